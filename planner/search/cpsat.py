"""The CP-SAT model of overlap-preserving bucketing (rules of planner/README.md, modelled exactly).

Why this exists: it is the product -- a global optimum over the decisions torch's greedy
makes one candidate at a time. The model is built in three parts behind ``build_model``:
variables (``_Variables``), the constraint families (``_add_constraints`` calls one small
function per family, in order: that list is the model's summary), and the objective
(``_set_objective``). ``ModelHandle.extract(solver)`` turns a solution into a Plan.

Decisions. A bucket is represented by its start anchor ``a`` (symmetry broken: each bucket has
exactly one representative). ``x[i, a]`` = collective ``i`` is in the bucket anchored at ``a``;
``x[a, a]`` = ``a`` anchors a bucket (perhaps alone). ``y[a, b]`` = that bucket's wait anchor
is ``b``. Final positions follow: ``FS[i] = pos(start of a)``, ``FW[i] = BW[a] = pos(wait of b)``.

Candidates are pruned only by rules that hold whatever else is decided (same key, fixed
predecessors of a start and fixed successors of a wait, hiding nodes of a protected
collective, the cap for a pair, hiders of a protected collective alone). An optional
``window`` additionally limits a collective to anchors within that many same-key collectives;
the model is then exact for the restricted space only, and ``solve`` says so (the bound is not
reported as the problem's).
"""

from __future__ import annotations

import bisect
import contextlib
import contextvars
import time
from dataclasses import dataclass, field

import numpy as np
from ortools.sat.python import cp_model

from planner.cost.memory import buffers_of
from planner.core.options import OBJECTIVES  # re-exported: the model builds each of them
from planner.core.policy import Policy
from planner.core.problem import Bucket, Plan, Problem

# count: fewest collectives. exposure: least summed exposed communication per bucket (no stream
# queuing; see TimeTerms). step: the simulated step itself (planner.search.step, added by the solver).


class BuildStopped(Exception):
    """A model's build stopped before it was complete, for the reason its message gives: the
    deadline passed (``timed_out``) or the model outgrew its candidate pairs (see ``build_guard``)."""

    def __init__(self, message: str, *, timed_out: bool):
        super().__init__(message)
        self.timed_out = timed_out


@dataclass(frozen=True)
class _BuildGuard:
    deadline: float | None  # time.perf_counter() value
    max_pairs: int | None


# The guard of the build running in this thread (a context variable: sweeps and solve-dir may
# build models in several threads at once). Read by build_tick, which the loops over
# collectives, candidates and constraints call.
_GUARD: contextvars.ContextVar[_BuildGuard | None] = contextvars.ContextVar("bucketplan_build_guard", default=None)


@contextlib.contextmanager
def build_guard(*, deadline: float | None = None, max_pairs: int | None = None):
    """Within it, a model's build (``build_model``, ``planner.search.step.add_step_objective``) raises
    ``BuildStopped`` once ``time.perf_counter()`` passes ``deadline`` or the model has more than
    ``max_pairs`` candidate (collective, anchor) pairs: their variables and constraints are what
    take a build's time and memory (a 200,000-collective problem built past 2:40 and 16 GB), and
    the time limit must hold while building too."""
    token = _GUARD.set(_BuildGuard(deadline, max_pairs))
    try:
        yield
    finally:
        _GUARD.reset(token)


def build_tick(pairs: int | None = None) -> None:
    """Raise ``BuildStopped`` when the guard of this build (``build_guard``) says so; ``pairs``:
    the candidate pairs made so far, where the caller knows them. Called once per collective or
    constraint: a clock read, far below the work it guards."""
    guard = _GUARD.get()
    if guard is None:
        return
    if guard.deadline is not None and time.perf_counter() > guard.deadline:
        raise BuildStopped("the time limit was reached while building the model", timed_out=True)
    if pairs is not None and guard.max_pairs is not None and pairs > guard.max_pairs:
        raise BuildStopped(f"the problem is too large for the model (more than {guard.max_pairs:,} candidate "
                           f"(collective, anchor) pairs)", timed_out=False)


@dataclass
class _Coll:
    idx: int
    name: str
    key: tuple
    pg: str
    s: int  # start position
    w: int  # wait position
    size: int
    protected: bool  # its overlap must be kept (fully hidden; under protect_partly also partly)
    hiders: tuple[int, ...]  # positions of hiding nodes
    hider: bool  # its start or wait hides a protected collective (rule 4): stays alone
    s_lo: int = -1  # FS > s_lo
    s_hi: int = 1 << 60  # FS < s_hi
    w_lo: int = -1  # FW > w_lo
    w_hi: int = 1 << 60  # FW < w_hi
    wait_preds_of_start: list[int] = field(default_factory=list)  # j: wait_j -> start_i
    # a protected collective's hiders that move (planner.core.positions: a conversion folded into the
    # bucket of collective m runs at its merged start): (m, scheduled position)
    moving_hiders: list[tuple[int, int]] = field(default_factory=list)
    # the waits its own folded conversions depend on: (j, the conversion's position): wait_j ->
    # conversion, wherever the conversion runs
    folded_wait_preds: list[tuple[int, int]] = field(default_factory=list)


