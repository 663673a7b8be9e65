"""The free-positions planner: CP-SAT's anchored step plan, the positioned search from it (and
from the hint, the starts and the per-block plan) within a peak, the floor over every plan with
any positions within that peak as its bound, and optionally CP-SAT over the search plan's
candidate space (``prove_s``). Reached through ``planner.plan`` (mode "free"), which owns the
time shares (``planning.TIME_SHARES``)."""

from __future__ import annotations

import time
from dataclasses import replace

from planner.core.options import PositionSearchOptions
from planner.core.policy import Policy
from planner.core.problem import Problem
from planner.search.result import SolveResult, gap_of, mark_interrupted

GB = 1e9


def check(spec) -> None:
    """What a free-positions spec must be, refused when built (``PlanSpec``)."""
    from planner.core.arguments import ArgumentError

    if spec.objective != "step":
        raise ArgumentError("objective", "free positions are chosen by the simulated step: objective step")
    spec.only_defaults(("scenarios",), "free")


def plan_free(problem: Problem, spec, calls, started: float) -> SolveResult:
    """The free-positions plan ``spec`` asks for (``planning.PlanSpec``), from ``started``."""
    from planner.cost.bounds import free_position_floor
    from planner.search.planning import anchored_seconds
    from planner.search.free.position_search import default_peak_budget, deterministic_evaluations, position_search
    from planner.search.solver import DETERMINISTIC_WALL_FACTOR, solve

    policy = spec.policy or Policy(keep_overlap=False)
    total, deterministic = spec.budget.seconds, spec.budget.deterministic
    anchored = None
    if spec.anchored_start:  # CP-SAT's anchored step plan: one start of the positioned search
        anchored = solve(problem, spec.anchored_options(anchored_seconds(total)), hint=spec.hint,
                         count_plan=spec.count_plan, fallback_plans=spec.fallback_plans,
                         progress=calls.search_progress)
        calls.on_plan(anchored.plan)
        if anchored.plan is None or anchored.stats.get("interrupted"):
            return replace(anchored, stats={**anchored.stats, "stage": "anchored"})
    # by default a plan never holds more than what it replaces: a legal one (default_peak_budget)
    budget = (policy.peak_memory_bytes if policy.peak_memory_bytes is not None
              else default_peak_budget(problem, [spec.hint], policy.keep_overlap))
    positioned_s = total - (anchored_seconds(total) if spec.anchored_start else 0.0)
    evaluations = deterministic_evaluations(problem, positioned_s) if deterministic else None
    options = PositionSearchOptions(seed=spec.seed, max_evaluations=evaluations, per_block=spec.per_block,
                                    keep_overlap=policy.keep_overlap)
    deadline = started + total * (DETERMINISTIC_WALL_FACTOR if deterministic else 1.0)
    calls.progress(f"positioned search within a peak of {budget / GB:.3f} GB, "
                   + (f"{evaluations} evaluations" if evaluations is not None
                      else f"{max(0.0, deadline - time.perf_counter()):.0f} s"))
    starts = [p for p in (anchored.plan if anchored is not None else None, spec.hint, *spec.starts) if p is not None]
    try:
        found = position_search(problem, starts, options, peak_memory_bytes=budget, deadline=deadline)
    except KeyboardInterrupt:  # while the seeds were prepared: CP-SAT's verified plan is the best
        if anchored is None:
            raise
        return replace(anchored, plan=mark_interrupted(anchored.plan), stats={
            **anchored.stats, "stage": "anchored", "interrupted": True,
            "note": f"interrupted before the positioned search had a plan, so CP-SAT's anchored plan "
                    f"({anchored.objective:.3f} ms; verified, not held to the peak)"})
    calls.on_plan(found.plan)
    floor = free_position_floor(problem, peak_memory_bytes=budget)
    stats = {**found.stats, "stage": "free", "peak_budget_bytes": budget, "max_evaluations": evaluations,
             "searched_ms": found.objective, "bound_scope": floor.scope,
             "anchored": None if anchored is None else {"objective_ms": anchored.objective, "plan": anchored.plan}}
    result = replace(found, stats=stats)
    if spec.prove_s is not None and not found.stats.get("interrupted"):
        result = _proved(problem, spec, calls, result, floor.floor_ms, budget)
        calls.on_plan(result.plan)
    return replace(result, status="FEASIBLE", bound=floor.floor_ms, gap=gap_of(result.objective, floor.floor_ms))


def _proved(problem: Problem, spec, calls, searched: SolveResult, floor_ms: float, budget: int) -> SolveResult:
    """CP-SAT over the candidate space of the search's plan within ``budget`` for ``prove_s``
    seconds (``solve_capped``): a faster plan of that space, or the proof that none is. Its status
    and bound travel in ``stats['proof']`` and the plan's ``params['candidate_bound']``."""
    from planner.search.free.capped import CappedModelOptions, solve_capped

    calls.progress(f"CP-SAT over the search plan's candidate space within {budget / GB:.3f} GB, "
                   + (f"{spec.prove_s:g} s of deterministic time" if spec.budget.deterministic
                      else f"{spec.prove_s:g} s"))
    try:
        proof = solve_capped(problem, [searched.plan], peak_memory_bytes=budget, time_limit_s=spec.prove_s,
                             floor_ms=floor_ms, say=calls.search_progress,
                             search=CappedModelOptions(workers=spec.workers, deterministic=spec.budget.deterministic))
    except KeyboardInterrupt:  # while the model was built: the search's plan is the best verified one
        return replace(searched, plan=mark_interrupted(searched.plan), stats={
            **searched.stats, "interrupted": True,
            "note": "interrupted while CP-SAT's positioned model was built: the positioned search's plan"})
    improved = proof.objective < searched.objective - 1e-9
    stats = {**searched.stats, "interrupted": proof.stats.get("interrupted", False), "proof": proof,
             "best_from": searched.stats["best_from"] + ("; then CP-SAT's, over its candidate space" if improved else "")}
    plan = proof.plan.model_copy(update={"params": {**proof.plan.params, "candidate_bound": {
        "status": proof.status, "bound_ms": round(proof.bound, 6), "scope": proof.bound_scope,
        "gap": round(proof.gap, 6)}}})
    return replace(searched, plan=plan, objective=proof.objective, peak_bytes=proof.peak_bytes, stats=stats)
