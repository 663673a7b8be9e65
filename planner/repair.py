"""Repair a plan that breaks a rule: the best feasible plan whose buckets lie inside its buckets.

Why this exists: torch's greedy and manual bucketings often break a feasibility rule (rule 9
most of all), and a plan that cannot be applied cannot be compared with one that can. The repair
keeps what the plan chose -- which collectives share a bucket -- and re-chooses anchors, splitting
buckets only where it must, so the comparison is fair. A fast re-anchoring comes first; a CP-SAT
search within the plan's buckets (``planner.solver.solve`` with ``within``) only when that is not
enough.
"""

from __future__ import annotations

import time

from planner.cpsat import plan_objective
from planner.polish import anchored
from planner.policy import Policy
from planner.problem import Plan, Problem
# planner.solver imports this module only inside solve (to repair an infeasible hint), so this
# top-level import is no circle
from planner.solver import SolveResult, check_plan_matches, solve
from planner.verifier import verify


def _reanchor(problem: Problem, plan: Plan) -> Plan:
    """A fast repair: keep every bucket's members, re-anchor them (``planner.polish.anchored``),
    and break up buckets the verifier still rejects. Never fewer buckets than ``plan``."""
    candidate = anchored(problem, plan)
    for _ in range(len(candidate.buckets) + 1):
        bad = {v.bucket for v in verify(problem, candidate) if v.bucket is not None}
        if not bad:
            break
        candidate = candidate.model_copy(update={"buckets": tuple(
            b for k, b in enumerate(candidate.buckets) if k not in bad)})
    return candidate


def repair(problem: Problem, plan: Plan, *, time_limit_s: float = 10.0, workers: int | None = None,
           seed: int = 0, protect_partly: bool = False, memory_budget_bytes: int | None = None) -> SolveResult:
    """The best feasible plan whose buckets lie inside ``plan``'s buckets (anchors re-chosen,
    buckets split where needed): how a plan that breaks a rule is compared fairly.

    A fast re-anchoring comes first; when it keeps every bucket it is optimal for this
    restricted space (no refinement has fewer buckets) and no search is needed."""
    check_plan_matches(problem, plan)
    t0 = time.perf_counter()
    policy = Policy(protect_partly, memory_budget_bytes).as_params()
    quick = _reanchor(problem, plan)
    quick_ok = not verify(problem, quick, **policy)
    if quick_ok and len(quick.buckets) == len(plan.buckets):
        result = SolveResult(plan=quick, status="FEASIBLE", objective=plan_objective(problem, quick, "count"),
                             bound=None, gap=None, wall_s=round(time.perf_counter() - t0, 3),
                             stats={"repair": "re-anchored", "restricted_bound": plan_objective(problem, quick,
                                                                                                 "count")})
    else:
        # the plan itself (or its partial re-anchoring) is the hint: usually only anchors move
        result = solve(problem, time_limit_s=time_limit_s, workers=workers, seed=seed, within=plan, window=None,
                       hint=quick if quick_ok else plan, **policy)
    if result.plan is not None:
        # the policy it was repaired under, as solve records it: the re-anchored plan carries the
        # given plan's params, which may name no policy or another one (`bucketplan verify` reads it)
        result.plan = result.plan.model_copy(update={"planner": f"{plan.planner}-repaired",
                                                     "params": {**result.plan.params, "repaired": plan.planner,
                                                                **policy}})
    return result