def prepare_collectives(problem: Problem, protect_partly: bool = False) -> list[_Coll]:
    nodes = problem.nodes
    index = {n.name: i for i, n in enumerate(nodes)}
    pos = [n.pos for n in nodes]
    # rule 4: a collective whose start or wait hides a protected collective (fully hidden; under
    # protect_partly also partly hidden) stays alone -- merging would erase or move that hider
    protected_hiders = {h for c in problem.collectives
                        if c.status == "hidden" or (protect_partly and c.status == "partly") for h in c.hiding}
    wait_owner = {c.wait: k for k, c in enumerate(problem.collectives)}
    # a folded conversion moves with its collective's bucket (planner.core.positions): it is neither a
    # fixed predecessor of that start, nor a fixed successor of a wait, nor a fixed hider
    folder = {index[f]: k for k, c in enumerate(problem.collectives) for f in c.folded}
    succ: dict[int, list[int]] = {}
    for i, n in enumerate(nodes):
        for d in n.deps:
            succ.setdefault(d, []).append(i)
    out = []
    for k, c in enumerate(problem.collectives):
        build_tick()
        protected = c.status == "hidden" or (protect_partly and c.status == "partly")
        hp = tuple(sorted(pos[index[h]] for h in c.hiding if index[h] not in folder))
        cc = _Coll(k, c.name, (c.kind, c.pg, c.key), c.pg, c.start_pos, c.wait_pos, c.size_bytes, protected, hp,
                   any(n in protected_hiders for n in (c.name, c.wait)))
        if protected:
            cc.moving_hiders = [(folder[index[h]], pos[index[h]]) for h in c.hiding if index[h] in folder]
        for d in nodes[index[c.name]].deps:  # immediate pinned predecessors of the start
            if d in folder:  # its own folded conversion: that conversion's inputs bound the start
                for e in nodes[d].deps:
                    if nodes[e].kind == "wait" and nodes[e].name in wait_owner:
                        cc.folded_wait_preds.append((wait_owner[nodes[e].name], pos[d]))
                    elif nodes[e].kind != "start":
                        cc.s_lo = max(cc.s_lo, pos[e])
            elif nodes[d].kind == "wait" and nodes[d].name in wait_owner:
                cc.wait_preds_of_start.append(wait_owner[nodes[d].name])
            elif nodes[d].kind != "start":
                cc.s_lo = max(cc.s_lo, pos[d])
        for s in succ.get(index[c.wait], []):  # immediate pinned successors of the wait
            if nodes[s].kind != "start" and s not in folder:
                cc.w_hi = min(cc.w_hi, pos[s])
        if protected and hp:  # rule 7
            cc.s_hi = min(cc.s_hi, hp[0])
            cc.w_lo = max(cc.w_lo, hp[-1])
        out.append(cc)
    return out


@dataclass
class ModelHandle:
    """The model and the map from its variables back to collectives and buckets."""

    problem: Problem
    model: cp_model.CpModel
    colls: list[_Coll]
    x: dict[tuple[int, int], cp_model.IntVar]
    y: dict[tuple[int, int], cp_model.IntVar]
    fs: dict[int, cp_model.IntVar]
    fw: dict[int, cp_model.IntVar]
    bw: dict[int, cp_model.IntVar]
    objective: str
    window: int | None
    stats: dict = field(default_factory=dict)
    joined_vars: dict[int, cp_model.IntVar] = field(default_factory=dict)  # see ``joined``

    def anchors(self, i: int) -> list[int]:
        return [a for (j, a) in self.x if j == i]

    def candidate_members(self) -> dict[int, list[int]]:
        """Per anchor, every collective that may be in its bucket (itself included), in the
        model's order of ``x``."""
        members: dict[int, list[int]] = {}
        for (i, a) in self.x:
            members.setdefault(a, []).append(i)
        return members

    def joined(self, i: int):
        """``joined_var`` of ``i`` in this model (shared with the rules that made it)."""
        return joined_var(self.model, self.x, [j for (j, a) in self.x if a == i and j != i], self.joined_vars, i,
                          self.colls[i].name)

    def extract(self, solver: cp_model.CpSolver, *, planner: str = "cpsat", params: dict | None = None,
                created: str = "") -> Plan:
        members: dict[int, list[int]] = {}
        for (i, a), var in self.x.items():
            if solver.boolean_value(var):
                members.setdefault(a, []).append(i)
        buckets = []
        for a, ms in sorted(members.items(), key=lambda kv: self.colls[kv[0]].s):
            if len(ms) < 2:
                continue
            wait = next(b for (aa, b), var in self.y.items() if aa == a and solver.boolean_value(var))
            ms.sort(key=lambda i: self.colls[i].s)
            buckets.append(Bucket(members=tuple(self.colls[i].name for i in ms), start=self.colls[a].name,
                                  wait=self.colls[wait].name))
        return Plan(problem_fingerprint=self.problem.fingerprint, planner=planner, params=params or {},
                    created=created, buckets=tuple(buckets))

    def add_hint(self, plan: Plan) -> int:
        """Hint a plan's assignment; returns how many of its buckets fit the candidate space."""
        by_name = {c.name: c.idx for c in self.colls}
        anchor_of = {i: i for i in range(len(self.colls))}
        wait_of = {i: i for i in range(len(self.colls))}
        fitted = 0
        for b in plan.buckets:
            a, w = by_name[b.start], by_name[b.wait]
            ms = [by_name[m] for m in b.members]
            if all((i, a) in self.x for i in ms) and (a, w) in self.y:
                fitted += 1
                for i in ms:
                    anchor_of[i] = a
                wait_of[a] = w
        for (i, a), var in self.x.items():
            self.model.add_hint(var, anchor_of[i] == a)
        for (a, b), var in self.y.items():
            self.model.add_hint(var, wait_of[a] == b)
        return fitted


