"""Collective prices from torch's own NCCL-derived cost model, for a named cluster.

Why this exists: a plan is worth what the hardware charges for it, and torch's overlap
scheduler decides what hides what from torch's own estimate. Torch 2.13 ships a model ported
from NCCL's tuning (``torch._inductor.comm_analysis``: ring/tree x LL/LL128/Simple, per-hop
latency, NVLink inside a node and InfiniBand across nodes). It reads the GPU generation and
GPUs per node from the machine it runs on -- on a CPU machine it falls back to Ampere and 8 GPUs
a node -- so we call it with the topology *named*, never detected: ``torch_topology`` sets the
generation and how many of the group's ranks share a node for the duration of one call.

Two products:
- ``torch_collective_ms``: torch's exact figure (what our estimator hands torch's scheduler);
- ``nccl_link``: a ``planner.Link`` whose table samples that figure on a dense grid of sizes,
  so ``planner`` (which never imports torch) prices any bucket the way torch would. The grid
  is geometric (16 points per doubling) plus both sides of every power of two, where the tree
  all_reduce's correction factor jumps; ``tests/test_costs.py`` checks the table against
  torch's function within 1% from 1 KiB to 4 GiB for every kind and preset.

Torch prices a collective by its input plus output bytes (``estimate_fx_collective_size``),
while ``planner`` counts each collective's full (unsharded) tensor, its ``wire_bytes``: an
all_gather or reduce_scatter over n ranks has ``wire * (1 + 1/n)`` bytes of input and output,
an all_reduce ``2 * wire`` (``torch_bytes``).
"""

from __future__ import annotations

import contextlib
import math
from unittest import mock

import planner

KINDS = ("all_gather", "reduce_scatter", "all_reduce")
GPU_GENERATIONS = ("volta", "ampere", "hopper", "blackwell")
# Sizes sampled for the table: 0, then 2**(k / POINTS_PER_DOUBLING) bytes up to 2**MAX_LOG2
# (a bucket beyond 1 TiB is extrapolated along the last segment).
POINTS_PER_DOUBLING = 16
MAX_LOG2 = 40


def _coll(kind: str):
    from torch._inductor.comm_analysis import NCCL_COLL

    return {"all_gather": NCCL_COLL.ALL_GATHER, "reduce_scatter": NCCL_COLL.REDUCE_SCATTER,
            "all_reduce": NCCL_COLL.ALL_REDUCE}[kind]


@contextlib.contextmanager
def torch_topology(gpu: str, ranks_per_node: int):
    """Within this context torch's NCCL model sees ``gpu`` GPUs with ``ranks_per_node`` of the
    group's ranks in each node (NVLink inside it), whatever this machine has."""
    import torch
    from torch._inductor import comm_analysis as ca

    if gpu not in GPU_GENERATIONS:
        raise ValueError(f"unknown GPU generation {gpu!r}; use one of {GPU_GENERATIONS}")
    generation = ca.NVIDIA_GPU_TYPE[gpu.upper()]
    with mock.patch.object(ca, "get_gpu_type", lambda: generation), \
            mock.patch.object(ca, "_has_nvlink", lambda: True), \
            mock.patch.object(torch.cuda, "is_available", lambda: True), \
            mock.patch.object(torch.cuda, "device_count", lambda: ranks_per_node):
        yield


def torch_bytes(kind: str, wire_bytes: int, group_size: int) -> int:
    """The bytes torch's model is given for a collective of this full size (input + output)."""
    if kind == "all_reduce":
        return 2 * wire_bytes
    return wire_bytes + wire_bytes // max(group_size, 1)


def torch_collective_ms(kind: str, nbytes: int, group_size: int, *, gpu: str, ranks_per_node: int) -> float:
    """Torch's own estimate (ms) for ``nbytes`` of input plus output, as its scheduler makes it."""
    from torch._inductor.comm_analysis import estimate_nccl_collective_runtime_impl

    with torch_topology(gpu, ranks_per_node):
        return float(estimate_nccl_collective_runtime_impl(int(nbytes), group_size, _coll(kind)))


def sample_sizes() -> list[int]:
    """Wire sizes at which the table samples torch's model (see the module docstring)."""
    sizes = {0}
    for k in range(MAX_LOG2 * POINTS_PER_DOUBLING + 1):
        sizes.add(int(round(2 ** (k / POINTS_PER_DOUBLING))))
    for j in range(1, MAX_LOG2 + 1):
        sizes.add(2**j - 1)  # the last size before a power of two: the tree correction steps there
    return sorted(sizes)


def nccl_link(pg: str, group_size: int, *, gpu: str, ranks_per_node: int, label: str = "") -> planner.Link:
    """A table link sampling torch's NCCL model for this group (``ranks_per_node`` of its ranks
    share each node)."""
    sizes = sample_sizes()
    table = {}
    for kind in KINDS:
        table[kind] = tuple((b, torch_collective_ms(kind, torch_bytes(kind, b, group_size), group_size,
                                                    gpu=gpu, ranks_per_node=ranks_per_node)) for b in sizes)
    nodes = math.ceil(group_size / ranks_per_node)
    what = label or f"torch {gpu} NCCL model, {group_size} ranks on {nodes} node(s), {ranks_per_node} per node"
    return planner.Link(pg=pg, group_size=group_size, table=table, hardware=what)
