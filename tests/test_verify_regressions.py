"""Shrunk counterexamples found by hypothesis, kept as regression tests."""

from __future__ import annotations

import planner
from planner.verifier import check


def _two_group_problem():
    c = dict(kind="all_gather", dtype="bfloat16", size_bytes=1024, wire_bytes=1024, est_ms=0.2, fsdp=False)
    colls = (
        planner.Collective(name="coll_0", wait="wait_0", pg="pg0", key="all_gather/pg0/bfloat16", exposed_ms=0.2,
                           start_pos=2, wait_pos=6, hiding=(), status="exposed", **c),
        planner.Collective(name="coll_1", wait="wait_1", pg="pg1", key="all_gather/pg1/bfloat16", exposed_ms=0.0,
                           start_pos=1, wait_pos=5, hiding=("mm_0",), status="hidden", **c),
        planner.Collective(name="coll_2", wait="wait_2", pg="pg0", key="all_gather/pg0/bfloat16", exposed_ms=0.2,
                           start_pos=0, wait_pos=3, hiding=(), status="exposed", **c),
    )
    N = planner.Node
    nodes = (N(name="coll_2", kind="start", pos=0, est_ms=0.1), N(name="coll_1", kind="start", pos=1, est_ms=0.1),
             N(name="coll_0", kind="start", pos=2, est_ms=0.1), N(name="wait_2", kind="wait", pos=3, est_ms=0, deps=(0,)),
             N(name="mm_0", kind="compute", pos=4, est_ms=0.1), N(name="wait_1", kind="wait", pos=5, est_ms=0, deps=(1,)),
             N(name="wait_0", kind="wait", pos=6, est_ms=0, deps=(2,)))
    links = tuple(planner.Link(pg=pg, group_size=2, latency_ms=0.02, bandwidth_gbps=50.0) for pg in ("pg0", "pg1"))
    return planner.Problem(bucket_mode="default", bucket_cap_bytes=65536, n_scheduled=7, collectives=colls,
                           nodes=nodes, timelines=(), links=links).with_fingerprint()


def test_bucket_mixing_process_groups_reports_rule_2_without_crashing():
    # found by test_cpsat_optimum_equals_brute_force_on_tiny_problems: the stream check indexed
    # buckets by their first member's group only and missed the hidden collective's group
    p = _two_group_problem()
    plan = planner.Plan(problem_fingerprint=p.fingerprint, planner="brute", created="t",
                        buckets=(planner.Bucket(members=("coll_0", "coll_1"), start="coll_0", wait="coll_0"),))
    rules = {v.rule for v in check(p, plan).violations}
    assert 2 in rules
