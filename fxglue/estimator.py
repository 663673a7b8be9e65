"""Analytical runtime estimates: roofline for compute, α-β for collectives per process group.

Why this exists: torch's overlap scheduler decides what hides what from runtime estimates.
On a CPU-only machine torch's own estimators cannot run (they benchmark on a GPU or ask
triton for the device's peak numbers), so we supply deterministic analytical ones, with
hardware figures a user can override.

Defaults model an NVIDIA H100 SXM5 80GB at achievable rather than datasheet rates
(800 TFLOP/s bf16/fp16 of the 989 dense peak, 60 TFLOP/s fp32, 3.0 TB/s of the 3.35 TB/s
HBM3) in a cluster where the data-parallel group crosses nodes over one 400 Gb/s InfiniBand
NDR NIC per GPU (50 GB/s bus bandwidth, 20 µs per collective) and the tensor-parallel group
stays inside a node on NVLink 4 (200 GB/s, 5 µs). They are round, documented figures for a
realistic ratio of compute to communication, not measurements; ``Hardware.from_json``
overrides any of them.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
import torch.fx as fx
from torch.utils._pytree import tree_flatten, tree_map

from planner.problem import Link


@dataclass(frozen=True)
class LinkSpec:
    latency_us: float
    bandwidth_gbps: float
    name: str


@dataclass(frozen=True)
class Hardware:
    """Hardware figures behind the estimates. ``links`` maps a role (``dp``, ``tp``) to a link."""

    name: str = "H100-SXM5-80GB (achievable rates), DP over 400Gb/s IB NDR, TP over NVLink4"
    bf16_tflops: float = 800.0
    fp32_tflops: float = 60.0
    hbm_tbps: float = 3.0
    links: dict[str, LinkSpec] = field(default_factory=lambda: {
        "dp": LinkSpec(20.0, 50.0, "InfiniBand NDR 400Gb/s per GPU"),
        "tp": LinkSpec(5.0, 200.0, "NVLink 4"),
    })

    def peak_flops(self, dtype: torch.dtype) -> float:
        if dtype in (torch.bfloat16, torch.float16):
            return self.bf16_tflops * 1e12
        return self.fp32_tflops * 1e12

    @classmethod
    def from_json(cls, path: str | Path) -> "Hardware":
        """Override defaults from a JSON file: any of the fields above; links as {role: {...}}."""
        data = json.loads(Path(path).read_text())
        base = cls()
        unknown = set(data) - {"name", "bf16_tflops", "fp32_tflops", "hbm_tbps", "links"}
        if unknown:
            raise ValueError(f"{path}: unknown hardware field(s) {sorted(unknown)}")
        links = dict(base.links)
        for role, spec in data.pop("links", {}).items():
            links[role] = LinkSpec(**{**asdict(links.get(role, base.links["dp"])), **spec})
        return replace(base, links=links, **data)


_VIEW_TARGETS = {
    torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default, torch.ops.aten.t.default,
    torch.ops.aten.transpose.int, torch.ops.aten.expand.default, torch.ops.aten.unsqueeze.default,
    torch.ops.aten.squeeze.dim, torch.ops.aten.permute.default, torch.ops.aten.split.Tensor,
    torch.ops.aten.split_with_sizes.default, torch.ops.aten.slice.Tensor, torch.ops.aten.select.int,
    torch.ops.aten.alias.default, torch.ops.aten.as_strided.default, torch.ops.aten.reshape.default,
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


class Estimator:
    """``custom_runtime_estimation`` for torch's scheduler, plus the per-PG links it used.

    ``roles`` maps process-group names to hardware link roles (``dp``/``tp``); unlisted
    groups use ``dp``.
    """

    def __init__(self, hardware: Hardware | None = None, roles: dict[str, str] | None = None):
        self.hardware = hardware or Hardware()
        self.roles = dict(roles or {})

    def link(self, pg: str) -> Link:
        from torch.distributed.distributed_c10d import _get_group_size_by_name

        role = self.roles.get(pg, "dp")
        spec = self.hardware.links[role]
        return Link(pg=pg, group_size=_get_group_size_by_name(pg), latency_ms=spec.latency_us / 1e3,
                    bandwidth_gbps=spec.bandwidth_gbps, hardware=f"{role}: {spec.name}")

    def collective_ms(self, n: fx.Node, override_size: int | None = None) -> float | None:
        from torch._inductor.fx_passes.overlap_scheduling import get_group_name

        kind = collective_kind(n)
        if kind is None:
            return None
        size = wire_bytes(n) if override_size is None else override_size
        return self.link(get_group_name(n)).time_ms(kind, size)

    def compute_ms(self, n: fx.Node) -> float:
        """Roofline: max(FLOPs / peak, bytes touched / HBM bandwidth); views cost nothing."""
        from torch.utils.flop_counter import flop_registry

        if n.op != "call_function" or n.target in _VIEW_TARGETS:
            return 0.0
        if n.target is torch.ops._c10d_functional.wait_tensor.default:
            return 0.0
        out = _val(n)
        flat_out, _ = tree_flatten(out)
        tensors_out = [x for x in flat_out if isinstance(x, torch.Tensor)]
        if not tensors_out:
            return 0.0
        args = tree_map(_val, n.args)
        kwargs = tree_map(_val, n.kwargs)
        flat_in, _ = tree_flatten((args, kwargs))
        mem_s = (sum(map(_nbytes, flat_in)) + sum(map(_nbytes, tensors_out))) / (self.hardware.hbm_tbps * 1e12)
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
