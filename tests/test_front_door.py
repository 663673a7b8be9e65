"""``planner.plan``, the one front door to planning: every command and job reaches the searches
through it (a walk of their source), each mode's plan is what its search gives on its own, the
free mode's bound is the floor within its peak, and a spec is refused naming its field."""

from __future__ import annotations

import ast
import dataclasses
import time
from pathlib import Path

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings

import planner
from planner.core.arguments import ArgumentError
from planner.cost.bounds import free_position_floor
from planner.cost.memory import peak_bytes
from planner.search import planners, planning
from planner.search.planning import Budget, PlanSpec
from tests.strategies import problems

ROOT = Path(__file__).resolve().parent.parent
# the searches and floors only the front door (and the modes it runs) may call
BEHIND_THE_DOOR = {"position_search", "solve_capped", "free_position_floor", "polish", "robust_plan"}


def _calls_behind_the_door(path: Path) -> list[str]:
    """Each call in ``path`` of a search behind the door: by its name, as an attribute
    (``x.position_search(...)``), ``solve`` of ``planner.search.solver`` or ``planner.solve``."""
    tree = ast.parse(path.read_text(), str(path))
    solve_names = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                   and node.module == "planner.search.solver" for alias in node.names if alias.name == "solve"}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
        owner = f.value.id if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) else None
        if name in BEHIND_THE_DOOR or (isinstance(f, ast.Name) and name in solve_names) \
                or (name == "solve" and owner in ("solver", "planner")):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}")
    return found


def test_commands_and_jobs_reach_every_planner_only_through_the_front_door():
    files = sorted((ROOT / "bucketplan").rglob("*.py")) + sorted((ROOT / "planner" / "jobs").rglob("*.py"))
    assert len(files) > 20
    found = [hit for f in files for hit in _calls_behind_the_door(f)]
    assert found == []


def test_the_walk_finds_a_search_called_behind_the_door(tmp_path):
    # the walk itself: each way of calling a search is seen (else the test above could not fail)
    probe = ROOT / "bucketplan" / "_probe_front_door.py"
    probe.write_text("from planner.search.solver import solve as s\nimport planner\n"
                     "s(p)\nplanner.solve(p)\nx.position_search(p)\nfree_position_floor(p)\n")
    try:
        assert len(_calls_behind_the_door(probe)) == 4
    finally:
        probe.unlink()


def test_every_mode_is_a_registry_entry_whose_functions_exist():
    import importlib

    assert set(planners.MODES) == {"anchored", "free", "robust"}
    for mode in planners.MODES.values():
        module = importlib.import_module(mode.module)
        assert callable(getattr(module, mode.run_name))
        assert mode.check_name is None or callable(getattr(module, mode.check_name))
        assert "\n" not in mode.description


def test_a_planner_is_a_registry_entry_and_its_module(monkeypatch, tmp_path):
    # a toy mode, registered as any other: plan() checks its spec with it and returns its plan,
    # verified by the front door
    toy = tmp_path / "toy_planner.py"
    toy.write_text(
        "from planner.core.problem import unbucketed_plan\n"
        "from planner.search.result import SolveResult\n"
        "def check(spec):\n"
        "    from planner.core.arguments import ArgumentError\n"
        "    if spec.prove_s is not None:\n"
        "        raise ArgumentError('prove_s', 'the toy proves nothing')\n"
        "def run(problem, spec, calls, started):\n"
        "    plan = unbucketed_plan(problem)\n"
        "    calls.on_plan(plan)\n"
        "    return SolveResult(plan=plan, status='FEASIBLE', objective=0.0, bound=None, gap=None, wall_s=0.0)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(planners.MODES, "toy", planners.Mode("toy", "the unbucketed plan", "toy_planner", "run",
                                                             "check"))
    problem = _chain()
    seen = []
    result = planner.plan(problem, PlanSpec(mode="toy"), on_plan=seen.append)
    assert result.plan.buckets == () and seen == [result.plan]
    with pytest.raises(ArgumentError, match="the toy proves nothing") as e:
        PlanSpec(mode="toy", prove_s=1.0)
    assert e.value.name == "prove_s"


