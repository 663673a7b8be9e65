"""Fuzzing on random small FX graphs: every planner's plan verifies and applies; overlap is kept.

A hypothesis strategy writes a random straight-line program of matmuls and collectives
(all_gather / reduce_scatter / all_reduce, bf16 or fp32, on one to three process groups),
started and waited at random points, and random hiding annotations consistent with the
schedule (hiding matmuls strictly between a collective's start and wait). The program is traced
on the fake process group, so graphs are real ATen FX graphs.

One example in ``FUZZ_GLOO_EVERY`` (default 5) also runs for real: the same program on two
gloo ranks (real bf16/fp32 tensors, different data per rank), unbucketed and bucketed with each
planner's plan, every output compared bitwise. The ranks stay alive between examples
(``fxglue.run.gloo.GlooWorld``).

Budget: ``FUZZ_EXAMPLES`` (default 25 in CI). A longer run:
``FUZZ_EXAMPLES=10000 python3 -m pytest tests/test_fuzz.py -q``.
"""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import HealthCheck, event, given, settings

import planner
from fxglue.apply import PlanError, apply_plan
from fxglue.cpu_compat import cpu_compat
from fxglue.estimator import Estimator
from fxglue.greedy import greedy_plan
from planner.search.solver import solve
from planner.rules.verifier import verify
from tests.strategies import plans

pytestmark = pytest.mark.slow  # traces random programs, runs a sample on gloo ranks

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "25"))
GLOO_EVERY = int(os.environ.get("FUZZ_GLOO_EVERY", "5"))  # 0: never run on gloo
GLOO_RANKS = 2
c10d = torch.ops._c10d_functional


@dataclass(frozen=True)
class Program:
    ops: tuple  # ("mm", i, j) | ("start", kind, pg, i, fp32) | ("wait", k)
    n_inputs: int
    hiding: tuple  # per collective (in start order): (tuple of mm indices, "hidden"|"partly") or None


@st.composite
def programs(draw, max_ops: int = 16):
    n_inputs = draw(st.integers(2, 3))
    n_pgs = draw(st.integers(1, 3))
    # a small palette of collective kinds (kind, group, fp32) per program, so that same-key
    # collectives -- the ones that can merge -- are common; mixed keys still occur
    palette = draw(st.lists(st.tuples(st.sampled_from(["all_gather", "reduce_scatter", "all_reduce"]),
                                      st.integers(0, n_pgs - 1), st.booleans()), min_size=1, max_size=3))
    values = n_inputs
    ops, pending, mm_count = [], [], 0
    mm_positions: list[int] = []  # op index of each mm
    starts: list[tuple[int, int]] = []  # (op index of start, op index of wait)
    for _ in range(draw(st.integers(3, max_ops))):
        choice = draw(st.sampled_from(["mm", "mm", "start", "start", "wait"] if pending else ["mm", "start"]))
        if choice == "mm":
            i, j = draw(st.integers(0, values - 1)), draw(st.integers(0, values - 1))
            ops.append(("mm", i, j))
            mm_positions.append(len(ops) - 1)
            values += 1
            mm_count += 1
        elif choice == "start":
            kind, pg, fp32 = draw(st.sampled_from(palette))
            ops.append(("start", kind, pg, draw(st.integers(0, values - 1)), fp32))
            pending.append((len(starts), len(ops) - 1))
            starts.append((len(ops) - 1, -1))
        else:
            k, op_idx = pending.pop(draw(st.integers(0, len(pending) - 1)))
            ops.append(("wait", k))
            starts[k] = (op_idx, len(ops) - 1)
            values += 1
    for k, op_idx in pending:  # wait whatever is still in flight, in random order
        ops.append(("wait", k))
        starts[k] = (op_idx, len(ops) - 1)
        values += 1
    hiding = []
    for s, w in starts:
        between = [m for m, pos in enumerate(mm_positions) if s < pos < w]
        if between and draw(st.booleans()):
            chosen = draw(st.lists(st.sampled_from(between), min_size=1, unique=True))
            hiding.append((tuple(sorted(chosen)), draw(st.sampled_from(["hidden", "partly"]))))
        else:
            hiding.append(None)
    return Program(tuple(ops), n_inputs, tuple(hiding))


def _groups(n: int) -> list[str]:
    """The world group and two more over every rank: on torch's fake process group (8 ranks) in
    the test process, on the real one in a gloo rank (new_group is collective: every rank makes
    them in the same order, once)."""
    import torch.distributed as dist

    from fxglue.models.workloads import ensure_fake_world

    if not dist.is_initialized():
        ensure_fake_world()
    while len(_EXTRA_GROUPS) < 2:
        _EXTRA_GROUPS.append(dist.new_group(list(range(dist.get_world_size()))).group_name)
    return ([dist.group.WORLD.group_name] + _EXTRA_GROUPS)[:n]


_EXTRA_GROUPS: list[str] = []


