"""Torch's greedy vs CP-SAT on built-in workloads: counts, feasibility, bounds, apply check.

    python -m experiments.greedy_vs_cpsat --workloads llama3-8b-fsdp-2 ... [--pre both|off|on]
        [--time-limit 60] [--window auto|none|N] [--out experiments/results/greedy_vs_cpsat]

For each workload and pre-bucketing setting: trace; torch's scheduler; extract; torch's greedy
search (recorded, timed) and verifier findings on it, with its best feasible repair when it
breaks a rule; CP-SAT (count objective, 2 workers, greedy as hint); the CP-SAT plan verified
and applied to the real graph with ``apply_plan`` (collectives counted after). ``extract.md``
holds the problem sizes and the wall time of tracing, scheduling, extraction and torch's greedy. With pre-bucketing
on, the greedy row is torch's default pipeline (FSDP pre-bucketing + greedy). Rows are appended
to ``rows.jsonl`` as they finish, the table is rewritten each time (``table.md``), and every
problem and plan is saved gzipped for reproduction.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

import planner
from collections import Counter

from experiments.common import append_row, git_revision, machine, markdown_table, read_rows, save_gz
from fxglue.apply import apply_plan
from fxglue.pipeline import PipelineOptions, count_collectives, prepare
from planner.search.repair import repair
from planner.search.solver import solve
from planner.rules.verifier import check


def run_one(name: str, pre: bool, time_limit: float, window, out: Path) -> dict:
    row: dict = {"workload": name, "pre_bucketing": pre, "revision": REVISION}
    # prepare: trace (8 ranks, TP 2), schedule, extract and torch's greedy, on the α-β figures
    prepared = prepare(name, pipeline=PipelineOptions(pre_bucketing=pre))
    traced, inputs, problem, greedy = prepared.traced, prepared.inputs, prepared.problem, prepared.greedy
    row.update({k: round(v, 2) for k, v in prepared.timings.items()})
    row["nodes"] = problem.n_scheduled
    row["collectives"] = len(problem.collectives)
    row["by_kind_pg"] = dict(sorted(Counter(f"{c.kind}@{c.pg}" for c in problem.collectives).items()))
    status = Counter(c.status for c in problem.collectives)
    row["hidden_partly_exposed"] = f"{status['hidden']} / {status['partly']} / {status['exposed']}"
    row["pinned_nodes"] = len(problem.nodes)
    row["dependency_edges"] = sum(len(n.deps) for n in problem.nodes)
    row["greedy_after"] = planner.collectives_after(problem, greedy)
    g_report = check(problem, greedy)
    row["greedy_violations"] = g_report.by_rule()
    tag = f"{name}{'-pre' if pre else ''}"
    save_gz(problem, out / tag / "problem.json.gz")
    save_gz(greedy, out / tag / "greedy-plan.json.gz")
    hint = greedy
    if not g_report.feasible:
        rep = repair(problem, greedy, planner.SolveOptions(time_limit_s=30))
        row["greedy_repaired_after"] = rep.objective
        if rep.plan is not None:
            hint = rep.plan
            save_gz(rep.plan, out / tag / "greedy-repaired-plan.json.gz")
    else:
        row["greedy_repaired_after"] = row["greedy_after"]

    result = solve(problem, planner.SolveOptions(time_limit_s=time_limit, workers=2, window=window), hint=hint)
    row.update(cpsat_status=result.status, cpsat_after=result.objective, bound=result.bound,
               gap=None if result.gap is None else round(result.gap, 4), cpsat_s=result.wall_s,
               bound_scope=result.stats.get("bound_scope"),
               model_x_vars=result.stats.get("x_vars"), model_stream_clauses=result.stats.get("rule8_stream"))
    if result.plan is not None:
        save_gz(result.plan, out / tag / "cpsat-plan.json.gz")
        q = check(problem, result.plan)
        row["cpsat_feasible"] = q.feasible
        row["hidden_kept"] = f"{q.quality.hidden_kept}/{q.quality.hidden_relations}"
        row["partly_kept"] = f"{q.quality.partly_kept}/{q.quality.partly_relations}"
        t0 = time.perf_counter()
        try:
            with traced.fake_mode:
                apply_plan(inputs.gm.graph, inputs.collective_info, inputs.scheduled, result.plan, problem=problem)
            row["applied_after"] = sum(count_collectives(inputs.gm).values())
        except Exception as e:  # noqa: BLE001 - recorded in the table, never hidden
            row["applied_after"] = f"error: {type(e).__name__}: {str(e)[:120]}"
        row["apply_s"] = round(time.perf_counter() - t0, 2)
    return row


REVISION = git_revision()  # the code this run started with (later commits do not change it)


def write_table(rows: list[dict], out: Path, argv: list[str]) -> None:
    cols = ["workload", "pre_bucketing", "nodes", "collectives", "greedy_after", "greedy_violations",
            "greedy_repaired_after", "cpsat_after", "cpsat_status", "bound", "gap", "bound_scope", "applied_after",
            "hidden_kept", "partly_kept", "greedy_s", "cpsat_s", "apply_s", "revision"]
    # a run resumes, so the rows of one folder may come from several invocations and revisions:
    # each row names its own, the header the invocation that wrote the table last
    revisions = sorted({r.get("revision", "?") for r in rows})
    lines = ["# Torch's greedy vs CP-SAT", "",
             f"Command (last invocation): `python -m experiments.greedy_vs_cpsat {' '.join(argv)}`  ",
             f"Git revision of that invocation: `{REVISION}`; of the rows: {', '.join(f'`{r}`' for r in revisions)}; "
             f"machine: {json.dumps(machine())}  ",
             "CP-SAT: count objective, 2 workers, seed 0, torch's greedy (or its repair) as hint. "
             "Times are wall seconds on this machine, one run.", "", *markdown_table(cols, rows)]
    (out / "table.md").write_text("\n".join(lines) + "\n")
    # the extraction view of the same runs (problem sizes and the wall time of each step)
    cols = ["workload", "pre_bucketing", "nodes", "pinned_nodes", "dependency_edges", "by_kind_pg",
            "hidden_partly_exposed", "greedy_after", "trace_s", "schedule_s", "extract_s", "greedy_s"]
    lines = ["# Extraction", "", "Same runs as table.md (revision of each row there). Wall seconds, one run; "
             "`extract_s / greedy_s` is extraction's cost relative to torch's greedy search.", "",
             "| " + " | ".join(cols) + " | extract/greedy |", "|" + "---|" * (len(cols) + 1)]
    for r in rows:
        ratio = round(r["extract_s"] / r["greedy_s"], 3) if r.get("greedy_s") else ""
        lines.append("| " + " | ".join(str(r.get(c, "")) for c in cols) + f" | {ratio} |")
    (out / "extract.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", nargs="+", required=True)
    ap.add_argument("--pre", choices=["both", "off", "on"], default="both")
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--window", default="auto", help="auto, none, or a number")
    ap.add_argument("--out", default="experiments/results/greedy_vs_cpsat")
    args = ap.parse_args()
    window = args.window if args.window == "auto" else (None if args.window == "none" else int(args.window))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows_path = out / "rows.jsonl"
    rows = read_rows(rows_path)
    pres = {"both": [False, True], "off": [False], "on": [True]}[args.pre]
    for name in args.workloads:
        for pre in pres:
            if any(r["workload"] == name and r["pre_bucketing"] == pre for r in rows):
                continue  # resume: keep finished rows
            print(f"{name} pre_bucketing={pre} ...", file=sys.stderr, flush=True)
            row = run_one(name, pre, args.time_limit, window, out)
            rows.append(row)
            append_row(rows_path, row)
            print(json.dumps(row), file=sys.stderr, flush=True)
            write_table(rows, out, sys.argv[1:])
            gc.collect()
    write_table(rows, out, sys.argv[1:])  # also when every row was already there (rewrites the tables)


if __name__ == "__main__":
    main()
