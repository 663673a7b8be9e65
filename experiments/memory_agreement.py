"""planner.cost.memory against torch's own memory estimator on the graphs ``fxglue.apply`` leaves.

For each workload on a preset: the unbucketed schedule, torch's greedy plan (its repair where it
breaks a rule), CP-SAT's fewest-collectives plan, the positioned search's plan within the
unbucketed peak, and torch's manual per-block pass (its own graph, priced as its problem). Each
plan is applied to a fresh trace and torch's ``memory_estimator.build_memory_profile`` (every
device counted) is set beside ``planner.cost.memory``'s peak.

    python -m experiments.memory_agreement --workloads llama3-8b-fsdp-2 llama3-8b-fsdp-8 \\
        --out experiments/results/memory_agreement
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import planner
from experiments.common import git_revision, machine
from planner.cost.memory import memory_timeline, peak_bytes
from planner.search.free.position_search import position_search


def _applied(name: str, preset: str, plan) -> tuple[planner.Problem, int]:
    from fxglue.apply import apply_plan, torch_peak_bytes
    from fxglue.pipeline import prepare

    prepared = prepare(name, preset=preset, greedy=False)
    inputs, problem = prepared.inputs, prepared.problem
    if plan is not None:
        apply_plan(inputs.gm.graph, inputs.collective_info, inputs.scheduled, plan, problem=problem,
                   bucket_mode=problem.bucket_mode)
    return problem, torch_peak_bytes(inputs.gm.graph)


def _plans(name: str, preset: str, seconds: float) -> dict:
    from fxglue.pipeline import prepare

    prepared = prepare(name, preset=preset)
    problem, greedy = prepared.problem, prepared.greedy
    if planner.verify(problem, greedy):
        greedy = planner.repair(problem, greedy, planner.SolveOptions(time_limit_s=20)).plan
    count = planner.solve(problem, planner.SolveOptions(time_limit_s=seconds, objective="count", workers=2,
                                                        deterministic=True)).plan
    positioned = position_search(problem, [greedy, count],
                                 planner.PositionSearchOptions(max_evaluations=int(100 * seconds)),
                                 peak_memory_bytes=peak_bytes(problem),
                                 deadline=time.perf_counter() + 20 * seconds).plan
    return {"unbucketed": None, "torch greedy": greedy, "cpsat count": count, "positioned": positioned}


def _manual(name: str, preset: str) -> tuple[int, int]:
    from fxglue.apply import torch_peak_bytes
    from fxglue.manual import manual_bucketing_problem
    from fxglue.models.workloads import trace
    from fxglue.pipeline import estimator_for, resolve_preset

    p = resolve_preset(preset)
    traced = trace(name, world_size=p.world_size, tp=p.tp)
    problem, _ = manual_bucketing_problem(traced, estimator_for(traced, preset=p))
    return memory_timeline(problem).peak_bytes, torch_peak_bytes(traced.gm.graph)


def main(argv=None) -> int:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--workloads", nargs="+", default=["llama3-8b-fsdp-2", "llama3-8b-fsdp-8"])
    args.add_argument("--preset", default="h100-8nodes")
    args.add_argument("--seconds", type=float, default=20.0, help="CP-SAT's deterministic seconds; the positioned "
                      "search gets 100 evaluations per second")
    args.add_argument("--out", default="experiments/results/memory_agreement")
    opts = args.parse_args(argv)
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in opts.workloads:
        for label, plan in _plans(name, opts.preset, opts.seconds).items():
            problem, theirs = _applied(name, opts.preset, plan)
            rows.append((name, label, memory_timeline(problem, plan).peak_bytes, theirs))
            print(rows[-1], flush=True)
        rows.append((name, "torch manual (its own graph)", *_manual(name, opts.preset)))
        print(rows[-1], flush=True)
    lines = [f"# planner.cost.memory against torch's estimator ({opts.preset})", "",
             f"Revision {git_revision()}; {json.dumps(machine())}.", "",
             "| workload | plan | planner.cost.memory GB | torch's estimator GB | difference |", "|---|---|---|---|---|"]
    for name, label, ours, theirs in rows:
        lines.append(f"| {name} | {label} | {ours / 1e9:.3f} | {theirs / 1e9:.3f} | {ours - theirs:+d} bytes |")
    (out / "table.md").write_text("\n".join(lines) + "\n")
    (out / "commands.txt").write_text("python -m experiments.memory_agreement " + " ".join(argv if argv is not None else sys.argv[1:]) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
