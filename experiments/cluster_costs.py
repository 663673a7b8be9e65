"""The headline under the best-evidenced costs: compare's rows at equal memory, planned under
nccl-tests logs of published bus bandwidths, compute at a measured rate and NCCL's contention,
each plan then re-priced by held-out logs; and the same rows under torch's own model.

    python -m experiments.cluster_costs --seconds 40 --out experiments/results/cluster_costs

The costs (``--costs measured``, the default, then ``torch``):
- ``measured``: the collectives priced by nccl-tests logs (``logs/``, written here in nccl-tests'
  own format, ``write_logs``) of the published bus bandwidths of each group layout the workloads
  have: 64 ranks over 8 whole H100 nodes (InfiniBand NDR: all_gather and reduce_scatter 320 GB/s,
  all_reduce 400; ``planner.search.scenarios.PUBLISHED_BUSBW``, sources there), 8 ranks one per node
  (a 2-D mesh's data-parallel group, one 400G NIC: 48 GB/s, ibid.) and 8 ranks in one node over
  NVLink 4 (all_reduce 460 GB/s, the low end of the 460-480 GB/s the "NCCL-tests in practice"
  guide of docs.alayanew.com gives for 8xH100 SXM5; all_gather and reduce_scatter 370 GB/s, the
  NVLink 4 bus bandwidth of torch's NCCL table, from NCCL's topo.h). A collective's fixed cost
  (its time at 0 bytes) is torch's NCCL model's for the layout (as the ``published`` scenario
  keeps it): no published small-message figure is held here. Compute at 533 TFLOP/s
  (``--compute-tflops``: the presets' 800 / 1.5, the ``published`` scenario's compute, which it
  takes from published Llama-3-8B training on H100 at 33-43% MFU), and contention 1.19 (``--contention``: compute overlapped
  by NCCL runs 18.9% slower on average, ``CONTENTION_SLOWDOWN``'s source).
- held-out (``heldout.csv``): every plan of the measured run re-priced by a second set of logs of
  the same figures at other sizes (1.5 KiB x 2^k, where the planning logs have 1 KiB x 4^k) with a
  +-4% run-to-run variation, so a plan is not judged on the exact table it was searched under.
- ``torch``: the presets' own model (torch 2.13's NCCL model, compute at 800 TFLOP/s, no contention).

Per workload, ``bucketplan.compare.compare_workload`` with ``--seconds`` per searching row: torch's
rows (unbucketed, default pipeline, greedy, manual per-block pass), CP-SAT's, and our free
positions within torch default's peak and within torch manual's peak exactly (on torch's
schedule, its pre-bucketed one and the graph's own order), each with its
bound (the least step of any plan within that peak on those schedules) and gap. ``results.md``:
per budget, our row against the fastest torch row within it. One run at a time on the machine:
the searches are timed and their figures depend on its rate.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import time
from pathlib import Path

import planner
from experiments.common import git_revision, machine, markdown_table, save_gz

WORKLOADS = ("llama3-8b-fsdp-2", "llama3-8b-fsdp-8", "llama3-8b-2d-8")
PRESET = "h100-8nodes"
COMPUTE_TFLOPS = 533.0
CONTENTION = 1.19
# (ranks, ranks per node) -> bus bandwidth GB/s per kind (sources in the module docstring)
BUSBW = {(64, 8): {"all_gather": 320.0, "reduce_scatter": 320.0, "all_reduce": 400.0},
         (8, 1): {"all_gather": 48.0, "reduce_scatter": 48.0, "all_reduce": 48.0},
         (8, 8): {"all_gather": 370.0, "reduce_scatter": 370.0, "all_reduce": 460.0}}
KINDS = ("all_gather", "reduce_scatter", "all_reduce")
PLANNING_SIZES = [1024 * 4**k for k in range(12)]  # 1 KiB .. 4 GiB, as nccl-tests -f 4
HELDOUT_SIZES = [1536 * 2**k for k in range(23)]  # 1.5 KiB .. 6 GiB
HELDOUT_VARIATION = 0.04
HEADER = ("#                                                              out-of-place                       in-place\n"
          "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n"
          "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)")


@functools.lru_cache(maxsize=None)
def fixed_us(kind: str, ranks: int, per_node: int) -> float:
    """The time torch's NCCL model gives a collective of 0 bytes on the layout."""
    from fxglue.costs import nccl_link

    return nccl_link("x", ranks, gpu="hopper", ranks_per_node=per_node).time_ms(kind, 0) * 1e3


