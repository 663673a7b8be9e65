"""planner.jobs.tables (the one table writer: CSV, Markdown, JSON; atomic) and bucketplan.report
(compare's table and the timeline span)."""

from __future__ import annotations

import csv
import json

import pytest

import planner
from bucketplan.report import (COLUMNS, TERMINAL_COLUMNS, PlanRow, WorkloadRow, layer_spans, markdown, table_rows,
                               write_compare_table)
from planner.jobs.tables import TableStyle, markdown_lines, write_table

COLS = ["name", "ms", "note"]
ROWS = [{"name": "a|b", "ms": 0.1 + 0.2, "note": 'comma, "quoted"'},
        {"name": "none", "ms": None, "note": "x | y", "ignored": "not a column"},
        {"name": "missing"}]


def test_csv_reads_back_as_the_cells_none_and_missing_empty(tmp_path):
    paths = write_table(tmp_path, "t", COLS, ROWS)
    assert paths == [tmp_path / "t.csv", tmp_path / "t.md"]
    with open(tmp_path / "t.csv", newline="", encoding="utf-8") as fh:
        back = list(csv.DictReader(fh))
    assert back == [{"name": "a|b", "ms": "0.30000000000000004", "note": 'comma, "quoted"'},
                    {"name": "none", "ms": "", "note": "x | y"},
                    {"name": "missing", "ms": "", "note": ""}]


def test_markdown_has_a_line_per_row_with_pipes_replaced(tmp_path):
    write_table(tmp_path, "t", COLS, ROWS, title="A | title")
    lines = (tmp_path / "t.md").read_text(encoding="utf-8").splitlines()
    assert lines[:4] == ["# A | title", "", "| name | ms | note |", "|---|---|---|"]
    assert lines[4:] == ['| a/b | 0.30000000000000004 | comma, "quoted" |', "| none |  | x / y |",
                         "| missing |  |  |"]
    assert all(line.count("|") == len(COLS) + 1 for line in lines[2:])  # every cell where its column is


def test_no_title_no_heading_and_an_empty_table_is_header_and_rule(tmp_path):
    write_table(tmp_path, "t", COLS, [])
    assert (tmp_path / "t.md").read_text() == "| name | ms | note |\n|---|---|---|\n"
    assert (tmp_path / "t.csv").read_text() == "name,ms,note\n"


def test_first_cell_cut_to_its_width_in_markdown_only(tmp_path):
    rows = [{"name": "0123456789abcdef", "ms": 1}, {"name": "short|", "ms": 2}]
    write_table(tmp_path, "t", COLS, rows, style=TableStyle(first_width=12))
    body = (tmp_path / "t.md").read_text(encoding="utf-8").splitlines()[2:]
    assert body == ["| 0123456789ab… | 1 |  |", "| short/… | 2 |  |"]
    assert [r["name"] for r in csv.DictReader((tmp_path / "t.csv").open())] == ["0123456789abcdef", "short|"]


def test_written_atomically_nothing_else_left_in_the_folder(tmp_path):
    write_table(tmp_path, "t", COLS, ROWS, formats=("csv", "md", "json"))
    write_table(tmp_path, "t", COLS, ROWS[:1], formats=("csv", "md", "json"))  # over the first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv", "t.json", "t.md"]
    assert json.loads((tmp_path / "t.json").read_text()) == [{"name": "a|b", "ms": 0.1 + 0.2,
                                                              "note": 'comma, "quoted"'}]


def test_an_unknown_format_is_refused(tmp_path):
    with pytest.raises(ValueError, match="xlsx"):
        write_table(tmp_path, "t", COLS, ROWS, formats=("xlsx",))


def test_markdown_lines_keeps_pipes_and_renders_cells_as_asked():
    # experiments' tables: None shown as "None", "|" left as it is
    lines = markdown_lines(["a", "b"], [{"a": None, "b": "x|y"}, {}], TableStyle(cell=str, pipe=None))
    assert lines[2:] == ["| None | x|y |", "|  |  |"]


def _chain(n: int, compute_ms: float = 1.0) -> planner.Problem:
    """``n`` all_reduces on one stream, each started, hidden by one matmul and waited, in a row
    (0.5 ms each on the link, under ``compute_ms`` of compute)."""
    nodes, colls = [], []
    for i in range(n):
        s = len(nodes)
        nodes += [planner.Node(name=f"c{i}", kind="start", pos=s, est_ms=0.0),
                  planner.Node(name=f"mm{i}", kind="compute", pos=s + 1, est_ms=compute_ms),
                  planner.Node(name=f"wait_c{i}", kind="wait", pos=s + 2, est_ms=0.0, deps=(s,))]
        colls.append(planner.Collective(
            name=f"c{i}", wait=f"wait_c{i}", kind="all_reduce", pg="pg0", key="all_reduce/pg0/bf16",
            dtype="bfloat16", size_bytes=1 << 20, wire_bytes=1 << 20, est_ms=0.5, exposed_ms=0.0, start_pos=s,
            wait_pos=s + 2, hiding=(f"mm{i}",), status="hidden"))
    links = (planner.Link(pg="pg0", group_size=2, latency_ms=0.0, bandwidth_gbps=2.0),)
    return planner.Problem(bucket_mode="default", bucket_cap_bytes=1 << 30, n_scheduled=len(nodes),
                           collectives=tuple(colls), nodes=tuple(nodes), timelines=(), links=links).with_fingerprint()


