"""A discrete-event model of a bucketed schedule: what a plan costs in milliseconds.

Why this exists: the verifier says whether a plan is *allowed*; it says nothing about whether
it is *worth it*. Bucketing saves per-collective latency but moves starts later and waits
earlier, and on a FIFO stream a big bucket can hold up everything queued behind it. The only
way to weigh those effects against each other without a GPU is to replay the final schedule
on a model of the streams. This module is that model, torch-free like the rest of
``planner``, so planners can score plans and a person can look at the result in Perfetto.

The model (see ``planner/README.md`` for the assumptions):
- one compute stream runs the pinned compute/other nodes in final order, each for ``est_ms``,
  and the unpinned nodes' compute where they are scheduled (``Node.unpinned_ms``: before the
  pinned node that follows them, and before whatever is issued or waited there);
- one FIFO communication stream per process group;
- a bucket is issued at its merged start (its start anchor's position, or the position it
  names: ``planner.core.positions``): it begins no earlier than the compute
  stream's clock at that moment and no earlier than the end of the previous bucket on its
  stream, and runs for ``link.time_ms(kind, sum of wire_bytes)`` (latency paid once);
- a bucket's wait, at its merged wait, stalls the compute stream until it is done;
- with ``problem.bucketing`` set, what torch's merge adds runs on the compute stream too: every
  collective issued costs ``launch_ms`` at its start, a merged bucket's input copy runs right
  before it is issued and an all_gather bucket's output copy right after its wait (see
  ``planner.core.problem.BucketingCost``). Without it merging is free, as in earlier problems;
- a dtype conversion torch's merge folds into a bucket's copy (``Collective.folded``) runs, for
  its ``est_ms``, right before that bucket is issued instead of at its own position;
- ``contention`` (1 by default: overlap is free): while any collective runs on any stream, work on
  the compute stream progresses ``contention`` times slower, because NCCL's kernels take SMs and
  memory bandwidth from the kernels they overlap (``planner.search.scenarios``' ``contention`` scenario,
  with its published figure). Stalls on a wait are not work and are not slowed; the collectives'
  own times are left as priced.
"""

from __future__ import annotations

import json
import os
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from pathlib import Path

from planner.core.arguments import PlanMismatchError, check_fingerprint, problem_and_plan
from planner.core.positions import bucket_positions, place_of, unknown_positions
from planner.core.problem import MAX_CONTENTION, Collective, Link, Plan, Problem, copy_bytes


@dataclass(frozen=True)
class ComputeRun:
    """One compute (or other pinned) node on the compute stream, or a bucketing overhead
    (``kind`` "launch", "copy-in" or "copy-out")."""

    name: str
    begin_ms: float
    end_ms: float
    kind: str = "compute"


@dataclass(frozen=True)
class BucketRun:
    """One bucket (a collective in no bucket is a bucket of its own) on its group's stream.

    ``issue_ms``: compute-stream clock when the start is reached; ``begin_ms`` / ``end_ms``:
    when it occupies the stream; ``wait_ms``: compute-stream clock when its wait is reached;
    ``blocked_ms``: how long that wait stalled the compute stream.
    """

    members: tuple[str, ...]
    kind: str
    pg: str
    wire_bytes: int
    issue_ms: float
    begin_ms: float
    end_ms: float
    wait_ms: float
    blocked_ms: float

    @property
    def label(self) -> str:
        if len(self.members) == 1:
            return f"{self.kind}: {self.members[0]}"
        return f"{self.kind} x{len(self.members)}: {', '.join(self.members)}"


@dataclass(frozen=True)
class Simulation:
    """The simulated step: its length, what waits cost per process group, and every run."""

    step_ms: float
    compute_ms: float  # the graph's own compute and other pinned nodes
    exposed_ms_by_pg: dict[str, float]
    buckets: tuple[BucketRun, ...]  # in issue order
    compute: tuple[ComputeRun, ...]  # in run order
    overhead_ms: float = 0.0  # launches and bucketing copies on the compute stream

    @property
    def exposed_ms(self) -> float:
        return sum(self.exposed_ms_by_pg.values())


