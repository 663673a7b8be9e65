"""``bucketplan solve --positions free``: the positioned search from CP-SAT's anchored plan, the
hint and the per-block seed, within a peak memory budget; reported as solve reports."""

from __future__ import annotations

import dataclasses
import sys
import time

from bucketplan.cli.common import GB, CLIError, memory_line, progress, stamped, with_bound


def position_search_and_report(args, problem, anchored, hint, options, peak: int | None, t_start: float) -> int:
    """The positioned search after CP-SAT's ``anchored`` result, as ``options`` say, within ``peak``
    bytes (None: the hint's peak, or the unbucketed schedule's). With ``--deterministic``
    (``options.max_evaluations``) the wall clock is only a guard, and the plan records no creation
    time: two runs write the same bytes."""
    import planner
    from planner.cost.bounds import free_position_floor
    from planner.search.position_search import (FREE_POSITIONS_CP_SAT_SHARE, default_peak_budget,
                                                deterministic_evaluations, position_search)
    from planner.search.result import gap_of
    from planner.search.solver import DETERMINISTIC_WALL_FACTOR

    # by default a plan never holds more than what it replaces
    budget = peak if peak is not None else default_peak_budget(problem, [hint])
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
        planner.save(stamped(anchored.plan, args), args.output)
        print(f"interrupted before the positioned search had a plan: wrote CP-SAT's anchored plan "
              f"({anchored.objective:.3f} ms; verified, not held to --peak-memory-gb) "
              f"to {args.output}", file=sys.stderr)
        return 130
    floor = free_position_floor(problem, peak_memory_bytes=budget)
    gap = gap_of(result.objective, floor.floor_ms)
    planner.save(stamped(with_bound(result.plan, floor.floor_ms, floor.scope, gap), args), args.output)
    _report(args, problem, anchored, result, floor, gap, budget)
    _print_wall(result, evaluations, t_start)
    print(f"wrote               {args.output}")
    return 130 if result.stats.get("interrupted") else 0


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
    print(memory_line(problem, result.plan) + f"; budget {budget / GB:.3f} GB")


def _print_wall(result, evaluations: int | None, t_start: float) -> None:
    guarded = evaluations is not None and result.stats["evaluations"] < evaluations
    print(f"wall                {time.perf_counter() - t_start:.1f}s" + (
        " (a wall-clock limit: another run may differ)" if evaluations is None else
        " (stopped by the wall-clock guard before its evaluations: another run may differ)"
        if guarded else
        f" ({result.stats['evaluations']} evaluations: the same plan on any machine)"))