class _Variables:
    """Anchor choices x, wait-anchor choices y, final positions FS / FW / BW."""

    def __init__(self, m: cp_model.CpModel, colls: list[_Coll], cap: int, window: int | None,
                 within: dict[int, int] | None = None):
        self.x: dict[tuple[int, int], cp_model.IntVar] = {}
        self.y: dict[tuple[int, int], cp_model.IntVar] = {}
        by_key: dict[tuple, list[_Coll]] = {}
        for c in colls:
            by_key.setdefault(c.key, []).append(c)
        self.joiners: dict[int, list[int]] = {c.idx: [] for c in colls}
        self.joined: dict[int, cp_model.IntVar] = {}  # joined_var's, once per collective
        # the first and last wait position of its key each collective's wait can take: the key's
        # waits strictly between w_lo and w_hi (a range, not the list of them: at 8,000
        # collectives of one key the lists alone held 30 million entries, quadratic in the key)
        w_range: dict[int, tuple[int, int]] = {}
        for group in by_key.values():
            group.sort(key=lambda c: c.s)
            starts = [c.s for c in group]
            waits = sorted(c.w for c in group)
            rank = {c.idx: r for r, c in enumerate(group)}
            for c in group:
                # never empty: a collective's own wait lies strictly between w_lo and w_hi
                w_range[c.idx] = (c.w, c.w) if c.hider else (
                    waits[bisect.bisect_right(waits, c.w_lo)], waits[bisect.bisect_left(waits, c.w_hi) - 1])
            for c in group:
                build_tick(len(self.x))
                cands = [c.idx]
                if not c.hider:
                    wc = w_range[c.idx]
                    lo = bisect.bisect_right(starts, c.s_lo)
                    hi = bisect.bisect_left(starts, min(c.s_hi, wc[1]))
                    if window is not None:  # group is in start order: the window is a slice too
                        lo, hi = max(lo, rank[c.idx] - window), min(hi, rank[c.idx] + window + 1)
                    for a in group[lo:hi]:
                        if a.idx == c.idx or a.hider:
                            continue
                        if within is not None and (c.idx not in within or within.get(a.idx) != within[c.idx]):
                            continue
                        if c.size + a.size > cap:
                            continue
                        wa = w_range[a.idx]
                        # both are ranges of one sorted list of distinct positions: they share a
                        # position exactly when they overlap
                        if wa[1] < wc[0] or wc[1] < wa[0]:
                            continue  # no wait position both can take
                        cands.append(a.idx)
                for a in cands:
                    self.x[c.idx, a] = m.new_bool_var(f"x[{c.name},{colls[a].name}]")
                    if a != c.idx:
                        self.joiners[a].append(c.idx)
        # wait anchors: b must be able to sit in a's bucket (b == a, or b joins a)
        for c in colls:
            build_tick(len(self.x))
            a = c.idx
            first, last = w_range[a]
            for b in [a] + self.joiners[a]:
                if first <= colls[b].w <= last:  # b's wait is one of the key's: in a's range, it is allowed
                    self.y[a, b] = m.new_bool_var(f"y[{c.name},{colls[b].name}]")
        # final positions range over what the candidates allow (exact: nothing else is reachable)
        anchors_of: dict[int, list[int]] = {}
        for (i, a) in self.x:
            anchors_of.setdefault(i, []).append(a)
        bw_vals: dict[int, list[int]] = {}
        for (a, b) in self.y:
            bw_vals.setdefault(a, []).append(colls[b].w)
        self.s_dom = {i: sorted({colls[a].s for a in anchors_of[i]}) for i in anchors_of}
        self.bw_dom = {a: sorted(set(vals)) for a, vals in bw_vals.items()}
        self.w_dom: dict[int, list[int]] = {}
        for i in anchors_of:
            build_tick(len(self.x))
            first, last = w_range[i]
            self.w_dom[i] = sorted({w for a in anchors_of[i] for w in self.bw_dom[a] if first <= w <= last})
        self.fs: dict[int, cp_model.IntVar] = {}
        self.fw: dict[int, cp_model.IntVar] = {}
        self.bw: dict[int, cp_model.IntVar] = {}
        for c in colls:
            build_tick()
            self.fs[c.idx] = m.new_int_var_from_domain(cp_model.Domain.from_values(self.s_dom[c.idx]), f"FS[{c.name}]")
            self.fw[c.idx] = m.new_int_var_from_domain(cp_model.Domain.from_values(self.w_dom[c.idx]), f"FW[{c.name}]")
            self.bw[c.idx] = m.new_int_var_from_domain(cp_model.Domain.from_values(self.bw_dom[c.idx]), f"BW[{c.name}]")


