"""Workloads trace, torch schedules them on CPU, and the extracted problem matches torch's view."""

from __future__ import annotations

import re

import pytest

import planner
from tests.conftest import fresh_schedule, scheduled

pytestmark = pytest.mark.slow  # traces and schedules every small built-in workload

# the 8-layer steps but FSDP's (which test_polish schedules anyway) are the 2-layer ones deeper:
# the same extraction, in the long run only (`-m long`)
SMALL = [f"llama3-8b-{v}-{n}" if (v, n) != ("2d", 8) and (v, n) != ("ddp", 8)
         else pytest.param(f"llama3-8b-{v}-{n}", marks=pytest.mark.long)
         for v in ("fsdp", "2d", "ddp") for n in (2, 8)]


def _hf_small():
    try:
        from fxglue.models.hf_models import workloads
    except ImportError:  # the `models` extra is not installed
        return []
    return [n if n.endswith("-2") else pytest.param(n, marks=pytest.mark.long)  # -8: as SMALL's
            for n in workloads() if n.endswith(("-2", "-8"))]
EXPECTED_KINDS = {"fsdp": {"all_gather", "reduce_scatter"}, "2d": {"all_gather", "reduce_scatter", "all_reduce"},
                  "ddp": {"all_reduce"}}


def test_builtin_workloads_follow_the_naming_scheme():
    from fxglue.models.workloads import workloads

    names = list(workloads())
    for v in ("fsdp", "2d", "ddp"):
        for n in (2, 8, 32, 80):
            assert f"llama3-8b-{v}-{n}" in names
    assert all(re.fullmatch(r"(llama3-8b-(fsdp|2d|ddp|fsdp-mp)|llama3-(70b|405b)-(fsdp|2d)|hf-[a-z0-9]+(-[a-z0-9]+)*)-\d+", n) for n in names), names


@pytest.mark.parametrize("name", SMALL + _hf_small())
def test_every_small_builtin_extracts(name, tmp_path):
    from fxglue.pipeline import count_collectives

    s = scheduled(name)
    problem = s.problem
    variant = "fsdp" if name.startswith("hf-") else name.split("-")[2]
    kinds = {c.kind for c in problem.collectives}
    assert kinds == EXPECTED_KINDS[variant]
    # every collective of the scheduled graph is in the problem, once
    assert len(problem.collectives) == sum(count_collectives(s.inputs.gm).values())
    assert len({c.pg for c in problem.collectives}) == (2 if variant == "2d" else 1)
    # SimpleFSDP: one reduce_scatter per parameter, every parameter gathered at least once
    if variant in ("fsdp", "2d"):
        rs = sum(c.kind == "reduce_scatter" for c in problem.collectives)
        ag = sum(c.kind == "all_gather" for c in problem.collectives)
        assert rs == len(s.traced.gm.graph.output_node().args[0]) - 1  # one per parameter gradient
        assert ag > rs
    # each collective's hiding nodes lie strictly between its start and wait in the schedule
    pos = {n.name: n.pos for n in problem.nodes}
    for c in problem.collectives:
        assert all(c.start_pos < pos[h] < c.wait_pos for h in c.hiding), c.name
    # JSON round trip is exact
    planner.save(problem, tmp_path / "p.json")
    assert planner.load_problem(tmp_path / "p.json") == problem


@pytest.mark.parametrize("name", ["llama3-8b-fsdp-2", "llama3-8b-2d-2"])
def test_timelines_and_dependencies_match_torchs_bucketer(name):
    """Our compact problem reproduces torch's timelines and data reachability exactly."""
    import torch._inductor.fx_passes.overlap_preserving_bucketer as opb
    from torch._inductor.fx_passes.utils import BitsetAncestors

    from fxglue.cpu_compat import cpu_compat

    s = scheduled(name)
    problem = s.problem
    with cpu_compat(s.estimator):
        b = opb.OverlapPreservingBucketer(s.inputs.gm.graph, s.inputs.collective_info, s.inputs.scheduled)
    for t in problem.timelines:
        ours = [(problem.nodes[i].name, k) for i, k in zip(t.nodes, t.types)]
        theirs, e = [], b.pg_to_timeline_head[t.pg]
        while e is not None:
            theirs.append((e.node.name, e.event_type[0]))
            e = e.next
        assert ours == theirs
    # reachability among pinned nodes == torch's data-only ancestors restricted to pinned nodes
    sched = list(s.inputs.scheduled)
    by_name = {n.name: n for n in sched}
    anc = BitsetAncestors(sched)
    closure = []
    for i, n in enumerate(problem.nodes):
        a = 0
        for d in n.deps:
            a |= closure[d] | (1 << d)
        closure.append(a)
    for i, n in enumerate(problem.nodes):
        for j in range(i):
            expected = anc.is_ancestor(by_name[problem.nodes[j].name], by_name[n.name])
            assert bool((closure[i] >> j) & 1) == expected, (problem.nodes[j].name, n.name)
        # deps are a transitive reduction: no dep is implied by another
        for d in n.deps:
            assert not any((closure[e] >> d) & 1 for e in n.deps if e != d)


