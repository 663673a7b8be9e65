"""Extract the torch-free ``planner.Problem`` from what torch's bucketer receives.

Why this exists: the planner must decide on exactly the information torch's
``OverlapPreservingBucketer`` decides on -- the collectives with their estimates and hiding
nodes, the per-process-group timelines, and dependence between the nodes that matter --
without importing torch. This module reads the scheduled graph once and writes that down.

Dependence is kept compactly: reachability restricted to *pinned* nodes (collective
starts/waits, compute, hiding nodes), as each pinned node's immediate pinned predecessors.
It is computed with integer bitsets over pinned nodes only, in one pass over the schedule.

A figure the problem's schema cannot hold (a time of ``planner.core.problem.MAX_MS`` or more, bytes of
``MAX_BYTES`` or more: a graph of 3e8 x 3e8 matmuls) is refused as a ``WorkloadError`` naming the
node or collective, the field and the figure, before any plan is searched.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Iterable
from contextlib import contextmanager

import torch
import torch.fx as fx
from pydantic import ValidationError
from torch.utils._ordered_set import OrderedSet

import planner
from fxglue.cpu_compat import cpu_compat
from fxglue.estimator import Estimator, collective_kind, wire_bytes
from fxglue.models.base import WorkloadError


def _out_of_range(what: str, e: ValidationError) -> WorkloadError:
    """The schema's refusal of a figure as one line: ``what``, the field and the figure."""
    err = e.errors()[0]
    value = err.get("input")
    shown = f"{value:.4g}" if isinstance(value, float) else repr(value)
    return WorkloadError(f"{what}: {'.'.join(map(str, err['loc'])) or e.title} = {shown}: {err['msg']} "
                         "(beyond what a problem records)")


@contextmanager
def _in_range():
    """A figure out of the schema's range, refused naming the model and field that hold it."""
    try:
        yield
    except ValidationError as e:
        raise _out_of_range(f"the problem's {e.title}", e) from None


def _built(cls, what: str, **fields):
    """``cls(**fields)``, a figure out of the schema's range refused naming ``what``."""
    try:
        return cls(**fields)
    except ValidationError as e:
        raise _out_of_range(what, e) from None


def _key_str(n: fx.Node, mode) -> str:
    from torch._inductor.fx_passes.bucketing import get_full_bucket_key

    kind, key = get_full_bucket_key(n, mode)
    parts = [kind] + [str(x) for x in (key if isinstance(key, tuple) else (key,))]
    return "/".join(parts)


def torch_timeline_events(scheduled: list[fx.Node], collective_info, pg: str) -> list[tuple[fx.Node, str]]:
    """Torch's ``OverlapPreservingBucketer.build_timeline`` for one group, as (node, s|w|c).

    Kept in step with torch 2.13: this group's starts and waits, compute nodes, and nodes
    that hide one of this group's collectives (a wait of another group included).
    """
    from torch._inductor.fx_passes.bucketing import _get_collective_node_from_wait, _schedulable_wait_node
    from torch._inductor.fx_passes.overlap_scheduling import get_group_name, is_compute_node

    events = []
    hiding: OrderedSet[fx.Node] = OrderedSet()
    for node in scheduled:
        t = None
        if node in collective_info and get_group_name(node) == pg:
            t = "s"
            hiding |= collective_info[node].hiding_nodes
        elif _schedulable_wait_node(node):
            coll = _get_collective_node_from_wait(node)
            if isinstance(coll, fx.Node) and get_group_name(coll) == pg:
                t = "w"
            elif node in hiding:
                t = "c"
        elif is_compute_node(node) or node in hiding:
            t = "c"
        if t is not None:
            events.append((node, t))
    return events


def _pinned_dependencies(scheduled: list[fx.Node], pinned_idx: dict[fx.Node, int]) -> list[tuple[int, ...]]:
    """Immediate pinned predecessors of each pinned node (transitive reduction).

    One pass in schedule order keeps, per node, two bitsets over pinned indices: all pinned
    ancestors, and the *frontier* -- pinned ancestors reachable without crossing another
    pinned node. The reduction of a pinned node's frontier drops members that are ancestors
    of other members; frontiers are small, so this is linear in practice.
    """
    anc: dict[fx.Node, int] = {}
    front: dict[fx.Node, int] = {}
    pinned_anc: dict[int, int] = {}
    deps: list[tuple[int, ...]] = [()] * len(pinned_idx)
    for node in scheduled:
        a = f = 0
        for inp in node._input_nodes:
            if inp not in anc:  # an input scheduled later or outside the schedule
                continue
            j = pinned_idx.get(inp)
            if j is not None:
                a |= anc[inp] | (1 << j)
                f |= 1 << j
            else:
                a |= anc[inp]
                f |= front[inp]
        anc[node] = a
        i = pinned_idx.get(node)
        if i is not None:
            red = f
            bits = f
            while bits:
                low = bits & -bits
                j = low.bit_length() - 1
                red &= ~pinned_anc[j]
                bits ^= low
            out = []
            while red:
                low = red & -red
                out.append(low.bit_length() - 1)
                red ^= low
            deps[i] = tuple(out)
            pinned_anc[i] = a
            front[node] = 0
        else:
            front[node] = f
    return deps



