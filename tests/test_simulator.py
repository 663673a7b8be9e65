"""The schedule simulator against timelines worked out by hand.

Every link below has group_size 2 and 1 GB/s, so an all_reduce of N bytes runs for
``latency + N / 1e6`` ms: 1_000_000 bytes is 1 ms. Latency is 0 unless a test says otherwise.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import planner
from planner.cost.simulator import simulate, to_chrome_trace, write_chrome_trace
from tests.strategies import problems

MB = 1_000_000


def make(seq, colls, latency_ms=0.0):
    """A problem from a schedule of tokens.

    ``seq``: ``("mm0", 2.0)`` is a compute node of 2 ms, ``("s", "a")`` / ``("w", "a")`` the
    start / wait of collective ``a``. ``colls``: name -> (process group, wire bytes).
    """
    nodes, pos = [], {}
    for k, tok in enumerate(seq):
        if tok[0] in ("s", "w"):
            name = tok[1] if tok[0] == "s" else f"wait_{tok[1]}"
            deps = (pos[tok[1]],) if tok[0] == "w" else ()
            nodes.append(planner.Node(name=name, kind="start" if tok[0] == "s" else "wait", pos=k,
                                      est_ms=0.0, deps=deps))
        else:
            name = tok[0]
            nodes.append(planner.Node(name=name, kind="compute", pos=k, est_ms=tok[1]))
        pos[name] = k
    collectives = tuple(
        planner.Collective(name=c, wait=f"wait_{c}", kind="all_reduce", pg=pg, key=f"all_reduce/{pg}/bf16",
                           dtype="bfloat16", size_bytes=nbytes, wire_bytes=nbytes, est_ms=nbytes / MB,
                           exposed_ms=nbytes / MB, start_pos=pos[c], wait_pos=pos[f"wait_{c}"], status="exposed")
        for c, (pg, nbytes) in colls.items())
    pgs = sorted({pg for pg, _ in colls.values()})
    links = tuple(planner.Link(pg=pg, group_size=2, latency_ms=latency_ms, bandwidth_gbps=1.0) for pg in pgs)
    return planner.Problem(bucket_mode="default", bucket_cap_bytes=1 << 30, n_scheduled=len(seq),
                           collectives=collectives, nodes=tuple(nodes), timelines=(), links=links).with_fingerprint()


def plan_of(problem, *buckets):
    return planner.Plan(problem_fingerprint=problem.fingerprint, planner="hand", created="now",
                        buckets=tuple(planner.Bucket(members=m, start=s, wait=w) for m, s, w in buckets))


def run(sim, name):
    return next(r for r in sim.buckets if name in r.members)


def test_collective_fully_overlapped_by_compute():
    # a: 0 -> 1 on pg0 while mm0 runs 0 -> 2; the wait at 2 finds it done.
    p = make([("s", "a"), ("mm0", 2.0), ("w", "a")], {"a": ("pg0", 1 * MB)})
    sim = simulate(p)
    assert sim.compute_ms == pytest.approx(2.0)
    assert sim.step_ms == pytest.approx(2.0)
    assert sim.exposed_ms == pytest.approx(0.0)
    a = run(sim, "a")
    assert (a.issue_ms, a.begin_ms, a.end_ms, a.wait_ms, a.blocked_ms) == pytest.approx((0, 0, 1, 2, 0))


def test_collective_waited_right_after_its_start_is_fully_exposed():
    # mm0 0 -> 1; a issued at 1, runs 1 -> 2.5; its wait at 1 stalls 1.5; mm1 2.5 -> 3.5.
    p = make([("mm0", 1.0), ("s", "a"), ("w", "a"), ("mm1", 1.0)], {"a": ("pg0", 1.5 * MB)})
    sim = simulate(p)
    assert sim.exposed_ms == pytest.approx(1.5)
    assert sim.exposed_ms_by_pg == pytest.approx({"pg0": 1.5})
    assert sim.step_ms == pytest.approx(3.5)
    a = run(sim, "a")
    assert (a.issue_ms, a.begin_ms, a.end_ms, a.wait_ms, a.blocked_ms) == pytest.approx((1, 1, 2.5, 1, 1.5))
    assert [(c.name, c.begin_ms, c.end_ms) for c in sim.compute] == [("mm0", 0, 1), ("mm1", 2.5, 3.5)]


def test_fifo_stream_queues_a_collective_behind_an_earlier_long_one():
    # a (3 ms) runs 0 -> 3. b is issued at 1 but its stream is busy until 3: b runs 3 -> 4.
    # mm1 ends at 2, so waiting b stalls 2 ms though b alone would have been hidden.
    seq = [("s", "a"), ("mm0", 1.0), ("s", "b"), ("mm1", 1.0), ("w", "b"), ("mm2", 1.0), ("w", "a")]
    sim = simulate(make(seq, {"a": ("pg0", 3 * MB), "b": ("pg0", 1 * MB)}))
    b = run(sim, "b")
    assert (b.issue_ms, b.begin_ms, b.end_ms, b.wait_ms, b.blocked_ms) == pytest.approx((1, 3, 4, 2, 2))
    assert run(sim, "a").blocked_ms == pytest.approx(0.0)  # waited at 5, done at 3
    assert sim.exposed_ms == pytest.approx(2.0)
    assert sim.step_ms == pytest.approx(5.0)
    # On separate groups b would run 1 -> 2, hidden behind mm1.
    other = simulate(make(seq, {"a": ("pg0", 3 * MB), "b": ("pg1", 1 * MB)}))
    assert other.exposed_ms == pytest.approx(0.0)
    assert other.step_ms == pytest.approx(3.0)


def test_two_process_groups_run_concurrently():
    # a on pg0 and b on pg1 both run 0 -> 2; mm0 ends at 1; waiting a stalls 1 ms, b is then done.
    seq = [("s", "a"), ("s", "b"), ("mm0", 1.0), ("w", "a"), ("w", "b")]
    sim = simulate(make(seq, {"a": ("pg0", 2 * MB), "b": ("pg1", 2 * MB)}))
    assert [(r.pg, r.begin_ms, r.end_ms) for r in sim.buckets] == [("pg0", 0, 2), ("pg1", 0, 2)]
    assert sim.exposed_ms_by_pg == pytest.approx({"pg0": 1.0, "pg1": 0.0})
    assert sim.step_ms == pytest.approx(2.0)
    # the same on one group: b queues 2 -> 4 and its wait stalls another 2 ms
    same = simulate(make(seq, {"a": ("pg0", 2 * MB), "b": ("pg0", 2 * MB)}))
    assert same.exposed_ms_by_pg == pytest.approx({"pg0": 3.0})
    assert same.step_ms == pytest.approx(4.0)


def test_two_member_bucket_pays_latency_once():
    # latency 0.5 ms; a and b are 1 MB each (1.5 ms alone, 2.5 ms together).
    seq = [("s", "a"), ("mm0", 1.0), ("w", "a"), ("s", "b"), ("mm1", 1.0), ("w", "b")]
    p = make(seq, {"a": ("pg0", MB), "b": ("pg0", MB)}, latency_ms=0.5)
    # Unbucketed: a 0 -> 1.5, waited at 1 (0.5 stall); b 1.5 -> 3.0, waited at 2.5 (0.5 stall).
    alone = simulate(p)
    assert alone.step_ms == pytest.approx(3.0)
    assert alone.exposed_ms == pytest.approx(1.0)
    # Bucket issued at a's start, waited at b's wait: 0 -> 2.5 behind mm0 and mm1 (0 -> 2).
    sim = simulate(p, plan_of(p, (("a", "b"), "a", "b")))
    (bucket,) = sim.buckets
    assert bucket.members == ("a", "b") and bucket.wire_bytes == 2 * MB
    assert (bucket.begin_ms, bucket.end_ms, bucket.wait_ms, bucket.blocked_ms) == pytest.approx((0, 2.5, 2, 0.5))
    assert sim.step_ms == pytest.approx(2.5)
    assert sim.exposed_ms == pytest.approx(0.5)
    # The wait anchor matters: waited at a's wait (time 1) it stalls 1.5 ms, then mm1 runs.
    early = simulate(p, plan_of(p, (("a", "b"), "a", "a")))
    assert early.step_ms == pytest.approx(3.5)
    assert early.exposed_ms == pytest.approx(1.5)


def test_waiting_a_bucket_before_it_is_issued_is_an_error():
    seq = [("s", "a"), ("w", "a"), ("s", "b"), ("w", "b")]
    p = make(seq, {"a": ("pg0", MB), "b": ("pg0", MB)})
    with pytest.raises(ValueError, match="before it is issued"):
        simulate(p, plan_of(p, (("a", "b"), "b", "a")))


def test_chrome_trace_has_a_track_per_group_and_matches_the_simulation(tmp_path):
    seq = [("s", "a"), ("s", "b"), ("mm0", 1.0), ("w", "a"), ("w", "b"), ("mm1", 0.5)]
    p = make(seq, {"a": ("pg0", 2 * MB), "b": ("pg1", 2 * MB)})
    sim = simulate(p)
    trace = json.loads(json.dumps(to_chrome_trace(sim, p)))
    events = trace["traceEvents"]
    tracks = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert sorted(tracks.values()) == ["compute", "pg pg0", "pg pg1"]
    by_track = {name: [e for e in events if e["ph"] == "X" and e["tid"] == tid] for tid, name in tracks.items()}
    compute = {e["name"]: e for e in by_track["compute"]}
    assert set(compute) == {"mm0", "mm1", "blocked: all_reduce: a"}
    assert compute["mm0"]["dur"] == pytest.approx(1000.0)
    assert compute["blocked: all_reduce: a"]["ts"] == pytest.approx(1000.0)
    assert compute["blocked: all_reduce: a"]["dur"] == pytest.approx(1000.0)
    assert compute["mm1"]["ts"] == pytest.approx(2000.0)
    for r in sim.buckets:
        (e,) = by_track[f"pg {r.pg}"]
        assert e["name"] == f"all_reduce: {r.members[0]}"
        assert e["ts"] == pytest.approx(r.begin_ms * 1000)
        assert e["dur"] == pytest.approx((r.end_ms - r.begin_ms) * 1000)
    out = write_chrome_trace(sim, p, tmp_path / "sub" / "trace.json")
    assert json.loads(out.read_text()) == trace
    assert [f.name for f in out.parent.iterdir()] == ["trace.json"]  # no temporary file left


def test_bucket_label_names_every_member():
    seq = [("s", "a"), ("s", "b"), ("s", "c"), ("mm0", 1.0), ("w", "a"), ("w", "b"), ("w", "c")]
    p = make(seq, {m: ("pg0", MB) for m in "abc"})
    sim = simulate(p, plan_of(p, (("a", "b", "c"), "a", "c")))
    names = [e["name"] for e in to_chrome_trace(sim, p)["traceEvents"] if e.get("cat") == "all_reduce"]
    assert names == ["all_reduce x3: a, b, c"]


@settings(max_examples=40, deadline=None)
@given(problems())
def test_unbucketed_step_is_at_least_the_compute(problem):
    sim = simulate(problem)
    compute = sum(n.unpinned_ms + (n.est_ms if n.kind in ("compute", "other") else 0.0) for n in problem.nodes)
    assert sim.compute_ms == pytest.approx(compute)
    assert sim.step_ms >= compute - 1e-9
    assert sim.exposed_ms >= 0 and all(v >= 0 for v in sim.exposed_ms_by_pg.values())
    # every collective is waited, so the step is the compute plus the stalls
    assert sim.step_ms == pytest.approx(sim.compute_ms + sim.exposed_ms)
    assert sorted(m for r in sim.buckets for m in r.members) == sorted(c.name for c in problem.collectives)


def test_bucketing_costs_run_on_the_compute_stream_as_worked_out_by_hand():
    # all_reduces a (1 MB) and b (1 MB) merged, anchored at a's start and b's wait; launches
    # 0.1 ms each issue; copies at 1 GB/s: copy-in reads and writes 2 MB -> 4 ms, no copy-out
    # (all_reduce outputs are views). mm0 0 -> 1; launch 1 -> 1.1; copy-in 1.1 -> 5.1; the
    # bucket runs 5.1 -> 7.1; mm1 5.1 -> 6.1; the wait at 6.1 stalls 1.0 to 7.1; mm2 7.1 -> 8.1.
    p = make([("mm0", 1.0), ("s", "a"), ("s", "b"), ("mm1", 1.0), ("w", "a"), ("w", "b"), ("mm2", 1.0)],
             {"a": ("pg0", 1 * MB), "b": ("pg0", 1 * MB)})
    p = p.model_copy(update={"bucketing": planner.BucketingCost(copy_gbps=1.0, launch_ms=0.1)})
    sim = simulate(p, plan_of(p, (("a", "b"), "a", "b")))
    ab = run(sim, "a")
    assert (ab.issue_ms, ab.begin_ms, ab.end_ms, ab.wait_ms, ab.blocked_ms) == pytest.approx((5.1, 5.1, 7.1, 6.1, 1.0))
    assert sim.step_ms == pytest.approx(8.1)
    assert sim.overhead_ms == pytest.approx(4.1)
    assert [c.kind for c in sim.compute] == ["compute", "launch", "copy-in", "compute", "compute"]
    # unbucketed: two launches, no copies. mm0 0->1; a: launch 1->1.1, runs 1.1->2.1; b: launch
    # 1.1->1.2, queued behind a 2.1->3.1; mm1 1.2->2.2; wait a at 2.2 (done); wait b stalls to 3.1.
    sim = simulate(p)
    assert sim.step_ms == pytest.approx(4.1)
    assert sim.overhead_ms == pytest.approx(0.2)


def test_all_gather_bucket_copies_its_shards_in_and_its_outputs_out():
    # torch's all_gather merge: copy-in of each rank's shards (wire / group size), copy-out of
    # every full output (see planner.core.problem.BucketingCost)
    assert planner.core.problem.copy_bytes("all_gather", [800, 400], 4, "default") == (300, 1200)
    assert planner.core.problem.copy_bytes("reduce_scatter", [800, 400], 4, "default") == (1200, 0)
    assert planner.core.problem.copy_bytes("reduce_scatter", [800, 400], 4, "coalesced") == (0, 0)
    assert planner.core.problem.copy_bytes("all_gather", [800], 4, "default") == (0, 0)  # not merged


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_step_ms_is_the_recorded_replays_step_to_the_bit(data):
    # planner.step_ms (what polish scores thousands of plans with) replays without recording the
    # runs; it must be the same float as simulate's, bucketing costs and mixed kinds included
    from planner.cost.simulator import step_ms
    from tests.strategies import plans

    problem = data.draw(problems(costs=data.draw(st.booleans())))
    plan = data.draw(plans(problem))
    if planner.verify(problem, plan):  # an infeasible plan may not be replayable (waited before issued)
        plan = None
    assert step_ms(problem, plan) == simulate(problem, plan).step_ms
    assert step_ms(problem) == simulate(problem).step_ms


def _walk_every_node(problem, plan):
    """An oracle written apart from planner.cost.simulator: (step, exposed per group) by walking every
    node in order with one clock, as the simulator did before it learned to visit anchors only."""
    colls = {c.name: c for c in problem.collectives}
    buckets = [(b.members, b.start, b.wait) for b in (plan.buckets if plan else ())]
    placed = {m for b in buckets for m in b[0]}
    buckets += [((c.name,), c.name, c.name) for c in problem.collectives if c.name not in placed]
    issue_at = {start: k for k, (_, start, _) in enumerate(buckets)}
    wait_at = {colls[wait].wait: k for k, (_, _, wait) in enumerate(buckets)}
    clock, free, ends, copy_out, last_end = 0.0, {}, {}, {}, 0.0
    exposed = {c.pg: 0.0 for c in problem.collectives}
    cost = problem.bucketing
    for node in problem.nodes:
        clock += node.unpinned_ms  # the unpinned nodes scheduled before this one
        if node.kind in ("compute", "other"):
            clock += node.est_ms
        elif node.kind == "start" and node.name in issue_at:
            k = issue_at[node.name]
            members = [colls[m] for m in buckets[k][0]]
            link = problem.link(members[0].pg)
            wires = [m.wire_bytes for m in members]
            if cost is not None:
                cin, cout = planner.core.problem.copy_bytes(members[0].kind, wires, link.group_size, problem.bucket_mode)
                clock += cost.launch_ms + cost.copy_ms(cin)
                copy_out[k] = cost.copy_ms(cout)
            begin = max(clock, free.get(members[0].pg, 0.0))
            ends[k] = free[members[0].pg] = begin + link.time_ms(members[0].kind, sum(wires))
            last_end = max(last_end, ends[k])
        elif node.kind == "wait" and node.name in wait_at:
            k = wait_at[node.name]
            blocked = max(0.0, ends[k] - clock)
            exposed[colls[buckets[k][0][0]].pg] += blocked
            clock += blocked + copy_out.get(k, 0.0)
    return max(clock, last_end), exposed


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_the_replay_of_anchors_is_the_walk_over_every_node(data):
    from tests.strategies import plans

    problem = data.draw(problems(costs=data.draw(st.booleans())))
    plan = data.draw(plans(problem))
    if planner.verify(problem, plan):
        plan = None
    sim = simulate(problem, plan)
    step, exposed = _walk_every_node(problem, plan)
    assert sim.step_ms == pytest.approx(step, rel=1e-12, abs=1e-9)
    assert sim.exposed_ms_by_pg == pytest.approx(exposed, rel=1e-12, abs=1e-9)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_one_replay_index_serves_every_plan_of_its_problem(data):
    # polish keeps one index (and the bucket prices it remembers) for thousands of plans: a price
    # remembered from one plan must be right in the next, where the same members meet again
    from planner.cost.simulator import replay_index, step_ms
    from tests.strategies import plans

    problem = data.draw(problems(costs=data.draw(st.booleans())))
    index = replay_index(problem)
    for _ in range(4):
        plan = data.draw(plans(problem))
        if planner.verify(problem, plan):
            continue
        assert step_ms(problem, plan, index) == simulate(problem, plan).step_ms
    assert step_ms(problem, None, index) == simulate(problem).step_ms
