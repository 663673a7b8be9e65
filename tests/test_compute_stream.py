"""Every scheduled node's compute, pinned or not (issue 28): fxglue/estimator.py's prices checked
against a roofline computed here from the tensors' shapes, and the problem's compute stream
(``Node.stream_ms``: a node's own estimate plus the unpinned compute charged before it) against
the sum of those prices over every scheduled node.

The independent roofline: a matmul's FLOPs worked out from its shapes (2·m·k·n; other compute
ops by torch's FLOP formulas), bytes as torch's roofline counts them (each tensor's elements over
its non-broadcast dimensions), views, getitems and waits free; a node inductor fuses (torch's
``build_fusion_regions`` names the regions: the oracle of what inductor fuses) pays only for the
tensors that cross its region's boundary: inputs from outside, and its output when a node outside
uses it.
"""

from __future__ import annotations

import math
import types

import pytest
import torch

import planner
from fxglue.estimator import Estimator, collective_kind
from fxglue.presets import Hardware
from tests.handmade import build

pytestmark = pytest.mark.slow  # traces workloads

HW = Hardware()
aten = torch.ops.aten


def _bytes(t) -> int:
    if not isinstance(t, torch.Tensor):
        return 0
    return math.prod(int(s) for s, st in zip(t.shape, t.stride()) if st != 0) * t.element_size()


def _tensors(x) -> list:
    if isinstance(x, torch.fx.Node):
        return _tensors(x.meta.get("val"))
    if isinstance(x, (list, tuple)):
        return [t for y in x for t in _tensors(y)]
    if isinstance(x, dict):
        return [t for y in x.values() for t in _tensors(y)]
    return [x] if isinstance(x, torch.Tensor) else []


def _flops(n) -> float | None:
    from torch.utils.flop_counter import flop_registry

    shape = [tuple(t.shape) for t in _tensors(n.args)]
    if n.target == aten.mm.default:
        (m, k), (_, c) = shape[:2]
        return 2 * m * k * c
    if n.target == aten.addmm.default:
        (m, k), (_, c) = shape[1:3]
        return 2 * m * k * c
    if n.target == aten.bmm.default:
        (b, m, k), (_, _, c) = shape[:2]
        return 2 * b * m * k * c
    key = getattr(n.target, "overloadpacket", None)
    if key in flop_registry:  # attention: torch's own formula
        args = torch.utils._pytree.tree_map(lambda a: a.meta.get("val") if isinstance(a, torch.fx.Node) else a,
                                            (n.args, n.kwargs))
        return flop_registry[key](*args[0], **args[1], out_val=n.meta.get("val"))
    return None


def independent_ms(n, regions) -> float:
    """The roofline price of one node, worked out here (see the module's docstring)."""
    if n.op != "call_function" or n.target is __import__("operator").getitem or collective_kind(n):
        return 0.0
    if n.target == torch.ops._c10d_functional.wait_tensor.default:
        return 0.0
    if isinstance(n.target, torch._ops.OpOverload) and n.target.is_view or n.target in (
            aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.split.Tensor,
            aten.split_with_sizes.default, aten.view.dtype, aten.t.default, aten.alias.default):
        return 0.0
    hbm = HW.hbm_tbps * 1e12
    if n in regions:
        region = regions[n]
        outside = sum(_bytes(i.meta.get("val")) for i in n.all_input_nodes if i not in region)
        if any(u not in region for u in n.users):
            outside += sum(map(_bytes, _tensors(n)))
        return outside / hbm * 1e3
    outs = _tensors(n)
    if not outs:
        return 0.0
    touched = sum(map(_bytes, _tensors(n.args) + _tensors(n.kwargs) + outs))
    flops = _flops(n)
    compute = flops / HW.peak_flops(outs[0].dtype) if flops is not None else 0.0
    return max(touched / hbm, compute) * 1e3


