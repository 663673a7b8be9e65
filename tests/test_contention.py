"""The ``contention`` scenario: compute slowed while a collective runs (``planner.simulate(...,
contention=F)``, ``planner.search.scenarios``). The simulator is checked against timelines worked out
by hand in the comments below, not against its own arithmetic; the scenario through the command
line on a small problem: ``compare --scenarios torch,contention`` re-prices every row and
``solve --robust torch,contention`` reports its plan's worst-case regret."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import planner
from planner.search.scenarios import CONTENTION_SLOWDOWN, contention_of, describe, judge, reprice
from tests.chain import chain_problem, pairs_plan
from tests.support import run_cli

N, C = planner.Node, planner.Collective


def _flat(ms: float) -> dict:
    return {"all_gather": ((0, ms), (1 << 40, ms))}


def _hand(nodes, collectives, links) -> planner.Problem:
    """A problem from (name, kind, est_ms) nodes in scheduled order; every collective is an
    all_gather priced by a flat table (the same time at any size)."""
    pos = {name: i for i, (name, _, _) in enumerate(nodes)}
    waits = {c[1]: c for c in collectives}
    built = []
    for i, (name, kind, ms) in enumerate(nodes):
        deps = (pos[waits[name][0]],) if name in waits else ()
        built.append(N(name=name, kind=kind, pos=i, est_ms=ms, deps=deps))
    cs = tuple(C(name=s, wait=w, kind="all_gather", pg=pg, key=f"all_gather/{pg}/bfloat16", dtype="bfloat16",
                 size_bytes=1 << 20, wire_bytes=2 << 20, est_ms=0.0, exposed_ms=0.0, start_pos=pos[s],
                 wait_pos=pos[w], status="hidden") for s, w, pg in collectives)
    return planner.Problem(bucket_mode="default", bucket_cap_bytes=1 << 30, n_scheduled=len(built), collectives=cs,
                           nodes=tuple(built), timelines=(),
                           links=tuple(planner.Link(pg=pg, group_size=2, table=_flat(ms)) for pg, ms in links)
                           ).with_fingerprint()


def _runs(sim) -> dict[tuple[str, str], float]:
    """Each compute node's begin and end, flat: pytest.approx compares flat mappings only."""
    return {(r.name, end): t for r in sim.compute for end, t in (("begin", r.begin_ms), ("end", r.end_ms))}


def _spans(spans: dict[str, tuple[float, float]]) -> dict[tuple[str, str], float]:
    """Hand-worked spans, {name: (begin, end)}, in ``_runs``' flat form."""
    return {(name, end): t for name, (b, e) in spans.items() for end, t in (("begin", b), ("end", e))}


def _one_gather(collective_ms: float) -> planner.Problem:
    # ag issued first; mm_1, mm_2 (10 ms each) run while it is in flight; waited before mm_3 (5 ms)
    return _hand([("ag", "start", 0.0), ("mm_1", "compute", 10.0), ("mm_2", "compute", 10.0), ("w", "wait", 0.0),
                  ("mm_3", "compute", 5.0)], [("ag", "w", "0")], [("0", collective_ms)])


def test_compute_beside_a_collective_is_slowed_and_the_rest_is_not():
    p = _one_gather(6.0)
    # Without contention: mm_1 0-10, mm_2 10-20, the gather (0-6) is done by its wait, mm_3 20-25.
    free = planner.simulate(p)
    assert free.step_ms == 25.0 and _runs(free) == _spans({"mm_1": (0, 10), "mm_2": (10, 20), "mm_3": (20, 25)})
    # At 1.5x: from 0 to 6 the gather runs and mm_1 does 6 / 1.5 = 4 ms of its work; its other
    # 6 ms run alone, 6-12. mm_2 12-22 and mm_3 22-27 run alone.
    slow = planner.simulate(p, contention=1.5)
    assert slow.step_ms == pytest.approx(27.0)
    assert _runs(slow) == pytest.approx(_spans({"mm_1": (0, 12), "mm_2": (12, 22), "mm_3": (22, 27)}))
    assert slow.exposed_ms == 0


