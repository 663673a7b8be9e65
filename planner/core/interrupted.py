"""Where a plan cut short by Ctrl-C is written: never over finished work.

A plan marked ``params.interrupted`` is the best verified plan a stopped search had. It replaces
nothing but a missing file or another interrupted plan; where a finished plan (or any file that
is not an interrupted plan: a user's) holds the path, it goes beside it as
``<stem>.interrupted<suffix>`` (``-2``, ``-3``... should that name be taken the same way). A plan
that was not cut short is written where asked, as ``save`` writes it.

Every command that writes plans (solve, solve-dir, sweep) saves them here, so a second run
interrupted a second into its search never replaces the first run's finished plan.
"""

from __future__ import annotations

import os
from pathlib import Path

from planner.core.io import load_plan, save
from planner.core.problem import Plan


def is_interrupted(plan: Plan) -> bool:
    return bool(plan.params.get("interrupted"))


def save_plan(plan: Plan, path: str | os.PathLike) -> Path:
    """Save ``plan`` and return where it went: ``path``, or beside it when ``plan`` is interrupted
    and ``path`` holds finished work."""
    p = Path(path)
    if not is_interrupted(plan):
        return save(plan, p)
    for candidate in _beside(p):
        if _replaceable_by_a_cut_short_plan(candidate):
            return save(plan, candidate)
    raise AssertionError("unreachable: _beside never ends")


def _beside(p: Path):
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


def _replaceable_by_a_cut_short_plan(p: Path) -> bool:
    if not os.path.lexists(p):
        return True
    if p.is_symlink() or not p.is_file():
        return False  # someone's: a link or a folder is never written through
    try:
        return is_interrupted(load_plan(p))
    except (OSError, ValueError):  # not a plan: someone's file
        return False
