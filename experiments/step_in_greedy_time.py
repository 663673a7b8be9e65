"""The step objective given only torch greedy's own search time, on the 80-layer Llama-3-70B shape.

    python -m experiments.step_in_greedy_time [--source experiments/results/presets_70b]
                                              [--out experiments/results/step_in_greedy_time]

The issue's scale point: at 80 layers a step plan no slower than torch's greedy, found within the
wall time torch's greedy search took on the same graph. Torch-free: reads each committed case
(``problem.json.gz``, ``torch-greedy-plan.json.gz``) and the greedy search's wall time recorded
beside it (``plan_s`` of the "torch greedy" row in the source's ``rows.jsonl``, measured by
``experiments.presets`` in its own run), and runs ``planner.solve`` (step objective, 2 workers,
greedy as hint) with that time limit. ``solve_s`` is this run's wall time, model building and
polish included; the greedy wall time is the committed run's, not measured again here.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import planner
from experiments.common import git_revision, load_gz, machine, markdown_table, read_rows, run_missing
from planner.cost.bounds import step_floor
from planner.search.repair import repair
from planner.search.solver import solve

COLUMNS = ["workload", "preset", "collectives", "greedy_search_s", "solve_s", "status", "unbucketed_ms", "greedy_ms",
           "step_ms", "vs_greedy_pct", "floor_ms", "bound_ms", "polish_evaluations", "wall_limit_hit"]


def run_case(case: Path, greedy_s: float) -> dict:
    workload, preset = case.name.split("--")
    problem = load_gz(case / "problem.json.gz", planner.Problem)
    greedy = load_gz(case / "torch-greedy-plan.json.gz", planner.Plan)
    t0 = time.perf_counter()
    result = solve(problem, planner.SolveOptions(time_limit_s=greedy_s, objective="step", workers=2, seed=0),
                   hint=greedy)
    solve_s = time.perf_counter() - t0
    if planner.verify(problem, greedy):  # torch's greedy often breaks rule 9: simulated as its repair
        greedy = repair(problem, greedy, planner.SolveOptions(time_limit_s=20)).plan
    greedy_ms = planner.simulate(problem, greedy).step_ms
    return {"workload": workload, "preset": preset, "collectives": len(problem.collectives),
            "greedy_search_s": greedy_s, "solve_s": round(solve_s, 1), "status": result.status,
            "unbucketed_ms": round(planner.simulate(problem).step_ms, 3), "greedy_ms": round(greedy_ms, 3),
            "step_ms": round(result.objective, 3),
            "vs_greedy_pct": round(100 * (greedy_ms - result.objective) / greedy_ms, 2),
            "floor_ms": round(step_floor(problem).floor_ms, 3), "bound_ms": round(result.bound, 3),
            "polish_evaluations": (result.stats.get("polish") or {}).get("evaluations"),
            "wall_limit_hit": result.stats.get("wall_limit_hit"), "revision": git_revision()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", default="experiments/results/presets_70b")
    ap.add_argument("--out", default="experiments/results/step_in_greedy_time")
    args = ap.parse_args()
    source, out = Path(args.source), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    greedy_s = {(r["workload"], r["preset"]): r["plan_s"] for r in read_rows(source / "rows.jsonl")
                if r["planner"] == "torch greedy"}
    cases = [c for c in sorted(source.glob("*--*")) if tuple(c.name.split("--")) in greedy_s]
    rows = run_missing(out, cases, lambda c: run_case(c, greedy_s[tuple(c.name.split("--"))]),
                       lambda c: tuple(c.name.split("--")), lambda r: (r["workload"], r["preset"]))
    lines = ["# The step objective within torch greedy's own search time", "",
             f"Command: `python -m experiments.step_in_greedy_time {' '.join(sys.argv[1:])}`; machine: "
             f"{json.dumps(machine())}. One run per case; `greedy_search_s`: torch's greedy search on the same graph "
             f"in the committed run of `{source}` (the time limit here); `solve_s`: this run, all stages included.",
             "", *markdown_table(COLUMNS + ["revision"], rows)]
    (out / "table.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