def test_a_stall_is_not_slowed_and_hides_less_of_the_collective():
    p = _one_gather(30.0)
    # Without contention: the compute ends at 20, the wait stalls until the gather ends at 30
    # (10 ms exposed), mm_3 30-35.
    free = planner.simulate(p)
    assert free.step_ms == 35.0 and free.exposed_ms == pytest.approx(10.0)
    # At 2x: mm_1's 10 ms take 0-20; mm_2 does (30 - 20) / 2 = 5 ms by the gather's end and its
    # other 5 ms 30-35. The wait at 35 finds the gather done: nothing exposed; mm_3 35-40.
    slow = planner.simulate(p, contention=2.0)
    assert slow.step_ms == pytest.approx(40.0) and slow.exposed_ms == 0
    assert _runs(slow) == pytest.approx(_spans({"mm_1": (0, 20), "mm_2": (20, 35), "mm_3": (35, 40)}))


def _two_gathers(same_stream: bool) -> planner.Problem:
    pg_b = "0" if same_stream else "1"
    return _hand([("ag_a", "start", 0.0), ("mm_1", "compute", 2.0), ("ag_b", "start", 0.0),
                  ("mm_2", "compute", 10.0), ("w_a", "wait", 0.0), ("w_b", "wait", 0.0), ("mm_3", "compute", 5.0)],
                 [("ag_a", "w_a", "0"), ("ag_b", "w_b", pg_b)], [("0", 20.0), ("1", 10.0)] if not same_stream
                 else [("0", 20.0)])


def test_two_collectives_in_flight_slow_the_compute_once_not_twice():
    # At 2x. ag_a runs 0-20 on stream 0. mm_1 (2 ms) takes 0-4. ag_b is issued at 4 and runs
    # 4-14 on stream 1 (10 ms), inside ag_a. mm_2 (10 ms) from 4: the span 4-20 is covered by a
    # collective, 8 ms of work; the last 2 ms run alone, 20-22. Both waits at 22 find their
    # gathers done; mm_3 22-27. (Slowed twice over 4-14 it would end later.)
    slow = planner.simulate(_two_gathers(same_stream=False), contention=2.0)
    assert _runs(slow) == pytest.approx(_spans({"mm_1": (0, 4), "mm_2": (4, 22), "mm_3": (22, 27)}))
    assert slow.step_ms == pytest.approx(27.0)


def test_a_queued_collective_slows_the_compute_from_when_it_runs():
    # One stream, at 2x: ag_a 0-20; ag_b, issued at 4, waits in the FIFO until 20 and runs 20-40
    # (the stream's one table: 20 ms). mm_2 from 4: 4-24 covered, 10 ms of work take 20 ms, it
    # ends at 24. w_a at 24 (done at 20); w_b stalls 24-40, not slowed; mm_3 40-45.
    slow = planner.simulate(_two_gathers(same_stream=True), contention=2.0)
    assert _runs(slow) == pytest.approx(_spans({"mm_1": (0, 4), "mm_2": (4, 24), "mm_3": (40, 45)}))
    assert slow.step_ms == pytest.approx(45.0) and slow.exposed_ms == pytest.approx(16.0)


def test_no_contention_is_the_simulator_as_it_was():
    chain = _busy_chain()
    plan = pairs_plan(chain)
    assert planner.simulate(chain, plan, contention=1.0) == planner.simulate(chain, plan)
    from planner.cost.simulator import replay_index, step_ms

    assert step_ms(chain, plan, replay_index(chain, 1.0)) == step_ms(chain, plan)
    # more contention never makes a step shorter, nor longer than all compute slowed
    steps = [planner.simulate(chain, plan, contention=f).step_ms for f in (1.0, 1.2, 1.5, 3.0)]
    assert steps == sorted(steps) and steps[-1] > steps[0]
    assert steps[-1] <= steps[0] + 2.0 * planner.simulate(chain, plan).compute_ms + 1e-9


