"""`bucketplan compare`: one table, and outputs a person can open (PNG renders, traces load)."""

from __future__ import annotations

import csv
import json
import re

import pytest

import planner

pytestmark = pytest.mark.slow  # compare traces and plans a workload


PLANNERS = ["unbucketed", "torch default (pre-bucketing + greedy)", "torch greedy",
            "torch manual (a bucket per block)", "cpsat (count)", "cpsat (step)", "cpsat (step, pre-bucketed)",
            "bucketplan (step, free positions)", "bucketplan (free positions, manual's peak)"]


def check_compare_folder(out, printed: str, err: str, workloads: list[str]) -> None:
    """What a finished `bucketplan compare` of ``workloads`` (built-in names) left in ``out`` and
    printed: every planner's row per workload, progress one line per planner run apart, the units
    and statuses the legend promises, rows never below the floor, the positioned row within torch
    default's peak, plots that render, traces that load, every plan saved and verified from the
    command line. The README's main job is checked with it (tests/test_readme.py)."""
    import matplotlib.image

    from bucketplan.cli import main

    rows = list(csv.DictReader((out / "compare.csv").open()))
    assert [r["workload"] for r in rows] == [w for w in workloads for _ in PLANNERS]
    assert all(r["workload"] in printed for r in rows)
    # progress: one line per planner that runs apart (torch's two come with the trace), no solver
    # detail without -v, nothing leaked from torch's loggers
    lines = err.splitlines()
    n = len(workloads)
    assert len(lines) == 7 * n and all(f"/{n} " in x and ", planner " in x and " left" in x for x in lines), lines
    assert [x.split(", planner ")[1].split("/")[0] for x in lines] == ["1-2", "3", "4", "5", "6", "7", "8"] * n
    assert not any("incumbent" in x or "polish" in x or "I1" in x or "INFO" in x for x in lines)
    for workload in workloads:
        mine = [r for r in rows if r["workload"] == workload]
        assert [r["planner"] for r in mine] == PLANNERS
        # OPTIMAL only where the gap is zero; one unit per bound column
        assert all(float(r["gap_pct"] or 0) == 0 for r in mine if r["status"] == "OPTIMAL")
        assert mine[4]["bound_collectives"] and not mine[4]["bound_ms"]
        assert mine[5]["bound_ms"] and not mine[5]["bound_collectives"]
        by = {r["planner"]: r for r in mine}
        assert int(by["cpsat (count)"]["collectives_after"]) <= int(by["torch greedy"]["collectives_after"])
        assert float(by["unbucketed"]["step_ms"]) > 0
        # the step plan is never slower than what it started from; no row is below the floor
        step = float(by["cpsat (step)"]["step_ms"])
        assert step <= min(float(by[k]["step_ms"]) for k in ("unbucketed", "torch greedy", "cpsat (count)"))
        assert all(float(r["step_ms"]) >= float(r["floor_ms"]) for r in mine if r["step_ms"])
        pre = float(by["cpsat (step, pre-bucketed)"]["step_ms"])
        assert pre <= float(by["torch default (pre-bucketing + greedy)"]["step_ms"])
        # the positioned rows stay within torch default's and torch manual's peak memory (every row
        # reports its peak, rounded to the MB: the exact check is equal_memory's test), the first never
        # loses to torch default's plan, and each row's bound is under its step
        positioned = by["bucketplan (step, free positions)"]
        default = by["torch default (pre-bucketing + greedy)"]
        assert float(positioned["peak_gb"]) <= float(default["peak_gb"])
        assert float(positioned["step_ms"]) <= float(default["step_ms"]) + 1e-6
        capped = by["bucketplan (free positions, manual's peak)"]
        if capped["step_ms"]:
            assert float(capped["peak_gb"]) <= float(by["torch manual (a bucket per block)"]["peak_gb"])
        else:  # nothing found within it: the note says what was reached
            assert capped["status"] == "NOT FOUND" and ("lowest peak reached" in capped["note"]
                                                        or "every plan peaks at" in capped["note"]), capped
        for r in (positioned, capped):
            assert not r["step_ms"] or float(r["bound_ms"]) <= float(r["step_ms"])
        assert all(r["peak_gb"] for r in mine if r["step_ms"])
    # the comparison at equal memory: one line per workload and budget, in compare.md and printed
    md = (out / "compare.md").read_text()
    for workload in workloads:
        for budget in ("torch default's peak", "torch manual's peak"):
            assert f"- {workload}, within {budget} (" in md and f"  {workload}, within {budget} (" in printed
    for png in ("step_time.png", "collectives_and_exposed.png", "timeline.png"):
        img = matplotlib.image.imread(out / png)
        assert img.shape[0] > 100 and img.shape[1] > 100
    traces = sorted((out / "traces").glob("*.json"))
    assert len(traces) == 9 * n - sum(not r["step_ms"] for r in rows)
    for trace in traces:
        events = json.loads(trace.read_text())["traceEvents"]
        assert any(e.get("ph") == "X" for e in events)
    # every plan compare computed is saved beside its problem and verifies from the command line
    saved = sorted((out / "plans").glob("*.json"))
    # every row but the unbucketed one, torch's manual pass and a row that found nothing
    assert len(saved) == 7 * n - sum(not r["step_ms"] for r in rows)
    index = (out / "plans" / "index.md").read_text()
    for plan in saved:
        line = next(x for x in index.splitlines() if f"plans/{plan.name}" in x)
        problem = out / line.split("|")[4].strip()
        assert main(["verify", str(problem), str(plan)]) == 0, plan.name
    # the timeline's rows and spans: groups by role, a block's backward (DDP moves nothing in forward)
    from bucketplan.report import _group_names, layer_spans

    if "llama3-8b-ddp-2" in workloads:
        problem = planner.load_problem(out / "problems" / "llama3-8b-ddp-2.json")
        assert set(_group_names(problem).values()) == {"dp"}
        spans = layer_spans(problem)
        assert list(spans) == ["backward"] and spans["backward"][0] < spans["backward"][1]


