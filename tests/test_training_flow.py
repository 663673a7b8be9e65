"""The README's training flow, run as a user runs it: the three commands of *Use a plan in
training*, read from the README and run verbatim in a fresh folder, with inductor's caches on
(as torch ships them; in this test's own cache folder so an earlier run cannot serve them).

It once failed on every `use` (the pass's cache key read files by name that a move had taken
away) while every test passed: the tests had switched the caches off.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import planner
from planner.jobs.plan_dir import PLAN, PROBLEM
from tests.test_plan_cache import _break  # the same broken plans, here through a real compile

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow  # two 2-rank compiles and a solve: about 1.5 minutes on 2 cores


def readme_training_commands() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Use a plan in training"):]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    commands = [line.split("#")[0].strip() for line in block.splitlines()]
    return [c for c in commands if c]


def run(command: str, cwd: Path, env: dict, timeout_s: int = 600) -> subprocess.CompletedProcess:
    argv = shlex.split(command)
    if argv[0] == "python":
        argv[0] = sys.executable  # `python` as the user's environment resolves it
    elif argv[0] == "bucketplan":  # the console script installed beside this interpreter, as an
        # activated environment puts it first on PATH
        script = Path(sys.executable).parent / "bucketplan"
        argv[0] = str(script) if script.exists() else shutil.which("bucketplan") or argv[0]
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s)


def flow_env(tmp_path: Path) -> dict:
    env = dict(os.environ)
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path / "inductor-cache")
    env.pop("TORCHINDUCTOR_FX_GRAPH_CACHE", None)
    env.pop("TORCHINDUCTOR_AUTOGRAD_CACHE", None)
    return env


def losses(out: str) -> list[str]:
    return re.findall(r"^step \d+: loss (\S+)$", out, re.M)


def graph_lines(out: str) -> list[tuple[str, int, int, str]]:
    """(problem digest prefix, collectives before, after, outcome) per compiled graph."""
    return [(m[0], int(m[1]), int(m[2]), m[3]) for m in
            re.findall(r"\(problem (\w+)\): (\d+) -> (\d+) collectives \((.*)\)$", out, re.M)]


@pytest.fixture(scope="module")
def flow(tmp_path_factory):
    """The README's three commands, run in a folder holding a copy of examples/."""
    tmp_path = tmp_path_factory.mktemp("flow")
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    env = flow_env(tmp_path)
    commands = readme_training_commands()
    assert [c.split()[:3] for c in commands] == [["python", "examples/train_compiled.py", "record"],
                                                 ["bucketplan", "solve-dir", "plans/"],
                                                 ["python", "examples/train_compiled.py", "use"]], commands
    results = [run(c, tmp_path, env) for c in commands]
    for c, r in zip(commands, results):
        assert r.returncode == 0, f"{c}: exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return tmp_path, env, results


def test_the_readme_training_flow_applies_every_plan_and_keeps_the_loss(flow):
    tmp_path, _, (recorded, _, used) = flow
    assert "Traceback" not in recorded.stderr + used.stderr
    assert len(losses(recorded.stdout)) == 3 and losses(used.stdout) == losses(recorded.stdout)
    plan_dir = tmp_path / "plans"
    rec, use = graph_lines(recorded.stdout), graph_lines(used.stdout)
    assert rec and {g[3] for g in rec} == {"recorded"}
    assert use and {g[3] for g in use} == {"planned"}, used.stdout
    assert sorted(g[0] for g in rec) == sorted(g[0] for g in use)
    for digest, before, after, _ in use:
        (folder,) = [p for p in plan_dir.iterdir() if p.name.startswith(digest)]
        problem, plan = planner.load_problem(folder / PROBLEM), planner.load_plan(folder / PLAN)
        assert not planner.verify(problem, plan)
        # the compiled graph holds exactly the plan's collectives, of a problem that held all the graph's
        assert (before, after) == (len(problem.collectives), planner.collectives_after(problem, plan))
        assert after < before
    assert not re.search(r"^\[rank \d\] bucketplan:", used.stderr, re.M), used.stderr  # no fallback warned


@pytest.mark.long  # five more 2-rank compiles: about 2 minutes
@pytest.mark.parametrize("how,args,says", [
    ("corrupt", "", "unreadable plan"),
    ("foreign", "", "is for another problem"),
    ("infeasible", "", "fails verification"),
    ("stale", "--layers 3", "no plan in"),  # the model changed: another graph, no plan
])
def test_every_fallback_warns_once_and_trains_with_torchs_bucketing(flow, tmp_path, how, args, says):
    flow_dir, env, (recorded, _, _) = flow
    shutil.copytree(flow_dir / "examples", tmp_path / "examples")
    shutil.copytree(flow_dir / "plans", tmp_path / "plans")
    _break(tmp_path / "plans", how)
    r = run(f"python examples/train_compiled.py use plans/ {args}", tmp_path, flow_env(tmp_path))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    warnings = [line for line in r.stderr.splitlines() if line.startswith("[rank 0] bucketplan:")]
    assert len(warnings) == 1 and says in warnings[0], r.stderr[-3000:]
    assert {g[3].split(":")[0] for g in graph_lines(r.stdout)} == {"fallback"}
    if how != "stale":  # torch's greedy on the same graph: the numbers record computed
        assert losses(r.stdout) == losses(recorded.stdout)


@pytest.mark.parametrize("how", ["missing", "not a directory"])
def test_use_without_a_plan_directory_is_one_line_before_anything_compiles(tmp_path, how):
    """No directory is a mistake named at once, not a run of torch's bucketing that inductor's cache
    (serving a graph compiled before, with no warning to repeat) could pass off as planned."""
    plan_dir = tmp_path / "plans"
    if how == "not a directory":
        plan_dir.write_text("")
    r = run(f"python {ROOT / 'examples' / 'train_compiled.py'} use {plan_dir}", tmp_path, flow_env(tmp_path),
            timeout_s=300)
    assert r.returncode == 2 and not r.stdout, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    assert r.stderr.strip() == (f"train_compiled.py: error: no plan directory {plan_dir} ({how}; run record, "
                                "then bucketplan solve-dir)"), r.stderr[-2000:]
    assert not [p for p in (tmp_path / "inductor-cache").rglob("*") if p.is_file()]  # nothing compiled


def test_use_again_is_served_from_inductors_cache_with_the_same_numbers(flow, tmp_path):
    """The same plans and code give the same cache key in a new process: nothing recompiles."""
    flow_dir, env, (_, _, used) = flow
    use = readme_training_commands()[2]
    again = run(use, flow_dir, env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "no graph was compiled: inductor served this program from its cache" in again.stdout, again.stdout
    assert losses(again.stdout) == losses(used.stdout)
