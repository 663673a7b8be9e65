"""The command line builds the library's options objects from its flags: every flag of ``solve``
sets an options field or is a named non-option, every field is set by a flag or named as the
library's alone, and a flag's value lands in its field. ``check``'s flags likewise map onto
``CheckOptions``, the pipeline flags onto ``PipelineOptions``. Memory flags are GB = 10^9 bytes.
"""

from __future__ import annotations

import argparse
import dataclasses

import pytest

import planner
from bucketplan.cli import build_parser
from bucketplan.cli import check as check_command
from bucketplan.cli import options as shared
from bucketplan.cli import solve as solve_command
from planner.core.options import SolveOptions
from planner.search.planning import Budget, PlanSpec

OWN = (argparse._HelpAction, argparse._VersionAction)


def _command(name: str) -> argparse.ArgumentParser:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def _flags(name: str) -> set[str]:
    """Each argument of the command by its longest spelling (a positional by its name)."""
    return {max(a.option_strings, key=len) if a.option_strings else a.dest
            for a in _command(name)._actions if not isinstance(a, OWN)}


def test_every_solve_flag_sets_an_options_field_or_is_a_named_non_option():
    flags = _flags("solve")
    mapped, other = set(solve_command.FLAG_FIELDS), set(solve_command.NOT_OPTIONS)
    assert not mapped & other
    assert flags == mapped | other, (sorted(flags - mapped - other), sorted((mapped | other) - flags))


def _spec_fields() -> set[str]:
    """The fields of planner.PlanSpec, those of its budget and policy as ``budget.x``/``policy.x``."""
    out = set()
    for f in dataclasses.fields(PlanSpec):
        inner = {"budget": Budget, "policy": planner.Policy}.get(f.name)
        out |= {f"{f.name}.{g.name}" for g in dataclasses.fields(inner)} if inner else {f.name}
    return out


def test_every_spec_field_has_a_flag_or_is_named_as_the_library_s_alone():
    fields = _spec_fields()
    set_by_flags = {f for fs in solve_command.FLAG_FIELDS.values() for f in fs}
    library_only = set(solve_command.LIBRARY_ONLY)
    assert set_by_flags <= fields and library_only <= fields and not set_by_flags & library_only
    assert fields == set_by_flags | library_only, sorted(fields - set_by_flags - library_only)


def test_each_solve_flag_lands_in_its_field():
    args = _command("solve").parse_args([
        "p.json", "-o", "plan.json", "--time-limit", "7", "--objective", "exposure", "--workers", "3",
        "--seed", "5", "--deterministic", "--window", "4", "--protect-partly", "--memory-budget-gb", "1.5"])
    assert solve_command.plan_spec(args) == PlanSpec(
        mode="anchored", objective="exposure", budget=Budget(7.0, deterministic=True), workers=3, seed=5, window=4,
        policy=planner.Policy(protect_partly=True, memory_budget_bytes=1_500_000_000))
    free = _command("solve").parse_args([
        "p.json", "-o", "plan.json", "--positions", "free", "--keep-overlap", "--peak-memory-gb", "2",
        "--seed", "5"])
    assert solve_command.plan_spec(free) == PlanSpec(
        mode="free", seed=5, policy=planner.Policy(keep_overlap=True, peak_memory_bytes=2_000_000_000))
    proved = _command("solve").parse_args(["p.json", "-o", "plan.json", "--positions", "free", "--prove", "9"])
    assert solve_command.plan_spec(proved) == PlanSpec(mode="free", prove_s=9.0,
                                                       policy=planner.Policy(keep_overlap=False))
    # the defaults are the library's, but for the objective (the command line's is step, as the spec's)
    defaults = solve_command.plan_spec(_command("solve").parse_args(["p.json", "-o", "plan.json"]))
    assert defaults == PlanSpec(policy=planner.Policy())
    assert defaults.anchored_options() == dataclasses.replace(SolveOptions(), objective="step")
    assert _command("solve").parse_args(["p.json", "-o", "x", "--window", "none"]).window == "none"


@pytest.mark.parametrize("flag", ["--memory-budget-gb", "--peak-memory-gb"])
def test_memory_flags_are_gigabytes_of_ten_to_the_nine_bytes_and_say_so(flag):
    action = next(a for a in _command("solve")._actions if flag in a.option_strings)
    assert "GB = 10^9 bytes" in action.help
    from bucketplan.cli.common import gigabytes

    assert gigabytes(2.5, flag) == 2_500_000_000