def published_us(kind: str, size: int, ranks: int, per_node: int) -> float:
    """nccl-tests' time for ``size`` bytes (its size column: max(send, receive) bytes of a rank) at
    the layout's bus bandwidth: busbw = algbw x (n-1)/n (all_reduce: 2(n-1)/n), plus the fixed cost
    torch's NCCL model gives the layout."""
    factor = 2 * (ranks - 1) / ranks if kind == "all_reduce" else (ranks - 1) / ranks
    return fixed_us(kind, ranks, per_node) + size * factor / (BUSBW[(ranks, per_node)][kind] * 1e3)


def nccl_tests_log(kind: str, ranks: int, per_node: int, sizes) -> str:
    """A log as nccl-tests prints it (src/common.cu): rank lines naming each rank's host, then one row
    per size with the out-of-place and in-place times (bf16, count per rank for all_gather and
    reduce_scatter, all elements for all_reduce)."""
    out = [f"# Collective test starting: {kind}_perf",
           f"# nThread 1 nGpus 1 minBytes {sizes[0]} maxBytes {sizes[-1]} step: 4(factor) warmup iters: 5 iters: 20",
           "#", "# Using devices"]
    out += [f"#  Rank {r:3d} Group  0 Pid {4000 + r:6d} on gpu-node-{r // per_node:02d} device  {r % per_node} "
            "[0x1b] NVIDIA H100 80GB HBM3" for r in range(ranks)]
    out += ["#", HEADER]
    for size in sizes:
        count = size // 2 if kind == "all_reduce" else size // 2 // ranks
        t = published_us(kind, size, ranks, per_node)
        algbw = size / t / 1e3
        busbw = algbw * (2 * (ranks - 1) / ranks if kind == "all_reduce" else (ranks - 1) / ranks)
        redop = "none" if kind == "all_gather" else "sum"
        out.append(f"{size:12d}  {count:12d}  bfloat16  {redop:>6}      -1  {t:7.2f}  {algbw:6.2f}  {busbw:6.2f}"
                   f"      0  {t:7.2f}  {algbw:6.2f}  {busbw:6.2f}      0")
    out += ["# Out of bounds values : 0 OK", "#"]
    return "\n".join(out) + "\n"


