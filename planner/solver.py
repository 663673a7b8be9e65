"""Solve a bucketing problem with CP-SAT: always a time limit, an honest status, a verified plan.

Why this exists: users need more than a plan -- whether it is optimal, and if not, how far
from a proved bound it may be. ``solve`` builds the model (``planner.cpsat``), hints it with a
given plan (torch's greedy), runs CP-SAT deterministically, re-checks the answer with the
independent verifier, and never returns a plan worse than a feasible hint.
"""

from __future__ import annotations

import datetime as _dt
import math
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

from ortools.sat.python import cp_model

from planner.bounds import fixed_limits, key_lower_bounds, step_floor
from planner.cpsat import OBJECTIVES, ModelHandle, build_model, plan_objective
from planner.polish import anchored, polish
from planner.problem import Bucket, Plan, Problem
from planner.simulator import simulate
from planner.step import NS_PER_MS, add_step_objective, hint_every_variable
from planner.verifier import verify

STATUSES = ("OPTIMAL", "FEASIBLE", "INFEASIBLE", "UNKNOWN", "NOT_RUN")
# Above this many collectives the default search uses a candidate window (the full model's
# build and presolve alone exceed minutes at 32 layers); the bound then comes from
# planner.bounds, which holds for the whole problem.
AUTO_FULL_MODEL_MAX_COLLECTIVES = 320
AUTO_FULL_MODEL_MAX_PAIRS = 20_000  # candidate (collective, anchor) pairs; ddp-32 has 39k and stalls
AUTO_WINDOW = 16
# With probing, the main search keeps at least half the time limit and at least this many
# seconds (8-layer models need 20-30 s to reach their optimum: fsdp-8 proved in 22 s); the
# probe gets the rest. `bucketplan compare`'s 30 s per objective thus leaves no time to probe.
PROBE_MIN_MAIN_S = 30.0
# A windowed search that solves its restricted model early widens the window while at least
# this much time is left (see _widen).
WIDEN_MIN_S = 5.0
# A step plan is reported OPTIMAL when its simulated step is within this of the bound (ms): the
# model is a relaxation (a table link's curve by a minorant) with integer-ns rounding.
STEP_OPTIMAL_TOLERANCE_MS = 1e-3
# With deterministic=True the wall-clock limit is this multiple of the time limit, a guard only:
# CP-SAT's deterministic time accrued at about 0.7x wall time on this 2-core machine when idle
# (issue #14) and at 0.2x while a second job shared it (fsdp-2 step search, measured).
DETERMINISTIC_WALL_FACTOR = 20.0
# Share of a step search's time spent finding a fewest-collectives plan to start from, when the
# caller gives none (floor_plans).
STEP_COUNT_SHARE = 0.25
# Share of a step search's time kept for planner.polish (local search scored by the simulator) on
# the best plan: at 8 layers and more the CP-SAT step search mostly returns the plan it started
# from, while polish improves it within seconds (llama3-8b-fsdp-8 on 8 nodes: 253.0 -> 245.6 ms,
# a local optimum after 5 s). In deterministic runs polish is limited by evaluations instead.
POLISH_SHARE = 0.15
POLISH_EVALUATIONS_PER_S = 100


class PlanMismatchError(ValueError):
    """A plan handed to ``solve`` (``hint``) or ``repair`` that cannot belong to the problem: it
    was made for another problem, or names collectives the problem does not have."""


def check_plan_matches(problem: Problem, plan: Plan) -> None:
    """Raise ``PlanMismatchError`` unless ``plan`` can be a plan of ``problem``.

    Why here: the model and the repair index the problem's collectives by a plan's member names
    (a KeyError deep in ``repair`` otherwise), and a plan of another problem would silently steer
    the search. Fingerprints are compared when both are set (a problem built in code without
    ``with_fingerprint`` has none; files always have one)."""
    if plan.problem_fingerprint and problem.fingerprint and plan.problem_fingerprint != problem.fingerprint:
        raise PlanMismatchError(f"plan is for another problem (its problem_fingerprint "
                                f"{plan.problem_fingerprint[:19]}..., the problem's {problem.fingerprint[:19]}...)")
    names = {c.name for c in problem.collectives}
    unknown = sorted({m for b in plan.buckets for m in b.members} - names)
    if unknown:
        more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
        raise PlanMismatchError(f"plan names collective(s) {unknown[:5]}{more} that the problem does not have")


