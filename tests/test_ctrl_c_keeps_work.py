"""Ctrl-C never loses work: any sequence of up to three SIGINTs, at any moment of ``solve``,
``solve --positions free --prove``, ``solve-dir`` and ``compare``, exits 130 without a traceback,
leaves every output a finished run wrote byte-identical, and keeps the best verified plan that
existed, marked interrupted, beside it (``planner/core/interrupted.py``).

Each command runs in its own session and gets SIGINT on its process group, as a terminal sends
Ctrl-C. The first signal comes from 0.3 s on: before that the interpreter itself is starting,
and no code of ours runs yet.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import planner
from planner.core.interrupted import save_plan
from planner.core.problem import unbucketed_plan
from planner.jobs.plan_dir import PLAN, PROBLEM, problem_dir
from planner.rules.verifier import recorded_policy
from tests.support import PROBLEMS, ROOT, run_cli, start_cli

FSDP8 = PROBLEMS / "llama3-8b-fsdp-8--ab-ib8.json.gz"  # 224 collectives
FSDP2 = PROBLEMS / "llama3-8b-fsdp-2--h100-8nodes-graph-order.json.gz"  # 62 collectives
BOUND_S = 120  # every command here stops within seconds of its first SIGINT; one that runs this long hangs


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
        self.sent = 0
        self.marker_first = None
        try:
            for t in at_s:
                time.sleep(max(0.0, started + t - time.monotonic()))
                if self.proc.poll() is not None:
                    break
                if self.marker_first is None:
                    self.marker_first = seen.is_set()
                os.killpg(self.proc.pid, signal.SIGINT)
                self.sent += 1
            self.out = self.proc.stdout.read()
            self.proc.wait(BOUND_S)
            reader.join(10)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.err = "".join(lines)
        self.code = self.proc.returncode

    def assert_stopped(self) -> None:
        """Exit 130 when a signal reached it (0 when it had finished first), never a traceback nor
        death by SIGINT."""
        assert "Traceback" not in self.err, self.err[-3000:]
        assert self.code == (130 if self.sent else 0), (self.code, self.sent, self.err[-3000:])


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

def test_a_cut_short_plan_goes_beside_finished_work_and_replaces_only_a_cut_short_one(tmp_path):
    problem = planner.load_problem(FSDP2)
    cut = unbucketed_plan(problem).model_copy(update={"params": {"interrupted": True}})
    # nothing there: written where asked
    assert save_plan(cut, tmp_path / "a.json") == tmp_path / "a.json"
    # an interrupted plan there: replaced (the newer cut-short plan)
    assert save_plan(cut, tmp_path / "a.json") == tmp_path / "a.json"
    # a finished plan there: kept byte for byte, the cut-short one beside it
    finished = _finished_plan(problem, tmp_path / "b.json")
    assert save_plan(cut, tmp_path / "b.json") == tmp_path / "b.interrupted.json"
    assert (tmp_path / "b.json").read_bytes() == finished
    # a user's file that is no plan at the beside name too: the next free name
    (tmp_path / "c.json").write_text("my notes\n")
    (tmp_path / "c.interrupted.json").write_text("more notes\n")
    assert save_plan(cut, tmp_path / "c.json") == tmp_path / "c.interrupted-2.json"
    assert (tmp_path / "c.json").read_text() == "my notes\n"
    assert (tmp_path / "c.interrupted.json").read_text() == "more notes\n"
    # .json.gz keeps its double suffix
    _finished_plan(problem, tmp_path / "d.json.gz")
    assert save_plan(cut, tmp_path / "d.json.gz") == tmp_path / "d.interrupted.json.gz"
    # a finished plan always goes where asked (a rerun replaces the last run's plan)
    done = unbucketed_plan(problem)
    assert save_plan(done, tmp_path / "b.json") == tmp_path / "b.json"


def test_the_command_line_raises_the_first_ctrl_c_only_and_redelivers_one_python_dropped():
    """In this process: the latch main() installs, with the test's own handler put back after."""
    from types import SimpleNamespace

    from bucketplan.cli import CtrlC

    ours = signal.getsignal(signal.SIGINT)
    latch = CtrlC.install()
    try:
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
        os.kill(os.getpid(), signal.SIGINT)  # during the wind-down: counted, not raised
        time.sleep(0.2)
        assert latch.count == 2
        # a KeyboardInterrupt Python dropped ("Exception ignored in" a weakref callback) comes again
        with pytest.raises(KeyboardInterrupt):
            latch._on_unraisable(SimpleNamespace(exc_value=KeyboardInterrupt()))
            time.sleep(1)
    finally:
        latch.uninstall()
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN  # after a Ctrl-C: the exit stays 130
        signal.signal(signal.SIGINT, ours)


