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
