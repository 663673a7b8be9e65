"""Interrupt means interrupted, everywhere: Ctrl-C in ``compare``, ``solve --positions free``,
``solve --positions free --prove``, ``solve --robust``, ``solve-dir`` (every planner), ``extract`` and while the command line starts
stops within seconds, exits 130 without a traceback, keeps the best verified result marked
``interrupted``, never replaces a finished output with a cut-short one, and the next
``solve-dir`` solves it again. ``solve-dir --jobs`` survives a solve whose process dies.

Each command runs in its own session (``start_new_session``) and gets SIGINT on its process
group, as a terminal sends Ctrl-C, once its progress says it is where the test wants it.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

import planner
from planner.jobs.plan_dir import PLAN, PROBLEM, problem_dir, SolveDirOptions, solve_dir
from tests.support import PROBLEMS, ROOT, run_cli, run_script, start_cli

pytestmark = pytest.mark.slow  # every command runs, and is interrupted, in a child process

FSDP8 = PROBLEMS / "llama3-8b-fsdp-8--ab-ib8.json.gz"
FSDP8_GREEDY = PROBLEMS / "llama3-8b-fsdp-8--ab-ib8-greedy-plan.json.gz"
FSDP8_NCCL = PROBLEMS / "llama3-8b-fsdp-8--h100-8nodes.json.gz"  # priced by torch's NCCL model: re-priceable
BOUND_S = 120  # every command here is interrupted within seconds; one that runs this long hangs
STOPS_WITHIN_S = 5.0  # from SIGINT to exit: "within a second or two", with a loaded machine's slack


class Interrupted:
    """A command run in its own session, interrupted once ``marker`` shows on its stderr."""

    def __init__(self, *args: str, marker: str, delay_s: float = 0.0, cwd: Path = ROOT):
        self.proc = start_cli(*args, cwd=cwd, start_new_session=True)
        self.err_lines: list[str] = []
        seen = threading.Event()

        def read_stderr() -> None:
            for line in self.proc.stderr:
                self.err_lines.append(line)
                if marker in line:
                    seen.set()
        reader = threading.Thread(target=read_stderr, daemon=True)
        reader.start()
        try:
            if not seen.wait(BOUND_S):
                pytest.fail(f"never saw {marker!r}: {''.join(self.err_lines)[-2000:]}")
            time.sleep(delay_s)
            sent = time.monotonic()
            os.killpg(self.proc.pid, signal.SIGINT)
            self.out = self.proc.stdout.read()
            self.proc.wait(BOUND_S)
            self.stop_s = time.monotonic() - sent
            reader.join(10)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.err = "".join(self.err_lines)
        self.code = self.proc.returncode

    def assert_interrupted(self) -> None:
        assert self.code == 130 and "Traceback" not in self.err, (self.code, self.err[-3000:])
        assert self.stop_s < STOPS_WITHIN_S, f"took {self.stop_s:.1f} s to stop after SIGINT"


@pytest.fixture
def fsdp8(tmp_path) -> Path:
    """llama3-8b-fsdp-8 @ ab-ib8 (224 collectives) and torch's greedy plan beside it, as extract writes them."""
    folder = tmp_path / "fsdp8"
    folder.mkdir()
    planner.save(planner.load_problem(FSDP8), folder / "problem.json")
    planner.save(planner.load_plan(FSDP8_GREEDY), folder / "greedy-plan.json")
    return folder


@pytest.mark.long  # ~30 s (a whole compare first); the default run's test_ctrl_c_keeps_work.py
# (test_any_ctrl_c_sequence_keeps_finished_work_and_the_best_verified_plan[compare]) checks the same:
# a finished compare folder byte for byte as it was after Ctrl-Cs at random moments, exit 130
def test_ctrl_c_in_compare_leaves_a_finished_run_as_it_was(fsdp8, tmp_path):
    out = tmp_path / "compare"
    finished = run_cli("compare", fsdp8 / "problem.json", "-o", out, "--time-limit", "1", "-q", timeout=BOUND_S)
    assert finished.returncode == 0, finished.stderr[-2000:]
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    run = Interrupted("compare", fsdp8 / "problem.json", "-o", out, "--force", "--time-limit", "10",
                      marker="planner 2/3", delay_s=3.0)
    run.assert_interrupted()
    assert f"{out} is left as it was" in run.err
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    # the count row's plan, made before the Ctrl-C, is kept beside it, verified and marked
    kept = tmp_path / "compare.interrupted"
    assert f"{kept}/plans/" in run.err
    problem = planner.load_problem(fsdp8 / "problem.json")
    plans = sorted((kept / "plans").glob("*.json"))
    assert plans
    for path in plans:
        plan = planner.load_plan(path)
        assert plan.params["interrupted"] is True and not planner.verify(problem, plan)
    assert not any(p.name.startswith(".") and p.is_dir() for p in tmp_path.iterdir())  # no temporary folder left