@pytest.mark.long  # 18 s: the README's main job (tests/test_readme.py) runs compare and these checks
def test_compare_writes_table_plots_traces_and_plans(tmp_path, capsys):
    from bucketplan.cli import main

    out = tmp_path / "cmp"
    assert main(["compare", "llama3-8b-ddp-2", "-o", str(out), "--time-limit", "5"]) == 0
    captured = capsys.readouterr()
    check_compare_folder(out, captured.out, captured.err, ["llama3-8b-ddp-2"])
    capsys.readouterr()


def test_compare_never_replaces_a_run_silently(tmp_path, monkeypatch, capsys):
    """Default: out/compare, then out/compare-2 beside it; a named -o that exists needs --force."""
    import bucketplan.compare as compare
    from bucketplan.cli import main

    monkeypatch.chdir(tmp_path)
    ran = []

    def fake(workloads, *, out, **_):
        from planner.core.io import replace_dir_atomically

        ran.append(out)
        with replace_dir_atomically(out, owned=compare.OUTPUTS) as tmp:  # as the real one: with its manifest
            (tmp / "compare.csv").write_text("table")
        return []
    monkeypatch.setattr(compare, "run_compare", fake)
    for _ in range(3):
        assert main(["compare", "llama3-8b-ddp-2", "-q"]) == 0
    assert [str(p) for p in ran] == ["out/compare", "out/compare-2", "out/compare-3"]
    assert main(["compare", "llama3-8b-ddp-2", "-q", "-o", "out/compare"]) == 2
    assert "--force" in capsys.readouterr().err
    assert main(["compare", "llama3-8b-ddp-2", "-q", "-o", "out/compare", "--force"]) == 0
    assert str(ran[-1]) == "out/compare"


