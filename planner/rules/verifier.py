"""The independent feasibility verifier: checks a plan against the rules of planner/README.md.

Why this exists: a plan may come from torch's greedy, from CP-SAT, or from a file; none of
them may certify itself. This module re-derives everything from the ``Problem`` -- final
positions, reachability, hiding intervals -- and shares no code with any planner, so a
modelling bug in a planner shows up here as a named violation.

The final state of a plan: a bucket's merged start sits at its start anchor's start
position, its merged wait at its wait anchor's wait position, or each just before the pinned node
the bucket names (``planner.core.positions``, the one definition of positions, read by the simulator
too); a collective in no bucket is a bucket of its own; a dtype conversion torch's merge folds
into a bucket's copy runs just before that bucket's merged start (``folded_positions``); every
other node keeps its position.

``check`` reads as the list of rules: one function per rule, ``_rule_<number>_<name>``, each
returning its violations; rules 2 to 10 read one ``_FinalState`` derived once.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

import planner.core.arguments as arguments
from planner.cost.memory import MemoryCounter, memory_timeline, rule10_extra
from planner.core.positions import bucket_positions, folded_positions, unknown_positions
from planner.core.problem import Collective, Plan, Problem

RULES = {
    1: "plan-matches-problem",
    2: "same-key",
    3: "byte-cap",
    4: "hider-never-merges",
    5: "anchors-are-members",
    6: "no-dependent-members",
    7: "hiding-kept",
    8: "stream-fifo",
    9: "schedule-acyclic",
    10: "memory-budget",
    11: "peak-memory",
}


@dataclass(frozen=True)
class Violation:
    rule: int
    bucket: int | None  # index into plan.buckets, None for problem-level issues
    collectives: tuple[str, ...]
    message: str

    @property
    def rule_name(self) -> str:
        return RULES[self.rule]

    def __str__(self) -> str:
        where = f"bucket {self.bucket}: " if self.bucket is not None else ""
        return f"rule {self.rule} ({self.rule_name}): {where}{self.message}"


@dataclass
class Quality:
    collectives_before: int = 0
    collectives_after: int = 0
    buckets: int = 0
    hidden_relations: int = 0
    hidden_kept: int = 0
    partly_relations: int = 0
    partly_kept: int = 0


@dataclass
class Report:
    violations: list[Violation] = field(default_factory=list)
    quality: Quality = field(default_factory=Quality)

    @property
    def feasible(self) -> bool:
        return not self.violations

    def by_rule(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for v in self.violations:
            out[v.rule] = out.get(v.rule, 0) + 1
        return dict(sorted(out.items()))


# The policy options of verify/check, as planner.solve records them in a plan's params: a plan
# is checked by default under the policy it was made for (bucketplan verify)
POLICY_KEYS = ("protect_partly", "memory_budget_bytes", "keep_overlap", "peak_memory_bytes")


def recorded_policy(plan: Plan, *, ignore=()) -> dict:
    """The policy options ``plan.params`` records (``POLICY_KEYS``; absent keys are left out),
    as keyword arguments of ``verify``/``check``. Keys in ``ignore`` (the caller overrides them)
    are not read. A value that is no policy raises ValueError naming the key: params are free
    JSON, and a hand-edited "yes" or -1 must not silently become some policy."""
    out: dict = {}
    for key in POLICY_KEYS:
        if key not in plan.params or key in ignore:
            continue
        value = plan.params[key]
        # the library's rule for the argument (True is an int in Python, a JSON float no byte count)
        rule, what = _POLICY_RULES[key]
        if not _obeys(rule, value):
            raise ValueError(f"params.{key}: {value!r} is not a {what}")
        out[key] = value
    return out


# each recorded policy key: the library's rule for its value, and what a value must be
_POLICY_RULES = {
    "protect_partly": (arguments.flag, "policy (true or false)"),
    "keep_overlap": (arguments.flag, "policy (true or false)"),
    "memory_budget_bytes": (arguments.memory_budget_bytes, "budget (null or an integer from 0 to below 2**62)"),
    "peak_memory_bytes": (arguments.memory_budget_bytes, "budget (null or an integer from 0 to below 2**62)"),
}


def _obeys(rule, value) -> bool:
    """Whether ``value`` passes one of planner.core.arguments' rules (a file's value is reported in
    its own words, naming the params key)."""
    try:
        rule(value, "value")
    except ValueError:
        return False
    return True


class Verifier:
    """``verify`` and ``check`` for many plans of one problem: what no plan changes (lookups, the
    dependency edges, each collective's memory buffers) is derived once, and rule 6's answer for a
    bucket is remembered by its members.

    Why: the positioned search (``planner.search.free.position_search``) verifies tens of thousands of
    plans, each a bucket or two away from the last; deriving all of it again took about two thirds
    of each of its evaluations on llama3-8b-fsdp-8 (rule 6's reachability pass over the graph
    alone, 40%). Nothing here is shared with a planner: the memo holds this module's own answers."""

    # buckets whose rule 6 answer is remembered before the memo is emptied
    MEMO_BUCKETS = 100_000

    def __init__(self, problem: Problem):
        arguments.problem_and_plan(problem, None, optional=True)
        self.problem = problem
        self.colls = {c.name: c for c in problem.collectives}
        self.node_pos = {n.name: n.pos for n in problem.nodes}
        self.index = {n.name: i for i, n in enumerate(problem.nodes)}
        self.wait_owner = {c.wait: c.name for c in problem.collectives}
        self.dependent_members: dict[tuple[str, ...], list[tuple[str, str]]] = {}

    @cached_property
    def dependencies(self) -> tuple[np.ndarray, np.ndarray]:
        """Rule 9's every dependency as (from, to) node indices, in node order, then ``deps`` order."""
        edges = [(d, i) for i, n in enumerate(self.problem.nodes) for d in n.deps]
        return np.array([d for d, _ in edges], dtype=np.int64), np.array([i for _, i in edges], dtype=np.int64)

    @cached_property
    def memory(self) -> MemoryCounter:
        """Rule 11's count."""
        return MemoryCounter.of(self.problem)

    @classmethod
    def of(cls, problem: Problem) -> "Verifier":
        """The last verifier made here when it is of this very problem, else a new one: callers
        verify many plans of one problem in a row (polish, the solver's repairs, the searches), and
        a problem is immutable."""
        global _LAST_VERIFIER
        if _LAST_VERIFIER is None or _LAST_VERIFIER.problem is not problem:
            _LAST_VERIFIER = cls(problem)
        return _LAST_VERIFIER

    def verify(self, plan: Plan, **policy) -> list[Violation]:
        """Every rule violation of ``plan`` (``verify``)."""
        return _checked(self, plan, False, **policy).violations

    def check(self, plan: Plan, **policy) -> Report:
        """Violations and quality figures of ``plan`` (``check``)."""
        return _checked(self, plan, True, **policy)

    def dependent_pairs(self, members: tuple[str, ...]) -> list[tuple[str, str]]:
        """(x, y) for every two members of one bucket where y's start depends on x's wait, in
        members order (rule 6)."""
        found = self.dependent_members.get(members)
        if found is None:
            if len(self.dependent_members) >= self.MEMO_BUCKETS:
                self.dependent_members.clear()
            index, colls = self.index, self.colls
            depends = _waits_reaching_starts(self.problem.nodes, [[(index[colls[m].wait], index[m]) for m in members]])
            found = [(x, y) for x in members for y in members
                     if x != y and (index[colls[x].wait], index[y]) in depends]
            self.dependent_members[members] = found
        return found


_LAST_VERIFIER: Verifier | None = None


def verify(problem: Problem, plan: Plan, *, check_fingerprint: bool = True, protect_partly: bool = False,
           memory_budget_bytes: int | None = None, keep_overlap: bool = True,
           peak_memory_bytes: int | None = None) -> list[Violation]:
    """Every rule violation of ``plan`` on ``problem`` (empty list: the plan is feasible)."""
    arguments.problem_and_plan(problem, plan)
    return Verifier.of(problem).verify(plan, check_fingerprint=check_fingerprint, protect_partly=protect_partly,
                                       memory_budget_bytes=memory_budget_bytes, keep_overlap=keep_overlap,
                                       peak_memory_bytes=peak_memory_bytes)


def check(problem: Problem, plan: Plan, *, check_fingerprint: bool = True, protect_partly: bool = False,
          memory_budget_bytes: int | None = None, keep_overlap: bool = True,
          peak_memory_bytes: int | None = None) -> Report:
    """Violations and quality figures of ``plan`` on ``problem``: the rules of planner/README.md,
    one function each, violations in this order (rules 1 and 5, and rules 2 to 4, bucket by bucket).

    ``protect_partly``: the stricter policy in which rules 4, 7 and 8 protect partly hidden
    collectives too (torch's default protects fully hidden ones only). ``memory_budget_bytes``:
    rule 10 applies only when it is given. ``keep_overlap`` False: the overlap-preservation rules
    4, 7 and 8 do not apply (the policy of step plans with named positions, whose simulated step
    prices lost overlap itself); the quality figures still count the relations kept.
    ``peak_memory_bytes``: rule 11, the planned schedule's peak within it. A bad argument raises
    one ValueError naming it.
    """
    arguments.problem_and_plan(problem, plan)
    return Verifier.of(problem).check(plan, check_fingerprint=check_fingerprint, protect_partly=protect_partly,
                                      memory_budget_bytes=memory_budget_bytes, keep_overlap=keep_overlap,
                                      peak_memory_bytes=peak_memory_bytes)


def _checked(verifier: Verifier, plan: Plan, quality: bool, *, check_fingerprint: bool = True,
             protect_partly: bool = False, memory_budget_bytes: int | None = None, keep_overlap: bool = True,
             peak_memory_bytes: int | None = None) -> Report:
    """``check`` with ``verifier``'s problem; without ``quality`` (``verify``) the quality figures
    are left empty."""
    arguments.problem_and_plan(verifier.problem, plan)
    arguments.flag(check_fingerprint, "check_fingerprint")
    arguments.flag(protect_partly, "protect_partly")
    arguments.flag(keep_overlap, "keep_overlap")
    arguments.memory_budget_bytes(memory_budget_bytes, "memory_budget_bytes")
    arguments.memory_budget_bytes(peak_memory_bytes, "peak_memory_bytes")
    problem = verifier.problem
    ill_formed = _bucket_by_bucket(_rule_1_plan_matches_problem(verifier, plan, check_fingerprint)
                                   + _rule_5_anchors_are_members(plan))
    if ill_formed:  # positions are undefined for an ill-formed plan
        return Report(violations=ill_formed)
    s = _final_state(verifier, plan, protect_partly)
    overlap = keep_overlap
    out = _bucket_by_bucket(_rule_2_same_key(s) + _rule_3_byte_cap(s)
                            + (_rule_4_hider_never_merges(s) if overlap else []))
    out += _rule_6_no_dependent_members(s)
    out += _rule_7_hiding_kept(s) if overlap else []
    # rule 8's situations are looked for when the rule applies or the quality figures count them:
    # with neither (``verify`` of a positioned plan), not at all (1 s of a 1.1 s check at 80 layers)
    stream, broken = _rule_8_stream_fifo(s) if overlap or quality else ([], set())
    out += stream if overlap else []
    out += _rule_9_schedule_acyclic(s)
    if memory_budget_bytes is not None:
        out += _rule_10_memory_budget(s, memory_budget_bytes)
    if peak_memory_bytes is not None:
        out += _rule_11_peak_memory(s, peak_memory_bytes)
    return Report(violations=out, quality=_quality_of(s, broken) if quality else Quality())


def _bucket_by_bucket(violations: list[Violation]) -> list[Violation]:
    """Problem-level violations first, then bucket by bucket; within a bucket in the order given
    (a stable sort): rules checked together per bucket report in that order."""
    return sorted(violations, key=lambda v: -1 if v.bucket is None else v.bucket)


@dataclass(frozen=True)
class _FinalState:
    """The final state of a well-formed plan (module docstring), derived once from the
    ``Problem`` and read by rules 2 to 10 and the quality figures.

    Bucket ids: the plan's buckets first (``plan.buckets`` indices), then one singleton per
    collective in no bucket, in problem order."""

    problem: Problem
    plan: Plan
    verifier: Verifier  # what no plan changes
    colls: dict[str, Collective]  # name -> collective
    node_pos: dict[str, int]  # pinned node name -> its scheduled position
    folded_at: dict[str, float]  # folded conversion that moves -> its final position (planner.core.positions)
    start_of: dict[str, float]  # collective -> position of its bucket's merged start (planner.core.positions)
    wait_of: dict[str, float]  # collective -> position of its bucket's merged wait
    group: dict[str, int]  # collective -> bucket id
    members_of: tuple[tuple[str, ...], ...]  # bucket id -> members
    protected: frozenset[str]  # the statuses rules 4, 7 and 8 protect under the policy

    def at(self, node: str) -> float:
        """A pinned node's final position, where it is not a start or wait of a collective."""
        return self.folded_at.get(node, self.node_pos[node])

    @property
    def n_plan(self) -> int:
        """Bucket ids below this are the plan's own buckets."""
        return len(self.plan.buckets)


def _final_state(verifier: Verifier, plan: Plan, protect_partly: bool) -> _FinalState:
    problem, colls, node_pos = verifier.problem, verifier.colls, verifier.node_pos
    start_of: dict[str, int] = {}
    wait_of: dict[str, int] = {}
    group: dict[str, int] = {}
    members_of: list[tuple[str, ...]] = []
    for b, bucket in enumerate(plan.buckets):
        members_of.append(bucket.members)
        start, wait = bucket_positions(bucket, colls, node_pos)
        for m in bucket.members:
            start_of[m] = start
            wait_of[m] = wait
            group[m] = b
    for c in problem.collectives:
        if c.name not in group:
            group[c.name] = len(members_of)
            members_of.append((c.name,))
            start_of[c.name] = c.start_pos
            wait_of[c.name] = c.wait_pos
    final = {c: (start_of[c], wait_of[c]) for c in start_of}
    return _FinalState(problem=problem, plan=plan, verifier=verifier, colls=colls, node_pos=node_pos,
                       folded_at=folded_positions(problem, plan, final), start_of=start_of, wait_of=wait_of, group=group, members_of=tuple(members_of),
                       protected=frozenset({"hidden", "partly"} if protect_partly else {"hidden"}))


def _rule_1_plan_matches_problem(verifier: Verifier, plan: Plan, check_fingerprint: bool) -> list[Violation]:
    """The plan is for this problem, names only its collectives, and none of them twice."""
    problem, names, node_pos = verifier.problem, verifier.colls, verifier.node_pos
    out = []
    if check_fingerprint and plan.problem_fingerprint != problem.fingerprint:
        out.append(Violation(1, None, (), f"plan is for problem {plan.problem_fingerprint or '(none)'}, "
                                          f"not {problem.fingerprint}"))
    bucket_of: dict[str, int] = {}
    for b, bucket in enumerate(plan.buckets):
        unknown = [m for m in bucket.members if m not in names]
        if unknown:
            out.append(Violation(1, b, tuple(unknown), f"unknown collective(s) {unknown}"))
        for m in bucket.members:
            if m in bucket_of:
                out.append(Violation(1, b, (m,), f"{m} is also in bucket {bucket_of[m]}"))
            bucket_of.setdefault(m, b)
        missing = unknown_positions(bucket, node_pos)
        if missing:
            out.append(Violation(1, b, bucket.members, f"named position(s) {missing} are not pinned nodes of the problem"))
    return out


def _rule_5_anchors_are_members(plan: Plan) -> list[Violation]:
    """Both anchors are members (the Plan type checks this too; files can be hand-made)."""
    return [Violation(5, b, (anchor,), f"{role} anchor {anchor} is not a member")
            for b, bucket in enumerate(plan.buckets)
            for role, anchor in (("start", bucket.start), ("wait", bucket.wait))
            if anchor not in bucket.members]


def _rule_2_same_key(s: _FinalState) -> list[Violation]:
    """All members share torch's bucket key: kind, process group, and the mode's dtype/op fields."""
    out = []
    for b, bucket in enumerate(s.plan.buckets):
        keys = {(s.colls[m].kind, s.colls[m].pg, s.colls[m].key) for m in bucket.members}
        if len(keys) > 1:
            out.append(Violation(2, b, bucket.members, f"members have different keys: {sorted(k[2] for k in keys)}"))
    return out


def _rule_3_byte_cap(s: _FinalState) -> list[Violation]:
    """The members' torch memory footprints add up to at most the problem's cap."""
    out = []
    cap = s.problem.bucket_cap_bytes
    for b, bucket in enumerate(s.plan.buckets):
        total = sum(s.colls[m].size_bytes for m in bucket.members)
        if total > cap:
            out.append(Violation(3, b, bucket.members, f"{total} bytes exceed the cap of {cap}"))
    return out


def _rule_4_hider_never_merges(s: _FinalState) -> list[Violation]:
    """A collective whose start or wait is a hiding node of a protected collective (fully hidden;
    under protect_partly also partly hidden) stays alone (torch, for fully hidden ones: "nyi:
    bucketing collective used for overlap"). Why: merging it erases those nodes or replaces them
    by the bucket's (elsewhere, when it is not the anchor), while rules 7 and 8 judge every hiding
    node at its final position; the violation names both the hider and what it hides. The dtype
    conversion a merge folds into the bucket's copy (``Collective.folded``) is no such case: it
    still runs, as the copy-in at the merged start, and rules 7 and 8 judge it there (torch maps
    the erased conversion to the bucket's start or copy-in node in the same way)."""
    hidden_by: dict[str, list[str]] = {}  # hiding node -> the protected collectives it hides
    for c in s.problem.collectives:
        if c.status in s.protected:
            for h in c.hiding:
                hidden_by.setdefault(h, []).append(c.name)
    out = []
    for b, bucket in enumerate(s.plan.buckets):
        if len(bucket.members) > 1:
            hides = {m: list(dict.fromkeys(x for n in (m, s.colls[m].wait) for x in hidden_by.get(n, [])))
                     for m in bucket.members}
            hiders = [m for m in bucket.members if hides[m]]
            if hiders:
                what = "; ".join(f"{m} hides {', '.join(hides[m])}" for m in hiders)
                out.append(Violation(4, b, tuple(hiders),
                                     f"{hiders} hide another collective (start or wait is a hiding node): {what}"))
    return out


def _rule_6_no_dependent_members(s: _FinalState) -> list[Violation]:
    """No member's start depends on another member's wait (the merged start would need the
    merged wait first: a cycle inside the bucket). See ``_waits_reaching_starts`` for memory."""
    return [Violation(6, b, (x, y), f"{y} depends on the wait of {x}")
            for b, bucket in enumerate(s.plan.buckets) if len(bucket.members) > 1
            for x, y in s.verifier.dependent_pairs(bucket.members)]


def _rule_7_hiding_kept(s: _FinalState) -> list[Violation]:
    """Every protected (fully hidden; under protect_partly also partly hidden) collective keeps its
    hiding nodes strictly between its bucket's merged start and merged wait. A collective left
    alone can break this too: a folded conversion that hid it moves with another bucket; the
    violation is then that bucket's."""
    folder = {f: c.name for c in s.problem.collectives for f in c.folded}
    out = []
    for g, members in enumerate(s.members_of):
        for m in members:
            c = s.colls[m]
            if c.status not in s.protected:
                continue
            lo, hi = s.start_of[m], s.wait_of[m]
            outside = [h for h in c.hiding if not lo < s.at(h) < hi]
            if outside:
                moved = [h for h in outside if h in s.folded_at]
                where = g if g < s.n_plan else next((s.group[folder[h]] for h in moved), None)
                note = "; ".join(f"{h} runs as the copy-in of {folder[h]}'s bucket at pos {s.at(h)}" for h in moved)
                out.append(Violation(7, where, (m,), f"hiding node(s) {outside} of {m} are not between the "
                                                     f"bucket's start (pos {lo}) and wait (pos {hi})"
                                                     + (f" ({note})" if note else "")))
    return out


def _rule_8_stream_fifo(s: _FinalState) -> tuple[list[Violation], set[tuple[str, str]]]:
    """One FIFO stream per process group: no new situation A or B (``_new_stream_situations``)
    around a protected collective's hiding node.

    Also returns every hiding relation ``(c, h)`` a new situation breaks, protected or not: the
    quality figures count them, and finding them twice would double this rule's time."""
    out: list[Violation] = []
    broken: set[tuple[str, str]] = set()
    for c, h, g, situation in _new_stream_situations(s):
        broken.add((c.name, h))
        if c.status not in s.protected:
            continue
        b = g if g < s.n_plan else s.group[c.name]
        msg = (f"bucket issued before {c.name} is still on the stream at its hiding node {h}"
               if situation == "A" else
               f"waiting a bucket issued after {c.name} forces it to finish before its hiding node {h}")
        out.append(Violation(8, b if b < s.n_plan else None, s.members_of[g] + (c.name,), msg))
    return out, broken


def _new_stream_situations(s: _FinalState) -> Iterator[tuple[Collective, str, int, str]]:
    """``(c, h, g, situation)`` for every hiding node ``h`` of a hidden or partly hidden collective
    ``c`` and every other bucket ``g`` on ``c``'s group that, in the final state, is issued before
    ``c`` and waited after ``h`` ("A") or issued after ``c`` and waited before ``h`` ("B"), where
    no member of ``g`` made the same situation at the original positions (of ``c``, the member
    and ``h``: a folded conversion is judged where it runs, compared with where it was)."""
    by_pg: dict[str, list[int]] = {}
    for g, ms in enumerate(s.members_of):
        for pg in dict.fromkeys(s.colls[m].pg for m in ms):  # a mixed bucket (rule 2) is on each group
            by_pg.setdefault(pg, []).append(g)
    # Per group, its buckets by merged start and the longest and shortest start-to-wait span
    # among them (negative in a plan that waits before it starts, which rule 9 refuses): a bucket
    # in situation A starts before c and waits after h, so it starts after ph - longest; one in
    # situation B starts after c and waits before h, so it starts before ph - shortest. Bisection
    # finds those few instead of scanning every bucket of the group for every hiding node
    # (quadratic: 9.5 of 20 s of polish at 32 layers went to this rule). Candidates are visited
    # in bucket order, as before.
    by_start = {}
    for pg, gs in by_pg.items():
        spans = sorted((s.start_of[s.members_of[g][0]], g) for g in gs)
        lengths = [s.wait_of[s.members_of[g][0]] - s.start_of[s.members_of[g][0]] for g in gs]
        by_start[pg] = ([sg for sg, _ in spans], [g for _, g in spans], max(lengths), min(lengths))
    colls = s.colls
    for c in s.problem.collectives:
        if not c.hiding or c.status == "exposed":
            continue
        gc, sc = s.group[c.name], s.start_of[c.name]
        starts, order, longest, shortest = by_start[c.pg]
        for h in c.hiding:
            ph, ph0 = s.at(h), s.node_pos[h]  # final and scheduled (a folded conversion moves)
            in_a = order[bisect_right(starts, ph - longest):bisect_left(starts, sc)]
            in_b = order[bisect_right(starts, sc):bisect_left(starts, ph - shortest)]
            for g in sorted(in_a + in_b):
                if g == gc:
                    continue
                ms = s.members_of[g]
                sg, wg = s.start_of[ms[0]], s.wait_of[ms[0]]
                if sg < sc and ph < wg:
                    if not any(colls[x].start_pos < c.start_pos and ph0 < colls[x].wait_pos for x in ms):
                        yield c, h, g, "A"
                elif sc < sg and wg < ph:
                    if not any(c.start_pos < colls[x].start_pos and colls[x].wait_pos < ph0 for x in ms):
                        yield c, h, g, "B"


def _rule_9_schedule_acyclic(s: _FinalState) -> list[Violation]:
    """The final order of pinned nodes respects every dependency ``u -> v``: u's final position is
    before v's. Each violated dependency is reported once, under the lowest plan bucket involved."""
    nodes, v = s.problem.nodes, s.verifier
    wait_owner = v.wait_owner
    fpos = [_final_position(n, s, wait_owner) for n in nodes]
    at = np.array(fpos, dtype=np.float64)
    out = []
    reported: set[tuple[int, int]] = set()
    dep_from, dep_to = v.dependencies
    for e in np.flatnonzero(~(at[dep_from] < at[dep_to])):  # every dependency, in node order
        d, i = int(dep_from[e]), int(dep_to[e])
        n = nodes[i]
        if (d, i) in reported:
            continue
        reported.add((d, i))
        involved = tuple(sorted({x for x in (_owner(nodes[d], wait_owner), _owner(n, wait_owner)) if x}))
        gs = sorted({s.group[x] for x in involved if s.group[x] < s.n_plan})
        out.append(Violation(9, gs[0] if gs else None, involved,
                             f"{nodes[d].name} must run before {n.name}, but the plan puts it at "
                             f"position {fpos[d]} and {n.name} at {fpos[i]}"))
    return out


def _final_position(node, s: _FinalState, wait_owner: dict[str, str]) -> float:
    """A pinned node's final position: a start or wait of a collective moves to its bucket's merged
    start or wait, a folded conversion to just before its bucket's merged start; every other node
    keeps its own."""
    if node.kind == "start" and node.name in s.start_of:
        return s.start_of[node.name]
    if node.kind == "wait":
        c = wait_owner.get(node.name)
        if c is not None:
            return s.wait_of[c]
    return s.at(node.name)


def _rule_10_memory_budget(s: _FinalState, budget: int) -> list[Violation]:
    """The bytes the plan keeps alive beyond the unbucketed schedule by moving starts stay within
    ``budget`` in every segment, counted as torch's memory estimator counts them
    (``planner.cost.memory.rule10_extra``): an all_gather issued earlier holds its output from its
    merged start, one issued later frees that span; a reduce_scatter or all_reduce issued later
    holds its input until its merged start, one issued earlier frees it sooner; a wait moved frees
    nothing (torch frees after the last user, which follows the wait). Reports the first segment
    over it, naming the collectives whose bucket moved a start across it."""
    extra = rule10_extra(s.problem, s.plan)
    bounds = [n.pos for n in s.problem.nodes]
    for j, x in enumerate(extra):
        if x > budget:
            at = bounds[j - 1] if j else 0
            moved = [c.name for c in s.problem.collectives if s.start_of[c.name] != c.start_pos
                     and min(s.start_of[c.name], c.start_pos) <= at <= max(s.start_of[c.name], c.start_pos)]
            return [Violation(10, None, tuple(moved), f"{x} extra bytes alive from position {at} (buffers of "
                                                      f"{moved[:6]}{' ...' if len(moved) > 6 else ''}) exceed the "
                                                      f"budget of {budget}")]
    return []


def _rule_11_peak_memory(s: _FinalState, budget: int) -> list[Violation]:
    """The planned schedule's peak (``planner.cost.memory.memory_timeline``: the graph's own memory,
    every collective's buffers where the plan puts them, merged buckets' copies) is within
    ``budget``."""
    t = memory_timeline(s.problem, s.plan, s.verifier.memory)
    if t.peak_bytes <= budget:
        return []
    bounds = [n.pos for n in s.problem.nodes]
    at = bounds[t.peak_segment - 1] if t.peak_segment else 0
    return [Violation(11, None, (), f"the schedule peaks at {t.peak_bytes} bytes from position {at}, over the "
                                    f"budget of {budget} (unbucketed: {t.unbucketed_peak_bytes})")]


def _quality_of(s: _FinalState, broken: set[tuple[str, str]]) -> Quality:
    """Collectives before and after, merged buckets, and the hiding relations ``(c, h)`` kept: ``h``
    still exists, between c's final start and wait, and not broken by a new stream situation
    (rule 8). A hiding node that is the start or wait of a member of a merged bucket no longer
    exists: torch's merge erases it, or replaces it by the bucket's own (rule 4 forbids this for
    protected collectives; under the default policy partly hidden ones can lose a hider so). A
    folded conversion still runs, at its bucket's copy-in, and is judged there."""
    q = Quality(collectives_before=len(s.problem.collectives), collectives_after=len(s.members_of),
                buckets=sum(1 for bucket in s.plan.buckets if len(bucket.members) > 1))
    gone = {n for bucket in s.plan.buckets if len(bucket.members) > 1
            for m in bucket.members for n in (m, s.colls[m].wait)}
    for c in s.problem.collectives:
        if c.status == "exposed" or not c.hiding:
            continue
        kept = sum(1 for h in c.hiding
                   if h not in gone and s.start_of[c.name] < s.at(h) < s.wait_of[c.name]
                   and (c.name, h) not in broken)
        if c.status == "hidden":
            q.hidden_relations += len(c.hiding)
            q.hidden_kept += kept
        else:
            q.partly_relations += len(c.hiding)
            q.partly_kept += kept
    return q


def _waits_reaching_starts(nodes, buckets: list[list[tuple[int, int]]]) -> set[tuple[int, int]]:
    """The pairs (wait, start) of the same bucket, as node indices, where the start depends on the
    wait; ``buckets`` lists each bucket's members as (wait index, start index).

    Why not ancestor sets of every node: as bitsets over all nodes they take N**2 / 8 bytes (a
    valid 250k-node chain needed 4.4 GB). Only member waits are sources (one bit each) and only
    member starts are asked, so one forward pass in schedule order (``deps`` point to earlier
    nodes) carries, per node, the bits of the member waits it depends on, and
    - covers only the nodes from the first member wait to the last member start;
    - keeps a wait's bit only up to its bucket's last member start (no later node is asked
      about it), so a node carries the bits of buckets still open;
    - forgets a node's bits once its last consumer has been visited, so memory is the
      frontier of the pass (one node in a chain) times the bits in flight, not N**2."""
    bit_of: dict[int, int] = {}  # member wait -> its bit
    expire: dict[int, int] = {}  # node -> bits no node after it is asked about
    owners: dict[int, list[int]] = {}  # member start -> the member waits of its bucket
    sources = sorted((w, g) for g, ms in enumerate(buckets) for w, _ in ms)
    last_start = [max(s for _, s in ms) for ms in buckets]
    for w, g in sources:  # bits in wait order: a node's bitset is no wider than the waits before it
        if w < last_start[g]:  # a wait after every member start reaches none of them
            bit_of[w] = len(bit_of)
            expire[last_start[g]] = expire.get(last_start[g], 0) | (1 << bit_of[w])
    for ms in buckets:
        waits = [w for w, _ in ms if w in bit_of]
        for _, s in ms:
            owners[s] = waits
    if not bit_of:
        return set()
    lo, hi = min(bit_of), max(expire)
    last_use: dict[int, int] = {}
    for i in range(lo, hi + 1):
        for d in nodes[i].deps:
            if d >= lo:
                last_use[d] = i  # ascending i: ends at the last consumer
    out: set[tuple[int, int]] = set()
    carried: dict[int, int] = {}  # node -> bits of the member waits it depends on, while still needed
    live = 0  # bits of waits seen whose bucket has a member start still ahead
    for i in range(lo, hi + 1):
        deps = nodes[i].deps
        r = 0
        for d in deps:
            r |= carried.get(d, 0)
        for d in deps:  # a second loop: a dependency listed twice must not lose its bits
            if last_use.get(d) == i:
                carried.pop(d, None)
        if i in bit_of:
            live |= 1 << bit_of[i]
            r |= 1 << bit_of[i]
        r &= live
        if i in owners and r:
            out.update((w, i) for w in owners[i] if (r >> bit_of[w]) & 1)
        if r and last_use.get(i, -1) > i:
            carried[i] = r
        if i in expire:
            live &= ~expire[i]
    return out


def _owner(node, wait_owner: dict[str, str]) -> str | None:
    if node.kind == "start":
        return node.name
    if node.kind == "wait":
        return wait_owner.get(node.name)
    return None
