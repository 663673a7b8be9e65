"""`bucketplan verify` checks a plan under the policy it records (protect_partly, memory budget); flags override it."""

from __future__ import annotations

import json

import pytest

import planner
from bucketplan.cli import main as cli
from tests.test_hostile import _one_line_error


def _problem() -> planner.Problem:
    """rs_a, partly hidden by mm_1, then rs_b, which needs mm_2: merging them issues rs_a after its
    hider (rule 7 only under protect_partly) and later than its own start, so its input stays alive
    until then (extra bytes alive: rule 10)."""
    N, C = planner.Node, planner.Collective
    nodes = (N(name="rs_a", kind="start", pos=0, est_ms=0.0), N(name="mm_1", kind="compute", pos=1, est_ms=1.0),
             N(name="w_rs_a", kind="wait", pos=2, est_ms=0.0, deps=(0,)),
             N(name="mm_2", kind="compute", pos=3, est_ms=1.0, deps=(1,)),
             N(name="rs_b", kind="start", pos=4, est_ms=0.0, deps=(3,)),
             N(name="w_b", kind="wait", pos=5, est_ms=0.0, deps=(4,)))
    common = dict(kind="reduce_scatter", pg="0", key="reduce_scatter/0/bfloat16/sum", dtype="bfloat16", size_bytes=1 << 20,
                  wire_bytes=1 << 23, est_ms=2.0)
    colls = (C(name="rs_a", wait="w_rs_a", exposed_ms=1.0, start_pos=0, wait_pos=2, hiding=("mm_1",), status="partly",
               **common),
             C(name="rs_b", wait="w_b", exposed_ms=2.0, start_pos=4, wait_pos=5, status="exposed", **common))
    return planner.Problem(bucket_mode="default", bucket_cap_bytes=1 << 30, n_scheduled=6, collectives=colls,
                           nodes=nodes, timelines=(),
                           links=(planner.Link(pg="0", group_size=8, latency_ms=0.02, bandwidth_gbps=50.0),)
                           ).with_fingerprint()


P = _problem()
MERGED = (planner.Bucket(members=("rs_a", "rs_b"), start="rs_b", wait="rs_b"),)


def test_the_policies_disagree_on_the_merged_plan():
    plan = planner.Plan(problem_fingerprint=P.fingerprint, planner="hand", created="t", buckets=MERGED)
    assert planner.verify(P, plan) == []
    assert {v.rule for v in planner.verify(P, plan, protect_partly=True)} == {7}
    assert {v.rule for v in planner.verify(P, plan, memory_budget_bytes=0)} == {10}


def _files(tmp_path, params=None, buckets=MERGED):
    problem_path, plan_path = tmp_path / "problem.json", tmp_path / "plan.json"
    planner.save(P, problem_path)
    plan = planner.Plan(problem_fingerprint=P.fingerprint, planner="hand", created="t", buckets=buckets,
                        params=params or {})
    planner.save(plan, plan_path)
    return str(problem_path), str(plan_path)


def _verify(capsys, *argv) -> tuple[int, str]:
    code = cli(["verify", *argv])
    return code, capsys.readouterr().out


def _policy_line(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("policy"))


def test_solved_plans_record_their_policy_and_verify_applies_it(tmp_path, capsys):
    problem_path = tmp_path / "problem.json"
    planner.save(P, problem_path)
    strict, loose = tmp_path / "strict.json", tmp_path / "loose.json"
    # count: MERGED below is the fewest-collectives optimum under torch's policy
    assert cli(["solve", str(problem_path), "-o", str(strict), "--objective", "count", "--protect-partly",
                "--time-limit", "5", "-q"]) == 0
    assert cli(["solve", str(problem_path), "-o", str(loose), "--objective", "count", "--time-limit", "5", "-q"]) == 0
    capsys.readouterr()
    strict_plan, loose_plan = planner.load_plan(strict), planner.load_plan(loose)
    assert strict_plan.params["protect_partly"] is True and strict_plan.params["memory_budget_bytes"] is None
    assert loose_plan.params["protect_partly"] is False
    assert strict_plan.buckets == () and loose_plan.buckets == MERGED  # the policies give different optima

    code, out = _verify(capsys, str(problem_path), str(strict))
    assert code == 0 and _policy_line(out).endswith("protect_partly=True, memory budget none (recorded in the plan)")
    assert "(protected: protect_partly)" in out
    # the plan solved under torch's policy breaks the stricter one: only the flag applies it
    code, out = _verify(capsys, str(problem_path), str(loose))
    assert code == 0 and "protect_partly=False, memory budget none (recorded in the plan)" in out
    code, out = _verify(capsys, str(problem_path), str(loose), "--protect-partly")
    assert code == 1 and "rule 7 (hiding-kept)" in out
    assert _policy_line(out).endswith("protect_partly=True (from flags), memory budget none (recorded in the plan)")


def test_the_recorded_policy_decides_the_verdict_and_a_flag_overrides_it(tmp_path, capsys):
    # the merged plan as it would be recorded by a search under the stricter policy (a modelling
    # bug there, or a hand edit): judged by the default rules it would pass
    files = _files(tmp_path, {"protect_partly": True, "memory_budget_bytes": None})
    code, out = _verify(capsys, *files)
    assert code == 1 and "rule 7 (hiding-kept): bucket 0" in out
    assert _policy_line(out).endswith("protect_partly=True, memory budget none (recorded in the plan)")
    code, out = _verify(capsys, *files, "--no-protect-partly")
    assert code == 0 and "feasible            yes" in out and "protect_partly=False (from flags)" in out


