"""The positioned search again, for longer, from a committed plan of a presets case, within a row's exact peak.

    python -m experiments.search_longer experiments/results/presets_v2/llama3-8b-fsdp-32--h100-8nodes \\
        --plan bucketplan-step-free-positions-manual-s-peak-plan.json.gz --seconds 1200 \\
        --out experiments/results/search_longer

The presets runs give each search 10-30 s; at 32 layers the positioned search makes about 45
evaluations a second, so those rows are far from what it finds with time. This starts
``planner.search.free.position_search`` from one committed plan of the case (and the per-block seed), on
that plan's own problem (found by its fingerprint among the case's problem files: torch's schedule,
or the graph's own order), within the exact peak (``planner.cost.memory``) of the row ``--within``
(default torch manual's), for ``--seconds`` of wall clock on one core. The row: the plan's step, its
peak, the floor over every plan with any positions within that peak (``free_position_floor``) and
the gap to it. The plan is verified and saved beside ``rows.jsonl`` and ``table.md``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import planner
from experiments.common import append_row, case_problems, git_revision, load_gz, machine, markdown_table, read_rows, save_gz
from experiments.positioned_acceptance import MANUAL, row_peak_bytes
from planner.cost.memory import peak_bytes
from planner.rules.verifier import verify
from planner.search.free.position_search import positioned_policy
from planner.search.result import gap_of


def run(case: Path, plan_file: str, within: str, seconds: float, out: Path) -> dict:
    start = load_gz(case / plan_file, planner.Plan)
    problem_file, problem = case_problems(case)[start.problem_fingerprint]
    cap = row_peak_bytes(case, within)
    t0 = time.perf_counter()
    result = planner.plan(problem, planner.PlanSpec(mode="free", budget=planner.Budget(seconds), starts=(start,),
                                                    anchored_start=False,
                                                    policy=planner.Policy(keep_overlap=False, peak_memory_bytes=cap)),
                          started=t0)
    wall = time.perf_counter() - t0
    wrong = verify(problem, result.plan, **positioned_policy(cap).as_params())
    assert not wrong, f"the plan kept breaks a rule: {wrong[0]}"
    floor = result.bound  # free_position_floor within the cap
    name = case.name
    save_gz(result.plan, out / f"{name}-plan.json.gz")
    return {"case": name, "problem": problem_file, "from": plan_file, "start_ms": round(planner.simulate(problem, start).step_ms, 3),
            "step_ms": round(result.objective, 3), "within": within, "cap_bytes": cap,
            "peak_bytes": peak_bytes(problem, result.plan), "floor_ms": round(floor, 3),
            "gap": round(gap_of(result.objective, floor), 4), "evaluations": result.stats.get("evaluations"),
            "best_from": result.stats.get("best_from"), "search_s": round(wall, 1), "revision": git_revision()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("case", type=Path, help="a case folder of a presets run")
    ap.add_argument("--plan", required=True, help="the committed plan file of the case to start from")
    ap.add_argument("--within", default=MANUAL, help="the row whose exact peak is the cap (default: torch manual's)")
    ap.add_argument("--seconds", type=float, default=1200.0)
    ap.add_argument("--out", type=Path, default=Path("experiments/results/search_longer"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    row = run(args.case, args.plan, args.within, args.seconds, args.out)
    append_row(args.out / "rows.jsonl", row)
    print(json.dumps(row), flush=True)
    rows = read_rows(args.out / "rows.jsonl")
    text = ["# The positioned search again, for longer, from a committed plan", "",
            "Each row: `python -m experiments.search_longer <case> --plan <from> --seconds <search_s> --out "
            f"{args.out}` (the cap: the exact peak of the row `within`, by `planner.cost.memory`; `floor_ms`: "
            "`free_position_floor` within that cap on the plan's problem; simulated under the case's preset).", "",
            f"Machine: {json.dumps(machine())}", "", *markdown_table(list(rows[0]), rows), ""]
    (args.out / "table.md").write_text("\n".join(text))


if __name__ == "__main__":
    main()