def _buckets(problem: Problem, plan: Plan | None, index: "ReplayIndex") -> list[tuple[tuple[str, ...], float, float]]:
    """(members, merged start, merged wait) for every bucket of the final state, positions as
    ``planner.core.positions`` defines them."""
    colls = index.colls
    out, placed = [], set()
    for i, b in enumerate(plan.buckets if plan is not None else ()):
        unknown = [m for m in b.members if m not in colls]
        if unknown:
            raise PlanMismatchError(f"bucket {i}: unknown collective(s) {unknown}")
        missing = unknown_positions(b, index.node_pos)
        if missing:
            raise PlanMismatchError(f"bucket {i}: named position(s) {missing} are not pinned nodes of the problem")
        out.append((b.members, *bucket_positions(b, colls, index.node_pos)))
        placed.update(b.members)
    out += [((c.name,), c.start_pos, c.wait_pos) for c in problem.collectives if c.name not in placed]
    return out


@dataclass(frozen=True)
class ReplayIndex:
    """What a replay reads of a problem alone, computed once by ``replay_index`` (a local search
    replays thousands of plans of one problem).

    ``compute_before[pos]``: the graph's compute scheduled before position ``pos`` (a running
    sum in node order; the unpinned compute scheduled just before the node at ``pos`` included,
    ``Node.unpinned_ms``). The compute stream's clock at any position is that plus ``delay``,
    everything else the stream has run so far (stalls, launches, copies), so a replay only visits
    the buckets' anchors: at 32 layers 300 events instead of 8,600 nodes."""

    colls: dict[str, Collective]
    links: dict[str, Link]
    node_pos: dict[str, int]  # pinned node -> its scheduled position (named positions)
    compute_before: dict[int, float]  # at every pinned node's position and at n_scheduled
    compute_ms: float  # the whole graph's
    compute_nodes: tuple[tuple[int, str, float, float], ...]  # (pos, name, begin before delays, est_ms)
    folded: dict[str, tuple[tuple[str, int, float], ...]]  # collective -> (node, pos, est_ms) it folds
    contention: float = 1.0  # compute-stream slow-down while a collective runs (1: overlap is free)
    prices: dict[tuple[str, ...], "_Price"] = field(default_factory=dict, compare=False)  # by members, as met


@dataclass(frozen=True)
class _Price:
    """What a bucket costs wherever it is issued: its stream time and its compute-stream
    overheads (launch, copies; 0 without ``problem.bucketing``)."""

    kind: str
    pg: str
    wire_bytes: int
    duration_ms: float
    launch_ms: float
    copy_in_ms: float
    copy_out_ms: float


# bucket prices an index remembers (a local search meets each member list again and again);
# bounded so that hours of search stay within memory
PRICES_REMEMBERED = 100_000


def _price(problem: Problem, index: ReplayIndex, members: tuple[str, ...]) -> _Price:
    got = index.prices.get(members)
    if got is None:
        first = index.colls[members[0]]
        link = index.links[first.pg]
        wires = [index.colls[m].wire_bytes for m in members]
        launch = copy_in = copy_out = 0.0
        if problem.bucketing is not None:
            cost = problem.bucketing
            in_bytes, out_bytes = copy_bytes(first.kind, wires, link.group_size, problem.bucket_mode)
            launch, copy_in, copy_out = cost.launch_ms, cost.copy_ms(in_bytes), cost.copy_ms(out_bytes)
        got = _Price(first.kind, first.pg, sum(wires), link.time_ms(first.kind, sum(wires)), launch, copy_in, copy_out)
        if len(index.prices) >= PRICES_REMEMBERED:
            index.prices.clear()
        index.prices[members] = got
    return got


def check_contention(contention: float) -> float:
    """``contention`` as a slow-down factor: a finite number from 1 (overlap is free) to
    ``MAX_CONTENTION``; anything else raises ValueError."""
    if isinstance(contention, bool) or not isinstance(contention, (int, float)) \
            or not 1.0 <= contention <= MAX_CONTENTION:
        raise ValueError(f"contention {contention!r}: give a slow-down factor from 1 (overlap is free) to "
                         f"{MAX_CONTENTION:g}")
    return float(contention)