def build(program: Program):
    """Trace the program; returns (gm, collective_info, scheduled, fake_mode).

    On the process group of this process: the fake one (8 ranks) or a gloo rank's. Shapes stay
    (64, 64) for every value whatever the group size."""
    import torch.distributed as dist

    groups = _groups(3)
    n = dist.get_world_size()

    def fn(*xs):
        vals = list(xs)
        live = {}
        for op in program.ops:
            if op[0] == "mm":
                vals.append(torch.mm(vals[op[1]], vals[op[2]]))
            elif op[0] == "start":
                _, kind, pg, i, fp32 = op
                x = vals[i].float() if fp32 else vals[i]
                g = groups[pg]
                if kind == "all_gather":
                    h = c10d.all_gather_into_tensor(x[:64 // n].contiguous(), n, g)
                elif kind == "reduce_scatter":
                    h = c10d.reduce_scatter_tensor(x, "sum", n, g)
                else:
                    h = c10d.all_reduce(x, "sum", g)
                live[len(live)] = (h, kind, fp32)
            else:
                h, kind, fp32 = live[op[1]]
                y = c10d.wait_tensor(h)
                if kind == "reduce_scatter":
                    y = y.repeat(n, 1)
                vals.append(y.to(torch.bfloat16) if fp32 else y)
        return tuple(vals[program.n_inputs:])

    from tests.handmade import build as build_handmade

    hiding = {k: h for k, h in enumerate(program.hiding) if h is not None}
    h = build_handmade(fn, [((64, 64), torch.bfloat16)] * program.n_inputs, hiding)
    return h.gm, h.collective_info, h.scheduled, h.fake_mode


def _apply_and_check(program: Program, plan: planner.Plan, problem: planner.Problem) -> None:
    gm, info, sched, fm = build(program)
    before = str(gm.graph)
    with fm:
        apply_plan(gm.graph, info, sched, plan, problem=problem)  # raises on a broken overlap (post-check)
    gm.graph.lint()
    gm.recompile()
    assert str(gm.graph) != before or not any(len(b.members) > 1 for b in plan.buckets)


# ---- real execution on gloo ranks -------------------------------------------------------

def run_on_rank(rank: int, world: int, program: Program, plans: list[planner.Plan]) -> dict[str, str]:
    """Run ``program`` unbucketed and bucketed with each plan on this gloo rank.

    Returns, per plan's planner, "" when every output is bitwise equal, else what differed. The
    plans were made for the fake process group's problem; here group names differ, so each plan is
    re-fingerprinted for this rank's problem (the buckets, by node names, are the same) and
    verified again by ``apply_plan``."""
    from fxglue.extract import extract_problem
    from fxglue.run.gloo import bitwise_equal

    gm, info, sched, _ = build(program)
    problem = extract_problem(gm.graph, info, sched, estimator=Estimator())  # same for every fresh trace
    gen = torch.Generator().manual_seed(100 + rank)  # data differs across ranks
    args = [(0.25 * torch.randn(64, 64, generator=gen)).to(torch.bfloat16) for _ in range(program.n_inputs)]
    with torch.no_grad():
        reference = gm(*args)
    report = {}
    for plan in plans:
        gm2, info2, sched2, fm2 = build(program)
        with fm2:
            apply_plan(gm2.graph, info2, sched2, plan.model_copy(update={"problem_fingerprint": problem.fingerprint}),
                       problem=problem)
        gm2.recompile()
        with torch.no_grad():
            out = gm2(*args)
        diffs = [k for k, (a, b) in enumerate(zip(reference, out)) if not bitwise_equal(a, b)]
        report[plan.planner] = f"outputs {diffs} differ" if diffs or len(out) != len(reference) else ""
    return report


@pytest.fixture(scope="module")
def gloo_world():
    """A lazily started two-rank gloo world shared by the module's examples."""
    holder: dict = {}

    def get():
        if "world" not in holder or holder["world"].closed:  # a failed example closes it
            from fxglue.run.gloo import GlooWorld

            holder["world"] = GlooWorld(GLOO_RANKS)
        return holder["world"]

    yield get
    if "world" in holder:
        holder["world"].close()


def _run_on_gloo(get_world, program: Program, plans: dict[str, planner.Plan]) -> None:
    merging = [p.model_copy(update={"planner": label}) for label, p in plans.items()
               if any(len(b.members) > 1 for b in p.buckets)]
    if not merging:
        event("gloo: sampled, nothing merged")
        return
    event("gloo: ran bucketed plans on 2 ranks")
    for rank, report in enumerate(get_world().run(run_on_rank, program, merging, timeout_s=300)):
        bad = {label: why for label, why in report.items() if why}
        assert not bad, f"rank {rank}: bucketed graph differs from the original: {bad}"


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(programs(), st.data())
def test_every_planner_plan_verifies_and_applies(gloo_world, program, data):
    from fxglue.extract import extract_problem

    gm, info, sched, fm = build(program)
    est = Estimator()
    problem = extract_problem(gm.graph, info, sched, estimator=est)
    with cpu_compat(est):
        greedy = greedy_plan(gm.graph, info, sched, problem_fingerprint=problem.fingerprint, estimator=est)
    result = solve(problem, planner.SolveOptions(time_limit_s=2, workers=1), hint=greedy)
    assert result.plan is not None and verify(problem, result.plan) == []
    assert result.bound is None or result.objective >= result.bound
    event(f"cpsat merges {len(problem.collectives) - result.objective:.0f} collective(s)")
    verified = {"cpsat": result.plan}
    if not verify(problem, greedy):
        assert result.objective <= planner.collectives_after(problem, greedy)
        _apply_and_check(program, greedy, problem)
        verified["greedy"] = greedy
    _apply_and_check(program, result.plan, problem)
    # a random plan: applied if the verifier accepts it, rejected (graph untouched) otherwise
    random_plan = data.draw(plans(problem))
    if verify(problem, random_plan):
        gm2, info2, sched2, fm2 = build(program)
        before = str(gm2.graph)
        with pytest.raises(PlanError), fm2:
            apply_plan(gm2.graph, info2, sched2, random_plan, problem=problem)
        assert str(gm2.graph) == before
    else:
        _apply_and_check(program, random_plan, problem)
        verified["random"] = random_plan
    # a fixed one-in-N sample (by a stable hash of the program; a drawn number would shrink to "always")
    if GLOO_EVERY and zlib.crc32(repr(program).encode()) % GLOO_EVERY == 0:
        _run_on_gloo(gloo_world, program, verified)
