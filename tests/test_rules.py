"""The feasibility rules on small hand-made graphs: verifier and apply_plan agree, rule by rule."""

from __future__ import annotations

import pytest
import torch

import planner
from fxglue.apply import PlanError
from planner.rules.verifier import check, verify
from tests.handmade import ag, apply_and_count, ar, build, plan_for, rs, two_hidden_gathers, wait

BF16 = torch.bfloat16
F32 = torch.float32
VEC = ((64, 64), BF16)


def _rejects(h, plan, problem, rule):
    """Both the verifier and apply_plan reject the plan, naming ``rule``; the graph is unchanged."""
    found = {v.rule for v in verify(problem, plan)}
    assert rule in found, found
    before = str(h.gm.graph)
    with pytest.raises(PlanError) as err:
        apply_and_count(h, plan, problem)
    assert err.value.rule in found and f"rule {err.value.rule} " in str(err.value)
    assert str(h.gm.graph) == before
    return found


def gathers_around_reduce_scatter(rs_status):
    """ag0 (hidden by mm0) waited before a reduce_scatter is issued; ag1 issued after it and
    hidden by mm1, which also hides the reduce_scatter when it is hidden; the reduce_scatter is
    waited after mm1."""

    def fn(x0, x1, g, a):
        s0 = ag(x0)
        m0 = torch.mm(a, a)
        w0 = wait(s0)
        r = rs(g)
        s1 = ag(x1)
        m1 = torch.mm(m0, a)
        w1 = wait(s1)
        wr = wait(r)
        return torch.mm(w0, w1), m1, wr

    hiding = {0: ([0], "hidden"), 2: ([1], "hidden")}  # c0 = ag0, c1 = reduce_scatter, c2 = ag1
    if rs_status == "hidden":
        hiding[1] = ([1], "hidden")
    return build(fn, [((8, 64), BF16), ((8, 64), BF16), ((64, 64), BF16), VEC], hiding)


def test_two_gathers_each_hidden_by_its_own_mm_merge():
    h = two_hidden_gathers()
    p = h.problem()
    a, b = h.names["c0"], h.names["c1"]
    plan = plan_for(p, [([a, b], a, b)])
    report = check(p, plan)
    assert report.feasible, report.violations
    assert report.quality.hidden_kept == report.quality.hidden_relations == 2
    assert apply_and_count(h, plan, p) == 1


def test_two_gathers_with_a_hidden_reduce_scatter_between_do_not_merge():
    h = gathers_around_reduce_scatter("hidden")
    p = h.problem()
    a, b = h.names["c0"], h.names["c2"]
    for start in (a, b):
        for w in (a, b):
            assert not check(p, plan_for(p, [([a, b], start, w)])).feasible
    found = _rejects(h, plan_for(p, [([a, b], a, b)]), p, 8)
    assert found == {8}  # only the stream rule: the bucket now encloses the reduce_scatter's overlap


def test_two_gathers_with_an_exposed_reduce_scatter_between_do_merge():
    h = gathers_around_reduce_scatter("exposed")
    p = h.problem()
    a, b = h.names["c0"], h.names["c2"]
    plan = plan_for(p, [([a, b], a, b)])
    assert verify(p, plan) == []
    assert apply_and_count(h, plan, p) == 2


def test_nested_interval_whose_outer_hider_consumes_the_inner_output_does_not_merge():
    def fn(x0, x1, a):
        outer = ag(x0)
        inner = ag(x1)
        m0 = torch.mm(a, a)  # hides inner
        wi = wait(inner)
        m1 = torch.mm(wi[:64], a)  # hides outer, consumes the inner gather
        wo = wait(outer)
        return wo, m1, m0

    h = build(fn, [((8, 64), BF16), ((8, 64), BF16), VEC], {0: ([1], "hidden"), 1: ([0], "hidden")})
    p = h.problem()
    a, b = h.names["c0"], h.names["c1"]
    for start in (a, b):
        for w in (a, b):
            rules = {v.rule for v in verify(p, plan_for(p, [([a, b], start, w)]))}
            assert rules & {7, 9}, (start, w, rules)
    _rejects(h, plan_for(p, [([a, b], a, a)]), p, 9)


