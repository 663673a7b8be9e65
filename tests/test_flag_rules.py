"""Every flag is honoured or refused, by one rule for every command: the flags that shape a workload
(``bucketplan.cli.rules.SHAPING_FLAGS``) are refused where they shape nothing -- beside a problem
file, or a built-in name that carries its depth and parallelism -- and the flags that need or
exclude others (``COMBINATIONS``) are refused alike by ``solve`` and ``solve-dir``; scenarios are
told apart by what they price. Each refusal is one line naming the flag, exit 2, before any work.
"""

from __future__ import annotations

import argparse

import pytest

from bucketplan.cli import build_parser
from bucketplan.cli import rules
from bucketplan.cli.extract import TINY_IGNORES
from tests.support import run_main
from tests.test_hostile import assert_one_line_error

# a value for each shaping flag that takes one (the refusal comes before any is read)
SAMPLE = {"--preset": ["h100-1node"], "--ranks": ["16"], "--tp": ["2"], "--collectives": ["f.csv"],
          "--collective-ranks": ["64/8"], "--compute-tflops": ["100"], "--hbm-tbps": ["2"], "--contention": ["1.19"],
          "--profile": ["t.json"], "--profile-cpu": [], "--pre-bucketing": [], "--schedule": ["graph"],
          "--bucket-mode": ["coalesced"],
          "--max-bucket-memory-gb": ["1"], "--hardware": ["hw.json"], "--layers": ["8"], "--parallel": ["ddp"],
          "--group": ["x=2"]}


def _command(name: str) -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def _options(name: str) -> set[str]:
    return {max(a.option_strings, key=len) for a in _command(name)._actions if a.option_strings}


@pytest.fixture
def problem_file(tmp_path):
    path = tmp_path / "problem.json"
    path.write_text("{}")  # never read: the flags are refused first
    return path


def test_every_workload_flag_of_every_command_is_in_the_one_table():
    """The workload, cluster and pipeline flags of each command that takes a workload are the
    table's, so none can be added without a rule saying what it shapes."""
    others = {"--help", "--output", "--force", "--time-limit", "--scenarios", "--quiet", "--verbose", "--save-graph",
              "--tiny", "--model", "--hf-config", "--hf", "--graph", "--plan", "--planner", "--seed"}
    for name in ("extract", "apply", "compare"):
        assert _options(name) - others == set(rules.SHAPING_FLAGS) & _options(name), name
    assert set(SAMPLE) == set(rules.SHAPING_FLAGS)


@pytest.mark.parametrize("flag", [f for f, rule in rules.SHAPING_FLAGS.items()
                                  if rule.every_target and f in _options("compare")])
def test_compare_refuses_a_cluster_flag_beside_a_problem_file(capsys, problem_file, flag):
    code, _, err = run_main(["compare", problem_file, flag, *SAMPLE[flag], "-q"], capsys)
    assert_one_line_error(code, err, flag, f"problem file {problem_file}", "extracted already")


def test_compare_refuses_the_issue_s_command_line(capsys, problem_file, tmp_path):
    code, _, err = run_main(["compare", problem_file, "--preset", "h100-1node", "--compute-tflops", "100", "--ranks",
                             "16", "--collectives", "f.csv", "-o", tmp_path / "c"], capsys)
    assert_one_line_error(code, err, "--preset")
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("argv, flag", [
    (["compare", "llama3-8b-fsdp-2", "--layers", "8", "--parallel", "ddp"], "--layers"),
    (["compare", "llama3-8b-fsdp-2", "--parallel", "ddp"], "--parallel"),
    (["compare", "llama3-8b-fsdp-2", "--parallel", "fsdp"], "--parallel"),  # its default's value, given
    (["compare", "--parallel", "ddp"], "--parallel"),  # the default suite: built-in names
    (["compare", "llama3-8b-fsdp-2", "--group", "x=2"], "--group"),
    (["extract", "llama3-8b-fsdp-2", "--parallel", "ddp", "-o", "{tmp}/o"], "--parallel"),
    (["extract", "llama3-8b-fsdp-2", "--layers", "8", "-o", "{tmp}/o"], "--layers"),
    (["extract", "--graph", "{tmp}/g.py", "--parallel", "ddp", "-o", "{tmp}/o"], "--parallel"),
    (["check", "llama3-8b-fsdp-2", "--parallel", "ddp"], "--parallel"),
])
def test_a_flag_of_one_workload_is_refused_where_the_workload_carries_it(capsys, tmp_path, argv, flag):
    (tmp_path / "g.py").write_text("")
    code, _, err = run_main([a.format(tmp=tmp_path) for a in argv], capsys)
    assert_one_line_error(code, err, flag)
    assert not (tmp_path / "o").exists()


