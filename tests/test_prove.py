"""``solve --positions free --prove SECONDS``: after the positioned search, CP-SAT over the candidate
space of the search's plan within the same peak (``planner.search.free.capped.solve_capped``).
The plan written is verified, within the peak, no slower than the search's, and carries two bounds
named apart: the floor over every plan with any positions (``bound``) and the candidate space's
(``candidate_bound``), the first never above the second, the second never above the plan's step;
``--deterministic`` writes the same bytes twice; bad uses are one line, exit 2, before any work."""

from __future__ import annotations

import pytest

import planner
from bucketplan.cli import main as cli
from planner.rules.verifier import recorded_policy
from tests.support import PROBLEMS
from tests.test_hostile import assert_one_line_error

# llama3-8b-fsdp-2 @ h100-8nodes on the graph's own order (torch's manual pass's), 62 collectives
GRAPH_ORDER = PROBLEMS / "llama3-8b-fsdp-2--h100-8nodes-graph-order.json.gz"


@pytest.mark.slow  # a search, then CP-SAT: about 12 s
def test_prove_writes_a_verified_plan_with_the_candidate_space_bound(tmp_path, capsys):
    out = tmp_path / "plan.json"
    code = cli(["solve", str(GRAPH_ORDER), "-o", str(out), "-q", "--positions", "free", "--time-limit", "4",
                "--prove", "10", "--workers", "2"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    problem, plan = planner.load_problem(GRAPH_ORDER), planner.load_plan(out)
    assert not planner.verify(problem, plan, **recorded_policy(plan))
    budget = planner.cost.memory.peak_bytes(problem)  # the default: the unbucketed schedule's peak
    assert planner.cost.memory.peak_bytes(problem, plan) <= budget
    step = planner.simulate(problem, plan).step_ms
    floor, candidate = plan.params["bound"], plan.params["candidate_bound"]
    assert candidate["status"] in ("OPTIMAL", "FEASIBLE") and "candidate space" in candidate["scope"]
    assert floor["bound_ms"] <= candidate["bound_ms"] + 1e-6 <= step + 2e-6
    if candidate["status"] == "OPTIMAL":  # the step, less the model's rounding slack (1 ns per event
        # and per duration, ``model.slack_ns``: a few hundred ns here; 392 once)
        assert candidate["bound_ms"] == pytest.approx(step, abs=1e-3)
    assert plan.params["interrupted"] is False and plan.params["positions"] == "free"
    assert f"CP-SAT over it      {candidate['status']}" in printed
    assert f"{step:.3f} ms (simulated)" in printed  # the step reported is the plan written's


@pytest.mark.long  # two runs, 12 s; CappedModelOptions's own determinism is in the default run (test_positioned)
def test_prove_deterministic_writes_the_same_bytes_twice(tmp_path, capsys):
    outs = [tmp_path / f"plan{k}.json" for k in (1, 2)]
    for out in outs:
        code = cli(["solve", str(GRAPH_ORDER), "-o", str(out), "-q", "--positions", "free", "--time-limit", "2",
                    "--prove", "0.3", "--deterministic", "--workers", "2"])
        assert code == 0, capsys.readouterr().out
    assert outs[0].read_bytes() == outs[1].read_bytes()
    assert "candidate_bound" in planner.load_plan(outs[0]).params


@pytest.mark.parametrize("flags, fragment", [
    (["--prove", "5"], "--prove needs --positions free"),
    (["--positions", "free", "--prove", "0"], "--prove must be a positive number"),
    (["--positions", "free", "--prove", "nan"], "--prove must be a positive number"),
    (["--positions", "free", "--prove", "5", "--keep-overlap"], "--prove does not keep torch's overlap"),
])
def test_prove_refuses_what_it_cannot_do_in_one_line(tmp_path, capsys, flags, fragment):
    out = tmp_path / "plan.json"
    code = cli(["solve", str(GRAPH_ORDER), "-o", str(out), "-q", "--time-limit", "3", *flags])
    assert_one_line_error(code, capsys.readouterr().err, fragment)
    assert not out.exists()
