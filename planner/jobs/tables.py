"""The one table writer: CSV, Markdown and JSON tables, each written atomically, and what every
shared column means (``MEANING``).

Compare, sweeps and plan folders all call ``write_table``, so a column means one thing and is
written one way wherever it appears. Standard library only; ``pyplot`` gives matplotlib
(imported only when a figure is drawn) to the jobs and the application that draw one.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from planner.core.io import atomic_write_text

def cell_text(value) -> str:
    """A table cell: empty for None, ``str`` otherwise."""
    return "" if value is None else str(value)


@dataclass(frozen=True)
class TableStyle:
    """How cells are written: ``cell`` turns a value into text; ``pipe`` is what a "|" inside a
    Markdown cell becomes (None: left as is, and the row breaks); ``first_width`` cuts the first
    Markdown cell to that many characters and "…" (fingerprints); ``csv_newline`` ends each CSV line."""

    cell: Callable[[object], str] = cell_text
    pipe: str | None = "/"
    first_width: int | None = None
    csv_newline: str = "\n"


def markdown_lines(columns: Iterable[str], rows: list[dict], style: TableStyle = TableStyle()) -> list[str]:
    """Header, rule and one line per row, in ``style``; a missing cell is ``style.cell("")``."""
    columns = list(columns)
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        cells = [style.cell(r.get(k, "")) for k in columns]
        if style.first_width is not None and cells:
            cells[0] = cells[0][:style.first_width] + "…"
        if style.pipe is not None:
            cells = [c.replace("|", style.pipe) for c in cells]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def legend_lines(legend: dict[str, str], columns: Iterable[str]) -> list[str]:
    """The column legend under a Markdown table: one "- `column`: meaning" line per column, in the
    table's order. A column without an entry is a ValueError: every column says what it means."""
    columns = list(columns)
    missing = [c for c in columns if c not in legend]
    if missing:
        raise ValueError(f"legend: no meaning for column(s) {', '.join(missing)}")
    return ["", "Columns:", ""] + [f"- `{c}`: {legend[c]}" for c in columns]


def write_table(out_dir: Path, stem: str, columns: Iterable[str], rows: list[dict], *, title: str | None = None,
                formats: Iterable[str] = ("csv", "md"), legend: dict[str, str] | None = None,
                style: TableStyle = TableStyle(), after_table: Iterable[str] = ()) -> list[Path]:
    """``rows`` as ``out_dir/stem.csv``, ``.md`` (under ``# title`` when given; ``after_table``'s
    Markdown lines, then ``legend``, the columns' meanings, under the table) and ``.json``, as
    ``formats`` asks, each written
    atomically; returns the paths. Keys outside ``columns`` are left out; a missing key is an
    empty cell (None in JSON). ``style``: how cells are written (``TableStyle``)."""
    columns, out_dir = list(columns), Path(out_dir)
    paths = []
    for fmt in formats:
        if fmt == "csv":
            buf = io.StringIO()
            w = csv.DictWriter(buf, fieldnames=columns, lineterminator=style.csv_newline)
            w.writeheader()
            w.writerows({k: style.cell(r.get(k)) for k in columns} for r in rows)
            text = buf.getvalue()
        elif fmt == "md":
            head = [f"# {title}", ""] if title is not None else []
            text = "\n".join(head + markdown_lines(columns, rows, style) + list(after_table)
                             + (legend_lines(legend, columns) if legend is not None else []))
            text += "\n"
        elif fmt == "json":
            text = json.dumps([{k: r.get(k) for k in columns} for r in rows], indent=1)
        else:
            raise ValueError(f"write_table: unknown format {fmt!r} (csv, md, json)")
        paths.append(out_dir / f"{stem}.{fmt}")
        atomic_write_text(paths[-1], text)
    return paths



# One place for what shared column names mean (compare, sweep and solve-dir tables)
MEANING = {
    "workload": "the built-in workload, your model or the problem file planned",
    "cluster": "the cluster preset that prices it (`bucketplan` docs: presets; `fxglue/presets.py`)",
    "graph_nodes": "nodes of the traced FX graph torch's scheduler ordered (not cluster nodes)",
    "collectives_before": "collectives in the graph before bucketing",
    "collectives_after": "collectives left once the plan's buckets are merged",
    "planner": "who bucketed: torch's pipelines, CP-SAT (`count`: fewest collectives; `step`: fastest simulated "
               "step), bucketplan's free positions (starts and waits moved too); `unbucketed`: nothing merged",
    "step_ms": "simulated time of one training step, ms (`planner.simulate`, under the cluster's cost model)",
    "floor_ms": "the step no plan of any row can beat on this graph and cluster, ms (`planner.cost.bounds`)",
    "above_floor_ms": "`step_ms` - `floor_ms`: what the row leaves on the table, ms",
    "above_floor_pct": "the step above the floor no plan can beat (`floor_ms`), % of the floor",
    "exposed_ms": "communication the compute stream waits for, ms",
    "overhead_ms": "bucketing's own cost: merge copies and collective launches, ms",
    "peak_gb": "peak memory of the planned schedule, GB (10^9 bytes), counted as torch's memory estimator counts it",
    "plan_s": "wall seconds the planner took",
    "status": "OPTIMAL: proved (the objective equals its bound: within 1 us for the step, exactly for counts); "
              "FEASIBLE: a verified plan, not proved; empty: torch's, not searched",
    "bound_ms": "no plan in the row's search space has a step below this, ms (step searches)",
    "bound_collectives": "no plan in the row's search space has fewer collectives (fewest-collectives search)",
    "gap_pct": "(objective - bound) / objective, %: how far from proved the row's plan may be",
    "note": "what else to know about the row (a rule torch's plan breaks, the schedule it ran on, a time limit hit)",
    # the sweep's and solve-dir's per-plan columns
    "greedy_after": "collectives after torch's greedy bucketer", "plan_after": "collectives after the plan",
    "unbucketed_ms": "simulated step with nothing merged, ms", "greedy_ms": "simulated step of torch's greedy plan, ms",
    "plan_ms": "simulated step of the plan, ms", "greedy_peak_gb": "peak memory of torch's greedy plan, GB",
    "plan_peak_gb": "peak memory of the plan, GB (torch's estimator's accounting)",
}


def pyplot():
    """matplotlib's pyplot on the Agg backend (files only, no display), imported here on first use."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
