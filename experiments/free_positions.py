"""Free start/wait positions against torch's manual per-block pass, at equal peak memory.

For each workload on one cluster preset: trace and schedule with torch (pre-bucketing off),
extract the problem (with its memory profile and block labels), run torch's manual per-block
pass on a fresh trace and take its own problem's step and peak (both by our simulator and
``planner.cost.memory``, which equals torch's estimator on applied graphs: tests/test_memory.py), then
run ``planner.search.free.position_search`` with the manual plan's peak as the budget, from the per-block seed
and torch's greedy plan, for ``--seconds`` of wall time on one core. Writes ``table.md``,
``rows.jsonl`` and per workload the problem and the positioned plan (gzipped) to ``--out``.

    python -m experiments.free_positions --workloads llama3-8b-fsdp-8 llama3-8b-fsdp-32 \
        --seconds 300 --out experiments/results/free_positions
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import planner
from experiments.capped_positioned import torch_order_peak
from experiments.common import append_row, git_revision, machine, read_rows, save_gz
from planner.cost.memory import memory_timeline
from planner.search import planning
from planner.search.result import gap_of


def _torch_rows(name: str, preset: str, manual: bool) -> tuple[dict, object, object]:
    """Torch's rows as ``bucketplan compare`` has them: its default pipeline (pre-bucketing +
    greedy, on its own pre-bucketed problem), its greedy alone, and its manual per-block pass on a
    fresh trace (``manual``), each as (step ms, peak bytes); a greedy plan that breaks a rule is
    priced as its repair, as compare does. Returns them, the problem and greedy's plan."""
    from bucketplan.compare import _greedy_row, _manual_row
    from fxglue.pipeline import PipelineOptions, prepare

    rows = {}
    base = prepare(name, preset=preset)
    pre = prepare(name, preset=preset, pipeline=PipelineOptions(pre_bucketing=True))
    for label, prepared in (("default", pre), ("greedy", base)):
        row = _greedy_row(label, prepared.problem, prepared.greedy, 0.0)
        rows[label] = (planner.simulate(row.problem, row.plan).step_ms, memory_timeline(row.problem, row.plan).peak_bytes)
    if manual:
        row = _manual_row(name, preset, lambda msg: None)
        rows["manual"] = (planner.simulate(row.problem).step_ms, memory_timeline(row.problem).peak_bytes)
    return rows, base.problem, base.greedy


def run(name: str, preset: str, seconds: float, out: Path, manual: bool = True) -> dict:
    t0 = time.perf_counter()
    torch_rows, problem, greedy = _torch_rows(name, preset, manual)
    fastest = min(torch_rows, key=lambda k: torch_rows[k][0])
    budget = torch_rows[fastest][1]  # at no more memory than the fastest torch row
    prep_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    result = planner.plan(problem, planner.PlanSpec(mode="free", budget=planner.Budget(seconds), hint=greedy,
                                                    anchored_start=False,
                                                    policy=planner.Policy(keep_overlap=False, peak_memory_bytes=budget)),
                          started=t1)
    search_s = time.perf_counter() - t1
    assert not planner.verify(problem, result.plan, **planner.rules.verifier.recorded_policy(result.plan))
    save_gz(problem, out / name / f"{preset}--problem.json.gz")
    save_gz(result.plan, out / name / f"{preset}--positioned-plan.json.gz")
    gb = 1e9
    capped_floor = result.bound  # the floor over every plan with any positions within the budget
    row = {"workload": name, "preset": preset, "unbucketed_ms": planner.simulate(problem).step_ms,
           "unbucketed_peak_gb": memory_timeline(problem).peak_bytes / gb, "fastest_torch": fastest,
           "positioned_ms": result.objective, "positioned_peak_gb": result.peak_bytes / gb,
           "free_floor_ms": planning.floor(problem).floor_ms, "search_s": search_s, "prepare_s": prep_s,
           # the floor over every plan with any positions within the budget, and the plan's gap to it
           "capped_floor_ms": capped_floor, "capped_gap": gap_of(result.objective, capped_floor),
           # the plan applied to a fresh trace: torch's own estimator's peak (planner.cost.memory's is positioned_peak_gb)
           "torch_peak_gb": torch_order_peak(name, result.plan, preset) / gb,
           "stats": result.stats, "revision": git_revision()}
    for label, (ms, peak) in torch_rows.items():
        row[f"{label}_ms"], row[f"{label}_peak_gb"] = ms, peak / gb
    return row


TABLE_HEAD = ("| workload | preset | unbucketed ms | torch default ms (peak GB) | torch greedy ms | torch manual ms "
              "(peak GB) | positioned ms (peak GB) | vs fastest torch row | free-position floor ms | search s "
              "| floor within the budget ms | gap to it | torch's peak of the plan GB |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|")


