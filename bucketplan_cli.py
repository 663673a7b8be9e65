"""The ``bucketplan`` command line.

Torch-free commands (``verify``, ``solve``) import only ``planner``; the others import
``fxglue`` (and torch) when they run. This module imports only the standard library at its top,
so that a Ctrl-C while the packages load is caught by ``main`` (exit 130, one line).
"""

from __future__ import annotations

import argparse
import contextlib
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
    from fxglue.models.workloads import workloads

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
    """The cluster the flags name: --preset at --ranks / --tp, priced by --collectives files and
    a --profile trace."""
    from fxglue.presets import get_preset, with_measurements

    try:
        preset = get_preset(args.preset, ranks=args.ranks, tp=args.tp)
        ranks, per_node = _collective_ranks(getattr(args, "collective_ranks", None))
        preset = _compute_rates(preset, args)
        preset = with_measurements(preset, getattr(args, "collectives", None), ranks=ranks, ranks_per_node=per_node)
        if getattr(args, "profile_cpu", False) and not getattr(args, "profile", None):
            raise CLIError("--profile-cpu: give the CPU run's trace with --profile TRACE.json")
        if getattr(args, "profile", None):
            from fxglue.profile import with_profile  # torch's trace parser

            preset = with_profile(preset, args.profile, cpu=getattr(args, "profile_cpu", False))
        return preset
    except ValueError as e:  # planner.measured.MeasuredError and BadFileError are ValueErrors
        raise CLIError(str(e)) from None


def _compute_rates(preset, args):
    """--compute-tflops / --hbm-tbps: the roofline's rates instead of the preset's."""
    from dataclasses import replace

    rates = {}
    for flag, field in (("compute_tflops", "bf16_tflops"), ("hbm_tbps", "hbm_tbps")):
        value = getattr(args, flag, None)
        if value is not None:
            _positive(value, "--" + flag.replace("_", "-"))
            rates[field] = value
    if not rates:
        return preset
    if getattr(args, "hardware", None):
        raise CLIError("--compute-tflops / --hbm-tbps with --hardware: give the rates in the hardware file")
    what = ", ".join(f"{k} {v:g}" for k, v in rates.items())
    hardware = replace(preset.hardware, name=f"{preset.hardware.name}; {what}", **rates)
    tag = "-".join(f"{k.split('_')[0]}{v:g}" for k, v in rates.items())
    return replace(preset, hardware=hardware, name=f"{preset.name}+{tag}", description=f"{preset.description}; {what}")


def _collective_ranks(text: str | None) -> tuple[int | None, int | None]:
    """--collective-ranks N/PER_NODE."""
    if text is None:
        return None, None
    n, _, per = text.partition("/")
    if not n.isdigit() or int(n) < 1 or not per.isdigit() or int(per) < 1:
        raise CLIError(f"--collective-ranks {text!r}: give N/PER_NODE, positive integers (e.g. 64/8)")
    return int(n), int(per)


def _measured_notes(preset, problem) -> None:
    """On stderr: which groups the measurements (--collectives, --profile, a graph file's collectives
    table) priced and by what, and sizes outside what they measured."""
    measured = getattr(preset, "measured", None)
    if measured is None:
        return
    if not measured.used:
        print("note: no measurement (--collectives, --profile or the graph's collectives table) matches a group "
              "of this graph (names, sizes and ranks per node differ); torch's model priced every collective",
              file=sys.stderr)
    for pg, used in measured.used.items():
        print(f"note: group {pg} priced by " + "; ".join(s.describe() for s in used.values()), file=sys.stderr)
    for line in measured.range_notes(problem.collectives):
        print(f"note: {line}", file=sys.stderr)


def _workload(args, *, required: bool = True):
    """The workload the flags name: a built-in name, --model, --hf-config or --hf (one of them)."""
    from fxglue.models.custom import factory_workload, hf_config_workload
    from fxglue.models.workloads import WorkloadError

    given = [x for x in (args.workload, args.model, args.hf_config, args.hf, args.graph) if x]
    if len(given) > 1:
        raise CLIError("give one workload: a built-in name, --model, --hf-config, --hf or --graph")
    if args.group and not args.graph:
        raise CLIError("--group names the process groups of a --graph file; give --graph FILE")
    if not given:
        if required:
            raise CLIError("no workload: give a built-in name (`bucketplan workloads`), --model, --hf-config, --hf "
                           "or --graph")
        return None
    try:
        if args.graph:
            return _graph_file(args)
        if args.model:
            return factory_workload(args.model, args.parallel, args.layers)
        if args.hf_config or args.hf:
            return hf_config_workload(args.hf_config, model_id=args.hf, parallel=args.parallel, layers=args.layers)
    except WorkloadError as e:
        raise CLIError(str(e)) from None
    if args.layers is not None:
        raise CLIError("--layers applies to --model, --hf-config and --hf (built-in names carry their depth)")
    return args.workload


def _graph_file(args):
    """--graph FILE with its --group flags (checked here; the file is loaded when it is traced)."""
    from fxglue.graph_file import GraphFile, parse_group

    if not Path(args.graph).is_file():
        raise CLIError(f"--graph {args.graph}: no such file")
    if args.layers is not None:
        raise CLIError("--layers applies to --model, --hf-config and --hf (a --graph file carries its depth)")
    groups = tuple(parse_group(g) for g in args.group) if args.group else None
    names = [g.name for g in groups or ()]
    if len(set(names)) != len(names):
        raise CLIError(f"--group {next(n for n in names if names.count(n) > 1)!r} is given twice")
    return GraphFile(args.graph, groups)


def _extract_tiny(args) -> int:
    """Each gloo rank's problem at tiny shapes, as `check` extracts it, for `check --plan`."""
    from fxglue.run.gloo import check_workload
    from fxglue.models.workloads import WorkloadError

    if args.hf_config or args.hf or args.graph:
        raise CLIError("--tiny takes a built-in workload or --model (the shapes `check` runs)")
    _workload(args)
    ranks = args.ranks or 2
    _positive(ranks, "--ranks")
    out = Path(args.output)
    _output_file(str(out / "rank0" / "problem.json"), "-o")
    say = _progress(args.quiet)
    say(f"extracting each of {ranks} gloo ranks' problems at tiny shapes")
    try:
        result = check_workload(args.workload, ranks=ranks, planner="none", model=args.model,
                                parallel=args.parallel, layers=args.layers, bucket_mode=args.bucket_mode,
                                pre_bucketing=args.pre_bucketing, save_problems=str(out))
    except WorkloadError as e:
        raise CLIError(str(e)) from None
    failed = [r for r in result.per_rank if r.error]
    if failed:
        print(f"bucketplan extract: rank {failed[0].rank} failed: {failed[0].error.splitlines()[-1]}", file=sys.stderr)
        return 1
    distinct = len({r.problem_fingerprint for r in result.per_rank})
    for r in range(ranks):
        print(f"wrote               {out / f'rank{r}' / 'problem.json'}, {out / f'rank{r}' / 'greedy-plan.json'}")
    print(f"{distinct} distinct problem(s) over {ranks} ranks. Solve each rank's problem into "
          f"{out}/rank<R>/plan.json (`bucketplan solve {out}/rank0/problem.json -o {out}/rank0/plan.json`), "
          f"then `bucketplan check {args.workload or '--model ' + args.model} --ranks {ranks} --plan {out}`")
    return 0