def test_all_reduce_and_reduce_scatter_never_share_a_bucket():
    def fn(x, y):
        r = rs(x)
        s = ar(y)
        return wait(r), wait(s)

    h = build(fn, [((64, 64), F32), ((64, 64), F32)], {})
    p = h.problem()
    a, b = h.names["c0"], h.names["c1"]
    assert _rejects(h, plan_for(p, [([a, b], a, b)]), p, 2) == {2}


def test_dependent_collectives_never_share_a_bucket():
    def fn(x, a):
        s0 = ag(x)
        w0 = wait(s0)
        s1 = ag(torch.mm(w0, a)[:8])
        return wait(s1)

    h = build(fn, [((8, 64), BF16), VEC], {})
    p = h.problem()
    a, b = h.names["c0"], h.names["c1"]
    for start in (a, b):
        for w in (a, b):
            assert 6 in {v.rule for v in verify(p, plan_for(p, [([a, b], start, w)]))}
    _rejects(h, plan_for(p, [([a, b], a, b)]), p, 6)


@pytest.mark.parametrize("mode", ["default", "custom_ops", "custom_ops_multidtype"])
def test_mixed_dtypes_share_a_bucket_only_in_multidtype_mode(mode):
    def fn(x, y):
        s0 = ag(x)
        s1 = ag(y)
        return wait(s0), wait(s1)

    h = build(fn, [((8, 64), BF16), ((8, 64), F32)], {})
    p = h.problem(bucket_mode=mode)
    a, b = h.names["c0"], h.names["c1"]
    plan = plan_for(p, [([a, b], a, b)])
    if mode == "custom_ops_multidtype":
        assert verify(p, plan) == []
        assert apply_and_count(h, plan, p, bucket_mode=mode) == 1
    else:
        assert {v.rule for v in verify(p, plan)} == {2}


def test_over_cap_bucket_is_rejected():
    def fn(x, y):
        return wait(ag(x)), wait(ag(y))

    h = build(fn, [((8, 64), BF16), ((8, 64), BF16)], {})
    size = h.problem().collectives[0].size_bytes
    p = h.problem(max_bucket_memory_gb=(2 * size - 1) / 1024**3)
    a, b = h.names["c0"], h.names["c1"]
    assert _rejects(h, plan_for(p, [([a, b], a, b)]), p, 3) == {3}


def test_a_collective_used_for_hiding_never_merges():
    def fn(x0, x1, x2, g):
        r = rs(g)  # hidden by ... nothing mm-like; we use the wait of another group below instead
        s0 = ag(x0)
        s1 = ag(x1)
        w0 = wait(s0)
        w1 = wait(s1)
        return w0, w1, wait(r)

    h = build(fn, [((8, 64), BF16), ((8, 64), BF16), ((8, 64), BF16), ((64, 64), F32)], {})
    # the wait of the first all_gather hides the reduce_scatter (as a cross-group wait would)
    from torch.utils._ordered_set import OrderedSet

    starts = sorted(h.collective_info, key=list(h.gm.graph.nodes).index)
    h.collective_info[starts[0]].hiding_nodes = OrderedSet([h.collective_info[starts[1]].wait_node])
    h.collective_info[starts[0]].exposed_time_ms = 0.0
    p = h.problem()
    a, b = h.names["c1"], h.names["c2"]
    assert _rejects(h, plan_for(p, [([a, b], a, b)]), p, 4) == {4}


def test_plan_for_another_problem_or_unknown_collective_is_rejected():
    h = two_hidden_gathers()
    p = h.problem()
    a, b = h.names["c0"], h.names["c1"]
    wrong = planner.Plan(problem_fingerprint="sha256:other", planner="hand", created="t",
                         buckets=(planner.Bucket(members=(a, b), start=a, wait=b),))
    assert _rejects(h, wrong, p, 1) == {1}
    unknown = plan_for(p, [([a, "no_such_collective"], a, a)])
    assert _rejects(h, unknown, p, 1) == {1}


