"""The rules for the arguments of the library's entry points, one function per rule.

Why this exists: ``time_limit_s=nan``, ``workers=0`` or ``seed=2**40`` would pass silently into
CP-SAT (an unbounded search, a silent default, MODEL_INVALID or a TypeError deep in ortools).
Each rule lives here once: the options objects (``planner.core.options``, ``planner.core.policy``) apply
them to their fields when built, ``planner.simulate`` and ``planner.verify`` to their arguments,
and the command line to the flags that build no options object, so a value is refused with the
same words wherever it comes from. Every function raises one ``ArgumentError`` (a ``ValueError``)
naming the argument, or ``PlanMismatchError`` (a ``ValueError``) for a plan of another problem.
"""

from __future__ import annotations

import math

from planner.core.problem import MAX_BYTES, Plan, Problem

# CP-SAT refuses more than 10,000 workers (kMaxReasonableParallelism in OR-Tools'
# ortools/sat/parameters_validation.cc: num_workers, and interleave_batch_size, which the solver
# sets to the worker count, are MODEL_INVALID above it; measured on 9.15: 10,000 runs, 10,001 is
# MODEL_INVALID)
MAX_WORKERS = 10_000
# CP-SAT's random_seed is an int32 (a larger one is a TypeError deep inside ortools)
SEED_RANGE = (-(2**31), 2**31 - 1)


class ArgumentError(ValueError):
    """An argument, or a field of an options object (``planner.core.options``), that its rule refuses;
    ``name`` is the one the message names (the command line names the flag that set it instead)."""

    def __init__(self, name: str, message: str):
        super().__init__(message)
        self.name = name


class PlanMismatchError(ValueError):
    """A plan handed to ``solve`` (``hint``), ``repair`` or ``simulate`` that cannot belong to the
    problem: it was made for another problem, or names collectives the problem does not have."""


def _is_integer(value) -> bool:
    # bool is an int in Python: True workers or seed is a mistake, not 1
    return isinstance(value, int) and not isinstance(value, bool)


def positive_number(value, name: str, *, zero_ok: bool = False) -> None:
    """A finite number above 0 (or 0 with ``zero_ok``): nan and inf are refused, since CP-SAT
    would run unbounded or not at all."""
    if not (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and (value > 0 or zero_ok and value == 0)):
        raise ArgumentError(name, f"{name} must be a {'non-negative' if zero_ok else 'positive'} number, not {value!r}")


def positive_integer(value, name: str) -> None:
    """A count: an integer from 1 (True is no count)."""
    if not _is_integer(value) or value < 1:
        raise ArgumentError(name, f"{name} must be a positive number, not {value!r}")


def non_negative_integer(value, name: str) -> None:
    """A count that may be 0 (a window of no neighbours): an integer from 0."""
    if not _is_integer(value) or value < 0:
        raise ArgumentError(name, f"{name} must be a non-negative integer, not {value!r}")


def deadline(value, name: str = "deadline", *, optional: bool = False) -> None:
    """A ``time.perf_counter()`` value, or inf for none (or None with ``optional``): nan never
    compares, so a search would never stop on it; -inf and a string are mistakes."""
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or value == -math.inf:
        raise ArgumentError(name, f"{name} must be a time.perf_counter() value or inf, not {value!r}")


def callback(value, name: str) -> None:
    """None or something to call (a progress callback that is a string fails only at its first line)."""
    if value is not None and not callable(value):
        raise ArgumentError(name, f"{name} must be None or callable, not {type(value).__name__}")


def plans_of(problem, plans, name: str = "plans") -> None:
    """A list or tuple of plans of ``problem``: each a Plan (``name[k]`` names the one that is not)
    that can belong to it (``PlanMismatchError`` otherwise)."""
    if not isinstance(plans, (list, tuple)):
        raise ArgumentError(name, f"{name} must be a list of plans, not {type(plans).__name__}")
    for k, plan in enumerate(plans):
        plan_of(problem, plan, f"{name}[{k}]")