def _work_done(spans, factor: float, since: float, until: float) -> float:
    """Compute done from ``since`` to ``until`` beside ``spans`` (collectives in flight), by a
    sweep over their ends that counts how many run: at 1/``factor`` of the rate while any does."""
    marks = sorted({since, until, *(t for s in spans for t in s if since < t < until)})
    done = 0.0
    for a, b in zip(marks, marks[1:]):
        covered = any(s <= a and b <= e for s, e in spans)
        done += (b - a) / factor if covered else b - a
    return done


_span = st.tuples(st.integers(0, 60), st.integers(1, 30)).map(lambda t: (float(t[0]), float(t[0] + t[1])))


@settings(max_examples=200, deadline=None)
@given(events=st.lists(st.one_of(st.tuples(st.just("add"), _span),
                                 st.tuples(st.just("work"), st.tuples(st.integers(0, 15), st.integers(0, 40)))),
                       max_size=25),
       factor=st.sampled_from([1.19, 2.0, 3.5]))
def test_the_slowed_clock_ends_work_when_a_sweep_over_the_collectives_says(events, factor):
    # The replay's clock under contention (kept as the union of the spans issued so far) against
    # an independent count: the end of each stretch of work is where the sweep's work done reaches
    # it, found by bisection. Stretches begin at clocks that only move forward, as in a replay.
    from planner.cost.simulator import _Contention

    slow, spans, clock = _Contention(factor), [], 0.0
    for what, (x, y) in events:
        if what == "add":
            slow.add(x, y)
            spans.append((x, y))
            continue
        clock += x
        end = slow.finish(clock, float(y))
        assert _work_done(spans, factor, clock, end) == pytest.approx(float(y), abs=1e-9)
        lo, hi = clock, clock + factor * y  # never slower than every moment slowed
        for _ in range(100):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if _work_done(spans, factor, clock, mid) < y else (lo, mid)
        assert end == pytest.approx(hi, abs=1e-6)


@pytest.mark.parametrize("bad", [0.5, 0.999, float("nan"), float("inf"), 11.0, True, "1.2"])
def test_a_contention_that_is_no_slow_down_factor_is_refused(bad):
    with pytest.raises(ValueError, match="slow-down factor"):
        planner.simulate(chain_problem(60), contention=bad)


def test_the_scenario_keeps_the_costs_and_slows_by_its_published_factor():
    chain = _busy_chain()
    priced = reprice(chain, "contention")
    assert priced.nodes == chain.nodes and priced.links == chain.links and priced.fingerprint == chain.fingerprint
    assert contention_of("contention") == CONTENTION_SLOWDOWN == 1.189
    assert contention_of("contention=1.3") == 1.3 and contention_of("torch") == contention_of("published") == 1.0
    assert "arXiv:2507.03114" in describe("contention")
    j = judge(chain, {"pairs": pairs_plan(chain), "unbucketed": None}, ["torch", "contention", "contention=2"])
    for name, plan in (("pairs", pairs_plan(chain)), ("unbucketed", None)):
        assert j.steps[name]["torch"] == planner.simulate(chain, plan).step_ms
        assert j.steps[name]["contention"] == planner.simulate(chain, plan, contention=1.189).step_ms
        assert j.steps[name]["contention=2"] == planner.simulate(chain, plan, contention=2.0).step_ms


def _busy_chain() -> planner.Problem:
    """``chain_problem(60)`` with 20x its compute (0.2 ms a node): its gathers (0.5 ms) hide
    behind compute, so contention shows."""
    p = chain_problem(60)
    return p.model_copy(update={"nodes": tuple(n.model_copy(update={"est_ms": n.est_ms * 20}) for n in p.nodes)}
                        ).with_fingerprint()


@pytest.fixture
def chain_file(tmp_path):
    path = tmp_path / "problem.json"
    planner.save(_busy_chain(), path)
    return path