def test_anchor_that_is_not_a_member_is_rejected_even_when_forced_past_validation():
    h = two_hidden_gathers()
    p = h.problem()
    a, b = h.names["c0"], h.names["c1"]
    bad = planner.Bucket.model_construct(members=(a,), start=b, wait=a)
    plan = planner.Plan.model_construct(problem_fingerprint=p.fingerprint, planner="hand", created="t", params={},
                                        buckets=(bad,), schema_version=1)
    assert _rejects(h, plan, p, 5) == {5}


def test_hiding_node_left_outside_the_bucket_is_rejected():
    h = two_hidden_gathers()
    p = h.problem()
    a, b = h.names["c0"], h.names["c1"]
    # wait at the first gather's wait: the second gather's hiding mm ends up after the bucket
    assert _rejects(h, plan_for(p, [([a, b], a, a)]), p, 7) == {7}


# One feasible/infeasible pair per rule: a small graph and two plans that differ in one member or
# one anchor. The good plan verifies and applies; the bad one breaks the rule (apply_plan refuses
# it too, except rule 10, which apply_plan does not take), and its violations of that rule are
# exactly the ones expected, each naming its bucket and collectives. Expectations are reasoned
# from the graph, in each test's comments.


def _pair(h, p, good, bad, rule, expected, *, rules=None, applies=True, **policy):
    """``good`` is feasible; ``bad`` breaks exactly ``rules`` (default: only ``rule``), and its
    violations of ``rule`` are ``expected``: (bucket, collectives, texts its line holds) each, in order."""
    assert verify(p, good, **policy) == []
    found = verify(p, bad, **policy)
    assert {v.rule for v in found} == (rules or {rule}), found
    mine = [v for v in found if v.rule == rule]
    assert [(v.bucket, v.collectives) for v in mine] == [(b, c) for b, c, _ in expected], mine
    for v, (b, _, texts) in zip(mine, expected):
        line = str(v)
        assert line.startswith(f"rule {rule} ({planner.RULES[rule]}): "), line
        assert b is None or f"bucket {b}: " in line, line
        for text in texts:
            assert text in line, (text, line)
    if applies:
        _rejects(h, bad, p, rule)  # first: it leaves the graph as it was
        merged = sum(len(bucket.members) - 1 for bucket in good.buckets)
        assert apply_and_count(h, good, p) == len(p.collectives) - merged  # it applies: one collective per bucket


def _collectives(p):
    return {c.name: c for c in p.collectives}


def two_exposed_gathers():
    """ag0 issued and waited, then ag1 issued and waited; no compute, nothing hidden."""

    def fn(x0, x1):
        w0 = wait(ag(x0))
        w1 = wait(ag(x1))
        return w0, w1

    return build(fn, [((8, 64), BF16), ((8, 64), BF16)], {})


def three_gathers(dtypes):
    """Three all_gathers issued in order, then waited in order; nothing hidden."""

    def fn(x0, x1, x2):
        s0, s1, s2 = ag(x0), ag(x1), ag(x2)
        return wait(s0), wait(s1), wait(s2)

    return build(fn, [((8, 64), d) for d in dtypes], {})


def test_rule_1_pair_a_member_the_problem_does_not_have():
    h = two_exposed_gathers()
    p = h.problem()
    a, b = h.names["c0"], h.names["c1"]
    good = plan_for(p, [([a, b], a, b)])
    bad = plan_for(p, [([a, b, "ghost"], a, b)])
    _pair(h, p, good, bad, 1, [(0, ("ghost",), ["unknown collective(s) ['ghost']"])])


def test_rule_2_pair_a_float32_gather_joins_two_bfloat16_ones():
    h = three_gathers([BF16, BF16, F32])
    p = h.problem()  # default mode: the dtype is part of the key
    c0, c1, c2 = h.names["c0"], h.names["c1"], h.names["c2"]
    keys = _collectives(p)
    assert keys[c0].key == keys[c1].key != keys[c2].key
    good = plan_for(p, [([c0, c1], c0, c1)])
    bad = plan_for(p, [([c0, c1, c2], c0, c1)])
    # the message names the two keys; the violation names the bucket and all its members
    _pair(h, p, good, bad, 2, [(0, (c0, c1, c2), ["members have different keys", keys[c0].key, keys[c2].key])])