def plan_of(problem, plan, name: str = "plan", *, optional: bool = False) -> None:
    """``plan`` is a Plan of ``problem`` (or None with ``optional``): ``problem_and_plan``'s types,
    then ``PlanMismatchError`` for a plan made for another problem."""
    problem_and_plan(problem, plan, name, optional=optional)
    if plan is not None:
        check_plan_matches(problem, plan)


def worker_count(value, name: str) -> None:
    """CP-SAT's workers: an integer from 1 to MAX_WORKERS (0 would silently become CP-SAT's
    default, a negative count or one above MAX_WORKERS is MODEL_INVALID)."""
    positive_integer(value, name)
    if value > MAX_WORKERS:
        raise ArgumentError(name, f"{name} must be at most {MAX_WORKERS} (CP-SAT's limit), not {value!r}")


def seed(value, name: str) -> None:
    """CP-SAT's random seed: an int32."""
    if not _is_integer(value) or not SEED_RANGE[0] <= value <= SEED_RANGE[1]:
        raise ArgumentError(name, f"{name} must be an integer from {SEED_RANGE[0]} to {SEED_RANGE[1]} "
                                  "(CP-SAT's range), "
                         f"not {value!r}")


def window(value, name: str) -> None:
    """A search window: "auto", None (the full model) or a positive number of same-key
    neighbours (0 or less would leave a collective no anchor but itself: a silent no-op search)."""
    if value == "auto" or value is None:
        return
    if not _is_integer(value) or value <= 0:
        raise ArgumentError(name, f"{name} must be 'auto', a positive integer, or none for the full model, "
                                  f"not {value!r}")


def memory_budget_bytes(value, name: str) -> None:
    """None (no budget) or a byte count from 0 to below MAX_BYTES, as a problem's byte counts
    (sums stay within CP-SAT's int64); a float is no byte count (nan, or a budget of 2.5 bytes)."""
    if value is not None and not (_is_integer(value) and 0 <= value < MAX_BYTES):
        raise ArgumentError(name, f"{name} must be None or an integer from 0 to below 2**62, not {value!r}")


def flag(value, name: str) -> None:
    """A boolean option (a string "no" is truthy: it must not silently mean True)."""
    if not isinstance(value, bool):
        raise ArgumentError(name, f"{name} must be True or False, not {value!r}")


def problem_and_plan(problem, plan, plan_name: str = "plan", *, optional: bool = False) -> None:
    """``problem`` is a Problem and ``plan`` a Plan (or None with ``optional``): a dict or a file
    name fails later with an AttributeError that names neither."""
    if not isinstance(problem, Problem):
        raise ArgumentError("problem", f"problem must be a planner.Problem, not {type(problem).__name__}")
    if plan is None and optional:
        return
    if not isinstance(plan, Plan):
        raise ArgumentError(plan_name, f"{plan_name} must be a planner.Plan{' or None' if optional else ''}, "
                         f"not {type(plan).__name__}")


def check_plan_matches(problem: Problem, plan: Plan) -> None:
    """Raise ``PlanMismatchError`` unless ``plan`` can be a plan of ``problem``.

    Why: the model and the repair index the problem's collectives by a plan's member names (a
    KeyError deep in ``repair`` otherwise), a plan of another problem would silently steer the
    search, and ``simulate`` would price it on the wrong graph. Fingerprints are compared when
    both are set (a problem built in code without ``with_fingerprint`` has none; files always
    have one)."""
    check_fingerprint(problem, plan)
    names = {c.name for c in problem.collectives}
    unknown = sorted({m for b in plan.buckets for m in b.members} - names)
    if unknown:
        more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
        raise PlanMismatchError(f"plan names collective(s) {unknown[:5]}{more} that the problem does not have")


def check_fingerprint(problem: Problem, plan: Plan) -> None:
    """Raise ``PlanMismatchError`` when ``plan`` records another problem's fingerprint (compared
    when both are set; cheap enough for a local search's thousands of replays)."""
    if plan.problem_fingerprint and problem.fingerprint and plan.problem_fingerprint != problem.fingerprint:
        raise PlanMismatchError(f"plan is for another problem (its problem_fingerprint "
                                f"{plan.problem_fingerprint[:19]}..., the problem's {problem.fingerprint[:19]}...)")