def _collective(s: fx.Node, info, pos: dict, mode, pinned: dict) -> planner.Collective:
    """One collective as torch's scheduler left it: where it starts and waits, what hides it,
    whether torch estimated it fully hidden, partly hidden or exposed, and the pinned node a merge
    would erase (its input's dtype conversion: torch's ``has_mergeable_all_gather_convert_dtype``)."""
    from torch._inductor.fx_passes.bucketing import has_mergeable_all_gather_convert_dtype, is_all_gather_into_tensor
    from torch._inductor.fx_passes.fsdp import is_fsdp_all_gather
    from torch._inductor.fx_passes.overlap_scheduling import get_group_name

    if info.exposed_time_ms == 0:
        status = "hidden"
    elif info.hiding_nodes and info.exposed_time_ms < info.estimated_time_ms:
        status = "partly"
    else:
        status = "exposed"
    return _built(
        planner.Collective, f"collective {s.name!r}",
        name=s.name, wait=info.wait_node.name, kind=collective_kind(s), pg=get_group_name(s), key=_key_str(s, mode),
        dtype=str(s.meta["val"].dtype).removeprefix("torch."), size_bytes=int(info.size_bytes),
        wire_bytes=wire_bytes(s), est_ms=float(info.estimated_time_ms),
        exposed_ms=float(info.exposed_time_ms), start_pos=pos[s], wait_pos=pos[info.wait_node],
        hiding=tuple(h.name for h in sorted(info.hiding_nodes, key=pos.__getitem__)), status=status,
        fsdp=bool(is_all_gather_into_tensor(s) and is_fsdp_all_gather(s)),
        folded=(s.args[0].name,) if has_mergeable_all_gather_convert_dtype(s) and s.args[0] in pinned else (),
    )


def _unpinned_compute(sched: list[fx.Node], pinned_idx: dict[fx.Node, int], estimator: Estimator) -> dict[int, float]:
    """The compute of the unpinned nodes, per pinned node (``Node.unpinned_ms``): the estimates of
    the unpinned nodes scheduled between the previous pinned node and this one, so the compute
    stream runs every scheduled node where the schedule has it; what follows the last pinned node
    is charged before it.

    Why: a node that hides nothing is left out of the pinned nodes, but its kernel still takes
    the compute stream's time. On torch's schedule of the built-in workloads every node with a
    cost hides something (none is left), but on a replayed order (torch manual's problem, the
    free-position search's) or a graph priced by another estimator, many are."""
    carried: dict[int, float] = {}
    pending = 0.0
    for n in sched:
        i = pinned_idx.get(n)
        if i is None:
            if n.op == "call_function":
                pending += float(estimator(n) or 0.0)
        else:
            carried[i], pending = pending, 0.0
    if pending and pinned_idx:
        last = len(pinned_idx) - 1
        carried[last] = carried.get(last, 0.0) + pending
    return {i: ms for i, ms in carried.items() if ms}