def replay_index(problem: Problem, contention: float | None = None) -> ReplayIndex:
    """What every replay of ``problem`` reads, computed once; ``contention``: see the module
    docstring (it is the index's, so a search scores every plan under the same one); None: the
    problem's own (``Problem.contention``)."""
    contention = check_contention(problem.contention if contention is None else contention)
    acc, before, nodes = 0.0, {}, []
    for node in problem.nodes:
        acc += node.unpinned_ms  # scheduled before this node: it runs before what is issued or waited here
        before[node.pos] = acc
        if node.kind in ("compute", "other"):
            nodes.append((node.pos, node.name, acc, node.est_ms))
            acc += node.est_ms
    before[problem.n_scheduled] = acc
    by_name = {n.name: n for n in problem.nodes}
    return ReplayIndex(colls={c.name: c for c in problem.collectives},
                       links={c.pg: problem.link(c.pg) for c in problem.collectives},
                       node_pos={n.name: n.pos for n in problem.nodes}, compute_before=before, compute_ms=acc,
                       compute_nodes=tuple(nodes),
                       folded={c.name: tuple((f, by_name[f].pos, by_name[f].est_ms) for f in c.folded)
                               for c in problem.collectives if c.folded}, contention=contention)


@dataclass(frozen=True)
class _Folds:
    """The folded conversions that move in one plan (their all_gather is in a bucket of two or
    more): per bucket, (node, est_ms) of those it runs before it is issued; their scheduled
    positions in order with the running sum of their est_ms, so the compute scheduled before a
    position can leave out the ones that moved away (``before``)."""

    at: dict[int, tuple] = field(default_factory=dict)
    positions: tuple[int, ...] = ()
    sums: tuple[float, ...] = ()
    names: frozenset[str] = frozenset()

    def before(self, place: int) -> float:
        """The est_ms of moved conversions scheduled before ``place``."""
        k = bisect_left(self.positions, place) if self.positions else 0
        return self.sums[k - 1] if k else 0.0

    @property
    def total_ms(self) -> float:
        return self.sums[-1] if self.sums else 0.0


class _GraphRuns:
    """The graph's own compute runs of a recorded replay, in order; nothing when not recording."""

    def __init__(self, index: ReplayIndex, folds: _Folds, record: bool):
        self.pending = iter(index.compute_nodes) if record else iter(())
        self.next = next(self.pending, None)
        self.folds = folds
        self.runs: list[ComputeRun] = []

    def until(self, upto: float | None, delay: float, warp=None) -> None:
        """Record the nodes scheduled before ``upto`` (None: all), ``delay`` later than scheduled;
        a moved folded conversion runs at its bucket's start instead. ``warp`` (under contention):
        the clock at which the compute done so far reaches a point of the schedule, instead."""
        while self.next is not None and (upto is None or self.next[0] < upto):
            at, name, begin, ms = self.next
            if ms > 0 and name not in self.folds.names:
                begin -= self.folds.before(at)
                if warp is None:
                    self.runs.append(ComputeRun(name, begin + delay, begin + delay + ms, "compute"))
                else:
                    self.runs.append(ComputeRun(name, warp(begin), warp(begin + ms), "compute"))
            self.next = next(self.pending, None)