def _save_graph(workload, preset, path: str, say):
    """The workload traced and written to ``path`` as a graph file; the traced step, to plan."""
    from fxglue.graph_file import save_graph
    from fxglue.pipeline import trace_for

    _output_file(path, "--save-graph")
    traced = trace_for(workload, preset, say)
    save_graph(traced, path)
    say(f"wrote {path}")
    return traced


def cmd_extract(args) -> int:
    import planner
    from fxglue.pipeline import run_pipeline
    from fxglue.models.workloads import WorkloadError

    if args.tiny:
        return _extract_tiny(args)
    say = _progress(args.quiet)
    out = Path(args.output)
    _output_file(str(out / "problem.json"), "-o")  # before the tracing, not after it
    preset = _preset(args)
    workload = _workload(args)
    try:
        if args.save_graph:
            workload = _save_graph(workload, preset, args.save_graph, say)
        result = run_pipeline(workload, planner_="greedy", preset=preset, pre_bucketing=args.pre_bucketing,
                              bucket_mode=args.bucket_mode, hardware=_hardware(args), apply=False,
                              max_bucket_memory_gb=args.max_bucket_memory_gb, progress=say)
    except WorkloadError as e:
        raise CLIError(str(e)) from None
    problem, plan = result.problem, result.plan
    _measured_notes(result.preset or preset, problem)
    try:
        planner.save(problem, out / "problem.json")
        planner.save(plan, out / "greedy-plan.json")
    except OSError as e:  # checked before tracing; a full disk shows only when the bytes are written
        raise CLIError(f"-o {out}: cannot write {e.filename or 'there'} ({e.strerror or e})") from None
    t = result.timings
    n = len(problem.collectives)
    print(f"workload            {result.name}")
    print(f"graph nodes         {problem.n_scheduled} scheduled (FX graph nodes, not cluster nodes)")
    print(f"collectives         {_fmt_counts(result.collectives_before)}"
          + (f"; {n} after pre-bucketing" if args.pre_bucketing else ""))
    print(_overlap_line(problem))
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
    try:
        return _verify_and_report(args)
    except KeyboardInterrupt:  # loading or checking a large problem takes seconds: exit as a tool interrupted
        print("bucketplan verify: interrupted before the check was complete", file=sys.stderr)
        return 130


def _verify_and_report(args) -> int:
    """``bucketplan verify``: check the plan under its recorded policy (or the flags'), report."""
    import planner
    from planner.verifier import check, recorded_policy

    # the policy flags are checked before anything is loaded, as solve's
    given: dict = {}
    if args.protect_partly is not None:
        given["protect_partly"] = args.protect_partly
    if args.memory_budget_gb is not None:
        given["memory_budget_bytes"] = _memory_budget(args.memory_budget_gb)
    elif args.no_memory_budget:
        given["memory_budget_bytes"] = None
    problem = planner.load_problem(args.problem)
    plan = planner.load_plan(args.plan)
    # a plan is checked under the policy it was made for (solve records it in params): a plan
    # solved with --protect-partly or a budget judged by the default rules would pass where it
    # should not, or the reverse; a flag overrides what the plan says
    try:
        recorded = recorded_policy(plan, ignore=given)
    except ValueError as e:
        raise CLIError(f"{args.plan}: {e}") from None
    policy = {"protect_partly": False, "memory_budget_bytes": None}
    source = dict.fromkeys(policy, "default")
    for key in policy:
        if key in given:
            policy[key], source[key] = given[key], "from flags"
        elif key in recorded:
            policy[key], source[key] = recorded[key], "recorded in the plan"
    # verify has no overlap flag: a positioned step plan records keep_overlap false (rules 4, 7 and 8
    # judge torch's order, which such a plan leaves) unless it was searched with --keep-overlap
    overlap = recorded.get("keep_overlap", True)
    peak = recorded.get("peak_memory_bytes")  # rule 11, as the positioned search recorded it
    report = check(problem, plan, **policy, keep_overlap=overlap, peak_memory_bytes=peak)
    q = report.quality
    for v in report.violations[: args.max_violations]:
        print(v)
    if len(report.violations) > args.max_violations:
        print(f"... and {len(report.violations) - args.max_violations} more violations")
    print(f"plan                {args.plan} ({plan.planner})")
    budget = policy["memory_budget_bytes"]
    parts = {"protect_partly": f"protect_partly={policy['protect_partly']}",
             "memory_budget_bytes": "memory budget " + ("none" if budget is None else
                                                        f"{budget / 1024**3:g} GB ({budget} bytes)")}
    if len(set(source.values())) == 1:
        print(f"policy              {', '.join(parts.values())} ({source['protect_partly']})")
    else:
        print(f"policy              {', '.join(f'{text} ({source[key]})' for key, text in parts.items())}")
    print(f"feasible            {'yes' if report.feasible else 'NO'} "
          f"({len(report.violations)} violations{': by rule ' + str(report.by_rule()) if report.violations else ''})")
    print(f"collectives         {q.collectives_before} -> {q.collectives_after} ({q.buckets} merged buckets)")
    print(_overlap_line(problem))
    print(f"overlap kept        {q.hidden_kept}/{q.hidden_relations} (collective, hiding compute) pairs of fully "
          f"hidden collectives; {q.partly_kept}/{q.partly_relations} of partly hidden ones "
          + ("(protected: protect_partly)" if policy["protect_partly"] else "(not protected, as in torch)"))
    if not overlap:
        print("overlap rules       4, 7 and 8 off (keep_overlap false, recorded in the plan)")
    if peak is not None:
        print(f"peak budget         {peak / 1e9:.3f} GB (rule 11, recorded in the plan)")
    if not any(v.rule in (1, 5) for v in report.violations):  # memory is defined for a well-formed plan
        print(_memory_line(problem, plan))
    return 0 if report.feasible else 1


def _overlap_line(problem) -> str:
    """How torch's schedule hides each collective, counted per collective: the same line in
    `extract` and `verify` (issue 30: they printed different counts under similar names)."""
    status = {s: sum(c.status == s for c in problem.collectives) for s in ("hidden", "partly", "exposed")}
    return (f"torch's overlap     of {len(problem.collectives)} collectives on torch's schedule: {status['hidden']} "
            f"hidden behind compute, {status['partly']} partly hidden, {status['exposed']} exposed")


def _memory_line(problem, plan) -> str:
    """The plan's peak memory against the unbucketed schedule's, as torch's estimator counts it."""
    from planner.memory import memory_timeline

    t = memory_timeline(problem, plan)
    gb = 1e9
    what = ("torch's estimator's accounting" if t.profiled
            else "no memory profile in this problem: the collectives' buffers only")
    return (f"peak memory         {t.peak_bytes / gb:.3f} GB planned, {t.unbucketed_peak_bytes / gb:.3f} GB "
            f"unbucketed ({t.extra_peak_bytes / gb:+.3f} GB; {what})")


