"""Valid inequalities of the positioned step model (``planner.search.free.model``): constraints every
plan of the candidate space meets, added so that CP-SAT's bound sees what its relaxation misses.

Why this exists: the model's clock is a max-plus chain whose stalls and stream order hold only
where a place literal is set, so with the literals fractional its linear relaxation gave nothing
beyond the compute (43.8 ms on llama3-8b-fsdp-2 graph order against 104.7 ms plans): a proof of
optimality had to enumerate. Three families close most of that:

- tails: a bucket ends before its latest wait place, and the compute after that place still
  runs;
- exclusions: a start or wait place at which a bucket's own output alone, over the graph's own
  bytes, is above the cap at an instant it must be alive is no place of its anchor's bucket in
  any plan within the cap, nor, for a gather, of a bucket it joins;
- phases: per place p, the buckets that must be waited before p run before the compute clock
  reaches p, with at least the compute from their latest wait place to p after them; the
  others run after it, except gather buckets started before p, whose members are alive at an
  instant of least room before p, so their bytes, and so their time, are bounded by that room.

Every one holds for every plan within the cap at the exact prices (``planner.simulate``'s), so the
bound stays a bound of the candidate space: tests/test_positioned.py checks the model's optimum
against brute force on tiny problems with a cap, and that real plans stay feasible.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from ortools.sat.python import cp_model

from planner.cost.curves import curve
from planner.cost.memory import INSTANTS_PER_POSITION, MemoryCounter, buffers_of
from planner.core.problem import Link
from planner.search.step import NS_PER_MS, to_ns


@dataclass
class StepTerms:
    """What ``add_positioned_step`` built that the cuts read: the step (``final``), each anchor's
    (launch, copy-in, copy-out, duration) and end, and the compute
    clock's static part (``compute_before(place)`` ns, ``total`` ns, the folded conversions'
    (position, ns), which may move into a bucket's copy-in), on the model's grid of ``scale``
    places per position."""

    final: cp_model.LinearExprT
    terms: dict
    end: dict
    compute_before: Callable[[int], int]
    total: int
    folded: list[tuple[int, int]]
    scale: int

    def compute_between(self, lo_place: int, hi_place: int | None) -> int:
        """The least compute (ns) the clock runs from ``lo_place`` to ``hi_place`` (None: the end),
        whatever moves into copy-ins."""
        lo = math.ceil(lo_place / self.scale)
        hi = math.inf if hi_place is None else math.ceil(hi_place / self.scale)
        moved = sum(ns for pos, ns in self.folded if lo <= pos < hi)
        upto = self.total if hi_place is None else self.compute_before(hi_place)
        return max(0, upto - self.compute_before(lo_place) - moved)


def folded_conversions(problem) -> list[tuple[int, int]]:
    """(position, ns) of every folded conversion, which may move into its bucket's copy-in."""
    by_name = {n.name: n for n in problem.nodes}
    return sorted((by_name[f].pos, to_ns(by_name[f].est_ms)) for c in problem.collectives for f in c.folded)


def add_tail_cuts(h) -> None:
    """final >= a bucket's end + its copy-out + the compute after its latest wait place. (The
    same over each stream's last frontier is valid too, but on a tiny problem of tests/
    test_positioned.py it kept CP-SAT from finding a 2-collective optimum in 20 s.)"""
    st, m, x = h.step, h.model, h.membership.x
    for a, end in st.end.items():
        tail = st.compute_between(max(place for place, _, _ in h.waits[a]), None)
        m.add(st.final >= end + st.terms[a][2] + tail).only_enforce_if(x[a, a])


def _alive_to(problem, c) -> float | None:
    """Up to which position a gather's bytes stay alive from its bucket's start, in one buffer or
    another (``planner.cost.memory.member_buffers``, alone or merged): its result until the wait,
    then the wait's storage until its last use. None where that last use is not known."""
    return buffers_of(problem, c).wait_last_use


def _least_alive_bytes(problem, c) -> int:
    """The fewest bytes a gather holds anywhere between its bucket's start and its last use."""
    b = buffers_of(problem, c)
    return min(b.out_bytes, c.wire_bytes, b.wait_bytes or 0)


