"""Problem and Plan files: exact JSON round-trips and clear errors for broken files."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import planner
from bucketplan_cli import main as cli_main
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


@pytest.fixture
def problem_file(tmp_path):
    p = planner.Problem(
        bucket_mode="default", bucket_cap_bytes=1 << 30, n_scheduled=3,
        collectives=(planner.Collective(name="ag", wait="w", kind="all_gather", pg="0", key="all_gather/0/bf16",
                                        dtype="bfloat16", size_bytes=10, wire_bytes=10, est_ms=1.0, exposed_ms=1.0,
                                        start_pos=0, wait_pos=2, status="exposed"),),
        nodes=(planner.Node(name="ag", kind="start", pos=0, est_ms=1.0),
               planner.Node(name="mm", kind="compute", pos=1, est_ms=1.0),
               planner.Node(name="w", kind="wait", pos=2, est_ms=0.0, deps=(0,))),
        timelines=(planner.Timeline(pg="0", nodes=(0, 1, 2), types="scw"),),
        links=(planner.Link(pg="0", group_size=8, latency_ms=0.025, bandwidth_gbps=40.0),),
    ).with_fingerprint()
    path = tmp_path / "problem.json"
    planner.save(p, path)
    return path


def _edit(path, fn):
    data = json.loads(path.read_text())
    fn(data)
    path.write_text(json.dumps(data))


BROKEN = {
    "truncated": (lambda p: p.write_text(p.read_text()[:100]), "not valid JSON"),
    "not an object": (lambda p: p.write_text("[1, 2]"), "holds a JSON object"),
    "future schema": (lambda p: _edit(p, lambda d: d.update(schema_version=2)), "schema_version: 2 is not supported"),
    "no schema": (lambda p: _edit(p, lambda d: d.pop("schema_version")), "schema_version: missing field"),
    "unknown top field": (lambda p: _edit(p, lambda d: d.update(colour="red")), "colour: unknown field"),
    "unknown nested field": (lambda p: _edit(p, lambda d: d["collectives"][0].update(extra=1)),
                             "collectives[0].extra: unknown field"),
    "missing nested field": (lambda p: _edit(p, lambda d: d["collectives"][0].pop("kind")),
                             "collectives[0].kind: missing field"),
    "bad kind": (lambda p: _edit(p, lambda d: d["collectives"][0].update(kind="broadcast")),
                 "collectives[0].kind"),
    "edited content": (lambda p: _edit(p, lambda d: d["nodes"][1].update(est_ms=9.0)),
                       "fingerprint does not match"),
    "dangling wait": (lambda p: _edit(p, lambda d: d["collectives"][0].update(wait="nope")),
                      "collectives[0] (ag): wait node 'nope' is not among nodes"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_problem_file_names_file_and_field(problem_file, case):
    breaker, expected = BROKEN[case]
    breaker(problem_file)
    with pytest.raises(planner.SchemaError) as err:
        planner.load_problem(problem_file)
    assert str(problem_file) in str(err.value)
    assert expected in str(err.value)


def test_plan_with_anchor_outside_bucket_is_rejected(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"schema_version": 1, "problem_fingerprint": "x", "planner": "hand",
                                "created": "now", "buckets": [{"members": ["a", "b"], "start": "c", "wait": "a"}]}))
    with pytest.raises(planner.SchemaError, match=r"plan.json: invalid plan: buckets\[0\].*start anchor 'c' is not a member"):
        planner.load_plan(path)


def test_plan_with_collective_in_two_buckets_is_rejected(tmp_path):
    path = tmp_path / "plan.json"
    b = {"members": ["a", "b"], "start": "a", "wait": "b"}
    path.write_text(json.dumps({"schema_version": 1, "problem_fingerprint": "x", "planner": "hand",
                                "created": "now", "buckets": [b, {"members": ["b", "c"], "start": "b", "wait": "c"}]}))
    with pytest.raises(planner.SchemaError, match="collective 'b' is in bucket 0 and bucket 1"):
        planner.load_plan(path)


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

    from planner.io import atomic_write_text

    umask = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "a.json", "{}")
        assert (tmp_path / "a.json").stat().st_mode & 0o777 == 0o644
    finally:
        os.umask(umask)