class _Contention:
    """The compute stream's clock when collectives slow it down: work progresses ``factor``
    times slower while any collective issued so far occupies its stream.

    The times some collective runs are kept as their union, sorted disjoint spans (touching ones
    merged), updated as each is issued: a replay asks ``finish`` once per stretch of work, hundreds
    of times, and re-sorting every collective in flight each time made replays under contention
    2.3x slower than without (a local search scores thousands)."""

    def __init__(self, factor: float):
        self.factor = factor
        self.begins: list[float] = []  # the union's spans, sorted; those before ``first`` ended
        self.ends: list[float] = []
        self.first = 0

    def add(self, begin: float, end: float) -> None:
        if end <= begin:
            return
        begins, ends = self.begins, self.ends
        i = bisect_right(begins, begin, self.first)
        if i > self.first and ends[i - 1] >= begin:  # joins the span before it
            i -= 1
            ends[i] = max(ends[i], end)
        else:
            begins.insert(i, begin)
            ends.insert(i, end)
        while i + 1 < len(begins) and begins[i + 1] <= ends[i]:  # and swallows those it reaches
            ends[i] = max(ends[i], ends[i + 1])
            del begins[i + 1], ends[i + 1]

    def finish(self, clock: float, work_ms: float) -> float:
        """When ``work_ms`` of compute begun at ``clock`` ends. The compute clock only moves
        forward, so spans that ended by ``clock`` are passed for good."""
        begins, ends, k = self.begins, self.ends, self.first
        while k < len(ends) and ends[k] <= clock:
            k += 1
        self.first = k
        if work_ms <= 0:
            return clock
        t, left = clock, work_ms
        for k in range(k, len(ends)):
            a, b = begins[k], ends[k]  # a span begun before t is counted from t
            if a > t:  # free until the next collective begins
                if left <= a - t:
                    return t + left
                left, t = left - (a - t), a
            done = (b - t) / self.factor  # work done while it runs
            if left <= done:
                return t + left * self.factor
            left, t = left - done, b
        return t + left


class _ComputeStream:
    """The compute stream's work during a replay. At a point ``here`` of the schedule (the
    graph's compute before it) the stream's clock is ``here + delay``, ``delay`` (the replay's)
    being everything else it has run or waited: stalls, launches, copies, moved conversions and,
    under contention, how much longer its work took beside collectives (each stretch of work is
    timed against those in flight)."""

    def __init__(self, index: ReplayIndex, record: bool, folds: _Folds):
        self.record = record
        self.colls = index.colls
        self.graph_runs = _GraphRuns(index, folds, record)
        self.runs = self.graph_runs.runs
        self.slow = _Contention(index.contention) if index.contention != 1.0 else None
        self.mark = 0.0  # under contention: the point of the schedule the stream had reached

    def reach(self, here: float, pos: float, delay: float) -> float:
        """Under contention: run the graph's compute up to ``here``, where the event at ``pos``
        happens, and return the new ``delay`` (without contention it is unchanged)."""
        since, mark, slow = self.mark + delay, self.mark, self.slow
        if self.record:  # nothing else has graph runs to time: no closure per event (10% of a replay)
            self.graph_runs.until(pos, delay, lambda x: slow.finish(since, x - mark))
        self.mark = here
        return slow.finish(since, here - mark) - here

    def work(self, clock: float, ms: float, kind: str, name: str = "", bucket: tuple = ()) -> float:
        """How long ``ms`` of work begun at ``clock`` takes: a moved conversion (``name``) or a
        launch or copy of ``bucket`` (``kind``)."""
        if ms <= 0:
            return 0.0
        took = ms if self.slow is None else self.slow.finish(clock, ms) - clock
        if self.record:  # labels only then: a local search replays thousands of plans
            label = name or f"{kind}: {self.colls[bucket[0]].kind} x{len(bucket)}"
            self.runs.append(ComputeRun(label, clock, clock + took, kind))
        return took


def _folded_moves(index: ReplayIndex, buckets: list) -> _Folds:
    if not index.folded:
        return _Folds()
    per_bucket: dict[int, tuple] = {}
    moved = []
    for b, (members, _, _) in enumerate(buckets):
        if len(members) > 1:
            here = [f for m in members for f in index.folded.get(m, ())]
            if here:
                per_bucket[b] = tuple((f, ms) for f, _, ms in here)
                moved += [(pos, ms) for _, pos, ms in here]
    moved.sort()
    acc, sums = 0.0, []
    for _, ms in moved:
        acc += ms
        sums.append(acc)
    return _Folds(per_bucket, tuple(p for p, _ in moved), tuple(sums),
                  frozenset(f for runs in per_bucket.values() for f, _ in runs))


