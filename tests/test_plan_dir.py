"""``bucketplan solve-dir``: solves what was recorded, resumes, refuses bad input in one line."""

from __future__ import annotations

import pytest

import planner
from bucketplan.cli import main
from planner.jobs.plan_dir import GREEDY, PLAN, PROBLEM, append_index, problem_dir, read_index


def _record(plan_dir, get_scheduled, name="llama3-8b-ddp-2"):
    s = get_scheduled(name)
    where = problem_dir(plan_dir, s.problem.fingerprint)
    planner.save(s.greedy, where / GREEDY)
    planner.save(s.problem, where / PROBLEM)
    append_index(plan_dir, {"graph": "0/0/backward", "rank": 0, "fingerprint": s.problem.fingerprint})
    return s, where


def test_solve_dir_writes_verified_plans_and_resumes(tmp_path, get_scheduled, capsys):
    s, where = _record(tmp_path, get_scheduled)
    assert main(["solve-dir", str(tmp_path), "--time-limit", "5", "-q"]) == 0
    plan = planner.load_plan(where / PLAN)
    assert not planner.verify(s.problem, plan)
    # never slower than torch's greedy (repaired) on the simulator, which the solver does not own
    from planner.search.repair import repair

    greedy = s.greedy if not planner.verify(s.problem, s.greedy) else repair(s.problem, s.greedy).plan
    assert planner.simulate(s.problem, plan).step_ms <= planner.simulate(s.problem, greedy).step_ms + 1e-6
    out = capsys.readouterr().out
    assert "0/0/backward (1 rank)" in out and ("OPTIMAL" in out or "FEASIBLE" in out)
    summary = (tmp_path / "summary.csv").read_text()
    assert where.name in summary
    # OPTIMAL only where the gap is zero (a summary once said OPTIMAL beside a 0.18% gap), and the
    # Markdown explains every column
    import csv

    for row in csv.DictReader(summary.splitlines()):
        assert row["status"] != "OPTIMAL" or float(row["gap_pct"] or 0) == 0, row
    assert "Columns:" in (tmp_path / "summary.md").read_text()

    before = (where / PLAN).stat().st_mtime_ns
    assert main(["solve-dir", str(tmp_path), "-q"]) == 0  # resumes: nothing left to solve
    assert (where / PLAN).stat().st_mtime_ns == before
    assert where.name in (tmp_path / "summary.csv").read_text()  # the earlier row is kept


def test_solve_dir_free_positions_gives_a_small_problem_a_proof_and_says_it(tmp_path, capsys):
    """On a problem of at most 100 collectives (llama3-8b-fsdp-2: 62) solve-dir --positions free
    gives CP-SAT over the plan's candidate space its share of the time: the plan records the
    proof's status, bound and scope, and the summary row's note says them; a larger problem
    (llama3-8b-fsdp-8: 224) gives all of it to the search."""
    import csv

    from planner.search.planning import proof_seconds
    from tests.support import data_problem

    small, large = data_problem("llama3-8b-fsdp-2--h100-8nodes-graph-order"), data_problem(
        "llama3-8b-fsdp-8--h100-8nodes")
    assert (proof_seconds(small, 10.0), proof_seconds(large, 10.0)) == (5.0, None)
    assert proof_seconds(small.model_copy(update={"contention": 1.19}).with_fingerprint(), 10.0) is None
    where = problem_dir(tmp_path, small.fingerprint)
    planner.save(small, where / PROBLEM)
    append_index(tmp_path, {"graph": "0/0/backward", "rank": 0, "fingerprint": small.fingerprint})
    assert main(["solve-dir", str(tmp_path), "--time-limit", "6", "--positions", "free", "-q"]) == 0
    proof = planner.load_plan(where / PLAN).params["candidate_bound"]
    assert proof["status"] in ("OPTIMAL", "FEASIBLE") and "candidate space" in proof["scope"]
    (row,) = csv.DictReader((tmp_path / "summary.csv").read_text().splitlines())
    assert f"CP-SAT over the plan's candidate space ({proof['scope']}): {proof['status']}" in row["note"], row


def test_solve_dir_reports_an_unreadable_problem_and_goes_on(tmp_path, get_scheduled, capsys):
    _, good = _record(tmp_path, get_scheduled)
    bad = tmp_path / "feedbeef"
    bad.mkdir()
    (bad / PROBLEM).write_text("{ not json")
    assert main(["solve-dir", str(tmp_path), "--time-limit", "5", "-q"]) == 1
    assert (good / PLAN).exists() and not (bad / PLAN).exists()
    captured = capsys.readouterr()
    assert "no plan for 1 problem(s): feedbeef" in captured.err


@pytest.mark.parametrize("argv,message", [
    (["solve-dir", "{tmp}/missing"], "no such plan directory"),
    (["solve-dir", "{tmp}"], "no recorded problems"),
    (["solve-dir", "{tmp}/rec", "--time-limit", "0"], "--time-limit must be a positive number"),
    (["solve-dir", "{tmp}/rec", "--time-limit", "nan"], "--time-limit must be a positive number"),
    (["solve-dir", "{tmp}/rec", "--jobs", "0"], "--jobs must be a positive number"),
    (["solve-dir", "{tmp}/rec", "--workers", "-1"], "--workers must be a positive number"),
])
def test_solve_dir_bad_input_is_one_line(tmp_path, get_scheduled, capsys, argv, message):
    _record(tmp_path / "rec", get_scheduled)
    assert main([a.format(tmp=tmp_path) for a in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err
    assert not list((tmp_path / "rec").glob(f"*/{PLAN}"))


def test_index_lines_from_concurrent_writers_stay_whole(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    entries = [{"graph": f"{i}/0/forward", "rank": i % 2, "fingerprint": "sha256:" + "ab" * 32, "pad": "x" * 500}
               for i in range(200)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda e: append_index(tmp_path, e), entries))
    (tmp_path / "index.jsonl").open("a").write("garbage line\n")
    got = read_index(tmp_path)
    assert sorted(e["graph"] for e in got) == sorted(e["graph"] for e in entries)


@pytest.mark.parametrize("link", ["dangling", "looping"])
def test_a_problem_json_symlink_that_does_not_load_is_an_error_row(tmp_path, capsys, link):
    """A dangling or looping symlink in a problem's place is reported as a directory there is, not
    dropped unseen (solve-dir said "no recorded problems", or nothing of it)."""
    folder = tmp_path / "feedbeef"
    folder.mkdir()
    (folder / PROBLEM).symlink_to("nowhere.json" if link == "dangling" else PROBLEM)
    assert main(["solve-dir", str(tmp_path), "--time-limit", "1", "-q"]) == 1
    assert "no plan for 1 problem(s): feedbeef" in capsys.readouterr().err
    import csv

    (row,) = csv.DictReader((tmp_path / "summary.csv").read_text().splitlines())
    assert row["problem"] == "feedbeef" and row["status"] == "ERROR", row
    assert str(folder / PROBLEM) in row["note"] and "symlink" in row["note"], row
