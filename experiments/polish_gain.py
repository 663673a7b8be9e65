"""What planner.search.polish adds to the committed step plans: each case of experiments/results/presets,
its CP-SAT step plan polished (local search scored by the simulator), on the same problem.

    python -m experiments.polish_gain [--seconds 30] [--out experiments/results/polish]

Torch-free: reads the saved problems and plans (``problem.json.gz``, ``cpsat-step-plan.json.gz``)
and sets the polished step beside the step plan, torch's greedy (repaired where it breaks a rule),
the unbucketed schedule and the step floor of the current code (``planner.cost.bounds.step_floor``,
release/tail floor included). One run per case, wall-clock limited; rows resume from rows.jsonl.
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
from planner.search.polish import polish
from planner.search.repair import repair

COLUMNS = ["workload", "preset", "collectives", "unbucketed_ms", "greedy_ms", "step_ms", "polished_ms", "gain_pct",
           "floor_ms", "evaluations", "polish_s", "local_optimum"]


def run_case(case: Path, seconds: float) -> dict:
    workload, preset = case.name.split("--")
    problem = load_gz(case / "problem.json.gz", planner.Problem)
    step = load_gz(case / "cpsat-step-plan.json.gz", planner.Plan)
    greedy = load_gz(case / "torch-greedy-plan.json.gz", planner.Plan)
    if planner.verify(problem, greedy):
        greedy = repair(problem, greedy, planner.SolveOptions(time_limit_s=20)).plan
    t0 = time.perf_counter()
    result = polish(problem, [step], deadline=t0 + seconds)
    before = planner.simulate(problem, step).step_ms
    return {"workload": workload, "preset": preset, "collectives": len(problem.collectives),
            "unbucketed_ms": round(planner.simulate(problem).step_ms, 3),
            "greedy_ms": round(planner.simulate(problem, greedy).step_ms, 3), "step_ms": round(before, 3),
            "polished_ms": round(result.objective, 3), "gain_pct": round(100 * (before - result.objective) / before, 2),
            "floor_ms": round(step_floor(problem).floor_ms, 3), "evaluations": result.stats["evaluations"],
            "polish_s": round(time.perf_counter() - t0, 1), "local_optimum": result.stats["local_optimum"],
            "revision": git_revision()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--source", default="experiments/results/presets")
    ap.add_argument("--out", default="experiments/results/polish")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cases = [c for c in sorted(Path(args.source).glob("*--*")) if (c / "cpsat-step-plan.json.gz").exists()]
    rows = run_missing(out, cases, lambda c: run_case(c, args.seconds), lambda c: tuple(c.name.split("--")),
                       lambda r: (r["workload"], r["preset"]))
    lines = ["# planner.search.polish on the committed step plans", "",
             f"Command: `python -m experiments.polish_gain {' '.join(sys.argv[1:])}`; machine: {json.dumps(machine())}; "
             f"one run per case, at most {args.seconds:g} s of wall clock each (the machine was shared with other "
             "jobs). `step_ms`: the committed CP-SAT step plan (experiments/results/presets); `polished_ms`: that "
             "plan after planner.search.polish; `floor_ms`: the step floor of this revision.", "",
             *markdown_table(COLUMNS + ["revision"], rows)]
    (out / "table.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
