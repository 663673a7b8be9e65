"""Every planner priced on real cluster shapes: step time against the floor, per preset.

    python -m experiments.presets --workloads llama3-8b-fsdp-2 ... --presets h100-1node h100-8nodes
        [--time-limit 30] [--out experiments/results/presets]

For each workload and cluster preset this runs ``bucketplan.compare.compare_workload`` (the rows of
``bucketplan compare``: unbucketed, torch's default pipeline, torch's greedy, CP-SAT count and
time objectives) on problems traced at the preset's world size and priced by torch's NCCL
model with bucketing's copies and launches, and sets every simulated step against the step
floor (``planner.cost.bounds.step_floor``). Rows are appended to ``rows.jsonl`` as each workload
finishes (a run resumes), ``table.md`` and ``above_floor.png`` are rewritten each time, and the
problem (pre-bucketing off) and every plan are saved gzipped.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
from pathlib import Path

from experiments.common import append_row, git_revision, machine, markdown_table, read_rows, save_gz
from bucketplan.compare import _slug, compare_workload
from bucketplan.report import COLUMNS, table_rows

REVISION = git_revision()


def run_one(name: str, preset: str, time_limit: float, out: Path, manual: bool = True) -> list[dict]:
    say = lambda msg: print(f"  {msg}", file=sys.stderr, flush=True)  # noqa: E731
    row = compare_workload(name, time_limit_s=time_limit, traces_to=None, say=say, preset=preset, manual=manual)
    tag = out / f"{name}--{preset}"
    for p in row.plans:
        if p.plan is not None:
            save_gz(p.plan, tag / f"{_slug(p.planner)}-plan.json.gz")
            if p.problem is not row.plans[1].problem:  # torch default's pre-bucketed, manual's own graph
                save_gz(p.problem, tag / f"{_slug(p.planner)}-problem.json.gz")
    save_gz(row.plans[1].problem, tag / "problem.json.gz")
    published = _published(row)
    return [{**r, **published.get(r["planner"], {}), "revision": REVISION, "time_limit_s": time_limit}
            for r in table_rows([row])]


def _published(row) -> dict[str, dict]:
    """Per row: its plan re-priced under the ``published`` scenario (planner.search.scenarios: cross-node
    groups at published nccl-tests bus bandwidths, compute 1.5x slower), with its regret there
    against the best row of the case; the same plans, nothing searched again."""
    from planner.search.scenarios import judge_each

    candidates = {"unbucketed": (row.problem, None), **{p.planner: (p.problem, p.plan) for p in row.plans
                                                         if p.plan is not None}}
    judged = judge_each(candidates, ["torch", "published"])
    best = min(steps["published"] for steps in judged.steps.values())
    return {name: {"published_ms": round(steps["published"], 3),
                   "published_regret_pct": round(100 * (steps["published"] / best - 1), 2)}
            for name, steps in judged.steps.items()}


def add_pre_step(name: str, preset: str, time_limit: float, out: Path, rows: list[dict]) -> list[dict]:
    """Only the ``cpsat (step, pre-bucketed)`` row, for a case run before compare had it; the
    floor and the unbucketed step come from that case's rows."""
    from bucketplan.compare import PRE_STEP_LABEL, _greedy_row, pre_step_row
    from bucketplan.report import WorkloadRow
    from fxglue.pipeline import PipelineOptions, prepare
    from planner.cost.simulator import simulate

    mine = {r["planner"]: r for r in rows if r["workload"] == name and r["preset"] == preset}
    say = lambda msg: print(f"  {msg}", file=sys.stderr, flush=True)  # noqa: E731
    p = prepare(name, preset=preset, pipeline=PipelineOptions(pre_bucketing=True))
    default = _greedy_row("torch default (pre-bucketing + greedy)", p.problem, p.greedy, p.timings["greedy_s"])
    plan_row = pre_step_row(name, p.problem, default.plan, time_limit, say)
    row = WorkloadRow(name, p.problem.n_scheduled, mine["unbucketed"]["collectives_before"], [plan_row],
                      floor_ms=mine["unbucketed"]["floor_ms"], preset=preset)
    row.sims = {PRE_STEP_LABEL: simulate(p.problem, plan_row.plan), "unbucketed": simulate(p.problem)}
    out_rows = [r for r in table_rows([row]) if r["planner"] == PRE_STEP_LABEL]
    for r in out_rows:
        r["nodes"] = mine["unbucketed"]["nodes"]
        slower = r["step_ms"] > mine["unbucketed"]["step_ms"] + 1e-9
        r["note"] = "; ".join(x for x in (plan_row.note, "slower than unbucketed" if slower else "") if x)
    save_gz(plan_row.plan, out / f"{name}--{preset}" / f"{_slug(PRE_STEP_LABEL)}-plan.json.gz")
    save_gz(p.problem, out / f"{name}--{preset}" / "problem-pre.json.gz")
    return [{**r, "revision": REVISION, "time_limit_s": time_limit} for r in out_rows]


