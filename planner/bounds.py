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

import math
from dataclasses import dataclass, field

import numpy as np
from ortools.sat.python import cp_model

from planner.problem import Problem

# Deterministic effort for one key's bin packing (CP-SAT's deterministic time, one worker: the
# bound is reproducible). Measured: the 8-layer MoE keys (4-5 distinct sizes, 27-53 items) prove
# in under 0.05 s; an unproved packing still yields CP-SAT's bound, which is valid.
BIN_PACKING_DETERMINISTIC_S = 2.0
BIN_PACKING_WALL_S = 20.0


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


def bin_packing_bound(sizes: list[int], cap: int) -> int:
    """Fewest buckets of ``cap`` bytes that hold items of these sizes -- or, when the small model
    is not proved within its effort, CP-SAT's bound on it, which is still a lower bound.

    An item over the cap is a bucket of its own (the cap applies to merges only)."""
    over = sum(1 for s in sizes if s > cap)
    items = [s for s in sizes if s <= cap]
    if not items:
        return over
    by_volume = max(1, math.ceil(sum(items) / cap))
    upper = _first_fit_decreasing(items, cap)
    if upper <= by_volume:
        return over + upper
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
    solver.parameters.catch_sigint_signal = False  # Ctrl-C is ours (solver._run_search)
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = 0
    solver.parameters.max_deterministic_time = BIN_PACKING_DETERMINISTIC_S
    solver.parameters.max_time_in_seconds = BIN_PACKING_WALL_S
    code = solver.solve(m)
    if code == cp_model.OPTIMAL:
        return over + round(solver.objective_value)
    if code == cp_model.FEASIBLE or code == cp_model.UNKNOWN:
        return over + max(by_volume, math.ceil(solver.best_objective_bound - 1e-9))
    raise AssertionError(f"bin packing of {len(items)} items cannot be infeasible (status {solver.status_name(code)})")


def fixed_limits(problem: Problem) -> dict[str, tuple[int, int]]:
    """Per collective (start name): (position of the last fixed predecessor of its start, position
    of the first fixed consumer of its wait). Whatever a plan does, its final start lies after the
    first and its final wait before the second (rule 9): fixed nodes never move."""
    index = {n.name: i for i, n in enumerate(problem.nodes)}
    pos = [n.pos for n in problem.nodes]
    succ: dict[int, list[int]] = {}
    for i, n in enumerate(problem.nodes):
        for d in n.deps:
            succ.setdefault(d, []).append(i)
    out = {}
    for c in problem.collectives:
        s_lo = max((pos[d] for d in problem.nodes[index[c.name]].deps
                    if problem.nodes[d].kind not in ("start", "wait")), default=-1)
        w_hi = min((pos[t] for t in succ.get(index[c.wait], []) if problem.nodes[t].kind != "start"),
                   default=problem.n_scheduled + 1)
        out[c.name] = (s_lo, w_hi)
    return out


def lower_bound(problem: Problem, objective: str = "count", protect_partly: bool = False) -> float:
    """A lower bound on ``objective`` valid for every feasible plan.

    For ``exposure`` (exposure x (n+1) + count, see planner.cpsat.TimeTerms) only the count part is
    bounded: exposure can be zero as far as this bound knows.
    """
    return float(sum(key_lower_bounds(problem, protect_partly).values()))


def key_lower_bounds(problem: Problem, protect_partly: bool = False) -> dict[tuple, int]:
    """Per bucket key (kind, process group, key): the fewest buckets any feasible plan leaves."""
    index = {n.name: i for i, n in enumerate(problem.nodes)}
    pos = [n.pos for n in problem.nodes]
    limits = fixed_limits(problem)
    # hiding nodes of protected (fully hidden) collectives: their owners stay alone (rule 4)
    protected_hiders = {h for c in problem.collectives if c.status == "hidden" for h in c.hiding}
    groups: dict[tuple, list] = {}
    for c in problem.collectives:
        groups.setdefault((c.kind, c.pg, c.key), []).append(c)
    out: dict[tuple, int] = {}
    for group_key, cs in groups.items():
        alone = [c for c in cs if any(n in protected_hiders for n in c.merge_replaces)]
        rest = [c for c in cs if not any(n in protected_hiders for n in c.merge_replaces)]
        need = len(alone)
        if rest:
            starts, waits = [], []
            for c in rest:
                s_lo, w_hi = limits[c.name]
                is_protected = c.status == "hidden" or (protect_partly and c.status == "partly")
                hp = sorted(pos[index[h]] for h in c.hiding) if is_protected else []
                s_hi = hp[0] if hp else w_hi
                w_lo = hp[-1] if hp else s_lo
                starts.append((s_lo, s_hi))
                waits.append((w_lo, w_hi))
            by_interval = max(_max_disjoint(starts), _max_disjoint(waits), 1)
            need += max(by_interval, bin_packing_bound([c.size_bytes for c in rest], problem.bucket_cap_bytes))
        out[group_key] = need
    return out


