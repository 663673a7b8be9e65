"""Graphs from anywhere (``fxglue.graph_file``, ``--graph`` / ``--save-graph``): torch's repro
format read back to the very problem a built-in workload or factory gives, forward-only and
backward-only graphs as a compile produces them planned from the command line, an external-style
file (cuda device literals, its own group names and ``get_pg_config``) priced by a measured table
through public API only, and every file that cannot be planned refused in one line."""

from __future__ import annotations

import io
import json
import re

import pytest

import planner
from bucketplan_cli import main as cli

TINY = "tests/data/tiny_factory.py:build"


def _run(argv, capsys):
    code = cli(argv)
    out, err = capsys.readouterr()
    return code, out, err


def _fingerprint(folder) -> str:
    return json.loads((folder / "problem.json").read_text())["fingerprint"]


@pytest.mark.parametrize("workload", [["llama3-8b-fsdp-2"], ["--model", TINY]], ids=["builtin", "factory"])
def test_save_graph_then_graph_gives_the_same_problem(tmp_path, capsys, workload):
    saved = tmp_path / "step.py"
    code, _, err = _run(["extract", *workload, "-o", str(tmp_path / "a"), "--save-graph", str(saved), "-q"], capsys)
    assert code == 0, err
    text = saved.read_text()
    assert "class Repro(torch.nn.Module)" in text and "def load_args(reader)" in text and "def get_pg_config" in text
    code, out, err = _run(["extract", "--graph", str(saved), "-o", str(tmp_path / "b"), "-q"], capsys)
    assert code == 0, err
    assert "graph:step.py" in out
    assert _fingerprint(tmp_path / "a") == _fingerprint(tmp_path / "b")


def _compile_graphs(tmp_path) -> dict[str, object]:
    """The forward and the backward graph AOT autograd gives the tiny factory under SimpleFSDP, each
    written by torch's own ``save_graph_repro``, as a compile's dump would be."""
    import torch
    from torch._dynamo.repro.after_aot import save_graph_repro
    from torch._functorch.aot_autograd import aot_function
    from torch._functorch.partitioners import default_partition
    from torch._subclasses.fake_tensor import FakeTensorMode

    from fxglue.models import parallel
    from fxglue.models.custom import factory_workload
    from fxglue.models.workloads import ensure_fake_world, mesh_groups, prepare

    ensure_fake_world(8)
    wl = factory_workload(TINY, "fsdp", None)
    groups = mesh_groups("fsdp", 8)
    paths = {}

    def writer(kind):
        def compiler(gm, example_inputs):
            buf = io.StringIO()
            save_graph_repro(buf, gm, example_inputs, "inductor")
            paths[kind] = tmp_path / f"{kind}.py"
            paths[kind].write_text(buf.getvalue())
            return gm
        return compiler

    with FakeTensorMode():
        wrapped, _, inputs = prepare(wl, groups)
        _, _, loss_fn = wl.build(groups)
        names = wrapped.param_names

        def loss(*args):
            return parallel._call(wrapped.module, dict(zip(names, args[:len(names)])), loss_fn, args[len(names):])

        step = aot_function(loss, fw_compiler=writer("forward"), bw_compiler=writer("backward"),
                            partition_fn=default_partition)
        step(*parallel.stored_params(wrapped), *inputs).backward()
    assert torch.distributed.is_initialized()
    return paths


@pytest.mark.filterwarnings("ignore:Your compiler for AOTAutograd:UserWarning")
def test_forward_only_and_backward_only_graphs_are_planned_from_the_cli(tmp_path, capsys):
    paths = _compile_graphs(tmp_path)
    for kind, only in (("forward", "all_gather"), ("backward", "reduce_scatter")):
        out = tmp_path / kind
        code, text, err = _run(["extract", "--graph", str(paths[kind]), "-o", str(out), "-q"], capsys)
        assert code == 0, err
        problem = planner.load_problem(out / "problem.json")
        assert {c.kind for c in problem.collectives} == {only} and len(problem.collectives) > 2
        code, _, err = _run(["solve", str(out / "problem.json"), "-o", str(out / "plan.json"), "--time-limit", "5",
                             "-q"], capsys)
        assert code == 0, err
        plan = planner.load_plan(out / "plan.json")
        assert not planner.verify(problem, plan)
        assert _run(["verify", str(out / "problem.json"), str(out / "plan.json")], capsys)[0] == 0
        code, text, err = _run(["apply", "--graph", str(paths[kind]), str(out / "plan.json")], capsys)
        assert code == 0, err
        after = int(re.search(r"collectives after\s+(\d+)", text).group(1))
        assert after == planner.collectives_after(problem, plan) < len(problem.collectives)