@dataclass
class SolveResult:
    """One result type for every planner: status, objective, bound, gap, wall time, plan."""

    plan: Plan | None
    status: str
    objective: float | None
    bound: float | None
    gap: float | None
    wall_s: float
    stats: dict = field(default_factory=dict)
    progress: list[tuple[float, float, float]] = field(default_factory=list)  # (t, incumbent, bound)

    def summary(self) -> str:
        gap = f"{self.gap:.1%}" if self.gap is not None else "n/a"
        return (f"status {self.status}, objective {self.objective}, bound {self.bound}, gap {gap}, "
                f"{self.wall_s:.1f}s")


class _Progress(cp_model.CpSolverSolutionCallback):
    """Incumbents and bounds as the search finds them, in the objective's units (ms for step;
    a step model's incumbent is its own estimate, the plan is re-simulated afterwards)."""

    def __init__(self, say: Callable[[str], None] | None, start: float, objective: str = "count"):
        super().__init__()
        self.say = say
        self.start = start
        self.interrupted = False  # Ctrl-C stopped a search (see _run_search): no later stage runs
        self.scale = NS_PER_MS if objective == "step" else 1
        self.unit = " ms" if objective == "step" else ""
        self.points: list[tuple[float, float, float]] = []

    def on_solution_callback(self) -> None:
        t = time.perf_counter() - self.start
        point = (round(t, 3), self.objective_value / self.scale, self.best_objective_bound / self.scale)
        self.points.append(point)
        if self.say:
            self.say(f"incumbent {point[1]:g}{self.unit}, bound {point[2]:g}{self.unit} at {t:.1f}s")


# The full-problem workers of a count search on a full model. CP-SAT's default portfolio runs
# eight of them, interleaved on our two workers, so each gets a quarter of a thread; on the
# 8-layer graphs two focused ones do better: the unsat-core search raises the bound (it proves
# fsdp-8 and 2d-8 without a probe) and the LP search finds plans. Measured with 60 s, 2 workers,
# greedy hint, on the 8 hardest 2/8-layer problems: all 8 proved, slowest 48 s (hf-qwen3-moe-8),
# where the default portfolio had left that one unproved (138 against 40) and hf-qwen3-8 took
# 50 s (now 18 s). Windowed searches and the time objective keep the default portfolio (their
# committed results were measured with it).
COUNT_SUBSOLVERS = ("core", "default_lp")


def _portfolio(objective: str, windowed: bool) -> tuple[str, ...]:
    """The full-problem workers for a search: focused for count searches on a full model (probes
    included), CP-SAT's default otherwise (see COUNT_SUBSOLVERS)."""
    return COUNT_SUBSOLVERS if objective == "count" and not windowed else ()


def _verified_plan(handle: ModelHandle, solver: cp_model.CpSolver, problem: Problem, objective: str, policy: dict,
                   stats: dict, *, params: dict, created: str) -> tuple[Plan | None, float | None]:
    """The solver's plan with its objective, re-checked by the independent verifier; (None, None)
    when the verifier rejects it (a modelling bug, recorded in ``stats['model_bug']``)."""
    plan = handle.extract(solver, planner="cpsat", params=params, created=created)
    violations = verify(problem, plan, **policy)
    if violations:
        stats["model_bug"] = [str(v) for v in violations[:5]]
        return None, None
    return plan, plan_objective(problem, plan, objective)


