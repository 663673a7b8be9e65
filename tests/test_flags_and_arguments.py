"""Every flag means what it says, every bad figure is one line (exit 2) before any work, and the
library's entry points refuse bad arguments as ``solve`` does.

- ``solve --robust`` honours the policy flags (and records them in the plan, so ``verify`` with
  the same flags agrees) or refuses the flags its search cannot honour, in one line;
  ``--robust ""`` is refused, not a plain step solve.
- ``compare --time-limit`` is checked up front, as ``solve``'s; ``extract -o`` and ``compare -o``
  are checked writable before minutes of tracing.
- ``planner.position_search`` (exported), ``lower_bound``, ``collectives_after`` and
  ``to_chrome_trace`` refuse what is not theirs with a ValueError naming the argument, and a
  plan of another problem with ``PlanMismatchError``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

import planner
from bucketplan.cli import main as cli
from planner.core.arguments import PlanMismatchError
from tests.test_hostile import assert_one_line_error

DATA = Path(__file__).resolve().parent / "data" / "problems"
NCCL = DATA / "llama3-8b-fsdp-8--h100-8nodes.json.gz"


@pytest.fixture(scope="module")
def two_layer(tmp_path_factory, get_scheduled) -> Path:
    """A 2-layer FSDP problem priced by torch's NCCL model (re-priceable under scenarios)."""
    path = tmp_path_factory.mktemp("fsdp2") / "problem.json"
    planner.save(get_scheduled("llama3-8b-fsdp-2", preset="h100-8nodes").problem, path)
    return path


# -- solve --robust ---------------------------------------------------------------------------------

@pytest.mark.parametrize("flags, fragment", [
    (["--robust", ""], "--robust '': give distinct scenarios"),
    (["--robust", "torch,published", "--window", "4"], "--window with --robust"),
    (["--robust", "torch,published", "--deterministic"], "--deterministic with --robust"),
    (["--robust", "torch,published", "--positions", "free"], "--robust searches anchored plans"),
])
def test_robust_refuses_what_it_cannot_honour(tmp_path, capsys, two_layer, flags, fragment):
    out = tmp_path / "plan.json"
    code = cli(["solve", str(two_layer), "-o", str(out), "-q", "--time-limit", "3", *flags])
    assert_one_line_error(code, capsys.readouterr().err, fragment)
    assert not out.exists()


def test_robust_keeps_the_policy_it_is_given_and_records_it(tmp_path, capsys, two_layer):
    """--protect-partly and --memory-budget-gb reach every search of the robust plan: the plan
    verifies under them, records them, and `bucketplan verify` with the same flags agrees."""
    out = tmp_path / "plan.json"
    code = cli(["solve", str(two_layer), "-o", str(out), "-q", "--time-limit", "6", "--robust", "torch,published",
                "--protect-partly", "--memory-budget-gb", "0", "--workers", "1", "--seed", "3"])
    assert code == 0, capsys.readouterr().err
    plan, problem = planner.load_plan(out), planner.load_problem(two_layer)
    assert plan.params["protect_partly"] is True and plan.params["memory_budget_bytes"] == 0
    assert plan.params["workers"] == 1 and plan.params["seed"] == 3 and plan.params["interrupted"] is False
    assert not planner.verify(problem, plan, protect_partly=True, memory_budget_bytes=0)
    capsys.readouterr()
    assert cli(["verify", str(two_layer), str(out), "--protect-partly", "--memory-budget-gb", "0"]) == 0


# -- figures checked before any work ------------------------------------------------------------------

@pytest.mark.parametrize("value", ["nan", "0", "-1", "inf"])
def test_compare_checks_its_time_limit_up_front(tmp_path, capsys, value):
    code = cli(["compare", "llama3-8b-fsdp-2", "-o", str(tmp_path / "c"), "--time-limit", value, "-q"])
    assert_one_line_error(code, capsys.readouterr().err, "--time-limit must be a positive number")
    assert not (tmp_path / "c").exists()


@pytest.mark.skipif(os.geteuid() == 0 and not Path("/proc/self/mountinfo").exists(), reason="needs a read-only place")
def test_extract_refuses_an_output_folder_it_cannot_write_before_tracing(tmp_path, capsys, monkeypatch):
    """A read-only place (/proc is one for root too): refused in one line before any tracing."""
    import fxglue.pipeline as pipeline

    def no_trace(*a, **k):
        raise AssertionError("traced before the output folder was checked")

    monkeypatch.setattr(pipeline, "run_pipeline", no_trace)
    code = cli(["extract", "llama3-8b-fsdp-2", "-o", "/proc/bucketplan-out", "-q"])
    assert_one_line_error(code, capsys.readouterr().err, "-o /proc/bucketplan-out", "cannot")


