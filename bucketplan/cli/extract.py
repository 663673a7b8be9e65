"""``bucketplan extract``: trace and schedule a workload, write its problem and torch's greedy
plan; ``--tiny``: each gloo rank's problem at the shapes ``check`` runs."""

from __future__ import annotations

import sys
from pathlib import Path

import bucketplan.cli.options as options
import bucketplan.cli.rules as rules
from bucketplan.cli.common import CLIError, built, fmt_counts, inputs_of, output_file, overlap_line, progress


def add_parser(sub) -> None:
    s = sub.add_parser("extract", help="trace and schedule a workload; write problem.json and "
                                       "torch's greedy plan")
    s.add_argument("workload", nargs="?", help="a built-in workload (or use --model / --hf-config "
                                               "/ --hf)")
    options.add_model_options(s)
    s.add_argument("-o", "--output", required=True, help="output directory")
    s.add_argument("--save-graph", metavar="FILE.py",
                   help="also write the traced step (before torch's scheduler) as a graph file in "
                        "torch's repro format, which --graph reads back to the same problem")
    s.add_argument("--tiny", action="store_true",
                   help="each gloo rank's problem at the tiny shapes `check` runs "
                        "(OUT/rank<R>/problem.json and greedy-plan.json; --ranks: how many, "
                        "default 2), to solve and check with `check --plan OUT`")
    options.add_pipeline_options(s)
    s.set_defaults(func=run)


def run(args) -> int:
    import planner
    from fxglue.models.workloads import WorkloadError
    from fxglue.pipeline import run_pipeline

    if args.tiny:
        return _extract_tiny(args)
    say = progress(args.quiet)
    out = Path(args.output)
    _outputs(args, [out / "problem.json", out / "greedy-plan.json"])  # before the tracing, not after it
    preset = options.preset(args)
    workload = options.workload(args)
    try:
        if args.save_graph:
            workload = _save_graph(workload, preset, args.save_graph, say)
        result = run_pipeline(workload, planner_="greedy", preset=preset,
                              pipeline=options.pipeline(args), apply=False, progress=say)
    except WorkloadError as e:
        raise CLIError(str(e)) from None
    problem, plan = result.problem, result.plan
    problem = _warn_measurements(result.preset or preset, problem)
    _measured_notes(result.preset or preset, problem)
    try:
        planner.save(problem, out / "problem.json")
        planner.save(plan, out / "greedy-plan.json")
    except OSError as e:  # checked before tracing; a full disk shows only when bytes are written
        raise CLIError(f"-o {out}: cannot write {e.filename or 'there'} "
                       f"({e.strerror or e})") from None
    _report(args, result, out)
    return 0


def _report(args, result, out: Path) -> None:
    import planner
    from planner.cost.bounds import step_floor
    from planner.cost.memory import peak_bytes

    problem, plan = result.problem, result.plan
    n = len(problem.collectives)
    print(f"workload            {result.name}")
    print(f"graph nodes         {problem.n_scheduled} scheduled (FX graph nodes, not cluster "
          "nodes)")
    print(f"collectives         {fmt_counts(result.collectives_before)}"
          + (f"; {n} after pre-bucketing" if args.pre_bucketing else ""))
    print(overlap_line(problem))
    print("schedule            " + ("the graph's own order (torch's scheduler not run)" if args.schedule == "graph"
                                    else "torch's overlap scheduler's"))
    print(f"torch greedy        {n} -> {planner.collectives_after(problem, plan)} collectives "
          f"in {len(plan.buckets)} buckets")
    print(f"cluster             {problem.meta.get('preset')}: "
          + "; ".join(f"pg {link.pg} ({link.group_size} ranks) {link.hardware}"
                      for link in problem.links))
    print(f"step (simulated)    unbucketed {planner.simulate(problem).step_ms:.3f} ms; "
          f"floor {step_floor(problem).floor_ms:.3f} ms")
    peak = peak_bytes(problem)
    print(f"peak memory         unbucketed {peak / 1e9:.3f} GB ({peak} bytes, as torch's memory estimator counts it)")
    print("timings (s)         "
          + ", ".join(f"{k.removesuffix('_s')} {v:.2f}" for k, v in result.timings.items()))
    print(f"wrote               {out / 'problem.json'}, {out / 'greedy-plan.json'}")


# the cluster flags a --tiny extraction has no use for: its ranks run on gloo here (--ranks, the
# pipeline's --bucket-mode and --pre-bucketing, and the workload's own flags it takes)
TINY_IGNORES = ("--preset", "--tp", "--collectives", "--collective-ranks", "--compute-tflops", "--hbm-tbps", "--contention",
                "--profile", "--profile-cpu", "--max-bucket-memory-gb", "--hardware", "--schedule")


