"""Brute force over every plan of a tiny problem: the independent reference for the planners."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import planner


def _partitions(items):
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in _partitions(rest):
        for k in range(len(part)):
            yield part[:k] + [[first] + part[k]] + part[k + 1:]
        yield [[first]] + part


def feasible_plans(problem: planner.Problem, **policy) -> Iterator[planner.Plan]:
    """Every plan the verifier accepts: every partition of the collectives, every anchor choice."""
    names = [c.name for c in problem.collectives]
    for part in _partitions(names):
        multi = [b for b in part if len(b) > 1]
        for anchors in itertools.product(*[[(s, w) for s in b for w in b] for b in multi]):
            plan = planner.Plan(problem_fingerprint=problem.fingerprint, planner="brute", created="t",
                                buckets=tuple(planner.Bucket(members=tuple(b), start=s, wait=w)
                                              for b, (s, w) in zip(multi, anchors)))
            if not planner.verify(problem, plan, **policy):
                yield plan


def exposure_objective(problem, plan) -> int:
    """The ``exposure`` objective of ``plan`` from its definition (docs/commands.md, *Planning from Python*), written
    apart from the model's own scoring (``cpsat.TimeTerms``/``plan_objective``), so a wrong
    formula there cannot check itself: per bucket (a collective in no bucket is its own), the
    link's cost at 0 bytes once plus each member's cost beyond it, in µs, less the compute
    scheduled between the bucket's start and its wait, never below 0; summed, then times
    (collectives + 1) plus the collectives left (fewer collectives break ties)."""
    links = {link.pg: link for link in problem.links}
    colls = {c.name: c for c in problem.collectives}
    in_bucket = {m for b in plan.buckets for m in b.members}
    groups = [(b.members, colls[b.start].start_pos, colls[b.wait].wait_pos) for b in plan.buckets]
    groups += [((c.name,), c.start_pos, c.wait_pos) for c in problem.collectives if c.name not in in_bucket]

    def compute_before_us(pos: int) -> int:
        return int(round((sum(n.est_ms for n in problem.nodes if n.kind in ("compute", "other") and n.pos < pos)
                          + sum(n.unpinned_ms for n in problem.nodes if n.pos <= pos)) * 1e3))

    total = 0
    for members, start, wait in groups:
        first = colls[members[0]]
        link, kind = links[first.pg], first.kind
        fixed = link.time_ms(kind, 0)
        comm = int(round(fixed * 1e3)) + sum(int(round((link.time_ms(kind, colls[m].wire_bytes) - fixed) * 1e3))
                                             for m in members)
        total += max(0, comm - (compute_before_us(wait) - compute_before_us(start)))
    left = len(problem.collectives) - len(in_bucket) + len(plan.buckets)
    return total * (len(problem.collectives) + 1) + left


def positioned_plans(problem: planner.Problem) -> Iterator[planner.Plan]:
    """Every plan with free positions of a tiny problem: every same-key partition, every anchor
    choice, for every bucket (singletons included) every named start and wait position or none,
    and every order of buckets that share a place. Not filtered: the caller verifies."""
    names = [c.name for c in problem.collectives]
    key = {c.name: (c.kind, c.pg, c.key) for c in problem.collectives}
    places = [None] + [n.name for n in problem.nodes]
    for part in _partitions(names):
        if any(len({key[m] for m in b}) > 1 for b in part):
            continue
        choices = [[(s, w, i, j) for s in b for w in b for i in places for j in places] for b in part]
        for picked in itertools.product(*choices):
            buckets = [planner.Bucket(members=tuple(b), start=s, wait=w, issue_before=i, wait_before=j)
                       for b, (s, w, i, j) in zip(part, picked)]
            # buckets issued (or waited) at one place act in plan order: a FIFO stream runs the first
            # first, so every order is a plan of its own (one order alone missed a faster plan)
            shared = any(len(named) != len(set(named)) for named in
                         ([i for _, _, i, _ in picked if i is not None], [j for _, _, _, j in picked if j is not None]))
            for order in itertools.permutations(buckets) if shared else (buckets,):
                yield planner.Plan(problem_fingerprint=problem.fingerprint, planner="brute", created="t",
                                   buckets=tuple(order))
