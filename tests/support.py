"""What several test files share: the committed problems of ``tests/data/problems``, the command
line run in a child process (as a user's shell runs it), and the scripts of ``tests/scripts``.

Fixtures are read from ``tests/data`` only, never from ``experiments/results``: re-running an
experiment must not change a test. ``tests/data/problems/README.md`` says where each file came from.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

import planner

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
PROBLEMS = DATA / "problems"
# `python -m CLI_MODULE ARGS` is `bucketplan ARGS` run from this checkout
CLI_MODULE = "bucketplan"


def data_problem(name: str) -> planner.Problem:
    """``tests/data/problems/NAME.json.gz``, e.g. ``llama3-8b-fsdp-2--alpha-beta``."""
    return planner.load_problem(PROBLEMS / f"{name}.json.gz")


def data_plan(name: str) -> planner.Plan:
    """``tests/data/problems/NAME.json.gz``, e.g. ``llama3-8b-fsdp-2--alpha-beta-greedy-plan``."""
    return planner.load_plan(PROBLEMS / f"{name}.json.gz")


def cli_argv(*args) -> list[str]:
    """The command line ``bucketplan ARGS`` as this interpreter runs it."""
    return [sys.executable, "-m", CLI_MODULE, *map(str, args)]


def run_cli(*args, timeout: float = 300, **kw) -> subprocess.CompletedProcess:
    """``bucketplan ARGS`` in a child process from the repository root, its output captured as text;
    a command still running after ``timeout`` seconds fails the test (a hang, not an error)."""
    try:
        return subprocess.run(cli_argv(*args), cwd=kw.pop("cwd", ROOT), capture_output=True, text=True,
                              timeout=timeout, **kw)
    except subprocess.TimeoutExpired:
        pytest.fail(f"bucketplan {' '.join(map(str, args))} did not end within {timeout}s (hangs?)")


def start_cli(*args, **kw) -> subprocess.Popen:
    """``bucketplan ARGS`` started in a child process from the repository root, stdout and stderr piped."""
    return subprocess.Popen(cli_argv(*args), cwd=kw.pop("cwd", ROOT), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def run_main(argv: list, capsys) -> tuple[int, str, str]:
    """``bucketplan ARGV`` in this process: its exit status, and its stdout and stderr (``capsys``)."""
    from bucketplan.cli import main

    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def script_argv(name: str, *args) -> list[str]:
    """``tests/scripts/NAME.py ARGS`` run as a module from the repository root (so ``tests`` imports)."""
    return [sys.executable, "-m", f"tests.scripts.{name}", *map(str, args)]


def run_script(name: str, *args, timeout: float = 300, **kw) -> subprocess.CompletedProcess:
    """``tests/scripts/NAME.py ARGS`` in a child process, its output captured as text."""
    return subprocess.run(script_argv(name, *args), cwd=ROOT, capture_output=True, text=True, timeout=timeout, **kw)


def sigint_default() -> None:
    """In a child before it starts: SIGINT as a terminal gives it. A background job of a shell
    inherits it ignored, and Python then never raises KeyboardInterrupt: every Ctrl-C test failed
    in a test run started with `nohup ... &`."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
