"""fxglue/pipeline.py: ``prepare`` (trace, schedule, extract) and ``run_pipeline`` (then plan and
apply), with the graph's collectives counted independently of the pipeline: by scanning node
targets for torch's functional collective ops.

Where else the pipeline runs: every session-cached workload of tests/conftest.py is a
``prepare``; the planner registry's names through ``run_pipeline`` in test_planners.py; a CP-SAT
plan's inserted copies in test_costs.py.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch

import planner
from fxglue.pipeline import count_collectives, run_pipeline
from tests.conftest import scheduled

pytestmark = pytest.mark.slow  # traces and schedules built-in workloads

c10d = torch.ops._c10d_functional
STARTS = {c10d.all_gather_into_tensor.default: "all_gather", c10d.reduce_scatter_tensor.default: "reduce_scatter",
          c10d.all_reduce.default: "all_reduce"}


def _starts(gm) -> dict[str, str]:
    """Start node name -> kind, for every functional collective start in the graph."""
    return {n.name: STARTS[n.target] for n in gm.graph.nodes if n.op == "call_function" and n.target in STARTS}


def test_prepare_extracts_every_collective_start_of_the_scheduled_graph_once():
    s = scheduled("llama3-8b-2d-2")  # all three kinds, on two process groups
    starts = _starts(s.inputs.gm)
    assert set(starts.values()) == {"all_gather", "reduce_scatter", "all_reduce"}
    assert {c.name: c.kind for c in s.problem.collectives} == starts
    assert len(s.problem.collectives) == len(starts)
    assert count_collectives(s.inputs.gm) == dict(Counter(starts.values()))
    assert s.greedy.problem_fingerprint == s.problem.fingerprint


def test_run_pipeline_without_bucketing_keeps_every_collective():
    result = run_pipeline("llama3-8b-ddp-2", planner_="none")
    kinds = dict(Counter(_starts(result.gm).values()))
    assert kinds == {"all_reduce": len(result.problem.collectives)}
    assert result.collectives_before == result.collectives_after == kinds


@pytest.mark.parametrize("given", ["plan", "plan file"])
def test_run_pipeline_applies_a_given_plan_to_one_collective_per_bucket(given, tmp_path):
    s = scheduled("llama3-8b-ddp-2")
    plan = s.greedy if not planner.verify(s.problem, s.greedy) else planner.repair(s.problem, s.greedy).plan
    assert plan is not None and any(len(b.members) > 1 for b in plan.buckets)
    if given == "plan file":
        plan_path = tmp_path / "plan.json"
        planner.save(plan, plan_path)
    result = run_pipeline("llama3-8b-ddp-2", planner_=plan if given == "plan" else str(plan_path))
    assert result.problem.fingerprint == s.problem.fingerprint and result.plan == plan  # a fresh trace, same problem
    bucketed = sum(len(b.members) for b in plan.buckets)
    expected = len(s.problem.collectives) - bucketed + len(plan.buckets)  # a collective in no bucket stays alone
    left = _starts(result.gm)
    assert len(left) == expected and set(left.values()) == {"all_reduce"}
    assert result.collectives_before == {"all_reduce": len(s.problem.collectives)}
    assert result.collectives_after == {"all_reduce": expected}
