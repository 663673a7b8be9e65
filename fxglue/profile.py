"""Prices from a profile: a Chrome trace of the real step (``torch.profiler``), read by torch
2.13's own profile-guided estimation (``torch._inductor.fx_passes.profile_guided_estimation``,
which inductor's overlap scheduler uses under
``aten_distributed_optimizations.profile_guided_estimations_profile_path``).

Why this exists: the roofline and torch's NCCL model are estimates; a user who has
profiled the step on the cluster has the real times. ``--profile TRACE.json`` prices with them
wherever the trace has them, and with the preset elsewhere:
- **Compute.** A node whose op ran with the same input shapes, strides and dtype in the trace
  takes the GPU time of its kernels there (torch's ``ProfileData.lookup_op``, an exact match; the
  CPU attention ops this machine traces are looked up under their CUDA names). Nodes inductor
  fuses keep the fused roofline (``Estimator.fused_costs``): an eager trace times them unfused,
  a compiled one under triton kernel names no graph node has.
- **Collectives.** The trace's NCCL kernels (torch's parser: collective name, the process group's
  ranks, message elements, dtype, duration) become measured series (``planner.cost.measured``), one
  per collective kind and group layout; the graph's groups take them as they take a
  ``--collectives`` file: by size and ranks per node, which come from the ranks (ranks fill nodes
  in order, ``ranks_per_node`` a node). Sizes between two measured ones are interpolated, others
  extrapolated and reported, as for any measurement.

**A trace of a CPU run** (``cpu=True``; ``--profile-cpu``), such as the gloo ranks of
``examples/train_compiled.py bench`` write on a machine without a GPU: torch's parser reads times
from GPU kernels only (an op's ``kernel`` events, an NCCL kernel's metadata), so it reads nothing
from it. What such a trace can price is the ops it timed with their input shapes, by their own
CPU time (the same exact match on name, shapes, strides and dtype): the extern kernels inductor
calls (``aten::mm``, ``addmm``, ``bmm``, attention) and every op of an eager step. It cannot price
collectives (gloo's work runs on its own threads, and the op the step calls carries no message
metadata: the trace has no collective times), nor inductor's fused C++ kernels (they run under no
aten name and with no shapes: they keep the fused roofline), and its times are the CPU's: a
problem priced by it models that CPU run, not a GPU cluster.

Inductor calls an extern kernel with ``out=`` (``extern_kernels.mm(a, b, out=buf)``), so in a
compiled step's trace, GPU or CPU, the op lists its output as one more input; a node is looked up
with its output so appended when its own inputs find nothing.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import torch.fx as fx

from planner.core.io import read_regular_text
from planner.cost.measured import Measured, MeasuredError, Series

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
    cpu: bool = False  # a trace of a CPU run, its ops priced by their CPU time (the module docstring)

    def op_ms(self, n: fx.Node) -> float | None:
        """The trace's time for this node's op at its input shapes, strides and dtype, or None."""
        from torch._inductor.fx_passes import profile_guided_estimation as pge

        from fxglue.cpu_compat import sdpa_aliases

        target = sdpa_aliases().get(n.target, n.target)  # the CPU attention ops under their CUDA names
        if not hasattr(target, "_schema"):
            return None
        name = f"{target.namespace}::{target._schema.name.split('::')[-1]}"
        shapes = pge._get_node_input_shapes_and_strides(n)
        if shapes is None:
            return None
        dtype = pge._get_node_dtype(n)
        found = self.data.lookup_op(name, shapes[0], shapes[1], dtype)
        out = _shape_and_stride(n.meta.get("val")) if found is None else None
        if out is not None:  # the out= form a compiled step's extern kernels are called in
            found = self.data.lookup_op(name, shapes[0] + (out[0],), shapes[1] + (out[1],), dtype)
        return found


def _shape_and_stride(val) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """A tensor value's concrete shape and stride (None: not one tensor, or symbolic)."""
    import torch

    if not isinstance(val, torch.Tensor):
        return None
    try:
        return tuple(int(d) for d in val.shape), tuple(int(d) for d in val.stride())
    except (TypeError, ValueError):  # an unbacked symbolic size has no value
        return None


