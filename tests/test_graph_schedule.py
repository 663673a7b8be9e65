"""``--schedule graph`` (extract, apply): plan on the graph's own order, torch's scheduler not run,
as torch's manual per-block pass plans; the plan applies to that order, and torch's own memory
estimator agrees with the budget the plan was searched within."""

from __future__ import annotations

import pytest

import planner
from tests.support import run_main
from tests.test_hostile import assert_one_line_error


def test_the_graph_order_runs_no_scheduler_so_no_pre_bucketing(capsys, tmp_path):
    from fxglue.pipeline import PipelineOptions
    from planner.core.arguments import ArgumentError

    with pytest.raises(ArgumentError, match="no pre-bucketing"):
        PipelineOptions(schedule="graph", pre_bucketing=True)
    with pytest.raises(ArgumentError, match="'fifo': one of torch, graph"):
        PipelineOptions(schedule="fifo")
    code, _, err = run_main(["extract", "llama3-8b-fsdp-2", "--schedule", "graph", "--pre-bucketing",
                             "-o", tmp_path / "o"], capsys)
    assert_one_line_error(code, err, "--schedule 'graph' runs no torch scheduler")
    assert not (tmp_path / "o").exists()


@pytest.mark.slow  # traces llama3-8b-fsdp-2 four times, searches 5 s
def test_extract_on_the_graph_order_then_solve_within_its_peak_then_apply(capsys, tmp_path):
    """extract --schedule graph writes the problem ``fixed_order_problem`` extracts from a fresh
    trace (the order torch's manual pass plans on); solve --positions free within its unbucketed
    peak gives a verified plan; apply --schedule graph applies it, and torch's memory_estimator on
    the applied graph reads no more than that peak; apply without the flag names it."""
    from fxglue.apply import torch_peak_bytes
    from fxglue.blocks import with_blocks
    from fxglue.manual import fixed_order_problem
    from fxglue.models.workloads import trace
    from fxglue.pipeline import PipelineOptions, estimator_for, resolve_preset, run_pipeline
    from planner.cost.memory import peak_bytes

    out = tmp_path / "g"
    code, printed, err = run_main(["extract", "llama3-8b-fsdp-2", "--schedule", "graph", "-q", "-o", out], capsys)
    assert code == 0, err
    assert "schedule            the graph's own order (torch's scheduler not run)" in printed
    problem = planner.load_problem(out / "problem.json")
    assert problem.meta["schedule"] == "graph"
    preset = resolve_preset("h100-8nodes")
    traced = trace("llama3-8b-fsdp-2", world_size=preset.world_size, tp=preset.tp)
    expected, _ = fixed_order_problem(traced, estimator_for(traced, preset=preset))
    expected = with_blocks(expected, traced, traced.gm)  # each collective's block, as every extraction records
    assert problem.fingerprint == expected.fingerprint
    # torch's schedule pulls compute forward under collectives: its unbucketed peak is the higher
    code, _, err = run_main(["extract", "llama3-8b-fsdp-2", "-q", "-o", tmp_path / "t"], capsys)
    assert code == 0, err
    cap = peak_bytes(problem)
    assert cap < peak_bytes(planner.load_problem(tmp_path / "t" / "problem.json"))

    code, printed, err = run_main(["solve", out / "problem.json", "-o", out / "plan.json", "--positions", "free",
                                   "--peak-memory-gb", cap / 1e9, "--time-limit", "5", "-q"], capsys)
    assert code == 0, err
    plan = planner.load_plan(out / "plan.json")
    assert planner.verify(problem, plan, keep_overlap=False) == []
    assert any(len(b.members) > 1 for b in plan.buckets)
    assert peak_bytes(problem, plan) <= cap

    code, _, err = run_main(["apply", "llama3-8b-fsdp-2", out / "plan.json", "-q"], capsys)
    assert_one_line_error(code, err, "plan-matches-problem", "--schedule")
    code, printed, err = run_main(["apply", "llama3-8b-fsdp-2", out / "plan.json", "-q", "--schedule", "graph"],
                                  capsys)
    assert code == 0, err
    applied = run_pipeline("llama3-8b-fsdp-2", planner_=plan, preset=preset,
                           pipeline=PipelineOptions(schedule="graph"))
    assert applied.problem.fingerprint == problem.fingerprint
    assert torch_peak_bytes(applied.gm.graph) <= cap
