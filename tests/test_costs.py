"""Pricing: torch's NCCL model in the Problem, bucketing's copies, the step floor.

Each figure is checked against an independent computation: torch's own function, the nodes
``apply_plan`` inserts into a real graph, and the simulator over every feasible plan.
"""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings

import planner
from fxglue.costs import KINDS, nccl_link, torch_bytes, torch_collective_ms
from fxglue.estimator import PRESETS
from planner.cost.bounds import step_floor
from planner.core.problem import copy_bytes
from tests.strategies import problems
from tests.brute import feasible_plans

pytestmark = pytest.mark.slow  # traces workloads and applies plans


def _groups_of(preset):
    """(group size, its ranks per node) of every group the preset's workloads use."""
    world, per_node, tp = preset.world_size, preset.ranks_per_node, preset.tp
    return {(world, min(world, per_node)), (tp, min(tp, per_node)),
            (world // tp, min(world // tp, max(1, per_node // tp)))}


@pytest.mark.parametrize("preset", [p for p in PRESETS.values() if p.comm == "nccl"], ids=lambda p: p.name)
def test_problem_price_equals_torchs_nccl_model_within_one_percent(preset):
    rng = random.Random(0)
    sizes = [rng.randint(1024, 4 * 1024**3) for _ in range(150)]
    sizes += [2**j + d for j in range(10, 33) for d in (-1, 0, 1)]  # where the tree correction steps
    for group_size, per_node in sorted(_groups_of(preset)):
        link = nccl_link("pg", group_size, gpu=preset.gpu, ranks_per_node=per_node)
        for kind in KINDS:
            for b in sizes:
                b -= b % group_size  # a full tensor is a whole number of shards
                want = torch_collective_ms(kind, torch_bytes(kind, b, group_size), group_size,
                                           gpu=preset.gpu, ranks_per_node=per_node)
                got = link.time_ms(kind, b)
                assert abs(got - want) <= 0.01 * want, (preset.name, group_size, kind, b, got, want)


def test_named_topology_is_what_torch_prices_not_this_machine():
    # torch's own figures for 1 MiB all_gather, as its model gives them for H100s (issue #11):
    # 8 ranks in one node, 16 ranks on two nodes, 64 ranks on eight
    one_node = torch_collective_ms("all_gather", 1 << 20, 8, gpu="hopper", ranks_per_node=8)
    two_nodes = torch_collective_ms("all_gather", 1 << 20, 16, gpu="hopper", ranks_per_node=8)
    eight_nodes = torch_collective_ms("all_gather", 1 << 20, 64, gpu="hopper", ranks_per_node=8)
    assert one_node < two_nodes < eight_nodes
    assert abs(one_node - 0.017) < 0.002 and abs(two_nodes - 0.072) < 0.005 and abs(eight_nodes - 0.132) < 0.005
    assert not torch.cuda.is_available()  # the patch did not leak


def test_step_floor_on_alpha_beta_is_bandwidth_time_plus_latencies():
    link = planner.Link(pg="0", group_size=2, latency_ms=0.5, bandwidth_gbps=1.0)
    from planner.cost.bounds import _key_stream_floor

    # 2 buckets at least: two latencies and the bytes once (factor 1/2 on 2 ranks)
    assert _key_stream_floor(link, "all_gather", 4_000_000, 2) == pytest.approx(2 * 0.5 + 2.0)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(max_collectives=5, max_compute=4, max_pgs=2, dtypes=("bfloat16",), costs=True))
def test_step_floor_never_exceeds_any_feasible_plans_simulated_step(problem):
    floor = step_floor(problem).floor_ms
    best = min(planner.simulate(problem, plan).step_ms for plan in feasible_plans(problem))
    assert floor <= best + 1e-9


def _inserted_copy_bytes(graph_before: set[str], gm) -> int:
    """Bytes written by the copies torch's merge inserted: ``cat`` (copy-in; its ``copy_`` into
    the output slice is fused with it by inductor) and ``clone`` (all_gather's copy-out)."""
    total = 0
    for n in gm.graph.nodes:
        if n.name in graph_before or n.op != "call_function":
            continue
        if n.target in (torch.ops.aten.cat.default, torch.ops.aten.clone.default):
            v = n.meta["val"]
            total += v.numel() * v.element_size()
    return total


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama3-8b-fsdp-2", "llama3-8b-ddp-2"])
def test_copy_bytes_charged_match_the_nodes_apply_plan_inserts(name):
    from fxglue.pipeline import run_pipeline
    from fxglue.models.workloads import trace

    traced = trace(name)
    before = {n.name for n in traced.gm.graph.nodes}
    result = run_pipeline(traced, planner_="cpsat", search=planner.SolveOptions(time_limit_s=10))
    problem, plan = result.problem, result.plan
    colls = {c.name: c for c in problem.collectives}
    charged = 0
    for b in plan.buckets:
        first = colls[b.members[0]]
        copy_in, copy_out = copy_bytes(first.kind, [colls[m].wire_bytes for m in b.members],
                                       problem.link(first.pg).group_size, problem.bucket_mode)
        charged += copy_in + copy_out
    inserted = _inserted_copy_bytes(before, result.gm)
    assert charged > 0 and abs(charged - inserted) <= 0.05 * inserted, (charged, inserted)
