"""torchtitan (the optional ``torchtitan`` extra): its models as workloads, and bucketplan's pass
inside its graph_trainer.

Without the extra only the first test runs (the one-line error naming what to install); the
others skip. With it: the workloads are torchtitan's own graphs and carry every collective's
block; the pass, called as graph_trainer calls its passes, leaves exactly the planned
collectives; and on two gloo ranks graph_trainer's step with bucketplan's pipeline records,
solves and uses a plan with the unbucketed step's loss and gradients, bit for bit.
"""

from __future__ import annotations

import copy
import functools
import importlib.util

import pytest

import planner
from planner.jobs.plan_dir import PLAN, PROBLEM, recorded_problems, SolveDirOptions, solve_dir

pytestmark = pytest.mark.slow  # torchtitan's models traced and compiled


@pytest.fixture
def titan():
    pytest.importorskip("torchtitan")
    pytest.importorskip("triton")
    from fxglue.models import titan

    return titan


def test_a_torchtitan_workload_without_the_extra_names_what_to_install(monkeypatch):
    from fxglue.models import titan
    from fxglue.models.workloads import WorkloadError, get_workload, workloads

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("torchtitan", "triton") else real(name, *a))
    assert not any(n.startswith("titan-") for n in workloads())
    with pytest.raises(WorkloadError) as e:
        get_workload("titan-llama3-8b-2")
    assert str(e.value) == f"titan-llama3-8b-2: needs torchtitan and triton (not installed here): {titan.INSTALL}"
    with pytest.raises(WorkloadError, match="unknown workload 'titan-foo'"):
        get_workload("titan-foo")


@pytest.mark.parametrize("name", ["titan-llama3-8b-2", "titan-qwen3-30b-a3b-2",
                                  pytest.param("titan-deepseek-v3-16b-2", marks=pytest.mark.long)])
def test_torchtitan_workloads_are_its_graphs_with_every_block(titan, name):
    """Listed by ``bucketplan workloads``; traced by torchtitan's code through graph_trainer's
    passes up to its bucketing pass; every FSDP collective moves one parameter of one of the blocks
    graph_trainer names (tok_embeddings, layers.N, norm+lm_head), so the positioned search gets its
    per-block seed; backward gathers again what forward resharded (graph_trainer's remat)."""
    from fxglue.models.workloads import workloads
    from fxglue.pipeline import prepare

    assert name in workloads()
    prepared = prepare(name, greedy=False)
    meta = prepared.traced.meta
    assert meta["torchtitan"]["passes"] == ["eliminate_dead_code_pass", "canonicalize_graph_pass",
                                            "deduplicate_fsdp_unshard_chains_pass", "tag_with_memory_policy_pass",
                                            "apply_cpu_offload_pass", "selective_activation_remat_pass"]
    collectives = prepared.problem.collectives
    assert {c.kind for c in collectives} == {"all_gather", "reduce_scatter"}
    assert all(c.module is not None for c in collectives), [c.name for c in collectives if c.module is None]
    blocks = {"tok_embeddings", "layers.0", "layers.1", "norm+lm_head"}
    assert {c.module for c in collectives} <= blocks
    for block in ("layers.0", "layers.1"):
        moved = [c for c in collectives if c.module == block]
        forward = sum(1 for c in moved if c.kind == "all_gather" and c.phase == "forward")
        assert forward > 0
        assert sum(1 for c in moved if c.kind == "all_gather" and c.phase == "backward") == forward
        assert sum(1 for c in moved if c.kind == "reduce_scatter") == forward


def test_the_pass_called_as_graph_trainer_calls_it_leaves_the_planned_collectives(titan, tmp_path):
    """``bucketplan_pass`` through graph_trainer's own ``apply_graph_passes`` (``pass(gm,
    example_inputs)``, settings bound by ``functools.partial``) on a torchtitan graph of the fake
    world: record writes the problem, solve-dir plans it, use applies exactly that plan, and the
    graph lints."""
    from torchtitan.experiments.graph_trainer.passes import apply_graph_passes

    from fxglue.models.workloads import trace
    from fxglue.pipeline import count_collectives
    from fxglue.run.titan import bucketplan_pass

    traced = trace("titan-llama3-8b-2")
    example_inputs = tuple(n.meta["val"] for n in traced.gm.graph.find_nodes(op="placeholder"))
    plan_dir = tmp_path / "plans"

    def run(mode: str):
        events: list = []
        gm = apply_graph_passes(copy.deepcopy(traced.gm), example_inputs,
                                [functools.partial(bucketplan_pass, mode=mode, plan_dir=plan_dir, events=events)])
        gm.graph.lint()
        return gm, events

    _, recorded = run("record")
    (folder,) = recorded_problems(plan_dir)
    problem = planner.load_problem(folder / PROBLEM)
    assert [(e.kind, e.outcome, e.collectives_before) for e in recorded] == [("joint", "recorded",
                                                                               len(problem.collectives))]
    solve_dir(plan_dir, SolveDirOptions(time_limit_s=5))
    plan = planner.load_plan(folder / PLAN)
    assert not planner.verify(problem, plan)
    planned = planner.collectives_after(problem, plan)
    assert planned < len(problem.collectives)

    gm, used = run("use")
    assert [(e.outcome, e.fingerprint) for e in used] == [("planned", problem.fingerprint)]
    assert used[0].collectives_after == planned == sum(count_collectives(gm).values())


