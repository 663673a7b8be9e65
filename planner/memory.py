"""Memory of a planned schedule, counted the way torch's memory estimator counts it.

Why this exists: a bucket issued early holds its gathered output longer, one issued late holds
its input longer, and a merged bucket copies its members into buffers of its own. Plans that
ignore this drift to gigabytes of extra memory (a free-position search with no budget held
4.6-9.5 GB more than torch's). Torch's overlap scheduler judges memory with
``torch/_inductor/fx_passes/memory_estimator.py``; this module replays the same accounting on
a ``Problem`` without torch, for any plan, so budgets and reports agree with torch's figure.

The model (``Problem.memory``, written by ``fxglue.extract.memory_profile``):
- the graph's own storages, as torch's estimator counts them in torch's scheduled order, are a
  fixed curve: ``segment_peak_bytes`` per segment between pinned nodes (positions.py's scale);
- a collective's output (``out_bytes``) is allocated at its bucket's merged start and freed after
  its last user (a merged reduce_scatter or all_reduce returns views of one buffer, alive until
  the last member's last user); its input (``in_bytes``, when the start is that storage's last
  use) lives from its producer to the merged start. A merged wait frees nothing: torch frees a
  storage after its last user, and every user of a collective's output comes after its wait;
- a merged bucket's copies (``planner.problem.copy_bytes``): the copy-in buffer at its start, an
  all_gather's copy-out buffer at its wait, each counted in that segment.
An event just before a named node is counted in the whole segment that ends there, and a buffer
freed at an event through that whole segment: a conservative rounding (never below torch's count
on the applied graph) of at most one segment.

``rule10_extra`` is rule 10's accounting (the bytes a plan keeps alive beyond the unbucketed
schedule by moving starts), the same buffers without the copies.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

from planner.positions import bucket_positions
from planner.problem import Collective, CollectiveBuffers, Plan, Problem, copy_bytes


@dataclass(frozen=True)
class MemoryTimeline:
    """The planned schedule's memory: its peak, where it is, and the unbucketed schedule's peak."""

    peak_bytes: int
    peak_segment: int  # planner.problem.MemoryProfile's segment index
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
    colls = {c.name: c for c in problem.collectives}
    node_pos = {n.name: n.pos for n in problem.nodes}
    out, placed = [], set()
    for b in plan.buckets if plan is not None else ():
        out.append(([colls[m] for m in b.members], *bucket_positions(b, colls, node_pos)))
        placed.update(b.members)
    out += [([c], c.start_pos, c.wait_pos) for c in problem.collectives if c.name not in placed]
    return out


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


def peak_and_segment(problem: Problem, plan: Plan | None) -> tuple[int, int]:
    """The planned schedule's peak bytes and the segment where it is first reached."""
    own = problem.memory.segment_peak_bytes if problem.memory is not None else None
    totals = _collective_buffers(problem, plan, copies=True)
    best, at = -1, 0
    for j, b in enumerate(totals):
        x = b + (own[j] if own is not None else 0)
        if x > best:
            best, at = x, j
    return best, at


def memory_timeline(problem: Problem, plan: Plan | None = None) -> MemoryTimeline:
    """The peak bytes of ``plan``'s final schedule (``None``: unbucketed) and of the unbucketed one.
    ``plan`` must be well-formed (the verifier's rules 1 and 5)."""
    peak, at = peak_and_segment(problem, plan)
    base, _ = peak_and_segment(problem, None)
    return MemoryTimeline(peak_bytes=peak, peak_segment=at, unbucketed_peak_bytes=base,
                          profiled=problem.memory is not None)


def peak_bytes(problem: Problem, plan: Plan | None = None) -> int:
    return peak_and_segment(problem, plan)[0]


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
