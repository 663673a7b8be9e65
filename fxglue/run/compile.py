"""Plans in a real ``torch.compile`` run: record the problems, solve them offline, use the plans.

    with bucketplan_compile.record("plans/"):      # 1. compile as usual; problems are written
        step(...)
    $ bucketplan solve-dir plans/                   # 2. offline, any machine
    with bucketplan_compile.use("plans/"):          # 3. compile again; our plans are applied
        step(...)

Why it hooks where it does: torch 2.13 runs its overlap scheduler (and the greedy bucketer at
its end) inside ``post_grad_passes``, after the user's ``post_grad_custom_post_pass``, and the
only supported place to change what happens to a post-grad graph is that custom pass (a
``CustomGraphPass``, whose ``uuid()`` is part of inductor's cache key). So inside ``record`` /
``use`` inductor's own overlap scheduling is switched off and our pass runs torch's scheduler
itself with the same inductor settings (``schedule_overlap_bucketing_from_inductor_configs``'s
keys), stops it before bucketing exactly as ``fxglue.pipeline`` does, extracts the problem, and
then either lets torch's own bucketer finish (``record``: compilation and bucketing are
torch's) or applies the plan found in the cache with ``apply_plan`` (``use``).

Plan directory::

    plan_dir/index.jsonl              one line per graph seen by record (graph id, rank, kind,
                                      fingerprint, collectives)
    plan_dir/<fingerprint>/problem.json
    plan_dir/<fingerprint>/greedy.json   torch's greedy bucket search on it, recorded
    plan_dir/<fingerprint>/plan.json     written by ``bucketplan solve-dir``

(``planner.plan_dir`` owns this layout and the offline solving.)

The fingerprint is the problem's content hash (graph, schedule, costs): the same program
compiled again, in another process, gives the same one; a changed model gives another, whose
plan is missing, so ``use`` warns and lets torch bucket (compilation never fails because of the
plan cache). Under ``record`` inductor's FX-graph and AOT-autograd caches are off (a cache hit
would skip the post-grad passes and record nothing); under ``use`` they stay as configured and
the pass's ``uuid()`` hashes every plan in the directory, so a new or changed plan is a new
cache key.

Differences from inductor's own call site: overlap scheduling and bucketing are on (that is what
there is to plan); the estimator is the named cluster preset's (as in ``bucketplan extract``);
``enable_fusion_regions`` is off (it needs triton) and ``fxglue.cpu_compat`` is active around the
scheduler (CPU); torch's ``overlap_scheduling_autofix_cycles`` is on, because torch's greedy
fails its own cycle check on DDP graphs (``experiments/torch_cycle_repro``) and a compile must
not fail where torch buckets.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.fx as fx
from torch._inductor.custom_graph_pass import CustomGraphPass

import planner
from planner.io import SchemaError
from planner.plan_dir import PLAN, PROBLEM, GREEDY, append_index, problem_dir

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
    """Handed out by ``record`` / ``use``: the directory and what happened to each graph."""

    plan_dir: Path | None  # None: unbucketed()
    mode: str
    events: list[GraphEvent] = field(default_factory=list)


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _graph_kind(graph: fx.Graph) -> str:
    names = [n.name for n in graph.find_nodes(op="placeholder")]
    return "backward" if any(n.startswith("tangents") for n in names) else "forward"


def _graph_id(graph: fx.Graph) -> str:
    from torch._guards import CompileContext

    cid = CompileContext.current_compile_id()
    return f"{cid if cid is not None else '?'}/{_graph_kind(graph)}"


def _n_collectives(gm: fx.GraphModule) -> int:
    from fxglue.pipeline import count_collectives

    return sum(count_collectives(gm).values())


def _scheduler_kwargs(estimator) -> dict:
    from torch._inductor import config

    opts = config.aten_distributed_optimizations
    kwargs = {k: v for k in _INDUCTOR_KEYS if (v := getattr(opts, k, None)) is not None}
    # inductor inserts overlap deps by default (post_grad.py), so that its scheduler keeps the order
    kwargs.setdefault("insert_overlap_deps", True)
    kwargs.update(collective_bucketing=True, custom_runtime_estimation=estimator, compute_estimator="analytical",
                  collective_estimator="analytical", enable_fusion_regions=False)
    return kwargs


def _plans_digest(plan_dir: Path) -> str:
    """One hash over every plan in the directory (name and bytes): the cache key part of ``use``."""
    h = hashlib.sha256()
    for p in sorted(plan_dir.glob(f"*/{PLAN}")):
        h.update(p.parent.name.encode())
        try:
            h.update(hashlib.sha256(p.read_bytes()).digest())
        except OSError:
            h.update(b"unreadable")
    return h.hexdigest()


class PlanPass(CustomGraphPass):
    """The post-grad pass behind ``record`` and ``use`` (see the module docstring)."""

    def __init__(self, session: Session, estimator, preset_name: str):
        self.session = session
        self.estimator = estimator
        self.preset_name = preset_name

    def uuid(self) -> str:
        h = hashlib.sha256()
        h.update(f"{self.session.mode}|{self.preset_name}|".encode())
        for f in ("compile.py", "apply.py", "extract.py", "estimator.py", "pipeline.py"):
            h.update(Path(__file__).with_name(f).read_bytes())
        if self.session.mode == "use":
            h.update(_plans_digest(self.session.plan_dir).encode())
        else:  # record writes files, unbucketed reports: never served from a cache (the caches are off too)
            h.update(str(time.time_ns()).encode())
        return h.hexdigest()

    def __call__(self, graph: fx.Graph) -> None:
        gm = graph.owning_module
        if not graph.find_nodes(op="call_function", target=torch.ops._c10d_functional.wait_tensor.default):
            return
        from fxglue.cpu_compat import cpu_compat
        from fxglue.extract import extract_problem
        from fxglue.pipeline import capture_bucketing_inputs, finalize_with_torch
        import torch._inductor.fx_passes.overlap_scheduling as overlap_scheduling

        before = _n_collectives(gm)
        est = self.estimator
        with cpu_compat(est), est.torch_topology(), capture_bucketing_inputs() as captured:
            overlap_scheduling.schedule_overlap_bucketing(gm, **_scheduler_kwargs(est))
        if len(captured) != 1:
            return  # the scheduler stopped early (nothing to bucket); it left the graph valid
        inputs = captured[0]
        bucketing = dict(max_bucket_memory_gb=inputs.kwargs.get("max_bucket_memory_gb", 2.0),
                         bucket_mode=inputs.kwargs.get("bucket_mode"))
        problem = extract_problem(graph, inputs.collective_info, inputs.scheduled, estimator=est,
                                  meta={"source": "torch.compile", "graph": _graph_id(graph), "preset": self.preset_name,
                                        "pre_bucketing": bool(inputs.kwargs.get("pre_bucketing_fsdp_collectives"))},
                                  **bucketing)
        event = GraphEvent(_graph_id(graph), _rank(), _graph_kind(graph), problem.fingerprint, before, before, "")
        with cpu_compat(est):
            if self.session.mode == "unbucketed":
                finalize_with_torch(inputs, collective_bucketing=False)
                event.outcome = "unbucketed"
            elif self.session.mode == "record":
                self._record(problem, inputs, bucketing, event)
                finalize_with_torch(inputs)
            else:
                self._use(problem, inputs, bucketing, event)
        gm.recompile()
        event.collectives_after = _n_collectives(gm)
        self.session.events.append(event)
        if self.session.mode == "record":
            append_index(self.session.plan_dir, {**asdict(event), "collectives": len(problem.collectives),
                                                 "nodes": len(problem.nodes)})

    def _record(self, problem: planner.Problem, inputs, bucketing: dict, event: GraphEvent) -> None:
        from fxglue.greedy import greedy_plan

        where = problem_dir(self.session.plan_dir, problem.fingerprint)
        if not (where / PROBLEM).exists():
            greedy = greedy_plan(inputs.gm.graph, inputs.collective_info, inputs.scheduled,
                                 problem_fingerprint=problem.fingerprint, estimator=self.estimator,
                                 **bucketing, **inputs.bucketer_kwargs)
            planner.save(greedy, where / GREEDY)
            planner.save(problem, where / PROBLEM)  # last: its presence means "recorded"
        event.outcome = "recorded"

    def _use(self, problem: planner.Problem, inputs, bucketing: dict, event: GraphEvent) -> None:
        """Apply the cached plan for this graph; anything that stops it (no plan, unreadable,
        another problem's, refused by ``apply_plan``'s verification and cycle check, which run
        before any mutation) is one warning, and torch's greedy buckets the graph instead."""
        from fxglue.apply import PlanError, apply_plan
        from fxglue.pipeline import finalize_with_torch

        path = problem_dir(self.session.plan_dir, problem.fingerprint) / PLAN
        why = None
        if not path.exists():
            recorded = sum(1 for _ in self.session.plan_dir.glob(f"*/{PROBLEM}"))
            why = (f"no plan in {self.session.plan_dir} for this graph ({recorded} recorded problem(s) there; "
                   "the model, its shapes or the preset changed since `record`? record and solve-dir again)")
        else:
            try:
                plan = planner.load_plan(path)
            except (SchemaError, OSError, ValueError) as e:
                why = f"{path}: unreadable plan ({str(e).splitlines()[0][:200]})"
            else:
                if plan.problem_fingerprint != problem.fingerprint:
                    why = f"{path} is for another problem (fingerprint {plan.problem_fingerprint[:12]}…)"
                else:
                    try:
                        apply_plan(inputs.gm.graph, inputs.collective_info, inputs.scheduled, plan, problem=problem,
                                   estimator=self.estimator,
                                   insert_overlap_deps=bool(inputs.kwargs.get("insert_overlap_deps")), **bucketing)
                        event.outcome = "planned"
                        return
                    except PlanError as e:
                        why = f"{path} fails verification ({e})"
        event.outcome = f"fallback: {why}"
        log.warning("bucketplan: %s graph %s (fingerprint %s…): %s; torch's greedy bucketing is used instead",
                    event.kind, event.graph, problem.fingerprint[:12], why)
        finalize_with_torch(inputs)


