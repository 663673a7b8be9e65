"""Torch's manual per-block bucketing (``fxglue.manual``) on the built-in Llama workloads.

Expected counts come from the model's structure, not from the graph: a Llama block has 9
parameters (two RMSNorm weights, wq/wk/wv/wo, w1/w3/w2); around the blocks sit the embedding
(``tok_emb``) and the final norm and output head. SimpleFSDP gathers every parameter in
forward, gathers it again in backward wherever backward needs the weight (every one but the
embedding's: its backward needs only the token ids) and reduce-scatters every gradient.
"""

from __future__ import annotations

import functools
import math

import pytest

import planner
from fxglue.models.llama import LLAMA3_8B

pytestmark = pytest.mark.slow  # traces workloads for torch's manual pass

BLOCK_PARAMS = 9
LAYERS = 2
BF16 = 2


def block_param_bytes(tp: int = 1) -> int:
    """Bytes of one block's parameters (full, unsharded), from the model config alone."""
    c = LLAMA3_8B
    hd = c.dim // c.n_heads
    q = c.dim * (c.n_heads // tp) * hd
    kv = c.dim * (c.n_kv_heads // tp) * hd
    numel = 2 * c.dim + 2 * q + 2 * kv + 3 * c.dim * (c.ffn_dim // tp)
    return numel * BF16


@functools.lru_cache(maxsize=None)
def manual(name: str, phase_local: bool = True):
    from fxglue.manual import manual_bucketing_problem
    from fxglue.models.workloads import trace

    traced = trace(name)
    problem, info = manual_bucketing_problem(traced, phase_local=phase_local)
    return traced, problem, info


def _block_checks(problem, info, tp: int):
    plans = info.module_bucket_plans
    assert plans == ["tok_emb", ["norm", "output"]] + [f"layers.{i}" for i in range(LAYERS)]
    colls = {c.name: c for c in problem.collectives}
    for i in range(LAYERS):
        p = plans.index(f"layers.{i}")
        mine = [b for b in info.buckets if b.plan == p]
        # one bucket per block per (phase, kind): forward gather, backward re-gather, gradient scatter
        assert sorted((b.phase, b.kind) for b in mine) == [
            ("backward", "all_gather"), ("backward", "reduce_scatter"), ("forward", "all_gather")]
        for b in mine:
            assert len(b.params) == BLOCK_PARAMS and all(q.startswith(f"layers.{i}.") for q in b.params)
            assert colls[b.name].wire_bytes == block_param_bytes(tp), b
    # the embedding: forward gather and gradient scatter only; norm + output: one bucket each way
    assert sorted((b.phase, b.kind, len(b.params)) for b in info.buckets if b.plan == 0) == [
        ("backward", "reduce_scatter", 1), ("forward", "all_gather", 1)]
    assert sorted((b.phase, b.kind, len(b.params)) for b in info.buckets if b.plan == 1) == [
        ("backward", "all_gather", 2), ("backward", "reduce_scatter", 2), ("forward", "all_gather", 2)]


def _simulates(problem):
    sim = planner.simulate(problem, None)
    assert len(sim.buckets) == len(problem.collectives)
    assert sim.step_ms > 0
    assert math.isclose(sim.step_ms, sim.compute_ms + sim.exposed_ms + getattr(sim, "overhead_ms", 0.0),
                        rel_tol=1e-9, abs_tol=1e-6)
    return sim


def test_fsdp_one_bucket_per_block_per_kind():
    traced, problem, info = manual("llama3-8b-fsdp-2")
    fsdp_before = LAYERS * 3 * BLOCK_PARAMS + 2 + 3 + 3  # blocks + tok_emb (no re-gather) + norm + output
    fsdp_after = LAYERS * 3 + 2 + 3
    assert sum(info.collectives_before.values()) == fsdp_before
    assert info.collectives_before == {"all_gather": LAYERS * 2 * BLOCK_PARAMS + 1 + 4,
                                       "reduce_scatter": LAYERS * BLOCK_PARAMS + 3}
    assert len(problem.collectives) == sum(info.collectives_after.values()) == fsdp_after < fsdp_before
    assert problem.bucket_mode == "custom_ops"
    assert info.replay_forced_waits == 0
    _block_checks(problem, info, tp=1)
    traced.gm.graph.lint()
    _simulates(problem)


def test_fsdp_backward_buckets_stay_in_backward():
    """The one adaptation: the backward run sees only backward compute, so its first gather is
    not hoisted above the forward (torch's pass as is on the joint graph does that)."""
    from fxglue.manual import loss_ancestors

    traced, problem, info = manual("llama3-8b-fsdp-2")
    graph = traced.gm.graph
    pos = {n.name: i for i, n in enumerate(graph.nodes)}
    loss = pos[graph.output_node().args[0][0].name]
    fwd = {n.name for n in loss_ancestors(graph)}
    for b in info.buckets:
        assert (b.name in fwd) == (b.phase == "forward")
        if b.phase == "backward":
            assert pos[b.name] > loss, b


def test_2d_buckets_fsdp_collectives_and_leaves_tp_all_reduce():
    _, problem, info = manual("llama3-8b-2d-2")
    tp_all_reduces = LAYERS * 4  # per block: after attention and MLP in forward, before both in backward
    assert info.collectives_before["all_reduce"] == info.collectives_after["all_reduce"] == tp_all_reduces
    assert info.collectives_after["all_gather"] + info.collectives_after["reduce_scatter"] == LAYERS * 3 + 5
    assert len({c.pg for c in problem.collectives}) == 2
    _block_checks(problem, info, tp=2)
    _simulates(problem)


def test_ddp_all_reduce_is_left_alone_and_the_emulated_plan_covers_it():
    """Torch's pass buckets only FSDP all_gather / reduce_scatter: DDP's graph is unchanged.
    ``per_block_plan`` puts the same per-block idea on our scheduled problem instead."""
    from fxglue.extract import extract_problem
    from fxglue.manual import per_block_plan, transformer_block_plans, module_of
    from fxglue.pipeline import estimator_for, schedule
    from fxglue.models.workloads import trace

    _, problem, info = manual("llama3-8b-ddp-2")
    ddp = LAYERS * BLOCK_PARAMS + 3
    assert info.collectives_before == info.collectives_after == {"all_reduce": ddp}
    assert not any(b.merged for b in info.buckets)
    _simulates(problem)

    traced = trace("llama3-8b-ddp-2")
    est = estimator_for(traced)
    inputs = schedule(traced, est)
    scheduled = extract_problem(inputs.gm.graph, inputs.collective_info, inputs.scheduled, estimator=est)
    module = module_of(traced)
    plans = transformer_block_plans(module)
    res = per_block_plan(scheduled, inputs.gm, [n for n, _ in module.named_parameters()], plans)
    assert planner.check(scheduled, res.plan).feasible
    sizes = sorted(len(b.members) for b in res.plan.buckets)
    if not res.repaired:  # one all_reduce bucket per plan entry (the embedding's is a lone one)
        assert sizes == [2] + [BLOCK_PARAMS] * LAYERS
    assert planner.collectives_after(scheduled, res.plan) < ddp
    planner.simulate(scheduled, res.plan)


def test_transformer_block_plans_match_torchtitan_layout():
    import torch.nn as nn

    from fxglue.models.llama import LLAMA_TINY, Llama
    from fxglue.manual import transformer_block_plans

    assert transformer_block_plans(Llama(LLAMA_TINY.with_(n_layers=3))) == [
        "tok_emb", ["norm", "output"], "layers.0", "layers.1", "layers.2"]

    class Tied(nn.Module):  # blocks in a ModuleDict, head first: entries follow registration order
        def __init__(self):
            super().__init__()
            self.head = nn.Linear(4, 4)
            self.blocks = nn.ModuleDict({"a": nn.Linear(4, 4), "b": nn.Linear(4, 4)})

    assert transformer_block_plans(Tied()) == ["head", "blocks.a", "blocks.b"]


def test_the_graph_order_problem_keeps_the_traced_order_and_a_positioned_plan_on_it_verifies():
    """``fixed_order_problem`` on a fresh trace: torch's scheduler does not run, so the problem's
    nodes are the traced graph's in the traced order (torch's schedule moves collectives: the
    scheduled problem's order of the same nodes differs; it pins more, the nodes its overlap used
    as hiding nodes), and the positioned search's plan on it is verified."""
    from fxglue.manual import fixed_order_problem
    from fxglue.models.workloads import trace
    from fxglue.pipeline import estimator_for, prepare
    from planner.search.free.position_search import position_search

    traced = trace("llama3-8b-fsdp-2")
    graph_order = [n.name for n in traced.gm.graph.nodes]
    problem, forced = fixed_order_problem(traced, estimator_for(traced))
    assert forced == 0
    names = [n.name for n in problem.nodes]
    rank = {name: i for i, name in enumerate(graph_order)}
    assert names == sorted(names, key=rank.__getitem__)
    scheduled = [n.name for n in prepare("llama3-8b-fsdp-2", greedy=False).problem.nodes]
    assert set(names) < set(scheduled) and [n for n in scheduled if n in set(names)] != names
    result = position_search(problem, [], planner.PositionSearchOptions(max_evaluations=200, per_block=False),
                             peak_memory_bytes=None, deadline=float("inf"))
    assert not planner.verify(problem, result.plan, **planner.rules.verifier.recorded_policy(result.plan))
