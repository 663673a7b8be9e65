"""Extract the production-size built-in workloads and tabulate them against torch's greedy.

    python -m experiments.extract_large [--layers 32 80] [--variants fsdp 2d ddp] [--out experiments/results/extract]

For each workload: trace, run torch's overlap scheduler (pre-bucketing off), extract the
problem, run torch's greedy bucket search (recorded as a plan, not applied). Writes
``extract.md`` (the table), ``extract.json`` (rows + machine + git revision) and every
problem and greedy plan (gzipped JSON) to the output folder, one row at a time, so a long run
keeps what it finished.
"""

from __future__ import annotations

import argparse
import gc
import gzip
import json
import platform
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import planner
from fxglue.pipeline import estimator_for, schedule
from fxglue.extract import extract_problem
from fxglue.greedy import greedy_plan
from fxglue.workloads import trace


def git_revision() -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True).stdout.strip()
        return rev + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine() -> dict:
    import os

    import torch

    return {"python": platform.python_version(), "torch": torch.__version__, "cpus": os.cpu_count(),
            "platform": platform.platform()}


def run_one(name: str, out: Path) -> dict:
    t0 = time.perf_counter()
    traced = trace(name)
    trace_s = time.perf_counter() - t0
    est = estimator_for(traced)
    t0 = time.perf_counter()
    inputs = schedule(traced, est, pre_bucketing=False)
    schedule_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    problem = extract_problem(inputs.gm.graph, inputs.collective_info, inputs.scheduled, estimator=est,
                              meta={**traced.meta, "pre_bucketing": False})
    extract_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    plan = greedy_plan(inputs.gm.graph, inputs.collective_info, inputs.scheduled,
                       problem_fingerprint=problem.fingerprint, estimator=est, **inputs.bucketer_kwargs)
    greedy_s = time.perf_counter() - t0
    for obj, fname in ((problem, "problem.json.gz"), (plan, "greedy-plan.json.gz")):
        path = out / name / fname
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(gzip.compress(planner.io.dumps(obj).encode()))
    by_kind_pg = Counter(f"{c.kind}@{c.pg}" for c in problem.collectives)
    status = Counter(c.status for c in problem.collectives)
    return {
        "workload": name, "nodes": problem.n_scheduled, "pinned_nodes": len(problem.nodes),
        "dependency_edges": sum(len(n.deps) for n in problem.nodes),
        "collectives": len(problem.collectives), "by_kind_pg": dict(sorted(by_kind_pg.items())),
        "hidden": status["hidden"], "partly": status["partly"], "exposed": status["exposed"],
        "greedy_after": planner.collectives_after(problem, plan), "greedy_buckets": len(plan.buckets),
        "trace_s": round(trace_s, 2), "schedule_s": round(schedule_s, 2), "extract_s": round(extract_s, 2),
        "greedy_s": round(greedy_s, 2), "extract_over_greedy": round(extract_s / greedy_s, 3),
    }


def write_table(rows: list[dict], out: Path, args) -> None:
    head = ("| workload | nodes | collectives (kind@pg) | hidden / partly / exposed | torch greedy after "
            "| trace s | schedule s | extract s | greedy s | extract/greedy |")
    lines = [
        "# Extraction of the large built-in workloads", "",
        f"Command: `python -m experiments.extract_large {' '.join(sys.argv[1:])}`  ",
        f"Git revision: `{git_revision()}`; machine: {json.dumps(machine())}  ",
        "Pre-bucketing off; torch's greedy search only (recorded, not applied); times are wall seconds "
        "on this machine, one run.", "", head, "|" + "---|" * 10,
    ]
    for r in rows:
        kinds = ", ".join(f"{k} {v}" for k, v in r["by_kind_pg"].items())
        lines.append(f"| {r['workload']} | {r['nodes']} | {r['collectives']} ({kinds}) | {r['hidden']} / "
                     f"{r['partly']} / {r['exposed']} | {r['greedy_after']} | {r['trace_s']} | {r['schedule_s']} | "
                     f"{r['extract_s']} | {r['greedy_s']} | {r['extract_over_greedy']} |")
    (out / "extract.md").write_text("\n".join(lines) + "\n")
    (out / "extract.json").write_text(json.dumps({"revision": git_revision(), "machine": machine(),
                                                  "rows": rows}, indent=1) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, nargs="+", default=[32, 80])
    ap.add_argument("--variants", nargs="+", default=["fsdp", "2d", "ddp"])
    ap.add_argument("--out", default="experiments/results/extract")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for layers in args.layers:
        for variant in args.variants:
            name = f"llama3-8b-{variant}-{layers}"
            print(f"{name} ...", file=sys.stderr, flush=True)
            rows.append(run_one(name, out))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
            write_table(rows, out, args)
            gc.collect()


if __name__ == "__main__":
    main()
