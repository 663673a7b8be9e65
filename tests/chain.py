"""A very long, valid problem for the verifier's memory: compute nodes in one chain, a few collectives.

``chain_problem(n)``: about ``n`` pinned nodes, ``mm_0 -> mm_1 -> ...``, and ``collectives``
all_gathers spaced evenly along it, each started right after one mm and waited right before a
later one (which then also consumes the wait). Neighbours overlap in time and do not depend on
each other; collective k + 2 starts after collective k's wait has been consumed, so it depends
on it. ``pairs_plan`` merges overlapping neighbours (feasible); ``chained_plan`` merges k and
k + 2 (rule 6: a member depends on another's wait).

Run ``python -m tests.chain N`` to print the peak RSS and wall time of ``planner.check`` on it.
"""

from __future__ import annotations

import planner


def chain_problem(n: int, collectives: int = 8) -> planner.Problem:
    N, C = planner.Node, planner.Collective
    n_compute = n - 2 * collectives
    step = n_compute // (collectives + 2)
    assert step >= 4, "too few nodes for that many collectives"
    starts = {(k + 1) * step: k for k in range(collectives)}  # start right after this mm
    waits = {(k + 1) * step + (3 * step) // 2: k for k in range(collectives)}  # wait right before this mm
    nodes: list = []
    colls: dict[int, dict] = {}
    prev = None  # index of the previous mm
    for j in range(n_compute):
        deps = () if prev is None else (prev,)
        if j in waits:
            k = waits[j]
            i = len(nodes)
            nodes.append(N(name=f"wait_{k}", kind="wait", pos=i, est_ms=0.0, deps=(colls[k]["start_idx"],)))
            colls[k].update(wait_pos=i)
            deps = (*deps, i)
        i = len(nodes)
        nodes.append(N(name=f"mm_{j}", kind="compute", pos=i, est_ms=0.01, deps=deps))
        prev = i
        if j in starts:
            k = starts[j]
            nodes.append(N(name=f"ag_{k}", kind="start", pos=i + 1, est_ms=0.0, deps=(i,)))
            colls[k] = {"start_idx": i + 1, "start_pos": i + 1}
    cs = tuple(C(name=f"ag_{k}", wait=f"wait_{k}", kind="all_gather", pg="0", key="all_gather/0/bfloat16",
                 dtype="bfloat16", size_bytes=1 << 20, wire_bytes=8 << 20, est_ms=0.5, exposed_ms=0.5,
                 start_pos=colls[k]["start_pos"], wait_pos=colls[k]["wait_pos"], status="exposed")
               for k in range(collectives))
    return planner.Problem(bucket_mode="default", bucket_cap_bytes=1 << 30, n_scheduled=len(nodes),
                           collectives=cs, nodes=tuple(nodes), timelines=(),
                           links=(planner.Link(pg="0", group_size=8, latency_ms=0.02, bandwidth_gbps=50.0),)
                           ).with_fingerprint()


def _plan(problem: planner.Problem, buckets) -> planner.Plan:
    return planner.Plan(problem_fingerprint=problem.fingerprint, planner="hand", created="test",
                        buckets=tuple(planner.Bucket(members=m, start=s, wait=w) for m, s, w in buckets))


def empty_plan(problem: planner.Problem) -> planner.Plan:
    return _plan(problem, ())


def pairs_plan(problem: planner.Problem) -> planner.Plan:
    """ag_0 + ag_1, ag_2 + ag_3, ...: issued at the later start, waited at the earlier wait."""
    k = len(problem.collectives)
    return _plan(problem, [((f"ag_{i}", f"ag_{i + 1}"), f"ag_{i + 1}", f"ag_{i}") for i in range(0, k - 1, 2)])


def chained_plan(problem: planner.Problem) -> planner.Plan:
    """ag_0 + ag_2: ag_2's start depends on ag_0's wait (rule 6, and rule 9 wherever it is anchored)."""
    return _plan(problem, [(("ag_0", "ag_2"), "ag_0", "ag_0")])


if __name__ == "__main__":
    import argparse
    import resource
    import time

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("n", type=int, help="pinned nodes")
    ap.add_argument("--plan", choices=["empty", "pairs", "chained"], default="empty")
    args = ap.parse_args()

    def rss_mb() -> float:  # peak RSS so far; Linux reports KiB
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    t0 = time.perf_counter()
    prob = chain_problem(args.n)
    plan = {"empty": empty_plan, "pairs": pairs_plan, "chained": chained_plan}[args.plan](prob)
    built_s, built_mb = time.perf_counter() - t0, rss_mb()
    t0 = time.perf_counter()
    report = planner.check(prob, plan)
    print(f"nodes {len(prob.nodes)} plan {args.plan}: build {built_s:.1f}s, peak RSS {built_mb:.0f} MB; "
          f"check {time.perf_counter() - t0:.1f}s, peak RSS {rss_mb():.0f} MB; "
          f"feasible {report.feasible} {report.by_rule()}")