def test_a_recorded_memory_budget_is_applied_and_a_flag_overrides_it(tmp_path, capsys):
    files = _files(tmp_path, {"memory_budget_bytes": 0})
    code, out = _verify(capsys, *files)
    assert code == 1 and "rule 10 (memory-budget)" in out
    assert _policy_line(out).endswith("protect_partly=False (default), memory budget 0 GB (0 bytes) "
                                      "(recorded in the plan)")
    code, out = _verify(capsys, *files, "--memory-budget-gb", "1")
    assert code == 0 and "memory budget 1 GB (1000000000 bytes) (from flags)" in out
    code, out = _verify(capsys, *files, "--no-memory-budget")
    assert code == 0 and "memory budget none (from flags)" in out


def test_a_budget_recorded_from_a_gib_flag_reads_back_as_its_bytes(tmp_path, capsys):
    """Plans record budgets in bytes: one solved when --memory-budget-gb 1 meant 2^30 bytes keeps
    that budget, shown in GB = 10^9 bytes."""
    code, out = _verify(capsys, *_files(tmp_path, {"memory_budget_bytes": 2**30}))
    assert code == 0 and _policy_line(out).endswith("memory budget 1.07374 GB (1073741824 bytes) "
                                                    "(recorded in the plan)")


def test_a_plan_without_a_policy_is_checked_under_the_default(tmp_path, capsys):
    code, out = _verify(capsys, *_files(tmp_path))
    assert code == 0 and _policy_line(out).endswith("protect_partly=False, memory budget none (default)")
    code, out = _verify(capsys, *_files(tmp_path), "--memory-budget-gb", "0")
    assert code == 1 and "memory budget 0 GB (0 bytes) (from flags)" in out



@pytest.mark.parametrize("value, fragment", [
    ("nan", "--memory-budget-gb must be a non-negative number, not nan"),
    ("inf", "--memory-budget-gb must be a non-negative number, not inf"),
    ("-1", "--memory-budget-gb must be a non-negative number, not -1.0"),
    ("1e12", "--memory-budget-gb 1000000000000.0 is beyond any machine"),
])
def test_bad_budget_flags_are_one_line_errors(tmp_path, capsys, value, fragment):
    # refused before the files are read: these do not even exist
    code = cli(["verify", str(tmp_path / "no-problem.json"), str(tmp_path / "no-plan.json"),
                f"--memory-budget-gb={value}"])
    _one_line_error(capsys, code, fragment)


@pytest.mark.parametrize("params, fragment", [
    ({"protect_partly": "yes"}, "params.protect_partly: 'yes' is not a policy (true or false)"),
    ({"protect_partly": 1}, "params.protect_partly: 1 is not a policy"),
    ({"memory_budget_bytes": -1}, "params.memory_budget_bytes: -1 is not a budget"),
    ({"memory_budget_bytes": 1.5}, "params.memory_budget_bytes: 1.5 is not a budget"),
    ({"memory_budget_bytes": True}, "params.memory_budget_bytes: True is not a budget"),
    ({"memory_budget_bytes": 2**62}, "is not a budget"),
])
def test_a_recorded_policy_that_is_no_policy_is_a_one_line_error(tmp_path, capsys, params, fragment):
    problem_path, plan_path = _files(tmp_path)
    data = json.loads((tmp_path / "plan.json").read_text())
    data["params"] = params
    (tmp_path / "plan.json").write_text(json.dumps(data))
    err = _one_line_error(capsys, cli(["verify", problem_path, plan_path]), fragment)
    assert err.startswith(f"bucketplan verify: error: {plan_path}: ")
    # a flag that overrides the broken key does not read it
    flag = "--protect-partly" if "protect_partly" in params else "--no-memory-budget"
    assert cli(["verify", problem_path, plan_path, flag]) in (0, 1)


def test_a_repaired_plan_records_the_policy_it_was_repaired_under():
    # the quick re-anchoring path keeps the given plan's params: they said protect_partly=False
    given = planner.Plan(problem_fingerprint=P.fingerprint, planner="cpsat", created="t", buckets=(),
                         params={"protect_partly": False, "memory_budget_bytes": None})
    result = planner.repair(P, given,
                            planner.SolveOptions(policy=planner.Policy(protect_partly=True, memory_budget_bytes=0)))
    assert result.stats.get("repair") == "re-anchored"
    assert result.plan.params["protect_partly"] is True and result.plan.params["memory_budget_bytes"] == 0


def test_solve_with_free_positions_writes_a_verified_positioned_plan_within_its_budget(tmp_path, capsys):
    """`bucketplan solve --positions free`: a plan verified under the policy it records (rules 4, 7
    and 8 off, rule 11 at the budget), its peak and the floor over every plan within the budget
    reported, with its scope; the flags
    that make no sense without it are one-line errors."""
    problem_path, _ = _files(tmp_path)
    out = tmp_path / "pos.json"
    assert cli(["solve", problem_path, "-o", str(out), "--positions", "free", "--time-limit", "2", "-q"]) == 0
    printed = capsys.readouterr().out
    plan = planner.load_plan(out)
    recorded = planner.rules.verifier.recorded_policy(plan)
    assert recorded["keep_overlap"] is False and recorded["peak_memory_bytes"] is not None
    assert planner.verify(P, plan, **recorded) == []
    assert "every plan with any positions within" in printed and "peak memory" in printed and "budget" in printed
    assert _verify(capsys, problem_path, str(out))[0] == 0
    code = cli(["solve", problem_path, "-o", str(out), "--positions", "free", "--objective", "count"])
    assert code == 2 and "--positions free needs --objective step" in capsys.readouterr().err
    code = cli(["solve", problem_path, "-o", str(out), "--peak-memory-gb", "1"])
    assert code == 2 and "--peak-memory-gb needs --positions free" in capsys.readouterr().err