def _run_search(solver: cp_model.CpSolver, model: cp_model.CpModel, cb: "_Progress") -> int:
    """``solver.solve`` that a Ctrl-C stops within a moment, keeping what it found.

    CP-SAT's own SIGINT handling stops the search but says nothing, so the caller went on to
    its next stage and exited 0. Here the search runs in a thread while this one waits, so
    Python's KeyboardInterrupt arrives at once: the search is stopped, its incumbent kept, and
    ``cb.interrupted`` tells every later stage not to start."""
    if cb.interrupted:
        return cp_model.UNKNOWN
    solver.parameters.catch_sigint_signal = False
    if threading.current_thread() is not threading.main_thread():
        return solver.solve(model, cb)
    outcome: list = []
    done = threading.Event()  # not Thread.join: an interrupted join can report a live thread done

    def search() -> None:
        try:
            outcome.append(solver.solve(model, cb))
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            outcome.append(e)
        finally:
            done.set()

    threading.Thread(target=search, daemon=True).start()
    while True:
        try:
            while not done.wait(0.1):
                pass
            break
        except KeyboardInterrupt:
            cb.interrupted = True
            solver.stop_search()  # then wait for the search to hand back its incumbent
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0]


def _build(problem: Problem, objective: str, window: int | None, within: Plan | None, bounds: dict,
           policy: dict, floor_ms: float | None) -> ModelHandle:
    """The rule model with its objective; ``step`` adds the step variables of planner.step."""
    if objective != "step":
        return build_model(problem, objective=objective, window=window, within=within, **bounds, **policy)
    handle = build_model(problem, objective="count", window=window, within=within, **bounds, **policy)
    step = add_step_objective(handle, problem, floor_ms=floor_ms or 0.0)
    handle.objective = "step"
    handle.stats.update(step.stats, step_slack_ns=step.stats["step_events"] + step.stats["step_anchors"])
    return handle


def _step_start(problem: Problem, hint: Plan | None, floor_plans: tuple[Plan, ...], policy: dict, cb: "_Progress",
                stats: dict, count_search: dict | None) -> Plan:
    """The fastest feasible plan a step search starts from: the unbucketed schedule, the hint
    and ``floor_plans``; none of them is ever beaten by the result. With ``count_search`` and
    no floor plans, a fewest-collectives plan is searched first: on multi-node presets the step
    search started from greedy or unbucketed stayed near them (h100-8nodes fsdp-2: 129.7 ms
    after 20 s) while the fewest-collectives plan is 114.7 ms."""
    if count_search is not None:
        count = solve(problem, objective="count", hint=hint, **count_search, **policy)
        if count.plan is not None:
            floor_plans = (count.plan,)
        cb.interrupted = bool(count.stats.get("interrupted"))
        stats["count_plan"] = {"status": count.status, "collectives": count.objective, "wall_s": count.wall_s}
    unbucketed = Plan(problem_fingerprint=problem.fingerprint, planner="unbucketed", created="", buckets=())
    starts = [unbucketed] + ([hint] if hint is not None else [])
    starts += [p for p in floor_plans if not verify(problem, p, **policy)]
    return min(starts, key=lambda p: simulate(problem, p).step_ms)


def _problem_bound(handle: ModelHandle, solver_bound: float) -> float:
    """The solver's bound in the objective's units: a step model's ns less its rounding slack
    (one ns per event and per duration) in ms."""
    if handle.objective != "step":
        return solver_bound
    return (solver_bound - handle.stats["step_slack_ns"]) / NS_PER_MS


