"""Ctrl-C never loses work: any sequence of up to three SIGINTs, at any moment of ``solve``,
``solve --positions free --prove``, ``solve-dir`` and ``compare``, exits 130 without a traceback,
leaves every output a finished run wrote byte-identical, and keeps the best verified plan that
existed, marked interrupted, beside it (``planner/jobs/interrupted.py``).

Each command runs in its own session and gets SIGINT on its process group, as a terminal sends
Ctrl-C. The first signal comes from 0.3 s on: before that the interpreter itself is starting,
and no code of ours runs yet.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import planner
from planner.jobs.interrupted import save_plan
from planner.core.problem import unbucketed_plan
from planner.jobs.plan_dir import PLAN, PROBLEM, problem_dir
from planner.rules.verifier import recorded_policy
from tests.support import PROBLEMS, ROOT, run_cli, run_script, start_cli

FSDP8 = PROBLEMS / "llama3-8b-fsdp-8--ab-ib8.json.gz"  # 224 collectives
FSDP8_GREEDY = PROBLEMS / "llama3-8b-fsdp-8--ab-ib8-greedy-plan.json.gz"
FSDP2 = PROBLEMS / "llama3-8b-fsdp-2--h100-8nodes-graph-order.json.gz"  # 62 collectives
BOUND_S = 120  # every command here stops within seconds of its first SIGINT; one that runs this long hangs
# from the first SIGINT to the exit: stopping and saving, with a loaded machine's slack (a Ctrl-C
# lost would leave the command to run out its time limit and report: longer on these problems)
STOPS_WITHIN_S = 8.0


class Signalled:
    """``bucketplan ARGS`` in its own session, sent SIGINT at each of ``at_s`` (seconds from its
    start, ascending) while it runs; ``marker_first``: whether ``marker`` was on its stderr before
    the first signal went."""

    def __init__(self, *args, at_s: list[float], marker: str, cwd: Path = ROOT):
        self.proc = start_cli(*args, cwd=cwd, start_new_session=True)
        started = time.monotonic()
        lines: list[str] = []
        seen = threading.Event()

        def read_stderr() -> None:
            for line in self.proc.stderr:
                lines.append(line)
                if marker in line:
                    seen.set()

        reader = threading.Thread(target=read_stderr, daemon=True)
        reader.start()
        out: list[str] = []  # read as it comes: a full pipe would hold the command up
        out_reader = threading.Thread(target=lambda: out.append(self.proc.stdout.read()), daemon=True)
        out_reader.start()
        self.sent = 0
        self.first_sent = 0.0
        self.marker_first = None
        try:
            for t in at_s:
                try:  # until this signal is due, or the command has ended
                    self.proc.wait(timeout=max(0.0, started + t - time.monotonic()))
                    break
                except subprocess.TimeoutExpired:
                    pass
                if self.marker_first is None:
                    self.marker_first = seen.is_set()
                os.killpg(self.proc.pid, signal.SIGINT)
                self.sent += 1
                self.first_sent = self.first_sent or time.monotonic()
            self.proc.wait(BOUND_S)
            self.stop_s = time.monotonic() - self.first_sent if self.sent else 0.0
            reader.join(10)
            out_reader.join(10)
            self.out = "".join(out)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.err = "".join(lines)
        self.code = self.proc.returncode

    def assert_stopped(self) -> None:
        """Exit 130 when a signal reached it (0 when it had finished first, or the signal came as
        it exited, its work done), never a traceback nor death by SIGINT."""
        assert "Traceback" not in self.err, self.err[-3000:]
        assert self.code in ((130, 0) if self.sent else (0,)), (self.code, self.sent, self.err[-3000:])
        assert self.stop_s < STOPS_WITHIN_S, f"ended {self.stop_s:.1f} s after the first Ctrl-C: {self.err[-2000:]}"


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _assert_kept(problem, path: Path) -> None:
    """``path`` holds a verified plan of ``problem``, marked interrupted."""
    plan = planner.load_plan(path)
    assert plan.params.get("interrupted") is True, path
    assert plan.problem_fingerprint == problem.fingerprint
    assert not planner.verify(problem, plan, **recorded_policy(plan)), path


def _finished_plan(problem, path: Path) -> bytes:
    """A finished (not interrupted) plan of ``problem`` at ``path``: what an earlier run left."""
    plan = unbucketed_plan(problem).model_copy(update={"planner": "cpsat", "params": {"interrupted": False}})
    planner.save(plan, path)
    return path.read_bytes()


def _plan_dir_with_finished_plans(root: Path) -> dict[Path, bytes]:
    """fsdp-8's and fsdp-2's problems recorded under ``root``, each with a finished plan.json: {folder: its bytes}."""
    finished = {}
    for source in (FSDP8, FSDP2):
        problem = planner.load_problem(source)
        folder = problem_dir(root, problem.fingerprint)
        planner.save(problem, folder / PROBLEM)
        finished[folder] = _finished_plan(problem, folder / PLAN)
    return finished


# --- the rule, without a process -------------------------------------------------------------

def test_a_cut_short_plan_goes_beside_finished_work_inputs_and_faster_cut_short_plans(tmp_path):
    problem = planner.load_problem(FSDP8)
    slow = unbucketed_plan(problem).model_copy(update={"params": {"interrupted": True}})
    fast = planner.load_plan(FSDP8_GREEDY).model_copy(update={"params": {"interrupted": True}})
    assert planner.simulate(problem, fast).step_ms < planner.simulate(problem, slow).step_ms  # the premise
    # nothing there: written where asked
    assert save_plan(slow, tmp_path / "a.json", problem) == tmp_path / "a.json"
    # a slower cut-short plan there: replaced; a faster one: kept, the slower beside it
    assert save_plan(fast, tmp_path / "a.json", problem) == tmp_path / "a.json"
    assert save_plan(slow, tmp_path / "a.json", problem) == tmp_path / "a.interrupted.json"
    assert planner.load_plan(tmp_path / "a.json") == fast
    # a finished plan there: kept byte for byte, the cut-short one beside it
    finished = _finished_plan(problem, tmp_path / "b.json")
    assert save_plan(slow, tmp_path / "b.json", problem) == tmp_path / "b.interrupted.json"
    assert (tmp_path / "b.json").read_bytes() == finished
    # a user's file that is no plan at the beside name too: the next free name
    (tmp_path / "c.json").write_text("my notes\n")
    (tmp_path / "c.interrupted.json").write_text("more notes\n")
    assert save_plan(slow, tmp_path / "c.json", problem) == tmp_path / "c.interrupted-2.json"
    assert (tmp_path / "c.json").read_text() == "my notes\n"
    assert (tmp_path / "c.interrupted.json").read_text() == "more notes\n"
    # one of the command's inputs (a cut-short plan given as --hint) is never written over
    hint = tmp_path / "d.interrupted.json"
    planner.save(slow, hint)
    _finished_plan(problem, tmp_path / "d.json")
    assert save_plan(fast, tmp_path / "d.json", problem, inputs=[("--hint", hint)]) == tmp_path / "d.interrupted-2.json"
    assert planner.load_plan(hint) == slow
    # .json.gz keeps its double suffix
    _finished_plan(problem, tmp_path / "e.json.gz")
    assert save_plan(slow, tmp_path / "e.json.gz", problem) == tmp_path / "e.interrupted.json.gz"
    # a finished plan always goes where asked (a rerun replaces the last run's plan)
    assert save_plan(unbucketed_plan(problem), tmp_path / "b.json", problem) == tmp_path / "b.json"


@pytest.mark.slow  # a child process: it sends SIGINT to itself
def test_the_command_line_raises_the_first_ctrl_c_only_and_redelivers_one_python_dropped():
    result = run_script("ctrl_c_latch", timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.splitlines() == [
        "first raises True", "second raises False", "count 2", "dropped one comes again True",
        "after the hook returned True", "exiting: ignored True", "inside a program: its handler back True", "ok"]


# --- each command, at a chosen moment --------------------------------------------------------

@pytest.mark.slow  # a solve in a child process, interrupted
def test_ctrl_c_a_second_into_solve_leaves_the_finished_plan_and_keeps_its_own_beside(tmp_path):
    problem = planner.load_problem(FSDP8)
    finished = _finished_plan(problem, tmp_path / "done.json")
    for at_s in (0.3, 3.0):
        run = Signalled("solve", FSDP8, "-o", tmp_path / "done.json", "--time-limit", "60", at_s=[at_s],
                        marker="solving", cwd=tmp_path)
        # each run, the first too: a Ctrl-C while packages load must not let the solve finish either
        run.assert_stopped()
        assert (tmp_path / "done.json").read_bytes() == finished, (at_s, run.code, run.err[-3000:])
        if run.marker_first:
            break
        # that signal landed while packages loaded: nothing was verified yet; again, once it solves
    _assert_kept(problem, tmp_path / "done.interrupted.json")
    assert "done.interrupted.json" in run.out and "left as it was" in run.out


@pytest.mark.slow  # solve --prove in a child process, interrupted twice
def test_two_ctrl_c_50_ms_apart_in_solve_prove_keep_the_verified_plan(tmp_path):
    problem = planner.load_problem(FSDP2)
    run = Signalled("solve", FSDP2, "-o", tmp_path / "p.json", "--positions", "free", "--prove", "30",
                    "--time-limit", "6", at_s=[3.0, 3.05], marker="solving", cwd=tmp_path)
    run.assert_stopped()
    assert run.marker_first, run.err
    _assert_kept(problem, tmp_path / "p.json")


@pytest.mark.slow  # solve-dir's solves in child processes, interrupted
def test_ctrl_c_in_solve_dir_force_keeps_every_finished_plan(tmp_path):
    finished = _plan_dir_with_finished_plans(tmp_path)
    run = Signalled("solve-dir", tmp_path, "--force", "--time-limit", "20", at_s=[3.0, 3.05, 3.5],
                    marker="[1/2] solving")
    run.assert_stopped()
    for folder, plan in finished.items():
        assert (folder / PLAN).read_bytes() == plan, folder
    kept = [f / "plan.interrupted.json" for f in finished if (f / "plan.interrupted.json").exists()]
    assert len(kept) == 1, run.err
    _assert_kept(planner.load_problem(kept[0].parent / PROBLEM), kept[0])


@pytest.mark.slow  # two sweeps in child processes, the second interrupted
def test_ctrl_c_in_a_sweep_that_solves_a_task_again_keeps_its_finished_plan(tmp_path):
    """A task whose settings changed is solved again; a Ctrl-C during that solve leaves the plan
    the earlier run finished as it was, and keeps the cut-short one beside it."""
    spec = tmp_path / "spec.toml"
    out = tmp_path / "sweep"

    def write_spec(seconds: int) -> None:
        spec.write_text(f"objectives = ['step']\ntime_limit_s = {seconds}\n[[case]]\nproblems = ['{FSDP2}']\n")

    write_spec(2)
    first = run_cli("sweep", spec, "-o", out, "--sequential", "-q", cwd=tmp_path, timeout=BOUND_S)
    assert first.returncode == 0, first.stderr[-2000:]
    (plan,) = (out / "cases").glob("*/step-plan.json")
    finished = plan.read_bytes()
    write_spec(60)
    run = Signalled("sweep", spec, "-o", out, "--sequential", at_s=[4.0, 4.05], marker="to solve", cwd=tmp_path)
    run.assert_stopped()
    assert run.marker_first, run.err
    assert plan.read_bytes() == finished
    _assert_kept(planner.load_problem(FSDP2), plan.with_name("step-plan.interrupted.json"))


# --- any moment: the property -----------------------------------------------------------------
# Each command runs with a short time limit, so that the signals land in every stage: loading,
# searching, proving, writing, reporting, and after the command's own save. An output the run
# finished itself (its plan written, then a Ctrl-C) is its own finished work, not a cut-short one.

def _finished_or_kept(problem, path: Path, before: bytes) -> None:
    """``path`` is what an earlier run finished, byte for byte, or this run's own finished plan."""
    if path.read_bytes() != before:
        plan = planner.load_plan(path)
        assert not plan.params.get("interrupted"), path
        assert not planner.verify(problem, plan, **recorded_policy(plan)), path