def _library_rule(rule, value, flag: str, **kw) -> None:
    """One of planner.arguments' rules (the library's, so that a flag and the argument it feeds
    are refused alike) applied to a flag: its ValueError becomes a one-line error naming the flag."""
    try:
        rule(value, flag, **kw)
    except ValueError as e:
        raise CLIError(str(e)) from None


def _seed(value: int, flag: str) -> None:
    import planner.arguments as arguments

    _library_rule(arguments.seed, value, flag)  # CP-SAT's int32


def _window(value: str) -> int | str | None:
    """--window: 'auto', 'none' (the full model) or a positive number of same-key neighbours
    (planner.arguments.window's rule, spelled for the command line)."""
    import planner.arguments as arguments

    if value in ("auto", "none"):
        return None if value == "none" else value
    try:
        n = int(value)
        arguments.window(n, "--window")
    except ValueError:
        raise CLIError(f"--window must be 'auto', 'none' or a positive integer, not {value!r}") from None
    return n


def _output_file(path: str, flag: str) -> None:
    """Refuse an output file that cannot be written, before any work: an existing directory or
    other non-regular file (the plan is written by renaming over it: -o /dev/null would replace
    the device), or a folder that cannot be created or written. Writability is probed with a
    temporary file in the nearest existing folder, removed at once: permission bits say nothing
    for root or on a read-only or virtual filesystem (/sys)."""
    p = Path(path)
    if p.is_dir():
        raise CLIError(f"{flag} {path}: is a directory; give the plan file to write")
    if p.exists() and not p.is_file():
        raise CLIError(f"{flag} {path}: exists and is not a regular file")
    _writable_place(p.parent, flag, path)


def _writable_place(folder: Path, flag: str, shown: str) -> None:
    """``folder``, or the nearest folder above it that exists, takes a new file (a temporary one,
    removed at once)."""
    import tempfile

    while not folder.exists():  # ends at '.' or '/', which exist
        folder = folder.parent
    if not folder.is_dir():
        raise CLIError(f"{flag} {shown}: cannot create a folder there: {folder} is a file")
    try:
        fd, probe = tempfile.mkstemp(prefix=".bucketplan-probe-", dir=folder)
    except OSError as e:
        raise CLIError(f"{flag} {shown}: cannot write in {folder} ({e.strerror or e})") from None
    os.close(fd)
    os.unlink(probe)


def _memory_budget(gb: float | None) -> int | None:
    """--memory-budget-gb in bytes (None: no budget), as solve and verify take it."""
    from planner.problem import MAX_BYTES

    if gb is None:
        return None
    _positive(gb, "--memory-budget-gb", zero_ok=True)  # 0: nothing extra may stay alive
    budget = int(gb * 1024**3)
    if budget >= MAX_BYTES:  # as a problem's byte counts: sums stay within CP-SAT's int64
        raise CLIError(f"--memory-budget-gb {gb!r} is beyond any machine (below {MAX_BYTES // 1024**3} GB)")
    return budget


def _position_search_and_report(args, problem, anchored, hint, t_start: float) -> int:
    """``solve --positions free``: the positioned search from CP-SAT's plan, the hint and the
    per-block seed, within the peak budget; reports as solve does. ``--deterministic``: a number of
    evaluations instead of seconds (EVALUATIONS_PER_S of the positioned share), the wall clock only
    a guard, and no creation time in the plan: two runs write the same bytes."""
    import planner
    from planner.bounds import free_position_floor
    from planner.memory import memory_timeline
    from planner.position_search import EVALUATIONS_PER_S, FREE_POSITIONS_CP_SAT_SHARE, position_search
    from planner.solver import DETERMINISTIC_WALL_FACTOR

    budget = _peak_budget(args.peak_memory_gb, problem, hint)
    starts = [p for p in (anchored.plan, hint) if p is not None]
    evaluations = (int(EVALUATIONS_PER_S * (1 - FREE_POSITIONS_CP_SAT_SHARE) * args.time_limit)
                   if args.deterministic else None)
    deadline = t_start + args.time_limit * (DETERMINISTIC_WALL_FACTOR if args.deterministic else 1.0)
    _progress(args.quiet)(f"positioned search within a peak of {budget / 1e9:.3f} GB, "
                          + (f"{evaluations} evaluations" if evaluations is not None
                             else f"{max(0.0, deadline - time.perf_counter()):.0f} s"))
    try:
        result = position_search(problem, starts, peak_memory_bytes=budget, deadline=deadline, seed=args.seed,
                                 keep_overlap=args.keep_overlap, max_evaluations=evaluations)
    except ValueError as e:  # nothing fits the budget
        raise CLIError(f"--peak-memory-gb: {e}") from None
    except KeyboardInterrupt:  # while the seeds were prepared: CP-SAT's verified anchored plan is the best so far
        if anchored.plan is None:
            raise
        planner.save(_stamped(anchored.plan, args), args.output)
        print(f"interrupted before the positioned search had a plan: wrote CP-SAT's anchored plan "
              f"({anchored.objective:.3f} ms; verified, not held to --peak-memory-gb) to {args.output}", file=sys.stderr)
        return 130
    planner.save(_stamped(result.plan, args), args.output)
    floor = free_position_floor(problem).floor_ms
    gap = (result.step_ms - floor) / result.step_ms if result.step_ms > 0 else 0.0
    note = "; interrupted: the best verified plan so far" if result.stats.get("interrupted") else ""
    print(f"status              FEASIBLE (local search over positions and membership, best from "
          f"{result.stats['best_from']}{note})")
    print(f"collectives         {len(problem.collectives)} -> {planner.collectives_after(problem, result.plan)}")
    print(f"step / bound        {result.step_ms:.3f} ms (simulated) / {floor:.3f} ms (free-position floor); "
          f"unbucketed {planner.simulate(problem).step_ms:.3f} ms")
    if anchored.plan is not None:
        over = memory_timeline(problem, anchored.plan).peak_bytes
        print(f"CP-SAT's start      {anchored.objective:.3f} ms (anchored), peak {over / 1e9:.3f} GB"
              + (" (over the budget: fitted before the search)" if over > budget else ""))
    print(f"gap                 {gap:.1%}")
    print(_memory_line(problem, result.plan) + f"; budget {budget / 1e9:.3f} GB")
    guarded = evaluations is not None and result.stats["evaluations"] < evaluations
    print(f"wall                {time.perf_counter() - t_start:.1f}s" + (
        " (a wall-clock limit: another run may differ)" if evaluations is None else
        " (stopped by the wall-clock guard before its evaluations: another run may differ)" if guarded else
        f" ({result.stats['evaluations']} evaluations: the same plan on any machine)"))
    print(f"wrote               {args.output}")
    return 130 if result.stats.get("interrupted") else 0