def _add_constraints(m: cp_model.CpModel, v: _Variables, colls: list[_Coll], cap: int,
                     memory_budget_bytes: int | None = None, problem: Problem | None = None) -> dict:
    """The constraint families of the model, in order; returns the constraints added per family."""
    # Rules 2 (same key), 4 (hiders alone), 7 (hiding kept): no family; candidate pruning in prepare_collectives/_Variables.
    counts = {
        "structure": (_one_bucket_per_collective(m, v, colls) + _one_wait_anchor_per_bucket(m, v, colls)
                      + _members_wait_with_their_bucket(m, v)),
        "rule3_cap": _members_fit_the_cap(m, v, colls, cap),
        "rule9_order": _final_order_keeps_dependencies(m, v, colls),
    }
    greater, by_pg = _Greater(m), _anchor_arrays_by_pg(v, colls)
    counts["rule8_stream"] = _no_new_stream_blocking(m, v, colls, by_pg, greater)
    counts["folded_conversions"] = _folded_conversions_run_at_their_bucket(m, v, colls, by_pg, greater)
    if memory_budget_bytes is not None:
        moved = {c.name: (buffers_of(problem, c).out_bytes if c.kind == "all_gather" else buffers_of(problem, c).in_bytes)
                 for c in problem.collectives}
        counts["rule10_memory"] = _extra_memory_within_budget(m, v, colls, memory_budget_bytes, moved,
                                                              {c.name: c.kind for c in problem.collectives},
                                                              [n.pos for n in problem.nodes])
    return counts


def _by_first(pairs) -> dict[int, list[int]]:
    """``{i: [a, ...]}`` from ``(i, a)`` pairs, in pair order."""
    out: dict[int, list[int]] = {}
    for (i, a) in pairs:
        out.setdefault(i, []).append(a)
    return out


def _exactly_one_choice(m: cp_model.CpModel, choice: dict, implied, value: dict, weight) -> int:
    """For each ``i`` of ``choice`` ((i, a) -> bool): exactly one ``a`` chosen; choosing ``a != i``
    implies ``implied(i, a)``; ``value[i]`` is the chosen ``weight(a)``. The number of ``i``."""
    by_i = _by_first(choice)
    for i, options in by_i.items():
        build_tick()
        m.add_exactly_one(choice[i, a] for a in options)
        for a in options:
            if a != i:
                m.add_implication(choice[i, a], implied(i, a))
        m.add(value[i] == sum(weight(a) * choice[i, a] for a in options))
    return len(by_i)


def _one_bucket_per_collective(m: cp_model.CpModel, v: _Variables, colls: list[_Coll]) -> int:
    """Structure: each collective is in exactly one bucket, whose anchor anchors it; FS is that anchor's start."""
    return _exactly_one_choice(m, v.x, lambda i, a: v.x[a, a], v.fs, lambda a: colls[a].s)


def _one_wait_anchor_per_bucket(m: cp_model.CpModel, v: _Variables, colls: list[_Coll]) -> int:
    """Structure (rule 5): each bucket has exactly one wait anchor, a member; BW is its wait."""
    return _exactly_one_choice(m, v.y, lambda a, b: v.x[b, a], v.bw, lambda b: colls[b].w)


def _members_wait_with_their_bucket(m: cp_model.CpModel, v: _Variables) -> int:
    """Structure: a member's final wait FW is its bucket's BW."""
    for k, ((i, a), var) in enumerate(v.x.items()):
        if k % 64 == 0:
            build_tick()
        m.add(v.fw[i] == v.bw[a]).only_enforce_if(var)
    return len(v.x)


def _members_fit_the_cap(m: cp_model.CpModel, v: _Variables, colls: list[_Coll], cap: int) -> int:
    """Rule 3 (byte cap): the members of each bucket whose candidates could overflow fit the cap."""
    n = 0
    for a, js in v.joiners.items():
        build_tick()
        if js and sum(colls[j].size for j in js) + colls[a].size > cap:
            # written against x[a, a] (joiners need it anyway): the same integer points, a much
            # tighter linear relaxation (no room is left in a bucket that is not opened)
            m.add(sum(colls[j].size * v.x[j, a] for j in js) <= (cap - colls[a].size) * v.x[a, a])
            n += 1
    return n


def _final_order_keeps_dependencies(m: cp_model.CpModel, v: _Variables, colls: list[_Coll]) -> int:
    """Rules 6 and 9: a start before its wait, a wait before every start that consumes it."""
    # Fixed predecessors/successors are in the domains. Two members with a wait -> start
    # dependency would need BW < FS of the same bucket: rule 6 follows.
    n = 0
    for c in colls:
        build_tick()
        m.add(v.fs[c.idx] < v.fw[c.idx])
        for j in c.wait_preds_of_start:
            m.add(v.fw[j] < v.fs[c.idx])
            n += 1
    return n + len(colls)


