"""``bucketplan solve``: one problem's plan by ``planner.plan`` (status, objective, bound, gap); its
flags are all checked before anything is loaded, as one ``PlanSpec``. ``--positions free`` is
reported by solve_free.py, ``--robust`` by solve_robust.py."""

from __future__ import annotations

import contextlib
import sys
import time

from bucketplan.cli.best_plan import BestPlan
from bucketplan.cli.common import (SCENARIOS_HELP, CLIError, built, gigabytes, memory_line,
                                   with_bound, inputs_of, output_file, positive, progress)

OBJECTIVES = ["count", "exposure", "step"]
OBJECTIVE_HELP = ("step: the simulated step time in ms; count: the number of collectives; "
                  "exposure: exposed communication summed per bucket, without stream queuing")

# The PlanSpec field(s) each flag sets (planner.search.planning; "budget.x" and "policy.x" are
# fields of its budget and policy), checked once when the spec is built; tests/test_cli_options.py
# walks the parser against these tables and the spec's fields.
FLAG_FIELDS = {
    "--time-limit": ("budget.seconds",),
    "--deterministic": ("budget.deterministic",),
    "--objective": ("objective",),
    "--workers": ("workers",),
    "--seed": ("seed",),
    "--window": ("window",),
    "--protect-partly": ("policy.protect_partly",),
    "--memory-budget-gb": ("policy.memory_budget_bytes",),
    "--keep-overlap": ("policy.keep_overlap",),
    "--peak-memory-gb": ("policy.peak_memory_bytes",),
    "--positions": ("mode",),
    "--robust": ("mode", "scenarios"),
    "--prove": ("prove_s",),
    "--hint": ("hint",),
}
# the flags that set no field of the spec, and what each is instead
NOT_OPTIONS = {
    "problem": "the problem file",
    "--output": "the plan file written",
    "--quiet": "solve's progress (none)",
}
# the fields no flag sets, and what the command line uses
LIBRARY_ONLY = {
    "probe": "on: a count search probes its bound with the time left",
    "per_block": "on: the positioned search starts from the per-block plan too",
    "starts": "none beyond --hint and CP-SAT's anchored plan",
    "anchored_start": "on: CP-SAT's anchored step plan starts the positioned search",
    "fallback_plans": "none beyond --hint",
    "count_plan": "none: a step search finds its own fewest-collectives plan",
}


def add_parser(sub) -> None:
    s = sub.add_parser("solve",
                       help="optimal bucketing with CP-SAT (status, objective, bound, gap)")
    s.add_argument("problem",
                   help="the problem file to solve (problem.json, as `extract` writes it)")
    s.add_argument("-o", "--output", required=True, help="plan file to write")
    s.add_argument("--time-limit", type=float, default=60.0, help="seconds of search (default 60)")
    s.add_argument("--objective", choices=OBJECTIVES, default="step",
                   help="what to minimize (default step, as solve-dir): " + OBJECTIVE_HELP)
    s.add_argument("--workers", type=int, default=2, help="CP-SAT workers (default 2)")
    s.add_argument("--seed", type=int, default=0,
                   help="CP-SAT's random seed (default %(default)s); with the same workers, the "
                        "same plan")
    s.add_argument("--deterministic", action="store_true",
                   help="--time-limit counts CP-SAT's deterministic time, not wall seconds: the "
                        "same seed and workers give the same plan on any machine, even when not "
                        "proved optimal (runs take longer)")
    s.add_argument("--hint", help="a plan to start from (e.g. greedy-plan.json; default: none)")
    s.add_argument("--window", default="auto",
                   help="'auto' (the default: full model up to 320 collectives, else 16), 'none' "
                        "(full model), or N: limit anchors to N same-key neighbours; the reported "
                        "bound always holds for the whole problem")
    s.add_argument("--protect-partly", action="store_true",
                   help="keep the overlap of partly hidden collectives too (stricter than torch's "
                        "rules; default: off, torch's rules)")
    s.add_argument("--memory-budget-gb", type=float, default=None,
                   help="extra memory kept alive by moved starts/waits stays within this at every "
                        "position (GB = 10^9 bytes; default: no budget)")
    s.add_argument("--positions", choices=["anchored", "free"], default="anchored",
                   help="anchored (the default): each bucket starts and waits where torch "
                        "scheduled one of its members; free: also choose where "
                        "(planner.search.free.position_search, step objective only), within --peak-memory-gb; "
                        "apply, check and use merge such plans where they name")
    s.add_argument("--keep-overlap", action="store_true",
                   help="with --positions free: keep torch's overlap too (rules 4, 7 and 8: a "
                        "bucket keeps what hid each member), as anchored plans do (default: off; "
                        "the step prices lost overlap)")
    s.add_argument("--peak-memory-gb", type=float, default=None,
                   help="with --positions free: the planned schedule's peak memory (GB = 10^9 "
                        "bytes) stays within this (default: the --hint plan's peak if it keeps the rules, "
                        "or the unbucketed schedule's, whichever is higher)")
    s.add_argument("--prove", type=float, default=None, metavar="SECONDS",
                   help="with --positions free: after the search, up to SECONDS more of CP-SAT over "
                        "the candidate space of the search's plan within the same peak "
                        "(planner.search.free.capped): a faster plan of that space, or the proof "
                        "that none is (OPTIMAL). Practical at a few layers (llama3-8b-fsdp-2: seconds); "
                        "with --deterministic, SECONDS of CP-SAT's deterministic time (default: none)")
    s.add_argument("--robust", metavar="A,B,...",
                   help="the plan with the least worst-case regret across these cost scenarios "
                        f"({SCENARIOS_HELP}), within --time-limit")
    s.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    s.set_defaults(func=run)


