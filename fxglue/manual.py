"""Torch's manual per-module bucketing (one bucket per transformer block) as a baseline.

Why this exists: besides its greedy search, torch 2.13 ships a *manual* bucketing pass,
``torch/_inductor/fx_passes/overlap_manual_scheduling.py: manual_overlap_bucketing(gm,
module_bucket_plans, ...)``. SimpleFSDP users turn it on in torchtitan with
``compile.graph_passes = "transformer_block_bucketing"``; torchtitan then passes
``get_transformer_block_buckets(model)`` = ``[tok_embeddings, [norm, output], layers.0, ...,
layers.N-1]`` and runs the pass on the forward graph and on the backward graph separately
(``fw_compiler`` / ``bw_compiler`` of AOT autograd), *instead of* the overlap scheduler. One
bucket per block per collective kind is also what FSDP2's ``fully_shard`` per block amounts
to. This module runs that pass, unchanged, on our traced graph and extracts a ``Problem``
from the result, so ``planner.simulate(problem, None)`` is the step time of torch's manual
plan, priced by the same simulator as every other row of ``bucketplan compare`` (with the
caveat on merge nodes below).

What torch's pass does (read from the torch 2.13 source):

1. ``_manual_bucket_collectives``: for each entry of ``module_bucket_plans`` it takes the
   graph nodes whose module stack lies under that FQN (``graph_view.make_graph_view``), keeps
   the collectives that are FSDP all_gathers (``is_fsdp_all_gather``: derived from exactly one
   placeholder) or FSDP reduce_scatters (``is_fsdp_reduce_scatter``: flowing to the output
   through unary ops), groups them by ``get_full_bucket_key(node, "custom_ops")`` and merges
   each group into one collective (``merge_all_gather_bucket`` right after the first member,
   waited at the earliest member wait; ``merge_reduce_scatter_bucket`` right after the last
   member). **all_reduce is never bucketed** (DDP gradients, TP activations stay as they are).
2. ``_manual_reorder_graph``: prefetches the next module's all_gather bucket before the
   current one's wait, and defers each reduce_scatter bucket's wait past the next bucket's
   start (``_move_overlap_nodes`` moves nodes in the graph). No runtime estimates are used.

How we run it here, and each adaptation:

- **Module names.** ``make_fx`` records no ``nn_module_stack`` (measured: the traced nodes
  carry only ``val``, ``tensor_meta`` and ``eager_input_vals``), and backward nodes would not
  have it anyway outside AOT autograd. Torch's pass takes a ``module_stack_fn`` for exactly
  this case; ours maps each collective to the parameter it moves: an all_gather to the one
  placeholder it derives from (torch's own FSDP criterion), a reduce_scatter / all_reduce to
  the gradient output it flows to, and the parameter to its owning module's FQN (parameter
  ``i`` of the module is placeholder ``i`` and gradient output ``1 + i``, by
  ``parallel.make_train_step``). Every other node gets no module, which only matters for
  collectives: compute nodes are never bucketed.
- **Forward and backward separately.** Our graph is the joint forward+backward step. Run
  once on it, the pass would merge a block's forward all_gathers with its backward
  re-gathers into one bucket (same key), i.e. keep the gathered block alive from forward to
  backward -- not what torchtitan does. So the pass runs twice, as torchtitan runs it on its two
  graphs: first with only forward collectives labelled (the ancestors of the loss), then with
  only backward ones. Each run has its own bucketer, so its reordering sees only its own
  buckets (torch keeps ``bucketed_node_types`` per instance for this very case).
  One line of the reordering assumes a graph of one phase: the first all_gather bucket of the
  graph is made a dependency of the graph's *first compute node* (``last_compute`` in the
  reverse walk), hoisting it to the top of the graph. In the backward run on a joint graph
  that node is the first *forward* compute, so the backward's first gather would be issued
  before the forward even starts. While the backward run is active, ``is_compute_node`` as
  seen by ``overlap_manual_scheduling`` is therefore restricted to backward nodes (and to
  forward nodes in the forward run) -- the only patch, undone on exit. ``phase_local=False``
  skips it (torch's code as is on the joint graph).
- **Final order.** In torchtitan the pass replaces the overlap scheduler; with inductor,
  ``insert_overlap_deps=True`` pins the graph order. We run with ``insert_overlap_deps=False``
  (no control-dependency nodes in the graph) and take the resulting graph order as the final
  schedule, which is what those dependencies enforce.
- **Extraction.** ``extract_problem`` needs what torch's bucketer receives:
  ``collective_info`` (estimates, exposed time, hiding nodes) and the schedule. The manual
  pass computes none of that (its estimates are zero). We build torch's ``OverlapScheduler``
  on the bucketed graph with our estimator (as ``fxglue.pipeline.schedule`` does) and, instead
  of letting it reorder, replay the fixed graph order through its own bookkeeping
  (``_handle_collective_start`` / ``_handle_compute_or_other`` / ``_handle_wait``, with its
  pulling of further collectives disabled). So hiding nodes and exposed times are torch's
  accounting of *this* order. ``planner.simulate`` does not use them (it prices positions,
  sizes and compute estimates); they matter only if a planner is run on this problem.

Since the pass replaces the overlap scheduler, a collective it does not bucket keeps its
traced position: the wait right after the start. So on DDP (nothing bucketed) the problem is the
traced graph in traced order, every all_reduce exposed -- what the pass gives a DDP graph, not
what torch's overlap scheduler would.

The problem's collectives are the buckets torch built, so ``simulate(problem, None)`` prices
torch's manual plan, and ``planner.simulate(problem, plan)`` with any other plan would price a
*further* bucketing on top of it. The copies torch's merge inserts (``_pre_bucket_*``,
``split``/``cat``) are ordinary graph nodes: like the rest of non-compute work (and like the
pre-bucketed default pipeline's row) they are not pinned and cost nothing in the simulator.

For a problem that needs no torch pass (e.g. to plan DDP's all_reduces per block, which torch's
pass leaves alone), ``per_block_plan`` builds the equivalent plan on our own scheduled
problem: one bucket per (block, phase, bucket key), verified and repaired if it breaks a rule.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import torch.fx as fx
import torch.nn as nn

import planner
from fxglue.blocks import (loss_ancestors, module_of, block_owner, plan_index, block_of_collectives,  # noqa: F401
                           block_source, collective_params, parameter_names, transformer_block_plans)
from fxglue.cpu_compat import cpu_compat
from fxglue.estimator import Estimator, collective_kind
from fxglue.graph_order import fixed_order_inputs

MANUAL_BUCKET_MODE = "custom_ops"  # ManualOverlapScheduler's default ("historically custom_ops")


# ---------------------------------------------------------------------------------------
# Which module owns each collective
# ---------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------
# Running torch's pass
# ---------------------------------------------------------------------------------------


@dataclass
class ManualBucket:
    """One collective of the graph after torch's pass (a merged bucket or a lone collective)."""

    name: str  # start node
    kind: str
    phase: str  # "forward" | "backward"
    plan: int | None  # index into module_bucket_plans, None: in no plan
    params: tuple[str, ...]  # parameters it moves (all members' for a bucket)

    @property
    def merged(self) -> bool:
        return len(self.params) > 1


