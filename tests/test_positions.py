"""Buckets with named positions (``issue_before`` / ``wait_before``): the plan format, the
simulator against an independent replay, and the verifier's data-dependence rules."""

from __future__ import annotations

import json

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings

import planner
from planner.core.problem import with_buckets
from tests.strategies import problems, two_gathers

LINK = planner.Link(pg="0", group_size=8, latency_ms=0.5, bandwidth_gbps=10.0)


def reference_step(problem: planner.Problem, plan: planner.Plan) -> float:
    """The step of ``plan`` written out from the definition, without the simulator's position
    arithmetic: the final order is built as an explicit list (before each pinned node, the waits
    that name it, then the starts that name it in plan order, then the node itself, where an
    anchored merged start or wait takes its anchor's node), then replayed node by node."""
    colls = {c.name: c for c in problem.collectives}
    buckets = [(b.members, b.start, b.wait, b.issue_before, b.wait_before) for b in plan.buckets]
    placed = {m for b in plan.buckets for m in b.members}
    buckets += [((c.name,), c.name, c.name, None, None) for c in problem.collectives if c.name not in placed]
    waits_before, starts_before, start_at, wait_at = {}, {}, {}, {}
    for k, (members, s, w, ib, wb) in enumerate(buckets):
        if ib is None:
            start_at[s] = k
        else:
            starts_before.setdefault(ib, []).append(k)
        if wb is None:
            wait_at[colls[w].wait] = k
        else:
            waits_before.setdefault(wb, []).append(k)
    order = []
    for n in problem.nodes:
        order.append(("compute", n.unpinned_ms))  # scheduled before n: before anything named at n
        order += [("wait", k) for k in waits_before.get(n.name, [])]
        order += [("start", k) for k in starts_before.get(n.name, [])]
        if n.kind == "start":
            if n.name in start_at:
                order.append(("start", start_at[n.name]))
        elif n.kind == "wait":
            if n.name in wait_at:
                order.append(("wait", wait_at[n.name]))
        else:
            order.append(("compute", n.est_ms))
    cost = problem.bucketing
    clock, free, ends, step_end = 0.0, {}, {}, 0.0
    for what, x in order:
        if what == "compute":
            clock += x
            continue
        members = buckets[x][0]
        first = colls[members[0]]
        link = problem.link(first.pg)
        wires = [colls[m].wire_bytes for m in members]
        copy_in, copy_out = planner.core.problem.copy_bytes(first.kind, wires, link.group_size, problem.bucket_mode)
        if what == "start":
            if cost is not None:
                clock += cost.launch_ms + cost.copy_ms(copy_in)
            begin = max(clock, free.get(first.pg, 0.0))
            free[first.pg] = ends[x] = begin + link.time_ms(first.kind, sum(wires))
            step_end = max(step_end, ends[x])
        else:
            if x not in ends:
                raise ValueError("waited before issued")
            clock = max(clock, ends[x])
            if cost is not None:
                clock += cost.copy_ms(copy_out)
    return max(clock, step_end)


@st.composite
def positioned_plans(draw, problem: planner.Problem) -> planner.Plan:
    """Random same-key buckets, each with random anchors and, at random, named positions."""
    by_key: dict[tuple, list[str]] = {}
    for c in problem.collectives:
        by_key.setdefault((c.kind, c.pg, c.key), []).append(c.name)
    node_names = [n.name for n in problem.nodes]
    buckets = []
    for names in by_key.values():
        order = draw(st.permutations(names))
        k = 0
        while k < len(order):
            size = draw(st.integers(1, len(order) - k))
            members = tuple(order[k:k + size])
            k += size
            if size == 1 and draw(st.booleans()):
                continue
            pos = st.one_of(st.none(), st.sampled_from(node_names))
            buckets.append(planner.Bucket(members=members, start=draw(st.sampled_from(members)),
                                          wait=draw(st.sampled_from(members)),
                                          issue_before=draw(pos), wait_before=draw(pos)))
    return planner.Plan(problem_fingerprint=problem.fingerprint, planner="random", created="t",
                        buckets=tuple(buckets))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_simulator_matches_the_written_out_replay(data):
    problem = data.draw(problems(max_collectives=5, max_compute=5, costs=True))
    plan = data.draw(positioned_plans(problem))
    try:
        expected = reference_step(problem, plan)
    except ValueError:
        with pytest.raises(ValueError, match="before it is issued"):
            planner.simulate(problem, plan)
        # a plan that waits a bucket before issuing it breaks rule 9
        assert 9 in planner.check(problem, plan, keep_overlap=False).by_rule()
        return
    assert planner.simulate(problem, plan).step_ms == pytest.approx(expected, rel=1e-12, abs=1e-12)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_a_feasible_positioned_plan_respects_every_dependence_in_its_final_order(data):
    """The verifier's rule 9 against the written-out final order: when it accepts, every
    dependency of the problem runs before its consumer in that order."""
    problem = data.draw(problems(max_collectives=5, max_compute=5))
    plan = data.draw(positioned_plans(problem))
    if planner.verify(problem, plan, keep_overlap=False):
        return
    colls = {c.name: c for c in problem.collectives}
    index = {n.name: i for i, n in enumerate(problem.nodes)}
    # where each pinned node runs in the final order (a member's start / wait: its bucket's)
    where = {n.name: (n.pos, 2) for n in problem.nodes}
    for b in plan.buckets:
        s = (index[b.issue_before], 1) if b.issue_before else (index[b.start], 2)
        w = (index[b.wait_before], 0) if b.wait_before else (index[colls[b.wait].wait], 2)
        for m in b.members:
            where[m], where[colls[m].wait] = s, w
    for i, n in enumerate(problem.nodes):
        for d in n.deps:
            assert where[problem.nodes[d].name] < where[n.name], (problem.nodes[d].name, n.name)