class _Greater:
    """Literals for ``var > value``, created on first use and cached per (variable, value)."""

    def __init__(self, m: cp_model.CpModel):
        self.m = m
        self.cache: dict[tuple[int, int], cp_model.IntVar] = {}

    def __call__(self, var_id: str, var: cp_model.IntVar, value: int) -> cp_model.IntVar:
        k = (id(var), value)
        if k not in self.cache:
            lit = self.m.new_bool_var(f"{var_id}>{value}")
            self.m.add(var > value).only_enforce_if(lit)
            self.m.add(var <= value).only_enforce_if(~lit)
            self.cache[k] = lit
        return self.cache[k]


def _anchor_arrays_by_pg(v: _Variables, colls: list[_Coll]) -> dict[str, tuple]:
    """Per process group: its candidate anchors, their starts, and the ends of their BW domains."""
    # Arrays, so that each (c, h) pair selects the anchors whose bucket could be in situation A
    # or B with one vectorized test instead of a Python scan (80-layer graphs: ~2,000 hiding
    # pairs x ~2,000 anchors).
    by_pg: dict[str, tuple] = {}
    for pg in {c.pg for c in colls}:
        anchors = [a for a in colls if a.pg == pg and (a.idx, a.idx) in v.x]
        by_pg[pg] = (anchors, np.array([a.s for a in anchors], dtype=np.int64),
                     np.array([v.bw_dom[a.idx][0] for a in anchors], dtype=np.int64),
                     np.array([v.bw_dom[a.idx][-1] for a in anchors], dtype=np.int64))
    return by_pg


def _no_new_stream_blocking(m: cp_model.CpModel, v: _Variables, colls: list[_Coll], by_pg: dict,
                            greater: _Greater) -> int:
    """Rule 8 (FIFO stream): no bucket newly blocks a protected collective during its hiding nodes."""
    # For every hiding node h of a protected collective c and every possible bucket anchor a on
    # c's group: if a anchors a bucket without c that is issued before c and waited after h (A),
    # or issued after c and waited before h (B), some member of that bucket must have made the
    # same situation originally.
    n = 0
    for c in colls:
        if not c.protected:
            continue
        for ph in c.hiders:
            n += _stream_at_hider(m, v, colls, c, ph, ph, by_pg, greater)
    return n


def _stream_at_hider(m: cp_model.CpModel, v: _Variables, colls: list[_Coll], c: _Coll, ph: int, ph0: int,
                     by_pg: dict, greater: _Greater, unless: list = ()) -> int:
    """Rule 8 at one hiding node of protected ``c``, which runs at ``ph`` and was scheduled at
    ``ph0`` (they differ for a folded conversion that moves), unless a literal of ``unless`` holds."""
    build_tick()
    fs_dom = v.s_dom[c.idx]
    anchors, a_s, bw_min, bw_max = by_pg[c.pg]
    maybe_a = (a_s < fs_dom[-1]) & (bw_max > ph)
    maybe_b = (a_s > fs_dom[0]) & (bw_min < ph)
    n = 0
    for k in np.flatnonzero(maybe_a | maybe_b):
        a = anchors[k]
        if a.idx == c.idx:
            continue
        if maybe_a[k]:
            n += _not_newly_open_across_hider(m, v, colls, c, a, ph, greater, ph0, unless)
        if maybe_b[k]:
            n += _not_newly_waited_before_hider(m, v, colls, c, a, ph, greater, ph0, unless)
    return n


def _not_newly_open_across_hider(m: cp_model.CpModel, v: _Variables, colls: list[_Coll], c: _Coll, a: _Coll,
                                 ph: int, greater: _Greater, ph0: int, unless: list) -> int:
    """Rule 8 (A): a's bucket is not newly issued before c and waited after hiding node ``ph``
    (scheduled at ``ph0``)."""
    x = v.x
    old = [j for j in [a.idx] + v.joiners[a.idx] if colls[j].s < c.s and ph0 < colls[j].w]
    if a.idx in old:
        return 0
    in_c = [x[c.idx, a.idx]] if (c.idx, a.idx) in x else []
    lits = [~x[a.idx, a.idx]] + in_c + [x[j, a.idx] for j in old] + list(unless)
    if a.s >= v.s_dom[c.idx][0]:
        lits.append(~greater(f"FS{c.idx}", v.fs[c.idx], a.s))
    if v.bw_dom[a.idx][0] <= ph:
        lits.append(~greater(f"BW{a.idx}", v.bw[a.idx], ph))
    m.add_bool_or(lits)
    return 1


