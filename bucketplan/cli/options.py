"""The flag groups several commands share, each beside the function that reads it: the workload
(a built-in name, --model, --hf-config, --hf or --graph), the cluster (--preset and what prices
it), torch's pipeline, and --planner. Which workloads each of them shapes is ``rules.py``'s table.

Imports only the standard library at its top; fxglue is imported when a parser is built or a
workload or cluster is read.
"""

from __future__ import annotations

from pathlib import Path

from bucketplan.cli.common import CLIError, positive
from bucketplan.cli.rules import FACTORY, GRAPH, HF, check_shaping, noted, target_source

BUCKET_MODES = ["default", "custom_ops", "custom_ops_multidtype", "coalesced"]


def add_model_options(s) -> None:
    s.add_argument("--model", help="your model: MODULE:FACTORY or FILE.py:FACTORY, where "
                                   "factory(groups) returns (module, example_inputs, loss_fn) "
                                   "(README, 'Plan your own model')")
    s.add_argument("--hf-config",
                   help="a Hugging Face causal-LM config.json, built from the config alone")
    s.add_argument("--hf", help="a Hugging Face model id whose config is in the local cache "
                                "(nothing is downloaded)")
    s.add_argument("--parallel", action=noted(s), choices=["fsdp", "ddp", "2d"], default="fsdp",
                   help="how --model / --hf-config / --hf is parallelized (default fsdp)")
    s.add_argument("--layers", action=noted(s), type=int, help="decoder layers of --hf-config / --hf (default: the "
                   "config's num_hidden_layers), or factory(groups, layers=N) (default: the "
                   "factory's own)")
    s.add_argument("--graph", metavar="FILE.py",
                   help="an FX graph in torch's repro format (a Repro module and load_args, as "
                        "torch's save_graph_repro, the minifier and `extract --save-graph` write "
                        "it): a whole step, a forward or a backward graph, traced on fake CPU "
                        "tensors. The file is Python and runs with your permissions: give only "
                        "files you trust (its code may take BUCKETPLAN_GRAPH_LOAD_TIMEOUT_S "
                        "seconds, default 300)")
    s.add_argument("--group", action=noted(s, "append"), metavar="NAME=SIZE[@RANKS_PER_NODE][:dp|tp]",
                   help="a process group of the --graph file (repeat for each; default: the file's "
                        "get_pg_config() or setup_fake_process_groups); groups are data-parallel "
                        "unless marked tp, ranks per node default to the preset's layout")


def add_cluster_options(s) -> None:
    from fxglue.presets import DEFAULT_PRESET, PRESETS

    s.add_argument("--preset", action=noted(s), choices=list(PRESETS), default=DEFAULT_PRESET,
                   help="cluster: world size, 2-D TP degree, GPU and how collectives are priced "
                        f"(default {DEFAULT_PRESET}); "
                        + "; ".join(f"{p.name}: {p.description}" for p in PRESETS.values()))
    s.add_argument("--ranks", action=noted(s), type=int,
                   help="world size instead of the preset's (a multiple of its ranks per node)")
    s.add_argument("--tp", action=noted(s), type=int, help="tensor-parallel degree of 2-D workloads instead of the "
                                          "preset's")
    s.add_argument("--collectives", action=noted(s), nargs="+", metavar="FILE",
                   help="measured collective times that replace the preset's model for the groups "
                        "they cover: nccl-tests output (all_gather_perf, reduce_scatter_perf, "
                        "all_reduce_perf) or a CSV kind,group,ranks_per_node,bytes,ms "
                        "(docs/commands.md)")
    s.add_argument("--compute-tflops", action=noted(s), type=float,
                   help="bf16/fp16 rate of the compute roofline in TFLOP/s instead of the preset's "
                        "(800: ~60%% MFU on H100; published Llama-3-8B training runs at 33-43%%, "
                        "i.e. 330-420)")
    s.add_argument("--hbm-tbps", action=noted(s), type=float,
                   help="memory bandwidth of the compute roofline in TB/s instead of the preset's "
                        "(3.0)")
    s.add_argument("--profile", action=noted(s), metavar="TRACE.json",
                   help="a Chrome trace of the step on the cluster (torch.profiler, "
                        "record_shapes=True): its op times replace the roofline of the nodes it "
                        "timed, its NCCL kernels the collective model of the groups they cover "
                        "(torch's profile-guided estimation; docs/commands.md)")
    s.add_argument("--profile-cpu", action=noted(s, "store_true"),
                   help="the --profile trace is of a CPU run (no GPU kernels): its ops' CPU times "
                        "price the nodes it timed; it has no collective times (docs/commands.md)")
    s.add_argument("--contention", action=noted(s), type=float, metavar="F",
                   help="compute runs F times slower while a collective is in flight (NCCL's kernels "
                        "take SMs and memory bandwidth): every planner, bound and report counts it "
                        "(default 1: overlap is free, as torch's estimator assumes; published: 1.19 on "
                        "average across A100/H100, up to 2; `train_compiled.py bench` measures it)")
    s.add_argument("--collective-ranks", action=noted(s), metavar="N/PER_NODE",
                   help="ranks and ranks per node of nccl-tests files whose header lists no ranks "
                        "(e.g. 64/8)")


