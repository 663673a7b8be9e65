"""The torch-free bucketing problem and plan: frozen, validated, JSON round-trippable.

Why this exists: the planner, the verifier and the simulator must see exactly what torch's
``OverlapPreservingBucketer`` sees, without torch. ``fxglue.extract_problem`` writes a
``Problem`` at the moment torch would start bucketing; every planner answers with a ``Plan``.
Only names of FX nodes cross this boundary.

Conventions
- Positions (``pos``) index torch's ``scheduled`` order (the order after overlap scheduling).
- ``nodes`` lists the *pinned* nodes, in schedule order: every collective start and wait,
  every compute node (one with a FLOP formula, which is what torch calls compute), and every
  node that hides a collective. ``Node.deps`` holds each node's immediate pinned
  predecessors (the transitive reduction of data dependence restricted to pinned nodes), as
  indices into ``nodes``; reachability through unpinned nodes is preserved.
- A collective is ``hidden`` when torch estimated it fully hidden (``exposed_ms == 0``),
  ``partly`` when some but not all of it is hidden, ``exposed`` when none is. Torch protects
  the hiding nodes of hidden collectives only.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator

# of a Problem: 2 added the compute of unpinned nodes (``Node.unpinned_ms``); a problem without
# any is written as version 1, so every earlier problem reads, writes and fingerprints as before,
# and a reader that knows only version 1 refuses the problems whose compute it would undercount
# 3 added the contention factor (``Problem.contention``): a problem priced with overlap that is
# not free is written as version 3, so a reader that knows none refuses it instead of pricing it
# as if overlap were free
PROBLEM_SCHEMA_VERSIONS = (1, 2, 3)
SCHEMA_VERSION = 1
# a slow-down beyond this is no measurement of overlap (the worst published is 2x: a GEMM whose
# single wave NCCL's blocks split in two, ``planner.search.scenarios``)
MAX_CONTENTION = 10.0
# of a Plan: 2 added a bucket's named positions (``Bucket.issue_before`` / ``wait_before``); a
# plan that uses none of them is written as version 1, so every earlier plan reads and writes as
# before, and a reader that knows no positions refuses only the plans that have them
PLAN_SCHEMA_VERSIONS = (1, 2)

Kind = Literal["all_gather", "reduce_scatter", "all_reduce"]
NodeKind = Literal["start", "wait", "compute", "other"]
Status = Literal["hidden", "partly", "exposed"]
JSONValue = Any

# Sane bounds for the numbers of a problem file. A value beyond them is a corrupt or hostile
# file, not a cluster: NaN or Infinity poisons every comparison, 1e308 ms overflows the step
# model's integer nanoseconds and 1e30 bytes CP-SAT's int64 arithmetic, and a bandwidth of
# 1e-300 GB/s prices a collective at Infinity. The largest values in committed problems are
# 2.1e9 bytes, 14,000 ms (a table's last breakpoint) and 50 GB/s.
MAX_BYTES = 2**62
MAX_MS = 1e9
MIN_GBPS = 1e-9


def _ms(**kw):
    """A time in ms: finite, non-negative, below MAX_MS."""
    return Field(ge=0, lt=MAX_MS, allow_inf_nan=False, **kw)


def _bytes(**kw):
    """A byte count: non-negative, below MAX_BYTES."""
    return Field(ge=0, lt=MAX_BYTES, **kw)


def _gbps(**kw):
    """A bandwidth in GB/s: finite, above MIN_GBPS."""
    return Field(gt=MIN_GBPS, allow_inf_nan=False, **kw)


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=False)


class Link(_Frozen):
    """The cost of one collective on one process group: ``time_ms(kind, wire_bytes)``.

    Two models, one of them set:
    - α-β (``latency_ms``, ``bandwidth_gbps``): ``latency_ms + factor(kind) * bytes /
      bandwidth`` with the ring factors of nccl-tests' bus bandwidth: (n-1)/n for all_gather /
      reduce_scatter (bytes = the full, unsharded tensor) and 2(n-1)/n for all_reduce;
    - ``table``: per kind, breakpoints ``(wire_bytes, ms)`` of any cost curve, interpolated
      linearly between them and extended past the last one along the last segment.
      ``fxglue.costs`` samples torch's NCCL-derived model (``torch._inductor.comm_analysis``)
      this way, so the planner prices any bucket size the way torch does, without torch.
    ``wire_bytes`` is always the full (unsharded) tensor; a bucket is priced at its members' sum,
    so it pays the fixed part of the curve once.
    """

    pg: str
    group_size: int = Field(ge=1)
    latency_ms: float | None = _ms(default=None)
    bandwidth_gbps: float | None = _gbps(default=None, description="bus bandwidth in GB/s (1e9 bytes)")
    table: dict[Kind, tuple[tuple[int, float], ...]] | None = Field(
        default=None, description="per kind: (wire_bytes, ms) breakpoints, bytes strictly increasing from 0")
    hardware: str = ""

    @model_validator(mode="after")
    def _one_model(self):
        alpha_beta = self.latency_ms is not None and self.bandwidth_gbps is not None
        if self.table is None and not alpha_beta:
            raise ValueError(f"link {self.pg}: needs latency_ms and bandwidth_gbps, or a table")
        if self.table is not None and (self.latency_ms is not None or self.bandwidth_gbps is not None):
            raise ValueError(f"link {self.pg}: a table link has no latency_ms / bandwidth_gbps")
        for kind, points in (self.table or {}).items():
            where = f"link {self.pg}: table[{kind}]"
            if len(points) < 2 or points[0][0] != 0:
                raise ValueError(f"{where}: needs at least two breakpoints, the first at 0 bytes")
            for (b0, _), (b1, t1) in zip(points, points[1:]):
                if b1 <= b0:
                    raise ValueError(f"{where}: bytes must increase ({b0} then {b1})")
            for b, t in points:
                if not (math.isfinite(t) and 0 <= t < MAX_MS) or not 0 <= b < MAX_BYTES:
                    raise ValueError(f"{where}: breakpoint ({b}, {t}) needs 0 <= bytes < 2**62 and a finite "
                                     f"time 0 <= ms < {MAX_MS:g}")
        return self

    def factor(self, kind: str) -> float:
        n = self.group_size
        if n <= 1:
            return 0.0
        return 2 * (n - 1) / n if kind == "all_reduce" else (n - 1) / n

    def time_ms(self, kind: str, wire_bytes: int) -> float:
        if self.table is None:
            return self.latency_ms + self.factor(kind) * wire_bytes / (self.bandwidth_gbps * 1e6)
        points = self.table.get(kind)
        if points is None:
            raise ValueError(f"link {self.pg}: its table has no {kind}")
        k = bisect.bisect_right(points, (wire_bytes, math.inf)) - 1
        k = min(max(k, 0), len(points) - 2)  # past the last breakpoint: extend the last segment
        (b0, t0), (b1, t1) = points[k], points[k + 1]
        return max(0.0, t0 + (t1 - t0) * (wire_bytes - b0) / (b1 - b0))  # a falling last segment stops at 0

    def fixed_ms(self, kind: str) -> float:
        """What a collective of this kind costs at 0 bytes: what merging saves per collective."""
        return self.time_ms(kind, 0)


class BucketingCost(_Frozen):
    """What a merged bucket costs beyond its collective, as torch's merge functions build it.

    Why this exists: merging is not free. ``torch._inductor.fx_passes.bucketing`` copies the
    members' inputs into one buffer before the merged collective (``cat``; for all_gather into
    the rank's slice of the output) and, for all_gather, copies every member's output out of
    the interleaved buffer afterwards (``split_with_sizes`` on dim 1, then a ``reshape`` that
    must copy); reduce_scatter and all_reduce outputs are views. ``coalesced`` reduce_scatters
    copy nothing. These copies run on the compute stream; each is priced by the roofline as
    bytes read plus bytes written over ``copy_gbps``. Every collective issued (a merged bucket
    or a lone collective) also costs ``launch_ms`` on the compute stream, so merging n
    collectives saves n - 1 launches. See ``copy_bytes``.
    """

    copy_gbps: float = _gbps(description="memory bandwidth for the copies, GB/s (1e9 bytes)")
    launch_ms: float = _ms(description="per collective issued, on the compute stream")
    source: str = ""

    def copy_ms(self, nbytes: int) -> float:
        return 2 * nbytes / (self.copy_gbps * 1e6)  # read + write


def copy_bytes(kind: str, wire_bytes: list[int] | tuple[int, ...], group_size: int,
               bucket_mode: str) -> tuple[int, int]:
    """(bytes copied in before the merged start, bytes copied out after its wait) for a bucket
    of members with these ``wire_bytes``; (0, 0) for a lone collective (torch does not merge it).
    See ``BucketingCost`` for where each copy comes from."""
    if len(wire_bytes) < 2:
        return 0, 0
    total = sum(wire_bytes)
    if kind == "all_gather":  # coalesced mode falls back to the default merge for all_gather
        return sum(b // max(group_size, 1) for b in wire_bytes), total
    if kind == "reduce_scatter" and bucket_mode == "coalesced":
        return 0, 0
    return total, 0


class Collective(_Frozen):
    """One collective as torch's bucketer sees it (start node name = its id)."""

    name: str
    wait: str
    kind: Kind
    pg: str
    key: str = Field(description="torch's full bucket key under the problem's bucket mode")
    dtype: str
    size_bytes: int = _bytes(description="torch's memory footprint; what the bucket cap counts")
    wire_bytes: int = _bytes(description="bytes the cost model charges (full tensor)")
    est_ms: float = _ms()
    exposed_ms: float = _ms()
    start_pos: int = Field(ge=0)
    wait_pos: int = Field(ge=0)
    hiding: tuple[str, ...] = ()
    status: Status
    # torch's merge of an all_gather erases the dtype conversion that feeds it (when it is that
    # conversion's only user) and does the conversion in the bucket's copy instead; a pinned node
    # that goes so is listed here, because it may hide another collective: it then runs, and hides,
    # at the bucket's merged start (planner.core.positions.folded_positions)
    folded: tuple[str, ...] = Field(default=(), description="pinned nodes torch's merge erases when this joins a bucket")
    fsdp: bool = False
    # the transformer block (torchtitan's bucket plan entry) whose parameters it moves, and in which
    # phase; None where it moves no single block's parameters or the workload has no blocks
    module: str | None = Field(default=None, description="block whose parameters it moves")
    phase: Literal["forward", "backward"] | None = None