def _table(text: str, key: int = 0) -> dict[str, list[str]]:
    """A markdown table's rows by the cell in column ``key``: the other cells, or all for key > 0."""
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in text.splitlines()
            if line.startswith("| ") and "---" not in line]
    return {r[key]: (r[1:] if key == 0 else r) for r in rows[1:]}


def test_compare_reprices_every_row_under_contention(tmp_path, chain_file):
    out = tmp_path / "cmp"
    r = run_cli("compare", str(chain_file), "-o", str(out), "--time-limit", "1", "-q", "--scenarios", "torch,contention")
    assert r.returncode == 0, r.stderr
    text = (out / "scenarios.md").read_text()
    assert "`contention`: compute 1.189x slower" in text
    rows = _table(text)
    problem = planner.load_problem(chain_file)
    # every row of the main table, each plan as compare saved it (plans/index.md names the files)
    plans = {cells[1]: planner.load_plan(out / cells[2]) for cells in _table((out / "plans" / "index.md").read_text(),
                                                                            key=1).values()}
    assert set(rows) == {r["planner"] for r in json.loads((out / "compare.json").read_text())}
    assert set(rows) == set(plans) | {"unbucketed"} and len(plans) >= 2
    slower = []
    for name, cells in rows.items():
        torch_ms, contention_ms = float(cells[0]), float(cells[2])
        # simulated here: each row's plan under the published factor
        assert contention_ms == pytest.approx(planner.simulate(problem, plans.get(name), contention=1.189).step_ms,
                                              abs=1e-3)
        assert contention_ms >= torch_ms
        slower.append(contention_ms > torch_ms)
    # a plan whose gathers outlast the compute beside them loses nothing (the stall absorbs the
    # slow-down: cpsat (count) here); one whose compute outlasts them does
    assert any(slower)
    assert min(float(cells[3].rstrip("%")) for cells in rows.values()) == 0  # the best under contention: no regret


def test_solve_robust_under_torch_and_contention_reports_its_worst_regret(tmp_path, chain_file):
    out = tmp_path / "robust.json"
    r = run_cli("solve", str(chain_file), "-o", str(out), "--robust", "torch,contention", "--time-limit", "4")
    assert r.returncode == 0, r.stderr
    assert "scenario contention: compute 1.189x slower" in r.stdout
    rows = _table(r.stdout)
    best = {s: min(float(cells[k]) for cells in rows.values()) for s, k in (("torch", 0), ("contention", 2))}
    worst = max(float(rows["robust"][0]) / best["torch"], float(rows["robust"][2]) / best["contention"]) - 1
    reported = float(re.search(r"worst regret (\S+)%", r.stdout).group(1)) / 100
    assert reported == pytest.approx(worst, abs=2e-4)
    problem, plan = planner.load_problem(chain_file), planner.load_plan(out)
    assert planner.verify(problem, plan) == []
    assert float(rows["robust"][2]) == pytest.approx(planner.simulate(problem, plan, contention=1.189).step_ms,
                                                     abs=1e-3)
    assert "searched already" in r.stderr  # contention has torch's costs: one step search, not two


@pytest.mark.parametrize("scenario,says", [("contention=abc", "is not a number"),
                                           ("contention=0.5", "slow-down factor"),
                                           ("contention=", "is not a number")])
def test_a_bad_contention_factor_is_one_line_exit_2(tmp_path, chain_file, scenario, says):
    r = run_cli("solve", str(chain_file), "-o", str(tmp_path / "p.json"), "--robust", f"torch,{scenario}")
    assert r.returncode == 2 and says in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert not (tmp_path / "p.json").exists()


# --- the problem's own contention (``Problem.contention``: extract --contention F) -------------------

def test_a_problem_carries_its_contention_and_the_simulator_reads_it():
    """The hand-worked 1.5x timeline above, from the problem's own factor instead of an argument;
    an explicit factor still wins (the scenarios price at theirs)."""
    p = _one_gather(6.0).model_copy(update={"contention": 1.5}).with_fingerprint()
    slow = planner.simulate(p)
    assert slow.step_ms == pytest.approx(27.0)
    assert _runs(slow) == pytest.approx(_spans({"mm_1": (0, 12), "mm_2": (12, 22), "mm_3": (22, 27)}))
    assert planner.simulate(p, contention=1.0).step_ms == 25.0


