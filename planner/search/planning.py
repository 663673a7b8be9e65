"""The one front door to planning: ``planner.plan(problem, spec) -> SolveResult``.

Why this exists: the free-positions pipeline (CP-SAT's anchored step plan, then the positioned
search from it, then the floor, then optionally CP-SAT over the search plan's candidate space) was
assembled by hand in the command line, solve-dir and compare, each splitting the time its own way.
Here a ``PlanSpec`` says what is wanted (the mode, the budget of time, the policy with the peak
inside it, proof, seed, workers, starts); ``plan`` checks it, runs the mode's entry of the registry
(``planner.search.planners.MODES``) and returns the plan with its bound, scope and gap. Every
command and job calls this; none assembles a pipeline of searches itself
(``tests/test_front_door.py`` walks them).

The time shares live in one table here (``TIME_SHARES``), read by every mode that splits a
budget between stages.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, fields, replace

import planner.core.arguments as arguments
from planner.core.arguments import ArgumentError
from planner.core.options import OBJECTIVES, SolveOptions
from planner.core.policy import Policy
from planner.core.problem import Plan, Problem
from planner.search.result import SolveResult

# How each mode that runs stages in turn shares its budget of time: stage -> share. One table, so
# no caller splits a budget again.
# - free positions: CP-SAT's anchored step search gets ``anchored`` of the budget, at most
#   ``anchored_max_s`` seconds; the positioned search gets the rest. Why a cap: on an 8-layer
#   FSDP step the positioned search's best plan comes from the per-block seed, not from CP-SAT's
#   anchored plan, and it gains with the evaluations it gets (the annealing runs); CP-SAT's plan
#   matters where no per-block seed exists (a graph without module names) and is found in seconds.
#   Measured (experiments/results/time_shares): llama3-8b-fsdp-8 @ h100-8nodes within torch
#   default's peak, 300 s, seeds 0-1: this table from the command line 180.73 and 179.65 ms, every
#   second to the positioned search 180.78 and 180.58 (gaps to the floor 3.6-4.2%).
# - robust: each scenario's step search an equal share, and one more share for the regret search
#   (``planner.search.scenarios.robust_plan`` splits it so).
# - proof in the main jobs (compare's free-position rows, solve-dir --positions free): on a problem
#   of at most ``prove_most_collectives`` collectives (a 2-layer Llama-3 step: 62 on
#   llama3-8b-fsdp-2) and no contention, ``prove`` of the time goes to CP-SAT over the plan's
#   candidate space (``PlanSpec.prove_s``), which can close there (`solve --positions free --prove`
#   proved llama3-8b-fsdp-2 OPTIMAL in 3.5-12.5 s); deeper problems give it all to the search.
TIME_SHARES = {
    "free": {"anchored": 0.2, "anchored_max_s": 10.0},
    "proof": {"prove": 0.5, "prove_most_collectives": 100},
}


def anchored_seconds(total_s: float) -> float:
    """The seconds of a free-positions budget that CP-SAT's anchored step search gets
    (``TIME_SHARES['free']``); the positioned search gets the rest."""
    share = TIME_SHARES["free"]
    return min(total_s * share["anchored"], share["anchored_max_s"])


def proof_seconds(problem: Problem, total_s: float) -> float | None:
    """The seconds of a main job's free-positions budget that CP-SAT's proof over the plan's
    candidate space gets on ``problem`` (``TIME_SHARES['proof']``); None: none (too large, or
    under contention, which CP-SAT's positioned model does not count)."""
    share = TIME_SHARES["proof"]
    if problem.contention != 1.0 or len(problem.collectives) > share["prove_most_collectives"]:
        return None
    return total_s * share["prove"]


@dataclass(frozen=True)
class Budget:
    """How long a plan may take: ``seconds`` of wall clock, or with ``deterministic`` of CP-SAT's
    deterministic time and, for a local search, as many evaluations as that many seconds give on
    this problem (``position_search.deterministic_evaluations``): the same plan on any machine,
    the wall clock a guard only (``solver.DETERMINISTIC_WALL_FACTOR`` times it)."""

    seconds: float = 60.0
    deterministic: bool = False

    def __post_init__(self) -> None:
        arguments.positive_number(self.seconds, "seconds")
        arguments.flag(self.deterministic, "deterministic")


@dataclass(frozen=True)
class PlanSpec:
    """What ``plan`` is asked for, checked once when built (one ``ArgumentError`` naming the field).

    ``mode``: an entry of ``planners.MODES`` ("anchored": CP-SAT, each bucket where torch scheduled
    a member; "free": also where each bucket starts and waits, within a peak; "robust": the least
    worst-case regret across ``scenarios``). ``objective``: what an anchored search minimizes
    (free and robust: the step). ``budget``: the time. ``policy``: the rules a plan keeps, the peak
    memory cap inside it (``peak_memory_bytes``); None: the mode's own (anchored: torch's overlap
    kept, no cap; free: overlap priced not kept, and the peak of the hint or of the unbucketed
    schedule, whichever is higher). ``prove_s``: free only, seconds (deterministic time with a
    deterministic budget) of CP-SAT over the search plan's candidate space after the search, on top
    of the budget. ``seed``, ``workers`` and ``window``: the searches'. ``per_block``: free, the
    per-block plan is a start too. ``hint``: a plan to start from (CP-SAT's hint, a start of the
    positioned search, the default peak's yardstick). ``starts``: free, more starts.
    ``anchored_start``: free, CP-SAT's anchored step plan is searched first as a start (False: the
    starts given are enough). ``fallback_plans`` and ``count_plan``: anchored, plans the result is
    never worse than (``planner.solve``). ``probe``: anchored count searches probe their bound."""

    mode: str = "anchored"
    objective: str = "step"
    budget: Budget = Budget()
    policy: Policy | None = None
    prove_s: float | None = None
    seed: int = 0
    workers: int = 2
    window: int | str | None = "auto"
    per_block: bool = True
    scenarios: tuple[str, ...] = ()
    hint: Plan | None = None
    starts: tuple[Plan, ...] = ()
    anchored_start: bool = True
    fallback_plans: tuple[Plan, ...] = ()
    count_plan: Plan | None = None
    probe: bool = True

    def __post_init__(self) -> None:
        from planner.search import planners

        if self.mode not in planners.MODES:
            raise ArgumentError("mode", f"unknown mode {self.mode!r}; use one of {', '.join(planners.MODES)}")
        if self.objective not in OBJECTIVES:
            raise ArgumentError("objective", f"unknown objective {self.objective!r}; use one of {OBJECTIVES}")
        if not isinstance(self.budget, Budget):
            raise ArgumentError("budget", f"budget must be a planner.Budget, not {type(self.budget).__name__}")
        if self.policy is not None and not isinstance(self.policy, Policy):
            raise ArgumentError("policy", f"policy must be a planner.Policy or None, not {type(self.policy).__name__}")
        if self.prove_s is not None:
            arguments.positive_number(self.prove_s, "prove_s")
        arguments.seed(self.seed, "seed")
        arguments.worker_count(self.workers, "workers")
        arguments.window(self.window, "window")
        for name in ("per_block", "anchored_start", "probe"):
            arguments.flag(getattr(self, name), name)
        for name in ("starts", "fallback_plans", "scenarios"):
            if not isinstance(getattr(self, name), tuple):
                raise ArgumentError(name, f"{name} must be a tuple, not {type(getattr(self, name)).__name__}")
        planners.MODES[self.mode].check(self)

    def only_defaults(self, names: tuple[str, ...], mode: str) -> None:
        """Refuse (``ArgumentError`` naming the field) any of ``names`` set away from its default:
        a field another mode reads, which ``mode`` would otherwise ignore."""
        defaults = {f.name: f.default for f in fields(self)}
        for name in names:
            if getattr(self, name) != defaults[name]:
                raise ArgumentError(name, f"{name} is not the {mode} mode's")

    def anchored_options(self, seconds: float | None = None, objective: str | None = None) -> SolveOptions:
        """CP-SAT's options for this spec's anchored search of ``seconds`` (None: the whole
        budget): the policy's fields the CP-SAT model takes (``SolveOptions.POLICY_FIELDS``)."""
        policy = self.policy or Policy()
        return SolveOptions(time_limit_s=self.budget.seconds if seconds is None else seconds,
                            objective=objective or self.objective, workers=self.workers, seed=self.seed,
                            window=self.window, deterministic=self.budget.deterministic, probe=self.probe,
                            policy=Policy(**{f: getattr(policy, f) for f in SolveOptions.POLICY_FIELDS}))

    @classmethod
    def of_solve_options(cls, options: SolveOptions, **more) -> PlanSpec:
        """The anchored spec of ``planner.solve``'s options (the pipeline registry's ``cpsat``)."""
        return cls(mode="anchored", objective=options.objective,
                   budget=Budget(options.time_limit_s, options.deterministic), policy=options.policy,
                   seed=options.seed, workers=options.workers, window=options.window, probe=options.probe, **more)


@dataclass(frozen=True)
class Calls:
    """What a plan reports while it runs: ``progress``, one line per stage; ``search_progress``,
    the searches' own lines (incumbents, bounds); ``on_plan``, each verified plan as a stage finds
    it (a command keeps the best one for a Ctrl-C between stages)."""

    progress: Callable[[str], None] = lambda msg: None
    search_progress: Callable[[str], None] | None = None
    on_plan: Callable[[Plan], None] = lambda plan: None


def plan(problem: Problem, spec: PlanSpec = PlanSpec(), *, progress: Callable[[str], None] | None = None,
         search_progress: Callable[[str], None] | None = None,
         on_plan: Callable[[Plan], None] | None = None, started: float | None = None) -> SolveResult:
    """The plan ``spec`` asks for: its mode's search within its budget, counted from ``started``
    (a ``time.perf_counter`` value; None: now), its plan verified, its ``bound`` (ms, with
    ``bound_scope``) and ``gap``. A plan made for another problem (hint, starts) raises
    ``PlanMismatchError`` before any search; a peak no plan was found within raises
    ``planner.search.free.position_search.PeakNotReached`` (what it proves and what it reached).
    A Ctrl-C during a search returns its best verified plan so far (``stats['interrupted']``); one
    between stages propagates after ``on_plan`` has seen every plan found."""
    from planner.search import planners

    arguments.problem_and_plan(problem, None, optional=True)
    if not isinstance(spec, PlanSpec):
        raise ArgumentError("spec", f"spec must be a planner.PlanSpec, not {type(spec).__name__}")
    arguments.plans_of(problem, [p for p in (spec.hint, spec.count_plan, *spec.starts, *spec.fallback_plans)
                                 if p is not None], "spec's plans")
    for name, f in (("progress", progress), ("search_progress", search_progress), ("on_plan", on_plan)):
        arguments.callback(f, name)
    if started is not None:
        arguments.deadline(started, "started")
    if spec.prove_s is not None and problem.contention != 1.0:
        # the positioned model prices overlap as free, and each plan it returns is checked to
        # equal the simulator's step: at another contention it would certify the wrong step
        raise ArgumentError("prove_s", f"CP-SAT's positioned model has no contention yet (this problem's is "
                                       f"{problem.contention:g}); plan without it: the search and its floor "
                                       "count contention")
    calls = Calls(progress=progress or Calls.progress, search_progress=search_progress,
                  on_plan=on_plan or Calls.on_plan)
    t0 = time.perf_counter() if started is None else started
    result = planners.MODES[spec.mode].run(problem, spec, calls, t0)
    if result.plan is not None:
        _verified(problem, result.plan)
    return replace(result, wall_s=time.perf_counter() - t0)


def _verified(problem: Problem, plan_: Plan) -> None:
    """Every plan ``plan`` returns keeps the rules its params record (each search verifies; this is
    the last guard, by the independent verifier)."""
    from planner.rules.verifier import recorded_policy, verify

    violations = verify(problem, plan_, **recorded_policy(plan_))
    if violations:
        raise AssertionError(f"a search returned a plan that breaks a rule: {violations[0]}")


def floor(problem: Problem, peak_memory_bytes: int | None = None):
    """The least step any plan of ``problem`` can have, with any positions, within
    ``peak_memory_bytes`` (None: no cap): ``planner.cost.bounds.free_position_floor``, the bound
    the free mode reports (``.floor_ms``, ``.scope``)."""
    from planner.cost.bounds import free_position_floor

    return free_position_floor(problem, peak_memory_bytes=peak_memory_bytes)
