"""The free-position floor with and without a memory cap, beside the best plans we have.

Reads committed results only (nothing is searched): for each positioned plan within a peak-memory
cap (llama3-8b FSDP at 2, 8 and 32 layers, h100-8nodes: every row of the ``CAPPED_RUNS`` folders
of the ``LONGER_RUNS`` folders and ``published_rates``), the floor over every plan with any positions
(``planner.cost.bounds.free_position_floor``) without a cap and within the plan's own peak
(which the plan meets, so the capped floor must stay under its step); and for each Llama-3 case of
``experiments/results/presets_v2`` the best plan of any row beside the floor of its problem.
Writes ``table.md`` and ``rows.jsonl`` into ``--out``.

    python -m experiments.floor_scopes
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import planner
from experiments.common import case_problems, git_revision, machine, markdown_table, read_rows
from planner.cost.bounds import free_position_floor
from planner.cost.memory import peak_bytes

RESULTS = Path("experiments/results")
# experiments.capped_positioned's runs: a folder per workload and order, with problem and plan
CAPPED_RUNS = ("capped_positioned", "capped_positioned_300", "capped_positioned_900", "capped_positioned_600_torch",
               "capped_positioned_default_cap", "capped_positioned_default_cap_600", "capped_positioned_split",
               "capped_positioned_default_cap_split", "capped_positioned_default_cap_resplit",
               "capped_positioned_fresh300", "capped_positioned_fresh300_default", "capped_positioned_anneal",
               "capped_positioned_anneal_default", "capped_positioned_anneal_seed1",
               "capped_positioned_anneal_default_seed1", "capped_positioned_fast", "capped_positioned_fast_default",
               "capped_positioned_runs", "capped_positioned_runs_default")
# folders of experiments.search_longer runs (their plans are of presets_v2 problems)
LONGER_RUNS = ("search_longer", "search_longer_lift", "search_longer_runs")


def _capped_row(name: str, problem, plan) -> dict:
    step, peak = planner.simulate(problem, plan).step_ms, peak_bytes(problem, plan)
    t0 = time.perf_counter()
    capped = free_position_floor(problem, peak_memory_bytes=peak).floor_ms
    seconds = time.perf_counter() - t0
    uncapped = free_position_floor(problem).floor_ms
    assert capped <= step + 1e-9, (name, capped, step)  # the plan is within its own peak
    return {"case": name, "plan_ms": round(step, 2), "cap_gb": round(peak / 1e9, 3),
            "floor_ms": round(uncapped, 2), "capped_floor_ms": round(capped, 2),
            "gap": round((step - uncapped) / step, 4), "capped_gap": round((step - capped) / step, 4),
            "floor_s": round(seconds, 3)}


def capped_rows(results: Path) -> list[dict]:
    rows = []
    for run in CAPPED_RUNS:
        if not (results / run).is_dir():
            continue
        for case in sorted(p for p in (results / run).iterdir() if p.is_dir()):
            rows.append(_capped_row(f"{run}/{case.name}", planner.load_problem(case / "problem.json.gz"),
                                    planner.load_plan(case / "capped-plan.json.gz")))
    for run in LONGER_RUNS:
        longer = results / run
        for row in read_rows(longer / "rows.jsonl"):
            problem = planner.load_problem(results / "presets_v2" / row["case"] / row["problem"])
            rows.append(_capped_row(f"{run}/{row['case']}", problem,
                                    planner.load_plan(longer / f"{row['case']}-plan.json.gz")))
    published = results / "published_rates"
    for row in read_rows(published / "rows.jsonl"):  # on problems re-priced under `published`
        stem = f"{row['workload']}--{row['preset']}"
        rows.append(_capped_row(f"published_rates/{stem}", planner.load_problem(published / f"{stem}-problem.json.gz"),
                                planner.load_plan(published / f"{stem}-plan.json.gz")))
    return rows


def preset_rows(root: Path) -> list[dict]:
    """Per Llama-3 case: the fastest plan on torch's schedules (compare's rows) beside the floor of
    its problem. Every plan of the case, those on the graph's own order too (positioned_at_manual_peak's,
    priced as torch manual's problem is, so not ranked with the others), is checked against its
    own problem's floor."""
    rows = []
    for case in sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith("llama3")):
        best = None
        problems = case_problems(case)
        for plan_file in sorted(case.glob("*-plan.json.gz")):
            stem = plan_file.name[:-len("-plan.json.gz")]
            plan = planner.load_plan(plan_file)
            problem_file, problem = problems[plan.problem_fingerprint]
            step = planner.simulate(problem, plan).step_ms
            floor = free_position_floor(problem).floor_ms
            assert floor <= step + 1e-9, (case.name, stem, floor, step)
            if problem_file != "problem-graph-order.json.gz" and (best is None or step < best[0]):
                best = (step, floor, stem)
        step, floor, stem = best
        rows.append({"case": case.name, "best_plan": stem, "plan_ms": round(step, 2), "floor_ms": round(floor, 2),
                     "above_floor_pct": round(100 * (step - floor) / floor, 1)})
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=RESULTS / "floor_scopes")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    capped, presets = capped_rows(RESULTS), preset_rows(RESULTS / "presets_v2")
    (args.out / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in capped + presets))
    lines = ["# The free-position floor: its scope with and without a memory cap", "",
             f"`python -m experiments.floor_scopes`; git {git_revision()}; {machine()}.", "",
             "## Within a memory cap (each plan's own peak; h100-8nodes)", "",
             *markdown_table(list(capped[0]), capped), "",
             "## Without a cap: the best plan of every row (experiments/results/presets_v2, Llama-3)", "",
             *markdown_table(list(presets[0]), presets), "",
             f"above_floor_pct over the {len(presets)} cases: "
             f"{min(r['above_floor_pct'] for r in presets)} to {max(r['above_floor_pct'] for r in presets)}.", ""]
    (args.out / "table.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