def run(args) -> int:
    # every flag and the output path are checked before anything is loaded or solved: a bad
    # one must not cost the search's minutes, nor surface as a traceback from CP-SAT or the save
    from bucketplan.cli.rules import check_combinations

    check_combinations(args)  # the table solve-dir applies too
    spec = plan_spec(args)
    output_file(args.output, "-o", inputs_of(args))  # never over the problem, --hint or a measured file
    best = BestPlan(args.output, args)
    try:
        return _plan_and_report(args, spec, best)
    except KeyboardInterrupt:
        # a search stopped by Ctrl-C returns its plan and is reported as usual; this one came
        # between stages (loading, a floor, a model's build, the report): keep what is held
        print(f"bucketplan solve: {best.write_interrupted()}", file=sys.stderr)
        return 130


# the flag that sets each field, by the field's own name (what ArgumentError names)
_FIELD_FLAGS = {f.rpartition(".")[2]: flag for flag, fs in FLAG_FIELDS.items() for f in fs}


def plan_spec(args):
    """The PlanSpec of the flags (FLAG_FIELDS), built and checked once; the hint is loaded with
    the problem (``_plan_and_report``)."""
    from planner.core.policy import Policy
    from planner.search.planning import Budget, PlanSpec

    flags = _FIELD_FLAGS
    free = args.positions == "free"
    scenarios = ()
    if args.robust is not None:
        from bucketplan.cli.solve_robust import robust_scenarios

        scenarios = robust_scenarios(args)
    policy = {"protect_partly": args.protect_partly,
              "memory_budget_bytes": gigabytes(args.memory_budget_gb, "--memory-budget-gb", zero_ok=True)}
    if free:  # a positioned plan prices lost overlap unless --keep-overlap, within --peak-memory-gb
        policy.update(keep_overlap=args.keep_overlap, peak_memory_bytes=gigabytes(args.peak_memory_gb, "--peak-memory-gb"))
    if args.prove is not None:
        positive(args.prove, "--prove")
    return built(PlanSpec, {
        "mode": "robust" if scenarios else args.positions, "objective": args.objective,
        "budget": built(Budget, {"seconds": args.time_limit, "deterministic": args.deterministic}, flags),
        "policy": built(Policy, policy, flags), "prove_s": args.prove, "seed": args.seed, "workers": args.workers,
        "window": _window(args.window), "scenarios": scenarios}, flags)


def _window(value: str) -> int | str | None:
    """--window as SolveOptions takes it: 'auto', 'none' (None: the full model) or a number (which
    SolveOptions checks)."""
    if value in ("auto", "none"):
        return None if value == "none" else value
    try:
        return int(value)
    except ValueError:
        raise CLIError(f"--window must be 'auto', a positive integer, or none for the full model, "
                       f"not {value!r}") from None