@pytest.fixture(scope="module")
def world():
    from fxglue.run.gloo import GlooWorld

    with GlooWorld(2) as w:
        yield w


@pytest.mark.slow  # four traced steps on two gloo ranks, about a minute and a half here
def test_graph_trainers_step_with_bucketplans_pipeline_records_solves_and_uses_a_plan(titan, world, tmp_path):
    """torchtitan's tiny Llama 3, its parallelize function over 2 gloo ranks, graph_trainer's tracer,
    the pass pipeline looked up by name as graph_trainer's trainer looks it up (graph_trainer's
    default list with bucketplan's pass where its bucketing pass was, regional inductor after it),
    run by graph_trainer's ``run_traced``: record, ``solve-dir``, use. The graph that runs holds
    exactly the planned collectives, and loss and every gradient equal the unbucketed step's, bit
    for bit (bucketing is exact on 2 ranks; the graph runs op by op, as graph_trainer leaves it)."""
    from tests.titan_steps import titan_step

    spec = {"plan_dir": str(tmp_path / "plans"), "cache_dir": str(tmp_path / "cache")}
    plain = world.run(titan_step, {**spec, "mode": "unbucketed"}, timeout_s=900)
    recorded = world.run(titan_step, {**spec, "mode": "record"}, timeout_s=900)
    for r in plain + recorded:
        passes = r["passes"]
        assert "bucketplan_pass" in passes and titan.BUCKETING_PASS not in passes
        assert passes.index("bucketplan_pass") == passes.index("selective_activation_remat_pass") + 1
    assert {e["outcome"] for r in recorded for e in r["events"]} == {"recorded"}
    (folder,) = recorded_problems(spec["plan_dir"])  # both ranks' graphs are one problem

    solve_dir(spec["plan_dir"], SolveDirOptions(time_limit_s=10))
    problem, plan = planner.load_problem(folder / PROBLEM), planner.load_plan(folder / PLAN)
    planned = planner.collectives_after(problem, plan)
    used = world.run(titan_step, {**spec, "mode": "use"}, timeout_s=900)
    for rank, r in enumerate(used):
        assert r["warnings"] == []
        assert [(e["outcome"], e["collectives_after"]) for e in r["events"]] == [("planned", planned)]
        assert r["collectives"] == planned < len(problem.collectives) == plain[rank]["collectives"]
        for mode, other in (("unbucketed", plain[rank]), ("torch's greedy", recorded[rank])):
            assert r["loss"].equal(other["loss"]), f"rank {rank}: loss differs from {mode}"
            assert all(a.equal(b) for a, b in zip(r["grads"], other["grads"])), f"rank {rank}: gradients differ"


def test_the_example_config_selects_bucketplans_pipeline_through_torchtitans_launcher(titan, monkeypatch, tmp_path):
    """examples/torchtitan_bucketplan.py as torchtitan's launcher reads it (``--module``/``--config``,
    then its command-line overrides): graph_trainer's config with the bucketplan pipeline selected and
    registered; a plan directory record cannot write to is one line before anything trains."""
    from pathlib import Path

    from torchtitan.config import ConfigManager
    from torchtitan.experiments.graph_trainer.registry import PASS_PIPELINE_REGISTRY

    from fxglue.run.compile import PlanCacheError

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "examples"))
    monkeypatch.setenv("BUCKETPLAN_MODE", "use")
    monkeypatch.setenv("BUCKETPLAN_DIR", str(tmp_path / "plans"))
    args = ["--module", "torchtitan_bucketplan", "--config", "graph_trainer_llama3_debugmodel_bucketplan"]
    with titan.quiet():
        config = ConfigManager().parse_args(args + ["--training.steps", "3"])
    assert (config.compile.mode, config.compile.pass_pipeline, config.training.steps) == ("aot_fx_trace", "bucketplan", 3)
    assert PASS_PIPELINE_REGISTRY["bucketplan"].keywords["settings"]["mode"] == "use"

    (tmp_path / "file").write_text("")
    monkeypatch.setenv("BUCKETPLAN_MODE", "record")
    monkeypatch.setenv("BUCKETPLAN_DIR", str(tmp_path / "file" / "plans"))
    with titan.quiet(), pytest.raises(PlanCacheError, match="cannot record plans there"):
        ConfigManager().parse_args(args)