def _stamped(plan, args):
    """The plan as written: a deterministic run records no creation time, so two runs write the
    same bytes."""
    return plan.model_copy(update={"created": ""}) if args.deterministic else plan


def _peak_budget(gb: float | None, problem, hint) -> int:
    """--peak-memory-gb in bytes; by default the peak of the hint (e.g. torch's greedy plan), or
    of the unbucketed schedule without one: a plan never holds more than what it replaces."""
    from planner.position_search import default_peak_budget
    from planner.problem import MAX_BYTES

    if gb is None:
        return default_peak_budget(problem, [hint])
    _positive(gb, "--peak-memory-gb")
    budget = int(gb * 1e9)
    if budget >= MAX_BYTES:
        raise CLIError(f"--peak-memory-gb {gb!r} is beyond any machine")
    return budget


def cmd_solve(args) -> int:
    import planner.arguments as arguments

    # every flag and the output path are checked before anything is loaded or solved: a bad
    # one must not cost the search's minutes, nor surface as a traceback from CP-SAT or the save
    _positive(args.time_limit, "--time-limit")  # nan and inf too: CP-SAT would run unbounded or not at all
    # 0 silently became 2; -1 and more than CP-SAT's 10,000 gave MODEL_INVALID
    _library_rule(arguments.worker_count, args.workers, "--workers")
    _seed(args.seed, "--seed")
    window = _window(args.window)
    budget = _memory_budget(args.memory_budget_gb)
    if args.positions == "free" and args.objective != "step":
        raise CLIError("--positions free needs --objective step (positions are chosen by the simulated step)")
    if args.peak_memory_gb is not None:
        if args.positions != "free":
            raise CLIError("--peak-memory-gb needs --positions free")
        _positive(args.peak_memory_gb, "--peak-memory-gb")
    if args.keep_overlap and args.positions != "free":
        raise CLIError("--keep-overlap needs --positions free (anchored plans always keep torch's overlap)")
    _output_file(args.output, "-o")
    try:
        if args.robust is not None:
            return _robust_and_report(args, budget)
        return _solve_and_report(args, window, budget)
    except KeyboardInterrupt:
        # solve keeps the best verified plan at a first Ctrl-C (written, exit 130); this one came
        # while loading the problem, at a second Ctrl-C, or while writing: nothing verified to keep
        print("bucketplan solve: interrupted before a plan was written", file=sys.stderr)
        return 130


def _scenario_list(text: str, flag: str) -> list[str]:
    """A comma-separated list of scenario names (planner.scenarios.SCENARIOS, contention=F) or
    measured files."""
    from planner.scenarios import SCENARIOS, contention_of, is_named

    names = [x.strip() for x in text.split(",") if x.strip()]
    for name in names:
        if not is_named(name) and not Path(name).is_file():
            raise CLIError(f"{flag}: unknown scenario {name!r}; choose from {', '.join(SCENARIOS)}, contention=F or "
                           "give a measured collectives file")
        if is_named(name):
            try:
                contention_of(name)  # contention=F: F a factor from 1
            except ValueError as e:
                raise CLIError(f"{flag}: {e}") from None
        else:  # a bad file is refused now, not after minutes of search
            from planner.scenarios import measured_series

            try:
                measured_series(name)  # parsed once: the re-pricing takes it from here
            except ValueError as e:
                raise CLIError(f"{flag}: {e}") from None
    if len(set(names)) != len(names) or not names:
        raise CLIError(f"{flag} {text!r}: give distinct scenarios, e.g. torch,published")
    return names


def _robust_and_report(args, budget: int | None) -> int:
    """``solve --robust A,B``: the least worst-case regret across the scenarios (planner.scenarios),
    under the policy the flags give; flags its search cannot honour are refused."""
    import planner
    from planner.policy import Policy
    from planner.scenarios import ScenarioError, describe, robust_plan

    scenarios = _scenario_list(args.robust, "--robust")
    if args.positions == "free" or args.objective != "step":
        raise CLIError("--robust searches anchored plans by their step: no --positions free, --objective step")
    if args.window != "auto":
        raise CLIError("--window with --robust: each scenario's step search chooses its own window; drop --window")
    if args.deterministic:
        raise CLIError("--deterministic with --robust: its regret search stops on the wall clock; drop one of them")
    problem = planner.load_problem(args.problem)
    hint = planner.load_plan(args.hint) if args.hint else None
    say = _progress(args.quiet)
    from planner.solver import PlanMismatchError

    try:
        result = robust_plan(problem, scenarios, time_limit_s=args.time_limit, hint=hint, seed=args.seed,
                             workers=args.workers, policy=Policy(args.protect_partly, budget), progress=say)
    except ScenarioError as e:
        raise CLIError(f"{args.problem}: {e}") from None
    except PlanMismatchError as e:
        raise CLIError(f"{args.hint}: {e}") from None
    planner.save(result.plan, args.output)
    for s in scenarios:
        print(f"scenario {s}: {describe(s)}")
    print()
    print("\n".join(result.judged.markdown()))
    print(f"\nregret: a plan's step over the least step any plan here reaches under that scenario, minus 1. "
          f"Steps simulated (planner.simulate) on each scenario's re-priced problem.")
    print(f"wall                {result.wall_s:.1f}s"
          + (" (a CP-SAT search stopped by the wall clock: another run may differ)" if result.wall_limit_hit else ""))
    note = "; interrupted: the most robust verified plan so far" if result.interrupted else ""
    print(f"wrote               {args.output} (robust: worst regret {result.judged.worst_regret('robust'):.2%}; "
          f"verified{note})")
    return 130 if result.interrupted else 0


