"""How the free-positions budget is shared between CP-SAT's anchored start and the positioned
search (``planner.search.planning.TIME_SHARES``), measured through ``planner.plan`` as the
command line calls it.

    bucketplan extract llama3-8b-fsdp-8 --preset h100-8nodes -o fsdp8
    python -m experiments.time_shares fsdp8/problem.json --hint fsdp8/greedy-plan.json \\
        --seconds 300 --seeds 0 1 --splits table search-only --out experiments/results/time_shares

Splits: ``table``, the shares of ``TIME_SHARES`` (what ``bucketplan solve --positions free``
runs); ``search-only``, every second to the positioned search from the hint and the per-block
plan (``anchored_start=False``: ``experiments.capped_positioned``'s split). Within the hint's peak
(torch default's, on torch's schedule), as the command line's default. Each row: the step, the
bound (the floor over every plan with any positions within that peak) and the gap, the
positioned search's evaluations and annealing runs, and where its best plan came from. One run
at a time on the machine: the search is single-threaded and its figures depend on its rate.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import planner
from experiments.common import append_row, git_revision, machine, markdown_table, read_rows

SPLITS = ("table", "search-only")
COLUMNS = ["problem", "split", "seed", "seconds", "step_ms", "bound_ms", "gap_pct", "anchored_ms", "evaluations",
           "anneals", "best_from", "wall_s", "revision"]


def run(problem_file: Path, hint_file: Path, split: str, seed: int, seconds: float) -> dict:
    problem, hint = planner.load_problem(problem_file), planner.load_plan(hint_file)
    spec = planner.PlanSpec(mode="free", budget=planner.Budget(seconds), hint=hint, seed=seed,
                            anchored_start=split == "table")
    t0 = time.perf_counter()
    result = planner.plan(problem, spec, started=t0)
    anchored = result.stats.get("anchored")
    return {"problem": str(problem_file), "split": split, "seed": seed, "seconds": seconds,
            "step_ms": round(result.objective, 3), "bound_ms": round(result.bound, 3),
            "gap_pct": round(100 * result.gap, 2),
            "anchored_ms": round(anchored["objective_ms"], 3) if anchored else None,
            "evaluations": result.stats.get("evaluations"), "anneals": result.stats.get("anneals"),
            "best_from": result.stats.get("best_from"), "wall_s": round(time.perf_counter() - t0, 1),
            "revision": git_revision()}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("problem", type=Path)
    ap.add_argument("--hint", type=Path, required=True, help="torch's greedy plan (its peak is the cap)")
    ap.add_argument("--seconds", type=float, default=300.0)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--splits", nargs="+", choices=SPLITS, default=list(SPLITS))
    ap.add_argument("--out", type=Path, default=Path("experiments/results/time_shares"))
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows_file = args.out / "rows.jsonl"
    for split in args.splits:
        for seed in args.seeds:
            row = run(args.problem, args.hint, split, seed, args.seconds)
            print(row, flush=True)
            append_row(rows_file, row)
    rows = read_rows(rows_file)
    (args.out / "table.md").write_text("\n".join([
        "# Time shares of the free-positions planner", "",
        f"Command: `python -m experiments.time_shares {args.problem} --hint {args.hint} --seconds {args.seconds:g}`; "
        f"machine: {machine()}; one run at a time.", "", *markdown_table(COLUMNS, rows), ""]))


if __name__ == "__main__":
    main()