def _chain():
    from tests.chain import chain_problem

    return chain_problem(60, 6)


def test_time_shares_come_from_one_table():
    share = planning.TIME_SHARES["free"]
    assert planning.anchored_seconds(5.0) == pytest.approx(5.0 * share["anchored"])
    assert planning.anchored_seconds(300.0) == share["anchored_max_s"] < 300 * share["anchored"]


@pytest.mark.parametrize("fields, name", [
    ({"mode": "sideways"}, "mode"),
    ({"mode": "free", "objective": "count"}, "objective"),
    ({"mode": "anchored", "prove_s": 3.0}, "prove_s"),
    ({"mode": "anchored", "policy": planner.Policy(keep_overlap=False)}, "policy"),
    ({"mode": "robust"}, "scenarios"),
    ({"mode": "robust", "scenarios": ("torch",), "budget": Budget(5, deterministic=True)}, "deterministic"),
    ({"budget": 5}, "budget"),
    ({"workers": 0}, "workers"),
    ({"starts": [1]}, "starts"),
])
def test_a_spec_is_refused_naming_its_field(fields, name):
    with pytest.raises(ArgumentError) as e:
        PlanSpec(**fields)
    assert e.value.name == name


def test_a_hint_for_another_problem_is_refused_before_any_search():
    problem = _chain()
    other = planner.Plan(problem_fingerprint="0" * 64, planner="x", params={}, created="", buckets=())
    with pytest.raises(planner.PlanMismatchError):
        planner.plan(problem, PlanSpec(hint=other))


def test_the_anchored_mode_is_cpsat_s_plan():
    problem = _chain()
    options = planner.SolveOptions(time_limit_s=5, objective="step", deterministic=True, workers=1)
    direct = planner.solve(problem, options)
    through = planner.plan(problem, PlanSpec.of_solve_options(options))
    assert through.plan.buckets == direct.plan.buckets and through.objective == pytest.approx(direct.objective)
    assert through.bound == pytest.approx(direct.bound) and through.status == direct.status


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(max_collectives=3, max_compute=4, costs=True), st.booleans())
def test_the_free_mode_is_held_to_its_peak_and_bounded_by_the_floor_within_it(problem, anchored_start):
    budget = peak_bytes(problem, None)
    # a wall-clock budget: what is checked holds for any plan the search ends on
    spec = PlanSpec(mode="free", budget=Budget(0.5), anchored_start=anchored_start, workers=1)
    result = planner.plan(problem, spec)
    # the default peak is the unbucketed schedule's (no hint); the bound is the floor within it,
    # computed here on its own
    assert result.stats["peak_budget_bytes"] == budget
    assert planner.verify(problem, result.plan, keep_overlap=False, peak_memory_bytes=budget) == []
    assert result.objective == pytest.approx(planner.simulate(problem, result.plan).step_ms)
    floor = free_position_floor(problem, peak_memory_bytes=budget).floor_ms
    assert result.bound == pytest.approx(floor) and result.bound <= result.objective + 1e-9
    assert result.gap == pytest.approx(max(0.0, (result.objective - floor) / result.objective) if result.objective else 0.0)


def test_the_free_mode_reports_each_plan_it_finds_and_starts_from_the_ones_given():
    problem = _chain()
    seen = []
    spec = PlanSpec(mode="free", budget=Budget(2.0, deterministic=True), workers=1)
    result = planner.plan(problem, spec, on_plan=seen.append, started=time.perf_counter())
    # CP-SAT's anchored plan, then the positioned search's
    assert len(seen) == 2 and seen[-1] == result.plan
    assert result.stats["anchored"]["plan"] == seen[0]
    again = planner.plan(problem, dataclasses.replace(spec, anchored_start=False, starts=(seen[0],)))
    assert "anchored" in again.stats and again.stats["anchored"] is None
    assert again.objective <= planner.simulate(problem, seen[0]).step_ms + 1e-9 or \
        peak_bytes(problem, seen[0]) > again.stats["peak_budget_bytes"]