def memory_profile(graph: fx.Graph, sched: list[fx.Node], collective_info, pinned: list[fx.Node]) -> planner.MemoryProfile:
    """The graph's own memory over the schedule and each collective's buffers, as torch's
    estimator counts them (``memory_estimator.build_memory_profile``: a node's fresh storages are
    allocated when it runs, a releasable storage -- not a ``primals`` input -- is freed after its
    last user in this order), with torch's own ``GraphAliasTracker``. Every device is counted:
    torch's filter drops CPU storages, which would leave a CPU trace with nothing.

    A collective's buffers are left out of the graph's own memory and recorded apart, so a plan can
    put them where its buckets start and wait (``planner.cost.memory``): the storage its start allocates
    (until its last user, the wait), the storage its wait allocates (torch's functional wait returns
    a fresh one, until its last user), and its input storage when the start is that storage's last
    use. The own memory is written twice: per segment between pinned nodes (``segment_peak_bytes``,
    what earlier problems had) and exactly, in runs cut at every pinned node and every fixed
    position where a buffer is allocated or freed, with what it holds just before each pinned node."""
    from torch._inductor.fx_passes.memory_estimator import GraphAliasTracker, _is_releasable
    from torch.fx.experimental.symbolic_shapes import optimization_hint

    inputs = [n for n in graph.nodes if n.op in ("placeholder", "get_attr")]
    order = inputs + [n for n in sched if n.op not in ("placeholder", "get_attr", "output")]
    pos = {n: i for i, n in enumerate(sched)}
    # the output node is a user, as in torch's own tracker: a storage the graph returns is never freed
    tracker = GraphAliasTracker(order + list(graph.find_nodes(op="output")))

    def nbytes(key) -> int:
        return int(optimization_hint(key.storage.nbytes()))

    end = len(sched) - 1  # a storage the graph returns lives to the end

    def last_use(keys, at: int) -> int:
        users = (tracker.storage_to_last_user.get(k) for k in keys)
        return max((end if u is not None and u.op == "output" else pos.get(u, at) for u in users), default=at)

    waits_of = {info.wait_node for info in collective_info.values()}
    buffers, apart = {}, set()
    for s in collective_info:
        outs = tracker.get_fresh_allocations(s)
        wait = collective_info[s].wait_node
        waits = [k for k in tracker.get_fresh_allocations(wait) if k not in outs]
        # another collective's output feeding this one stays that collective's buffer (counted once)
        freed = [k for k in tracker.get_storages_last_used(s) if _is_releasable(tracker.storage_to_allocator[k])
                 and k not in outs and tracker.storage_to_allocator[k] not in collective_info
                 and tracker.storage_to_allocator[k] not in waits_of]
        alloc = max((pos.get(tracker.storage_to_allocator[k], -1) for k in freed), default=-1)
        fold = _folded_input(s, tracker, pos, nbytes, _is_releasable)
        if fold.get("fold_in_last_use") is not None:
            apart.update(fold.pop("storages"))
        fold.pop("storages", None)
        buffers[s.name] = planner.CollectiveBuffers(
            out_bytes=sum(map(nbytes, outs)), out_last_use=max(last_use(outs, pos[s]), pos[s]),
            in_bytes=sum(map(nbytes, freed)), in_alloc=alloc,
            wait_bytes=sum(map(nbytes, waits)), wait_last_use=max(last_use(waits, pos[wait]), pos[wait]), **fold)
        apart.update(outs, freed, waits)
    own = _own_memory(order[len(inputs):], pos, tracker, apart, nbytes, _is_releasable,
                      sum(nbytes(k) for n in inputs for k in tracker.get_fresh_allocations(n) if k not in apart))
    bounds = [pos[n] for n in pinned]
    segments = [0] * (len(pinned) + 1)
    for p, (peak, _) in own.items():
        j = bisect.bisect_right(bounds, p)  # segment j holds pinned node j - 1 up to pinned node j
        segments[j] = max(segments[j], peak)
    cuts = {0, *bounds, *(b + 1 for b in bounds)}
    for buf in buffers.values():
        cuts.update(x for x in (buf.in_alloc, buf.out_last_use + 1, buf.wait_last_use + 1) if x >= 0)
        if buf.fold_in_last_use is not None:
            cuts.update(x for x in (buf.fold_in_alloc, buf.fold_in_last_use + 1) if x >= 0)
    starts = sorted(c for c in cuts if c < max(1, len(sched)))
    peaks = [0] * len(starts)
    for p, (peak, _) in own.items():
        k = bisect.bisect_right(starts, p) - 1
        peaks[k] = max(peaks[k], peak)
    return planner.MemoryProfile(segment_peak_bytes=tuple(segments), buffers=buffers,
                                 source="torch memory_estimator.GraphAliasTracker, every device",
                                 run_starts=tuple(starts), run_peak_bytes=tuple(peaks),
                                 before_bytes=tuple(own[b][1] if b in own else 0 for b in bounds))


def _folded_input(s: fx.Node, tracker, pos: dict, nbytes, releasable) -> dict:
    """For an all_gather whose dtype conversion torch's merge folds into its copy-in: the
    ``CollectiveBuffers`` fields of the conversion's input (its bytes; where it is allocated and
    freed, when the conversion is its last use), and its storages (``storages``); {} otherwise."""
    from torch._inductor.fx_passes.bucketing import has_mergeable_all_gather_convert_dtype

    if not has_mergeable_all_gather_convert_dtype(s):
        return {}
    conversion = s.args[0]
    source = conversion.args[0]
    keys = list(tracker.node_to_output_storages.get(source, ()))
    fields: dict = {"fold_in_bytes": sum(map(nbytes, keys)), "storages": keys}
    freed = [k for k in keys if tracker.storage_to_last_user.get(k) is conversion
             and releasable(tracker.storage_to_allocator[k])]
    if freed and len(freed) == len(keys):
        fields.update(fold_in_alloc=max(pos.get(tracker.storage_to_allocator[k], -1) for k in keys),
                      fold_in_last_use=pos[conversion])
    return fields