def _qwen3_rows():
    """The committed plans of hf-qwen3-2 @ h100-1node as compare's rows: torch default 9.450 GB,
    CP-SAT's count plan 10.131, the positioned search's 9.450, torch manual 9.875."""
    from pathlib import Path

    from bucketplan.compare import DEFAULT_LABEL, MANUAL_LABEL, POSITIONED_LABEL, TORCH_ROWS
    from bucketplan.report import PlanRow, WorkloadRow

    case = Path(__file__).parent / "data" / "plans_v2" / "hf-qwen3-2--h100-1node"

    def row(label, stem, own_problem):
        problem = planner.load_problem(case / (f"{stem}-problem.json.gz" if own_problem else "problem.json.gz"))
        return PlanRow(label, problem, planner.load_plan(case / f"{stem}-plan.json.gz"), 0.0)

    workload = WorkloadRow("hf-qwen3-2", 0, 0, baselines=TORCH_ROWS)
    workload.problem = planner.load_problem(case / "problem.json.gz")  # unbucketed 9.450 GB
    workload.plans = [row(DEFAULT_LABEL, "torch-default-pre-bucketing-greedy", True),
                      row(MANUAL_LABEL, "torch-manual-a-bucket-per-block", True),
                      row(POSITIONED_LABEL, "bucketplan-step-free-positions", True),
                      row("cpsat (count)", "cpsat-count", False)]
    return workload


def test_a_row_above_torch_defaults_peak_is_flagged():
    """Rows are judged at the memory torch would use: a row whose plan peaks above torch default's
    plan (torch's own rows too) says by how much in its note; rows within it say nothing."""
    from bucketplan.compare import _flag_over_default_peak

    workload = _qwen3_rows()
    _flag_over_default_peak(workload)
    assert [r.note for r in workload.plans[::2]] == ["", ""]
    # the excess in MB, so a small one does not read as equal to the budget: 10.131 - 9.450 GB
    # and 9.875 - 9.450, each rounded to the MB, are 681 and 425 MB give or take one
    for r, gb, mb in ((workload.plans[3], "10.131", 681), (workload.plans[1], "9.875", 425)):
        over = re.fullmatch(rf"peak {re.escape(gb)} GB, ([\d.]+) MB above torch default's peak 9\.450 GB", r.note)
        assert over and mb - 1 <= float(over.group(1)) <= mb + 1, r.note


def test_equal_memory_sets_each_capped_row_against_the_torch_rows_within_its_budget():
    """The line per budget: our row's step, bound and gap, the fastest torch row whose peak is within
    the budget (steps here chosen by hand, so the percentages are the test's own arithmetic), and
    torch's rows above it; a budget without our plan says so with the row's note."""
    from types import SimpleNamespace

    from bucketplan.compare import DEFAULT_LABEL, MANUAL_LABEL, POSITIONED_LABEL, POSITIONED_MANUAL_LABEL
    from bucketplan.report import MemoryBudget, PlanRow, equal_memory_lines, equal_memory_section, table_rows
    from planner.cost.memory import peak_bytes

    workload = _qwen3_rows()
    default, manual, ours = workload.plans[0], workload.plans[1], workload.plans[2]
    ours.bound, ours.gap = 80.0, 0.2
    workload.plans.append(PlanRow(POSITIONED_MANUAL_LABEL, workload.problem, None, 1.0, "NOT FOUND",
                                  note="no plan within a peak of 9 bytes found in 1.0 s"))
    steps = {"unbucketed": 130.0, DEFAULT_LABEL: 120.0, MANUAL_LABEL: 110.0, POSITIONED_LABEL: 100.0,
             "cpsat (count)": 90.0}  # the CP-SAT row is no torch row: never the one compared against
    workload.sims = {k: SimpleNamespace(step_ms=v, exposed_ms=0.0, overhead_ms=0.0) for k, v in steps.items()}
    cap = peak_bytes(default.problem, default.plan)
    manual_peak = peak_bytes(manual.problem, manual.plan)
    assert peak_bytes(workload.problem) <= cap < manual_peak  # the unbucketed row fits; torch manual does not
    workload.budgets = [MemoryBudget("torch default's peak", cap, POSITIONED_LABEL),
                        MemoryBudget("torch manual's peak", manual_peak, POSITIONED_MANUAL_LABEL)]
    first, second = equal_memory_lines(workload)
    assert first == (f"hf-qwen3-2, within torch default's peak ({cap / 1e9:.3f} GB): {POSITIONED_LABEL} 100.000 ms "
                     "(no plan on its schedules within it is under 80.000 ms: gap 20.00%); fastest torch row "
                     f"within it: {DEFAULT_LABEL}, 120.000 ms; ours 16.7% faster; above it: {MANUAL_LABEL} "
                     f"(+{(manual_peak - cap) / 1e6:.1f} MB)")
    assert second == (f"hf-qwen3-2, within torch manual's peak ({manual_peak / 1e9:.3f} GB): no plan of ours "
                      "(no plan within a peak of 9 bytes found in 1.0 s)")
    # compare.md's section carries them, from the table's unbucketed row; what priced each group after
    workload.pricing = ["group 0 (8 ranks, 8 per node) priced by all_gather measured (ag.txt: ...)"]
    section = equal_memory_section(table_rows([workload]))
    k = section.index("## What priced each group")
    assert section[k - 3:k - 1] == [f"- {first}", f"- {second}"]
    assert section[-1] == "- hf-qwen3-2: group 0 (8 ranks, 8 per node) priced by all_gather measured (ag.txt: ...)"