def _solve_like(tmp_path: Path, at_s: list[float], source: Path, *flags: str):
    problem = planner.load_problem(source)
    done = tmp_path / "done.json"
    finished = _finished_plan(problem, done)
    run = Signalled("solve", source, "-o", done, *flags, at_s=at_s, marker="solving", cwd=tmp_path)
    run.assert_stopped()
    _finished_or_kept(problem, done, finished)
    cut = tmp_path / "done.interrupted.json"
    if cut.exists():
        _assert_kept(problem, cut)
    elif run.sent and run.marker_first:  # loaded before the Ctrl-C: a verified plan existed
        assert done.read_bytes() != finished, run.err  # and this run had saved it, finished


def _solve(tmp_path: Path, at_s: list[float]):
    _solve_like(tmp_path, at_s, FSDP8, "--time-limit", "3")


def _prove(tmp_path: Path, at_s: list[float]):
    _solve_like(tmp_path, at_s, FSDP2, "--positions", "free", "--prove", "3", "--time-limit", "3")


def _solve_dir(tmp_path: Path, at_s: list[float]):
    import csv

    finished = _plan_dir_with_finished_plans(tmp_path)
    run = Signalled("solve-dir", tmp_path, "--force", "--time-limit", "2", at_s=at_s, marker="[1/2] solving")
    run.assert_stopped()
    for folder, plan in finished.items():
        problem = planner.load_problem(folder / PROBLEM)
        _finished_or_kept(problem, folder / PLAN, plan)
        if (folder / "plan.interrupted.json").exists():
            _assert_kept(problem, folder / "plan.interrupted.json")
    if (tmp_path / "summary.csv").exists():  # the summary is the plans on disk
        for row in csv.DictReader((tmp_path / "summary.csv").open()):
            (folder,) = [f for f in finished if f.name.startswith(row["problem"].rstrip("…"))]
            step = planner.simulate(planner.load_problem(folder / PROBLEM), planner.load_plan(folder / PLAN)).step_ms
            assert float(row["plan_ms"]) == pytest.approx(step, abs=1e-3), (row, run.err)


