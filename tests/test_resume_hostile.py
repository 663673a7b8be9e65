"""Resumable work and hostile bookkeeping files (issue 27): ``solve-dir`` and ``sweep`` lose
nothing to Ctrl-C or a crash, solve again what was cut short, refuse a second ``solve-dir`` on
one directory, and meet a FIFO, device, directory or garbage where a bookkeeping file should be
with one line naming it (exit 2) -- never a hang or a traceback.

Torch-free and small: hand-made problems solved in a second or two. Every command that could
hang on a FIFO runs in a subprocess with a timeout, so a regression fails instead of blocking.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

import planner
from planner.core.io import BadFileError, read_regular_file
from planner.jobs.plan_dir import (INDEX, PLAN, PROBLEM, PlanDirError, append_index, locked, problem_dir,
                              recorded_problems)
from planner.jobs.sweep import ray_available
from tests.bounded import bounded
from tests.support import data_problem, run_cli, start_cli
from tests.test_hostile import _problem, assert_one_line_error

BOUND_S = 60  # any command here takes seconds; one that runs this long is hanging


def _cli(*args: str, timeout: float = BOUND_S) -> subprocess.CompletedProcess:
    return run_cli(*args, timeout=timeout)


def _one_line(proc: subprocess.CompletedProcess, *fragments: str) -> str:
    return assert_one_line_error(proc.returncode, proc.stderr, *fragments)


def _tiny(i: int) -> planner.Problem:
    """test_hostile's five-collective problem, its compute made a little longer per ``i``: a
    different problem (fingerprint) each, solved to optimality in well under a second."""
    p = _problem()
    nodes = list(p.nodes)
    nodes[2] = nodes[2].model_copy(update={"est_ms": 1.0 + 0.25 * i})
    return p.model_copy(update={"nodes": tuple(nodes), "fingerprint": ""}).with_fingerprint()


def _plan_dir(root: Path, n: int = 2) -> list[Path]:
    folders = []
    for i in range(n):
        p = _tiny(i)
        where = problem_dir(root, p.fingerprint)
        planner.save(p, where / PROBLEM)
        append_index(root, {"graph": f"{i}/0/forward", "rank": 0, "fingerprint": p.fingerprint})
        folders.append(where)
    return folders


def _summary(root: Path) -> dict[str, dict]:
    with open(root / "summary.csv", newline="", encoding="utf-8") as fh:
        return {r["problem"]: r for r in csv.DictReader(fh)}


def _solve_dir(root: Path, *more: str) -> subprocess.CompletedProcess:
    return _cli("solve-dir", root, "--time-limit", "5", "--workers", "1", *more)


def _kinds(path: Path, kind: str) -> None:
    """Put a ``kind`` where a file should be: fifo, dir, devzero (a symlink to /dev/zero), bytes."""
    if path.exists() or path.is_symlink():
        path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dir":
        path.mkdir()
    elif kind == "devzero":
        if not os.path.exists("/dev/zero"):
            pytest.skip("no /dev/zero here")
        path.symlink_to("/dev/zero")
    else:
        raise AssertionError(kind)


# -- the one reader of bookkeeping files --------------------------------------------------------

@pytest.mark.parametrize("kind, named", [("fifo", "a FIFO"), ("dir", "a directory"),
                                         ("devzero", "a character device, through a symlink to /dev/zero")])
def test_read_regular_file_refuses_what_is_not_a_regular_file_without_blocking(tmp_path, kind, named):
    path = tmp_path / "index.jsonl"
    _kinds(path, kind)
    with bounded(), pytest.raises(BadFileError) as err:
        read_regular_file(path, 1000, "plan index")
    assert str(err.value) == f"{path}: not a regular file ({named}); cannot be the plan index"


def test_read_regular_file_bounds_the_size_and_says_when_missing(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b"x" * 101)
    with pytest.raises(BadFileError, match="101 bytes is too large for a rows file"):
        read_regular_file(path, 100, "rows file")
    assert read_regular_file(path, 101, "rows file") == b"x" * 101
    assert read_regular_file(tmp_path / "nope", 100, "rows file", missing_ok=True) is None
    with pytest.raises(BadFileError, match="nope: cannot read the rows file"):
        read_regular_file(tmp_path / "nope", 100, "rows file")


# -- solve-dir: nothing lost, nothing counted that does not count -------------------------------

def _children(pid: int) -> list[int]:
    out = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(proc.name))
            except (OSError, ValueError, IndexError):
                continue
    return out


@pytest.mark.slow  # four 8-layer problems solved two at a time, interrupted, solved again
def test_ctrl_c_in_solve_dir_with_two_jobs_loses_no_row_and_the_rerun_finishes(tmp_path):
    """Four problems that take minutes to prove, two at a time; Ctrl-C (to the process group, as a
    terminal sends it) while both solve. It must end promptly (no queued solve runs on to its
    time limit), without a traceback; the rerun solves what is left or was cut short, and the
    summary has a row for every problem, each saying what its plan on disk says."""
    names = ("llama3-8b-fsdp-8--h100-8nodes", "llama3-8b-ddp-8--h100-8nodes", "llama3-8b-2d-8--h100-8nodes",
             "hf-qwen3-8--h100-8nodes")
    for name in names:
        p = data_problem(name)
        planner.save(p, problem_dir(tmp_path, p.fingerprint) / PROBLEM)
    proc = start_cli("solve-dir", tmp_path, "--jobs", "2", "--workers", "1", "--time-limit", "300",
                     start_new_session=True)
    try:
        deadline = time.monotonic() + BOUND_S
        while len(_children(proc.pid)) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, "the two solves never started"
            time.sleep(0.2)
        time.sleep(5)  # both in their search
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=BOUND_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130 and "Traceback" not in err, err[-2000:]
    assert "interrupted" in err

    rerun = _cli("solve-dir", tmp_path, "--jobs", "2", "--workers", "1", "--time-limit", "1", timeout=2 * BOUND_S)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    summary = _summary(tmp_path)
    folders = recorded_problems(tmp_path)
    assert sorted(summary) == sorted(f.name for f in folders)
    for folder in folders:
        problem, plan = planner.load_problem(folder / PROBLEM), planner.load_plan(folder / PLAN)
        assert plan.problem_fingerprint == problem.fingerprint and not plan.params["interrupted"]
        assert float(summary[folder.name]["plan_ms"]) == round(planner.simulate(problem, plan).step_ms, 3)


@pytest.mark.parametrize("damage", ["missing", "header only", "not UTF-8", "fifo", "devzero"])
def test_the_summary_is_rebuilt_from_the_plans_on_disk(tmp_path, damage):
    _plan_dir(tmp_path)
    first = _solve_dir(tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    before = {name: (tmp_path / name).read_bytes() for name in ("summary.csv", "summary.md")}
    assert len(_summary(tmp_path)) == 2
    path = tmp_path / "summary.csv"
    if damage == "missing":
        path.unlink()
        (tmp_path / "summary.md").unlink()
    elif damage == "header only":  # what an earlier run's Ctrl-C between plan and summary left
        path.write_text(before["summary.csv"].decode().splitlines()[0] + "\n")
    elif damage == "not UTF-8":
        path.write_bytes(b"problem\n\xff\xfe\n")
    else:
        _kinds(path, damage)
    rerun = _solve_dir(tmp_path)
    assert rerun.returncode == 0 and "Traceback" not in rerun.stderr, rerun.stderr[-2000:]
    assert "2 recorded problem(s)" in rerun.stderr and "0 to solve" in rerun.stderr
    assert not path.is_symlink()
    assert {name: (tmp_path / name).read_bytes() for name in before} == before


def test_a_plan_solve_dir_did_not_write_counts_and_gets_its_row(tmp_path):
    """`bucketplan solve -o DIR/<fingerprint>/plan.json` by hand: the plan counts, and its row is
    rebuilt from it (the figures recomputed; there is no solver status to show)."""
    (folder,) = _plan_dir(tmp_path, 1)
    problem = planner.load_problem(folder / PROBLEM)
    plan = planner.solve(problem, planner.SolveOptions(time_limit_s=5, workers=1)).plan
    planner.save(plan, folder / PLAN)
    run = _solve_dir(tmp_path)
    assert run.returncode == 0 and "0 to solve" in run.stderr, run.stderr[-2000:]
    row = _summary(tmp_path)[folder.name]
    assert float(row["plan_ms"]) == round(planner.simulate(problem, plan).step_ms, 3)
    assert row["note"] == "figures recomputed: the plan carries no row"


def _set_interrupted(folder: Path) -> None:
    data = json.loads((folder / PLAN).read_text())
    data["params"]["interrupted"] = True
    (folder / PLAN).write_text(json.dumps(data))


def test_an_interrupted_plan_is_solved_again_and_force_solves_all(tmp_path):
    done, cut = _plan_dir(tmp_path)
    assert _solve_dir(tmp_path).returncode == 0
    _set_interrupted(cut)
    kept = (done / PLAN).read_bytes()
    rerun = _solve_dir(tmp_path)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert "1 to solve (1 interrupted earlier)" in rerun.stderr
    assert planner.load_plan(cut / PLAN).params["interrupted"] is False
    assert (done / PLAN).read_bytes() == kept  # the finished one is not touched
    assert "interrupted" not in _summary(tmp_path)[cut.name]["note"]
    forced = _solve_dir(tmp_path, "--force")
    assert forced.returncode == 0 and "2 to solve" in forced.stderr


@pytest.mark.parametrize("plan", ["garbage", "empty", "another problem's", "fifo", "devzero", "infeasible"])
def test_a_plan_counts_only_if_it_loads_and_is_for_its_problem(tmp_path, plan):
    folder, other = _plan_dir(tmp_path)
    path = folder / PLAN
    if plan == "garbage":
        path.write_bytes(b"\x89PNG\r\n\x1a\n")
    elif plan == "empty":
        path.write_text("")
    elif plan == "another problem's":
        assert _solve_dir(tmp_path).returncode == 0
        path.write_bytes((other / PLAN).read_bytes())
    elif plan == "infeasible":  # for its problem, but breaks a rule: `use` would refuse it forever
        problem = planner.load_problem(folder / PROBLEM)
        names = [c.name for c in problem.collectives if c.key == problem.collectives[0].key]
        broken = planner.Plan(problem_fingerprint=problem.fingerprint, planner="hand", created="",
                              buckets=(planner.Bucket(members=tuple(names), start=names[0], wait=names[0]),))
        assert planner.verify(problem, broken)
        planner.save(broken, path)
    else:
        _kinds(path, plan)
    run = _solve_dir(tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    assert path.is_file() and not path.is_symlink()
    problem = planner.load_problem(folder / PROBLEM)
    assert not planner.verify(problem, planner.load_plan(path))
    assert folder.name in _summary(tmp_path)


def test_a_directory_where_the_plan_goes_is_reported_not_counted(tmp_path):
    folder, _ = _plan_dir(tmp_path)
    (folder / PLAN).mkdir()
    run = _solve_dir(tmp_path)
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr[-2000:]
    assert f"no plan for 1 problem(s): {folder.name[:12]}" in run.stderr
    assert "cannot write the plan" in _summary(tmp_path)[folder.name]["note"]


def test_one_solve_dir_per_directory_at_a_time(tmp_path):
    folders = _plan_dir(tmp_path)
    with locked(tmp_path):  # what a solve-dir running on it holds
        second = _solve_dir(tmp_path, "-q")
        _one_line(second, str(tmp_path), "another solve-dir is running on this directory")
        assert not any((f / PLAN).exists() for f in folders)
    assert _solve_dir(tmp_path).returncode == 0  # the lock goes with its holder
    assert all((f / PLAN).is_file() for f in folders)


@pytest.mark.parametrize("kind, named", [("fifo", "a FIFO"), ("dir", "a directory"),
                                         ("devzero", "a symlink to /dev/zero")])
def test_solve_dir_refuses_an_index_that_is_not_a_file(tmp_path, kind, named):
    folders = _plan_dir(tmp_path)
    _kinds(tmp_path / INDEX, kind)
    _one_line(_solve_dir(tmp_path, "-q"), f"{tmp_path / INDEX}: not a regular file", named)
    assert not any((f / PLAN).exists() for f in folders)


def test_solve_dir_refuses_a_directory_where_the_summary_goes(tmp_path):
    _plan_dir(tmp_path)
    (tmp_path / "summary.csv").mkdir()
    _one_line(_solve_dir(tmp_path, "-q"), f"{tmp_path / 'summary.csv'}: cannot write the summary")


def test_index_lines_of_the_wrong_shape_are_skipped(tmp_path):
    folders = _plan_dir(tmp_path)
    with open(tmp_path / INDEX, "a") as fh:
        for bad in ({"graph": "x", "rank": 0, "fingerprint": ["sha256:" + "ab" * 32]},
                    {"graph": "x", "rank": [0], "fingerprint": "sha256:" + folders[0].name},
                    {"graph": {"a": 1}, "rank": 0, "fingerprint": "sha256:" + folders[0].name},
                    {"graph": "x", "rank": 0, "fingerprint": "sha256:../../etc"}, [1, 2], "text"):
            fh.write(json.dumps(bad) + "\n")
    run = _solve_dir(tmp_path)
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr[-2000:]
    summary = _summary(tmp_path)
    assert summary[folders[0].name]["graphs"] == "0/0/forward (1 rank)"
    assert summary[folders[1].name]["graphs"] == "1/0/forward (1 rank)"


# -- record's side: append_index and problem_dir raise one clear error --------------------------

@pytest.mark.parametrize("kind", ["fifo", "dir", "devzero"])
def test_append_index_refuses_an_index_that_is_not_a_file(tmp_path, kind):
    _kinds(tmp_path / INDEX, kind)
    with bounded(), pytest.raises(BadFileError, match=f"{tmp_path / INDEX}: not a regular file"):
        append_index(tmp_path, {"graph": "0/0/forward", "rank": 0, "fingerprint": _tiny(0).fingerprint})


def test_problem_dir_refuses_a_file_in_the_way_and_a_fingerprint_that_is_a_path(tmp_path):
    fp = _tiny(0).fingerprint
    assert problem_dir(tmp_path, fp) == tmp_path / fp.split(":")[1]
    (tmp_path / fp.split(":")[1]).write_text("")
    with pytest.raises(PlanDirError, match="exists and is not a folder"):
        problem_dir(tmp_path, fp)
    with pytest.raises(PlanDirError, match="not a problem fingerprint"):
        problem_dir(tmp_path, "sha256:../../etc")


# -- sweep: rows.jsonl resumes exactly ------------------------------------------------------------

def _sweep_spec(tmp_path: Path, objectives: str = '["count", "step"]', workers: int = 1) -> Path:
    planner.save(_tiny(0), tmp_path / "tiny" / "problem.json")
    spec = tmp_path / "spec.toml"
    spec.write_text(f"objectives = {objectives}\ntime_limit_s = 2\ndeterministic = true\n"
                    f"workers_per_task = {workers}\n[[case]]\nproblems = ['tiny/problem.json']\n")
    return spec


def _sweep(spec: Path, out: Path, *more: str) -> subprocess.CompletedProcess:
    return _cli("sweep", spec, "-o", out, "--sequential", *more)


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def _clean_sweep_once(tmp_path_factory):
    base = tmp_path_factory.mktemp("clean-sweep")
    run = _sweep(_sweep_spec(base), base / "clean")
    assert run.returncode == 0, run.stderr[-2000:]
    return base


@pytest.fixture
def clean_sweep(tmp_path, _clean_sweep_once):
    """An uninterrupted sweep of the tiny problem in tmp_path/clean (run once, copied for each
    test): (spec, its results.csv)."""
    shutil.copytree(_clean_sweep_once, tmp_path, dirs_exist_ok=True)
    return tmp_path / "spec.toml", (tmp_path / "clean" / "results.csv").read_text()


def test_a_rows_file_cut_mid_line_is_repaired_before_the_next_row(tmp_path, clean_sweep):
    spec, table = clean_sweep
    out = tmp_path / "clean"
    text = (out / "rows.jsonl").read_text()
    (out / "rows.jsonl").write_text(text[:len(text) - 40])  # the last row cut, as a crash leaves it
    rerun = _sweep(spec, out)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert "dropped 1 line(s)" in rerun.stderr
    rows = _rows(out)  # every line whole: the new row was not glued onto the cut one
    assert [r["objective"] for r in rows] == ["count", "step"]
    assert (out / "results.csv").read_text() == table
    again = _sweep(spec, out)  # and nothing is left to solve
    assert again.returncode == 0 and "0 to solve" in again.stderr and _rows(out) == rows


@pytest.mark.parametrize("bad", [b"[1, 2]", b'{"case": "tiny", "status": "OPTIMAL"}', b'{"case": "\xff\xfe"}'])
def test_rows_that_are_not_rows_are_dropped_and_their_tasks_solved(tmp_path, clean_sweep, bad):
    spec, table = clean_sweep
    out = tmp_path / "clean"
    lines = (out / "rows.jsonl").read_bytes().splitlines(keepends=True)
    (out / "rows.jsonl").write_bytes(lines[0] + bad + b"\n")  # the step row replaced by a bad line
    rerun = _sweep(spec, out)
    assert rerun.returncode == 0 and "Traceback" not in rerun.stderr, rerun.stderr[-2000:]
    assert "1 to solve" in rerun.stderr
    assert [r["objective"] for r in _rows(out)] == ["count", "step"]
    assert (out / "results.csv").read_text() == table


def test_a_row_whose_plan_is_gone_or_garbage_is_solved_again(tmp_path, clean_sweep):
    spec, table = clean_sweep
    out = tmp_path / "clean"
    plans = sorted((out / "cases").glob("*/*-plan.json"))
    assert [p.name for p in plans] == ["count-plan.json", "step-plan.json"]
    plans[0].unlink()
    plans[1].write_text("{ not json")
    rerun = _sweep(spec, out)
    assert rerun.returncode == 0 and "2 to solve" in rerun.stderr, rerun.stderr[-2000:]
    assert (out / "results.csv").read_text() == table


def test_an_interrupted_sweep_rerun_gives_the_uninterrupted_table(tmp_path, clean_sweep, monkeypatch):
    """The step task's solve is cut short by Ctrl-C (its result says so, as solve's does): the run
    stops; the rerun solves that task again and the table equals the uninterrupted one."""
    from planner.jobs import sweep

    spec, table = clean_sweep
    real = sweep.run_task

    def cut_short(task, progress=None):
        result = real(task)
        return {**result, "interrupted": True} if task.objective == "step" else result

    monkeypatch.setattr(sweep, "run_task", cut_short)
    out = tmp_path / "cut"
    with pytest.raises(KeyboardInterrupt):
        sweep.run_sweep(sweep.load_spec(spec), out, extract=None, ray=False)
    assert "interrupted" in (out / "results.csv").read_text()
    monkeypatch.setattr(sweep, "run_task", real)
    report = sweep.run_sweep(sweep.load_spec(spec), out, extract=None, ray=False)
    assert not report.failed
    assert (out / "results.csv").read_text() == table


@pytest.mark.parametrize("kind, named", [("fifo", "a FIFO"), ("dir", "a directory"),
                                         ("devzero", "a symlink to /dev/zero")])
@pytest.mark.parametrize("which", ["rows.jsonl", "cases/tiny/stages.json"])
def test_sweep_refuses_bookkeeping_that_is_not_a_file(tmp_path, clean_sweep, which, kind, named):
    spec, _ = clean_sweep
    out = tmp_path / "clean"
    assert (out / which).is_file()
    _kinds(out / which, kind)
    _one_line(_sweep(spec, out, "-q"), f"{out / which}: not a regular file", named)


def test_a_spec_that_is_a_fifo_is_refused(tmp_path):
    spec = tmp_path / "spec.toml"
    os.mkfifo(spec)
    _one_line(_sweep(spec, tmp_path / "out", "-q"), f"{spec}: not a regular file (a FIFO)")


def test_sweep_output_under_a_file_is_one_line(tmp_path):
    spec = _sweep_spec(tmp_path)
    (tmp_path / "somefile").write_text("")
    _one_line(_sweep(spec, tmp_path / "somefile" / "out", "-q"), f"{tmp_path / 'somefile' / 'out'}: cannot make the "
              "output folder")


@pytest.mark.skipif(not ray_available(), reason="Ray is not installed (the `sweep` extra)")
def test_ray_refuses_a_task_wider_than_the_cluster_instead_of_waiting_forever(tmp_path):
    spec = _sweep_spec(tmp_path, objectives='["count"]', workers=3)
    _one_line(_cli("sweep", spec, "-o", tmp_path / "out", "--ray", "--cpus", "2", "-q"),
              "workers_per_task = 3 but the local Ray instance has 2 CPU(s)")


@pytest.mark.parametrize("kind", ["fifo", "devzero"])
def test_a_hardware_file_that_is_not_a_file_is_one_line(tmp_path, kind):
    path = tmp_path / "hw.json"
    _kinds(path, kind)
    run = _cli("extract", "llama3-8b-ddp-2", "--hardware", str(path), "-o", str(tmp_path / "out"))
    _one_line(run, str(path), "not a regular file")


def test_a_symlink_where_the_lock_goes_is_refused_not_followed(tmp_path):
    from planner.jobs.plan_dir import LOCK

    _plan_dir(tmp_path)
    (tmp_path / LOCK).symlink_to(tmp_path / "elsewhere")
    _one_line(_solve_dir(tmp_path), LOCK, "cannot open the solve-dir lock")
    assert not (tmp_path / "elsewhere").exists()  # nothing created through the link
