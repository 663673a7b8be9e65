"""CP-SAT never takes the process down: every solver configuration the project uses, run in a
subprocess under ``python -X faulthandler`` that must exit 0 (tests/scripts/solver_configurations.py).

OR-Tools 9.15 aborts the process (SIGABRT, "Check failed: heuristics.fixed_search != nullptr")
when an interleaved search of two or more workers is given a hint for a model whose
infeasibility it finds while loading; the count search's bound probes were such models.
``test_or_tools_still_aborts_on_the_minimal_model`` keeps the three-variable reproduction: when
an OR-Tools release fixes it, that test says so, and the rule "hint only what satisfies the
model" (planner/search/solver.py, above ``_probe``) may be relaxed.
"""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from tests.support import CLI_MODULE, PROBLEMS, ROOT

pytestmark = pytest.mark.slow  # CP-SAT in child processes under faulthandler

BOUND_S = 600


def _run(*args: str, timeout: float = BOUND_S) -> subprocess.CompletedProcess:
    """``python -X faulthandler ARGS``: a native abort shows as the exit status and its stack on stderr."""
    return subprocess.run([sys.executable, "-X", "faulthandler", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def _assert_clean(proc: subprocess.CompletedProcess) -> None:
    aborted = proc.returncode == -signal.SIGABRT or "Fatal Python error" in proc.stderr or "Check failed" in proc.stderr
    assert proc.returncode == 0 and not aborted, (
        f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")


def test_the_count_probe_with_two_workers_completes():
    """The configuration that aborted: a count search with two workers whose probe asks for fewer
    collectives than the best plan (llama3-8b-fsdp-8 @ ab-ib8)."""
    proc = _run("-m", "tests.scripts.solver_configurations", "--quick")
    _assert_clean(proc)
    assert "ok count/workers=2/hint=True/window=auto" in proc.stdout


@pytest.mark.long
def test_every_solver_configuration_completes():
    """Both objectives x 1/2/4 workers x hint or not x full model or a window, and the repair."""
    proc = _run("-m", "tests.scripts.solver_configurations", timeout=2 * BOUND_S)
    _assert_clean(proc)
    assert proc.stdout.count("\nok ") + proc.stdout.startswith("ok ") == 25, proc.stdout


@pytest.mark.long
def test_count_solve_on_the_problem_that_aborted_returns_its_plan_from_the_cli(tmp_path):
    """The command that aborted, as a user types it: a 60 s count solve with two workers (the
    library's solve with its probes brought forward runs in the default tier, above)."""
    problem = tmp_path / "problem.json.gz"
    problem.write_bytes((PROBLEMS / "llama3-8b-fsdp-8--ab-ib8.json.gz").read_bytes())
    proc = _run("-m", CLI_MODULE, "solve", str(problem), "-o", str(tmp_path / "p.json"), "--objective", "count",
                "--time-limit", "60", "--workers", "2", "-q")
    _assert_clean(proc)
    assert (tmp_path / "p.json").is_file() and "status" in proc.stdout


def test_or_tools_still_aborts_on_the_minimal_model():
    """The upstream bug, reduced (docs/results.md, "An OR-Tools abort"; tests/scripts/or_tools_abort.py):
    three Booleans whose odd cycle cover needs two, at most one allowed -- infeasible, which the LP
    finds while loading --, a hint, interleaved search, two workers. Without the hint it ends
    INFEASIBLE. Skipped once an OR-Tools release no longer aborts."""
    without = _run("-m", "tests.scripts.or_tools_abort", "nohint", timeout=60)
    assert without.returncode == 0 and without.stdout.strip() == "INFEASIBLE", without.stderr[-2000:]
    hinted = _run("-m", "tests.scripts.or_tools_abort", "hint", timeout=60)
    if hinted.returncode == 0:  # not a failure of ours: the rule above _probe may then be relaxed
        pytest.skip("this OR-Tools no longer aborts on a hinted infeasible model")
    assert hinted.returncode == -signal.SIGABRT and "heuristics.fixed_search" in hinted.stderr
