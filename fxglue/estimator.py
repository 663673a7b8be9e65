"""Analytical runtime estimates: roofline for compute; for collectives torch's own NCCL-derived
model on a named cluster (``PRESETS``), or an α-β link per process group.

Why this exists: torch's overlap scheduler decides what hides what from runtime estimates.
On a CPU-only machine torch's own estimators cannot run as they would on the cluster (they
benchmark on a GPU, ask triton for the device's peak numbers, or detect the GPU generation and
GPUs per node from this machine), so we supply deterministic ones for a cluster we name.

Cluster presets (``PRESETS``; ``bucketplan ... --preset NAME``) fix the world size, the
tensor-parallel degree of 2-D workloads, the GPUs per node and the GPU generation; collectives
are then priced by ``torch._inductor.comm_analysis`` for each group's real layout
(``fxglue.costs``), and merging costs what torch's merge functions add
(``planner.core.problem.BucketingCost``). The ``ab-ib8`` preset keeps the original α-β figures below.

The presets and hardware figures, with their sources, are in ``fxglue.presets``.
"""

from __future__ import annotations

import operator
import types
import weakref

import torch
import torch.fx as fx
from torch.utils._pytree import tree_flatten, tree_map

from fxglue.presets import DEFAULT_PRESET, PRESETS, Hardware, LinkSpec, Preset, get_preset  # noqa: F401
from planner.core.problem import BucketingCost, Link


_VIEW_TARGETS = {
    torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default, torch.ops.aten.t.default,
    torch.ops.aten.transpose.int, torch.ops.aten.expand.default, torch.ops.aten.unsqueeze.default,
    torch.ops.aten.squeeze.dim, torch.ops.aten.permute.default, torch.ops.aten.split.Tensor,
    torch.ops.aten.split_with_sizes.default, torch.ops.aten.slice.Tensor, torch.ops.aten.select.int,
    torch.ops.aten.alias.default, torch.ops.aten.as_strided.default, torch.ops.aten.reshape.default,
    torch.ops.aten.view.dtype,  # a reinterpretation of the same bytes, not a copy
}


def _val(n):
    return n.meta.get("val") if isinstance(n, fx.Node) else n


def _nbytes(t) -> int:
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0


def collective_kind(n: fx.Node) -> str | None:
    from torch._inductor.fx_passes.bucketing import (
        is_all_gather_into_tensor, is_all_reduce_tensor, is_reduce_scatter_tensor)

    if is_all_gather_into_tensor(n):
        return "all_gather"
    if is_reduce_scatter_tensor(n):
        return "reduce_scatter"
    if is_all_reduce_tensor(n):
        return "all_reduce"
    return None


def wire_bytes(n: fx.Node) -> int:
    """Bytes of the full (unsharded) tensor a collective moves: gathered output, scattered input."""
    kind = collective_kind(n)
    if kind == "all_gather":
        return _nbytes(n.meta["val"])
    return _nbytes(_val(n.args[0]))


def fused_node_costs(graph: fx.Graph, hbm_tbps: float) -> dict[fx.Node, float]:
    """ms per node of ``graph``'s fusion regions, by torch's own functions (``Estimator.fused_costs``)."""
    import torch.utils._runtime_estimation as runtime_estimation
    from torch._inductor.fx_passes.fusion_regions import build_fusion_regions, estimate_fused_node_costs

    regions = build_fusion_regions(types.SimpleNamespace(graph=graph))  # it reads gm.graph only
    original = runtime_estimation.get_gpu_dram_gbps
    runtime_estimation.get_gpu_dram_gbps = lambda: hbm_tbps * 1e3  # GB/s: bytes / GB/s is ns
    try:
        return estimate_fused_node_costs(regions) if regions else {}
    finally:
        runtime_estimation.get_gpu_dram_gbps = original