def add_pipeline_options(s) -> None:
    add_cluster_options(s)
    s.add_argument("--pre-bucketing", action=noted(s, "store_true"),
                   help="run torch's FSDP pre-bucketing before scheduling (torch's default; off "
                        "here so the bucket search sees every collective)")
    s.add_argument("--schedule", action=noted(s), choices=("torch", "graph"), default="torch",
                   help="the order to plan on: torch's overlap scheduler's (default), or the graph's own "
                        "(torch's scheduler not run, as torch's manual per-block pass plans; compute stays where "
                        "the model put it, so the unbucketed peak is lower); apply a plan with the same flag")
    s.add_argument("--bucket-mode", action=noted(s), choices=BUCKET_MODES, default=None,
                   help="torch's bucket mode (default: torch's config, i.e. 'default')")
    s.add_argument("--max-bucket-memory-gb", action=noted(s), type=float, default=2.0,
                   help="torch's bucket cap, its max_bucket_memory_gb, which torch reads as GiB "
                        "(2^30 bytes; default %(default)s, as torch)")
    s.add_argument("--hardware", action=noted(s), help="JSON file overriding the estimator's hardware figures "
                                      "(default: the preset's)")
    s.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")


def add_planner_option(s) -> None:
    from planner.search import planners  # torch-free: the registry's names and descriptions

    s.add_argument("--planner", choices=planners.names(), default="greedy",
                   help="which plan to check (default %(default)s): "
                        + planners.help_text().replace("%", "%%"))


def workload(args, *, required: bool = True, others: list[str] = ()):
    """The workload the flags name: a built-in name, --model, --hf-config or --hf (one of them),
    every shaping flag checked against it and the command's ``others`` targets
    (``check_shaping``)."""
    from fxglue.models.custom import factory_workload, hf_config_workload
    from fxglue.models.workloads import WorkloadError

    named = [x for x in (args.workload, args.model, args.hf_config, args.hf, args.graph) if x]
    if len(named) > 1:
        raise CLIError("give one workload: a built-in name, --model, --hf-config, --hf or --graph")
    own = next(((source, name) for source, name in ((GRAPH, args.graph), (FACTORY, args.model),
                                                     (HF, args.hf_config or args.hf)) if name),
               (target_source(args.workload), args.workload) if args.workload else None)
    if own is None and not others and required:
        raise CLIError("no workload: give a built-in name (`bucketplan workloads`), --model, "
                       "--hf-config, --hf or --graph")
    check_shaping(args, own, [(target_source(t), t) for t in others])
    if own is None:
        return None
    try:
        if args.graph:
            return _graph_file(args)
        if args.model:
            return factory_workload(args.model, args.parallel, args.layers)
        if args.hf_config or args.hf:
            return hf_config_workload(args.hf_config, model_id=args.hf, parallel=args.parallel,
                                      layers=args.layers)
    except WorkloadError as e:
        raise CLIError(str(e)) from None
    return args.workload


def _graph_file(args):
    """--graph FILE with its --group flags (checked here; the file is loaded when it is traced)."""
    from fxglue.graph_file import GraphFile, parse_group

    if not Path(args.graph).is_file():
        raise CLIError(f"--graph {args.graph}: no such file")
    groups = tuple(parse_group(g) for g in args.group) if args.group else None
    names = [g.name for g in groups or ()]
    if len(set(names)) != len(names):
        raise CLIError(f"--group {next(n for n in names if names.count(n) > 1)!r} is given twice")
    return GraphFile(args.graph, groups)