def test_rule_3_pair_a_third_gather_overflows_a_cap_of_two():
    h = three_gathers([BF16] * 3)
    size = h.problem().collectives[0].size_bytes
    p = h.problem(max_bucket_memory_gb=2 * size / 1024**3)
    assert p.bucket_cap_bytes == 2 * size and {c.size_bytes for c in p.collectives} == {size}
    c0, c1, c2 = h.names["c0"], h.names["c1"], h.names["c2"]
    good = plan_for(p, [([c0, c1], c0, c1)])  # 2 * size: at the cap
    bad = plan_for(p, [([c0, c1, c2], c0, c1)])  # 3 * size: over it
    _pair(h, p, good, bad, 3, [(0, (c0, c1, c2), [f"{3 * size} bytes exceed the cap of {2 * size}"])])


def test_rule_4_pair_the_gather_whose_wait_hides_a_reduce_scatter_joins_a_bucket():
    def fn(g, x0, x1, x2):
        r = rs(g)
        s0, s1, s2 = ag(x0), ag(x1), ag(x2)
        w0, w1, w2 = wait(s0), wait(s1), wait(s2)
        return w0, w1, w2, wait(r)

    h = build(fn, [((64, 64), F32)] + [((8, 64), BF16)] * 3, {})
    # the reduce_scatter (c0) is fully hidden by the wait of the first gather (c1), as a wait on
    # another group would hide it
    from torch.utils._ordered_set import OrderedSet

    starts = sorted(h.collective_info, key=list(h.gm.graph.nodes).index)
    h.collective_info[starts[0]].hiding_nodes = OrderedSet([h.collective_info[starts[1]].wait_node])
    h.collective_info[starts[0]].exposed_time_ms = 0.0
    p = h.problem()
    c1, c2, c3 = h.names["c1"], h.names["c2"], h.names["c3"]
    assert _collectives(p)[h.names["c0"]].hiding == (_collectives(p)[c1].wait,)
    good = plan_for(p, [([c2, c3], c2, c3)])
    # adding c1: the bucket still starts after the reduce_scatter and waits after its hider
    # (rules 7 and 8 hold); only the hider merging breaks a rule
    bad = plan_for(p, [([c1, c2, c3], c2, c3)])
    _pair(h, p, good, bad, 4, [(0, (c1,), [f"['{c1}'] hide another collective"])])


def test_rule_5_pair_a_start_anchor_outside_the_bucket():
    h = two_exposed_gathers()
    p = h.problem()
    a, b = h.names["c0"], h.names["c1"]
    good = plan_for(p, [([a], a, a)])
    bad = planner.Plan.model_construct(problem_fingerprint=p.fingerprint, planner="hand", created="t", params={},
                                       buckets=(planner.Bucket.model_construct(members=(a,), start=b, wait=a),),
                                       schema_version=1)
    _pair(h, p, good, bad, 5, [(0, (b,), [f"start anchor {b} is not a member"])])


def test_rule_6_pair_a_gather_fed_by_another_gathers_output_joins_its_bucket():
    def fn(x0, x2, a):
        w0 = wait(ag(x0))
        w1 = wait(ag(torch.mm(w0, a)[:8]))  # c1's input is computed from c0's output
        w2 = wait(ag(x2))
        return w1, w2

    h = build(fn, [((8, 64), BF16), ((8, 64), BF16), VEC], {})
    p = h.problem()
    c0, c1, c2 = h.names["c0"], h.names["c1"], h.names["c2"]
    good = plan_for(p, [([c1, c2], c1, c2)])  # c2 issued earlier, c1 waited later: independent
    bad = plan_for(p, [([c0, c1, c2], c1, c2)])
    # a member's start after another member's wait is also a cycle in the final order (rule 9:
    # the merged wait of c0 now comes after the mm that consumes it)
    _pair(h, p, good, bad, 6, [(0, (c0, c1), [f"{c1} depends on the wait of {c0}"])], rules={6, 9})