def _ms_peak(r: dict, label: str) -> str:
    if f"{label}_ms" not in r:
        return "not run"
    peak = r.get(f"{label}_peak_gb")
    return f"{r[f'{label}_ms']:.1f}" + (f" ({peak:.3f})" if peak is not None else "")


def _later(r: dict, column: str, spec: str) -> str:
    """A column rows run before it existed lack ("-")."""
    return format(r[column], spec) if r.get(column) is not None else "-"


def table(rows: list[dict]) -> str:
    lines = [TABLE_HEAD]
    for r in rows:
        fastest = r.get("fastest_torch", "manual")  # the first rows were run against manual, the fastest there
        lines.append(f"| {r['workload']} | {r['preset']} | {r['unbucketed_ms']:.1f} | {_ms_peak(r, 'default')} | "
                     f"{r['greedy_ms']:.1f} | {_ms_peak(r, 'manual')} | **{r['positioned_ms']:.1f}** "
                     f"({r['positioned_peak_gb']:.3f}) | {r['positioned_ms'] / r[f'{fastest}_ms'] - 1:+.1%} "
                     f"({fastest}) | {r['free_floor_ms']:.1f} | {r['search_s']:.0f} | {_later(r, 'capped_floor_ms', '.1f')} "
                     f"| {_later(r, 'capped_gap', '.1%')} | {_later(r, 'torch_peak_gb', '.3f')} |")
    lines += ["", "Columns: simulated step times (ms) on the preset's cost model (torch's NCCL model sampled into the "
              "problem's links; compute at the preset's rates). *torch manual*: torch's manual per-block pass "
              "(`overlap_manual_scheduling`, prefetch and deferred reduce_scatter waits) on its own graph; *torch default*: "
              "FSDP pre-bucketing + greedy on its own pre-bucketed graph; peaks by `planner.cost.memory` on each row's own "
              "problem. *positioned*: `planner.search.free.position_search` with the peak of the fastest torch row as its budget "
              "(the first two rows, run before torch default was measured here: torch manual's, the fastest of "
              "those rows in `bucketplan compare`), peak GB its own, verified under its recorded policy (rules 4, 7, "
              "8 off). *free-position floor*: `planner.cost.bounds.free_position_floor`, no positioned plan is faster; "
              "*floor within the budget*: the same within the fastest torch row's peak (rows run before it: -), and the "
              "plan's gap to it, (plan - floor) / plan; *torch's peak of the plan*: torch's memory estimator "
              "(`memory_estimator.build_memory_profile`) on a fresh trace with the plan applied. "
              "*torch greedy*: as compare prices it (the first two rows: as torch's search recorded it; on "
              "llama3-8b-fsdp-8 it breaks rule 9 in 16 places, as torch's own final cycle check reports; later rows: "
              "its repair where it breaks a rule). Search: one thread, wall-clock limited, so another run may differ.", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", nargs="+", required=True)
    ap.add_argument("--preset", default="h100-8nodes")
    ap.add_argument("--seconds", type=float, default=300.0)
    ap.add_argument("--out", type=Path, default=Path("experiments/results/free_positions"))
    ap.add_argument("--no-manual", action="store_true", help="skip torch's manual pass (slow at 80 layers)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows_path = args.out / "rows.jsonl"
    done = {(r["workload"], r["preset"]) for r in read_rows(rows_path)}
    for name in args.workloads:
        if (name, args.preset) in done:
            continue
        row = run(name, args.preset, args.seconds, args.out, manual=not args.no_manual)
        append_row(rows_path, row)
        print(json.dumps({k: v for k, v in row.items() if k != "stats"}), flush=True)
    rows = read_rows(rows_path)
    command = "python -m experiments.free_positions " + " ".join(
        ["--workloads", *args.workloads, "--preset", args.preset, "--seconds", f"{args.seconds:g}", "--out", str(args.out)]
        + (["--no-manual"] if args.no_manual else []))
    commands = args.out / "commands.txt"  # every invocation that added rows, in order
    seen = commands.read_text().splitlines() if commands.exists() else []
    if command not in seen:
        commands.write_text("\n".join(seen + [command]) + "\n")
    listed = "\n".join(f"- `{c}`" for c in seen + ([command] if command not in seen else []))
    (args.out / "table.md").write_text(f"# Free positions vs torch's fastest row, at its peak memory\n\n"
                                       f"Commands:\n{listed}\n\nMachine: {json.dumps(machine())}\n\n{table(rows)}")


if __name__ == "__main__":
    main()
