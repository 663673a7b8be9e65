"""The step model with positions: CP-SAT chooses each bucket's members *and* where it starts and
waits, among candidate places, and minimizes ``planner.simulate``'s step exactly (ns).

Why this exists: the plans that beat torch's manual per-block pass issue a block's gathers a block
ahead and wait reduce_scatters late, which no anchored plan can (``planner.core.positions``). A local
search found them (``planner.search.free.position_search``) but cannot say how far they are from the best.
Here the same plans are a CP-SAT model, so a solve returns a plan *and* a bound valid over every
plan of the candidate space.

The candidate space (``Candidates``): each bucket is represented by its anchor ``a`` (a member,
as in ``planner.search.cpsat``), its members are same-key collectives within a window of ``a``, and it
starts at ``a``'s own start or just before one of the pinned nodes named for ``a``, and waits at
a member's own wait or just before one of the nodes named for ``a``. The names come from the
problem (a gather prefetched before the previous same-key collectives' waits, issued as early as
its data allow; a reduce_scatter's wait deferred past the next same-key starts, or as late as its
consumers allow) and from any plans given (the per-block seed, the positioned search's, CP-SAT's
anchored one). Overlap is priced, not protected (the positioned policy: rules 4, 7 and 8 off).

The time model (the simulator as a max-plus recurrence over the candidate places, on a grid of
quarters: an anchored event at ``SCALE * pos``, a named start at ``SCALE * pos(node) - 1``, a
named wait at ``SCALE * pos(node) - 2``, as ``planner.core.positions`` orders them; several starts
at one place in one fixed order of the anchors, which ``extract`` writes the plan's buckets in: the
first plan given's own order, so the space holds that plan as it is): the compute clock ``T`` after each event; a bucket
started there is issued at ``T`` after its launch and copy-in, and
holds its group's FIFO stream from ``max(issue, the stream's frontier)`` for its duration (the
frontier is a running maximum of the ends of the buckets started before, per group); a wait
there stalls ``T`` until its bucket ends, then its copy-out runs. Durations, launches and copies
are ``planner.search.step``'s terms (exact for α-β links, within ns for tables). Inequalities every
plan of the space meets (``planner.search.free.cuts``: tails, places over the cap, phases)
give CP-SAT's bound what the relaxation of this chain misses.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from ortools.sat.python import cp_model

from planner.cost.bounds import BucketReach
from planner.search.free.cuts import (RoomProfile, StepTerms, add_phase_cuts, add_tail_cuts,
                                            exclude_places_over_cap, folded_conversions)
from planner.search.cpsat import ModelHandle, prepare_collectives, build_tick
from planner.core.problem import Bucket, Plan, Problem
from planner.search.step import NS_PER_MS, bucket_terms, compute_prefix, horizon_ns, to_ns, pieces_by_key
from planner.cost.bounds import per_byte_floors

SCALE = 4
NAMED_START, NAMED_WAIT = 1, 2  # below SCALE * pos(node): planner.core.positions' 0.25 and 0.5
# same-key neighbours a bucket's members may come from (either side of its anchor)
WINDOW = 16
# previous same-key waits a gather may be prefetched before, next same-key starts a
# reduce_scatter or all_reduce wait may be deferred past
PREFETCH, DEFER = 2, 2


@dataclass
class Candidates:
    """Per anchor (collective name): the pinned nodes its bucket may start just before, and those
    it may wait just before, besides its own start and its members' own waits."""

    starts: dict[str, set[str]] = field(default_factory=dict)
    waits: dict[str, set[str]] = field(default_factory=dict)
    joins: set[tuple[str, str]] = field(default_factory=set)  # (member, anchor) of the plans given, any window
    # the anchors of the first plan given, in its buckets' order: the order of several starts at
    # one place (``issue_ranks``)
    issue_order: tuple[str, ...] = ()

    def add(self, anchor: str, start: str | None, wait: str | None) -> None:
        if start is not None:
            self.starts.setdefault(anchor, set()).add(start)
        if wait is not None:
            self.waits.setdefault(anchor, set()).add(wait)