def read_profile(path: str | Path, ranks_per_node: int, cpu: bool = False) -> Profile:
    """The trace at ``path``; ``ranks_per_node``: how ranks fill a node (the preset's); ``cpu``:
    a trace of a CPU run, its ops priced by their CPU time (the module docstring)."""
    from torch._inductor.fx_passes.profile_guided_estimation import ProfileData

    try:  # a FIFO or a device would block or read without end (planner.core.io)
        text = read_regular_text(path, MAX_TRACE_BYTES, "profile trace")
    except ValueError as e:
        raise ProfileError(str(e)) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ProfileError(f"{path}: not a Chrome trace (not JSON: {e.msg} at line {e.lineno})") from None
    except ValueError as e:  # an integer of more digits than Python converts (sys.get_int_max_str_digits)
        raise ProfileError(f"{path}: not a Chrome trace ({str(e)[:80]})") from None
    except RecursionError:  # the decoder recurses once per nested list or object
        raise ProfileError(f"{path}: not a Chrome trace (JSON nested deeper than Python can read)") from None
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise ProfileError(f"{path}: not a Chrome trace (no traceEvents list; torch.profiler's "
                           "export_chrome_trace writes one)")
    _check_events(data["traceEvents"], str(path))
    _check_pg_configs(data, str(path))
    if cpu:
        _check_cpu_trace(data["traceEvents"], str(path))
    parsed = ProfileData()
    try:  # RecursionError: shapes nested past Python's stack (the parser recurses into them)
        parsed._parse_pg_configs(data)
        parsed._parse_events(data)
        if cpu:  # torch's own op parsing, with the op's CPU time where a GPU trace has its kernels'
            for ev in data["traceEvents"]:
                if _is_cpu_op(ev):
                    parsed._parse_op(ev.get("name", ""), ev["args"], ev["dur"])
        parsed._build_indices()
    except (KeyError, TypeError, ValueError, AttributeError, RecursionError) as e:
        raise ProfileError(f"{path}: torch's trace parser cannot read it "
                           f"({type(e).__name__}: {str(e)[:200]})") from None
    from planner.core.problem import MAX_MS

    long_op = next((op for op in parsed.ops if not op.duration_us / 1e3 < MAX_MS), None)
    if long_op is not None:  # the sum of its kernels: each was checked, their sum is a price too
        raise ProfileError(f"{path}: op {long_op.op_name} ran {long_op.duration_us:g} µs in its kernels, beyond any "
                           f"step (below {MAX_MS * 1e3:g})")
    series = _collective_series(parsed, str(path), ranks_per_node)
    if cpu and not parsed.ops:
        raise ProfileError(f"{path}: no CPU op with input shapes (record with torch.profiler, record_shapes=True)")
    if not series and not parsed.ops:
        cpu_run = any(_is_cpu_op(ev) for ev in data["traceEvents"])
        raise ProfileError(f"{path}: no GPU kernel with an op's input shapes or a collective's metadata "
                           "(record with torch.profiler, record_shapes=True" +
                           ("; a CPU run's trace prices by its ops' CPU times with --profile-cpu)" if cpu_run else ")"))
    return Profile(str(path), parsed, series, hashlib.sha256(text.encode()).hexdigest()[:8], cpu)


def _is_cpu_op(ev) -> bool:
    """An op of the trace's CPU side with input shapes and a duration (what a CPU trace prices)."""
    return (isinstance(ev, dict) and ev.get("cat") == "cpu_op" and isinstance(ev.get("args"), dict)
            and bool(ev["args"].get("Input Dims")) and "dur" in ev)


def _check_cpu_trace(events: list, path: str) -> None:
    """A trace given as a CPU run's: no GPU kernel (a GPU run's ops are timed by their kernels),
    and every op it prices timed by a duration as ``_check_events`` holds a kernel's."""
    from planner.core.problem import MAX_MS

    for i, ev in enumerate(events):
        if isinstance(ev, dict) and ev.get("cat") == "kernel":
            raise ProfileError(f"{path}: traceEvents[{i}] ({str(ev.get('name', '?'))[:60]}) is a GPU kernel: a GPU "
                               "run's trace, priced by its kernels (drop --profile-cpu)")
        if _is_cpu_op(ev):
            dur = ev["dur"]
            if isinstance(dur, bool) or not isinstance(dur, (int, float)) or not 0 <= dur < MAX_MS * 1e3:
                raise ProfileError(f"{path}: traceEvents[{i}] ({str(ev.get('name', '?'))[:60]}): dur {_shown(dur)} "
                                   f"is not a duration in µs from 0 to below {MAX_MS * 1e3:g}")


