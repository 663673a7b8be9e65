"""``bucketplan sweep``: many workloads x presets x objectives from a TOML spec, each problem
extracted once and each (problem, objective) solved as a task (on Ray when installed), verified
and tabulated; resumable."""

from __future__ import annotations

import sys
from pathlib import Path

from bucketplan.cli.common import CLIError, inputs_of, not_inputs, positive, progress


def add_parser(sub) -> None:
    s = sub.add_parser("sweep", help="many workloads x presets x objectives from a TOML spec: "
                                     "extract each problem once, solve each (problem, objective) "
                                     "as a task (on Ray when installed), verify, tabulate; "
                                     "resumable")
    s.add_argument("spec", help="the sweep spec (TOML; planner/jobs/sweep.py documents it, "
                                "experiments/specs/ has examples)")
    s.add_argument("-o", "--output", default="out/sweep",
                   help="output folder (default out/sweep); a rerun resumes")
    s.add_argument("--sequential", action="store_true", help="run the tasks one by one in this "
                   "process, even with Ray installed")
    s.add_argument("--ray", action="store_true",
                   help="require Ray (an error when it is not installed)")
    s.add_argument("--address", help="a Ray cluster to run the tasks on (default: a Ray instance "
                                     "on this machine)")
    s.add_argument("--cpus", type=int,
                   help="CPUs of the local Ray instance (default: all of this machine's)")
    s.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    s.set_defaults(func=run)


def run(args) -> int:
    from planner.core.io import BadFileError, OutputFolderError, SchemaError
    from planner.jobs.sweep import SpecError, ray_available, run_sweep

    if args.sequential and args.address:
        raise CLIError("--sequential and --address exclude each other (--address runs on a Ray "
                       "cluster)")
    if args.cpus is not None:
        positive(args.cpus, "--cpus")
    if (args.address or args.ray) and not ray_available():
        raise CLIError("Ray is not installed: `pip install -e '.[sweep]'`, or drop --ray/--address "
                       "to run the tasks one by one here")
    spec, needs_torch = _spec(args.spec)
    out = Path(args.output)
    if out.exists() and not out.is_dir():
        raise CLIError(f"-o {out}: exists and is not a folder")
    # the folder is the sweep's (a problems glob there would read its own cases back): no input in it
    not_inputs([out], "-o", str(out), inputs_of(args) + _case_inputs(spec))
    extract = apply = None
    if needs_torch:
        from fxglue.run.sweep import apply_case, extract_case

        extract, apply = extract_case, apply_case
    try:
        report = run_sweep(spec, out, extract=extract, apply=apply,
                           ray=False if args.sequential else None, address=args.address,
                           cpus=args.cpus, say=progress(args.quiet))
    except OutputFolderError as e:  # another sweep writing it
        raise CLIError(f"-o {out}: {e.strerror}") from None
    # BadFileError: a bookkeeping file that is no regular file
    except (SpecError, SchemaError, BadFileError) as e:
        raise CLIError(str(e)) from None
    except PermissionError as e:
        raise CLIError(f"{e.filename or out}: cannot write there ({e.strerror})") from None
    except KeyboardInterrupt:
        print(f"interrupted: the tasks finished so far are in {out}/rows.jsonl (an interrupted one "
              "is solved again); run again to resume", file=sys.stderr)
        return 130
    return _report(out, report)


def _spec(path: str):
    """The spec, and whether its cases need torch; every workload and preset resolves before
    anything is traced."""
    from fxglue.presets import DEFAULT_PRESET
    from planner.jobs.sweep import SpecError, load_spec

    try:
        spec = load_spec(path, default_preset=DEFAULT_PRESET)
        needs_torch = any(c.source != "problem" for c in spec.cases)
        if needs_torch:
            from fxglue.run.sweep import check_cases

            check_cases(spec.cases)
    except SpecError as e:
        raise CLIError(str(e)) from None
    return spec, needs_torch


def _case_inputs(spec) -> list[tuple[str, str]]:
    """The files the spec's cases read: problem files, measured collectives, factories, configs and
    graph files."""
    found = []
    for case in spec.cases:
        if case.source in ("problem", "graph", "hf_config", "model"):
            path = case.name.rpartition(":")[0] if case.source == "model" else case.name
            if Path(path).is_file():
                found.append((f"case {case.key}'s {case.source.replace('_', ' ')} file", path))
        found += [(f"case {case.key}'s collectives", c) for c in case.collectives]
    return found


def _report(out: Path, report) -> int:
    from planner.core.io import BOOKKEEPING_MAX_BYTES, BadFileError, read_regular_text

    try:
        print(read_regular_text(out / "results.md", BOOKKEEPING_MAX_BYTES, "results table"), end="")
    except BadFileError as e:  # replaced since this run wrote it
        raise CLIError(str(e)) from None
    print(f"wrote {out}/results.csv, results.md, results.png, stages.csv, stages.md, cases/*/")
    if report.failed:
        print(f"no verified plan for {len(report.failed)} task(s): {', '.join(report.failed)}",
              file=sys.stderr)
        return 1
    return 0
