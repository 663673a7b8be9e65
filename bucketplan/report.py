"""Compare's rows, table and figures: ``PlanRow`` and ``WorkloadRow``, ``table_rows`` and
``markdown``, and ``plots`` (step times, counts and exposed time, the timeline), torch-free.

The application's report: ``bucketplan.compare`` fills the rows; the tables are written by
``planner.jobs.tables.write_table``, whose ``MEANING`` says what each column means.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from planner.cost.memory import memory_timeline, peak_bytes
from planner.core.problem import Plan, Problem, collectives_after
from planner.jobs.tables import MEANING, TableStyle, legend_lines, markdown_lines, pyplot, write_table

# ---------------------------------------------------------------- compare's table

# compare's search seconds per searching row (CP-SAT count, step, step pre-bucketed, free
# positions): four such rows per workload keep the default suite near two minutes on 2 cores;
# experiments/ give the searches minutes. Here, torch-free, so the command line
# states it in --help without importing torch.
COMPARE_TIME_LIMIT_S = 5.0


@dataclass
class PlanRow:
    planner: str
    problem: Problem
    plan: Plan | None
    plan_s: float
    status: str = ""
    bound: float | None = None
    gap: float | None = None
    note: str = ""
    bound_unit: str = "ms"  # "collectives": the bound of a fewest-collectives search
    # CP-SAT over the plan's candidate space (a free-positions row on a small problem): a line
    # naming its status, bound and gap (its scope is in the row's note); "" where none ran
    proof: str = ""

    @property
    def after(self) -> int | None:
        return None if self.plan is None else collectives_after(self.problem, self.plan)


@dataclass(frozen=True)
class MemoryBudget:
    """A peak one of our rows (``ours``, its planner label) was planned within, named by whose
    peak it is ("torch default's peak"): the comparison at equal memory (``equal_memory_lines``)."""

    name: str
    peak_bytes: int
    ours: str


@dataclass
class WorkloadRow:
    name: str
    nodes: int
    collectives_before: int
    plans: list[PlanRow] = field(default_factory=list)
    sims: dict = field(default_factory=dict)
    floor_ms: float | None = None
    preset: str = ""
    problem: Problem | None = None  # the unbucketed row's (its peak memory): torch's schedule
    problem_pre: Problem | None = None  # torch's pre-bucketed schedule, where the workload has one
    problem_graph: Problem | None = None  # the graph's own order (torch's scheduler not run), where searched
    # what priced it is not what the command asked for (a measurement file that prices nothing of
    # it, a group none prices): in its unbucketed row's note, and on stderr
    warnings: list[str] = field(default_factory=list)
    own_costs: bool = False  # a problem file: priced as extracted, whatever --preset says
    pricing: list[str] = field(default_factory=list)  # with measurements: what priced each group
    budgets: list[MemoryBudget] = field(default_factory=list)
    baselines: tuple[str, ...] = ()  # torch's rows, which our rows are set against at equal memory


COLUMNS = ["workload", "cluster", "graph_nodes", "collectives_before", "planner", "collectives_after", "step_ms",
           "floor_ms", "above_floor_ms", "above_floor_pct", "exposed_ms", "overhead_ms", "peak_gb", "plan_s",
           "status", "bound_ms", "bound_collectives", "gap_pct", "note"]
# what the command line prints; compare.md has every column
TERMINAL_COLUMNS = ["workload", "planner", "collectives_before", "collectives_after", "step_ms", "above_floor_pct",
                    "peak_gb", "status", "gap_pct"]
# One place for what shared column names mean (compare, sweep and solve-dir tables)
COMPARE_LEGEND = {c: MEANING[c] for c in COLUMNS}
# compare's files as they have always been: "|" kept in Markdown cells, CSV lines end in \r\n
_COMPARE_STYLE = TableStyle(pipe=None, csv_newline="\r\n")


def table_rows(rows: list[WorkloadRow]) -> list[dict]:
    out = []
    for r in rows:
        def line(planner_name, after, sim, p: PlanRow | None = None):
            above = None if sim is None or r.floor_ms is None else sim.step_ms - r.floor_ms
            # peak memory as torch's estimator counts it (planner.cost.memory), on the row's own problem
            problem, plan = (p.problem, p.plan) if p is not None else (r.problem, None)
            peak = None if problem is None or (p is not None and plan is None) else memory_timeline(problem, plan)
            bound = "" if p is None or p.bound is None else p.bound
            unit = "collectives" if p is not None and p.bound_unit == "collectives" else "ms"
            return {"workload": r.name, "preset": r.preset, "nodes": r.nodes, "cluster": r.preset,
                    "graph_nodes": r.nodes,
                    "collectives_before": r.collectives_before, "planner": planner_name, "collectives_after": after,
                    "step_ms": round(sim.step_ms, 3) if sim else None,
                    "floor_ms": None if r.floor_ms is None else round(r.floor_ms, 3),
                    "above_floor_ms": None if above is None else round(above, 3),
                    "above_floor_pct": None if above is None else round(100 * above / r.floor_ms, 2),
                    "exposed_ms": round(sim.exposed_ms, 3) if sim else None,
                    "overhead_ms": round(sim.overhead_ms, 3) if sim else None,
                    "peak_gb": None if peak is None else round(peak.peak_bytes / 1e9, 3),
                    "plan_s": None if p is None else round(p.plan_s, 2), "status": "" if p is None else p.status,
                    "bound": bound, "bound_ms": bound if unit == "ms" else "",
                    "bound_collectives": round(bound) if unit == "collectives" and bound != "" else "",
                    "gap_pct": None if p is None or p.gap is None else round(100 * p.gap, 2),
                    "note": "; ".join(f"warning: {w}" for w in r.warnings) if p is None else p.note,
                    "warnings": list(r.warnings) if p is None else [], "own_costs": r.own_costs}

        base = r.sims["unbucketed"]
        out.append(line("unbucketed", r.collectives_before, base))
        out[-1]["equal_memory"] = equal_memory_lines(r)
        out[-1]["pricing"] = list(r.pricing)
        for p in r.plans:
            sim = r.sims.get(p.planner)
            row = line(p.planner, p.after, sim, p)
            if sim is not None and sim.step_ms > base.step_ms + 1e-9:
                row["note"] = "; ".join(x for x in (row["note"], "slower than unbucketed") if x)
            out.append(row)
    return out


def equal_memory_lines(r: WorkloadRow) -> list[str]:
    """One line per memory budget of the workload: our row planned within it, its bound and gap,
    and the fastest of torch's rows whose peak (``planner.cost.memory``, as torch's estimator counts
    it) is within it, with how much faster ours is; torch's rows above it are named."""
    peaks = {"unbucketed": peak_bytes(r.problem)} if r.problem is not None else {}
    peaks.update({p.planner: peak_bytes(p.problem, p.plan) for p in r.plans if p.plan is not None})
    out = []
    for b in r.budgets:
        head = f"{r.name}, within {b.name} ({b.peak_bytes / 1e9:.3f} GB):"
        ours = next((p for p in r.plans if p.planner == b.ours), None)
        if ours is None or ours.plan is None or ours.planner not in r.sims:
            out.append(f"{head} no plan of ours" + (f" ({ours.note})" if ours is not None and ours.note else ""))
            continue
        step = r.sims[ours.planner].step_ms
        text = f"{head} {ours.planner} {step:.3f} ms"
        if ours.bound is not None and ours.gap is not None:
            text += f" (no plan on its schedules within it is under {ours.bound:.3f} ms: gap {100 * ours.gap:.2f}%)"
        if ours.proof:
            text += f" ({ours.proof})"
        torch_rows = [label for label in r.baselines if label in r.sims and label in peaks]
        fits = [label for label in torch_rows if peaks[label] <= b.peak_bytes]
        if fits:
            best = min(fits, key=lambda label: r.sims[label].step_ms)
            t = r.sims[best].step_ms
            gain = 100 * (t - step) / t
            text += (f"; fastest torch row within it: {best}, {t:.3f} ms; ours "
                     + (f"{gain:.1f}% faster" if gain >= 0 else f"{-gain:.1f}% slower"))
        else:
            text += "; no torch row fits it"
        above = [label for label in torch_rows if label not in fits]
        if above:
            text += "; above it: " + ", ".join(f"{label} (+{excess_text(peaks[label] - b.peak_bytes)})" for label in above)
        out.append(text)
    return out


