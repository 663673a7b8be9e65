"""``bucketplan solve --robust A,B``: the plan with the least worst-case regret across cost
scenarios (planner.search.scenarios), under the policy the flags give."""

from __future__ import annotations

from bucketplan.cli.common import CLIError, progress, scenario_list


def robust_and_report(args, options, best) -> int:
    """Refuse the flags the regret search cannot honour, search as ``options`` (SolveOptions)
    say, write, report."""
    import planner
    from planner.search.scenarios import ScenarioError, describe, robust_plan
    from planner.search.solver import PlanMismatchError

    scenarios = scenario_list(args.robust, "--robust")
    if args.positions == "free" or args.objective != "step":
        raise CLIError("--robust searches anchored plans by their step: no --positions free, "
                       "--objective step")
    if args.window != "auto":
        raise CLIError("--window with --robust: each scenario's step search chooses its own "
                       "window; drop --window")
    if args.deterministic:
        raise CLIError("--deterministic with --robust: its regret search stops on the wall clock; "
                       "drop one of them")
    problem = best.load_problem(args.problem)
    hint = planner.load_plan(args.hint) if args.hint else None
    try:
        result = robust_plan(problem, scenarios, options, hint=hint, progress=progress(args.quiet))
    except ScenarioError as e:
        raise CLIError(f"{args.problem}: {e}") from None
    except PlanMismatchError as e:
        raise CLIError(f"{args.hint}: {e}") from None
    best.write(result.plan)
    for s in scenarios:
        print(f"scenario {s}: {describe(s)}")
    print()
    print("\n".join(result.judged.markdown()))
    print("\nregret: a plan's step over the least step any plan here reaches under that scenario, "
          "minus 1. Steps simulated (planner.simulate) on each scenario's re-priced problem.")
    print(f"wall                {result.wall_s:.1f}s"
          + (" (a CP-SAT search stopped by the wall clock: another run may differ)"
             if result.wall_limit_hit else ""))
    note = "; interrupted: the most robust verified plan so far" if result.interrupted else ""
    print(f"{best.wrote_line()} (robust: worst regret "
          f"{result.judged.worst_regret('robust'):.2%}; verified{note})")
    return 130 if result.interrupted else 0
