"""Run torch's overlap scheduling pipeline with the bucket search delegated to a planner.

Why this exists: the scheduler (reordering for overlap) is torch's and stays torch's; only
the bucket *search* is ours to replace. Torch 2.13's ``OverlapScheduler.run`` imports
``overlap_preserving_bucketer.finalize_overlap_scheduling`` at call time and hands it the
scheduled graph. Inside ``capture_bucketing_inputs()`` that function is swapped for one that
only records its arguments, so after scheduling we hold exactly what torch's bucketer would
have received and can extract a problem, run torch's greedy, or apply any plan. The swap
lives only inside the context; nothing is patched globally.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field
from typing import Any

import torch.fx as fx

import planner
from fxglue.blocks import with_blocks
from fxglue.cpu_compat import cpu_compat
from planner.search import planners
from fxglue.estimator import Estimator, Hardware, Preset, get_preset
from fxglue.extract import extract_problem
from fxglue.graph_file import GraphFile
from fxglue.greedy import TORCH_BUCKETER_DEFAULTS, greedy_plan
from fxglue.models.workloads import TracedWorkload, Workload, trace


class TorchGreedyError(RuntimeError):
    """Torch's own greedy bucketing could not be applied to this graph (a torch defect)."""


@dataclass
class BucketingInputs:
    """What torch's ``finalize_overlap_scheduling`` received: graph, collectives, schedule, knobs."""

    gm: fx.GraphModule
    collective_info: dict
    scheduled: Any
    kwargs: dict

    @property
    def bucketer_kwargs(self) -> dict:
        return {k: self.kwargs[k] for k in TORCH_BUCKETER_DEFAULTS if k in self.kwargs}


@contextlib.contextmanager
def capture_bucketing_inputs():
    """Within this context torch's scheduler stops before bucketing and records its inputs."""
    import torch._inductor.fx_passes.overlap_preserving_bucketer as opb

    captured: list[BucketingInputs] = []
    original = opb.finalize_overlap_scheduling

    def record(gm, collective_info, scheduled, **kwargs):
        captured.append(BucketingInputs(gm, collective_info, scheduled, kwargs))

    opb.finalize_overlap_scheduling = record
    try:
        yield captured
    finally:
        opb.finalize_overlap_scheduling = original


def finalize_with_torch(inputs: BucketingInputs, *, collective_bucketing: bool = True,
                        autofix_cycles: bool | None = None) -> None:
    """Torch's own bucketing + dependency application, exactly as the scheduler would run it.
    ``autofix_cycles``: torch's ``overlap_scheduling_autofix_cycles`` set to this meanwhile
    (None: torch's config as it is)."""
    import torch._inductor.config as inductor_config
    import torch._inductor.fx_passes.overlap_preserving_bucketer as opb

    kwargs = dict(inputs.kwargs)
    kwargs["collective_bucketing"] = collective_bucketing
    patch = (contextlib.nullcontext() if autofix_cycles is None
             else inductor_config.patch({planners.AUTOFIX_CONFIG: autofix_cycles}))
    with patch:
        opb.finalize_overlap_scheduling(inputs.gm, inputs.collective_info, inputs.scheduled, **kwargs)


def graph_order_inputs(traced, estimator: Estimator, *, bucket_mode=None):
    """Torch's bucketing inputs (``fxglue.pipeline.BucketingInputs``) for ``traced.gm`` in its own
    order, torch's scheduler not run: the replay of ``fixed_order_inputs``, the schedule being the
    graph's order, and the finalize knobs torch's scheduler passes (its bucketer's defaults, no
    overlap deps), so torch's greedy and ``apply_plan`` run on it as on torch's schedule. The order
    torch's manual pass plans on (``fxglue.manual.fixed_order_problem`` extracts its problem)."""
    from torch.utils._ordered_set import OrderedSet

    from fxglue.graph_order import fixed_order_inputs

    collective_info, order, _ = fixed_order_inputs(traced, estimator, bucket_mode=bucket_mode)
    kwargs = {"collective_bucketing": True, "insert_overlap_deps": False, "max_bucket_memory_gb": 2.0,
              "bucket_mode": bucket_mode, **TORCH_BUCKETER_DEFAULTS}
    return BucketingInputs(traced.gm, collective_info, OrderedSet(order), kwargs)


