"""The feasibility rules on small hand-made graphs: verifier and apply_plan agree, rule by rule."""

from __future__ import annotations

import pytest
import torch

import planner
from fxglue.apply import PlanError, apply_plan
from fxglue.pipeline import count_collectives
from planner.verifier import check, verify
from tests.handmade import ag, ar, build, plan_for, rs, wait

BF16 = torch.bfloat16
F32 = torch.float32
VEC = ((64, 64), BF16)


def _apply(h, plan, problem, bucket_mode=None):
    with h.fake_mode:
        apply_plan(h.gm.graph, h.collective_info, h.scheduled, plan, problem=problem, bucket_mode=bucket_mode)
    h.gm.recompile()
    return sum(count_collectives(h.gm).values())


def _rejects(h, plan, problem, rule):
    """Both the verifier and apply_plan reject the plan, naming ``rule``; the graph is unchanged."""
    found = {v.rule for v in verify(problem, plan)}
    assert rule in found, found
    before = str(h.gm.graph)
    with pytest.raises(PlanError) as err:
        _apply(h, plan, problem)
    assert err.value.rule in found and f"rule {err.value.rule} " in str(err.value)
    assert str(h.gm.graph) == before
    return found


def two_hidden_gathers():
    """ag0 hidden by mm0, ag1 hidden by mm1; both gathers used at the end."""

    def fn(x0, x1, a):
        s0 = ag(x0)
        m0 = torch.mm(a, a)
        w0 = wait(s0)
        s1 = ag(x1)
        m1 = torch.mm(m0, a)
        w1 = wait(s1)
        return torch.mm(w0, w1), m1

    return build(fn, [((8, 64), BF16), ((8, 64), BF16), VEC], {0: ([0], "hidden"), 1: ([1], "hidden")})


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
    assert _apply(h, plan, p) == 1


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
    assert _apply(h, plan, p) == 2


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
        assert _apply(h, plan, p, bucket_mode=mode) == 1
    else:
        assert {v.rule for v in verify(p, plan)} == {2}


@pytest.mark.parametrize("mode", ["default", "custom_ops", "coalesced"])
def test_every_bucket_mode_applies_reduce_scatters(mode):
    def fn(x, y, a):
        s0 = rs(x)
        m = torch.mm(a, a)
        s1 = rs(y)
        return wait(s0), wait(s1), m

    h = build(fn, [((64, 64), F32), ((64, 64), F32), ((64, 64), F32)], {})
    p = h.problem(bucket_mode=mode)
    a, b = h.names["c0"], h.names["c1"]
    plan = plan_for(p, [([a, b], a, b)])
    assert verify(p, plan) == []
    assert _apply(h, plan, p, bucket_mode=mode) == 1


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


def test_insert_overlap_deps_pins_the_order_with_control_dependencies():
    h = two_hidden_gathers()
    p = h.problem()
    a, b = h.names["c0"], h.names["c1"]
    with h.fake_mode:
        apply_plan(h.gm.graph, h.collective_info, h.scheduled, plan_for(p, [([a, b], a, b)]), problem=p,
                   insert_overlap_deps=True)
    h.gm.graph.lint()
    targets = {str(n.target) for n in h.gm.graph.nodes}
    assert any("control_deps" in t for t in targets), targets
