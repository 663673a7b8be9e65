"""``bucketplan solve --positions free``: the positioned search from CP-SAT's anchored plan, the
hint and the per-block seed, within a peak memory budget; reported as solve reports."""

from __future__ import annotations

import dataclasses
import sys
import time

from bucketplan.cli.common import GB, CLIError, memory_line, progress, with_bound


def position_search_and_report(args, problem, anchored, hint, options, peak: int | None, t_start: float,
                               best) -> int:
    """The positioned search after CP-SAT's ``anchored`` result, as ``options`` say, within ``peak``
    bytes (None: the hint's peak, or the unbucketed schedule's). With ``--deterministic``
    (``options.max_evaluations``) the wall clock is only a guard, and the plan records no creation
    time: two runs write the same bytes. ``best`` (``BestPlan``) holds the best verified plan at
    each moment, for a Ctrl-C between stages."""
    from planner.cost.bounds import free_position_floor
    from planner.search.position_search import (FREE_POSITIONS_CP_SAT_SHARE, default_peak_budget,
                                                deterministic_evaluations, position_search)
    from planner.search.result import gap_of
    from planner.jobs.interrupted import mark_interrupted
    from planner.search.solver import DETERMINISTIC_WALL_FACTOR

    # by default a plan never holds more than what it replaces: a legal one (default_peak_budget)
    budget = peak if peak is not None else default_peak_budget(problem, [hint], options.keep_overlap)
    starts = [p for p in (anchored.plan, hint) if p is not None]
    if args.deterministic:  # the positioned share of --time-limit, in evaluations of this problem
        options = dataclasses.replace(options, max_evaluations=deterministic_evaluations(
            problem, (1 - FREE_POSITIONS_CP_SAT_SHARE) * args.time_limit))
    evaluations = options.max_evaluations
    deadline = t_start + args.time_limit * (DETERMINISTIC_WALL_FACTOR if args.deterministic
                                            else 1.0)
    progress(args.quiet)(f"positioned search within a peak of {budget / GB:.3f} GB, "
                         + (f"{evaluations} evaluations" if evaluations is not None
                            else f"{max(0.0, deadline - time.perf_counter()):.0f} s"))
    try:
        result = position_search(problem, starts, options, peak_memory_bytes=budget, deadline=deadline)
    except ValueError as e:  # nothing fits the budget
        raise CLIError(f"--peak-memory-gb: {e}") from None
    except KeyboardInterrupt:  # while the seeds were prepared: CP-SAT's verified plan is the best
        if anchored.plan is None:
            raise
        print(f"interrupted before the positioned search had a plan, so CP-SAT's anchored plan "
              f"({anchored.objective:.3f} ms; verified, not held to --peak-memory-gb): "
              f"{best.write_interrupted()}", file=sys.stderr)
        return 130
    best.offer(result.plan)
    floor = free_position_floor(problem, peak_memory_bytes=budget)
    searched = result
    proof = None
    if args.prove is not None and not result.stats.get("interrupted"):
        proof = _prove(args, problem, result, floor.floor_ms, budget)
        if proof is not None:
            improved = proof.objective < result.objective - 1e-9
            result = dataclasses.replace(proof, stats={
                **result.stats, "interrupted": proof.stats["interrupted"],
                "best_from": result.stats["best_from"] + ("; then CP-SAT's, over its candidate space" if improved else "")})
            best.offer(result.plan)
        else:  # a Ctrl-C while the model was built: the search's plan is the best verified one
            result = dataclasses.replace(result, stats={**result.stats, "interrupted": True},
                                         plan=mark_interrupted(result.plan))
    gap = gap_of(result.objective, floor.floor_ms)
    plan = with_bound(result.plan, floor.floor_ms, floor.scope, gap)
    if proof is not None:  # the second number: the candidate space's bound, named as such
        plan = plan.model_copy(update={"params": {**plan.params, "candidate_bound": {
            "status": proof.status, "bound_ms": round(proof.bound, 6), "scope": proof.bound_scope,
            "gap": round(proof.gap, 6)}}})
    best.write(plan)
    _report(args, problem, anchored, result, floor, gap, budget)
    if proof is not None:
        _report_proof(proof, searched)
    print(memory_line(problem, result.plan) + f"; budget {budget / GB:.3f} GB")
    _print_wall(searched, evaluations, t_start)
    print(best.wrote_line())
    return 130 if result.stats.get("interrupted") else 0