def _external_file(tmp_path, capsys):
    """llama3-8b-fsdp-2's step as another tool might dump it: cuda device literals, a group named
    ``dp_shard`` of 64 ranks, 8 per node, declared by its own ``get_pg_config``; no blocks."""
    code, _, err = _run(["extract", "llama3-8b-fsdp-2", "-o", str(tmp_path / "own"), "--save-graph",
                         str(tmp_path / "own.py"), "-q"], capsys)
    assert code == 0, err
    text = (tmp_path / "own.py").read_text()
    assert text.count("device(type='cpu')") > 0 and text.count(", '0')") > 0
    text = text.replace("device(type='cpu')", "device(type='cuda', index=0)").replace(", '0')", ", 'dp_shard')")
    text = re.sub(r"# bucketplan:.*?\nbucketplan_workload = .*?\n", "", text, flags=re.S)  # none of our additions
    text = text.replace("setup_fake_process_groups({'0'", "setup_fake_process_groups({'dp_shard'")
    text += "\n\ndef get_pg_config():\n    return {'dp_shard': {'size': 64, 'rank': 0, 'ranks_per_node': 8}}\n"
    assert "bucketplan" not in text
    path = tmp_path / "external.py"
    path.write_text(text)
    return path


def test_an_external_repro_is_planned_with_a_measured_table_through_public_api(tmp_path, capsys):
    from fxglue.graph_file import GraphFile
    from fxglue.pipeline import prepare
    from fxglue.presets import get_preset, with_measurements

    path = _external_file(tmp_path, capsys)
    points = {"all_gather": [(1 << 10, 0.031), (1 << 20, 0.120), (1 << 24, 1.900)],
              "reduce_scatter": [(1 << 10, 0.029), (1 << 20, 0.118), (1 << 24, 1.850)]}
    table = tmp_path / "measured.csv"
    table.write_text("kind,group,ranks_per_node,bytes,ms\n" + "".join(
        f"{kind},64,8,{b},{ms}\n" for kind, pts in points.items() for b, ms in pts))
    preset = with_measurements(get_preset("h100-8nodes"), [table])
    prepared = prepare(GraphFile(str(path)), preset=preset)
    problem = prepared.problem
    assert problem.meta["devices_mapped"] > 0 and problem.meta["graph_groups"] == {"dp_shard": {"size": 64, "role": "dp"}}
    (link,) = problem.links
    assert link.pg == "dp_shard" and link.group_size == 64
    for kind, pts in points.items():
        for nbytes, ms in pts:
            assert link.time_ms(kind, nbytes) == pytest.approx(ms, rel=5e-3), (kind, nbytes)
    # torch's scheduler was priced by the same table: the problem's collectives cost what the link says
    for c in problem.collectives:
        assert c.est_ms == pytest.approx(link.time_ms(c.kind, c.wire_bytes), rel=1e-6), c.name
    result = planner.solve(problem, time_limit_s=5)
    assert not planner.verify(problem, result.plan)


