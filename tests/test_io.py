"""planner/core/io.py: problem and plan files round-trip exactly, are written atomically with the mode
open() would give, and a file that is no problem file is refused naming the file.

What the types themselves refuse (unknown and missing fields, broken references, an edited
fingerprint, plans whose buckets break the schema) is in test_problem.py; hostile files (too
large, not regular files, duplicate keys, deep nesting, a schema version of ``true``) in
test_hostile.py; replacing a whole output folder (``replace_dir_atomically``) in
test_replace_dir.py; gzipped problems are read by test_sweep.py.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import planner
from bucketplan.cli import main as cli_main
from tests.conftest import edit_json, load_fails_naming_file_and_field
from tests.strategies import plans, problems


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_problem_and_plan_round_trip_exactly(tmp_path_factory, data):
    problem = data.draw(problems())
    plan = data.draw(plans(problem))
    d = tmp_path_factory.mktemp("rt")
    planner.save(problem, d / "problem.json")
    planner.save(plan, d / "plan.json")
    assert planner.load_problem(d / "problem.json") == problem
    assert planner.load_plan(d / "plan.json") == plan
    # the fingerprint is reproducible from content alone
    assert planner.load_problem(d / "problem.json").content_fingerprint() == problem.fingerprint


# files refused before the types see them: not JSON, not an object, no or another schema version
BROKEN = {
    "truncated": (lambda p: p.write_text(p.read_text()[:100]), "not valid JSON"),
    "not an object": (lambda p: p.write_text("[1, 2]"), "holds a JSON object"),
    "future schema": (lambda p: edit_json(p, lambda d: d.update(schema_version=4)),
                      "schema_version: 4 is not supported"),
    "no schema": (lambda p: edit_json(p, lambda d: d.pop("schema_version")), "schema_version: missing field"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_problem_file_names_file_and_field(problem_file, case):
    load_fails_naming_file_and_field(problem_file, *BROKEN[case])


def test_save_is_atomic_and_leaves_no_temporary_files(problem_file):
    problem = planner.load_problem(problem_file)
    out = problem_file.parent / "sub" / "copy.json"
    planner.save(problem, out)
    assert sorted(p.name for p in out.parent.iterdir()) == ["copy.json"]


def test_cli_exits_non_zero_and_names_the_file(problem_file, capsys):
    problem_file.write_text(problem_file.read_text()[:50])
    code = cli_main(["verify", str(problem_file), str(problem_file)])
    err = capsys.readouterr().err
    assert code == 2
    assert str(problem_file) in err and "not valid JSON" in err


def test_written_files_get_the_mode_open_would_give_not_0600(tmp_path):
    import os

    from planner.core.io import atomic_write_text

    umask = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "a.json", "{}")
        assert (tmp_path / "a.json").stat().st_mode & 0o777 == 0o644
    finally:
        os.umask(umask)


@pytest.mark.slow  # writes a 9 MB problem and solves it in a child process under a memory limit
def test_a_problem_too_big_for_the_memory_left_is_one_line_not_an_abort(tmp_path):
    """pydantic-core aborts the process when an allocation fails while it validates (no except
    catches that); measured with this 10,000-collective problem (9 MB of JSON): under
    `ulimit -v` 450 MB its load aborted, at 500 MB it hung. Load refuses such a file up front."""
    import resource

    from tests.chain import chain_problem
    from tests.support import run_cli

    big = tmp_path / "big.json"
    planner.save(chain_problem(60020, 10000), big)

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (400 * 2**20, resource.RLIM_INFINITY))

    result = run_cli("solve", big, "-o", tmp_path / "plan.json", "--time-limit", "5", timeout=120,
                     preexec_fn=limited)
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    (line,) = result.stderr.strip().splitlines()
    assert f"{big}: loading this problem file (9 MB of JSON) takes about 0.3 GB of memory" in line
    assert not (tmp_path / "plan.json").exists()
