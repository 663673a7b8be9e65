"""Your own model: a factory file outside the package and an unseen Hugging Face config, planned
by the command line alone; every broken spec is a one-line error that writes nothing."""

from __future__ import annotations

import json

import pytest

import planner
from tests.support import DATA, ROOT, run_main

pytestmark = pytest.mark.slow  # traces users' models, and runs one on gloo ranks

FACTORY = (DATA / "net_factory.py").read_text()  # a user's factory: each test writes it outside the package


def _plan_by_cli_alone(tmp_path, capsys, source: list[str]):
    out = tmp_path / "out"
    code, _, err = run_main(["extract", *source, "-o", str(out), "-q", "--preset", "h100-1node"], capsys)
    assert code == 0, err
    problem = planner.load_problem(out / "problem.json")
    code, text, err = run_main(["solve", str(out / "problem.json"), "-o", str(out / "plan.json"), "--objective", "step",
                               "--hint", str(out / "greedy-plan.json"), "--time-limit", "5", "-q"], capsys)
    assert code == 0, err
    code, text, _ = run_main(["verify", str(out / "problem.json"), str(out / "plan.json")], capsys)
    assert code == 0 and "feasible            yes" in text
    plan = planner.load_plan(out / "plan.json")
    code, text, err = run_main(["apply", *source, str(out / "plan.json"), "-q", "--preset", "h100-1node"], capsys)
    assert code == 0, err
    after = int(text.split("collectives after")[1].split()[0])
    assert after == planner.collectives_after(problem, plan)
    return problem


def test_a_factory_outside_the_package_is_planned_by_the_cli_alone(tmp_path, capsys):
    (tmp_path / "net.py").write_text(FACTORY)
    problem = _plan_by_cli_alone(tmp_path, capsys, ["--model", f"{tmp_path / 'net.py'}:build", "--layers", "3"])
    # 3 blocks of (weight, bias) + embedding + head: each gathered in forward, re-gathered in
    # backward except the first use, reduce-scattered once
    assert sum(c.kind == "reduce_scatter" for c in problem.collectives) == 3 * 2 + 2


def test_an_unseen_hugging_face_config_is_planned_by_the_cli_alone(tmp_path, capsys):
    config = {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 128,
              "intermediate_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 6,
              "vocab_size": 1024, "max_position_embeddings": 8192, "torch_dtype": "bfloat16"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    problem = _plan_by_cli_alone(tmp_path, capsys, ["--hf-config", str(tmp_path / "config.json"), "--layers", "2"])
    assert problem.meta["layers"] == 2


@pytest.mark.parametrize("spec, named", [
    ("{dir}/missing.py:build", "no such file"),
    ("{dir}/broken.py:build", "importing"),
    ("{dir}/net.py:nothing", "no callable 'nothing'"),
    ("{dir}/net.py:wrong", "must return (module, example_inputs, loss_fn)"),
    ("no_colon_here", "expected MODULE:FACTORY"),
])
def test_broken_model_specs_are_one_line_errors_that_write_nothing(tmp_path, capsys, spec, named):
    (tmp_path / "net.py").write_text(FACTORY)
    (tmp_path / "broken.py").write_text("def build(groups):\n    return (\n")
    out = tmp_path / "out"
    code, _, err = run_main(["extract", "--model", spec.format(dir=tmp_path), "-o", str(out), "-q"], capsys)
    assert code == 2 and len(err.splitlines()) == 1 and named in err and "Traceback" not in err
    assert not out.exists()


@pytest.mark.slow
def test_check_runs_a_users_factory_on_gloo_bitwise(capsys):
    from bucketplan.cli import main

    assert main(["check", "--model", "tests/data/tiny_factory.py:build", "--layers", "2", "--planner", "cpsat",
                 "-q"]) == 0
    out = capsys.readouterr().out
    assert "rank 0: bitwise equal" in out and "rank 1: bitwise equal" in out and out.rstrip().endswith("OK")


@pytest.mark.parametrize("argv, named", [
    (["check", "--model", "no/such/file.py:build"], "no such file"),
    (["check", "llama3-8b-fsdp-2", "--model", "tests/data/tiny_factory.py:build"], "give one workload"),
    (["check", "--hf-config", "x.json"], "check runs built-in workloads and --model factories"),
    (["check", "llama3-8b-fsdp-2", "--layers", "3"], "--layers applies to"),
])
def test_check_refuses_what_it_cannot_run_in_one_line(capsys, argv, named):
    from bucketplan.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert named in err and len(err.splitlines()) == 1


def test_a_factory_workload_gets_blocks_like_a_built_in_one():
    """A user's factory cannot be rebuilt by name: its blocks come from the module the trace
    built (before wrapping renamed its parameters), so the positioned search's per-block seed
    applies to it as to a built-in workload."""
    from fxglue.models.custom import factory_workload
    from fxglue.pipeline import prepare

    problem = prepare(factory_workload(f"{ROOT}/examples/my_model.py:build", "fsdp", 2), greedy=False).problem
    named = {c.module for c in problem.collectives if c.module is not None}
    assert all(c.module is not None and c.phase in ("forward", "backward") for c in problem.collectives)
    assert {"blocks.0", "blocks.1"} <= named, named
