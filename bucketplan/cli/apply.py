"""``bucketplan apply``: schedule a workload and apply a plan file to it with torch's merge
functions; reports the collectives before and after."""

from __future__ import annotations

import bucketplan.cli.options as options
from bucketplan.cli.common import CLIError, fmt_counts, progress


def add_parser(sub) -> None:
    s = sub.add_parser("apply", help="schedule a workload and apply a plan file to it")
    s.add_argument("workload", nargs="?", help="a built-in workload (or use --model / --hf-config "
                                               "/ --hf)")
    s.add_argument("plan", help="the plan file to apply (solved for this workload's problem, e.g. "
                                "by `solve`)")
    options.add_model_options(s)
    options.add_pipeline_options(s)
    s.set_defaults(func=run)


def run(args) -> int:
    import planner
    from fxglue.apply import PlanError
    from fxglue.models.workloads import WorkloadError
    from fxglue.pipeline import run_pipeline

    say = progress(args.quiet)
    plan = planner.load_plan(args.plan)
    try:
        result = run_pipeline(options.workload(args), planner_=plan, preset=options.preset(args),
                              pipeline=options.pipeline(args), progress=say)
    except PlanError as e:
        hint = ("; a plan applies to the problem it was solved for: give the flags that problem was extracted "
                "with (the cluster flags, --pre-bucketing, --schedule)") if e.rule == 1 else ""
        raise CLIError(f"{args.plan}: {e}{hint}") from None
    except WorkloadError as e:
        raise CLIError(f"{args.plan}: {e}") from None
    print(f"workload            {result.name}")
    print(f"collectives before  {fmt_counts(result.collectives_before)}")
    print(f"collectives after   {fmt_counts(result.collectives_after)}")
    return 0
