"""``bucketplan compare``: torch's pipelines against every planner on the same graphs (counts,
simulated step, exposed communication), with plots, traces and every plan; a run never replaces
an earlier one unless told to."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import bucketplan.cli.options as options
from bucketplan.cli.common import (SCENARIOS_HELP, CLIError, inputs_of, output_folder, positive, progress,
                                   scenario_list)


def add_parser(sub) -> None:
    from bucketplan.report import COMPARE_TIME_LIMIT_S

    s = sub.add_parser("compare", help="torch's pipelines vs CP-SAT on the same graphs: counts, "
                                       "simulated step time and exposed communication, plots and "
                                       "traces")
    s.add_argument("targets", nargs="*", help="workload names or problem.json files (default: the "
                                              "built-in suite)")
    s.add_argument("-o", "--output", default=None,
                   help="output folder (default: out/compare, or out/compare-2, -3, ... if that "
                        "exists)")
    s.add_argument("--force", action="store_true",
                   help="replace the -o folder if it exists (default: refuse)")
    s.add_argument("--time-limit", type=float, default=COMPARE_TIME_LIMIT_S,
                   help="seconds of search per searching planner (CP-SAT count, step, step "
                        "pre-bucketed, free positions) per workload (default %(default)s: the "
                        "default suite in about two minutes)")
    options.add_model_options(s)
    options.add_cluster_options(s)
    s.add_argument("--scenarios", metavar="A,B,...",
                   help="also re-price every plan under these cost scenarios and report its step "
                        f"and regret ({SCENARIOS_HELP}); written to scenarios.md")
    s.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    s.add_argument("-v", "--verbose", action="store_true",
                   help="the searches' own progress too: incumbents, bounds, polish moves "
                        "(default: one line per planner)")
    s.set_defaults(func=run)


def run(args) -> int:
    from bucketplan.compare import OUTPUTS, run_compare
    from fxglue.models.workloads import WorkloadError
    from planner.core.io import OutputFolderError, check_replaceable

    say = progress(args.quiet)
    targets = _targets(args)
    positive(args.time_limit, "--time-limit")  # as solve: nan, inf and 0 before minutes of tracing
    scenarios = (scenario_list(args.scenarios, "--scenarios") if args.scenarios is not None
                 else None)
    out = _compare_output(args.output, args.force)
    output_folder(out, "-o", inputs_of(args))  # written beside it, then renamed
    try:  # before the minutes of tracing, not after them (run_compare checks it again)
        check_replaceable(out, OUTPUTS)
    except OSError as e:
        raise CLIError(f"-o {out}: {e.strerror}") from None
    detail = say if args.verbose else None  # say is silent under -q
    try:
        table = run_compare(targets, out=out, time_limit_s=args.time_limit, progress=say,
                            preset=options.preset(args), detail=detail, scenarios=scenarios)
    except WorkloadError as e:
        raise CLIError(str(e)) from None
    except OutputFolderError as e:  # another compare writing it, or files put into it meanwhile
        raise CLIError(f"-o {out}: {e.strerror}") from None
    except KeyboardInterrupt as stop:  # run_compare removed its temporary folder; the old one is untouched
        kept = getattr(stop, "kept", None)
        print(f"interrupted: {out} is left as it was"
              + (f"; the plans made so far, verified and marked interrupted, are in {kept}/plans/"
                 if kept is not None else ""), file=sys.stderr)
        return 130
    _report(out, table, scenarios)
    return 0


def _targets(args) -> list:
    """The workloads and problem files to compare, each checked before anything is traced."""
    from bucketplan.compare import DEFAULT_SUITE
    from fxglue.models.workloads import WorkloadError, get_workload

    for target in args.targets:
        if not target.endswith(".json"):
            try:
                get_workload(target)
            except WorkloadError as e:
                raise CLIError(str(e)) from None
        elif not Path(target).is_file():
            raise CLIError(f"{target}: no such problem file")
    flagged = any((args.model, args.hf_config, args.hf, args.graph))
    others = list(args.targets) or ([] if flagged else list(DEFAULT_SUITE))  # what the flags shape
    mine = options.workload(argparse.Namespace(**{**vars(args), "workload": None}), required=False,
                            others=others)
    targets = list(args.targets) + ([mine] if mine is not None else [])
    return targets or list(DEFAULT_SUITE)


def _report(out: Path, table, scenarios) -> None:
    from bucketplan.report import markdown, simulated_on

    for r in table:  # also in compare.md, as the note of the workload's unbucketed row
        for line in r.get("warnings", ()):
            print(f"warning: {r['workload']}: {line}", file=sys.stderr)
    print(f"{simulated_on(table)} {out}/compare.md has every column.\n")
    print(markdown(table), end="")
    priced = [f"{r['workload']}: {x}" for r in table for x in r.get("pricing", ())]
    if priced:
        print("\nWhat priced each group:")
        print("\n".join(f"  {x}" for x in priced))
    lines = [x for r in table for x in r.get("equal_memory", ())]
    if lines:
        print("\nAt equal memory (compare.md says more):")
        print("\n".join(f"  {x}" for x in lines))
    print(f"\nwrote {out}/: compare.md (this table; also .csv, .json), step_time.png, "
          "timeline.png, collectives_and_exposed.png, traces/ (ui.perfetto.dev), plans/ (every "
          "plan, verified; plans/index.md)" + (", scenarios.md" if scenarios else ""))
    if scenarios:
        print()
        print((out / "scenarios.md").read_text(), end="")


def _compare_output(output: str | None, force: bool) -> Path:
    """compare's folder. Default: out/compare, or out/compare-2, -3, ... when that one exists, so
    a second run never replaces the first. A folder named with -o that exists is replaced only
    with --force (a refusal naming it otherwise), so a run is never silently overwritten."""
    if output is None:
        out, k = Path("out/compare"), 1
        while out.exists() or out.is_symlink():
            k += 1
            out = Path(f"out/compare-{k}")
        return out
    out = Path(output)
    if (out.exists() and (not out.is_dir() or any(out.iterdir()))) and not force:
        raise CLIError(f"-o {out}: exists (an earlier run?); pass --force to replace it, or name a "
                       "new folder")
    return out
