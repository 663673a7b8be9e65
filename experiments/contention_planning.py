"""Does planning at the cluster's contention pay? The free-positions plan optimized at contention F
(``Problem.contention``: the positioned search and polish score at F) against the plan optimized
with overlap free, both priced at F, within torch default's peak, through ``planner.plan``.

    bucketplan extract llama3-8b-fsdp-2 -o fsdp2
    python -m experiments.contention_planning fsdp2/problem.json --hint fsdp2/greedy-plan.json \\
        --contention 1.4 --seconds 30 --seeds 0 1 --out experiments/results/contention_planning

``--costs`` and ``--extracted-by`` word the table's heading (how the problems price time, and the
command that extracted them); ``--seeds`` with no seed only rewrites the table from ``rows.jsonl``.

Each row: torch default's plan (the hint) at F; the plan optimized at 1, at 1 and at F; the plan
optimized at F, at F; the bound at F within the peak (``free_position_floor`` raised by
``under_contention``); ``gain_pct``: how much faster at F the plan optimized at F is. Both plans
are of the same graph (the problem at F differs only in its contention). CP-SAT's anchored start
of the free mode optimizes with overlap free in both runs (its model has no contention yet).
One run at a time on the machine: the search is single-threaded and its figures depend on its rate.

``overlap_free`` (rows of revisions 901e610 and 45717df only): a variant, since removed, whose
positioned search at F spent that share of its time with overlap priced free first (replays
without contention run 2.4x faster); 0 there is the search at F alone, as every other row. It
did not help (``experiments/results/contention_planning_measured``: llama3-8b-fsdp-2 and -8 under
nccl-tests logs, docs/results.md).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import planner
from experiments.common import append_row, git_revision, machine, markdown_table, read_rows

COLUMNS = ["problem", "contention", "overlap_free", "seed", "seconds", "torch_default_at_f_ms", "plan_at_1_ms", "plan_at_1_priced_at_f_ms",
           "plan_at_f_ms", "bound_at_f_ms", "gain_pct", "gap_pct", "wall_s", "revision"]


def run(problem_file: Path, hint_file: Path, contention: float, seed: int, seconds: float) -> dict:
    problem, hint = planner.load_problem(problem_file), planner.load_plan(hint_file)
    at_f = problem.model_copy(update={"contention": contention}).with_fingerprint()
    t0 = time.perf_counter()
    free = planner.plan(problem, planner.PlanSpec(mode="free", budget=planner.Budget(seconds), hint=hint, seed=seed))
    hint_f = hint.model_copy(update={"problem_fingerprint": at_f.fingerprint})
    slow = planner.plan(at_f, planner.PlanSpec(mode="free", budget=planner.Budget(seconds), hint=hint_f, seed=seed))
    plan_at_1_at_f = planner.simulate(problem, free.plan, contention=contention).step_ms
    assert slow.objective == planner.simulate(at_f, slow.plan).step_ms
    return {"problem": str(problem_file), "contention": contention, "seed": seed, "seconds": seconds,
            "torch_default_at_f_ms": round(planner.simulate(problem, hint, contention=contention).step_ms, 3),
            "plan_at_1_ms": round(free.objective, 3), "plan_at_1_priced_at_f_ms": round(plan_at_1_at_f, 3),
            "plan_at_f_ms": round(slow.objective, 3), "bound_at_f_ms": round(slow.bound, 3),
            "gain_pct": round(100 * (plan_at_1_at_f / slow.objective - 1), 2), "gap_pct": round(100 * slow.gap, 2),
            "wall_s": round(time.perf_counter() - t0, 1), "revision": git_revision()}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("problem", type=Path, help="a problem extracted without contention")
    ap.add_argument("--hint", type=Path, required=True, help="torch's greedy plan (its peak is the cap)")
    ap.add_argument("--contention", type=float, default=1.4)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--seeds", type=int, nargs="*", default=[0, 1], help="none: only rewrite the table")
    ap.add_argument("--out", type=Path, default=Path("experiments/results/contention_planning"))
    ap.add_argument("--costs", default="under the problem's preset (torch 2.13's NCCL model)",
                    help="how the problem prices time, for the table's heading")
    ap.add_argument("--extracted-by", default="",
                    help="the command that extracted the problems, for the table's heading")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows_file = args.out / "rows.jsonl"
    for seed in args.seeds:
        row = run(args.problem, args.hint, args.contention, seed, args.seconds)
        print(row, flush=True)
        append_row(rows_file, row)
    extracted = f"`{args.extracted_by}`, then " if args.extracted_by else ""
    (args.out / "table.md").write_text("\n".join([
        "# Planning at the cluster's contention", "",
        "Free positions within torch default's peak, through `planner.plan`; every figure a simulated step "
        f"(ms) {args.costs}, at the contention named. `overlap_free` (older rows): the share of the search at F "
        "first spent with overlap free (a variant of revisions 901e610-45717df, removed; 0 or blank: the search "
        "at F alone).", "",
        f"Command: {extracted}`python -m experiments.contention_planning PROBLEM --hint GREEDY --contention F "
        f"--seconds S --seeds ...` (one row per run; the problem column says which); machine: {machine()}; one run "
        "at a time.", "", *markdown_table(COLUMNS, read_rows(rows_file)), ""]))


if __name__ == "__main__":
    main()
