"""Cluster presets and hardware figures: what a plan is priced on. Torch-free (the CLI lists
them without importing torch); ``fxglue.estimator`` turns them into estimates.

The α-β defaults of ``Hardware`` model an NVIDIA H100 SXM5 80GB at achievable rather than
datasheet rates, round figures of published measurements:
- 800 TFLOP/s bf16/fp16 (dense peak 989): the largest matmuls reach 794.5 TFLOP/s
  (``torch.matmul`` bf16, best shape 2048x2048x13312, torch 2.7 / CUDA 12.6: "Maximum
  Achievable Matmul FLOPS" table of stas00/ml-engineering, compute/accelerator/README.md) and
  780 TFLOP/s (a 4224x8192 @ 8192x2048 bf16 mm under max-autotune: gist jeromeku "H100 peak
  matmul FLOPS"). This is a matmul's rate, not the step's MFU: published Llama-3 training runs
  at 33-43% MFU (torchtitan benchmarks/llama3_h100_202412_torchtitan.md: 33-39%; Llama 3
  405B: 380-430 TFLOP/s per GPU), because not every kernel is a large matmul and not every
  collective hides (the ``published-mfu`` scenario of ``planner.search.scenarios`` prices that gap);
- 3.0 TB/s HBM3 (3.35 peak): STREAM-style kernels measure copy 2.90, triad 2.97 TB/s (Azure
  ND H100 v5, CUDA 12.6: samuel-bohman/AI-benchmarking-guide, Azure_Results);
- 60 TFLOP/s fp32 (67 dense peak without tensor cores; no built-in workload computes in fp32);
in a cluster where the data-parallel group crosses nodes over one 400 Gb/s InfiniBand NDR NIC
per GPU (50 GB/s bus bandwidth, 20 µs per collective) and the tensor-parallel group stays
inside a node on NVLink 4 (200 GB/s, 5 µs). ``--compute-tflops`` / ``--hbm-tbps`` and
``Hardware.from_json`` override them. The NCCL presets price collectives with torch's own model
instead (``fxglue.costs``).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path


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
    # Host-side cost of issuing one collective, charged on the compute stream (see
    # BucketingCost): ProcessGroupNCCL records an event on the compute stream, makes the NCCL
    # stream wait on it and launches the NCCL kernel. A kernel launch alone is 2-4 µs (NVIDIA,
    # "Getting Started with CUDA Graphs": 2-3 µs per launch); 5 µs is a round figure for the
    # launch with its event work. None: merging is free (the original α-β problems).
    launch_us: float | None = None
    links: dict[str, LinkSpec] = field(default_factory=lambda: {
        "dp": LinkSpec(20.0, 50.0, "InfiniBand NDR 400Gb/s per GPU"),
        "tp": LinkSpec(5.0, 200.0, "NVLink 4"),
    })

    def peak_flops(self, dtype) -> float:
        if str(dtype) in ("torch.bfloat16", "torch.float16"):
            return self.bf16_tflops * 1e12
        return self.fp32_tflops * 1e12

    @classmethod
    def from_json(cls, path: str | Path) -> "Hardware":
        """Override defaults from a JSON file: any of the fields above; links as {role: {...}}."""
        from planner.core.io import read_regular_text

        try:  # a FIFO or a device would block or read without end (planner.core.io)
            data = json.loads(read_regular_text(path, 1 << 20, "hardware file"))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not JSON ({e.msg} at line {e.lineno})") from None
        if not isinstance(data, dict):
            raise ValueError(f"{path}: a hardware file is a JSON object of fields, not {type(data).__name__}")
        base = cls()
        unknown = set(data) - {"name", "bf16_tflops", "fp32_tflops", "hbm_tbps", "links", "launch_us"}
        if unknown:
            raise ValueError(f"{path}: unknown hardware field(s) {sorted(unknown)}")
        links = dict(base.links)
        for role, spec in data.pop("links", {}).items():
            links[role] = LinkSpec(**{**asdict(links.get(role, base.links["dp"])), **spec})
        return replace(base, links=links, **data)


@dataclass(frozen=True)
class Preset:
    """A named cluster: world size, 2-D layout, GPU generation, and how collectives are priced.

    ``comm="nccl"``: torch's NCCL-derived model for each group's layout (``fxglue.costs``);
    ``"alpha-beta"``: ``hardware.links`` as they are. Ranks fill nodes in order and a 2-D mesh
    puts tensor parallelism innermost (``rank = dp_rank * tp + tp_rank``), so a TP group of at
    most ``ranks_per_node`` stays inside one node and the data-parallel group spans the nodes.
    """

    name: str
    description: str
    nodes: int
    tp: int  # tensor-parallel degree of 2-D workloads
    ranks_per_node: int = 8
    gpu: str = "hopper"
    comm: str = "nccl"
    hardware: Hardware = field(default_factory=Hardware)
    # measured collective times (``planner.cost.measured``) that replace the model for every group
    # and kind they cover (``with_measurements``); None: the model alone
    measured: object = None
    # a Chrome trace of the step (``fxglue.profile.Profile``): its op and collective times replace
    # the estimates wherever it has them (``fxglue.profile.with_profile``); None: no profile
    profile: object = None
    # compute-stream work runs this many times slower beside a collective in flight (NCCL's
    # kernels take SMs and HBM bandwidth); the problems extracted carry it (``Problem.contention``)
    contention: float = 1.0

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node


# Sources: H100 SXM5 compute and HBM figures as above (the achievable rates of Hardware);
# NVLink 4 (370 GB/s bus bandwidth in torch's table, from NCCL's topo.h) inside a DGX/HGX H100
# node of 8 GPUs; one 400 Gb/s NDR InfiniBand NIC per GPU across nodes (50 GB/s in torch's
# table), with the per-hop latencies and NIC-efficiency corrections of
# torch._inductor.comm_analysis (NCCL's tuning.cc constants, calibrated there on H100 RoCE).
_H100 = Hardware(name="H100-SXM5-80GB (achievable rates), NCCL model of torch 2.13", launch_us=5.0)
PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset("h100-1node", "one HGX H100 node: 8 ranks over NVLink; 2-D as TP 2 x FSDP 4", nodes=1, tp=2,
           hardware=_H100),
    Preset("h100-8nodes", "8 H100 nodes: 64 ranks, InfiniBand NDR across nodes; 2-D as TP 8 in the node x "
           "FSDP 8 across nodes", nodes=8, tp=8, hardware=_H100),
    Preset("h100-64nodes", "64 H100 nodes: 512 ranks, InfiniBand NDR across nodes; 2-D as TP 8 x FSDP 64",
           nodes=64, tp=8, hardware=_H100),
    Preset("ab-ib8", "the original α-β model: 8 ranks, every data-parallel group on 400 Gb/s InfiniBand "
           "(20 µs, 50 GB/s), TP on NVLink (5 µs, 200 GB/s); 2-D as TP 2 x FSDP 4; merging free",
           nodes=1, tp=2, comm="alpha-beta"),
)}
# The default cluster of the command line: 8 nodes is where bucketing pays (per-hop latency on
# InfiniBand, compute and communication of the same order), and a common production size.
DEFAULT_PRESET = "h100-8nodes"


def with_measurements(preset: Preset, paths, *, ranks: int | None = None,
                      ranks_per_node: int | None = None) -> Preset:
    """``preset`` priced by the measured collectives of ``paths`` (nccl-tests output or CSV; see
    ``planner.cost.measured``) wherever they cover a group; a bad file raises ``MeasuredError``."""
    from planner.cost.measured import Measured

    paths = list(paths or ())
    if not paths:
        return preset
    measured = Measured.read(paths, ranks=ranks, ranks_per_node=ranks_per_node)
    # the name carries a digest of what was measured: a plan recorded on one table is not
    # taken for another (torch.compile's plan pass and the problem's meta hash the name)
    digest = hashlib.sha256(repr(measured.series).encode()).hexdigest()[:8]
    return replace(preset, measured=measured, name=f"{preset.name}+measured-{digest}",
                   description=f"{preset.description}; collectives measured ({', '.join(map(str, paths))})")


def with_contention(preset: Preset, factor: float) -> Preset:
    """``preset`` whose problems carry contention ``factor`` (``Problem.contention``: compute that
    many times slower beside a collective in flight); ValueError for a factor outside 1 to
    ``MAX_CONTENTION``. At 1 the preset itself (its name unchanged: plans recorded on it still match)."""
    from planner.cost.simulator import check_contention

    factor = check_contention(factor)
    if factor == 1.0:
        return preset
    return replace(preset, contention=factor, name=f"{preset.name}+contention{factor:g}",
                   description=f"{preset.description}; compute {factor:g}x slower beside collectives")


def measurement_warnings(preset: Preset | None, problem, *, alone: bool = False) -> list[str]:
    """What the preset's measurements (``--collectives`` files, a ``--profile`` trace, a graph
    file's table) leave out of ``problem``, one line each: a measurement file that prices none of
    its collectives, and a group none of them prices (the preset's model prices it, as it would
    without them). ``alone``: the problem is all the command plans, so when none of the caller's
    measurements prices anything of it, its files were asked for nothing: ``MeasuredError``
    naming them instead of a warning.
    Matched as the estimator matches them (``Measured.find``: name, else size and ranks per node),
    so a file that priced something is never reported."""
    from planner.cost.measured import MeasuredError

    measured = getattr(preset, "measured", None)
    if measured is None:
        return []
    used, groups, bare = set(), [], []
    for link, ranks, per_node, by_kind in _series_by_group(measured, problem):
        found = [s for s in by_kind.values() if s is not None]
        used.update(id(s) for s in found)
        groups.append(f"{link.pg} ({ranks} ranks, {per_node} per node)")
        if by_kind and not found:
            bare.append(f"group {groups[-1]}: no measurement prices it; the preset's model does ({link.hardware})")
    files: dict[str, list] = {}
    for s in measured.series:  # the caller's own files (a profile's series have none)
        if s.file is not None:
            files.setdefault(s.file, []).append(s)
    idle = [f for f, series in files.items() if not any(id(s) in used for s in series)]
    here = f"this workload's groups are {'; '.join(groups)}"
    if alone and idle and not any(id(s) in used for s in measured.series):  # nothing the user gave prices
        raise MeasuredError(f"--collectives {', '.join(idle)}: prices no collective of this workload (it measures "
                            f"{_shapes([s for f in idle for s in files[f]])}; {here}); give measurements of these "
                            "groups, or drop it")
    return ([f"{f} prices no collective of this workload (it measures {_shapes(files[f])}; {here})" for f in idle]
            + bare)


def _series_by_group(measured, problem):
    """Per group of ``problem``: ``(link, ranks, ranks per node, {kind: the series that prices it,
    or None})`` over the kinds it runs, matched as the estimator matched them (``Measured.find``
    at the group's layout over nodes, or, an α-β problem, all of it on one node)."""
    from planner.search.scenarios import ScenarioError, layout

    for link in problem.links:
        try:
            ranks, per_node = layout(problem, link)
        except ScenarioError:
            ranks, per_node = link.group_size, link.group_size
        kinds = sorted({c.kind for c in problem.collectives if c.pg == link.pg})
        yield link, ranks, per_node, {k: measured.find(k, link.pg, ranks, per_node) if measured is not None else None
                                      for k in kinds}


def pricing_lines(preset: Preset | None, problem) -> list[str]:
    """What priced each process group of ``problem``, one line a group: its layout, and for each
    kind of collective it runs either the measurement that priced it (file, sizes measured, and how
    many of its collectives lie outside them: below the smallest size priced at the smallest's
    time, above the largest along the last measured segment) or the preset's model. Matched as
    the estimator matches them (``Measured.find``)."""
    from planner.cost.measured import size_text

    out = []
    for link, ranks, per_node, by_kind in _series_by_group(getattr(preset, "measured", None), problem):
        parts = []
        for kind, s in by_kind.items():
            if s is None:
                parts.append(f"{kind} by the preset's model")
                continue
            lo, hi = s.points[0][0], s.points[-1][0]
            sizes = [c.wire_bytes for c in problem.collectives if c.pg == link.pg and c.kind == kind]
            below, above = sum(b < lo for b in sizes), sum(b > hi for b in sizes)
            parts.append(f"{kind} measured ({s.source}: {len(s.points)} sizes, {size_text(lo)} to {size_text(hi)}; of its "
                         f"{len(sizes)}, {below} below (priced at {size_text(lo)}'s time), {above} above (along the "
                         "last measured segment))")
        out.append(f"group {link.pg} ({ranks} ranks, {per_node} per node) priced by {'; '.join(parts)}")
    return out


def _shapes(series, most: int = 4) -> str:
    """The group shapes a few series measure, e.g. ``all_gather on 64 ranks (8 per node)``."""
    shown = list(dict.fromkeys(
        f"{s.kind} on " + (f"group {s.group}" + (f" of {s.ranks} ranks" if s.ranks else "") if s.group
                           else f"{s.ranks} ranks ({s.ranks_per_node} per node)") for s in series))
    return ", ".join(shown[:most]) + (f" and {len(shown) - most} more" if len(shown) > most else "")


def with_graph_table(preset: Preset, path) -> Preset:
    """``preset`` priced also by the collectives table a graph file names (``get_colls_estimations_file()``,
    ``fxglue.graph_file``) wherever no measurement the preset already has (``--collectives``,
    ``--profile``) covers a group and kind: the user's own figures win, the file's fill in.
    A bad table raises ``MeasuredError`` (or ``BadFileError``), naming it."""
    from planner.cost.measured import Measured, read_series

    table = read_series(path)
    earlier = preset.measured
    measured = Measured(list(earlier.series) if earlier is not None else [],
                        fallback=[*(earlier.fallback if earlier is not None else []), *table])
    # a plan recorded on one table is not taken for another: the name carries its digest
    digest = hashlib.sha256(repr(table).encode()).hexdigest()[:8]
    return replace(preset, measured=measured, name=f"{preset.name}+table-{digest}",
                   description=f"{preset.description}; collectives measured by the graph's table ({path})")


def get_preset(name: str, *, ranks: int | None = None, tp: int | None = None) -> Preset:
    """A preset by name, optionally at another world size (filling nodes of the preset's size
    in order) or TP degree."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    preset = PRESETS[name]
    if ranks is not None:
        per_node = min(ranks, preset.ranks_per_node)
        if ranks < 1 or ranks % per_node:
            raise ValueError(f"--ranks {ranks}: must be a positive multiple of the {preset.ranks_per_node} "
                             f"ranks per node of preset {name} (or fewer)")
        preset = replace(preset, nodes=ranks // per_node, ranks_per_node=per_node,
                         name=f"{name}@{ranks}", description=f"{preset.description}; at {ranks} ranks")
    if tp is not None:
        if tp < 1 or preset.world_size % tp:
            raise ValueError(f"--tp {tp}: must divide the world size {preset.world_size}")
        preset = replace(preset, tp=tp, name=f"{preset.name}/tp{tp}")
    return preset
