"""Measured collectives (``planner.cost.measured``, ``--collectives``): nccl-tests output and CSV tables
price the problem and torch's scheduler alike; a bad file is one line naming file and line.

The logs are written here the way nccl-tests prints them (src/common.cu: the size column is
max(send, receive) bytes of a rank, the count column elements per rank for all_gather and
reduce_scatter, all elements for all_reduce), with times from published bus bandwidths:
8 H100 nodes of 8x400G, all_gather / reduce_scatter about 320 GB/s bus bandwidth at 1 GiB,
all_reduce about 350 GB/s (issue 28's figures). The expected times are the written figures,
not anything the code computes.
"""

from __future__ import annotations

import math

import pytest

from bucketplan import cli
import planner
from planner.cost.measured import Measured, MeasuredError, measured_table, read_series

HEADER = ("#                                                              out-of-place                       in-place\n"
          "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n"
          "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)\n")
BUSBW = {"all_gather": 320.0, "reduce_scatter": 320.0, "all_reduce": 350.0}
LATENCY_US = {"all_gather": 40.0, "reduce_scatter": 45.0, "all_reduce": 60.0}


def published_us(kind: str, size: int, ranks: int) -> float:
    """The time nccl-tests would print for ``size`` bytes at the published bus bandwidth."""
    factor = 2 * (ranks - 1) / ranks if kind == "all_reduce" else (ranks - 1) / ranks
    return LATENCY_US[kind] + size * factor / (BUSBW[kind] * 1e3)


def nccl_log(kind: str, *, ranks: int = 64, per_node: int = 8, named: bool = True, rank_lines: bool = True,
             sizes=None) -> tuple[str, dict[int, float]]:
    """An nccl-tests log and its out-of-place times (ms) by size."""
    out = [f"# Collective test starting: {kind}_perf"] if named else []
    out.append("# nThread 1 nGpus 1 minBytes 1024 maxBytes 4294967296 step: 4(factor) warmup iters: 5 iters: 20")
    out.append("#\n# Using devices")
    if rank_lines:
        for r in range(ranks):
            out.append(f"#  Rank {r:3d} Group  0 Pid {4000 + r:6d} on gpu-node-{r // per_node:02d} device  "
                       f"{r % per_node} [0x1b] NVIDIA H100 80GB HBM3")
    out.append("#")
    out.append(HEADER.rstrip("\n"))
    times = {}
    for size in sizes or [1024 * 4**k for k in range(12)]:  # 1 KiB .. 4 GiB
        count = size // 2 if kind == "all_reduce" else size // 2 // ranks
        redop = "none" if kind == "all_gather" else "sum"
        t = published_us(kind, size, ranks)
        times[size] = round(t, 2) / 1e3
        algbw = size / t / 1e3
        out.append(f"{size:12d}  {count:12d}  bfloat16  {redop:>6}      -1  {t:7.2f}  {algbw:6.2f}  {algbw:6.2f}"
                   f"      0  {t:7.2f}  {algbw:6.2f}  {algbw:6.2f}      0")
    out.append("# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 150.1\n#")
    return "\n".join(out) + "\n", times


@pytest.mark.parametrize("kind", ["all_gather", "reduce_scatter", "all_reduce"])
@pytest.mark.parametrize("named", [True, False])
def test_each_program_reads_its_sizes_ranks_and_times(tmp_path, kind, named):
    text, times = nccl_log(kind, named=named)
    path = tmp_path / ("log.txt" if not named else f"{kind}.log")
    path.write_text(text)
    (s,) = read_series(path)
    assert (s.kind, s.ranks, s.ranks_per_node) == (kind, 64, 8)
    assert dict(s.points) == times


def test_a_log_without_rank_lines_takes_the_ranks_given(tmp_path):
    text, _ = nccl_log("all_gather", rank_lines=False, ranks=8)
    path = tmp_path / "all_gather_perf.txt"
    path.write_text(text)
    (s,) = read_series(path, ranks=8, ranks_per_node=1)
    assert (s.ranks, s.ranks_per_node) == (8, 1)
    for given in ({}, {"ranks": 8}):  # the layout is never guessed
        with pytest.raises(MeasuredError, match="no '#  Rank"):
            read_series(path, **given)


