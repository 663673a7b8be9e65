"""Small hand-made scheduled graphs with explicit hiding annotations.

A test writes a step function with functional collectives and matmuls in the order it wants
scheduled; ``build`` traces it on the fake process group and returns what torch's bucketer
would receive: the graph, ``collective_info`` with the hiding nodes the test names, and the
schedule (graph order).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx as fx
from torch.utils._ordered_set import OrderedSet

c10d = torch.ops._c10d_functional
GROUP_SIZE = 8


def group() -> str:
    import torch.distributed as dist

    from fxglue.models.workloads import ensure_fake_world

    ensure_fake_world()
    return dist.group.WORLD.group_name


def ag(x):
    return c10d.all_gather_into_tensor(x, GROUP_SIZE, group())


def rs(x):
    return c10d.reduce_scatter_tensor(x, "sum", GROUP_SIZE, group())


def ar(x):
    return c10d.all_reduce(x, "sum", group())


wait = c10d.wait_tensor


@dataclass
class Handmade:
    gm: fx.GraphModule
    collective_info: dict
    scheduled: OrderedSet
    fake_mode: object
    names: dict[str, str]  # label -> start node name

    def problem(self, bucket_mode=None, max_bucket_memory_gb: float = 2.0):
        from fxglue.extract import extract_problem

        return extract_problem(self.gm.graph, self.collective_info, self.scheduled, bucket_mode=bucket_mode,
                               max_bucket_memory_gb=max_bucket_memory_gb)


def build(fn, shapes: list[tuple[tuple[int, ...], torch.dtype]], hiding: dict[int, tuple[list[int], str]]):
    """Trace ``fn`` and annotate hiding.

    ``hiding`` maps the k-th collective (by start, in graph order) to (indices of the mm nodes, in graph
    order, that hide it; "hidden" or "partly"). Unlisted collectives are exposed.
    """
    from torch._inductor.comm_analysis import estimate_fx_collective_memory_footprint
    from torch._inductor.fx_passes.bucketing import _get_collective_node_from_wait
    from torch._inductor.fx_passes.overlap_scheduling import CollectiveInfo
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    import torch.distributed as dist

    if not dist.is_initialized():  # a gloo world (the fuzz tests' real runs) is used as it is
        group()
    fm = FakeTensorMode()
    with fm:
        args = [torch.empty(s, dtype=d) for s, d in shapes]
        gm = make_fx(fn, tracing_mode="real")(*args)
    nodes = list(gm.graph.nodes)
    mms = [n for n in nodes if n.target in (torch.ops.aten.mm.default,)]
    info = {}
    for n in nodes:
        start = _get_collective_node_from_wait(n)
        if start is not None and start not in info:
            info[start] = CollectiveInfo(start_node=start, wait_node=n,
                                         size_bytes=estimate_fx_collective_memory_footprint(start),
                                         estimated_time_ms=1.0, exposed_time_ms=1.0)
    order = {n: i for i, n in enumerate(nodes)}
    starts = sorted(info, key=order.__getitem__)  # labels c0, c1, ... follow the start order
    for k, (hider_idx, status) in hiding.items():
        ci = info[starts[k]]
        ci.hiding_nodes = OrderedSet(mms[i] for i in hider_idx)
        ci.exposed_time_ms = 0.0 if status == "hidden" else 0.5
    return Handmade(gm, info, OrderedSet(nodes), fm, {f"c{k}": s.name for k, s in enumerate(starts)})


def plan_for(problem, buckets: list[tuple[list[str], str, str]]):
    """A plan from (members, start anchor, wait anchor) triples of start node names."""
    import planner

    return planner.Plan(problem_fingerprint=problem.fingerprint, planner="hand", created="test",
                        buckets=tuple(planner.Bucket(members=tuple(m), start=s, wait=w) for m, s, w in buckets))


def hide_by(h: Handmade, label: str, hiders: list, status: str) -> None:
    """Make collective ``label`` (``"c0"``, ...) ``status`` ("hidden" or "partly") hidden by
    ``hiders``: fx nodes, or labels of collectives meaning their wait (torch credits a wait on one
    group to a collective in flight on another, which makes that wait a hiding node)."""
    info = _info(h, label)
    info.hiding_nodes = OrderedSet(_info(h, x).wait_node if isinstance(x, str) else x for x in hiders)
    info.exposed_time_ms = 0.0 if status == "hidden" else 0.5


def _info(h: Handmade, label: str):
    return next(i for s, i in h.collective_info.items() if s.name == h.names[label])


def two_hidden_gathers() -> Handmade:
    """ag0 hidden by mm0, ag1 hidden by mm1; both gathers used at the end (merging them is
    feasible with the bucket anchored at ag0's start and ag1's wait)."""
    bf16 = torch.bfloat16

    def fn(x0, x1, a):
        s0 = ag(x0)
        m0 = torch.mm(a, a)
        w0 = wait(s0)
        s1 = ag(x1)
        m1 = torch.mm(m0, a)
        w1 = wait(s1)
        return torch.mm(w0, w1), m1

    return build(fn, [((8, 64), bf16), ((8, 64), bf16), ((64, 64), bf16)], {0: ([0], "hidden"), 1: ([1], "hidden")})


def apply_and_count(h: Handmade, plan, problem, bucket_mode=None) -> int:
    """``apply_plan`` on the hand-made graph (under its fake mode), then the collectives left in
    it, counted by ``fxglue.pipeline.count_collectives``."""
    from fxglue.apply import apply_plan
    from fxglue.pipeline import count_collectives

    with h.fake_mode:
        apply_plan(h.gm.graph, h.collective_info, h.scheduled, plan, problem=problem, bucket_mode=bucket_mode)
    h.gm.recompile()
    return sum(count_collectives(h.gm).values())