def _not_newly_waited_before_hider(m: cp_model.CpModel, v: _Variables, colls: list[_Coll], c: _Coll,
                                   a: _Coll, ph: int, greater: _Greater, ph0: int, unless: list) -> int:
    """Rule 8 (B): a's bucket is not newly issued after c and waited before hiding node ``ph``
    (scheduled at ``ph0``)."""
    x = v.x
    old = [j for j in [a.idx] + v.joiners[a.idx] if c.s < colls[j].s and colls[j].w < ph0]
    if a.idx in old:
        return 0
    in_c = [x[c.idx, a.idx]] if (c.idx, a.idx) in x else []
    lits = [~x[a.idx, a.idx]] + in_c + [x[j, a.idx] for j in old] + list(unless)
    if a.s <= v.s_dom[c.idx][-1]:
        lits.append(greater(f"FS{c.idx}", v.fs[c.idx], a.s - 1))
    if v.bw_dom[a.idx][-1] >= ph:
        lits.append(greater(f"BW{a.idx}", v.bw[a.idx], ph - 1))
    m.add_bool_or(lits)
    return 1


def _folded_conversions_run_at_their_bucket(m: cp_model.CpModel, v: _Variables, colls: list[_Coll], by_pg: dict,
                                            greater: _Greater) -> int:
    """Rules 7, 8 and 9 at a folded conversion, which runs where its collective's bucket starts
    (``planner.core.positions``): the waits it depends on come before it, and a protected collective
    it hides is in flight there, with no bucket newly blocking the stream around it."""
    places = _FoldedPlaces(m, v, colls)
    n = 0
    for c in colls:
        for j, pf in c.folded_wait_preds:  # rule 9: wait_j -> the conversion -> c's start
            for cond, q in places(c.idx, pf):
                m.add(v.fw[j] < q).only_enforce_if(cond)
                n += 1
        for owner, pf in c.moving_hiders:  # rules 7 and 8 for c, at its hider's place
            for cond, q in places(owner, pf):
                m.add(v.fs[c.idx] < q).only_enforce_if(cond)
                m.add(v.fw[c.idx] > q).only_enforce_if(cond)
                n += 2 + _stream_at_hider(m, v, colls, c, q, pf, by_pg, greater, [~lit for lit in cond])
    return n


def joined_var(m: cp_model.CpModel, x: dict, joiners: list[int], cache: dict, i: int, name: str):
    """A literal true exactly when some collective of ``joiners`` joins ``i``'s bucket (0 when none
    can): created once per model and ``i``, for every family that needs it."""
    if not joiners:
        return 0
    if i not in cache:
        cache[i] = m.new_bool_var(f"joined[{name}]")
        m.add_max_equality(cache[i], [x[j, i] for j in joiners])
    return cache[i]


class _FoldedPlaces:
    """Where a collective's folded conversion runs, case by case: ``(literals, position)`` pairs
    whose literals (a conjunction) hold in exactly one case. Alone: at its own position. Joining
    anchor ``a``: just before a's start (``pos - FOLD_OFFSET``: on integer positions, a constraint
    against it reads as one against a's start, as no wait or other start sits there). Joined by
    others: just before its own start."""

    def __init__(self, m: cp_model.CpModel, v: _Variables, colls: list[_Coll]):
        self.m, self.v, self.colls = m, v, colls
        self.anchors = _by_first(v.x)

    def __call__(self, i: int, own: int) -> list[tuple[list, int]]:
        x = self.v.x
        out = []
        joined = joined_var(self.m, x, self.v.joiners[i], self.v.joined, i, self.colls[i].name)
        if self.v.joiners[i]:
            out += [([x[i, i], ~joined], own), ([joined], self.colls[i].s)]
        else:
            out.append(([x[i, i]], own))
        out += [([x[i, a]], self.colls[a].s) for a in self.anchors[i] if a != i]
        return out


def _extra_memory_within_budget(m: cp_model.CpModel, v: _Variables, colls: list[_Coll], budget: int,
                                moved_bytes: dict[str, int], kind_of: dict[str, str],
                                node_positions: list[int]) -> int:
    """Rule 10 (optional memory budget): the bytes kept alive by moved starts stay within it.

    As planner/README.md states it (torch's memory estimator's accounting): an all_gather whose
    final start FS is before its own start s holds ``moved_bytes`` (its output) in the segments
    starting at pinned positions p with FS <= p < s, and frees them in s <= p < FS when it starts
    later; a reduce_scatter or all_reduce holds its input in s < p <= FS and frees it in
    FS < p <= s. The sum changes only at start positions and at the pinned position right after
    each, so checking those is exact. Waits hold nothing."""
    starts = sorted({c.s for c in colls})
    after = [node_positions[bisect.bisect_right(node_positions, p)] for p in starts
             if bisect.bisect_right(node_positions, p) < len(node_positions)]
    positions = sorted(set(starts) | set(after))
    terms: dict[int, list] = {p: [] for p in positions}

    def when(c: _Coll, p: int, fs_at_most_p: bool, weight: int) -> None:
        """``weight`` at p, on the condition FS <= p (or FS > p)."""
        fs_dom = v.s_dom[c.idx]
        if fs_dom[-1] <= p or fs_dom[0] > p:  # decided by the domain
            if (fs_dom[-1] <= p) == fs_at_most_p:
                terms[p].append(weight)
            return
        lit = m.new_bool_var(f"moved[{c.name}]@{p}")
        m.add(v.fs[c.idx] <= p).only_enforce_if(lit)
        m.add(v.fs[c.idx] > p).only_enforce_if(~lit)
        terms[p].append(weight * (lit if fs_at_most_p else 1 - lit))

    for c in colls:
        build_tick()
        size = moved_bytes[c.name]
        if not size:
            continue
        fs_dom = v.s_dom[c.idx]
        lo, hi = min(fs_dom[0], c.s), max(fs_dom[-1], c.s)
        for p in positions[bisect.bisect_left(positions, lo):bisect.bisect_right(positions, hi)]:
            if kind_of[c.name] == "all_gather":
                if p < c.s:
                    when(c, p, True, size)  # FS <= p < s
                else:
                    when(c, p, False, -size)  # s <= p < FS
            elif p > c.s:
                _late_input(m, v, c, p, size, terms)  # s < p <= FS
            else:
                _early_input(m, v, c, p, size, terms)  # FS < p <= s
    n = 0
    for p, ts in terms.items():
        build_tick()
        if ts:
            m.add(sum(ts) <= budget)
            n += 1
    return n


