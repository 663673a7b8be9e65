"""The Hugging Face workloads trace with the project's own path and torch's scheduler runs on them.

Why: ``fxglue.models.hf_models`` builds models from code we do not control, so a transformers or
torch upgrade can silently break tracing (MoE routing falling back to a data-dependent loop)
or change where the collectives land. These tests pin the 2-layer workloads: listed,
traced under FakeTensorMode with one reduce_scatter per parameter, and bucketed by torch's
greedy bucketer. Each is traced once per module (a few seconds on CPU).
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow  # traces Hugging Face models

pytest.importorskip("transformers")

import torch  # noqa: E402

from fxglue.models import hf_models  # noqa: E402
from fxglue.models import workloads as W  # noqa: E402

HF_2_LAYER = sorted(n for n, wl in hf_models.workloads().items() if wl.layers == 2)
C10D = torch.ops._c10d_functional


def _count(gm, op) -> int:
    return sum(1 for n in gm.graph.nodes if n.op == "call_function" and n.target is op.default)


def _n_params(wl: W.Workload) -> int:
    # Build the module the same way tracing does (fake, so full shapes cost nothing).
    from torch._subclasses.fake_tensor import FakeTensorMode

    W.ensure_fake_world()
    with FakeTensorMode():
        module, _, _ = wl.build(W.mesh_groups(wl.style))
    return sum(1 for _ in module.parameters())


@pytest.fixture(scope="module", params=HF_2_LAYER)
def traced(request):
    """(workload, traced, collective counts taken before anything mutates the graph)."""
    wl = W.get_workload(request.param)
    t = W.trace(request.param)
    counts = {k: _count(t.gm, getattr(C10D, k))
              for k in ("all_gather_into_tensor", "reduce_scatter_tensor", "wait_tensor", "all_reduce")}
    return wl, t, counts


def test_one_dense_and_one_moe_family():
    assert {hf_models._arch_of(W.get_workload(n)).moe for n in HF_2_LAYER} == {False, True}


@pytest.mark.parametrize("name", HF_2_LAYER)
def test_listed_by_registry(name):
    reg = W.workloads()
    assert name in reg
    wl = reg[name]
    assert (wl.style, wl.family, wl.layers) == ("fsdp", "hf", 2)
    assert f"{name[:-2]}-8" in reg


@pytest.mark.slow
def test_traces_with_fsdp_collectives(traced):
    wl, t, counts = traced
    n_params = _n_params(wl)
    # SimpleFSDP: one reduce_scatter per parameter gradient; every parameter gathered in
    # forward (and most again in backward); each collective waited on once; no DDP all_reduce.
    assert counts["reduce_scatter_tensor"] == n_params
    assert counts["all_gather_into_tensor"] >= n_params
    assert counts["wait_tensor"] == counts["all_gather_into_tensor"] + counts["reduce_scatter_tensor"]
    assert counts["all_reduce"] == 0
    if hf_models._arch_of(wl).moe:
        # Real top-k routing survived tracing, on the static-shape grouped GEMM path.
        assert _count(t.gm, torch.ops.aten._grouped_mm) > 0
        assert _count(t.gm, torch.ops.aten.topk) > 0


@pytest.mark.slow
def test_traced_step_writes_into_no_tensor(traced):
    # the MoE router's in-place division (`router_top_value /= ...`) is functionalized at trace
    # time: torch's scheduler orders by data edges only (fxglue.models.workloads.trace_step)
    _, t, _ = traced
    assert not W.mutating_nodes(t.gm)
    if hf_models._arch_of(W.get_workload(t.name)).moe:
        assert any(n.target is torch.ops.aten.div.Tensor for n in t.gm.graph.nodes)


@pytest.mark.slow
def test_greedy_pipeline_buckets(traced):
    from fxglue import pipeline as P

    _, t, counts = traced
    r = P.run_pipeline(t, planner_="greedy")  # schedules t.gm in place: run last on this trace
    assert r.collectives_before == {"all_gather": counts["all_gather_into_tensor"],
                                    "reduce_scatter": counts["reduce_scatter_tensor"]}
    before, after = sum(r.collectives_before.values()), sum(r.collectives_after.values())
    assert 0 < after < before
    assert r.collectives_after["all_gather"] < r.collectives_before["all_gather"]


@pytest.mark.parametrize("name", HF_2_LAYER)
def test_small_variant_runs_for_real(name):
    wl = W.get_workload(name, small=True)
    assert (wl.name, wl.style, wl.layers, wl.family) == (name, "fsdp", 2, "hf")
    torch.manual_seed(0)
    module, (ids, labels), loss_fn = wl.build(W.Groups(dp="unused", dp_size=1))
    assert all(p.dtype == torch.float32 for p in module.parameters())
    assert module.config.hidden_size <= 128
    ids = torch.randint(0, module.config.vocab_size, ids.shape)
    labels = torch.randint(0, module.config.vocab_size, labels.shape)
    loss = loss_fn(module, ids, labels)
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None for p in module.parameters())


def test_moe_static_paths_match_reference_loop():
    # The traced MoE must compute what transformers' reference (eager, data-dependent) expert
    # loop computes: same routing, same experts, just batched.
    name = next(n for n in HF_2_LAYER if hf_models._arch_of(W.get_workload(n)).moe)
    torch.manual_seed(0)
    module, (ids, _), _ = W.get_workload(name, small=True).build(W.Groups(dp="unused", dp_size=1))
    ids = torch.randint(0, module.config.vocab_size, ids.shape)
    outs = {}
    with torch.no_grad():
        for impl in ("eager", "batched_mm", "grouped_mm"):
            module.set_experts_implementation(impl)
            outs[impl] = module(input_ids=ids).logits
    torch.testing.assert_close(outs["batched_mm"], outs["eager"])
    torch.testing.assert_close(outs["grouped_mm"], outs["eager"])
