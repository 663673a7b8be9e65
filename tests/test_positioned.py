"""planner.search.free.model: the step model with positions prices a plan exactly as planner.simulate does
(within its ns of rounding), its optimum over a tiny problem's candidate space is the brute-force
optimum of the plans in that space, and its bound is never above it."""

from __future__ import annotations

import math
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ortools.sat.python import cp_model

import planner
from planner.search.free.position_search import position_search, positioned_policy
from planner.search.free.model import (add_positioned_step, build_positioned_model, candidates, hint_fully,
                                model_step_ms)
from tests.brute import positioned_plans
from tests.strategies import exact_memory, gathers_before_use, problems, two_gathers

RULES = positioned_policy(None).as_params()


def _reversed(plan: planner.Plan) -> planner.Plan:
    """The plan with its buckets listed the other way round: several buckets issued before one node
    go in plan order, so this is another plan wherever two share a start place."""
    return plan.model_copy(update={"buckets": tuple(reversed(plan.buckets))})


def _shared_start_places(plan: planner.Plan) -> int:
    """How many nodes two or more of the plan's buckets are issued before."""
    named = [b.issue_before for b in plan.buckets if b.issue_before is not None]
    return sum(1 for n in set(named) if named.count(n) > 1)


def _priced(problem: planner.Problem, plan: planner.Plan) -> tuple[float, float]:
    """The model's step with every choice of ``plan`` fixed, solved to optimality (ms), and its
    rounding slack (ms). The plan the solver's answer is written as (``extract``) must be the same
    plan, bucket order included: it simulates to the same step."""
    found = candidates(problem, [plan])
    h = build_positioned_model(problem, found, window=64)
    add_positioned_step(h)
    solver = _solved_with_plan_fixed(h, plan)
    extracted = h.extract(solver, params=RULES)
    assert planner.simulate(problem, extracted).step_ms == pytest.approx(planner.simulate(problem, plan).step_ms,
                                                                         abs=1e-9)
    return model_step_ms(h, solver), h.slack_ns / 1e6


