"""Bucketed graphs compute exactly what the original computed, for real, on gloo ranks."""

from __future__ import annotations

import pytest

from fxglue.gloo import check_workload


@pytest.mark.parametrize("workload,planner,mode,ranks", [
    ("llama3-8b-fsdp-2", "greedy", None, 2),
    ("llama3-8b-ddp-2", "cpsat", None, 2),
    ("llama3-8b-2d-2", "greedy-repaired", "custom_ops", 4),
])
def test_bucketed_graph_is_bitwise_equal(workload, planner, mode, ranks):
    result = check_workload(workload, ranks=ranks, planner=planner, bucket_mode=mode)
    assert result.ok, result.summary()
    for r in result.per_rank:
        assert r.collectives_after < r.collectives_before  # something was really merged
        assert r.max_abs_diff == 0.0


def test_check_cli_reports_and_exits_zero(capsys):
    from bucketplan_cli import main

    assert main(["check", "llama3-8b-fsdp-2", "--planner", "cpsat", "--ranks", "2", "-q"]) == 0
    out = capsys.readouterr().out
    assert "rank 0: bitwise equal" in out and "rank 1: bitwise equal" in out and out.rstrip().endswith("OK")


def test_a_one_rank_data_parallel_group_is_refused():
    from fxglue.workloads import WorkloadError

    with pytest.raises(WorkloadError, match="data-parallel group of 1"):
        check_workload("llama3-8b-2d-2", ranks=2)