@contextlib.contextmanager
def _session(plan_dir, mode: str, preset: str, tp_group: str | None, tp_size: int):
    import torch._functorch.config as functorch_config
    from torch._inductor import config

    from fxglue.pipeline import preset_estimator

    session = Session(Path(plan_dir) if plan_dir is not None else None, mode)
    estimator = preset_estimator(preset, tp_group=tp_group, tp_size=tp_size)
    if config.post_grad_custom_post_pass is not None:
        raise PlanCacheError("inductor's post_grad_custom_post_pass is already set; bucketplan needs it "
                             "(nest your pass inside ours is not supported)")
    patch = {"post_grad_custom_post_pass": PlanPass(session, estimator, preset),
             "aten_distributed_optimizations.enable_overlap_scheduling": False,
             # torch's greedy fails its own cycle check on DDP graphs (experiments/torch_cycle_repro):
             # where torch buckets (record, and use's fallback) its own escape hatch keeps the compile alive
             "aten_distributed_optimizations.overlap_scheduling_autofix_cycles": True}
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


def record(plan_dir: str | os.PathLike, *, preset: str = "h100-8nodes", tp_group: str | None = None,
           tp_size: int = 1):
    """Context manager: ``torch.compile`` runs as usual (torch's scheduler and greedy bucketer);
    every post-grad graph with collectives is also written to ``plan_dir`` as a problem priced on
    ``preset``, with torch's greedy plan. ``tp_group``/``tp_size`` name the tensor-parallel group
    of a 2-D model (priced as the preset's in-node links)."""
    from fxglue.presets import get_preset

    get_preset(preset)  # unknown name: ValueError naming the presets, before anything compiles
    _writable_dir(plan_dir)
    return _session(plan_dir, "record", preset, tp_group, tp_size)


def unbucketed(*, preset: str = "h100-8nodes", tp_group: str | None = None, tp_size: int = 1):
    """Context manager: the same pass with torch's schedule kept and nothing merged -- the
    reference a plan's numbers are compared with (same order, same overlap dependencies, so
    inductor generates the same kernels but for bucketing's copies)."""
    from fxglue.presets import get_preset

    get_preset(preset)
    return _session(None, "unbucketed", preset, tp_group, tp_size)


def use(plan_dir: str | os.PathLike, *, preset: str = "h100-8nodes", tp_group: str | None = None, tp_size: int = 1):
    """Context manager: at the same hook, each graph's plan is looked up by fingerprint in
    ``plan_dir``, verified and applied; a missing, corrupt, foreign or infeasible plan logs one
    warning and torch's greedy bucketing runs instead. Give the same preset as ``record``."""
    from fxglue.presets import get_preset

    get_preset(preset)
    if not Path(plan_dir).is_dir():
        raise PlanCacheError(f"{plan_dir}: no such plan directory (run record, then bucketplan solve-dir)")
    return _session(plan_dir, "use", preset, tp_group, tp_size)
