"""`bucketplan compare`: one table, and outputs a person can open (PNG renders, traces load)."""

from __future__ import annotations

import csv
import json


def test_compare_writes_table_plots_and_traces(tmp_path, capsys):
    from bucketplan_cli import main

    out = tmp_path / "cmp"
    assert main(["compare", "llama3-8b-ddp-2", "-o", str(out), "--time-limit", "5", "-q"]) == 0
    printed = capsys.readouterr().out
    rows = list(csv.DictReader((out / "compare.csv").open()))
    planners = [r["planner"] for r in rows]
    assert planners == ["unbucketed", "torch default (pre-bucketing + greedy)", "torch greedy",
                        "torch manual (a bucket per block)", "cpsat (count)", "cpsat (step)",
                        "cpsat (step, pre-bucketed)", "bucketplan (step, free positions)"]
    assert all(r["workload"] in printed for r in rows)
    by = {r["planner"]: r for r in rows}
    assert int(by["cpsat (count)"]["collectives_after"]) <= int(by["torch greedy"]["collectives_after"])
    assert float(by["unbucketed"]["step_ms"]) > 0
    # the step plan is never slower than what it started from; no row is below the floor
    step = float(by["cpsat (step)"]["step_ms"])
    assert step <= min(float(by[k]["step_ms"]) for k in ("unbucketed", "torch greedy", "cpsat (count)"))
    assert all(float(r["step_ms"]) >= float(r["floor_ms"]) for r in rows)
    pre = float(by["cpsat (step, pre-bucketed)"]["step_ms"])
    assert pre <= float(by["torch default (pre-bucketing + greedy)"]["step_ms"])
    # the positioned row stays within torch default's peak memory, or the unbucketed schedule's if
    # that is higher (every row reports its peak)
    positioned = by["bucketplan (step, free positions)"]
    budget = max(float(by[k]["peak_gb"]) for k in ("torch default (pre-bucketing + greedy)", "unbucketed"))
    assert float(positioned["peak_gb"]) <= budget + 1e-3
    assert float(positioned["step_ms"]) <= float(by["unbucketed"]["step_ms"])
    # it searches torch's pre-bucketed schedule from torch default's plan too: never slower than it
    assert float(positioned["step_ms"]) <= float(by["torch default (pre-bucketing + greedy)"]["step_ms"]) + 1e-6
    assert all(r["peak_gb"] for r in rows)
    import matplotlib.image

    for png in ("collectives_and_exposed.png", "timeline.png"):
        img = matplotlib.image.imread(out / png)
        assert img.shape[0] > 100 and img.shape[1] > 100
    traces = sorted((out / "traces").glob("*.json"))
    assert len(traces) == 8
    for t in traces:
        events = json.loads(t.read_text())["traceEvents"]
        assert any(e.get("ph") == "X" for e in events)
