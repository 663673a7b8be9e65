"""What several commands share: the one-line error, the progress line, the checks of numeric
flags and output paths (made before any work), and the report lines two commands print alike.

Imports only the standard library at its top: planner is imported where a check needs it.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path


class CLIError(Exception):
    """A user-facing error: printed without a traceback, exit status 2."""


def progress(quiet: bool):
    """``say(msg)``: ``msg`` on stderr after the seconds since this call (silent under -q)."""
    start = time.perf_counter()

    def say(msg: str) -> None:
        if not quiet:
            print(f"[{time.perf_counter() - start:7.1f}s] {msg}", file=sys.stderr, flush=True)

    return say


def fmt_counts(counts: dict[str, int]) -> str:
    total = sum(counts.values())
    parts = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
    return f"{total} ({parts})" if parts else "0"


def library_rule(rule, value, flag: str, **kw) -> None:
    """One of planner.core.arguments' rules (the library's, so that a flag and the argument it feeds
    are refused alike) applied to a flag: its ValueError becomes a one-line error naming the
    flag."""
    try:
        rule(value, flag, **kw)
    except ValueError as e:
        raise CLIError(str(e)) from None


def positive(value: float, flag: str, *, zero_ok: bool = False) -> None:
    import planner.core.arguments as arguments

    library_rule(arguments.positive_number, value, flag, zero_ok=zero_ok)


def seed(value: int, flag: str) -> None:
    import planner.core.arguments as arguments

    library_rule(arguments.seed, value, flag)  # CP-SAT's int32


def workers(value: int, flag: str) -> None:
    """CP-SAT workers: 0 silently became 2; -1 and more than CP-SAT's 10,000 gave MODEL_INVALID."""
    import planner.core.arguments as arguments

    library_rule(arguments.worker_count, value, flag)


def output_file(path: str, flag: str, inputs=()) -> None:
    """Refuse an output file that cannot be written, before any work: an existing directory or
    other non-regular file (the plan is written by renaming over it: -o /dev/null would replace
    the device), one of the command's ``inputs`` (``inputs_of``), or a folder that cannot be
    created or written. Writability is probed with a temporary file in the nearest existing
    folder, removed at once: permission bits say nothing for root or on a read-only or virtual
    filesystem (/sys)."""
    p = Path(path)
    if p.is_dir():
        raise CLIError(f"{flag} {path}: is a directory; give the plan file to write")
    if p.exists() and not p.is_file():
        raise CLIError(f"{flag} {path}: exists and is not a regular file")
    not_inputs([p], flag, path, inputs)
    writable_place(p.parent, flag, path)


def output_folder(path: str | Path, flag: str, inputs=()) -> None:
    """Refuse, before any work, an output folder the command replaces whole (from a new folder
    made beside it) when one of its ``inputs`` lies anywhere in it, or when its parent cannot take
    a new folder."""
    not_inputs([Path(path)], flag, str(path), inputs)
    writable_place(Path(path).absolute().parent, flag, str(path))


def not_inputs(places, flag: str, shown: str, inputs) -> None:
    """One line naming ``flag`` and the input when writing ``places`` (files, or folders standing
    for all under them) would overwrite or delete one of ``inputs`` ((label, path) pairs):
    the same file, through a symlink or a hard link too, or one inside such a folder."""
    from planner.core.io import clobbered_input

    hit = clobbered_input(places, inputs)
    if hit is None:
        return
    place, label, given, same = hit
    at = "" if place == str(shown) else f"{place} "  # a place under the folder the flag names
    raise CLIError(f"{flag} {shown}: {at}{'is' if same else 'holds'} {label} {given}, an input of this command"
                   + ("" if same else ", which writing there would overwrite or delete") + f"; give another {flag}")


# the flags (argparse dests) that name a file a command reads, as each is named in a refusal
_INPUT_FLAGS = (("problem", "the problem"), ("hint", "--hint"), ("graph", "--graph"),
                ("hf_config", "--hf-config"), ("profile", "--profile"), ("hardware", "--hardware"),
                ("spec", "the spec"))


def inputs_of(args) -> list[tuple[str, str]]:
    """Every file a command's flags name to read, as (how the refusal names it, path): what its
    outputs must not overwrite. One list for every command; flags a command lacks are skipped."""
    found = [(label, value) for dest, label in _INPUT_FLAGS
             if isinstance(value := getattr(args, dest, None), str) and value]
    found += [("--collectives", c) for c in getattr(args, "collectives", None) or ()]
    found += [("the problem", t) for t in getattr(args, "targets", None) or () if t.endswith(".json")]
    model = getattr(args, "model", None)
    if model and Path(module := model.rpartition(":")[0] or model).is_file():  # FILE.py:FACTORY
        found.append(("--model", module))
    for dest in ("robust", "scenarios"):  # measured collectives files among the scenario names
        names = getattr(args, dest, None) or ""
        found += [(f"--{dest}", n.strip()) for n in names.split(",") if n.strip() and Path(n.strip()).is_file()]
    return found