def _solve_and_report(args, window: int | str | None, budget: int | None) -> int:
    """``bucketplan solve`` once its flags are checked: load, solve, write, report."""
    import planner
    from planner.solver import PlanMismatchError, solve

    t_start = time.perf_counter()
    problem = planner.load_problem(args.problem)
    hint = planner.load_plan(args.hint) if args.hint else None
    say = _progress(args.quiet)
    say(f"solving {args.problem}: {len(problem.collectives)} collectives, objective {args.objective}, "
        f"time limit {args.time_limit}s")
    try:
        from planner.progress import LiveLine

        with LiveLine(say) if not args.quiet else contextlib.nullcontext(say) as live:
            # with free positions, CP-SAT's anchored step plan is one start of the positioned search
            from planner.position_search import FREE_POSITIONS_CP_SAT_SHARE

            cp_sat_s = args.time_limit * (FREE_POSITIONS_CP_SAT_SHARE if args.positions == "free" else 1.0)
            result = solve(problem, time_limit_s=cp_sat_s, objective=args.objective, workers=args.workers,
                           seed=args.seed, hint=hint, window=window, protect_partly=args.protect_partly,
                           memory_budget_bytes=budget, deterministic=args.deterministic, progress=live)
    except PlanMismatchError as e:  # raised before any search (solve checks the hint first)
        raise CLIError(f"{args.hint}: {e}") from None
    if args.positions == "free" and not result.stats.get("interrupted"):
        return _position_search_and_report(args, problem, result, hint, t_start)
    if result.plan is None:
        print(f"no plan: {result.summary()}")
        return 130 if result.stats.get("interrupted") else 1
    try:
        planner.save(_stamped(result.plan, args), args.output)
    except OSError as e:  # checked up front; this is a race (the folder changed during the search)
        raise CLIError(f"{args.output}: cannot write the plan ({e.strerror or e})") from None
    notes = []
    if result.stats.get("interrupted"):
        notes.append("interrupted: the best verified plan so far")
    if result.stats.get("model_not_built"):  # a huge problem: its model would pass the time or memory limit
        notes.append(f"no search: {result.stats['model_not_built']}")
    if result.stats.get("fallback"):  # planner README, Planning: solve always returns a verified plan
        notes.append(f"no better plan found in time than the {result.stats['fallback']} plan")
    print(f"status              {result.status}" + (f" ({'; '.join(notes)})" if notes else ""))
    print(f"collectives         {len(problem.collectives)} -> {planner.collectives_after(problem, result.plan)}")
    if args.objective == "step":
        bound = "n/a" if result.bound is None else f"{result.bound:.3f} ms"  # None: interrupted before the floor
        print(f"step / bound        {result.objective:.3f} ms (simulated) / {bound} "
              f"({result.stats['bound_scope']}); unbucketed {planner.simulate(problem).step_ms:.3f} ms")
    else:
        print(f"objective / bound   {result.objective} / {result.bound} ({result.stats['bound_scope']})")
    print(f"gap                 {'n/a' if result.gap is None else f'{result.gap:.1%}'}")
    print(_memory_line(problem, result.plan))
    print(f"wall                {result.wall_s:.1f}s" + (" (stopped by the wall-clock limit, not the deterministic "
                                                           "one: another run may differ)"
                                                           if result.stats.get("wall_limit_hit") else ""))
    print(f"wrote               {args.output}")
    return 130 if result.stats.get("interrupted") else 0


def cmd_solve_dir(args) -> int:
    from planner.io import BOOKKEEPING_MAX_BYTES, BadFileError, read_regular_text
    from planner.plan_dir import recorded_problems, solve_dir

    root = Path(args.plan_dir)
    if not root.is_dir():
        raise CLIError(f"{root}: no such plan directory (record one with fxglue.run.compile.record; README, "
                       "'Use a plan in training')")
    if not recorded_problems(root):
        raise CLIError(f"{root}: no recorded problems (no */problem.json)")
    _positive(args.time_limit, "--time-limit")
    _positive(args.jobs, "--jobs")
    _seed(args.seed, "--seed")
    if args.workers is not None:
        import planner.arguments as arguments

        _library_rule(arguments.worker_count, args.workers, "--workers")
    try:
        rows = solve_dir(root, objective=args.objective, time_limit_s=args.time_limit, jobs=args.jobs,
                         workers=args.workers, seed=args.seed, force=args.force, progress=_progress(args.quiet),
                         positions=args.positions)
    except BadFileError as e:  # a bookkeeping file that is no regular file, another solve-dir running
        raise CLIError(str(e)) from None
    except PermissionError as e:
        raise CLIError(f"{e.filename or root}: cannot write plans there ({e.strerror})") from None
    except KeyboardInterrupt:
        print("interrupted: the plans written so far are kept and an interrupted problem is solved again; "
              "run again to resume", file=sys.stderr)
        return 130
    try:
        print(read_regular_text(root / "summary.md", BOOKKEEPING_MAX_BYTES, "summary") if rows else "nothing to solve",
              end="")
    except BadFileError as e:  # replaced since this run wrote it
        raise CLIError(str(e)) from None
    failed = [r["problem"] for r in rows if r.get("status") in ("ERROR", "") or r.get("plan_ms") in (None, "")]
    print(f"wrote {root}/*/plan.json, {root}/summary.csv, {root}/summary.md")
    if failed:
        print(f"no plan for {len(failed)} problem(s): {', '.join(f[:12] for f in failed)}", file=sys.stderr)
    interrupted = any(r.get("interrupted") for r in rows)
    return 130 if interrupted else 1 if failed else 0


def cmd_sweep(args) -> int:
    from planner.io import BOOKKEEPING_MAX_BYTES, BadFileError, SchemaError, read_regular_text
    from planner.sweep import SpecError, load_spec, ray_available, run_sweep

    from fxglue.presets import DEFAULT_PRESET

    if args.sequential and args.address:
        raise CLIError("--sequential and --address exclude each other (--address runs on a Ray cluster)")
    if args.cpus is not None:
        _positive(args.cpus, "--cpus")
    if (args.address or args.ray) and not ray_available():
        raise CLIError("Ray is not installed: `pip install -e '.[sweep]'`, or drop --ray/--address to run the tasks "
                       "one by one here")
    try:
        spec = load_spec(args.spec, default_preset=DEFAULT_PRESET)
        needs_torch = any(c.source != "problem" for c in spec.cases)
        if needs_torch:
            from fxglue.run.sweep import check_cases

            check_cases(spec.cases)  # every workload and preset resolves before anything is traced
    except SpecError as e:
        raise CLIError(str(e)) from None
    out = Path(args.output)
    if out.exists() and not out.is_dir():
        raise CLIError(f"-o {out}: exists and is not a folder")
    extract = apply = None
    if needs_torch:
        from fxglue.run.sweep import apply_case, extract_case

        extract, apply = extract_case, apply_case
    say = _progress(args.quiet)
    try:
        report = run_sweep(spec, out, extract=extract, apply=apply, ray=False if args.sequential else None,
                           address=args.address, cpus=args.cpus, say=say)
    except (SpecError, SchemaError, BadFileError) as e:  # BadFileError: a bookkeeping file that is no regular file
        raise CLIError(str(e)) from None
    except PermissionError as e:
        raise CLIError(f"{e.filename or out}: cannot write there ({e.strerror})") from None
    except KeyboardInterrupt:
        print(f"interrupted: the tasks finished so far are in {out}/rows.jsonl (an interrupted one is solved again); "
              "run again to resume", file=sys.stderr)
        return 130
    try:
        print(read_regular_text(out / "results.md", BOOKKEEPING_MAX_BYTES, "results table"), end="")
    except BadFileError as e:  # replaced since this run wrote it
        raise CLIError(str(e)) from None
    print(f"wrote {out}/results.csv, results.md, results.png, stages.csv, stages.md, cases/*/")
    if report.failed:
        print(f"no verified plan for {len(report.failed)} task(s): {', '.join(report.failed)}", file=sys.stderr)
        return 1
    return 0


def _positive(value: float, flag: str, *, zero_ok: bool = False) -> None:
    import planner.arguments as arguments

    _library_rule(arguments.positive_number, value, flag, zero_ok=zero_ok)


