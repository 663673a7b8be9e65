"""The fastest plan of the candidate space within a memory cap, with CP-SAT's proof of how close
it is: ``planner.search.free.model``'s step model and memory cap, started from the best plan given.

Why this exists: the positioned search (``planner.search.free.position_search``) finds fast plans under a
peak budget but proves nothing, and treats the peak as a filter. Here the same plans are hints of
one CP-SAT model whose constraints include the cap, so the answer carries a bound over every plan
of the candidate space within the cap (``Candidates``: the members' own places, prefetch and
defer places, the earliest start and latest wait the data allow, and every place the plans given
use).

The cap is exact but lazy: the model constrains the memory at the instants where the plans seen
so far were fullest; a solution over the cap elsewhere adds the instants where it was over and the
search goes on from the best plan within the cap. Every instant added holds for every plan, so
each bound reported is a bound of the capped space. Every plan returned is verified (the
positioned policy, the peak by ``planner.cost.memory``) and simulated.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from ortools.sat.python import cp_model

import planner.core.arguments as arguments
from planner.cost.bounds import within_peak
from planner.cost.memory import memory_profile, peak_bytes
from planner.search.free.position_search import positioned_policy
from planner.search.free.cuts import add_phase_cuts
from planner.search.free.model import (Candidates, MemoryCap, PositionedHandle, add_positioned_step,
                                       build_positioned_model, candidates, hint_fully, model_step_ms)
from planner.core.problem import Plan, Problem
from planner.cost.simulator import step_ms
from planner.rules.verifier import verify
from planner.search.result import SolveResult, gap_of

# instants of a plan's memory profile the model constrains from the start (its fullest), and at
# most this many more per round where a solution went over the cap
FIRST_INSTANTS = 48
INSTANTS_PER_ROUND = 64
# a round that found no plan within the cap gets at least this much of the time left (s)
MIN_ROUND_S = 2.0
# the default candidate space's window: the buckets of the plans given, any member free to leave
# its bucket or join another of them. Wider membership relaxes to buckets of any size: measured on
# llama3-8b-fsdp-2 @ h100-8nodes within torch manual's peak, CP-SAT's bound after 60 s stayed
# near 82 ms at window 2 and 69 ms at 16 against 104 ms plans, where window 0 is proved.
CAPPED_WINDOW = 0


def _model(problem: Problem, found, cap_bytes: int | None, instants: list[float], window: int,
           floor_ms: float) -> tuple[PositionedHandle, MemoryCap | None]:
    h = build_positioned_model(problem, found, window=window)
    add_positioned_step(h, floor_ms=floor_ms)
    cap = None
    if cap_bytes is not None:
        cap = MemoryCap(h, cap_bytes)  # with the phase cuts the cap sharpens
        cap.add(instants)
    else:
        add_phase_cuts(h, None, set())
    return h, cap


def _fullest(problem: Problem, plan: Plan | None, most: int, over: int | None = None) -> list[float]:
    """The ``most`` fullest instants of ``plan``'s profile (only those above ``over``, if given)."""
    profile = sorted(memory_profile(problem, plan), key=lambda kv: -kv[1])
    return [t for t, held in profile[:most] if over is None or held > over]


@dataclass(frozen=True)
class CappedModelOptions:
    """How ``solve_capped`` searches: CP-SAT's ``workers``; the candidate space's ``window`` (the
    same-key neighbours a bucket may take members from besides those of the plans given);
    ``deterministic``: the time limit counts CP-SAT's deterministic time, the wall clock only
    guards (``DETERMINISTIC_WALL_FACTOR`` times it), so the same plans, workers and limit give the
    same answer on any machine."""

    workers: int = 2
    window: int = CAPPED_WINDOW
    deterministic: bool = False

    def __post_init__(self) -> None:
        # checked here, as SolveOptions' fields: a bad one otherwise fails deep in CP-SAT (a
        # TypeError from its bindings, MODEL_INVALID) or is taken silently
        arguments.worker_count(self.workers, "workers")
        arguments.non_negative_integer(self.window, "window")
        arguments.flag(self.deterministic, "deterministic")