@pytest.mark.parametrize("name, text, argv, named", [
    ("missing.py", None, [], "no such file"),
    ("broken.py", "class Repro(\n", [], "does not load: SyntaxError"),
    ("plain.py", "x = 1\n", [], "not a repro file"),
    ("nocoll.py", "import torch\nclass Repro(torch.nn.Module):\n    def forward(self, a):\n"
     "        return (torch.ops.aten.mm.default(a, a),)\n"
     "def load_args(reader):\n    reader.tensor(reader.storage(None, 64), (4, 4))\n", [], "no collectives"),
    ("nogroup.py", "import torch\nclass Repro(torch.nn.Module):\n    def forward(self, a):\n"
     "        ag = torch.ops._c10d_functional.all_gather_into_tensor.default(a, 4, 'mystery')\n"
     "        return (torch.ops._c10d_functional.wait_tensor.default(ag),)\n"
     "def load_args(reader):\n    reader.tensor(reader.storage(None, 64), (4, 4))\n", [], "group 'mystery'"),
    ("nogroup.py", None, ["--group", "mystery=4:pp"], "role 'pp'"),
    ("nogroup.py", None, ["--group", "mystery"], "NAME=SIZE"),
    ("nogroup.py", None, ["--group", "other=4"], "give --group mystery=SIZE"),
])
def test_a_graph_file_that_cannot_be_planned_is_one_line_exit_2(tmp_path, capsys, name, text, argv, named):
    if text is not None:
        (tmp_path / name).write_text(text)
    elif name != "missing.py":
        (tmp_path / name).write_text(
            "import torch\nclass Repro(torch.nn.Module):\n    def forward(self, a):\n"
            "        ag = torch.ops._c10d_functional.all_gather_into_tensor.default(a, 4, 'mystery')\n"
            "        return (torch.ops._c10d_functional.wait_tensor.default(ag),)\n"
            "def load_args(reader):\n    reader.tensor(reader.storage(None, 64), (4, 4))\n")
    out = tmp_path / "out"
    code, _, err = _run(["extract", "--graph", str(tmp_path / name), *argv, "-o", str(out), "-q"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and named in err and "Traceback" not in err, err
    assert not out.exists()


_ONE_GATHER = (
    "import torch\nclass Repro(torch.nn.Module):\n    def forward(self, a, w):\n"
    "        ag = torch.ops._c10d_functional.all_gather_into_tensor.default(a, 4, 'mystery')\n"
    "        x = torch.ops._c10d_functional.wait_tensor.default(ag)\n"
    "        return (torch.ops.aten.mm.default(x, w),)\n"
    "def load_args(reader):\n    reader.tensor(reader.storage(None, 64), (4, 4))\n"
    "    reader.tensor(reader.storage(None, 64), (4, 4))\n")
_GROUPED = _ONE_GATHER + "def get_pg_config():\n    return {'mystery': 4}\n"


def test_a_graph_with_groups_from_flags_plans_and_check_refuses_it(tmp_path, capsys):
    path = tmp_path / "g.py"
    path.write_text(_ONE_GATHER)
    code, out, err = _run(["extract", "--graph", str(path), "--group", "mystery=4@1", "-o", str(tmp_path / "o"), "-q"],
                          capsys)
    assert code == 0, err
    assert "pg mystery (4 ranks)" in out and "1 per node" in out
    code, out, err = _run(["compare", "--graph", str(path), "--group", "mystery=4@1", "--time-limit", "1",
                           "-o", str(tmp_path / "c"), "-q"], capsys)
    assert code == 0, err
    table = (tmp_path / "c" / "compare.md").read_text()
    assert "| graph:g.py | h100-8nodes | 6 | 1 | torch default" in table and "(step, free positions)" in table
    code, _, err = _run(["check", "--graph", str(path)], capsys)
    assert code == 2 and "a --graph file holds no module to run" in err
    code, _, err = _run(["extract", "llama3-8b-fsdp-2", "--group", "x=2", "-o", str(tmp_path / "p")], capsys)
    assert code == 2 and "--group names the process groups of a --graph file" in err


def test_a_sweep_case_plans_a_graph_file(tmp_path, capsys):
    (tmp_path / "g.py").write_text(_GROUPED)
    (tmp_path / "spec.toml").write_text('[[case]]\ngraph = "g.py"\nobjectives = ["step"]\ntime_limit_s = 2\n')
    code, _, err = _run(["sweep", str(tmp_path / "spec.toml"), "-o", str(tmp_path / "out"), "--sequential", "-q"],
                        capsys)
    assert code == 0, err
    results = (tmp_path / "out" / "results.md").read_text()
    assert "graph-g" in results
    (tmp_path / "bad.toml").write_text('[[case]]\ngraph = "g.py"\nranks = [8]\n')
    code, _, err = _run(["sweep", str(tmp_path / "bad.toml"), "-o", str(tmp_path / "bad"), "--sequential"], capsys)
    assert code == 2 and "ranks: a graph file carries its groups" in err and len(err.strip().splitlines()) == 1
