"""Graphs from anywhere (``fxglue.graph_file``, ``--graph`` / ``--save-graph``): torch's repro
format read back to the very problem a built-in workload or factory gives, forward-only and
backward-only graphs as a compile produces them planned from the command line, an external-style
file (cuda device literals, its own group names and ``get_pg_config``) priced by a measured table
through public API only, the state torch's writer emits for a GPU graph planned on the CPU, and
every file that cannot be planned refused in one line -- one that loops (even past a defeated
alarm), exits, raises a BaseException or moves the working directory included, its code being run
contained -- and what a file changes in the process (signal handlers, timers, standard streams,
builtins) put back, so the command's output and a later Ctrl-C work as without it."""

from __future__ import annotations

import io
import json
import re

import pytest

import planner
from tests.support import run_main

pytestmark = pytest.mark.slow  # traces graph files

TINY = "tests/data/tiny_factory.py:build"


def _fingerprint(folder) -> str:
    return json.loads((folder / "problem.json").read_text())["fingerprint"]


@pytest.mark.parametrize("workload", [["llama3-8b-fsdp-2"], ["--model", TINY]], ids=["builtin", "factory"])
def test_save_graph_then_graph_gives_the_same_problem(tmp_path, capsys, workload):
    saved = tmp_path / "step.py"
    code, _, err = run_main(["extract", *workload, "-o", str(tmp_path / "a"), "--save-graph", str(saved), "-q"], capsys)
    assert code == 0, err
    text = saved.read_text()
    assert "class Repro(torch.nn.Module)" in text and "def load_args(reader)" in text and "def get_pg_config" in text
    code, out, err = run_main(["extract", "--graph", str(saved), "-o", str(tmp_path / "b"), "-q"], capsys)
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
        code, text, err = run_main(["extract", "--graph", str(paths[kind]), "-o", str(out), "-q"], capsys)
        assert code == 0, err
        problem = planner.load_problem(out / "problem.json")
        assert {c.kind for c in problem.collectives} == {only} and len(problem.collectives) > 2
        code, _, err = run_main(["solve", str(out / "problem.json"), "-o", str(out / "plan.json"), "--time-limit", "5",
                                "-q"], capsys)
        assert code == 0, err
        plan = planner.load_plan(out / "plan.json")
        assert not planner.verify(problem, plan)
        assert run_main(["verify", str(out / "problem.json"), str(out / "plan.json")], capsys)[0] == 0
        code, text, err = run_main(["apply", "--graph", str(paths[kind]), str(out / "plan.json")], capsys)
        assert code == 0, err
        after = int(re.search(r"collectives after\s+(\d+)", text).group(1))
        assert after == planner.collectives_after(problem, plan) < len(problem.collectives)


