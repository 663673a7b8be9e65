"""Greedy vs optimal on the same graphs: counts, simulated step time, exposed communication.

Why this exists: users come to learn how far torch's greedy bucketing is from optimal on their
models and what the difference is worth. For each workload this runs, on the same traced
graph: torch's default pipeline (FSDP pre-bucketing + greedy), torch's greedy alone, and
torch's manual bucketing of one bucket per transformer block (``fxglue.manual``), and
CP-SAT (fewest collectives; and the simulated step itself, started from that plan), verifies
every plan, simulates each one
(``planner.simulate``), and writes one table (CSV and Markdown), plots and Chrome traces.
Every row is set against the step floor (``planner.bounds.step_floor``): the step no plan can
beat on that cluster, so "ms above the floor" is what a planner leaves on the table.
"""

from __future__ import annotations

import csv
import io
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import planner
from planner.io import atomic_write_text, replace_dir_atomically
from planner.bounds import step_floor
from planner.repair import repair
from planner.simulator import simulate, write_chrome_trace
from planner.progress import LiveLine
from planner.solver import solve
from planner.verifier import check

DEFAULT_SUITE = ("llama3-8b-fsdp-2", "llama3-8b-2d-2", "llama3-8b-ddp-2", "llama3-8b-fsdp-8")
# (label, objective): the step search starts from the count plan, which it never loses to
CPSAT_VARIANTS = (("cpsat (count)", "count"), ("cpsat (step)", "step"))
MANUAL_LABEL = "torch manual (a bucket per block)"
# everything run_compare writes into its folder: the folder is replaced as a whole, so one
# holding anything else (`-o .`, `-o ~`) is refused rather than wiped
OUTPUTS = ("compare.csv", "compare.md", "compare.json", "collectives_and_exposed.png", "timeline.png", "traces")


@dataclass
class PlanRow:
    planner: str
    problem: planner.Problem
    plan: planner.Plan | None
    plan_s: float
    status: str = ""
    bound: float | None = None
    gap: float | None = None
    note: str = ""

    @property
    def after(self) -> int | None:
        return None if self.plan is None else planner.collectives_after(self.problem, self.plan)


@dataclass
class WorkloadRow:
    name: str
    nodes: int
    collectives_before: int
    plans: list[PlanRow] = field(default_factory=list)
    sims: dict = field(default_factory=dict)
    floor_ms: float | None = None
    preset: str = ""


def _problems_for(name, say, preset=None):
    """(problem without pre-bucketing, torch's greedy on it, problem with pre-bucketing, greedy on it)."""
    from fxglue.pipeline import prepare

    out = []
    for pre in (False, True):
        say(f"{getattr(name, 'name', name)}: trace and schedule (pre-bucketing {'on' if pre else 'off'})")
        p = prepare(name, preset=preset, pre_bucketing=pre)
        out.append((p.problem, p.greedy, p.timings["greedy_s"], p.traced.gm))
    return out


def _greedy_row(label: str, problem, plan, seconds: float) -> PlanRow:
    row = PlanRow(label, problem, plan, seconds)
    report = check(problem, plan)
    if not report.feasible:
        fixed = repair(problem, plan, time_limit_s=20)
        row.note = (f"breaks rule(s) {sorted(report.by_rule())} as recorded; simulated as its repair "
                    f"({fixed.objective} collectives)")
        row.plan = fixed.plan
    return row


def compare_workload(workload, *, time_limit_s: float, out: Path, say, preset=None, traces: bool = True,
                     manual: bool = True) -> WorkloadRow:
    """Every row for one workload (a built-in name or a ``Workload``, e.g. a user's model)."""
    name = workload if isinstance(workload, str) else workload.name
    (prob, greedy, greedy_s, gm), (prob_pre, greedy_pre, greedy_pre_s, _) = _problems_for(workload, say, preset)
    row = WorkloadRow(name, prob.n_scheduled, len(prob.collectives), preset=prob.meta.get("preset") or "")
    # the floor of each problem holds for every plan on it; their minimum holds for every row
    row.floor_ms = min(step_floor(prob).floor_ms, step_floor(prob_pre).floor_ms)
    row.plans.append(_greedy_row("torch default (pre-bucketing + greedy)", prob_pre, greedy_pre, greedy_pre_s))
    row.plans.append(_greedy_row("torch greedy", prob, greedy, greedy_s))
    # torch's manual pass needs the module's block names: built-in workloads only
    manual_row = _manual_row(name, preset, say) if manual and isinstance(workload, str) else None
    if manual_row is not None:
        row.plans.append(manual_row)
        row.floor_ms = min(row.floor_ms, step_floor(manual_row.problem).floor_ms)
    _cpsat_rows(row, prob, row.plans[1].plan, time_limit_s, say)
    row.plans.append(pre_step_row(name, prob_pre, row.plans[0].plan, time_limit_s, say))
    for p in row.plans:
        if p.plan is None:
            continue
        sim = simulate(p.problem, p.plan)
        row.sims[p.planner] = sim
        if traces:
            write_chrome_trace(sim, p.problem, out / "traces" / f"{_slug(name)}--{_slug(p.planner)}.json")
    row.sims["unbucketed"] = simulate(prob, None)
    if traces:
        write_chrome_trace(row.sims["unbucketed"], prob, out / "traces" / f"{_slug(name)}--unbucketed.json")
    return row


