"""`bucketplan check` runs what the user gives it as given, and refuses what cannot run in a
few lines, exit 2, without a traceback: through the command line, as a user runs it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support import run_cli

pytestmark = pytest.mark.slow  # check spawns gloo ranks

DATA = Path(__file__).resolve().parent / "data"


def _check(*argv: str) -> subprocess.CompletedProcess:
    # bounded: a rank left waiting in a collective for one that stopped would otherwise hang the run
    return run_cli("check", *argv, "-q", timeout=300)


def test_check_model_runs_the_factorys_own_inputs():
    # the factory's targets are class ids below 4; check used to replace them by ids below 16
    # (IndexError: Target 14 is out of bounds, on every rank)
    proc = _check("--model", f"{DATA / 'four_class_factory.py'}:build", "--ranks", "2", "--planner", "greedy")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "rank 0: bitwise equal" in proc.stdout and "rank 1: bitwise equal" in proc.stdout
    assert proc.stdout.rstrip().endswith("OK")


def test_check_plan_of_another_problem_is_one_line_per_rank_exit_2():
    # a real plan of another problem: llama3-8b-ddp-2 at full shapes (from experiments/), given
    # to the tiny FSDP check; it used to print both ranks' tracebacks and exit 1
    plan = DATA / "llama3-8b-ddp-2-full-shapes-plan.json"
    proc = _check("llama3-8b-fsdp-2", "--ranks", "2", "--plan", str(plan))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    lines = proc.stderr.splitlines()
    assert lines[0].startswith(f"bucketplan check: error: --plan {plan}: refused by 2 of 2 ranks")
    assert [line.split(":")[0] for line in lines[1:]] == ["  rank 0", "  rank 1"]
    assert all(str(plan) in line and "plan-matches-problem" in line for line in lines[1:])


def _garbage(folder: Path) -> Path:
    (folder / "garbage.json").write_text("{not json")
    return folder / "garbage.json"


@pytest.mark.parametrize("make, named", [
    pytest.param(lambda d: d / "missing.json", "missing.json", id="missing"),
    pytest.param(_garbage, "garbage.json", id="garbage"),
])
def test_an_unreadable_plan_is_one_line_before_any_rank_starts(tmp_path, make, named):
    # each rank used to read the file itself: a traceback from every rank, exit 1
    plan = make(tmp_path)
    proc = _check("llama3-8b-fsdp-2", "--ranks", "2", "--plan", str(plan))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and named in proc.stderr and "Traceback" not in proc.stderr


def test_each_data_parallel_rank_gets_the_factorys_inputs_drawn_under_its_own_seed():
    # what the gloo run above cannot show: the inputs are the factory's (targets below 4), yet
    # differ across data-parallel ranks, as a batch does in training
    import torch

    from fxglue.models.custom import factory_workload
    from fxglue.run.gloo import _rank_inputs

    wl = factory_workload(f"{DATA / 'four_class_factory.py'}:build")
    # groups: None, as this factory never reads them (real ones need a process group)
    (x0, y0), (x1, y1), (x0_again, _) = [_rank_inputs(wl, None, (), r, from_factory=True) for r in (0, 1, 0)]
    assert y0.dtype == y1.dtype == torch.long and int(max(y0.max(), y1.max())) < 4
    assert not torch.equal(x0, x1) and torch.equal(x0, x0_again)