def test_contention_is_fingerprinted_only_when_set_and_round_trips(tmp_path):
    """A problem at contention 1 keeps the fingerprint and schema version it had before the field
    existed (its plans stay bound to it); another factor is schema version 3, another
    fingerprint, and reads back as written. Out of range is refused when read, naming the field."""
    p = _one_gather(6.0)
    assert p.schema_version == 1 and "contention" not in json.loads(p.model_dump_json())
    before = json.loads(p.model_dump_json())  # as a problem written before the field existed
    assert planner.Problem.model_validate(before).content_fingerprint() == p.fingerprint
    fingerprint = p.fingerprint
    assert p.model_copy(update={"fingerprint": ""}).with_fingerprint().fingerprint == fingerprint
    slow = p.model_copy(update={"contention": 1.19}).with_fingerprint()
    assert slow.schema_version == 3 and slow.fingerprint != p.fingerprint
    planner.save(slow, tmp_path / "p.json")
    back = planner.load_problem(tmp_path / "p.json")
    assert back == slow and back.contention == 1.19
    for bad in (0.5, 11.0):
        edited = json.loads((tmp_path / "p.json").read_text())
        edited["contention"] = bad
        (tmp_path / "bad.json").write_text(json.dumps(edited))
        with pytest.raises(ValueError, match="contention"):
            planner.load_problem(tmp_path / "bad.json")


def test_every_planner_plans_at_the_problems_contention_and_its_bound_holds_there():
    """On the 60-collective chain at contention 2: the anchored and free-position plans' objectives
    are their steps simulated at 2, each bound at most that, and the free bound is the floor at 2
    (under_contention of the floor at 1). --prove is refused: its model prices overlap as free."""
    from planner.cost.bounds import free_position_floor, under_contention
    from planner.core.arguments import ArgumentError
    from planner.search.planning import Budget, PlanSpec

    chain = chain_problem(60).model_copy(update={"contention": 2.0}).with_fingerprint()
    for mode in ("anchored", "free"):
        result = planner.plan(chain, PlanSpec(mode=mode, budget=Budget(2.0, deterministic=True)))
        assert result.objective == pytest.approx(planner.simulate(chain, result.plan).step_ms, abs=1e-6), mode
        assert result.bound is not None and result.bound <= result.objective + 1e-9, mode
    floor_at_1 = free_position_floor(chain, contention=1.0)
    assert result.bound == pytest.approx(under_contention(floor_at_1, 2.0).floor_ms)
    with pytest.raises(ArgumentError, match="no contention yet"):
        planner.plan(chain, PlanSpec(mode="free", budget=Budget(1.0), prove_s=1.0))


@pytest.mark.slow  # extract traces a workload; solve in a child process
def test_extract_contention_reaches_the_problem_and_solve_refuses_to_prove_it(tmp_path):
    out = tmp_path / "f2"
    r = run_cli("extract", "llama3-8b-fsdp-2", "--contention", "1.4", "-o", out)
    assert r.returncode == 0, r.stderr[-2000:]
    problem = planner.load_problem(out / "problem.json")
    assert problem.contention == 1.4 and "contention1.4" in r.stdout
    r = run_cli("solve", out / "problem.json", "--positions", "free", "--prove", "5", "-o", tmp_path / "p.json")
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].startswith(
        "bucketplan solve: error: --prove: CP-SAT's positioned model has no contention yet"), r.stderr
    assert not (tmp_path / "p.json").exists()
    for bad in ("0.5", "11", "nan"):
        r = run_cli("extract", "llama3-8b-fsdp-2", "--contention", bad, "-o", tmp_path / "x")
        assert r.returncode == 2 and r.stderr.strip().splitlines() == [
            f"bucketplan extract: error: --contention {float(bad):g}: give a slow-down factor from 1 (overlap "
            "is free) to 10"], r.stderr
