"""``bucketplan solve-dir``: every problem recorded from torch.compile that has no plan yet,
solved and verified; resumable; writes each plan.json and a summary."""

from __future__ import annotations

import sys
from pathlib import Path

from bucketplan.cli.common import CLIError, built, progress
from bucketplan.cli.solve import OBJECTIVE_HELP, OBJECTIVES

# each flag's SolveDirOptions field: args.DEST -> (field, flag), checked once when built
FLAGS = {"objective": ("objective", "--objective"), "time_limit": ("time_limit_s", "--time-limit"),
         "jobs": ("jobs", "--jobs"), "workers": ("workers", "--workers"), "seed": ("seed", "--seed"),
         "positions": ("positions", "--positions")}


def add_parser(sub) -> None:
    s = sub.add_parser("solve-dir", help="solve every problem recorded from torch.compile "
                                         "(fxglue.run.compile.record) that has no plan yet; "
                                         "resumable; writes plan.json and a summary")
    s.add_argument("plan_dir", help="the folder torch.compile recorded its problems in (one "
                                    "subfolder per problem, with its problem.json)")
    s.add_argument("--objective", choices=OBJECTIVES, default="step",
                   help="what to minimize (default step, as solve): " + OBJECTIVE_HELP)
    s.add_argument("--time-limit", type=float, default=60.0,
                   help="seconds of search per problem (default 60)")
    s.add_argument("--jobs", type=int, default=1, help="problems solved at once (default 1)")
    s.add_argument("--workers", type=int, help="CP-SAT workers per problem (default: cores / jobs)")
    s.add_argument("--seed", type=int, default=0, help="CP-SAT's random seed (default %(default)s)")
    s.add_argument("--force", action="store_true",
                   help="solve again problems that already have a plan")
    s.add_argument("--positions", choices=["anchored", "free"], default="anchored",
                   help="anchored (the default) or free: as solve's, within the higher of torch's "
                        "greedy plan's and the unbucketed schedule's peak memory (step objective "
                        "only)")
    s.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    s.set_defaults(func=run)


def run(args) -> int:
    from bucketplan.cli.rules import check_combinations
    from planner.core.io import BadFileError
    from planner.jobs.plan_dir import SolveDirOptions, recorded_problems, solve_dir

    check_combinations(args)  # solve's table: --positions free needs --objective step
    root = Path(args.plan_dir)
    if not root.is_dir():
        raise CLIError(f"{root}: no such plan directory (record one with "
                       "fxglue.run.compile.record; README, 'Use a plan in training')")
    if not recorded_problems(root):
        raise CLIError(f"{root}: no recorded problems (no */problem.json)")
    options = built(SolveDirOptions, {field: getattr(args, dest) for dest, (field, _) in FLAGS.items()},
                    {field: flag for field, flag in FLAGS.values()})
    try:
        rows = solve_dir(root, options, force=args.force, progress=progress(args.quiet))
    except BadFileError as e:  # a bookkeeping file that is no regular file, another solve-dir
        raise CLIError(str(e)) from None
    except PermissionError as e:
        raise CLIError(f"{e.filename or root}: cannot write plans there ({e.strerror})") from None
    except KeyboardInterrupt:
        print("interrupted: the plans written so far are kept and an interrupted problem is "
              "solved again; run again to resume", file=sys.stderr)
        return 130
    return _report(root, rows)


def _report(root: Path, rows: list[dict]) -> int:
    from planner.core.io import BOOKKEEPING_MAX_BYTES, BadFileError, read_regular_text

    try:
        print(read_regular_text(root / "summary.md", BOOKKEEPING_MAX_BYTES, "summary")
              if rows else "nothing to solve", end="")
    except BadFileError as e:  # replaced since this run wrote it
        raise CLIError(str(e)) from None
    failed = [r["problem"] for r in rows
              if r.get("status") in ("ERROR", "") or r.get("plan_ms") in (None, "")]
    print(f"wrote {root}/*/plan.json, {root}/summary.csv, {root}/summary.md")
    if failed:
        print(f"no plan for {len(failed)} problem(s): {', '.join(f[:12] for f in failed)}",
              file=sys.stderr)
    interrupted = any(r.get("interrupted") for r in rows)
    return 130 if interrupted else 1 if failed else 0