class Node(_Frozen):
    """A pinned node: collective start/wait, compute, or another node that hides a collective."""

    name: str
    kind: NodeKind
    pos: int = Field(ge=0)
    est_ms: float = _ms()
    deps: tuple[int, ...] = ()
    # The compute of the unpinned nodes scheduled between the previous pinned node and this one
    # (version 2): elementwise and reduction kernels that hide nothing still take the compute
    # stream's time. It belongs to this place in the schedule, not to the node: it runs before
    # whatever is issued or waited here (a bucket named at this node included), and stays here
    # when this node is a start, wait or folded conversion that a plan moves or erases.
    unpinned_ms: float = _ms(default=0.0, description="compute of the unpinned nodes scheduled just before it")

    @property
    def own_ms(self) -> float:
        """This node's own time on the compute stream: its estimate for a compute or other node,
        none for a start or wait."""
        return self.est_ms if self.kind in ("compute", "other") else 0.0

    @property
    def stream_ms(self) -> float:
        """What the compute stream spends here: the unpinned compute before this node and its own."""
        return self.unpinned_ms + self.own_ms


class Timeline(_Frozen):
    """Torch's per-process-group event list: ``types[i]`` is s(tart), w(ait) or c(ompute)."""

    pg: str
    nodes: tuple[int, ...]
    types: str

    @model_validator(mode="after")
    def _same_length(self):
        if len(self.nodes) != len(self.types):
            raise ValueError(f"timeline {self.pg}: {len(self.nodes)} nodes but {len(self.types)} types")
        if set(self.types) - set("swc"):
            raise ValueError(f"timeline {self.pg}: types must be s, w or c")
        return self