def cmd_apply(args) -> int:
    import planner
    from fxglue.apply import PlanError
    from fxglue.pipeline import run_pipeline
    from fxglue.models.workloads import WorkloadError

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
    from fxglue.run.gloo import check_workload
    from fxglue.models.workloads import WorkloadError

    say = _progress(args.quiet)
    if args.graph:
        raise CLIError("check runs built-in workloads and --model factories for real on gloo; a --graph file "
                       "holds no module to run (extract, solve and apply plan it)")
    if args.hf_config or args.hf:
        raise CLIError("check runs built-in workloads and --model factories; for --hf-config/--hf use a built-in "
                       "hf-... workload of the same architecture (tiny shapes) or a --model factory")
    _workload(args)  # one workload, a factory that imports, --layers only with --model: before spawning
    what = args.workload or args.model
    shapes = "tiny shapes" if args.workload else "the shapes the factory builds"
    say(f"running {what} ({shapes}) on {args.ranks} gloo ranks: original vs bucketed")
    try:
        result = check_workload(args.workload, ranks=args.ranks, planner=args.planner, plan=args.plan,
                                bucket_mode=args.bucket_mode, pre_bucketing=args.pre_bucketing, seed=args.seed,
                                model=args.model, parallel=args.parallel, layers=args.layers)
    except WorkloadError as e:
        raise CLIError(str(e)) from None
    print(result.summary())
    return 0 if result.ok else 1


def cmd_compare(args) -> int:
    from fxglue.compare import DEFAULT_SUITE, OUTPUTS, run_compare
    from planner.report import markdown
    from planner.io import check_replaceable
    from fxglue.models.workloads import WorkloadError

    say = _progress(args.quiet)
    from fxglue.models.workloads import get_workload

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
    _positive(args.time_limit, "--time-limit")  # as solve: nan, inf and 0 before minutes of tracing
    scenarios = _scenario_list(args.scenarios, "--scenarios") if args.scenarios is not None else None
    out = _compare_output(args.output, args.force)
    try:  # before the minutes of tracing, not after them (run_compare checks it again)
        check_replaceable(out, OUTPUTS)
    except OSError as e:
        raise CLIError(f"-o {out}: {e.strerror}") from None
    _writable_place(out.absolute().parent, "-o", str(out))  # the run is written beside it, then renamed
    detail = say if args.verbose else None  # say is silent under -q
    try:
        table = run_compare(targets, out=out, time_limit_s=args.time_limit, progress=say, preset=_preset(args),
                            detail=detail, scenarios=scenarios)
    except WorkloadError as e:
        raise CLIError(str(e)) from None
    except KeyboardInterrupt:  # run_compare removed its temporary folder; the old one is untouched
        print(f"interrupted: {out} is left as it was", file=sys.stderr)
        return 130
    clusters = ", ".join(sorted({str(r.get("cluster") or "the problem's own costs") for r in table}))
    print(f"Simulated on {clusters} (cluster nodes; --preset picks another). {out}/compare.md has every column.\n")
    print(markdown(table), end="")
    print(f"\nwrote {out}/: compare.md (this table; also .csv, .json), step_time.png, timeline.png, "
          f"collectives_and_exposed.png, traces/ (ui.perfetto.dev), plans/ (every plan, verified; plans/index.md)"
          + (", scenarios.md" if scenarios else ""))
    if scenarios:
        print()
        print((out / "scenarios.md").read_text(), end="")
    return 0


def _compare_output(output: str | None, force: bool) -> Path:
    """compare's folder. Default: out/compare, or out/compare-2, -3, ... when that one exists, so a
    second run never replaces the first. A folder named with -o that exists is replaced only
    with --force (a refusal naming it otherwise), so a run is never silently overwritten."""
    if output is None:
        out, k = Path("out/compare"), 1
        while out.exists() or out.is_symlink():
            k += 1
            out = Path(f"out/compare-{k}")
        return out
    out = Path(output)
    if (out.exists() and (not out.is_dir() or any(out.iterdir()))) and not force:
        raise CLIError(f"-o {out}: exists (an earlier run?); pass --force to replace it, or name a new folder")
    return out


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
    s.add_argument("--save-graph", metavar="FILE.py", help="also write the traced step (before torch's scheduler) "
                   "as a graph file in torch's repro format, which --graph reads back to the same problem")
    s.add_argument("--tiny", action="store_true", help="each gloo rank's problem at the tiny shapes `check` runs "
                   "(OUT/rank<R>/problem.json and greedy-plan.json; --ranks: how many, default 2), to solve and "
                   "check with `check --plan OUT`")
    _add_pipeline_options(s)
    s.set_defaults(func=cmd_extract)

    s = sub.add_parser("verify", help="check a plan against the rules of planner/README.md (exit 1 if infeasible)")
    s.add_argument("problem", help="the problem file (problem.json, as `extract` writes it)")
    s.add_argument("plan", help="the plan file to check (plan.json, as `solve` writes it)")
    s.add_argument("--max-violations", type=int, default=20, help="violations to print (default %(default)s)")
    # default None: not given, so the policy the plan records (or the default one) applies
    s.add_argument("--protect-partly", action=argparse.BooleanOptionalAction, default=None,
                   help="check under the stricter policy that keeps partly hidden overlap too (--no-protect-partly: "
                        "torch's); default: the policy the plan records in its params, else torch's")
    g = s.add_mutually_exclusive_group()
    g.add_argument("--memory-budget-gb", type=float, default=None,
                   help="check rule 10 with this budget (GB); default: the budget the plan records, else none")
    g.add_argument("--no-memory-budget", action="store_true", help="check without a memory budget")
    s.set_defaults(func=cmd_verify)

    _add_solve_parsers(sub)

    _add_many_parsers(sub)
    s = sub.add_parser("check", help="run original and bucketed graphs for real on gloo; compare bitwise")
    s.add_argument("workload", nargs="?", help="a built-in workload (tiny shapes), or use --model")
    _add_model_options(s)
    g = s.add_mutually_exclusive_group()
    g.add_argument("--plan", help="a plan file for the tiny-shape problem of this workload, or a folder of "
                   "rank<R>/plan.json, one per rank (`bucketplan extract --tiny` writes each rank's problem)")
    _add_planner_option(g)
    s.add_argument("--ranks", type=int, default=2,
                   help="gloo processes to run on (default %(default)s, at least 2; a 2-D workload gets TP 2 from 4 "
                        "ranks on, else TP 1)")
    s.add_argument("--seed", type=int, default=0,
                   help="torch's seed for the parameters, the same on every rank (default %(default)s)")
    s.add_argument("--pre-bucketing", action="store_true",
                   help="run torch's FSDP pre-bucketing before scheduling (default: off, as in extract)")
    s.add_argument("--bucket-mode", choices=["default", "custom_ops", "custom_ops_multidtype", "coalesced"],
                   help="torch's bucket mode (default: torch's config, i.e. 'default')")
    s.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    s.set_defaults(func=cmd_check)

    s = sub.add_parser("apply", help="schedule a workload and apply a plan file to it")
    s.add_argument("workload", nargs="?", help="a built-in workload (or use --model / --hf-config / --hf)")
    s.add_argument("plan", help="the plan file to apply (solved for this workload's problem, e.g. by `solve`)")
    _add_model_options(s)
    _add_pipeline_options(s)
    s.set_defaults(func=cmd_apply)
    return p


