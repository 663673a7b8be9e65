"""Where a plan cut short by Ctrl-C is written: never over finished work, an input, or a better
cut-short plan.

A plan marked ``params.interrupted`` is the best verified plan a stopped search had. It replaces
nothing but a missing file or another interrupted plan of the same problem whose simulated step
is no better; where a finished plan (or any file that is not such a plan: a user's, one of the
command's inputs) holds the path, it goes beside it as ``<stem>.interrupted<suffix>`` (``-2``,
``-3``... should that name be taken the same way). A plan that was not cut short is written where
asked, as ``save`` writes it.

Every command that writes plans (solve, solve-dir, sweep) saves them here, so a second run
interrupted a second into its search never replaces the first run's finished plan.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

from planner.core.io import clobbered_input, load_plan, save
from planner.core.problem import Plan, Problem
from planner.cost.simulator import simulate


def is_interrupted(plan: Plan) -> bool:
    return bool(plan.params.get("interrupted"))


def save_plan(plan: Plan, path: str | os.PathLike, problem: Problem,
              inputs: Iterable[tuple[str, str | os.PathLike]] = ()) -> Path:
    """Save ``plan`` (of ``problem``) and return where it went: ``path``, or beside it when ``plan``
    is interrupted and ``path`` holds finished work, one of ``inputs`` (the command's (label, path)
    pairs, ``planner.core.io.clobbered_input``'s), or a faster cut-short plan."""
    p = Path(path)
    if not is_interrupted(plan):
        return save(plan, p)
    inputs = list(inputs)
    for candidate in beside(p):
        if clobbered_input([candidate], inputs) is None and _replaceable(candidate, plan, problem):
            return save(plan, candidate)
    raise AssertionError("unreachable: beside never ends")


def beside(p: Path):
    """``p``, then ``<stem>.interrupted<suffix>``, ``<stem>.interrupted-2<suffix>``, ..."""
    yield p
    name, suffix = p.name, ""
    for ext in (".json.gz", ".json"):
        if name.endswith(ext):
            name, suffix = name[: -len(ext)], ext
            break
    yield p.with_name(f"{name}.interrupted{suffix}")
    k = 2
    while True:
        yield p.with_name(f"{name}.interrupted-{k}{suffix}")
        k += 1


def _replaceable(p: Path, plan: Plan, problem: Problem) -> bool:
    """Nothing there, or a cut-short plan of ``problem`` that ``plan`` is at least as fast as."""
    if not os.path.lexists(p):
        return True
    if p.is_symlink() or not p.is_file():
        return False  # someone's: a link or a folder is never written through
    try:
        there = load_plan(p)
    except (OSError, ValueError):  # not a plan: someone's file
        return False
    if not is_interrupted(there) or there.problem_fingerprint != problem.fingerprint:
        return False
    try:
        return simulate(problem, plan).step_ms <= simulate(problem, there).step_ms
    except (ValueError, KeyError, IndexError):  # a hand-edited plan the simulator cannot price
        return False
