"""The fastest plan of the candidate space within a memory cap, with CP-SAT's proof of how close
it is: ``planner.search.positioned``'s step model and memory cap, started from the best plan given.

Why this exists: the positioned search (``planner.search.position_search``) finds fast plans under a
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

import time

from ortools.sat.python import cp_model

from planner.cost.bounds import within_peak
from planner.cost.memory import memory_profile, peak_bytes
from planner.search.position_search import positioned_policy
from planner.search.positioned_cuts import add_phase_cuts
from planner.search.positioned import (MemoryCap, PositionedHandle, add_positioned_step,
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


def solve_capped(problem: Problem, plans: list[Plan], *, peak_memory_bytes: int | None, time_limit_s: float,
                 workers: int = 2, window: int = CAPPED_WINDOW, floor_ms: float = 0.0,
                 say=None) -> SolveResult:
    """The fastest plan of the candidate space of ``plans`` within ``peak_memory_bytes``
    (module docstring), from the fastest of ``plans`` within it, which must exist: a start the
    search keeps if it finds nothing better. The result: the plan's simulated step (``objective``,
    ms), its peak (``peak_bytes``), CP-SAT's status and bound over the capped candidate space
    ("OPTIMAL" or "FEASIBLE"; a bound of that space, not of every plan with any positions: its
    ``bound_scope`` says so). The candidate space's buckets are those of ``plans``, any member
    free to leave its bucket or join another of them; ``window``: the same-key neighbours a bucket
    may take members from besides those (``CAPPED_WINDOW`` by default)."""
    from planner.search.solver import _configured_solver, _Progress, _run_search

    t0 = time.perf_counter()
    policy = positioned_policy(peak_memory_bytes).as_params()
    legal = [p for p in plans if not verify(problem, p, **policy)]
    if not legal:
        raise ValueError("no plan given is within the rules and the peak-memory cap: nothing to start from")
    best = min(legal, key=lambda p: step_ms(problem, p))
    best_ms = step_ms(problem, best)
    # the best plan first: its buckets' order is the model's order of several starts at one place
    found = candidates(problem, [best] + [p for p in legal if p is not best])
    instants: list[float] = []
    if peak_memory_bytes is not None:
        instants = sorted(set(_fullest(problem, best, FIRST_INSTANTS) + _fullest(problem, None, FIRST_INSTANTS // 2)))
    stats: dict = {"rounds": 0, "instants": 0, "window": window,
                   "candidates_start": sum(map(len, found.starts.values())),
                   "candidates_wait": sum(map(len, found.waits.values()))}
    status, bound_ms = "FEASIBLE", floor_ms
    while True:
        left = time_limit_s - (time.perf_counter() - t0)
        if left <= 0.05:
            break
        stats["rounds"] += 1
        t_build = time.perf_counter()
        h, cap = _model(problem, found, peak_memory_bytes, instants, window, floor_ms)
        twin, _ = _model(problem, found, peak_memory_bytes, instants, window, floor_ms)
        t_hint = time.perf_counter()
        hinted = hint_fully(h, twin, best, time_limit_s=min(10.0, left / 4))
        stats.setdefault("rounds_s", []).append({"build": round(t_hint - t_build, 2),
                                                "hint": round(time.perf_counter() - t_hint, 2),
                                                "hinted": hinted})
        stats["instants"] = len(instants)
        solver = _configured_solver(workers, 0, wall_s=time_limit_s - (time.perf_counter() - t0),
                                    deterministic_s=time_limit_s)
        cb = _Progress(say, t0, objective="step")
        code = _run_search(solver, h.model, cb)
        if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            if code == cp_model.INFEASIBLE:
                raise AssertionError("the capped model refused the plan it was started from")
            break
        bound_ms = max(bound_ms, (solver.best_objective_bound - h.slack_ns) / 1e6)
        plan = h.extract(solver, params={**policy, "window": window})
        wrong = verify(problem, plan, **{**policy, "peak_memory_bytes": None})
        if wrong:
            raise AssertionError(f"the positioned model returned a plan the verifier refuses: {wrong[0]}")
        over = _fullest(problem, plan, INSTANTS_PER_ROUND, peak_memory_bytes) if peak_memory_bytes is not None else []
        plan_ms = step_ms(problem, plan)
        stats.setdefault("model_vs_simulated_ns", []).append(round((model_step_ms(h, solver) - plan_ms) * 1e6))
        if not over:
            if plan_ms < best_ms:
                best, best_ms = plan, plan_ms
            status = "OPTIMAL" if code == cp_model.OPTIMAL else "FEASIBLE"
            break
        # over the cap somewhere the model did not look yet: look there too, and search again
        instants = sorted(set(instants) | set(over))
        if cb.interrupted:
            break
    stats["seconds"] = round(time.perf_counter() - t0, 2)
    space = f"every plan of the candidate space (the plans' buckets, window {window})"
    stats["bound_scope"] = within_peak(space, peak_memory_bytes)
    bound = min(bound_ms, best_ms)
    return SolveResult(plan=best, status=status, objective=best_ms, bound=bound, gap=gap_of(best_ms, bound),
                       wall_s=time.perf_counter() - t0, stats=stats, peak_bytes=peak_bytes(problem, best))