@dataclass(frozen=True)
class StepFloor:
    """A step time no plan can beat (ms), and where it comes from.

    ``compute_ms``: the compute stream's own work plus the launches of the fewest collectives any
    plan leaves (``key_lower_bounds``); copies can be zero. ``stream_ms``: per process group, the
    least time its FIFO stream is busy: per bucket key, the cost curve's subadditive minorant at
    the key's total bytes with that fewest number of buckets (``_key_stream_floor``). The step
    lasts at least as long as any stream is busy and as the compute stream's work.
    ``ordered_ms``: per process group, ``release_tail_floor`` (when the fixed order lets its
    collectives run, and the compute that must follow them).
    """

    floor_ms: float
    compute_ms: float
    stream_ms: dict[str, float]
    ordered_ms: dict[str, float] = field(default_factory=dict)  # release_tail_floor


def _minorant_lines(link, kind: str, total: int) -> tuple[np.ndarray, np.ndarray]:
    """Lines g(b) = c + s*b with c >= 0 that lie below the link's cost curve f on [0, total]:
    intercepts ``c`` and slopes ``s``. The slopes searched are those of the chords from every
    breakpoint to ``total`` (and 0); c(s) = min over breakpoints of f(b) - s*b (f is linear
    between breakpoints, so the minimum over [0, total] is at one of them)."""
    if link.table is None:
        fixed = link.fixed_ms(kind)
        return np.array([fixed]), np.array([(link.time_ms(kind, total) - fixed) / max(total, 1)])
    pts = [(b, t) for b, t in link.table[kind] if b < total] + [(total, link.time_ms(kind, total))]
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


def release_tail_floor(problem: Problem) -> dict[str, float]:
    """Per process group, a floor from when its collectives can run and what must follow them
    (the one-machine bound of Jackson / Carlier with release and tail times).

    Node order is fixed, so whatever the plan, collective j's bucket is issued after the compute
    of every node up to its last fixed predecessor (``fixed_limits``) -- its release r_j -- and
    waited before its first fixed consumer, after which the compute of every later node still
    runs -- its tail q_j. A bucket takes at least c + s*bytes on its kind's best line below the
    cost curve (``_minorant_lines``), so it holds the FIFO stream at least p_j = s*bytes per member
    and c once. For any set S of one group's collectives the stream serves all their buckets
    after min r, one at a time, and the step lasts until the last one ends plus its tail:
    step >= min_S r + sum_S p + c_min + min_S q. Every S of the form {r >= R, q >= Q} is tried."""
    limits = fixed_limits(problem)
    order = sorted(problem.nodes, key=lambda n: n.pos)
    pos = np.array([n.pos for n in order])
    work = np.cumsum([n.est_ms if n.kind in ("compute", "other") else 0.0 for n in order])
    total_work = float(work[-1]) if len(work) else 0.0

    def work_through(p: int) -> float:  # compute of the nodes at positions <= p
        k = int(np.searchsorted(pos, p, side="right"))
        return float(work[k - 1]) if k else 0.0

    by_pg: dict[str, list] = {}
    for c in problem.collectives:
        by_pg.setdefault(c.pg, []).append(c)
    out: dict[str, float] = {}
    for pg, cs in by_pg.items():
        link = problem.link(pg)
        totals: dict[str, int] = {}
        for c in cs:
            totals[c.kind] = totals.get(c.kind, 0) + c.wire_bytes
        best = {}
        for kind, total in totals.items():  # the line that prices one bucket of everything highest
            lc, ls = _minorant_lines(link, kind, total)
            i = int(np.argmax(lc + ls * total)) if len(lc) else None
            best[kind] = (float(lc[i]), float(ls[i])) if i is not None else (0.0, 0.0)
        c_min = min(c for c, _ in best.values())
        r = np.array([work_through(limits[c.name][0]) for c in cs])
        q = np.array([total_work - work_through(limits[c.name][1] - 1) for c in cs])
        p = np.array([best[c.kind][1] * c.wire_bytes for c in cs])
        floor = 0.0
        for release in np.unique(r):
            mask = r >= release
            tails, holds = q[mask], p[mask]
            by_tail = np.argsort(-tails, kind="stable")
            floor = max(floor, float((release + np.cumsum(holds[by_tail]) + tails[by_tail]).max()) + c_min)
        out[pg] = floor
    return out


def step_floor(problem: Problem) -> StepFloor:
    """The floor of ``planner.simulate``'s step time over every feasible plan (see ``StepFloor``)."""
    need = key_lower_bounds(problem)
    totals: dict[tuple, int] = {}
    for c in problem.collectives:
        k = (c.kind, c.pg, c.key)
        totals[k] = totals.get(k, 0) + c.wire_bytes
    stream: dict[str, float] = {}
    for (kind, pg, key), total in totals.items():
        stream[pg] = stream.get(pg, 0.0) + _key_stream_floor(problem.link(pg), kind, total, need[(kind, pg, key)])
    compute = sum(n.est_ms for n in problem.nodes if n.kind in ("compute", "other"))
    if problem.bucketing is not None:
        compute += problem.bucketing.launch_ms * sum(need.values())
    ordered = release_tail_floor(problem)
    return StepFloor(floor_ms=max([compute, *stream.values(), *ordered.values()]), compute_ms=compute,
                     stream_ms=stream, ordered_ms=ordered)