def excess_text(nbytes: int) -> str:
    """A peak's excess over a budget, in MB, or in bytes where that would read as 0.0 MB."""
    return f"{nbytes / 1e6:.1f} MB" if nbytes >= 50_000 else f"{nbytes} bytes"


def equal_memory_section(table: list[dict]) -> list[str]:
    """compare.md's sections after the table: every workload's ``equal_memory`` lines, and, where
    measurements priced it, what priced each group (``pricing``); a section with no lines is left out."""
    lines = [f"- {x}" for r in table for x in r.get("equal_memory", ())]
    priced = [f"- {r['workload']}: {x}" for r in table for x in r.get("pricing", ())]
    out = []
    if lines:
        out += ["", "## At equal memory", "",
                "Each of our rows searched within a peak torch's own rows reach; the bound is the least step of any "
                "plan, any positions, within that peak on the schedules it searched (under this cluster's cost "
                "model).", "", *lines]
    if priced:
        out += ["", "## What priced each group", "",
                "Per process group and kind: the measurement that priced it, or the preset's model.", "", *priced]
    return out


def simulated_on(rows: list[dict]) -> str:
    """The line that says what priced the table: the traced workloads' cluster, and each problem
    file's own (as extracted: the cluster flags do not apply to it)."""
    traced = sorted({str(r.get("cluster")) for r in rows if not r.get("own_costs")})
    own = sorted({str(r.get("cluster") or "its own costs") for r in rows if r.get("own_costs")})
    parts = ([f"{', '.join(traced)} (cluster nodes; --preset picks another)"] if traced else []) + (
        [f"{', '.join(own)} (each problem file's own cluster, as it was extracted)"] if own else [])
    return f"Simulated on {'; '.join(parts)}."


