"""Plans that survive a wrong estimate: worst-case regret across cost scenarios, on the committed
8-layer problems of the presets table.

    python -m experiments.robust_scenarios [--scenarios torch,published] [--seconds 60]
        [--out experiments/results/robust_scenarios]

For each committed ``experiments/results/presets/*-8--*/problem.json.gz`` (8 layers; 1, 8 and 64
nodes) this runs ``planner.search.scenarios.robust_plan`` (a step search per scenario on the problem
re-priced by it, then a local search on the worst-case regret), with torch's greedy plan as the
hint, and reports each candidate's steps and regrets. The issue-28 figure: the robust plan's
worst-case regret against the worst-case regret of the plan optimized for torch's model alone
(``step under torch``). Rows append to ``rows.jsonl`` as each case ends (a run resumes); the
table is rewritten each time; each robust plan is saved gzipped. Cost model: the presets'
(torch's NCCL model, roofline compute) and ``planner.search.scenarios``' published figures.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from experiments.common import git_revision, load_gz, machine, markdown_table, run_missing, save_gz
from planner.core.options import SolveOptions
from planner.core.problem import Plan, Problem
from planner.search.scenarios import SCENARIOS, robust_plan

PRESETS_DIR = Path("experiments/results/presets")


@dataclass
class Case:
    name: str
    folder: Path


def run_case(case: Case, scenarios: list[str], seconds: float, out: Path) -> dict:
    problem = load_gz(case.folder / "problem.json.gz", Problem)
    greedy = load_gz(case.folder / "torch-greedy-plan.json.gz", Plan)
    r = robust_plan(problem, scenarios, SolveOptions(time_limit_s=seconds), hint=greedy,
                    progress=lambda m: print(f"  {m}", file=sys.stderr, flush=True))
    save_gz(r.plan, out / case.name / "robust-plan.json.gz")
    j = r.judged
    row = {"case": case.name, "collectives": len(problem.collectives), "seconds": seconds,
           "wall_s": round(r.wall_s, 1), "revision": git_revision()}
    for name in j.steps:
        for s in scenarios:
            row[f"{name} @ {s} ms"] = round(j.steps[name][s], 3)
        row[f"{name} worst regret"] = round(j.worst_regret(name), 5)
    row["torch-optimized worst regret %"] = round(100 * j.worst_regret("step under torch"), 2)
    row["robust worst regret %"] = round(100 * j.worst_regret("robust"), 2)
    row["ratio"] = round(j.worst_regret("robust") / j.worst_regret("step under torch"), 3) \
        if j.worst_regret("step under torch") > 0 else None
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenarios", default="torch,published")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--out", default="experiments/results/robust_scenarios")
    ap.add_argument("--presets-dir", type=Path, default=PRESETS_DIR,
                    help="the presets run whose 8-layer problems to judge (default %(default)s)")
    args = ap.parse_args(argv)
    scenarios = args.scenarios.split(",")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cases = [Case(d.name, d) for d in sorted(args.presets_dir.glob("*-8--*")) if (d / "problem.json.gz").exists()]
    rows = run_missing(out, cases, lambda c: run_case(c, scenarios, args.seconds, out),
                       case_key=lambda c: c.name, row_key=lambda r: r["case"])
    cols = ["case", "collectives", "torch-optimized worst regret %", "robust worst regret %", "ratio", "wall_s"]
    lines = [f"# Worst-case regret across {', '.join(scenarios)}: the plan optimized for torch's model vs the "
             "robust plan", "",
             f"`python -m experiments.robust_scenarios --scenarios {args.scenarios} --seconds {args.seconds:g}"
             + (f" --presets-dir {args.presets_dir} --out {args.out}" if args.presets_dir != PRESETS_DIR else "")
             + "` on "
             f"{machine()}. Scenarios: " + "; ".join(f"`{s}`: {SCENARIOS.get(s, s)}" for s in scenarios) + ".", "",
             *markdown_table(cols, rows), "",
             "regret: a plan's step over the least step any judged plan reaches under that scenario, minus 1 "
             "(planner.search.scenarios); `ratio`: robust / torch-optimized worst regret. Every step per plan and "
             "scenario is in rows.jsonl."]
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
