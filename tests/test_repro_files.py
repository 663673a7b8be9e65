"""Repro files written by other projects' tooling (``tests/data/repro/``): torch's
``save_graph_repro`` for CUDA runs and AutoParallel's overlap-simulator graphs, each planned from
the command line (extract, solve, verify, apply); every tensor the graph makes (factories with
cuda device literals, 0-d scalars) traced as a node on fake CPU tensors of the trace's own mode;
a graph that still does not trace refused in one line naming its node; and AutoParallel's
collectives table, read with no flag from ``get_colls_estimations_file()`` or given with
``--collectives``, pricing each group at the table's own numbers.

Expected values come from the files themselves: collectives and factory calls counted in the
graph file's text, times read off the table's text by splitting its lines (not by
``planner.cost.measured``), the failing node's line found by searching the file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import planner
from tests.support import run_main

pytestmark = pytest.mark.slow  # traces repro files

DATA = Path(__file__).parent / "data" / "repro"
CORPUS = ["fw_scalar_index.py", "bw_empty_cuda.py", "autoparallel_2d.py"]
KIND_OPS = {"all_gather": "all_gather_into_tensor", "reduce_scatter": "reduce_scatter_tensor",
            "all_reduce": "all_reduce"}
# the factories of the corpus: ops that make a tensor from literals alone
FACTORIES = ("full", "empty", "empty_strided", "zeros", "ones", "arange", "scalar_tensor", "new_zeros")


def _collectives_in(text: str) -> dict[str, int]:
    """Collectives by kind, counted in the file's forward."""
    return {kind: len(re.findall(rf"_c10d_functional\.{op}\.default\(", text)) for kind, op in KIND_OPS.items()}


def _table(path: Path) -> tuple[list[int], dict[tuple[str, int, str], list[float]]]:
    """AutoParallel's table read by splitting its lines: the MB columns, and per (group, group
    size, collective) the milliseconds at each."""
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    sizes = [int(w[:-2]) for w in lines[0].split() if w.endswith("MB")]
    rows = {}
    for line in lines[2:]:
        group, size, name, *times = line.split()
        rows[(group, int(size), name)] = [float(t) for t in times]
    return sizes, rows


@pytest.mark.parametrize("name", CORPUS)
def test_each_repro_file_extracts_solves_verifies_and_applies_from_the_cli(tmp_path, capsys, name):
    graph = DATA / name
    out = tmp_path / "out"
    code, _, err = run_main(["extract", "--graph", str(graph), "-o", str(out), "-q"], capsys)
    assert code == 0, err
    problem = planner.load_problem(out / "problem.json")
    counted = _collectives_in(graph.read_text())
    assert {k: sum(c.kind == k for c in problem.collectives) for k in KIND_OPS} == counted
    forward = graph.read_text().split("def load_args")[0]
    assert problem.meta["devices_mapped"] == len(re.findall(r"device = (?:device\(type='cuda'|'cuda)", forward))
    code, _, err = run_main(["solve", out / "problem.json", "-o", out / "plan.json", "--time-limit", "5", "-q"],
                            capsys)
    assert code == 0, err
    plan = planner.load_plan(out / "plan.json")
    assert not planner.verify(problem, plan)
    assert run_main(["verify", str(out / "problem.json"), str(out / "plan.json")], capsys)[0] == 0
    code, text, err = run_main(["apply", "--graph", str(graph), str(out / "plan.json")], capsys)
    assert code == 0, err
    after = int(re.search(r"collectives after\s+(\d+)", text).group(1))
    assert after == planner.collectives_after(problem, plan) < len(problem.collectives)


def _factory_calls(text: str) -> dict[str, int]:
    """Factory calls by op, counted in the file's forward (``torch.ops.aten.NAME.overload(``)."""
    return {op: n for op in FACTORIES if (n := len(re.findall(rf"torch\.ops\.aten\.{op}\.\w+\(", text)))}


