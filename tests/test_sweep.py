"""``bucketplan sweep``: a spec checked whole, tasks on Ray or one by one with the same tables,
a killed worker's task retried, failures reported and never dropped, every plan verified here."""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

import pytest

import planner
from bucketplan.cli import main
from planner.jobs import sweep
from planner.jobs.sweep import load_spec, ray_available, run_sweep
from tests.support import PROBLEMS, start_cli
from tests.test_hostile import _one_line_error

needs_ray = pytest.mark.skipif(not ray_available(), reason="Ray is not installed (the `sweep` extra)")


def _spec(tmp_path, text: str, name: str = "spec.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _csv(out: Path) -> str:
    return (out / "results.csv").read_text()


BAD_SPECS = {
    "not TOML": ("objectives = [", "not valid TOML"),
    "no case": ('objectives = ["step"]', "no [[case]]"),
    "unknown top": ("colour = 1\n[[case]]\nworkloads = ['llama3-8b-ddp-2']", "'colour'"),
    "unknown case field": ("[[case]]\nworkloads = ['llama3-8b-ddp-2']\nlayer = 2", "[[case]] 1: unknown field 'layer'"),
    "two sources": ("[[case]]\nworkloads = ['llama3-8b-ddp-2']\nmodel = 'x.py:f'", "exactly one of"),
    "bad objective": ("objectives = ['time']\n[[case]]\nworkloads = ['llama3-8b-ddp-2']", "unknown objective 'time'"),
    "string seconds": ("time_limit_s = '5'\n[[case]]\nworkloads = ['llama3-8b-ddp-2']", "time_limit_s: must be"),
    "zero rank": ("[[case]]\nworkloads = ['llama3-8b-ddp-2']\nranks = [0]", "ranks: must be"),
    "bool workers": ("workers_per_task = true\n[[case]]\nworkloads = ['llama3-8b-ddp-2']", "workers_per_task"),
    "no such problem": ("[[case]]\nproblems = ['nowhere/*.json']", "'nowhere/*.json' matches no file"),
    "twice": ("[[case]]\nworkloads = ['llama3-8b-ddp-2', 'llama3-8b-ddp-2']", "listed twice"),
    "unknown workload": ("[[case]]\nworkloads = ['llama9']", "unknown workload 'llama9'"),
    "unknown preset": ("[[case]]\nworkloads = ['llama3-8b-ddp-2']\npresets = ['tpu']", "unknown preset 'tpu'"),
    "layers on builtin": ("[[case]]\nworkloads = ['llama3-8b-ddp-2']\nlayers = 4", "layers: built-in"),
    "contention below 1": ("[[case]]\nworkloads = ['llama3-8b-ddp-2']\ncontention = 0.9",
                           "contention: must be a slow-down factor from 1"),
    "contention as text": ("[[case]]\nworkloads = ['llama3-8b-ddp-2']\ncontention = '1.19'", "contention: must be"),
    "contention on problems": ("[[case]]\nproblems = ['nowhere/*.json']\ncontention = 1.19",
                               "contention: does not apply to problem files"),
}


def test_a_case_s_contention_reaches_the_preset_its_problems_are_extracted_with(tmp_path):
    """``contention = F`` in a case: its key says so (a case at 1 and one at F are two folders) and
    the preset it is extracted with carries F (``Problem.contention`` comes from it)."""
    from fxglue.run.sweep import resolve

    spec = load_spec(_spec(tmp_path, "[[case]]\nworkloads = ['llama3-8b-ddp-2']\npresets = ['h100-8nodes']\n"
                                     "contention = 1.19\n[[case]]\nworkloads = ['llama3-8b-ddp-2']\n"
                                     "presets = ['h100-8nodes']\n"))
    at_f, at_1 = spec.cases
    assert (at_f.contention, at_1.contention) == (1.19, 1.0)
    assert at_f.key == "llama3-8b-ddp-2--h100-8nodes-contention1.19" and at_1.key == "llama3-8b-ddp-2--h100-8nodes"
    assert resolve(at_f)[1].contention == 1.19 and resolve(at_1)[1].contention == 1.0


@pytest.mark.parametrize("case", sorted(BAD_SPECS))
def test_a_bad_spec_is_one_line_naming_the_item(tmp_path, capsys, case):
    text, fragment = BAD_SPECS[case]
    out = tmp_path / "out"
    code = main(["sweep", str(_spec(tmp_path, text)), "-o", str(out), "-q", "--sequential"])
    _one_line_error(capsys, code, fragment)
    assert not out.exists()  # checked whole before any work


def _problem_case(tmp_path, name="llama3-8b-ddp-2--h100-1node", objectives='["count", "step"]', seconds=3,
                  deterministic="true") -> Path:
    return _spec(tmp_path, f"objectives = {objectives}\ntime_limit_s = {seconds}\ndeterministic = {deterministic}\n"
                           f"[[case]]\nproblems = ['{PROBLEMS / f'{name}.json.gz'}']\n")


@pytest.mark.slow
@needs_ray
def test_ray_and_one_by_one_give_the_same_tables_and_a_rerun_resumes(tmp_path):
    """One built-in workload (extracted once, in a child process) and one committed problem file,
    two objectives each, deterministic: the table from Ray's 2 workers equals the one-by-one one."""
    spec = _spec(tmp_path, f"""
objectives = ["count", "step"]
time_limit_s = 1
deterministic = true
[[case]]
workloads = ["llama3-8b-ddp-2"]
presets = ["h100-1node"]
[[case]]
problems = ['{PROBLEMS / "llama3-8b-fsdp-2--h100-1node.json.gz"}']
""")
    one, ray_out = tmp_path / "one", tmp_path / "ray"
    assert main(["sweep", str(spec), "-o", str(one), "-q", "--sequential"]) == 0
    shutil.copytree(one / "cases", ray_out / "cases")
    for case in (ray_out / "cases").iterdir():  # the Ray run solves again; it reuses only the extraction
        for plan in case.glob("*-plan.json"):
            plan.unlink()
    assert main(["sweep", str(spec), "-o", str(ray_out), "-q", "--ray", "--cpus", "2"]) == 0
    assert _csv(one) == _csv(ray_out)
    rows = _csv(one).splitlines()
    assert len(rows) == 1 + 4 and all(",OPTIMAL," in r or ",FEASIBLE," in r for r in rows[1:])
    # one unit per bound column (a "bound" column once mixed "25 collectives" and "39.838 ms"),
    # no negative share, OPTIMAL only at a zero gap, a legend under the Markdown table
    import csv

    for r in csv.DictReader(rows):
        assert (r["bound_ms"] == "") == (r["objective"] != "step") and (r["bound_collectives"] == "") == (
            r["objective"] != "count")
        assert r["closed_pct"] == "" or float(r["closed_pct"]) >= 0
        assert r["status"] != "OPTIMAL" or float(r["gap_pct"]) == 0
        if r["bound_collectives"]:
            assert r["bound_collectives"].isdigit()
    assert "- `graph_nodes`: nodes of the traced FX graph" in (one / "results.md").read_text()
    # the driver's own figures: each plan verifies and simulates as the table says
    for case in ("llama3-8b-ddp-2--h100-1node", "llama3-8b-fsdp-2--h100-1node"):
        problem = planner.load_problem(one / "cases" / case / "problem.json.gz")
        for objective in ("count", "step"):
            plan = planner.load_plan(one / "cases" / case / f"{objective}-plan.json")
            assert not planner.verify(problem, plan)
            ms = round(planner.simulate(problem, plan).step_ms, 3)
            assert f"{case},{objective}," in _csv(one) and f",{ms}," in _csv(one)
    stages = (one / "stages.csv").read_text()
    for stage in ("trace", "schedule", "extract", "greedy", "solve count", "solve step"):
        assert f",{stage}," in stages
    before = (one / "rows.jsonl").read_text()
    assert main(["sweep", str(spec), "-o", str(one), "-q", "--sequential"]) == 0  # nothing left to solve
    assert (one / "rows.jsonl").read_text() == before and _csv(one) == _csv(ray_out)


def _ray_task_pids(case: str) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if (proc / "cmdline").read_bytes().startswith(f"ray::solve:{case}:".encode()):
                    pids.append(int(proc.name))
            except OSError:
                continue
    return pids


@pytest.mark.long  # 25 s: the Ray sweep itself runs in the default run
@needs_ray
def test_a_killed_ray_worker_is_retried_and_the_table_is_complete(tmp_path):
    case = "llama3-8b-fsdp-8--h100-8nodes"
    spec = _problem_case(tmp_path, case, objectives='["step"]', seconds=15, deterministic="false")
    out = tmp_path / "out"
    proc = start_cli("sweep", spec, "-o", out, "--ray", "--cpus", "2")
    try:
        deadline = time.monotonic() + 120
        while not (pids := _ray_task_pids(case)):
            assert proc.poll() is None and time.monotonic() < deadline, "the task never started"
            time.sleep(0.5)
        time.sleep(2)  # mid-task
        os.kill(pids[0], signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr[-2000:]
    assert "retrying once" in stderr
    (line,) = [r for r in (out / "stages.csv").read_text().splitlines() if r.startswith(f"{case},solve step,")]
    assert line.split(",")[4] == "2"  # attempts: the killed one and its retry
    problem = planner.load_problem(out / "cases" / case / "problem.json.gz")
    plan = planner.load_plan(out / "cases" / case / "step-plan.json")
    assert not planner.verify(problem, plan)
    assert len(_csv(out).splitlines()) == 2 and f"{case},step," in _csv(out)


def test_a_failing_task_is_retried_once_then_reported_not_dropped(tmp_path, monkeypatch):
    calls = []
    real = sweep.run_task

    def flaky(task, progress=None):
        calls.append(task.objective)
        if task.objective == "count" or calls.count("step") == 1:  # count always fails; step fails once
            raise RuntimeError("worker lost")
        return real(task)

    monkeypatch.setattr(sweep, "run_task", flaky)
    spec = load_spec(_problem_case(tmp_path, seconds=2))
    report = run_sweep(spec, tmp_path / "out", extract=None, ray=False)
    by_objective = {r["objective"]: r for r in report.results}
    assert by_objective["count"]["status"] == "FAILED" and "worker lost" in by_objective["count"]["note"]
    assert by_objective["step"]["plan_ms"] is not None
    assert calls == ["count", "count", "step", "step"]
    assert report.failed == ["llama3-8b-ddp-2--h100-1node count"]
    attempts = {r["stage"]: r["attempts"] for r in report.stages}
    assert attempts == {"solve count": 2, "solve step": 2}
    # a rerun tries the failed task again, and only it
    monkeypatch.setattr(sweep, "run_task", real)
    report = run_sweep(spec, tmp_path / "out", extract=None, ray=False)
    assert not report.failed and all(r["plan_ms"] is not None for r in report.results)


def test_the_driver_rejects_a_plan_the_worker_got_wrong(tmp_path, monkeypatch):
    """The worker's answer is not trusted: a plan that breaks a rule is REJECTED, not tabulated."""
    real = sweep.run_task

    def wrong(task, progress=None):
        result = real(task)
        problem = planner.Problem.model_validate_json(task.problem_json)
        kinds = {}
        for c in problem.collectives:
            kinds.setdefault(c.kind, c.name)
        a, b = list(kinds.values())[:2]  # two collectives of different kinds: never one bucket (rule 2)
        bad = planner.Plan(problem_fingerprint=problem.fingerprint, planner="liar", created="now",
                           buckets=(planner.Bucket(members=(a, b), start=a, wait=b),))
        return {**result, "plan_json": bad.model_dump_json()}

    monkeypatch.setattr(sweep, "run_task", wrong)
    spec = load_spec(_problem_case(tmp_path, "llama3-8b-fsdp-2--h100-1node", objectives='["count"]', seconds=2))
    report = run_sweep(spec, tmp_path / "out", extract=None, ray=False)
    (row,) = report.results
    assert row["status"] == "REJECTED" and "fails verification" in row["note"] and row.get("plan_ms") is None
    assert not list((tmp_path / "out" / "cases").glob("*/count-plan.json"))


@pytest.mark.slow
def test_a_case_that_cannot_be_extracted_is_a_row_saying_why(tmp_path, capsys):
    factory = tmp_path / "broken.py"
    factory.write_text("def build(groups):\n    raise RuntimeError('no weights here')\n")
    spec = _spec(tmp_path, f"objectives = ['count']\ntime_limit_s = 2\n[[case]]\nmodel = '{factory}:build'\n"
                           "presets = ['h100-1node']\n")
    out = tmp_path / "out"
    assert main(["sweep", str(spec), "-o", str(out), "-q", "--sequential"]) == 1
    table = (out / "results.md").read_text()
    assert "NOT EXTRACTED" in table and "no weights here" in table
    assert "no verified plan for 1 task(s)" in capsys.readouterr().err


def test_closed_pct_is_the_share_of_greedys_distance_to_the_floor():
    from planner.jobs.sweep import closed_note, closed_pct

    # by hand: greedy 200, floor 100 -> a distance of 100 ms; a 150 ms plan closes 50 of it
    assert closed_pct({"greedy_ms": 200.0, "plan_ms": 150.0, "floor_ms": 100.0}) == 50.0
    assert closed_pct({"greedy_ms": 200.0, "plan_ms": 100.0, "floor_ms": 100.0}) == 100.0
    # slower than greedy: no share (a negative one said -208.9% once), the note says so instead
    assert closed_pct({"greedy_ms": 200.0, "plan_ms": 210.0, "floor_ms": 100.0}) is None
    assert closed_note({"greedy_ms": 200.0, "plan_ms": 210.0, "floor_ms": 100.0}) == "slower than greedy"
    assert closed_note({"greedy_ms": 101.0, "plan_ms": 103.0, "floor_ms": 100.0}) == "greedy already at the floor"
    assert closed_note({"greedy_ms": 200.0, "plan_ms": 150.0, "floor_ms": 100.0}) == ""
    assert closed_pct({"greedy_ms": 100.0, "plan_ms": 100.0, "floor_ms": 100.0}) is None  # greedy on the floor
    assert closed_pct({"greedy_ms": 101.0, "plan_ms": 100.5, "floor_ms": 100.0}) is None  # within 1% of it
    assert closed_pct({"greedy_ms": 102.0, "plan_ms": 101.0, "floor_ms": 100.0}) == 50.0
    assert closed_pct({"greedy_ms": None, "plan_ms": 100.0, "floor_ms": 90.0}) is None
