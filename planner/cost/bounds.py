"""Valid lower bounds on the number of buckets, from relaxations of the rules.

Why this exists: when the full CP-SAT model is too large to build and solve in the time given,
``solve`` searches a restricted space (a candidate window) whose optimum is not a bound for the
problem. The bound reported then comes from here: every plan that passes the rules needs at
least this many buckets. It is also stated to the full model (per key), where it prunes and can
prove an incumbent optimal that the search alone cannot (a bin-packing argument is hard for
CP-SAT's linear relaxation: hf-qwen3-moe-8 with pre-bucketing, 20 against a bound of 18 after
60 s without it, 20 proved by it).

Per bucket key (buckets never mix keys):
- a collective whose start, wait or folded conversion hides a fully hidden collective is alone (rule 4);
- the others need at least as many buckets as a bin packing of their bytes into buckets of the
  cap (rule 3): ceil(total bytes / cap), raised by a small exact bin-packing model over the
  distinct sizes when first-fit decreasing does not already meet that;
- collectives whose possible start positions are pairwise disjoint open intervals cannot share
  a start, so they need distinct buckets; the same for wait positions (rules 7 and 9 fix the
  intervals: after the last fixed predecessor of the start, before the first hiding node of a
  fully hidden collective; after its last hiding node, before the first fixed consumer of the
  wait). The largest such set is found exactly by interval scheduling.
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from ortools.sat.python import cp_model

import planner.core.arguments as arguments
from planner.core.problem import Problem
from planner.cost.curves import curve

# Deterministic effort for one key's bin packing (CP-SAT's deterministic time, one worker: the
# bound is reproducible). Measured: the 8-layer MoE keys (4-5 distinct sizes, 27-53 items) prove
# in under 0.05 s; an unproved packing still yields CP-SAT's bound, which is valid.
BIN_PACKING_DETERMINISTIC_S = 2.0
BIN_PACKING_WALL_S = 20.0
# bucket_reach sums a grid of (start, wait) positions per bucket key and scans each collective's
# rectangle of it: quadratic memory and up to cubic time in the key's collectives. Measured on
# generated keys whose collectives all overlap: 2,000 collectives scan 2.7e9 cells in 3 s, 4,000
# scan 2.2e10 in 30 s, 8,000 need a 512 MB grid. Beyond these limits a key gets the bound by
# projection (_projected_reach); every committed problem stays within them (the largest,
# llama3-405b-fsdp-126 @ h100-64nodes: a 5.2e6-cell grid, 2.6e9 cells scanned, 0.2 s).
REACH_GRID_MAX_CELLS = 16_000_000
REACH_SCAN_MAX_CELLS = 3_000_000_000


def _max_disjoint(intervals: list[tuple[int, int]]) -> int:
    """Largest set of pairwise disjoint open intervals (a, b) (greedy by right end is optimal)."""
    count, last_end = 0, None
    for a, b in sorted(intervals, key=lambda iv: iv[1]):
        if last_end is None or a >= last_end - 1:  # open intervals on integers: (a,b) holds a+1..b-1
            if b - a >= 2:
                count += 1
                last_end = b
    return count


def _first_fit_decreasing(sizes: list[int], cap: int) -> int:
    free: list[int] = []
    for s in sorted(sizes, reverse=True):
        for k, room in enumerate(free):
            if s <= room:
                free[k] -= s
                break
        else:
            free.append(cap - s)
    return len(free)


def bin_packing_bound(sizes: list[int], cap: int, deadline: float | None = None) -> int:
    """Fewest buckets of ``cap`` bytes that hold items of these sizes -- or, when the small model
    is not proved within its effort, CP-SAT's bound on it, which is still a lower bound.
    ``deadline`` (``time.perf_counter()`` seconds): the search stops there too, and a bound
    asked for past it is the volume bound alone (a solve's time limit holds for its bounds).

    An item over the cap is a bucket of its own (the cap applies to merges only)."""
    over = sum(1 for s in sizes if s > cap)
    items = [s for s in sizes if s <= cap]
    if not items:
        return over
    by_volume = max(1, math.ceil(sum(items) / cap))
    upper = _first_fit_decreasing(items, cap)
    if upper <= by_volume:
        return over + upper
    wall_s = BIN_PACKING_WALL_S if deadline is None else min(BIN_PACKING_WALL_S, deadline - time.perf_counter())
    if wall_s <= 0:
        return over + by_volume
    counts: dict[int, int] = {}
    for s in items:
        counts[s] = counts.get(s, 0) + 1
    # bins x distinct sizes: how many items of each size a bin holds; used bins come first
    m = cp_model.CpModel()
    used = [m.new_bool_var(f"used[{b}]") for b in range(upper)]
    held = {(b, s): m.new_int_var(0, n if s == 0 else min(n, cap // s), f"n[{b},{s}]")
            for b in range(upper) for s, n in counts.items()}
    for s, n in counts.items():
        m.add(sum(held[b, s] for b in range(upper)) == n)
    for b in range(upper):
        m.add(sum(s * held[b, s] for s in counts) <= cap * used[b])
        if b:
            m.add_implication(used[b], used[b - 1])
    m.add(sum(used) >= by_volume)
    m.minimize(sum(used))
    solver = cp_model.CpSolver()
    solver.parameters.catch_sigint_signal = False  # Ctrl-C is ours (solver.run_search)
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = 0
    solver.parameters.max_deterministic_time = BIN_PACKING_DETERMINISTIC_S
    solver.parameters.max_time_in_seconds = wall_s
    code = solver.solve(m)
    if code == cp_model.OPTIMAL:
        return over + round(solver.objective_value)
    if code == cp_model.FEASIBLE or code == cp_model.UNKNOWN:
        return over + max(by_volume, math.ceil(solver.best_objective_bound - 1e-9))
    raise AssertionError(f"bin packing of {len(items)} items cannot be infeasible (status {solver.status_name(code)})")


def fixed_limits(problem: Problem) -> dict[str, tuple[int, int]]:
    """Per collective (start name): (position of the last fixed predecessor of its start, position
    of the first fixed consumer of its wait). Whatever a plan does, its final start lies after the
    first and its final wait before the second (rule 9): fixed nodes never move. A folded
    conversion moves with the start it feeds (``planner.core.positions``): its own inputs bound it."""
    index = {n.name: i for i, n in enumerate(problem.nodes)}
    pos = [n.pos for n in problem.nodes]
    succ: dict[int, list[int]] = {}
    for i, n in enumerate(problem.nodes):
        for d in n.deps:
            succ.setdefault(d, []).append(i)
    moving = {index[f] for c in problem.collectives for f in c.folded}
    out = {}
    for c in problem.collectives:
        inputs = [d for d in problem.nodes[index[c.name]].deps if d not in moving]
        inputs += [e for d in problem.nodes[index[c.name]].deps if d in moving for e in problem.nodes[d].deps]
        s_lo = max((pos[d] for d in inputs if problem.nodes[d].kind not in ("start", "wait")), default=-1)
        w_hi = min((pos[t] for t in succ.get(index[c.wait], []) if problem.nodes[t].kind != "start" and t not in moving),
                   default=problem.n_scheduled + 1)
        out[c.name] = (s_lo, w_hi)
    return out


def lower_bound(problem: Problem, objective: str = "count", protect_partly: bool = False) -> float:
    """A lower bound on ``objective`` valid for every feasible plan.

    For ``exposure`` (exposure x (n+1) + count, see planner.search.cpsat.TimeTerms) only the count part is
    bounded: exposure can be zero as far as this bound knows.
    """
    arguments.problem_and_plan(problem, None, optional=True)
    if objective not in ("count", "exposure"):
        raise ValueError(f"objective must be 'count' or 'exposure' (a step bound is planner.cost.bounds.step_floor), "
                         f"not {objective!r}")
    arguments.flag(protect_partly, "protect_partly")
    return float(sum(key_lower_bounds(problem, protect_partly).values()))


def merge_intervals(problem: Problem, protect_partly: bool = False) -> dict[str, tuple[int, int, int, int, bool]]:
    """Per collective (start name): ``(s_lo, s_hi, w_lo, w_hi, alone)``. Whatever a plan does, the
    collective's bucket starts at a position in the open interval (s_lo, s_hi) and is waited in
    (w_lo, w_hi) (rule 9: after the last fixed predecessor of the start, before the first fixed
    consumer of the wait; rule 7: a protected collective starts before its first hiding node and
    is waited after its last, of those that do not move); ``alone``: its start or wait hides a
    fully hidden collective, so it is never merged (rule 4). A folded conversion moves with its
    bucket's start (``planner.core.positions``), so it bounds nothing here."""
    index = {n.name: i for i, n in enumerate(problem.nodes)}
    pos = [n.pos for n in problem.nodes]
    limits = fixed_limits(problem)
    protected_hiders = {h for c in problem.collectives if c.status == "hidden" for h in c.hiding}
    folded = {f for c in problem.collectives for f in c.folded}
    out = {}
    for c in problem.collectives:
        s_lo, w_hi = limits[c.name]
        is_protected = c.status == "hidden" or (protect_partly and c.status == "partly")
        hp = sorted(pos[index[h]] for h in c.hiding if h not in folded) if is_protected else []
        out[c.name] = (s_lo, hp[0] if hp else w_hi, hp[-1] if hp else s_lo, w_hi,
                       any(n in protected_hiders for n in (c.name, c.wait)))
    return out


def _by_key(problem: Problem) -> dict[tuple, list]:
    """The collectives per bucket key (kind, process group, key): buckets never mix keys."""
    groups: dict[tuple, list] = {}
    for c in problem.collectives:
        groups.setdefault((c.kind, c.pg, c.key), []).append(c)
    return groups


def key_lower_bounds(problem: Problem, protect_partly: bool = False, deadline: float | None = None) -> dict[tuple, int]:
    """Per bucket key (kind, process group, key): the fewest buckets any feasible plan leaves.
    ``deadline``: as ``bin_packing_bound``'s (the bounds may only be looser for it)."""
    arguments.problem_and_plan(problem, None, optional=True)
    arguments.flag(protect_partly, "protect_partly")
    arguments.deadline(deadline, optional=True)
    intervals = merge_intervals(problem, protect_partly)
    out: dict[tuple, int] = {}
    for group_key, cs in _by_key(problem).items():
        alone = [c for c in cs if intervals[c.name][4]]
        rest = [c for c in cs if not intervals[c.name][4]]
        need = len(alone)
        if rest:
            starts = [intervals[c.name][0:2] for c in rest]
            waits = [intervals[c.name][2:4] for c in rest]
            by_interval = max(_max_disjoint(starts), _max_disjoint(waits), 1)
            need += max(by_interval, bin_packing_bound([c.size_bytes for c in rest], problem.bucket_cap_bytes,
                                                       deadline))
        out[group_key] = need
    return out


@dataclass(frozen=True)
class BucketReach:
    """The most wire bytes a bucket can have: ``member[name]`` over buckets holding the
    collective, ``anchored[name]`` over buckets issued at its start (it anchors them)."""

    member: dict[str, int]
    anchored: dict[str, int]


def bucket_reach(problem: Problem) -> BucketReach:
    """How large a bucket can get, from the positions the rules leave each collective
    (``merge_intervals``) and the cap.

    A bucket is issued at one member's start position X and waited at one member's wait position
    Y, and X lies in every member's start interval and Y in every member's wait interval; so a
    bucket issued at X and waited at Y holds at most the collectives of its key whose intervals
    contain both (``Tot[X, Y]``, summed from a 2-D difference array per key). Its members' sizes fit the cap
    (rule 3), so its wire bytes are at most the cap times the key's largest wire/size ratio.
    A collective that stays alone reaches its own bytes. Superset arguments only: every feasible
    bucket is within reach (tested against the verifier's plans)."""
    intervals = merge_intervals(problem)
    member: dict[str, int] = {}
    anchored: dict[str, int] = {}
    for cs in _by_key(problem).values():
        xs = sorted({c.start_pos for c in cs})
        ys = sorted({c.wait_pos for c in cs})
        spans = []
        for c in cs:
            s_lo, s_hi, w_lo, w_hi, _ = intervals[c.name]
            spans.append((bisect.bisect_right(xs, s_lo), bisect.bisect_left(xs, s_hi),
                          bisect.bisect_right(ys, w_lo), bisect.bisect_left(ys, w_hi)))
        # the same members' sizes fit the cap (see below)
        ratio = max((c.wire_bytes / c.size_bytes for c in cs if c.size_bytes > 0), default=0.0)
        capped = problem.bucket_cap_bytes * ratio + sum(c.wire_bytes for c in cs if c.size_bytes == 0)
        scanned = sum(max(0, x1 - x0) * max(0, y1 - y0) for c, (x0, x1, y0, y1) in zip(cs, spans)
                      if not intervals[c.name][4])
        if (len(xs) + 1) * (len(ys) + 1) > REACH_GRID_MAX_CELLS or scanned > REACH_SCAN_MAX_CELLS:
            _projected_reach(cs, spans, [intervals[c.name][4] for c in cs], xs, capped, member, anchored)
            continue
        # bytes of the key's collectives that can sit in a bucket at (X, Y): each adds its bytes
        # to a rectangle of positions (a 2-D difference array, summed along both axes)
        tot = np.zeros((len(xs) + 1, len(ys) + 1))
        for c, (x0, x1, y0, y1) in zip(cs, spans):
            if not intervals[c.name][4] and x1 > x0 and y1 > y0:
                tot[x0, y0] += c.wire_bytes
                tot[x0, y1] -= c.wire_bytes
                tot[x1, y0] -= c.wire_bytes
                tot[x1, y1] += c.wire_bytes
        tot = tot.cumsum(axis=0).cumsum(axis=1)
        # members' sizes fit the cap, so their wire bytes fit the cap times the largest ratio
        # (``ratio``, ``capped`` above); a member of size 0 fits any bucket, its wire bytes on top
        for c, (x0, x1, y0, y1) in zip(cs, spans):
            if intervals[c.name][4] or x1 <= x0 or y1 <= y0:
                member[c.name] = anchored[c.name] = c.wire_bytes
                continue
            x = bisect.bisect_left(xs, c.start_pos)
            most = float(tot[x0:x1, y0:y1].max())
            own = float(tot[x, y0:y1].max()) if x0 <= x < x1 else 0.0
            member[c.name] = max(c.wire_bytes, math.ceil(min(most, capped)))
            anchored[c.name] = max(c.wire_bytes, math.ceil(min(own, capped)))
    return BucketReach(member, anchored)


def _projected_reach(cs: list, spans: list[tuple[int, int, int, int]], alone: list[bool], xs: list[int],
                     capped: float, member: dict[str, int], anchored: dict[str, int]) -> None:
    """``bucket_reach`` for one key whose grid is too large to sum (REACH_GRID_MAX_CELLS,
    REACH_SCAN_MAX_CELLS): the same superset argument on each axis alone. The members of a bucket
    holding c have start ranges that meet c's (they share the start position) and wait ranges that
    meet c's, so its bytes are at most the smaller of the two sums of the collectives whose range
    meets c's; one issued at c's own start holds only collectives whose start range contains it.
    Looser than the grid's bound where both ranges are wide, valid all the same; sorted prefix sums
    make it O(n log n) in the key's collectives (a 4,000-collective key took the grid 30 s)."""
    live = [k for k, c in enumerate(cs) if not alone[k] and spans[k][1] > spans[k][0] and spans[k][3] > spans[k][2]]
    wire = np.array([cs[k].wire_bytes for k in live], dtype=np.float64)

    def meeting(lo_col: int, hi_col: int):
        """For half-open ranges [lo, hi) of the live collectives: per query range, the wire bytes of
        those whose range meets it (lo' < hi and hi' > lo), and of those containing a point."""
        lo = np.array([spans[k][lo_col] for k in live], dtype=np.int64)
        hi = np.array([spans[k][hi_col] for k in live], dtype=np.int64)
        by_lo, by_hi = np.argsort(lo, kind="stable"), np.argsort(hi, kind="stable")
        lo_sorted, hi_sorted = lo[by_lo], hi[by_hi]
        lo_sum = np.concatenate(([0.0], np.cumsum(wire[by_lo])))
        hi_sum = np.concatenate(([0.0], np.cumsum(wire[by_hi])))

        def meets(q_lo: int, q_hi: int) -> float:  # started before q_hi, less those ended by q_lo
            return float(lo_sum[np.searchsorted(lo_sorted, q_hi, "left")] - hi_sum[np.searchsorted(hi_sorted, q_lo, "right")])

        def contains(x: int) -> float:  # started at or before x, less those ended by then
            return float(lo_sum[np.searchsorted(lo_sorted, x, "right")] - hi_sum[np.searchsorted(hi_sorted, x, "right")])

        return meets, contains

    starts_meeting, starts_containing = meeting(0, 1)
    waits_meeting, _ = meeting(2, 3)
    for k, c in enumerate(cs):
        x0, x1, y0, y1 = spans[k]
        if alone[k] or x1 <= x0 or y1 <= y0:
            member[c.name] = anchored[c.name] = c.wire_bytes
            continue
        by_waits = waits_meeting(y0, y1)
        most = min(starts_meeting(x0, x1), by_waits)
        x = bisect.bisect_left(xs, c.start_pos)
        own = min(starts_containing(x), by_waits) if x0 <= x < x1 else 0.0
        member[c.name] = max(c.wire_bytes, math.ceil(min(most, capped)))
        anchored[c.name] = max(c.wire_bytes, math.ceil(min(own, capped)))


def per_byte_floor(link, kind: str) -> Callable[[int], float]:
    """``least(M)``: inf over 0 < b <= M of time(b) / b, so a bucket of at most M bytes costs at
    least ``least(M)`` per byte it carries. The curve is linear between breakpoints (c + s*b, whose
    c/b + s is monotone), so the infimum is at a breakpoint or at M (no concavity needed). The
    running minimum over the breakpoints is computed once (torch's NCCL tables have ~600 points
    per kind, and a 405B problem 3,410 collectives to price)."""
    points = curve(link, kind).bends(0)
    bs = np.array(points, dtype=float)
    best = np.minimum.accumulate([link.time_ms(kind, b) / b for b in points]) if points else np.array([])

    def least(most_bytes: int) -> float:
        if most_bytes <= 0:
            return 0.0
        at_most = link.time_ms(kind, most_bytes) / most_bytes
        k = int(np.searchsorted(bs, most_bytes, side="left"))  # breakpoints strictly below most_bytes
        return min(at_most, float(best[k - 1])) if k else at_most

    return least


# Units a bucket's bytes are counted in by ``bucket_stream_floor``: a bucket of the largest size
# spans this many, so rounding to a unit costs at most one unit's time per bucket (measured: the
# h100 tables' 2 GiB buckets, 1 MiB units, about 0.01 ms). The least-time table covers this many
# of the largest buckets; beyond it the floor stays at its last value (still a floor: more bytes
# never take less time), where the per-byte price takes over.
BUCKET_UNITS = 2048
BUCKET_FLOOR_BUCKETS = 16


def _least_time_per_unit_count(link, kind: str, unit: int, largest: int) -> np.ndarray:
    """``cost[p - 1]``: the least time of a bucket of ``kind`` whose wire bytes b span p units
    (ceil(b / unit) = p, b in [(p - 1)*unit + 1, p*unit]) and are at most ``largest``, for
    p = 1 .. ceil(largest / unit). The curve is linear between breakpoints, so the least of an
    interval is at its ends or a breakpoint inside."""
    spans = -(-largest // unit)
    lo = np.arange(spans, dtype=np.int64) * unit + 1
    hi = np.minimum(np.arange(1, spans + 1, dtype=np.int64) * unit, largest)
    cost = np.minimum([link.time_ms(kind, int(b)) for b in lo], [link.time_ms(kind, int(b)) for b in hi])
    for b in curve(link, kind).bends(0, largest + 1):
        p = -(-int(b) // unit)
        cost[p - 1] = min(cost[p - 1], link.time_ms(kind, int(b)))
    return cost


def bucket_stream_floor(link, kind: str, largest: int, total: int) -> Callable[[np.ndarray], np.ndarray]:
    """``floor(X)``: a floor of the stream time of any buckets of ``kind`` on ``link``, each of at
    most ``largest`` wire bytes, that carry ``X`` wire bytes or more in all (vectorized over X).

    Why this exists: pricing each byte at the best per-byte time of the largest bucket
    (``per_byte_floor``) says 34 MB cost 0.36 ms on the h100-8nodes table, but any bucket carrying
    them takes at least 0.98: a stream that must deliver little, soon (the first gather of the
    step, the last reduce), pays for a small bucket. This is the least over every way to split X
    into buckets, found on a grid of units: a bucket spanning p units (ceil(bytes / unit) = p)
    costs at least ``cost[p - 1]`` (``_least_time_per_unit_count``), and buckets carrying X bytes
    span at least ceil(X / unit) units; ``least[n]`` is the least cost of buckets spanning n
    units or more (an unbounded knapsack, then a running minimum from the right). Exact when a
    unit is one byte; else each bucket is priced at the least of its unit's sizes. No concavity of
    the curve is assumed (torch's tables have steps)."""
    if largest <= 0 or total <= 0:
        return lambda x: np.zeros(np.shape(x))
    unit = max(1, math.ceil(largest / BUCKET_UNITS))
    cost = _least_time_per_unit_count(link, kind, unit, largest)
    parts = len(cost)  # a bucket spans 1 .. parts units
    most = min(-(-total // unit), BUCKET_FLOOR_BUCKETS * parts)
    # the cheapest buckets spanning n units or more span fewer than n + parts (drop any bucket and
    # they would still span n otherwise): exact spans up to most + parts cover every n <= most
    least = np.full(most + parts + 1, np.inf)
    least[0] = 0.0
    for n in range(1, most + parts + 1):
        k = min(n, parts)
        least[n] = float(np.min(least[n - k:n][::-1] + cost[:k]))
    least = np.minimum.accumulate(least[::-1])[::-1]

    def floor(x: np.ndarray) -> np.ndarray:
        n = -np.floor_divide(-np.asarray(x, dtype=np.int64), unit)  # ceil(x / unit)
        return least[np.minimum(n, most)]

    return floor


def pipeline_end_floor(link, kind: str, largest: int, consumers: list[tuple[float, int]]) -> float | None:
    """A floor of max_j (S_j + tail_j) over every way one FIFO stream, starting at 0, can carry the
    bytes of ``consumers`` (in the order they are due: (tail_j, bytes due there)) in buckets of
    ``kind`` of at most ``largest`` wire bytes, where S_j is when the bucket carrying consumer j's
    last byte ends: the end of the step, when each consumer j then still needs ``tail_j`` of compute.

    Why this exists: ``bucket_stream_floor`` prices each cut with the best split of its own bytes,
    but one split serves every consumer of a chain: big buckets are cheap per byte and make the
    first consumers wait, small ones are dear (the forward of an FSDP step: its gathers, all
    released at the top, are a pipeline). Relaxed so it holds for every plan: bytes divisible and
    carried in the order they are due (an exchange that keeps every bucket's size only brings a
    consumer's bytes sooner), other traffic on the stream dropped. Exact on a grid of units:
    after buckets carrying B bytes, floor(B / unit) units are carried, so a bucket of b bytes
    advances p units with b in ((p - 1)*unit, (p + 1)*unit), priced at the least time there or at
    any more units (a bucket cut at the last consumer is priced no higher than the whole); a
    consumer counts as served once floor(its cumulative bytes / unit) units are, no later than in
    the plan. ``V[n] = min_p cost(p) + max(tail of the first consumer served by it, V[n + p])``.
    None when the chain spans more than ``BUCKET_FLOOR_BUCKETS`` of the largest buckets."""
    unit = max(1, math.ceil(largest / BUCKET_UNITS))
    served = np.cumsum([b for _, b in consumers]) // unit  # units carried once each consumer is served
    tails = np.array([t for t, _ in consumers], dtype=float)
    n_units = int(served[-1]) if len(served) else 0
    if n_units == 0 or largest <= 0:
        return 0.0 if n_units == 0 else None
    by_count = _least_time_per_unit_count(link, kind, unit, largest)  # bytes in [(q - 1)*unit + 1, q*unit]
    most = largest // unit + 1  # units one bucket can advance
    if n_units > BUCKET_FLOOR_BUCKETS * most:
        return None
    spans = len(by_count)
    advance = np.array([min(by_count[p - 1] if p <= spans else math.inf, by_count[p] if p < spans else math.inf)
                        for p in range(1, most + 1)])
    advance = np.minimum.accumulate(advance[::-1])[::-1]  # or any more units
    value = np.full(n_units + 1, math.inf)
    value[n_units] = 0.0
    for n in range(n_units - 1, -1, -1):
        ends = np.arange(n + 1, min(n_units, n + most) + 1)
        first = int(np.searchsorted(served, n, side="right"))  # the first consumer not yet served at n
        cover = np.where(ends >= served[first], tails[first], 0.0)
        value[n] = float(np.min(advance[ends - n - 1] + np.maximum(cover, value[ends])))
    return float(value[0])


def per_byte_floors(problem: Problem) -> dict[tuple[str, str], Callable[[int], float]]:
    """``per_byte_floor`` of every (process group, kind) the problem has, each computed once."""
    return {(pg, kind): per_byte_floor(problem.link(pg), kind) for pg, kind in {(c.pg, c.kind) for c in problem.collectives}}


def priced_bytes(problem: Problem, reach: BucketReach | None = None) -> dict[str, float]:
    """Per collective: its bytes at the least per-byte time of the largest bucket it can be in.
    A bucket B of at most M_i bytes for each member i takes time(B) = B * time(B)/B >=
    sum_i bytes_i * least(M_i) (``per_byte_floor``): summed over any plan's buckets, a stream is busy at
    least the sum of its collectives' prices. This is what prices bucket size: where the rules
    keep buckets small, their bytes cannot ride the curve's peak bandwidth."""
    reach = reach or bucket_reach(problem)
    least = per_byte_floors(problem)
    return {c.name: c.wire_bytes * least[c.pg, c.kind](reach.member[c.name]) for c in problem.collectives}


@dataclass(frozen=True)
class StepFloor:
    """A step time no plan can beat (ms), and where it comes from.

    ``compute_ms``: the compute stream's own work plus the launches of the fewest collectives any
    plan leaves (``key_lower_bounds``); copies can be zero. ``comm_busy_ms``: per process group, the
    least time its FIFO stream is busy, summed over bucket keys, each the larger of the cost
    curve's subadditive minorant at the key's total bytes with its fewest buckets
    (``_key_stream_floor``) and its collectives' bytes priced at the best per-byte time of the
    largest bucket each can be in (``priced_bytes``). The step lasts at least as long as any
    stream is busy and as the compute stream's work. ``chain_ms``: ``chain_floor`` (when the
    fixed order lets collectives run, and what must run between); ``chain_cut``: its longest path
    was stopped at a deadline (still a floor, over fewer edges). ``scope``: the plans it holds
    for, in words (reports print it beside the number). ``off_ms``: under contention, the time the
    compute stream does no work in any of them (``off_stream_floor``).
    """

    floor_ms: float
    compute_ms: float
    comm_busy_ms: dict[str, float]
    chain_ms: float = 0.0
    chain_cut: bool = False
    scope: str = "every plan with anchored positions"
    off_ms: float = 0.0

    @property
    def free_overlap_ms(self) -> float:
        """The floor of the same plans simulated without contention (overlap free): what a model
        that prices overlap as free may be told."""
        return max(self.compute_ms, self.chain_ms, *self.comm_busy_ms.values())


def _merged_copies_ms(problem: Problem, c) -> tuple[float, float]:
    """(copy in, copy out) a collective's bytes cost on the compute stream when it is in a bucket
    of two or more (``planner.core.problem.copy_bytes`` adds up over members; a lone collective
    copies nothing); (0, 0) without ``problem.bucketing``."""
    from planner.core.problem import copy_bytes

    if problem.bucketing is None:
        return 0.0, 0.0
    in_bytes, out_bytes = copy_bytes(c.kind, [c.wire_bytes, 0], problem.link(c.pg).group_size, problem.bucket_mode)
    return problem.bucketing.copy_ms(in_bytes), problem.bucketing.copy_ms(out_bytes)


@dataclass(frozen=True)
class _KeyStream:
    """One bucket key as ``beside_streams_floor`` needs it: its process group, the fewest buckets
    ``need`` any plan has, and per collective (in one order): ``alone_ms``, its stream time in a
    bucket of its own; ``merged_ms``, a floor of its share of a merged bucket's stream time (its
    bytes at their best per-byte time); ``copies_ms``, what merging it copies on the compute
    stream. ``busy(k)``: a floor of the key's stream time in k buckets (vectorized over k, never
    decreasing)."""

    pg: str
    need: int
    alone_ms: np.ndarray
    merged_ms: np.ndarray
    copies_ms: np.ndarray
    busy: Callable[[np.ndarray], np.ndarray]


def _key_stream(problem: Problem, kind: str, pg: str, cs: list, need: int, merged_ms: list[float]) -> _KeyStream:
    """``_KeyStream`` of one key; ``merged_ms`` per collective. ``busy(k)`` is the larger of their
    sum (whatever the count) and the best line below the cost curve at k buckets
    (``_key_stream_floor``)."""
    link = problem.link(pg)
    total = sum(c.wire_bytes for c in cs)
    lc, ls = _minorant_lines(link, kind, total)
    priced = float(sum(merged_ms))

    def busy(k: np.ndarray) -> np.ndarray:
        by_count = (np.asarray(k, dtype=float)[:, None] * lc[None, :] + ls[None, :] * total).max(axis=1, initial=0.0)
        return np.maximum(by_count, priced)

    return _KeyStream(pg, need, np.array([link.time_ms(kind, c.wire_bytes) for c in cs]), np.array(merged_ms),
                      np.array([sum(_merged_copies_ms(problem, c)) for c in cs]), busy)


def beside_streams_floor(problem: Problem, keys: list[_KeyStream], contention: float) -> float:
    """A floor of W + U (1 - 1/F) (``under_contention``: the compute stream's work W and the time U
    some collective is in flight): the graph's compute, plus per key what its launches, the copies
    merging puts on the compute stream and, on one process group's stream (U is at least its busy
    time, its keys' times adding up), (1 - 1/F) of its stream time cost at least; the best group
    counts. Per key, the larger of two floors of that cost:

    - by count: the least over bucket counts k of k launches, the copies of the members k buckets
      must merge (k buckets of n collectives leave at most k - 1 alone, so at least the n - k + 1
      smallest copies; none when k = n) and the stream time of k buckets (``busy``);
    - by member: each collective alone costs a launch and its own stream time, merged its copies
      and its share of a merged bucket's stream time (the merged buckets' launches and fixed
      costs dropped); each member at the lesser.

    Why: fewer buckets save stream latency but copy more on the compute stream. The plain floor
    takes each key's fewest buckets for the stream and no copies for the work; at F = 1.19 on
    llama3-8b-fsdp-2 (measured costs) a 117 MB gather merged costs 0.16 ms of copies and saves
    0.013 ms of slowed compute, so the best plans leave most collectives alone."""
    from planner.cost.simulator import check_contention

    share = 1.0 - 1.0 / check_contention(contention)
    launch = problem.bucketing.launch_ms if problem.bucketing is not None else 0.0
    on_stream: dict[str, float] = {}  # per group: what its keys cost at least, their stream time included
    alone: dict[str, float] = {}  # per group: what its keys cost on the compute stream alone
    for key in keys:
        n = len(key.alone_ms)
        k = np.arange(key.need, n + 1)
        merged = np.where(k < n, n - k + 1, 0)
        work = k * launch + np.concatenate([[0.0], np.cumsum(np.sort(key.copies_ms))])[merged]
        by_member = np.minimum(launch + share * key.alone_ms, key.copies_ms + share * key.merged_ms).sum()
        on_stream[key.pg] = on_stream.get(key.pg, 0.0) + max(float(np.min(work + share * key.busy(k))), by_member)
        alone[key.pg] = alone.get(key.pg, 0.0) + max(float(np.min(work)), np.minimum(launch, key.copies_ms).sum())
    compute = sum(n.stream_ms for n in problem.nodes)
    every = sum(alone.values())
    return float(compute + max((on_stream[pg] + every - alone[pg] for pg in on_stream), default=0.0))


def under_contention(floor: StepFloor, contention: float, off_ms: float = 0.0, beside_ms: float = 0.0) -> StepFloor:
    """``floor`` (``step_floor``'s or ``free_position_floor``'s) as a floor of the step simulated at
    ``contention`` F (``planner.simulate(..., contention=F)``: compute-stream work runs F times
    slower while any collective is in flight). ``off_ms``: a floor of the time the compute stream
    does no work in any plan the floor is over, at F (``off_stream_floor``; 0 knows nothing);
    ``beside_ms``: a floor of W + U (1 - 1/F) below (``beside_streams_floor``; 0 knows nothing).
    Two facts, whatever the plan:

    - slowing work never ends anything earlier (the replay's times are maxima and sums of
      durations that only grow with F), so ``floor.floor_ms`` still holds;
    - let W be the compute stream's work, O the time it works while some collective is in flight,
      Z the time it does no work, U the time some collective is in flight. Its work beside
      collectives takes F times longer, so S >= (W - O/F) + O + Z; and U <= O + Z (in flight,
      the stream works or not; the step ends with the compute stream, which waits every bucket).
      So S >= W + (U - Z) (1 - 1/F) + Z = W + U (1 - 1/F) + Z / F, and U is at least any one
      stream's busy time.

    So S >= max(compute_ms + max(comm_busy_ms) * (1 - 1/F), beside_ms) + off_ms / F. At F = 1 this
    is no more than the floor itself, which is returned."""
    from planner.cost.simulator import check_contention

    factor = check_contention(contention)
    if factor == 1.0:
        return floor
    busy = max(floor.comm_busy_ms.values(), default=0.0)
    overlapped = float(max(floor.compute_ms + busy * (1.0 - 1.0 / factor), beside_ms) + max(off_ms, 0.0) / factor)
    return StepFloor(floor_ms=max(floor.floor_ms, overlapped), compute_ms=floor.compute_ms,
                     comm_busy_ms=floor.comm_busy_ms, chain_ms=floor.chain_ms, chain_cut=floor.chain_cut,
                     scope=f"{floor.scope}, at contention {factor:g}", off_ms=float(max(off_ms, 0.0)))


def _minorant_lines(link, kind: str, total: int) -> tuple[np.ndarray, np.ndarray]:
    """Lines g(b) = c + s*b with c >= 0 that lie below the link's cost curve f on [0, total]:
    intercepts ``c`` and slopes ``s``. The slopes searched are those of the chords from every
    breakpoint to ``total`` (and 0); c(s) = min over breakpoints of f(b) - s*b (f is linear
    between breakpoints, so the minimum over [0, total] is at one of them)."""
    cv = curve(link, kind)
    if cv.is_line:
        return np.array([cv.fixed_ms]), np.array([(cv.time_ms(total) - cv.fixed_ms) / max(total, 1)])
    pts = [(b, cv.time_ms(b)) for b in (0, *cv.bends(0, total)) if b < total] + [(total, cv.time_ms(total))]
    bs = np.array([b for b, _ in pts], dtype=float)
    ts = np.array([t for _, t in pts], dtype=float)
    span = total - bs[:-1]
    slopes = np.concatenate([[0.0], (ts[-1] - ts[:-1]) / np.where(span > 0, span, 1)])
    c = (ts[None, :] - slopes[:, None] * bs[None, :]).min(axis=1)
    keep = c >= 0
    return c[keep], slopes[keep]


def _key_stream_floor(link, kind: str, total: int, min_buckets: int) -> float:
    """Least total stream time of ``min_buckets`` or more buckets of one kind whose bytes add up
    to ``total``: for any line g = c + s*b below f on [0, total] (``_minorant_lines``), a plan's
    buckets cost at least sum g(B_j) = k*c + s*total >= min_buckets*c + s*total; the best line
    counts. For α-β links (f itself a line) this is min_buckets latencies plus the bandwidth time."""
    c, s = _minorant_lines(link, kind, total)
    return float(max(0.0, (min_buckets * c + s * total).max(initial=0.0)))


def chain_floor(problem: Problem, reach: BucketReach | None = None, price: dict[str, float] | None = None,
                deadline: float | None = None) -> float:
    """A floor from the fixed order: the longest chain of facts about the clock, one per pair of
    positions (a longest path; it contains Jackson / Carlier's one-machine bound with release and
    tail times; the stream floor of ``step_floor``, which also prices by count, is kept beside it).

    T(v) is the compute stream's clock when it reaches position v (0 at the first node, the step
    at the end). Whatever the plan: T(v') >= T(v) + the compute of the nodes in [v, v'); and per
    process group, T(v') >= T(v) + the least time its FIFO stream needs for the collectives that
    can be issued no earlier than v and must be waited before v' -- a collective's bucket is
    issued at a start position after its last fixed predecessor (clock >= T(s_lo + 1)) and its
    wait sits before its first fixed consumer (the bucket has ended by T(w_hi)). Those buckets
    hold the stream one at a time in between, at least max(c_min + sum s*bytes on the kinds'
    best lines below the curve (``_minorant_lines``), sum of ``priced_bytes``). The step is at
    least the longest path from the first position to the end along these edges.

    The path is relaxed point by point, quadratic in the points (200,000 collectives: minutes);
    at ``deadline`` (``time.perf_counter()`` seconds) it stops with the longest path over the
    edges out of the points relaxed so far: every clock value is still some path's length, so
    still a floor, at least the compute (the first point's edges are always relaxed)."""
    return _chain_floor(problem, reach, price, deadline)[0]


def _chain_floor(problem: Problem, reach: BucketReach | None, price: dict[str, float] | None,
                 deadline: float | None) -> tuple[float, bool]:
    """``chain_floor`` and whether the deadline cut it."""
    limits = fixed_limits(problem)
    order = sorted(problem.nodes, key=lambda n: n.pos)
    pos = np.array([n.pos for n in order])
    work = np.concatenate([[0.0], np.cumsum([n.stream_ms for n in order])])
    end = int(pos[-1]) + 1 if len(pos) else 1
    cs = problem.collectives
    release = [limits[c.name][0] + 1 for c in cs]
    waited_by = [min(limits[c.name][1], end) for c in cs]
    points = np.array(sorted({0, end, *release, *waited_by}))
    done = work[np.searchsorted(pos, points, side="left")]  # compute of the nodes before each point
    rel_at = np.searchsorted(points, release)
    wait_at = np.searchsorted(points, waited_by)
    price = price if price is not None else priced_bytes(problem, reach)
    streams = []  # per process group: its members' (release index, wait index, line price, price), c_min
    for pg in sorted({c.pg for c in cs}):
        idx = [k for k, c in enumerate(cs) if c.pg == pg]
        link = problem.link(pg)
        best = {}
        for kind in {cs[k].kind for k in idx}:  # the line that prices one bucket of everything highest
            total = sum(cs[k].wire_bytes for k in idx if cs[k].kind == kind)
            lc, ls = _minorant_lines(link, kind, total)
            i = int(np.argmax(lc + ls * total)) if len(lc) else None
            best[kind] = (float(lc[i]), float(ls[i])) if i is not None else (0.0, 0.0)
        line = np.array([best[cs[k].kind][1] * cs[k].wire_bytes for k in idx])
        priced = np.array([price[cs[k].name] for k in idx])
        streams.append((rel_at[idx], wait_at[idx], line, priced, min(c for c, _ in best.values())))
    m = len(points)
    # per stream, by wait point: the line price, the price and the count of the collectives that
    # can still be issued no earlier than the current point (those released earlier are taken out)
    held = []
    for rel, wait, line, priced, c_min in streams:
        by_release = np.argsort(rel, kind="stable")
        held.append([rel[by_release], wait[by_release], line[by_release], priced[by_release], c_min, 0,
                     np.bincount(wait, weights=line, minlength=m), np.bincount(wait, weights=priced, minlength=m),
                     np.bincount(wait, minlength=m).astype(float)])
    clock = np.full(m, -np.inf)
    clock[0] = 0.0
    for a in range(m - 1):
        if deadline is not None and a and a % 16 == 0 and time.perf_counter() > deadline:
            return float(clock[-1]), True  # >= the compute: the edge from point 0 to the end is relaxed
        edge = done[a + 1:] - done[a]
        for h in held:
            rel, wait, line, priced, c_min, k, by_line, by_price, by_count = h
            while k < len(rel) and rel[k] < a:  # released before a: not in this edge's set
                by_line[wait[k]] -= line[k]
                by_price[wait[k]] -= priced[k]
                by_count[wait[k]] -= 1
                k += 1
            h[5] = k
            some = by_count.cumsum()[a + 1:] > 0.5
            stream = np.maximum(by_line.cumsum()[a + 1:] + c_min * some, by_price.cumsum()[a + 1:])
            edge = np.maximum(edge, stream)
        clock[a + 1:] = np.maximum(clock[a + 1:], clock[a] + edge)
    return float(clock[-1]), False


def step_floor(problem: Problem, reach: BucketReach | None = None, need: dict[tuple, int] | None = None,
               deadline: float | None = None, contention: float | None = None) -> StepFloor:
    """The floor of ``planner.simulate``'s step time over every feasible plan (see ``StepFloor``).
    ``reach``: ``bucket_reach(problem)``, ``need``: ``key_lower_bounds(problem)`` (without
    protect_partly: the floor holds for either policy) when the caller has them. ``deadline``:
    the chain floor stops there (``chain_floor``); the floor stays valid, only looser.
    ``contention``: the step simulated at that factor (``under_contention``); None: the problem's."""
    arguments.problem_and_plan(problem, None, optional=True)
    arguments.deadline(deadline, optional=True)
    need = need if need is not None else key_lower_bounds(problem)
    reach = reach or bucket_reach(problem)
    price = priced_bytes(problem, reach)
    stream: dict[str, float] = {}
    keys = []
    for (kind, pg, key), cs in _by_key(problem).items():  # buckets never mix keys: their floors add up
        by_count = _key_stream_floor(problem.link(pg), kind, sum(c.wire_bytes for c in cs), need[(kind, pg, key)])
        stream[pg] = stream.get(pg, 0.0) + max(by_count, sum(price[c.name] for c in cs))
        keys.append((kind, pg, cs, need[(kind, pg, key)], [price[c.name] for c in cs]))
    compute = sum(n.stream_ms for n in problem.nodes)
    if problem.bucketing is not None:
        compute += problem.bucketing.launch_ms * sum(need.values())
    chain, cut = _chain_floor(problem, reach, price, deadline)
    factor = problem.contention if contention is None else contention
    floor = StepFloor(floor_ms=max([compute, *stream.values(), chain]), compute_ms=compute, comm_busy_ms=stream,
                      chain_ms=chain, chain_cut=cut)
    return _at_contention(problem, floor, factor, keys, None, deadline)


def _at_contention(problem: Problem, floor: StepFloor, factor: float, keys: list[tuple],
                   peak_memory_bytes: int | None, deadline: float | None) -> StepFloor:
    """``floor`` raised by ``under_contention`` at ``factor``, with what only a contention above 1
    asks for: ``off_stream_floor`` and ``beside_streams_floor`` over ``keys`` ((kind, process
    group, collectives, fewest buckets, each collective's stream price in a merged bucket) per
    bucket key)."""
    if factor == 1.0:
        return under_contention(floor, factor)
    streams = [_key_stream(problem, kind, pg, cs, need, merged) for kind, pg, cs, need, merged in keys]
    return under_contention(floor, factor, off_stream_floor(problem, factor, peak_memory_bytes, deadline),
                            beside_streams_floor(problem, streams, factor))


def free_position_floor(problem: Problem, deadline: float | None = None,
                        peak_memory_bytes: int | None = None, contention: float | None = None) -> StepFloor:
    """A floor of the simulated step over every plan *with free positions* (``planner.core.positions``):
    no position argument, so no interval of the rules and no chain. The compute stream does its
    nodes' work and one launch per bucket of the fewest the cap allows (bin packing of each key's
    ``size_bytes``); each stream is busy at least, per key, the larger of the minorant at the key's
    bytes with those buckets (``_key_stream_floor``) and its bytes at the curve's best per-byte
    time for a bucket of at most the key's total wire bytes (``per_byte_floor``); and
    ``chain_ms`` is ``release_deadline_floor`` (no stream runs a collective before its data exist,
    nor finishes it after its consumers ran; with ``peak_memory_bytes``, nor gathers earlier than
    the cap leaves room for: then the floor holds for the plans whose peak is within it).
    ``step_floor`` assumes anchored buckets (a bucket's reach), so it does not hold for positioned
    plans. ``contention``: the step simulated at that factor (``under_contention``); None: the
    problem's."""
    arguments.problem_and_plan(problem, None, optional=True)
    arguments.deadline(deadline, optional=True)
    arguments.memory_budget_bytes(peak_memory_bytes, "peak_memory_bytes")
    stream: dict[str, float] = {}
    launches = 0
    least = per_byte_floors(problem)
    keys = []
    for (kind, pg, key), cs in _by_key(problem).items():
        need = bin_packing_bound([c.size_bytes for c in cs], problem.bucket_cap_bytes, deadline)
        launches += need
        total = sum(c.wire_bytes for c in cs)
        by_count = _key_stream_floor(problem.link(pg), kind, total, need)
        largest = _largest_bucket_wire(cs, problem.bucket_cap_bytes)
        rate = least[pg, kind](largest)
        stream[pg] = stream.get(pg, 0.0) + max(by_count, total * rate)
        keys.append((kind, pg, cs, need, [c.wire_bytes * rate for c in cs]))
    compute = sum(n.stream_ms for n in problem.nodes)
    if problem.bucketing is not None:
        compute += problem.bucketing.launch_ms * launches
    chain = release_deadline_floor(problem, peak_memory_bytes)
    scope = within_peak("every plan with any positions", peak_memory_bytes)
    factor = problem.contention if contention is None else contention
    floor = StepFloor(floor_ms=max([compute, chain, *stream.values()]), compute_ms=compute, comm_busy_ms=stream,
                      chain_ms=chain, scope=scope)
    return _at_contention(problem, floor, factor, keys, peak_memory_bytes, deadline)


def within_peak(plans: str, peak_memory_bytes: int | None) -> str:
    """A bound's scope in words: ``plans``, and the peak they keep to when there is a cap."""
    return plans if peak_memory_bytes is None else f"{plans} within {peak_memory_bytes / 1e9:.3f} GB"


def _largest_bucket_wire(cs: list, cap: int) -> int:
    """An upper bound on the wire bytes of any bucket of ``cs``: one within the cap, or one
    collective alone, which may exceed the cap (rule 3 holds buckets of two or more to it)."""
    return max(_most_wire_within_cap(cs, cap), max((c.wire_bytes for c in cs), default=0))


def _most_wire_within_cap(cs: list, cap: int) -> int:
    """An upper bound on the wire bytes of any bucket of ``cs`` within the cap (its members'
    ``size_bytes`` at most ``cap``): the fractional knapsack, best wire per footprint byte first."""
    room, wire = cap, 0.0
    for c in sorted(cs, key=lambda c: -(c.wire_bytes / c.size_bytes) if c.size_bytes else -math.inf):
        if c.size_bytes <= room:
            room -= c.size_bytes
            wire += c.wire_bytes
        else:
            wire += c.wire_bytes * room / c.size_bytes
            break
    return math.ceil(wire)


@dataclass(frozen=True)
class _Gathered:
    """An all_gather as the memory cap sees it (``_memory_room``): ``least`` bytes held from its
    merged start to its wait's last use ``last`` in every plan, due at position ``due`` (its first
    fixed consumer)."""

    name: str
    pg: str
    least: int
    due: int
    last: int


@dataclass(frozen=True)
class _MemoryRoom:
    """Positions ``keys`` and, at each, ``room``: the cap less what every plan holds there (the
    graph's own bytes and each all_gather already due and still held), which the all_gathers
    started by then and due later share."""

    keys: list[float]
    room: np.ndarray
    gathers: list[_Gathered]


def _memory_room(problem: Problem, peak_memory_bytes: int) -> _MemoryRoom | None:
    """Whatever its bucket, an all_gather holds at least the least of its start's result, its
    wire bytes and its wait's storage from its merged start to its wait's last use
    (``planner.cost.memory.member_buffers``: the start's result until the wait, then the wait's
    storage, with the bucket's wire share between them when merged); its wait lies before its first
    fixed consumer (``fixed_limits``), so from there to the last use every plan holds it. None for
    a problem without the exact profile."""
    from planner.cost.memory import buffers_of, own_memory

    if problem.memory is None or problem.memory.run_starts is None:
        return None
    limits = fixed_limits(problem)
    gathers = []
    for c in problem.collectives:
        b = buffers_of(problem, c)
        if c.kind != "all_gather" or b.wait_last_use is None:
            continue
        least = min(b.out_bytes, c.wire_bytes, b.wait_bytes or 0)
        if least > 0 and limits[c.name][1] <= b.wait_last_use:
            gathers.append(_Gathered(c.name, c.pg, least, limits[c.name][1], b.wait_last_use))
    keys = sorted({float(r) for r in problem.memory.run_starts} | {float(n.pos) for n in problem.nodes}
                  | {float(g.due) for g in gathers} | {float(g.last) for g in gathers})
    own = own_memory(problem)
    held = np.zeros(len(keys) + 1)
    for g in gathers:  # due and still held: in every plan
        held[bisect.bisect_left(keys, g.due)] += g.least
        held[bisect.bisect_right(keys, g.last)] -= g.least
    room = peak_memory_bytes - np.array([own(q) for q in keys], dtype=np.float64) - np.cumsum(held)[:-1]
    return _MemoryRoom(keys, room, gathers)


def peak_memory_floor(problem: Problem) -> int:
    """The least peak (``planner.cost.memory``'s count) that any plan of ``problem``, with any
    positions, can have: no plan frees the graph's own storages, and every plan holds each
    all_gather's least bytes from its first fixed consumer to its wait's last use
    (``_memory_room``), so the peak is at least their largest sum at one position. Per segment
    (a problem without the exact profile): the graph's own bytes of the fullest segment; with no
    profile, 0. Why: a search that finds nothing within a cap may say that no plan fits only
    when this floor is above it (``position_search``)."""
    arguments.problem_and_plan(problem, None, optional=True)
    if problem.memory is None:
        return 0
    room = _memory_room(problem, 0)
    if room is None:  # counted per segment: the collectives' buffers add to the graph's own bytes
        return max(problem.memory.segment_peak_bytes, default=0)
    # in integers (the room is in floats, which round byte counts near MAX_BYTES)
    from planner.cost.memory import own_memory

    own = own_memory(problem)
    change = [0] * (len(room.keys) + 1)
    for g in room.gathers:
        change[bisect.bisect_left(room.keys, g.due)] += g.least
        change[bisect.bisect_right(room.keys, g.last)] -= g.least
    held, most = 0, 0
    for q, d in zip(room.keys, change):
        held += d
        most = max(most, own(q) + held)
    return most


def memory_releases(problem: Problem, peak_memory_bytes: int) -> dict[str, float]:
    """Per all_gather: a position its bucket's start comes after in every plan whose peak
    (``planner.cost.memory``) is within ``peak_memory_bytes``: the last position before it is due
    where it alone does not fit in the room the cap leaves (``_memory_room``). An all_gather the
    cap does not hold back is left out, as is every collective of a problem without the exact
    profile."""
    arguments.problem_and_plan(problem, None, optional=True)
    if peak_memory_bytes is None:
        raise arguments.ArgumentError("peak_memory_bytes", "peak_memory_bytes must be an integer from 0 to below "
                                                           "2**62, not None (no cap holds nothing back)")
    arguments.memory_budget_bytes(peak_memory_bytes, "peak_memory_bytes")
    room = _memory_room(problem, peak_memory_bytes)
    return _held_back(room) if room is not None else {}


def _held_back(room: _MemoryRoom) -> dict[str, float]:
    out = {}
    for g in room.gathers:
        over = np.nonzero(room.room[:bisect.bisect_left(room.keys, g.due)] < g.least)[0]
        if len(over):
            out[g.name] = room.keys[int(over[-1])]
    return out


class _ComputeAlong:
    """The compute stream's work along the schedule, as the release floors count it.

    ``done[k]``: the fixed compute once node k has run (a folded dtype conversion runs where its
    bucket starts, not where it was scheduled: its own time is counted nowhere here; its unpinned
    compute stays at its place). ``every[k]``: all the work before node k, moved conversions
    included (an upper bound)."""

    def __init__(self, problem: Problem):
        self.nodes = sorted(problem.nodes, key=lambda n: n.pos)
        self.positions = [n.pos for n in self.nodes]
        self.moving = {f for c in problem.collectives for f in c.folded}
        self.done = np.cumsum([n.stream_ms - (n.own_ms if n.name in self.moving else 0.0) for n in self.nodes])
        self.total = float(self.done[-1]) if len(self.nodes) else 0.0
        self.every = np.concatenate([[0.0], np.cumsum([n.stream_ms for n in self.nodes])])

    def reached(self, pos: float) -> float:
        """The fixed compute run when the stream reaches the first place after ``pos`` where a
        bucket can start: every node at or before ``pos``, and the unpinned compute scheduled just
        before the next node, which runs before anything issued there (the simulator's
        ``compute_before``). A start comes after ``pos``, and every place is a node's."""
        k = bisect.bisect_right(self.positions, pos)
        return (float(self.done[k - 1]) if k else 0.0) + (self.nodes[k].unpinned_ms if k < len(self.nodes) else 0.0)

    def before(self, pos: float) -> float:
        """At most the work done when the stream starts the node at ``pos`` (its unpinned compute
        included)."""
        k = bisect.bisect_left(self.positions, pos)
        return float(self.every[k]) + (self.nodes[k].unpinned_ms if k < len(self.nodes) else 0.0)

    def tail(self, pos: int) -> float:
        """The consumer's own compute and the fixed compute after it."""
        k = bisect.bisect_left(self.positions, pos)
        if k >= len(self.nodes):
            return 0.0
        return self.total - float(self.done[k]) + (0.0 if self.nodes[k].name in self.moving else self.nodes[k].own_ms)


def release_deadline_floor(problem: Problem, peak_memory_bytes: int | None = None) -> float:
    """A floor of the simulated step (ms) over every plan with any positions that knows what
    ``free_position_floor`` ignores: when each collective's data allow it to run, and that the
    compute stream waits for what it consumes.

    A collective's bucket is issued no earlier than the compute stream has run its start's last
    fixed predecessor (``fixed_limits``: its release position ``s``), and its wait sits before
    its wait's first fixed consumer ``Q``. ``A(x)``, the time the compute stream reaches the first
    place after position ``x`` where a bucket can start (every place is a node's), is at least the
    fixed compute up to ``x``, plus the unpinned compute scheduled just before the next node (it
    runs before anything issued there), plus ``D``, the delay the consumers before ``x`` took:
    consumer ``Q`` starts no earlier than ``A(s)`` plus the time its
    process group's FIFO stream needs for the collectives released at ``s`` or later and due by
    ``Q``, for every ``s``: the larger of their bytes at the best per-byte time of their key's
    largest bucket (``per_byte_floor``) and, per kind, the least time of any buckets carrying
    that many bytes (``bucket_stream_floor``: a little, soon, needs a small bucket). The step is
    at least the fixed compute plus the last ``D``. Nothing hides the first gather of the step
    (``s`` = -1, ``Q`` its consumer) or the last reduce of the backward, and what one consumer
    waits for delays every release after it.

    ``peak_memory_bytes``: a floor over the plans within that peak only. An all_gather that does
    not fit alone in the room the cap leaves at a position is released after it
    (``memory_releases``); and at each position ``s``, the all_gathers due after ``s`` that started
    by ``s`` share the room there (``_memory_room``), so those due by ``Q`` beyond that room start
    after ``s`` too."""
    arguments.problem_and_plan(problem, None, optional=True)
    arguments.memory_budget_bytes(peak_memory_bytes, "peak_memory_bytes")
    limits = fixed_limits(problem)
    room = _memory_room(problem, peak_memory_bytes) if peak_memory_bytes is not None else None
    held_back = _held_back(room) if room is not None else {}
    along = _ComputeAlong(problem)
    released, tail, total = along.reached, along.tail, along.total

    least = per_byte_floors(problem)
    items = []  # (process group, release position, due position, stream ms, name, kind, wire bytes)
    gather_rate: dict[str, float] = {}  # per process group: the least per-byte time of any all_gather
    largest_of: dict[tuple[str, str], int] = {}  # per (process group, kind): its keys' largest bucket
    for (kind, pg, _), cs in _by_key(problem).items():
        largest = _largest_bucket_wire(cs, problem.bucket_cap_bytes)
        largest_of[pg, kind] = max(largest_of.get((pg, kind), 0), largest)
        if kind == "all_gather":
            gather_rate[pg] = min(gather_rate.get(pg, math.inf), least[pg, kind](largest))
        for c in cs:
            s_lo, w_hi = limits[c.name]
            items.append((pg, float(max(s_lo, held_back.get(c.name, -1))), w_hi,
                          c.wire_bytes * least[pg, kind](largest), c.name, kind, c.wire_bytes))
    held = sum(g.least for g in room.gathers) if room is not None else 0  # the most gathered bytes beyond a room
    bucketed = {(pg, kind): bucket_stream_floor(problem.link(pg), kind, largest,
                                                sum(it[6] for it in items if it[0] == pg and it[5] == kind)
                                                + (held if kind == "all_gather" else 0))
                for (pg, kind), largest in largest_of.items()}
    ends = _first_gathers_end(problem, items, largest_of, tail, released(-1.0))
    if held_back:  # the pipeline the data alone release holds for every plan, those within the cap too
        unheld = [(it[0], float(limits[it[4]][0]), *it[2:]) for it in items]
        for due, end in _first_gathers_end(problem, unheld, largest_of, tail, released(-1.0)).items():
            ends[due] = max(ends.get(due, end), end)
    return total + _consumer_delay(items, room, gather_rate, bucketed, released, tail, total, ends)


def _first_gathers_end(problem: Problem, items: list, largest_of: dict, tail: Callable[[int], float],
                       start: float) -> dict[int, float]:
    """Per process group with all_gathers: at the last gather consumer before anything of that
    group is released after the top of the step (the forward, on FSDP graphs), a floor of the end
    of the step from the gathers due by then alone, as one pipeline (``pipeline_end_floor``: the
    stream starts at ``start``, the earliest a bucket can)."""
    ends: dict[int, float] = {}
    for pg in {it[0] for it in items if it[5] == "all_gather"}:
        later = [it[1] for it in items if it[0] == pg and it[1] > -1.0]
        cut = min(later) if later else math.inf
        gathers = sorted((it[2], it[6]) for it in items if it[0] == pg and it[5] == "all_gather" and it[2] <= cut)
        if not gathers:
            continue
        by_due: dict[int, int] = {}
        for due, wire in gathers:
            by_due[due] = by_due.get(due, 0) + wire
        w = pipeline_end_floor(problem.link(pg), "all_gather", largest_of[pg, "all_gather"],
                               [(tail(due), wire) for due, wire in sorted(by_due.items())])
        if w is not None:
            last = max(by_due)
            ends[last] = max(ends.get(last, 0.0), start + w)
    return ends


def _consumer_delay(items: list, room: _MemoryRoom | None, gather_rate: dict[str, float],
                    bucketed: dict[tuple[str, str], Callable[[np.ndarray], np.ndarray]],
                    released: Callable[[float], float], tail: Callable[[int], float], total: float,
                    ends: dict[int, float] | None = None) -> float:
    """``release_deadline_floor``'s last ``D``: consumers in position order, each starting no
    earlier than ``A(s)`` + the stream time of its group's collectives released at ``s`` or later
    and due by it (+ the all_gathers beyond the room at ``s``), for every ``s`` of the grid: the
    larger of their per-byte prices and the sum over kinds of ``bucketed`` at their bytes. ``ends``:
    per consumer position, a floor of the step's end already known there (``_first_gathers_end``)."""
    grid = sorted({-1.0} | {item[1] for item in items} | set(room.keys if room is not None else ()))
    at = {s: k for k, s in enumerate(grid)}
    positions = np.array(grid)
    base = np.array([released(s) for s in grid])
    free = np.full(len(grid), np.inf)
    mine: dict[str, _Gathered] = {}
    if room is not None:
        for q, r in zip(room.keys, room.room):
            free[at[q]] = max(float(r), 0.0)
        mine = {g.name: g for g in room.gathers}
    groups = {pg for pg, *_ in items}
    work = {pg: np.zeros(len(grid)) for pg in groups}  # per s: stream ms released at s or later, due so far
    carried = {pk: np.zeros(len(grid)) for pk in bucketed}  # the same in wire bytes, per (group, kind)
    ahead = {pg: np.zeros(len(grid)) for pg in groups}  # per s: gathered bytes started by s, due after s
    delay = np.zeros(len(grid))  # per s: D of the consumers at or before s
    d = 0.0
    by_due: dict[int, list] = {}
    for item in items:
        by_due.setdefault(item[2], []).append(item)
    for due in sorted(by_due):
        for pg, s, _, ms, name, kind, wire in by_due[due]:
            k = at[s]
            work[pg][:k + 1] += ms  # released at s: counted from every grid point at or before it
            carried[pg, kind][:k + 1] += wire
            if name in mine:  # before it: started by then only within the room
                ahead[pg][k + 1:] += np.where(positions[k + 1:] < due, mine[name].least, 0.0)
        before = positions < due
        start = 0.0
        for pg in {pg for pg, *_ in by_due[due]}:
            beyond = np.maximum(ahead[pg] - free, 0.0)  # gathered bytes that start after s too
            stream = work[pg] + beyond * gather_rate.get(pg, 0.0)
            in_buckets = sum(floor(carried[q, kind] + (beyond if kind == "all_gather" else 0.0))
                             for (q, kind), floor in bucketed.items() if q == pg)
            stream = np.maximum(stream, in_buckets)
            start = max(start, float(np.max(np.where(before, base + delay + stream, 0.0))))
        d = max(d, start + tail(due) - total, (ends or {}).get(due, -math.inf) - total)
        delay[~before] = d
    return d



def off_stream_floor(problem: Problem, contention: float, peak_memory_bytes: int | None = None,
                     deadline: float | None = None) -> float:
    """A floor (ms) of the time the compute stream does no work during a step simulated at
    ``contention`` F, over every plan with any positions (within ``peak_memory_bytes`` when
    given): ``under_contention`` adds it to the floor, divided by F.

    A window is a release position ``s`` and a due position ``Q`` of one process group: the
    collectives released at ``s`` or later (``fixed_limits``; later where the cap holds a gather
    back, ``memory_releases``) and due by ``Q`` begin no earlier than the compute stream reaches
    the first place after ``s`` and end before it starts ``Q``'s node (``Q`` past the last node:
    the step's end), one at a time on their FIFO stream. So the window lasts at least their
    stream time ``G`` (``release_deadline_floor``'s pricing: their bytes at the best per-byte time
    of their key's largest bucket, or per kind the least time of any buckets carrying them). In
    it the compute stream can do at most ``w`` of work (the graph's nodes between, all of them,
    and every launch, copy and moved conversion of a collective that can be issued or waited
    there), which takes at most F * w; it does no work for at least ``G - F*w``. Windows that do
    not overlap in time (the next one's ``s`` at or after the last one's ``Q``) add up: a longest
    path over the grid of positions.

    A collective of the same group released at ``s`` or later and waited in the window although
    due after ``Q`` runs on the stream inside the window too: its copy-out is charged only beyond
    its stream time / F (``G`` then counted per byte, which adds up; the least-time-of-buckets
    price does not). Why: an FSDP step gathers most of its parameters at the top, and their
    copies out (bucketing) would otherwise eat the first window's gain.

    Quadratic in the positions collectives are released and due at (each window a cell of a
    matrix), measured on this 2-core machine: 0.1 s on llama3-8b-fsdp-8, 5.8 s and 14.5 s (1.2 GB)
    on the 80- and 126-layer presets. Only a contention above 1 asks for it. At ``deadline``
    (``time.perf_counter()`` seconds) it stops with the windows of the process groups priced so far,
    over the positions walked so far: still a floor (0 before any)."""
    from planner.cost.simulator import check_contention

    factor = check_contention(contention)
    arguments.problem_and_plan(problem, None, optional=True)
    arguments.memory_budget_bytes(peak_memory_bytes, "peak_memory_bytes")
    arguments.deadline(deadline, optional=True)
    if not problem.collectives or not problem.nodes:
        return 0.0

    def late() -> bool:
        return deadline is not None and time.perf_counter() > deadline

    room = _memory_room(problem, peak_memory_bytes) if peak_memory_bytes is not None else None
    grid = _window_grid(problem, _held_back(room) if room is not None else {})
    gain = _window_gains(problem, grid, factor, late)
    return factor * _longest_windows(gain, late)


@dataclass(frozen=True)
class _WindowGrid:
    """``off_stream_floor``'s windows: the positions ``points`` collectives are released (``rel``,
    per collective, an index into them) and due at (``due``); ``work[i, j]``: at most the graph's
    work between reaching the first place after ``points[i]`` and starting the node at ``points[j]``."""

    points: np.ndarray
    rel: np.ndarray
    due: np.ndarray
    work: np.ndarray

    def in_rectangles(self, weights: np.ndarray, which: np.ndarray, rows: tuple, cols: tuple) -> np.ndarray:
        """Per window [i, j]: the sum of ``weights`` of the collectives ``which`` whose release
        index lies in [rows[0], rows[1]) and due index in [cols[0], cols[1]) (bounds: m x m arrays
        or scalars, from 0 to m)."""
        m = len(self.points)
        h = np.zeros((m + 1, m + 1))
        np.add.at(h, (self.rel[which] + 1, self.due[which] + 1), weights[which])
        total = h.cumsum(axis=0).cumsum(axis=1)  # [r, c]: release index < r and due index < c
        r0, r1, c0, c1 = (np.broadcast_to(x, (m, m)) for x in (*rows, *cols))
        return total[r1, c1] - total[r0, c1] - total[r1, c0] + total[r0, c0]


def _window_grid(problem: Problem, held_back: dict[str, float]) -> _WindowGrid:
    """The grid of windows: releases (later where the cap holds a gather back), due positions
    (the step's end past the last node) and the work between every two."""
    cs = problem.collectives
    limits = fixed_limits(problem)
    along = _ComputeAlong(problem)
    end = along.positions[-1] + 1
    released = np.array([max(float(limits[c.name][0]), held_back.get(c.name, -1.0)) for c in cs])
    due = np.array([float(min(limits[c.name][1], end)) for c in cs])
    points = np.array(sorted({-1.0, float(end), *released, *due}))
    work = np.array([along.before(q) for q in points])[None, :] - np.array([along.reached(s) for s in points])[:, None]
    return _WindowGrid(points, np.searchsorted(points, released), np.searchsorted(points, due), work)


def _window_prices(problem: Problem) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[tuple[str, str], int]]:
    """Per collective: its stream time at its bytes' best per-byte time (``ms``); what issuing it
    can put on the compute stream (a launch, its copy in and moved conversions where it can be
    merged: ``issue``); its copy out where it can be merged; and per (process group, kind) the
    largest bucket of its keys."""
    own = {n.name: n.own_ms for n in problem.nodes}
    least = per_byte_floors(problem)
    launch = problem.bucketing.launch_ms if problem.bucketing is not None else 0.0
    largest_of: dict[tuple[str, str], int] = {}
    price = {}
    for (kind, pg, _), group in _by_key(problem).items():
        largest = _largest_bucket_wire(group, problem.bucket_cap_bytes)
        largest_of[pg, kind] = max(largest_of.get((pg, kind), 0), largest)
        sizes = sorted(c.size_bytes for c in group)
        for c in group:
            partner = sizes[1] if len(sizes) > 1 and c.size_bytes == sizes[0] else sizes[0]  # the smallest other
            mergeable = len(sizes) > 1 and c.size_bytes + partner <= problem.bucket_cap_bytes  # rule 3
            copy_in, copy_out = _merged_copies_ms(problem, c) if mergeable else (0.0, 0.0)
            moved = sum(own[f] for f in c.folded) if mergeable else 0.0
            price[c.name] = (c.wire_bytes * least[pg, kind](largest), launch + copy_in + moved, copy_out)
    ms, issue, copy_out = (np.array([price[c.name][k] for c in problem.collectives]) for k in range(3))
    return ms, issue, copy_out, largest_of


def _window_gains(problem: Problem, grid: _WindowGrid, factor: float, late: Callable[[], bool]) -> np.ndarray:
    """Per window [i, j] (i < j; 0 elsewhere): a floor of (the time the compute stream does no
    work there) / F, at least 0, the best of the process groups priced before ``late``."""
    cs = problem.collectives
    m = len(grid.points)
    ms, issue, copy_out, largest_of = _window_prices(problem)
    full = issue + copy_out
    ii, jj = np.arange(m)[:, None], np.arange(m)[None, :]  # a window: s = points[i], Q = points[j]
    # Where a collective's issue and wait can fall against the window (released at r, due at d;
    # positions between s and Q are inside): it adds ``full`` to the work there when issued and
    # waited inside, ``issue`` when only issued inside (d > Q), ``copy_out`` when only waited
    # inside (r < s). Issued and waited inside, one of Q's group also lies on its stream inside:
    # it lengthens the window by its stream time, worth ms / F of work. The most work each can add:
    before_s, inside = (0, ii), (ii, jj)  # release index ranges: r < s, s <= r < Q
    due_inside, after_q, by_q = (ii + 1, jj + 1), (jj + 1, m), (0, jj + 1)
    everyone = np.ones(len(cs), dtype=bool)
    overhead = grid.in_rectangles(full, everyone, (0, jj), (ii + 1, m))  # r < Q, d > s: everyone at most full
    wire = np.array([c.wire_bytes for c in cs], dtype=np.float64)
    lengthened = full - ms / factor
    gain = np.full((m, m), -np.inf)
    for pg in sorted({c.pg for c in cs}):
        if late():  # each group's windows are windows of their own: those priced so far still count
            break
        mine = np.array([c.pg == pg for c in cs])
        per_byte = grid.in_rectangles(ms, mine, inside, by_q)  # released at s or later, due by Q: on the stream inside
        in_buckets = np.zeros((m, m))
        for kind in sorted({c.kind for c in cs if c.pg == pg}):
            of_kind = mine & np.array([c.kind == kind for c in cs])
            carried = grid.in_rectangles(wire, of_kind, inside, by_q)
            total = int(wire[of_kind].sum())
            in_buckets += bucket_stream_floor(problem.link(pg), kind, largest_of[pg, kind], total)(np.rint(carried))
        # what the group's own collectives that need not be inside add at most, with their stream time
        # counted (only beside the per-byte price, which adds up): full less this is spared
        spared = (grid.in_rectangles(full - np.maximum(lengthened, copy_out), mine, before_s, due_inside)
                  + grid.in_rectangles(full - np.maximum.reduce([lengthened, issue, copy_out]), mine, before_s,
                                       after_q)
                  + grid.in_rectangles(full - np.maximum(lengthened, issue), mine, inside, after_q))
        stream = np.maximum(per_byte / factor + spared, np.maximum(per_byte, in_buckets) / factor)
        gain = np.maximum(gain, stream - grid.work - overhead)
    return np.where(ii < jj, np.maximum(gain, 0.0), 0.0)


def _longest_windows(gain: np.ndarray, late: Callable[[], bool]) -> float:
    """The most total ``gain`` of windows that do not overlap (the next one's start at or after
    the last one's end), a longest path over the grid; at ``late`` the windows ending so far."""
    m = len(gain)
    best = np.zeros(m)  # per grid point q: the most over windows that all end by q
    for j in range(1, m):
        if j % 64 == 0 and late():
            return float(best[j - 1])
        best[j] = max(best[j - 1], float(np.max(best[:j] + gain[:j, j])))
    return float(best[-1]) if m else 0.0