def candidates(problem: Problem, plans: Iterable[Plan] = ()) -> Candidates:
    """The named places of the candidate space (module docstring): from the problem's order and
    from every positioned bucket of ``plans``."""
    from planner.cost.bounds import fixed_limits

    out = Candidates()
    nodes = problem.nodes
    names = [n.name for n in nodes]
    index = {n.name: i for i, n in enumerate(nodes)}
    after = {n.pos: i for i, n in enumerate(nodes)}
    limits = fixed_limits(problem)
    by_key: dict[tuple, list] = {}
    for c in problem.collectives:
        by_key.setdefault((c.kind, c.pg, c.key), []).append(c)
    for key, cs in by_key.items():
        cs.sort(key=lambda c: c.start_pos)
        for k, c in enumerate(cs):
            s_lo, w_hi = limits[c.name]
            first = next((i for i in range(len(nodes)) if nodes[i].pos > s_lo), None)
            if first is not None and first < index[c.name]:
                out.add(c.name, names[first], None)  # as early as its data allow
            if key[0] == "all_gather":
                for prev in cs[max(0, k - PREFETCH):k]:
                    if index[prev.wait] < index[c.name]:
                        out.add(c.name, names[index[prev.wait]], None)  # prefetched before an earlier wait
            else:
                for nxt in cs[k + 1:k + 1 + DEFER]:
                    j = index[nxt.name] + 1
                    if j < len(nodes) and j > index[c.wait]:
                        out.add(c.name, None, names[j])  # deferred past a later start
                last = after.get(w_hi)
                if last is not None and last > index[c.wait] + 1:
                    out.add(c.name, None, names[last])  # as late as its consumers allow
    for k, plan in enumerate(plans):
        if k == 0:
            out.issue_order = tuple(b.start for b in plan.buckets)
        for b in plan.buckets:
            out.add(b.start, b.issue_before, b.wait_before)
            out.joins.update((m, b.start) for m in b.members if m != b.start)
    return out


def issue_ranks(colls, issue_order: Iterable[str]) -> dict[int, tuple]:
    """A total order of the anchors for several starts at one place (the simulator issues those in
    plan order): the anchors of ``issue_order`` in that order, every other one by its scheduled
    start among them (before the first listed anchor scheduled after it). Why: the positioned
    search writes buckets in any order, and a fixed order by schedule left such a plan out of the
    space (measured: a 105.25 ms plan of llama3-8b-fsdp-2 priced 111.77 ms in the model, its
    seven starts before one node taken in another order), so CP-SAT began 6.5 ms behind it."""
    by_name = {c.name: c.idx for c in colls}
    listed = list(dict.fromkeys(by_name[n] for n in issue_order if n in by_name))
    ranks = {a: (k, 1, 0) for k, a in enumerate(listed)}
    for c in colls:
        if c.idx not in ranks:
            k = next((k for k, a in enumerate(listed) if colls[a].s > c.s), len(listed))
            ranks[c.idx] = (k, 0, c.s)
    return ranks