def writable_place(folder: Path, flag: str, shown: str) -> None:
    """``folder``, or the nearest folder above it that exists, takes a new file (a temporary one,
    removed at once)."""
    import tempfile

    while not folder.exists():  # ends at '.' or '/', which exist
        folder = folder.parent
    if not folder.is_dir():
        raise CLIError(f"{flag} {shown}: cannot create a folder there: {folder} is a file")
    try:
        fd, probe = tempfile.mkstemp(prefix=".bucketplan-probe-", dir=folder)
    except OSError as e:
        raise CLIError(f"{flag} {shown}: cannot write in {folder} ({e.strerror or e})") from None
    os.close(fd)
    os.unlink(probe)


# a memory flag's GB: 10^9 bytes, as every figure the command line prints (torch's own
# --max-bucket-memory-gb apart, which torch reads as GiB)
GB = 10**9


def gigabytes(gb: float | None, flag: str, *, zero_ok: bool = False) -> int | None:
    """A memory flag (--memory-budget-gb, --peak-memory-gb) in bytes, GB = 10^9 bytes (None: not
    given)."""
    from planner.core.problem import MAX_BYTES

    if gb is None:
        return None
    positive(gb, flag, zero_ok=zero_ok)
    budget = int(gb * GB)
    if budget >= MAX_BYTES:  # as a problem's byte counts: sums stay within CP-SAT's int64
        raise CLIError(f"{flag} {gb!r} is beyond any machine (below {MAX_BYTES // GB} GB)")
    return budget


def built(options_type, values: dict, flags: dict):
    """``options_type(**values)``, an options object checked when built: a value its rule refuses
    is one line naming the flag that set it (``flags``: field -> flag)."""
    from planner.core.arguments import ArgumentError

    try:
        return options_type(**values)
    except ArgumentError as e:
        flag = flags.get(e.name)
        raise CLIError(str(e).replace(e.name, flag, 1) if flag else str(e)) from None


# what --robust and --scenarios take, as their help says it
SCENARIOS_HELP = ("torch, published-comm, published-mfu, published, contention, contention=F, or a "
                  "measured collectives file; planner/search/scenarios.py")


def scenario_list(text: str, flag: str) -> list[str]:
    """A comma-separated list of scenario names (planner.search.scenarios.SCENARIOS, contention=F) or
    measured files, each checked now, not after minutes of search."""
    from planner.search.scenarios import (SCENARIOS, contention_of, is_named, measured_series,
                                          scenario_value)

    names = [x.strip() for x in text.split(",") if x.strip()]
    for name in names:
        if not is_named(name) and not Path(name).is_file():
            raise CLIError(f"{flag}: unknown scenario {name!r}; choose from "
                           f"{', '.join(SCENARIOS)}, contention=F or give a measured collectives "
                           "file")
        try:
            if is_named(name):
                contention_of(name)  # contention=F: F a factor from 1
            else:
                measured_series(name)  # parsed once: the re-pricing takes it from here
        except ValueError as e:
            raise CLIError(f"{flag}: {e}") from None
    if not names:
        raise CLIError(f"{flag} {text!r}: give distinct scenarios, e.g. torch,published")
    seen: dict = {}
    for name in names:  # by what each prices: contention=1 and contention=1.0 are one scenario
        value = scenario_value(name)
        if value in seen:
            raise CLIError(f"{flag} {text!r}: {seen[value]!r} and {name!r} are the same scenario; give "
                           "distinct scenarios, e.g. torch,published")
        seen[value] = name
    return names


def overlap_line(problem) -> str:
    """How the problem's schedule (torch's scheduler's, or the graph's own order) hides each
    collective, counted per collective: the same line in `extract` and `verify`."""
    status = {s: sum(c.status == s for c in problem.collectives)
              for s in ("hidden", "partly", "exposed")}
    where = "the graph's own order" if problem.meta.get("schedule") == "graph" else "torch's schedule"
    return (f"torch's overlap     of {len(problem.collectives)} collectives on {where}: "
            f"{status['hidden']} hidden behind compute, {status['partly']} partly hidden, "
            f"{status['exposed']} exposed")


def memory_line(problem, plan) -> str:
    """The plan's peak memory against the unbucketed schedule's, as torch's estimator counts it."""
    from planner.cost.memory import memory_timeline

    t = memory_timeline(problem, plan)
    gb = GB
    what = ("torch's estimator's accounting" if t.profiled
            else "no memory profile in this problem: the collectives' buffers only")
    return (f"peak memory         {t.peak_bytes / gb:.3f} GB planned, "
            f"{t.unbucketed_peak_bytes / gb:.3f} GB unbucketed "
            f"({t.extra_peak_bytes / gb:+.3f} GB; {what})")


def stamped(plan, args):
    """The plan as written: a --deterministic run records no creation time, so two runs write
    the same bytes."""
    return plan.model_copy(update={"created": ""}) if args.deterministic else plan


def with_bound(plan, bound_ms: float | None, scope: str, gap: float | None):
    """The plan with what the search proved about it in its params (``bound``: ms, the space the
    bound holds for, and the plan's gap to it), so the file says how good it is without its run's
    log. A count search's bound (collectives) is not a step: none is recorded then."""
    bound = {"bound_ms": None if bound_ms is None else round(bound_ms, 6), "scope": scope,
             "gap": None if gap is None else round(gap, 6)}
    return plan.model_copy(update={"params": {**plan.params, "bound": bound}})