def solve_capped(problem: Problem, plans: list[Plan], *, peak_memory_bytes: int | None, time_limit_s: float,
                 floor_ms: float = 0.0, say=None, search: CappedModelOptions = CappedModelOptions()) -> SolveResult:
    """The fastest plan of the candidate space of ``plans`` within ``peak_memory_bytes``
    (module docstring), from the fastest of ``plans`` within it, which must exist: a start the
    search keeps if it finds nothing better. The result: the plan's simulated step (``objective``,
    ms), its peak (``peak_bytes``), CP-SAT's status and bound over the capped candidate space
    ("OPTIMAL" or "FEASIBLE"; a bound of that space, not of every plan with any positions: its
    ``bound_scope`` says so). The candidate space's buckets are those of ``plans``, any member
    free to leave its bucket or join another of them, and members from ``search.window``
    neighbours. A Ctrl-C stops the search and keeps the best plan within the cap
    (``stats['interrupted']``); ``stats['wall_limit_hit']``: a deterministic search that the wall
    clock stopped first (another run may differ)."""
    _validate(problem, plans, peak_memory_bytes, time_limit_s, floor_ms, say, search)
    t0 = time.perf_counter()
    policy = positioned_policy(peak_memory_bytes).as_params()
    legal = [p for p in plans if not verify(problem, p, **policy)]
    if not legal:
        raise ValueError("no plan given is within the rules and the peak-memory cap: nothing to start from")
    best = min(legal, key=lambda p: step_ms(problem, p))
    # its plans say what they are as the best plan given does (a positioned search's: objective,
    # positions, seed), with the positioned policy they were verified under and the window
    params = {**{k: v for k, v in best.params.items() if k != "bound"}, **policy, "window": search.window}
    # the best plan first: its buckets' order is the model's order of several starts at one place
    found = candidates(problem, [best] + [p for p in legal if p is not best])
    run = _CappedRun(problem, found, peak_memory_bytes, floor_ms, search, policy, params, best, step_ms(problem, best))
    run.stats.update(window=search.window, candidates_start=sum(map(len, run.found.starts.values())),
                     candidates_wait=sum(map(len, run.found.waits.values())))
    if peak_memory_bytes is not None:
        run.instants = sorted(set(_fullest(problem, best, FIRST_INSTANTS) + _fullest(problem, None, FIRST_INSTANTS // 2)))
    run.search_all(t0, time_limit_s, say)
    run.stats["seconds"] = round(time.perf_counter() - t0, 2)
    space = (f"every plan of the candidate space (the plans' buckets, window {search.window}; several starts at "
             f"one place in the best plan's order)")
    run.stats["bound_scope"] = within_peak(space, peak_memory_bytes)
    bound = min(run.bound_ms, run.best_ms)
    plan = run.best.model_copy(update={"params": {**run.best.params, "interrupted": run.stats["interrupted"]}})
    return SolveResult(plan=plan, status=run.status, objective=run.best_ms, bound=bound,
                       gap=gap_of(run.best_ms, bound), wall_s=time.perf_counter() - t0, stats=run.stats,
                       peak_bytes=peak_bytes(problem, run.best))


def _validate(problem, plans, peak_memory_bytes, time_limit_s, floor_ms, say, search) -> None:
    """``solve_capped``'s arguments, before any model is built: one ``ArgumentError`` naming the
    argument, ``PlanMismatchError`` for a plan of another problem."""
    arguments.problem_and_plan(problem, None, optional=True)
    arguments.plans_of(problem, plans, "plans")
    arguments.memory_budget_bytes(peak_memory_bytes, "peak_memory_bytes")
    arguments.positive_number(time_limit_s, "time_limit_s")
    arguments.positive_number(floor_ms, "floor_ms", zero_ok=True)
    arguments.callback(say, "say")
    if not isinstance(search, CappedModelOptions):
        raise arguments.ArgumentError("search", f"search must be a CappedModelOptions, not {type(search).__name__}")


@dataclass
class _CappedRun:
    """One ``solve_capped``: the rounds of CP-SAT over the capped model, the instants it
    constrains, and the best plan within the cap so far."""

    problem: Problem
    found: Candidates
    cap: int | None
    floor_ms: float
    search: CappedModelOptions
    policy: dict  # the positioned policy's verify arguments
    params: dict  # the params of the plans the model writes
    best: Plan  # the fastest plan within the cap so far (at first the fastest given)
    best_ms: float
    instants: list[float] = field(default_factory=list)
    status: str = "FEASIBLE"
    bound_ms: float = 0.0
    stats: dict = field(default_factory=lambda: {"rounds": 0, "instants": 0, "interrupted": False,
                                                 "wall_limit_hit": False})

    def search_all(self, t0: float, time_limit_s: float, say) -> None:
        """Rounds until one finds a plan within the cap (or the time is out): each adds the
        instants where the last solution was over it. Deterministic: each round gets the
        deterministic time left, and the wall clock only guards (a guard that stops the search
        says so in ``wall_limit_hit``)."""
        from planner.search.solver import DETERMINISTIC_WALL_FACTOR

        self.bound_ms = self.floor_ms
        deadline = t0 + time_limit_s * (DETERMINISTIC_WALL_FACTOR if self.search.deterministic else 1.0)
        det_left = time_limit_s if self.search.deterministic else math.inf
        while det_left > 0.05:
            if deadline - time.perf_counter() <= 0.05:
                self.stats["wall_limit_hit"] = self.search.deterministic
                return
            used, done = self._round(t0, deadline, det_left, say)
            det_left -= used
            if done:
                return

    def _round(self, t0: float, deadline: float, det_left: float, say) -> tuple[float, bool]:
        """One CP-SAT solve until ``deadline`` (wall) or ``det_left`` (deterministic time);
        (its deterministic time, whether the search is over)."""
        from planner.search.solver import configured_solver, SearchProgress, run_search

        problem, cap = self.problem, self.cap
        self.stats["rounds"] += 1
        t_build = time.perf_counter()
        h, _ = _model(problem, self.found, cap, self.instants, self.search.window, self.floor_ms)
        twin, _ = _model(problem, self.found, cap, self.instants, self.search.window, self.floor_ms)
        t_hint = time.perf_counter()
        # the plan's choices fixed: solved in well under a second; a cut-short hint changes the
        # search, which a deterministic run must say (wall_limit_hit)
        hinted = hint_fully(h, twin, self.best, time_limit_s=min(10.0, max(0.05, (deadline - t_hint) / 4)))
        self.stats.setdefault("rounds_s", []).append({"build": round(t_hint - t_build, 2),
                                                     "hint": round(time.perf_counter() - t_hint, 2), "hinted": hinted})
        self.stats["instants"] = len(self.instants)
        self.stats["wall_limit_hit"] |= self.search.deterministic and not hinted
        wall = deadline - time.perf_counter()  # the build and the hint count too
        if wall <= 0.05:
            self.stats["wall_limit_hit"] |= self.search.deterministic
            return 0.0, True
        solver = configured_solver(self.search.workers, 0, wall_s=wall, deterministic_s=min(det_left, 1e9))
        cb = SearchProgress(say, t0, objective="step")
        code = run_search(solver, h.model, cb)
        self.stats["interrupted"] = cb.interrupted
        if self.search.deterministic and code != cp_model.OPTIMAL and solver.wall_time >= wall * 0.99:
            self.stats["wall_limit_hit"] = True
        if code == cp_model.INFEASIBLE and hinted or code == cp_model.MODEL_INVALID:
            raise AssertionError(f"the capped model refused the plan it was started from ({solver.status_name(code)})")
        if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return solver.deterministic_time, True
        self.bound_ms = max(self.bound_ms, (solver.best_objective_bound - h.slack_ns) / 1e6)
        if hinted and self.bound_ms > self.best_ms + h.slack_ns / 1e6 + 1e-6:
            # the start is a plan of the space: a bound above its simulated step is a mispriced model
            raise AssertionError(f"the capped model's bound {self.bound_ms:.6f} ms lies above the plan it was "
                                 f"started from ({self.best_ms:.6f} ms simulated)")
        plan = h.extract(solver, params=self.params)
        wrong = verify(problem, plan, **{**self.policy, "peak_memory_bytes": None})
        if wrong:
            raise AssertionError(f"the positioned model returned a plan the verifier refuses: {wrong[0]}")
        over = _fullest(problem, plan, INSTANTS_PER_ROUND, cap) if cap is not None else []
        plan_ms = step_ms(problem, plan)
        off_ns = round((model_step_ms(h, solver) - plan_ms) * 1e6)
        self.stats.setdefault("model_vs_simulated_ns", []).append(off_ns)
        if abs(off_ns) > h.slack_ns + 1:
            raise AssertionError(f"the capped model's step {model_step_ms(h, solver):.6f} ms is not the simulator's "
                                 f"{plan_ms:.6f} ms for the plan it returned")
        if not over:
            if plan_ms < self.best_ms:
                self.best, self.best_ms = plan, plan_ms
            self.status = "OPTIMAL" if code == cp_model.OPTIMAL and not cb.interrupted else "FEASIBLE"
            return solver.deterministic_time, True
        # over the cap somewhere the model did not look yet: look there too, and search again
        self.instants = sorted(set(self.instants) | set(over))
        return solver.deterministic_time, cb.interrupted