class CollectiveBuffers(_Frozen):
    """What one collective allocates and frees, as torch's memory estimator sees it
    (``torch/_inductor/fx_passes/memory_estimator.py``): its start allocates ``out_bytes``, alive
    until the scheduled position ``out_last_use`` of that storage's last user (its wait);
    ``in_bytes``: its input storage when the start is that storage's last use (freed there),
    allocated at scheduled position ``in_alloc`` (-1: a graph input). ``wait_bytes``: the storage
    its wait allocates (torch's functional wait returns a fresh one), alive until scheduled position
    ``wait_last_use``; None in problems extracted before waits were recorded apart (their waits'
    storages are in the graph's own memory there)."""

    out_bytes: int = _bytes()
    out_last_use: int = Field(ge=0)
    in_bytes: int = _bytes(default=0)
    in_alloc: int = Field(default=-1, ge=-1)
    wait_bytes: int | None = _bytes(default=None)
    wait_last_use: int | None = Field(default=None, ge=0)
    # an all_gather whose dtype conversion torch's merge folds into the bucket's copy-in (torch's
    # has_mergeable_all_gather_convert_dtype): the bytes of the conversion's input, read by that copy
    # when merged; and when the conversion is that storage's last use, where it was allocated (-1: a
    # graph input) and freed (the conversion's position) -- merged, it is freed at the copy-in
    fold_in_bytes: int | None = _bytes(default=None)
    fold_in_alloc: int | None = Field(default=None, ge=-1)
    fold_in_last_use: int | None = Field(default=None, ge=0)