def _external_file(tmp_path, capsys):
    """llama3-8b-fsdp-2's step as another tool might dump it: cuda device literals, a group named
    ``dp_shard`` of 64 ranks, 8 per node, declared by its own ``get_pg_config``; no blocks."""
    code, _, err = run_main(["extract", "llama3-8b-fsdp-2", "-o", str(tmp_path / "own"), "--save-graph",
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
    result = planner.solve(problem, planner.SolveOptions(time_limit_s=5))
    assert not planner.verify(problem, result.plan)


def _file(*, init: str = "", extra: str = "", load: str = "", pg: str = "    return {'mystery': 4}\n", top: str = "",
          shapes: tuple[str, str] = ("(4, 4)", "(4, 4)")) -> str:
    """A one-gather graph file in torch's repro format, with code put in its ``__init__``, its
    forward, its ``load_args``, its ``get_pg_config`` and at its top level."""
    return ("import torch\nfrom torch import tensor, device\nclass Repro(torch.nn.Module):\n"
            f"    def __init__(self):\n        super().__init__()\n{init}"
            "    def forward(self, a, w):\n"
            "        ag = torch.ops._c10d_functional.all_gather_into_tensor.default(a, 4, 'mystery')\n"
            f"        x = torch.ops._c10d_functional.wait_tensor.default(ag)\n{extra}"
            "        return (torch.ops.aten.mm.default(x, w),)\n"
            f"def load_args(reader):\n{load}    reader.tensor(reader.storage(None, 64), {shapes[0]})\n"
            f"    reader.tensor(reader.storage(None, 64), {shapes[1]})\n"
            f"def get_pg_config():\n{pg}{top}")


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
    # a group sized otherwise than its collectives say: the graph's shapes are those of 4 ranks
    ("nogroup.py", None, ["--group", "mystery=8"],
     "collective 'all_gather_into_tensor_default' runs on group 'mystery' of 4 ranks, but --group sizes that group 8"),
    ("size8.py", _file(pg="    return {'mystery': 8}\n"), [],
     "collective 'all_gather_into_tensor_default' runs on group 'mystery' of 4 ranks, but get_pg_config() sizes"),
    ("disagree.py", _file(extra="        ag2 = torch.ops._c10d_functional.all_gather_into_tensor.default(w, 2, "
                                "'mystery')\n        x = torch.ops._c10d_functional.wait_tensor.default(ag2)\n"), [],
     "group 'mystery' disagree on its size: 'all_gather_into_tensor_default' gives 4 ranks, "
     "'all_gather_into_tensor_default_1' 2"),
    ("sizetrue.py", _file(pg="    return {'mystery': True}\n"), [], "group 'mystery': {'size': True} is not"),
    ("sizehuge.py", _file(pg="    return {'mystery': {'size': 10**12}}\n"), [], "{'size': 1000000000000} is not"),
    ("nogroup.py", None, ["--group", "mystery=99999999999999999999"], "more than 1048576 ranks"),
    # a layout that cannot be: ranks per node that do not divide the group, or more of them than it has
    ("nogroup.py", None, ["--group", "mystery=4@3"], "--group 'mystery=4@3': 4 ranks do not fill whole nodes of 3"),
    ("nogroup.py", None, ["--group", "mystery=4@8"],
     "--group 'mystery=4@8': 8 ranks per node, more than the group's 4"),
    ("pernode.py", _file(pg="    return {'mystery': {'size': 4, 'ranks_per_node': 3}}\n"), [],
     "get_pg_config(): group 'mystery': 4 ranks do not fill whole nodes of 3"),
    # figures beyond what a problem records: named where the graph says them, or where they are priced
    ("huge.py", _file(shapes=("(4, 1 << 30)", "(1 << 30, 1 << 30)")), [], "load_args: input 1: shape "
     "(1073741824, 1073741824) of float32 is 4.61e+18 bytes"),
    ("bigconst.py", _file(init="        self.register_buffer('_tensor_constant0', torch.empty(1 << 30, 1 << 30, "
                               "device='cuda:0'))\n", extra="        x = x + self._tensor_constant0\n"), [],
     "tensor '_tensor_constant0' of the Repro module: shape"),
    ("slow.py", _file(shapes=("(300000000, 300000000)",) * 2), [],
     "collective 'all_gather_into_tensor': est_ms = 3.649e+09"),
    # Repro() as the file defines it
    ("initarg.py", _file(init="        pass\n    def __init__(self, x):\n        super().__init__()\n"), [],
     "Repro() failed: TypeError: Repro.__init__() missing 1 required positional argument"),
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
    code, _, err = run_main(["extract", "--graph", str(tmp_path / name), *argv, "-o", str(out), "-q"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and named in err and "Traceback" not in err, err
    assert not out.exists()


def test_loading_a_graph_file_says_first_that_it_runs_python(tmp_path, capsys):
    (tmp_path / "g.py").write_text(_file())
    code, _, err = run_main(["extract", "--graph", str(tmp_path / "g.py"), "-o", str(tmp_path / "o")], capsys)
    assert code == 0, err
    assert re.search(rf"^\[ *[\d.]+s\] note: {re.escape(str(tmp_path / 'g.py'))} is Python: running it \(its code runs "
                     r"with your permissions\)$", err.splitlines()[0]), err


@pytest.mark.parametrize("where", ["top", "init", "load"])
def test_a_graph_file_that_never_returns_is_stopped_at_the_time_limit(tmp_path, capsys, monkeypatch, where):
    import signal

    from tests.bounded import bounded

    loop = {"top": "while True:\n    pass\n", "init": "        while True:\n            pass\n",
            "load": "    while True:\n        pass\n"}[where]
    path = tmp_path / "loops.py"
    path.write_text(_file(**{where: loop}))
    monkeypatch.setenv("BUCKETPLAN_GRAPH_LOAD_TIMEOUT_S", "1")
    with bounded(20, "loading a file that loops"):
        outer = signal.getsignal(signal.SIGALRM)
        code, _, err = run_main(["extract", "--graph", str(path), "-o", str(tmp_path / "o"), "-q"], capsys)
        # the caller's alarm and its handler are back (here: bounded's, still counting down)
        assert signal.getsignal(signal.SIGALRM) is outer and 0 < signal.getitimer(signal.ITIMER_REAL)[0] <= 20
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert f"{path}: " in err and "still ran at the time limit of 1 s (BUCKETPLAN_GRAPH_LOAD_TIMEOUT_S" in err, err


def test_a_graph_file_loads_off_the_main_thread_without_a_limit(tmp_path):
    import threading

    from fxglue.graph_file import load_graph

    (tmp_path / "g.py").write_text(_file())
    done = []
    worker = threading.Thread(target=lambda: done.append(load_graph(tmp_path / "g.py")))
    worker.start()
    worker.join(60)
    assert done and done[0].groups.dp == "mystery"


def test_the_working_directory_a_graph_file_changes_is_restored(tmp_path, capsys, monkeypatch):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "g.py").write_text(_file(top=f"import os\nos.chdir({str(elsewhere)!r})\n"))
    monkeypatch.chdir(tmp_path)
    code, _, err = run_main(["extract", "--graph", "g.py", "-o", "relout", "-q"], capsys)
    assert code == 0, err
    assert (tmp_path / "relout" / "problem.json").is_file() and not (elsewhere / "relout").exists()


@pytest.mark.parametrize("where, code, failed", [
    ("top", "import sys\nsys.exit(0)\n", "does not load"),
    ("top", "raise SystemExit\n", "does not load"),
    ("init", "        import sys\n        sys.exit(0)\n", "Repro() failed"),
    ("load", "    raise SystemExit(0)\n", "load_args(reader) failed"),
    ("pg", "    import sys\n    sys.exit(0)\n", "get_pg_config() failed"),
], ids=["sys.exit-at-import", "SystemExit-at-import", "in-Repro()", "in-load_args", "in-get_pg_config"])
def test_a_graph_file_that_exits_is_refused_in_one_line(tmp_path, capsys, where, code, failed):
    _refused_in_one_line(tmp_path, capsys, _file(**{where: code}), f"{failed}: its code exited")


def _refused_in_one_line(tmp_path, capsys, text: str, named: str) -> None:
    """extract of a graph file with ``text``: exit 2, one line naming the file and ``named``, nothing written."""
    path = tmp_path / "graph.py"
    path.write_text(text)
    out = tmp_path / "o"
    status, _, err = run_main(["extract", "--graph", str(path), "-o", str(out), "-q"], capsys)
    assert status == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert f"{path}: {named}" in err and not out.exists(), err


@pytest.mark.parametrize("name, text, named", [
    # os._exit ends the process whatever catches what: run apart, so a regression cannot end this one
    ("exits.py", _file(top="import os\nos._exit(0)\n"), "does not load: its code exited"),
    ("exits.py", _file(load="    import os\n    os._exit(0)\n"), "load_args(reader) failed: its code exited"),
    # torch logs a fake kernel's failure with its traceback; the refusal is the one line
    ("misshaped.py", _file().replace("(4, 4))\ndef get_pg_config", "(5, 5))\ndef get_pg_config"),
     "does not trace on fake CPU tensors: node mm_default (aten.mm.default, line 9): RuntimeError: a and b must "
     "have same reduction dim"),
], ids=["os._exit-at-import", "os._exit-in-load_args", "misshaped"])
def test_a_graph_file_refused_in_its_own_process_is_one_line(tmp_path, name, text, named):
    from tests.support import run_cli

    (tmp_path / name).write_text(text)
    out = tmp_path / "o"
    run = run_cli("extract", "--graph", tmp_path / name, "-o", out, "-q", timeout=120)
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert "Traceback" not in run.stderr and named in run.stderr and not out.exists(), run.stderr


def test_ctrl_c_in_a_graph_file_propagates_and_the_process_is_restored(tmp_path):
    import os
    import signal

    from fxglue.graph_file import load_graph

    path = tmp_path / "interrupted.py"
    path.write_text(_file(top="import os\nos.chdir('/')\nos.environ['BUCKETPLAN_SEEN'] = '1'\n"
                              "raise KeyboardInterrupt\n"))
    cwd, exit_, handler = os.getcwd(), os._exit, signal.getsignal(signal.SIGALRM)
    with pytest.raises(KeyboardInterrupt):
        load_graph(path)
    assert (os.getcwd(), os._exit, signal.getsignal(signal.SIGALRM)) == (cwd, exit_, handler)
    assert "BUCKETPLAN_SEEN" not in os.environ and signal.getitimer(signal.ITIMER_REAL)[0] == 0


ITIMERS = ("ITIMER_REAL", "ITIMER_VIRTUAL", "ITIMER_PROF")


def _process_state() -> tuple:
    """What a graph file's code can change for the rest of the process: the handlers of SIGINT,
    SIGTERM and SIGALRM, the signal mask, the interval timers, the standard streams, the builtins."""
    import builtins
    import signal
    import sys

    return ({s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGALRM)},
            signal.pthread_sigmask(signal.SIG_BLOCK, ()),
            [signal.getitimer(getattr(signal, t)) for t in ITIMERS],
            (sys.stdin, sys.stdout, sys.stderr), dict(vars(builtins)))


@pytest.fixture
def process_state():
    """The process state before the test; put back after it whatever the code under test left, so a
    regression fails its own test and not the rest of the run."""
    import builtins
    import signal
    import sys

    before = _process_state()
    yield before
    handlers, mask, timers, streams, names = before
    for s, h in handlers.items():
        signal.signal(s, h)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    for t, (value, interval) in zip(ITIMERS, timers):
        signal.setitimer(getattr(signal, t), value, interval)
    sys.stdin, sys.stdout, sys.stderr = streams
    for name in set(vars(builtins)) - set(names):
        delattr(builtins, name)
    vars(builtins).update(names)


# everything _process_state reads, changed by a graph file's code
HOSTILE = ("import builtins, io, signal, sys\n"
           "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
           "signal.signal(signal.SIGTERM, lambda *a: None)\n"
           "signal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
           "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})\n"
           "signal.setitimer(signal.ITIMER_PROF, 1000)\n"
           "builtins.print = lambda *a, **k: None\n"
           "builtins.bucketplan_added = 1\n"
           "del builtins.copyright\n"
           "sys.stdin, sys.stdout, sys.stderr = io.StringIO(), io.StringIO(), io.StringIO()\n")


def _indented(code: str, spaces: int) -> str:
    return "".join(" " * spaces + line + "\n" for line in code.splitlines())


@pytest.mark.parametrize("where, fails", [("top", False), ("load", False), ("init", True)],
                         ids=["at-import", "in-load_args", "in-Repro()-then-raises"])
def test_what_a_graph_file_changes_in_the_process_is_put_back(tmp_path, process_state, where, fails):
    from fxglue.graph_file import GraphFileError, load_graph

    code = HOSTILE + ("raise ValueError('after all that')\n" if fails else "")
    path = tmp_path / "hostile.py"
    path.write_text(_file(**{where: _indented(code, {"top": 0, "load": 4, "init": 8}[where])}))
    if fails:
        with pytest.raises(GraphFileError, match="Repro\\(\\) failed: ValueError: after all that"):
            load_graph(path)
    else:
        assert load_graph(path).groups.dp == "mystery"
    assert _process_state() == process_state


@pytest.mark.parametrize("top", ["import builtins\nbuiltins.print = lambda *a, **k: None\n",
                                 "import sys\nsys.stdout.close()\n",
                                 "import sys\nsys.stdout = None\n"],
                         ids=["print-replaced", "stdout-closed", "stdout-none"])
def test_the_commands_output_survives_what_a_graph_file_does_to_it(tmp_path, capsys, process_state, top):
    path = tmp_path / "g.py"
    path.write_text(_file(top=top))
    code, out, err = run_main(["extract", "--graph", str(path), "-o", str(tmp_path / "o"), "-q"], capsys)
    assert code == 0 and "Traceback" not in err, err
    assert f"wrote               {tmp_path / 'o' / 'problem.json'}" in out, out


@pytest.mark.parametrize("where, code, named", [
    ("top", "raise GeneratorExit\n", "does not load: GeneratorExit"),
    ("top", "class Stop(BaseException):\n    pass\nraise Stop('no more')\n", "does not load: Stop: no more"),
    # an exception that cannot say what it is: its type names it
    ("top", "class Odd(BaseException):\n    def __str__(self):\n        raise SystemExit\nraise Odd\n",
     "does not load: Odd"),
    ("load", "    raise GeneratorExit('closed')\n", "load_args(reader) failed: GeneratorExit: closed"),
    ("extra", "        raise BaseException('in forward')\n",
     "the Repro module does not trace: BaseException: in forward"),
], ids=["GeneratorExit", "own-BaseException", "unprintable", "in-load_args", "in-forward"])
def test_a_graph_file_raising_a_base_exception_is_refused_in_one_line(tmp_path, capsys, where, code, named):
    _refused_in_one_line(tmp_path, capsys, _file(**{where: code}), named)


# runs for 30 s unless stopped: long past the 1 s limit, and a finite test should the limit fail
SPIN = "import time\nend = time.monotonic() + 30\nwhile time.monotonic() < end:\n    pass\n"


@pytest.mark.parametrize("top, load", [
    ("import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\n" + SPIN, ""),
    ("import signal\nsignal.signal(signal.SIGALRM, lambda *a: None)\n" + SPIN, ""),
    ("import signal\nsignal.setitimer(signal.ITIMER_REAL, 0)\n" + SPIN, ""),
    ("import signal, time\nsignal.alarm(0)\ntime.sleep(30)\n", ""),  # blocked in C, not running bytecode
    ("import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\nsignal.alarm(0)\n", _indented(SPIN, 4)),
], ids=["ignored", "own-handler", "timer-cancelled", "alarm(0)-then-sleeps",
        "defeated-at-import-spins-in-load_args"])
def test_a_graph_file_that_defeats_the_alarm_is_stopped_at_the_time_limit(tmp_path, capsys, monkeypatch,
                                                                           process_state, top, load):
    import time

    path = tmp_path / "defeats.py"
    path.write_text(_file(top=top, load=load))
    monkeypatch.setenv("BUCKETPLAN_GRAPH_LOAD_TIMEOUT_S", "1")
    before, t0 = _process_state(), time.monotonic()  # the streams as capsys set them for the test's call
    code, _, err = run_main(["extract", "--graph", str(path), "-o", str(tmp_path / "o"), "-q"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert f"{path}: " in err and "still ran at the time limit of 1 s" in err, err
    assert time.monotonic() - t0 < 20  # not the 30 s the file would take
    assert _process_state() == before


def test_ctrl_c_after_a_graph_file_ignored_sigint_still_ends_the_command_with_130(tmp_path):
    """The file sets SIGINT to SIG_IGN as it loads; a Ctrl-C after the load ends the command."""
    import signal
    import subprocess
    import threading

    from tests.support import ROOT, script_argv, sigint_default

    path = tmp_path / "ignores.py"
    path.write_text(_file(top="import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"))
    proc = subprocess.Popen(script_argv("ctrl_c_after_graph_load", path, tmp_path / "o"), cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=sigint_default)
    watchdog = threading.Timer(180, proc.kill)  # bounded, should the child stop talking
    watchdog.start()
    try:
        seen = []
        while not seen or seen[-1] and seen[-1].strip() != "loaded":  # the hold after the load begins
            seen.append(proc.stderr.readline())
        assert seen[-1].strip() == "loaded", "".join(seen)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)  # ignored, it would hold its 60 s
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130 and "Traceback" not in err, err[-2000:]
    assert "bucketplan extract: interrupted" in err and not (tmp_path / "o").exists(), err


def test_repro_buffers_parameters_and_constants_as_torch_writes_them_are_planned(tmp_path, capsys):
    """What torch's repro writer emits for a graph's state on a GPU (``.to("cuda:0")``, ``device=``,
    a small constant's repr, a module moved whole, ``mod = Repro()`` at import) and a CPU constant:
    each becomes a fake CPU tensor of its shape, and the graph plans."""
    init = ("        self.register_buffer('_tensor_constant0', torch.randn([4, 4], dtype=torch.float32)"
            ".to(\"cuda:0\"))\n"
            "        self.register_buffer('_tensor_constant1', tensor([[1., 2., 3., 4.]], device='cuda:0'))\n"
            "        self.register_buffer('_tensor_constant2', torch.empty(16, 4, device='cuda:0'))\n"
            "        self.register_buffer('_tensor_constant3', torch.ones(4))\n"
            "        self.w2 = torch.nn.Parameter(torch.randn([4, 4], dtype=torch.float32, device=\"cuda:0\"))\n"
            "        self.lin = torch.nn.Linear(in_features=4, out_features=4, bias=True).to(\"cuda:0\")\n"
            "        self.lin2 = torch.nn.Linear(4, 4).cuda()\n")
    extra = ("        x = torch.ops.aten.mm.default(x, self._tensor_constant0) + self._tensor_constant1\n"
             "        x = self.lin2(self.lin(x + self._tensor_constant2 + self._tensor_constant3)) @ self.w2\n")
    path = tmp_path / "state.py"
    path.write_text(_file(init=init, extra=extra, top="mod = Repro()\n"))
    code, out, err = run_main(["extract", "--graph", str(path), "-o", str(tmp_path / "o"), "-q"], capsys)
    assert code == 0, err
    problem = planner.load_problem(tmp_path / "o" / "problem.json")
    assert [c.pg for c in problem.collectives] == ["mystery"]
    assert sum(n.kind == "compute" for n in problem.nodes) >= 4  # the two mms and the two linears, all priced


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
    code, out, err = run_main(["extract", "--graph", path, "--group", "mystery=4@1", "-o", tmp_path / "o", "-q"],
                              capsys)
    assert code == 0, err
    assert "pg mystery (4 ranks)" in out and "1 per node" in out
    code, out, err = run_main(["compare", "--graph", str(path), "--group", "mystery=4@1", "--time-limit", "1",
                              "-o", str(tmp_path / "c"), "-q"], capsys)
    assert code == 0, err
    table = (tmp_path / "c" / "compare.md").read_text()
    assert "| graph:g.py | h100-8nodes | 6 | 1 | torch default" in table and "(step, free positions)" in table
    code, _, err = run_main(["check", "--graph", str(path)], capsys)
    assert code == 2 and "a --graph file holds no module to run" in err
    code, _, err = run_main(["extract", "llama3-8b-fsdp-2", "--group", "x=2", "-o", str(tmp_path / "p")], capsys)
    assert code == 2 and "--group names the process groups of a --graph file" in err


def test_a_sweep_case_plans_a_graph_file(tmp_path, capsys):
    (tmp_path / "g.py").write_text(_GROUPED)
    (tmp_path / "spec.toml").write_text('[[case]]\ngraph = "g.py"\nobjectives = ["step"]\ntime_limit_s = 2\n')
    code, _, err = run_main(["sweep", str(tmp_path / "spec.toml"), "-o", str(tmp_path / "out"), "--sequential", "-q"],
                            capsys)
    assert code == 0, err
    results = (tmp_path / "out" / "results.md").read_text()
    assert "graph-g" in results
    (tmp_path / "bad.toml").write_text('[[case]]\ngraph = "g.py"\nranks = [8]\n')
    code, _, err = run_main(["sweep", str(tmp_path / "bad.toml"), "-o", str(tmp_path / "bad"), "--sequential"], capsys)
    assert code == 2 and "ranks: a graph file carries its groups" in err and len(err.strip().splitlines()) == 1