@pytest.mark.parametrize("name", ["fw_scalar_index.py", "bw_empty_cuda.py", "autoparallel_2d.py"])
def test_every_tensor_the_graph_makes_is_a_node_on_fake_cpu_tensors_of_the_trace(name):
    """A factory of a CUDA run's graph (empty.memory_format on device(type='cuda', index=0), a 0-d
    full on the CPU that index_put takes, arange on 'cuda:0', ...) is a node of the traced graph
    whose value is a fake CPU tensor of the trace's own FakeTensorMode -- never a constant baked
    in while the file was read, never a real tensor."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensor

    from fxglue.graph_file import load_graph

    graph = DATA / name
    expected = _factory_calls(graph.read_text())
    assert expected  # the corpus file makes tensors inside its graph
    traced = load_graph(graph)
    made = {}
    for n in traced.gm.graph.nodes:
        if n.op == "call_function" and getattr(n.target, "_opname", None) in FACTORIES:
            made[n.target._opname] = made.get(n.target._opname, 0) + 1
            val = n.meta["val"]
            assert isinstance(val, FakeTensor) and val.fake_mode is traced.fake_mode, n.name
            assert val.device == torch.device("cpu") and str(n.kwargs.get("device", "cpu")) == "cpu", n.name
    assert made == expected
    assert not [n for n in traced.gm.graph.nodes if n.op == "get_attr"]  # nothing baked in as a constant


def test_the_scalar_index_put_takes_is_made_in_the_graph_as_an_int64_fake_scalar():
    """AutoParallel's embedding mask: index_put of a 0-d int64 ``full`` made on the CPU."""
    import torch

    from fxglue.graph_file import load_graph

    traced = load_graph(DATA / "autoparallel_2d.py")
    puts = [n for n in traced.gm.graph.nodes if n.target is torch.ops.aten.index_put.default]
    assert len(puts) == 2
    values = [n.args[2] for n in puts]
    assert all(v.target is torch.ops.aten.full.default for v in values)
    assert [(tuple(v.meta["val"].shape), v.meta["val"].dtype) for v in values] == [((), torch.int64),
                                                                                  ((), torch.bfloat16)]
    mask = puts[0].args[1][0].meta["val"]
    assert mask.dtype == torch.bool and tuple(mask.shape) == (2, 256)


def test_device_literals_in_every_form_are_mapped_to_the_cpu(tmp_path):
    """A torch.device of any index, a device string given by keyword or in a position whose schema
    says Device, and a torch-level factory's device= string."""
    import torch

    from fxglue.graph_file import load_graph

    path = tmp_path / "devices.py"
    path.write_text(
        "import torch\nfrom torch import device\nclass Repro(torch.nn.Module):\n"
        "    def forward(self, a):\n"
        "        ag = torch.ops._c10d_functional.all_gather_into_tensor.default(a, 4, 'g')\n"
        "        x = torch.ops._c10d_functional.wait_tensor.default(ag)\n"
        "        y = torch.ops.aten.to.device(x, 'cuda:2', torch.bfloat16)\n"
        "        z = torch.ops.aten._to_copy.default(y, dtype = torch.float32, device = device(type='cuda', index=3))\n"
        "        e = torch.empty(16, 4, device='cuda')\n"
        "        o = torch.ops.aten.ones.default([16, 4], device = 'cuda:1', pin_memory = False)\n"
        "        return (z + e + o,)\n"
        "def load_args(reader):\n    reader.tensor(reader.storage(None, 64, device='cuda:0'), (4, 4))\n"
        "def get_pg_config():\n    return {'g': 4}\n")
    traced = load_graph(path)
    assert traced.meta["devices_mapped"] == 4
    devices = {str(n.meta["val"].device) for n in traced.gm.graph.nodes if isinstance(n.meta.get("val"), torch.Tensor)}
    assert devices == {"cpu"}


def _line_of(text: str, start: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if line.strip().startswith(start))