class MemoryProfile(_Frozen):
    """The graph's own memory over torch's scheduled order, without the collectives' buffers
    (``buffers`` holds those, so a plan can put them where its buckets are: ``planner.cost.memory``).

    ``segment_peak_bytes[j]``: the most bytes the graph's own storages hold at any node of segment
    ``j``, as torch's estimator counts them (after a node's allocations, before its frees): segment
    0 is the scheduled positions before the first pinned node, segment ``j`` (j >= 1) those from
    pinned node ``j - 1`` up to pinned node ``j``. Where the exact profile (runs) is present, the
    waits' storages are buffers too and not counted here. Written by ``fxglue.extract`` with torch's
    own alias tracker; every device counted (a CPU trace would count nothing under torch's filter)."""

    segment_peak_bytes: tuple[int, ...]
    buffers: dict[str, CollectiveBuffers]
    source: str = ""
    # The exact profile (``planner.cost.memory``), absent from problems extracted before it: the graph's
    # own memory in runs of scheduled positions, cut at every pinned node (each pinned node a run of
    # its own) and wherever a collective's buffer is allocated or freed at a fixed position, so that
    # every buffer is alive over whole runs; and what the graph's own storages hold just before
    # each pinned node, where a start or wait placed before that node happens.
    run_starts: tuple[int, ...] | None = Field(default=None, description="first scheduled position of each run")
    run_peak_bytes: tuple[int, ...] | None = Field(default=None, description="own bytes at the fullest node of each run")
    before_bytes: tuple[int, ...] | None = Field(default=None, description="own bytes just before each pinned node")


def _canonical(data: dict) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


