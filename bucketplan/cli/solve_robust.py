"""``bucketplan solve --robust A,B``: the plan with the least worst-case regret across cost
scenarios (planner.search.scenarios), under the policy the flags give."""

from __future__ import annotations

from bucketplan.cli.common import CLIError, scenario_list


def robust_scenarios(args) -> tuple[str, ...]:
    """--robust's scenarios, each checked now; the flags the regret search cannot honour refused."""
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
    return tuple(scenarios)


def robust_report(result, best) -> int:
    """Write the plan of ``planner.plan``'s robust mode and report every candidate's regret."""
    from planner.search.scenarios import describe

    found = result.stats["robust"]
    best.write(found.plan)
    for s in found.judged.scenarios:
        print(f"scenario {s}: {describe(s)}")
    print()
    print("\n".join(found.judged.markdown()))
    print("\nregret: a plan's step over the least step any plan here reaches under that scenario, "
          "minus 1. Steps simulated (planner.simulate) on each scenario's re-priced problem.")
    print(f"wall                {found.wall_s:.1f}s"
          + (" (a CP-SAT search stopped by the wall clock: another run may differ)"
             if found.wall_limit_hit else ""))
    note = "; interrupted: the most robust verified plan so far" if found.interrupted else ""
    print(f"{best.wrote_line()} (robust: worst regret "
          f"{found.judged.worst_regret('robust'):.2%}; verified{note})")
    return 130 if found.interrupted else 0