@dataclass
class ManualInfo:
    """What torch's manual pass did and what the problem was extracted from."""

    module_bucket_plans: list[list[str] | str]
    phase_local: bool
    collectives_before: dict[str, int]
    collectives_after: dict[str, int]
    buckets: list[ManualBucket]
    replay_forced_waits: int  # waits torch's FIFO bookkeeping had to bring forward (0 expected)
    merge_nodes: set[str] = field(default_factory=set)  # nodes torch's merges added (copies, views)
    merge_nodes_ms: float = 0.0  # their estimates on the problem's compute stream
    timings: dict[str, float] = field(default_factory=dict)

    def count(self, *, kind: str | None = None, phase: str | None = None, plan: int | None = None,
              merged: bool | None = None) -> int:
        return sum(1 for b in self.buckets if (kind is None or b.kind == kind) and (phase is None or b.phase == phase)
                   and (plan is None or b.plan == plan) and (merged is None or b.merged == merged))

    def summary(self) -> dict[str, Any]:
        by = Counter((b.phase, b.kind, "merged" if b.merged else "alone") for b in self.buckets)
        return {"plans": len(self.module_bucket_plans), "before": sum(self.collectives_before.values()),
                "after": sum(self.collectives_after.values()),
                "by_phase_kind": {"/".join(k): v for k, v in sorted(by.items())},
                "replay_forced_waits": self.replay_forced_waits,
                "merge_nodes_ms": round(self.merge_nodes_ms, 3), **self.timings}


@contextlib.contextmanager
def _compute_nodes_restricted_to(nodes: set[fx.Node] | None):
    """``is_compute_node`` as seen by the manual pass, limited to one phase's nodes."""
    import torch._inductor.fx_passes.overlap_manual_scheduling as oms

    if nodes is None:
        yield
        return
    original = oms.is_compute_node
    oms.is_compute_node = lambda n: n in nodes and original(n)
    try:
        yield
    finally:
        oms.is_compute_node = original