def _configured_solver(workers: int, seed: int, wall_s: float, deterministic_s: float,
                       subsolvers: tuple[str, ...] = ()) -> cp_model.CpSolver:
    """CP-SAT with this package's search settings (deterministic for a fixed seed and workers);
    ``subsolvers`` replaces CP-SAT's default full-problem portfolio."""
    solver = cp_model.CpSolver()
    solver.parameters.catch_sigint_signal = False  # Ctrl-C is ours (solver._run_search)
    p = solver.parameters
    p.subsolvers.extend(subsolvers)
    p.num_workers = workers
    p.random_seed = seed
    p.interleave_search = True
    # one presolve pass: on 8-layer graphs repeated passes cost tens of seconds for little
    # (hf-qwen3-8: proved in 57 s instead of not within 100 s, measured on this machine)
    p.max_presolve_iterations = 1
    # an explicit batch size: with the automatic one, interleaved search on these models was
    # seen to stop early with large-neighbourhood workers never run (ddp-8: stuck at the hint)
    p.interleave_batch_size = max(2, workers)
    p.max_deterministic_time = max(0.01, deterministic_s)
    p.max_time_in_seconds = max(0.05, wall_s)
    return solver


def _gap(obj: float | None, bound: float | None) -> float | None:
    if obj is None or bound is None:
        return None
    if obj == 0:
        return 0.0
    return max(0.0, (obj - bound) / abs(obj))


