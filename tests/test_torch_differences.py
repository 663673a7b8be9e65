"""Where torch's step-by-step checks and our final-state rules disagree, one minimal graph each.

Each test runs torch's own check (``_can_add_to_bucket`` or its whole greedy search) on the
graph and our verifier on the extracted problem, and asserts the documented difference
(planner/README.md, "Where torch differs").
"""

from __future__ import annotations

import time

import torch

from fxglue.cpu_compat import cpu_compat
from fxglue.estimator import Estimator
from fxglue.greedy import greedy_plan
from planner.rules.verifier import verify
from tests.handmade import ar, build, plan_for, rs, wait, ag

BF16 = torch.bfloat16
VEC = ((64, 64), BF16)


def torch_accepts(h, first: str, candidate: str, at: tuple[str, str] | None = None) -> bool:
    """Torch's verdict on adding ``candidate`` to a bucket holding ``first``; with ``at``
    (start anchor, wait anchor collective names), on that one timeline position only."""
    import torch._inductor.fx_passes.overlap_preserving_bucketer as opb
    from torch._inductor.fx_passes.overlap_scheduling import CollBucket, get_group_name

    with cpu_compat(Estimator()):
        b = opb.OverlapPreservingBucketer(h.gm.graph, h.collective_info, h.scheduled)
        by_name = {n.name: n for n in h.gm.graph.nodes}
        a = by_name[first]
        b._populate_node_to_event(get_group_name(a))
        bucket = CollBucket(collectives=[a], total_bytes=h.collective_info[a].size_bytes)
        if at is None:
            return b._can_add_to_bucket(bucket, by_name[candidate])
        start_pos = by_name[at[0]]
        wait_pos = h.collective_info[by_name[at[1]]].wait_node
        why = opb.WhyNoBucket(a, by_name[candidate])
        return b._try_timeline_position(bucket, by_name[candidate], start_pos, wait_pos, why)


def test_looser_torch_misses_a_wait_that_forces_a_hidden_member_to_finish_early():
    """FIFO situation B: ag1 joins ag0's early bucket; an exposed reduce_scatter issued after the
    bucket is waited before ag1's hiding mm, which forces the bucket (and ag1) to complete first.
    Torch only scans for enclosed hiding intervals, so it accepts."""

    def fn(x0, x1, g, a):
        s0 = ag(x0)
        m0 = torch.mm(a, a)
        w0 = wait(s0)
        r = rs(g)
        m1 = torch.mm(m0, a)
        wr = wait(r)
        s1 = ag(x1)
        m2 = torch.mm(m1, a)
        w1 = wait(s1)
        return torch.mm(w0, w1), m2, wr

    h = build(fn, [((8, 64), BF16), ((8, 64), BF16), ((64, 64), BF16), VEC],
              {0: ([0], "hidden"), 2: ([2], "hidden")})
    p = h.problem()
    a, b = h.names["c0"], h.names["c2"]
    assert torch_accepts(h, a, b)
    violations = verify(p, plan_for(p, [([a, b], a, b)]))
    assert [v.rule for v in violations] == [8] and "forces it to finish" in violations[0].message


def test_stricter_torch_protects_partly_hidden_members_inside_the_bucket():
    """Torch keeps every member's hiding nodes (partly hidden ones too) between the merged start
    and wait; our rules protect fully hidden collectives only (as torch's dependency graph does)."""

    def fn(x0, x1, a):
        s0 = ag(x0)
        w0 = wait(s0)
        s1 = ag(x1)
        m0 = torch.mm(a, a)  # partly hides ag1
        w1 = wait(s1)
        return w0, w1, m0

    h = build(fn, [((8, 64), BF16), ((8, 64), BF16), VEC], {1: ([0], "partly")})
    p = h.problem()
    a, b = h.names["c0"], h.names["c1"]
    # the only anchors torch could reach without moving w0 later: start and wait of ag0 -> m0 outside
    assert verify(p, plan_for(p, [([a, b], a, a)])) == []
    with cpu_compat(Estimator()):
        plan = greedy_plan(h.gm.graph, h.collective_info, h.scheduled)
    buckets = {(bk.start, bk.wait) for bk in plan.buckets}
    assert (a, a) not in buckets  # torch never produces that final state


def test_stricter_torch_rejects_an_enclosure_that_already_existed():
    """An enclosure present before bucketing is not new: ag1 (issued before the reduce_scatter
    and waited after its hider) already encloses it; merging ag0 into ag1's slot keeps that.
    Torch's region scan finds the enclosure and rejects."""

    def fn(x0, x1, g, a):
        s1 = ag(x1)
        r = rs(g)
        m0 = torch.mm(a, a)  # hides the reduce_scatter
        wr = wait(r)
        s0 = ag(x0)
        w1 = wait(s1)
        w0 = wait(s0)
        return w0, w1, wr, m0

    h = build(fn, [((8, 64), BF16), ((8, 64), BF16), ((64, 64), BF16), VEC], {1: ([0], "hidden")})
    p = h.problem()
    first, late = h.names["c0"], h.names["c2"]  # c0 = ag(x1) issued first, c2 = ag(x0)
    plan = plan_for(p, [([first, late], first, late)])
    assert verify(p, plan) == []
    assert not torch_accepts(h, first, late, at=(first, late))


