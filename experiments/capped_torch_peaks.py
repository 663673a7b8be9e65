"""The committed capped plans of ``experiments/results/capped_positioned`` applied again on the
current code: each plan's peak by ``planner.cost.memory`` beside torch's
``memory_estimator.build_memory_profile`` on the graph ``fxglue.apply`` leaves (positioned plans
on torch's order and on the graph's own order, llama3-8b-fsdp-2 and -8 @ h100-8nodes). Nothing is
searched; the problems are traced again and must have the committed fingerprints.

    python -m experiments.capped_torch_peaks
"""

from __future__ import annotations

from pathlib import Path

import planner
from experiments.capped_positioned import _graph_order, _torch_order
from experiments.common import git_revision, machine, markdown_table
from planner.cost.memory import peak_bytes

ROOT = Path("experiments/results/capped_positioned")


def main() -> None:
    rows = []
    for workload in ("llama3-8b-fsdp-2", "llama3-8b-fsdp-8"):
        for order, make in (("graph", _graph_order), ("torch", _torch_order)):
            problem, _, torch_peak = make(workload)
            tag = ROOT / f"{workload}--{order}-order"
            assert planner.load_problem(tag / "problem.json.gz").fingerprint == problem.fingerprint, tag
            plan = planner.load_plan(tag / "capped-plan.json.gz")
            ours, torch = peak_bytes(problem, plan), torch_peak(plan)
            rows.append({"workload": workload, "order": order, "buckets": len(plan.buckets),
                         "positioned_buckets": sum(1 for b in plan.buckets if b.issue_before or b.wait_before),
                         "planner_memory_gb": round(ours / 1e9, 3), "torch_estimator_gb": round(torch / 1e9, 3),
                         "difference_bytes": torch - ours})
            print(rows[-1], flush=True)
    lines = ["# Capped positioned plans: planner.cost.memory against torch's estimator on the applied graph", "",
             f"`python -m experiments.capped_torch_peaks`; git {git_revision()}; {machine()}.", "",
             *markdown_table(list(rows[0]), rows), ""]
    (ROOT / "torch_peaks.md").write_text("\n".join(lines))


if __name__ == "__main__":
    main()
