"""``bucketplan check``: run the original and the bucketed graphs for real on gloo ranks and
compare them bitwise."""

from __future__ import annotations

import bucketplan.cli.options as options
from bucketplan.cli.common import CLIError, built, progress

# the flag that sets each CheckOptions field (save_problems: `extract --tiny -o`; timeout_s: the
# library's default)
CHECK_FLAGS = {"ranks": "--ranks", "planner": "--planner", "plan": "--plan", "bucket_mode": "--bucket-mode",
               "pre_bucketing": "--pre-bucketing", "seed": "--seed"}


def add_parser(sub) -> None:
    s = sub.add_parser("check", help="run original and bucketed graphs for real on gloo; compare "
                                     "bitwise")
    s.add_argument("workload", nargs="?", help="a built-in workload (tiny shapes), or use --model")
    options.add_model_options(s)
    g = s.add_mutually_exclusive_group()
    g.add_argument("--plan", help="a plan file for the tiny-shape problem of this workload, or a "
                   "folder of rank<R>/plan.json, one per rank (`bucketplan extract --tiny` writes "
                   "each rank's problem)")
    options.add_planner_option(g)
    s.add_argument("--ranks", type=int, default=2,
                   help="gloo processes to run on (default %(default)s, at least 2; a 2-D workload "
                        "gets TP 2 from 4 ranks on, else TP 1)")
    s.add_argument("--seed", type=int, default=0,
                   help="torch's seed for the parameters, the same on every rank (default "
                        "%(default)s)")
    s.add_argument("--pre-bucketing", action="store_true",
                   help="run torch's FSDP pre-bucketing before scheduling (default: off, as in "
                        "extract)")
    s.add_argument("--bucket-mode", choices=options.BUCKET_MODES,
                   help="torch's bucket mode (default: torch's config, i.e. 'default')")
    s.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    s.set_defaults(func=run)


def run(args) -> int:
    from fxglue.models.workloads import WorkloadError
    from fxglue.run.gloo import check_workload

    say = progress(args.quiet)
    if args.graph:
        raise CLIError("check runs built-in workloads and --model factories for real on gloo; a "
                       "--graph file holds no module to run (extract, solve and apply plan it)")
    if args.hf_config or args.hf:
        raise CLIError("check runs built-in workloads and --model factories; for --hf-config/--hf "
                       "use a built-in hf-... workload of the same architecture (tiny shapes) or a "
                       "--model factory")
    # one workload, a factory that imports, --layers only with --model: before spawning
    options.workload(args)
    what = args.workload or args.model
    shapes = "tiny shapes" if args.workload else "the shapes the factory builds"
    say(f"running {what} ({shapes}) on {args.ranks} gloo ranks: original vs bucketed")
    try:
        result = check_workload(args.workload, _check_options(args), model=args.model,
                                parallel=args.parallel, layers=args.layers)
    except WorkloadError as e:
        raise CLIError(str(e)) from None
    print(result.summary())
    return 0 if result.ok else 1


def _check_options(args):
    """The CheckOptions of the flags, checked once (before anything is spawned)."""
    from fxglue.run.gloo import CheckOptions

    return built(CheckOptions, {field: getattr(args, field) for field in CHECK_FLAGS}, CHECK_FLAGS)
