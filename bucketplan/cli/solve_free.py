"""``bucketplan solve --positions free``: the report of ``planner.plan``'s free mode (the positioned
search from CP-SAT's anchored plan, the hint and the per-block seed, within a peak memory budget),
as solve reports."""

from __future__ import annotations

import time

from bucketplan.cli.common import GB, memory_line, with_bound


def positioned_report(problem, result, t_start: float, best) -> int:
    """Write and report the plan of ``planner.plan``'s free mode: the positioned search's (or
    CP-SAT's over its candidate space, with --prove), within the peak budget, its floor as the
    bound. With ``--deterministic`` the plan records no creation time: two runs write the same
    bytes."""
    stats = result.stats
    plan = with_bound(result.plan, result.bound, result.bound_scope, result.gap)
    best.write(plan)
    _report(problem, result)
    proof = stats.get("proof")
    if proof is not None:
        _report_proof(proof, stats["searched_ms"])
    print(memory_line(problem, result.plan) + f"; budget {stats['peak_budget_bytes'] / GB:.3f} GB")
    _print_wall(stats, t_start)
    print(best.wrote_line())
    return 130 if stats.get("interrupted") else 0


def _report_proof(proof, searched_ms: float) -> None:
    """The candidate space's status and bound, beside the floor over every plan."""
    stopped = ("; interrupted" if proof.stats.get("interrupted") else
               "; stopped by the wall-clock guard: another run may differ" if proof.stats.get("wall_limit_hit")
               else "" if proof.status == "OPTIMAL" else "; stopped by its time limit")
    what = ("none is faster" if proof.status == "OPTIMAL"
            else f"none is below {proof.bound:.3f} ms, gap {proof.gap:.1%}")
    print(f"candidate space     {proof.bound_scope}")
    print(f"CP-SAT over it      {proof.status}: {what} ({proof.wall_s:.1f}s{stopped})")
    if proof.objective < searched_ms - 1e-9:
        print(f"CP-SAT improved     {searched_ms:.3f} -> {proof.objective:.3f} ms")


def _report(problem, result) -> None:
    import planner
    from planner.cost.memory import memory_timeline

    stats, budget = result.stats, result.stats["peak_budget_bytes"]
    note = "; interrupted: the best verified plan so far" if stats.get("interrupted") else ""
    print(f"status              FEASIBLE (local search over positions and membership, best from "
          f"{stats['best_from']}{note})")
    print(f"collectives         {len(problem.collectives)} -> "
          f"{planner.collectives_after(problem, result.plan)}")
    print(f"step / bound        {result.objective:.3f} ms (simulated) / {result.bound:.3f} ms "
          f"({result.bound_scope} is at least this); "
          f"unbucketed {planner.simulate(problem).step_ms:.3f} ms")
    anchored = stats.get("anchored")
    if anchored is not None and anchored["plan"] is not None:
        over = memory_timeline(problem, anchored["plan"]).peak_bytes
        print(f"CP-SAT's start      {anchored['objective_ms']:.3f} ms (anchored), "
              f"peak {over / GB:.3f} GB"
              + (" (over the budget: fitted before the search)" if over > budget else ""))
    print(f"gap                 {result.gap:.1%}")


def _print_wall(stats: dict, t_start: float) -> None:
    evaluations = stats["max_evaluations"]
    guarded = evaluations is not None and stats["evaluations"] < evaluations
    print(f"wall                {time.perf_counter() - t_start:.1f}s" + (
        " (a wall-clock limit: another run may differ)" if evaluations is None else
        " (stopped by the wall-clock guard before its evaluations: another run may differ)"
        if guarded else
        f" ({stats['evaluations']} evaluations: the same plan on any machine)"))
