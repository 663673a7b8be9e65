"""Standalone reproducer: torch's overlap-preserving bucketer builds a cyclic schedule.

Four all_reduces and two matmuls, DDP-style (each gradient is all_reduced as soon as it is
produced), run through torch._inductor's own `schedule_overlap_bucketing` with bucketing on.
Torch's greedy bucketer accepts two buckets whose merged starts depend on each other, and its
final check raises

    RuntimeError: Overlap scheduling: detected 1 cyclic extra dep(s): [...]. Please report this
    to the overlap scheduling developers.

CPU only, no GPU or triton needed; imports nothing but torch.

    python experiments/torch_cycle_repro/repro.py            # exit 1 + torch's error if the bug is present
    python experiments/torch_cycle_repro/repro.py --explain  # also print the schedule and torch's bucketing log
"""

import logging
import sys

import torch
import torch._inductor.fx_passes.overlap_preserving_bucketer as overlap_preserving_bucketer
import torch._inductor.fx_passes.overlap_scheduling as overlap_scheduling
import torch.distributed as dist
from torch.fx.experimental.proxy_tensor import make_fx
from torch.testing._internal.distributed.fake_pg import FakeStore

EXPLAIN = "--explain" in sys.argv[1:]

# A fake process group: no communication happens, the graph is only traced and scheduled.
dist.init_process_group(backend="fake", rank=0, world_size=2, store=FakeStore())
PG = dist.group.WORLD.group_name
c10d = torch.ops._c10d_functional


def all_reduce(t):
    return c10d.wait_tensor(c10d.all_reduce(t, "sum", PG))


def step(g0, w):
    # DDP-style: every gradient is all_reduced as soon as it is produced. g0 is a gradient
    # produced before this graph; mm and mm_1 produce the next ones. all_reduce_2 reduces the
    # same tensor as all_reduce_1: think of two gradients that become ready at the same moment.
    r0 = all_reduce(g0)  # all_reduce
    g1 = torch.mm(g0, w)  # mm
    r1 = all_reduce(g1)  # all_reduce_1
    r2 = all_reduce(g1)  # all_reduce_2
    g2 = torch.mm(g0, w)  # mm_1
    r3 = all_reduce(g2)  # all_reduce_3
    return r0, r1, r2, r3


gm = make_fx(step, tracing_mode="fake")(torch.randn(64, 64), torch.randn(64, 64))
fake_mode = torch._guards.detect_fake_mode([n.meta["val"] for n in gm.graph.nodes if "val" in n.meta])


def runtime_ms(node, override_size=None):
    """custom_runtime_estimation: every matmul 0.5 ms, every all_reduce 2 ms, the rest free."""
    if node.op != "call_function":
        return None
    if node.target is torch.ops.aten.mm.default:
        return 0.5
    if node.target is c10d.all_reduce.default:
        return 2.0
    return 0.0


# CPU workaround: the scheduler calls estimate_roofline_runtime_ms on every compute node even when
# custom_runtime_estimation is given (gather_node_runtime_estimations, and
# _align_compute_nodes_runtime_estimations_across_all_distributed_ranks), and that asks triton
# for the device's bandwidth: ModuleNotFoundError without triton. With analytical estimators the
# roofline value is discarded in favour of runtime_ms above, so any number will do.
overlap_scheduling.estimate_roofline_runtime_ms = lambda node: 0.0

if EXPLAIN:
    # Show what the bucketer receives (OverlapScheduler.run imports finalize_overlap_scheduling at
    # call time) and turn on torch's own bucketing debug log.
    finalize = overlap_preserving_bucketer.finalize_overlap_scheduling

    def show_schedule(gm, collective_info, scheduled, **kwargs):
        print("schedule handed to OverlapPreservingBucketer:")
        for i, n in enumerate(n for n in scheduled if n.op == "call_function"):
            info = collective_info.get(n)
            extra = (f"   est {info.estimated_time_ms} ms, exposed {info.exposed_time_ms} ms, "
                     f"hiding_nodes {[h.name for h in info.hiding_nodes]}") if info else ""
            print(f"  {i:2d} {n.name:14s} <- {', '.join(a.name for a in n.all_input_nodes):8s}{extra}")
        return finalize(gm, collective_info, scheduled, **kwargs)

    overlap_preserving_bucketer.finalize_overlap_scheduling = show_schedule
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("  [bucketer] %(message)s"))
    overlap_preserving_bucketer.bucket_log.addHandler(handler)
    overlap_preserving_bucketer.bucket_log.setLevel(logging.DEBUG)
    overlap_preserving_bucketer.bucket_log.propagate = False

print(f"torch {torch.__version__}: schedule_overlap_bucketing on 4 all_reduces + 2 mms")
try:
    with fake_mode:
        overlap_scheduling.schedule_overlap_bucketing(
            gm,
            collective_bucketing=True,
            compute_estimator="analytical",  # the default, "benchmark", times kernels on a GPU
            collective_estimator="analytical",
            custom_runtime_estimation=runtime_ms,
        )
except RuntimeError as e:
    if "cyclic extra dep" not in str(e):
        raise
    print(f"BUG PRESENT: torch's bucketer produced a cyclic schedule:\n{type(e).__name__}: {e}")
    sys.exit(1)

print("no cyclic dependency: the bug is not present in this torch build. Bucketed graph:")
print(gm.graph)