class RoomProfile:
    """The room the cap leaves over the graph's own bytes at every instant (positions' scale),
    counted once: a plan's collectives must fit in it wherever they are alive."""

    def __init__(self, problem, cap_bytes: int):
        per = INSTANTS_PER_POSITION
        self.lo = -per  # a named place before the first node lies below 0
        hi = (max((n.pos for n in problem.nodes), default=0) + 2) * per
        instants = np.arange(self.lo, hi + 1, dtype=np.float64) / per
        self.room = cap_bytes - MemoryCounter.of(problem).own(instants).astype(np.int64)

    def least(self, lo_tick: int, hi_tick: int) -> tuple[int, int] | None:
        """(tick, room) of the least room in [lo_tick, hi_tick] (the earliest such), None if empty."""
        lo, hi = max(lo_tick, self.lo) - self.lo, min(hi_tick - self.lo, len(self.room) - 1)
        if hi < lo:
            return None
        k = int(np.argmin(self.room[lo:hi + 1]))
        return lo + k + self.lo, int(self.room[lo + k])


def exclude_places_over_cap(h, room: RoomProfile) -> set[int]:
    """Forbid an anchor's bucket every start or wait place at which the anchor's own output
    buffer (alone or merged, ``member_buffers``) would be alive, with the graph's own bytes, above
    the cap at some instant; a gather's bytes also stay alive to its last use. Only where it
    anchors: a collective that joins another bucket keeps its own start and wait literals set,
    and they mean nothing there; a gather that joins is kept instead from the bucket's start
    places where its own bytes break the cap before its last use. Returns the anchors'
    literals' indices."""
    m, problem, scale, x = h.model, h.problem, h.step.scale, h.membership.x
    per = INSTANTS_PER_POSITION
    excluded: set[int] = set()

    def over(lo_pos: float, hi_pos: float, nbytes: int) -> bool:
        found = room.least(math.ceil(lo_pos * per), math.floor(hi_pos * per))
        return nbytes > 0 and found is not None and found[1] < nbytes

    # per gather: from a start place s, is it over the cap before its last use (alone, whatever
    # its bucket)? the same test binds it as an anchor and as a joiner
    gathers = {}
    for c in h.membership.colls:
        coll = problem.collectives[c.idx]
        alive_to = _alive_to(problem, coll) if coll.kind == "all_gather" else None
        if alive_to is not None:
            least = _least_alive_bytes(problem, coll)
            gathers[c.idx] = lambda s, alive_to=alive_to, least=least: over(s, alive_to, least)
    for c in h.membership.colls:
        a, coll = c.idx, problem.collectives[c.idx]
        out_bytes = buffers_of(problem, coll).out_bytes
        w_min = min(place for place, _, _ in h.waits[a]) / scale
        s_max = max(place for place, _, _ in h.starts[a]) / scale
        for place, lit, _ in h.starts[a]:
            s = place / scale
            if over(s, w_min, out_bytes) or (a in gathers and gathers[a](s)):
                m.add_implication(x[a, a], lit.Not())
                excluded.add(lit.index)
        for place, lit, _ in h.waits[a]:
            if over(s_max, place / scale, out_bytes):
                m.add_implication(x[a, a], lit.Not())
                excluded.add(lit.index)
    # a gather that joins a bucket is alive from the bucket's start to its own last use too: a
    # clause per (member, start place); the anchor's own literals are set apart above
    for (i, a), member in x.items():
        if i != a and i in gathers:
            for place, lit, _ in h.starts[a]:
                if gathers[i](place / scale):
                    m.add_bool_or([member.Not(), lit.Not()])
    return excluded


def most_time_ms(link: Link, kind: str, budget: int, k: int) -> float:
    """The most time (ms) at most ``k`` collectives of ``kind`` holding ``budget`` bytes in all can
    take on ``link``: k times the least concave majorant of its curve at budget / k (Jensen; the
    curve is linear between its table's points)."""
    if k <= 0:
        return 0.0
    if budget <= 0:
        return k * link.time_ms(kind, 0)
    marks = sorted({0, budget, *curve(link, kind).bends(0, budget)})
    hull: list[tuple[int, float]] = []  # the upper concave hull of the curve's points (monotone chain)
    for b, t in ((b, link.time_ms(kind, b)) for b in marks):
        while len(hull) >= 2 and ((hull[-1][0] - hull[-2][0]) * (t - hull[-2][1])
                                  >= (hull[-1][1] - hull[-2][1]) * (b - hull[-2][0])):
            hull.pop()
        hull.append((b, t))
    # its running maximum, so that more bytes never take less (a table may fall at its end)
    top = max(range(len(hull)), key=lambda i: hull[i][1])
    x = min(budget / k, hull[top][0])
    i = max(0, bisect.bisect_right([b for b, _ in hull], x) - 1)
    if i + 1 >= len(hull):
        return k * hull[i][1]
    (b0, t0), (b1, t1) = hull[i], hull[i + 1]
    return k * (t0 + (t1 - t0) * (x - b0) / (b1 - b0))