def estimator_for(traced: TracedWorkload, hardware: Hardware | None = None, preset: Preset | None = None) -> Estimator:
    """The estimator for a traced workload (see ``preset_estimator``)."""
    groups = traced.groups
    return preset_estimator(preset, tp_group=groups.tp, tp_size=groups.tp_size if groups.tp else 1, hardware=hardware,
                            ranks_per_node=traced.meta.get("group_ranks_per_node"))


def preset_estimator(preset: Preset | str | None, *, tp_group: str | None = None, tp_size: int = 1,
                     hardware: Hardware | None = None, ranks_per_node: dict[str, int] | None = None) -> Estimator:
    """The preset's cost model for a layout with TP innermost: a TP group fills a node first, the
    data-parallel groups stride across nodes; or the α-β ``hardware`` links (the ``ab-ib8``
    preset) when no NCCL preset is given. Groups other than ``tp_group`` are data-parallel.
    ``ranks_per_node`` (role -> ranks of such a group on one node): a layout a graph file's
    groups state (``fxglue.graph_file``), instead of the preset's for that role."""
    preset = resolve_preset(preset)
    roles = {tp_group: "tp"} if tp_group else {}
    measured = preset.measured if preset else None
    profile = preset.profile if preset else None
    if preset is None or preset.comm == "alpha-beta":
        return Estimator(hardware or (preset.hardware if preset else None), roles, measured=measured,
                         profile=profile, contention=preset.contention if preset else 1.0)
    per_node = preset.ranks_per_node
    tp = tp_size if tp_group else 1
    layout = {"tp": min(tp, per_node), "dp": max(1, per_node // tp), **(ranks_per_node or {})}
    return Estimator(hardware or preset.hardware, roles, ranks_per_node=layout, gpu=preset.gpu, measured=measured,
                     profile=profile, contention=preset.contention)


def _fsdp_logger_inherits() -> None:
    """torch's FSDP pre-bucketing module pins its logger at INFO when imported (every other
    inductor logger inherits), so its summary line leaked into every `compare` run past the
    command line's ``torch._inductor`` level. Let it inherit too; TORCH_LOGS, when a user sets
    it, is torch's to honour, so it is left alone then."""
    import logging

    import torch._inductor.fx_passes.fsdp as fsdp

    if not os.environ.get("TORCH_LOGS") and fsdp.logger.level == logging.INFO:
        fsdp.logger.setLevel(logging.NOTSET)


class NotScheduled(RuntimeError):
    """Torch's scheduler returned without reaching the bucketing step (nothing to bucket); the
    graph is left valid."""


@contextlib.contextmanager
def _no_reentrant_waits():
    """Torch 2.13's scheduler, handling an exposed wait, first forces the waits of collectives
    issued before it on the same group, and each forced wait that is exposed overlaps collectives
    of other groups; when such a collective depends on the wait being handled, scheduling its
    path handles that wait again, which forces the same earlier wait again: the recursion never
    ends (RecursionError). Measured on an AutoParallel-shaped 2-D forward priced by its own
    collectives table (``tests/data/repro/autoparallel_2d.py``): the FSDP gather of an MLP
    weight was prefetched before the embedding's, and handling the embedding's wait forced the
    MLP weight's, which overlapped the sequence-parallel reduce_scatter that needs the embedding. Within this context a collective whose
    path runs through a wait still being handled is not taken for overlap -- it cannot start
    before that wait anyway. Only runs that would never end otherwise are changed: a wait
    handled twice is removed from flight twice, which torch's own code cannot survive."""
    import torch._inductor.fx_passes.overlap_scheduling as overlap_scheduling

    cls = overlap_scheduling.OverlapScheduler
    handle_wait, find_path = cls._handle_wait, cls._find_schedulable_path
    handling: list[fx.Node] = []

    def guarded_handle_wait(self, node):
        handling.append(node)
        try:
            return handle_wait(self, node)
        finally:
            handling.pop()

    def guarded_find_path(self, target, curr_overlap_node, why):
        path = find_path(self, target, curr_overlap_node, why)
        if path is not None and any(n in path for n in handling):
            why("path blocked by a wait still being handled")
            return None
        return path

    cls._handle_wait, cls._find_schedulable_path = guarded_handle_wait, guarded_find_path
    try:
        yield
    finally:
        cls._handle_wait, cls._find_schedulable_path = handle_wait, find_path


# what ``schedule`` itself decides; a caller's scheduler keywords may not say otherwise
_OWN_SCHEDULER_KEYS = ("custom_runtime_estimation", "pre_bucketing_fsdp_collectives", "bucket_mode")


def schedule(traced: TracedWorkload, estimator: Estimator, *, pre_bucketing: bool = False,
             bucket_mode=None, **scheduler_kwargs) -> BucketingInputs:
    """Run torch's overlap scheduler on ``traced.gm`` (in place) up to the bucketing step.
    ``scheduler_kwargs``: further keywords of torch's ``schedule_overlap_bucketing`` (a compile's
    inductor settings), over our defaults (bucketing on, analytical estimates); the estimator,
    pre-bucketing and bucket mode are the named arguments, which extraction uses too."""
    import torch._inductor.fx_passes.overlap_scheduling as overlap_scheduling

    clash = sorted(set(scheduler_kwargs) & set(_OWN_SCHEDULER_KEYS))
    if clash:
        raise ValueError(f"scheduler keyword(s) {clash} are schedule's own (estimator, pre_bucketing, bucket_mode)")
    kwargs = {"collective_bucketing": True, "compute_estimator": "analytical", "collective_estimator": "analytical",
              **scheduler_kwargs, "custom_runtime_estimation": estimator,
              "pre_bucketing_fsdp_collectives": pre_bucketing, "bucket_mode": bucket_mode}
    _fsdp_logger_inherits()
    with (cpu_compat(estimator), estimator.torch_topology(), capture_bucketing_inputs() as captured,
          _no_reentrant_waits(), traced.fake_mode):
        overlap_scheduling.schedule_overlap_bucketing(traced.gm, **kwargs)
    if len(captured) != 1:
        raise NotScheduled("torch's scheduler did not reach the bucketing step (no collectives?)")
    return captured[0]


def count_collectives(gm: fx.GraphModule) -> dict[str, int]:
    """Collectives in a graph by kind, counted once per start (a coalesced start counts once),
    looking inside the ``control_deps`` wrappers that ``insert_overlap_deps`` puts around nodes."""
    # importing the module registers torch.ops.higher_order.control_deps (absent before)
    from torch._inductor.fx_passes.control_dependencies import control_deps

    out: dict[str, int] = {}
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        if n.target is control_deps:
            sub = n.args[1] if len(n.args) > 1 else None
            if isinstance(sub, fx.Node) and sub.op == "get_attr":
                for kind, k in count_collectives(getattr(gm, sub.target)).items():
                    out[kind] = out.get(kind, 0) + k
            continue
        if getattr(n.target, "namespace", None) != "_c10d_functional" or "wait_tensor" in str(n.target):
            continue
        name = str(n.target)
        kind = next((k for k in ("all_gather", "reduce_scatter", "all_reduce") if k in name), name)
        out[kind] = out.get(kind, 0) + 1
    return out


@dataclass
class Prepared:
    """A workload traced and scheduled by torch, with its problem and torch's greedy plan
    (recorded; the graph is still unbucketed, in scheduled order)."""

    traced: TracedWorkload
    inputs: BucketingInputs
    estimator: Estimator
    problem: planner.Problem
    greedy: planner.Plan | None
    preset: Preset | None
    timings: dict[str, float] = field(default_factory=dict)
    max_bucket_memory_gb: float = 2.0
    bucket_mode: Any = None

    def record_greedy(self) -> planner.Plan:
        """Torch's greedy bucket search on this schedule, recorded as a plan (graph untouched)."""
        t0 = time.perf_counter()
        inputs = self.inputs
        self.greedy = greedy_plan(inputs.gm.graph, inputs.collective_info, inputs.scheduled,
                                  max_bucket_memory_gb=self.max_bucket_memory_gb, bucket_mode=self.bucket_mode,
                                  problem_fingerprint=self.problem.fingerprint, estimator=self.estimator,
                                  **inputs.bucketer_kwargs)
        self.timings["greedy_s"] = time.perf_counter() - t0
        return self.greedy


def resolve_preset(preset: Preset | str | None) -> Preset | None:
    if preset is None or isinstance(preset, Preset):
        return preset
    return get_preset(preset)


def trace_for(workload: str | Workload | GraphFile | TracedWorkload, preset: Preset | None = None,
              progress=None) -> TracedWorkload:
    """The traced step of a workload: a name or ``Workload`` traced at the preset's world size
    and TP degree (8 ranks, TP 2 without one), a graph file loaded with its own groups, a traced
    workload as it is."""
    say = progress or (lambda msg: None)
    if isinstance(workload, GraphFile):
        # the first thing said of a graph file: loading it runs it
        say(f"note: {workload.path} is Python: running it (its code runs with your permissions)")
        return workload.load()
    if not isinstance(workload, (str, Workload)):
        return workload
    world, tp = (preset.world_size, preset.tp) if preset else (8, 2)
    label = workload if isinstance(workload, str) else workload.name
    say(f"tracing {label} ({world} ranks{f', TP {tp}' if tp > 1 else ''})")
    return trace(workload, world_size=world, tp=tp)


# the orders a plan can be made on (``PipelineOptions.schedule``)
SCHEDULES = ("torch", "graph")


@dataclass(frozen=True)
class PipelineOptions:
    """How torch's pipeline runs around the plan: its FSDP ``pre_bucketing`` before its scheduler,
    its ``bucket_mode`` and bucket cap (``max_bucket_memory_gb``, torch's knob, which torch reads
    as GiB), what prices the schedule (the estimator's ``hardware`` figures, or the ``estimator``
    itself; None: the preset's), whether the applied graph pins its order with control
    dependencies (``insert_overlap_deps``), and which order the plan is made on (``schedule``:
    "torch", torch's overlap scheduler's; "graph", the graph's own, torch's scheduler not run, as
    torch's manual per-block pass runs: compute stays where the model put it, so the unbucketed peak
    is lower)."""

    pre_bucketing: bool = False
    bucket_mode: str | None = None
    max_bucket_memory_gb: float = 2.0
    hardware: Hardware | None = None
    estimator: Estimator | None = None
    insert_overlap_deps: bool = False
    schedule: str = "torch"

    def __post_init__(self) -> None:
        import planner.core.arguments as arguments

        arguments.flag(self.pre_bucketing, "pre_bucketing")
        if self.schedule not in SCHEDULES:
            raise arguments.ArgumentError("schedule", f"schedule {self.schedule!r}: one of {', '.join(SCHEDULES)}")
        if self.schedule == "graph" and self.pre_bucketing:
            raise arguments.ArgumentError("schedule", "schedule 'graph' runs no torch scheduler, so no pre-bucketing "
                                                      "(torch's scheduler's first step)")
        arguments.positive_number(self.max_bucket_memory_gb, "max_bucket_memory_gb")
        arguments.flag(self.insert_overlap_deps, "insert_overlap_deps")


def prepare(
    workload: str | Workload | GraphFile | TracedWorkload,
    *,
    preset: Preset | str | None = None,
    pipeline: PipelineOptions = PipelineOptions(),
    progress=None,
    greedy: bool = True,
    scheduler_kwargs: dict | None = None,
    meta: dict | None = None,
) -> Prepared:
    """The one way from a workload to a problem: trace (``trace_for``: a name at the preset's
    world size and TP degree, a graph file loaded, a traced step -- a gloo rank's, a compile's
    post-grad graph -- as it is), schedule with torch's overlap scheduler (``pipeline.schedule``
    "graph": replay the graph's own order instead, ``graph_order_inputs``), extract the problem,
    record each collective's block and phase (``blocks.with_blocks``), and record torch's greedy
    plan (``greedy=False``: later, by ``record_greedy``), torch's pipeline run as ``pipeline``
    says (pre-bucketing, bucket mode and cap; ``insert_overlap_deps`` is the apply's, not read
    here). ``preset`` None: 8 ranks, TP 2, the α-β ``pipeline.hardware`` (the ``ab-ib8``
    figures). A graph file that names a collectives table
    (``get_colls_estimations_file()``) is priced by it where the preset's own measurements do
    not reach (``presets.with_graph_table``; ``Prepared.preset`` is then that preset).
    ``pipeline.estimator``: the cost model itself, instead of the preset's (the preset then only sizes the
    trace, and a graph file's table is not read); it prices torch's scheduler and the problem
    alike. ``scheduler_kwargs``: further keywords of torch's scheduler (``schedule``);
    ``meta``: entries of the problem's ``meta`` (provenance, not fingerprinted) over ours.
    Raises ``NotScheduled`` when torch's scheduler stops before bucketing."""
    say = progress or (lambda msg: None)
    preset = resolve_preset(preset)
    pre_bucketing, bucket_mode = pipeline.pre_bucketing, pipeline.bucket_mode
    max_bucket_memory_gb, estimator = pipeline.max_bucket_memory_gb, pipeline.estimator
    timings: dict[str, float] = {}
    traced = trace_for(workload, preset, say)
    if traced is not workload:
        timings["trace_s"] = traced.trace_s
    if estimator is None and traced.meta.get("collectives_table"):
        preset = _with_graph_table(traced, preset)
    estimator = estimator or estimator_for(traced, pipeline.hardware, preset)
    t0 = time.perf_counter()
    if pipeline.schedule == "graph":
        if scheduler_kwargs:
            raise ValueError(f"scheduler keyword(s) {sorted(scheduler_kwargs)}: schedule 'graph' runs no scheduler")
        say("replaying the graph's own order (torch's scheduler not run)")
        inputs = graph_order_inputs(traced, estimator, bucket_mode=bucket_mode)
    else:
        say("scheduling with torch's overlap scheduler")
        inputs = schedule(traced, estimator, pre_bucketing=pre_bucketing, bucket_mode=bucket_mode,
                          **(scheduler_kwargs or {}))
    timings["schedule_s"] = time.perf_counter() - t0
    say("extracting the bucketing problem")
    t0 = time.perf_counter()
    meta = {**traced.meta, "pre_bucketing": pre_bucketing, "preset": preset.name if preset else None,
            **({"schedule": "graph"} if pipeline.schedule == "graph" else {}), **(meta or {})}
    problem = extract_problem(inputs.gm.graph, inputs.collective_info, inputs.scheduled,
                              max_bucket_memory_gb=max_bucket_memory_gb, bucket_mode=bucket_mode,
                              estimator=estimator, meta=meta)
    problem = with_blocks(problem, traced, inputs.gm)
    timings["extract_s"] = time.perf_counter() - t0
    prepared = Prepared(traced, inputs, estimator, problem, None, preset, timings, max_bucket_memory_gb, bucket_mode)
    if greedy:
        say("running torch's greedy bucket search")
        prepared.record_greedy()
    return prepared


def _with_graph_table(traced: TracedWorkload, preset: Preset | None) -> Preset:
    """The preset priced also by the collectives table the traced graph file names (read when it
    was loaded; read again here, so a table changed or removed since is one line too). Without a
    preset (the α-β figures of ``hardware``), the table prices its groups on the ``ab-ib8`` preset,
    which is those figures."""
    from fxglue.graph_file import GraphFileError
    from fxglue.presets import with_graph_table

    table = traced.meta["collectives_table"]
    try:
        return with_graph_table(preset or get_preset("ab-ib8"), table)
    except ValueError as e:  # MeasuredError and BadFileError name the table and line
        raise GraphFileError(f"{traced.meta.get('graph_file', traced.name)}: its collectives table: {e}") from None


def _finalize_by_torch(prepared: Prepared, finalize: planners.TorchFinalize) -> float:
    """Torch's own finalize on the prepared graph (its search and merge, or, without collective
    bucketing, its schedule only); seconds taken."""
    traced = prepared.traced
    t0 = time.perf_counter()
    with cpu_compat(prepared.estimator), traced.fake_mode:
        try:
            finalize_with_torch(prepared.inputs, **finalize.as_kwargs())
        except RuntimeError as e:
            if "cyclic extra dep" not in str(e):
                raise
            raise TorchGreedyError(
                f"{traced.name}: torch's own greedy bucketing failed its cycle check ({str(e)[:200]}...). "
                "Its step-by-step checks accepted merges whose final order is cyclic; "
                "`bucketplan verify` on the recorded greedy plan names them (rule 9). "
                "See planner/README.md, 'Where torch differs'.") from e
    return time.perf_counter() - t0


def _apply_our_plan(prepared: Prepared, plan: planner.Plan, insert_overlap_deps: bool) -> float:
    """``apply_plan`` on the prepared graph (verified first; refused untouched); seconds taken."""
    from fxglue.apply import apply_plan

    inputs = prepared.inputs
    t0 = time.perf_counter()
    with prepared.traced.fake_mode:
        apply_plan(inputs.gm.graph, inputs.collective_info, inputs.scheduled, plan,
                   max_bucket_memory_gb=prepared.max_bucket_memory_gb, bucket_mode=prepared.bucket_mode,
                   insert_overlap_deps=insert_overlap_deps, problem=prepared.problem, estimator=prepared.estimator)
    return time.perf_counter() - t0


@dataclass
class PipelineResult:
    """A scheduled (and, unless ``apply=False``, bucketed) graph with its problem and plan."""

    name: str
    gm: fx.GraphModule
    problem: planner.Problem
    plan: planner.Plan | None
    timings: dict[str, float] = field(default_factory=dict)
    collectives_before: dict[str, int] = field(default_factory=dict)
    collectives_after: dict[str, int] = field(default_factory=dict)
    solve_result: Any = None
    preset: Preset | None = None  # what priced it: the caller's, with a graph file's collectives table


def _registry_entry(planner_: str | planner.Plan | os.PathLike) -> planners.Planner | None:
    """The registry's entry a name selects; None for a Plan or a plan file. A string that is
    neither a registry name nor a file is refused in one line naming every entry."""
    if not isinstance(planner_, str):
        return None
    if planner_ in planners.PLANNERS or not os.path.exists(planner_):
        return planners.get(planner_, or_else="a Plan or a plan file")
    return None


def _make_plan(entry: planners.Planner, prepared: Prepared, timings: dict[str, float],
               search: planner.SolveOptions | None, progress) -> planners.PlannerOutput:
    """The entry's plan for the prepared problem; ``plan_s`` (torch's greedy search included
    where the planner starts from it) when it made one."""
    request = planners.PlanRequest(prepared.problem, greedy=prepared.greedy, solve=search, repair=search,
                                   progress=progress)
    out = entry.plan(request)
    if out.plan is not None:
        timings["plan_s"] = (timings["greedy_s"] if entry.needs_greedy else 0.0) + out.wall_s
    return out


def run_pipeline(
    workload: str | Workload | GraphFile | TracedWorkload,
    *,
    planner_: str | planner.Plan | os.PathLike = "greedy",
    preset: Preset | str | None = None,
    pipeline: PipelineOptions = PipelineOptions(),
    search: planner.SolveOptions | None = None,
    apply: bool = True,
    progress=None,
) -> PipelineResult:
    """``prepare``, then plan and apply, torch's pipeline run as ``pipeline`` says.

    ``planner_``: a name of the registry (``planner.search.planners``: ``"greedy"`` and
    ``"greedy-autofix"`` searched and applied by torch, ``"none"`` no bucketing, ``"cpsat"``
    searched and ``"greedy-repaired"`` repaired with ``search``, None: their defaults), or a
    ``Plan`` / path to a plan file. Plans that torch does not apply itself are applied with
    ``apply_plan``; ``apply=False``: none is (the graph stays scheduled, unbucketed).
    """
    say = progress or (lambda msg: None)
    entry = _registry_entry(planner_)
    # torch's greedy search only where the planner starts from it (minutes on a 405B-shaped graph)
    prepared = prepare(workload, preset=preset, pipeline=pipeline, progress=progress,
                       greedy=entry is not None and entry.needs_greedy)
    traced, inputs, problem = prepared.traced, prepared.inputs, prepared.problem
    before = count_collectives(traced.gm)
    timings = dict(prepared.timings)
    solve_result = None
    if entry is not None:
        out = _make_plan(entry, prepared, timings, search, say)
        plan, solve_result = out.plan, out.solve_result
    else:
        plan = planner_ if isinstance(planner_, planner.Plan) else planner.load_plan(planner_)
    if apply and entry is not None and entry.finalize is not None:
        # Torch's greedy search runs twice on purpose: once recorded as a plan (graph untouched),
        # once inside torch's own finalize, so the applied graph is exactly torch's -- even where
        # its recorded anchors break rule 9 and apply_plan would refuse them.
        timings["apply_s"] = _finalize_by_torch(prepared, entry.finalize)
    elif apply and plan is not None:
        say("applying the plan")
        timings["apply_s"] = _apply_our_plan(prepared, plan, pipeline.insert_overlap_deps)
    if apply:
        inputs.gm.recompile()
    return PipelineResult(name=traced.name, gm=inputs.gm, problem=problem, plan=plan, timings=timings,
                          collectives_before=before, collectives_after=count_collectives(inputs.gm),
                          solve_result=solve_result, preset=prepared.preset)
