"""Hostile inputs: every broken problem or plan file gets an exact, named error and a non-zero exit."""

from __future__ import annotations

import json
import re

import pytest

import planner
from bucketplan.cli import main as cli
from tests.bounded import bounded


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
    monkeypatch.setattr(planner.core.io, "MAX_FILE_BYTES", 1000)
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
    assert cli(["solve", str(problem_path), "-o", str(out), "--objective", "count", "--time-limit", "5", "-q"]) == 0
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
    data = json.loads(planner.core.io.dumps(P))
    data.update(edit)
    return json.dumps(data)


def _edited(fn) -> str:
    """The problem file with ``fn`` applied to its data; the fingerprint is left stale on purpose:
    field checks and the problem's own checks come before the fingerprint's."""
    data = json.loads(planner.core.io.dumps(P))
    fn(data)
    return json.dumps(data)  # allow_nan: Infinity and NaN are written as Python's json writes them


def _set(path: str, value):
    def fn(data):
        *where, last = path.split(".")
        obj = data
        for part in where:
            obj = obj[int(part)] if part.isdigit() else obj[part]
        obj[last] = value
    return fn


def _hidden_after_wait(data):  # ag_a (start 0, wait 1) "hidden" by mm at position 2
    data["collectives"][0].update(hiding=["mm"], status="hidden", exposed_ms=0.0)