def _prove(args, problem, searched, floor_ms: float, budget: int):
    """CP-SAT over the candidate space of the search's plan within ``budget`` for --prove seconds
    (``solve_capped``); None when a Ctrl-C came before it searched."""
    from planner.search.positioned_solve import CappedSearch, solve_capped

    say = progress(args.quiet)
    say(f"CP-SAT over the search plan's candidate space within {budget / GB:.3f} GB, "
        + (f"{args.prove:g} s of deterministic time" if args.deterministic else f"{args.prove:g} s"))
    try:
        return solve_capped(problem, [searched.plan], peak_memory_bytes=budget, time_limit_s=args.prove,
                            floor_ms=floor_ms, say=None if args.quiet else say,
                            search=CappedSearch(workers=args.workers, deterministic=args.deterministic))
    except KeyboardInterrupt:
        print("interrupted while CP-SAT's positioned model was built: wrote the positioned search's plan",
              file=sys.stderr)
        return None


def _report_proof(proof, searched) -> None:
    """The candidate space's status and bound, beside the floor over every plan."""
    stopped = ("; interrupted" if proof.stats.get("interrupted") else
               "; stopped by the wall-clock guard: another run may differ" if proof.stats.get("wall_limit_hit")
               else "" if proof.status == "OPTIMAL" else "; stopped by its time limit")
    what = ("none is faster" if proof.status == "OPTIMAL"
            else f"none is below {proof.bound:.3f} ms, gap {proof.gap:.1%}")
    print(f"candidate space     {proof.bound_scope}")
    print(f"CP-SAT over it      {proof.status}: {what} ({proof.wall_s:.1f}s{stopped})")
    if proof.objective < searched.objective - 1e-9:
        print(f"CP-SAT improved     {searched.objective:.3f} -> {proof.objective:.3f} ms")


def _report(args, problem, anchored, result, floor, gap: float, budget: int) -> None:
    import planner
    from planner.cost.memory import memory_timeline

    note = "; interrupted: the best verified plan so far" if result.stats.get("interrupted") else ""
    print(f"status              FEASIBLE (local search over positions and membership, best from "
          f"{result.stats['best_from']}{note})")
    print(f"collectives         {len(problem.collectives)} -> "
          f"{planner.collectives_after(problem, result.plan)}")
    print(f"step / bound        {result.objective:.3f} ms (simulated) / {floor.floor_ms:.3f} ms "
          f"({floor.scope} is at least this); "
          f"unbucketed {planner.simulate(problem).step_ms:.3f} ms")
    if anchored.plan is not None:
        over = memory_timeline(problem, anchored.plan).peak_bytes
        print(f"CP-SAT's start      {anchored.objective:.3f} ms (anchored), "
              f"peak {over / GB:.3f} GB"
              + (" (over the budget: fitted before the search)" if over > budget else ""))
    print(f"gap                 {gap:.1%}")


def _print_wall(result, evaluations: int | None, t_start: float) -> None:
    guarded = evaluations is not None and result.stats["evaluations"] < evaluations
    print(f"wall                {time.perf_counter() - t_start:.1f}s" + (
        " (a wall-clock limit: another run may differ)" if evaluations is None else
        " (stopped by the wall-clock guard before its evaluations: another run may differ)"
        if guarded else
        f" ({result.stats['evaluations']} evaluations: the same plan on any machine)"))
