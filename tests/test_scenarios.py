"""Cost scenarios (``planner.search.scenarios``): re-pricing checked against figures computed here by
hand and against the simulator's own sums; regret and the robust choice against brute force."""

from __future__ import annotations

import pytest

import planner
from planner.search import scenarios
from planner.search.scenarios import (PUBLISHED_BUSBW, PUBLISHED_COMPUTE_SCALE, Judged, ScenarioError, judge, layout,
                               reprice, robust_plan)
from tests.chain import chain_problem
from tests.support import data_problem, run_cli


def _with_layout(problem, ranks, per_node):
    meta = {**(problem.meta or {}), "layout": {l.pg: {"ranks": ranks, "ranks_per_node": per_node}
                                               for l in problem.links}}
    links = tuple(l.model_copy(update={"group_size": ranks}) for l in problem.links)
    return problem.model_copy(update={"meta": meta, "links": links}).with_fingerprint()


@pytest.fixture
def chain():
    return chain_problem(60)


def test_published_comm_prices_cross_node_groups_at_the_published_bus_bandwidth(chain):
    p = _with_layout(chain, 64, 8)
    (link,) = reprice(p, "published-comm").links
    (base,) = p.links
    gib = 1 << 30
    for kind in ("all_gather", "reduce_scatter", "all_reduce"):
        factor = (2 if kind == "all_reduce" else 1) * 63 / 64
        by_hand = base.time_ms(kind, 0) + factor * gib / (PUBLISHED_BUSBW["whole_nodes"][kind] * 1e9) * 1e3
        assert link.time_ms(kind, gib) == pytest.approx(by_hand, rel=1e-9)
    one_per_node = reprice(_with_layout(chain, 8, 1), "published-comm").links[0]
    assert one_per_node.time_ms("all_gather", gib) == pytest.approx(
        base.time_ms("all_gather", 0) + 7 / 8 * gib / 48e9 * 1e3, rel=1e-9)
    inside = _with_layout(chain, 8, 8)
    assert reprice(inside, "published-comm").links == inside.links  # one node: the model stays


def test_published_mfu_scales_the_compute_and_nothing_else(chain):
    slow = reprice(chain, "published-mfu")
    assert slow.links == chain.links
    for a, b in zip(chain.nodes, slow.nodes):
        scale = PUBLISHED_COMPUTE_SCALE if a.kind in ("compute", "other") else 1.0
        assert b.est_ms == pytest.approx(a.est_ms * scale) and (a.name, a.deps) == (b.name, b.deps)
        assert b.unpinned_ms == pytest.approx(a.unpinned_ms * scale)
    assert planner.simulate(slow).step_ms > planner.simulate(chain).step_ms


def test_the_layout_comes_from_meta_or_torchs_description(chain):
    link = chain.links[0].model_copy(update={"hardware": "dp: torch hopper NCCL model, 64 ranks on 8 node(s), 8 per node"})
    p = chain.model_copy(update={"links": (link,)})
    assert layout(p, link) == (64, 8)
    with pytest.raises(ScenarioError, match="layout"):
        layout(chain.model_copy(update={"links": (link.model_copy(update={"hardware": "IB"}),)}), link.model_copy(
            update={"hardware": "IB"}))


def test_regret_and_the_robust_choice_match_brute_force():
    steps = {"a": {"x": 10.0, "y": 30.0}, "b": {"x": 12.0, "y": 20.0}, "c": {"x": 15.0, "y": 19.0}}
    best = {"x": 10.0, "y": 19.0}
    j = Judged(["x", "y"], steps)
    worst = {c: max(steps[c][s] / best[s] - 1 for s in best) for c in steps}
    assert {c: j.worst_regret(c) for c in steps} == pytest.approx(worst)
    assert j.robust_choice() == min(worst, key=worst.get) == "b"


@pytest.fixture(scope="module")
def fsdp2(get_scheduled):
    return get_scheduled("llama3-8b-fsdp-2", preset="h100-8nodes")


def test_robust_plan_is_verified_and_no_worse_than_any_candidate(fsdp2):
    r = robust_plan(fsdp2.problem, ["torch", "published"], planner.SolveOptions(time_limit_s=8), hint=fsdp2.greedy)
    assert planner.verify(fsdp2.problem, r.plan) == []
    j = r.judged
    assert set(j.steps) >= {"unbucketed", "step under torch", "step under published", "robust"}
    for s in j.scenarios:
        assert min(j.regret(c, s) for c in j.steps) == 0  # regret is against the best judged
        assert j.steps["robust"][s] == pytest.approx(
            planner.simulate(reprice(fsdp2.problem, s), r.plan.model_copy(
                update={"problem_fingerprint": reprice(fsdp2.problem, s).fingerprint})).step_ms)
    assert j.worst_regret("robust") <= min(j.worst_regret(c) for c in j.steps if c != "robust") + 1e-12
    # the extracted problem records its layout, so re-pricing needs no description to parse
    assert fsdp2.problem.meta["layout"] == {"0": {"ranks": 64, "ranks_per_node": 8}}