PROBLEM_CASES = {
    # case: (problem file content, message fragment)
    "duplicate key": (_problem_text()[:-1] + ', "bucket_mode": "default"}', "key 'bucket_mode' appears twice"),
    "schema version true": (_problem_text(schema_version=True), "schema_version: True is not supported"),
    "schema version 1.0": (_problem_text(schema_version=1.0), "schema_version: 1.0 is not supported"),
    "empty fingerprint": (_problem_text(fingerprint=""), "fingerprint: must be the problem's content fingerprint"),
    "deep nesting": ('{"schema_version": 1, "meta": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
    "bytes as a string": (_problem_text().replace('"size_bytes": 10', '"size_bytes": "10"', 1), "size_bytes"),
    "bytes as a boolean": (_problem_text().replace('"size_bytes": 10', '"size_bytes": true', 1), "size_bytes"),
    # non-finite or absurd numbers, refused by the fields' bounds (planner.core.problem.MAX_BYTES, ...)
    "est_ms Infinity": (_edited(_set("collectives.0.est_ms", float("inf"))),
                        "collectives[0].est_ms: Input should be a finite number"),
    "est_ms NaN": (_edited(_set("collectives.0.est_ms", float("nan"))),
                   "collectives[0].est_ms: Input should be a finite number"),
    "exposed_ms 1e308": (_edited(_set("collectives.0.exposed_ms", 1e308)),
                         "collectives[0].exposed_ms: Input should be less than 1000000000"),
    "node est_ms NaN": (_edited(_set("nodes.2.est_ms", float("nan"))), "nodes[2].est_ms: Input should be a finite"),
    "latency_ms Infinity": (_edited(_set("links.0.latency_ms", float("inf"))),
                            "links[0].latency_ms: Input should be a finite number"),
    "latency_ms 1e308": (_edited(_set("links.0.latency_ms", 1e308)), "links[0].latency_ms: Input should be less than"),
    "size_bytes 10**30": (_edited(_set("collectives.0.size_bytes", 10**30)),
                          "collectives[0].size_bytes: Input should be less than 4611686018427387904"),
    "wire_bytes 1e30": (_edited(_set("collectives.0.wire_bytes", 1e30)), "collectives[0].wire_bytes"),
    "bandwidth 1e-300": (_edited(_set("links.0.bandwidth_gbps", 1e-300)),
                         "links[0].bandwidth_gbps: Input should be greater than 0.000000001"),
    "bandwidth 0": (_edited(_set("links.0.bandwidth_gbps", 0.0)), "links[0].bandwidth_gbps: Input should be greater"),
    # was an IndexError in planner/search/cpsat.py once solved
    "hidden after its wait": (_edited(_hidden_after_wait),
                              "collectives[0] (ag_a): hiding node 'mm' at position 2 is not between its start (0) "
                              "and its wait (1)"),
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


def assert_one_line_error(code: int, err: str, *fragments: str) -> str:
    """Exit 2 and one line on stderr, no traceback, naming each fragment; the line."""
    err = err.strip()
    assert code == 2, (code, err[-2000:])
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err[-2000:]
    for fragment in fragments:
        assert fragment in err, err
    return err


def _one_line_error(capsys, code: int, fragment: str) -> str:
    return assert_one_line_error(code, capsys.readouterr().err, fragment)


@pytest.mark.parametrize("case", sorted(PROBLEM_CASES))
def test_solve_refuses_a_hostile_problem_file(tmp_path, capsys, case):
    content, fragment = PROBLEM_CASES[case]
    problem_path, out = tmp_path / "problem.json", tmp_path / "plan.json"
    problem_path.write_text(content)
    code = cli(["solve", str(problem_path), "-o", str(out), "-q", "--time-limit", "5"])
    err = _one_line_error(capsys, code, fragment)
    assert str(problem_path) in err and not out.exists()


@pytest.fixture
def no_search(monkeypatch):
    """solve() must not be reached: a bad flag or output path is refused before any search."""
    import planner.search.solver

    def fail(*a, **k):
        raise AssertionError("solve() ran")
    monkeypatch.setattr(planner.search.solver, "solve", fail)


@pytest.mark.parametrize("flags, fragment", [
    (["--time-limit=0"], "--time-limit must be a positive number, not 0.0"),
    (["--time-limit=-5"], "--time-limit must be a positive number, not -5.0"),
    (["--time-limit=nan"], "--time-limit must be a positive number, not nan"),
    (["--time-limit=inf"], "--time-limit must be a positive number, not inf"),
    (["--workers=0"], "--workers must be a positive number, not 0"),  # was silently 2
    (["--workers=-1"], "--workers must be a positive number, not -1"),  # was MODEL_INVALID
    (["--seed=99999999999"], "--seed must be an integer from -2147483648 to 2147483647"),
    (["--window=abc"], "--window must be 'auto', a positive integer, or none for the full model, not 'abc'"),
    (["--window=0"], "--window must be 'auto', a positive integer, or none for the full model, not 0"),
    (["--window=-3"], "--window must be 'auto', a positive integer, or none for the full model, not -3"),
    (["--memory-budget-gb=nan"], "--memory-budget-gb must be a non-negative number, not nan"),
    (["--memory-budget-gb=inf"], "--memory-budget-gb must be a non-negative number, not inf"),
    (["--memory-budget-gb=-1"], "--memory-budget-gb must be a non-negative number, not -1.0"),
])
def test_bad_solve_flags_are_one_line_errors(tmp_path, capsys, no_search, flags, fragment):
    problem_path, out = tmp_path / "problem.json", tmp_path / "plan.json"
    planner.save(P, problem_path)
    _one_line_error(capsys, cli(["solve", str(problem_path), "-o", str(out), "-q", *flags]), fragment)
    assert not out.exists()


@pytest.mark.parametrize("output, fragment", [
    ("adir", "adir: is a directory"),
    ("a-file/plan.json", "cannot create a folder there"),
    ("/sys/x/plan.json", "-o /sys/x/plan.json: cannot write in /sys"),  # sysfs takes no files, even from root
])
def test_unwritable_output_is_refused_before_solving(tmp_path, capsys, no_search, output, fragment):
    import os

    if output.startswith("/sys") and not os.path.isdir("/sys"):
        pytest.skip("no /sys here")
    problem_path = tmp_path / "problem.json"
    planner.save(P, problem_path)
    (tmp_path / "adir").mkdir()
    (tmp_path / "a-file").write_text("")
    before = sorted(p.name for p in tmp_path.rglob("*"))
    out = output if output.startswith("/") else str(tmp_path / output)
    _one_line_error(capsys, cli(["solve", str(problem_path), "-o", out, "-q"]), fragment)
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # nothing written, not even the probe


Q = P.model_copy(update={"bucket_cap_bytes": 200}).with_fingerprint()  # same collectives, another problem


@pytest.mark.parametrize("hint, fragment", [
    (_plan(Q, [(["ag_a", "ag_e"], "ag_a", "ag_e")]), "plan is for another problem"),
    (_plan(P, [(["ag_a", "ghost"], "ag_a", "ag_a")]),
     "plan names collective(s) ['ghost'] that the problem does not have"),
])
def test_a_hint_for_another_problem_is_a_one_line_error(tmp_path, capsys, hint, fragment):
    problem_path, hint_path, out = tmp_path / "problem.json", tmp_path / "hint.json", tmp_path / "plan.json"
    planner.save(P, problem_path)
    _write(hint_path, hint)
    code = cli(["solve", str(problem_path), "-o", str(out), "-q", "--time-limit", "5", "--hint", str(hint_path)])
    err = _one_line_error(capsys, code, fragment)
    assert err.startswith(f"bucketplan solve: error: {hint_path}: ") and not out.exists()


def test_solve_and_repair_refuse_a_plan_of_another_problem():
    ghost = planner.Plan.model_validate(_plan(P, [(["ag_a", "ghost"], "ag_a", "ag_a")]))
    other = planner.Plan.model_validate(_plan(Q, []))
    for plan, fragment in ((ghost, "['ghost']"), (other, "another problem")):
        with pytest.raises(planner.PlanMismatchError, match=re.escape(fragment)):
            planner.solve(P, planner.SolveOptions(time_limit_s=5), hint=plan)
        with pytest.raises(planner.PlanMismatchError, match=re.escape(fragment)):
            planner.repair(P, plan)


def _fifo(tmp_path):
    import os

    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs here")
    path = tmp_path / "fifo.json"
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("which", ["problem", "plan"])
@pytest.mark.parametrize("special", ["/dev/zero", "fifo"])
def test_non_regular_files_are_refused_up_front(tmp_path, capsys, which, special):
    import os

    if special == "/dev/zero" and not os.path.exists(special):
        pytest.skip("no /dev/zero here")
    path = str(_fifo(tmp_path)) if special == "fifo" else special
    problem_path, plan_path = tmp_path / "problem.json", tmp_path / "plan.json"
    planner.save(P, problem_path)
    _write(plan_path, _plan(P, []))
    files = [path, str(plan_path)] if which == "problem" else [str(problem_path), path]

    with bounded(20, f"opening {path}"):  # a FIFO waits for a writer: fail the test instead of hanging it
        code = cli(["verify", *files])
    kind = "a FIFO" if special == "fifo" else "a character device"
    _one_line_error(capsys, code, f"{path}: not a regular file ({kind}); cannot be the {which} file")


@pytest.mark.parametrize("command", [["workloads"], ["verify", "problem.json", "plan.json"]])
def test_a_closed_pipe_exits_quietly(tmp_path, command):
    # `bucketplan ... | head -1` with head gone before we write: the read end is closed before
    # the command has even started, so the first write meets a broken pipe every time
    from tests.support import start_cli

    planner.save(P, tmp_path / "problem.json")
    _write(tmp_path / "plan.json", _plan(P, []))
    proc = start_cli(*command, cwd=tmp_path)
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=300) == 141 and err == ""  # as a tool killed by SIGPIPE; no traceback
