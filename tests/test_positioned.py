"""planner.positioned: the step model with positions prices a plan exactly as planner.simulate does
(within its ns of rounding), its optimum over a tiny problem's candidate space is the brute-force
optimum of the plans in that space, and its bound is never above it."""

from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, given, settings
from ortools.sat.python import cp_model

import planner
from planner.position_search import position_search, positioned_policy
from planner.positioned import (add_positioned_step, build_positioned_model, candidates, hint_fully,
                                model_step_ms)
from tests.brute import positioned_plans
from tests.strategies import problems

RULES = positioned_policy(None).as_params()


def _in_plan_order(problem: planner.Problem, plan: planner.Plan) -> planner.Plan:
    """The plan with its buckets in its anchors' order: several buckets issued before one node go
    in plan order, and the model's space takes them in its anchors' order (planner.positioned)."""
    at = {c.name: c.start_pos for c in problem.collectives}
    return plan.model_copy(update={"buckets": tuple(sorted(plan.buckets, key=lambda b: at[b.start]))})


def _priced(problem: planner.Problem, plan: planner.Plan) -> float:
    """The model's step with every choice of ``plan`` fixed, solved to optimality (ms)."""
    found = candidates(problem, [plan])
    h = build_positioned_model(problem, found, window=64)
    add_positioned_step(h)
    assert h.add_hint(plan) == len(plan.buckets)
    proto = h.model.proto
    for var, value in zip(proto.solution_hint.vars, proto.solution_hint.values):
        h.model.add(h.model.get_int_var_from_proto_index(var) == value)
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.max_time_in_seconds = 60
    assert solver.solve(h.model) == cp_model.OPTIMAL
    return model_step_ms(h, solver), h.slack_ns / 1e6


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(max_collectives=2, max_compute=3, costs=True))
def test_a_fixed_plan_is_priced_as_the_simulator_prices_it(problem):
    """Every verified positioned plan of a tiny problem (a sample): the model's step with the
    plan fixed equals planner.simulate's within the model's ns of rounding."""
    plans = [_in_plan_order(problem, p) for p in positioned_plans(problem)]
    legal = [p for p in plans[::max(1, len(plans) // 40)] if not planner.verify(problem, p, **RULES)]
    for plan in legal[:5]:
        model_ms, slack_ms = _priced(problem, plan)
        simulated = planner.simulate(problem, plan).step_ms
        assert abs(model_ms - simulated) <= slack_ms + 1e-9, (plan, model_ms, simulated)  # ns rounding


def test_a_positioned_plan_of_fsdp_is_priced_as_the_simulator_prices_it(get_scheduled):
    """At 2 layers, on a table link with bucketing costs: the positioned search's plans."""
    problem = get_scheduled("llama3-8b-fsdp-2", preset="h100-8nodes").problem
    for seed in (0, 1):
        plan = position_search(problem, [], peak_memory_bytes=None, deadline=time.perf_counter() + 60,
                                max_evaluations=300, seed=seed).plan
        plan = _in_plan_order(problem, plan)
        model_ms, slack_ms = _priced(problem, plan)
        simulated = planner.simulate(problem, plan).step_ms
        assert abs(model_ms - simulated) <= slack_ms + 1e-9


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(max_collectives=2, max_compute=3, costs=True))
def test_the_optimum_of_the_candidate_space_is_the_brute_force_one_and_the_bound_holds(problem):
    """With every brute-force plan's places as candidates (and every member within the window),
    the model's optimum is the best simulated step over the legal plans in anchor order, and its
    bound is never above it."""
    plans = [_in_plan_order(problem, p) for p in positioned_plans(problem)]
    legal = [p for p in plans if not planner.verify(problem, p, **RULES)]
    best = min(planner.simulate(problem, p).step_ms for p in legal)
    h = build_positioned_model(problem, candidates(problem, legal), window=64)
    add_positioned_step(h)
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.max_time_in_seconds = 60
    assert solver.solve(h.model) == cp_model.OPTIMAL
    found = h.extract(solver, params=RULES)
    assert not planner.verify(problem, found, **RULES)
    slack = h.slack_ns / 1e6
    assert planner.simulate(problem, found).step_ms == pytest.approx(best, abs=slack + 1e-6)
    assert (solver.best_objective_bound - h.slack_ns) / 1e6 <= best + 1e-9


def test_a_full_hint_starts_the_search_from_the_plan(get_scheduled):
    """hint_fully: a whole solution, times included, that CP-SAT takes as its first."""
    problem = get_scheduled("llama3-8b-fsdp-2", preset="h100-8nodes").problem
    plan = _in_plan_order(problem, position_search(problem, [], peak_memory_bytes=None,
                                                   deadline=time.perf_counter() + 60, max_evaluations=200).plan)
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
