"""Plans in a real ``torch.compile`` run: record the problems, solve them offline, use the plans.

    with bucketplan_compile.record("plans/"):      # 1. compile as usual; problems are written
        step(...)
    $ bucketplan solve-dir plans/                   # 2. offline, any machine
    with bucketplan_compile.use("plans/"):          # 3. compile again; our plans are applied
        step(...)

Two more contexts give the references a plan is measured against (``fxglue.run.bench``):
``unbucketed`` (torch's schedule, nothing merged) and ``manual`` (torch's manual per-block pass,
torchtitan's ``transformer_block_bucketing``, instead of torch's overlap scheduler).

Why it hooks where it does: torch 2.13 runs its overlap scheduler (and the greedy bucketer at
its end) inside ``post_grad_passes``, after the user's ``post_grad_custom_post_pass``, and the
only supported place to change what happens to a post-grad graph is that custom pass (a
``CustomGraphPass``, whose ``uuid()`` is part of inductor's cache key). So inside ``record`` /
``use`` inductor's own overlap scheduling is switched off and our pass runs torch's scheduler
itself with the same inductor settings (``schedule_overlap_bucketing_from_inductor_configs``'s
keys) through ``fxglue.pipeline.prepare``, the one way from a graph to a problem that
``bucketplan extract`` and the gloo check take too (schedule, stop before bucketing, extract,
record each collective's block and phase -- here from the graph's module stacks,
``fxglue.blocks``), and then either lets torch's own bucketer finish (``record``: compilation
and bucketing are torch's) or applies the plan found in the cache with ``apply_plan``
(``use``). Torch's FSDP pre-bucketing, which runs inside its scheduler before the graph is
handed on, is off in all three contexts: it would merge collectives before the problem is
extracted, so the search would not see them and ``unbucketed`` would not be free of merges.
``record``'s bucketing is thus torch's greedy bucketer alone, not its default pipeline.

Plan directory::

    plan_dir/index.jsonl              one line per graph seen by record (graph id, rank, kind,
                                      fingerprint, collectives)
    plan_dir/<fingerprint>/problem.json
    plan_dir/<fingerprint>/greedy.json   torch's greedy bucket search on it, recorded
    plan_dir/<fingerprint>/plan.json     written by ``bucketplan solve-dir``

(``planner.jobs.plan_dir`` owns this layout and the offline solving.)

The fingerprint is the problem's content hash (graph, schedule, costs): the same program
compiled again, in another process, gives the same one; a changed model gives another, whose
plan is missing, so ``use`` warns and lets torch bucket (compilation never fails because of the
plan cache). Under ``record`` inductor's FX-graph and AOT-autograd caches are off (a cache hit
would skip the post-grad passes and record nothing); under ``use`` they stay as configured and
the pass's ``uuid()`` hashes every plan in the directory, the preset and TP layout, and the
source of the ``planner`` and ``fxglue`` packages, so a new or changed plan or bucketplan is a
new cache key.

``manual`` runs torch's ``manual_overlap_bucketing`` at the same hook, as torchtitan's inductor
backend does for ``transformer_block_bucketing`` (there it is the ``post_grad_custom_post_pass``
itself, with ``insert_overlap_deps=True``). torchtitan names the blocks from its model; the pass
here has only the graph, so each collective's block comes from its node's module stack
(``fxglue.blocks.compiled_graph_blocks``: the blocks ``transformer_block_plans`` names, and the
modules before and after them), and the graph's blocks are the pass's ``module_bucket_plans``.
Torch's pass runs without its overlap dependencies, the problem of the order it leaves is
extracted as ``fxglue.manual`` extracts it for ``bucketplan compare`` (torch's bookkeeping replayed
over that order, so ``planner.simulate(problem, None)`` prices torch's manual plan), and then
the same dependencies torch would have inserted are inserted; with inductor's peak-memory and
compute-communication reorderings off, as torchtitan sets them for this pass, inductor keeps
that order (without that it moved a gather's wait ahead of seven matmuls).

Differences from inductor's own call site: overlap scheduling and bucketing are on (that is what
there is to plan); the estimator is the named cluster preset's (as in ``bucketplan extract``);
``enable_fusion_regions`` is off (it needs triton) and ``fxglue.cpu_compat`` is active around the
scheduler (CPU); torch's ``overlap_scheduling_autofix_cycles`` is on, because torch's greedy
fails its own cycle check on DDP graphs (``experiments/torch_cycle_repro``) and a compile must
not fail where torch buckets.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import logging
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.fx as fx
from torch._inductor.custom_graph_pass import CustomGraphPass

import planner
from planner.core.io import MAX_FILE_BYTES, BadFileError, SchemaError, read_regular_file
from planner.jobs.plan_dir import PLAN, PROBLEM, GREEDY, append_index, problem_dir

log = logging.getLogger("bucketplan.compile")

# inductor's own overlap-scheduling settings, read as schedule_overlap_bucketing_from_inductor_configs
# reads them; the estimators and fusion regions are ours (see the module docstring)
_INDUCTOR_KEYS = ("collective_bucketing", "max_compute_pre_fetch", "insert_overlap_deps", "max_memory_increase_gb",
                  "max_memory_increase_ratio", "compute_overlap_multipler", "max_in_flight_gb", "max_coll_distance",
                  "bucket_exposed_first", "bucket_only_internode_comms", "prioritize_bucketing_during_scheduling",
                  "bucket_mode", "pre_bucketing_fsdp_collectives", "pre_bucketing_fsdp_collectives_bucket_cap_mb")


class PlanCacheError(ValueError):
    """The plan directory cannot be used as asked (raised when the context is entered)."""


@dataclass
class GraphEvent:
    """What the pass did with one post-grad graph on this rank."""

    graph: str
    rank: int
    kind: str
    fingerprint: str
    collectives_before: int
    collectives_after: int
    outcome: str  # "recorded", "planned", or "fallback: <why>"


@dataclass
class Session:
    """Handed out by ``record`` / ``use`` / ``unbucketed`` / ``manual``: the directory, what
    happened to each graph, and each graph's problem by fingerprint (what ``fxglue.run.bench``
    simulates: ``unbucketed`` and ``manual`` write none to disk)."""

    plan_dir: Path | None  # None: unbucketed() and manual()
    mode: str
    events: list[GraphEvent] = field(default_factory=list)
    problems: dict[str, "planner.Problem"] = field(default_factory=dict)


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _graph_kind(graph: fx.Graph) -> str:
    from fxglue.blocks import compiled_graph_phase, is_compiled_graph

    # a make_fx trace of forward, loss and backward in one graph (torchtitan's graph_trainer,
    # ``graph_pass``): not AOT autograd's, and autograd marked its backward nodes
    if not is_compiled_graph(graph) and any(n.meta.get("autograd_backward") for n in graph.nodes):
        return "joint"
    return compiled_graph_phase(graph)


def _graph_id(graph: fx.Graph) -> str:
    from torch._guards import CompileContext

    cid = CompileContext.current_compile_id()
    return f"{cid if cid is not None else '?'}/{_graph_kind(graph)}"


def _n_collectives(gm: fx.GraphModule) -> int:
    from fxglue.pipeline import count_collectives

    return sum(count_collectives(gm).values())


# torch's FSDP pre-bucketing inside record/use/unbucketed (torch's default: on): off, because it
# would merge all_gathers and reduce_scatters before the scheduler hands the graph on, so the
# recorded problem would hide them from the search and `unbucketed` would not be free of merges
# (README, "Use a plan in training")
_PRE_BUCKETING = False


def _bucket_mode():
    """Inductor's ``bucket_mode`` setting (None: torch's default for the graph)."""
    from torch._inductor import config

    return getattr(config.aten_distributed_optimizations, "bucket_mode", None)


def _scheduler_kwargs() -> dict:
    """Inductor's overlap-scheduling settings as torch's scheduler takes them, but for what
    ``fxglue.pipeline.schedule`` sets itself (the estimator, pre-bucketing, the bucket mode)."""
    from torch._inductor import config

    opts = config.aten_distributed_optimizations
    own = ("bucket_mode", "pre_bucketing_fsdp_collectives")
    kwargs = {k: v for k in _INDUCTOR_KEYS if k not in own and (v := getattr(opts, k, None)) is not None}
    # inductor inserts overlap deps by default (post_grad.py), so that its scheduler keeps the order
    kwargs.setdefault("insert_overlap_deps", True)
    kwargs.update(collective_bucketing=True, compute_estimator="analytical", collective_estimator="analytical",
                  enable_fusion_regions=False)
    return kwargs


def post_grad_workload(gm: fx.GraphModule, graph_id: str = "?") -> "TracedWorkload":
    """A post-grad graph as ``fxglue.pipeline.prepare`` takes a traced step. No fake mode is
    entered around it (inductor runs its post-grad passes without one) and no process groups are
    named (the estimator is given); its blocks come from its nodes (``fxglue.blocks``)."""
    from fxglue.models.base import TracedWorkload

    return TracedWorkload(name=f"torch.compile {graph_id}", gm=gm, fake_mode=contextlib.nullcontext(), groups=None,
                          trace_s=0.0, meta={"source": "torch.compile", "graph": graph_id})


def _plans_digest(plan_dir: Path) -> str:
    """One hash over every plan in the directory (name and bytes): the cache key part of ``use``.
    Read through ``read_regular_file``: a FIFO would block the compile, a link to a device would
    read without end (``_use`` then reports such a plan as unreadable)."""
    h = hashlib.sha256()
    for p in sorted(plan_dir.glob(f"*/{PLAN}")):
        h.update(p.parent.name.encode())
        try:
            h.update(hashlib.sha256(read_regular_file(p, MAX_FILE_BYTES, "plan file")).digest())
        except BadFileError as e:
            h.update(f"unreadable: {e}".encode())
    return h.hexdigest()


# What the pass's output depends on besides the graph, the preset and the plans: the code of
# bucketplan's two packages (extraction, pricing, torch's bucketing as we drive it, apply_plan,
# the verifier). Found through the imported packages themselves, not by file names beside this
# one: a file moved or added within them changes the key, and none can be missing.
_CODE_PACKAGES = ("planner", "fxglue")


@functools.lru_cache(maxsize=None)
def _source_digest(packages: tuple[str, ...] = _CODE_PACKAGES) -> str:
    """One hash over the source of every module of ``packages`` (path within the package and
    bytes), computed once per process."""
    h = hashlib.sha256()
    for name in packages:
        package = importlib.import_module(name)
        for root in package.__path__:
            for path in sorted(Path(root).rglob("*.py")):
                h.update(f"{name}/{path.relative_to(root).as_posix()}".encode())
                h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


class PlanPass(CustomGraphPass):
    """The post-grad pass behind ``record`` and ``use`` (see the module docstring)."""

    def __init__(self, session: Session, estimator, preset_name: str, tp_group: str | None = None, tp_size: int = 1):
        self.session = session
        self.estimator = estimator
        self.preset_name = preset_name
        self.layout = f"tp {tp_group or '-'} x{tp_size}"  # prices the groups, so picks the plan too

    def uuid(self) -> str:
        h = hashlib.sha256()
        h.update(f"{self.session.mode}|{self.preset_name}|{self.layout}|{_source_digest()}|".encode())
        if self.session.mode == "use":
            h.update(_plans_digest(self.session.plan_dir).encode())
        else:  # record writes files, unbucketed reports: never served from a cache (the caches are off too)
            h.update(str(time.time_ns()).encode())
        return h.hexdigest()

    def __call__(self, graph: fx.Graph) -> None:
        gm = graph.owning_module
        if not graph.find_nodes(op="call_function", target=torch.ops._c10d_functional.wait_tensor.default):
            return
        if self.session.mode == "manual":
            self._manual(gm)
            return
        from fxglue.cpu_compat import cpu_compat
        from fxglue.pipeline import NotScheduled, PipelineOptions, finalize_with_torch, prepare

        before = _n_collectives(gm)
        est = self.estimator
        try:
            prepared = prepare(post_grad_workload(gm, _graph_id(graph)),
                               pipeline=PipelineOptions(pre_bucketing=_PRE_BUCKETING, bucket_mode=_bucket_mode(),
                                                        estimator=est), scheduler_kwargs=_scheduler_kwargs(),
                               meta={"preset": self.preset_name}, greedy=False)
        except NotScheduled:
            return  # the scheduler stopped early (nothing to bucket); it left the graph valid
        problem, inputs = prepared.problem, prepared.inputs
        self.session.problems[problem.fingerprint] = problem
        event = GraphEvent(_graph_id(graph), _rank(), _graph_kind(graph), problem.fingerprint, before, before, "")
        with cpu_compat(est):
            if self.session.mode == "unbucketed":
                finalize_with_torch(inputs, collective_bucketing=False)
                event.outcome = "unbucketed"
            elif self.session.mode == "record":
                self._record(prepared, event)
                finalize_with_torch(inputs)
            else:
                self._use(prepared, event)
        gm.recompile()
        event.collectives_after = _n_collectives(gm)
        self.session.events.append(event)
        if self.session.mode == "record" and event.outcome == "recorded":
            try:
                append_index(self.session.plan_dir, {**asdict(event), "collectives": len(problem.collectives),
                                                     "nodes": len(problem.nodes)})
            except (OSError, ValueError) as e:  # the index is informative; the problem is recorded
                log.warning("bucketplan: %s: cannot append to the index (%s)", self.session.plan_dir,
                            _one_line(e))

    def _manual(self, gm: fx.GraphModule) -> None:
        """Torch's manual per-block pass on this graph, its problem extracted, its order pinned
        (the module docstring). A graph whose problem cannot be extracted still runs torch's
        pass: the event says why it is not priced."""
        import torch.nn as nn
        import torch._inductor.fx_passes.overlap_manual_scheduling as oms
        from torch._inductor.fx_passes.control_dependencies import preserve_node_ordering

        from fxglue.blocks import compiled_graph_blocks
        from fxglue.cpu_compat import cpu_compat
        from fxglue.manual import MANUAL_BUCKET_MODE, fixed_order_problem

        graph = gm.graph
        before = _n_collectives(gm)
        labels = compiled_graph_blocks(graph)
        block = {n: labels[n.name][0] for n in graph.nodes if n.name in labels}
        plans = list(dict.fromkeys(block.values()))  # each block once, in graph order

        def module_stack_fn(node: fx.Node) -> list:
            return [(block[node], nn.Module)] if node in block else []

        deps: dict = {}
        move = oms._move_overlap_nodes

        def keep_deps(g, overlap_deps, node_types):  # the dependencies torch would insert
            deps.update(overlap_deps)
            return move(g, overlap_deps, node_types)

        oms._move_overlap_nodes = keep_deps
        try:
            with cpu_compat(self.estimator):
                oms.manual_overlap_bucketing(gm, plans, insert_overlap_deps=False, module_stack_fn=module_stack_fn,
                                             bucket_mode=MANUAL_BUCKET_MODE)
        finally:
            oms._move_overlap_nodes = move
        graph_id = _graph_id(graph)
        event = GraphEvent(graph_id, _rank(), _graph_kind(graph), "", before, before, "manual")
        try:
            with cpu_compat(self.estimator):
                problem, _ = fixed_order_problem(post_grad_workload(gm, graph_id), self.estimator,
                                                 bucket_mode=MANUAL_BUCKET_MODE,
                                                 meta={"preset": self.preset_name,
                                                       "manual_bucketing": {"module_bucket_plans": plans}})
        except Exception as e:  # torch's pass has run: the graph compiles as it left it, unpriced
            event.outcome = f"manual (not priced: {_one_line(e)})"
            log.warning("bucketplan: %s graph %s: torch's manual pass ran, its problem was not extracted: %s",
                        event.kind, graph_id, _one_line(e))
        else:
            event.fingerprint = problem.fingerprint
            self.session.problems[problem.fingerprint] = problem
        if deps:
            preserve_node_ordering(graph, deps)
        gm.recompile()
        event.collectives_after = _n_collectives(gm)
        self.session.events.append(event)

    def _record(self, prepared, event: GraphEvent) -> None:
        """Write the problem and torch's greedy plan on it, once per fingerprint. A directory that
        cannot take them (a file where the problem's folder goes, a full disk) is one warning:
        compilation goes on with torch's bucketing, as it would without ``record``."""
        problem = prepared.problem
        try:
            where = problem_dir(self.session.plan_dir, problem.fingerprint)
            if not (where / PROBLEM).is_file():
                greedy = prepared.record_greedy()
                planner.save(greedy, where / GREEDY)
                planner.save(problem, where / PROBLEM)  # last: its presence means "recorded"
        except (OSError, ValueError) as e:
            event.outcome = f"not recorded: {_one_line(e)}"
            log.warning("bucketplan: %s graph %s (fingerprint %s…): not recorded: %s", event.kind, event.graph,
                        problem.fingerprint[:12], _one_line(e))
            return
        event.outcome = "recorded"

    def _use(self, prepared, event: GraphEvent) -> None:
        """Apply the cached plan for this graph; anything that stops it (no plan directory, no
        plan, unreadable, another problem's, refused by ``apply_plan``'s verification and cycle
        check, which run before any mutation) is one warning, and torch's greedy buckets the graph
        instead."""
        from fxglue.apply import PlanError, apply_plan
        from fxglue.pipeline import finalize_with_torch

        problem, inputs = prepared.problem, prepared.inputs
        why = _unusable_dir(self.session.plan_dir)
        path = None
        if why is None:
            try:
                path = problem_dir(self.session.plan_dir, problem.fingerprint) / PLAN
            except (OSError, ValueError) as e:  # a file where the problem's folder goes
                why = _one_line(e)
        if why is None and not os.path.lexists(path):
            recorded = sum(1 for _ in self.session.plan_dir.glob(f"*/{PROBLEM}"))
            why = (f"no plan in {self.session.plan_dir} for this graph ({recorded} recorded problem(s) there; "
                   "the model, its shapes or the preset changed since `record`? record and solve-dir again)")
        if why is None:
            try:
                plan = planner.load_plan(path)  # a regular file of bounded size (planner.core.io)
            except (SchemaError, OSError, ValueError) as e:
                why = f"{path}: unreadable plan ({_one_line(e)})"
            else:
                if plan.problem_fingerprint != problem.fingerprint:
                    why = f"{path} is for another problem (fingerprint {plan.problem_fingerprint[:12]}…)"
                else:
                    try:
                        apply_plan(inputs.gm.graph, inputs.collective_info, inputs.scheduled, plan, problem=problem,
                                   estimator=self.estimator,
                                   insert_overlap_deps=bool(inputs.kwargs.get("insert_overlap_deps")),
                                   max_bucket_memory_gb=prepared.max_bucket_memory_gb,
                                   bucket_mode=prepared.bucket_mode)
                        event.outcome = "planned"
                        return
                    except PlanError as e:
                        why = f"{path} fails verification ({e})"
        event.outcome = f"fallback: {why}"
        log.warning("bucketplan: %s graph %s (fingerprint %s…): %s; torch's greedy bucketing is used instead",
                    event.kind, event.graph, problem.fingerprint[:12], why)
        finalize_with_torch(inputs)


def _one_line(error: BaseException) -> str:
    text = str(error).strip()
    return (text.splitlines()[0] if text else type(error).__name__)[:200]


def _unusable_dir(plan_dir: Path) -> str | None:
    """Why ``use`` cannot read plans from ``plan_dir`` (missing, not a directory, unlistable), or None."""
    try:
        if not plan_dir.is_dir():
            return (f"no plan directory {plan_dir} ({'not a directory' if plan_dir.exists() else 'missing'}; "
                    "run record, then bucketplan solve-dir)")
        os.listdir(plan_dir)
    except OSError as e:
        return f"plan directory {plan_dir} cannot be read ({e.strerror or e})"
    return None


def check_plan_dir(plan_dir: str | os.PathLike) -> None:
    """Refuse a plan directory ``use`` cannot read plans from (missing, not a directory,
    unlistable), for a front end that names the mistake before anything compiles: ``use`` itself
    only warns per graph, and inductor's cache, serving a graph compiled earlier, can hide even that."""
    why = _unusable_dir(Path(plan_dir))
    if why is not None:
        raise PlanCacheError(why)


def graph_pass(mode: str, plan_dir: str | os.PathLike | None = None, *, preset: str = "h100-8nodes",
               tp_group: str | None = None, tp_size: int = 1, collectives=()) -> PlanPass:
    """The pass of ``record`` / ``use`` / ``unbucketed`` (``mode``) alone, for a compiler that calls
    its graph passes itself (torchtitan's graph_trainer: ``fxglue.run.titan``); call it on a graph
    (``pass(gm.graph)``) with torch's ``overlap_scheduling_autofix_cycles`` on, as the contexts set
    it. Checked as the contexts check: an unknown preset or bad ``collectives`` file, or (record) a
    directory that cannot take problems, raises ``ValueError`` here."""
    from fxglue.pipeline import preset_estimator

    if mode not in ("record", "use", "unbucketed"):
        raise PlanCacheError(f"unknown mode {mode!r}: record, use or unbucketed")
    if plan_dir is None and mode != "unbucketed":
        raise PlanCacheError(f"{mode} needs a plan directory")
    resolved = _resolved(preset, collectives)
    if mode == "record":
        _writable_dir(plan_dir)
    session = Session(Path(plan_dir) if mode != "unbucketed" else None, mode)
    return PlanPass(session, preset_estimator(resolved, tp_group=tp_group, tp_size=tp_size), resolved.name, tp_group,
                    tp_size)


@contextlib.contextmanager
def _session(plan_dir, mode: str, preset, tp_group: str | None, tp_size: int):
    import torch._functorch.config as functorch_config
    from torch._inductor import config

    from fxglue.pipeline import preset_estimator

    session = Session(Path(plan_dir) if plan_dir is not None else None, mode)
    estimator = preset_estimator(preset, tp_group=tp_group, tp_size=tp_size)
    if config.post_grad_custom_post_pass is not None:
        raise PlanCacheError("inductor's post_grad_custom_post_pass is already set; bucketplan needs it "
                             "(nest your pass inside ours is not supported)")
    patch = {"post_grad_custom_post_pass": PlanPass(session, estimator, preset.name, tp_group, tp_size),
             "aten_distributed_optimizations.enable_overlap_scheduling": False,
             # torch's greedy fails its own cycle check on DDP graphs (experiments/torch_cycle_repro):
             # where torch buckets (record, and use's fallback) its own escape hatch keeps the compile alive
             "aten_distributed_optimizations.overlap_scheduling_autofix_cycles": True}
    if mode == "manual":  # as torchtitan sets them for this pass: inductor keeps the order it leaves
        patch.update({"reorder_for_peak_memory": False, "reorder_for_compute_comm_overlap": False})
    caches = contextlib.nullcontext()
    if mode != "use":
        patch["fx_graph_cache"] = False
        caches = functorch_config.patch(enable_autograd_cache=False)
    with config.patch(patch), caches:
        yield session


def _writable_dir(plan_dir) -> Path:
    path = Path(plan_dir)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".bucketplan-write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise PlanCacheError(f"{path}: cannot record plans there ({e.strerror or e})") from None
    return path


def _resolved(preset: str, collectives, profile=None, profile_cpu: bool = False) -> "Preset":
    """The named preset, priced by the measured ``collectives`` files where they cover a group and
    by a ``profile`` trace (``fxglue.profile``; ``profile_cpu``: a trace of a CPU run) where it has
    times; an unknown name or a bad file raises ValueError, before anything compiles."""
    from fxglue.presets import get_preset, with_measurements

    resolved = with_measurements(get_preset(preset), collectives)
    if profile:
        from fxglue.profile import with_profile

        resolved = with_profile(resolved, profile, cpu=profile_cpu)
    return resolved


def record(plan_dir: str | os.PathLike, *, preset: str = "h100-8nodes", tp_group: str | None = None,
           tp_size: int = 1, collectives=(), profile=None, profile_cpu: bool = False):
    """Context manager: ``torch.compile`` runs as usual (torch's scheduler and greedy bucketer);
    every post-grad graph with collectives is also written to ``plan_dir`` as a problem priced on
    ``preset``, with torch's greedy plan. ``tp_group``/``tp_size`` name the tensor-parallel group
    of a 2-D model (priced as the preset's in-node links). ``collectives``: measured collective
    files (nccl-tests output or CSV, ``planner.cost.measured``) that price the groups they cover.
    ``profile``: a Chrome trace of the step (``torch.profiler``, ``record_shapes=True``; e.g. one
    ``fxglue.run.bench`` wrote) whose op and collective times price what it timed
    (``fxglue.profile``); ``profile_cpu``: it is a trace of a CPU run (its ops' CPU times)."""
    resolved = _resolved(preset, collectives, profile, profile_cpu)
    _writable_dir(plan_dir)
    return _session(plan_dir, "record", resolved, tp_group, tp_size)


def unbucketed(*, preset: str = "h100-8nodes", tp_group: str | None = None, tp_size: int = 1, collectives=(),
               profile=None, profile_cpu: bool = False):
    """Context manager: the same pass with torch's schedule kept and nothing merged -- the
    reference a plan's numbers are compared with (same order, same overlap dependencies, so
    inductor generates the same kernels but for bucketing's copies)."""
    return _session(None, "unbucketed", _resolved(preset, collectives, profile, profile_cpu), tp_group, tp_size)


def manual(*, preset: str = "h100-8nodes", tp_group: str | None = None, tp_size: int = 1, collectives=(),
           profile=None, profile_cpu: bool = False):
    """Context manager: torch's manual per-block pass (``manual_overlap_bucketing``, torchtitan's
    ``transformer_block_bucketing``) instead of torch's overlap scheduler, one bucket per block and
    collective kind, the next block's all_gather prefetched and reduce_scatter waits deferred; it
    buckets FSDP all_gathers and reduce_scatters only (never all_reduce). Each graph's problem,
    priced on ``preset``, is kept in the session (the module docstring)."""
    return _session(None, "manual", _resolved(preset, collectives, profile, profile_cpu), tp_group, tp_size)


def use(plan_dir: str | os.PathLike, *, preset: str = "h100-8nodes", tp_group: str | None = None, tp_size: int = 1,
        collectives=(), profile=None, profile_cpu: bool = False):
    """Context manager: at the same hook, each graph's plan is looked up by fingerprint in
    ``plan_dir``, verified and applied; a missing, corrupt, foreign or infeasible plan logs one
    warning and torch's greedy bucketing runs instead. Give the same preset, ``collectives`` and
    ``profile`` as ``record`` (they price each graph, so they are part of its fingerprint)."""
    resolved = _resolved(preset, collectives, profile, profile_cpu)
    # a missing or unreadable directory is not an error here: like a missing plan, each graph
    # warns once and torch buckets it (compilation never fails because of the plan cache)
    return _session(plan_dir, "use", resolved, tp_group, tp_size)