def test_a_flag_given_at_its_default_counts_as_given():
    args = _command("compare").parse_args(["--preset", "h100-8nodes"])
    assert rules.given(args, "--preset") and not rules.given(_command("compare").parse_args([]), "--preset")


# -- flags that need or exclude others: solve and solve-dir alike ---------------------------------------

@pytest.mark.parametrize("argv, message", [
    (["--positions", "free", "--objective", "count"], "--positions free needs --objective step"),
    (["--positions", "free", "--objective", "exposure"], "--positions free needs --objective step"),
])
def test_solve_and_solve_dir_refuse_a_combination_alike(capsys, tmp_path, problem_file, argv, message):
    (tmp_path / "rec" / "a1").mkdir(parents=True)
    (tmp_path / "rec" / "a1" / "problem.json").write_text("{}")
    code, _, solve_err = run_main(["solve", problem_file, "-o", tmp_path / "plan.json", *argv], capsys)
    assert_one_line_error(code, solve_err, message)
    code, _, dir_err = run_main(["solve-dir", tmp_path / "rec", *argv], capsys)
    assert_one_line_error(code, dir_err, message)
    assert solve_err.split("error: ")[1] == dir_err.split("error: ")[1]
    assert not list((tmp_path / "rec").glob("*/plan.json"))


def test_every_combination_names_flags_solve_has():
    for rule in rules.COMBINATIONS:
        for side in (rule.flag, rule.other):
            assert side.shown.split()[0] in _options("solve"), side
            assert side.dest in vars(_command("solve").parse_args(["p.json", "-o", "x"]))


def test_the_library_refuses_free_positions_with_another_objective():
    from planner.core.arguments import ArgumentError
    from planner.jobs.plan_dir import SolveDirOptions

    with pytest.raises(ArgumentError, match="positions free needs objective step") as e:
        SolveDirOptions(positions="free", objective="count")
    assert e.value.name == "positions"
    assert SolveDirOptions(positions="free").objective == "step"


# -- scenarios by value ------------------------------------------------------------------------------

@pytest.mark.parametrize("text", ["contention=1,contention=1.0", "torch,contention=1", "contention,contention=1.189",
                                  "torch,torch"])
def test_robust_refuses_one_scenario_spelled_twice(capsys, tmp_path, problem_file, text):
    code, _, err = run_main(["solve", problem_file, "-o", tmp_path / "plan.json", "--robust", text], capsys)
    assert_one_line_error(code, err, "--robust", "same scenario")
    assert not (tmp_path / "plan.json").exists()


def test_compare_refuses_one_scenario_spelled_twice(capsys, tmp_path):
    code, _, err = run_main(["compare", "llama3-8b-fsdp-2", "--scenarios", "contention=1.5,contention=1.50",
                             "-o", tmp_path / "c"], capsys)
    assert_one_line_error(code, err, "--scenarios", "'contention=1.5' and 'contention=1.50' are the same scenario")
    assert not (tmp_path / "c").exists()


def test_one_measured_file_by_two_paths_is_one_scenario(monkeypatch, tmp_path):
    from bucketplan.cli.common import CLIError, scenario_list

    (tmp_path / "m.csv").write_text("kind,group,ranks_per_node,bytes,ms\nall_gather,8,8,1024,0.05\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CLIError, match="same scenario"):
        scenario_list(f"m.csv,{tmp_path}/m.csv", "--robust")
    assert scenario_list("contention=2,contention,published", "--robust") == ["contention=2", "contention",
                                                                               "published"]


@pytest.mark.parametrize("flag", TINY_IGNORES)
def test_extract_tiny_refuses_the_cluster_flags_its_gloo_ranks_ignore(capsys, tmp_path, flag):
    code, _, err = run_main(["extract", "llama3-8b-fsdp-2", "--tiny", flag, *SAMPLE[flag], "-o", tmp_path / "o"],
                            capsys)
    assert_one_line_error(code, err, f"{flag} with --tiny")
    assert not (tmp_path / "o").exists()