def simulate(problem: Problem, plan: Plan | None = None, *, contention: float | None = None) -> Simulation:
    """Replay the final schedule of ``plan`` on ``problem`` (``None``: unbucketed). A plan made
    for another problem raises ``PlanMismatchError`` (it would be priced on the wrong graph).
    ``contention``: compute slowed that many times while a collective runs (module docstring);
    None: the problem's own."""
    _check_arguments(problem, plan)
    return _replay(problem, plan, replay_index(problem, contention), record=True)


def _check_arguments(problem: Problem, plan: Plan | None) -> None:
    """A Problem and a Plan of it (or None). Only the fingerprints are compared here; names the
    problem does not have are refused as they are met (``_buckets``)."""
    problem_and_plan(problem, plan, optional=True)
    if plan is not None:
        check_fingerprint(problem, plan)


def step_ms(problem: Problem, plan: Plan | None = None, index: ReplayIndex | None = None, *,
            contention: float | None = None) -> float:
    """``simulate(problem, plan, contention=...).step_ms``, without recording the runs (a local
    search scores thousands of plans). ``index``: ``replay_index(problem, contention)`` when the
    caller has it (its contention is the one used)."""
    _check_arguments(problem, plan)
    if index is not None and contention is not None and contention != index.contention:
        raise ValueError(f"contention {contention!r} differs from the index's ({index.contention!r})")
    return _replay(problem, plan, index or replay_index(problem, contention), record=False).step_ms


def _replay(problem: Problem, plan: Plan | None, index: ReplayIndex, record: bool) -> Simulation:
    # A bucket acts only at its merged start and merged wait (``planner.core.positions``: its anchors'
    # own positions, or just before the nodes it names), and every other node keeps its
    # position. So walking those events in position order *is* walking the final order; the
    # starts and waits of the members themselves do nothing, and compute runs between them.
    # Events at one position are of one type (positions.py); starts there go in plan order.
    buckets = _buckets(problem, plan, index)
    # a folded conversion that moves runs before its bucket's start, on the compute stream, and
    # no longer where it was scheduled: positions after it have that much less compute before them
    folds = _folded_moves(index, buckets)
    events = sorted([(start, b, 0) for b, (_, start, _) in enumerate(buckets)]
                    + [(wait, b, 1) for b, (_, _, wait) in enumerate(buckets)])
    delay = 0.0  # on the compute stream besides the graph's compute (``_ComputeStream``)
    stream = _ComputeStream(index, record, folds)
    stream_free: dict[str, float] = {}  # per process group: when its FIFO stream is idle again
    exposed = dict.fromkeys(index.links, 0.0)
    issued: dict[int, dict] = {}  # in flight: issued, not yet waited
    done: dict[int, BucketRun] = {}
    issue_order: list[int] = []
    overhead_ms = last_end = 0.0
    work, slow, until = stream.work, stream.slow, stream.graph_runs.until

    for pos, b, is_wait in events:
        place = place_of(pos)
        here = index.compute_before[place] - folds.before(place)
        if slow is None:
            until(pos, delay)
        else:
            delay = stream.reach(here, pos, delay)
        if not is_wait:
            members = buckets[b][0]
            price = _price(problem, index, members)
            for name, ms in folds.at.get(b, ()):  # its folded conversions, as the first part of its copy-in
                delay += work(here + delay, ms, "compute", name)
            before = delay
            delay += work(here + delay, price.launch_ms, "launch", "", members)
            delay += work(here + delay, price.copy_in_ms, "copy-in", "", members)
            overhead_ms += delay - before
            clock = here + delay
            # The comm stream waits on the compute stream at issue (ProcessGroupNCCL syncs the
            # streams), so a collective never runs ahead of the compute issued before it.
            begin = max(clock, stream_free.get(price.pg, 0.0))
            end = begin + price.duration_ms
            stream_free[price.pg] = end
            last_end = max(last_end, end)
            if slow is not None:
                slow.add(begin, end)
            issue_order.append(b)
            issued[b] = (members, price, clock, begin, end)
        else:
            if b not in issued:
                raise ValueError(f"bucket {list(buckets[b][0])}: waited at position {buckets[b][2]} before it is "
                                 f"issued at {buckets[b][1]}")
            members, price, issue_ms, begin, end = issued.pop(b)
            clock = here + delay
            blocked = max(0.0, end - clock)
            exposed[price.pg] += blocked
            if record:
                done[b] = BucketRun(members=members, kind=price.kind, pg=price.pg, wire_bytes=price.wire_bytes,
                                    issue_ms=issue_ms, begin_ms=begin, end_ms=end, wait_ms=clock, blocked_ms=blocked)
            delay += blocked
            took = work(here + delay, price.copy_out_ms, "copy-out", "", members)
            delay += took
            overhead_ms += took
    # every collective has been waited by now: the rest of the graph's compute runs alone
    until(None, delay)
    if issued:  # cannot happen for a valid problem: every collective has a wait
        raise ValueError(f"bucket(s) never waited: {[list(r[0]) for r in issued.values()]}")

    # the moved conversions ran inside ``delay``: the graph's own compute leaves them out
    compute_end = index.compute_ms - folds.total_ms + delay
    return Simulation(step_ms=max(compute_end, last_end), compute_ms=index.compute_ms,
                      exposed_ms_by_pg=exposed, buckets=tuple(done[b] for b in issue_order) if record else (),
                      compute=tuple(stream.runs), overhead_ms=overhead_ms)


