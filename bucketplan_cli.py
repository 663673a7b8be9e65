"""The ``bucketplan`` command line.

Torch-free commands (``verify``, ``solve``) import only ``planner``; the others import
``fxglue`` (and torch) when they run.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path


class CLIError(Exception):
    """A user-facing error: printed without a traceback, exit status 2."""


def _progress(quiet: bool):
    start = time.perf_counter()

    def say(msg: str) -> None:
        if not quiet:
            print(f"[{time.perf_counter() - start:7.1f}s] {msg}", file=sys.stderr, flush=True)

    return say


def _fmt_counts(counts: dict[str, int]) -> str:
    total = sum(counts.values())
    parts = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
    return f"{total} ({parts})" if parts else "0"


def cmd_workloads(args) -> int:
    from fxglue.workloads import workloads

    for name, wl in workloads().items():
        print(f"{name}\t{wl.description}")
    return 0


def _hardware(args):
    if not getattr(args, "hardware", None):
        return None
    from fxglue.presets import Hardware

    try:
        return Hardware.from_json(args.hardware)
    except (OSError, ValueError, TypeError) as e:
        raise CLIError(f"{args.hardware}: cannot read hardware figures: {e}") from None


def _preset(args):
    from fxglue.presets import get_preset

    try:
        return get_preset(args.preset, ranks=args.ranks, tp=args.tp)
    except ValueError as e:
        raise CLIError(str(e)) from None


def _workload(args, *, required: bool = True):
    """The workload the flags name: a built-in name, --model, --hf-config or --hf (one of them)."""
    from fxglue.custom import factory_workload, hf_config_workload
    from fxglue.workloads import WorkloadError

    given = [x for x in (args.workload, args.model, args.hf_config, args.hf) if x]
    if len(given) > 1:
        raise CLIError("give one workload: a built-in name, --model, --hf-config or --hf")
    if not given:
        if required:
            raise CLIError("no workload: give a built-in name (`bucketplan workloads`), --model, --hf-config or --hf")
        return None
    try:
        if args.model:
            return factory_workload(args.model, args.parallel, args.layers)
        if args.hf_config or args.hf:
            return hf_config_workload(args.hf_config, model_id=args.hf, parallel=args.parallel, layers=args.layers)
    except WorkloadError as e:
        raise CLIError(str(e)) from None
    if args.layers is not None:
        raise CLIError("--layers applies to --model, --hf-config and --hf (built-in names carry their depth)")
    return args.workload


def cmd_extract(args) -> int:
    import planner
    from fxglue.pipeline import run_pipeline
    from fxglue.workloads import WorkloadError

    say = _progress(args.quiet)
    out = Path(args.output)
    try:
        result = run_pipeline(_workload(args), planner_="greedy", preset=_preset(args), pre_bucketing=args.pre_bucketing,
                              bucket_mode=args.bucket_mode, hardware=_hardware(args), apply=False,
                              max_bucket_memory_gb=args.max_bucket_memory_gb, progress=say)
    except WorkloadError as e:
        raise CLIError(str(e)) from None
    problem, plan = result.problem, result.plan
    planner.save(problem, out / "problem.json")
    planner.save(plan, out / "greedy-plan.json")
    t = result.timings
    n = len(problem.collectives)
    print(f"workload            {result.name}")
    print(f"nodes scheduled     {problem.n_scheduled}")
    print(f"collectives         {_fmt_counts(result.collectives_before)}"
          + (f"; {n} after pre-bucketing" if args.pre_bucketing else ""))
    status = {s: sum(c.status == s for c in problem.collectives) for s in ("hidden", "partly", "exposed")}
    print(f"hidden/partly/exp.  {status['hidden']} / {status['partly']} / {status['exposed']}")
    print(f"torch greedy        {n} -> {planner.collectives_after(problem, plan)} collectives "
          f"in {len(plan.buckets)} buckets")
    from planner.bounds import step_floor

    print(f"cluster             {problem.meta.get('preset')}: "
          + "; ".join(f"pg {link.pg} ({link.group_size} ranks) {link.hardware}" for link in problem.links))
    print(f"step (simulated)    unbucketed {planner.simulate(problem).step_ms:.3f} ms; "
          f"floor {step_floor(problem).floor_ms:.3f} ms")
    print("timings (s)         " + ", ".join(f"{k.removesuffix('_s')} {v:.2f}" for k, v in t.items()))
    print(f"wrote               {out / 'problem.json'}, {out / 'greedy-plan.json'}")
    return 0


def cmd_verify(args) -> int:
    import planner
    from planner.verifier import check

    problem = planner.load_problem(args.problem)
    plan = planner.load_plan(args.plan)
    report = check(problem, plan)
    q = report.quality
    for v in report.violations[: args.max_violations]:
        print(v)
    if len(report.violations) > args.max_violations:
        print(f"... and {len(report.violations) - args.max_violations} more violations")
    print(f"plan                {args.plan} ({plan.planner})")
    print(f"feasible            {'yes' if report.feasible else 'NO'} "
          f"({len(report.violations)} violations{': by rule ' + str(report.by_rule()) if report.violations else ''})")
    print(f"collectives         {q.collectives_before} -> {q.collectives_after} ({q.buckets} merged buckets)")
    print(f"hidden relations    {q.hidden_kept}/{q.hidden_relations} kept (fully hidden collectives)")
    print(f"partly hidden       {q.partly_kept}/{q.partly_relations} kept (not protected, as in torch)")
    return 0 if report.feasible else 1


def cmd_solve(args) -> int:
    import planner
    from planner.solver import solve

    problem = planner.load_problem(args.problem)
    hint = planner.load_plan(args.hint) if args.hint else None
    say = _progress(args.quiet)
    say(f"solving {args.problem}: {len(problem.collectives)} collectives, objective {args.objective}, "
        f"time limit {args.time_limit}s")
    window = args.window if args.window == "auto" else None if args.window == "none" else int(args.window)
    result = solve(problem, time_limit_s=args.time_limit, objective=args.objective, workers=args.workers,
                   seed=args.seed, hint=hint, window=window, protect_partly=args.protect_partly,
                   memory_budget_bytes=None if args.memory_budget_gb is None else int(args.memory_budget_gb * 1024**3),
                   deterministic=args.deterministic, progress=say)
    if result.plan is None:
        print(f"no plan: {result.summary()}")
        return 130 if result.stats.get("interrupted") else 1
    planner.save(result.plan, args.output)
    print(f"status              {result.status}" + (" (interrupted: the best verified plan so far)"
                                                   if result.stats.get("interrupted") else ""))
    print(f"collectives         {len(problem.collectives)} -> {planner.collectives_after(problem, result.plan)}")
    if args.objective == "step":
        print(f"step / bound        {result.objective:.3f} ms (simulated) / {result.bound:.3f} ms "
              f"({result.stats['bound_scope']}); unbucketed {planner.simulate(problem).step_ms:.3f} ms")
    else:
        print(f"objective / bound   {result.objective} / {result.bound} ({result.stats['bound_scope']})")
    print(f"gap                 {'n/a' if result.gap is None else f'{result.gap:.1%}'}")
    print(f"wall                {result.wall_s:.1f}s" + (" (stopped by the wall-clock limit, not the deterministic "
                                                           "one: another run may differ)"
                                                           if result.stats.get("wall_limit_hit") else ""))
    print(f"wrote               {args.output}")
    return 130 if result.stats.get("interrupted") else 0


def cmd_apply(args) -> int:
    import planner
    from fxglue.apply import PlanError
    from fxglue.pipeline import run_pipeline
    from fxglue.workloads import WorkloadError

    say = _progress(args.quiet)
    plan = planner.load_plan(args.plan)
    try:
        result = run_pipeline(_workload(args), planner_=plan, preset=_preset(args), pre_bucketing=args.pre_bucketing,
                              bucket_mode=args.bucket_mode, hardware=_hardware(args),
                              max_bucket_memory_gb=args.max_bucket_memory_gb, progress=say)
    except (PlanError, WorkloadError) as e:
        raise CLIError(f"{args.plan}: {e}") from None
    print(f"workload            {result.name}")
    print(f"collectives before  {_fmt_counts(result.collectives_before)}")
    print(f"collectives after   {_fmt_counts(result.collectives_after)}")
    return 0


def cmd_check(args) -> int:
    from fxglue.gloo import check_workload
    from fxglue.workloads import WorkloadError

    say = _progress(args.quiet)
    say(f"running {args.workload} (tiny shapes) on {args.ranks} gloo ranks: original vs bucketed")
    try:
        result = check_workload(args.workload, ranks=args.ranks, planner=args.planner, plan=args.plan,
                                bucket_mode=args.bucket_mode, pre_bucketing=args.pre_bucketing, seed=args.seed)
    except WorkloadError as e:
        raise CLIError(str(e)) from None
    print(result.summary())
    return 0 if result.ok else 1


def cmd_compare(args) -> int:
    from fxglue.compare import DEFAULT_SUITE, run_compare, markdown
    from fxglue.workloads import WorkloadError

    say = _progress(args.quiet)
    from fxglue.workloads import get_workload

    for target in args.targets:  # every name is checked before anything is traced
        if not target.endswith(".json"):
            try:
                get_workload(target)
            except WorkloadError as e:
                raise CLIError(str(e)) from None
        elif not Path(target).is_file():
            raise CLIError(f"{target}: no such problem file")
    mine = _workload(argparse.Namespace(**{**vars(args), "workload": None}), required=False)
    targets = list(args.targets) + ([mine] if mine is not None else [])
    targets = targets or list(DEFAULT_SUITE)
    out = Path(args.output)
    try:
        table = run_compare(targets, out=out, time_limit_s=args.time_limit, progress=say, preset=_preset(args))
    except WorkloadError as e:
        raise CLIError(str(e)) from None
    print(markdown(table), end="")
    print(f"\nwrote {out}/compare.csv, compare.md, compare.json, collectives_and_exposed.png, timeline.png, traces/")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bucketplan", description=__doc__.splitlines()[0] + " "
                                "Plans bucketing of collectives in PyTorch training graphs.")
    from importlib.metadata import PackageNotFoundError, version

    try:
        mine = version("bucketplan")
    except PackageNotFoundError:  # run from a checkout that is not installed
        mine = "unknown (not installed)"
    p.add_argument("--version", action="version", version=f"bucketplan {mine}")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("workloads", help="list built-in workloads, one a line, name first")
    s.set_defaults(func=cmd_workloads)

    s = sub.add_parser("extract", help="trace and schedule a workload; write problem.json and torch's greedy plan")
    s.add_argument("workload", nargs="?", help="a built-in workload (or use --model / --hf-config / --hf)")
    _add_model_options(s)
    s.add_argument("-o", "--output", required=True, help="output directory")
    _add_pipeline_options(s)
    s.set_defaults(func=cmd_extract)

    s = sub.add_parser("verify", help="check a plan against the rules of planner/README.md (exit 1 if infeasible)")
    s.add_argument("problem")
    s.add_argument("plan")
    s.add_argument("--max-violations", type=int, default=20, help="violations to print (default 20)")
    s.set_defaults(func=cmd_verify)

    s = sub.add_parser("solve", help="optimal bucketing with CP-SAT (status, objective, bound, gap)")
    s.add_argument("problem")
    s.add_argument("-o", "--output", required=True, help="plan file to write")
    s.add_argument("--time-limit", type=float, default=60.0, help="seconds of search (default 60)")
    s.add_argument("--objective", choices=["count", "exposure", "step"], default="count")
    s.add_argument("--workers", type=int, default=2, help="CP-SAT workers (default 2)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--deterministic", action="store_true",
                   help="--time-limit counts CP-SAT's deterministic time, not wall seconds: the same seed and workers "
                        "give the same plan on any machine, even when not proved optimal (runs take longer)")
    s.add_argument("--hint", help="a plan to start from (e.g. greedy-plan.json)")
    s.add_argument("--window", default="auto",
                   help="'auto' (full model up to 320 collectives, else 16), 'none' (full model), or N: limit "
                        "anchors to N same-key neighbours; the reported bound always holds for the whole problem")
    s.add_argument("--protect-partly", action="store_true",
                   help="keep the overlap of partly hidden collectives too (stricter than torch's rules)")
    s.add_argument("--memory-budget-gb", type=float, default=None,
                   help="extra memory kept alive by moved starts/waits stays within this at every position")
    s.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    s.set_defaults(func=cmd_solve)

    s = sub.add_parser("compare", help="torch's pipelines vs CP-SAT on the same graphs: counts, simulated "
                                       "step time and exposed communication, plots and traces")
    s.add_argument("targets", nargs="*", help="workload names or problem.json files (default: the built-in suite)")
    s.add_argument("-o", "--output", default="out/compare", help="output directory (default out/compare)")
    s.add_argument("--time-limit", type=float, default=30.0, help="CP-SAT seconds per objective (default 30)")
    _add_model_options(s)
    _add_cluster_options(s)
    s.add_argument("-q", "--quiet", action="store_true")
    s.set_defaults(func=cmd_compare)

    s = sub.add_parser("check", help="run original and bucketed graphs for real on gloo; compare bitwise")
    s.add_argument("workload")
    g = s.add_mutually_exclusive_group()
    g.add_argument("--plan", help="a plan file for the tiny-shape problem of this workload")
    g.add_argument("--planner", choices=["greedy", "greedy-autofix", "greedy-repaired", "cpsat", "none"],
                   default="greedy", help="greedy: torch's own greedy, applied by torch; greedy-autofix: the same "
                   "with torch's overlap_scheduling_autofix_cycles on; greedy-repaired: torch's greedy plan "
                   "repaired and applied by bucketplan; cpsat; none: torch's schedule, nothing merged")
    s.add_argument("--ranks", type=int, default=2)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--pre-bucketing", action="store_true")
    s.add_argument("--bucket-mode", choices=["default", "custom_ops", "custom_ops_multidtype", "coalesced"])
    s.add_argument("-q", "--quiet", action="store_true")
    s.set_defaults(func=cmd_check)

    s = sub.add_parser("apply", help="schedule a workload and apply a plan file to it")
    s.add_argument("workload", nargs="?", help="a built-in workload (or use --model / --hf-config / --hf)")
    s.add_argument("plan")
    _add_model_options(s)
    _add_pipeline_options(s)
    s.set_defaults(func=cmd_apply)
    return p


def _add_model_options(s) -> None:
    s.add_argument("--model", help="your model: MODULE:FACTORY or FILE.py:FACTORY, where factory(groups) returns "
                                   "(module, example_inputs, loss_fn) (README, 'Plan your own model')")
    s.add_argument("--hf-config", help="a Hugging Face causal-LM config.json, built from the config alone")
    s.add_argument("--hf", help="a Hugging Face model id whose config is in the local cache (nothing is downloaded)")
    s.add_argument("--parallel", choices=["fsdp", "ddp", "2d"], default="fsdp",
                   help="how --model / --hf-config / --hf is parallelized (default fsdp)")
    s.add_argument("--layers", type=int, help="decoder layers of --hf-config / --hf, or factory(groups, layers=N)")


def _add_cluster_options(s) -> None:
    from fxglue.presets import DEFAULT_PRESET, PRESETS

    s.add_argument("--preset", choices=list(PRESETS), default=DEFAULT_PRESET,
                   help="cluster: world size, 2-D TP degree, GPU and how collectives are priced "
                        f"(default {DEFAULT_PRESET}); " + "; ".join(f"{p.name}: {p.description}" for p in PRESETS.values()))
    s.add_argument("--ranks", type=int, help="world size instead of the preset's (a multiple of its ranks per node)")
    s.add_argument("--tp", type=int, help="tensor-parallel degree of 2-D workloads instead of the preset's")


def _add_pipeline_options(s) -> None:
    _add_cluster_options(s)
    s.add_argument("--pre-bucketing", action="store_true",
                   help="run torch's FSDP pre-bucketing before scheduling (torch's default; off here so the "
                        "bucket search sees every collective)")
    s.add_argument("--bucket-mode", choices=["default", "custom_ops", "custom_ops_multidtype", "coalesced"],
                   default=None, help="torch's bucket mode (default: torch's config, i.e. 'default')")
    s.add_argument("--max-bucket-memory-gb", type=float, default=2.0, help="bucket cap, as torch (2.0)")
    s.add_argument("--hardware", help="JSON file overriding the estimator's hardware figures")
    s.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import logging

    # torch's inductor passes log at INFO on their own loggers (pre-bucketing summaries): the
    # command line reports what matters itself
    logging.getLogger("torch._inductor").setLevel(logging.WARNING)
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except CLIError as e:
        print(f"bucketplan {args.command}: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - planner errors carry the offending item in their message
        from planner.io import SchemaError

        if isinstance(e, SchemaError):
            print(f"bucketplan {args.command}: error: {e}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
