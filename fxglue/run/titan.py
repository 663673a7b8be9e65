"""bucketplan's plans inside torchtitan's graph_trainer: a pass with graph_trainer's pass signature.

Why here, and why this way: torchtitan 0.3.0's graph_trainer (``--compile.mode aot_fx_trace``,
its default) traces forward, loss and backward into one FX graph and runs a list of passes on it,
each called as ``pass_fn(gm, example_inputs) -> gm`` (``passes.apply_graph_passes``), in the order
the configured pass pipeline returns them (``--compile.pass_pipeline``, looked up in
``registry.PASS_PIPELINE_REGISTRY``; "default" is ``construct_default_graph_passes``). Its FSDP
bucketing is one of them, ``joint_transformer_block_bucketing_reordering_pass`` (one bucket per
transformer block and collective kind, the next block prefetched). ``register_pipeline`` registers
graph_trainer's default pipeline with that one pass replaced by ``bucketplan_pass``, which does
what ``fxglue.run.compile`` does inside an inductor compile, with its pass (``graph_pass``):

- ``record``: torch's overlap scheduler on the graph, the problem and torch's greedy plan written
  to the plan directory under the problem's fingerprint, torch's greedy bucketer finishes;
- ``bucketplan solve-dir`` solves the directory offline, as for any recorded compile;
- ``use``: the same schedule, then the directory's plan for that fingerprint, verified and applied
  (``apply_plan``); no plan, or one that fails verification, is one warning and torch's greedy.

The graph's fingerprint depends on the model, its shapes, the parallelism, the preset and
bucketplan's code; a run with the same config on the same ranks finds its plan. The passes after
bucketing (regional or full inductor, cudagraphs) run as graph_trainer runs them.

Not covered: graph_trainer's precompile (``precompile_main`` builds its pass list with
``compile_time_passes`` directly, not through the configured pipeline, so its artifact holds
graph_trainer's bucketing); the dense-region FSDP scheduler and EP overlap, which schedule the
buckets graph_trainer's own pass made (refused in one line). JIT mode (``--compile.mode jit``,
deprecated in 0.3.0) accepts only its two named passes; with ``--compile.backend inductor`` it is a
``torch.compile``, where ``fxglue.run.compile.record`` / ``use`` around training apply unchanged.
"""

from __future__ import annotations

import functools
import logging
import os

import torch.fx as fx

from fxglue.models.titan import BUCKETING_PASS

log = logging.getLogger("bucketplan.compile")

PIPELINE = "bucketplan"
# graph_trainer passes that schedule the buckets its own bucketing pass made (it tags them)
_NEEDS_ITS_BUCKETS = ("schedule_fsdp_comms_to_dense_regions_pass", "ep_overlap_schedule_pass")


def bucketplan_pass(gm: fx.GraphModule, example_inputs, *, mode: str, plan_dir: str | os.PathLike | None = None,
                    preset: str = "h100-8nodes", tp: tuple[str | None, int] = (None, 1), collectives=(),
                    events: list | None = None) -> fx.GraphModule:
    """graph_trainer's pass signature (``gm, example_inputs -> gm``; graph_trainer binds the rest
    with ``functools.partial``): ``mode`` "record", "use" or "unbucketed" (torch's schedule,
    nothing merged: the reference) on ``plan_dir``, the problem priced on ``preset`` (and the
    measured ``collectives`` files) with ``tp``, the tensor-parallel group's name and size
    (``_tp_layout``; (None, 1): none), as ``fxglue.run.compile``'s contexts of the same name.
    ``events``: a list that gets this graph's ``GraphEvent`` (what was done, collectives before
    and after). The graph is changed in place and returned."""
    import torch._inductor.config as inductor_config

    from planner.search.planners import AUTOFIX_CONFIG
    from fxglue.run.compile import graph_pass

    tp_group, tp_size = tp
    plan_pass = graph_pass(mode, plan_dir, preset=preset, tp_group=tp_group, tp_size=tp_size,
                           collectives=collectives)
    # as record/use set it: torch's greedy (record, and use's fallback) fails its own cycle check
    # on some graphs without its escape hatch, and a step must not fail where torch buckets
    with inductor_config.patch({AUTOFIX_CONFIG: True}):
        plan_pass(gm.graph)
    if events is not None:
        events.extend(plan_pass.session.events)
    return gm


def _tp_layout(parallel_dims) -> tuple[str | None, int]:
    """The tensor-parallel group's name and size (priced as in-node links), or (None, 1)."""
    if parallel_dims is None or not getattr(parallel_dims, "tp_enabled", False):
        return None, 1
    mesh = parallel_dims.get_mesh("tp")
    return mesh.get_group().group_name, mesh.size()


def pass_pipeline(traced_result, config, *, parallel_dims=None, settings: dict, events: list):
    """graph_trainer's default pass pipeline (``construct_default_graph_passes``) with its FSDP
    bucketing pass replaced by ``bucketplan_pass`` bound to ``settings``."""
    from torchtitan.experiments.graph_trainer.passes import _get_pass_name, construct_default_graph_passes

    passes = construct_default_graph_passes(traced_result, config, parallel_dims=parallel_dims)
    names = [_get_pass_name(p) for p in passes]
    clash = [n for n in _NEEDS_ITS_BUCKETS if n in names]
    if clash:
        raise ValueError(f"bucketplan: {', '.join(clash)} schedules the buckets of graph_trainer's own {BUCKETING_PASS}, "
                         "which bucketplan's pass replaces: turn it off (--compile.enable_fsdp_dense_region_overlap, "
                         "--compile.ep_overlap.enabled)")
    if BUCKETING_PASS not in names:
        if config.compile.precompile_artifact_dir:
            log.warning("bucketplan: graph_trainer loads a precompiled artifact (%s), bucketed when it was "
                        "precompiled; bucketplan's pass does not run", config.compile.precompile_artifact_dir)
            return passes
        raise ValueError(f"bucketplan: graph_trainer's pass list has no {BUCKETING_PASS} to replace "
                         f"(--compile.disable_passes names it?): {', '.join(names)}")
    passes[names.index(BUCKETING_PASS)] = functools.partial(bucketplan_pass, tp=_tp_layout(parallel_dims),
                                                            events=events, **settings)
    return passes


def register_pipeline(mode: str, plan_dir: str | os.PathLike | None = None, *, preset: str = "h100-8nodes",
                      collectives=(), name: str = PIPELINE) -> list:
    """Register the pipeline as ``name`` in graph_trainer's pass-pipeline registry (select it with
    ``config.compile.pass_pipeline = name`` or ``--compile.pass_pipeline NAME``), its pass in
    ``mode`` on ``plan_dir`` priced on ``preset``. Returns the list each traced graph's
    ``GraphEvent`` is appended to. The preset, the ``collectives`` files and (record) the directory
    are checked here, in one line, before training starts."""
    from torchtitan.experiments.graph_trainer.registry import register_pass_pipeline

    from fxglue.run.compile import graph_pass

    graph_pass(mode, plan_dir, preset=preset, collectives=collectives)  # the checks; the pass is made per graph
    events: list = []
    settings = {"mode": mode, "plan_dir": None if plan_dir is None else str(plan_dir), "preset": preset,
                "collectives": tuple(collectives)}
    register_pass_pipeline(name)(functools.partial(pass_pipeline, settings=settings, events=events))
    return events
