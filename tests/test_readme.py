"""The README as a newcomer meets it (issue 30): short, linked to docs/ that exist, its two
set-up commands the ones CI runs, and every command of its entry points run verbatim in a fresh
folder (the training flow's three are tests/test_training_flow.py's)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

import planner
from planner.rules.verifier import recorded_policy
from tests.test_training_flow import flow_env, run

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def bash_blocks(text: str) -> list[list[str]]:
    """Each ```bash block's commands: comments cut, continuation lines joined."""
    blocks = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        blocks.append([c for c in (line.split("  #")[0].split(" # ")[0].strip() for line in joined.splitlines())
                       if c and not c.startswith("#")])
    return blocks


def section(title: str) -> str:
    start = README.index(title)
    end = README.find("\n## ", start + len(title))
    return README[start:end if end != -1 else len(README)]


def test_the_readme_is_a_front_door_with_its_details_in_docs():
    assert len(README.splitlines()) <= 150
    links = re.findall(r"\]\(((?:docs|planner)/[^)#]+)", README)
    assert {"docs/commands.md", "docs/model.md", "docs/results.md", "docs/glossary.md", "docs/training.md",
            "docs/your-model.md", "docs/step_time.png"} <= set(links)
    for link in links:
        assert (ROOT / link).is_file(), link
    for page in (ROOT / "docs").glob("*.md"):  # every page linked from the README
        assert f"docs/{page.name}" in links, page.name
    glossary = (ROOT / "docs" / "glossary.md").read_text()
    for word in ("floor", "rule 9", "anchor", "window", "polish", "protect-partly", "hidden / partly hidden / exposed",
                 "graph nodes / cluster nodes"):
        assert f"**{word}**" in glossary, word
    # numbers in prose come with their folder and command, not commit hashes
    results = (ROOT / "docs" / "results.md").read_text()
    assert not re.search(r"\b(at|on) [0-9a-f]{7}\b", results)


def test_the_two_setup_commands_are_the_ones_ci_runs():
    first = bash_blocks(README)[0]
    assert len(first) == 2
    *install, main_job = first[0].split(" && ")
    assert main_job == "bucketplan compare"
    ci = (ROOT / ".ci" / "run").read_text()
    # a fresh venv, the pinned versions (constraints.txt), then the tests, in the README's order
    assert install[0] == "python3 -m venv .venv" and "python3 -m venv --clear .venv" in ci
    steps = [step.replace("pip install -c", "pip install -q -c") for step in install[1:]] + [first[1]]
    places = [ci.find(step) for step in steps]
    assert -1 not in places and places == sorted(places), (steps, places)


@pytest.mark.slow
def test_the_main_job_runs_verbatim(tmp_path):
    """`bucketplan compare` as the README's first command runs it: defaults, a fresh folder; what it
    leaves is checked as compare's own test checks it (``check_compare_folder``)."""
    command = bash_blocks(README)[0][0].split(" && ")[-1]
    result = run(command, tmp_path, flow_env(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(result.stderr.splitlines()) <= 30, result.stderr
    out = tmp_path / "out" / "compare"
    from bucketplan.compare import DEFAULT_SUITE
    from tests.test_compare import check_compare_folder

    check_compare_folder(out, result.stdout, result.stderr, list(DEFAULT_SUITE))
    assert (out / "compare.md").is_file() and (out / "step_time.png").is_file()
    plans = sorted((out / "plans").glob("*.json"))
    import csv

    rows = list(csv.DictReader((out / "compare.csv").open()))
    assert len(rows) == 4 * 9  # the unbucketed row and eight planners per workload of the default suite
    # a plan per row but the unbucketed one and torch's manual pass: seven per workload, less any
    # capped row that found nothing within its peak
    assert len(plans) == 4 * 7 - sum(not r["step_ms"] for r in rows)
    # each plan is listed beside the problem it is for, and verifies against it under the policy it records
    listed = [row.strip("|").split("|") for row in (out / "plans" / "index.md").read_text().splitlines()
              if row.startswith("| ") and row.endswith(".json |")]
    assert sorted(out / plan.strip() for _, _, plan, _ in listed) == plans
    for _, _, plan_file, problem_file in listed:
        problem, plan = planner.load_problem(out / problem_file.strip()), planner.load_plan(out / plan_file.strip())
        assert plan.problem_fingerprint == problem.fingerprint, plan_file
        assert not planner.verify(problem, plan, **recorded_policy(plan)), plan_file


@pytest.mark.slow
@pytest.mark.parametrize("title", ["**Built-in workloads.**", "**Your model.**"])
def test_the_entry_points_run_verbatim(tmp_path, title):
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    env = flow_env(tmp_path)
    (commands,) = bash_blocks(section(title))[:1]
    assert len(commands) >= 5
    for command in commands:
        result = run(command, tmp_path, env)
        assert result.returncode == 0, f"{command}: exit {result.returncode}\n{result.stderr[-3000:]}"