class Problem(_Frozen):
    """Everything a planner, the verifier and the simulator need, with no torch inside."""

    schema_version: Literal[PROBLEM_SCHEMA_VERSIONS] = SCHEMA_VERSION
    fingerprint: str = ""
    bucket_mode: Literal["default", "custom_ops", "custom_ops_multidtype", "coalesced"]
    bucket_cap_bytes: int = Field(gt=0, lt=MAX_BYTES)
    n_scheduled: int = Field(ge=0)
    collectives: tuple[Collective, ...]
    nodes: tuple[Node, ...]
    timelines: tuple[Timeline, ...]
    links: tuple[Link, ...]
    bucketing: BucketingCost | None = Field(default=None, description="copies and launches; none: merging is free")
    memory: MemoryProfile | None = Field(default=None, description="the graph's own memory and the collectives' buffers")
    # The cluster's contention: compute-stream work runs this many times slower while any
    # collective is in flight (``planner.cost.simulator``). Every planner, bound and report reads
    # it through the simulator; 1: overlap is free, as torch's own estimator assumes.
    contention: float = Field(default=1.0, ge=1.0, le=MAX_CONTENTION, allow_inf_nan=False,
                              description="compute slow-down beside collectives; 1: overlap is free")
    meta: dict[str, JSONValue] = Field(default_factory=dict, description="provenance; not fingerprinted")

    @model_serializer(mode="wrap")
    def _contention_only_when_set(self, handler):
        """Contention 1 (overlap free) is not written nor fingerprinted: a problem without it reads,
        writes and fingerprints as it did before the field existed, and its plans stay bound to it."""
        data = handler(self)
        if data.get("contention") == 1.0:
            data.pop("contention", None)
        return data

    def content_fingerprint(self) -> str:
        data = self.model_dump(mode="json", exclude={"fingerprint", "meta"})
        # Fields added later are fingerprinted only when set, so problems written before they
        # existed keep their fingerprints (and their plans stay bound to them).
        for added in ("bucketing", "memory"):
            if data[added] is None:
                del data[added]
        if data.get("memory") is not None:
            for added in ("run_starts", "run_peak_bytes", "before_bytes"):
                if data["memory"][added] is None:
                    del data["memory"][added]
            for buf in data["memory"]["buffers"].values():
                for added in ("wait_bytes", "wait_last_use", "fold_in_bytes", "fold_in_alloc", "fold_in_last_use"):
                    if buf[added] is None:
                        del buf[added]
        for node in data["nodes"]:
            if not node["unpinned_ms"]:
                del node["unpinned_ms"]
        for coll in data["collectives"]:
            if not coll["folded"]:
                del coll["folded"]
            for added in ("module", "phase"):
                if coll[added] is None:
                    del coll[added]
        for link in data["links"]:
            for added in ("table", "latency_ms", "bandwidth_gbps"):
                if link[added] is None:
                    del link[added]
        return "sha256:" + hashlib.sha256(_canonical(data)).hexdigest()

    def with_fingerprint(self) -> "Problem":
        """This problem fingerprinted, at the lowest schema version that holds its content."""
        version = 3 if self.contention != 1.0 else 2 if any(n.unpinned_ms for n in self.nodes) else 1
        stamped = self.model_copy(update={"schema_version": version})
        return stamped.model_copy(update={"fingerprint": stamped.content_fingerprint()})

    def _check_folded(self, names: dict[str, int]) -> None:
        """A folded node is the direct input of its all_gather's start and nothing else's, folded
        once: torch folds the conversion whose only user is the all_gather
        (``has_mergeable_all_gather_convert_dtype``), and planners move it with that start."""
        folded_by: dict[str, str] = {}
        for i, c in enumerate(self.collectives):
            where = f"collectives[{i}] ({c.name})"
            for f in c.folded:
                if f not in names:
                    raise ValueError(f"{where}: folded node {f!r} is not among nodes")
                if self.nodes[names[f]].kind in ("start", "wait") or names[f] not in self.nodes[names[c.name]].deps:
                    raise ValueError(f"{where}: folded node {f!r} is not a direct input of its start")
                if f in folded_by:
                    raise ValueError(f"{where}: folded node {f!r} is folded by {folded_by[f]} too")
                folded_by[f] = c.name
        for i, n in enumerate(self.nodes):
            bad = [self.nodes[d].name for d in n.deps if self.nodes[d].name in folded_by
                   and folded_by[self.nodes[d].name] != n.name]
            if bad:
                raise ValueError(f"nodes[{i}] ({n.name}): depends on {bad[0]!r}, a conversion folded into "
                                 f"{folded_by[bad[0]]}, which only that start may use")

    @model_validator(mode="after")
    def _check(self):
        names: dict[str, int] = {}
        for i, n in enumerate(self.nodes):
            if n.name in names:
                raise ValueError(f"nodes[{i}]: duplicate node name {n.name!r}")
            names[n.name] = i
            for d in n.deps:
                if not 0 <= d < i:
                    raise ValueError(f"nodes[{i}] ({n.name}): dependency index {d} is not an earlier node")
            if i and n.pos <= self.nodes[i - 1].pos:
                raise ValueError(f"nodes[{i}] ({n.name}): positions must increase along nodes")
            if n.unpinned_ms and self.schema_version < 2:
                raise ValueError(f"nodes[{i}] ({n.name}): unpinned_ms is new in problem version 2 (this problem "
                                 "is version 1)")
        seen: set[str] = set()
        for i, c in enumerate(self.collectives):
            where = f"collectives[{i}] ({c.name})"
            if c.name in seen:
                raise ValueError(f"{where}: duplicate collective")
            seen.add(c.name)
            for ref, kind, pos in ((c.name, "start", c.start_pos), (c.wait, "wait", c.wait_pos)):
                j = names.get(ref)
                if j is None:
                    raise ValueError(f"{where}: {kind} node {ref!r} is not among nodes")
                if self.nodes[j].kind != kind or self.nodes[j].pos != pos:
                    raise ValueError(f"{where}: node {ref!r} is not a {kind} at position {pos}")
            if c.wait_pos <= c.start_pos:
                raise ValueError(f"{where}: wait is scheduled before its start")
            for h in c.hiding:
                if h not in names:
                    raise ValueError(f"{where}: hiding node {h!r} is not among nodes")
                # a node hides a collective only while it is in flight; one outside that interval
                # (a corrupt file) would leave the model's rule-7 window empty (IndexError later)
                if not c.start_pos < self.nodes[names[h]].pos < c.wait_pos:
                    raise ValueError(f"{where}: hiding node {h!r} at position {self.nodes[names[h]].pos} is not "
                                     f"between its start ({c.start_pos}) and its wait ({c.wait_pos})")
        # The structure of functional collectives: a start's only user is its wait, and a wait's
        # only input is its start. Planners rely on it, so it is part of a valid problem.
        start_of_wait = {c.wait: c.name for c in self.collectives}
        starts = {c.name for c in self.collectives}
        for i, n in enumerate(self.nodes):
            pred_names = [self.nodes[d].name for d in n.deps]
            if n.name in start_of_wait and pred_names != [start_of_wait[n.name]]:
                raise ValueError(f"nodes[{i}] ({n.name}): a wait must depend on its start only, found {pred_names}")
            bad = [d for d in pred_names if d in starts and start_of_wait.get(n.name) != d]
            if bad:
                raise ValueError(f"nodes[{i}] ({n.name}): depends on collective start {bad[0]!r}, "
                                 "which only its wait may use")
        self._check_folded(names)
        # positions index torch's scheduled order of n_scheduled nodes (the pinned ones are a
        # subset): a position at or past it is a corrupt file, and the bounds and polish take
        # n_scheduled + 1 as "past every position" (a fixed limit before a wait otherwise)
        if self.nodes and self.nodes[-1].pos >= self.n_scheduled:
            raise ValueError(f"n_scheduled is {self.n_scheduled}, but nodes[{len(self.nodes) - 1}] "
                             f"({self.nodes[-1].name}) is at position {self.nodes[-1].pos}: positions index the "
                             f"scheduled order, so n_scheduled must exceed every position")
        pgs: set[str] = set()
        for i, link in enumerate(self.links):
            if link.pg in pgs:  # which of two cost models would price the group is arbitrary
                raise ValueError(f"links[{i}]: a second link for process group {link.pg!r}")
            pgs.add(link.pg)
        for i, c in enumerate(self.collectives):
            if c.pg not in pgs:
                raise ValueError(f"collectives[{i}] ({c.name}): process group {c.pg!r} has no link (cost model)")
        for t in self.timelines:
            if t.pg not in pgs:
                raise ValueError(f"timeline {t.pg}: process group {t.pg!r} has no link (cost model)")
            for j in t.nodes:
                if not 0 <= j < len(self.nodes):
                    raise ValueError(f"timeline {t.pg}: node index {j} out of range")
        self._check_memory()
        if self.fingerprint and self.fingerprint != self.content_fingerprint():
            raise ValueError("fingerprint does not match the content (the file was edited or corrupted)")
        return self

    def _check_memory(self) -> None:
        """The memory profile, when there is one: a segment per pinned node and one more, buffers
        for exactly the collectives, and each buffer's positions around its collective's start."""
        if self.memory is None:
            return
        if len(self.memory.segment_peak_bytes) != len(self.nodes) + 1:
            raise ValueError(f"memory.segment_peak_bytes: {len(self.memory.segment_peak_bytes)} segments, but "
                             f"{len(self.nodes)} pinned nodes make {len(self.nodes) + 1}")
        by_name = {c.name: c for c in self.collectives}
        missing = [n for n in by_name if n not in self.memory.buffers]
        extra = [n for n in self.memory.buffers if n not in by_name]
        if missing or extra:
            raise ValueError(f"memory.buffers: one entry per collective (missing {missing[:3]}, "
                             f"not collectives {extra[:3]})")
        for name, buf in self.memory.buffers.items():
            c = by_name[name]
            if buf.out_last_use < c.start_pos or buf.out_last_use >= self.n_scheduled or buf.in_alloc >= c.start_pos:
                raise ValueError(f"memory.buffers[{name!r}]: output last used at {buf.out_last_use} or input "
                                 f"allocated at {buf.in_alloc}, outside the scheduled order around its start "
                                 f"({c.start_pos})")
            if (buf.wait_bytes is None) != (buf.wait_last_use is None) or (
                    buf.wait_last_use is not None and not c.wait_pos <= buf.wait_last_use < self.n_scheduled):
                raise ValueError(f"memory.buffers[{name!r}]: wait_bytes and wait_last_use go together, last used "
                                 f"from its wait ({c.wait_pos}) on")
        self._check_runs()

    def _check_runs(self) -> None:
        """The exact profile: all three or none, runs ascending from 0 within the schedule, one
        ``before_bytes`` per pinned node, and every buffer's position recorded there."""
        m = self.memory
        given = [x is not None for x in (m.run_starts, m.run_peak_bytes, m.before_bytes)]
        if not any(given):
            return
        if not all(given) or len(m.run_starts) != len(m.run_peak_bytes) or len(m.before_bytes) != len(self.nodes):
            raise ValueError("memory: run_starts, run_peak_bytes (one per run) and before_bytes (one per pinned "
                             "node) go together")
        if not m.run_starts or m.run_starts[0] != 0 or any(b <= a for a, b in zip(m.run_starts, m.run_starts[1:])) \
                or m.run_starts[-1] >= max(1, self.n_scheduled):
            raise ValueError("memory.run_starts: strictly increasing scheduled positions from 0")
        if any(b.wait_bytes is None for b in m.buffers.values()):
            raise ValueError("memory: an exact profile records every collective's wait storage (wait_bytes)")
        # what the graph holds just before a node it still holds while the node runs; the exact
        # accounting's instants (planner.cost.memory.memory_profile) rely on it
        for k, node in enumerate(self.nodes):
            run = max(0, bisect.bisect_right(m.run_starts, node.pos) - 1)
            if m.before_bytes[k] > m.run_peak_bytes[run]:
                raise ValueError(f"memory.before_bytes[{k}] ({node.name!r}): {m.before_bytes[k]} bytes just before "
                                 f"the node, above the peak of the run holding it ({m.run_peak_bytes[run]})")

    # -- convenience lookups (cheap; the model is frozen so callers may cache them) --
    def collective_index(self) -> dict[str, int]:
        return {c.name: i for i, c in enumerate(self.collectives)}

    def node_index(self) -> dict[str, int]:
        return {n.name: i for i, n in enumerate(self.nodes)}

    def link(self, pg: str) -> Link:
        for link in self.links:
            if link.pg == pg:
                return link
        raise KeyError(pg)


