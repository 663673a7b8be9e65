"""Every option and positional argument of every ``bucketplan`` command says what it does and,
where it has a default, what that default is (issue 30, point 5); one default objective."""

from __future__ import annotations

import argparse

import pytest

from bucketplan.cli import build_parser

COMMANDS = {"workloads", "extract", "verify", "solve", "solve-dir", "sweep", "compare", "check", "apply"}
# argparse's own: --help and --version, with argparse's help text
OWN = (argparse._HelpAction, argparse._VersionAction)


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {"": parser, **sub.choices}


def _arguments():
    """(command, action) for every option and positional of every command, the top level too."""
    for name, parser in _commands().items():
        for action in parser._actions:
            if not isinstance(action, OWN + (argparse._SubParsersAction,)):
                yield name, action


def _label(name: str, action: argparse.Action) -> str:
    return f"bucketplan {name} {'/'.join(action.option_strings) or action.dest}".replace("  ", " ")


def _rendered(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """The help text as --help prints it (%(default)s and the like filled in), on one line."""
    if not action.help:
        return ""
    return " ".join(parser._get_formatter()._expand_help(action).split())


def _default_forms(default) -> set[str]:
    """How a help text may write ``default``: 60.0 as "60" or "60.0"."""
    forms = {str(default)}
    if isinstance(default, float) and default.is_integer():
        forms.add(str(int(default)))
    return forms


def test_the_walk_sees_every_command_and_their_arguments():
    # guards the tests below against passing on an empty walk
    assert set(_commands()) - {""} == COMMANDS
    seen = {(name, action.dest) for name, action in _arguments()}
    for expected in [("verify", "problem"), ("verify", "plan"), ("solve", "objective"), ("check", "ranks"),
                     ("compare", "quiet"), ("check", "bucket_mode"), ("solve-dir", "plan_dir")]:
        assert expected in seen


def test_every_command_has_a_one_line_description():
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    missing = sorted(c.dest for c in sub._choices_actions if not (c.help or "").strip())
    assert not missing, f"commands without help: {missing}"


def test_every_option_and_positional_has_help_text():
    missing = [_label(name, a) for name, a in _arguments()
               if a.help is None or a.help == argparse.SUPPRESS or not a.help.strip()]
    assert not missing, "no help text: " + ", ".join(missing)


def test_every_default_is_stated_in_the_help():
    # a default that is neither None nor False (a flag's off) is a value the user gets without
    # asking: the help names it, as "%(default)s" or written out ("default 60" for 60.0)
    commands = _commands()
    unstated = []
    for name, action in _arguments():
        default = action.default
        if default is None or default is False or default == argparse.SUPPRESS:
            continue
        text = _rendered(commands[name], action)
        if "default" not in text.lower() or not any(form in text for form in _default_forms(default)):
            unstated.append(f"{_label(name, action)} (default {default!r}): {text!r}")
    assert not unstated, "default not stated:\n" + "\n".join(unstated)


@pytest.mark.parametrize("name", sorted(COMMANDS | {""}))
def test_help_renders(name, capsys):
    # a stray '%' in a help text only fails when --help formats it: every page is formatted here
    text = _commands()[name].format_help()
    assert "usage: bucketplan" in text


def test_solve_and_solve_dir_default_to_the_same_objective_step():
    commands = _commands()
    solve = commands["solve"].parse_args(["problem.json", "-o", "plan.json"])
    solve_dir = commands["solve-dir"].parse_args(["plans"])
    assert solve.objective == solve_dir.objective == "step"


MAIN_MAX_LINES = 200  # bucketplan/cli/__init__.py: the parser and the dispatch, nothing else
COMMAND_MAX_LINES = 300  # each module of bucketplan/cli/


def test_every_command_lives_in_its_own_module_with_its_parser():
    # `solve-dir` is bucketplan/cli/solve_dir.py; the function a command runs is defined in the
    # module that adds its subparser, so the flags and the code that reads them sit together
    import importlib

    for name, parser in _commands().items():
        if not name:
            continue
        module = f"bucketplan.cli.{name.replace('-', '_')}"
        importlib.import_module(module)
        assert parser.get_default("func").__module__ == module, name


def test_the_main_module_and_every_command_module_stay_short():
    import bucketplan.cli
    from pathlib import Path

    main = Path(bucketplan.cli.__file__)
    lines = {path.name: len(path.read_text().splitlines()) for path in main.parent.glob("*.py")}
    assert lines.pop("__init__.py") < MAIN_MAX_LINES
    assert {f"{name.replace('-', '_')}.py" for name in COMMANDS} <= set(lines)
    long = {name: n for name, n in lines.items() if n >= COMMAND_MAX_LINES}
    assert not long, long