@dataclass
class PositionedHandle:
    """The model, its membership (a ``ModelHandle``, so ``planner.search.step``'s terms apply), and where
    each anchor's bucket may start and wait: ``starts[a]`` / ``waits[a]`` list ``(place, literal,
    what)`` with ``what`` None for the anchor's own start, a member index for a member's own wait,
    or a node name for a named place."""

    problem: Problem
    model: cp_model.CpModel
    membership: ModelHandle
    starts: dict[int, list[tuple[int, cp_model.IntVar, object]]]
    waits: dict[int, list[tuple[int, cp_model.IntVar, object]]]
    stats: dict = field(default_factory=dict)
    final: cp_model.LinearExprT = 0
    slack_ns: int = 0
    step: StepTerms | None = None  # what add_positioned_step built (planner.search.free.cuts reads it)
    ranks: dict[int, tuple] = field(default_factory=dict)  # issue_ranks: several starts at one place

    def extract(self, solver: cp_model.CpSolver, *, params: dict, created: str = "") -> Plan:
        h = self.membership
        members: dict[int, list[int]] = {}
        for (i, a), var in h.x.items():
            if solver.boolean_value(var):
                members.setdefault(a, []).append(i)
        buckets = []
        for a, ms in sorted(members.items(), key=lambda kv: self.ranks[kv[0]]):
            start = next(what for _, lit, what in self.starts[a] if solver.boolean_value(lit))
            wait = next(what for _, lit, what in self.waits[a] if solver.boolean_value(lit))
            if len(ms) < 2 and start is None and isinstance(wait, int):
                continue  # alone where it was scheduled: no bucket to write
            ms.sort(key=lambda i: h.colls[i].s)
            buckets.append(Bucket(members=tuple(h.colls[i].name for i in ms), start=h.colls[a].name,
                                  wait=h.colls[wait if isinstance(wait, int) else a].name,
                                  issue_before=start, wait_before=wait if isinstance(wait, str) else None))
        return Plan(problem_fingerprint=self.problem.fingerprint, planner="bucketplan positioned cpsat",
                    params=params, created=created, buckets=tuple(buckets))

    def add_hint(self, plan: Plan) -> int:
        """Hint a plan's membership and places; returns how many of its buckets fit the model."""
        h = self.membership
        by_name = {c.name: c.idx for c in h.colls}
        anchor_of = {i: i for i in range(len(h.colls))}
        start_of: dict[int, object] = {}
        wait_of: dict[int, object] = {}
        fitted = 0
        for b in plan.buckets:
            a = by_name[b.start]
            ms = [by_name[m] for m in b.members]
            s_what = b.issue_before
            w_what = b.wait_before if b.wait_before is not None else by_name[b.wait]
            fits = (all((i, a) in h.x for i in ms) and any(what == s_what for _, _, what in self.starts[a])
                    and any(what == w_what for _, _, what in self.waits[a]))
            if fits:
                fitted += 1
                for i in ms:
                    anchor_of[i] = a
                start_of[a], wait_of[a] = s_what, w_what
        for (i, a), var in h.x.items():
            self.model.add_hint(var, anchor_of[i] == a)
        for a, options in self.starts.items():
            for _, lit, what in options:
                self.model.add_hint(lit, start_of.get(a) == what)
        for a, options in self.waits.items():
            own = wait_of.get(a, a)
            for _, lit, what in options:
                self.model.add_hint(lit, own == what)
        return fitted


def build_positioned_model(problem: Problem, found: Candidates, *, window: int = WINDOW) -> PositionedHandle:
    """The membership and places of the candidate space, and the rules that hold in it (module
    docstring): one bucket per collective, anchors are members, the cap, same key, each bucket's
    start before its wait, every dependence kept (rule 9) at the places chosen."""
    m = cp_model.CpModel()
    colls = prepare_collectives(problem)
    cap = problem.bucket_cap_bytes
    index = {n.name: i for i, n in enumerate(problem.nodes)}
    pos_of = {n.name: n.pos for n in problem.nodes}
    x: dict[tuple[int, int], cp_model.IntVar] = {}
    joiners: dict[int, list[int]] = {c.idx: [] for c in colls}
    by_key: dict[tuple, list] = {}
    for c in colls:
        by_key.setdefault(c.key, []).append(c)
    by_name = {c.name: c for c in colls}
    given = {}
    for member, anchor in found.joins:
        given.setdefault(member, []).append(by_name[anchor])
    named_start_places = {c.idx: _named_start_places(c, found, pos_of) for c in colls}
    for group in by_key.values():
        group.sort(key=lambda c: c.s)
        for r, c in enumerate(group):
            build_tick(len(x))
            near = [a for a in group[max(0, r - window):r + window + 1] if a.idx != c.idx]
            near += [a for a in given.get(c.name, ()) if a not in near]
            for a in [c] + near:
                if a.idx != c.idx and (c.size + a.size > cap or not _may_join(c, a, named_start_places[a.idx])):
                    continue
                x[c.idx, a.idx] = m.new_bool_var(f"x[{c.name},{a.name}]")
                if a.idx != c.idx:
                    joiners[a.idx].append(c.idx)
    for c in colls:
        m.add_exactly_one(x[c.idx, a] for (i, a) in x if i == c.idx)
    for (i, a), var in x.items():
        if i != a:
            m.add_implication(var, x[a, a])
    for a, js in joiners.items():
        if js and sum(colls[j].size for j in js) + colls[a].size > cap:
            m.add(sum(colls[j].size * x[j, a] for j in js) <= (cap - colls[a].size) * x[a, a])
    starts: dict[int, list] = {}
    waits: dict[int, list] = {}
    y: dict[tuple[int, int], cp_model.IntVar] = {}
    named_starts: dict[int, list] = {}
    named_waits: dict[int, list] = {}
    for c in colls:
        a = c.idx
        own = m.new_bool_var(f"start_own[{c.name}]")
        starts[a] = [(SCALE * c.s, own, None)]
        for place, node in named_start_places[a]:
            lit = m.new_bool_var(f"start[{c.name}<{node}]")
            m.add_implication(lit, x[a, a])
            starts[a].append((place, lit, node))
            named_starts.setdefault(place, []).append(lit)
        waits[a] = []
        for b in [a] + [j for j in joiners[a] if colls[j].w < c.w_hi]:  # a bucket waits before a's consumers
            y[a, b] = m.new_bool_var(f"y[{c.name},{colls[b].name}]")
            if b != a:
                m.add_implication(y[a, b], x[b, a])
            waits[a].append((SCALE * colls[b].w, y[a, b], b))
        for node in sorted(found.waits.get(c.name, ()), key=pos_of.__getitem__):
            place = SCALE * pos_of[node] - NAMED_WAIT
            if place >= SCALE * c.w_hi:
                continue  # after one of a's consumers: no place for a's bucket
            lit = m.new_bool_var(f"wait[{c.name}<{node}]")
            m.add_implication(lit, x[a, a])
            waits[a].append((place, lit, node))
            named_waits.setdefault(place, []).append(lit)
        m.add_exactly_one(lit for _, lit, _ in starts[a])
        m.add_exactly_one(lit for _, lit, _ in waits[a])
    _places_keep_dependencies(m, colls, x, starts, waits, index)
    _alone_keeps_its_conversion(m, problem, colls, x, joiners, starts)
    membership = ModelHandle(problem=problem, model=m, colls=colls, x=x, y=y, fs={}, fw={}, bw={},
                             objective="step", window=window)
    stats = {"x_vars": len(x), "named_starts": sum(len(v) for v in named_starts.values()),
             "named_waits": sum(len(v) for v in named_waits.values())}
    return PositionedHandle(problem, m, membership, starts, waits, stats,
                            ranks=issue_ranks(colls, found.issue_order))