def test_the_table_goes_through_every_point_flat_below_and_along_the_last_segment_above():
    points = ((1024, 0.04), (4096, 0.05), (1 << 20, 0.5))
    link = planner.Link(pg="0", group_size=8, table={"all_gather": measured_table(points)})
    for b, t in points:
        assert link.time_ms("all_gather", b) == t
    assert link.time_ms("all_gather", 0) == link.time_ms("all_gather", 10) == 0.04
    slope = (0.5 - 0.05) / ((1 << 20) - 4096)
    assert link.time_ms("all_gather", 1 << 21) == pytest.approx(0.5 + slope * (1 << 20))


@pytest.fixture(scope="module")
def fsdp_measured(tmp_path_factory):
    """llama3-8b-fsdp-2 on 8 nodes (one 64-rank group, 8 per node), all_gather and reduce_scatter
    measured by nccl-tests logs, all_reduce by a CSV."""
    from fxglue.pipeline import prepare
    from fxglue.presets import get_preset, with_measurements

    d = tmp_path_factory.mktemp("measured")
    times = {}
    for kind in ("all_gather", "reduce_scatter"):
        text, times[kind] = nccl_log(kind)
        (d / f"{kind}_perf.txt").write_text(text)
    csv = ["kind,group,ranks_per_node,bytes,ms"] + [f"all_reduce,64,8,{b},{published_us('all_reduce', b, 64) / 1e3}"
                                                   for b in (1 << 10, 1 << 20, 1 << 30)]
    times["all_reduce"] = {b: published_us("all_reduce", b, 64) / 1e3 for b in (1 << 10, 1 << 20, 1 << 30)}
    (d / "all_reduce.csv").write_text("\n".join(csv) + "\n")
    preset = with_measurements(get_preset("h100-8nodes"), sorted(d.iterdir()))
    return prepare("llama3-8b-fsdp-2", preset=preset, greedy=False), times, preset


def test_the_problem_is_priced_at_the_measured_points(fsdp_measured):
    prepared, times, _ = fsdp_measured
    (link,) = prepared.problem.links
    for kind, by_size in times.items():
        for size, ms in by_size.items():
            assert math.isclose(link.time_ms(kind, size), ms, rel_tol=0.005), (kind, size)
    assert "measured" in link.hardware


def test_torch_scheduler_and_the_problem_price_every_collective_alike(fsdp_measured):
    prepared, times, _ = fsdp_measured
    links = {l.pg: l for l in prepared.problem.links}
    for c in prepared.problem.collectives:
        assert c.est_ms == pytest.approx(links[c.pg].time_ms(c.kind, c.wire_bytes), rel=1e-12)
        # and against the published figure itself, within the two decimals of the log
        assert c.est_ms == pytest.approx(published_us(c.kind, c.wire_bytes, 64) / 1e3, rel=0.005, abs=1e-5)


def test_each_group_says_what_priced_it_and_its_sizes_outside_the_measured_range(fsdp_measured):
    """``pricing_lines``: per group and kind, the file that priced it and how many of its collectives
    lie below and above the measured sizes (counted here from the problem and the logs' own range,
    1 KiB to 4 GiB; the workload has no all_reduce, which the CSV measures); a kind no measurement
    prices says the model does."""
    from fxglue.presets import get_preset, pricing_lines, with_measurements

    prepared, _, preset = fsdp_measured
    problem = prepared.problem
    (line,) = pricing_lines(preset, problem)
    assert line.startswith("group 0 (64 ranks, 8 per node) priced by ")
    for kind, source, hi in (("all_gather", "all_gather_perf.txt", 4 << 30), ("reduce_scatter",
                             "reduce_scatter_perf.txt", 4 << 30)):
        sizes = [c.wire_bytes for c in problem.collectives if c.kind == kind]
        below, above = sum(b < 1024 for b in sizes), sum(b > hi for b in sizes)
        assert f"{kind} measured (" in line and source in line, line
        assert f"of its {len(sizes)}, {below} below (priced at 1 KiB's time), {above} above" in line, line
    # only the all_gathers measured: the reduce_scatters say the model prices them
    (gathers,) = [s.file for s in preset.measured.series if s.kind == "all_gather"]
    only = with_measurements(get_preset("h100-8nodes"), [gathers])
    (line,) = pricing_lines(only, problem)
    assert "reduce_scatter by the preset's model" in line and "all_gather measured (" in line, line


