"""Bucketed graphs compute exactly what the original computed, for real, on gloo ranks."""

from __future__ import annotations

import pytest

from fxglue.run.gloo import CheckOptions, check_workload

pytestmark = pytest.mark.slow  # steps run for real on gloo ranks


@pytest.mark.parametrize("workload,planner,mode,ranks", [
    ("llama3-8b-fsdp-2", "greedy", None, 2),
    ("llama3-8b-ddp-2", "cpsat", None, 2),
    pytest.param("llama3-8b-2d-2", "greedy-repaired", "custom_ops", 4, marks=pytest.mark.long),  # 14 s, 4 ranks
    # mixed precision: fp32 shards, bf16 gathers; merges fold each conversion into the bucket's copy
    ("llama3-8b-fsdp-mp-2", "cpsat", None, 2),
    # a Hugging Face model whose rotary inv_freq is a real buffer, not an input (it used to stop
    # fake tracing on every rank); long: hf-qwen3-moe-2's has one too, checked by default below
    pytest.param("hf-qwen3-2", "cpsat", None, 2, marks=pytest.mark.long),
])
def test_bucketed_graph_is_bitwise_equal(workload, planner, mode, ranks):
    """Loss and gradients of the bucketed graph bitwise those of the original, on gloo ranks (the
    variants under -m long: 4 ranks of 2-D, and hf-qwen3-2, whose point test_hf_moe_check covers)."""
    result = check_workload(workload, CheckOptions(ranks=ranks, planner=planner, bucket_mode=mode))
    assert result.ok, result.summary()
    for r in result.per_rank:
        assert r.collectives_after < r.collectives_before  # something was really merged
        assert r.max_abs_diff == 0.0


def _checked_and_prepared(rank, world, spec):
    """This rank's problem as ``check`` makes it (written to ``spec["options"].save_problems``), and
    ``prepare``'s on the same graph: the rank's step traced as check traces it, taken as it is."""
    import torch
    from torch._guards import detect_fake_mode

    from fxglue.models import parallel
    from fxglue.models.workloads import TracedWorkload, get_workload, mesh_groups, trace_step, wrap_module
    from fxglue.pipeline import prepare
    from fxglue.run.gloo import _check_rank

    assert not _check_rank(rank, world, spec).error
    wl = get_workload(spec["workload"], small=True)
    groups = mesh_groups(wl.style, world, tp_size=1)
    torch.manual_seed(spec["options"].seed)
    module, inputs, loss_fn = wl.build(groups)
    wrapped = wrap_module(wl, module, groups, rank)
    gm = trace_step(parallel.make_train_step(wrapped, loss_fn), [*parallel.stored_params(wrapped), *inputs])
    fake_mode = detect_fake_mode([n.meta.get("val") for n in gm.graph.find_nodes(op="placeholder")])
    return prepare(TracedWorkload(wl.name, gm, fake_mode, groups, 0.0), greedy=False).problem


def test_the_checked_problem_is_prepares_with_blocks(tmp_path):
    """The problem each gloo rank plans (and ``extract --tiny`` writes) is ``prepare``'s for the
    rank's graph, fingerprint for fingerprint, blocks included: check names blocks from the
    rank's own module, prepare from the workload rebuilt by name."""
    import planner
    from fxglue.run.gloo import GlooWorld

    spec = {"workload": "llama3-8b-fsdp-2", "options": CheckOptions(planner="none", save_problems=str(tmp_path)),
            "plans": None, "tp_size": 1, "model": None}
    with GlooWorld(2) as world:
        prepared = world.run(_checked_and_prepared, spec)
    for rank, expected in enumerate(prepared):
        checked = planner.load_problem(tmp_path / f"rank{rank}" / "problem.json")
        moved = [c for c in checked.collectives if c.kind in ("all_gather", "reduce_scatter")]
        assert moved and all(c.module is not None and c.phase is not None for c in moved), checked.collectives
        assert {c.phase for c in moved} == {"forward", "backward"}
        assert checked.fingerprint == expected.fingerprint