@pytest.mark.parametrize("name", ["llama3-8b-fsdp-2", "llama3-8b-2d-2", "llama3-8b-ddp-2"])
def test_greedy_plan_matches_what_torch_applies_and_leaves_graph_untouched(name):
    """Recorded greedy plan == torch's applied result. Where our verifier finds the recorded
    anchors unrealizable (rule 9, torch's restore_to_event defect), torch's own apply either
    fails its cycle check, or -- seen on llama3-8b-fsdp-2 since getitem costs nothing in the
    estimator -- applies the same buckets without a cycle (so torch does not put that merged
    start where the recorded anchor says; open question, see the session note)."""
    from planner.rules.verifier import verify

    from fxglue.cpu_compat import cpu_compat
    from fxglue.pipeline import count_collectives, finalize_with_torch

    s = scheduled(name)
    assert str(s.inputs.gm.graph) == s.graph_before_greedy  # greedy_plan did not touch the graph
    assert s.greedy.problem_fingerprint == s.problem.fingerprint
    for b in s.greedy.buckets:
        assert b.start in b.members and b.wait in b.members and len(b.members) > 1
    violations = verify(s.problem, s.greedy)
    traced, inputs, est = fresh_schedule(name)
    with cpu_compat(est), traced.fake_mode:
        if violations:
            assert {v.rule for v in violations} == {9}
            try:
                finalize_with_torch(inputs)
            except RuntimeError as e:
                assert "cyclic extra dep" in str(e)
                return
        else:
            finalize_with_torch(inputs)
    applied = sum(count_collectives(inputs.gm).values())
    assert planner.collectives_after(s.problem, s.greedy) == applied < len(s.problem.collectives)


def test_pre_bucketing_on_and_off_both_run():
    off = scheduled("llama3-8b-fsdp-2")
    on = scheduled("llama3-8b-fsdp-2", pre_bucketing=True)
    assert len(on.problem.collectives) < len(off.problem.collectives)
    assert on.problem.fingerprint != off.problem.fingerprint


def test_cpu_adaptations_are_undone_after_use():
    import torch
    import torch._inductor.fx_passes.overlap_scheduling as overlap_scheduling
    from torch.utils.flop_counter import flop_registry

    from fxglue.cpu_compat import cpu_compat
    from fxglue.estimator import Estimator

    original = overlap_scheduling.estimate_roofline_runtime_ms
    cpu_attention = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    with cpu_compat(Estimator()):
        assert overlap_scheduling.estimate_roofline_runtime_ms is not original
        assert cpu_attention in flop_registry
    assert overlap_scheduling.estimate_roofline_runtime_ms is original
    assert cpu_attention not in flop_registry


def test_generic_fsdp_wrapper_on_a_foreign_module():
    """The SimpleFSDP wrapping applies to any nn.Module, including ones with odd shapes."""
    import torch
    import torch.nn as nn

    from fxglue.models import parallel
    from fxglue.models.workloads import ensure_fake_world, trace_step

    ensure_fake_world()
    import torch.distributed as dist

    from torch._subclasses.fake_tensor import FakeTensorMode

    fm = FakeTensorMode()
    with fm:
        module = nn.Sequential(nn.Linear(10, 7), nn.GELU(), nn.Linear(7, 3))  # 7 and 3 do not divide by 8
        wrapped = parallel.wrap(module, "fsdp", 8, dist.group.WORLD.group_name)
        x = torch.randn(4, 10)
        args = [*parallel.stored_params(wrapped), x]
    step = parallel.make_train_step(wrapped, lambda m, inp: m(inp).sum())
    gm = trace_step(step, args, fake_mode=fm)
    targets = [str(n.target) for n in gm.graph.nodes]
    assert sum("all_gather_into_tensor" in t for t in targets) >= 4
    assert sum("reduce_scatter_tensor" in t for t in targets) == 4
    outputs = gm.graph.output_node().args[0]
    shard_shapes = [tuple(o.meta["val"].shape) for o in outputs[1:]]
    assert shard_shapes == [(1, 10), (1,), (1, 7), (1,)]  # ceil(7/8), ceil(3/8) rows, padded