def solve(
    problem: Problem,
    *,
    time_limit_s: float = 60.0,
    objective: str = "count",
    workers: int | None = None,
    seed: int = 0,
    hint: Plan | None = None,
    window: int | str | None = "auto",
    within: Plan | None = None,
    protect_partly: bool = False,
    memory_budget_bytes: int | None = None,
    probe: bool = True,
    floor_plans: tuple[Plan, ...] = (),
    deterministic: bool = False,
    progress: Callable[[str], None] | None = None,
) -> SolveResult:
    """Optimal (or best found) bucketing of ``problem`` under the rules of planner/README.md.

    ``time_limit_s`` is wall-clock time for the search (with ``deterministic``, CP-SAT's
    deterministic time instead: the wall clock is then only a guard at 20x). Deterministic for a fixed ``seed`` and
    ``workers``: the search is interleaved and also limited by CP-SAT's deterministic time (the
    same number); a run that ends on proof or on the deterministic limit is reproducible, one
    cut by the wall clock first (a slower or busier machine) is reported in
    ``stats['wall_limit_hit']`` and may differ between runs.
    ``hint`` (e.g. torch's greedy plan) seeds the search of a full model (a windowed search,
    which it was measured to trap, starts without it); a feasible hint is always the floor of
    the result; one made for another problem raises ``PlanMismatchError`` before any search.
    With ``window`` the candidate anchors are limited and the bound holds for that
    restricted space only (``stats['bound_scope']``); likewise with ``within`` (merges only
    inside that plan's buckets). ``protect_partly`` solves under the stricter policy in which
    partly hidden collectives keep their overlap too (see planner/README.md);
    ``memory_budget_bytes`` bounds the extra bytes kept alive by moved starts and waits (rule 10).
    ``probe`` (count objective, full model): the search gets half the time, and at least 30 s;
    if it has not proved optimality, the rest probes the best bound B (is there a plan with at most B collectives?
    with the incumbent as hint): infeasible raises the bound by one and probes again, a plan found
    there is optimal.
    ``objective="step"`` minimizes ``planner.simulate``'s step (planner.step): the objective is
    the returned plan's simulated step in ms, the bound holds for the whole problem (the step
    floor when the search was windowed), and the result is never slower than the unbucketed
    schedule, a feasible hint, or any feasible plan of ``floor_plans`` (e.g. the count plan).
    """
    policy = {"protect_partly": protect_partly, "memory_budget_bytes": memory_budget_bytes}
    if time_limit_s <= 0:
        raise ValueError("time_limit_s must be positive")
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r}; use one of {OBJECTIVES}")
    if hint is not None:
        check_plan_matches(problem, hint)  # before any model is built
    step = objective == "step"
    # deterministic: the wall clock only guards against a stuck run; CP-SAT's deterministic time
    # (the same number) ends every stage, so unproved runs are reproducible too
    wall_factor = DETERMINISTIC_WALL_FACTOR if deterministic else 1.0
    t0 = time.perf_counter()
    workers = workers or 2
    auto = window == "auto"
    if auto:
        window = None if len(problem.collectives) <= AUTO_FULL_MODEL_MAX_COLLECTIVES else AUTO_WINDOW
    key_bounds = key_lower_bounds(problem, protect_partly=protect_partly)
    lb = float(sum(key_bounds.values()))  # = planner.bounds.lower_bound, computed once
    bounds = {"lower_bound": lb, "key_bounds": key_bounds}
    floor_ms = step_floor(problem).floor_ms if step else None
    if step:
        lb = floor_ms  # the step's relaxation bound, valid for the whole problem
    handle = _build(problem, objective, window, within, bounds, policy, floor_ms)
    if auto and window is None and within is None and handle.stats["x_vars"] > AUTO_FULL_MODEL_MAX_PAIRS:
        window = AUTO_WINDOW
        handle = _build(problem, objective, window, None, bounds, policy, floor_ms)
    stats = dict(handle.stats)
    stats["relaxation_bound"] = lb
    stats["build_s"] = round(time.perf_counter() - t0, 3)
    cb = _Progress(progress, t0, objective)
    hint_ok = hint is not None and not verify(problem, hint, **policy)
    if hint is not None and not hint_ok and within is None:
        # an infeasible hint (torch's greedy often breaks rule 9) misleads the search: hint its
        # best feasible repair instead
        repaired = repair(problem, hint, time_limit_s=min(10.0, time_limit_s / 4), workers=workers, seed=seed,
                          **policy)
        stats["hint_repaired"] = repaired.plan is not None
        if repaired.plan is not None:
            hint, hint_ok = repaired.plan, True
    if step:
        hint, hint_ok = _step_start(problem, hint if hint_ok else None, floor_plans, policy, cb, stats,
                                    count_search=dict(time_limit_s=STEP_COUNT_SHARE * time_limit_s, workers=workers,
                                                      seed=seed, window=window if not auto else "auto",
                                                      deterministic=deterministic)
                                    if not floor_plans and within is None else None), True
    if hint is not None:
        stats["hint_feasible"] = hint_ok
        # Measured (experiments/results/greedy_vs_cpsat_80): in a windowed search the hint
        # confines CP-SAT to its neighbourhood -- llama3-8b-ddp-80 stayed at greedy's 250 for
        # 600 s with it and reached 42 in 402 s without it; on the other 80-layer runs both end
        # at the same plan. There the hint is only the floor of the result; a full model gets it.
        stats["hint_fed_to_search"] = window is None or step
        if window is None or step:
            stats["hint_buckets_fitted"] = handle.add_hint(hint)
        # the full hint needs a second model built and solved: at 80 layers (windowed) the two
        # builds alone took the step search 41 s past its 120 s limit (llama3-70b-fsdp-80)
        if step and not cb.interrupted and window is None:
            twin = _build(problem, objective, window, within, bounds, policy, floor_ms)
            stats["hint_every_variable"] = hint_every_variable(handle, twin, hint,
                                                               time_limit_s=min(10.0, time_limit_s / 6))
    # full count models also probe the bound afterwards (see _probe) with what the main search leaves
    probing = probe and window is None and within is None and objective == "count"
    polish_s = POLISH_SHARE * time_limit_s if step and within is None else 0.0
    main_s = max(0.5 * time_limit_s, min(time_limit_s, PROBE_MIN_MAIN_S)) if probing else time_limit_s - polish_s
    focused = _portfolio(objective, windowed=window is not None)
    stats["subsolvers"] = list(focused) or "default"
    solver = _configured_solver(workers, seed, wall_factor * main_s - (time.perf_counter() - t0), main_s, focused)
    p = solver.parameters
    code = _run_search(solver, handle.model, cb)
    status = solver.status_name(code)
    stats.update(solve_wall_s=round(solver.wall_time, 3),
                 deterministic_time=round(solver.deterministic_time, 3), branches=solver.num_branches,
                 conflicts=solver.num_conflicts, workers=workers, seed=seed,
                 wall_limit_hit=solver.wall_time >= p.max_time_in_seconds * 0.99 and code != cp_model.OPTIMAL,
                 bound_scope="problem" if window is None and within is None else
                 f"problem (relaxation; search in candidate window {window})" if within is None
                 else f"search within plan {within.planner}")
    params = {"objective": objective, "time_limit_s": time_limit_s, "workers": workers, "seed": seed,
              "window": window, **policy}
    created = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    plan = None
    obj = bound = None
    if code in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        plan, obj = _verified_plan(handle, solver, problem, objective, policy, stats, params=params, created=created)
        if plan is None:  # a modelling bug: never hand out an unverified plan
            status = "UNKNOWN"
        bound = _problem_bound(handle, solver.best_objective_bound)
    elif code == cp_model.UNKNOWN:
        bound = _problem_bound(handle, solver.best_objective_bound)
    if hint_ok:
        hint_obj = plan_objective(problem, hint, objective)
        if obj is None or hint_obj < obj:
            plan = Plan(problem_fingerprint=problem.fingerprint, planner="cpsat", created=created,
                        params={**params, "from_hint": hint.planner}, buckets=hint.buckets)
            obj = hint_obj
            status = "FEASIBLE" if status in ("UNKNOWN", "FEASIBLE", "OPTIMAL") else status
    widened_exact = False
    # later stages (wider windows, probes) stop short of the limit by the time it takes to
    # extract and verify their plan (0.3 s at 32 layers), so that solve() ends within it
    search_deadline = t0 + wall_factor * (time_limit_s - polish_s) - min(1.0, 0.02 * time_limit_s)
    if auto and window is not None and within is None and code == cp_model.OPTIMAL and plan is not None:
        # the restricted model is solved before the time limit: spend the rest on wider windows
        plan, obj, bound, window, widened_exact = _widen(
            problem, plan, obj, bound, window, search_deadline, time_limit_s - solver.deterministic_time, objective,
            workers, seed, policy, lambda w: _build(problem, objective, w, None, bounds, policy, floor_ms), params, cb,
            stats)
        stats["bound_scope"] = "problem" if widened_exact else \
            f"problem (relaxation; search in candidate window {window})"
    if probing and plan is not None and status != "OPTIMAL":
        det_left = time_limit_s - solver.deterministic_time
        plan, obj, bound = _probe(problem, plan, obj, max(bound if bound is not None else lb, lb), search_deadline,
                                  det_left, workers, seed, policy, key_bounds, cb, stats)
    if polish_s and plan is not None and not cb.interrupted:
        plan, obj = _polished(problem, plan, obj, t0 + wall_factor * time_limit_s - min(1.0, 0.02 * time_limit_s),
                              int(POLISH_EVALUATIONS_PER_S * polish_s) if deterministic else None, seed, policy,
                              progress, stats)
    if widened_exact:
        bound = max(bound, lb)  # the last window held every candidate: its bound is the problem's
    elif window is not None or within is not None:
        # the restricted model's bound is not the problem's; report the relaxation bound
        stats["restricted_bound"] = bound
        bound = None if within is not None else lb
        if status == "OPTIMAL":
            status = "FEASIBLE"
    elif bound is not None:
        bound = max(bound, lb)
    if bound is not None:
        bound = float(round(bound, 6))
        tolerance = STEP_OPTIMAL_TOLERANCE_MS if step else 1e-9
        if obj is not None and obj <= bound + tolerance:
            status = "OPTIMAL"  # the incumbent meets a bound valid for the whole problem
        elif step and status == "OPTIMAL":
            status = "FEASIBLE"  # the relaxation is solved; the simulated step is above its bound
    stats["interrupted"] = cb.interrupted
    if plan is not None:  # how the search ended travels with the plan
        plan = plan.model_copy(update={"params": {**plan.params, "interrupted": cb.interrupted,
                                                  "wall_limit_hit": bool(stats.get("wall_limit_hit"))}})
    result = SolveResult(plan=plan, status=status, objective=obj, bound=bound, gap=_gap(obj, bound),
                         wall_s=round(time.perf_counter() - t0, 3), stats=stats, progress=cb.points)
    return result