def write_logs(folder: Path) -> list[Path]:
    """The planning logs: one nccl-tests log per kind and layout."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for (ranks, per_node) in BUSBW:
        for kind in KINDS:
            paths.append(folder / f"{kind}_perf-{ranks}x{per_node}.txt")
            paths[-1].write_text(nccl_tests_log(kind, ranks, per_node, PLANNING_SIZES))
    return paths


def write_heldout(path: Path) -> Path:
    """The held-out logs as one CSV (kind, group size, ranks per node, bytes, ms): the same figures at
    other sizes, each time off by up to HELDOUT_VARIATION (a fixed pattern: reproducible)."""
    lines = ["kind,group,ranks_per_node,bytes,ms"]
    for (ranks, per_node) in BUSBW:
        for j, kind in enumerate(KINDS):
            for k, size in enumerate(HELDOUT_SIZES):
                wobble = 1 + HELDOUT_VARIATION * math.sin(1.7 * k + 2.3 * j + ranks)
                # a CSV row's bytes are wire bytes, which nccl-tests' size column is (planner.cost.measured)
                lines.append(f"{kind},{ranks},{per_node},{size},{published_us(kind, size, ranks, per_node) * wobble / 1e3:.6f}")
    path.write_text("\n".join(lines) + "\n")
    return path


def cluster(costs: str, logs: list[Path]):
    """The preset as the command line builds it from its flags (``bucketplan.cli.options.preset``)."""
    from bucketplan.cli.options import preset

    flags = dict(preset=PRESET, ranks=None, tp=None, collective_ranks=None, hardware=None, hbm_tbps=None,
                 profile=None, profile_cpu=False, compute_tflops=None, contention=None, collectives=None)
    if costs == "measured":
        flags.update(compute_tflops=COMPUTE_TFLOPS, contention=CONTENTION, collectives=[str(p) for p in logs])
    return preset(argparse.Namespace(**flags))


def run_workload(workload: str, costs: str, logs: list[Path], heldout: Path | None, seconds: float,
                 out: Path) -> list[dict]:
    """compare's rows of one workload under ``costs``, each plan saved; under the measured costs
    each row re-priced by the held-out logs too."""
    from bucketplan.compare import TORCH_ROWS, compare_workload
    from bucketplan.report import equal_memory_lines
    from planner.cost.memory import peak_bytes
    from planner.search.scenarios import rebound, reprice

    t0 = time.perf_counter()
    row = compare_workload(workload, time_limit_s=seconds, traces_to=None, say=None, preset=cluster(costs, logs))
    wall = time.perf_counter() - t0
    runs = [("unbucketed", row.problem, None, None)] + [(p.planner, p.problem, p.plan, p) for p in row.plans]
    rows, tag = [], out / costs / workload
    for k, (label, problem, plan, p) in enumerate(runs):
        if problem is None or (p is not None and plan is None):
            rows.append({"workload": workload, "costs": costs, "planner": label, "step_ms": None,
                         "note": p.note if p is not None else ""})
            continue
        save_gz(problem, tag / f"{k}-problem.json.gz")
        if plan is not None:
            save_gz(plan, tag / f"{k}-plan.json.gz")
        step = row.sims[label].step_ms
        held = None
        if heldout is not None:
            priced = reprice(problem, str(heldout))
            held = planner.simulate(priced, rebound(plan, priced) if plan is not None else None).step_ms
        rows.append({"workload": workload, "costs": costs, "planner": label, "torch_row": label in TORCH_ROWS,
                     "step_ms": round(step, 3), "heldout_ms": None if held is None else round(held, 3),
                     "peak_bytes": peak_bytes(problem, plan), "bound_ms": None if p is None else p.bound,
                     "gap_pct": None if p is None or p.gap is None else round(100 * p.gap, 2),
                     "note": "" if p is None else p.note})
    rows.append({"workload": workload, "costs": costs, "planner": "(equal memory)",
                 "lines": equal_memory_lines(row), "budgets": [[b.name, b.peak_bytes, b.ours] for b in row.budgets],
                 "pricing": list(row.pricing), "wall_s": round(wall, 1), "seconds": seconds,
                 "revision": git_revision()})
    return rows


def headline(rows: list[dict]) -> list[dict]:
    """Per workload, costs and budget: our row against the fastest torch row within that peak."""
    out = []
    for summary in (r for r in rows if r["planner"] == "(equal memory)"):
        mine = [r for r in rows if r["workload"] == summary["workload"] and r["costs"] == summary["costs"]
                and r["planner"] != "(equal memory)"]
        for name, cap, ours_label in summary["budgets"]:
            ours = next(r for r in mine if r["planner"] == ours_label)
            fits = [r for r in mine if r.get("torch_row") and r["step_ms"] is not None and r["peak_bytes"] <= cap]
            best = min(fits, key=lambda r: r["step_ms"]) if fits else None
            line = {"workload": summary["workload"], "costs": summary["costs"], "budget": name,
                    "budget_gb": round(cap / 1e9, 3), "torch_best": best["planner"] if best else None,
                    "torch_ms": best["step_ms"] if best else None, "ours_ms": ours["step_ms"],
                    "bound_ms": ours.get("bound_ms"), "gap_pct": ours.get("gap_pct")}
            if best and ours.get("bound_ms") is not None:
                # most any plan could gain: from the torch row down to the bound
                line["most_pct"] = round(100 * (1 - ours["bound_ms"] / best["step_ms"]), 1)
            if best and ours["step_ms"] is not None:
                line["gain_pct"] = round(100 * (1 - ours["step_ms"] / best["step_ms"]), 1)
                if ours.get("heldout_ms") is not None:
                    line["torch_heldout_ms"] = best["heldout_ms"]
                    line["ours_heldout_ms"] = ours["heldout_ms"]
                    line["heldout_gain_pct"] = round(100 * (1 - ours["heldout_ms"] / best["heldout_ms"]), 1)
            out.append(line)
    return out


def memory_check(out: Path, workloads) -> list[str]:
    """Each capped plan of the measured run applied to its workload (torch's merge functions, on
    the schedule its problem was extracted on, priced as it was), and torch's own
    ``memory_estimator`` read on the applied graph against the budget: one line each."""
    from experiments.common import load_gz
    from fxglue.apply import torch_peak_bytes
    from fxglue.pipeline import PipelineOptions, run_pipeline
    from planner.cost.memory import peak_bytes

    logs = sorted((out / "logs").glob("*.txt"))
    rows = [json.loads(x) for x in (out / "rows.jsonl").read_text().splitlines()]
    lines = []
    for workload in workloads:
        mine = [r for r in rows if r["workload"] == workload and r["costs"] == "measured"]
        summary = next(r for r in mine if r["planner"] == "(equal memory)")
        planners = [r["planner"] for r in mine if r["planner"] != "(equal memory)"]  # run_workload's order
        for name, cap, label in summary["budgets"]:
            k = planners.index(label)
            if not (out / "measured" / workload / f"{k}-plan.json.gz").exists():
                lines.append(f"{workload} within {name}: no plan")
                continue
            problem = load_gz(out / "measured" / workload / f"{k}-problem.json.gz", planner.Problem)
            plan = load_gz(out / "measured" / workload / f"{k}-plan.json.gz", planner.Plan)
            options = PipelineOptions(pre_bucketing=bool(problem.meta.get("pre_bucketing")),
                                      schedule="graph" if problem.meta.get("schedule") == "graph" else "torch")
            applied = run_pipeline(workload, planner_=plan, preset=cluster("measured", logs), pipeline=options)
            assert applied.problem.fingerprint == problem.fingerprint, (workload, label)
            torch_peak = torch_peak_bytes(applied.gm.graph)
            lines.append(f"{workload} within {name} ({cap} bytes): planned {peak_bytes(problem, plan)} bytes "
                         f"(planner.cost.memory); torch's memory_estimator on the applied graph ({options.schedule} "
                         f"schedule{', pre-bucketed' if options.pre_bucketing else ''}) {torch_peak} bytes: "
                         + ("within" if torch_peak <= cap else "ABOVE"))
    return lines


HEADLINE_COLUMNS = ["workload", "costs", "budget", "budget_gb", "torch_best", "torch_ms", "ours_ms", "gain_pct",
                    "bound_ms", "gap_pct", "most_pct", "torch_heldout_ms", "ours_heldout_ms", "heldout_gain_pct"]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=40.0, help="search seconds per searching row")
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS))
    ap.add_argument("--costs", nargs="+", default=["measured", "torch"], choices=["measured", "torch"])
    ap.add_argument("--out", type=Path, default=Path("experiments/results/cluster_costs"))
    ap.add_argument("--memory", nargs="+", metavar="WORKLOAD",
                    help="instead: apply these workloads' capped plans of the measured run and read torch's "
                         "memory estimate on the applied graphs (memory.md)")
    args = ap.parse_args(argv)
    if args.memory:
        lines = memory_check(args.out, args.memory)
        (args.out / "memory.md").write_text("\n".join([
            "# torch's memory estimate on the applied capped plans", "",
            f"Command: `python -m experiments.cluster_costs --out {args.out} --memory {' '.join(args.memory)}` "
            f"(revision {git_revision()}).", "", *[f"- {x}" for x in lines], ""]))
        print(*lines, sep="\n")
        return
    args.out.mkdir(parents=True, exist_ok=True)
    revision = git_revision()  # the code the run starts from (its modules are imported from it)
    logs = write_logs(args.out / "logs")
    heldout = write_heldout(args.out / "heldout.csv")
    rows_file = args.out / "rows.jsonl"
    rows = [json.loads(x) for x in rows_file.read_text().splitlines()] if rows_file.exists() else []
    done = {(r["workload"], r["costs"]) for r in rows if r["planner"] == "(equal memory)"}
    for costs in args.costs:
        for workload in args.workloads:
            if (workload, costs) in done:
                continue
            new = run_workload(workload, costs, logs, heldout if costs == "measured" else None, args.seconds, args.out)
            with rows_file.open("a") as f:
                f.writelines(json.dumps(r) + "\n" for r in new)
            rows += new
            print(*(r for r in new if r["planner"] == "(equal memory)"), sep="\n", flush=True)
    table = headline(rows)
    (args.out / "results.md").write_text("\n".join([
        "# Equal memory under the best-evidenced costs", "",
        f"Command: `python -m experiments.cluster_costs --seconds {args.seconds:g} --out {args.out}` "
        f"(revision {revision}; machine: {machine()}). Costs: `measured` (nccl-tests logs of published bus "
        f"bandwidths in `logs/`, compute at {COMPUTE_TFLOPS:g} TFLOP/s, contention {CONTENTION:g}; `heldout` "
        "columns: the same plans re-priced by `heldout.csv`) and `torch` (torch 2.13's NCCL model on the preset, "
        "800 TFLOP/s, no contention): the module docstring says where each figure comes from.", "",
        "Per workload and peak budget: the fastest of torch's rows within it (`torch_best`), our free-position "
        "plan within it (`ours_ms`), `gain_pct` = 1 - ours/torch, `bound_ms` the least step of any plan within the "
        "peak on the schedules searched (`gap_pct` from ours), `most_pct` = 1 - bound/torch: the most any such plan "
        "could gain under these costs.", "",
        *markdown_table(HEADLINE_COLUMNS, table), "",
        "Each workload's lines as compare prints them:", "",
        *[f"- {x}" for r in rows if r["planner"] == "(equal memory)" for x in r["lines"]], "",
        "What priced each group (measured costs):", "",
        *[f"- {r['workload']}: {x}" for r in rows if r["planner"] == "(equal memory)" for x in r["pricing"]], ""]))


if __name__ == "__main__":
    main()
