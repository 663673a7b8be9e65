"""The independent feasibility verifier: checks a plan against the rules of planner/README.md.

Why this exists: a plan may come from torch's greedy, from CP-SAT, or from a file; none of
them may certify itself. This module re-derives everything from the ``Problem`` -- final
positions, reachability, hiding intervals -- and shares no code with any planner, so a
modelling bug in a planner shows up here as a named violation.

The final state of a plan: a bucket's merged start sits at its start anchor's start
position, its merged wait at its wait anchor's wait position; a collective in no bucket is a
bucket of its own; every other node keeps its position.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.problem import MAX_BYTES, Plan, Problem

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
POLICY_KEYS = ("protect_partly", "memory_budget_bytes")


def recorded_policy(plan: Plan, *, ignore=()) -> dict:
    """The policy options ``plan.params`` records (``POLICY_KEYS``; absent keys are left out),
    as keyword arguments of ``verify``/``check``. Keys in ``ignore`` (the caller overrides them)
    are not read. A value that is no policy raises ValueError naming the key: params are free
    JSON, and a hand-edited "yes" or -1 must not silently become some policy."""
    out: dict = {}
    if "protect_partly" in plan.params and "protect_partly" not in ignore:
        value = plan.params["protect_partly"]
        if not isinstance(value, bool):
            raise ValueError(f"params.protect_partly: {value!r} is not a policy (true or false)")
        out["protect_partly"] = value
    if "memory_budget_bytes" in plan.params and "memory_budget_bytes" not in ignore:
        value = plan.params["memory_budget_bytes"]
        # type() is int: True is an int in Python, and a JSON float is not a byte count
        if value is not None and not (type(value) is int and 0 <= value < MAX_BYTES):
            raise ValueError(f"params.memory_budget_bytes: {value!r} is not a budget "
                             f"(null or an integer from 0 to below 2**62)")
        out["memory_budget_bytes"] = value
    return out


def verify(problem: Problem, plan: Plan, *, check_fingerprint: bool = True, protect_partly: bool = False,
           memory_budget_bytes: int | None = None) -> list[Violation]:
    """Every rule violation of ``plan`` on ``problem`` (empty list: the plan is feasible)."""
    return check(problem, plan, check_fingerprint=check_fingerprint, protect_partly=protect_partly,
                 memory_budget_bytes=memory_budget_bytes).violations


def check(problem: Problem, plan: Plan, *, check_fingerprint: bool = True, protect_partly: bool = False,
          memory_budget_bytes: int | None = None) -> Report:
    """Violations and quality figures of ``plan`` on ``problem``.

    ``protect_partly``: the stricter policy in which rules 7 and 8 protect partly hidden
    collectives too (torch's default protects fully hidden ones only).
    """
    protected_status = {"hidden", "partly"} if protect_partly else {"hidden"}
    report = Report()
    out = report.violations
    colls = {c.name: c for c in problem.collectives}
    node_pos = {n.name: n.pos for n in problem.nodes}

    # Rule 1: the plan is for this problem and names only its collectives.
    if check_fingerprint and plan.problem_fingerprint != problem.fingerprint:
        out.append(Violation(1, None, (), f"plan is for problem {plan.problem_fingerprint or '(none)'}, "
                                          f"not {problem.fingerprint}"))
    bucket_of: dict[str, int] = {}
    for b, bucket in enumerate(plan.buckets):
        unknown = [m for m in bucket.members if m not in colls]
        if unknown:
            out.append(Violation(1, b, tuple(unknown), f"unknown collective(s) {unknown}"))
        for m in bucket.members:
            if m in bucket_of:
                out.append(Violation(1, b, (m,), f"{m} is also in bucket {bucket_of[m]}"))
            bucket_of.setdefault(m, b)
        # Rule 5: anchors are members (the Plan type checks this too; files can be hand-made).
        for role, anchor in (("start", bucket.start), ("wait", bucket.wait)):
            if anchor not in bucket.members:
                out.append(Violation(5, b, (anchor,), f"{role} anchor {anchor} is not a member"))
    if out:  # positions are undefined for an ill-formed plan
        return report

    # Final state: every collective's merged start / wait position.
    start_of: dict[str, int] = {}
    wait_of: dict[str, int] = {}
    group: dict[str, int] = {}  # collective -> bucket id (singletons get ids after the plan's)
    members_of: list[tuple[str, ...]] = []
    for b, bucket in enumerate(plan.buckets):
        members_of.append(bucket.members)
        for m in bucket.members:
            start_of[m] = colls[bucket.start].start_pos
            wait_of[m] = colls[bucket.wait].wait_pos
            group[m] = b
    for c in problem.collectives:
        if c.name not in group:
            group[c.name] = len(members_of)
            members_of.append((c.name,))
            start_of[c.name] = c.start_pos
            wait_of[c.name] = c.wait_pos

    # Hiding nodes of fully hidden collectives: torch never merges a collective whose start or
    # wait is one of them.
    protected_hiders = {h for c in problem.collectives if c.status == "hidden" for h in c.hiding}

    for b, bucket in enumerate(plan.buckets):
        ms = [colls[m] for m in bucket.members]
        # Rule 2: same bucket key (kind, process group, and the mode's dtype/op fields).
        keys = {(m.kind, m.pg, m.key) for m in ms}
        if len(keys) > 1:
            out.append(Violation(2, b, bucket.members, f"members have different keys: {sorted(k[2] for k in keys)}"))
        # Rule 3: byte cap on torch's memory footprint.
        total = sum(m.size_bytes for m in ms)
        if total > problem.bucket_cap_bytes:
            out.append(Violation(3, b, bucket.members,
                                 f"{total} bytes exceed the cap of {problem.bucket_cap_bytes}"))
        # Rule 4: collectives used for hiding never merge.
        if len(ms) > 1:
            hiders = [m.name for m in ms if m.name in protected_hiders or m.wait in protected_hiders]
            if hiders:
                out.append(Violation(4, b, tuple(hiders),
                                     f"{hiders} hide another collective (start or wait is a hiding node)"))

    nodes = problem.nodes
    index = {n.name: i for i, n in enumerate(nodes)}

    # Rule 6: no member's start depends on another member's wait (the merged start would need
    # the merged wait first: a cycle inside the bucket).
    merged = [(b, bucket) for b, bucket in enumerate(plan.buckets) if len(bucket.members) > 1]
    depends = _waits_reaching_starts(nodes, [[(index[colls[m].wait], index[m]) for m in bucket.members]
                                             for _, bucket in merged])
    for b, bucket in merged:
        for x in bucket.members:
            wx = index[colls[x].wait]
            for y in bucket.members:
                if x != y and (wx, index[y]) in depends:
                    out.append(Violation(6, b, (x, y), f"{y} depends on the wait of {x}"))

    # Rule 7: every fully hidden member keeps its hiding nodes strictly inside its bucket.
    for b, bucket in enumerate(plan.buckets):
        for m in bucket.members:
            c = colls[m]
            if c.status not in protected_status:
                continue
            s, w = start_of[m], wait_of[m]
            outside = [h for h in c.hiding if not s < node_pos[h] < w]
            if outside:
                out.append(Violation(7, b, (m,), f"hiding node(s) {outside} of {m} are not between the "
                                                 f"bucket's start (pos {s}) and wait (pos {w})"))

    # Rule 8: FIFO stream per process group -- no new enclosure of a hidden collective's hiding
    # interval (start, hider) by another bucket issued earlier and waited after the hider (A),
    # and no new bucket issued later but waited before the hider (B).
    by_pg: dict[str, list[int]] = {}
    for g, ms in enumerate(members_of):
        for pg in dict.fromkeys(colls[m].pg for m in ms):  # a mixed bucket (rule 2) is on each group
            by_pg.setdefault(pg, []).append(g)
    broken: set[tuple[str, str]] = set()
    for c in problem.collectives:
        if not c.hiding or c.status == "exposed":
            continue
        gc = group[c.name]
        sc = start_of[c.name]
        for h in c.hiding:
            ph = node_pos[h]
            for g in by_pg[c.pg]:
                if g == gc:
                    continue
                ms = members_of[g]
                sg, wg = start_of[ms[0]], wait_of[ms[0]]
                if sg < sc and ph < wg:
                    situation = "A"
                    was = any(colls[x].start_pos < c.start_pos and ph < colls[x].wait_pos for x in ms)
                elif sc < sg and wg < ph:
                    situation = "B"
                    was = any(c.start_pos < colls[x].start_pos and colls[x].wait_pos < ph for x in ms)
                else:
                    continue
                if was:
                    continue
                broken.add((c.name, h))
                if c.status in protected_status:
                    b = g if g < len(plan.buckets) else group[c.name]
                    msg = (f"bucket issued before {c.name} is still on the stream at its hiding node {h}"
                           if situation == "A" else
                           f"waiting a bucket issued after {c.name} forces it to finish before its hiding node {h}")
                    out.append(Violation(8, b if b < len(plan.buckets) else None, ms + (c.name,), msg))

    # Rule 9: the final order of pinned nodes respects every dependency.
    wait_owner = {c.wait: c.name for c in problem.collectives}

    def final_pos(i: int) -> int:
        n = nodes[i]
        if n.kind == "start" and n.name in start_of:
            return start_of[n.name]
        if n.kind == "wait":
            c = wait_owner.get(n.name)
            if c is not None:
                return wait_of[c]
        return n.pos

    fpos = [final_pos(i) for i in range(len(nodes))]
    reported: set[tuple[int, int]] = set()
    for i, n in enumerate(nodes):
        for d in n.deps:
            if fpos[d] >= fpos[i]:
                pair = (d, i)
                if pair in reported:
                    continue
                reported.add(pair)
                involved = tuple(sorted({x for x in (_owner(nodes[d], wait_owner), _owner(n, wait_owner)) if x}))
                gs = sorted({group[x] for x in involved if group[x] < len(plan.buckets)})
                out.append(Violation(9, gs[0] if gs else None, involved,
                                     f"{nodes[d].name} must run before {n.name}, but the plan puts it at "
                                     f"position {fpos[d]} and {n.name} at {fpos[i]}"))

    # Rule 10 (only with a budget): extra bytes alive because starts moved earlier or waits later.
    if memory_budget_bytes is not None:
        delta: dict[int, int] = {}
        for c in problem.collectives:
            for lo, hi in ((start_of[c.name], c.start_pos), (c.wait_pos, wait_of[c.name])):
                if lo < hi:  # alive over [lo, hi) beyond the original schedule
                    delta[lo] = delta.get(lo, 0) + c.size_bytes
                    delta[hi] = delta.get(hi, 0) - c.size_bytes
        extra = 0
        for p in sorted(delta):
            extra += delta[p]
            if extra > memory_budget_bytes:
                out.append(Violation(10, None, (), f"{extra} extra bytes alive at position {p} exceed the "
                                                   f"budget of {memory_budget_bytes}"))
                break

    # Quality figures.
    q = report.quality
    q.collectives_before = len(problem.collectives)
    q.collectives_after = len(members_of)
    q.buckets = sum(1 for ms in plan.buckets if len(ms.members) > 1)
    for c in problem.collectives:
        if c.status == "exposed" or not c.hiding:
            continue
        kept = sum(1 for h in c.hiding
                   if start_of[c.name] < node_pos[h] < wait_of[c.name] and (c.name, h) not in broken)
        if c.status == "hidden":
            q.hidden_relations += len(c.hiding)
            q.hidden_kept += kept
        else:
            q.partly_relations += len(c.hiding)
            q.partly_kept += kept
    return report


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