def test_a_capped_row_takes_a_faster_plan_of_another_that_fits_its_budget():
    """A plan our row found within one peak is a plan within every higher peak: the row there takes
    it where its own search did worse, saying so, its bound kept and its gap re-taken; the other way
    round nothing moves (the faster plan is its own)."""
    from bucketplan.compare import (DEFAULT_LABEL, POSITIONED_LABEL, POSITIONED_MANUAL_LABEL,
                                    _best_within_each_budget)
    from bucketplan.report import MemoryBudget, PlanRow
    from planner.cost.memory import peak_bytes

    workload = _qwen3_rows()
    default, ours = workload.plans[0], workload.plans[2]
    slow = simulate_ms(default.problem, default.plan)
    fast = simulate_ms(ours.problem, ours.plan)
    assert fast < slow
    low = peak_bytes(ours.problem, ours.plan)
    workload.budgets = [MemoryBudget("torch default's peak", low + 10**9, POSITIONED_LABEL),
                        MemoryBudget("torch manual's peak", low, POSITIONED_MANUAL_LABEL)]
    # the row within the higher peak searched worse: torch default's plan; the lower one found ours
    bound = 0.9 * fast  # the row's bound (a figure of the test's: it is kept as it is)
    high_row = PlanRow(POSITIONED_LABEL, default.problem, default.plan, 1.0, "FEASIBLE", bound, None, "own note",
                       proof="CP-SAT over its plan's candidate space: FEASIBLE")
    low_row = PlanRow(POSITIONED_MANUAL_LABEL, ours.problem, ours.plan, 1.0, "FEASIBLE", bound, None, "")
    workload.plans = [default, high_row, low_row]
    _best_within_each_budget(workload)
    assert (high_row.problem, high_row.plan) == (ours.problem, ours.plan) and high_row.proof == ""
    assert high_row.note == (f"the plan of row {POSITIONED_MANUAL_LABEL!r}, within this budget too and faster (its own "
                             f"search's best {slow:.3f} ms); own note")
    assert high_row.gap == pytest.approx(0.1) and high_row.bound == bound
    assert low_row.plan is ours.plan and low_row.note == ""


def simulate_ms(problem, plan) -> float:
    return planner.simulate(problem, plan).step_ms


def test_a_problem_file_is_reported_on_its_own_cluster(tmp_path, capsys):
    """A problem file is priced as it was extracted: the report names its cluster as its own, not
    the one --preset would pick (the cluster flags are refused beside it: tests/test_flag_rules.py)."""
    import gzip
    import shutil

    from bucketplan.cli import main
    from tests.support import PROBLEMS

    problem = tmp_path / "problem.json"
    with gzip.open(PROBLEMS / "llama3-8b-fsdp-2--h100-1node.json.gz") as src, problem.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    assert main(["compare", str(problem), "-o", str(tmp_path / "c"), "-q", "--time-limit", "0.3"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("Simulated on h100-1node (each problem file's own cluster, as it was extracted)."), first
    assert "--preset" not in first and "h100-8nodes" not in first
    (row, *_) = csv.DictReader((tmp_path / "c" / "compare.csv").open())
    assert row["cluster"] == "h100-1node"