def _cpsat_rows(row: WorkloadRow, prob, hint, time_limit_s: float, say) -> None:
    """CP-SAT's rows: fewest collectives, then the step objective started from that plan."""
    floor_plans: tuple = ()
    for label, objective in CPSAT_VARIANTS:
        say(f"{row.name}: {label}")
        with LiveLine(lambda msg: say(f"{row.name}: {label}: {msg}")) as live:  # never silent for long
            res = solve(prob, time_limit_s=time_limit_s, objective=objective, hint=hint, workers=2,
                        floor_plans=floor_plans, progress=live)
        note = "stopped by the wall clock" if res.stats.get("wall_limit_hit") else ""
        row.plans.append(PlanRow(label, prob, res.plan, res.wall_s, res.status, res.bound, res.gap, note))
        if res.plan is not None:
            floor_plans = (res.plan,)


PRE_STEP_LABEL = "cpsat (step, pre-bucketed)"


def pre_step_row(name: str, prob_pre, default_plan, time_limit_s: float, say) -> PlanRow:
    """The step objective on torch's pre-bucketed schedule, started from torch's default
    pipeline (its greedy plan there, repaired if it breaks a rule), which it never loses to.
    On 64 nodes pre-bucketing before scheduling gave torch's default pipeline a better schedule
    than any plan on the unbucketed one (llama3-8b-2d-8: 98.6 ms against 165.6)."""
    say(f"{name}: {PRE_STEP_LABEL}")
    res = solve(prob_pre, time_limit_s=time_limit_s, objective="step", hint=default_plan, workers=2,
                floor_plans=(default_plan,) if default_plan is not None else (),
                progress=lambda msg: say(f"{name}: {PRE_STEP_LABEL}: {msg}"))
    note = "on torch's pre-bucketed schedule" + ("; stopped by the wall clock" if res.stats.get("wall_limit_hit")
                                                  else "")
    return PlanRow(PRE_STEP_LABEL, prob_pre, res.plan, res.wall_s, res.status, res.bound, res.gap, note)


def _manual_row(name: str, preset, say) -> PlanRow | None:
    """Torch's manual per-block bucketing on a fresh trace (the pass replaces the scheduler),
    simulated as it leaves the graph; None for a workload whose blocks it cannot name."""
    from fxglue.manual import manual_bucketing_problem
    from fxglue.pipeline import estimator_for, resolve_preset
    from fxglue.models.workloads import trace

    say(f"{name}: torch's manual per-block bucketing")
    p = resolve_preset(preset)
    traced = trace(name, world_size=p.world_size, tp=p.tp) if p else trace(name)
    t0 = time.perf_counter()
    problem, info = manual_bucketing_problem(traced, estimator_for(traced, preset=p),
                                             meta={**traced.meta, "preset": p.name if p else None})
    plan = planner.Plan(problem_fingerprint=problem.fingerprint, planner="torch-manual", created="",
                        buckets=())  # torch merged its buckets in the graph: the problem is the plan
    return PlanRow(MANUAL_LABEL, problem, plan, time.perf_counter() - t0,
                   note="all_reduce never bucketed by this pass" if any(
                       c.kind == "all_reduce" for c in problem.collectives) else "")


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def compare_problem_file(path: Path, *, time_limit_s: float, out: Path, say) -> WorkloadRow:
    """A problem file: torch's greedy from the sibling greedy-plan.json when there is one, CP-SAT."""
    prob = planner.load_problem(path)
    name = str(path)
    row = WorkloadRow(name, prob.n_scheduled, len(prob.collectives), preset=prob.meta.get("preset") or "",
                      floor_ms=step_floor(prob).floor_ms)
    greedy_path = path.parent / "greedy-plan.json"
    hint = None
    if greedy_path.exists():
        g = planner.load_plan(greedy_path)
        row.plans.append(_greedy_row("torch greedy", prob, g, float(g.params.get("wall_s", 0.0))))
        hint = row.plans[-1].plan
    _cpsat_rows(row, prob, hint, time_limit_s, say)
    for p in row.plans:
        if p.plan is not None:
            row.sims[p.planner] = simulate(prob, p.plan)
            write_chrome_trace(row.sims[p.planner], prob, out / "traces" / f"{_slug(name)}--{_slug(p.planner)}.json")
    row.sims["unbucketed"] = simulate(prob, None)
    return row