@pytest.mark.parametrize("planner", ["none", pytest.param("cpsat", marks=pytest.mark.long)])
@pytest.mark.slow
def test_hf_moe_check_is_bitwise_equal(planner):
    # transformers' Qwen3-MoE router divides its top-k weights in place; before the traced step
    # was functionalized, torch's scheduler moved autograd's saved copy of them past that write
    # and the check failed even with nothing bucketed (planner none: max |diff| 0.0035)
    result = check_workload("hf-qwen3-moe-2", CheckOptions(ranks=2, planner=planner))
    assert result.ok and result.bitwise, result.summary()
    assert all(r.max_abs_diff == 0.0 for r in result.per_rank)


def _read_then_write(x):
    y = x * 2
    saved = y.clone()  # read before the write below; no data edge orders the two
    y.div_(y.sum())
    return saved + y


def test_traced_step_is_functional_so_any_data_edge_order_computes_the_same():
    """What torch's scheduler may do to a graph (move a node as late as its users allow) must
    not change what it computes: ``trace_step`` leaves no node that writes into a tensor."""
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    from fxglue.models.workloads import mutating_nodes, trace_step
    from fxglue.run.gloo import bitwise_equal

    def clone_moved_late(gm):
        clone = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.clone.default)
        next(iter(clone.users)).prepend(clone)  # legal by data edges alone
        gm.recompile()
        return gm

    x = torch.randn(4, 3)
    expected = _read_then_write(x.clone())
    raw = make_fx(_read_then_write)(x)
    assert mutating_nodes(raw)  # the hazard: moving the read past the write changes the result
    assert not bitwise_equal(clone_moved_late(raw)(x.clone()), expected)
    gm = trace_step(_read_then_write, [x])
    assert not mutating_nodes(gm)
    assert bitwise_equal(gm(x.clone()), expected)
    assert bitwise_equal(clone_moved_late(gm)(x.clone()), expected)


@pytest.mark.long
def test_check_cli_reports_and_exits_zero(capsys):
    """`bucketplan check` on a built-in workload. Long: the README's `bucketplan check llama3-8b-fsdp-2
    --planner cpsat` runs verbatim by default (test_readme.py), its report's lines in test_custom.py
    (a factory's model), built-in workloads on gloo above."""
    from bucketplan.cli import main

    assert main(["check", "llama3-8b-fsdp-2", "--planner", "cpsat", "--ranks", "2", "-q"]) == 0
    out = capsys.readouterr().out
    assert "rank 0: bitwise equal" in out and "rank 1: bitwise equal" in out and out.rstrip().endswith("OK")


def test_a_one_rank_data_parallel_group_is_refused():
    from fxglue.models.workloads import WorkloadError

    with pytest.raises(WorkloadError, match="data-parallel group of 1"):
        check_workload("llama3-8b-fsdp-2", CheckOptions(ranks=1))


def _rank_value(rank, world, fail_on):
    import torch
    import torch.distributed as dist

    if rank == fail_on:
        raise ValueError(f"rank {rank} was told to fail")
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)  # a real gloo collective across the ranks
    return (rank, world, float(t))


def test_gloo_world_runs_on_every_rank_and_names_a_failing_one():
    from fxglue.run.gloo import GlooWorld, RankError

    with GlooWorld(2) as world:
        assert world.run(_rank_value, None) == [(0, 2, 3.0), (1, 2, 3.0)]
        with pytest.raises(RankError, match=r"_rank_value failed on rank 1: ValueError: rank 1 was told to fail"):
            world.run(_rank_value, 1, timeout_s=20)


