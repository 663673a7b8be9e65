"""planner.search.free.gather_split.best_split: the split of a chain of gathers issued together that the
simulator finds fastest, checked against every split into consecutive buckets simulated by
``planner.simulate``; and the positioned search starts from it."""

from __future__ import annotations

import itertools
import random
import time

import pytest

import planner
from planner.core.options import PositionSearchOptions
from planner.search.free.gather_split import ChainCosts, best_split
from planner.search.free.position_search import position_search, positioned_policy


def gather_chain(sizes: list[int], compute_ms: list[float], latency_ms: float = 1.0,
                 bandwidth_gbps: float = 0.05) -> planner.Problem:
    """All gathers started at the top of the step (``s0 .. s{n-1}``), then per gather its wait and
    the compute that consumes it (``w{i}``, ``mm{i}``): a forward whose weights arrive in order."""
    n = len(sizes)
    N = planner.Node
    nodes = [N(name=f"s{i}", kind="start", pos=i, est_ms=0.0) for i in range(n)]
    colls = []
    for i, (size, ms) in enumerate(zip(sizes, compute_ms)):
        w = len(nodes)
        nodes.append(N(name=f"w{i}", kind="wait", pos=w, est_ms=0.0, deps=(i,)))
        nodes.append(N(name=f"mm{i}", kind="compute", pos=w + 1, est_ms=ms, deps=(w,) + ((w - 1,) if i else ())))
        colls.append(planner.Collective(name=f"s{i}", wait=f"w{i}", kind="all_gather", pg="0", key="ag/0",
                                        dtype="bfloat16", size_bytes=size, wire_bytes=size, est_ms=1.0,
                                        exposed_ms=1.0, start_pos=i, wait_pos=w, status="exposed"))
    link = planner.Link(pg="0", group_size=2, latency_ms=latency_ms, bandwidth_gbps=bandwidth_gbps)
    return planner.Problem(schema_version=2, bucket_mode="default", bucket_cap_bytes=1 << 30,
                           n_scheduled=len(nodes), collectives=tuple(colls), nodes=tuple(nodes), timelines=(),
                           links=(link,)).with_fingerprint()


def issued_at_the_top(problem: planner.Problem, groups: list[list[str]]) -> planner.Plan:
    buckets = tuple(planner.Bucket(members=tuple(g), start=g[0], wait=g[0], issue_before="s0") for g in groups)
    return planner.Plan(problem_fingerprint=problem.fingerprint, planner="t", created="t", buckets=buckets)


def consecutive_splits(names: list[str]):
    for cuts in itertools.product((False, True), repeat=len(names) - 1):
        groups, current = [], [names[0]]
        for name, cut in zip(names[1:], cuts):
            if cut:
                groups.append(current)
                current = []
            current.append(name)
        yield groups + [current]


@pytest.mark.parametrize("seed", range(12))
def test_the_best_split_is_the_fastest_consecutive_split_the_simulator_finds(seed):
    """Random chains of 6 gathers (sizes 1-100 kB at 50 kB/ms and 1 ms a bucket, 0.1-3 ms of
    compute per consumer): the split ``best_split`` picks simulates exactly as fast as the fastest
    of all 32 splits into consecutive buckets, each issued at the top and waited before its first
    consumer."""
    rng = random.Random(seed)
    sizes = [rng.randint(1_000, 100_000) for _ in range(6)]
    compute = [round(rng.uniform(0.1, 3.0), 2) for _ in range(6)]
    problem = gather_chain(sizes, compute)
    names = [c.name for c in problem.collectives]
    rules = positioned_policy(None).as_params()
    steps = []
    for groups in consecutive_splits(names):
        plan = issued_at_the_top(problem, groups)
        assert not planner.verify(problem, plan, **rules)
        steps.append(planner.simulate(problem, plan).step_ms)
    chosen = best_split(ChainCosts(problem), list(reversed(names)))
    assert sorted(m for g in chosen for m in g) == sorted(names)
    assert planner.simulate(problem, issued_at_the_top(problem, chosen)).step_ms == pytest.approx(min(steps), abs=1e-9)