def test_a_group_laid_out_otherwise_keeps_the_model(tmp_path):
    """A measurement of 64 ranks with one per node does not price a group spanning whole nodes."""
    text, _ = nccl_log("all_gather", ranks=64, per_node=1)
    (tmp_path / "ag.txt").write_text(text)
    m = Measured.read([tmp_path / "ag.txt"])
    base = planner.Link(pg="0", group_size=64, latency_ms=0.02, bandwidth_gbps=50.0)
    assert m.link(base, 8) is base
    assert m.link(base, 1).time_ms("all_gather", 1024) == pytest.approx(published_us("all_gather", 1024, 64) / 1e3,
                                                                         rel=0.005)


# name -> (content, where the one line must point: ":LINE:" or a word)
BAD = {
    "empty.txt": ("", "empty"),
    "binary.txt": (b"\xff\xfe\x00garbage", "not UTF-8"),
    "short_row.txt": ("# Collective test starting: all_gather_perf\n1024 8 float none\n", ":2:"),
    "bad_size.txt": ("# Collective test starting: all_gather_perf\n1k 8 float none -1 20.0 0.1 0.1 0\n", ":2:"),
    "no_rows.txt": ("# Collective test starting: all_gather_perf\n# nothing measured\n", "no result rows"),
    "bad_count.txt": ("# Collective test starting: all_gather_perf\n1024 x float none -1 20.0 0.1 0.1 0\n", ":2:"),
    "bad_type.txt": ("# Collective test starting: all_gather_perf\n1024 8 complex none -1 20.0 0.1 0.1 0\n", ":2:"),
    "negative_time.txt": ("# Collective test starting: all_gather_perf\n1024 8 float none -1 -3 0.1 0.1 0\n", ":2:"),
    "unknown_program.txt": ("# Collective test starting: alltoall_perf\n1024 8 float none -1 20 0.1 0.1 0\n", ":1:"),
    "bad_header.csv": ("kind,size,bytes\nall_gather,8,1024\n", ":1:"),
    "bad_kind.csv": ("kind,group,ranks_per_node,bytes,ms\nbroadcast,8,8,1024,0.1\n", ":2:"),
    "bad_ms.csv": ("kind,group,ranks_per_node,bytes,ms\nall_gather,8,8,1024,fast\n", ":2:"),
    "twice.csv": ("kind,group,ranks_per_node,bytes,ms\nall_gather,8,8,1024,0.1\nall_gather,8,8,1024,0.2\n", ":3:"),
    # figures beyond any machine: a problem could not hold them (planner.core.problem.MAX_BYTES, MAX_MS)
    "huge_bytes.csv": ("kind,group,ranks_per_node,bytes,ms\nall_gather,8,8,4611686018427387904,0.1\n", ":2:"),
    "huge_ms.csv": ("kind,group,ranks_per_node,bytes,ms\nall_gather,8,8,1024,1e9\n", ":2:"),
    "huge_size.txt": ("# Collective test starting: all_gather_perf\n"
                      "4611686018427387904 8 float none -1 20.0 0.1 0.1 0\n", ":2:"),
    "nan_time.txt": ("# Collective test starting: all_gather_perf\n1024 8 float none -1 nan 0.1 0.1 0\n", ":2:"),
    # more digits than int() converts: a ValueError of Python's, naming neither file nor line
    "huge_group.csv": ("kind,group,ranks_per_node,bytes,ms\nall_gather," + "9" * 5000 + ",8,1024,0.1\n", ":2:"),
    "huge_rank.txt": ("# Collective test starting: all_gather_perf\n#  Rank " + "9" * 5000 + " Group 0 Pid 1 on h0\n"
                      "1024 8 float none -1 20.0 0.1 0.1 0\n", ":2:"),
    # a time that falls at the largest size would be extended below zero above it
    "falling.csv": ("kind,group,ranks_per_node,bytes,ms\nall_gather,8,8,1048576,1.0\nall_gather,8,8,2097152,0.5\n",
                    "cannot be extended above it"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_malformed_file_is_one_line_naming_file_and_line_exit_2(tmp_path, capsys, name):
    data, where = BAD[name]
    path = tmp_path / name
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    code = cli.main(["extract", "llama3-8b-fsdp-2", "-o", str(tmp_path / "out"), "-q",
                                "--collectives", str(path)])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert str(path) in err and where in err, err
    assert not (tmp_path / "out").exists()


def test_a_sweep_case_takes_measured_files_relative_to_its_spec(tmp_path):
    from fxglue.run.sweep import resolve
    from planner.jobs.sweep import SpecError, load_spec

    text, _ = nccl_log("all_gather")
    (tmp_path / "ag.txt").write_text(text)
    spec = tmp_path / "spec.toml"
    spec.write_text('[[case]]\nworkloads = ["llama3-8b-fsdp-2"]\npresets = ["h100-8nodes"]\ncollectives = ["ag.txt"]\n')
    (case,) = load_spec(spec).cases
    assert case.collectives == (str(tmp_path / "ag.txt"),)
    _, preset = resolve(case)
    assert preset.measured.series[0].kind == "all_gather"
    spec.write_text('[[case]]\nworkloads = ["llama3-8b-fsdp-2"]\ncollectives = ["missing.txt"]\n')
    with pytest.raises(SpecError, match="missing.txt"):
        load_spec(spec)


def test_compute_tflops_reprices_the_compute_bound_nodes_only(tmp_path, fsdp_measured):
    prepared, _, _ = fsdp_measured  # compute at the preset's 800 TFLOP/s
    assert cli.main(["extract", "llama3-8b-fsdp-2", "-o", str(tmp_path), "-q",
                                "--compute-tflops", "400"]) == 0
    slow = planner.load_problem(tmp_path / "problem.json")
    # by name: torch's scheduler may order the graph otherwise once compute costs differ
    before = {n.name: n.est_ms for n in prepared.problem.nodes if n.kind == "compute"}
    pairs = [(before[n.name], n.est_ms) for n in slow.nodes if n.kind == "compute"]
    assert len(pairs) == len(before)
    # roofline max(flops / rate, bytes / bandwidth): halving the rate at most doubles a node, and
    # doubles exactly the nodes that were compute-bound (matmuls at these shapes)
    assert all(a <= b <= 2 * a * (1 + 1e-9) for a, b in pairs)
    assert sum(b == pytest.approx(2 * a, rel=1e-9) for a, b in pairs if a > 0) >= 10
    assert "bf16_tflops 400" in slow.meta["hardware"]


def test_prepare_takes_a_cost_model_that_prices_scheduler_and_problem_alike():
    """An α-β estimator handed to prepare (no private call): the problem's links are its, and
    torch's scheduler estimated every collective by the same link."""
    from fxglue.estimator import Estimator
    from fxglue.pipeline import PipelineOptions, prepare
    from fxglue.presets import Hardware, LinkSpec

    hw = Hardware(links={"dp": LinkSpec(33.0, 77.0, "made-up link"), "tp": LinkSpec(5.0, 200.0, "NVLink 4")})
    p = prepare("llama3-8b-fsdp-2", preset="h100-8nodes", pipeline=PipelineOptions(estimator=Estimator(hw)),
                greedy=False)
    (link,) = p.problem.links
    assert (link.latency_ms, link.bandwidth_gbps) == (0.033, 77.0)
    for c in p.problem.collectives:
        factor = (link.group_size - 1) / link.group_size
        assert c.est_ms == pytest.approx(0.033 + factor * c.wire_bytes / 77e6, rel=1e-9)


def test_a_csv_names_a_group_as_pg_name_and_a_bare_integer_is_a_size(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("kind,group,ranks_per_node,bytes,ms\nall_gather,pg:0,8,1024,0.1\nall_gather,pg:0,8,2048,0.2\n"
                    "reduce_scatter,64,8,1024,0.3\nreduce_scatter,64,8,2048,0.4\n")
    m = Measured.read([path])
    base = planner.Link(pg="0", group_size=16, latency_ms=0.02, bandwidth_gbps=50.0)
    link = m.link(base, 8)  # "0" by name whatever its size; reduce_scatter's 64 ranks are not this group's 16
    assert link.time_ms("all_gather", 2048) == 0.2
    assert link.time_ms("reduce_scatter", 2048) == base.time_ms("reduce_scatter", 2048)


def test_the_header_says_how_many_ranks_and_a_contradicting_flag_is_not_taken(tmp_path):
    text, _ = nccl_log("all_gather", ranks=16, per_node=8)
    (tmp_path / "ag.txt").write_text(text)
    (s,) = read_series(tmp_path / "ag.txt", ranks=64, ranks_per_node=1)
    assert (s.ranks, s.ranks_per_node) == (16, 8)


def test_torchs_override_size_is_turned_back_into_the_full_tensor(fsdp_measured):
    """torch's scheduler passes sizes as input plus output bytes (fxglue.costs.torch_bytes); the
    measured curve is in full-tensor bytes, so the estimator converts before looking up."""
    from fxglue.costs import torch_bytes
    from fxglue.estimator import collective_kind, wire_bytes

    prepared, _, _ = fsdp_measured
    est = prepared.estimator
    (link,) = prepared.problem.links
    starts = [n for n in prepared.inputs.gm.graph.nodes if collective_kind(n)]
    assert starts
    for n in starts[:6]:
        kind, wire = collective_kind(n), wire_bytes(n)
        for full in (wire, 3 * wire):  # the member itself, and a bucket three times its size
            given = torch_bytes(kind, full, link.group_size)
            assert est.collective_ms(n, override_size=given) == pytest.approx(link.time_ms(kind, full), rel=1e-3)


def test_a_csv_saved_with_a_byte_order_mark_reads_as_without(tmp_path):
    """Spreadsheets save CSV with a UTF-8 byte-order mark; it was taken for nccl-tests output."""
    text = "kind,group,ranks_per_node,bytes,ms\nall_gather,8,8,1048576,0.1\nall_gather,8,8,2097152,0.15\n"
    plain, marked = tmp_path / "plain.csv", tmp_path / "marked.csv"
    plain.write_text(text)
    marked.write_bytes("\ufeff".encode() + text.encode())
    assert Measured.read([marked]).series[0].points == Measured.read([plain]).series[0].points


def test_a_group_that_is_a_digit_to_isdigit_but_no_integer_is_a_name(tmp_path):
    """A superscript two is a digit to str.isdigit and no integer to int(): the group is a name,
    as any other non-integer."""
    path = tmp_path / "t.csv"
    path.write_text("kind,group,ranks_per_node,bytes,ms\nall_gather,\u00b2,8,1024,0.1\n", encoding="utf-8")
    (s,) = Measured.read([path]).series
    assert (s.group, s.ranks) == ("\u00b2", None)


def test_a_falling_nccl_tests_series_names_file_kind_and_both_sizes(tmp_path):
    path = tmp_path / "all_gather_perf.txt"
    path.write_text("# Collective test starting: all_gather_perf\n#  Rank  0 Group  0 Pid 1 on h0 device 0\n"
                    "1024 256 float none -1 20.0 0.1 0.1 0\n2048 512 float none -1 10.0 0.1 0.1 0\n")
    with pytest.raises(MeasuredError) as e:
        Measured.read([path])
    assert str(path) in str(e.value) and "all_gather" in str(e.value)
    assert "at 2 KiB" in str(e.value) and "at 1 KiB" in str(e.value)


# -- what the measurements leave out: a warning, or a refusal when they price nothing ---------------

GRAPH_ORDER = "llama3-8b-fsdp-2--h100-8nodes-graph-order"  # one group, "0": 64 ranks, 8 per node
CSV_HEAD = "kind,group,ranks_per_node,bytes,ms\n"


def _measurement(path, kind: str, group: str, per_node: int):
    path.write_text(CSV_HEAD + f"{kind},{group},{per_node},1024,0.05\n{kind},{group},{per_node},1048576,0.5\n")
    return path


def _warnings(paths, name: str = GRAPH_ORDER, **kw):
    from fxglue.presets import get_preset, measurement_warnings, with_measurements
    from tests.support import data_problem

    return measurement_warnings(with_measurements(get_preset("h100-8nodes"), paths), data_problem(name), **kw)


def test_a_measurement_file_that_prices_nothing_is_a_warning_naming_it(tmp_path):
    good = _measurement(tmp_path / "good.csv", "all_gather", "64", 8)
    idle = _measurement(tmp_path / "idle.csv", "all_gather", "64", 1)  # one rank per node: another layout
    (line,) = _warnings([good, idle], alone=True)
    assert line.startswith(f"{idle} prices no collective") and "all_gather on 64 ranks (1 per node)" in line, line
    assert "groups are 0 (64 ranks, 8 per node)" in line, line
    assert _warnings([good], alone=True) == []


def test_measurements_that_price_nothing_are_refused_when_asked_for_alone(tmp_path):
    idle = _measurement(tmp_path / "idle.csv", "all_gather", "8", 8)
    with pytest.raises(MeasuredError, match=f"--collectives {idle}: prices no collective"):
        _warnings([idle], alone=True)
    # among several workloads (compare's), the file may be another's: a warning, and the group too
    file_line, group_line = _warnings([idle])
    assert str(idle) in file_line
    assert group_line.startswith("group 0 (64 ranks, 8 per node): no measurement prices it") and "NCCL" in group_line


def test_a_group_no_measurement_prices_is_a_warning(tmp_path):
    """2-D: the TP group (8 ranks in a node) measured, the FSDP group (8 ranks, one per node) not."""
    from tests.support import data_problem

    problem = data_problem("llama3-8b-2d-8--h100-8nodes")
    tp = next(link.pg for link in problem.links if "8 per node" in link.hardware)
    dp = next(link.pg for link in problem.links if link.pg != tp)
    ar = _measurement(tmp_path / "tp.csv", "all_reduce", f"pg:{tp}", 8)
    (line,) = _warnings([ar], "llama3-8b-2d-8--h100-8nodes", alone=True)
    assert line.startswith(f"group {dp} (8 ranks, 1 per node): no measurement prices it"), line


@pytest.mark.slow  # traces llama3-8b-2d-8 at 64 ranks
def test_a_2d_workload_s_8_rank_groups_are_priced_by_8_rank_nccl_tests_logs(tmp_path):
    """llama3-8b-2d-8 @ h100-8nodes: TP on 8 ranks in a node, FSDP on 8 ranks one per node. The
    64-rank logs price neither group: both are warned of (each log's file too). With nccl-tests logs
    of 8 ranks on NVLink (8 per node) and 8 ranks across nodes (1 per node) added, nothing is warned
    of, and the problem extracted with them prices each group by its own log at the written times
    (published_us: the test's own figures, nothing the code computes)."""
    from fxglue.pipeline import prepare
    from fxglue.presets import get_preset, measurement_warnings, with_measurements
    from tests.support import data_problem

    problem = data_problem("llama3-8b-2d-8--h100-8nodes")
    kinds = {link.pg: sorted({c.kind for c in problem.collectives if c.pg == link.pg}) for link in problem.links}
    tp = next(link.pg for link in problem.links if "8 per node" in link.hardware)
    dp = next(pg for pg in kinds if pg != tp)
    wide = []
    for kind in ("all_gather", "reduce_scatter", "all_reduce"):
        wide.append(tmp_path / f"{kind}-64.txt")
        wide[-1].write_text(nccl_log(kind)[0])
    preset = with_measurements(get_preset("h100-8nodes"), wide)
    warned = measurement_warnings(preset, problem)
    assert [w for w in warned if w.startswith("group ")] == [
        f"group {pg} (8 ranks, {per} per node): no measurement prices it; the preset's model does "
        f"({next(link.hardware for link in problem.links if link.pg == pg)})" for pg, per in sorted([(tp, 8), (dp, 1)])]
    assert sum(" prices no collective of this workload" in w for w in warned) == 3

    narrow = {}
    for pg, per_node in ((tp, 8), (dp, 1)):
        for kind in kinds[pg]:
            path = tmp_path / f"{kind}-8x{per_node}.txt"
            text, times = nccl_log(kind, ranks=8, per_node=per_node)
            path.write_text(text)
            narrow[path] = (pg, kind, per_node, times)
    preset = with_measurements(get_preset("h100-8nodes"), [*wide, *narrow])
    # left: only the 64-rank files, which still price nothing of it
    assert [w.split(" prices no collective")[0] for w in measurement_warnings(preset, problem)] == list(map(str, wide))
    extracted = prepare("llama3-8b-2d-8", preset=preset, greedy=False).problem
    assert {link.pg for link in extracted.links} == {tp, dp}  # the committed problem's group names
    for pg, kind, per_node, times in narrow.values():
        for size, ms in times.items():
            assert extracted.link(pg).time_ms(kind, size) == pytest.approx(ms, rel=1e-9), (pg, kind, size)


def test_compare_s_table_carries_the_warnings_in_the_unbucketed_row():
    from bucketplan.report import WorkloadRow, simulated_on, table_rows
    from planner.cost.simulator import simulate
    from tests.support import data_problem

    problem = data_problem(GRAPH_ORDER)
    row = WorkloadRow("w", problem.n_scheduled, len(problem.collectives), preset="h100-8nodes", problem=problem,
                      warnings=["f.csv prices no collective of this workload"])
    row.sims["unbucketed"] = simulate(problem)
    (line,) = table_rows([row])
    assert line["note"] == "warning: f.csv prices no collective of this workload" and line["warnings"]
    assert simulated_on([line]) == "Simulated on h100-8nodes (cluster nodes; --preset picks another)."


@pytest.mark.slow  # traces llama3-8b-fsdp-2
def test_extract_warns_of_a_file_that_prices_nothing_on_stderr_and_in_the_problem(tmp_path, capsys):
    good = _measurement(tmp_path / "good.csv", "reduce_scatter", "64", 8)
    idle = _measurement(tmp_path / "idle.csv", "all_gather", "8", 8)
    code = cli.main(["extract", "llama3-8b-fsdp-2", "-o", str(tmp_path / "out"), "-q", "--collectives", str(good),
                     str(idle)])
    err = capsys.readouterr().err
    assert code == 0, err
    assert f"warning: {idle} prices no collective of this workload" in err, err
    (warning,) = planner.load_problem(tmp_path / "out" / "problem.json").meta["warnings"]
    assert warning.startswith(f"{idle} prices no collective")


@pytest.mark.slow  # traces llama3-8b-fsdp-2 twice (torch's schedule and its pre-bucketed one)
def test_compare_carries_the_warnings_of_each_workload_in_its_problem(tmp_path):
    """compare warns, never refuses: its report carries the warning beside the rows, and a file
    may be meant for another workload of the run."""
    from bucketplan.compare import _problems_for
    from fxglue.presets import get_preset, with_measurements

    idle = _measurement(tmp_path / "idle.csv", "all_gather", "8", 8)
    preset = with_measurements(get_preset("h100-8nodes"), [idle])
    (problem, *_), _ = _problems_for("llama3-8b-fsdp-2", lambda *a: None, preset)
    file_line, group_line = problem.meta["warnings"]
    assert file_line.startswith(f"{idle} prices no collective") and group_line.startswith("group 0 (64 ranks")
    # and what priced each group and kind, for compare.md's section
    assert problem.meta["pricing"] == ["group 0 (64 ranks, 8 per node) priced by all_gather by the preset's model; "
                                       "reduce_scatter by the preset's model"]


def test_compare_prints_the_table_s_warnings_on_stderr(tmp_path, monkeypatch, capsys):
    import bucketplan.compare as compare
    from bucketplan.report import WorkloadRow, table_rows
    from planner.cost.simulator import simulate
    from tests.support import data_problem

    problem = data_problem(GRAPH_ORDER)
    row = WorkloadRow("llama3-8b-fsdp-2", problem.n_scheduled, len(problem.collectives), preset="h100-8nodes",
                      problem=problem, warnings=["idle.csv prices no collective of this workload"])
    row.sims["unbucketed"] = simulate(problem)

    def fake(workloads, *, out, **_):
        out.mkdir(parents=True, exist_ok=True)
        return table_rows([row])
    monkeypatch.setattr(compare, "run_compare", fake)
    assert cli.main(["compare", "llama3-8b-fsdp-2", "-q", "-o", str(tmp_path / "c")]) == 0
    captured = capsys.readouterr()
    assert captured.err == "warning: llama3-8b-fsdp-2: idle.csv prices no collective of this workload\n"
    assert "Simulated on h100-8nodes (cluster nodes; --preset picks another)." in captured.out