def test_ctrl_c_in_the_positioned_search_writes_its_plan_marked_interrupted(fsdp8, tmp_path):
    plan_path = tmp_path / "plan.json"
    run = Interrupted("solve", fsdp8 / "problem.json", "-o", plan_path, "--positions", "free", "--time-limit", "40",
                      "--hint", fsdp8 / "greedy-plan.json", marker="positioned search within", delay_s=3.0)
    run.assert_interrupted()
    plan = planner.load_plan(plan_path)
    assert plan.params["interrupted"] is True and plan.params["positions"] == "free"
    problem = planner.load_problem(fsdp8 / "problem.json")
    from planner.rules.verifier import recorded_policy

    assert not planner.verify(problem, plan, **recorded_policy(plan))


def test_ctrl_c_while_prove_searches_keeps_its_best_plan_marked_interrupted(tmp_path):
    """--prove's CP-SAT (from a weak 3 s deterministic search, whose space it does not close in
    120 s) stops at a Ctrl-C: the best plan within the budget, verified, marked interrupted."""
    plan_path = tmp_path / "plan.json"
    run = Interrupted("solve", PROBLEMS / "llama3-8b-fsdp-2--h100-8nodes-graph-order.json.gz", "-o", plan_path,
                      "--positions", "free", "--time-limit", "3", "--deterministic", "--prove", "120",
                      marker="CP-SAT over the search plan's candidate space", delay_s=4.0)
    run.assert_interrupted()
    plan = planner.load_plan(plan_path)
    assert plan.params["interrupted"] is True and plan.params["candidate_bound"]["status"] == "FEASIBLE"
    problem = planner.load_problem(PROBLEMS / "llama3-8b-fsdp-2--h100-8nodes-graph-order.json.gz")
    from planner.rules.verifier import recorded_policy

    assert not planner.verify(problem, plan, **recorded_policy(plan))
    assert planner.cost.memory.peak_bytes(problem, plan) <= planner.cost.memory.peak_bytes(problem)
    assert "interrupted" in run.out


def test_ctrl_c_in_a_robust_solve_stops_and_marks_its_plan(tmp_path):
    plan_path = tmp_path / "plan.json"
    run = Interrupted("solve", FSDP8_NCCL, "-o", plan_path, "--robust", "torch,published",
                      "--time-limit", "60", marker="step search under scenario torch", delay_s=4.0)
    run.assert_interrupted()
    plan = planner.load_plan(plan_path)
    assert plan.params["interrupted"] is True and plan.planner == "robust"
    assert "interrupted" in run.out


def _recorded(root: Path, source: Path) -> Path:
    problem = planner.load_problem(source)
    folder = problem_dir(root, problem.fingerprint)
    planner.save(problem, folder / PROBLEM)
    return folder


@pytest.mark.long  # 17 s: solve --positions free interrupted runs in the default run
def test_ctrl_c_in_solve_dir_free_positions_keeps_the_plan_marked_and_the_rerun_solves_it(tmp_path):
    folder = _recorded(tmp_path, FSDP8)
    run = Interrupted("solve-dir", tmp_path, "--positions", "free", "--time-limit", "30", "--workers", "2",
                      marker="[1/1] solving", delay_s=14.0)  # CP-SAT has the first 6 s, the positioned search the rest
    run.assert_interrupted()
    plan = planner.load_plan(folder / PLAN)
    assert plan.params["interrupted"] is True and plan.params.get("positions") == "free"
    rerun = run_cli("solve-dir", tmp_path, "--time-limit", "2", "--workers", "1", timeout=BOUND_S)
    assert rerun.returncode == 0 and "1 to solve (1 interrupted earlier)" in rerun.stderr, rerun.stderr[-2000:]
    assert planner.load_plan(folder / PLAN).params["interrupted"] is False


def test_ctrl_c_while_extract_traces_is_one_line_and_exit_130(tmp_path):
    run = Interrupted("extract", "llama3-8b-fsdp-8", "-o", tmp_path / "out", marker="tracing", delay_s=0.5)
    run.assert_interrupted()
    assert run.err.strip().splitlines()[-1] == "bucketplan extract: interrupted"
    assert not (tmp_path / "out" / "problem.json").exists()


def test_ctrl_c_while_the_command_line_starts_is_exit_130(tmp_path):
    """SIGINT a moment after start, while planner, OR-Tools and torch load (from 0.3 s on: before
    that the interpreter is still compiling the command line's own module, which is Python's)."""
    for delay in (0.3, 0.45, 0.6, 1.0, 1.5):
        proc = start_cli("workloads", start_new_session=True)
        time.sleep(delay)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=BOUND_S)
        # done before the signal came (0), or interrupted: 130, or dead of SIGINT after its line (a
        # shell reports both as 130) -- never a traceback
        assert proc.returncode in (0, 130, -signal.SIGINT) and "Traceback" not in err, (delay, proc.returncode,
                                                                                       err[-2000:])


# -- solve-dir --jobs: one solve's process dying costs only its own problem ----------------------

def _tiny_problems(root: Path, n: int) -> list[Path]:
    from tests.test_resume_hostile import _tiny

    folders = []
    for i in range(n):
        p = _tiny(i)
        folder = problem_dir(root, p.fingerprint)
        planner.save(p, folder / PROBLEM)
        folders.append(folder)
    return folders