def to_chrome_trace(sim: Simulation, problem: Problem) -> dict:
    """Chrome / Perfetto trace JSON: a compute track and one track per process group."""
    if not isinstance(sim, Simulation):
        raise ValueError(f"sim must be a planner.Simulation (planner.simulate's result), not {type(sim).__name__}")
    problem_and_plan(problem, None, optional=True)
    pid = 1
    pgs = sorted({r.pg for r in sim.buckets} | {c.pg for c in problem.collectives})
    tid = {pg: i + 1 for i, pg in enumerate(pgs)}
    us = 1000.0  # trace times are microseconds

    def meta(name: str, t: int, value) -> dict:
        return {"name": name, "ph": "M", "pid": pid, "tid": t, "args": value}

    events = [{"name": "process_name", "ph": "M", "pid": pid,
               "args": {"name": f"bucketplan simulation {problem.fingerprint[:19]}".strip()}},
              meta("thread_name", 0, {"name": "compute"}), meta("thread_sort_index", 0, {"sort_index": 0})]
    for pg in pgs:
        events += [meta("thread_name", tid[pg], {"name": f"pg {pg}"}),
                   meta("thread_sort_index", tid[pg], {"sort_index": tid[pg]})]

    def span(name: str, cat: str, t: int, begin: float, end: float, args: dict | None = None) -> dict:
        return {"name": name, "cat": cat, "ph": "X", "pid": pid, "tid": t,
                "ts": begin * us, "dur": (end - begin) * us, "args": args or {}}

    for c in sim.compute:
        events.append(span(c.name, c.kind, 0, c.begin_ms, c.end_ms))
    for r in sim.buckets:
        args = {"members": list(r.members), "wire_bytes": r.wire_bytes, "issue_ms": r.issue_ms,
                "queued_ms": r.begin_ms - r.issue_ms, "wait_ms": r.wait_ms, "blocked_ms": r.blocked_ms}
        events.append(span(r.label, r.kind, tid[r.pg], r.begin_ms, r.end_ms, args))
        if r.blocked_ms > 0:
            events.append(span(f"blocked: {r.label}", "blocked", 0, r.wait_ms, r.wait_ms + r.blocked_ms,
                               {"pg": r.pg}))
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"step_ms": sim.step_ms, "compute_ms": sim.compute_ms, "overhead_ms": sim.overhead_ms,
                          "exposed_ms": sim.exposed_ms,
                          "exposed_ms_by_pg": dict(sim.exposed_ms_by_pg)}}


def write_chrome_trace(sim: Simulation, problem: Problem, path: str | os.PathLike) -> Path:
    """Write the trace atomically (``planner.core.io.atomic_write_text``)."""
    from planner.core.io import atomic_write_text

    return atomic_write_text(path, json.dumps(to_chrome_trace(sim, problem)))
