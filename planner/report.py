"""Tables and plots of results, torch-free: one table writer and every figure in one place.

Why this exists: ``bucketplan compare``, sweeps and plan directories each wrote their CSV and
Markdown their own way, and the compare table and plots sat in the torch room though they only
read numbers. Here: ``write_table`` (CSV, Markdown, JSON; written atomically), compare's rows
(``PlanRow``, ``WorkloadRow``) and table (``table_rows``, ``markdown``), and the plots
(``plots`` for compare, ``sweep_plot`` for a sweep). ``fxglue.compare``, ``planner.sweep`` and
``planner.plan_dir`` import it; it imports none of them. matplotlib is imported inside the
plotting functions only, so writing a table needs nothing beyond the standard library.
"""

from __future__ import annotations

import csv
import io
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from planner.io import atomic_write_text
from planner.memory import memory_timeline
from planner.problem import Plan, Problem, collectives_after

# ---------------------------------------------------------------- tables


def cell_text(value) -> str:
    """A table cell: empty for None, ``str`` otherwise."""
    return "" if value is None else str(value)


def markdown_lines(columns: Iterable[str], rows: list[dict], *, cell: Callable[[object], str] = cell_text,
                   pipe: str | None = "/", first_width: int | None = None) -> list[str]:
    """Header, rule and one line per row; a missing cell is ``cell("")``.

    ``pipe``: what a "|" inside a cell becomes (None: left as is, and the row breaks).
    ``first_width``: the first cell cut to that many characters and "…" (fingerprints)."""
    columns = list(columns)
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        cells = [cell(r.get(k, "")) for k in columns]
        if first_width is not None and cells:
            cells[0] = cells[0][:first_width] + "…"
        if pipe is not None:
            cells = [c.replace("|", pipe) for c in cells]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def write_table(out_dir: Path, stem: str, columns: Iterable[str], rows: list[dict], *, title: str | None = None,
                formats: Iterable[str] = ("csv", "md"), cell: Callable[[object], str] = cell_text,
                pipe: str | None = "/", first_width: int | None = None, csv_newline: str = "\n") -> list[Path]:
    """``rows`` as ``out_dir/stem.csv``, ``.md`` (under ``# title`` when given) and ``.json``, as
    ``formats`` asks, each written atomically; returns the paths. Keys outside ``columns`` are
    left out; a missing key is an empty cell (None in JSON). ``pipe`` and ``first_width`` shape
    the Markdown only (``markdown_lines``); ``csv_newline`` ends each CSV line."""
    columns, out_dir = list(columns), Path(out_dir)
    paths = []
    for fmt in formats:
        if fmt == "csv":
            buf = io.StringIO()
            w = csv.DictWriter(buf, fieldnames=columns, lineterminator=csv_newline)
            w.writeheader()
            w.writerows({k: cell(r.get(k)) for k in columns} for r in rows)
            text = buf.getvalue()
        elif fmt == "md":
            head = [f"# {title}", ""] if title is not None else []
            text = "\n".join(head + markdown_lines(columns, rows, cell=cell, pipe=pipe, first_width=first_width))
            text += "\n"
        elif fmt == "json":
            text = json.dumps([{k: r.get(k) for k in columns} for r in rows], indent=1)
        else:
            raise ValueError(f"write_table: unknown format {fmt!r} (csv, md, json)")
        paths.append(out_dir / f"{stem}.{fmt}")
        atomic_write_text(paths[-1], text)
    return paths


# ---------------------------------------------------------------- compare's table


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

    @property
    def after(self) -> int | None:
        return None if self.plan is None else collectives_after(self.problem, self.plan)


@dataclass
class WorkloadRow:
    name: str
    nodes: int
    collectives_before: int
    plans: list[PlanRow] = field(default_factory=list)
    sims: dict = field(default_factory=dict)
    floor_ms: float | None = None
    preset: str = ""
    problem: Problem | None = None  # the unbucketed row's (its peak memory)


COLUMNS = ["workload", "preset", "nodes", "collectives_before", "planner", "collectives_after", "step_ms",
           "floor_ms", "above_floor_ms", "above_floor_pct", "exposed_ms", "overhead_ms", "peak_gb", "plan_s",
           "status", "bound", "gap_pct", "note"]
# compare's files as they have always been: "|" kept in Markdown cells, CSV lines end in \r\n
_COMPARE_STYLE = {"pipe": None, "csv_newline": "\r\n"}