def _own_memory(nodes: list[fx.Node], pos: dict, tracker, apart: set, nbytes, releasable,
                initial: int) -> dict[int, tuple[int, int]]:
    """Per scheduled position of ``nodes``: (own bytes after the node's allocations, own bytes just
    before it, after the frees of the node before), leaving out the storages ``apart`` (the
    collectives' buffers)."""
    out: dict[int, tuple[int, int]] = {}
    current = initial
    for n in nodes:
        before = current
        current += sum(nbytes(k) for k in tracker.get_fresh_allocations(n) if k not in apart)
        out[pos[n]] = (current, before)
        current -= sum(nbytes(k) for k in tracker.get_storages_last_used(n)
                       if k not in apart and releasable(tracker.storage_to_allocator[k]))
    return out


def extract_problem(
    graph: fx.Graph,
    collective_info: dict,
    scheduled: Iterable[fx.Node],
    *,
    max_bucket_memory_gb: float = 2.0,
    bucket_mode=None,
    estimator: Estimator | None = None,
    meta: dict | None = None,
) -> planner.Problem:
    """The bucketing problem at the moment torch's bucketer would start.

    Takes the arguments ``OverlapPreservingBucketer`` receives. ``estimator`` supplies compute
    times and the per-group α-β links; by default the documented hardware with every group on
    the data-parallel link.
    """
    from torch._inductor.fx_passes.bucketing import _default_bucket_mode
    from torch._inductor.fx_passes.overlap_scheduling import is_compute_node

    estimator = estimator or Estimator()
    mode = bucket_mode or _default_bucket_mode()
    t0 = time.perf_counter()
    with cpu_compat(estimator), _in_range():  # the links', timelines' and memory profile's figures
        sched = list(scheduled)
        pos = {n: i for i, n in enumerate(sched)}
        waits = {info.wait_node: s for s, info in collective_info.items()}
        all_hiders: OrderedSet[fx.Node] = OrderedSet()
        for info in collective_info.values():
            all_hiders |= info.hiding_nodes

        def kind_of(n):
            if n in collective_info:
                return "start"
            if n in waits:
                return "wait"
            return "compute" if is_compute_node(n) else "other"

        pinned = [n for n in sched if n in collective_info or n in waits or n in all_hiders or is_compute_node(n)]
        pinned_idx = {n: i for i, n in enumerate(pinned)}
        deps = _pinned_dependencies(sched, pinned_idx)

        colls = [_collective(s, info, pos, mode, pinned_idx) for s, info in collective_info.items()]
        unpinned = _unpinned_compute(sched, pinned_idx, estimator)
        nodes = []
        for i, n in enumerate(pinned):
            k = kind_of(n)
            est = 0.0 if k == "wait" else float(estimator(n) or 0.0)
            nodes.append(_built(planner.Node, f"node {n.name!r}", name=n.name, kind=k, pos=pos[n], est_ms=est,
                                deps=deps[i], unpinned_ms=unpinned.get(i, 0.0)))
        pgs = dict.fromkeys(c.pg for c in colls)

        timelines = []
        for pg in pgs:
            ev = torch_timeline_events(sched, collective_info, pg)
            timelines.append(planner.Timeline(pg=pg, nodes=tuple(pinned_idx[n] for n, _ in ev),
                                              types="".join(t for _, t in ev)))
        links = tuple(estimator.link(pg) for pg in pgs)
        # how each group lies over the nodes, for re-pricing the problem later without torch
        # (planner.search.scenarios); an α-β estimator has no layout
        layout = ({pg: dict(zip(("ranks", "ranks_per_node"), estimator.group_layout(pg))) for pg in pgs}
                  if estimator.ranks_per_node is not None else {})
        memory = memory_profile(graph, sched, collective_info, pinned)
    problem = _built(
        planner.Problem, "the problem",
        schema_version=2 if unpinned else 1, bucket_mode=mode, bucket_cap_bytes=int(max_bucket_memory_gb * 1024**3), n_scheduled=len(sched),
        collectives=tuple(colls), nodes=tuple(nodes), timelines=tuple(timelines), links=links,
        bucketing=estimator.bucketing, memory=memory, contention=estimator.contention, meta={"torch": torch.__version__, "hardware": estimator.hardware.name,
              "extract_s": round(time.perf_counter() - t0, 4), **({"layout": layout} if layout else {}),
              **(meta or {})},
    )
    return problem.with_fingerprint()
