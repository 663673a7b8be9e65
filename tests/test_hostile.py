"""Hostile inputs: every broken problem or plan file gets an exact, named error and a non-zero exit."""

from __future__ import annotations

import json

import pytest

import planner
from bucketplan_cli import main as cli


def _problem() -> planner.Problem:
    """ag_a -> mm -> ag_b (b depends on a's wait); ag_c in float32; a big ag_e; rs_d."""
    N, C = planner.Node, planner.Collective

    def coll(name, wait, kind, dtype, size, s, w):
        return C(name=name, wait=wait, kind=kind, pg="0", key=f"{kind}/0/{dtype}", dtype=dtype, size_bytes=size,
                 wire_bytes=size, est_ms=0.1, exposed_ms=0.1, start_pos=s, wait_pos=w, status="exposed")

    nodes = (N(name="ag_a", kind="start", pos=0, est_ms=0.1), N(name="w_a", kind="wait", pos=1, est_ms=0, deps=(0,)),
             N(name="mm", kind="compute", pos=2, est_ms=1.0, deps=(1,)),
             N(name="ag_b", kind="start", pos=3, est_ms=0.1, deps=(2,)),
             N(name="w_b", kind="wait", pos=4, est_ms=0, deps=(3,)),
             N(name="ag_c", kind="start", pos=5, est_ms=0.1), N(name="w_c", kind="wait", pos=6, est_ms=0, deps=(5,)),
             N(name="ag_e", kind="start", pos=7, est_ms=0.1), N(name="w_e", kind="wait", pos=8, est_ms=0, deps=(7,)),
             N(name="rs_d", kind="start", pos=9, est_ms=0.1), N(name="w_d", kind="wait", pos=10, est_ms=0, deps=(9,)))
    colls = (coll("ag_a", "w_a", "all_gather", "bfloat16", 10, 0, 1),
             coll("ag_b", "w_b", "all_gather", "bfloat16", 10, 3, 4),
             coll("ag_c", "w_c", "all_gather", "float32", 10, 5, 6),
             coll("ag_e", "w_e", "all_gather", "bfloat16", 95, 7, 8),
             coll("rs_d", "w_d", "reduce_scatter", "bfloat16", 10, 9, 10))
    return planner.Problem(bucket_mode="default", bucket_cap_bytes=100, n_scheduled=11, collectives=colls,
                           nodes=nodes, timelines=(planner.Timeline(pg="0", nodes=tuple(range(11)),
                                                                    types="swcswswswsw"),),
                           links=(planner.Link(pg="0", group_size=8, latency_ms=0.02, bandwidth_gbps=50.0),)
                           ).with_fingerprint()


def _plan(problem, buckets, **over) -> dict:
    data = {"schema_version": 1, "problem_fingerprint": problem.fingerprint, "planner": "hand",
            "params": {}, "created": "2026-11-29T00:00:00+00:00",
            "buckets": [{"members": m, "start": s, "wait": w} for m, s, w in buckets]}
    data.update(over)
    return data


def _write(path, content):
    if isinstance(content, (dict, list)):
        content = json.dumps(content)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)