def _add_many_parsers(sub) -> None:
    """``sweep`` and ``compare``: many workloads, presets and planners at once."""
    s = sub.add_parser("sweep", help="many workloads x presets x objectives from a TOML spec: extract each problem "
                                     "once, solve each (problem, objective) as a task (on Ray when installed), "
                                     "verify, tabulate; resumable")
    s.add_argument("spec", help="the sweep spec (TOML; planner/sweep.py documents it, experiments/specs/ has examples)")
    s.add_argument("-o", "--output", default="out/sweep", help="output folder (default out/sweep); a rerun resumes")
    s.add_argument("--sequential", action="store_true", help="run the tasks one by one in this process, even "
                   "with Ray installed")
    s.add_argument("--ray", action="store_true", help="require Ray (an error when it is not installed)")
    s.add_argument("--address", help="a Ray cluster to run the tasks on (default: a Ray instance on this machine)")
    s.add_argument("--cpus", type=int, help="CPUs of the local Ray instance (default: all of this machine's)")
    s.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    s.set_defaults(func=cmd_sweep)

    s = sub.add_parser("compare", help="torch's pipelines vs CP-SAT on the same graphs: counts, simulated "
                                       "step time and exposed communication, plots and traces")
    s.add_argument("targets", nargs="*", help="workload names or problem.json files (default: the built-in suite)")
    s.add_argument("-o", "--output", default=None,
                   help="output folder (default: out/compare, or out/compare-2, -3, ... if that exists)")
    s.add_argument("--force", action="store_true", help="replace the -o folder if it exists (default: refuse)")
    from planner.report import COMPARE_TIME_LIMIT_S

    s.add_argument("--time-limit", type=float, default=COMPARE_TIME_LIMIT_S,
                   help="seconds of search per searching planner (CP-SAT count, step, step pre-bucketed, free "
                        "positions) per workload (default %(default)s: the default suite in about two minutes)")
    _add_model_options(s)
    _add_cluster_options(s)
    s.add_argument("--scenarios", metavar="A,B,...",
                   help="also re-price every plan under these cost scenarios and report its step and regret "
                        "(torch, published-comm, published-mfu, published, contention, contention=F, or a measured "
                        "collectives file; planner/scenarios.py); written to scenarios.md")
    s.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    s.add_argument("-v", "--verbose", action="store_true",
                   help="the searches' own progress too: incumbents, bounds, polish moves (default: one line per "
                        "planner)")
    s.set_defaults(func=cmd_compare)


def _add_solve_parsers(sub) -> None:
    """``solve`` and ``solve-dir``: one problem, and every problem recorded from torch.compile."""
    s = sub.add_parser("solve", help="optimal bucketing with CP-SAT (status, objective, bound, gap)")
    s.add_argument("problem", help="the problem file to solve (problem.json, as `extract` writes it)")
    s.add_argument("-o", "--output", required=True, help="plan file to write")
    s.add_argument("--time-limit", type=float, default=60.0, help="seconds of search (default 60)")
    s.add_argument("--objective", choices=["count", "exposure", "step"], default="step",
                   help="what to minimize (default step, as solve-dir): step: the simulated step time in ms; "
                        "count: the number of collectives; exposure: exposed communication summed per bucket, "
                        "without stream queuing")
    s.add_argument("--workers", type=int, default=2, help="CP-SAT workers (default 2)")
    s.add_argument("--seed", type=int, default=0,
                   help="CP-SAT's random seed (default %(default)s); with the same workers, the same plan")
    s.add_argument("--deterministic", action="store_true",
                   help="--time-limit counts CP-SAT's deterministic time, not wall seconds: the same seed and workers "
                        "give the same plan on any machine, even when not proved optimal (runs take longer)")
    s.add_argument("--hint", help="a plan to start from (e.g. greedy-plan.json; default: none)")
    s.add_argument("--window", default="auto",
                   help="'auto' (the default: full model up to 320 collectives, else 16), 'none' (full model), or N: "
                        "limit anchors to N same-key neighbours; the reported bound always holds for the whole problem")
    s.add_argument("--protect-partly", action="store_true",
                   help="keep the overlap of partly hidden collectives too (stricter than torch's rules; default: "
                        "off, torch's rules)")
    s.add_argument("--memory-budget-gb", type=float, default=None,
                   help="extra memory kept alive by moved starts/waits stays within this at every position "
                        "(default: no budget)")
    s.add_argument("--positions", choices=["anchored", "free"], default="anchored",
                   help="anchored (the default): each bucket starts and waits where torch scheduled one of its "
                        "members; free: also choose where (planner.position_search, step objective only), within "
                        "--peak-memory-gb; apply, check and use merge such plans where they name")
    s.add_argument("--keep-overlap", action="store_true",
                   help="with --positions free: keep torch's overlap too (rules 4, 7 and 8: a bucket keeps what hid "
                        "each member), as anchored plans do (default: off; the step prices lost overlap)")
    s.add_argument("--peak-memory-gb", type=float, default=None,
                   help="with --positions free: the planned schedule's peak memory (GB, 1e9 bytes) stays within "
                        "this (default: the --hint plan's peak, or the unbucketed schedule's)")
    s.add_argument("--robust", metavar="A,B,...",
                   help="the plan with the least worst-case regret across these cost scenarios (torch, "
                        "published-comm, published-mfu, published, contention, contention=F, or a measured "
                        "collectives file; planner/scenarios.py), within --time-limit")
    s.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    s.set_defaults(func=cmd_solve)

    s = sub.add_parser("solve-dir", help="solve every problem recorded from torch.compile (fxglue.run.compile.record) "
                                         "that has no plan yet; resumable; writes plan.json and a summary")
    s.add_argument("plan_dir", help="the folder torch.compile recorded its problems in (one subfolder per "
                                    "problem, with its problem.json)")
    s.add_argument("--objective", choices=["count", "exposure", "step"], default="step",
                   help="what to minimize (default step, as solve): step: the simulated step time in ms; "
                        "count: the number of collectives; exposure: exposed communication summed per bucket, "
                        "without stream queuing")
    s.add_argument("--time-limit", type=float, default=60.0, help="seconds of search per problem (default 60)")
    s.add_argument("--jobs", type=int, default=1, help="problems solved at once (default 1)")
    s.add_argument("--workers", type=int, help="CP-SAT workers per problem (default: cores / jobs)")
    s.add_argument("--seed", type=int, default=0, help="CP-SAT's random seed (default %(default)s)")
    s.add_argument("--force", action="store_true", help="solve again problems that already have a plan")
    s.add_argument("--positions", choices=["anchored", "free"], default="anchored",
                   help="anchored (the default) or free: as solve's, within the higher of torch's greedy plan's and "
                        "the unbucketed schedule's peak memory (step objective only)")
    s.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    s.set_defaults(func=cmd_solve_dir)



def _add_planner_option(s) -> None:
    from fxglue import planners  # torch-free: the registry's names and descriptions

    s.add_argument("--planner", choices=planners.names(), default="greedy",
                   help="which plan to check (default %(default)s): " + planners.help_text().replace("%", "%%"))


