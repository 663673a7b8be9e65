"""The graph's own order through torch's scheduler's bookkeeping, nothing reordered: what torch's
manual per-block pass plans on (``fxglue.manual``) and ``--schedule graph`` plans on
(``fxglue.pipeline.graph_order_inputs``). Its own module so that both import it and neither
imports the other for it."""

from __future__ import annotations

from fxglue.cpu_compat import cpu_compat
from fxglue.estimator import Estimator


def fixed_order_inputs(traced, estimator: Estimator, *, bucket_mode):
    """``(collective_info, scheduled, forced_waits)`` for ``traced.gm`` in its current order.

    Builds torch's ``OverlapScheduler`` with the knobs ``fxglue.pipeline.schedule`` uses and
    replays the graph order through its bookkeeping without reordering anything.
    ``forced_waits`` counts waits torch's one-FIFO-stream-per-group rule would have brought
    forward (a wait reached while an earlier collective of its group is still in flight).
    ``bucket_mode``: torch's (None: torch's default; torch's manual pass: ``fxglue.manual.MANUAL_BUCKET_MODE``).
    """
    import torch._inductor.fx_passes.overlap_scheduling as os_
    from torch._inductor.fx_passes.bucketing import _schedulable_wait_node

    class _Replay(os_.OverlapScheduler):
        def _add_to_ready_queue(self, node):  # no ready queues: the order is given
            pass

        def _schedule_collectives_for_overlap(self, *args, **kwargs):  # nothing is pulled forward
            pass

    with cpu_compat(estimator), traced.fake_mode:
        order = list(traced.gm.graph.nodes)
        s = _Replay(traced.gm, max_in_flight_gb=5, max_compute_pre_fetch=200, collective_bucketing=True,
                    insert_overlap_deps=False, compute_overlap_multipler=1.0, max_coll_distance=200,
                    custom_runtime_estimation=estimator, collective_estimator="analytical",
                    compute_estimator="analytical", bucket_mode=bucket_mode)
        if list(s.graph.nodes) != order:
            raise RuntimeError("torch's topological sort changed the manual pass's order")
        s._align_compute_nodes_runtime_estimations_across_all_distributed_ranks()
        forced = 0
        for node in order:
            if node in s.scheduled:
                forced += 1
                continue
            if node.op == "placeholder":
                s._schedule(node)
            elif node in s.collective_info:
                s._handle_collective_start(node)
            elif _schedulable_wait_node(node):
                s._handle_wait(node)
            else:
                s._handle_compute_or_other(node)
    return s.collective_info, order, forced
