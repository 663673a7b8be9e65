"""fxglue/estimator.py: the estimates torch's overlap scheduler runs on, checked against figures
worked out by hand from the hardware's numbers (FLOPs of a matmul, bytes an op touches, the ring
factors of an α-β link), on hand-made graphs traced under the fake process group (8 ranks).

Torch's NCCL-derived pricing of the presets is checked against torch's own function in
test_costs.py.
"""

from __future__ import annotations

import pytest
import torch

from fxglue.estimator import Estimator, collective_kind, wire_bytes
from fxglue.presets import Hardware
from tests.handmade import GROUP_SIZE, ag, ar, build, rs, wait

c10d = torch.ops._c10d_functional
HW = Hardware()


def _nodes(fn, shapes, target):
    h = build(fn, shapes, {})
    return [n for n in h.gm.graph.nodes if n.target == target]


@pytest.mark.parametrize("m, k, n", [(4096, 8192, 2048), (4096, 16384, 2048), (2048, 2048, 8192)])
@pytest.mark.parametrize("dtype, tflops", [(torch.bfloat16, HW.bf16_tflops), (torch.float32, HW.fp32_tflops)])
def test_a_large_matmul_costs_its_flops_at_the_peak_rate(m, k, n, dtype, tflops):
    (mm,) = _nodes(lambda a, b: torch.mm(a, b), [((m, k), dtype), ((k, n), dtype)], torch.ops.aten.mm.default)
    flops = 2 * m * k * n  # a multiply and an add per (row, column, inner) triple
    touched = (m * k + k * n + m * n) * torch.tensor([], dtype=dtype).element_size()
    assert touched / (HW.hbm_tbps * 1e12) < flops / (tflops * 1e12)  # compute-bound: the FLOPs decide
    assert Estimator().compute_ms(mm) == pytest.approx(flops / (tflops * 1e12) * 1e3, rel=1e-9)


def test_an_elementwise_op_costs_the_bytes_it_reads_and_writes():
    (add,) = _nodes(lambda a, b: a + b, [((1024, 2048), torch.float32)] * 2, torch.ops.aten.add.Tensor)
    touched = 3 * 1024 * 2048 * 4  # two inputs read, one output written
    assert Estimator().compute_ms(add) == pytest.approx(touched / (HW.hbm_tbps * 1e12) * 1e3, rel=1e-9)


def test_views_waits_and_inputs_cost_nothing():
    def fn(a, x):
        return a.t(), a.view(-1), wait(ag(x))

    h = build(fn, [((64, 32), torch.float32), ((8, 64), torch.bfloat16)], {})
    est = Estimator()
    by_target = {n.target: n for n in h.gm.graph.nodes}
    assert est(by_target[torch.ops.aten.t.default]) == 0.0
    assert est(by_target[torch.ops.aten.view.default]) == 0.0
    assert est(by_target[c10d.wait_tensor.default]) == 0.0
    assert all(est(n) is None for n in h.gm.graph.nodes if n.op in ("placeholder", "output"))


def test_collectives_move_the_full_tensor_and_pay_the_ring_factor_on_an_alpha_beta_link():
    def fn(x, g, y):
        return wait(ag(x)), wait(rs(g)), wait(ar(y))

    h = build(fn, [((8, 64), torch.bfloat16), ((64, 64), torch.float32), ((64, 64), torch.float32)], {})
    starts = {collective_kind(n): n for n in h.gm.graph.nodes if collective_kind(n)}
    # all_gather: the gathered output, GROUP_SIZE shards; reduce_scatter: the input before scattering
    full = {"all_gather": GROUP_SIZE * 8 * 64 * 2, "reduce_scatter": 64 * 64 * 4, "all_reduce": 64 * 64 * 4}
    dp = HW.links["dp"]  # no preset: every group is data-parallel, priced by the α-β figures
    ring = (GROUP_SIZE - 1) / GROUP_SIZE  # nccl-tests' bus bandwidth factors; all_reduce moves it twice
    est = Estimator()
    for kind, node in starts.items():
        assert wire_bytes(node) == full[kind]
        factor = 2 * ring if kind == "all_reduce" else ring
        expected = dp.latency_us / 1e3 + factor * full[kind] / (dp.bandwidth_gbps * 1e9) * 1e3
        assert est(node) == pytest.approx(expected, rel=1e-9), kind
    assert set(starts) == {"all_gather", "reduce_scatter", "all_reduce"}
