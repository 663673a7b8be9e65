"""The positioned search again, within torch manual's peak, where no plan of a presets run within it is as fast.

    python -m experiments.positioned_at_manual_peak experiments/results/presets_positions [--seconds 10]

``compare``'s positioned row is budgeted at torch default's peak (or the unbucketed schedule's).
Where torch's manual per-block pass peaks at another height, that row is not judged against the
manual pass at equal memory (issue 26: "within torch manual's peak no slower than torch
manual"): lower (no plan of ours fits), or higher (the manual pass buys its speed with memory our
row was not given). For each case of the run where no plan of ours within the manual row's peak
is as fast as it, this runs ``planner.search.free.position_search`` within the manual pass's peak: on the
committed problem (torch's schedule, from the committed plans on it) where its unbucketed schedule
fits, and on the graph's own order (``fxglue.manual.fixed_order_problem``: torch's scheduler not
run, so compute is not pulled forward under collectives and the peak is lower, as in torch's
manual pass, which replaces the scheduler; priced as torch manual's problem is, the nodes
torch's scheduler pins for overlap left uncharged, so the row is judged against torch manual
only) where torch's schedule's plan does not beat torch manual. The plan kept (torch's schedule's
whenever it beats torch manual, the kind ``use`` applies) is appended as the row
``bucketplan (step, free positions, manual's peak)`` to ``rows.jsonl`` (its plan, and its problem
when it is the graph's order, saved beside the others). A rerun skips cases that have the row.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import planner
from experiments.common import append_row, git_revision, load_gz, read_rows, rewrite_rows, save_gz
from experiments.positioned_acceptance import DEFAULT, MANUAL, _best_within, case_peaks
from bucketplan.compare import _slug
from planner.cost.bounds import free_position_floor
from planner.cost.memory import peak_bytes
from planner.search.free.position_search import position_search
from bucketplan.report import PlanRow, WorkloadRow, table_rows

LABEL = "bucketplan (step, free positions, manual's peak)"
COMPARE_CAP_GB = 2.0  # compare's bucket cap (max_bucket_memory_gb), every other row's


def cases_to_run(folder: Path, rows: list[dict]) -> list[tuple[str, str, dict, int]]:
    """(workload, preset, its rows by label, torch manual's exact peak in bytes) of each case."""
    by: dict[tuple, dict] = {}
    for r in rows:
        by.setdefault((r["workload"], r["preset"]), {})[r["planner"]] = r
    out = []
    for (w, p), mine in by.items():
        manual, default = mine.get(MANUAL), mine.get(DEFAULT)
        if manual is None or default is None or LABEL in mine or manual["peak_gb"] is None:
            continue
        peaks = case_peaks(folder / f"{w}--{p}", mine)
        best = _best_within(mine, peaks, peaks[MANUAL])
        if best is None or best["step_ms"] > manual["step_ms"]:
            out.append((w, p, mine, peaks[MANUAL]))
    return out


def graph_order_problem(workload: str, preset: str, max_bucket_memory_gb: float = COMPARE_CAP_GB) -> planner.Problem:
    """The workload's problem in its graph's own order (torch's scheduler not run), priced as the
    run priced it, with its blocks (for the per-block seed)."""
    from fxglue.blocks import with_blocks
    from fxglue.manual import fixed_order_problem
    from fxglue.models.workloads import trace
    from fxglue.pipeline import estimator_for, resolve_preset

    p = resolve_preset(preset)
    traced = trace(workload, world_size=p.world_size, tp=p.tp)
    problem, _ = fixed_order_problem(traced, estimator_for(traced, preset=p), meta={"preset": p.name},
                                     max_bucket_memory_gb=max_bucket_memory_gb)
    return with_blocks(problem, traced, traced.gm)


def committed_plans(tag: Path, problem: planner.Problem) -> list[planner.Plan]:
    """The committed plans of the case that are plans of ``problem``."""
    plans = [load_gz(f, planner.Plan) for f in sorted(tag.glob("*-plan.json.gz"))]
    return [p for p in plans if p.problem_fingerprint == problem.fingerprint]


def run_case(folder: Path, workload: str, preset: str, mine: dict, budget: int, seconds: float,
             cap_gb: float = COMPARE_CAP_GB) -> dict | None:
    """Half the seconds on torch's schedule (the committed problem, from the committed plans) when
    its unbucketed schedule fits the budget and the cap is compare's; its plan is the row if it
    beats torch manual (the only kind ``use`` applies). Else the graph's own order, from the
    per-block seed, for the seconds left after tracing (priced as torch manual's problem is).
    None when no plan on either order fits torch manual's peak (no row: the case does not hold)."""
    tag = folder / f"{workload}--{preset}"
    t0 = time.perf_counter()
    problem = load_gz(tag / "problem.json.gz", planner.Problem)
    where, problem_file, result = "torch's schedule", "problem.json.gz", None
    if peak_bytes(problem, None) <= budget and cap_gb == COMPARE_CAP_GB:
        result = position_search(problem, committed_plans(tag, problem), peak_memory_bytes=budget,
                                 deadline=time.perf_counter() + seconds / 2)
    if result is None or result.objective > mine[MANUAL]["step_ms"]:
        problem = graph_order_problem(workload, preset, cap_gb)
        where, problem_file = "the graph's own order (torch's scheduler not run)", "problem-graph-order.json.gz"
        left = seconds / 2 if result is not None else seconds  # counted after the trace
        try:
            result = position_search(problem, [], peak_memory_bytes=budget, deadline=time.perf_counter() + left)
        except ValueError:  # even unbucketed, the graph's own order peaks above torch manual
            return None
        save_gz(problem, tag / problem_file)
    elif (tag / "problem-graph-order.json.gz").exists():
        (tag / "problem-graph-order.json.gz").unlink()  # an earlier run's, no row's problem now
    floor = free_position_floor(problem).floor_ms
    save_gz(result.plan, tag / f"{_slug(LABEL)}-plan.json.gz")
    base = mine["unbucketed"]
    # the row as compare's table writes every row (table_rows: peak, floor distance, bound columns),
    # floor and unbucketed step of the plan's own problem
    plan_row = PlanRow(LABEL, problem, result.plan, time.perf_counter() - t0, "FEASIBLE", round(floor, 3),
                       (result.objective - floor) / result.objective,
                       f"on {where} ({problem_file}), within torch manual's peak ({budget / 1e9:.3f} GB)"
                       + (f" and a bucket cap of {cap_gb:g} GB (torch manual's largest bucket; compare's rows: "
                          f"{COMPARE_CAP_GB:g})" if cap_gb != COMPARE_CAP_GB else "") + "; local "
                       f"search, best from {result.stats['best_from']}")
    row = WorkloadRow(workload, base["nodes"], base["collectives_before"], [plan_row], floor_ms=floor,
                      preset=preset, problem=problem)
    row.sims = {LABEL: planner.simulate(problem, result.plan), "unbucketed": planner.simulate(problem)}
    (out,) = [r for r in table_rows([row]) if r["planner"] == LABEL]
    return {**out, "revision": git_revision(), "time_limit_s": seconds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path, help="a presets run (rows.jsonl and the case folders)")
    ap.add_argument("--seconds", type=float, default=10.0, help="search seconds per case (default 10)")
    ap.add_argument("--case", nargs=2, metavar=("WORKLOAD", "PRESET"),
                    help="this case only, again (its earlier row of this label is replaced)")
    ap.add_argument("--max-bucket-memory-gb", type=float, default=COMPARE_CAP_GB,
                    help="the bucket cap of the graph-order problem (default 2, compare's; torch's manual pass "
                         "ignores it: one bucket per block)")
    args = ap.parse_args()
    rows_path = args.folder / "rows.jsonl"
    rows = read_rows(rows_path)
    again = [r for r in rows if args.case and r["planner"] == LABEL and [r["workload"], r["preset"]] == args.case]
    todo = [c for c in cases_to_run(args.folder, [r for r in rows if r not in again])
            if not args.case or list(c[:2]) == args.case]
    print(f"{len(todo)} case(s) to run")
    for w, p, mine, budget in todo:
        row = run_case(args.folder, w, p, mine, budget, args.seconds, args.max_bucket_memory_gb)
        if row is None:
            print(f"{w} @ {p}: no plan fits torch manual's peak ({mine[MANUAL]['peak_gb']} GB) on torch's "
                  f"schedule or on the graph's own order", flush=True)
            continue
        if again:  # the old row goes only once its replacement exists
            rewrite_rows(rows_path, [r for r in read_rows(rows_path) if r not in again] + [row])
        else:
            append_row(rows_path, row)
        print(f"{w} @ {p}: {row['step_ms']} ms at {row['peak_gb']} GB (manual {mine[MANUAL]['step_ms']} ms at "
              f"{mine[MANUAL]['peak_gb']} GB)", flush=True)


if __name__ == "__main__":
    main()
