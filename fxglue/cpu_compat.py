"""Every adaptation torch's overlap scheduler needs to run on a CPU-only machine, in one place.

Why this exists: torch 2.13's scheduler assumes a GPU build. Two things break on CPU:

1. ``OverlapScheduler`` estimates compute nodes with
   ``overlap_scheduling.estimate_roofline_runtime_ms`` even when a custom estimator is given
   (``_align_compute_nodes_runtime_estimations_across_all_distributed_ranks`` calls it
   directly), and that function asks triton for the device's DRAM bandwidth -- an
   ImportError without triton. We swap in our own roofline (``fxglue.estimator``), so compute
   estimates come from the same documented hardware model as everything else.
2. torch's FLOP registry (``torch.utils.flop_counter.flop_registry``) has formulas for the
   CUDA attention ops but not for the CPU ones that SDPA dispatches to here
   (``_scaled_dot_product_flash_attention_for_cpu`` and its backward). Without them attention
   is not a "compute node" at all, so it could hide nothing. We alias the CUDA formulas,
   which take the same arguments.

Both changes are active only inside ``cpu_compat(...)`` and undone on exit; nothing is
patched at import time.
"""

from __future__ import annotations

import contextlib

import torch


def sdpa_aliases():
    aten = torch.ops.aten
    return {
        aten._scaled_dot_product_flash_attention_for_cpu: aten._scaled_dot_product_flash_attention,
        aten._scaled_dot_product_flash_attention_for_cpu_backward: aten._scaled_dot_product_flash_attention_backward,
    }


@contextlib.contextmanager
def cpu_compat(estimator):
    """Run torch's overlap scheduling machinery on CPU with ``estimator`` for compute."""
    import torch._inductor.fx_passes.overlap_scheduling as overlap_scheduling
    from torch.utils.flop_counter import flop_registry

    added = []
    for cpu_op, cuda_op in sdpa_aliases().items():
        if cpu_op not in flop_registry and cuda_op in flop_registry:
            flop_registry[cpu_op] = flop_registry[cuda_op]
            added.append(cpu_op)
    original_roofline = overlap_scheduling.estimate_roofline_runtime_ms
    overlap_scheduling.estimate_roofline_runtime_ms = estimator.compute_ms
    try:
        yield
    finally:
        overlap_scheduling.estimate_roofline_runtime_ms = original_roofline
        for op in added:
            flop_registry.pop(op, None)
