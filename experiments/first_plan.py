"""CP-SAT alone, given only torch's greedy wall time: is its plan already no worse than greedy's?

    python -m experiments.first_plan --runs experiments/results/greedy_vs_cpsat_80

For every run in a ``greedy_vs_cpsat`` folder (its saved problem and its row), CP-SAT solves the
problem again with no hint (torch's plan is not used) and a time limit equal to the wall time
torch's greedy search took in that run (``greedy_s``, measured on the same machine), including
model building. Recorded: the verified plan's count, status and bound, when the first incumbent
appeared and when the incumbent first reached greedy's count (from the solver's progress).
Writes ``first_plan.jsonl`` and ``first_plan.md`` into that folder (a rerun resumes).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from experiments.common import append_row, git_revision, load_gz, machine, markdown_table, read_rows
from planner.core.options import SolveOptions
from planner.core.problem import Problem
from planner.search.solver import solve

REVISION = git_revision()


def run_one(row: dict, folder: Path) -> dict:
    tag = f"{row['workload']}{'-pre' if row['pre_bucketing'] else ''}"
    problem = load_gz(folder / tag / "problem.json.gz", Problem)
    greedy = row["greedy_after"]
    budget = float(row["greedy_s"])
    result = solve(problem, SolveOptions(time_limit_s=budget, workers=2, seed=0), hint=None,
                   progress=lambda s: print(f"  {tag}: {s}", file=sys.stderr, flush=True))
    reach = next((t for t, obj, _ in result.progress if obj <= greedy), None)
    return {"workload": row["workload"], "pre_bucketing": row["pre_bucketing"], "collectives": row["collectives"],
            "greedy_after": greedy, "greedy_repaired_after": row.get("greedy_repaired_after"),
            "budget_s": budget, "cpsat_after": result.objective, "status": result.status, "bound": result.bound,
            "first_incumbent_s": result.progress[0][0] if result.progress else None,
            "reached_greedy_s": reach, "no_worse_than_greedy": result.objective is not None and result.objective <= greedy,
            "build_s": result.stats.get("build_s"), "wall_s": result.wall_s, "revision": REVISION}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", required=True, help="a greedy_vs_cpsat result folder")
    args = ap.parse_args()
    folder = Path(args.runs)
    rows = read_rows(folder / "rows.jsonl")
    out_path = folder / "first_plan.jsonl"
    done = read_rows(out_path)
    for row in sorted(rows, key=lambda r: r["greedy_s"]):  # shortest budgets first
        if any(d["workload"] == row["workload"] and d["pre_bucketing"] == row["pre_bucketing"] for d in done):
            continue
        print(f"{row['workload']} pre={row['pre_bucketing']} budget {row['greedy_s']}s ...", file=sys.stderr, flush=True)
        rec = run_one(row, folder)
        done.append(rec)
        append_row(out_path, rec)
        cols = ["workload", "pre_bucketing", "collectives", "greedy_after", "greedy_repaired_after", "budget_s",
                "cpsat_after", "no_worse_than_greedy", "status", "bound", "first_incumbent_s", "reached_greedy_s",
                "build_s", "wall_s"]
        lines = ["# CP-SAT without a hint, within torch greedy's own wall time", "",
                 f"Command: `python -m experiments.first_plan --runs {args.runs}`  ",
                 f"Git revision: `{REVISION}`; machine: {json.dumps(machine())}  ",
                 "`budget_s` = torch's greedy search wall time in the run that made the problem (same machine); "
                 "CP-SAT gets exactly that (model building included), count objective, 2 workers, seed 0, "
                 "no hint. Times in seconds from the start of `solve`.", "", *markdown_table(cols, done)]
        (folder / "first_plan.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