def _add_model_options(s) -> None:
    s.add_argument("--model", help="your model: MODULE:FACTORY or FILE.py:FACTORY, where factory(groups) returns "
                                   "(module, example_inputs, loss_fn) (README, 'Plan your own model')")
    s.add_argument("--hf-config", help="a Hugging Face causal-LM config.json, built from the config alone")
    s.add_argument("--hf", help="a Hugging Face model id whose config is in the local cache (nothing is downloaded)")
    s.add_argument("--parallel", choices=["fsdp", "ddp", "2d"], default="fsdp",
                   help="how --model / --hf-config / --hf is parallelized (default fsdp)")
    s.add_argument("--layers", type=int, help="decoder layers of --hf-config / --hf (default: the config's "
                   "num_hidden_layers), or factory(groups, layers=N) (default: the factory's own)")
    s.add_argument("--graph", metavar="FILE.py", help="an FX graph in torch's repro format (a Repro module and "
                   "load_args, as torch's save_graph_repro, the minifier and `extract --save-graph` write it): "
                   "a whole step, a forward or a backward graph, traced on fake CPU tensors. The file is Python "
                   "and runs with your permissions: give only files you trust (its code may take "
                   "BUCKETPLAN_GRAPH_LOAD_TIMEOUT_S seconds, default 300)")
    s.add_argument("--group", action="append", metavar="NAME=SIZE[@RANKS_PER_NODE][:dp|tp]",
                   help="a process group of the --graph file (repeat for each; default: the file's get_pg_config() "
                        "or setup_fake_process_groups); groups are data-parallel unless marked tp, ranks per node "
                        "default to the preset's layout")


def _add_cluster_options(s) -> None:
    from fxglue.presets import DEFAULT_PRESET, PRESETS

    s.add_argument("--preset", choices=list(PRESETS), default=DEFAULT_PRESET,
                   help="cluster: world size, 2-D TP degree, GPU and how collectives are priced "
                        f"(default {DEFAULT_PRESET}); " + "; ".join(f"{p.name}: {p.description}" for p in PRESETS.values()))
    s.add_argument("--ranks", type=int, help="world size instead of the preset's (a multiple of its ranks per node)")
    s.add_argument("--tp", type=int, help="tensor-parallel degree of 2-D workloads instead of the preset's")
    s.add_argument("--collectives", nargs="+", metavar="FILE",
                   help="measured collective times that replace the preset's model for the groups they cover: "
                        "nccl-tests output (all_gather_perf, reduce_scatter_perf, all_reduce_perf) or a CSV "
                        "kind,group,ranks_per_node,bytes,ms (docs/commands.md)")
    s.add_argument("--compute-tflops", type=float,
                   help="bf16/fp16 rate of the compute roofline in TFLOP/s instead of the preset's (800: ~60%% MFU "
                        "on H100; published Llama-3-8B training runs at 33-43%%, i.e. 330-420)")
    s.add_argument("--hbm-tbps", type=float, help="memory bandwidth of the compute roofline in TB/s instead of the "
                                                  "preset's (3.0)")
    s.add_argument("--profile", metavar="TRACE.json",
                   help="a Chrome trace of the step on the cluster (torch.profiler, record_shapes=True): its op "
                        "times replace the roofline of the nodes it timed, its NCCL kernels the collective model "
                        "of the groups they cover (torch's profile-guided estimation; docs/commands.md)")
    s.add_argument("--profile-cpu", action="store_true",
                   help="the --profile trace is of a CPU run (no GPU kernels): its ops' CPU times price the nodes "
                        "it timed; it has no collective times (docs/commands.md)")
    s.add_argument("--collective-ranks", metavar="N/PER_NODE",
                   help="ranks and ranks per node of nccl-tests files whose header lists no ranks (e.g. 64/8)")


def _add_pipeline_options(s) -> None:
    _add_cluster_options(s)
    s.add_argument("--pre-bucketing", action="store_true",
                   help="run torch's FSDP pre-bucketing before scheduling (torch's default; off here so the "
                        "bucket search sees every collective)")
    s.add_argument("--bucket-mode", choices=["default", "custom_ops", "custom_ops_multidtype", "coalesced"],
                   default=None, help="torch's bucket mode (default: torch's config, i.e. 'default')")
    s.add_argument("--max-bucket-memory-gb", type=float, default=2.0,
                   help="bucket cap in GB (default %(default)s, as torch)")
    s.add_argument("--hardware", help="JSON file overriding the estimator's hardware figures (default: the "
                                      "preset's)")
    s.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")


def _stdout_gone() -> bool:
    """Whether stdout is a pipe whose reader has closed it (poll reports an error on it)."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(0))
    except (OSError, ValueError, AttributeError):  # no file descriptor, or no poll (Windows)
        return False


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import logging

    # torch's inductor passes log at INFO on their own loggers (pre-bucketing summaries): the
    # command line reports what matters itself
    logging.getLogger("torch._inductor").setLevel(logging.WARNING)
    try:
        parser = build_parser()  # imports planner and the presets: seconds on a cold start
    except (KeyboardInterrupt, ImportError) as e:
        if not _by_ctrl_c(e):
            raise
        print("bucketplan: interrupted while starting", file=sys.stderr)
        return 130
    args = parser.parse_args(argv)
    try:
        return _run(args)
    except (KeyboardInterrupt, ImportError) as e:
        if not _by_ctrl_c(e):
            raise
        # a command that keeps a result at Ctrl-C returns 130 itself; this one came while it
        # traced, loaded or wrote (each file is written whole or not at all)
        print(f"bucketplan {args.command}: interrupted", file=sys.stderr)
        return 130


def _by_ctrl_c(e: BaseException) -> bool:
    """A KeyboardInterrupt, or an error it caused: Ctrl-C while a C extension initializes surfaces
    as "ImportError: initialization failed" with the KeyboardInterrupt as its context (OR-Tools)."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


def _run(args) -> int:
    """The command ``args`` names, with its errors as one line and exit 2."""
    try:
        code = args.func(args)
        sys.stdout.flush()  # here, so a closed pipe raises below and not at interpreter exit
        return code
    except BrokenPipeError:
        if not _stdout_gone():
            raise  # another pipe broke (a gloo rank died in `check`): not ours to hide
        # the reader went away (`bucketplan workloads | head -1`): Python's documented idiom --
        # point stdout at devnull so the final flush cannot raise again, and exit as a tool killed
        # by SIGPIPE would (128 + 13), quietly
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):  # stdout without a file descriptor (captured in tests)
            pass
        return 141
    except CLIError as e:
        print(f"bucketplan {args.command}: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - planner errors carry the offending item in their message
        from planner.io import SchemaError
        from planner.solver import PlanMismatchError

        # PlanMismatchError: a plan of another problem given to solve/repair through an API
        # caller (compare's sibling greedy-plan.json); `solve --hint` names its file itself
        if isinstance(e, (SchemaError, PlanMismatchError)):
            print(f"bucketplan {args.command}: error: {e}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