def test_a_graph_that_does_not_trace_names_its_node_and_op_in_one_line(tmp_path, capsys):
    """A bool mask selecting rows (data-dependent length): one line naming the node as the file
    names it, its op and its line; exit 2; nothing written."""
    graph = DATA / "untraceable_bool_index.py"
    line = _line_of(graph.read_text(), "index_1 = ")
    out = tmp_path / "o"
    code, _, err = run_main(["extract", "--graph", str(graph), "-o", str(out), "-q"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert f"does not trace on fake CPU tensors: node index_1 (aten.index.Tensor, line {line}): " in err, err
    assert not out.exists()


def test_an_error_raised_in_the_graphs_own_code_is_one_line_too(tmp_path, capsys):
    """torch prints a GraphModule's generated code to stderr when its own code raises (here an
    index past a split's pieces); the refusal stays one line naming the node."""
    path = tmp_path / "getitem.py"
    path.write_text(
        "import torch\nclass Repro(torch.nn.Module):\n    def forward(self, a):\n"
        "        ag = torch.ops._c10d_functional.all_gather_into_tensor.default(a, 4, 'g')\n"
        "        x = torch.ops._c10d_functional.wait_tensor.default(ag)\n"
        "        split = torch.ops.aten.split.Tensor(x, 8)\n"
        "        getitem_5 = split[5]\n"
        "        return (getitem_5,)\n"
        "def load_args(reader):\n    reader.tensor(reader.storage(None, 64), (4, 4))\n"
        "def get_pg_config():\n    return {'g': 4}\n")
    code, _, err = run_main(["extract", "--graph", str(path), "-o", str(tmp_path / "o"), "-q"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "node getitem_5 (getitem, line 7): IndexError: " in err, err


def test_a_graph_files_numbered_groups_load_after_a_2d_mesh_left_the_same_names():
    """Group names are often '0' and '1': an earlier trace's 2-D mesh of the same world size left
    '1' registered at another size; the file still reads as it says, and a mesh made afterwards
    gets names of its own. In a process of its own: it starts the fake world afresh."""
    from tests.support import run_script

    run = run_script("numbered_groups", DATA / "autoparallel_2d.py")
    assert run.returncode == 0, run.stderr
    # the mesh's data-parallel group of 4 took the name '1'; the file's '0' and '1' are its 8 ranks
    assert run.stdout.split() == ["4", "8", "8", "False"], run.stdout


# ---------------------------------------------------------------------------------------
# AutoParallel's collectives table
# ---------------------------------------------------------------------------------------


def _expected_points(table: Path, group: str, size: int) -> dict[str, list[tuple[int, float]]]:
    """(wire bytes, ms) per kind for one group of the table: the column is the input tensor in MiB,
    which for an all_gather is the shard (its wire bytes are the group's size times that)."""
    sizes, rows = _table(table)
    out = {}
    for kind, op in KIND_OPS.items():
        if (group, size, op) in rows:
            per = size if kind == "all_gather" else 1
            out[kind] = [(mb * per << 20, ms) for mb, ms in zip(sizes, rows[(group, size, op)])]
    return out


def test_the_tables_all_gather_column_is_its_input_the_shard():
    """The reading the pricing rests on, checked on the table itself: an all_gather of X MB of
    input moves what a reduce_scatter of the group's size times X MB does, and the table says
    they cost the same."""
    sizes, rows = _table(DATA / "autoparallel_2d.table")
    for group in ("0", "1"):
        ag, rs = rows[(group, 8, "all_gather_into_tensor")], rows[(group, 8, "reduce_scatter_tensor")]
        for i, mb in enumerate(sizes):
            if 8 * mb in sizes:
                assert ag[i] == pytest.approx(rs[sizes.index(8 * mb)], rel=1e-3), (group, mb)


def test_a_graph_naming_its_table_is_priced_by_it_with_no_flag(tmp_path, capsys, monkeypatch):
    """AutoParallel's repro file names its table relative to itself; extracting it from another
    directory with no flag prices every group and kind the table has at the table's own numbers
    (within 1%), torch's scheduler by the same curve, and says which groups it priced."""
    monkeypatch.chdir(tmp_path)  # the table is found beside the graph, not in the working directory
    graph = DATA / "autoparallel_2d.py"
    code, _, err = run_main(["extract", "--graph", str(graph), "-o", "out"], capsys)
    assert code == 0, err
    problem = planner.load_problem(tmp_path / "out" / "problem.json")
    table = DATA / "autoparallel_2d.table"
    for pg in ("0", "1"):
        link = problem.link(pg)
        expected = _expected_points(table, pg, 8)
        assert set(expected) == ({"all_gather", "reduce_scatter"} if pg == "0" else set(KIND_OPS))
        for kind, points in expected.items():
            for nbytes, ms in points:
                assert link.time_ms(kind, nbytes) == pytest.approx(ms, rel=0.01), (pg, kind, nbytes)
        notes = [line for line in err.splitlines() if re.match(rf"note: group {pg} \(\d+ ranks, \d+ per node\) priced by ", line)]
        assert len(notes) == 1 and str(table) in notes[0], err
    for c in problem.collectives:
        assert c.est_ms == pytest.approx(problem.link(c.pg).time_ms(c.kind, c.wire_bytes), rel=1e-6), c.name
    # group '0' has no all_reduce row: the model it had stays (the graph has no such all_reduce)
    assert "all_reduce: dp: torch" in problem.link("0").hardware
    assert problem.meta["collectives_table"] == str(table)


def test_the_table_is_accepted_by_collectives_and_wins_over_the_files_own(tmp_path, capsys):
    """The same format given with --collectives, for a graph that names its own table: the flag's
    rows price what they cover (group '1''s all_reduce here), the file's table the rest."""
    sizes, _ = _table(DATA / "autoparallel_2d.table")
    ours = [round(0.5 + 0.01 * mb, 4) for mb in sizes]
    text = (DATA / "autoparallel_2d.table").read_text().splitlines()
    flag = tmp_path / "mine.table"
    flag.write_text("\n".join(text[:2] + ["      1             8  all_reduce  " + "  ".join(map(str, ours))]) + "\n")
    code, _, err = run_main(["extract", "--graph", str(DATA / "autoparallel_2d.py"), "--collectives", str(flag),
                            "-o", str(tmp_path / "out"), "-q"], capsys)
    assert code == 0, err
    problem = planner.load_problem(tmp_path / "out" / "problem.json")
    for mb, ms in zip(sizes, ours):
        assert problem.link("1").time_ms("all_reduce", mb << 20) == pytest.approx(ms, rel=0.01)
    for nbytes, ms in _expected_points(DATA / "autoparallel_2d.table", "1", 8)["reduce_scatter"]:
        assert problem.link("1").time_ms("reduce_scatter", nbytes) == pytest.approx(ms, rel=0.01)


def test_collectives_takes_the_table_for_a_built_in_workload_by_group_name_and_size(tmp_path, capsys):
    """llama3-8b-fsdp-2 on h100-8nodes has one group, '0', of 64 ranks: a row of group '0' of 64
    ranks prices it; a row of the same name at another size does not."""
    sizes = [1, 4, 16, 64, 256]
    ag = [round(0.05 + 0.2 * mb, 4) for mb in sizes]
    rs = [round(0.04 + 0.004 * mb, 4) for mb in sizes]
    head = "  Group    Group Size  Collective  " + "  ".join(f"{mb}MB (ms)" for mb in sizes)
    rule = "-------  ------------  ----------  " + "  ".join("-" * 8 for _ in sizes)
    path = tmp_path / "colls64.table"
    path.write_text("\n".join([head, rule, "0  64  all_gather_into_tensor  " + "  ".join(map(str, ag)),
                               "0  8  reduce_scatter_tensor  " + "  ".join(map(str, rs))]) + "\n")
    code, _, err = run_main(["extract", "llama3-8b-fsdp-2", "--collectives", str(path), "-o", str(tmp_path / "o")],
                            capsys)
    assert code == 0, err
    link = planner.load_problem(tmp_path / "o" / "problem.json").link("0")
    for mb, ms in zip(sizes, ag):
        assert link.time_ms("all_gather", (mb << 20) * 64) == pytest.approx(ms, rel=0.01)
    assert "reduce_scatter, all_reduce: dp: torch" in link.hardware  # the 8-rank row is another group
    assert re.search(r"^note: group 0 \(64 ranks, 8 per node\) priced by all_gather measured \(.*colls64\.table:3: 5 sizes", err, re.M), err


BAD_TABLES = {
    "header": ("Group  Size  Collective  1MB (ms)\n---\n0 8 all_reduce 0.1\n", ":1: a collectives table's header"),
    "unit": ("Group  Group Size  Collective  1MB (us)  2MB (us)\n---\n0 8 all_reduce 10 20\n", ":1: column 1MB is in us"),
    "column": ("Group  Group Size  Collective  1MB (ms)  2GB (ms)\n---\n0 8 all_reduce 1 2\n", ":1: header word '2GB'"),
    "no_rule": ("Group  Group Size  Collective  1MB (ms)\n0 8 all_reduce 0.1\n", ":2: the line under the header"),
    "fields": ("Group  Group Size  Collective  1MB (ms)  2MB (ms)\n-- --\n0 8 all_reduce 0.1\n", ":3: 4 field(s)"),
    "collective": ("Group  Group Size  Collective  1MB (ms)\n---\n0 8 all_to_all 0.1\n", ":3: collective 'all_to_all'"),
    "size": ("Group  Group Size  Collective  1MB (ms)\n---\n0 eight all_reduce 0.1\n", ":3: group size 'eight'"),
    "zero_ranks": ("Group  Group Size  Collective  1MB (ms)\n---\n0 0 all_reduce 0.1\n", ":3: group size '0'"),
    "time": ("Group  Group Size  Collective  1MB (ms)  2MB (ms)\n---\n0 8 all_reduce 0.1 nan\n", ":3: time at 2MB"),
    "twice": ("Group  Group Size  Collective  1MB (ms)\n---\n0 8 all_reduce 0.1\n0 8 all_reduce 0.2\n",
              ":4: group 0 of 8 ranks: all_reduce is also given on"),
    "falling": ("Group  Group Size  Collective  1MB (ms)  2MB (ms)\n---\n0 8 all_reduce 0.2 0.1\n",
                "cannot be extended above it"),
    "empty_body": ("Group  Group Size  Collective  1MB (ms)\n---\n", "no rows under the header"),
}


@pytest.mark.parametrize("name", sorted(BAD_TABLES))
def test_a_bad_table_is_one_line_naming_file_and_line_exit_2(tmp_path, capsys, name):
    text, named = BAD_TABLES[name]
    path = tmp_path / f"{name}.table"
    path.write_text(text)
    code, _, err = run_main(["extract", "llama3-8b-fsdp-2", "--collectives", path, "-o", tmp_path / "o", "-q"],
                            capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert str(path) in err and named in err, err
    assert not (tmp_path / "o").exists()


def test_a_graph_files_bad_table_is_one_line_naming_graph_table_and_line(tmp_path, capsys):
    graph = tmp_path / "g.py"
    graph.write_text((DATA / "autoparallel_2d.py").read_text().replace('"autoparallel_2d.table"', '"bad.table"'))
    (tmp_path / "bad.table").write_text("Group  Group Size  Collective  1MB (ms)\n---\n0 8 all_to_all 0.1\n")
    code, _, err = run_main(["extract", "--graph", str(graph), "-o", str(tmp_path / "o"), "-q"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert (f"{graph}: get_colls_estimations_file() names 'bad.table': {tmp_path / 'bad.table'}:3: collective "
            "'all_to_all'") in err, err
    assert not (tmp_path / "o").exists()


def _copied_alone(tmp_path: Path) -> tuple[Path, Path]:
    """AutoParallel's repro file copied without the table it names; (the copy, where it looks)."""
    graph = tmp_path / "autoparallel_2d.py"
    graph.write_text((DATA / "autoparallel_2d.py").read_text())
    return graph, tmp_path / "autoparallel_2d.table"


def _missing_table_warning(err: str, graph: Path, table: Path) -> None:
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert warnings == [f"warning: {graph}: get_colls_estimations_file() names {table}, which is not there; its "
                        "groups are priced by --collectives or --profile where given, else by the cluster preset's "
                        "model"], err


def test_a_graph_whose_table_is_not_beside_it_is_priced_as_one_naming_none_with_a_warning(tmp_path, capsys):
    """A repro file copied alone plans with no edit: a warning names the table it looked for, the
    problem records it, and the problem is the one the same graph naming no table gives (same
    fingerprint: same graph, schedule and costs)."""
    graph, table = _copied_alone(tmp_path)
    code, _, err = run_main(["extract", "--graph", str(graph), "-o", str(tmp_path / "out")], capsys)
    assert code == 0 and "Traceback" not in err, err
    _missing_table_warning(err, graph, table)
    assert not re.search(r"^note: group", err, re.M), err  # no measurement priced a group
    problem = planner.load_problem(tmp_path / "out" / "problem.json")
    assert problem.meta["collectives_table_missing"] == str(table) and "collectives_table" not in problem.meta
    plain = tmp_path / "plain" / "autoparallel_2d.py"
    plain.parent.mkdir()
    plain.write_text(graph.read_text().split("def get_colls_estimations_file")[0])
    code, _, err = run_main(["extract", "--graph", str(plain), "-o", str(tmp_path / "plain_out"), "-q"], capsys)
    assert code == 0 and not err.strip(), err
    assert planner.load_problem(tmp_path / "plain_out" / "problem.json").fingerprint == problem.fingerprint


def test_collectives_prices_a_graph_whose_own_table_is_not_beside_it(tmp_path, capsys):
    """The table given with --collectives instead: every group and kind it has priced at its own numbers."""
    graph, table = _copied_alone(tmp_path)
    given = DATA / "autoparallel_2d.table"
    code, _, err = run_main(["extract", "--graph", str(graph), "--collectives", str(given), "-o",
                            str(tmp_path / "out")], capsys)
    assert code == 0 and "Traceback" not in err, err
    _missing_table_warning(err, graph, table)
    problem = planner.load_problem(tmp_path / "out" / "problem.json")
    for pg in ("0", "1"):
        for kind, points in _expected_points(given, pg, 8).items():
            for nbytes, ms in points:
                assert problem.link(pg).time_ms(kind, nbytes) == pytest.approx(ms, rel=0.01), (pg, kind, nbytes)
        notes = [line for line in err.splitlines() if re.match(rf"note: group {pg} \(\d+ ranks, \d+ per node\) priced by ", line)]
        assert len(notes) == 1 and str(given) in notes[0], err


@pytest.mark.long
def test_a_saved_32_layer_step_reads_back_from_its_graph_file(tmp_path, capsys):
    """The large case: llama3-8b-fsdp-32 (872 collectives, 8364 scheduled nodes) written with
    --save-graph and its device literals turned into a CUDA run's, extracted back with --graph to
    the same problem (measured: 20 s each on 2 shared cores, trace 9 s)."""
    saved = tmp_path / "step.py"
    code, _, err = run_main(["extract", "llama3-8b-fsdp-32", "-o", tmp_path / "a", "--save-graph", saved, "-q"],
                            capsys)
    assert code == 0, err
    cuda = tmp_path / "step_cuda.py"
    cuda.write_text(saved.read_text().replace("device(type='cpu')", "device(type='cuda', index=0)"))
    code, _, err = run_main(["extract", "--graph", str(cuda), "-o", str(tmp_path / "b"), "-q"], capsys)
    assert code == 0, err
    a, b = (planner.load_problem(tmp_path / d / "problem.json") for d in "ab")
    assert len(a.collectives) == len(b.collectives) == 872
    assert a.fingerprint == b.fingerprint