def add_phase_cuts(h, room: RoomProfile | None, excluded: set[int]) -> int:
    """The phase inequalities (module docstring), per stream and candidate place; returns how many."""
    st, colls = h.step, h.membership.colls
    members = h.membership.candidate_members()
    by_pg: dict[str, list[int]] = {}
    for a in st.terms:
        by_pg.setdefault(colls[a].pg, []).append(a)
    added = 0
    for pg, anchors in by_pg.items():
        added += _phase_cuts_of_stream(h, anchors, members, room, excluded)
    return added


def _phase_cuts_of_stream(h, anchors: list[int], members: dict, room: RoomProfile | None,
                          excluded: set[int]) -> int:
    st, m, problem = h.step, h.model, h.problem
    link = problem.link(h.membership.colls[anchors[0]].pg)
    # a collective with no place left cannot anchor (exclude_places_over_cap): it adds nothing
    anchors = [a for a in anchors if any(lit.index not in excluded for _, lit, _ in h.waits[a])
               and any(lit.index not in excluded for _, lit, _ in h.starts[a])]
    if not anchors:
        return 0
    latest_wait = {a: max(p for p, lit, _ in h.waits[a] if lit.index not in excluded) for a in anchors}
    start_places = {a: sorted(p for p, lit, _ in h.starts[a] if lit.index not in excluded) for a in anchors}
    every_start = sorted({p for ps in start_places.values() for p in ps})
    first = every_start[0]
    first_issue = st.compute_between(0, first) if first > 0 else 0  # nothing is issued earlier
    added = 0
    for p in sorted(set(latest_wait.values()) | set(every_start)):
        before = [a for a in anchors if latest_wait[a] < p]
        after = [a for a in anchors if latest_wait[a] >= p and start_places[a][0] >= p]
        if not before or not after:
            continue
        gap = min(st.compute_between(latest_wait[a], p) for a in before)
        head = first_issue + sum(st.terms[a][3] for a in before) + gap
        for counted, early_ns in [(after, 0), *_early_variant(h, after, anchors, members, p, room, latest_wait,
                                                              start_places, every_start, link)]:
            tail = min(st.compute_between(latest_wait[a], None) for a in counted)
            m.add(st.final >= head + sum(st.terms[a][3] for a in counted) - early_ns + tail)
            added += 1
    return added


def _early_variant(h, after, anchors, members, p: int, room: RoomProfile | None, latest_wait, start_places,
                   every_start, link) -> list[tuple[list[int], int]]:
    """The buckets not waited before p, those that may start before it too when they are
    gather buckets: what those early ones can take of the stream is at most the time of the
    bytes that fit the least room from the last place before p on (their members are all alive
    there), plus the bytes of members that need not be."""
    if room is None:
        return []
    before_p = bisect.bisect_left(every_start, p)  # the start places before p
    if not before_p:
        return []
    per, scale, problem, colls = INSTANTS_PER_POSITION, h.step.scale, h.problem, h.membership.colls
    least = room.least(math.ceil(every_start[before_p - 1] / scale * per), math.floor(p / scale * per))
    if least is None or least[1] < 0:
        return []
    tick, space = least
    counted, eligible, free = list(after), set(), {}
    for a in anchors:
        if latest_wait[a] < p or start_places[a][0] >= p:
            continue
        if not all(colls[j].key[0] == "all_gather" for j in members[a]):
            continue
        counted.append(a)
        for j in members[a]:
            c = problem.collectives[colls[j].idx]
            alive_to = _alive_to(problem, c)
            if alive_to is not None and alive_to * per > tick and _least_alive_bytes(problem, c) == c.wire_bytes:
                if c.wire_bytes <= space:
                    eligible.add(j)
            else:
                free[j] = c.wire_bytes
    if len(counted) == len(after):
        return []
    k = len(eligible) + len(free)
    early_ms = most_time_ms(link, "all_gather", space + sum(free.values()), k)
    return [(counted, math.ceil(early_ms * NS_PER_MS) + k)]  # + 1 ns per bucket: the model's rounding
