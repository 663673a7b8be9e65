"""The step objective: the model reproduces planner.simulate, and the search finds the optimum.

Independent references: ``planner.simulate`` (the model's objective with a plan fixed) and a
brute force over every partition and anchor choice, scored by ``planner.simulate`` itself.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ortools.sat.python import cp_model

import planner
from planner.search.cpsat import build_model
from planner.search.solver import solve
from planner.search.step import NS_PER_MS, PIECE_TOLERANCE_NS, _fix, add_step_objective
from tests.strategies import folded_conversions, folded_pair, merged, plans, problems, two_gathers
from tests.brute import feasible_plans
from tests.support import data_problem


def _brute_force_step(problem: planner.Problem) -> float:
    """Least simulated step over every feasible plan (anchors included; the empty plan too)."""
    return min(planner.simulate(problem, plan).step_ms for plan in feasible_plans(problem))


def _alpha_beta(problem: planner.Problem) -> planner.Problem:
    """The same problem (bucketing costs kept) with α-β links, which the model prices exactly."""
    links = tuple(planner.Link(pg=link.pg, group_size=link.group_size, latency_ms=0.05, bandwidth_gbps=0.5)
                  for link in problem.links)
    return planner.Problem.model_validate({**problem.model_dump(), "links": links, "fingerprint": ""}).with_fingerprint()


def _model_value_ms(problem: planner.Problem, plan: planner.Plan, exact: bool = True) -> float | None:
    handle = build_model(problem)
    step = add_step_objective(handle, problem, exact=exact)
    if not _fix(handle, plan):
        return None
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    assert solver.solve(handle.model) == cp_model.OPTIMAL
    slack = step.stats["step_events"] + step.stats["step_anchors"]
    return solver.objective_value / NS_PER_MS, slack / NS_PER_MS


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), st.booleans())
def test_model_with_a_plan_fixed_is_the_simulated_step(data, tables):
    problem = data.draw(problems(max_collectives=5, max_compute=4, max_pgs=2, dtypes=("bfloat16",), costs=True))
    if data.draw(st.booleans()):  # conversions that run at their bucket's copy-in when merged
        problem = data.draw(folded_conversions(problem))
    if not tables:
        problem = _alpha_beta(problem)
    plan = data.draw(plans(problem))
    if planner.verify(problem, plan):
        plan = planner.Plan(problem_fingerprint=problem.fingerprint, planner="none", created="t", buckets=())
    value = _model_value_ms(problem, plan)
    if value is None:
        return  # a choice outside the candidates the rules leave
    model_ms, slack_ms = value
    sim = planner.simulate(problem, plan).step_ms
    assert model_ms <= sim + slack_ms  # never above the step, up to integer-ns rounding
    # α-β links are modelled exactly; tables (random shapes, not only concave) to within
    # 2 PIECE_TOLERANCE_NS per bucket (planner.search.step.duration_pieces)
    pieces_ms = 0.0 if not tables else 2 * PIECE_TOLERANCE_NS / NS_PER_MS * len(problem.collectives)
    assert abs(model_ms - sim) <= slack_ms + pieces_ms


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), st.booleans())
def test_step_search_finds_the_brute_force_optimum_and_its_bound_holds(data, tables):
    problem = data.draw(problems(max_collectives=4, max_compute=3, max_pgs=2, dtypes=("bfloat16",), costs=True))
    if data.draw(st.booleans()):  # conversions that run at their bucket's copy-in when merged
        problem = data.draw(folded_conversions(problem))
    if not tables:
        problem = _alpha_beta(problem)
    best = _brute_force_step(problem)
    result = solve(problem, planner.SolveOptions(time_limit_s=10, objective="step", workers=1))
    assert result.plan is not None and not planner.verify(problem, result.plan)
    assert result.objective == planner.simulate(problem, result.plan).step_ms
    assert result.bound <= best + 1e-6
    assert result.objective <= planner.simulate(problem).step_ms  # never slower than unbucketed
    # an exact model (tables: to within 2 PIECE_TOLERANCE_NS per bucket): the search finds the optimum
    assert result.objective <= best + (1e-5 if not tables else 1e-4)


def test_the_chord_cut_lies_under_the_link_curve_on_a_torch_nccl_table():
    # the duration cut (planner.search.step.chord_cut) against the curve itself, ``Link.time_ms`` of a
    # committed problem priced with torch's NCCL model (h100-8nodes: 627 points per kind), at
    # every byte count of a grid between a collective's own bytes and its widest bucket
    import random

    from planner.search.step import BYTE_UNIT, chord_cut, duration_lines

    link = data_problem("llama3-8b-ddp-2--h100-8nodes").links[0]
    rng = random.Random(0)
    cuts = 0
    for kind in ("all_reduce", "all_gather", "reduce_scatter"):
        for _ in range(40):
            lo = rng.choice([4096, 1 << 20, 8 << 20, 117440512])
            hi = lo * rng.choice([2, 7, 64, 1000])
            scale, lines = duration_lines(link, kind, lo, hi)
            cut = chord_cut(lines, lo // BYTE_UNIT, hi // BYTE_UNIT)
            if cut is None:  # a falling chord (the minorant under torch's tree all_reduce can fall)
                continue
            cuts += 1
            for b in [lo, hi] + [rng.randrange(lo, hi) for _ in range(50)]:
                u = b // BYTE_UNIT  # what the model's byte count is for b bytes (rounded down)
                assert (cut[0] + cut[1] * u) / scale <= link.time_ms(kind, b) * NS_PER_MS + 1e-6
    assert cuts >= 100  # of 120 ranges


def test_the_per_byte_cut_never_asks_more_than_the_curve():
    # regression (found in review): the per-byte cut asked ceil(time(hi)) ns of a duration whose
    # domain ended at floor(time(hi)), so merging everything at an anchor was infeasible in the
    # model though the verifier accepts it -- whenever time/bytes falls up to hi, as on NCCL tables
    table = ((0, 0.02), (1 << 16, 0.05), (1 << 20, 0.2), (16 << 20, 1.5), (256 << 20, 15.0))
    link = planner.Link(pg="0", group_size=4, table={"all_gather": table})
    for wire in (64, 192, 6400, 64000, 6400000, 32000000, 64000000):
        problem = two_gathers((wire, wire), (wire // 4, wire // 4), link)
        plan = merged(problem)
        assert not planner.verify(problem, plan)
        model_ms, slack_ms = _model_value_ms(problem, plan)
        assert model_ms <= planner.simulate(problem, plan).step_ms + slack_ms


def test_duration_pieces_lie_under_a_torch_nccl_curve_and_meet_it():
    # planner.search.step.duration_pieces against the curve itself (``Link.time_ms`` of committed problems
    # priced with torch's NCCL model, 627 points per kind, all_reduce not concave): at every
    # breakpoint and at random bytes of each region, the minimum of its lines is under the curve,
    # within 2 PIECE_TOLERANCE_NS of it, and past the region by the slack still under it
    import random

    from planner.search.step import duration_pieces

    rng = random.Random(0)
    for case in ("llama3-8b-ddp-2--h100-8nodes", "llama3-8b-ddp-2--h100-64nodes"):
        link = data_problem(case).links[0]
        for kind in ("all_reduce", "all_gather", "reduce_scatter"):
            for _ in range(6):
                lo = rng.choice([8192, 1 << 20, 8 << 20, 117440512])
                hi = lo * rng.choice([2, 7, 64, 1000])
                slack = rng.choice([0, 0, 64 * 21])
                pieces = duration_pieces(link, kind, lo, hi, slack)
                assert pieces[0][0] <= lo and pieces[-1][1] >= hi
                assert all(p[0] <= p[1] and q[0] in (p[1], p[1] + 1) for p, q in zip(pieces, pieces[1:]))
                for b0, b1, lines in pieces:
                    inside = [b for b, _ in link.table[kind] if b0 <= b <= b1] + [b0, b1]
                    inside += [rng.randint(b0, b1) for _ in range(20)]
                    for b in inside:
                        f, g = link.time_ms(kind, b) * NS_PER_MS, min(c + s * b for c, s in lines)
                        assert g <= f + 1e-6
                        if slack == 0:
                            assert f - g <= 2 * PIECE_TOLERANCE_NS + 1e-6
                    for b in [b1 + slack] + [rng.randint(b1, b1 + slack) for _ in range(5)]:
                        assert min(c + s * b for c, s in lines) <= link.time_ms(kind, b) * NS_PER_MS + 1e-6


def test_a_merged_bucket_is_priced_exactly_on_a_curve_that_is_not_concave():
    # torch's all_reduce curve bends up (tree to ring, at powers of two): the concave minorant
    # alone priced such buckets up to 2.5 ms low per bucket at 64 nodes, so no plan met its bound.
    # Here a curve that bends up at 64 KiB and down after, two gathers merged across the bend:
    # the model with the plan fixed is planner.simulate's step (up to its ns slack and the pieces'
    # tolerance), where the minorant alone is not
    table = ((0, 0.02), (1 << 16, 0.05), (1 << 17, 0.5), (1 << 20, 1.0))
    link = planner.Link(pg="0", group_size=4, table={"all_gather": table})
    missed = 0
    for wire in (36864, 40960, 49152, 61440, 98304, 200704):
        problem = two_gathers((wire, wire), (wire // 4, wire // 4), link)
        plan = merged(problem)
        assert not planner.verify(problem, plan)
        sim = planner.simulate(problem, plan).step_ms
        model_ms, slack_ms = _model_value_ms(problem, plan)
        assert abs(model_ms - sim) <= slack_ms + 2 * 2 * PIECE_TOLERANCE_NS / NS_PER_MS
        minorant_ms, _ = _model_value_ms(problem, plan, exact=False)
        missed += sim - minorant_ms > 1e-3
    assert missed >= 3  # the case this is for: the minorant alone is more than 1 µs low
    # a merge priced far above its members' own times (free alone, 7.5 ms merged, beside 2 ms of
    # compute): the model's clocks must still reach it
    link = planner.Link(pg="0", group_size=4, table={"all_gather": ((0, 0.0), (1 << 16, 0.0), (1 << 17, 30.0))})
    problem = two_gathers((40960, 40960), (10240, 10240), link)
    plan = merged(problem)
    assert not planner.verify(problem, plan)
    model_ms, slack_ms = _model_value_ms(problem, plan)
    assert abs(model_ms - planner.simulate(problem, plan).step_ms) <= slack_ms + 2 * 2 * PIECE_TOLERANCE_NS / NS_PER_MS


def test_pieces_stay_under_a_falling_curve_with_rounded_bytes_and_past_its_zero():
    # two counterexamples from review: (1) a curve that falls, bytes not whole 64s: the model
    # reads the lines at the bytes rounded down, where a falling line is higher (it asked 94 and
    # 375 ns over the curve); (2) a last segment that falls and stops at 0: a chord across the
    # zero lies above the curve (45 ns over at 5120 bytes)
    from planner.search.step import duration_pieces

    falling = planner.Link(pg="0", group_size=4, table={"all_gather": ((0, 0.0), (1024, 0.010), (2048, 0.002),
                                                                        (4096, 0.020))})
    problem = two_gathers((1100, 100), (275, 25), falling)
    for plan in (merged(problem), planner.Plan(problem_fingerprint=problem.fingerprint, planner="none",
                                               created="t", buckets=())):
        assert not planner.verify(problem, plan)
        model_ms, slack_ms = _model_value_ms(problem, plan)
        assert model_ms <= planner.simulate(problem, plan).step_ms + slack_ms
    to_zero = planner.Link(pg="0", group_size=4, table={"all_gather": ((0, 0.0), (2048, 0.3), (4096, 0.1001))})
    for b0, b1, lines in duration_pieces(to_zero, "all_gather", 4096, 6400, 0):
        for b in range(b0, b1 + 1, 8):
            assert min(c + s * b for c, s in lines) <= to_zero.time_ms("all_gather", b) * NS_PER_MS + 1e-6


def test_a_folded_conversion_is_priced_at_its_buckets_copy_in():
    # ag_b folds a 2 ms conversion scheduled after ag_a's wait. Merged at ag_a's start, the
    # conversion runs first (0-2 ms), then the bucket (d ms) is issued while mm_0 and mm_1 run
    # (2-6 ms): the step is 2 + d, by hand. Were the conversion left at its place (the bucket
    # issued at 0), the step would be max(6, d) = d, 2 ms less. The simulator, the step model
    # with this plan fixed, and the step search all price the move.
    link = planner.Link(pg="0", group_size=8, latency_ms=0.05, bandwidth_gbps=0.3)
    problem = folded_pair(link)
    plan = planner.Plan(problem_fingerprint=problem.fingerprint, planner="test", created="t", buckets=(
        planner.Bucket(members=("ag_a", "ag_b"), start="ag_a", wait="ag_b"),))
    assert planner.verify(problem, plan) == []
    d = link.time_ms("all_gather", 2 << 20)
    assert d > 6  # the bucket outlasts the compute: where it is issued is the step
    sim = planner.simulate(problem, plan)
    assert abs(sim.step_ms - (2 + d)) < 1e-9
    assert [r.name for r in sim.compute] == ["conv", "mm_0", "mm_1"]
    model_ms, slack_ms = _model_value_ms(problem, plan)
    assert abs(model_ms - sim.step_ms) <= slack_ms
    result = solve(problem, planner.SolveOptions(time_limit_s=10, objective="step", workers=1))
    assert abs(result.objective - _brute_force_step(problem)) < 1e-6
