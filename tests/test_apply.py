"""``fxglue.apply.apply_plan`` itself: a plan realized on a hand-made graph in every bucket mode,
and torch's control dependencies pinning the final order.

Where else ``apply_plan`` is tested (tests/README.md): rule by rule, agreeing with the verifier
and leaving the graph untouched when it refuses (test_rules.py); on random graphs and on gloo
ranks (test_fuzz.py); on mutants of solved plans (test_mutants.py); on torch's greedy plans of
the built-in workloads (test_greedy_plans.py); the copies it inserts against what the problem
charges (test_costs.py).
"""

from __future__ import annotations

import pytest
import torch

from fxglue.apply import apply_plan
from planner.rules.verifier import verify
from tests.handmade import ag, apply_and_count, build, plan_for, rs, two_hidden_gathers, wait

F32 = torch.float32


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
    assert apply_and_count(h, plan, p, bucket_mode=mode) == 1


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


def _prefetch_graph():
    """mm0 and mm1 run first; the two gathers are scheduled after them, the second gather's shard
    is a view produced after mm0 (an unpinned input the start must bring along)."""
    bf16 = torch.bfloat16

    def fn(x0, x1, a):
        m0 = torch.mm(a, a)
        m1 = torch.mm(m0, a)
        shard = x1.view(8, 64)
        s0 = ag(x0)
        s1 = ag(shard)
        return torch.mm(wait(s0), wait(s1)), m1

    return build(fn, [((8, 64), bf16), ((8, 64), bf16), ((64, 64), bf16)], {})


def test_a_positioned_bucket_is_merged_where_it_is_named_with_its_inputs():
    import planner

    h = _prefetch_graph()
    p = h.problem()
    a, b = h.names["c0"], h.names["c1"]
    mm0 = next(n.name for n in p.nodes if n.kind == "compute")
    plan = planner.Plan(problem_fingerprint=p.fingerprint, planner="hand", created="t", params={"keep_overlap": False},
                        buckets=(planner.Bucket(members=(a, b), start=a, wait=a, issue_before=mm0),))
    assert verify(p, plan, keep_overlap=False) == []
    assert apply_and_count(h, plan, p) == 1
    order = [n for n in h.gm.graph.nodes]
    start = next(n for n in order if "all_gather" in str(n.target))
    index = {n: i for i, n in enumerate(order)}
    first_mm = next(n for n in order if n.target is torch.ops.aten.mm.default)
    assert index[start] < index[first_mm]  # issued before mm0, as named
    # the shard's view was traced after mm1: it came along, ahead of the start that needs it
    views = [n for n in order if n.target is torch.ops.aten.view.default and n.args[0].op == "placeholder"]
    assert views and all(index[v] < index[first_mm] for v in views)
