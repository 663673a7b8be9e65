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
    assert planners == ["unbucketed", "torch default (pre-bucketing + greedy)", "torch greedy", "cpsat (count)",
                        "cpsat (time, partly protected)"]
    assert all(r["workload"] in printed for r in rows)
    by = {r["planner"]: r for r in rows}
    assert int(by["cpsat (count)"]["collectives_after"]) <= int(by["torch greedy"]["collectives_after"])
    assert float(by["unbucketed"]["step_ms"]) > 0
    import matplotlib.image

    for png in ("collectives_and_exposed.png", "timeline.png"):
        img = matplotlib.image.imread(out / png)
        assert img.shape[0] > 100 and img.shape[1] > 100
    traces = sorted((out / "traces").glob("*.json"))
    assert len(traces) == 5
    for t in traces:
        events = json.loads(t.read_text())["traceEvents"]
        assert any(e.get("ph") == "X" for e in events)
