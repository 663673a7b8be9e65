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

import hashlib
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

SCHEMA_VERSION = 1

Kind = Literal["all_gather", "reduce_scatter", "all_reduce"]
NodeKind = Literal["start", "wait", "compute", "other"]
Status = Literal["hidden", "partly", "exposed"]
JSONValue = Any


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=False)


class Link(_Frozen):
    """α-β cost of collectives on one process group.

    ``time_ms(kind, bytes) = latency_ms + factor(kind) * bytes / bandwidth`` with the ring
    factors of nccl-tests' bus bandwidth: (n-1)/n for all_gather / reduce_scatter (bytes = the
    full, unsharded tensor) and 2(n-1)/n for all_reduce. A bucket pays ``latency_ms`` once.
    """

    pg: str
    group_size: int = Field(ge=1)
    latency_ms: float = Field(ge=0)
    bandwidth_gbps: float = Field(gt=0, description="bus bandwidth in GB/s (1e9 bytes)")
    hardware: str = ""

    def factor(self, kind: str) -> float:
        n = self.group_size
        if n <= 1:
            return 0.0
        return 2 * (n - 1) / n if kind == "all_reduce" else (n - 1) / n

    def time_ms(self, kind: str, wire_bytes: int) -> float:
        return self.latency_ms + self.factor(kind) * wire_bytes / (self.bandwidth_gbps * 1e6)


class Collective(_Frozen):
    """One collective as torch's bucketer sees it (start node name = its id)."""

    name: str
    wait: str
    kind: Kind
    pg: str
    key: str = Field(description="torch's full bucket key under the problem's bucket mode")
    dtype: str
    size_bytes: int = Field(ge=0, description="torch's memory footprint; what the bucket cap counts")
    wire_bytes: int = Field(ge=0, description="bytes the cost model charges (full tensor)")
    est_ms: float = Field(ge=0)
    exposed_ms: float = Field(ge=0)
    start_pos: int = Field(ge=0)
    wait_pos: int = Field(ge=0)
    hiding: tuple[str, ...] = ()
    status: Status
    fsdp: bool = False


class Node(_Frozen):
    """A pinned node: collective start/wait, compute, or another node that hides a collective."""

    name: str
    kind: NodeKind
    pos: int = Field(ge=0)
    est_ms: float = Field(ge=0)
    deps: tuple[int, ...] = ()


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


def _canonical(data: dict) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


class Problem(_Frozen):
    """Everything a planner, the verifier and the simulator need, with no torch inside."""

    schema_version: Literal[1] = SCHEMA_VERSION
    fingerprint: str = ""
    bucket_mode: Literal["default", "custom_ops", "custom_ops_multidtype", "coalesced"]
    bucket_cap_bytes: int = Field(gt=0)
    n_scheduled: int = Field(ge=0)
    collectives: tuple[Collective, ...]
    nodes: tuple[Node, ...]
    timelines: tuple[Timeline, ...]
    links: tuple[Link, ...]
    meta: dict[str, JSONValue] = Field(default_factory=dict, description="provenance; not fingerprinted")

    def content_fingerprint(self) -> str:
        data = self.model_dump(mode="json", exclude={"fingerprint", "meta"})
        return "sha256:" + hashlib.sha256(_canonical(data)).hexdigest()

    def with_fingerprint(self) -> "Problem":
        return self.model_copy(update={"fingerprint": self.content_fingerprint()})

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
        pgs = {link.pg for link in self.links}
        for i, c in enumerate(self.collectives):
            if c.pg not in pgs:
                raise ValueError(f"collectives[{i}] ({c.name}): process group {c.pg!r} has no link (cost model)")
        for t in self.timelines:
            for j in t.nodes:
                if not 0 <= j < len(self.nodes):
                    raise ValueError(f"timeline {t.pg}: node index {j} out of range")
        if self.fingerprint and self.fingerprint != self.content_fingerprint():
            raise ValueError("fingerprint does not match the content (the file was edited or corrupted)")
        return self

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
    and the merged wait takes the place of ``wait``'s wait (both are member names)."""

    members: tuple[str, ...] = Field(min_length=1)
    start: str
    wait: str

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

    schema_version: Literal[1] = SCHEMA_VERSION
    problem_fingerprint: str
    planner: str
    params: dict[str, JSONValue] = Field(default_factory=dict)
    created: str
    buckets: tuple[Bucket, ...]

    @model_validator(mode="after")
    def _disjoint(self):
        owner: dict[str, int] = {}
        for i, b in enumerate(self.buckets):
            for m in b.members:
                if m in owner:
                    raise ValueError(f"collective {m!r} is in bucket {owner[m]} and bucket {i}")
                owner[m] = i
        return self


def collectives_after(problem: Problem, plan: Plan) -> int:
    """Collectives left once the plan is applied (a collective in no bucket is its own)."""
    bucketed = sum(len(b.members) for b in plan.buckets)
    return len(problem.collectives) - bucketed + len(plan.buckets)