def _polished(problem: Problem, plan: Plan, obj: float, deadline: float, max_evaluations: int | None, seed: int,
              policy: dict, progress, stats: dict) -> tuple[Plan, float]:
    """``planner.polish`` on the search's best plan; its result is verified and never slower."""
    result = polish(problem, plan, deadline=deadline, max_evaluations=max_evaluations, seed=seed, policy=policy,
                    progress=progress)
    stats["polish"] = result.stats
    if result.step_ms < obj:
        return result.plan.model_copy(update={"params": {**plan.params, "polished": True}}), result.step_ms
    return plan, obj


def _widen(problem: Problem, plan: Plan, obj: float, bound: float, window: int, deadline: float, det_left: float,
           objective: str, workers: int, seed: int, policy: dict, build: Callable[[int], ModelHandle], params: dict,
           cb: "_Progress", stats: dict) -> tuple[Plan, float, float | None, int, bool]:
    """Window widening: while time is left after a windowed search has solved its restricted
    model, double the window and search again with the incumbent as hint (it lies inside the
    wider space). Measured: llama3-8b-fsdp-32 with pre-bucketing, window 16 solved at 136 in 6 s;
    window 32 reached 134 and window 48 133 within 60-120 s. A window that holds every same-key
    candidate is the full model, so its proof is a proof for the problem.
    Returns (plan, objective, restricted bound, last window, whether that window was exact)."""
    largest = max(Counter((c.kind, c.pg, c.key) for c in problem.collectives).values())
    # called after the previous window was solved: if it held every candidate, that was exact
    stages, exact = [], window >= largest
    build_s = stats.get("build_s", 0.0)
    while window < largest:
        # a wider model takes longer to build (and presolve): leave room for twice the last build
        if det_left < WIDEN_MIN_S or deadline - time.perf_counter() < WIDEN_MIN_S + 2 * build_s:
            break
        window = min(2 * window, largest)
        if cb.say:
            cb.say(f"restricted model solved at {obj:g}; widening the window to {window}")
        started = time.perf_counter()
        handle = build(window)
        build_s = time.perf_counter() - started
        handle.add_hint(plan)
        solver = _configured_solver(workers, seed, deadline - time.perf_counter(), det_left,
                                    _portfolio(objective, windowed=True))
        code = _run_search(solver, handle.model, cb)
        det_left -= solver.deterministic_time
        stage = {"window": window, "status": solver.status_name(code), "wall_s": round(solver.wall_time, 2),
                 "x_vars": handle.stats["x_vars"]}
        stages.append(stage)
        if code in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            found, value = _verified_plan(handle, solver, problem, objective, policy, stats,
                                          params={**params, "window": window}, created=plan.created)
            if found is None:  # a modelling bug: keep the verified incumbent
                break
            stage["objective"] = value
            if value < obj:
                plan, obj = found, value
        bound = _problem_bound(handle, solver.best_objective_bound)  # valid for this window's space only
        if code != cp_model.OPTIMAL:
            break  # the time ran out inside this window
        exact = window >= largest
    stats["widened"] = stages
    return plan, obj, bound, window, exact