def run_manual_pass(traced, plans: list[list[str] | str] | None = None, *, estimator: Estimator | None = None,
                    param_names: list[str] | None = None, phase_local: bool = True) -> ManualInfo:
    """Run torch's ``manual_overlap_bucketing`` on ``traced.gm`` in place, forward then backward.

    ``plans``: module FQN entries as torchtitan passes them (default: ``transformer_block_plans``
    of the workload's module). Returns what it did; ``traced.gm`` is left bucketed and reordered.
    """
    from torch._inductor.fx_passes.bucketing import _schedulable_wait_node
    from torch._inductor.fx_passes.overlap_manual_scheduling import manual_overlap_bucketing

    from fxglue.pipeline import count_collectives, estimator_for

    t0 = time.perf_counter()
    estimator = estimator or estimator_for(traced)
    if param_names is None or plans is None:
        # those recorded with the trace (a torchtitan workload has no module to rebuild), else the module's
        names, blocks = block_source(traced)
        param_names = param_names or names
        plans = plans if plans is not None else blocks
    gm = traced.gm
    before = count_collectives(gm)
    names_before = {n.name for n in gm.graph.nodes}
    timings = {"prepare_s": time.perf_counter() - t0}

    for phase in ("forward", "backward"):
        t0 = time.perf_counter()
        graph = gm.graph
        fwd = loss_ancestors(graph)
        phase_nodes = fwd if phase == "forward" else set(graph.nodes) - fwd
        owners = {s: block_owner(p[0]) for s, p in collective_params(graph, param_names).items()
                  if len(p) == 1 and s in phase_nodes}

        def module_stack_fn(node: fx.Node, owners=owners) -> list[tuple[str, type]]:
            owner = owners.get(node)
            return [(owner, nn.Module)] if owner else []

        with cpu_compat(estimator), traced.fake_mode, \
                _compute_nodes_restricted_to(phase_nodes if phase_local else None):
            manual_overlap_bucketing(gm, plans, insert_overlap_deps=False, module_stack_fn=module_stack_fn,
                                     bucket_mode=MANUAL_BUCKET_MODE)
        timings[f"{phase}_pass_s"] = time.perf_counter() - t0

    graph = gm.graph
    fwd = loss_ancestors(graph)
    buckets = []
    for start, params in collective_params(graph, param_names).items():
        idx = {plan_index(block_owner(p), plans) for p in params}
        buckets.append(ManualBucket(name=start.name, kind=collective_kind(start) or str(start.target),
                                    phase="forward" if start in fwd else "backward",
                                    plan=idx.pop() if len(idx) == 1 else None, params=params))
    merged = {b.name for b in buckets}
    merge_nodes = {n.name for n in graph.nodes if n.name not in names_before and n.name not in merged
                   and not (n.op == "call_function" and _schedulable_wait_node(n))}
    return ManualInfo(module_bucket_plans=plans, phase_local=phase_local, collectives_before=before,
                      collectives_after=count_collectives(gm), buckets=buckets, replay_forced_waits=0,
                      merge_nodes=merge_nodes, timings=timings)


# ---------------------------------------------------------------------------------------
# The fixed order as torch's bucketer would see it
# ---------------------------------------------------------------------------------------


def fixed_order_problem(traced, estimator: Estimator, *, bucket_mode=None, max_bucket_memory_gb: float = 2.0,
                        meta: dict | None = None) -> tuple[planner.Problem, int]:
    """The problem of ``traced.gm`` in its current order, torch's scheduler not run (its replay
    only: ``fixed_order_inputs``), and the count of waits the replay brought forward. On a fresh
    trace this is the graph's own order, where compute runs as the model wrote it: a lower peak
    than torch's schedule, which pulls compute forward under collectives (hf-qwen3-8 @
    h100-8nodes: 13.17 vs 14.04 GB unbucketed), so free positions can prefetch within a budget
    torch's schedule cannot meet. Every node costs its time, pinned or not (``Node.unpinned_ms``):
    the replay pins fewer nodes than torch's scheduler, which pins every hiding node, and before
    problem version 2 the others cost nothing here (llama3-8b-fsdp-2: 31.9 ms of compute against
    45.8 ms on torch's schedule).

    ``bucket_mode`` None is the planner's default (the bucket keys and merge of every other
    problem); torch manual's problem passes ``MANUAL_BUCKET_MODE`` (its custom-ops merge)."""
    from fxglue.extract import extract_problem

    collective_info, order, forced = fixed_order_inputs(traced, estimator, bucket_mode=bucket_mode)
    problem = extract_problem(traced.gm.graph, collective_info, order, max_bucket_memory_gb=max_bucket_memory_gb,
                              bucket_mode=bucket_mode, estimator=estimator,
                              meta={**traced.meta, "pre_bucketing": False, **(meta or {})})
    return problem, forced