def test_a_fused_chain_costs_one_read_and_one_write():
    """x * 2 + 1, relu'd: inductor runs one kernel that reads x once and writes the result once."""
    h = build(lambda x: torch.relu(x * 2 + 1), [((1024, 1024), torch.bfloat16)], {})
    est = Estimator(HW)
    total = sum(est.compute_ms(n) for n in h.gm.graph.nodes)
    assert total == pytest.approx(2 * 1024 * 1024 * 2 / (HW.hbm_tbps * 1e12) * 1e3, rel=1e-9)
    alone = [n for n in h.gm.graph.nodes if n.target == aten.mul.Tensor]
    assert len(alone) == 1  # unfused, each of the three would read and write the whole tensor


def _regions(graph):
    from torch._inductor.fx_passes.fusion_regions import build_fusion_regions

    return build_fusion_regions(types.SimpleNamespace(graph=graph))


def _check_every_node(prepared, regions, problem):
    from fxglue.cpu_compat import cpu_compat

    sched = prepared.inputs.scheduled
    with cpu_compat(prepared.estimator):  # the SDPA formulas for CPU attention, as the scheduler sees them
        ours = {n: 0.0 if collective_kind(n) else prepared.estimator.compute_ms(n) for n in sched}
        theirs = {n: independent_ms(n, regions) for n in sched}
    wrong = [(n.name, ours[n], theirs[n]) for n in sched if ours[n] != pytest.approx(theirs[n], rel=1e-9, abs=1e-12)]
    assert not wrong, wrong[:5]
    stream = sum(n.stream_ms for n in problem.nodes)
    assert stream == pytest.approx(sum(theirs.values()), rel=1e-9)
    assert planner.simulate(problem).compute_ms == pytest.approx(stream, rel=1e-9)
    return theirs


@pytest.mark.parametrize("workload", ["llama3-8b-fsdp-2", pytest.param("llama3-8b-fsdp-8", marks=pytest.mark.long)])
def test_the_compute_stream_runs_every_scheduled_node_at_its_roofline_price(workload):
    """On torch's schedule: regions are read off the graph as traced (the order torch's scheduler
    first saw), every node's price matches, and the compute stream is their sum."""
    from fxglue.models.workloads import trace
    from fxglue.pipeline import prepare, resolve_preset

    preset = resolve_preset("h100-8nodes")
    traced = trace(workload, world_size=preset.world_size, tp=preset.tp)
    regions = _regions(traced.gm.graph)
    prepared = prepare(traced, preset=preset, greedy=False)
    theirs = _check_every_node(prepared, regions, prepared.problem)
    assert sum(v > 0 for v in theirs.values()) > 100 and len(regions) > 50


def test_a_replayed_order_charges_the_nodes_it_leaves_unpinned():
    """Torch manual's problem replays the graph's own order, which pins fewer nodes than torch's
    scheduler: the others are charged as unpinned compute (a version-2 problem), so its compute
    stream is still the sum over every node of the graph (the prices themselves are checked
    above; here, that none is left out or counted twice)."""
    from fxglue.cpu_compat import cpu_compat
    from fxglue.manual import manual_bucketing_problem
    from fxglue.models.workloads import trace
    from fxglue.pipeline import estimator_for, resolve_preset

    preset = resolve_preset("h100-8nodes")
    traced = trace("llama3-8b-fsdp-2", world_size=preset.world_size, tp=preset.tp)
    estimator = estimator_for(traced, preset=preset)
    problem, info = manual_bucketing_problem(traced, estimator)
    pinned = {n.name for n in problem.nodes}
    with cpu_compat(estimator):
        prices = {n.name: estimator.compute_ms(n) for n in traced.gm.graph.nodes if not collective_kind(n)}
    left_out = sum(ms for name, ms in prices.items() if name not in pinned)
    assert problem.schema_version == 2 and left_out > 1.0
    assert sum(n.unpinned_ms for n in problem.nodes) == pytest.approx(left_out, rel=1e-9)
    assert sum(n.stream_ms for n in problem.nodes) == pytest.approx(sum(prices.values()), rel=1e-9)