P = _problem()
CASES = {
    # case: (plan content, exit code, message fragment naming the item)
    "truncated": (json.dumps(_plan(P, [(["ag_b", "ag_c"], "ag_b", "ag_c")]))[:40], 2, "not valid JSON"),
    "not json": (b"\x89PNG\r\n\x1a\n\x00\x00", 2, "cannot read plan"),
    "future schema": (_plan(P, [], schema_version=9), 2, "schema_version: 9 is not supported"),
    "unknown field": (_plan(P, [], colour="red"), 2, "colour: unknown field"),
    "missing field": ({k: v for k, v in _plan(P, []).items() if k != "planner"}, 2, "planner: missing field"),
    "other problem": (_plan(P, [], problem_fingerprint="sha256:0000"), 1, "rule 1 (plan-matches-problem)"),
    "unknown collective": (_plan(P, [(["ag_a", "ghost"], "ag_a", "ag_a")]), 1, "unknown collective(s) ['ghost']"),
    "duplicated member": (_plan(P, [(["ag_a", "ag_a"], "ag_a", "ag_a")]), 2, "a collective is listed twice"),
    "in two buckets": (_plan(P, [(["ag_a", "ag_c"], "ag_a", "ag_a"), (["ag_c", "ag_e"], "ag_c", "ag_c")]), 2,
                       "collective 'ag_c' is in bucket 0 and bucket 1"),
    "anchor not member": (_plan(P, [(["ag_a", "ag_e"], "ag_b", "ag_a")]), 2, "start anchor 'ag_b' is not a member"),
    "mixed keys": (_plan(P, [(["ag_c", "ag_e"], "ag_c", "ag_e")]), 1, "rule 2 (same-key): bucket 0"),
    "over cap": (_plan(P, [(["ag_a", "ag_e"], "ag_a", "ag_e")]), 1, "rule 3 (byte-cap): bucket 0: 105 bytes"),
    "cycle": (_plan(P, [(["ag_a", "ag_b"], "ag_a", "ag_b")]), 1, "rule 6 (no-dependent-members): bucket 0"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_plan_file(tmp_path, capsys, case):
    content, code, fragment = CASES[case]
    problem_path, plan_path = tmp_path / "problem.json", tmp_path / "plan.json"
    planner.save(P, problem_path)
    _write(plan_path, content)
    assert cli(["verify", str(problem_path), str(plan_path)]) == code
    out = capsys.readouterr()
    text = out.out + out.err
    assert fragment in text
    if code == 2:
        assert str(plan_path) in text  # the error names the file


def test_enormous_file_is_refused_before_reading(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(planner.io, "MAX_FILE_BYTES", 1000)
    path = tmp_path / "problem.json"
    path.write_text(" " * 5000)
    assert cli(["verify", str(path), str(path)]) == 2
    assert "is too large for a problem file" in capsys.readouterr().err


def test_missing_file_names_it(tmp_path, capsys):
    assert cli(["verify", str(tmp_path / "nope.json"), str(tmp_path / "nope2.json")]) == 2
    assert "nope.json: cannot read problem" in capsys.readouterr().err


def test_solve_writes_its_plan_atomically_and_verifiably(tmp_path, capsys):
    problem_path = tmp_path / "problem.json"
    planner.save(P, problem_path)
    out = tmp_path / "deep" / "plan.json"
    assert cli(["solve", str(problem_path), "-o", str(out), "--time-limit", "5", "-q"]) == 0
    assert sorted(p.name for p in out.parent.iterdir()) == ["plan.json"]
    assert cli(["verify", str(problem_path), str(out)]) == 0
    text = capsys.readouterr().out
    assert "status              OPTIMAL" in text and "feasible            yes" in text


def test_unknown_workload_is_a_clear_error(capsys):
    assert cli(["extract", "llama3-8b-fsdp-7", "-o", "/tmp/never"]) == 2
    assert "unknown workload 'llama3-8b-fsdp-7'" in capsys.readouterr().err


def test_problem_files_are_data_not_code(tmp_path, capsys):
    import pickle

    path = tmp_path / "problem.json"
    path.write_bytes(pickle.dumps({"schema_version": 1}))
    assert cli(["verify", str(path), str(path)]) == 2
    assert "cannot read problem" in capsys.readouterr().err


@pytest.mark.parametrize("flags, named", [
    (["--ranks", "12"], "--ranks 12"),
    (["--ranks", "0"], "--ranks 0"),
    (["--tp", "3"], "--tp 3"),
    (["--preset", "h100-8nodes", "--tp", "64"], None),  # TP = world: no data-parallel group left
])
def test_bad_cluster_flags_are_one_line_errors(tmp_path, capsys, flags, named):
    code = cli(["extract", "llama3-8b-2d-2", "-o", str(tmp_path / "x"), "-q", *flags])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err
    assert named is None or named in err
    assert not (tmp_path / "x").exists()


def test_compare_checks_every_name_before_tracing_any(capsys):
    # the first name is valid: were it traced first, this would take seconds and then fail
    assert cli(["compare", "llama3-8b-fsdp-80", "no-such-workload-3", "-q"]) == 2
    assert "unknown workload 'no-such-workload-3'" in capsys.readouterr().err


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.startswith("bucketplan ")


def _problem_text(**edit) -> str:
    data = json.loads(planner.io.dumps(P))
    data.update(edit)
    return json.dumps(data)


PROBLEM_CASES = {
    # case: (problem file content, message fragment)
    "duplicate key": (_problem_text()[:-1] + ', "bucket_mode": "default"}', "key 'bucket_mode' appears twice"),
    "schema version true": (_problem_text(schema_version=True), "schema_version: True is not supported"),
    "schema version 1.0": (_problem_text(schema_version=1.0), "schema_version: 1.0 is not supported"),
    "empty fingerprint": (_problem_text(fingerprint=""), "fingerprint: must be the problem's content fingerprint"),
    "deep nesting": ('{"schema_version": 1, "meta": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
    "bytes as a string": (_problem_text().replace('"size_bytes": 10', '"size_bytes": "10"', 1), "size_bytes"),
    "bytes as a boolean": (_problem_text().replace('"size_bytes": 10', '"size_bytes": true', 1), "size_bytes"),
}


@pytest.mark.parametrize("case", sorted(PROBLEM_CASES))
def test_hostile_problem_file(tmp_path, capsys, case):
    content, fragment = PROBLEM_CASES[case]
    problem_path, plan_path = tmp_path / "problem.json", tmp_path / "plan.json"
    problem_path.write_text(content)
    _write(plan_path, _plan(P, []))
    assert cli(["verify", str(problem_path), str(plan_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert fragment in err and str(problem_path) in err and len(err.splitlines()) == 1 and "Traceback" not in err