COLUMNS = ["workload", "preset", "nodes", "collectives_before", "planner", "collectives_after", "step_ms",
           "floor_ms", "above_floor_ms", "above_floor_pct", "exposed_ms", "overhead_ms", "plan_s", "status",
           "bound", "gap_pct", "note"]


def _bound_text(p: PlanRow):
    if p.bound is None:
        return ""
    if "exposure" in p.planner:  # decode exposure x (n+1) + count to exposed ms
        return f"{int(p.bound) // (len(p.problem.collectives) + 1) / 1000:.3f} ms exposed"
    return p.bound


def table_rows(rows: list[WorkloadRow]) -> list[dict]:
    out = []
    for r in rows:
        def line(planner_name, after, sim, p: PlanRow | None = None):
            above = None if sim is None or r.floor_ms is None else sim.step_ms - r.floor_ms
            return {"workload": r.name, "preset": r.preset, "nodes": r.nodes,
                    "collectives_before": r.collectives_before, "planner": planner_name, "collectives_after": after,
                    "step_ms": round(sim.step_ms, 3) if sim else None,
                    "floor_ms": None if r.floor_ms is None else round(r.floor_ms, 3),
                    "above_floor_ms": None if above is None else round(above, 3),
                    "above_floor_pct": None if above is None else round(100 * above / r.floor_ms, 2),
                    "exposed_ms": round(sim.exposed_ms, 3) if sim else None,
                    "overhead_ms": round(sim.overhead_ms, 3) if sim else None,
                    "plan_s": None if p is None else round(p.plan_s, 2), "status": "" if p is None else p.status,
                    "bound": "" if p is None else _bound_text(p),
                    "gap_pct": None if p is None or p.gap is None else round(100 * p.gap, 2),
                    "note": "" if p is None else p.note}

        base = r.sims["unbucketed"]
        out.append(line("unbucketed", r.collectives_before, base))
        for p in r.plans:
            sim = r.sims.get(p.planner)
            row = line(p.planner, p.after, sim, p)
            if sim is not None and sim.step_ms > base.step_ms + 1e-9:
                row["note"] = "; ".join(x for x in (row["note"], "slower than unbucketed") if x)
            out.append(row)
    return out