def test_bitwise_equal_compares_bytes_not_values():
    import torch

    from fxglue.run.gloo import bitwise_equal

    nan = torch.tensor([float("nan")])
    assert bitwise_equal(nan, nan.clone())  # torch.equal says False for NaN
    assert not bitwise_equal(torch.tensor([0.0]), torch.tensor([-0.0]))  # equal values, different bits
    assert not bitwise_equal(torch.ones(2), torch.ones(2, dtype=torch.float64))
    assert not bitwise_equal(torch.ones(2), torch.ones(1, 2))
    x = torch.randn(4, 4).to(torch.bfloat16)
    assert bitwise_equal(x.t(), x.t().contiguous())
    assert bitwise_equal(torch.tensor(1.5), torch.tensor(1.5)) and not bitwise_equal(torch.tensor(1.5), torch.tensor(2.5))


def test_the_sum_order_tolerance_applies_only_where_it_is_granted():
    from fxglue.run.gloo import CheckResult, RankResult

    close = RankResult(rank=0, bitwise_equal=False, max_abs_diff=7e-9, max_rel_diff=3e-8, plan_fingerprint="p")
    far = RankResult(rank=1, bitwise_equal=False, max_abs_diff=1e-3, max_rel_diff=1e-3, plan_fingerprint="p")
    strict = CheckResult("w", 2, "cpsat", None, False, per_rank=[close])
    assert not strict.ok  # two ranks: bitwise or nothing
    lenient = CheckResult("w", 4, "cpsat", None, False, per_rank=[close], sum_order_tolerance=2.9e-6)
    assert lenient.ok and not lenient.bitwise and "within the sum-order tolerance" in lenient.summary()
    assert not CheckResult("w", 4, "cpsat", None, False, per_rank=[close, far], sum_order_tolerance=2.9e-6).ok


@pytest.mark.long  # 14 s: 2-rank DDP checks run in the default run
def test_four_ddp_ranks_pass_within_the_sum_order_tolerance_only():
    # gloo sums a merged all_reduce buffer in another order on more than two ranks
    result = check_workload("llama3-8b-ddp-2", CheckOptions(ranks=4, planner="cpsat"))
    assert result.ok, result.summary()
    assert result.sum_order_tolerance is not None
    assert all(r.collectives_after < r.collectives_before for r in result.per_rank)


@pytest.mark.long  # 21 s: check --plan on 4 ranks; the plan path of check runs by default
def test_check_plan_takes_each_ranks_plan_solved_offline(tmp_path, capsys):
    """`extract --tiny` writes each rank's problem (2-D: the ranks' TP groups differ, so do their
    problems); each is solved offline; `check --plan DIR` applies rank R's plan on rank R."""
    import shutil

    import planner
    from bucketplan.cli import main

    out = tmp_path / "tiny"
    assert main(["extract", "llama3-8b-2d-2", "--tiny", "--ranks", "2", "-o", str(out), "-q"]) == 0
    problems = [planner.load_problem(out / f"rank{r}" / "problem.json") for r in range(2)]
    assert problems[0].fingerprint != problems[1].fingerprint  # one plan for both would be refused
    for r in range(2):
        assert main(["solve", str(out / f"rank{r}" / "problem.json"), "-o", str(out / f"rank{r}" / "plan.json"),
                     "--time-limit", "5", "--objective", "count", "-q"]) == 0
    capsys.readouterr()
    assert main(["check", "llama3-8b-2d-2", "--ranks", "2", "--plan", str(out), "-q"]) == 0
    report = capsys.readouterr().out
    assert "rank 0: bitwise equal" in report and "rank 1: bitwise equal" in report
    # rank 1 given rank 0's plan (another problem) while rank 0's fits: rank 0 must not go on to
    # wait in a collective for rank 1, and the refusal is one line naming rank 1, no traceback
    shutil.copy(out / "rank0" / "plan.json", out / "rank1" / "plan.json")
    assert main(["check", "llama3-8b-2d-2", "--ranks", "2", "--plan", str(out), "-q"]) == 2
    err = capsys.readouterr().err
    assert "refused by 1 of 2 ranks" in err and "Traceback" not in err
    rank_lines = [line for line in err.splitlines() if line.startswith("  rank")]
    assert len(rank_lines) == 1 and rank_lines[0].startswith(f"  rank 1: {out / 'rank1' / 'plan.json'}: rule 1")
    # a folder missing a rank's plan: one line before anything is spawned
    (out / "rank1" / "plan.json").unlink()
    assert main(["check", "llama3-8b-2d-2", "--ranks", "2", "--plan", str(out), "-q"]) == 2
    assert "rank1/plan.json" in capsys.readouterr().err