def plot(rows: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = list(dict.fromkeys((r["workload"], r["preset"]) for r in rows))
    planners = list(dict.fromkeys(r["planner"] for r in rows))
    fig, ax = plt.subplots(figsize=(max(8, 0.9 * len(cases)), 4.8))
    width = 0.8 / len(planners)
    for k, label in enumerate(planners):
        ys = [next((r["above_floor_pct"] for r in rows if (r["workload"], r["preset"]) == c and r["planner"] == label),
                   0) or 0 for c in cases]
        ax.bar([i + k * width for i in range(len(cases))], ys, width, label=label)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(cases))], [f"{w}\n{p}" for w, p in cases], rotation=30,
                  ha="right", fontsize=7)
    ax.set_ylabel("simulated step above the floor (% of floor)")
    ax.set_title("Distance to the step floor per workload and cluster preset (lower is better)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "above_floor.png", dpi=110)
    plt.close(fig)


def write_table(rows: list[dict], out: Path, argv: list[str]) -> None:
    revisions = sorted({r.get("revision", "?") for r in rows})
    lines = ["# Planners on cluster presets: simulated step time against the floor", "",
             f"Command (last invocation): `python -m experiments.presets {' '.join(argv)}`  ",
             f"Revisions of the rows: {', '.join(f'`{r}`' for r in revisions)}; machine: {json.dumps(machine())}  ",
             "CP-SAT: 2 workers, seed 0, torch's greedy (or its repair) as hint; `plan_s` wall seconds, one run. "
             "`floor_ms`: planner.cost.bounds.step_floor (no plan can beat it). `published_ms`: the same plan "
             "re-priced under planner.search.scenarios' `published` scenario (cross-node groups at published nccl-tests "
             "bus bandwidths, compute 1.5x slower), `published_regret_pct` its step there over the case's best row "
             "there, minus 1 (rows run before these columns existed have none).", "",
             *markdown_table(COLUMNS + ["published_ms", "published_regret_pct", "revision"], rows)]
    (out / "table.md").write_text("\n".join(lines) + "\n")
    plot(rows, out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", nargs="+", required=True)
    ap.add_argument("--presets", nargs="+", required=True)
    ap.add_argument("--time-limit", type=float, default=30.0)
    ap.add_argument("--out", default="experiments/results/presets")
    ap.add_argument("--no-manual", action="store_true", help="skip torch's manual per-block pass (slow at 80 layers)")
    ap.add_argument("--add-pre-step", action="store_true",
                    help="only add the 'cpsat (step, pre-bucketed)' row to cases already in rows.jsonl")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows_path = out / "rows.jsonl"
    rows = read_rows(rows_path)
    for preset in args.presets:
        for name in args.workloads:
            if args.add_pre_step:
                case = [r for r in rows if r["workload"] == name and r["preset"] == preset]
                if case and not any(r["planner"] == "cpsat (step, pre-bucketed)" for r in case):
                    print(f"{name} on {preset}: step on the pre-bucketed schedule ...", file=sys.stderr, flush=True)
                    for r in add_pre_step(name, preset, args.time_limit, out, rows):
                        rows.append(r)
                        append_row(rows_path, r)
                    write_table(rows, out, sys.argv[1:])
                continue
            if any(r["workload"] == name and r["preset"] == preset for r in rows):
                continue  # resume: keep finished rows
            print(f"{name} on {preset} ...", file=sys.stderr, flush=True)
            for r in run_one(name, preset, args.time_limit, out, manual=not args.no_manual):
                rows.append(r)
                append_row(rows_path, r)
            write_table(rows, out, sys.argv[1:])
            gc.collect()
    write_table(rows, out, sys.argv[1:])


if __name__ == "__main__":
    main()