def _plan_and_report(args, spec, best: BestPlan) -> int:
    """``bucketplan solve`` once its flags are checked: load, plan (``planner.plan``), write, report."""
    import dataclasses

    import planner
    from planner.jobs.progress import LiveLine
    from planner.core.arguments import ArgumentError
    from planner.search.free.position_search import PeakNotReached
    from planner.search.scenarios import ScenarioError
    from planner.search.solver import PlanMismatchError

    t_start = time.perf_counter()
    problem = best.load_problem(args.problem)
    spec = dataclasses.replace(spec, hint=planner.load_plan(args.hint) if args.hint else None)
    say = progress(args.quiet)
    if spec.mode != "robust":  # the regret search says its own stages
        say(f"solving {args.problem}: {len(problem.collectives)} collectives, objective {args.objective}, "
            f"{spec.mode} positions, time limit {args.time_limit}s")
    try:
        with LiveLine(say) if not args.quiet and spec.mode != "robust" else contextlib.nullcontext(say) as live:
            result = planner.plan(problem, spec, progress=live, search_progress=live, on_plan=best.offer,
                                  started=t_start)
    except PlanMismatchError as e:  # raised before any search (plan checks the hint first)
        raise CLIError(f"{args.hint}: {e}") from None
    except ArgumentError as e:  # a flag this problem cannot take, before any search
        raise CLIError(f"{_FIELD_FLAGS.get(e.name, e.name)}: {e}") from None
    except PeakNotReached as e:  # nothing found within the peak (or proved that nothing fits)
        raise CLIError(f"--peak-memory-gb: {e}") from None
    except ScenarioError as e:
        raise CLIError(f"{args.problem}: {e}") from None
    if result.stats.get("note"):  # how a Ctrl-C left it, said beside the report
        print(result.stats["note"], file=sys.stderr)
    stage = result.stats.get("stage")
    if stage == "robust":
        from bucketplan.cli.solve_robust import robust_report

        return robust_report(result, best)
    if stage == "free":
        from bucketplan.cli.solve_free import positioned_report

        return positioned_report(problem, result, t_start, best)
    if result.plan is None:
        print(f"no plan: {result.summary()}")
        return 130 if result.stats.get("interrupted") else 1
    plan = result.plan
    if args.objective == "step":
        plan = with_bound(plan, result.bound, result.bound_scope or "", result.gap)
    best.write(plan)
    _report(args, problem, result, best)
    return 130 if result.stats.get("interrupted") else 0


def _report(args, problem, result, best: BestPlan) -> None:
    import planner

    notes = []
    if result.stats.get("interrupted"):
        notes.append("interrupted: the best verified plan so far")
    if result.stats.get("model_not_built"):  # a huge problem: its model would pass a limit
        notes.append(f"no search: {result.stats['model_not_built']}")
    if result.stats.get("fallback"):  # solve always returns a verified plan (planner README)
        notes.append(f"no better plan found in time than the {result.stats['fallback']} plan")
    print(f"status              {result.status}" + (f" ({'; '.join(notes)})" if notes else ""))
    print(f"collectives         {len(problem.collectives)} -> "
          f"{planner.collectives_after(problem, result.plan)}")
    scope = result.bound_scope
    if args.objective == "step":
        # None: interrupted before the floor
        bound = "n/a" if result.bound is None else f"{result.bound:.3f} ms"
        print(f"step / bound        {result.objective:.3f} ms (simulated) / {bound} ({scope}); "
              f"unbucketed {planner.simulate(problem).step_ms:.3f} ms")
    else:
        print(f"objective / bound   {result.objective} / {result.bound} ({scope})")
    print(f"gap                 {'n/a' if result.gap is None else f'{result.gap:.1%}'}")
    print(memory_line(problem, result.plan))
    print(f"wall                {result.wall_s:.1f}s"
          + (" (stopped by the wall-clock limit, not the deterministic one: another run may "
             "differ)" if result.stats.get("wall_limit_hit") else ""))
    print(best.wrote_line())
