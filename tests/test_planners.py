"""The one planner registry (planner.search.planners): what the command line accepts, how an unknown name
is refused, and that each planner's plan is what its name says."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

import planner
from planner.search import planners

NAMES = ("greedy", "greedy-autofix", "greedy-repaired", "cpsat", "none")
UNKNOWN = "unknown planner 'greedyy'; use one of " + ", ".join(NAMES)


def _choices(command: str, dest: str) -> tuple[str, ...]:
    from bucketplan.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    option = next(a for a in sub.choices[command]._actions if a.dest == dest)
    return tuple(option.choices)


def test_the_registry_holds_every_planner_once_in_order():
    assert planners.names() == NAMES
    assert all(planners.get(n).name == n and "\n" not in planners.get(n).description for n in NAMES)


def test_the_command_line_accepts_exactly_the_registry_names():
    assert _choices("check", "planner") == planners.names()


def test_check_help_describes_every_planner(capsys):
    from bucketplan.cli import main

    with pytest.raises(SystemExit):
        main(["check", "--help"])
    help_text = "".join(capsys.readouterr().out.split())  # argparse wraps lines, at hyphens too
    for p in planners.PLANNERS.values():
        assert "".join(f"{p.name}: {p.description}".split()) in help_text


def test_an_unknown_name_is_one_line_naming_the_registry():
    with pytest.raises(ValueError) as e:
        planners.get("greedyy")
    assert str(e.value) == UNKNOWN
    with pytest.raises(ValueError, match="use one of greedy, greedy-autofix"):
        planners.select("greedy", "cpsat-fast")


def test_pipeline_and_check_refuse_an_unknown_name_before_any_work(tmp_path, monkeypatch):
    from fxglue.pipeline import run_pipeline
    from fxglue.run.gloo import CheckOptions, check_workload

    monkeypatch.chdir(tmp_path)  # no file of that name here either
    with pytest.raises(ValueError) as e:
        run_pipeline("llama3-8b-fsdp-2", planner_="greedyy")
    assert str(e.value) == UNKNOWN + ", a Plan or a plan file"
    with pytest.raises(ValueError) as e:
        check_workload("llama3-8b-fsdp-2", CheckOptions(planner="greedyy"))  # raised before any rank is spawned
    assert str(e.value) == UNKNOWN


def test_command_line_refuses_an_unknown_name(capsys):
    from bucketplan.cli import main

    with pytest.raises(SystemExit) as e:
        main(["check", "llama3-8b-fsdp-2", "--planner", "greedyy"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'greedyy'" in err and all(n in err for n in NAMES)


def test_the_gloo_matrix_names_registry_entries():
    from experiments.gloo_matrix import cases

    assert {planner_name for _, _, planner_name, _ in cases()} <= set(planners.names())


def test_how_each_planner_reaches_the_graph():
    torch_applied = {n for n in NAMES if planners.get(n).torch_applies}
    assert torch_applied == {"greedy", "greedy-autofix", "none"}
    assert planners.get("none").finalize.collective_bucketing is False
    assert planners.get("greedy-autofix").finalize.autofix_cycles is True
    assert planners.get("greedy").finalize.autofix_cycles is False
    assert {n for n in NAMES if planners.get(n).needs_greedy} == {"greedy", "greedy-autofix", "greedy-repaired"}


def test_a_planner_that_starts_from_greedy_refuses_a_request_without_it():
    problem = planner.Problem.model_construct()
    with pytest.raises(ValueError, match="'greedy-repaired' starts from torch's greedy plan"):
        planners.get("greedy-repaired").plan(planners.PlanRequest(problem))


@pytest.fixture
def request_fsdp2(get_scheduled):
    s = get_scheduled("llama3-8b-fsdp-2")
    options = planner.SolveOptions(time_limit_s=10, workers=1)
    return planners.PlanRequest(s.problem, greedy=s.greedy, solve=options, repair=options)


@pytest.mark.parametrize("name", [n for n in NAMES if not planners.get(n).torch_applies])
def test_each_planning_entry_returns_a_verified_plan(request_fsdp2, name):
    said = []
    out = planners.get(name).plan(dataclasses.replace(request_fsdp2, progress=said.append))
    assert planner.check(request_fsdp2.problem, out.plan).feasible
    assert out.solve_result is not None and out.solve_result.plan is not None
    assert out.plan.problem_fingerprint == request_fsdp2.problem.fingerprint
    assert planner.collectives_after(request_fsdp2.problem, out.plan) < len(request_fsdp2.problem.collectives)
    assert len(said) == 1 and out.wall_s > 0


@pytest.mark.parametrize("name", [n for n in NAMES if planners.get(n).torch_applies])
def test_a_torch_applied_entry_reports_torchs_recorded_plan(request_fsdp2, name):
    out = planners.get(name).plan(request_fsdp2)
    expected = None if name == "none" else request_fsdp2.greedy
    assert out.plan is expected and out.solve_result is None