# --- each command, at a chosen moment --------------------------------------------------------

@pytest.mark.slow  # a solve in a child process, interrupted
def test_ctrl_c_a_second_into_solve_leaves_the_finished_plan_and_keeps_its_own_beside(tmp_path):
    problem = planner.load_problem(FSDP8)
    finished = _finished_plan(problem, tmp_path / "done.json")
    run = Signalled("solve", FSDP8, "-o", tmp_path / "done.json", "--time-limit", "60", at_s=[0.3],
                    marker="solving", cwd=tmp_path)
    # a first signal this early can land while packages load: then nothing was verified yet
    run = run if run.marker_first else Signalled(
        "solve", FSDP8, "-o", tmp_path / "done.json", "--time-limit", "60", at_s=[3.0], marker="solving",
        cwd=tmp_path)
    run.assert_stopped()
    assert (tmp_path / "done.json").read_bytes() == finished
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


# --- any moment: the property -----------------------------------------------------------------

def _solve(tmp_path: Path, at_s: list[float]):
    problem = planner.load_problem(FSDP8)
    finished = _finished_plan(problem, tmp_path / "done.json")
    run = Signalled("solve", FSDP8, "-o", tmp_path / "done.json", "--time-limit", "30", at_s=at_s,
                    marker="solving", cwd=tmp_path)
    run.assert_stopped()
    assert (tmp_path / "done.json").read_bytes() == finished
    if run.marker_first:  # the problem was loaded: the unbucketed plan at least was verified
        _assert_kept(problem, tmp_path / "done.interrupted.json")


def _prove(tmp_path: Path, at_s: list[float]):
    problem = planner.load_problem(FSDP2)
    finished = _finished_plan(problem, tmp_path / "done.json")
    run = Signalled("solve", FSDP2, "-o", tmp_path / "done.json", "--positions", "free", "--prove", "30",
                    "--time-limit", "6", at_s=at_s, marker="solving", cwd=tmp_path)
    run.assert_stopped()
    assert (tmp_path / "done.json").read_bytes() == finished
    if run.marker_first:
        _assert_kept(problem, tmp_path / "done.interrupted.json")


def _solve_dir(tmp_path: Path, at_s: list[float]):
    finished = _plan_dir_with_finished_plans(tmp_path)
    run = Signalled("solve-dir", tmp_path, "--force", "--time-limit", "20", at_s=at_s, marker="[1/2] solving")
    run.assert_stopped()
    for folder, plan in finished.items():
        assert (folder / PLAN).read_bytes() == plan, folder
        if (folder / "plan.interrupted.json").exists():
            _assert_kept(planner.load_problem(folder / PROBLEM), folder / "plan.interrupted.json")


def _compare(tmp_path: Path, at_s: list[float], finished_run: Path):
    import shutil

    problem_file = tmp_path / "p.json"
    planner.save(planner.load_problem(FSDP2), problem_file)
    out = tmp_path / "cmp"
    shutil.copytree(finished_run, out, symlinks=True)
    before = _snapshot(out)
    run = Signalled("compare", problem_file, "-o", out, "--force", "--time-limit", "20", at_s=at_s,
                    marker="planner 3/3", cwd=tmp_path)
    run.assert_stopped()
    assert _snapshot(out) == before
    kept = tmp_path / "cmp.interrupted"
    if run.marker_first:  # CP-SAT's count row had its verified plan
        plans = sorted((kept / "plans").glob("*.json"))
        assert plans, run.err
        for plan in plans:
            _assert_kept(planner.load_problem(problem_file), plan)


@pytest.fixture(scope="module")
def finished_compare(tmp_path_factory) -> Path:
    """A finished compare run of fsdp-2's problem file (2 s a row), copied into each example."""
    folder = tmp_path_factory.mktemp("finished")
    planner.save(planner.load_problem(FSDP2), folder / "p.json")
    result = run_cli("compare", folder / "p.json", "-o", folder / "cmp", "--time-limit", "2", "-q", cwd=folder,
                     timeout=BOUND_S)
    assert result.returncode == 0, result.stderr[-3000:]
    return folder / "cmp"


SIGINT_TIMES = st.lists(st.floats(0.3, 4.0), min_size=1, max_size=3).map(sorted)


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
