"""The library's entry points refuse a bad argument before any work, as ``solve`` does: one
``ValueError`` (``ArgumentError``) whose message names the argument, or ``PlanMismatchError``
for a plan made for another problem; never an AttributeError, a TypeError from CP-SAT's bindings,
an AssertionError or a silent answer."""

from __future__ import annotations

import time

import pytest

import planner
from planner.core.arguments import PlanMismatchError
from planner.cost import bounds, memory
from planner.search import polish as polish_module
from planner.search.free import position_search as ps
from planner.search import scenarios
from planner.search.free.capped import CappedModelOptions, solve_capped
from tests.support import data_problem

NAN = float("nan")


@pytest.fixture(scope="module")
def case():
    """A problem with an exact memory profile, its unbucketed plan, and a plan of another problem."""
    problem = data_problem("llama3-8b-fsdp-2--h100-8nodes-graph-order")
    own = planner.Plan(problem_fingerprint=problem.fingerprint, planner="u", created="", buckets=())
    other = planner.Plan(problem_fingerprint="sha256:" + "ab" * 32, planner="x", created="", buckets=())
    return problem, own, other


def _later() -> float:
    return time.perf_counter() + 30


def _capped(**kw):
    def call(P, U, O):
        args = {"peak_memory_bytes": None, "time_limit_s": 5.0, **kw}
        plans = args.pop("plans", [U])
        return solve_capped(P, plans, **args)
    return call


def _robust(scenario_list=("torch",), options="ok", **kw):
    def call(P, U, O):
        opts = planner.SolveOptions(time_limit_s=1) if options == "ok" else options
        return scenarios.robust_plan(P, list(scenario_list) if scenario_list is not None else None, opts, **kw)
    return call


def _polish(**kw):
    def call(P, U, O):
        args = {"deadline": _later(), "max_evaluations": 1, **kw}
        starts = args.pop("starts", [U])
        return polish_module.polish(P, starts if starts != "other" else [O], **args)
    return call