def _solved_with_plan_fixed(h, plan: planner.Plan) -> cp_model.CpSolver:
    """The solver of ``h``'s model with every choice of ``plan`` fixed, which must be optimal:
    the plan fits the candidate space and no constraint removes it."""
    assert h.add_hint(plan) == len(plan.buckets)
    proto = h.model.proto
    for var, value in zip(proto.solution_hint.vars, proto.solution_hint.values):
        h.model.add(h.model.get_int_var_from_proto_index(var) == value)
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.max_time_in_seconds = 60
    assert solver.solve(h.model) == cp_model.OPTIMAL, plan.planner
    return solver


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(max_collectives=2, max_compute=3, costs=True))
def test_a_fixed_plan_is_priced_as_the_simulator_prices_it(problem):
    """Every verified positioned plan of a tiny problem (a sample), its buckets in either order:
    the model's step with the plan fixed equals planner.simulate's within the model's ns of
    rounding."""
    plans = list(positioned_plans(problem))
    legal = [p for p in plans[::max(1, len(plans) // 40)] if not planner.verify(problem, p, **RULES)]
    for plan in [q for p in legal[:5] for q in (p, _reversed(p))]:
        model_ms, slack_ms = _priced(problem, plan)
        simulated = planner.simulate(problem, plan).step_ms
        assert abs(model_ms - simulated) <= slack_ms + 1e-9, (plan, model_ms, simulated)  # ns rounding


def test_a_positioned_plan_of_fsdp_is_priced_as_the_simulator_prices_it(get_scheduled):
    """At 2 layers, on a table link with bucketing costs: the positioned search's plans as written,
    and listed the other way round (several starts before one node in another order: the model
    once took them in its anchors' order and priced such a plan 6.5 ms above the simulator)."""
    problem = get_scheduled("llama3-8b-fsdp-2", preset="h100-8nodes").problem
    for seed in (0, 1):
        plan = position_search(problem, [], planner.PositionSearchOptions(seed=seed, max_evaluations=300),
                               peak_memory_bytes=None, deadline=time.perf_counter() + 60).plan
        assert _shared_start_places(plan) > 0  # else the order of starts is not tested here
        for written in (plan, _reversed(plan)):
            model_ms, slack_ms = _priced(problem, written)
            simulated = planner.simulate(problem, written).step_ms
            assert abs(model_ms - simulated) <= slack_ms + 1e-9, (seed, written is plan, model_ms, simulated)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(max_collectives=2, max_compute=3, costs=True))
def test_the_optimum_of_the_candidate_space_is_the_brute_force_one_and_the_bound_holds(problem):
    """With every brute-force plan's places as candidates (and every member within the window),
    the model's optimum is the best simulated step over the legal plans in anchor order, and its
    bound is never above it."""
    _check_the_optimum(problem)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(max_collectives=2, max_compute=3, max_pgs=1, dtypes=("bfloat16",), costs=True,
                kinds=("all_gather",)) | problems(max_collectives=2, max_compute=3, max_pgs=1,
                                                   dtypes=("bfloat16",), costs=True, kinds=("reduce_scatter",)))
def test_on_one_bucket_key_the_optimum_is_the_brute_force_one(problem):
    """As above, where every pair may merge (one kind, group and dtype) and the bucket cap
    sometimes forbids it: the membership rules (one bucket each, anchors are members, the cap)
    and the places' (a named place belongs to a bucket that exists) are what keep the model's
    optimum a plan (experiments/results/positioned_mutants: each dropped, a test here fails)."""
    _check_the_optimum(problem)


def _check_the_optimum(problem: planner.Problem) -> None:
    legal = _legal_plans(problem)
    best = min(planner.simulate(problem, p).step_ms for p in legal)
    h, solver, found = _solved_to_optimality(problem, candidates(problem, legal))
    assert planner.simulate(problem, found).step_ms == pytest.approx(best, abs=h.slack_ns / 1e6 + 1e-6)
    assert (solver.best_objective_bound - h.slack_ns) / 1e6 <= best + 1e-9


def _solved_to_optimality(problem: planner.Problem, found_places, cap: int | None = None, instants=()) -> tuple:
    """(handle, solver, plan) of the model over ``found_places`` (within ``cap`` at ``instants``,
    if given) solved to optimality: the plan verifies and the model's objective is its simulated
    step, within the model's ns of rounding."""
    from planner.search.free.model import MemoryCap

    h = build_positioned_model(problem, found_places, window=64)
    add_positioned_step(h)
    if cap is not None:
        MemoryCap(h, cap).add(instants)
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.max_time_in_seconds = 60
    assert solver.solve(h.model) == cp_model.OPTIMAL
    found = h.extract(solver, params=RULES)
    assert not planner.verify(problem, found, **RULES)
    simulated = planner.simulate(problem, found).step_ms
    # the objective is the step
    assert model_step_ms(h, solver) == pytest.approx(simulated, abs=h.slack_ns / 1e6 + 1e-6)
    return h, solver, found


def test_where_merging_pays_the_optimum_is_the_brute_force_one():
    """Hand-made, so the rules that keep a solution a plan are sure to be tested: two gathers
    whose merge saves a millisecond (a collective may join only a bucket whose anchor is in it:
    without that rule the model drops both waits)."""
    link = planner.Link(pg="0", group_size=8, latency_ms=1.0, bandwidth_gbps=50.0)
    _check_the_optimum(two_gathers((1 << 20, 1 << 20), (1 << 20, 1 << 20), link))


def _one_key_gathers(nodes: list[tuple], colls: list[tuple], cap: int = 1 << 30) -> planner.Problem:
    """A problem from (name, kind, deps) nodes in schedule order and (start, wait, folded)
    all_gathers of one key, 1 MiB each, exposed, on a link whose latency (1 ms) makes merging pay,
    with bucket cap ``cap``."""
    pos = {name: k for k, (name, _, _) in enumerate(nodes)}
    made = tuple(planner.Node(name=name, kind=kind, pos=k, est_ms=1.0 if kind == "compute" else 0.0,
                              deps=tuple(pos[d] for d in deps)) for k, (name, kind, deps) in enumerate(nodes))
    made_colls = tuple(planner.Collective(name=start, wait=wait, kind="all_gather", pg="0",
                                          key="all_gather/0/bfloat16", dtype="bfloat16", size_bytes=1 << 20,
                                          wire_bytes=1 << 20, est_ms=0.0, exposed_ms=0.0, start_pos=pos[start],
                                          wait_pos=pos[wait], status="exposed", folded=folded)
                       for start, wait, folded in colls)
    types = "".join({"compute": "c", "start": "s", "wait": "w"}[kind] for _, kind, _ in nodes)
    link = planner.Link(pg="0", group_size=8, latency_ms=1.0, bandwidth_gbps=50.0)
    return planner.Problem(bucket_mode="default", bucket_cap_bytes=cap, n_scheduled=len(nodes),
                           collectives=made_colls, nodes=made, links=(link,),
                           timelines=(planner.Timeline(pg="0", nodes=tuple(range(len(nodes))), types=types),)
                           ).with_fingerprint()


@pytest.mark.parametrize("nodes, colls", [
    # ag2's data come from mm_1: merged, the bucket starts after mm_1, not at ag1's start
    ([("mm_0", "compute", ()), ("ag1", "start", ()), ("mm_1", "compute", ()), ("ag2", "start", ("mm_1",)),
      ("w1", "wait", ("ag1",)), ("w2", "wait", ("ag2",)), ("mm_2", "compute", ("w1", "w2"))],
     [("ag1", "w1", ()), ("ag2", "w2", ())]),
    # mm_1 uses ag1: merged, the bucket waits before mm_1, not at ag2's wait
    ([("mm_0", "compute", ()), ("ag1", "start", ()), ("ag2", "start", ()), ("w1", "wait", ("ag1",)),
      ("mm_1", "compute", ("w1",)), ("w2", "wait", ("ag2",)), ("mm_2", "compute", ("w2",))],
     [("ag1", "w1", ()), ("ag2", "w2", ())]),
    # ag_b's folded conversion reads ag_a's result: merged, the conversion would run before ag_a's wait
    ([("ag_a", "start", ()), ("mm_0", "compute", ()), ("w_a", "wait", ("ag_a",)), ("conv", "compute", ("w_a",)),
      ("ag_b", "start", ("conv",)), ("mm_1", "compute", ()), ("w_b", "wait", ("ag_b",))],
     [("ag_a", "w_a", ()), ("ag_b", "w_b", ("conv",))]),
], ids=["data-released-late", "consumer-early", "folded-conversion-reads-a-wait"])
def test_where_the_data_forbid_the_best_merge_the_optimum_is_the_brute_force_one(nodes, colls):
    """Hand-made, one rule of the data each: merging the two gathers would pay, but where the
    merged bucket would sit breaks a dependence, so the model's optimum is the best legal plan."""
    _check_the_optimum(_one_key_gathers(nodes, colls))


def test_where_the_best_wait_is_a_joiners_own_the_model_reaches_it():
    """Hand-made: ag2's data come from mm_1, so a bucket of both gathers starts at ag2 (its anchor),
    and its best wait is ag1's own, right before mm_3, which consumes both: at ag2's own wait the
    bucket would stall the compute. Over the places of ``candidates(problem)`` (gathers get no
    named waits) only the option of waiting at a joiner's own wait reaches that plan, and it must:
    ag1's wait is one position before the first consumer, the last place the data allow. The
    model's optimum is the best legal plan of that space (brute force)."""
    nodes = [("mm_0", "compute", ()), ("ag1", "start", ()), ("mm_1", "compute", ()), ("ag2", "start", ("mm_1",)),
             ("w2", "wait", ("ag2",)), ("mm_2", "compute", ()), ("w1", "wait", ("ag1",)),
             ("mm_3", "compute", ("w1", "w2"))]
    problem = _one_key_gathers(nodes, [("ag1", "w1", ()), ("ag2", "w2", ())])
    places = candidates(problem)
    assert not places.waits
    in_space = [p for p in _legal_plans(problem)
                if all(b.wait_before is None and b.issue_before in {None, *places.starts.get(b.start, ())}
                       for b in p.buckets)]
    best = min(planner.simulate(problem, p).step_ms for p in in_space)
    h, _, found = _solved_to_optimality(problem, places)
    assert planner.simulate(problem, found).step_ms == pytest.approx(best, abs=h.slack_ns / 1e6 + 1e-6)
    assert [(b.members, b.start, b.wait) for b in found.buckets] == [(("ag1", "ag2"), "ag2", "ag1")]


def test_where_two_of_three_fit_the_cap_the_optimum_merges_two():
    """Three gathers, any two within the bucket cap and three not: the model's optimum is a plan
    (the cap holds over a whole bucket, not only over each pair), priced as the simulator prices
    it, and merges two of them (no plan within the cap merges three)."""
    nodes = [("mm_0", "compute", ()), *((f"ag{k}", "start", ()) for k in (1, 2, 3)),
             *((f"w{k}", "wait", (f"ag{k}",)) for k in (1, 2, 3)), ("mm_1", "compute", ("w1", "w2", "w3"))]
    problem = _one_key_gathers(nodes, [(f"ag{k}", f"w{k}", ()) for k in (1, 2, 3)], cap=5 << 19)
    _, _, found = _solved_to_optimality(problem, candidates(problem))
    assert max(len(b.members) for b in found.buckets) == 2


def test_a_full_hint_starts_the_search_from_the_plan(get_scheduled):
    """hint_fully: a whole solution, times included, that CP-SAT takes as its first."""
    problem = get_scheduled("llama3-8b-fsdp-2", preset="h100-8nodes").problem
    plan = position_search(problem, [], planner.PositionSearchOptions(max_evaluations=200),
                           peak_memory_bytes=None, deadline=time.perf_counter() + 60).plan
    found = candidates(problem, [plan])
    h, twin = build_positioned_model(problem, found), build_positioned_model(problem, found)
    add_positioned_step(h)
    add_positioned_step(twin)
    assert hint_fully(h, twin, plan)
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.max_time_in_seconds = 5
    solver.parameters.max_presolve_iterations = 1
    solver.parameters.cp_model_probing_level = 0
    assert solver.solve(h.model) in (cp_model.OPTIMAL, cp_model.FEASIBLE)
    extracted = h.extract(solver, params=RULES)
    assert not planner.verify(problem, extracted, **RULES)
    assert planner.simulate(problem, extracted).step_ms <= planner.simulate(problem, plan).step_ms + 1e-6


def _fsdp2_plans(problem: planner.Problem) -> list[planner.Plan]:
    """Plans whose buffers differ: anchored merges of every kind (CP-SAT's fewest collectives) and
    positioned ones (the positioned search, with and without a memory budget)."""
    count = planner.solve(problem, planner.SolveOptions(time_limit_s=5, objective="count", workers=1)).plan
    plans = [count]
    for seed, budget in ((0, None), (1, planner.cost.memory.peak_bytes(problem))):
        options = planner.PositionSearchOptions(seed=seed, max_evaluations=150)
        plans.append(position_search(problem, [], options, peak_memory_bytes=budget,
                                     deadline=time.perf_counter() + 60).plan)
    return plans


def test_no_instant_holds_more_than_the_memory_profile_says(get_scheduled):
    """memory_profile lists the instants where the memory can change, and the memory cap may
    constrain any instant (a bound must hold for every plan): at every place a candidate start or
    wait may take, and just around it, memory_at is at most the profile's value at the instant
    listed before it (within a run) or after it (just before a pinned node, where the own memory
    is what the node's run holds at most), and equal to it at the listed ones."""
    from bisect import bisect_left

    from planner.cost.memory import memory_at, memory_profile

    problem = get_scheduled("llama3-8b-fsdp-2", preset="h100-8nodes").problem
    plans = _fsdp2_plans(problem)
    h = build_positioned_model(problem, candidates(problem, plans))
    places = {p / 4 for opts in (*h.starts.values(), *h.waits.values()) for p, _, _ in opts}
    instants = sorted({t + d for t in places for d in (-1 / 16, -1 / 32, 0, 1 / 32, 1 / 16)})
    for plan in [None, *plans]:
        profile = memory_profile(problem, plan)
        keys = [k for k, _ in profile]
        for key, held in profile[::7]:
            assert memory_at(problem, plan, key) == held
        for t in instants:
            k = bisect_left(keys, t)
            around = [profile[j][1] for j in (k - 1, k) if 0 <= j < len(profile)]
            assert memory_at(problem, plan, t) <= max(around), (t, plan and plan.planner)


def _memory_grid(problem: planner.Problem) -> list[float]:
    """Every 1/INSTANTS_PER_POSITION of a position, from one position before the graph to one after."""
    from planner.cost.memory import INSTANTS_PER_POSITION

    return [k / INSTANTS_PER_POSITION for k in range(-INSTANTS_PER_POSITION,
                                                     (problem.n_scheduled + 1) * INSTANTS_PER_POSITION)]


def _legal_plans(problem: planner.Problem) -> list[planner.Plan]:
    """Every positioned plan of a tiny problem the verifier accepts under the positioned policy."""
    return [p for p in positioned_plans(problem) if not planner.verify(problem, p, **RULES)]


@pytest.mark.slow  # every legal plan's memory at every instant: 8-12 s
@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(gathers_before_use() | problems(max_collectives=2, max_compute=3, max_pgs=1, dtypes=("bfloat16",),
                                       costs=True).flatmap(exact_memory))
def test_the_profile_peak_is_the_most_any_instant_holds(problem):
    """On FSDP-like gathers and random gathers, reduce_scatters and all_reduces with exact memory
    profiles, unbucketed and under every legal positioned plan: memory_profile's peak (its
    instants only) is the most memory_at, summed from the buffers, holds on a 1/32-position grid
    from one position before the graph. (Instants before position 0 once read the first run's
    peak, not what the graph holds before it runs.)"""
    from planner.cost.memory import memory_at, peak_bytes

    grid = _memory_grid(problem)
    for plan in [None, *_legal_plans(problem)]:
        assert peak_bytes(problem, plan) == max(memory_at(problem, plan, t) for t in grid)


def test_before_the_graph_runs_only_its_inputs_are_held():
    """Hand-made: a reduce_scatter whose 1 MiB input exists before the graph, issued before the
    first node (mm_0, whose run peaks at 4 MiB; nothing is held just before it). Before position 0
    the graph holds the input and nothing of its own (1 MiB), at mm_0 its 4 MiB and no input: the
    peak is 4 MiB, by memory_profile and at every instant by memory_at. (The first run's peak read
    before position 0 made memory_at 5 MiB at -1, where memory_profile said 4.)"""
    from planner.cost.memory import memory_at, peak_bytes

    N, mib = planner.Node, 1 << 20
    nodes = (N(name="mm_0", kind="compute", pos=0, est_ms=1.0), N(name="rs", kind="start", pos=1, est_ms=0.0),
             N(name="w", kind="wait", pos=2, est_ms=0.0, deps=(1,)),
             N(name="mm_1", kind="compute", pos=3, est_ms=1.0, deps=(2,)))
    coll = planner.Collective(name="rs", wait="w", kind="reduce_scatter", pg="0", key="reduce_scatter/0/bfloat16",
                              dtype="bfloat16", size_bytes=mib, wire_bytes=mib, est_ms=0.0, exposed_ms=0.0,
                              start_pos=1, wait_pos=2, status="exposed")
    buffers = {"rs": planner.CollectiveBuffers(out_bytes=0, out_last_use=2, in_bytes=mib, in_alloc=-1, wait_bytes=0,
                                               wait_last_use=3)}
    memory = planner.MemoryProfile(segment_peak_bytes=(4 * mib,) * 5, buffers=buffers, run_starts=(0, 1, 2, 3),
                                   run_peak_bytes=(4 * mib, 0, 0, 0), before_bytes=(0, 0, 0, 0))
    link = planner.Link(pg="0", group_size=8, latency_ms=1.0, bandwidth_gbps=50.0)
    problem = planner.Problem(bucket_mode="default", bucket_cap_bytes=1 << 30, n_scheduled=4, collectives=(coll,),
                              nodes=nodes, links=(link,), memory=memory,
                              timelines=(planner.Timeline(pg="0", nodes=(0, 1, 2, 3), types="cswc"),)).with_fingerprint()
    plan = planner.Plan(problem_fingerprint=problem.fingerprint, planner="hand", params={}, created="",
                        buckets=(planner.Bucket(members=("rs",), start="rs", wait="rs", issue_before="mm_0"),))
    assert not planner.verify(problem, plan, **RULES)
    assert [memory_at(problem, plan, t) for t in (-1.0, -0.5, -0.25, 0.0, 0.5)] == [mib, mib, mib, 4 * mib, 0]
    assert peak_bytes(problem, plan) == 4 * mib
    # what a node finds held it holds while it runs: a profile saying otherwise is refused, by name
    with pytest.raises(ValueError, match=r"before_bytes\[0\] \('mm_0'\)"):
        planner.Problem.model_validate({**problem.model_dump(),
                                        "memory": {**memory.model_dump(), "before_bytes": (5 * mib, 0, 0, 0)}})


def test_the_memory_cap_counts_a_fixed_plan_as_planner_memory_does(get_scheduled):
    """With every choice of a plan fixed, the least the model can hold at an instant is
    planner.cost.memory's figure there, at the plan's fullest instants and at others; and a cap one byte
    below its peak, at the peak's instant, makes the plan impossible."""
    from planner.cost.memory import memory_at, memory_profile, own_memory
    from planner.search.free.model import MemoryCap

    problem = get_scheduled("llama3-8b-fsdp-2", preset="h100-8nodes").problem
    own = own_memory(problem)
    plans = _fsdp2_plans(problem)
    for plan in plans:
        profile = memory_profile(problem, plan)
        h = build_positioned_model(problem, candidates(problem, [plan]))
        assert h.add_hint(plan) == len(plan.buckets)
        proto = h.model.proto
        for var, value in zip(proto.solution_hint.vars, proto.solution_hint.values):
            h.model.add(h.model.get_int_var_from_proto_index(var) == value)
        cap = MemoryCap(h, 1 << 62)
        # every instant's terms are its own, so the least sum is the least at each instant
        instants = profile[::max(1, len(profile) // 60)]
        held = [cap._held_at(round(t * 32)) for t, _ in instants]
        h.model.minimize(sum(held))
        solver = cp_model.CpSolver()
        solver.parameters.num_workers = 1
        assert solver.solve(h.model) == cp_model.OPTIMAL
        for (t, total), expr in zip(instants, held):
            assert solver.value(expr) + own(t) == total == memory_at(problem, plan, t), (plan.planner, t)
        peak_at, peak = max(profile, key=lambda kv: kv[1])
        h = build_positioned_model(problem, candidates(problem, [plan]))
        h.add_hint(plan)
        proto = h.model.proto
        for var, value in zip(proto.solution_hint.vars, proto.solution_hint.values):
            h.model.add(h.model.get_int_var_from_proto_index(var) == value)
        MemoryCap(h, peak - 1).add([peak_at])
        solver = cp_model.CpSolver()
        solver.parameters.num_workers = 1
        assert solver.solve(h.model) == cp_model.INFEASIBLE


def test_the_capped_solve_returns_a_verified_plan_within_the_cap_and_a_bound_below_it(get_scheduled):
    """solve_capped on llama3-8b-fsdp-2 within the unbucketed schedule's peak, from a positioned
    search's plan: the plan returned is verified, within the cap by planner.cost.memory, no slower than
    the plan it started from, and its bound lies between free_position_floor and its step."""
    from planner.cost.bounds import free_position_floor
    from planner.cost.memory import peak_bytes
    from planner.search.free.capped import CappedModelOptions, solve_capped

    problem = get_scheduled("llama3-8b-fsdp-2", preset="h100-8nodes").problem
    cap = peak_bytes(problem)
    start = position_search(problem, [], planner.PositionSearchOptions(seed=0, max_evaluations=100),
                            peak_memory_bytes=cap, deadline=time.perf_counter() + 60)
    floor = free_position_floor(problem).floor_ms
    result = solve_capped(problem, [start.plan], peak_memory_bytes=cap, time_limit_s=8, floor_ms=floor,
                          search=CappedModelOptions(workers=1))
    assert not planner.verify(problem, result.plan, **positioned_policy(cap).as_params())
    assert result.peak_bytes == peak_bytes(problem, result.plan) <= cap
    assert result.objective == planner.simulate(problem, result.plan).step_ms <= start.objective
    assert floor - 1e-6 <= result.bound <= result.objective
    assert result.stats["instants"] > 0


@pytest.mark.slow  # a search and two solves of the capped model
def test_a_deterministic_capped_solve_gives_the_same_answer_twice(get_scheduled):
    """CappedModelOptions(deterministic=True): the limit is CP-SAT's deterministic time, so two solves
    from the same plan return the same plan, byte for byte, status and bound."""
    from planner.cost.memory import peak_bytes
    from planner.search.free.capped import CappedModelOptions, solve_capped

    problem = get_scheduled("llama3-8b-fsdp-2", preset="h100-8nodes").problem
    cap = peak_bytes(problem)
    start = position_search(problem, [], planner.PositionSearchOptions(seed=1, max_evaluations=100),
                            peak_memory_bytes=cap, deadline=time.perf_counter() + 60)
    runs = [solve_capped(problem, [start.plan], peak_memory_bytes=cap, time_limit_s=0.5,
                         search=CappedModelOptions(deterministic=True)) for _ in range(2)]
    assert runs[0].plan.model_dump_json() == runs[1].plan.model_dump_json()
    assert (runs[0].status, runs[0].bound) == (runs[1].status, runs[1].bound)
    assert not runs[0].stats["wall_limit_hit"]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 1 << 20), st.floats(0.0, 5.0)), min_size=1, max_size=6),
       st.floats(0.0, 0.2), st.integers(1, 2 << 20), st.integers(1, 4))