def test_judge_reprices_each_plan_on_its_problem(fsdp2):
    j = judge(fsdp2.problem, {"greedy": fsdp2.greedy, "unbucketed": None}, ["torch"])
    assert j.steps["unbucketed"]["torch"] == planner.simulate(fsdp2.problem).step_ms


@pytest.mark.parametrize("flags", [["--robust", "torch,nope"], ["--robust", "torch,torch"],
                                   ["--robust", "torch", "--positions", "free"], ["--robust", "torch,BAD"]])
def test_solve_robust_refuses_bad_flags_in_one_line(tmp_path, flags, chain):
    path = tmp_path / "problem.json"
    planner.save(chain, path)
    (tmp_path / "bad.csv").write_text("kind,group\n")
    flags = [f.replace("BAD", str(tmp_path / "bad.csv")) for f in flags]
    r = run_cli("solve", path, "-o", tmp_path / "p.json", *flags)
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_solve_robust_on_an_alpha_beta_problem_says_it_has_no_layout(tmp_path, chain):
    path = tmp_path / "problem.json"
    planner.save(chain, path)
    r = run_cli("solve", path, "-o", tmp_path / "p.json", "--robust", "torch,published-comm", "--time-limit", "2")
    assert r.returncode == 2 and "layout" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "p.json").exists()


def test_compare_writes_each_rows_step_and_regret_per_scenario(tmp_path, chain, capsys):
    from bucketplan import cli

    path = tmp_path / "problem.json"
    planner.save(chain, path)
    out = tmp_path / "cmp"
    assert cli.main(["compare", str(path), "-o", str(out), "--time-limit", "1", "-q",
                                "--scenarios", "torch,published-mfu"]) == 0
    text = (out / "scenarios.md").read_text()
    # a problem priced by α-β links has no layout to re-price its collectives by: said, the run kept
    assert cli.main(["compare", str(path), "-o", str(tmp_path / "ab"), "--time-limit", "1", "-q",
                                "--scenarios", "torch,published-comm"]) == 0
    assert "not re-priced" in (tmp_path / "ab" / "scenarios.md").read_text()
    assert text in capsys.readouterr().out
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert rows
    for cells in rows:
        assert float(cells[1]) > 0 and float(cells[2].rstrip("%")) >= 0
    assert min(float(cells[2].rstrip("%")) for cells in rows) == 0  # the best row has no regret
    # each row's step under `torch` is the main table's step for that planner
    import json

    main = {r["planner"]: r["step_ms"] for r in json.loads((out / "compare.json").read_text())}
    matched = [cells for cells in rows if cells[0].lstrip("| ") in main]
    assert len(matched) == len(rows)
    for cells in matched:
        assert float(cells[1]) == pytest.approx(main[cells[0].lstrip("| ")], abs=1e-3)


def test_robust_refuses_a_hint_of_another_problem(chain):
    from planner.core.arguments import PlanMismatchError
    from tests.chain import empty_plan

    other = chain_problem(70)
    with pytest.raises(PlanMismatchError):
        robust_plan(chain, ["torch"], planner.SolveOptions(time_limit_s=2), hint=empty_plan(other))


def test_a_measured_scenario_that_matches_no_group_is_refused(tmp_path, chain):
    path = tmp_path / "m.csv"
    path.write_text("kind,group,ranks_per_node,bytes,ms\nall_gather,512,8,1024,0.1\n")
    with pytest.raises(ScenarioError, match="no measurement matches"):
        reprice(_with_layout(chain, 64, 8), str(path))


@pytest.mark.slow  # two short step searches
def test_a_ctrl_c_while_the_candidates_are_judged_keeps_the_most_robust_one(monkeypatch):
    """A Ctrl-C outside the searches (here: as the candidates are first judged) returns the most
    robust candidate found, marked interrupted, not the unbucketed plan or nothing."""
    problem = data_problem("llama3-8b-fsdp-2--h100-8nodes-graph-order")
    real, calls = scenarios.judge, []

    def interrupted_once(*args, **kw):
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return real(*args, **kw)

    monkeypatch.setattr(scenarios, "judge", interrupted_once)
    r = robust_plan(problem, ["torch", "published"], planner.SolveOptions(time_limit_s=4))
    assert r.interrupted and r.plan.params["interrupted"] is True
    assert not planner.verify(problem, r.plan)
    j = r.judged
    others = {c: j.worst_regret(c) for c in j.steps if c != "robust"}
    assert j.worst_regret("robust") == pytest.approx(min(others.values()))
    assert min(others, key=others.get) != "unbucketed"  # the premise: a searched plan is more robust
