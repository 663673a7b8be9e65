"""Outputs never clobber inputs or foreign files: every command that writes refuses, before any
work, an output that is one of its inputs (the same path, a symlink to it, a hard link of it) or
a folder of its own holding one (``bucketplan.cli.common.not_inputs``); compare replaces its
folder only while it holds nothing but what compare wrote, one compare at a time
(``planner.core.io.replace_dir_atomically``, whose own tests are in test_replace_dir.py).

Every refusal is one line with exit status 2, and the inputs are byte-identical afterwards."""

from __future__ import annotations

import fcntl
import gzip
import os
from pathlib import Path

import pytest

from bucketplan.cli import main

DATA = Path(__file__).parent / "data" / "problems"


def _problem(folder: Path, name: str = "p.json") -> Path:
    """A small problem (DDP, 2 layers, α-β costs) as a plain .json file, which compare takes."""
    folder.mkdir(parents=True, exist_ok=True)
    p = folder / name
    p.write_bytes(gzip.decompress((DATA / "llama3-8b-ddp-2--alpha-beta.json.gz").read_bytes()))
    return p


def _files(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` with its bytes (a symlink as where it points)."""
    return {str(p.relative_to(root)): os.readlink(p).encode() if p.is_symlink() else p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file() or p.is_symlink()}


def _refused(argv: list[str], capsys, *says: str) -> str:
    assert main([str(a) for a in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and all(s in err for s in says), err
    return err


def _hold_lock(lock: Path) -> int:
    """Another run's lock: the file descriptor holding it (close it to let go)."""
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


# -- one file over another ------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["same path", "symlink", "hard link"])
def test_solve_never_writes_its_plan_over_the_problem(tmp_path, capsys, how):
    problem = _problem(tmp_path)
    out = {"same path": problem, "symlink": tmp_path / "link.json", "hard link": tmp_path / "hard.json"}[how]
    if how == "symlink":
        out.symlink_to(problem)
    elif how == "hard link":
        os.link(problem, out)
    before = _files(tmp_path)
    _refused(["solve", problem, "-o", out, "--time-limit", "1", "-q"], capsys,
             f"-o {out}: is the problem {problem}, an input")
    assert _files(tmp_path) == before


def test_solve_never_writes_its_plan_over_the_hint(tmp_path, capsys):
    problem = _problem(tmp_path)
    hint = tmp_path / "greedy-plan.json"
    hint.write_bytes(gzip.decompress((DATA / "llama3-8b-ddp-2--alpha-beta-greedy-plan.json.gz").read_bytes()))
    before = _files(tmp_path)
    _refused(["solve", problem, "--hint", hint, "-o", hint, "--time-limit", "1", "-q"], capsys,
             f"-o {hint}: is --hint {hint}")
    assert _files(tmp_path) == before


def test_extract_never_saves_the_graph_over_the_graph_it_reads(tmp_path, capsys):
    graph = tmp_path / "step.py"
    graph.write_text("# a graph file: refused before it is loaded\n")
    before = _files(tmp_path)
    _refused(["extract", "--graph", graph, "--save-graph", graph, "-o", tmp_path / "out", "-q"], capsys,
             f"--save-graph {graph}: is --graph {graph}")
    assert _files(tmp_path) == before


def test_extract_never_saves_the_graph_where_it_writes_the_problem(tmp_path, capsys):
    out = tmp_path / "d"
    _refused(["extract", "llama3-8b-fsdp-2", "-o", out, "--save-graph", out / "problem.json", "-q"], capsys,
             f"--save-graph {out / 'problem.json'}: is where -o writes problem.json")
    assert not out.exists()


def test_extract_never_writes_its_problem_over_an_input(tmp_path, capsys):
    """-o is a folder extract writes two named files into: an input named like one is refused; the
    folder may hold other files, the workload's own among them."""
    out = tmp_path / "out"
    measured = out / "problem.json"
    out.mkdir()
    measured.write_text("kind,group,ranks_per_node,bytes,ms\n")
    before = _files(tmp_path)
    _refused(["extract", "llama3-8b-ddp-2", "--collectives", measured, "-o", out, "-q"], capsys,
             f"-o {measured}: is --collectives {measured}")
    assert _files(tmp_path) == before


# -- compare's folder ---------------------------------------------------------------------------


def _earlier_compare(out: Path, files: dict[str, bytes]) -> None:
    """A folder as an earlier compare left it: ``files`` and the manifest listing them."""
    from bucketplan.compare import OUTPUTS
    from planner.core.io import replace_dir_atomically

    with replace_dir_atomically(out, owned=OUTPUTS) as tmp:
        for rel, data in files.items():
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp / rel).write_bytes(data)


def test_compare_force_never_deletes_the_problem_it_compares(tmp_path, capsys):
    out = tmp_path / "run"
    _earlier_compare(out, {"compare.csv": b"old table", "problems/p.json": _problem(tmp_path).read_bytes()})
    problem = out / "problems" / "p.json"
    before = _files(tmp_path)
    _refused(["compare", problem, "-o", out, "--force", "--time-limit", "1", "-q"], capsys,
             f"-o {out}: holds the problem {problem}, an input")
    assert _files(tmp_path) == before


@pytest.mark.parametrize("where", ["plans/mine.json", "traces/r/mine.json"])
def test_compare_force_never_deletes_a_file_put_below_the_top(tmp_path, capsys, where):
    out = tmp_path / "run"
    _earlier_compare(out, {"compare.csv": b"old table", "plans/index.md": b"plans", "traces/t.json": b"{}"})
    (out / where).parent.mkdir(parents=True, exist_ok=True)
    (out / where).write_text("mine")
    problem = _problem(tmp_path / "in")
    before = _files(tmp_path)
    _refused(["compare", problem, "-o", out, "--force", "--time-limit", "1", "-q"], capsys,
             f"-o {out}: holds files this command did not write ({where})")
    assert _files(tmp_path) == before


def test_compare_keeps_a_file_put_into_its_folder_during_the_run(tmp_path, capsys, monkeypatch):
    """The folder is checked again as the run ends: a file dropped into it meanwhile stays there
    with the old results, and the new ones are left beside it, in the folder the line names."""
    import bucketplan.compare as compare

    out = tmp_path / "run"
    _earlier_compare(out, {"compare.csv": b"old table", "traces/t.json": b"{}"})

    def meanwhile(target, *, traces_to, **_):
        (traces_to / "traces").mkdir(exist_ok=True)
        (traces_to / "traces" / "new.json").write_text("{}")
        (out / "traces" / "r").mkdir()
        (out / "traces" / "r" / "mine.txt").write_text("written during the run")
        return target
    monkeypatch.setattr(compare, "compare_workload", meanwhile)
    monkeypatch.setattr(compare, "table_rows", lambda rows: [])
    monkeypatch.setattr(compare, "plots", lambda rows, folder: None)
    monkeypatch.setattr(compare, "save_plans", lambda rows, folder: None)
    err = _refused(["compare", "llama3-8b-ddp-2", "-o", out, "--force", "-q"], capsys,
                   f"-o {out}: holds files this command did not write (traces/r/mine.txt)", "results are in")
    assert _files(out)["traces/r/mine.txt"] == b"written during the run" and _files(out)["compare.csv"] == b"old table"
    kept = Path(err.rpartition("results are in ")[2])
    assert kept.parent == tmp_path and "traces/new.json" in _files(kept)


def test_a_second_compare_of_the_same_folder_is_refused_at_once(tmp_path, capsys):
    problem = _problem(tmp_path)
    out = tmp_path / "c"
    fd = _hold_lock(tmp_path / ".c.lock")
    try:
        _refused(["compare", problem, "-o", out, "--time-limit", "1", "-q"], capsys,
                 f"-o {out}: another run is writing this folder")
    finally:
        os.close(fd)
    assert not out.exists()


def test_compare_into_a_symlink_loop_is_one_line(tmp_path, capsys, monkeypatch):
    problem = _problem(tmp_path)
    monkeypatch.chdir(tmp_path)
    Path("selfloop").symlink_to("selfloop")
    _refused(["compare", problem, "-o", "selfloop", "--time-limit", "1", "-q"], capsys,
             "-o selfloop: is a symlink loop")
    assert os.readlink("selfloop") == "selfloop"


# -- sweep's folder ---------------------------------------------------------------------------


def _spec(path: Path, problems: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'objectives = ["count"]\ntime_limit_s = 1\n\n[[case]]\nproblems = ["{problems}"]\n')
    return path


@pytest.mark.parametrize("inside", ["spec", "problem"])
def test_sweep_never_writes_into_a_folder_holding_its_inputs(tmp_path, capsys, inside):
    """The sweep's folder is its own: a problems glob there would read its own cases back."""
    out = tmp_path / "sw"
    problem = _problem(out if inside == "problem" else tmp_path / "in")
    spec = _spec((out if inside == "spec" else tmp_path) / "spec.toml", str(problem))
    before = _files(tmp_path)
    _refused(["sweep", spec, "-o", out, "--sequential", "-q"], capsys, f"-o {out}: holds",
             f"the spec {spec}" if inside == "spec" else f"problem file {problem}")
    assert _files(tmp_path) == before


def test_a_second_sweep_of_the_same_folder_is_refused_at_once(tmp_path, capsys):
    out = tmp_path / "sw"
    out.mkdir()
    spec = _spec(tmp_path / "spec.toml", str(_problem(tmp_path / "in")))
    fd = _hold_lock(out / ".sweep.lock")
    try:
        _refused(["sweep", spec, "-o", out, "--sequential", "-q"], capsys,
                 f"-o {out}: another run is writing this folder")
    finally:
        os.close(fd)
    assert [p.name for p in out.iterdir()] == [".sweep.lock"]


# -- examples/train_compiled.py bench ---------------------------------------------------------------


@pytest.mark.slow  # starts the example in a child process (it imports torch)
@pytest.mark.parametrize("flags,says", [
    ("plans --profile bench/traces/torch.rank0.json --profile-cpu",
     "bench/traces holds --profile bench/traces/torch.rank0.json"),
    ("bench/record", "bench/record is the plan directory bench/record"),
])
def test_bench_never_writes_over_what_it_reads(tmp_path, flags, says):
    """bench writes its traces under --out: the trace of an earlier run given back as --profile
    (docs/training.md) must not be overwritten by this run's, nor the plans recorded over."""
    from tests.test_training_flow import ROOT, flow_env, run

    trace = tmp_path / "bench" / "traces" / "torch.rank0.json"
    trace.parent.mkdir(parents=True)
    trace.write_text('{"traceEvents": []}')
    (tmp_path / "plans").mkdir()
    (tmp_path / "bench" / "record").mkdir()
    before = _files(tmp_path)
    r = run(f"python {ROOT / 'examples' / 'train_compiled.py'} bench {flags} --out bench", tmp_path,
            flow_env(tmp_path))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert f"--out bench: {says}" in r.stderr, r.stderr
    assert _files(tmp_path) == before