def test_the_most_time_of_early_buckets_is_never_below_a_split_of_their_bytes(points, at_zero, budget, k):
    """most_time_ms, the time the phase cuts allow buckets started early: never below the time of
    any split of ``budget`` bytes into at most ``k`` buckets (a brute force over a grid of splits),
    on a table link whose curve may rise and fall."""
    from planner.search.free.cuts import most_time_ms

    table = {"all_gather": [(0, at_zero), *sorted({b: t for b, t in points}.items())]}
    link = planner.Link(pg="0", group_size=2, table=table)
    grid = 40
    times = [link.time_ms("all_gather", budget * u // grid) for u in range(grid + 1)]
    best = [0.0] + [-math.inf] * grid  # best[u]: the most time of splits of u grid units so far
    most = 0.0
    for _ in range(k):
        best = [max(best[u - v] + times[v] for v in range(u + 1)) for u in range(grid + 1)]
        most = max(most, max(best))
    assert most_time_ms(link, "all_gather", budget, k) >= most - 1e-9


@pytest.mark.slow  # peaks of every legal plan at every instant of the grid: 8-15 s
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(gathers_before_use() | problems(max_collectives=2, max_compute=3, max_pgs=1, dtypes=("bfloat16",),
                                       costs=True).flatmap(exact_memory), st.integers(0, 100))
def test_within_a_cap_the_optimum_is_the_brute_force_one_and_the_bound_holds(problem, pick):
    """On FSDP-like gathers and on random gathers and reduce_scatters, with exact memory profiles:
    with a memory cap (one of the legal plans' peaks) exact at every instant of a 1/32-position
    grid, and so every cut the cap brings (places over it, the phase cuts): the model's optimum is
    the best simulated step of the legal plans within the cap, and its bound is never above it.
    The peaks are memory_at's, summed from the buffers at every instant of the grid (the
    independent count; the test above holds memory_profile to it)."""
    _check_the_optimum_within(problem, lambda peaks: peaks[pick % len(peaks)])


def _check_the_optimum_within(problem: planner.Problem, choose_cap) -> planner.Plan:
    """The capped model's optimum against brute force (the test above): ``choose_cap`` picks the
    cap from the legal plans' distinct peaks, in order. Returns the model's plan."""
    from planner.cost.memory import memory_at

    grid = _memory_grid(problem)
    legal = _legal_plans(problem)
    peak = {id(p): max(memory_at(problem, p, t) for t in grid) for p in legal}
    cap = choose_cap(sorted(set(peak.values())))
    best = min(planner.simulate(problem, p).step_ms for p in legal if peak[id(p)] <= cap)
    h, solver, found = _solved_to_optimality(problem, candidates(problem, legal), cap, grid)
    assert max(memory_at(problem, found, t) for t in grid) <= cap
    assert planner.simulate(problem, found).step_ms == pytest.approx(best, abs=h.slack_ns / 1e6 + 1e-6)
    assert (solver.best_objective_bound - h.slack_ns) / 1e6 <= best + 1e-9
    return found


@pytest.mark.slow  # the brute force: 4,866 legal plans' peaks over 124 instants, about 15 s
def test_a_gather_whose_own_places_are_over_the_cap_may_still_join_a_bucket():
    """Two gathers whose merge pays, and a spike of the graph's own bytes from the first start to
    past the second: neither may start at its own place within the cap, so the best plan merges
    them issued after the spike. The cut that forbids a place over the cap binds a collective only
    where it anchors: a joiner keeps its own start literal set (without that, no merge is left)."""
    nodes = [("ag1", "start", ()), ("mm_0", "compute", ()), ("ag2", "start", ()), ("mm_1", "compute", ()),
             ("mm_x", "compute", ()), ("w1", "wait", ("ag1",)), ("w2", "wait", ("ag2",)),
             ("mm_2", "compute", ("w1", "w2"))]
    problem = _one_key_gathers(nodes, [("ag1", "w1", ()), ("ag2", "w2", ())])
    mib, spike = 1 << 20, 64 << 20
    peaks = tuple(spike if 1 <= k <= 3 else 0 for k in range(len(nodes)))
    buffers = {c.name: planner.CollectiveBuffers(out_bytes=mib, out_last_use=c.wait_pos, wait_bytes=mib,
                                                 wait_last_use=7) for c in problem.collectives}
    memory = planner.MemoryProfile(segment_peak_bytes=(spike,) * (len(nodes) + 1), buffers=buffers,
                                   run_starts=tuple(range(len(nodes))), run_peak_bytes=peaks, before_bytes=peaks)
    problem = problem.model_copy(update={"memory": memory}).with_fingerprint()
    found = _check_the_optimum_within(problem, lambda peaks: max(p for p in peaks if p < spike + mib))
    assert [len(b.members) for b in found.buckets] == [2]


def test_the_cuts_keep_every_plan_within_the_cap_and_price_it_as_the_simulator(get_scheduled):
    """On llama3-8b-fsdp-2 within its unbucketed schedule's peak: every plan of _fsdp2_plans and of
    the per-block seeds that is within the cap stays a solution of the capped model once fixed (no
    cut of planner.search.free.cuts removes it), priced as planner.simulate prices it."""
    from planner.cost.memory import peak_bytes
    from planner.search.free.position_search import per_block_seed
    from planner.search.free.model import MemoryCap

    problem = get_scheduled("llama3-8b-fsdp-2", preset="h100-8nodes").problem
    cap = peak_bytes(problem)
    seeds = [planner.Plan(problem_fingerprint=problem.fingerprint, planner="seed", created="t",
                          buckets=tuple(per_block_seed(problem, wait_at_first_use=w))) for w in (False, True)]
    searched = [position_search(problem, [], planner.PositionSearchOptions(seed=seed, max_evaluations=150),
                                peak_memory_bytes=cap, deadline=time.perf_counter() + 60).plan for seed in (2, 3)]
    kept = [p for p in [*_fsdp2_plans(problem), *seeds, *searched]
            if not planner.verify(problem, p, **positioned_policy(cap).as_params())]
    assert len(kept) >= 3
    for plan in kept:  # first: its order of several starts at one place is the model's
        h = build_positioned_model(problem, candidates(problem, [plan, *kept]))
        add_positioned_step(h)
        cap_model = MemoryCap(h, cap)
        assert cap_model.stats["phase_cuts"] > 0
        solver = _solved_with_plan_fixed(h, plan)
        assert model_step_ms(h, solver) == pytest.approx(planner.simulate(problem, plan).step_ms,
                                                         abs=h.slack_ns / 1e6 + 1e-6)