def _check_events(events: list, path: str) -> None:
    """Refuse, naming the event, what torch's parser would take silently and price wrongly: a GPU
    kernel whose duration is not a finite time below ``planner.core.problem.MAX_MS``; an NCCL kernel
    whose message element counts are not whole numbers within ``MAX_BYTES``, whose dtype torch does
    not know (its parser would count 1 byte an element) or whose group names a rank twice."""
    import torch

    from planner.core.problem import MAX_BYTES, MAX_MS

    for i, ev in enumerate(events):
        if not isinstance(ev, dict) or ev.get("cat") != "kernel":
            continue
        args = ev.get("args") if isinstance(ev.get("args"), dict) else {}
        where = f"{path}: traceEvents[{i}] ({str(ev.get('name', '?'))[:60]})"
        dur = ev.get("dur", 0.0)
        # compared, not converted: JSON integers have no bound, and float() of a long one overflows
        # (NaN fails the comparison too)
        if isinstance(dur, bool) or not isinstance(dur, (int, float)) or not 0 <= dur < MAX_MS * 1e3:
            raise ProfileError(f"{where}: dur {_shown(dur)} is not a duration in µs from 0 to below "
                               f"{MAX_MS * 1e3:g}")
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
                raise ProfileError(f"{where}: {field} {_shown(n)} is not a whole number of elements below "
                                   f"{MAX_BYTES // size:,}")
        ranks = args.get("Process Group Ranks", "")
        if isinstance(ranks, str) and ranks.startswith("["):  # what torch's parser reads; else pg_config's
            try:
                listed = json.loads(ranks)
            except (ValueError, RecursionError):
                listed = None
            _check_ranks(listed, f"{where}: Process Group Ranks {ranks[:60]!r}")


def _check_pg_configs(data: dict, path: str) -> None:
    """The groups of the trace's ``distributedInfo.pg_config``, which torch's parser takes for an
    NCCL kernel whose event does not list its ranks: as ``_check_events`` checks an event's."""
    info = data.get("distributedInfo")
    config = info.get("pg_config") if isinstance(info, dict) else None
    if isinstance(config, dict):  # torch writes either form
        entries = list(config.items())
    elif isinstance(config, list):
        entries = [(e.get("pg_name", "") if isinstance(e, dict) else "", e) for e in config]
    else:
        entries = []
    for name, entry in entries:
        ranks = entry.get("ranks") if isinstance(entry, dict) else None
        if ranks:  # torch's parser skips a group without ranks; a malformed entry is its to refuse
            _check_ranks(ranks, f"{path}: distributedInfo.pg_config {str(name)[:60]!r}: ranks {_shown(ranks)}")


def _check_ranks(listed, what: str) -> None:
    """A group's ranks: distinct whole numbers >= 0 (the group's size is how many it lists)."""
    if not isinstance(listed, list) or not all(type(r) is int and r >= 0 for r in listed):
        raise ProfileError(f"{what} is not a list of ranks")
    if len(set(listed)) != len(listed):
        raise ProfileError(f"{what} names a rank twice")


def _shown(value) -> str:
    """A figure for a message: its repr, cut short (a JSON number or list may be any length)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


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


def with_profile(preset, path, cpu: bool = False):
    """``preset`` priced by the trace at ``path`` where it has a time (see the module docstring;
    ``cpu``: a trace of a CPU run); a bad trace raises ``ProfileError``."""
    from dataclasses import replace

    if not path:
        return preset
    profile = read_profile(path, preset.ranks_per_node, cpu=cpu)
    # measurements the user gave with --collectives come first: they win where both cover a group
    earlier = list(preset.measured.series) if preset.measured is not None else []
    measured = Measured(earlier + profile.series) if earlier or profile.series else None
    kind = "cpu-profile" if cpu else "profile"  # a CPU run's prices are another preset's
    return replace(preset, profile=profile, measured=measured, name=f"{preset.name}+{kind}-{profile.digest}",
                   description=f"{preset.description}; priced by the {'CPU run ' if cpu else ''}profile {path} "
                               "where it has times")