def test_rule_7_pair_the_wait_anchor_cuts_off_a_hiding_mm():
    h = two_hidden_gathers()
    p = h.problem()
    a, b = h.names["c0"], h.names["c1"]
    hiders = list(_collectives(p)[b].hiding)
    assert len(hiders) == 1
    good = plan_for(p, [([a, b], a, b)])
    bad = plan_for(p, [([a, b], a, a)])  # the merged wait at ag0's: before mm1, which hides ag1
    _pair(h, p, good, bad, 7, [(0, (b,), [f"hiding node(s) {hiders} of {b} are not between"])])


def test_rule_8_pair_a_bucket_spans_a_hidden_reduce_scatter_it_did_not_span_before():
    def fn(x0, x1, x2, g, a):
        s0 = ag(x0)
        m0 = torch.mm(a, a)
        w0 = wait(s0)
        r = rs(g)
        s1 = ag(x1)
        m1 = torch.mm(m0, a)
        w1 = wait(s1)
        wr = wait(r)
        w2 = wait(ag(x2))
        return torch.mm(w0, w1), m1, wr, w2

    # c0 = ag0 hidden by mm0; c1 = the reduce_scatter and c2 = ag1, both hidden by mm1; c3 exposed
    h = build(fn, [((8, 64), BF16)] * 3 + [((64, 64), BF16), VEC],
              {0: ([0], "hidden"), 1: ([1], "hidden"), 2: ([1], "hidden")})
    p = h.problem()
    c0, c1, c2, c3 = (h.names[f"c{k}"] for k in range(4))
    (mm1,) = _collectives(p)[c1].hiding
    # ag1 + ag2: issued after the reduce_scatter, waited after mm1 -- neither situation
    good = plan_for(p, [([c2, c3], c2, c3)])
    # ag0 + ag1: issued at ag0, before the reduce_scatter, and waited at ag1's wait, after mm1:
    # the bucket holds the stream while mm1 runs (situation A), which no member did before
    bad = plan_for(p, [([c0, c2], c0, c2)])
    _pair(h, p, good, bad, 8, [(0, (c0, c2, c1), [f"bucket issued before {c1} is still on the stream at its "
                                                  f"hiding node {mm1}"])])


def test_rule_9_pair_the_merged_wait_before_the_merged_start():
    h = two_exposed_gathers()
    p = h.problem()
    a, b = h.names["c0"], h.names["c1"]
    ca, cb = _collectives(p)[a], _collectives(p)[b]
    assert ca.wait_pos < cb.start_pos
    good = plan_for(p, [([a, b], b, b)])
    bad = plan_for(p, [([a, b], b, a)])  # issued at ag1's start, waited at ag0's earlier wait
    # each member's start -> wait dependency is broken, in schedule order of the waits
    _pair(h, p, good, bad, 9, [
        (0, (a,), [f"{a} must run before {ca.wait}, but the plan puts it at position {cb.start_pos} and "
                   f"{ca.wait} at {ca.wait_pos}"]),
        (0, (b,), [f"{b} must run before {cb.wait}, but the plan puts it at position {cb.start_pos} and "
                   f"{cb.wait} at {ca.wait_pos}"]),
    ])


def test_rule_10_pair_a_gather_issued_early_beyond_a_budget():
    h = two_exposed_gathers()
    p = h.problem()
    a, b = h.names["c0"], h.names["c1"]
    ca, cb = _collectives(p)[a], _collectives(p)[b]
    size = p.memory.buffers[b].out_bytes  # ag1's gathered output, as torch's estimator sizes it
    assert size > 0 and ca.wait_pos < cb.start_pos
    # issued at ag1's start: ag0 is issued later, which holds nothing (its output is allocated
    # later); waited at ag1's wait: a wait moved later holds nothing either
    good = plan_for(p, [([a, b], b, b)])
    # issued at ag0's start: ag1's output is allocated early, from ag0's start to its own
    bad = plan_for(p, [([a, b], a, b)])
    _pair(h, p, good, bad, 10, [(None, (b,), [f"{size} extra bytes alive from position {ca.start_pos}",
                                             f"exceed the budget of {size - 1}"])],
          applies=False, memory_budget_bytes=size - 1)
    assert verify(p, bad, memory_budget_bytes=size) == []  # at the budget is within it