class Bucket(_Frozen):
    """Collectives merged into one; the merged start takes ``start``'s place in the schedule
    and the merged wait takes the place of ``wait``'s wait (both are member names), unless the
    bucket names its positions: ``issue_before`` / ``wait_before``, a pinned node of the problem
    the merged start / wait sits just before (``planner.core.positions``). The anchors still name the
    members torch's merge builds the bucket from."""

    members: tuple[str, ...] = Field(min_length=1)
    start: str
    wait: str
    issue_before: str | None = Field(default=None, description="pinned node the merged start is issued before")
    wait_before: str | None = Field(default=None, description="pinned node the merged wait sits before")

    @model_serializer(mode="wrap")
    def _positions_only_when_named(self, handler):
        """Unset positions are not written: an anchored bucket serializes as it did before
        positions existed (version-1 plans stay byte-identical)."""
        data = handler(self)
        for key in ("issue_before", "wait_before"):
            if data.get(key) is None:
                data.pop(key, None)
        return data

    @model_validator(mode="after")
    def _anchors_are_members(self):
        if len(set(self.members)) != len(self.members):
            raise ValueError(f"bucket {list(self.members)}: a collective is listed twice")
        for role, anchor in (("start", self.start), ("wait", self.wait)):
            if anchor not in self.members:
                raise ValueError(f"bucket {list(self.members)}: {role} anchor {anchor!r} is not a member")
        return self