def test_verify_reads_its_budget_flag_as_gigabytes_of_ten_to_the_nine_bytes(tmp_path, capsys):
    from bucketplan.cli import main
    from tests.test_verify_cli import MERGED, P

    problem, plan = tmp_path / "problem.json", tmp_path / "plan.json"
    planner.save(P, problem)
    planner.save(planner.Plan(problem_fingerprint=P.fingerprint, planner="hand", created="t", buckets=MERGED), plan)
    main(["verify", str(problem), str(plan), "--memory-budget-gb", "2"])
    assert "memory budget 2 GB (2000000000 bytes)" in capsys.readouterr().out
    action = next(a for a in _command("verify")._actions if "--memory-budget-gb" in a.option_strings)
    assert "GB = 10^9 bytes" in action.help


def test_check_flags_map_onto_check_options():
    from fxglue.run.gloo import CheckOptions

    fields = {f.name for f in dataclasses.fields(CheckOptions)}
    assert set(check_command.CHECK_FLAGS) <= fields
    assert {check_command.CHECK_FLAGS[f] for f in check_command.CHECK_FLAGS} <= _flags("check")
    # the two fields no check flag sets: extract --tiny's output folder, and the library's timeout
    assert fields - set(check_command.CHECK_FLAGS) == {"save_problems", "timeout_s"}
    args = _command("check").parse_args(["llama3-8b-ddp-2", "--ranks", "4", "--seed", "7", "--pre-bucketing",
                                         "--bucket-mode", "coalesced", "--planner", "cpsat"])
    assert check_command._check_options(args) == CheckOptions(ranks=4, planner="cpsat", bucket_mode="coalesced",
                                                              pre_bucketing=True, seed=7)


@pytest.mark.parametrize("command", ["extract", "apply"])
def test_pipeline_flags_map_onto_pipeline_options(command):
    from fxglue.pipeline import PipelineOptions

    fields = {f.name for f in dataclasses.fields(PipelineOptions)}
    assert set(shared.PIPELINE_FLAGS) <= fields and set(shared.PIPELINE_FLAGS.values()) <= _flags(command)
    argv = ["llama3-8b-ddp-2"] + (["plan.json"] if command == "apply" else ["-o", "out"])
    args = _command(command).parse_args(argv + ["--pre-bucketing", "--max-bucket-memory-gb", "1"])
    assert shared.pipeline(args) == PipelineOptions(pre_bucketing=True, max_bucket_memory_gb=1.0)


def test_solve_dir_flags_map_onto_solve_dir_options():
    from bucketplan.cli import solve_dir as solve_dir_command
    from planner.jobs.plan_dir import SolveDirOptions

    fields = {f.name for f in dataclasses.fields(SolveDirOptions)}
    mapped = {field for field, _ in solve_dir_command.FLAGS.values()}
    assert mapped == fields, sorted(fields ^ mapped)
    # every other flag is the folder, --force or --quiet: what solve_dir takes beside its options
    assert _flags("solve-dir") - {flag for _, flag in solve_dir_command.FLAGS.values()} == {
        "plan_dir", "--force", "--quiet"}
    for objective, positions in (("count", "anchored"), ("step", "free")):  # free positions need step
        args = _command("solve-dir").parse_args(["d", "--objective", objective, "--time-limit", "7", "--jobs", "2",
                                                 "--workers", "3", "--seed", "5", "--positions", positions])
        values = {field: getattr(args, dest) for dest, (field, _) in solve_dir_command.FLAGS.items()}
        assert SolveDirOptions(**values) == SolveDirOptions(objective=objective, time_limit_s=7.0, jobs=2, workers=3,
                                                            seed=5, positions=positions)
    defaults = _command("solve-dir").parse_args(["d"])
    assert SolveDirOptions(**{f: getattr(defaults, d) for d, (f, _) in solve_dir_command.FLAGS.items()}) == \
        SolveDirOptions()


@pytest.mark.parametrize("argv, message", [(["--jobs", "0"], "--jobs must be a positive number"),
                                           (["--time-limit", "nan"], "--time-limit"),
                                           (["--workers", "0"], "--workers"),
                                           (["--seed", str(2**40)], "--seed")])
def test_solve_dir_names_the_flag_its_options_refuse(tmp_path, capsys, argv, message):
    from bucketplan.cli import main

    (tmp_path / "a1").mkdir()
    (tmp_path / "a1" / "problem.json").write_text("{}")
    assert main(["solve-dir", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