def manual_bucketing_problem(traced, estimator: Estimator | None = None, *,
                             plans: list[list[str] | str] | None = None, phase_local: bool = True,
                             max_bucket_memory_gb: float = 2.0,
                             meta: dict | None = None) -> tuple[planner.Problem, ManualInfo]:
    """Torch's manual per-block bucketing on ``traced.gm`` (in place) and its ``Problem``.

    ``planner.simulate(problem, None)`` is the step of torch's manual plan; ``info`` says what
    was bucketed (``info.buckets``) and how many collectives there were before and after.
    ``traced`` must be freshly traced (not scheduled): the pass replaces torch's scheduler.

    The nodes torch's merges add (``_pre_bucket_*`` copies, the ``split`` ``getitem``s and dtype
    views of custom_ops mode) run on the compute stream as every node does: pinned where torch's
    bookkeeping made them hiding nodes, else in the unpinned compute of the next pinned node
    (``Node.unpinned_ms``). ``info.merge_nodes_ms`` says how much they add.
    """
    from fxglue.pipeline import estimator_for

    estimator = estimator or estimator_for(traced)
    info = run_manual_pass(traced, plans, estimator=estimator, phase_local=phase_local)
    t0 = time.perf_counter()
    problem, info.replay_forced_waits = fixed_order_problem(
        traced, estimator, bucket_mode=MANUAL_BUCKET_MODE, max_bucket_memory_gb=max_bucket_memory_gb,
        meta={"manual_bucketing": {"module_bucket_plans": info.module_bucket_plans, "phase_local": phase_local},
              **(meta or {})})
    info.timings["replay_and_extract_s"] = time.perf_counter() - t0
    with cpu_compat(estimator):
        info.merge_nodes_ms = sum(estimator.compute_ms(n) for n in traced.gm.graph.nodes if n.name in info.merge_nodes)
    return problem, info


# ---------------------------------------------------------------------------------------
# The same idea as a plan on our own problem (no torch pass)
# ---------------------------------------------------------------------------------------


@dataclass
class PerBlockPlan:
    plan: planner.Plan
    feasible_as_built: bool
    broken_rules: list[str]
    repaired: bool
    groups: dict[str, list[str]]  # "plan-index/phase/key" -> members


def per_block_plan(problem: planner.Problem, gm: fx.GraphModule, param_names: list[str],
                   plans: list[list[str] | str], *, kinds: tuple[str, ...] = ("all_gather", "reduce_scatter",
                                                                              "all_reduce"),
                   repair_time_limit_s: float = 20.0) -> PerBlockPlan:
    """One bucket per (module plan entry, phase, bucket key) on a scheduled problem.

    ``gm`` is the scheduled graph the problem was extracted from (its collectives' names are the
    problem's). Unlike torch's pass this covers all_reduce too (DDP gradients), keeps torch's
    scheduled order instead of torch's manual reordering, and anchors each bucket like torch's
    merge: an all_gather bucket starts at its first member's start and is waited at its first
    member's wait; reduce_scatter and all_reduce buckets start at their last member's start
    and are waited at their last member's wait. The plan is checked with
    ``planner.rules.verifier.check``; if it breaks a rule it is repaired with ``planner.search.repair.repair``
    (the best plan whose buckets lie inside these).
    """
    from planner.search.repair import repair
    from planner.rules.verifier import check

    colls = {c.name: c for c in problem.collectives}
    groups: dict[str, list[str]] = defaultdict(list)
    for name, (idx, phase) in block_of_collectives(gm, param_names, plans).items():
        c = colls.get(name)
        if c is not None and c.kind in kinds:
            groups[f"{idx}/{phase}/{c.key}"].append(name)
    buckets = []
    for members in groups.values():
        if len(members) < 2:
            continue
        ms = sorted(members, key=lambda m: colls[m].start_pos)
        if colls[ms[0]].kind == "all_gather":
            start = ms[0]
            wait = min(ms, key=lambda m: colls[m].wait_pos)
        else:
            start = ms[-1]
            wait = max(ms, key=lambda m: colls[m].wait_pos)
        buckets.append(planner.Bucket(members=tuple(ms), start=start, wait=wait))
    created = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    plan = planner.Plan(problem_fingerprint=problem.fingerprint, planner="per-block (torch manual, emulated)",
                        params={"kinds": list(kinds), "plans": plans}, created=created, buckets=tuple(buckets))
    report = check(problem, plan)
    broken = sorted(report.by_rule()) if not report.feasible else []
    repaired = False
    if not report.feasible:
        plan = repair(problem, plan, planner.SolveOptions(time_limit_s=repair_time_limit_s)).plan
        repaired = True
    return PerBlockPlan(plan=plan, feasible_as_built=report.feasible, broken_rules=broken, repaired=repaired,
                        groups=dict(groups))