def pipeline(args):
    """The PipelineOptions of the pipeline flags (checked once, there: a bad one names its flag)."""
    from bucketplan.cli.common import built
    from fxglue.pipeline import PipelineOptions

    return built(PipelineOptions, {"pre_bucketing": args.pre_bucketing, "bucket_mode": args.bucket_mode,
                                   "max_bucket_memory_gb": args.max_bucket_memory_gb,
                                   "hardware": hardware(args), "schedule": args.schedule}, PIPELINE_FLAGS)


# the flag that sets each PipelineOptions field (estimator and insert_overlap_deps: library only)
PIPELINE_FLAGS = {"pre_bucketing": "--pre-bucketing", "bucket_mode": "--bucket-mode",
                  "max_bucket_memory_gb": "--max-bucket-memory-gb", "hardware": "--hardware",
                  "schedule": "--schedule"}


def hardware(args):
    """--hardware: the estimator's hardware figures from a JSON file (None: the preset's)."""
    if not getattr(args, "hardware", None):
        return None
    from fxglue.presets import Hardware

    try:
        return Hardware.from_json(args.hardware)
    except (OSError, ValueError, TypeError) as e:
        raise CLIError(f"{args.hardware}: cannot read hardware figures: {e}") from None


def preset(args):
    """The cluster the flags name: --preset at --ranks / --tp, priced by --collectives files and
    a --profile trace."""
    from fxglue.presets import get_preset, with_measurements

    try:
        chosen = get_preset(args.preset, ranks=args.ranks, tp=args.tp)
        ranks, per_node = _collective_ranks(getattr(args, "collective_ranks", None))
        chosen = _compute_rates(chosen, args)
        chosen = _contention(chosen, getattr(args, "contention", None))
        chosen = with_measurements(chosen, getattr(args, "collectives", None), ranks=ranks,
                                   ranks_per_node=per_node)
        if getattr(args, "profile_cpu", False) and not getattr(args, "profile", None):
            raise CLIError("--profile-cpu: give the CPU run's trace with --profile TRACE.json")
        if getattr(args, "profile", None):
            from fxglue.profile import with_profile  # torch's trace parser

            chosen = with_profile(chosen, args.profile, cpu=getattr(args, "profile_cpu", False))
        return chosen
    except ValueError as e:  # planner.cost.measured.MeasuredError and BadFileError are ValueErrors
        raise CLIError(str(e)) from None


def _compute_rates(chosen, args):
    """--compute-tflops / --hbm-tbps: the roofline's rates instead of the preset's."""
    from dataclasses import replace

    rates = {}
    for flag, field in (("compute_tflops", "bf16_tflops"), ("hbm_tbps", "hbm_tbps")):
        value = getattr(args, flag, None)
        if value is not None:
            positive(value, "--" + flag.replace("_", "-"))
            rates[field] = value
    if not rates:
        return chosen
    if getattr(args, "hardware", None):
        raise CLIError("--compute-tflops / --hbm-tbps with --hardware: give the rates in the "
                       "hardware file")
    what = ", ".join(f"{k} {v:g}" for k, v in rates.items())
    figures = replace(chosen.hardware, name=f"{chosen.hardware.name}; {what}", **rates)
    tag = "-".join(f"{k.split('_')[0]}{v:g}" for k, v in rates.items())
    return replace(chosen, hardware=figures, name=f"{chosen.name}+{tag}",
                   description=f"{chosen.description}; {what}")


def _contention(chosen, factor: float | None):
    """--contention F: the preset's problems priced with compute F times slower beside collectives."""
    from fxglue.presets import with_contention
    from planner.cost.simulator import MAX_CONTENTION

    if factor is None:
        return chosen
    try:
        return with_contention(chosen, factor)
    except ValueError:
        raise CLIError(f"--contention {factor:g}: give a slow-down factor from 1 (overlap is free) to "
                       f"{MAX_CONTENTION:g}") from None


def _collective_ranks(text: str | None) -> tuple[int | None, int | None]:
    """--collective-ranks N/PER_NODE."""
    if text is None:
        return None, None
    n, _, per = text.partition("/")
    if not n.isdigit() or int(n) < 1 or not per.isdigit() or int(per) < 1:
        raise CLIError(f"--collective-ranks {text!r}: give N/PER_NODE, positive integers "
                       "(e.g. 64/8)")
    return int(n), int(per)
