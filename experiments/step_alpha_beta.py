"""The step objective on the problems its acceptance figures came from: the α-β link.

    python -m experiments.step_alpha_beta [--source experiments/results/greedy_vs_cpsat_small]
                                          [--out experiments/results/step_alpha_beta] [--time-limit 60]

The step objective's targets (2 layers proved in 60 s, 8 layers within 1% of the bound) were set
from a prototype measured on these problems: the committed 2- and 8-layer graphs priced on one
α-β link (FSDP over 8 ranks on InfiniBand), where bucket size does not change the per-byte time
and the step floor is nearly reached (unbucketed − floor: 2.4% of the step on fsdp-8). This runs
today's step solve on them as ``bucketplan sweep`` runs each case (2 workers, seed 0, torch's
greedy, repaired when it breaks a rule, as hint and floor plan), so that its figures can be
read beside the preset sweeps (torch's NCCL curves, where the floor is far from any plan).
``reducible_pct``: (unbucketed − floor) / unbucketed, the most any plan could gain.
Torch-free: reads each workload's ``problem.json.gz`` and ``greedy-plan.json.gz``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import planner
from experiments.common import git_revision, load_gz, machine, markdown_table, run_missing
from planner.cost.bounds import step_floor
from planner.jobs.plan_dir import start_plan
from planner.search.solver import solve

COLUMNS = ["workload", "collectives", "time_limit_s", "solve_s", "status", "unbucketed_ms", "greedy_ms", "step_ms",
           "floor_ms", "bound_ms", "gap_pct", "reducible_pct", "wall_limit_hit"]


def run_case(case: Path, time_limit_s: float) -> dict:
    problem = load_gz(case / "problem.json.gz", planner.Problem)
    greedy, _ = start_plan(problem, load_gz(case / "greedy-plan.json.gz", planner.Plan))
    t0 = time.perf_counter()
    result = solve(problem, planner.SolveOptions(time_limit_s=time_limit_s, objective="step", workers=2, seed=0),
                   hint=greedy, fallback_plans=(greedy,) if greedy is not None else ())
    solve_s = time.perf_counter() - t0
    unbucketed = planner.simulate(problem).step_ms
    floor = step_floor(problem).floor_ms
    return {"workload": case.name, "collectives": len(problem.collectives), "time_limit_s": time_limit_s,
            "solve_s": round(solve_s, 1), "status": result.status, "unbucketed_ms": round(unbucketed, 3),
            "greedy_ms": round(planner.simulate(problem, greedy).step_ms, 3) if greedy is not None else None,
            "step_ms": round(result.objective, 3), "floor_ms": round(floor, 3), "bound_ms": round(result.bound, 3),
            "gap_pct": round(100 * result.gap, 3), "reducible_pct": round(100 * (unbucketed - floor) / unbucketed, 2),
            "wall_limit_hit": result.stats.get("wall_limit_hit"), "revision": git_revision()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", default="experiments/results/greedy_vs_cpsat_small")
    ap.add_argument("--out", default="experiments/results/step_alpha_beta")
    ap.add_argument("--time-limit", type=float, default=60.0)
    args = ap.parse_args()
    source, out = Path(args.source), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # the pre-bucketed variants (*-pre) are torch's default pipeline's graphs, not the prototype's
    cases = sorted(c for c in source.iterdir() if (c / "problem.json.gz").is_file() and not c.name.endswith("-pre"))
    rows = run_missing(out, cases, lambda c: run_case(c, args.time_limit), lambda c: c.name, lambda r: r["workload"])
    lines = ["# The step objective on the α-β link its targets were set on", "",
             f"Command: `python -m experiments.step_alpha_beta {' '.join(sys.argv[1:])}`; machine: "
             f"{json.dumps(machine())}. One wall-clock run per workload, one after another; `greedy_ms`: torch's "
             "greedy as recorded, or its repair where it breaks a rule.",
             "", *markdown_table(COLUMNS + ["revision"], rows)]
    (out / "table.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
