"""Repair a plan that breaks a rule: the best feasible plan whose buckets lie inside its buckets.

Why this exists: torch's greedy and manual bucketings often break a feasibility rule (rule 9
most of all), and a plan that cannot be applied cannot be compared with one that can. The repair
keeps what the plan chose -- which collectives share a bucket -- and re-chooses anchors, splitting
buckets only where it must, so the comparison is fair. A fast re-anchoring comes first
(``planner.polish.reanchored``); a CP-SAT search within the plan's buckets (``solve`` with
``within``) only when that is not enough. The search lives in ``planner.solver._repair``, because
``solve`` repairs an infeasible hint with it; this module is the public entry.
"""

from __future__ import annotations

from planner.policy import Policy
from planner.problem import Plan, Problem
from planner.solver import SolveResult, _repair


def repair(problem: Problem, plan: Plan, *, time_limit_s: float = 10.0, workers: int | None = None,
           seed: int = 0, protect_partly: bool = False, memory_budget_bytes: int | None = None,
           deterministic: bool = False) -> SolveResult:
    """The best feasible plan whose buckets lie inside ``plan``'s buckets (anchors re-chosen,
    buckets split where needed): how a plan that breaks a rule is compared fairly. A plan made for
    another problem raises ``PlanMismatchError`` first, and a bad argument one ValueError naming it
    (checked in ``_repair``). ``deterministic``: as ``solve``'s. When nothing better is found in
    time the result is solve's floor (``stats['fallback']``), at worst the unbucketed plan, which
    lies within any plan's buckets: a repair always has a feasible plan."""
    return _repair(problem, plan, time_limit_s=time_limit_s, workers=workers, seed=seed,
                   policy=Policy(protect_partly, memory_budget_bytes), deterministic=deterministic)