def _named_start_places(c, found: Candidates, pos_of: dict) -> list[tuple[int, str]]:
    """(place, node) of the named starts of ``c``'s bucket that ``c``'s own data allow: after its
    fixed predecessors and before its consumers (rule 9 holds for the anchor as for any member)."""
    places = ((SCALE * pos_of[node] - NAMED_START, node) for node in found.starts.get(c.name, ()))
    return sorted((place, node) for place, node in places if SCALE * c.s_lo < place < SCALE * c.w_hi)


def _may_join(c, a, named_places: list[tuple[int, str]]) -> bool:
    """Whether ``c`` can be a member of ``a``'s bucket at all: one of its start places lies after
    both their fixed predecessors and before both their consumers (every member's start and wait
    are the bucket's). Pruning what no plan can use tightens the relaxation the cuts read."""
    lo, hi = SCALE * max(c.s_lo, a.s_lo), SCALE * min(c.w_hi, a.w_hi)
    return any(lo < place < hi for place in [SCALE * a.s, *(p for p, _ in named_places)])


def _alone_keeps_its_conversion(m: cp_model.CpModel, problem: Problem, colls, x, joiners, starts) -> None:
    """A collective alone in its bucket keeps its folded conversion where it was scheduled
    (``planner.core.positions``: only a bucket of two or more runs it as its copy-in), so a named
    start of that bucket follows the conversion, as its own start does."""
    pos_of = {n.name: n.pos for n in problem.nodes}
    for c in colls:
        folded = problem.collectives[c.idx].folded
        early = [lit for place, lit, what in starts[c.idx]
                 if what is not None and place <= SCALE * max(pos_of[f] for f in folded)] if folded else []
        if not early:
            continue
        alone = m.new_bool_var(f"alone[{c.name}]")  # forced true when nothing joins c's own bucket
        m.add_bool_or([x[c.idx, c.idx].Not(), *(x[j, c.idx] for j in joiners[c.idx]), alone])
        for lit in early:
            m.add_implication(alone, lit.Not())