def _late_input(m, v, c, p: int, size: int, terms: dict) -> None:
    """A reduce_scatter / all_reduce input held at p (> s) iff FS >= p."""
    fs_dom = v.s_dom[c.idx]
    if fs_dom[0] >= p:
        terms[p].append(size)
    elif fs_dom[-1] >= p:
        lit = m.new_bool_var(f"late_input[{c.name}]@{p}")
        m.add(v.fs[c.idx] >= p).only_enforce_if(lit)
        m.add(v.fs[c.idx] < p).only_enforce_if(~lit)
        terms[p].append(size * lit)


def _early_input(m, v, c, p: int, size: int, terms: dict) -> None:
    """A reduce_scatter / all_reduce input freed at p (<= s) iff FS < p."""
    fs_dom = v.s_dom[c.idx]
    if fs_dom[-1] < p:
        terms[p].append(-size)
    elif fs_dom[0] < p:
        lit = m.new_bool_var(f"early_input[{c.name}]@{p}")
        m.add(v.fs[c.idx] < p).only_enforce_if(lit)
        m.add(v.fs[c.idx] >= p).only_enforce_if(~lit)
        terms[p].append(-size * lit)


@dataclass(frozen=True)
class TimeTerms:
    """Integer (µs) pieces of the time objective, shared by the model and ``plan_objective``.

    A bucket's communication costs ``fixed_us[anchor] + Σ bandwidth_us[member]``: the link's
    cost at 0 bytes once, and each member's cost beyond it (exact for α-β links; for a table
    link, an overestimate of a concave curve's merged cost). Bucketing copies are not modelled.
    the compute that can hide it is the compute scheduled between its start and its wait,
    ``prefix_us[wait pos] - prefix_us[start pos]``. Its exposed time is the positive part of the
    difference. Stream queuing behind other buckets is not modelled (``planner.simulate`` does).
    """

    fixed_us: dict[str, int]  # by collective name
    bandwidth_us: dict[str, int]  # by collective name
    prefix_us: dict[int, int]  # by position: compute scheduled strictly before it

    @staticmethod
    def of(problem: Problem) -> "TimeTerms":
        links = {link.pg: link for link in problem.links}
        fixed = {c.name: links[c.pg].fixed_ms(c.kind) for c in problem.collectives}
        lat = {c.name: int(round(fixed[c.name] * 1e3)) for c in problem.collectives}
        bw = {c.name: int(round((links[c.pg].time_ms(c.kind, c.wire_bytes) - fixed[c.name]) * 1e3))
              for c in problem.collectives}
        wanted = sorted({c.start_pos for c in problem.collectives} | {c.wait_pos for c in problem.collectives})
        prefix, acc, k = {}, 0.0, 0
        for n in problem.nodes:
            acc += n.unpinned_ms  # before what starts or waits at n
            while k < len(wanted) and wanted[k] <= n.pos:
                prefix[wanted[k]] = int(round(acc * 1e3))
                k += 1
            acc += n.own_ms
        for p in wanted[k:]:
            prefix[p] = int(round(acc * 1e3))
        return TimeTerms(lat, bw, prefix)

    def exposed_us(self, members, start_pos: int, wait_pos: int) -> int:
        comm = self.fixed_us[members[0]] + sum(self.bandwidth_us[m] for m in members)
        return max(0, comm - (self.prefix_us[wait_pos] - self.prefix_us[start_pos]))