def _probe(problem: Problem, plan: Plan, obj: float, bound: float, deadline: float, det_left: float,
           workers: int, seed: int, policy: dict, key_bounds: dict, cb: "_Progress",
           stats: dict) -> tuple[Plan, float, float]:
    """Destructive lower bounding with the time the main search left: ask for a plan with at
    most B = ceil(bound) collectives. Infeasible proves B + 1 is a bound (probe again); a plan
    found there meets the bound, so it is optimal. On these problems the relaxation bound is
    often tight, and a search told the target finds it sooner (hf-qwen3-8: 83 found under the
    constraint, not found in 120 s without it; llama3-8b-ddp-8: "at most 3" refuted in 3 s).
    Returns (plan, objective, bound)."""
    probes = []
    target = math.ceil(bound - 1e-9)
    while target < obj:
        if deadline - time.perf_counter() < 0.5 or det_left < 0.05:
            break
        handle = build_model(problem, objective="count", lower_bound=target, max_count=target,
                             key_bounds=key_bounds, **policy)
        handle.add_hint(plan)  # over the target, but it guides the search (CP-SAT repairs hints)
        solver = _configured_solver(workers, seed, deadline - time.perf_counter(), det_left,
                                    _portfolio("count", windowed=False))
        code = _run_search(solver, handle.model, cb)
        det_left -= solver.deterministic_time
        probes.append({"at_most": target, "status": solver.status_name(code), "wall_s": round(solver.wall_time, 2)})
        if code == cp_model.INFEASIBLE:
            bound = float(target + 1)  # no plan with at most `target` collectives
            target += 1
            continue
        if code in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            found, value = _verified_plan(handle, solver, problem, "count", policy, stats,
                                          params=dict(plan.params), created=plan.created)
            if found is not None:  # else a modelling bug: keep the verified incumbent
                plan, obj = found, value
        break  # found (it meets the bound) or out of time
    stats["probes"] = probes
    return plan, obj, bound