def _places_keep_dependencies(m: cp_model.CpModel, colls, x, starts, waits, index) -> None:
    """Rule 9 at the places chosen: every member's bucket starts after the member's fixed
    predecessors and after the waits it consumes (a folded conversion's too: it runs right before
    the start), waits before the member's fixed consumers, and starts before it waits."""
    # the latest place any start or wait may take (a wait deferred past every collective's own)
    top = max((p for opts in (*starts.values(), *waits.values()) for p, _, _ in opts), default=0) + SCALE
    st = {a: sum(p * lit for p, lit, _ in opts) for a, opts in starts.items()}
    wt = {a: sum(p * lit for p, lit, _ in opts) for a, opts in waits.items()}
    # a named place before the first node lies below 0
    fs = {c.idx: m.new_int_var(-SCALE, top, f"FS4[{c.name}]") for c in colls}
    fw = {c.idx: m.new_int_var(-SCALE, top, f"FW4[{c.name}]") for c in colls}
    for (i, a), var in x.items():
        m.add(fs[i] == st[a]).only_enforce_if(var)
        m.add(fw[i] == wt[a]).only_enforce_if(var)
    for c in colls:
        build_tick()
        m.add(st[c.idx] < wt[c.idx])
        m.add(fs[c.idx] > SCALE * c.s_lo)
        if c.w_hi < (1 << 60):
            m.add(fw[c.idx] < SCALE * c.w_hi)
        for j in c.wait_preds_of_start:
            m.add(fw[j] < fs[c.idx])
        for j, _ in c.folded_wait_preds:
            m.add(fw[j] < fs[c.idx])


def add_positioned_step(h: PositionedHandle, *, floor_ms: float = 0.0) -> None:
    """Make the model minimize the simulated step (ns) over the places chosen (module docstring)."""
    problem, m, mh = h.problem, h.model, h.membership
    colls, x = mh.colls, mh.x
    members = mh.candidate_members()
    anchors = sorted(members, key=lambda a: colls[a].s)
    reach = BucketReach(member={}, anchored={problem.collectives[colls[a].idx].name: _anchored_reach(
        problem, [colls[i].idx for i in members[a]], colls[a].idx) for a in anchors})
    positions, prefix, total = compute_prefix(problem)

    def compute_before(place: int) -> int:
        import bisect

        return prefix[bisect.bisect_left(positions, math.ceil(place / SCALE))]

    magnitude = min(50, 61 - math.ceil(math.log2(len(anchors) + 1)) - 2)
    pieces = pieces_by_key(problem, mh, members, anchors, reach)
    terms, away = bucket_terms(m, mh, problem, anchors, members, magnitude, reach, per_byte_floors(problem), pieces)
    horizon = horizon_ns(problem, _full_reach(problem, reach), total)
    at_place: dict[int, list[tuple[str, int, object]]] = {}
    for a in anchors:
        for place, lit, _ in h.starts[a]:
            at_place.setdefault(place, []).append(("s", a, lit))
        for place, lit, what in h.waits[a]:
            # a collective that anchors nothing keeps its own wait, which then does nothing
            active = [lit, x[a, a]] if what == a else [lit]
            at_place.setdefault(place, []).append(("w", a, active))
    issue = {a: m.new_int_var(0, horizon, f"issue[{colls[a].name}]") for a in anchors}
    begin = {a: m.new_int_var(0, horizon, f"begin[{colls[a].name}]") for a in anchors}
    end = {a: m.new_int_var(0, horizon, f"end[{colls[a].name}]") for a in anchors}
    for a in anchors:
        m.add(begin[a] >= issue[a])
        m.add(end[a] >= begin[a] + terms[a][3])
    frontier: dict[str, cp_model.LinearExprT] = {}
    clock: cp_model.LinearExprT = 0
    prev = 0
    n_events = 0
    for place in sorted(at_place):
        build_tick()
        here = compute_before(place)
        clock = clock + here - prev - away.take(math.ceil(place / SCALE))
        prev = here
        # several buckets may start (or wait) before one node: the simulator takes them in plan
        # order, which is the ranks' order (``extract``); each is a step of the chain here
        for kind, a, lit in sorted(at_place[place], key=lambda e: h.ranks[e[1]]):
            n_events += 1
            if kind == "s":
                launch, copy_in, _, _ = terms[a]
                overhead = m.new_int_var(0, horizon, f"overhead[{colls[a].name},{place}]")
                m.add(overhead >= launch + copy_in).only_enforce_if(lit)
                t = m.new_int_var(0, horizon, f"T[{colls[a].name},{place}]")
                m.add(t == clock + overhead)
                m.add(issue[a] >= t).only_enforce_if(lit)
                pg = colls[a].pg
                if pg in frontier:
                    m.add(begin[a] >= frontier[pg]).only_enforce_if(lit)
                f = m.new_int_var(0, horizon, f"frontier[{colls[a].name},{place}]")
                if pg in frontier:
                    m.add(f >= frontier[pg])
                m.add(f >= end[a]).only_enforce_if(lit)
                frontier[pg] = f
            else:
                stalled = m.new_int_var(0, horizon, f"stalled[{colls[a].name},{place}]")
                m.add(stalled >= clock)
                m.add(stalled >= end[a]).only_enforce_if(lit)
                copy_out = m.new_int_var(0, horizon, f"copy_out[{colls[a].name},{place}]")
                m.add(copy_out >= terms[a][2]).only_enforce_if(lit)
                t = m.new_int_var(0, horizon, f"T[{colls[a].name},{place}]")
                m.add(t == stalled + copy_out)
            clock = t
    final = clock + (total - prev) - away.take(None)
    h.slack_ns = n_events + len(anchors)  # one ns of rounding per event and per duration
    m.add(final >= max(0, to_ns(floor_ms) - h.slack_ns))
    m.minimize(final)
    h.final = final
    h.stats.update(step_events=n_events, step_anchors=len(anchors))
    h.step = StepTerms(final, terms, end, compute_before, total, folded_conversions(problem), SCALE)
    add_tail_cuts(h)