def test_solve_dir_jobs_survives_a_solve_whose_process_dies(tmp_path, monkeypatch):
    """One solve aborts natively (os.abort, as OR-Tools' CHECK did); the other finishes, the dead
    one is reported and has no plan, and the next run solves it."""
    import planner.jobs.plan_dir as plan_dir

    doomed, healthy = _tiny_problems(tmp_path, 2)
    real = plan_dir.solve_one

    def abort_one(job):
        if Path(job.folder) == doomed:
            import faulthandler

            faulthandler.disable()  # pytest's: its dump of the aborting child is noise here
            os.abort()
        return real(job)

    monkeypatch.setattr(plan_dir, "solve_one", abort_one)  # the solves are forked: they run this
    options = SolveDirOptions(objective="step", time_limit_s=2, jobs=2, workers=1)
    rows = {r["problem"]: r for r in solve_dir(tmp_path, options)}
    assert rows[healthy.name]["plan_ms"] is not None and (healthy / PLAN).is_file()
    assert rows[doomed.name]["status"] == "ERROR" and "died (signal SIGABRT)" in rows[doomed.name]["note"]
    assert not (doomed / PLAN).exists()
    monkeypatch.setattr(plan_dir, "solve_one", real)
    again = solve_dir(tmp_path, options)
    assert all(r["plan_ms"] is not None for r in again) and (doomed / PLAN).is_file()


def test_solve_dir_cli_reports_the_dead_solve_and_exits_1(tmp_path):
    """The same through the command line: a solve killed from outside (SIGKILL, as the OOM killer
    does) while the other goes on."""
    doomed = _recorded(tmp_path, FSDP8_NCCL)
    (healthy,) = _tiny_problems(tmp_path, 1)
    proc = start_cli("solve-dir", tmp_path, "--jobs", "2", "--workers", "1", "--time-limit", "60",
                     start_new_session=True)
    from tests.test_resume_hostile import _children

    deadline = time.monotonic() + BOUND_S
    while not (healthy / PLAN).exists():  # the tiny problem solves in a second; the 8-layer one runs on
        assert proc.poll() is None and time.monotonic() < deadline, "the tiny problem was never solved"
        time.sleep(0.2)
    time.sleep(1)
    alive = _children(proc.pid)
    assert alive, "no solve running"
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    out, err = proc.communicate(timeout=BOUND_S)
    assert proc.returncode == 1 and "Traceback" not in err, err[-3000:]
    assert f"no plan for 1 problem(s): {doomed.name[:12]}" in err
    assert "died (signal SIGKILL)" in (tmp_path / "summary.md").read_text()
    assert (healthy / PLAN).is_file() and not (doomed / PLAN).exists()


@pytest.mark.slow  # a child process: it sends SIGINT to itself
def test_a_ctrl_c_while_torch_loads_waits_for_the_import_to_end():
    """Raised inside torch's import, a KeyboardInterrupt met pybind11 code that aborted the process
    (SIGABRT, "terminate called after throwing an instance of 'pybind11::error_already_set'"; seen
    at 1.0-1.2 s into `bucketplan workloads` on a loaded machine). The latch holds it until the
    module has loaded and raises it then."""
    result = run_script("ctrl_c_native_import", timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.splitlines() == ["raised after the body True", "torch deferred True", "json left alone True",
                                          "finder removed True"]


def test_a_ctrl_c_inside_a_class_body_is_known_for_one():
    """A KeyboardInterrupt in a descriptor's ``__set_name__`` (a dataclass field, while planner's
    modules load) comes out of the class statement as "RuntimeError: Error calling __set_name__"
    on Python 3.11 (the KeyboardInterrupt its cause), itself on later versions: the command line
    takes either for the Ctrl-C it is (exit 130, "interrupted while starting"); a RuntimeError of
    its own is not one."""
    from bucketplan.cli import _by_ctrl_c

    class Interrupting:
        def __set_name__(self, owner, name):
            raise KeyboardInterrupt

    with pytest.raises(BaseException) as caught:
        type("Loading", (), {"field": Interrupting()})
    assert _by_ctrl_c(caught.value)
    assert not _by_ctrl_c(RuntimeError("Error calling __set_name__"))


def test_a_command_that_loads_a_class_as_ctrl_c_comes_exits_130(monkeypatch, capsys):
    """The same inside a command (its modules load lazily): exit 130 and one line, not a
    traceback (the RuntimeError passed the command line's Ctrl-C handlers); an unrelated
    RuntimeError still propagates."""
    import bucketplan.cli.workloads as workloads
    from bucketplan.cli import main

    class Interrupting:
        def __set_name__(self, owner, name):
            raise KeyboardInterrupt

    monkeypatch.setattr(workloads, "run", lambda args: type("Loading", (), {"field": Interrupting()}))
    assert main(["workloads"]) == 130
    assert capsys.readouterr().err == "bucketplan workloads: interrupted\n"

    def broken(args):
        raise RuntimeError("not a Ctrl-C")

    monkeypatch.setattr(workloads, "run", broken)
    with pytest.raises(RuntimeError, match="not a Ctrl-C"):
        main(["workloads"])
