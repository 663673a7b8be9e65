"""The ``bucketplan`` command line.

This module builds the parser and dispatches; each command is one module beside it
(``extract.py``, ``solve.py``, ...) that adds its own subparser (``add_parser``) and runs it
(``run``); ``common.py`` and ``options.py`` hold what several commands share. Torch-free
commands (``verify``, ``solve``) import only ``planner``; the others import ``fxglue`` (and
torch) when they run. These modules import only the standard library at their top, so that a
Ctrl-C while the packages load is caught by ``main`` (exit 130, one line).
"""

from __future__ import annotations

import argparse
import os
import sys

from bucketplan.cli.common import CLIError
from bucketplan.cli.ctrl_c import CtrlC


def build_parser() -> argparse.ArgumentParser:
    from importlib.metadata import PackageNotFoundError, version

    from bucketplan.cli import (apply, check, compare, extract, solve, solve_dir, sweep, verify,
                                workloads)

    p = argparse.ArgumentParser(prog="bucketplan", description=__doc__.splitlines()[0] + " "
                                "Plans bucketing of collectives in PyTorch training graphs.")
    try:
        mine = version("bucketplan")
    except PackageNotFoundError:  # run from a checkout that is not installed
        mine = "unknown (not installed)"
    p.add_argument("--version", action="version", version=f"bucketplan {mine}")
    sub = p.add_subparsers(dest="command", required=True)
    # in the order --help lists them
    for command in (workloads, extract, verify, solve, solve_dir, sweep, compare, check, apply):
        command.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    ctrl_c = CtrlC.install()
    try:
        code = _main(argv)
    except KeyboardInterrupt:  # one that came between _main's own handlers and its return
        print("bucketplan: interrupted", file=sys.stderr)
        code = 130
    finally:
        # the process exits next when it runs as the command (argv None)
        ctrl_c.uninstall(exiting=argv is None)
    return code


def _main(argv: list[str] | None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import logging

    # torch's inductor passes log at INFO on their own loggers (pre-bucketing summaries): the
    # command line reports what matters itself
    logging.getLogger("torch._inductor").setLevel(logging.WARNING)
    try:
        parser = build_parser()  # imports planner and the presets: seconds on a cold start
    except (KeyboardInterrupt, ImportError, RuntimeError) as e:
        if not _by_ctrl_c(e):
            raise
        print("bucketplan: interrupted while starting", file=sys.stderr)
        return 130
    args = parser.parse_args(argv)
    try:
        return _run(args)
    except (KeyboardInterrupt, ImportError, RuntimeError) as e:
        if not _by_ctrl_c(e):
            raise
        # a command that keeps a result at Ctrl-C returns 130 itself; this one came while it
        # traced, loaded or wrote (each file is written whole or not at all)
        print(f"bucketplan {args.command}: interrupted", file=sys.stderr)
        return 130


def _by_ctrl_c(e: BaseException) -> bool:
    """A KeyboardInterrupt, or an error it caused: Ctrl-C while a C extension initializes
    surfaces as "ImportError: initialization failed" with the KeyboardInterrupt as its context
    (OR-Tools), and one inside a class body's ``__set_name__`` (a dataclass field) as
    "RuntimeError: Error calling __set_name__" caused by it (seen while planner's modules loaded)."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


def _run(args) -> int:
    """The command ``args`` names, with its errors as one line and exit 2."""
    try:
        code = args.func(args)
        sys.stdout.flush()  # here, so a closed pipe raises below and not at interpreter exit
        return code
    except BrokenPipeError:
        if not _stdout_gone():
            raise  # another pipe broke (a gloo rank died in `check`): not ours to hide
        # the reader went away (`bucketplan workloads | head -1`): Python's documented idiom --
        # point stdout at devnull so the final flush cannot raise again, and exit as a tool
        # killed by SIGPIPE would (128 + 13), quietly
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):  # stdout without a file descriptor (captured in tests)
            pass
        return 141
    except CLIError as e:
        print(f"bucketplan {args.command}: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - planner errors name the offending item
        from planner.core.io import SchemaError
        from planner.search.solver import PlanMismatchError

        # PlanMismatchError: a plan of another problem given to solve/repair through an API
        # caller (compare's sibling greedy-plan.json); `solve --hint` names its file itself
        if isinstance(e, (SchemaError, PlanMismatchError)):
            print(f"bucketplan {args.command}: error: {e}", file=sys.stderr)
            return 2
        raise


def _stdout_gone() -> bool:
    """Whether stdout is a pipe whose reader has closed it (poll reports an error on it)."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(0))
    except (OSError, ValueError, AttributeError):  # no file descriptor, or no poll (Windows)
        return False