def _anchored_reach(problem: Problem, members: list[int], anchor: int) -> int:
    """The most wire bytes the bucket ``anchor`` may anchor can carry: its candidate members' in
    all, and, once anything joins it, no more than the cap allows (its members' sizes fit
    ``bucket_cap_bytes``, so its wire bytes are at most the cap times their largest wire/size
    ratio). The duration's per-byte price is read at this reach: above the cap it would price
    bytes at a bandwidth no bucket of the space reaches."""
    cs = problem.collectives
    wire = sum(cs[i].wire_bytes for i in members)
    # the largest (cap * wire / size), floored: integers, so no rounding can lift it past the truth
    capped = max((problem.bucket_cap_bytes * cs[i].wire_bytes // cs[i].size_bytes
                  for i in members if cs[i].size_bytes > 0), default=wire)
    return max(cs[anchor].wire_bytes, min(wire, capped))


def _full_reach(problem: Problem, reach: BucketReach) -> BucketReach:
    """A reach holding every collective's largest bucket here, for the clocks' horizon."""
    most: dict[str, int] = {}
    for name, wire in reach.anchored.items():
        most[name] = max(most.get(name, 0), wire)
    return BucketReach(member={c.name: max(most.values(), default=c.wire_bytes) for c in problem.collectives},
                       anchored=reach.anchored)


def model_step_ms(h: PositionedHandle, solver: cp_model.CpSolver) -> float:
    """The model's step of the solution found (ns -> ms)."""
    return solver.value(h.final) / NS_PER_MS


def hint_fully(h: PositionedHandle, twin: PositionedHandle, plan: Plan, *, time_limit_s: float = 10.0) -> bool:
    """Hint ``plan`` with every variable of ``h``'s model set, times included: ``twin`` (the same
    model, built the same way) is solved with the plan's choices fixed, and its values become the
    hints (a search that starts from a whole solution finds better plans sooner; from the
    choices alone CP-SAT found no solution in 60 s on llama3-8b-fsdp-2). False when the plan does
    not fit the candidate space (nothing is hinted then)."""
    if twin.add_hint(plan) < len(plan.buckets):
        return False
    proto = twin.model.proto
    for var, value in zip(proto.solution_hint.vars, proto.solution_hint.values):
        twin.model.add(twin.model.get_int_var_from_proto_index(var) == value)
    twin.model.clear_hints()
    solver = cp_model.CpSolver()
    solver.parameters.catch_sigint_signal = False
    solver.parameters.num_workers = 1
    solver.parameters.max_time_in_seconds = time_limit_s
    if solver.solve(twin.model) not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return False
    h.model.clear_hints()
    for k in range(len(h.model.proto.variables)):  # built alike: same variables, same order
        h.model.add_hint(h.model.get_int_var_from_proto_index(k),
                         solver.value(twin.model.get_int_var_from_proto_index(k)))
    return True


