"""The positioned CP-SAT model with the memory cap inside, after the positioned search, at equal
memory as torch's estimator counts it.

For each workload on h100-8nodes, two compute orders and caps: torch's schedule within torch's
greedy (default pipeline) plan's peak, and the graph's own order (torch's scheduler not run, as
torch's manual per-block pass runs) within that order's unbucketed peak, which is torch manual's
peak by torch's estimator (13.493 GB at fsdp-8, 8.214 at fsdp-2). Each row: the positioned
search's plan within the cap (``--search`` s), then ``planner.search.free.capped.solve_capped``
from it (``--cpsat`` s): its step, CP-SAT's status and bound over the capped candidate space, the
floor over every plan with any positions (``free_position_floor``, release/deadline included),
and the plan's peak by ``planner.cost.memory`` beside torch's estimator on the graph the plan was
applied to (``fxglue.apply``).

    python -m experiments.capped_positioned --workloads llama3-8b-fsdp-2 llama3-8b-fsdp-8 \\
        --search 30 --cpsat 60 --out experiments/results/capped_positioned
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import planner
from experiments.common import git_revision, machine, markdown_table, save_gz
from planner.cost.bounds import free_position_floor
from planner.cost.memory import peak_bytes
from planner.search.free.position_search import default_peak_budget, position_search
from planner.search.free.capped import CAPPED_WINDOW, CappedModelOptions, solve_capped

PRESET = "h100-8nodes"


def torch_order_peak(workload: str, plan, preset: str = PRESET) -> int:
    """Torch's estimator's peak of ``plan`` applied to a fresh trace scheduled by torch."""
    from fxglue.apply import apply_plan, torch_peak_bytes
    from fxglue.pipeline import prepare

    fresh = prepare(workload, preset=preset, greedy=False)
    inputs = fresh.inputs
    apply_plan(inputs.gm.graph, inputs.collective_info, inputs.scheduled, plan, problem=fresh.problem,
               bucket_mode=fresh.problem.bucket_mode)
    return torch_peak_bytes(inputs.gm.graph)


def _torch_order(workload: str):
    """(problem, torch's greedy plan, a function giving torch's peak of an applied plan)."""
    from fxglue.pipeline import prepare

    prepared = prepare(workload, preset=PRESET)
    return prepared.problem, prepared.greedy, lambda plan: torch_order_peak(workload, plan)


def _graph_order(workload: str):
    from experiments.positioned_at_manual_peak import graph_order_problem
    from fxglue.apply import apply_plan, torch_peak_bytes
    from fxglue.graph_order import fixed_order_inputs
    from fxglue.models.workloads import trace
    from fxglue.pipeline import estimator_for, resolve_preset

    problem = graph_order_problem(workload, PRESET)
    p = resolve_preset(PRESET)

    def torch_peak(plan) -> int:
        traced = trace(workload, world_size=p.world_size, tp=p.tp)
        info, order, _ = fixed_order_inputs(traced, estimator_for(traced, preset=p), bucket_mode=None)
        apply_plan(traced.gm.graph, info, order, plan, problem=problem, bucket_mode=problem.bucket_mode)
        return torch_peak_bytes(traced.gm.graph)

    return problem, None, torch_peak


def run_case(workload: str, order: str, search_s: float, cpsat_s: float, out: Path,
             start: Path | None = None, within: str = "own", seed: int = 0, window: int = CAPPED_WINDOW,
             evaluations: int | None = None) -> dict:
    """One row; ``start``: a plan file of the same problem the search also starts from (an earlier
    run's, to search on from it). ``within``: "own" caps each order as the module says; "torch-default"
    caps the graph's own order at torch's greedy (default pipeline) peak too. ``seed``: the search's
    (``PositionSearchOptions.seed``); a case searched with another than 0 gets its own folder.
    ``window``: the CP-SAT candidate space's (``solve_capped``). ``evaluations``: the search's
    reproducible limit (``PositionSearchOptions.max_evaluations``; ``search_s`` is then a guard
    only), for starts that are the same plan on any machine."""
    t0 = time.perf_counter()
    problem, greedy, torch_peak = _torch_order(workload) if order == "torch" else _graph_order(workload)
    if greedy is not None:
        cap = default_peak_budget(problem, [greedy])
    elif within == "torch-default":
        torch_problem, torch_greedy, _ = _torch_order(workload)
        cap = default_peak_budget(torch_problem, [torch_greedy])
    else:
        cap = peak_bytes(problem)
    prepare_s = time.perf_counter() - t0
    starts = [greedy] if greedy is not None else []
    if start is not None:
        starts.append(planner.load_plan(start))
    t1 = time.perf_counter()
    searched = position_search(problem, starts, planner.PositionSearchOptions(seed=seed, max_evaluations=evaluations),
                               peak_memory_bytes=cap, deadline=time.perf_counter() + search_s)
    t2 = time.perf_counter()
    floor = free_position_floor(problem, peak_memory_bytes=cap)  # any positions, within the cap
    capped = solve_capped(problem, [searched.plan], peak_memory_bytes=cap, time_limit_s=cpsat_s,
                          floor_ms=floor.floor_ms, search=CappedModelOptions(window=window))
    t3 = time.perf_counter()
    tag = out / (f"{workload}--{order}-order" + (f"--seed-{seed}" if seed else "")
                 + (f"--evaluations-{evaluations}" if evaluations is not None else ""))
    tag.mkdir(parents=True, exist_ok=True)
    save_gz(problem, tag / "problem.json.gz")
    save_gz(capped.plan, tag / "capped-plan.json.gz")
    return {"workload": workload, "preset": PRESET, "order": order, "within": within, "seed": seed,
            "cap_gb": round(cap / 1e9, 3),
            "search_evaluations": searched.stats.get("evaluations"),
            "search_ms": round(searched.objective, 2), "capped_ms": round(capped.objective, 2),
            "status": capped.status, "window": window, "candidate_bound_ms": round(capped.bound, 2),
            "any_position_floor_ms": round(floor.floor_ms, 2),
            "gap_to_floor": round((capped.objective - floor.floor_ms) / capped.objective, 4),
            "peak_gb": round(capped.peak_bytes / 1e9, 3), "torch_peak_gb": round(torch_peak(capped.plan) / 1e9, 3),
            "search_s": round(t2 - t1, 1), "cpsat_s": round(t3 - t2, 1), "prepare_s": round(prepare_s, 1),
            "cpsat_stats": {k: v for k, v in capped.stats.items()
                            if k not in ("rounds_s", "interrupted", "wall_limit_hit")}}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", nargs="+", default=["llama3-8b-fsdp-2", "llama3-8b-fsdp-8"])
    ap.add_argument("--orders", nargs="+", default=["graph", "torch"], choices=["graph", "torch"])
    ap.add_argument("--search", type=float, default=30.0)
    ap.add_argument("--cpsat", type=float, default=60.0)
    ap.add_argument("--out", type=Path, default=Path("experiments/results/capped_positioned"))
    ap.add_argument("--start", type=Path, help="a plan of the (one) workload and order to start from too")
    ap.add_argument("--within", default="own", choices=["own", "torch-default"],
                    help="the cap of the graph's own order: its unbucketed peak (torch manual's), "
                         "or torch default's peak")
    ap.add_argument("--seeds", nargs="+", type=int, default=[0], help="the positioned search's seeds, a row each")
    ap.add_argument("--window", type=int, default=CAPPED_WINDOW,
                    help="CP-SAT's candidate space: the same-key neighbours a bucket may take members from besides "
                         "those of the searched plan's bucket (0: that plan's buckets, any member alone)")
    ap.add_argument("--evaluations", nargs="+", type=int, default=[None],
                    help="the search's reproducible limits (evaluations), a row each: starts that are the same "
                         "plan on any machine (--search is then a wall-clock guard only)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for workload in args.workloads:
        for order in args.orders:
            for evaluations in args.evaluations:
                for seed in args.seeds:
                    row = run_case(workload, order, args.search, args.cpsat, args.out, args.start, args.within, seed,
                                   args.window, evaluations)
                    print(json.dumps(row), flush=True)
                    rows.append(row)
    (args.out / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cols = ["workload", "order", "within", "seed", "search_evaluations", "cap_gb", "search_ms", "capped_ms", "status", "window",
            "candidate_bound_ms",
            "any_position_floor_ms", "gap_to_floor", "peak_gb", "torch_peak_gb", "search_s", "cpsat_s"]
    lines = [f"# The capped positioned CP-SAT after the positioned search ({PRESET})", "",
             f"`python -m experiments.capped_positioned --workloads {' '.join(args.workloads)} "
             f"--orders {' '.join(args.orders)} --search {args.search:g} --cpsat {args.cpsat:g} --out {args.out}"
             + (f" --start {args.start}" if args.start else "")
             + (f" --within {args.within}" if args.within != "own" else "")
             + (f" --seeds {' '.join(map(str, args.seeds))}" if args.seeds != [0] else "")
             + (f" --window {args.window}" if args.window != CAPPED_WINDOW else "")
             + (f" --evaluations {' '.join(map(str, args.evaluations))}" if args.evaluations != [None] else "")
             + "`; "
             f"git {git_revision()}; {machine()}.", "",
             *markdown_table(cols, rows), ""]
    (args.out / "table.md").write_text("\n".join(lines))


if __name__ == "__main__":
    main()