def test_the_positioned_search_splits_a_chain_of_gathers_issued_together():
    """From a plan whose gathers are all alone and issued at the top (the chain the search levels
    off with on an FSDP forward), the positioned search's seeds include the best split of that
    chain, so within 20 evaluations it returns a plan as fast as the fastest consecutive split
    (5.1 ms: the first four, then the last two; alone 8.7, all in one bucket 5.9)."""
    problem = gather_chain([40_000, 40_000, 10_000, 80_000, 20_000, 60_000], [0.5, 0.2, 0.8, 0.3, 0.4, 0.2])
    names = [c.name for c in problem.collectives]
    best = min(planner.simulate(problem, issued_at_the_top(problem, g)).step_ms for g in consecutive_splits(names))
    alone = issued_at_the_top(problem, [[m] for m in names])
    assert planner.simulate(problem, alone).step_ms > best + 1.0
    result = position_search(problem, [alone], PositionSearchOptions(max_evaluations=20, per_block=False),
                             peak_memory_bytes=None, deadline=time.perf_counter() + 60)
    assert result.objective <= best + 1e-9


def test_the_split_takes_gathers_issued_at_one_time_and_keeps_the_later_ones_behind():
    """The same chain, alone and issued at the top, but the last gather anchored at its own start
    (no compute lies between the places, so it is issued at the same time) and first in the plan
    (buckets issued at one time go on the stream in the plan's order): the split takes all six,
    puts them back in the order due where the first of them stood, and reaches the fastest
    consecutive split (5.1 ms) within 20 evaluations."""
    problem = gather_chain([40_000, 40_000, 10_000, 80_000, 20_000, 60_000], [0.5, 0.2, 0.8, 0.3, 0.4, 0.2])
    names = [c.name for c in problem.collectives]
    best = min(planner.simulate(problem, issued_at_the_top(problem, g)).step_ms for g in consecutive_splits(names))
    last_first = planner.Plan(problem_fingerprint=problem.fingerprint, planner="t", created="t",
                              buckets=(planner.Bucket(members=("s5",), start="s5", wait="s5"),
                                       *issued_at_the_top(problem, [[m] for m in names[:5]]).buckets))
    assert not planner.verify(problem, last_first, **positioned_policy(None).as_params())
    assert planner.simulate(problem, last_first).step_ms > best + 1.0
    result = position_search(problem, [last_first], PositionSearchOptions(max_evaluations=20, per_block=False),
                             peak_memory_bytes=None, deadline=time.perf_counter() + 60)
    assert result.objective <= best + 1e-9


def test_gathers_prefetched_a_block_ahead_are_lifted_to_the_top_and_split():
    """The same chain, each gather alone and issued just before the previous one's wait (a block
    ahead, as torch's manual pass and the per-block seed prefetch; compute lies between those
    places, so no chain is issued at one time): the search lifts them all to where the first is
    issued, splits them there and reaches the fastest consecutive split issued at the top (5.1 ms)
    within 20 evaluations (6.8 ms without the lift: one move at a time)."""
    problem = gather_chain([40_000, 40_000, 10_000, 80_000, 20_000, 60_000], [0.5, 0.2, 0.8, 0.3, 0.4, 0.2])
    names = [c.name for c in problem.collectives]
    best = min(planner.simulate(problem, issued_at_the_top(problem, g)).step_ms for g in consecutive_splits(names))
    ahead = planner.Plan(problem_fingerprint=problem.fingerprint, planner="t", created="t",
                         buckets=tuple(planner.Bucket(members=(m,), start=m, wait=m,
                                                      issue_before=f"w{i - 1}" if i else None)
                                       for i, m in enumerate(names)))
    assert not planner.verify(problem, ahead, **positioned_policy(None).as_params())
    assert planner.simulate(problem, ahead).step_ms > best + 1.0
    result = position_search(problem, [ahead], PositionSearchOptions(max_evaluations=20, per_block=False),
                             peak_memory_bytes=None, deadline=time.perf_counter() + 60)
    assert result.objective <= best + 1e-9