class MemoryCap:
    """The peak-memory cap as constraints of the positioned model, counted as ``planner.cost.memory``
    counts it: at an instant ``t``, the graph's own bytes plus every buffer alive at ``t`` must fit
    under ``cap_bytes``. A buffer is alive when its bucket's start and wait (``member_buffers``'
    ends) put ``t`` between its allocation and its free; each collective counts its buffers as a
    member of the bucket it joins, alone or merged. Exact per instant, not a filter: the instants
    are added as they are needed (``add``), and a plan is within the cap when no instant of its
    ``memory_profile`` is over it; every instant added holds for every plan, so the model's bound
    stays a bound of the capped space."""

    def __init__(self, h: PositionedHandle, cap_bytes: int):
        from planner.cost.memory import INSTANTS_PER_POSITION, own_memory

        self.h, self.cap = h, cap_bytes
        self.unit = INSTANTS_PER_POSITION // SCALE  # model places -> instants
        self.own = own_memory(h.problem)
        self.instants: set[int] = set()
        m, mh = h.model, h.membership
        self.members = mh.candidate_members()
        # merged[a]: a's bucket has a member besides a (exact both ways: a lone anchor counts its
        # buffers as x[a, a] - merged[a])
        self.merged: dict[int, cp_model.LinearExprT] = {}
        for a, ms in self.members.items():
            others = [mh.x[j, a] for j in ms if j != a]
            if not others:
                self.merged[a] = 0
                continue
            g = m.new_bool_var(f"merged[{mh.colls[a].name}]")
            m.add_max_equality(g, others)
            self.merged[a] = g
        self.bucket_last_use: dict[tuple[int, int], cp_model.IntVar] = {}
        self.places: dict[tuple, cp_model.IntVar] = {}
        self.stats = {"instants": 0, "terms": 0}
        from planner.cost.memory import member_buffers

        problem = h.problem
        # what holds for every plan within the cap, whatever the instants added later
        if h.step is not None:
            room = RoomProfile(h.problem, cap_bytes)
            excluded = exclude_places_over_cap(h, room)
            self.stats.update(places_excluded=len(excluded), phase_cuts=add_phase_cuts(h, room, excluded))
        self.buffers = {(c.idx, merged): [buf for buf in member_buffers(problem, problem.collectives[c.idx], merged)
                                          if buf[2]]
                        for c in mh.colls for merged in (False, True)}

    def add(self, instants: Iterable[float]) -> int:
        """Constrain the memory at each instant (positions.py's scale); returns how many were new."""
        from planner.cost.memory import INSTANTS_PER_POSITION

        added = 0
        for t in instants:
            tick = round(t * INSTANTS_PER_POSITION)
            if tick in self.instants:
                continue
            self.instants.add(tick)
            added += 1
            held = self._held_at(tick)
            self.h.model.add(held <= self.cap - self.own(tick / INSTANTS_PER_POSITION))
        self.stats["instants"] = len(self.instants)
        return added

    def _held_at(self, tick: int) -> cp_model.LinearExprT:
        """The bytes the collectives' buffers hold at ``tick``: a buffer alive whatever the places
        counts as its member literal; the buffers of one bucket alive under the same condition on
        its places count together, as one variable at least their bytes when the condition holds."""
        mh, m = self.h.membership, self.h.model
        total: list = []
        groups: dict[tuple, list] = {}
        for (i, a), x in mh.x.items():
            modes = [(True, x)] if i != a else [(False, x - self.merged[a]), (True, self.merged[a])]
            for merged, member in modes:
                if isinstance(member, int) and member == 0:
                    continue
                for lo, hi, nbytes in self.buffers[i, merged]:
                    clauses = self._clauses(tick, lo, hi, a)
                    if not clauses:
                        continue
                    if any(not c for c in clauses):  # alive whenever it is a member
                        total.append(nbytes * member)
                        continue
                    key = (a, tuple(tuple(f.index for f in c) for c in clauses))
                    groups.setdefault(key, [clauses, []])[1].append((nbytes, member))
        for clauses, held in groups.values():
            most = sum(nbytes for nbytes, _ in held)
            alive = m.new_int_var(0, most, "")
            self.stats["terms"] += 1
            for factors in clauses:
                if len(held) == 1:  # one buffer: an exact AND of its member and the places
                    (nbytes, member), = held
                    m.add(alive >= nbytes * (member + sum(factors) - len(factors)))
                    continue
                cond = factors[0] if len(factors) == 1 else self._all_of(factors)
                m.add(alive >= sum(nbytes * member for nbytes, member in held) - most * (1 - cond))
            total.append(alive)
        return sum(total)

    def _all_of(self, factors) -> cp_model.IntVar:
        key = tuple(sorted(f.index for f in factors))
        if key not in self.places:
            lit = self.h.model.new_bool_var("")
            self.h.model.add(lit >= sum(factors) - (len(factors) - 1))
            self.places[key] = lit
        return self.places[key]

    def _clauses(self, tick: int, lo, hi, a: int) -> list[list]:
        """When the buffer (lo, hi) of a member of ``a``'s bucket is alive at ``tick``: an OR of
        clauses, each an AND of literals on the bucket's places ([] in it: always; none: never)."""
        from planner.cost.memory import BUCKET_LAST_USE, INSTANTS_PER_POSITION as per

        def fixed(value) -> float:
            return value * per

        # alive = lo <= tick <= hi; hi = max(base + offset, floor) is an OR of two clauses
        clauses = []
        hi_parts = [] if hi.base is None else [("base", hi)]
        if hi.floor == BUCKET_LAST_USE:
            hi_parts.append(("bucket", None))
        elif hi.base is None or hi.floor != -math.inf:
            hi_parts.append(("fixed", fixed(hi.floor)))
        for part, end in hi_parts:
            factors = []
            s_ok = w_ok = None  # predicates on the start's / wait's instant
            if lo.base is None:
                if fixed(lo.floor) > tick:
                    continue
            else:
                lo_off = lo.offset * per
                if lo.floor != -math.inf and fixed(lo.floor) > tick:
                    continue
                pred = (lambda v, o=lo_off: v + o <= tick)
                if lo.base == "S":
                    s_ok = pred
                else:
                    w_ok = pred
            if part == "fixed":
                if end < tick:
                    continue
            elif part == "bucket":
                factors.append(self._bucket_last_use(a, tick))
            else:
                hi_off = end.offset * per
                pred = (lambda v, o=hi_off: tick <= v + o)
                if end.base == "S":
                    s_ok = pred if s_ok is None else (lambda v, p=s_ok, q=pred: p(v) and q(v))
                else:
                    w_ok = pred if w_ok is None else (lambda v, p=w_ok, q=pred: p(v) and q(v))
            dead = False
            for which, ok in (("S", s_ok), ("W", w_ok)):
                if ok is not None:
                    factor = self._place_in(a, which, ok)
                    if factor is None:
                        dead = True
                        break
                    if factor is not True:
                        factors.append(factor)
            if not dead:
                clauses.append(factors)
        return clauses

    def _place_in(self, a: int, which: str, ok) -> cp_model.IntVar | bool | None:
        """Whether ``a``'s bucket starts (``which`` "S") or waits ("W") at a place ``ok`` accepts:
        True always, None never, else one literal shared by every buffer asking the same."""
        options = self.h.starts[a] if which == "S" else self.h.waits[a]
        chosen = tuple(k for k, (place, _, _) in enumerate(options) if ok(place * self.unit))
        if not chosen:
            return None
        if len(chosen) == len(options):
            return True
        if len(chosen) == 1:
            return options[chosen[0]][1]
        key = (a, which, chosen)
        if key not in self.places:
            lit = self.h.model.new_bool_var("")
            self.h.model.add(lit == sum(options[k][1] for k in chosen))  # exactly one of them is chosen
            self.places[key] = lit
        return self.places[key]

    def _bucket_last_use(self, a: int, tick: int) -> cp_model.LinearExprT:
        """At least 1 when a member of ``a``'s bucket uses its wait's storage at ``tick`` or later."""
        from planner.cost.memory import INSTANTS_PER_POSITION, buffers_of

        key = (a, tick)
        if key not in self.bucket_last_use:
            mh = self.h.membership
            problem = self.h.problem
            later = [mh.x[j, a] for j in self.members[a]
                     if (buffers_of(problem, problem.collectives[mh.colls[j].idx]).wait_last_use or 0)
                     * INSTANTS_PER_POSITION >= tick]
            z = self.h.model.new_bool_var("")
            for lit in later:
                self.h.model.add_implication(lit, z)
            if not later:
                self.h.model.add(z == 0)
            self.bucket_last_use[key] = z
        return self.bucket_last_use[key]