def _extract_tiny(args) -> int:
    """Each gloo rank's problem at tiny shapes, as `check` extracts it, for `check --plan`."""
    from fxglue.models.workloads import WorkloadError
    from fxglue.run.gloo import CheckOptions, check_workload

    if args.hf_config or args.hf or args.graph:
        raise CLIError("--tiny takes a built-in workload or --model (the shapes `check` runs)")
    for flag in TINY_IGNORES:
        if rules.given(args, flag):
            raise CLIError(f"{flag} with --tiny: each gloo rank's problem is scheduled and priced as the gloo run "
                           "schedules and prices it (torch's scheduler, its own model), not a cluster's; drop one "
                           "of them")
    options.workload(args)
    out = Path(args.output)
    run = built(CheckOptions, {"ranks": args.ranks or 2, "planner": "none", "bucket_mode": args.bucket_mode,
                               "pre_bucketing": args.pre_bucketing, "save_problems": str(out)},
                {"ranks": "--ranks"})
    _outputs(args, [out / f"rank{r}" / name for r in range(run.ranks)
                    for name in ("problem.json", "greedy-plan.json")])
    say = progress(args.quiet)
    say(f"extracting each of {run.ranks} gloo ranks' problems at tiny shapes")
    try:
        result = check_workload(args.workload, run, model=args.model, parallel=args.parallel,
                                layers=args.layers)
    except WorkloadError as e:
        raise CLIError(str(e)) from None
    failed = [r for r in result.per_rank if r.error]
    if failed:
        print(f"bucketplan extract: rank {failed[0].rank} failed: "
              f"{failed[0].error.splitlines()[-1]}", file=sys.stderr)
        return 1
    distinct = len({r.problem_fingerprint for r in result.per_rank})
    ranks = run.ranks
    for r in range(ranks):
        print(f"wrote               {out / f'rank{r}' / 'problem.json'}, "
              f"{out / f'rank{r}' / 'greedy-plan.json'}")
    print(f"{distinct} distinct problem(s) over {ranks} ranks. Solve each rank's problem into "
          f"{out}/rank<R>/plan.json (`bucketplan solve {out}/rank0/problem.json -o "
          f"{out}/rank0/plan.json`), then `bucketplan check "
          f"{args.workload or '--model ' + args.model} --ranks {ranks} --plan {out}`")
    return 0


def _outputs(args, files: list[Path]) -> None:
    """Every file extract writes (``files`` under -o, and --save-graph) can be written and is
    none of its inputs (--graph, --model, measured files): checked before anything is traced. The
    -o folder may hold other files, the workload's among them; only these are replaced."""
    from planner.core.io import clobbered_input

    inputs = inputs_of(args)
    for f in files:
        output_file(str(f), "-o", inputs)
    if args.save_graph:
        output_file(args.save_graph, "--save-graph", inputs)
        if clobbered_input([args.save_graph], [(f.name, f) for f in files]) is not None:
            # two outputs of one run: the graph saved, then the problem written over it
            raise CLIError(f"--save-graph {args.save_graph}: is where -o writes {Path(args.save_graph).name}; "
                           "give another --save-graph")


def _save_graph(workload, preset, path: str, say):
    """The workload traced and written to ``path`` as a graph file; the traced step, to plan."""
    from fxglue.graph_file import save_graph
    from fxglue.pipeline import trace_for

    traced = trace_for(workload, preset, say)
    save_graph(traced, path)
    say(f"wrote {path}")
    return traced


def _warn_measurements(preset, problem):
    """The measurement files that price nothing of the problem and the groups none prices, on
    stderr and in the problem's ``meta["warnings"]`` (provenance: its fingerprint is unchanged);
    refused when the files given price nothing at all (``fxglue.presets.measurement_warnings``)."""
    from fxglue.presets import measurement_warnings

    try:
        warnings = measurement_warnings(preset, problem, alone=True)
    except ValueError as e:  # MeasuredError: the files and the groups they miss
        raise CLIError(str(e)) from None
    for line in warnings:
        print(f"warning: {line}", file=sys.stderr)
    if not warnings:
        return problem
    return problem.model_copy(update={"meta": {**problem.meta, "warnings": warnings}})


def _measured_notes(preset, problem) -> None:
    """On stderr, where measurements (--collectives, --profile, a graph file's collectives table)
    are given: what priced each group and kind, and its sizes outside what was measured
    (``fxglue.presets.pricing_lines``)."""
    from fxglue.presets import pricing_lines

    if getattr(preset, "measured", None) is None:
        return
    for line in pricing_lines(preset, problem):
        print(f"note: {line}", file=sys.stderr)