def _positioned_check(tmp_path, capsys, workload: str) -> None:
    """`extract --tiny`, a positioned plan per rank (``planner.search.free.position_search`` with an evaluation
    limit, so the plan does not depend on the machine's load), `check --plan`: a plan that issues
    and waits buckets where it names, applied on gloo ranks, leaves loss and gradients bitwise."""
    import time

    import planner
    from bucketplan.cli import main
    from planner.search.free.position_search import position_search

    out = tmp_path / "tiny"
    assert main(["extract", workload, "--tiny", "--ranks", "2", "-o", str(out), "-q"]) == 0
    for r in range(2):
        problem = planner.load_problem(out / f"rank{r}" / "problem.json")
        greedy = planner.load_plan(out / f"rank{r}" / "greedy-plan.json")
        plan = position_search(problem, [greedy], planner.PositionSearchOptions(max_evaluations=600),
                               peak_memory_bytes=None, deadline=time.perf_counter() + 600).plan
        if len(plan.buckets) < 2:  # tiny DDP: one all_reduce bucket is fastest; two can each be moved
            plan = _halves(problem, plan)
        plan = _issued_as_early_as_allowed(problem, plan)
        assert sum(1 for b in plan.buckets if b.issue_before) >= 2, "a plan with positions"
        planner.save(plan, out / f"rank{r}" / "plan.json")
    capsys.readouterr()
    assert main(["check", workload, "--ranks", "2", "--plan", str(out), "-q"]) == 0
    report = capsys.readouterr().out
    assert "rank 0: bitwise equal" in report and "rank 1: bitwise equal" in report


def _halves(problem, plan):
    """``plan``'s one bucket as two, by start order, each anchored at its last member; verified."""
    import planner
    from planner.core.problem import with_buckets

    (bucket,) = plan.buckets
    order = sorted((c for c in problem.collectives if c.name in bucket.members), key=lambda c: c.start_pos)
    halves = (order[:len(order) // 2], order[len(order) // 2:])
    split = with_buckets(plan, [planner.Bucket(members=tuple(c.name for c in h), start=h[-1].name, wait=h[-1].name)
                                for h in halves])
    assert not planner.verify(problem, split, keep_overlap=False)
    return split


def _issued_as_early_as_allowed(problem, plan):
    """Every bucket of ``plan`` issued just after its members' last pinned predecessor, where the
    verifier (overlap rules off) accepts it: positions whatever the search found worth it."""
    import planner
    from planner.core.problem import with_buckets

    index = {n.name: i for i, n in enumerate(problem.nodes)}
    buckets = list(plan.buckets)
    for k, b in enumerate(buckets):
        after = max(max(problem.nodes[index[m]].deps, default=-1) for m in b.members) + 1
        trial = buckets[:k] + [b.model_copy(update={"issue_before": problem.nodes[after].name})] + buckets[k + 1:]
        candidate = with_buckets(plan, trial)
        if not planner.verify(problem, candidate, keep_overlap=False):
            buckets = trial
    return with_buckets(plan, buckets)


@pytest.mark.slow
def test_a_positioned_plan_is_bitwise_on_gloo(tmp_path, capsys):
    _positioned_check(tmp_path, capsys, "llama3-8b-fsdp-2")


@pytest.mark.long
@pytest.mark.parametrize("workload", ["llama3-8b-2d-2", "llama3-8b-ddp-2", "hf-qwen3-2", "hf-qwen3-moe-2"])
def test_positioned_plans_are_bitwise_on_gloo_on_every_workload_family(tmp_path, capsys, workload):
    _positioned_check(tmp_path, capsys, workload)
