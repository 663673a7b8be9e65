"""Repair a plan that breaks a rule: the best feasible plan whose buckets lie inside its buckets.

Why this exists: torch's greedy and manual bucketings often break a feasibility rule (rule 9
most of all), and a plan that cannot be applied cannot be compared with one that can. The repair
keeps what the plan chose -- which collectives share a bucket -- and re-chooses anchors, splitting
buckets only where it must, so the comparison is fair. A fast re-anchoring comes first
(``planner.search.polish.reanchored``); a CP-SAT search within the plan's buckets (``solve`` with
``within``) only when that is not enough. The search lives in ``planner.search.solver.repair_within``, because
``solve`` repairs an infeasible hint with it; this module is the public entry.
"""

from __future__ import annotations

from planner.core.options import SolveOptions
from planner.core.problem import Plan, Problem
from planner.search.solver import SolveResult, repair_within

# a repair is quick: the plan's own buckets, most often only re-anchored
REPAIR_OPTIONS = SolveOptions(time_limit_s=10.0)


def repair(problem: Problem, plan: Plan, options: SolveOptions = REPAIR_OPTIONS) -> SolveResult:
    """The best feasible plan whose buckets lie inside ``plan``'s buckets (anchors re-chosen,
    buckets split where needed): how a plan that breaks a rule is compared fairly. ``options``:
    the time limit, workers, seed, determinism and policy of the search (it counts collectives in
    the full model of the plan's buckets: the objective and window do not apply). A plan made for
    another problem raises ``PlanMismatchError`` first. When nothing better is found in time the
    result is solve's fallback (``stats['fallback']``), at worst the unbucketed plan, which lies
    within any plan's buckets: a repair always has a feasible plan."""
    return repair_within(problem, plan, options)
