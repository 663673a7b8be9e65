"""The committed capped plans of ``experiments/results/capped_positioned`` (and every positioned
plan of 8 or more layers committed since: ``MORE``) applied again on the current code: each plan's peak by ``planner.cost.memory`` beside torch's
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
RESULTS = Path("experiments/results")
SEED_1 = "llama3-8b-fsdp-8--graph-order--seed-1/capped-plan.json.gz"  # a run's second seed
# (results folder, workload, order, the plan's problem file when it is not the fresh trace's, its
# plan file): every positioned plan of 8 layers or more committed since, beside the
# capped_positioned ones
MORE = (("capped_positioned_300", "llama3-8b-fsdp-8", "graph", None, None),
        ("capped_positioned_900", "llama3-8b-fsdp-8", "graph", None, None),
        ("capped_positioned_600_torch", "llama3-8b-fsdp-8", "torch", None, None),
        ("capped_positioned_default_cap", "llama3-8b-fsdp-8", "graph", None, None),
        ("capped_positioned_default_cap_600", "llama3-8b-fsdp-8", "graph", None, None),
        ("capped_positioned_split", "llama3-8b-fsdp-8", "graph", None, None),
        ("capped_positioned_default_cap_split", "llama3-8b-fsdp-8", "graph", None, None),
        ("capped_positioned_default_cap_resplit", "llama3-8b-fsdp-8", "graph", None, None),
        ("published_rates", "llama3-8b-fsdp-8", "torch", "llama3-8b-fsdp-8--h100-8nodes-problem.json.gz",
         "llama3-8b-fsdp-8--h100-8nodes-plan.json.gz"),  # on its own re-priced problem
        ("search_longer", "llama3-8b-fsdp-32", "graph", None, "llama3-8b-fsdp-32--h100-8nodes-plan.json.gz"),
        ("search_longer_lift", "llama3-8b-fsdp-32", "graph", None, "llama3-8b-fsdp-32--h100-8nodes-plan.json.gz"),
        ("capped_positioned_fresh300", "llama3-8b-fsdp-8", "graph", None, None),
        ("capped_positioned_fresh300_default", "llama3-8b-fsdp-8", "graph", None, None),
        ("capped_positioned_anneal", "llama3-8b-fsdp-8", "graph", None, None),
        ("capped_positioned_anneal_default", "llama3-8b-fsdp-8", "graph", None, None),
        ("capped_positioned_fast", "llama3-8b-fsdp-8", "graph", None, None),
        ("capped_positioned_fast_default", "llama3-8b-fsdp-8", "graph", None, None),
        ("capped_positioned_runs", "llama3-8b-fsdp-8", "graph", None, None),
        ("capped_positioned_runs_default", "llama3-8b-fsdp-8", "graph", None, None),
        ("search_longer_runs", "llama3-8b-fsdp-32", "graph", None, "llama3-8b-fsdp-32--h100-8nodes-plan.json.gz"),
        ("capped_positioned_first_use", "llama3-8b-fsdp-8", "graph", None, None),
        ("capped_positioned_first_use_default", "llama3-8b-fsdp-8", "graph", None, None),
        ("capped_positioned_first_use_default", "llama3-8b-fsdp-8", "graph", None, SEED_1),
        ("capped_positioned_first_use_default/again", "llama3-8b-fsdp-8", "graph", None, SEED_1))


def _row(folder: Path, workload: str, order: str, problem_file: str | None, plan_file: str | None) -> dict:
    """One committed plan applied to a fresh trace: planner.cost.memory's peak and torch's."""
    from planner.search.scenarios import rebound

    problem, _, torch_peak = (_graph_order if order == "graph" else _torch_order)(workload)
    tag = folder / f"{workload}--{order}-order"
    plan = planner.load_plan(folder / plan_file if plan_file else tag / "capped-plan.json.gz")
    committed_gb = None
    if problem_file is not None:
        # a plan of a problem extracted earlier and re-priced: the same graph (nodes and collectives,
        # by name, position and bytes) as the fresh trace, its memory profile from that earlier code
        committed = planner.load_problem(folder / problem_file)
        assert committed.fingerprint == plan.problem_fingerprint and _shape(committed) == _shape(problem), folder
        committed_gb = round(peak_bytes(committed, plan) / 1e9, 3)
        plan = rebound(plan, problem)
    else:
        assert plan.problem_fingerprint == problem.fingerprint, (folder, workload)
    ours, torch = peak_bytes(problem, plan), torch_peak(plan)
    return {"plan": f"{folder.relative_to(RESULTS) if folder.is_relative_to(RESULTS) else folder.name}: {workload}"
                    + (" (seed 1)" if plan_file == SEED_1 else ""), "order": order, "buckets": len(plan.buckets),
            "positioned_buckets": sum(1 for b in plan.buckets if b.issue_before or b.wait_before),
            "planner_memory_gb": round(ours / 1e9, 3), "torch_estimator_gb": round(torch / 1e9, 3),
            "difference_bytes": torch - ours, "on_its_committed_problem_gb": committed_gb}


def _shape(problem: planner.Problem) -> tuple:
    return ([(n.name, n.pos, n.deps) for n in problem.nodes],
            [(c.name, c.kind, c.start_pos, c.wait_pos, c.wire_bytes, c.size_bytes) for c in problem.collectives])


def main() -> None:
    cases = [(ROOT, w, o, None, None) for w in ("llama3-8b-fsdp-2", "llama3-8b-fsdp-8") for o in ("graph", "torch")]
    cases += [(RESULTS / folder, *rest) for folder, *rest in MORE]
    rows = []
    for case in cases:
        rows.append(_row(*case))
        print(rows[-1], flush=True)
    lines = ["# Positioned plans: planner.cost.memory against torch's estimator on the applied graph", "",
             f"`python -m experiments.capped_torch_peaks`; git {git_revision()}; {machine()}.", "",
             *markdown_table(list(rows[0]), rows), ""]
    (ROOT / "torch_peaks.md").write_text("\n".join(lines))


if __name__ == "__main__":
    main()