# (id, call(problem, own plan, other problem's plan), exception, what the message must name)
CASES = [
    # the positioned CP-SAT search's options and keywords
    ("CappedModelOptions workers -1", lambda P, U, O: CappedModelOptions(workers=-1), ValueError, "workers"),
    ("CappedModelOptions workers 20000", lambda P, U, O: CappedModelOptions(workers=20000), ValueError, "workers"),
    ("CappedModelOptions workers 2.5", lambda P, U, O: CappedModelOptions(workers=2.5), ValueError, "workers"),
    ("CappedModelOptions window -1", lambda P, U, O: CappedModelOptions(window=-1), ValueError, "window"),
    ("CappedModelOptions deterministic 'no'", lambda P, U, O: CappedModelOptions(deterministic="no"), ValueError,
     "deterministic"),
    ("solve_capped time_limit_s nan", _capped(time_limit_s=NAN), ValueError, "time_limit_s"),
    ("solve_capped time_limit_s 0", _capped(time_limit_s=0), ValueError, "time_limit_s"),
    ("solve_capped time_limit_s -1", _capped(time_limit_s=-1), ValueError, "time_limit_s"),
    ("solve_capped peak nan", _capped(peak_memory_bytes=NAN), ValueError, "peak_memory_bytes"),
    ("solve_capped floor_ms nan", _capped(floor_ms=NAN), ValueError, "floor_ms"),
    ("solve_capped search dict", _capped(search={"workers": 1}), ValueError, "search"),
    ("solve_capped say 3", _capped(say=3), ValueError, "say"),
    ("solve_capped plans None", _capped(plans=None), ValueError, "plans"),
    ("solve_capped plans [problem]", lambda P, U, O: solve_capped(P, [P], peak_memory_bytes=None, time_limit_s=1),
     ValueError, "plans[0]"),
    ("solve_capped other plan", lambda P, U, O: solve_capped(P, [O], peak_memory_bytes=None, time_limit_s=1),
     PlanMismatchError, "another problem"),
    # scenarios
    ("robust_plan options None", _robust(options=None), ValueError, "options"),
    ("robust_plan no scenario", _robust(scenario_list=()), ValueError, "scenarios"),
    ("robust_plan scenarios None", _robust(scenario_list=None), ValueError, "scenarios"),
    ("robust_plan scenario 3", _robust(scenario_list=(3,)), ValueError, "scenarios[0]"),
    ("robust_plan hint dict", _robust(hint={}), ValueError, "hint"),
    ("robust_plan progress 3", _robust(progress=3), ValueError, "progress"),
    ("robust_plan other hint", lambda P, U, O: scenarios.robust_plan(P, ["torch"], planner.SolveOptions(
        time_limit_s=1), hint=O), PlanMismatchError, "another problem"),
    ("reprice None", lambda P, U, O: scenarios.reprice(P, None), ValueError, "scenario"),
    ("reprice problem None", lambda P, U, O: scenarios.reprice(None, "torch"), ValueError, "problem"),
    ("judge other plan", lambda P, U, O: scenarios.judge(P, {"x": O}, ["torch"]), PlanMismatchError,
     "another problem"),
    ("judge plan dict", lambda P, U, O: scenarios.judge(P, {"x": {}}, ["torch"]), ValueError, "plans['x']"),
    ("judge no scenario", lambda P, U, O: scenarios.judge(P, {"x": U}, []), ValueError, "scenarios"),
    ("judge plans list", lambda P, U, O: scenarios.judge(P, [U], ["torch"]), ValueError, "plans"),
    # floors
    ("free_position_floor peak -1", lambda P, U, O: bounds.free_position_floor(P, peak_memory_bytes=-1),
     ValueError, "peak_memory_bytes"),
    ("free_position_floor peak 2**70", lambda P, U, O: bounds.free_position_floor(P, peak_memory_bytes=2**70),
     ValueError, "peak_memory_bytes"),
    ("free_position_floor peak nan", lambda P, U, O: bounds.free_position_floor(P, peak_memory_bytes=NAN),
     ValueError, "peak_memory_bytes"),
    ("free_position_floor deadline 'x'", lambda P, U, O: bounds.free_position_floor(P, deadline="x"),
     ValueError, "deadline"),
    ("release_deadline_floor peak -1", lambda P, U, O: bounds.release_deadline_floor(P, -1), ValueError,
     "peak_memory_bytes"),
    ("memory_releases peak None", lambda P, U, O: bounds.memory_releases(P, None), ValueError, "peak_memory_bytes"),
    ("memory_releases peak nan", lambda P, U, O: bounds.memory_releases(P, NAN), ValueError, "peak_memory_bytes"),
    ("key_lower_bounds protect_partly 'no'", lambda P, U, O: bounds.key_lower_bounds(P, "no"), ValueError,
     "protect_partly"),
    ("step_floor problem None", lambda P, U, O: bounds.step_floor(None), ValueError, "problem"),
    ("peak_memory_floor problem None", lambda P, U, O: bounds.peak_memory_floor(None), ValueError, "problem"),
    # local search
    ("polish problem None", lambda P, U, O: polish_module.polish(None, [U], deadline=_later()), ValueError,
     "problem"),
    ("polish starts None", _polish(starts=None), ValueError, "starts"),
    ("polish starts []", _polish(starts=[]), ValueError, "starts"),
    ("polish other start", _polish(starts="other"), PlanMismatchError, "another problem"),
    ("polish deadline nan", _polish(deadline=NAN), ValueError, "deadline"),
    ("polish max_evaluations -1", _polish(max_evaluations=-1), ValueError, "max_evaluations"),
    ("polish seed 2.5", _polish(seed=2.5), ValueError, "seed"),
    ("polish policy dict", _polish(policy={}), ValueError, "policy"),
    ("polish objective 3", _polish(objective=3), ValueError, "objective"),
    ("polish progress 'x'", _polish(progress="x"), ValueError, "progress"),
    # the positioned search's helpers
    ("default_peak_budget problem None", lambda P, U, O: ps.default_peak_budget(None), ValueError, "problem"),
    ("default_peak_budget plan dict", lambda P, U, O: ps.default_peak_budget(P, [{}]), ValueError, "plans[0]"),
    ("default_peak_budget other plan", lambda P, U, O: ps.default_peak_budget(P, [O]), PlanMismatchError,
     "another problem"),
    ("deterministic_evaluations nan", lambda P, U, O: ps.deterministic_evaluations(P, NAN), ValueError, "seconds"),
    ("deterministic_evaluations -1", lambda P, U, O: ps.deterministic_evaluations(P, -1), ValueError, "seconds"),
    # the front door
    ("solve progress 3", lambda P, U, O: planner.solve(P, planner.SolveOptions(time_limit_s=1), progress=3),
     ValueError, "progress"),
    ("simulate contention nan", lambda P, U, O: planner.simulate(P, contention=NAN), ValueError, "contention"),
    ("position_search deadline nan", lambda P, U, O: planner.position_search(P, [], peak_memory_bytes=None,
                                                                             deadline=NAN), ValueError, "deadline"),
    # peak memory, as torch's estimator counts it
    ("peak_bytes plan dict", lambda P, U, O: memory.peak_bytes(P, {}), ValueError, "plan"),
    ("peak_bytes other plan", lambda P, U, O: memory.peak_bytes(P, O), PlanMismatchError, "another problem"),
    ("memory_timeline plan str", lambda P, U, O: memory.memory_timeline(P, "plan.json"), ValueError, "plan"),
    ("memory_timeline problem None", lambda P, U, O: memory.memory_timeline(None, U), ValueError, "problem"),
]


@pytest.mark.parametrize("call, error, name", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_bad_argument_is_refused_naming_it(case, call, error, name):
    with pytest.raises(error) as caught:
        call(*case)
    assert name in str(caught.value), str(caught.value)


def test_the_checks_leave_good_arguments_alone(case):
    """What the checks above let through still runs: a window of 0 (the plans' own buckets), a
    polish of no evaluation (a deterministic solve's share may round to none), a judge of the
    problem's own plan and of the unbucketed schedule."""
    P, U, _ = case
    assert CappedModelOptions(window=0, workers=1).window == 0
    assert polish_module.polish(P, [U], deadline=_later(), max_evaluations=0).plan.buckets == ()
    assert scenarios.judge(P, {"u": U, "none": None}, ["torch"]).steps["u"]["torch"] == pytest.approx(
        planner.simulate(P).step_ms)