def test_layer_spans_span_one_block_in_each_phase():
    """Four blocks of a collective each in backward, one in forward for block 0 and 1: the span
    runs from the position of one block's collective to the next one's, whatever the plan."""
    base = _chain(4)
    colls = [c.model_copy(update={"module": f"layers.{i}", "phase": "backward"}) for i, c in enumerate(base.collectives)]
    problem = base.model_copy(update={"collectives": tuple(colls)}).with_fingerprint()
    assert layer_spans(problem) == {"backward": (3, 6)}  # start positions 0, 3, 6, 9: the middle pair
    colls[0] = colls[0].model_copy(update={"phase": "forward"})
    colls[1] = colls[1].model_copy(update={"phase": "forward"})
    problem = base.model_copy(update={"collectives": tuple(colls)}).with_fingerprint()
    # forward: first uses (waits) at 2 and 5; backward now has blocks 2 and 3 only
    assert layer_spans(problem) == {"forward": (2, 5), "backward": (6, 9)}
    # a block's span in time holds exactly its own compute (mm1 at position 4) on the unbucketed step
    sim = planner.simulate(problem, None)
    from bucketplan.report import _time_at

    time_at = _time_at(sim, problem)
    lo, hi = time_at(3), time_at(6)
    inside = [c.name for c in sim.compute if lo <= c.begin_ms and c.end_ms <= hi + 1e-9 and c.kind == "compute"]
    assert inside == ["mm1"]
    assert layer_spans(base) == {}  # no blocks named: the timeline shows the whole step


def test_compare_table_rows_and_files(tmp_path):
    problem = _chain(3)
    slow = planner.Plan(problem_fingerprint=problem.fingerprint, planner="hand", created="", buckets=(
        planner.Bucket(members=("c0", "c1", "c2"), start="c0", wait="c0"),))
    row = WorkloadRow("w|1", problem.n_scheduled, 3, floor_ms=1.0)
    row.plans = [PlanRow("merged", problem, slow, 0.123, "FEASIBLE", 2.0, 0.5, "a note"),
                 PlanRow("cpsat (step)", problem, None, 1.0, "UNKNOWN")]
    row.sims = {"merged": planner.simulate(problem, slow), "unbucketed": planner.simulate(problem, None)}
    table = table_rows([row])
    assert [(r["planner"], r["collectives_after"]) for r in table] == [
        ("unbucketed", 3), ("merged", 1), ("cpsat (step)", None)]
    assert table[1]["note"] == "a note; slower than unbucketed" and table[1]["gap_pct"] == 50.0
    assert table[2]["step_ms"] is None and table[2]["bound_ms"] == "" and table[2]["bound_collectives"] == ""
    # one unit per bound column: a step search's bound in ms, a count search's in collectives
    assert table[1]["bound_ms"] == 2.0 and table[1]["bound_collectives"] == ""
    write_compare_table(tmp_path, table)
    assert (tmp_path / "compare.csv").read_bytes().count(b"\r\n") == 4  # compare's CSV ends lines in \r\n
    md = (tmp_path / "compare.md").read_text()
    assert "| " + " | ".join(COLUMNS) + " |" in md
    assert "| w|1 |" in markdown(table)  # compare's Markdown keeps "|" as it always has
    # a legend under each table, every column in it, graph nodes named apart from cluster nodes
    for text, columns in ((md, COLUMNS), (markdown(table), TERMINAL_COLUMNS)):
        legend = text.split("Columns:", 1)[1]
        assert all(f"- `{c}`: " in legend for c in columns)
    assert "not cluster nodes" in md
    assert json.loads((tmp_path / "compare.json").read_text()) == [{k: r[k] for k in COLUMNS} for r in table]
    assert set(COLUMNS) <= set(table[0])


def test_a_table_column_without_a_meaning_is_refused(tmp_path):
    from planner.jobs.tables import legend_lines

    with pytest.raises(ValueError, match="no meaning for column.*ms"):
        legend_lines({"name": "what"}, ["name", "ms"])
    write_table(tmp_path, "t", ["name"], [{"name": "a"}], legend={"name": "the thing"})
    assert (tmp_path / "t.md").read_text().endswith("Columns:\n\n- `name`: the thing\n")