def table_rows(rows: list[WorkloadRow]) -> list[dict]:
    out = []
    for r in rows:
        def line(planner_name, after, sim, p: PlanRow | None = None):
            above = None if sim is None or r.floor_ms is None else sim.step_ms - r.floor_ms
            # peak memory as torch's estimator counts it (planner.memory), on the row's own problem
            problem, plan = (p.problem, p.plan) if p is not None else (r.problem, None)
            peak = None if problem is None or (p is not None and plan is None) else memory_timeline(problem, plan)
            return {"workload": r.name, "preset": r.preset, "nodes": r.nodes,
                    "collectives_before": r.collectives_before, "planner": planner_name, "collectives_after": after,
                    "step_ms": round(sim.step_ms, 3) if sim else None,
                    "floor_ms": None if r.floor_ms is None else round(r.floor_ms, 3),
                    "above_floor_ms": None if above is None else round(above, 3),
                    "above_floor_pct": None if above is None else round(100 * above / r.floor_ms, 2),
                    "exposed_ms": round(sim.exposed_ms, 3) if sim else None,
                    "overhead_ms": round(sim.overhead_ms, 3) if sim else None,
                    "peak_gb": None if peak is None else round(peak.peak_bytes / 1e9, 3),
                    "plan_s": None if p is None else round(p.plan_s, 2), "status": "" if p is None else p.status,
                    "bound": "" if p is None or p.bound is None else p.bound,
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
    """Compare's table in Markdown, as ``compare.md`` holds it (the command line prints it)."""
    return "\n".join(markdown_lines(COLUMNS, rows, pipe=_COMPARE_STYLE["pipe"])) + "\n"


def write_compare_table(out_dir: Path, table: list[dict]) -> list[Path]:
    """``compare.csv``, ``compare.md`` and ``compare.json`` of ``table_rows``' rows."""
    return write_table(out_dir, "compare", COLUMNS, table, formats=("csv", "md", "json"), **_COMPARE_STYLE)


# ---------------------------------------------------------------- plots


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def timeline_window(sim, buckets_shown: int = 6) -> tuple[float, float]:
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


def plots(rows: list[WorkloadRow], out: Path) -> list[Path]:
    """Compare's figures: ``collectives_and_exposed.png`` and ``timeline.png``."""
    return [_counts_and_exposed(rows, out), _timeline(rows, out)]


def _counts_and_exposed(rows: list[WorkloadRow], out: Path) -> Path:
    """Collectives after bucketing and simulated exposed communication, a bar per planner."""
    plt = _pyplot()
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


def _timeline(rows: list[WorkloadRow], out: Path) -> Path:
    """A timeline window of the largest workload (about one layer in the middle of the step)."""
    plt = _pyplot()
    r = max(rows, key=lambda row: row.nodes)
    shown = [lbl for lbl in ("torch greedy", "cpsat (count)", "cpsat (step)") if lbl in r.sims]
    fig, axes = plt.subplots(len(shown), 1, figsize=(13, 2.2 * len(shown)), sharex=True)
    axes = axes if len(shown) > 1 else [axes]
    lo, hi = timeline_window(r.sims[shown[-1]])
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
    return p


def sweep_plot(out: Path, rows: list[dict]) -> None:
    """A sweep's ``results.png``: each case's simulated step relative to its floor (unbucketed,
    torch's greedy, each objective), written atomically."""
    plt = _pyplot()
    cases = list(dict.fromkeys(r["case"] for r in rows))
    objectives = list(dict.fromkeys(r["objective"] for r in rows))
    series = {"unbucketed": "unbucketed_ms", "torch greedy": "greedy_ms"}
    fig, ax = plt.subplots(figsize=(max(7.0, 1.1 * len(cases)), 4.6))
    labels = list(series) + [f"cpsat ({o})" for o in objectives]
    width = 0.8 / len(labels)
    for k, label in enumerate(labels):
        ys = []
        for c in cases:
            mine = [r for r in rows if r["case"] == c]
            r = next((x for x in mine if f"cpsat ({x['objective']})" == label), None) if label.startswith(
                "cpsat") else mine[0]
            key = "plan_ms" if label.startswith("cpsat") else series[label]
            v, floor = (r or {}).get(key), (r or {}).get("floor_ms")
            ys.append(100 * (v - floor) / floor if v is not None and floor else 0.0)
        ax.bar([i + k * width for i in range(len(cases))], ys, width, label=label)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(cases))], cases, rotation=25, ha="right", fontsize=7)
    ax.set_ylabel("simulated step above the floor (% of floor)")
    ax.set_title("Sweep: distance to the step floor per case (lower is better)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    tmp = out / ".results.png.tmp.png"
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, out / "results.png")