def _compare(tmp_path: Path, at_s: list[float], finished_run: Path):
    import shutil

    problem_file = tmp_path / "p.json"
    planner.save(planner.load_problem(FSDP2), problem_file)
    out = tmp_path / "cmp"
    shutil.copytree(finished_run, out, symlinks=True)
    before = _snapshot(out)
    run = Signalled("compare", problem_file, "-o", out, "--force", "--time-limit", "1", at_s=at_s,
                    marker="planner 3/3", cwd=tmp_path)
    run.assert_stopped()
    after = _snapshot(out)
    if after != before:  # this run finished and swapped its own folder in
        assert "compare.md" in after and ".bucketplan-manifest.json" in after, sorted(after)
        assert f"{out} is left as it was" not in run.err
        return
    kept = tmp_path / "cmp.interrupted"
    if run.sent and run.marker_first:  # CP-SAT's count row had its verified plan
        plans = sorted((kept / "plans").glob("*.json"))
        assert plans, run.err
        for plan in plans:
            _assert_kept(planner.load_problem(problem_file), plan)


@pytest.fixture(scope="module")
def finished_compare(tmp_path_factory) -> Path:
    """A finished compare run of fsdp-2's problem file (1 s a row), copied into each example."""
    folder = tmp_path_factory.mktemp("finished")
    planner.save(planner.load_problem(FSDP2), folder / "p.json")
    result = run_cli("compare", folder / "p.json", "-o", folder / "cmp", "--time-limit", "1", "-q", cwd=folder,
                     timeout=BOUND_S)
    assert result.returncode == 0, result.stderr[-3000:]
    return folder / "cmp"


SIGINT_TIMES = st.lists(st.floats(0.3, 9.0), min_size=1, max_size=3).map(sorted)


@pytest.mark.slow  # each example runs a command in a child process and interrupts it
@pytest.mark.parametrize("command", ["solve", "prove", "solve-dir", "compare"])
@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(at_s=SIGINT_TIMES)
def test_any_ctrl_c_sequence_keeps_finished_work_and_the_best_verified_plan(tmp_path_factory, finished_compare,
                                                                            command, at_s):
    tmp_path = tmp_path_factory.mktemp(command)
    if command == "compare":
        _compare(tmp_path, at_s, finished_compare)
    else:
        {"solve": _solve, "prove": _prove, "solve-dir": _solve_dir}[command](tmp_path, at_s)