def markdown(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        lines.append("| " + " | ".join("" if r[c] is None else str(r[c]) for c in COLUMNS) + " |")
    return "\n".join(lines) + "\n"


def _timeline_window(sim, buckets_shown: int = 6) -> tuple[float, float]:
    """A window that shows several whole collectives: the shortest run of ``buckets_shown``
    consecutive buckets of one stream in the middle half of the step, with a margin (a fixed
    slice of the step can fall inside one long collective and show only solid bars)."""
    step = sim.step_ms
    spans = sorted((b.begin_ms, b.end_ms) for b in sim.buckets)
    middle = [x for x in spans if 0.25 * step <= x[0] <= 0.75 * step] or spans
    if len(middle) <= buckets_shown:
        lo, hi = (middle[0][0], max(e for _, e in middle)) if middle else (0.0, step)
    else:
        lo, hi = min(((middle[i][0], max(e for _, e in middle[i:i + buckets_shown]))
                      for i in range(len(middle) - buckets_shown + 1)), key=lambda w: w[1] - w[0])
    pad = 0.05 * max(hi - lo, 1e-6)
    return max(0.0, lo - pad), min(step, hi + pad)


def _plots(rows: list[WorkloadRow], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    labels = list(dict.fromkeys(p.planner for r in rows for p in r.plans))
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    width = 0.8 / len(labels)
    for k, label in enumerate(labels):
        xs = [i + k * width for i in range(len(rows))]
        counts = [next((p.after or 0 for p in r.plans if p.planner == label), 0) for r in rows]
        exposed = [r.sims[label].exposed_ms if label in r.sims else 0 for r in rows]
        axes[0].bar(xs, counts, width, label=label)
        axes[1].bar(xs, exposed, width, label=label)
    # the unbucketed schedule as a baseline line across each workload's group of bars
    for i, r in enumerate(rows):
        base = r.sims.get("unbucketed")
        for ax, y in ((axes[0], r.collectives_before), (axes[1], base.exposed_ms if base else None)):
            if y is not None:
                ax.hlines(y, i - width / 2, i + 0.8 - width / 2, colors="black", linestyles="dashed", linewidth=1,
                          label="unbucketed" if i == 0 else None)
    for ax, title, ylabel in zip(axes, ("collectives after bucketing", "simulated exposed communication"),
                                 ("collectives in the step", "exposed communication (ms)")):
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(rows))], [r.name for r in rows], rotation=20,
                      ha="right", fontsize=8)
        ax.set_title(title)
        ax.set_ylabel(ylabel)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    p = out / "collectives_and_exposed.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(p)

    # a timeline window of the largest workload (about one layer in the middle of the step)
    r = max(rows, key=lambda row: row.nodes)
    shown = [lbl for lbl in ("torch greedy", "cpsat (count)", "cpsat (step)") if lbl in r.sims]
    fig, axes = plt.subplots(len(shown), 1, figsize=(13, 2.2 * len(shown)), sharex=True)
    axes = axes if len(shown) > 1 else [axes]
    lo, hi = _timeline_window(r.sims[shown[-1]])
    for ax, label in zip(axes, shown):
        sim = r.sims[label]
        pgs = sorted({b.pg for b in sim.buckets})
        for c in sim.compute:
            if c.end_ms >= lo and c.begin_ms <= hi:  # edges: adjacent kernels stay apart
                ax.barh(0, c.end_ms - c.begin_ms, left=c.begin_ms, color="tab:blue", height=0.6,
                        edgecolor="white", linewidth=0.4)
        for b in sim.buckets:
            if b.blocked_ms > 0 and b.wait_ms + b.blocked_ms >= lo and b.wait_ms <= hi:
                ax.barh(0, b.blocked_ms, left=b.wait_ms, color="tab:red", height=0.6)
            if b.end_ms >= lo and b.begin_ms <= hi:
                y = 1 + pgs.index(b.pg)
                ax.barh(y, b.end_ms - b.begin_ms, left=b.begin_ms, color="tab:orange", height=0.6,
                        edgecolor="black", linewidth=0.3)
        ax.set_yticks(range(1 + len(pgs)), ["compute"] + [f"pg {g}" for g in pgs])
        ax.set_xlim(lo, hi)
        ax.set_title(f"{r.name}: {label} (blue compute, red blocked, orange collectives)", fontsize=9)
    axes[-1].set_xlabel("ms")
    fig.tight_layout()
    p = out / "timeline.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(p)
    return paths


def run_compare(workloads, *, out: Path, time_limit_s: float = 30.0, progress=None, preset=None) -> list[dict]:
    """Every row for every target; writes the table, plots and traces into ``out``.

    ``out`` is replaced as a whole, and only when the run completes: everything is written into a
    fresh folder beside it first (``planner.io.replace_dir_atomically``). A run that fails or is
    interrupted leaves ``out`` as it was, so it never holds one run's table beside another's
    traces, nor traces of workloads the last run did not have."""
    say = progress or (lambda msg: None)
    with replace_dir_atomically(out, owned=OUTPUTS) as tmp:
        rows = []
        for target in workloads:
            if not isinstance(target, str):
                rows.append(compare_workload(target, time_limit_s=time_limit_s, out=tmp, say=say, preset=preset))
            elif str(target).endswith(".json"):
                rows.append(compare_problem_file(Path(target), time_limit_s=time_limit_s, out=tmp, say=say))
            else:
                rows.append(compare_workload(target, time_limit_s=time_limit_s, out=tmp, say=say, preset=preset))
        table = table_rows(rows)
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(table)
        atomic_write_text(tmp / "compare.csv", buf.getvalue())
        atomic_write_text(tmp / "compare.md", markdown(table))
        atomic_write_text(tmp / "compare.json", json.dumps(table, indent=1))
        _plots(rows, tmp)
    return table
