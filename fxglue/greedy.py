"""Torch's own greedy bucket search, recorded as a ``planner.Plan``.

Why this exists: every other planner is measured against the real thing, so we run torch's
``OverlapPreservingBucketer`` search unchanged and only write down what it decided: the
members of each bucket and where their merged start and wait sit on torch's timeline (the
anchors). The caller's graph is not touched: the search only edits torch's side structures
(timelines, augmented dependencies); we skip the step that rewrites nodes.
"""

from __future__ import annotations

import datetime as _dt
import time

import torch.fx as fx

import planner
from fxglue.cpu_compat import cpu_compat
from fxglue.estimator import Estimator

# schedule_overlap_bucketing's own defaults for the arguments it forwards to the bucketer
TORCH_BUCKETER_DEFAULTS = {"max_coll_distance": 200, "bucket_exposed_first": None,
                           "bucket_only_internode_comms": False}


def _recording_bucketer_cls():
    import torch._inductor.fx_passes.overlap_preserving_bucketer as opb
    from torch._inductor.fx_passes.bucketing import _get_collective_node_from_wait

    class RecordingBucketer(opb.OverlapPreservingBucketer):
        """Torch's bucketer that records each bucket with its timeline anchors and applies none."""

        recorded: list[planner.Bucket]

        def _find_buckets(self, collective_group, internode_pgs):
            buckets = super()._find_buckets(collective_group, internode_pgs)
            for b in buckets:
                first = b.collectives[0]
                # torch moves the first member's event pointers with every successful merge, so
                # they name the events where the merged start and wait ended up.
                start_anchor = self.node_to_event[first].node
                wait_anchor = _get_collective_node_from_wait(
                    self.node_to_event[self.collective_info[first].wait_node].node)
                self.recorded.append(planner.Bucket(
                    members=tuple(n.name for n in b.collectives), start=start_anchor.name, wait=wait_anchor.name))
            return buckets

        def _apply_bucket(self, bucket_info) -> None:  # record only: leave the graph untouched
            return None

    return RecordingBucketer


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def greedy_plan(
    graph: fx.Graph,
    collective_info: dict,
    scheduled,
    *,
    max_bucket_memory_gb: float = 2.0,
    bucket_mode=None,
    problem_fingerprint: str = "",
    estimator: Estimator | None = None,
    **torch_kwargs,
) -> planner.Plan:
    """Torch's greedy buckets for this schedule, as a Plan; the graph is left as it was.

    ``torch_kwargs`` are the other bucketer arguments (``max_coll_distance``,
    ``bucket_exposed_first``, ``bucket_only_internode_comms``); defaults are those of
    ``schedule_overlap_bucketing``.
    """
    from torch._inductor.fx_passes.bucketing import _default_bucket_mode

    unknown = set(torch_kwargs) - set(TORCH_BUCKETER_DEFAULTS)
    if unknown:
        raise TypeError(f"greedy_plan: unknown bucketer argument(s) {sorted(unknown)}")
    kwargs = {**TORCH_BUCKETER_DEFAULTS, **torch_kwargs}
    mode = bucket_mode or _default_bucket_mode()
    cls = _recording_bucketer_cls()
    t0 = time.perf_counter()
    with cpu_compat(estimator or Estimator()):
        bucketer = cls(graph=graph, collective_info=collective_info, scheduled=scheduled,
                       max_bucket_memory_gb=max_bucket_memory_gb, collective_bucketing=True,
                       bucket_mode=mode, **kwargs)
        bucketer.recorded = []
        bucketer._bucket_collectives_impl()
    wall = time.perf_counter() - t0
    return planner.Plan(
        problem_fingerprint=problem_fingerprint, planner="torch-greedy",
        params={"max_bucket_memory_gb": max_bucket_memory_gb, "bucket_mode": mode, **kwargs,
                "wall_s": round(wall, 4)},
        created=now_iso(), buckets=tuple(bucketer.recorded),
    )