def test_looser_torch_restore_to_event_side_effect_yields_an_unrealizable_plan():
    """``restore_to_event`` does not re-add the dependency of the next timeline event on the
    restored start. A failed attempt (A with B: path between starts) thus unpins the compute
    after B's start, and a later merge places C's start before the compute C consumes. Our rule 9
    names it; torch's own final cycle check (or its stable sort) cannot realize the anchors."""

    def fn(xa, xb, xc, a):
        sa = ar(xa)
        x = torch.mm(a, a)  # partly hides A
        sb = ar(xb + x)  # B depends on x: a timeline-only path A -> x -> B
        m1 = torch.mm(x, a)  # partly hides B
        sc = ar(xc + m1)  # C consumes m1
        return wait(sa), wait(sb), wait(sc)

    h = build(fn, [((64, 64), BF16)] * 3 + [VEC], {0: ([0], "partly"), 1: ([1], "partly")})
    p = h.problem()
    with cpu_compat(Estimator()):
        plan = greedy_plan(h.gm.graph, h.collective_info, h.scheduled, problem_fingerprint=p.fingerprint)
    rules = {v.rule for v in verify(p, plan)}
    assert plan.buckets, "torch's greedy merged something"
    assert 9 in rules, (plan.buckets, rules)


def _convert_dtype_as_hiding_nodes():
    """torch's ``test_can_bucket_with_convert_dtype_as_hiding_nodes``
    (test/distributed/test_overlap_bucketing_unit.py), ported: ag1 hidden by the fp16 conversion
    that feeds ag2; ag2 and ag3 (fp32, one key in ``custom_ops_multidtype``) hidden by mm."""
    from tests.handmade import hide_by

    def fn(a, b, c):
        ag1 = ag(a)
        b16 = torch.ops.prims.convert_element_type.default(b, torch.float16)
        o1 = wait(ag1)
        ag2, ag3 = ag(b16), ag(c)
        mm = o1[:4] @ o1[:4]
        return o1, wait(ag2), wait(ag3), mm

    h = build(fn, [((4, 4), torch.float32)] * 3, {})
    nodes = list(h.gm.graph.nodes)
    conversion = next(n for n in nodes if n.target is torch.ops.prims.convert_element_type.default)
    mm = next(n for n in nodes if n.target is torch.ops.aten.mm.default)
    for label, hider in (("c0", conversion), ("c1", mm), ("c2", mm)):
        hide_by(h, label, [hider], "hidden")
    return h, conversion


def _all_gathers(graph) -> int:
    return sum(1 for n in graph.nodes if n.op == "call_function" and "all_gather_into_tensor" in str(n.target))


def test_torch_merges_a_gather_whose_folded_conversion_hides_and_a_positioned_plan_matches_its_count():
    # torch's bucketer leaves 2 all_gathers (ag1 alone; ag2+ag3), as its unit test expects: its
    # _pre_bucket copy replaces the conversion and its deps delay ag1's wait after that copy.
    # We model the conversion as the bucket's copy-in at the merged start: anchored at ag2 or
    # ag3 (after ag1's wait) ag1 loses its hider (rule 7), so the anchored optimum keeps 3; a
    # bucket issued where the conversion was keeps every hiding relation, verifies under the
    # overlap rules, applies, and leaves torch's count.
    import torch._inductor.fx_passes.overlap_preserving_bucketer as opb
    from fxglue.apply import apply_plan

    import planner

    import copy

    h, conversion = _convert_dtype_as_hiding_nodes()
    theirs = copy.deepcopy(h.gm)
    by_name = {n.name: n for n in theirs.graph.nodes}
    info = {by_name[s.name]: copy.copy(i) for s, i in h.collective_info.items()}
    for i in info.values():
        i.start_node, i.wait_node = by_name[i.start_node.name], by_name[i.wait_node.name]
        i.hiding_nodes = type(i.hiding_nodes)(by_name[n.name] for n in i.hiding_nodes)
    with cpu_compat(Estimator()):
        opb.OverlapPreservingBucketer(theirs.graph, info, type(h.scheduled)(theirs.graph.nodes),
                                      bucket_mode="custom_ops_multidtype").bucket_collectives()
    assert _all_gathers(theirs.graph) == 2

    p = h.problem(bucket_mode="custom_ops_multidtype")
    ag1, ag2, ag3 = (h.names[k] for k in ("c0", "c1", "c2"))
    assert {c.name: c for c in p.collectives}[ag2].folded == (conversion.name,)
    at_ag2 = plan_for(p, [([ag2, ag3], ag2, ag3)])
    assert [(v.rule, v.collectives) for v in verify(p, at_ag2)] == [(7, (ag1,))]
    result = planner.solve(p, planner.SolveOptions(time_limit_s=5, workers=1))
    assert result.status == "OPTIMAL" and result.objective == 3
    where_it_was = planner.Plan(problem_fingerprint=p.fingerprint, planner="hand", created="test", buckets=(
        planner.Bucket(members=(ag2, ag3), start=ag2, wait=ag3, issue_before=conversion.name),))
    report = planner.check(p, where_it_was)
    assert report.feasible, report.violations
    assert (report.quality.hidden_kept, report.quality.hidden_relations) == (3, 3)
    # the positioned search held to torch's overlap (rules 4, 7, 8) finds torch's count itself
    from planner.search.free.position_search import position_search

    found = position_search(p, [], planner.PositionSearchOptions(max_evaluations=2000, keep_overlap=True),
                            peak_memory_bytes=None, deadline=time.perf_counter() + 60).plan
    assert "keep_overlap" not in found.params and not verify(p, found)  # recorded as the default: on
    assert planner.collectives_after(p, found) == 2
    with h.fake_mode:
        apply_plan(h.gm.graph, h.collective_info, h.scheduled, found, problem=p,
                   bucket_mode="custom_ops_multidtype")
    assert _all_gathers(h.gm.graph) == 2