class Estimator:
    """``custom_runtime_estimation`` for torch's scheduler, plus the per-PG links it used.

    ``roles`` maps process-group names to link roles (``dp``/``tp``); unlisted groups use
    ``dp``. With ``ranks_per_node`` (role -> how many of that group's ranks share a node) and
    ``gpu``, collectives are priced by torch's NCCL model (``fxglue.costs``); without it by the
    α-β ``hardware.links``. ``measured`` (``planner.cost.measured.Measured``): measured collective
    times replace the model for every group and kind they cover; then every collective, the
    scheduler's and the problem's alike, is priced by ``link(pg)``, one curve for both.
    ``profile`` (``fxglue.profile.Profile``): the op times of a trace replace the roofline of the
    nodes it timed (not of fused ones); its collectives come in through ``measured``.
    """

    def __init__(self, hardware: Hardware | None = None, roles: dict[str, str] | None = None, *,
                 ranks_per_node: dict[str, int] | None = None, gpu: str = "hopper", measured=None, profile=None,
                 contention: float = 1.0):
        self.hardware = hardware or Hardware()
        self.contention = contention  # the problems' (``Problem.contention``): torch's own estimate has none
        self.roles = dict(roles or {})
        self.ranks_per_node = dict(ranks_per_node) if ranks_per_node else None
        self.gpu = gpu
        self.measured = measured
        self.profile = profile
        self._links: dict[str, Link] = {}
        self._fused: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def group_layout(self, pg: str) -> tuple[int, int]:
        """(group size, its ranks per node)."""
        from torch.distributed.distributed_c10d import _get_group_size_by_name

        size = _get_group_size_by_name(pg)
        return size, min(size, self.ranks_per_node[self.roles.get(pg, "dp")])

    def link(self, pg: str) -> Link:
        if pg in self._links:
            return self._links[pg]
        role = self.roles.get(pg, "dp")
        if self.ranks_per_node is None:
            from torch.distributed.distributed_c10d import _get_group_size_by_name

            spec = self.hardware.links[role]
            link = Link(pg=pg, group_size=_get_group_size_by_name(pg), latency_ms=spec.latency_us / 1e3,
                        bandwidth_gbps=spec.bandwidth_gbps, hardware=f"{role}: {spec.name}")
        else:
            from fxglue.costs import nccl_link

            size, per_node = self.group_layout(pg)
            link = nccl_link(pg, size, gpu=self.gpu, ranks_per_node=per_node)
            link = link.model_copy(update={"hardware": f"{role}: {link.hardware}"})
        if self.measured is not None:
            per_node = self.group_layout(pg)[1] if self.ranks_per_node is not None else link.group_size
            link = self.measured.link(link, per_node)
        self._links[pg] = link
        return link

    def torch_topology(self):
        """A context in which torch's own topology-dependent decisions (its FSDP pre-bucketing cap
        from ``comm_analysis.compute_min_saturation_bytes``) see the named cluster as the
        data-parallel group lives on it, not this CPU machine (8 GPUs a node, Ampere)."""
        import contextlib

        if self.ranks_per_node is None:
            return contextlib.nullcontext()
        from fxglue.costs import torch_topology

        return torch_topology(self.gpu, self.ranks_per_node["dp"])

    @property
    def bucketing(self) -> BucketingCost | None:
        """What merging costs on the compute stream (None: free, as in the original α-β model)."""
        if self.hardware.launch_us is None:
            return None
        return BucketingCost(copy_gbps=self.hardware.hbm_tbps * 1e3, launch_ms=self.hardware.launch_us / 1e3,
                             source=f"{self.hardware.name}: copies at HBM bandwidth, "
                                    f"{self.hardware.launch_us:g} µs per collective issued")

    def collective_ms(self, n: fx.Node, override_size: int | None = None) -> float | None:
        from torch._inductor.fx_passes.overlap_scheduling import get_group_name

        kind = collective_kind(n)
        if kind is None:
            return None
        pg = get_group_name(n)
        if self.measured is not None:
            return self.link(pg).time_ms(kind, self._wire(kind, n, pg, override_size))
        if self.ranks_per_node is None:
            size = wire_bytes(n) if override_size is None else override_size
            return self.link(pg).time_ms(kind, size)
        # exactly what torch's analytical estimator computes, for the named topology
        from torch._inductor.comm_analysis import estimate_fx_collective_size

        from fxglue.costs import torch_collective_ms

        size, per_node = self.group_layout(pg)
        nbytes = estimate_fx_collective_size(n) if override_size is None else override_size
        return torch_collective_ms(kind, nbytes, size, gpu=self.gpu, ranks_per_node=per_node)

    def _wire(self, kind: str, n: fx.Node, pg: str, override_size: int | None) -> int:
        """The full-tensor bytes of a collective; torch's ``override_size`` is its own measure (input
        plus output, ``fxglue.costs.torch_bytes``), turned back (torch passes 0: the latency)."""
        if override_size is None:
            return wire_bytes(n)
        if kind == "all_reduce":
            return override_size // 2
        size = self.link(pg).group_size
        return override_size * size // (size + 1)

    def fused_costs(self, graph: fx.Graph) -> dict[fx.Node, float]:
        """What inductor's fusion makes of ``graph``'s memory-bound nodes: torch 2.13's own
        ``fusion_regions.build_fusion_regions`` (connected fusible nodes within a run of them) and
        ``estimate_fused_node_costs`` (a region's node pays only for the tensors that cross the
        region's boundary: intermediates are never written to memory), at this hardware's HBM
        bandwidth instead of the device's (torch asks triton for it). Computed the first time a
        graph is seen, and kept: torch's scheduler asks first, before it reorders the graph, and
        extraction, after, must price the same regions."""
        got = self._fused.get(graph)
        if got is None:
            got = fused_node_costs(graph, self.hardware.hbm_tbps)
            self._fused[graph] = got
        return got

    def compute_ms(self, n: fx.Node) -> float:
        """Roofline: max(FLOPs / peak, bytes touched / HBM bandwidth), the bytes counted as torch's
        roofline counts them (``get_num_bytes``: a broadcast dimension is read once); views cost
        nothing (ours and torch's ``is_view_node``); a node inductor fuses with its neighbours pays
        for its region's boundary only (``fused_costs``)."""
        from torch._inductor.fx_passes.fusion_regions import is_view_node
        from torch.utils._runtime_estimation import get_num_bytes
        from torch.utils.flop_counter import flop_registry

        # getitem picks one output of a multi-output node: no work of its own (it was charged
        # the bytes of the whole tuple it indexes: 8.3 ms of llama3-8b-fsdp-2's compute)
        if n.op != "call_function" or n.target in _VIEW_TARGETS or n.target is operator.getitem or is_view_node(n):
            return 0.0
        if n.target is torch.ops._c10d_functional.wait_tensor.default:
            return 0.0
        fused = self.fused_costs(n.graph).get(n)
        if fused is not None:
            return fused
        if self.profile is not None:
            profiled = self.profile.op_ms(n)
            if profiled is not None:
                return profiled
        out = _val(n)
        flat_out, _ = tree_flatten(out)
        tensors_out = [x for x in flat_out if isinstance(x, torch.Tensor)]
        if not tensors_out:
            return 0.0
        args = tree_map(_val, n.args)
        kwargs = tree_map(_val, n.kwargs)
        flat_in, _ = tree_flatten((args, kwargs))
        touched = sum(get_num_bytes(t) for t in (*flat_in, *tensors_out) if isinstance(t, torch.Tensor))
        mem_s = touched / (self.hardware.hbm_tbps * 1e12)
        key = getattr(n.target, "overloadpacket", None)
        key = key if key in flop_registry else (n.target if n.target in flop_registry else None)
        comp_s = 0.0
        if key is not None:
            flops = flop_registry[key](*args, **kwargs, out_val=out)
            comp_s = flops / self.hardware.peak_flops(tensors_out[0].dtype)
        return max(mem_s, comp_s) * 1e3

    def __call__(self, n: fx.Node, override_size: int | None = None) -> float | None:
        t = self.collective_ms(n, override_size)
        if t is not None:
            return t
        if n.op != "call_function":
            return None
        return self.compute_ms(n)
