"""Prices from a profile: a Chrome trace of the real step (``torch.profiler``), read by torch
2.13's own profile-guided estimation (``torch._inductor.fx_passes.profile_guided_estimation``,
which inductor's overlap scheduler uses under
``aten_distributed_optimizations.profile_guided_estimations_profile_path``).

Why this exists: the roofline and torch's NCCL model are estimates (issue 28); a user who has
profiled the step on the cluster has the real times. ``--profile TRACE.json`` prices with them
wherever the trace has them, and with the preset elsewhere:
- **Compute.** A node whose op ran with the same input shapes, strides and dtype in the trace
  takes the GPU time of its kernels there (torch's ``ProfileData.lookup_op``, an exact match; the
  CPU attention ops this machine traces are looked up under their CUDA names). Nodes inductor
  fuses keep the fused roofline (``Estimator.fused_costs``): an eager trace times them unfused,
  a compiled one under triton kernel names no graph node has.
- **Collectives.** The trace's NCCL kernels (torch's parser: collective name, the process group's
  ranks, message elements, dtype, duration) become measured series (``planner.measured``), one
  per collective kind and group layout; the graph's groups take them as they take a
  ``--collectives`` file: by size and ranks per node, which come from the ranks (ranks fill nodes
  in order, ``ranks_per_node`` a node). Sizes between two measured ones are interpolated, others
  extrapolated and reported, as for any measurement.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import torch.fx as fx

from planner.io import read_regular_text
from planner.measured import Measured, MeasuredError, Series

MAX_TRACE_BYTES = 1 << 30
# nccl message elements to the full tensor (planner's wire bytes): an all_gather's output, a
# reduce_scatter's input, an all_reduce's buffer (torch's parser reads "In/Out msg nelems")
_WIRE_NELEMS = {"all_gather": "out_nelems", "reduce_scatter": "in_nelems", "all_reduce": "in_nelems"}


class ProfileError(MeasuredError):
    """A trace that cannot be used; the message names the file."""


@dataclass
class Profile:
    """A trace read by torch's parser: ``data`` (its ``ProfileData``), the collectives as
    ``series``, and ``digest``, of the trace's text (a plan recorded on one trace is not taken for
    another's: the preset's name carries it)."""

    path: str
    data: object
    series: list[Series]
    digest: str

    def op_ms(self, n: fx.Node) -> float | None:
        """The trace's time for this node's op at its input shapes, strides and dtype, or None."""
        from torch._inductor.fx_passes import profile_guided_estimation as pge

        from fxglue.cpu_compat import _sdpa_aliases

        target = _sdpa_aliases().get(n.target, n.target)  # the CPU attention ops under their CUDA names
        if not hasattr(target, "_schema"):
            return None
        name = f"{target.namespace}::{target._schema.name.split('::')[-1]}"
        shapes = pge._get_node_input_shapes_and_strides(n)
        if shapes is None:
            return None
        return self.data.lookup_op(name, shapes[0], shapes[1], pge._get_node_dtype(n))


def read_profile(path: str | Path, ranks_per_node: int) -> Profile:
    """The trace at ``path``; ``ranks_per_node``: how ranks fill a node (the preset's)."""
    from torch._inductor.fx_passes.profile_guided_estimation import ProfileData

    try:  # a FIFO or a device would block or read without end (planner.io)
        text = read_regular_text(path, MAX_TRACE_BYTES, "profile trace")
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ProfileError(f"{path}: not a Chrome trace (not JSON: {e.msg} at line {e.lineno})") from None
    except ValueError as e:
        raise ProfileError(str(e)) from None
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise ProfileError(f"{path}: not a Chrome trace (no traceEvents list; torch.profiler's "
                           "export_chrome_trace writes one)")
    _check_events(data["traceEvents"], str(path))
    parsed = ProfileData()
    try:
        parsed._parse_pg_configs(data)
        parsed._parse_events(data)
        parsed._build_indices()
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ProfileError(f"{path}: torch's trace parser cannot read it ({type(e).__name__}: {e})") from None
    from planner.problem import MAX_MS

    long_op = next((op for op in parsed.ops if not op.duration_us / 1e3 < MAX_MS), None)
    if long_op is not None:  # the sum of its kernels: each was checked, their sum is a price too
        raise ProfileError(f"{path}: op {long_op.op_name} ran {long_op.duration_us:g} µs in its kernels, beyond any "
                           f"step (below {MAX_MS * 1e3:g})")
    series = _collective_series(parsed, str(path), ranks_per_node)
    if not series and not parsed.ops:
        raise ProfileError(f"{path}: no GPU kernel with an op's input shapes or a collective's metadata "
                           "(record with torch.profiler, record_shapes=True)")
    return Profile(str(path), parsed, series, hashlib.sha256(text.encode()).hexdigest()[:8])


def _check_events(events: list, path: str) -> None:
    """Refuse, naming the event, what torch's parser would take silently and price wrongly: a GPU
    kernel whose duration is not a finite time below ``planner.problem.MAX_MS``; an NCCL kernel
    whose message element counts are not whole numbers within ``MAX_BYTES``, whose dtype torch does
    not know (its parser would count 1 byte an element) or whose group names a rank twice."""
    import torch

    from planner.problem import MAX_BYTES, MAX_MS

    for i, ev in enumerate(events):
        if not isinstance(ev, dict) or ev.get("cat") != "kernel":
            continue
        args = ev.get("args") if isinstance(ev.get("args"), dict) else {}
        where = f"{path}: traceEvents[{i}] ({str(ev.get('name', '?'))[:60]})"
        dur = ev.get("dur", 0.0)
        if isinstance(dur, bool) or not isinstance(dur, (int, float)) or not math.isfinite(dur) or dur < 0 \
                or dur >= MAX_MS * 1e3:
            raise ProfileError(f"{where}: dur {dur!r} is not a duration in µs from 0 to below {MAX_MS * 1e3:g}")
        if "Collective name" not in args:
            continue
        dtype = args.get("dtype", "")
        known = isinstance(dtype, str) and isinstance(getattr(torch, dtype.lower(), None), torch.dtype)
        if not known:
            raise ProfileError(f"{where}: dtype {dtype!r} is not a dtype torch knows (e.g. BFloat16, Float)")
        size = getattr(torch, dtype.lower()).itemsize
        for field in ("In msg nelems", "Out msg nelems"):
            n = args.get(field, 0)
            if isinstance(n, bool) or not isinstance(n, int) or n < 0 or n * size >= MAX_BYTES:
                raise ProfileError(f"{where}: {field} {n!r} is not a whole number of elements below "
                                   f"{MAX_BYTES // size:,}")
        ranks = args.get("Process Group Ranks", "")
        if isinstance(ranks, str) and ranks.startswith("["):
            try:
                listed = json.loads(ranks)
            except ValueError:
                listed = None
            if not isinstance(listed, list) or not all(type(r) is int and r >= 0 for r in listed):
                raise ProfileError(f"{where}: Process Group Ranks {ranks[:60]!r} is not a list of ranks")
            if len(set(listed)) != len(listed):
                raise ProfileError(f"{where}: Process Group Ranks {ranks[:60]!r} names a rank twice")


def _collective_series(parsed, path: str, ranks_per_node: int) -> list[Series]:
    """One series per (collective kind, ranks, dtype): the mean duration at each message size."""
    times: dict[tuple, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for rec in parsed.collectives:
        kind = parsed._normalize_collective_name(rec.collective_name)
        if kind not in _WIRE_NELEMS or not rec.pg_ranks:
            continue
        wire = getattr(rec, _WIRE_NELEMS[kind]) * parsed._dtype_elem_bytes(rec.dtype)
        times[kind, rec.pg_ranks, rec.dtype][wire].append(rec.duration_us / 1e3)
    out = []
    for (kind, ranks, dtype), by_size in sorted(times.items()):
        per_node = max(Counter(r // ranks_per_node for r in ranks).values())
        points = tuple((b, sum(ms) / len(ms)) for b, ms in sorted(by_size.items()))
        out.append(Series(kind, points, f"{path}: {kind} on ranks {_ranks(ranks)}, {dtype}", ranks=len(ranks),
                          ranks_per_node=per_node))
    return out


def _ranks(ranks: tuple[int, ...]) -> str:
    return f"{ranks[0]}..{ranks[-1]} ({len(ranks)})" if len(ranks) > 4 else str(list(ranks))


def with_profile(preset, path):
    """``preset`` priced by the trace at ``path`` where it has a time (see the module docstring);
    a bad trace raises ``ProfileError``."""
    from dataclasses import replace

    if not path:
        return preset
    profile = read_profile(path, preset.ranks_per_node)
    # measurements the user gave with --collectives come first: they win where both cover a group
    earlier = list(preset.measured.series) if preset.measured is not None else []
    measured = Measured(earlier + profile.series) if earlier or profile.series else None
    return replace(preset, profile=profile, measured=measured, name=f"{preset.name}+profile-{profile.digest}",
                   description=f"{preset.description}; priced by the profile {path} where it has times")