def test_extract_reports_a_failed_write_in_one_line(tmp_path, capsys, monkeypatch):
    """A disk that fills while the problem is written (the probe before tracing passed)."""
    import errno

    import planner as planner_module

    def full(obj, path):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(planner_module, "save", full)
    code = cli(["extract", "llama3-8b-fsdp-2", "-o", str(tmp_path / "out"), "-q"])
    assert_one_line_error(code, capsys.readouterr().err, "No space left on device")


def test_compare_refuses_an_output_folder_it_cannot_write_before_tracing(capsys, monkeypatch):
    import bucketplan.compare as compare

    monkeypatch.setattr(compare, "run_compare", lambda *a, **k: pytest.fail("ran before the folder was checked"))
    code = cli(["compare", "llama3-8b-fsdp-2", "-o", "/proc/bucketplan-compare", "-q", "--time-limit", "1"])
    assert_one_line_error(code, capsys.readouterr().err, "-o /proc/bucketplan-compare")


# -- the library's entry points --------------------------------------------------------------------

@pytest.fixture(scope="module")
def fsdp8():
    return planner.load_problem(NCCL)


def test_position_search_is_exported_and_validates_like_solve(fsdp8):
    other = planner.Plan(problem_fingerprint="sha256:" + "ab" * 32, planner="x", created="", buckets=())
    soon = time.perf_counter() + 1
    search = planner.position_search
    with pytest.raises(ValueError, match="starts must be a list of plans"):
        search(fsdp8, None, peak_memory_bytes=None, deadline=soon)
    with pytest.raises(ValueError, match=r"starts\[0\] must be a planner.Plan"):
        search(fsdp8, [fsdp8], peak_memory_bytes=None, deadline=soon)
    with pytest.raises(PlanMismatchError, match="another problem"):
        search(fsdp8, [other], peak_memory_bytes=None, deadline=soon)
    for bad in (float("inf"), 2**70, "14e9", -1):
        with pytest.raises(ValueError, match="peak_memory_bytes must be None or an integer"):
            search(fsdp8, [], peak_memory_bytes=bad, deadline=soon)
    for bad in (None, float("nan"), -float("inf"), "soon", True):
        with pytest.raises(ValueError, match="deadline must be"):
            search(fsdp8, [], peak_memory_bytes=None, deadline=bad)
    with pytest.raises(ValueError, match="options must be a planner.PositionSearchOptions"):
        search(fsdp8, [], {"seed": 1}, peak_memory_bytes=None, deadline=soon)
    with pytest.raises(ValueError, match="seed must be an integer"):
        planner.PositionSearchOptions(seed="a")
    with pytest.raises(ValueError, match="keep_overlap must be True or False"):
        planner.PositionSearchOptions(keep_overlap="no")
    with pytest.raises(ValueError, match="max_evaluations must be a positive number"):
        planner.PositionSearchOptions(max_evaluations=0)


def test_the_other_entry_points_name_the_bad_argument(fsdp8):
    with pytest.raises(ValueError, match="problem must be a planner.Problem"):
        planner.lower_bound(None)
    with pytest.raises(ValueError, match="objective must be 'count' or 'exposure'"):
        planner.lower_bound(fsdp8, "step")
    with pytest.raises(ValueError, match="protect_partly must be True or False"):
        planner.lower_bound(fsdp8, protect_partly="no")
    with pytest.raises(ValueError, match="problem must be a planner.Problem"):
        planner.collectives_after(None, None)
    with pytest.raises(ValueError, match="plan must be a planner.Plan or None"):
        planner.collectives_after(fsdp8, {"buckets": []})
    assert planner.collectives_after(fsdp8, None) == len(fsdp8.collectives)
    with pytest.raises(ValueError, match="sim must be a planner.Simulation"):
        planner.to_chrome_trace(None, fsdp8)


def test_a_step_plan_records_its_bound_scope_and_gap(tmp_path, capsys, two_layer):
    """What solve printed about a step plan travels in its file (``params['bound']``): the bound
    never above the plan's simulated step, the same scope words, and the gap between them."""
    out = tmp_path / "plan.json"
    assert cli(["solve", str(two_layer), "-o", str(out), "--time-limit", "3", "--workers", "1"]) == 0
    printed = capsys.readouterr().out
    plan, problem = planner.load_plan(out), planner.load_problem(two_layer)
    bound, step = plan.params["bound"], planner.simulate(problem, plan).step_ms
    assert f"/ {bound['bound_ms']:.3f} ms ({bound['scope']})" in printed
    assert bound["bound_ms"] <= step + 1e-9
    assert bound["gap"] == pytest.approx((step - bound["bound_ms"]) / step, abs=1e-5)