class Plan(_Frozen):
    """A bucketing decision for one problem, and who made it."""

    schema_version: Literal[1, 2] = 1
    problem_fingerprint: str
    planner: str
    params: dict[str, JSONValue] = Field(default_factory=dict)
    created: str
    buckets: tuple[Bucket, ...]

    @model_validator(mode="after")
    def _disjoint(self):
        positioned = any(b.issue_before is not None or b.wait_before is not None for b in self.buckets)
        if positioned and "schema_version" not in self.model_fields_set:
            # a plan built in code with named positions is version 2 unless it says otherwise
            object.__setattr__(self, "schema_version", 2)
        if self.schema_version < 2:
            for i, b in enumerate(self.buckets):
                if b.issue_before is not None or b.wait_before is not None:
                    raise ValueError(f"buckets[{i}]: named positions (issue_before / wait_before) need "
                                     f"schema_version 2, the plan says {self.schema_version}")
        owner: dict[str, int] = {}
        for i, b in enumerate(self.buckets):
            for m in b.members:
                if m in owner:
                    raise ValueError(f"collective {m!r} is in bucket {owner[m]} and bucket {i}")
                owner[m] = i
        return self


def with_buckets(plan: Plan, buckets, **update) -> Plan:
    """``plan`` with other buckets (and other fields in ``update``), validated again and at the
    schema version its buckets need (``model_copy`` would skip both)."""
    data = {k: getattr(plan, k) for k in Plan.model_fields if k != "schema_version"}
    data.update(update, buckets=tuple(buckets))
    return Plan(**data)


def unbucketed_plan(problem: Problem) -> Plan:
    """Every collective left alone: feasible under every rule and policy (nothing moves)."""
    return Plan(problem_fingerprint=problem.fingerprint, planner="unbucketed", created="", buckets=())


def collectives_after(problem: Problem, plan: Plan | None) -> int:
    """Collectives left once the plan is applied (a collective in no bucket is its own; None: the
    unbucketed schedule)."""
    if not isinstance(problem, Problem):
        raise ValueError(f"problem must be a planner.Problem, not {type(problem).__name__}")
    if plan is None:
        return len(problem.collectives)
    if not isinstance(plan, Plan):
        raise ValueError(f"plan must be a planner.Plan or None, not {type(plan).__name__}")
    bucketed = sum(len(b.members) for b in plan.buckets)
    return len(problem.collectives) - bucketed + len(plan.buckets)