def _gathers():
    return two_gathers((1 << 20, 1 << 20), (1 << 20, 1 << 20), LINK)


def _plan(problem, **bucket):
    b = planner.Bucket(members=("ag1", "ag2"), start="ag1", wait="ag1", **bucket)
    return planner.Plan(problem_fingerprint=problem.fingerprint, planner="hand", created="t", buckets=(b,))


def test_a_start_issued_before_the_compute_it_follows_hides_it():
    """two_gathers: mm_0 (1 ms), ag1, ag2, w1, w2, mm_1. Issued before mm_0 the merged gather runs
    during it; at its anchor it runs after it."""
    p = _gathers()
    anchored = planner.simulate(p, _plan(p)).step_ms
    early = planner.simulate(p, _plan(p, issue_before="mm_0")).step_ms
    comm = LINK.time_ms("all_gather", 2 << 20)
    assert anchored == pytest.approx(1.0 + comm + 1.0)
    assert early == pytest.approx(max(1.0, comm) + 1.0)
    assert not planner.verify(p, _plan(p, issue_before="mm_0"), keep_overlap=False)


def test_a_wait_after_its_consumer_breaks_rule_9_and_one_before_it_is_feasible():
    p = _gathers()
    late = planner.check(p, _plan(p, wait_before="mm_1"), keep_overlap=False)
    assert late.feasible  # just before mm_1: still before its consumer
    bad = planner.Plan(problem_fingerprint=p.fingerprint, planner="hand", created="t",
                       buckets=(planner.Bucket(members=("ag1", "ag2"), start="ag1", wait="ag1", wait_before="ag1"),))
    report = planner.check(p, bad, keep_overlap=False)
    assert 9 in report.by_rule()  # waited before it is issued
    assert "position" in str(report.violations[0])


def test_a_start_before_its_producer_breaks_rule_9():
    """ag1's shard is produced by mm_0 in this variant: issuing before mm_0 is illegal."""
    p = _gathers()
    nodes = list(p.nodes)
    nodes[1] = nodes[1].model_copy(update={"deps": (0,)})
    p = p.model_copy(update={"nodes": tuple(nodes), "fingerprint": ""}).with_fingerprint()
    report = planner.check(p, _plan(p, issue_before="mm_0"), keep_overlap=False)
    assert [v.rule for v in report.violations] == [9]
    assert "mm_0 must run before ag1" in str(report.violations[0])


def test_an_unknown_named_position_is_rule_1_and_the_simulator_refuses_it():
    p = _gathers()
    plan = _plan(p, issue_before="no_such_node")
    report = planner.check(p, plan)
    assert [v.rule for v in report.violations] == [1]
    assert "no_such_node" in str(report.violations[0])
    with pytest.raises(planner.PlanMismatchError, match="no_such_node"):
        planner.simulate(p, plan)


def test_keep_overlap_is_the_policy_that_switches_rules_4_7_and_8():
    """ag2 hidden by w1: merging it with ag1 erases its hider (rule 4) and a bucket started after
    w1 leaves it unhidden (rule 7); without the overlap policy the same plan is feasible (only
    dependences, the key and the cap remain)."""
    p = _gathers()
    colls = list(p.collectives)
    colls[1] = colls[1].model_copy(update={"status": "hidden", "hiding": ("w1",)})
    p = p.model_copy(update={"collectives": tuple(colls), "fingerprint": ""}).with_fingerprint()
    plan = _plan(p, issue_before="w2", wait_before="mm_1")
    assert {4, 7} <= set(planner.check(p, plan).by_rule())
    assert planner.check(p, plan, keep_overlap=False).feasible
    recorded = with_buckets(plan, plan.buckets, params={"keep_overlap": False})
    assert planner.rules.verifier.recorded_policy(recorded) == {"keep_overlap": False}


def test_plan_format_round_trips_and_anchored_plans_stay_version_1(tmp_path):
    p = _gathers()
    positioned = _plan(p, issue_before="mm_0", wait_before="mm_1")
    assert positioned.schema_version == 2
    planner.save(positioned, tmp_path / "pos.json")
    assert planner.load_plan(tmp_path / "pos.json") == positioned
    anchored = _plan(p)
    assert anchored.schema_version == 1
    planner.save(anchored, tmp_path / "anc.json")
    written = json.loads((tmp_path / "anc.json").read_text())
    assert written["schema_version"] == 1 and set(written["buckets"][0]) == {"members", "start", "wait"}


def test_a_version_1_file_with_named_positions_is_refused_naming_the_bucket(tmp_path):
    p = _gathers()
    data = json.loads(planner.core.io.dumps(_plan(p, issue_before="mm_0")))
    data["schema_version"] = 1
    (tmp_path / "plan.json").write_text(json.dumps(data))
    with pytest.raises(planner.SchemaError, match=r"buckets\[0\].*schema_version 2"):
        planner.load_plan(tmp_path / "plan.json")