def markdown(rows: list[dict], columns: Iterable[str] = TERMINAL_COLUMNS) -> str:
    """Compare's table in Markdown with its legend: the command line prints these ``columns``;
    ``compare.md`` holds all of them (``write_compare_table``)."""
    columns = list(columns)
    return "\n".join(markdown_lines(columns, rows, TableStyle(pipe=None))
                     + legend_lines(COMPARE_LEGEND, columns)) + "\n"


def write_compare_table(out_dir: Path, table: list[dict]) -> list[Path]:
    """``compare.csv``, ``compare.md`` and ``compare.json`` of ``table_rows``' rows."""
    return write_table(out_dir, "compare", COLUMNS, table, formats=("csv", "md", "json"), legend=COMPARE_LEGEND,
                       title="bucketplan compare: every planner on the same graphs", style=_COMPARE_STYLE,
                       after_table=equal_memory_section(table))


# ---------------------------------------------------------------- plots
def plots(rows: list[WorkloadRow], out: Path) -> list[Path]:
    """Compare's figures: ``step_time.png``, ``timeline.png`` and ``collectives_and_exposed.png``."""
    return [_step_times(rows, out), _timeline(rows, out), _counts_and_exposed(rows, out)]


def _step_times(rows: list[WorkloadRow], out: Path) -> Path:
    """The headline measure: each planner's simulated step per workload, a bar each, with the
    floor no plan beats as a dashed line (a panel per workload: their steps differ tenfold)."""
    plt = pyplot()
    fig, axes = plt.subplots(len(rows), 1, figsize=(10, 0.45 * sum(len(r.sims) for r in rows) + 1.2 * len(rows)),
                             squeeze=False)
    for ax, r in zip(axes[:, 0], rows):
        labels = ["unbucketed"] + [p.planner for p in r.plans if p.planner in r.sims]
        steps = [r.sims[label].step_ms for label in labels]
        best = min(steps)
        colors = ["tab:green" if s_ <= best + 1e-9 else "tab:gray" if k == 0 else "tab:blue"
                  for k, s_ in enumerate(steps)]
        ax.barh(range(len(labels)), steps, color=colors, height=0.65)
        for k, s_ in enumerate(steps):
            ax.text(s_, k, f" {s_:.1f} ms", va="center", fontsize=8)
        if r.floor_ms is not None:
            ax.axvline(r.floor_ms, color="black", linestyle="--", linewidth=1)
            ax.text(r.floor_ms, len(labels) - 0.4, f" floor {r.floor_ms:.1f} ms", fontsize=8, va="bottom")
        ax.set_yticks(range(len(labels)), labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlim(0, max(steps) * 1.18)
        ax.set_title(f"{r.name} on {r.preset or 'its cluster'}: simulated step (shorter is better; green: fastest)",
                     fontsize=9)
    axes[-1, 0].set_xlabel("simulated step time (ms)")
    fig.tight_layout()
    p = out / "step_time.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p


def _counts_and_exposed(rows: list[WorkloadRow], out: Path) -> Path:
    """Collectives after bucketing and simulated exposed communication, a bar per planner."""
    plt = pyplot()
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
    return p


# the rows the timeline shows, when the run has them
TIMELINE_PLANNERS = ("unbucketed", "torch default (pre-bucketing + greedy)", "torch greedy",
                     "torch manual (a bucket per block)", "cpsat (step)", "bucketplan (step, free positions)")


def layer_spans(problem: Problem) -> dict[str, tuple[int, int]]:
    """Schedule positions spanning one transformer block's forward and one's backward, from the
    collectives that move its parameters (``Collective.module`` / ``phase``), so every plan of
    the problem is shown over the same stretch of graph. Forward: from the middle block's first
    gathered use to the next block's; backward: from the block before it (in backward order)
    issuing its gradients to the middle block issuing its own. A phase without two blocks has no
    span (DDP moves nothing in forward)."""
    import re

    spans = {}
    for phase, pos in (("forward", lambda c: c.wait_pos), ("backward", lambda c: c.start_pos)):
        first: dict[str, int] = {}
        mine = [c for c in problem.collectives if c.phase == phase and c.module is not None]
        if phase == "backward":  # gradients mark a block's backward; a re-gather is prefetched anywhere
            mine = [c for c in mine if c.kind != "all_gather"] or mine
        for c in mine:
            first[c.module] = min(first.get(c.module, pos(c)), pos(c))
        blocks = {m: p for m, p in first.items() if re.search(r"\.\d+$", m)} or first
        order = sorted(blocks.values())
        if len(order) >= 2:
            k = max(1, len(order) // 2)
            spans[phase] = (order[k - 1], order[k])
    return spans


def _time_at(sim, problem: Problem) -> Callable[[int], float]:
    """The simulated time at which the graph reaches schedule position ``pos``: the begin of the
    first compute run at or after it (the step's end past the last)."""
    at = {n.name: n.pos for n in problem.nodes}
    runs = sorted((at[c.name], c.begin_ms) for c in sim.compute if c.name in at)

    def time_at(pos: int) -> float:
        return next((t for p, t in runs if p >= pos), sim.step_ms)
    return time_at


def _group_names(problem: Problem) -> dict[str, str]:
    """Process group -> its role ("dp", "tp") for the timeline's rows; "pg N" where none is known."""
    roles = {pg: role for role, pg in (problem.meta.get("groups") or {}).items() if pg is not None}
    return {link.pg: roles.get(link.pg) or (link.hardware.split(":")[0] if ":" in link.hardware else f"pg {link.pg}")
            for link in problem.links}


def _timeline_panel(ax, sim, problem: Problem, lo: float, hi: float) -> float:
    """One plan over [lo, hi] ms: compute (blue), merge copies and launches (gray), time the
    compute stream sits blocked on a wait (red), and a row per process group (orange bars, one
    per bucket in flight). Returns the blocked ms shown."""
    names = _group_names(problem)
    pgs = sorted(names, key=lambda g: names[g])
    for c in sim.compute:
        if c.end_ms >= lo and c.begin_ms <= hi:
            ax.barh(0, c.end_ms - c.begin_ms, left=c.begin_ms, height=0.6, linewidth=0,
                    color="tab:blue" if c.kind == "compute" else "tab:gray")
    blocked = 0.0
    for b in sim.buckets:
        if b.blocked_ms > 0 and b.wait_ms + b.blocked_ms >= lo and b.wait_ms <= hi:
            ax.barh(0, b.blocked_ms, left=b.wait_ms, color="tab:red", height=0.8)
            blocked += min(hi, b.wait_ms + b.blocked_ms) - max(lo, b.wait_ms)
        if b.end_ms >= lo and b.begin_ms <= hi and b.pg in names:
            ax.barh(1 + pgs.index(b.pg), b.end_ms - b.begin_ms, left=b.begin_ms, color="tab:orange", height=0.6,
                    edgecolor="black", linewidth=0.4)
    ax.set_yticks(range(1 + len(pgs)), ["compute"] + [f"{names[g]} stream" for g in pgs], fontsize=8)
    ax.set_ylim(len(pgs) + 0.6, -0.6)
    ax.set_xlim(lo, hi)
    return blocked


def _timeline(rows: list[WorkloadRow], out: Path) -> Path:
    """The largest workload, one plan a row: one transformer block's forward (left) and backward
    (right) span (``layer_spans``), or the whole step where the graph names no blocks."""
    plt = pyplot()
    r = max(rows, key=lambda row: row.nodes)
    problems = {"unbucketed": r.problem, **{p.planner: p.problem for p in r.plans}}
    shown = [label for label in TIMELINE_PLANNERS if label in r.sims and problems.get(label) is not None]
    phases = sorted(layer_spans(problems[shown[0]]), key=("forward", "backward").index) or ["step"]
    fig, axes = plt.subplots(len(shown), len(phases), figsize=(7 * len(phases), 1.5 + 1.35 * len(shown)),
                             squeeze=False)
    for i, label in enumerate(shown):
        sim, problem = r.sims[label], problems[label]
        spans, time_at = layer_spans(problem), _time_at(sim, problem)
        for j, phase in enumerate(phases):
            ax = axes[i, j]
            if phase in spans:
                lo, hi = time_at(spans[phase][0]), time_at(spans[phase][1])
                what = f"a block's {phase}"
            else:
                lo, hi, what = 0.0, sim.step_ms, "whole step"
            if hi <= lo:
                hi = lo + 1e-3
            blocked = _timeline_panel(ax, sim, problem, lo, hi)
            ax.set_title(f"{label} (step {sim.step_ms:.1f} ms): {what}, {hi - lo:.2f} ms, {blocked:.2f} blocked",
                         fontsize=8)
    for j in range(len(phases)):
        axes[-1, j].set_xlabel("simulated time in the step (ms)")
    fig.suptitle(f"{r.name} on {r.preset or 'its cluster'}: blue compute, gray merge copies and launches, "
                 "red compute blocked on a wait, orange collectives in flight", fontsize=10)
    fig.tight_layout()
    p = out / "timeline.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p
