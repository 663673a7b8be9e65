"""A problem file given where a plan is expected, or a plan file where a problem is: one line
saying which file it is, not which field of the other kind it lacks."""

from __future__ import annotations

from bucketplan.cli import main
from tests.support import PROBLEMS
from tests.test_hostile import assert_one_line_error

PROBLEM = PROBLEMS / "llama3-8b-fsdp-2--alpha-beta.json.gz"
PLAN = PROBLEMS / "llama3-8b-fsdp-2--alpha-beta-greedy-plan.json.gz"


def test_a_problem_file_as_the_hint_is_named_as_such(tmp_path, capsys):
    out = tmp_path / "x.json"
    code = main(["solve", str(PROBLEM), "--hint", str(PROBLEM), "-o", str(out), "-q", "--time-limit", "1"])
    assert_one_line_error(code, capsys.readouterr().err, f"{PROBLEM}: this is a problem file, not a plan")
    assert not out.exists()


def test_a_plan_file_as_the_problem_is_named_as_such(tmp_path, capsys):
    out = tmp_path / "x.json"
    code = main(["solve", str(PLAN), "-o", str(out), "-q", "--time-limit", "1"])
    assert_one_line_error(code, capsys.readouterr().err, f"{PLAN}: this is a plan file, not a problem")
    assert not out.exists()


def test_verify_with_the_files_swapped_names_the_first(capsys):
    code = main(["verify", str(PLAN), str(PROBLEM)])
    assert_one_line_error(code, capsys.readouterr().err, f"{PLAN}: this is a plan file, not a problem")
