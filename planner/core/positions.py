"""Where a bucket's merged start and merged wait sit in the final schedule: the one definition.

Why this exists: a bucket anchored at one member's scheduled start and one member's scheduled
wait (its anchors) is never issued earlier than its earliest member nor waited later than its
latest one. Torch's manual per-block pass does exactly that (it prefetches
the next block's all_gather and defers reduce_scatter waits) and beats every anchored plan at
depth. A bucket may therefore name the pinned node its merged start is issued before
(``Bucket.issue_before``) and the one its merged wait sits before (``Bucket.wait_before``).
The verifier, the simulator, the memory timeline and the search all read positions here, so
they cannot disagree on what a plan means.

Final positions are numbers on the scale of ``Node.pos`` (torch's scheduled order):
- an anchored start sits at its start anchor's ``start_pos``, an anchored wait at its wait
  anchor's ``wait_pos`` (integers, as always);
- a positioned wait sits at ``pos(wait_before) - WAIT_OFFSET``, a positioned start at
  ``pos(issue_before) - START_OFFSET``: both just before the named node, a wait ahead of a start
  placed before the same node (waiting first frees memory; a FIFO stream gains nothing from the
  start going first, since the next bucket would begin when the waited one ends either way).
The named node is a place in torch's order, not an event that moves: naming a member's own start
means "where that start was scheduled". Several starts before one node are issued in plan order
(the order of ``plan.buckets``); nothing depends on the order of several waits at one place.
Every pinned node that is not a start or wait of a collective keeps its own position, but one:
the dtype conversion feeding an all_gather that torch's merge folds into the bucket's copy
(``Collective.folded``). When its all_gather joins a bucket of two or more, the conversion runs
as that bucket's copy-in, just before the merged start (``pos - FOLD_OFFSET``), and whatever it
hid is judged there (``folded_positions``); a collective left alone keeps its conversion.
"""

from __future__ import annotations

import math

from planner.core.problem import Bucket, Collective, Plan, Problem

# Offsets below the named node's position: distinct, exact in binary floating point, and in
# (0, 1) so a positioned event stays after every node scheduled before the named one.
WAIT_OFFSET = 0.5
START_OFFSET = 0.25
# a folded conversion runs right before its bucket's merged start: after a wait or another start
# placed before the same node (offsets 0.5, 0.25), and ahead of the start it feeds
FOLD_OFFSET = 0.125


def is_positioned(bucket: Bucket) -> bool:
    """Whether the bucket names a start or wait position instead of using its anchors."""
    return bucket.issue_before is not None or bucket.wait_before is not None


def plan_is_positioned(plan: Plan | None) -> bool:
    return plan is not None and any(is_positioned(b) for b in plan.buckets)


def unknown_positions(bucket: Bucket, node_pos: dict[str, int]) -> list[str]:
    """The named positions that are not pinned nodes of the problem (a bucket so named has no
    final state)."""
    return [n for n in (bucket.issue_before, bucket.wait_before) if n is not None and n not in node_pos]


def bucket_positions(bucket: Bucket, colls: dict[str, Collective], node_pos: dict[str, int]) -> tuple[float, float]:
    """(merged start, merged wait) of one bucket of a well-formed plan: anchors are members and
    named positions are pinned nodes (``unknown_positions`` is empty)."""
    start = (node_pos[bucket.issue_before] - START_OFFSET if bucket.issue_before is not None
             else colls[bucket.start].start_pos)
    wait = (node_pos[bucket.wait_before] - WAIT_OFFSET if bucket.wait_before is not None
            else colls[bucket.wait].wait_pos)
    return start, wait


def final_positions(problem: Problem, plan: Plan | None) -> dict[str, tuple[float, float]]:
    """Per collective: (its bucket's merged start, its bucket's merged wait); a collective in no
    bucket keeps its own. ``plan`` must be well-formed (the verifier's rules 1 and 5)."""
    colls = {c.name: c for c in problem.collectives}
    node_pos = {n.name: n.pos for n in problem.nodes}
    out: dict[str, tuple[float, float]] = {}
    for bucket in plan.buckets if plan is not None else ():
        where = bucket_positions(bucket, colls, node_pos)
        for m in bucket.members:
            out[m] = where
    for c in problem.collectives:
        out.setdefault(c.name, (c.start_pos, c.wait_pos))
    return out


def folded_positions(problem: Problem, plan: Plan | None,
                     final: dict[str, tuple[float, float]] | None = None) -> dict[str, float]:
    """Per folded conversion that moves (its all_gather is in a bucket of two or more members):
    its final position, just before that bucket's merged start. ``final``: ``final_positions``
    of the same plan, when the caller has it. Every other pinned node keeps ``Node.pos``."""
    if plan is None or not any(c.folded for c in problem.collectives):
        return {}
    colls = {c.name: c for c in problem.collectives}
    final = final if final is not None else final_positions(problem, plan)
    return {f: final[m][0] - FOLD_OFFSET for bucket in plan.buckets if len(bucket.members) > 1
            for m in bucket.members for f in colls[m].folded}


def place_of(fpos: float) -> int:
    """The scheduled position of the node an event at ``fpos`` sits before (or at): what compute
    ran before it is the compute scheduled before that position."""
    return math.ceil(fpos)


def final_order(problem: Problem, plan: Plan) -> list[tuple[str, int | None, str]]:
    """The pinned events of ``plan``'s final schedule, in order: ``(node name, bucket index or
    None, "start" | "wait" | "node")``. A merged or positioned bucket's start is named by its start
    anchor, its wait by its wait anchor's wait node, each at ``bucket_positions``; its members'
    other starts and waits, and the conversions folded into its copy-in (two or more members), are
    no events of their own; every other pinned node keeps its position. Several starts (or waits)
    before one node keep the plan's order. ``plan`` must be well-formed (the verifier's rules 1
    and 5): what ``fxglue.apply`` lays the graph out by."""
    colls = {c.name: c for c in problem.collectives}
    node_pos = {n.name: n.pos for n in problem.nodes}
    events: list[tuple[float, int, str, int | None, str]] = []  # (position, plan order, name, bucket, what)
    gone: set[str] = set()
    for b, bucket in enumerate(plan.buckets):
        if len(bucket.members) < 2 and not is_positioned(bucket):
            continue
        start, wait = bucket_positions(bucket, colls, node_pos)
        events += [(start, b, bucket.start, b, "start"), (wait, b, colls[bucket.wait].wait, b, "wait")]
        gone.update(*((m, colls[m].wait) for m in bucket.members))
        if len(bucket.members) > 1:
            gone.update(f for m in bucket.members for f in colls[m].folded)
    events += [(n.pos, -1, n.name, None, "node") for n in problem.nodes if n.name not in gone]
    events.sort(key=lambda e: (e[0], e[1]))
    return [(name, b, what) for _, _, name, b, what in events]
