"""Memory of a planned schedule, counted the way torch's memory estimator counts it.

Why this exists: a bucket issued early holds its gathered output longer, one issued late holds
its input longer, and a merged bucket copies its members into buffers of its own. Plans that
ignore this drift to gigabytes of extra memory (a free-position search with no budget held
4.6-9.5 GB more than torch's). Torch's overlap scheduler judges memory with
``torch/_inductor/fx_passes/memory_estimator.py``; this module replays the same accounting on
a ``Problem`` without torch, for any plan, so budgets and reports agree with torch's figure on the
graph ``fxglue.apply`` leaves (``tests/test_memory.py``).

The exact accounting (problems whose profile has runs, ``Problem.memory.run_starts``):
- the graph's own storages are a fixed curve over *instants*: runs of scheduled positions (each
  pinned node a run of its own, cut wherever a collective's buffer is allocated or freed at a fixed
  position), and the moments just before a pinned node where a positioned start or wait sits
  (``planner.core.positions``), which hold what the graph holds just before that node (never
  more than while it runs: ``Problem`` refuses a profile that says otherwise), and every
  instant before position 0, which holds what the graph holds just before it runs;
- every collective's buffers are intervals of instants placed by its bucket's merged start ``S``
  and merged wait ``W`` (``_bucket_buffers``): a lone collective keeps the buffers of its own graph
  (its start's storage from ``S`` to ``W``, its wait's from ``W`` to its last user, its input until
  ``S``); a merged bucket has what torch's merge functions (``torch/_inductor/fx_passes/
  bucketing.py``) allocate, read off the graphs they leave: an all_gather bucket allocates its
  output buffer and copies its members' shards in just before ``S`` (the output buffer and the
  start's result are both alive at ``S``), its wait's storage is copied out into each member's
  output right after ``W``; a reduce_scatter or all_reduce bucket concatenates its members' inputs
  just before ``S`` (their storages and the copy both alive then) and its wait's storage is viewed
  by every member, alive until the last member's last user; a coalesced reduce_scatter keeps
  each member's own buffers at the bucket's positions;
- the peak is the largest sum over instants.
Problems extracted before the exact profile existed are counted per segment between pinned
nodes (``_segment_peak``), at most one segment of conservative rounding, as before.

``rule10_extra`` is rule 10's accounting (the bytes a plan keeps alive beyond the unbucketed
schedule by moving starts), counted per segment, without the copies.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass

import numpy as np

import planner.core.arguments as arguments
from planner.core.positions import bucket_positions
from planner.core.problem import Collective, CollectiveBuffers, Plan, Problem, copy_bytes


@dataclass(frozen=True)
class MemoryTimeline:
    """The planned schedule's memory: its peak, where it is, and the unbucketed schedule's peak."""

    peak_bytes: int
    peak_segment: int  # planner.core.problem.MemoryProfile's segment index
    unbucketed_peak_bytes: int
    profiled: bool  # False: the problem has no memory profile, so only the collectives' buffers count

    @property
    def extra_peak_bytes(self) -> int:
        return self.peak_bytes - self.unbucketed_peak_bytes


def buffers_of(problem: Problem, c: Collective) -> CollectiveBuffers:
    """``c``'s buffers from the problem's profile; a problem extracted before profiles existed:
    torch's footprint ``size_bytes`` as the output of an all_gather (until its wait) and as the
    input of a reduce_scatter or all_reduce (from the graph's start)."""
    if problem.memory is not None:
        return problem.memory.buffers[c.name]
    if c.kind == "all_gather":
        return CollectiveBuffers(out_bytes=c.size_bytes, out_last_use=c.wait_pos)
    return CollectiveBuffers(out_bytes=0, out_last_use=c.wait_pos, in_bytes=c.size_bytes, in_alloc=-1)


def _groups(problem: Problem, plan: Plan | None) -> list[tuple[list[Collective], float, float]]:
    """``MemoryCounter.groups`` with the members as collectives."""
    counter = MemoryCounter.of(problem)
    return [([counter.colls[m] for m in members], start, wait) for members, start, wait in counter.groups(plan)]


class _Spans:
    """Bytes added over inclusive ranges of segments, summed once at the end (a difference array)."""

    def __init__(self, problem: Problem):
        self.bounds = [n.pos for n in problem.nodes]
        self.delta = [0] * (len(self.bounds) + 2)

    def segment(self, fpos: float) -> int:
        """The segment an event at ``fpos`` falls in (pinned nodes at or before it)."""
        return bisect_right(self.bounds, fpos)

    def add(self, nbytes: int, first: int, last: int) -> None:
        if nbytes and first <= last:
            self.delta[first] += nbytes
            self.delta[last + 1] -= nbytes

    def totals(self) -> list[int]:
        run, out = 0, []
        for d in self.delta[:-1]:
            run += d
            out.append(run)
        return out


def _collective_buffers(problem: Problem, plan: Plan | None, copies: bool) -> list[int]:
    """Per segment: the collectives' buffers alive in it under ``plan``."""
    spans = _Spans(problem)
    for members, start, wait in _groups(problem, plan):
        at_start = spans.segment(start)
        bufs = [buffers_of(problem, c) for c in members]
        views = len(members) > 1 and members[0].kind != "all_gather"  # one output buffer, member views
        for buf in bufs:
            spans.add(buf.in_bytes, spans.segment(buf.in_alloc), at_start)
            if not views:
                spans.add(buf.out_bytes, at_start, spans.segment(buf.out_last_use))
        if views:
            spans.add(sum(b.out_bytes for b in bufs), at_start, max(spans.segment(b.out_last_use) for b in bufs))
        if copies and len(members) > 1:
            first = members[0]
            group = problem.link(first.pg).group_size
            copy_in, copy_out = copy_bytes(first.kind, [c.wire_bytes for c in members], group, problem.bucket_mode)
            spans.add(copy_in, at_start, at_start)
            spans.add(copy_out, spans.segment(wait), spans.segment(wait))
    return spans.totals()


# Instants just around a bucket's merged start and wait, on positions.py's scale (offsets
# distinct from positions.py's and from each other): the merge's copy-in happens before the start
# (its buffers and the inputs it reads are alive there), the copy-out right after the wait.
BEFORE_START = 1 / 16
AFTER_WAIT = 1 / 32
# Every instant above is a whole number of these (the CP-SAT memory cap counts in them).
INSTANTS_PER_POSITION = 32
NEVER = -math.inf
BUCKET_LAST_USE = "bucket last use"  # an End's floor: the last use of any member's wait storage


@dataclass(frozen=True)
class End:
    """An instant a buffer is allocated or freed: ``max(base + offset, floor)``, ``base`` the
    bucket's merged start ``"S"`` or merged wait ``"W"``, or None for the fixed instant ``floor``.
    ``floor`` may be ``BUCKET_LAST_USE``: the latest last use of the bucket's members' waits."""

    base: str | None
    offset: float = 0.0
    floor: float | str = NEVER

    def at(self, start: float, wait: float, bucket_last_use: float) -> float:
        floor = bucket_last_use if self.floor == BUCKET_LAST_USE else self.floor
        if self.base is None:
            return floor
        return max((start if self.base == "S" else wait) + self.offset, floor)


def _fixed(instant: float | None) -> End:
    return End(None, floor=instant)


def member_buffers(problem: Problem, c: Collective, merged: bool) -> list[tuple[End, End, int]]:
    """(allocated, freed, bytes) of every buffer ``c`` accounts for in a bucket: alone
    (``merged`` False) or with others, its share of the bucket's buffers (module docstring). The
    one definition of where buffers live: ``memory`` evaluates it per plan, the CP-SAT memory cap
    (``planner.search.free.model``) per candidate start and wait."""
    b = buffers_of(problem, c)
    S, W = End("S"), End("W")
    wait_bytes, wait_last_use = b.wait_bytes or 0, b.wait_last_use if b.wait_last_use is not None else NEVER
    fold = b.fold_in_last_use is not None
    if not merged:
        out_end = End("W", floor=NEVER if b.out_last_use <= c.wait_pos else b.out_last_use)
        kept = [(_fixed(b.fold_in_alloc), _fixed(b.fold_in_last_use), b.fold_in_bytes)] if fold else []
        return [(S, out_end, b.out_bytes), (W, End("W", floor=wait_last_use), wait_bytes),
                (_fixed(b.in_alloc), S, b.in_bytes), *kept]
    pre = End("S", -BEFORE_START)
    kind, mode = c.kind, problem.bucket_mode
    out = [(S, W, b.out_bytes)]
    if kind == "all_gather":  # coalesced mode merges all_gathers as the default mode does
        out.append((pre, S, c.wire_bytes))  # its share of the output buffer, allocated before the copy-in
        if mode not in ("custom_ops", "custom_ops_multidtype"):  # default: a cat of what is copied in
            group = problem.link(c.pg).group_size
            out.append((pre, pre, b.fold_in_bytes if b.fold_in_bytes is not None else c.wire_bytes // group))
        after = End("W", AFTER_WAIT)
        out.append((W, after, c.wire_bytes))  # the wait's storage, until it is copied out
        out.append((after, End("W", AFTER_WAIT, wait_last_use), wait_bytes))
        # what the copy-in reads for the last time: an input, or the input of a dtype conversion the
        # merge folds in (the conversion itself is erased, and its output with it)
        if b.fold_in_bytes is None:
            out.append((_fixed(b.in_alloc), pre, b.in_bytes))
        if fold:
            out.append((_fixed(b.fold_in_alloc), pre, b.fold_in_bytes))
        return out
    if kind == "reduce_scatter" and mode == "coalesced":  # no copy: each member's own storages
        return out + [(W, End("W", floor=wait_last_use), wait_bytes), (_fixed(b.in_alloc), S, b.in_bytes)]
    # the concatenated input, alive until the start has read it; one output viewed by every member
    return out + [(pre, S, c.wire_bytes), (_fixed(b.in_alloc), pre, b.in_bytes),
                  (W, End("W", floor=BUCKET_LAST_USE), wait_bytes)]


def _bucket_buffers(problem: Problem, members: list[Collective], start: float,
                    wait: float) -> list[tuple[float, float, int]]:
    """(first instant, last instant, bytes) of every buffer of one bucket at merged start ``start``
    and merged wait ``wait``."""
    merged = len(members) > 1
    last_use = max((buffers_of(problem, c).wait_last_use or 0 for c in members), default=0)
    return [(lo.at(start, wait, last_use), hi.at(start, wait, last_use), nbytes)
            for c in members for lo, hi, nbytes in member_buffers(problem, c, merged) if nbytes]


# nothing runs before position 0: every earlier instant holds what the graph holds just before it
BEFORE_THE_GRAPH = -0.5


def own_memory(problem: Problem):
    """The graph's own bytes at an instant (positions.py's scale) of an exactly profiled problem:
    just before a pinned node, what it holds there; anywhere else, the peak of the run holding it;
    before position 0, what it holds just before it."""
    m = problem.memory
    runs = m.run_starts
    pinned = {n.pos: k for k, n in enumerate(problem.nodes)}

    def own(key: float) -> int:
        key = max(key, BEFORE_THE_GRAPH)
        at = math.ceil(key)
        if key != at and at in pinned:  # just before a pinned node
            return m.before_bytes[pinned[at]]
        return m.run_peak_bytes[max(0, bisect_right(runs, at) - 1)]  # the run holding it

    return own


class MemoryCounter:
    """The exact accounting (module docstring) of one exactly profiled problem, for many plans:
    what no plan changes (every collective's buffers, the run instants and the graph's own bytes at
    each) is computed once, each bucket's buffers are remembered by its members and merged start
    and wait, and the sum over instants is done with numpy.

    Why: the positioned search (``planner.search.free.position_search``) counts tens of thousands of
    plans, each one or two buckets away from the last; recounting every buffer in Python took
    about 70% of each of its evaluations on llama3-8b-fsdp-8 (3.4 ms of a plan's ~5 ms)."""

    # buckets remembered before the memo is emptied (a long search makes hundreds of thousands)
    MEMO_BUCKETS = 100_000

    def __init__(self, problem: Problem):
        m = problem.memory
        self.problem = problem
        self.colls = {c.name: c for c in problem.collectives}
        self.node_pos = {n.name: n.pos for n in problem.nodes}
        self.memo: dict[tuple, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self.exact = _is_exact(problem)
        if not self.exact:  # counted per segment (``_segment_peak``), nothing to keep
            return
        # pinned positions in order, with what the graph holds just before each
        order = sorted(range(len(problem.nodes)), key=lambda k: problem.nodes[k].pos)
        self.pinned_pos = np.array([problem.nodes[k].pos for k in order], dtype=np.float64)
        self.before = np.array([m.before_bytes[k] for k in order], dtype=np.int64)
        self.runs = np.array(m.run_starts, dtype=np.float64)
        self.run_peak = np.array(m.run_peak_bytes, dtype=np.int64)

    @classmethod
    def of(cls, problem: Problem) -> "MemoryCounter":
        """The last counter made here when it is of this very problem, else a new one: callers
        count many plans of one problem in a row, and a problem is immutable."""
        global _LAST_COUNTER
        if _LAST_COUNTER is None or _LAST_COUNTER.problem is not problem:
            _LAST_COUNTER = cls(problem)
        return _LAST_COUNTER

    def _buffers(self, members: tuple[str, ...], start: float, wait: float):
        """(first instants, last instants, bytes) of one bucket's buffers (``_bucket_buffers``)."""
        key = (members, start, wait)
        found = self.memo.get(key)
        if found is None:
            if len(self.memo) >= self.MEMO_BUCKETS:
                self.memo.clear()
            spans = _bucket_buffers(self.problem, [self.colls[n] for n in members], start, wait)
            found = (np.array([a for a, _, _ in spans], dtype=np.float64),
                     np.array([b for _, b, _ in spans], dtype=np.float64),
                     np.array([n for _, _, n in spans], dtype=np.int64))
            self.memo[key] = found
        return found

    def groups(self, plan: Plan | None) -> list[tuple[tuple[str, ...], float, float]]:
        """(members, merged start, merged wait) of every bucket of ``plan``'s final schedule, each
        collective in no bucket a bucket of its own."""
        out, placed = [], set()
        for b in plan.buckets if plan is not None else ():
            out.append((b.members, *bucket_positions(b, self.colls, self.node_pos)))
            placed.update(b.members)
        out += [((c.name,), c.start_pos, c.wait_pos) for c in self.problem.collectives if c.name not in placed]
        return out

    def own(self, keys: np.ndarray) -> np.ndarray:
        """``own_memory`` at every instant of ``keys`` at once: just before a pinned node what the
        graph holds there, anywhere else the peak of the run holding it (``memory_at`` reads
        ``own_memory`` itself, and tests hold the two counts against each other at every instant)."""
        keys = np.maximum(keys, BEFORE_THE_GRAPH)
        at = np.ceil(keys)
        k = np.minimum(np.searchsorted(self.pinned_pos, at), len(self.pinned_pos) - 1)
        before_pinned = (keys != at) & (self.pinned_pos[k] == at)
        run = np.maximum(np.searchsorted(self.runs, at, side="right") - 1, 0)
        return np.where(before_pinned, self.before[k], self.run_peak[run])

    def profile(self, plan: Plan | None) -> tuple[np.ndarray, np.ndarray]:
        """``memory_profile`` as two arrays: the instants in order and the bytes held at each."""
        parts = [(np.zeros(0), np.zeros(0), np.zeros(0, dtype=np.int64))]  # a problem may have no collective
        parts += [self._buffers(*group) for group in self.groups(plan)]
        lo = np.concatenate([p[0] for p in parts])
        hi = np.concatenate([p[1] for p in parts])
        nbytes = np.concatenate([p[2] for p in parts])
        ends = np.concatenate([lo, hi])
        # instants off the run starts: between positions, or at a position no pinned node holds
        k = np.minimum(np.searchsorted(self.pinned_pos, ends), len(self.pinned_pos) - 1)
        off_runs = (ends != np.floor(ends)) | ((self.pinned_pos[k] != ends) & (ends >= 0))
        keys = np.unique(np.concatenate([self.runs, ends[off_runs]]))
        first, past = np.searchsorted(keys, lo, side="left"), np.searchsorted(keys, hi, side="right")
        live = first < past
        delta = np.zeros(len(keys) + 1, dtype=np.int64)
        np.add.at(delta, first[live], nbytes[live])
        np.add.at(delta, past[live], -nbytes[live])
        return keys, np.cumsum(delta[:-1]) + self.own(keys)

    def peak(self, plan: Plan | None) -> tuple[int, float]:
        """The peak bytes and the instant (positions.py's scale) where it is first reached."""
        keys, totals = self.profile(plan)
        at = int(np.argmax(totals))
        return int(totals[at]), float(keys[at])

    def peak_and_segment(self, plan: Plan | None) -> tuple[int, int]:
        """``peak_and_segment`` of this counter's problem."""
        if not self.exact:
            return _segment_peak(self.problem, plan)
        peak, at = self.peak(plan)
        return peak, int(np.searchsorted(self.pinned_pos, at, side="right"))


_LAST_COUNTER: MemoryCounter | None = None


def memory_profile(problem: Problem, plan: Plan | None) -> list[tuple[float, int]]:
    """The exact accounting (module docstring): (instant, bytes) at every instant where the memory
    can change, in order. An instant not listed holds no more than the one listed before it (in
    a run) or the one after it (just before a pinned node), so the peak is among these, and a cap
    on any instant holds for every plan (tests/test_positioned.py)."""
    keys, totals = MemoryCounter.of(problem).profile(plan)
    return [(float(k), int(t)) for k, t in zip(keys, totals)]


def memory_at(problem: Problem, plan: Plan | None, instant: float) -> int:
    """The bytes held at one instant (positions.py's scale) of an exactly profiled problem, summed
    from the buffers directly (tests hold it against ``memory_profile``)."""
    total = own_memory(problem)(instant)
    for members, start, wait in _groups(problem, plan):
        total += sum(nbytes for a, b, nbytes in _bucket_buffers(problem, members, start, wait) if a <= instant <= b)
    return total


def peak_and_segment(problem: Problem, plan: Plan | None) -> tuple[int, int]:
    """The planned schedule's peak bytes and the segment where it is first reached (segment j:
    pinned node j - 1 up to pinned node j)."""
    return MemoryCounter.of(problem).peak_and_segment(plan)


def _is_exact(problem: Problem) -> bool:
    return problem.memory is not None and problem.memory.run_starts is not None


def _segment_peak(problem: Problem, plan: Plan | None) -> tuple[int, int]:
    """The per-segment accounting of problems extracted before the exact profile."""
    own = problem.memory.segment_peak_bytes if problem.memory is not None else None
    totals = _collective_buffers(problem, plan, copies=True)
    best, at = -1, 0
    for j, b in enumerate(totals):
        x = b + (own[j] if own is not None else 0)
        if x > best:
            best, at = x, j
    return best, at


def memory_timeline(problem: Problem, plan: Plan | None = None,
                    counter: MemoryCounter | None = None) -> MemoryTimeline:
    """The peak bytes of ``plan``'s final schedule (``None``: unbucketed) and of the unbucketed one.
    ``plan`` must be well-formed (the verifier's rules 1 and 5). ``counter``: this problem's
    ``MemoryCounter``, when the caller keeps one (the verifier, on every plan a search judges: the
    arguments are checked only without one)."""
    if counter is None:
        _problem_and_plan(problem, plan)
        counter = MemoryCounter.of(problem)
    peak, at = counter.peak_and_segment(plan)
    base, _ = counter.peak_and_segment(None)
    return MemoryTimeline(peak_bytes=peak, peak_segment=at, unbucketed_peak_bytes=base,
                          profiled=problem.memory is not None)


def peak_bytes(problem: Problem, plan: Plan | None = None) -> int:
    _problem_and_plan(problem, plan)
    return peak_and_segment(problem, plan)[0]


def _problem_and_plan(problem, plan) -> None:
    """The public entry points' check: a Problem, and a Plan of it or None (a dict or another
    problem's plan would fail deep inside, naming neither)."""
    arguments.plan_of(problem, plan, optional=True)


def rule10_extra(problem: Problem, plan: Plan) -> list[int]:
    """Per segment: the bytes a plan keeps alive beyond the unbucketed schedule by moving starts
    (rule 10): an all_gather's output from its bucket's merged start instead of its own (negative
    where it starts later), a reduce_scatter's or all_reduce's input until its merged start
    instead of its own (negative where it starts earlier). Waits and copies are not counted here:
    a wait frees nothing, and the peak (``memory_timeline``) counts the copies."""
    spans = _Spans(problem)
    for members, start, _ in _groups(problem, plan):
        merged = spans.segment(start)
        for c in members:
            buf, own = buffers_of(problem, c), spans.segment(c.start_pos)
            if c.kind == "all_gather":  # output alive from the segment of its start on
                spans.add(buf.out_bytes, merged, own - 1)
                spans.add(-buf.out_bytes, own, merged - 1)
            else:  # input alive up to and including the segment of its start
                spans.add(buf.in_bytes, own + 1, merged)
                spans.add(-buf.in_bytes, merged + 1, own)
    return spans.totals()