def _set_objective(m: cp_model.CpModel, v: _Variables, colls: list[_Coll], problem: Problem, objective: str,
                   lower_bound: float | None, max_count: int | None = None, key_bounds: dict | None = None):
    """count: fewest buckets. exposure: least total exposed communication in µs per bucket
    (see ``TimeTerms``), then fewest buckets (lexicographic: exposure x (n+1) + count).
    Known valid lower bounds (planner.cost.bounds: on the total, and per bucket key on that key's
    buckets) are stated to the solver: they prune, never cut off a feasible plan."""
    anchors = [c.idx for c in colls if (c.idx, c.idx) in v.x]
    count = sum(v.x[a, a] for a in anchors)
    for key, need in (key_bounds or {}).items():
        mine = [v.x[a, a] for a in anchors if colls[a].key == key]
        if mine and need > 1:
            m.add(sum(mine) >= need)
    if objective == "count":
        expr = count
    elif objective == "exposure":
        terms = TimeTerms.of(problem)
        ys: dict[int, list[int]] = {}
        for (a, b) in v.y:
            ys.setdefault(a, []).append(b)
        exposed = []
        for a in anchors:
            build_tick()
            ca = colls[a]
            members = [a] + v.joiners[a]
            comm = terms.fixed_us[ca.name] * v.x[a, a] + sum(
                terms.bandwidth_us[colls[i].name] * v.x[i, a] for i in members)
            hide = sum(terms.prefix_us[colls[b].w] * v.y[a, b] for b in ys[a]) - terms.prefix_us[ca.s] * v.x[a, a]
            top = terms.fixed_us[ca.name] + sum(terms.bandwidth_us[colls[i].name] for i in members)
            e = m.new_int_var(0, top, f"exposed[{ca.name}]")
            m.add(e >= comm - hide)
            exposed.append(e)
        expr = sum(exposed) * (len(colls) + 1) + count
    else:
        raise ValueError(f"unknown objective {objective!r}; use one of {OBJECTIVES}")
    if lower_bound is not None:
        m.add(expr >= int(lower_bound))
    if max_count is not None:  # a probe: is there a plan with at most this many collectives?
        m.add(count <= max_count)
    m.minimize(expr)


@dataclass(frozen=True)
class ObjectiveBounds:
    """What is known of the objective before a search, stated as redundant constraints: a valid
    ``lower_bound`` on it and ``key_bounds``, the fewest buckets of each bucket key
    (``planner.cost.bounds``); None: not known."""

    lower_bound: float | None = None
    key_bounds: dict | None = None


def build_model(problem: Problem, *, objective: str = "count", window: int | None = None,
                within: Plan | None = None, policy: Policy = Policy(), bounds: ObjectiveBounds = ObjectiveBounds(),
                max_count: int | None = None) -> ModelHandle:
    """The CP-SAT model of ``problem``: variables, one constraint family per rule, objective.

    ``within``: only merges inside that plan's buckets (its best feasible refinement, e.g. a
    repair of torch's greedy plan). ``policy``: ``protect_partly`` (rules 4, 7 and 8 protect
    partly hidden collectives too, as torch's search does inside a bucket) and
    ``memory_budget_bytes`` (extra bytes kept alive by moved starts and waits stay within it);
    the model always keeps overlap and has no peak cap (``SolveOptions`` refuses such a policy).
    ``bounds``: what is known of the objective (``ObjectiveBounds``). ``max_count``: only plans
    leaving at most that many collectives (used to probe a bound).
    """
    protect_partly, memory_budget_bytes = policy.protect_partly, policy.memory_budget_bytes
    lower_bound, key_bounds = bounds.lower_bound, bounds.key_bounds
    colls = prepare_collectives(problem, protect_partly)
    m = cp_model.CpModel()
    groups = None
    if within is not None:
        index = {c.name: c.idx for c in colls}
        groups = {index[name]: b for b, bucket in enumerate(within.buckets) for name in bucket.members
                  if name in index}
    v = _Variables(m, colls, problem.bucket_cap_bytes, window, groups)
    counts = _add_constraints(m, v, colls, problem.bucket_cap_bytes, memory_budget_bytes, problem)
    outside = within is None
    _set_objective(m, v, colls, problem, objective, lower_bound if outside else None, max_count,
                   key_bounds if outside else None)
    stats = {"collectives": len(colls), "x_vars": len(v.x), "y_vars": len(v.y), **counts}
    return ModelHandle(problem, m, colls, v.x, v.y, v.fs, v.fw, v.bw, objective, window, stats, v.joined)


def plan_objective(problem: Problem, plan: Plan, objective: str) -> float:
    """The objective value of a plan (to compare hints and results on one scale): collectives
    left, the encoded exposure, or the simulated step in ms."""
    n = len(problem.collectives) - sum(len(b.members) for b in plan.buckets) + len(plan.buckets)
    if objective == "count":
        return n
    if objective == "step":
        from planner.cost.simulator import simulate

        return simulate(problem, plan).step_ms
    terms = TimeTerms.of(problem)
    colls = {c.name: c for c in problem.collectives}
    in_bucket = {m for b in plan.buckets for m in b.members}
    total = sum(terms.exposed_us(b.members, colls[b.start].start_pos, colls[b.wait].wait_pos)
                for b in plan.buckets)
    total += sum(terms.exposed_us([c.name], c.start_pos, c.wait_pos)
                 for c in problem.collectives if c.name not in in_bucket)
    return total * (len(problem.collectives) + 1) + n