def _reanchor(problem: Problem, plan: Plan) -> Plan:
    """A fast repair: keep every bucket's members, re-anchor them (``planner.polish.anchored``),
    and break up buckets the verifier still rejects. Never fewer buckets than ``plan``."""
    candidate = anchored(problem, plan)
    for _ in range(len(candidate.buckets) + 1):
        bad = {v.bucket for v in verify(problem, candidate) if v.bucket is not None}
        if not bad:
            break
        candidate = candidate.model_copy(update={"buckets": tuple(
            b for k, b in enumerate(candidate.buckets) if k not in bad)})
    return candidate


def repair(problem: Problem, plan: Plan, *, time_limit_s: float = 10.0, workers: int | None = None,
           seed: int = 0, protect_partly: bool = False, memory_budget_bytes: int | None = None) -> SolveResult:
    """The best feasible plan whose buckets lie inside ``plan``'s buckets (anchors re-chosen,
    buckets split where needed): how a plan that breaks a rule is compared fairly.

    A fast re-anchoring comes first; when it keeps every bucket it is optimal for this
    restricted space (no refinement has fewer buckets) and no search is needed."""
    check_plan_matches(problem, plan)
    t0 = time.perf_counter()
    policy = {"protect_partly": protect_partly, "memory_budget_bytes": memory_budget_bytes}
    quick = _reanchor(problem, plan)
    quick_ok = not verify(problem, quick, **policy)
    if quick_ok and len(quick.buckets) == len(plan.buckets):
        result = SolveResult(plan=quick, status="FEASIBLE", objective=plan_objective(problem, quick, "count"),
                             bound=None, gap=None, wall_s=round(time.perf_counter() - t0, 3),
                             stats={"repair": "re-anchored", "restricted_bound": plan_objective(problem, quick,
                                                                                                 "count")})
    else:
        # the plan itself (or its partial re-anchoring) is the hint: usually only anchors move
        result = solve(problem, time_limit_s=time_limit_s, workers=workers, seed=seed, within=plan, window=None,
                       hint=quick if quick_ok else plan, **policy)
    if result.plan is not None:
        # the policy it was repaired under, as solve records it: the re-anchored plan carries the
        # given plan's params, which may name no policy or another one (`bucketplan verify` reads it)
        result.plan = result.plan.model_copy(update={"planner": f"{plan.planner}-repaired",
                                                     "params": {**result.plan.params, "repaired": plan.planner,
                                                                **policy}})
    return result
