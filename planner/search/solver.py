"""Solve a bucketing problem with CP-SAT: always a time limit, an honest status, a verified plan.

Why this exists: users need more than a plan -- whether it is optimal, and if not, how far
from a proved bound it may be. ``solve`` builds the model (``planner.search.cpsat``), hints it with a
given plan (torch's greedy), runs CP-SAT deterministically, re-checks the answer with the
independent verifier, and never returns a plan worse than a feasible hint.

``solve`` reads as its stages: prepare (validate, build the model, choose the hint), the main
search, then widening (windowed searches), probing (count searches) and polish (step searches)
while time is left. One frozen ``_Incumbent`` passes from stage to stage; ``_verdict`` alone
turns the last one into the reported status, bound and gap. ``planner.search.repair.repair``, the
public repair of a rule-breaking plan, is ``repair_within`` here: a solve within the plan's buckets, which
``solve`` itself uses on an infeasible hint (one module, so no import circle).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import math
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable

from ortools.sat.python import cp_model

import planner.core.arguments as arguments
from planner.core.arguments import PlanMismatchError  # re-exported: planner.search.solver's API
from planner.search.result import SolveResult, gap_of  # SolveResult re-exported: planner.search.solver's API
from planner.cost.bounds import BucketReach, bucket_reach, key_lower_bounds, step_floor
from planner.search.cpsat import BuildStopped, ModelHandle, ObjectiveBounds, build_guard, build_model, plan_objective
from planner.core.options import SolveOptions
from planner.search.polish import polish, reanchored
from planner.core.problem import Plan, Problem, unbucketed_plan
from planner.cost.simulator import simulate
from planner.search.step import NS_PER_MS, add_step_objective, hint_every_variable
from planner.rules.verifier import verify

STATUSES = ("OPTIMAL", "FEASIBLE", "INFEASIBLE", "UNKNOWN", "NOT_RUN")
# Above this many collectives the default search uses a candidate window (the full model's
# build and presolve alone exceed minutes at 32 layers); the bound then comes from
# planner.cost.bounds, which holds for the whole problem.
AUTO_FULL_MODEL_MAX_COLLECTIVES = 320
AUTO_FULL_MODEL_MAX_PAIRS = 20_000  # candidate (collective, anchor) pairs; ddp-32 has 39k and stalls
AUTO_WINDOW = 16
# The most candidate (collective, anchor) pairs a model may have (planner.search.cpsat.build_guard): a
# build beyond it stops and the solve returns the best plan known; the automatic window narrows
# below AUTO_WINDOW on problems so large that AUTO_WINDOW would pass it (above 60,000 collectives).
# Measured on generated problems of one bucket key with window 16: about 1.4 KB per pair while
# building (264k pairs: 360 MB, 1.06M pairs: 1.44 GB and 38 s on a loaded 2-core machine), so 2
# million pairs stay within a few GB with CP-SAT's copy; a 200,000-collective problem went past
# 16 GB building its window of 16.
MAX_MODEL_PAIRS = 2_000_000
# With probing, the main search keeps at least half the time limit and at least this many
# seconds (8-layer models need 20-30 s to reach their optimum: fsdp-8 proved in 22 s); the
# probe gets the rest. `bucketplan compare`'s 30 s per objective thus leaves no time to probe.
PROBE_MIN_MAIN_S = 30.0
# A windowed search that solves its restricted model early widens the window while at least
# this much time is left (see _widen).
WIDEN_MIN_S = 5.0
# A step plan is reported OPTIMAL when its simulated step is within this of the bound (ms): the
# model prices a table link's curve to within 10 ns per bucket (planner.search.step.duration_pieces) and
# rounds every time to integer ns.
STEP_OPTIMAL_TOLERANCE_MS = 1e-3
# A Ctrl-C while CP-SAT loads its workers waits for their search to start, at most this long (s;
# loading took 0.02 s on fsdp-8 idle, see run_search): a later OR-Tools may word its log otherwise.
STOP_DEFERRED_S = 10.0
# With deterministic=True the wall-clock limit is this multiple of the time limit, a guard only:
# CP-SAT's deterministic time accrues at about 0.7x wall time on a 2-core machine when idle and
# at 0.2x while a second job shares it (fsdp-2 step search, measured).
DETERMINISTIC_WALL_FACTOR = 20.0
# Share of a step search's time spent finding a fewest-collectives plan to start from, when the
# caller gives none (solve's count_plan).
STEP_COUNT_SHARE = 0.25
# ... and on a large model (see POLISH_SHARE_LARGE), whose count search needs 13-15 s of a 60 s
# solve to reach its optimum (llama3-8b-fsdp-8, h100-8nodes: 30 collectives at 12.7 s; h100-64nodes:
# 14 at 14.5 s, where a 15 s share once ended at 18 and the step plan 19 ms slower)
STEP_COUNT_SHARE_LARGE = 0.35
# Share of a step search's time kept for planner.search.polish (local search scored by the simulator) on
# the best plan: at 8 layers and more the CP-SAT step search mostly returns the plan it started
# from, while polish improves it within seconds (llama3-8b-fsdp-8 on 8 nodes: 253.0 -> 245.6 ms,
# a local optimum after 5 s). In deterministic runs polish is limited by evaluations instead.
POLISH_SHARE = 0.15
# ... and on a large model (a window, or more than STEP_LARGE_MODEL_PAIRS candidate pairs: every
# 8-layer preset problem has 4,500-13,000 but ddp-8 on one node, every 2-layer one at most 1,010),
# where CP-SAT rarely improves its start within a minute and polish does; the main search still
# keeps a quarter of a 60 s solve (15 s), below which it lost its bound above the floor. The
# measurements behind both numbers: docs/results.md, "Solver shares".
POLISH_SHARE_LARGE = 0.4
STEP_LARGE_MODEL_PAIRS = 2500
POLISH_EVALUATIONS_PER_S = 100


class SearchProgress(cp_model.CpSolverSolutionCallback):
    """Incumbents and bounds as the search finds them, in the objective's units (ms for step;
    a step model's incumbent is its own estimate, the plan is re-simulated afterwards)."""

    def __init__(self, say: Callable[[str], None] | None, start: float, objective: str = "count"):
        super().__init__()
        self.say = say
        self.start = start
        self.interrupted = False  # Ctrl-C stopped a search (see run_search): no later stage runs
        self.stop_deferred = False  # a Ctrl-C waited for CP-SAT's workers to start (see run_search)
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


@dataclass(frozen=True)
class _SolveContext:
    """What every stage of one ``solve`` reads: the problem, the caller's options and the window
    they resolve to, the relaxation bound and the time budget. Frozen: a stage never changes the
    settings of the next. ``stats`` (the result's record) and ``cb`` (incumbents as found, and
    whether Ctrl-C stopped a search) are the two things every stage writes to."""

    problem: Problem
    options: SolveOptions
    within: Plan | None
    window: int | None  # the main search's candidate window (None: full model)
    auto: bool  # the window was chosen automatically (then it may widen)
    t0: float  # time.perf_counter() when solve started
    bounds: ObjectiveBounds  # what is known of the objective (planner.search.cpsat.build_model)
    lb: float | None  # the relaxation bound for the whole problem (the step floor for step); None until computed
    floor_ms: float | None
    reach: BucketReach | None  # planner.cost.bounds.bucket_reach, computed once for a step solve
    progress: Callable[[str], None] | None
    cb: SearchProgress
    stats: dict
    starts: list[Plan] = dataclasses.field(default_factory=list)  # a step search's feasible starts, fastest first
    large: bool = False  # the main model is windowed or has over STEP_LARGE_MODEL_PAIRS candidate pairs

    # the options every stage reads, by their names
    objective = property(lambda self: self.options.objective)
    policy = property(lambda self: self.options.policy)
    workers = property(lambda self: self.options.workers)
    seed = property(lambda self: self.options.seed)
    deterministic = property(lambda self: self.options.deterministic)
    time_limit_s = property(lambda self: self.options.time_limit_s)

    @property
    def step(self) -> bool:
        return self.objective == "step"

    @property
    def wall_factor(self) -> float:
        # deterministic: the wall clock only guards against a stuck run; CP-SAT's deterministic
        # time (the same number) ends every stage, so unproved runs are reproducible too
        return DETERMINISTIC_WALL_FACTOR if self.deterministic else 1.0

    @property
    def probing(self) -> bool:
        """Full count models also probe the bound after the main search (see _probe)."""
        return self.options.probe and self.window is None and self.within is None and self.objective == "count"

    @property
    def polish_s(self) -> float:
        share = POLISH_SHARE_LARGE if self.large else POLISH_SHARE
        return share * self.time_limit_s if self.step and self.within is None else 0.0

    @property
    def main_s(self) -> float:
        """The main search's share of the time limit (the rest goes to probing or polish)."""
        if self.probing:
            return max(0.5 * self.time_limit_s, min(self.time_limit_s, PROBE_MIN_MAIN_S))
        return self.time_limit_s - self.polish_s

    def deadline(self, until_s: float) -> float:
        """The wall-clock deadline of a stage that may run until ``until_s`` of the time limit; it
        stops short by the time it takes to extract and verify a plan (0.3 s at 32 layers), so
        that solve() ends within the limit."""
        return self.t0 + self.wall_factor * until_s - min(1.0, 0.02 * self.time_limit_s)

    @property
    def params(self) -> dict:
        """The search's settings, recorded in every plan it returns."""
        return {"objective": self.objective, "time_limit_s": self.time_limit_s, "workers": self.workers,
                "seed": self.seed, "window": self.window, **self.policy.as_params()}


@dataclass(frozen=True)
class _Incumbent:
    """The best verified plan so far and what is proved about it, handed from stage to stage.

    ``bound`` is the last search's bound in the objective's units, valid for ``scope``: the whole
    problem (``"problem"``), the candidate window ``window`` (``"window"``), or the buckets of the
    ``within`` plan (``"within"``). ``status`` is the main search's (a feasible hint's fallback makes
    it FEASIBLE); ``_verdict`` turns it into the reported one. ``solved``: the main search proved
    its (possibly restricted) model, so a windowed search may widen; ``det_used``: the main
    search's deterministic time, which later stages subtract from the limit."""

    plan: Plan | None
    objective: float | None
    bound: float | None
    status: str
    scope: str
    window: int | None
    solved: bool
    det_used: float
    fallback: str | None = None  # the plan is the solve's fallback, not a search's: that fallback's planner


def solve(
    problem: Problem,
    options: SolveOptions = SolveOptions(),
    *,
    hint: Plan | None = None,
    within: Plan | None = None,
    count_plan: Plan | None = None,
    fallback_plans: tuple[Plan, ...] = (),
    progress: Callable[[str], None] | None = None,
) -> SolveResult:
    """Optimal (or best found) bucketing of ``problem`` under the rules of planner/README.md, searched
    as ``options`` say (``planner.core.options.SolveOptions``: time limit, objective, workers, seed,
    window, determinism, probing, policy).

    Reproducible for a fixed seed and workers when the search ends on proof or on CP-SAT's
    deterministic limit; one cut by the wall clock first is reported in ``stats['wall_limit_hit']``.
    ``hint`` (e.g. torch's greedy plan) seeds the search of a full model and, when feasible, is the
    result's fallback. A windowed search, or one ``within`` a plan's buckets, proves its bound for that
    restricted space only (``stats['bound_scope']``). A step search never returns a plan slower than
    the unbucketed schedule, a feasible hint, a feasible plan of ``fallback_plans``, or a
    fewest-collectives plan: ``count_plan`` when the caller has one, else one searched with part of
    the time (``stats['starts']`` lists them). A plan made for another problem (``hint``,
    ``within``, ``count_plan``) raises ``PlanMismatchError`` before any search. ``progress``: one
    line per incumbent and stage.
    """
    _validate(problem, options, hint=hint, within=within, count_plan=count_plan, fallback_plans=fallback_plans)
    arguments.callback(progress, "progress")  # else a TypeError at the first incumbent, mid-search
    ctx = _context(problem, options, within, progress)
    given = (hint, count_plan, *fallback_plans)  # the plans the caller knows: with the unbucketed one, the fallbacks
    incumbent: _Incumbent | None = None  # the last finished stage's: a verified plan and what is proved about it
    try:
        ctx = _with_bounds(ctx)
        ctx, handle = _main_model(ctx)
        hint, hint_ok = _search_hint(ctx, handle, hint, fallback_plans, count_plan)
        incumbent = _main_search(ctx, handle, hint if hint_ok else _best_known(ctx, ()))
        # after a Ctrl-C no later stage starts (their searches would not run, and they read their stats)
        if ctx.auto and incumbent.scope == "window" and incumbent.solved and incumbent.plan is not None \
                and not ctx.cb.interrupted:
            incumbent = _widen(ctx, incumbent)  # the restricted model is solved: spend the rest on wider windows
        if ctx.probing and incumbent.plan is not None and incumbent.status != "OPTIMAL" and not ctx.cb.interrupted:
            incumbent = _probe(ctx, incumbent)
        if ctx.polish_s and incumbent.plan is not None and not ctx.cb.interrupted:
            incumbent = _polished(ctx, incumbent)
    except BuildStopped as stop:  # the main model's build (a later stage's stops that stage alone)
        ctx.stats["model_not_built"] = str(stop)
        if ctx.cb.say:
            ctx.cb.say(f"{stop}: no search; returning the best plan known")
    except KeyboardInterrupt:
        # a Ctrl-C outside a search (a search stops itself, see run_search): while bounds or a
        # model were built, a hint repaired or a plan polished. The last finished stage's plan is
        # kept; a second Ctrl-C here leaves solve at once.
        ctx.cb.interrupted = True
    if incumbent is None:  # no search ran: the best of the plans known, the unbucketed one at least
        incumbent = _no_search(ctx, _best_known(ctx, given))
    return _result(ctx, incumbent)


def _validate(problem: Problem, options: SolveOptions, **plans) -> None:
    """Refuse what ``options`` (checked when built) cannot: options of another type, plans that are
    no plans (one ValueError naming each), a plan made for another problem (PlanMismatchError)."""
    if not isinstance(options, SolveOptions):
        raise ValueError(f"options must be a planner.SolveOptions, not {type(options).__name__}")
    fallback_plans = plans.pop("fallback_plans")
    for name, plan in plans.items():
        arguments.plan_of(problem, plan, name, optional=True)
    # fallback plans are only type-checked: one of another problem breaks rule 1 and is left out
    # (sweeps pass the plans they have; none of them must stop the solve)
    if not isinstance(fallback_plans, (tuple, list)):
        raise ValueError(f"fallback_plans must be a tuple of plans, not {type(fallback_plans).__name__}")
    for k, plan in enumerate(fallback_plans):
        arguments.problem_and_plan(problem, plan, f"fallback_plans[{k}]")


def _context(problem: Problem, options: SolveOptions, within: Plan | None,
             progress: Callable[[str], None] | None) -> _SolveContext:
    """The context of one solve, without its bounds yet (``_with_bounds``): created before
    anything that takes time, so that a Ctrl-C or a stopped build still has it to report with.
    ``window="auto"`` is a full model up to AUTO_FULL_MODEL_MAX_COLLECTIVES collectives (and
    AUTO_FULL_MODEL_MAX_PAIRS candidate pairs, see ``_main_model``), a window of AUTO_WINDOW beyond
    (narrower where that would pass MAX_MODEL_PAIRS)."""
    t0 = time.perf_counter()
    window, auto = options.window, options.window == "auto"
    if auto:
        n = len(problem.collectives)
        # a window of w leaves each collective at most 2w + 1 anchors: narrowed to stay within
        # MAX_MODEL_PAIRS (a build beyond it would stop with nothing to search)
        window = None if n <= AUTO_FULL_MODEL_MAX_COLLECTIVES else min(AUTO_WINDOW, max(1, (MAX_MODEL_PAIRS // n - 1) // 2))
    return _SolveContext(
        problem=problem, options=options, within=within, window=window, auto=auto, t0=t0,
        bounds=ObjectiveBounds(), lb=None, floor_ms=None, reach=None, progress=progress,
        cb=SearchProgress(progress, t0, options.objective), stats={})


def _with_bounds(ctx: _SolveContext) -> _SolveContext:
    """``ctx`` with the relaxation bounds of planner.cost.bounds (and for step, the bucket reach and
    the step floor), computed once for every model of the solve."""
    problem = ctx.problem
    deadline = ctx.deadline(ctx.time_limit_s)  # the bounds too are within the time limit
    key_bounds = key_lower_bounds(problem, protect_partly=ctx.policy.protect_partly, deadline=deadline)
    count_lb = lb = float(sum(key_bounds.values()))  # = planner.cost.bounds.lower_bound, computed once
    reach = bucket_reach(problem) if ctx.step else None  # the floor's and every step model's
    # the floor's key bounds are without protect_partly (looser or equal): reuse when they are
    floor_ms = None
    if ctx.step:
        need = key_bounds if not ctx.policy.protect_partly else key_lower_bounds(problem, deadline=deadline)
        # the step model prices overlap as free: it is told the floor at contention 1, and the
        # floor at the problem's contention is the bound reported (both hold for every plan)
        floor = step_floor(problem, reach, need, deadline=deadline)
        floor_ms = floor.free_overlap_ms
        lb = floor.floor_ms
        if floor.chain_cut:  # a valid floor, looser than it would be with time (planner.cost.bounds)
            ctx.stats["chain_floor_cut"] = True
    ctx = dataclasses.replace(ctx, bounds=ObjectiveBounds(count_lb, key_bounds),
                              lb=lb,  # the step's relaxation bound (or the count's), valid for the whole problem
                              floor_ms=floor_ms, reach=reach)
    ctx.stats["relaxation_bound"] = ctx.lb
    return ctx


def _main_model(ctx: _SolveContext) -> tuple[_SolveContext, ModelHandle]:
    """The main model, within the time limit and MAX_MODEL_PAIRS (``BuildStopped`` otherwise).
    An automatic full model that outgrows AUTO_FULL_MODEL_MAX_PAIRS is stopped there and built
    windowed instead."""
    if ctx.cb.say:
        ctx.cb.say(f"building the model ({len(ctx.problem.collectives)} collectives, "
                   f"{'full' if ctx.window is None else f'window {ctx.window}'})")
    if ctx.auto and ctx.window is None and ctx.within is None:
        try:
            handle = _build(ctx, None, None, max_pairs=AUTO_FULL_MODEL_MAX_PAIRS)
        except BuildStopped as stop:
            if stop.timed_out:
                raise
            ctx = dataclasses.replace(ctx, window=AUTO_WINDOW)
            handle = _build(ctx, ctx.window, None)
    else:
        handle = _build(ctx, ctx.window, ctx.within)
    ctx = dataclasses.replace(ctx, large=ctx.window is not None or handle.stats["x_vars"] > STEP_LARGE_MODEL_PAIRS)
    ctx.stats.update(handle.stats)
    ctx.stats["build_s"] = round(time.perf_counter() - ctx.t0, 3)
    return ctx, handle


def _build(ctx: _SolveContext, window: int | None, within: Plan | None, *,
           max_pairs: int | None = None) -> ModelHandle:
    """The rule model with its objective; ``step`` adds the step variables of planner.search.step.
    ``BuildStopped`` when the time limit passes while building or the model outgrows
    ``max_pairs`` candidate pairs (default MAX_MODEL_PAIRS; planner.search.cpsat.build_guard)."""
    max_pairs = MAX_MODEL_PAIRS if max_pairs is None else max_pairs
    with build_guard(deadline=ctx.deadline(ctx.time_limit_s), max_pairs=max_pairs):
        if not ctx.step:
            return build_model(ctx.problem, objective=ctx.objective, window=window, within=within,
                               policy=ctx.policy, bounds=ctx.bounds)
        handle = build_model(ctx.problem, objective="count", window=window, within=within, policy=ctx.policy,
                             bounds=ctx.bounds)
        step = add_step_objective(handle, ctx.problem, floor_ms=ctx.floor_ms or 0.0, reach=ctx.reach)
    handle.objective = "step"
    handle.stats.update(step.stats, step_slack_ns=step.stats["step_events"] + step.stats["step_anchors"])
    return handle


def _search_hint(ctx: _SolveContext, handle: ModelHandle, hint: Plan | None,
                 fallback_plans: tuple[Plan, ...], count_plan: Plan | None) -> tuple[Plan | None, bool]:
    """The plan the search starts from and whether it is feasible (then it is the result's fallback),
    fed to ``handle``'s model: the caller's hint, its repair when it breaks a rule, and for a step
    search the fastest of the starting plans (_step_start)."""
    hint_ok = hint is not None and not verify(ctx.problem, hint, **ctx.policy.as_params())
    if hint is not None and not hint_ok and ctx.within is None:
        hint, hint_ok = _repaired_hint(ctx, hint)
    if ctx.step:
        hint, hint_ok = _step_start(ctx, hint if hint_ok else None, fallback_plans, count_plan), True
    if hint is not None:
        _feed_hint(ctx, handle, hint, hint_ok)
    return hint, hint_ok


def _repaired_hint(ctx: _SolveContext, hint: Plan) -> tuple[Plan, bool]:
    """An infeasible hint (torch's greedy often breaks rule 9) misleads the search: its best
    feasible repair instead, when there is one."""
    # deterministic like the search it seeds: a repair cut by the wall clock under load gave a
    # deterministic solve another hint, hence another plan (hf-qwen3-moe-8, seen once in 46 runs)
    repaired = repair_within(ctx.problem, hint,
                       dataclasses.replace(ctx.options, time_limit_s=min(10.0, ctx.time_limit_s / 4)))
    ctx.cb.interrupted = ctx.cb.interrupted or bool(repaired.stats.get("interrupted"))  # the Ctrl-C was for us
    # a repair always has a plan (solve's fallback: the unbucketed plan lies within any buckets);
    # one that found nothing better in time is still feasible, so still a better hint than the
    # broken plan (a feasible re-anchoring that was not beaten is a repair too)
    ctx.stats["hint_repaired"] = repaired.plan is not None
    if ctx.stats["hint_repaired"]:
        return repaired.plan, True
    return hint, False


def repair_within(problem: Problem, plan: Plan, options: SolveOptions) -> SolveResult:
    """``planner.search.repair.repair`` (the public entry): here, because it is a solve within the plan's
    buckets and ``solve`` repairs an infeasible hint with it. It counts collectives in the full
    model of the plan's buckets (``options``' objective and window do not apply). A fast
    re-anchoring first; when it keeps every bucket it is optimal for this restricted space (no
    refinement has fewer buckets) and no search is needed. Checked first, since the re-anchoring
    does not reach ``solve``'s checks: one ValueError naming a bad argument, or PlanMismatchError
    for a plan of another problem."""
    arguments.problem_and_plan(problem, plan)
    _validate(problem, options, within=plan, fallback_plans=())
    options = dataclasses.replace(options, objective="count", window=None)
    t0 = time.perf_counter()
    params = options.policy.as_params()
    quick = reanchored(problem, plan)
    quick_ok = not verify(problem, quick, **params)
    if quick_ok and len(quick.buckets) == len(plan.buckets):
        count = plan_objective(problem, quick, "count")
        result = SolveResult(plan=quick, status="FEASIBLE", objective=count, bound=None, gap=None,
                             wall_s=round(time.perf_counter() - t0, 3),
                             stats={"repair": "re-anchored", "restricted_bound": count})
    else:
        # the plan itself (or its partial re-anchoring) is the hint: usually only anchors move
        result = solve(problem, options, within=plan, hint=quick if quick_ok else plan)
    if result.plan is not None:
        # the policy it was repaired under, as solve records it: the re-anchored plan carries the
        # given plan's params, which may name no policy or another one (`bucketplan verify` reads it)
        result.plan = result.plan.model_copy(update={"planner": f"{plan.planner}-repaired",
                                                     "params": {**result.plan.params, "repaired": plan.planner,
                                                                **params}})
    return result


def _step_start(ctx: _SolveContext, hint: Plan | None, fallback_plans: tuple[Plan, ...],
                count_plan: Plan | None) -> Plan:
    """The fastest feasible plan a step search starts from: the unbucketed schedule, the hint,
    ``fallback_plans`` and a fewest-collectives plan; none of them is ever beaten by the result.

    The fewest-collectives plan is ``count_plan`` when given, else searched first (not within
    a plan): on multi-node presets the step search started from greedy or unbucketed stayed near
    them (h100-8nodes fsdp-2: 129.7 ms after 20 s) while the fewest-collectives plan is 114.7 ms.
    Other fallback plans never replace it: with only a sweep's greedy start,
    llama3-8b-fsdp-8 @ h100-64nodes ends at 305.0 ms; with the count plan among its starts, at
    280.5 ms (60 s each)."""
    problem = ctx.problem

    def feasible(plan: Plan) -> bool:
        return not verify(problem, plan, **ctx.policy.as_params())

    counts: list[Plan] = []  # the fewest-collectives plan, verified
    if count_plan is not None and feasible(count_plan):
        counts.append(count_plan)
    elif ctx.within is None:  # none given, or it breaks a rule (of this solve's policy): search one
        share = STEP_COUNT_SHARE_LARGE if ctx.large else STEP_COUNT_SHARE
        options = dataclasses.replace(ctx.options, objective="count", time_limit_s=share * ctx.time_limit_s,
                                      window="auto" if ctx.auto else ctx.window)
        count = solve(problem, options, hint=hint)
        if count.plan is not None:  # solve returns verified plans only
            counts.append(count.plan)
        ctx.cb.interrupted = bool(count.stats.get("interrupted"))
        ctx.stats["count_plan"] = {"status": count.status, "collectives": count.objective, "wall_s": count.wall_s}
    unbucketed = Plan(problem_fingerprint=problem.fingerprint, planner="unbucketed", created="", buckets=())
    starts: dict[tuple, Plan] = {}  # one per bucketing (a sweep's start is its hint and a fallback plan)
    known = [unbucketed, *([hint] if hint is not None else []), *counts]  # feasible already
    for plan in known + [p for p in fallback_plans if all(p.buckets != k.buckets for k in known) and feasible(p)]:
        starts.setdefault(plan.buckets, plan)
    timed = sorted((simulate(problem, p).step_ms, k, p) for k, p in enumerate(starts.values()))
    ctx.starts[:] = [p for _, _, p in timed]
    ctx.stats["starts"] = [{"planner": p.planner, "objective": p.params.get("objective"), "step_ms": round(t, 6)}
                           for t, _, p in timed]
    return ctx.starts[0]


def _feed_hint(ctx: _SolveContext, handle: ModelHandle, hint: Plan, hint_ok: bool) -> None:
    """Hint ``handle``'s model with ``hint`` where that helps the search.

    Measured (experiments/results/greedy_vs_cpsat_80): in a windowed search the hint confines
    CP-SAT to its neighbourhood -- llama3-8b-ddp-80 stayed at greedy's 250 for 600 s with it and
    reached 42 in 402 s without it; on the other 80-layer runs both end at the same plan. There
    the hint is only the fallback of the result; a full model gets it."""
    stats = ctx.stats
    stats["hint_feasible"] = hint_ok
    stats["hint_fed_to_search"] = ctx.window is None or ctx.step
    if ctx.window is None or ctx.step:
        stats["hint_buckets_fitted"] = handle.add_hint(hint)
    # the full hint needs a second model built and solved: at 80 layers (windowed) the two
    # builds alone took the step search 41 s past its 120 s limit (llama3-70b-fsdp-80)
    if ctx.step and not ctx.cb.interrupted and ctx.window is None:
        try:
            twin = _build(ctx, ctx.window, ctx.within)
        except BuildStopped:  # out of time: the search starts from the x/y hints alone
            stats["hint_every_variable"] = False
            return
        stats["hint_every_variable"] = hint_every_variable(handle, twin, hint,
                                                           time_limit_s=min(10.0, ctx.time_limit_s / 6))


def _main_search(ctx: _SolveContext, handle: ModelHandle, fallback: Plan | None) -> _Incumbent:
    """The search of the main model with its share of the time limit; its verified plan, or
    ``fallback`` (a feasible hint, else the unbucketed plan) when that is better."""
    scope = "within" if ctx.within is not None else "window" if ctx.window is not None else "problem"
    if ctx.cb.interrupted:  # a Ctrl-C in a step solve's count search: no search runs, the starts stand
        return _no_search(ctx, fallback)  # ctx.lb: the step floor, a bound for the whole problem
    focused = _portfolio(ctx.objective, windowed=ctx.window is not None)
    ctx.stats["subsolvers"] = list(focused) or "default"
    # deterministic: the guard is 20x the search's own budget from its start, not from the solve's
    # start: on a loaded machine the stages before it (bounds, count search, building) took most
    # of a guard counted from t0, and the guard then cut a deterministic search short (a sweep's
    # Ray and one-by-one tables differed by "stopped by the wall clock" under two busy loops)
    elapsed = 0.0 if ctx.deterministic else time.perf_counter() - ctx.t0
    solver = configured_solver(ctx.workers, ctx.seed, ctx.wall_factor * ctx.main_s - elapsed, ctx.main_s, focused)
    code = run_search(solver, handle.model, ctx.cb)
    ctx.stats.update(solve_wall_s=round(solver.wall_time, 3),
                     deterministic_time=round(solver.deterministic_time, 3), branches=solver.num_branches,
                     conflicts=solver.num_conflicts, workers=ctx.workers, seed=ctx.seed,
                     wall_limit_hit=solver.wall_time >= solver.parameters.max_time_in_seconds * 0.99
                     and code != cp_model.OPTIMAL,
                     bound_scope=_scope_text(scope, ctx.window, ctx.within))
    created = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    plan = obj = bound = None
    status = ctx.stats["search_status"] = solver.status_name(code)
    if code in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        plan, obj = _verified_plan(ctx, handle, solver, params=ctx.params, created=created)
        if plan is None:  # a modelling bug: never hand out an unverified plan
            status = "UNKNOWN"
    if code in (cp_model.OPTIMAL, cp_model.FEASIBLE, cp_model.UNKNOWN):
        bound = _problem_bound(handle, solver.best_objective_bound)
    incumbent = _Incumbent(plan=plan, objective=obj, bound=bound, status=status, scope=scope, window=ctx.window,
                           solved=code == cp_model.OPTIMAL, det_used=solver.deterministic_time)
    return _with_fallback(ctx, incumbent, fallback, created)


def _with_fallback(ctx: _SolveContext, incumbent: _Incumbent, fallback: Plan | None, created: str) -> _Incumbent:
    """``incumbent``, or the verified ``fallback`` (a feasible hint, else the unbucketed plan) as a
    cpsat plan when the search found nothing better: the result never loses to it, and a search
    that found nothing in time still returns a plan (``_result`` says so)."""
    if fallback is None:  # the verifier refused even the unbucketed plan (see _best_known)
        return incumbent
    value = plan_objective(ctx.problem, fallback, ctx.objective)
    if incumbent.objective is not None and value >= incumbent.objective:
        return incumbent
    plan = Plan(problem_fingerprint=ctx.problem.fingerprint, planner="cpsat", created=created,
                params={**ctx.params, "from_hint": fallback.planner}, buckets=fallback.buckets)
    # a verified plan is feasible whatever the search said (INFEASIBLE or MODEL_INVALID there is a
    # modelling bug, kept in stats['search_status'])
    return dataclasses.replace(incumbent, plan=plan, objective=value, status="FEASIBLE", fallback=fallback.planner)


def _best_known(ctx: _SolveContext, plans: tuple[Plan | None, ...]) -> Plan | None:
    """The best of ``plans`` and the unbucketed plan that the verifier accepts (None only if it
    refuses them all, which would be a verifier bug: the unbucketed plan moves nothing)."""
    best, best_value = None, math.inf
    for plan in (*plans, unbucketed_plan(ctx.problem)):
        if plan is None or verify(ctx.problem, plan, **ctx.policy.as_params()):
            continue
        value = plan_objective(ctx.problem, plan, ctx.objective)
        if value < best_value:
            best, best_value = plan, value
    return best


def _no_search(ctx: _SolveContext, fallback: Plan | None) -> _Incumbent:
    """The incumbent of a solve whose main search did not run (its model was not built, or a
    Ctrl-C came first): ``fallback``, with the relaxation bound (None if the Ctrl-C came before it),
    which holds for the whole problem."""
    scope = "within" if ctx.within is not None else "window" if ctx.window is not None else "problem"
    ctx.stats.setdefault("bound_scope", _scope_text(scope, ctx.window, ctx.within))
    ctx.stats.setdefault("wall_limit_hit", False)
    none = _Incumbent(plan=None, objective=None, bound=ctx.lb, status="UNKNOWN", scope=scope, window=ctx.window,
                      solved=False, det_used=0.0)
    return _with_fallback(ctx, none, fallback, _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))


PROBLEM_SCOPE = "every anchored plan of the problem"


def _scope_text(scope: str, window: int | None, within: Plan | None) -> str:
    """``stats['bound_scope']``: the plans the search's bound holds for, in words."""
    if scope == "within":
        return f"every plan within the buckets of plan {within.planner}"
    if scope == "window":
        return f"{PROBLEM_SCOPE} (a relaxation; the search kept to candidate window {window})"
    return PROBLEM_SCOPE


def _widen(ctx: _SolveContext, incumbent: _Incumbent) -> _Incumbent:
    """Window widening: while time is left after a windowed search has solved its restricted
    model, double the window and search again with the incumbent as hint (it lies inside the
    wider space). Measured: llama3-8b-fsdp-32 with pre-bucketing, window 16 solved at 136 in 6 s;
    window 32 reached 134 and window 48 133 within 60-120 s. A window that holds every same-key
    candidate is the full model, so its proof is a proof for the problem (scope ``"problem"``)."""
    largest = max(Counter((c.kind, c.pg, c.key) for c in ctx.problem.collectives).values())
    plan, obj, bound, window = incumbent.plan, incumbent.objective, incumbent.bound, incumbent.window
    deadline, det_left = ctx.deadline(ctx.time_limit_s - ctx.polish_s), ctx.time_limit_s - incumbent.det_used
    # called after the previous window was solved: if it held every candidate, that was exact
    stages, exact = [], window >= largest
    build_s = ctx.stats.get("build_s", 0.0)
    while window < largest:
        # a wider model takes longer to build (and presolve): leave room for twice the last build
        if det_left < WIDEN_MIN_S or deadline - time.perf_counter() < WIDEN_MIN_S + 2 * build_s or ctx.cb.interrupted:
            break
        window = min(2 * window, largest)
        if ctx.cb.say:
            ctx.cb.say(f"restricted model solved at {obj:g}; widening the window to {window}")
        started = time.perf_counter()
        try:
            handle = _build(ctx, window, None)
        except BuildStopped:  # out of time or too large: the last window's result stands
            break
        build_s = time.perf_counter() - started
        handle.add_hint(plan)
        solver = configured_solver(ctx.workers, ctx.seed, deadline - time.perf_counter(), det_left,
                                    _portfolio(ctx.objective, windowed=True))
        code = run_search(solver, handle.model, ctx.cb)
        det_left -= solver.deterministic_time
        stage = {"window": window, "status": solver.status_name(code), "wall_s": round(solver.wall_time, 2),
                 "x_vars": handle.stats["x_vars"]}
        stages.append(stage)
        if code in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            found, value = _verified_plan(ctx, handle, solver, params={**ctx.params, "window": window},
                                          created=plan.created)
            if found is None:  # a modelling bug: keep the verified incumbent
                break
            stage["objective"] = value
            if value < obj:
                plan, obj = found, value
        bound = _problem_bound(handle, solver.best_objective_bound)  # valid for this window's space only
        if code != cp_model.OPTIMAL:
            break  # the time ran out inside this window
        exact = window >= largest
    ctx.stats["widened"] = stages
    scope = "problem" if exact else "window"
    ctx.stats["bound_scope"] = _scope_text(scope, window, None)
    return dataclasses.replace(incumbent, plan=plan, objective=obj, bound=bound, window=window, scope=scope,
                               fallback=incumbent.fallback if plan is incumbent.plan else None)


# CP-SAT 9.15 with interleave_search and two or more workers aborts the process ("Check failed:
# heuristics.fixed_search != nullptr", a C++ CHECK, SIGABRT) when the model has a solution hint
# and its infeasibility is found while a worker loads it (its search heuristics are never built).
# A three-variable model does it (docs/results.md, "An OR-Tools abort"). So a model is hinted only
# with a plan that satisfies it: then it is feasible and loading cannot find otherwise. The main
# model always holds the unbucketed plan; a probe ("at most B collectives") need not, and is not
# hinted.


def _probe(ctx: _SolveContext, incumbent: _Incumbent) -> _Incumbent:
    """Destructive lower bounding with the time the main search left: ask for a plan with at
    most B = ceil(bound) collectives. Infeasible proves B + 1 is a bound (probe again); a plan
    found there meets the bound, so it is optimal. On these problems the relaxation bound is
    often tight, and a search told the target finds it sooner (hf-qwen3-8: 83 found under the
    constraint, not found in 120 s without it; llama3-8b-ddp-8: "at most 3" refuted in 3 s)."""
    plan, obj = incumbent.plan, incumbent.objective
    bound = max(incumbent.bound if incumbent.bound is not None else ctx.lb, ctx.lb)
    deadline, det_left = ctx.deadline(ctx.time_limit_s - ctx.polish_s), ctx.time_limit_s - incumbent.det_used
    probes = []
    target = math.ceil(bound - 1e-9)
    while target < obj:
        if deadline - time.perf_counter() < 0.5 or det_left < 0.05 or ctx.cb.interrupted:
            break  # (a Ctrl-C in the last probe: it kept what it found)
        try:
            with build_guard(deadline=deadline, max_pairs=MAX_MODEL_PAIRS):
                handle = build_model(ctx.problem, objective="count", policy=ctx.policy, max_count=target,
                                     bounds=ObjectiveBounds(target, ctx.bounds.key_bounds))
        except BuildStopped:  # out of time: the bound so far stands
            break
        # no hint: the incumbent is over the target, so it breaks this model (see above _probe)
        solver = configured_solver(ctx.workers, ctx.seed, deadline - time.perf_counter(), det_left,
                                    _portfolio("count", windowed=False))
        code = run_search(solver, handle.model, ctx.cb)
        det_left -= solver.deterministic_time
        probes.append({"at_most": target, "status": solver.status_name(code), "wall_s": round(solver.wall_time, 2)})
        if code == cp_model.INFEASIBLE:
            bound = float(target + 1)  # no plan with at most `target` collectives
            target += 1
            continue
        if code in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            found, value = _verified_plan(ctx, handle, solver, params=dict(plan.params), created=plan.created)
            if found is not None:  # else a modelling bug: keep the verified incumbent
                plan, obj = found, value
        break  # found (it meets the bound) or out of time
    ctx.stats["probes"] = probes
    return dataclasses.replace(incumbent, plan=plan, objective=obj, bound=bound,
                               fallback=incumbent.fallback if plan is incumbent.plan else None)


def _polished(ctx: _SolveContext, incumbent: _Incumbent) -> _Incumbent:
    """``planner.search.polish`` on the search's best plan, with the rest of the time limit (in
    deterministic runs, POLISH_EVALUATIONS_PER_S evaluations per second of its share), then on
    the other plans the search could start from while time is left; its result is verified and
    never slower."""
    max_evaluations = int(POLISH_EVALUATIONS_PER_S * ctx.polish_s) if ctx.deterministic else None
    restarts = tuple(p for p in ctx.starts if p.buckets != incumbent.plan.buckets)
    result = polish(ctx.problem, (incumbent.plan, *restarts), deadline=ctx.deadline(ctx.time_limit_s),
                    max_evaluations=max_evaluations, seed=ctx.seed, policy=ctx.policy, progress=ctx.progress)
    ctx.stats["polish"] = result.stats
    if result.objective < incumbent.objective:
        from_start = {"polished_from": result.stats["best_from"]} if "best_from" in result.stats else {}
        plan = result.plan.model_copy(update={"params": {**incumbent.plan.params, "polished": True, **from_start}})
        return dataclasses.replace(incumbent, plan=plan, objective=result.objective, fallback=None)
    return incumbent


def _verdict(ctx: _SolveContext, incumbent: _Incumbent) -> tuple[str, float | None, float | None]:
    """The reported (status, bound, gap) of the final incumbent.

    The bound is the problem's: a restricted search's own bound is not (the relaxation bound is
    reported after a windowed search, none after a search within a plan, and neither is proved
    optimal by its search alone); a search bound below the relaxation bound is raised to it. An
    incumbent that meets a bound valid for the whole problem is OPTIMAL; a step search that
    solved its relaxation but whose simulated step is above the bound is not."""
    status, bound = incumbent.status, incumbent.bound
    if incumbent.scope != "problem":
        bound = None if ctx.within is not None else ctx.lb
        if status == "OPTIMAL":
            status = "FEASIBLE"
    elif bound is not None and ctx.lb is not None:
        bound = max(bound, ctx.lb)
    if bound is not None:
        bound = float(round(bound, 6))
        tolerance = STEP_OPTIMAL_TOLERANCE_MS if ctx.step else 1e-9
        if incumbent.objective is not None and incumbent.objective <= bound + tolerance:
            status = "OPTIMAL"
        elif ctx.step and status == "OPTIMAL":
            status = "FEASIBLE"
    return status, bound, gap_of(incumbent.objective, bound)


def _result(ctx: _SolveContext, incumbent: _Incumbent) -> SolveResult:
    """The SolveResult of the final incumbent; how the search ended travels with the plan."""
    if incumbent.scope != "problem":
        ctx.stats["restricted_bound"] = incumbent.bound
    status, bound, gap = _verdict(ctx, incumbent)
    if incumbent.fallback is not None and status != "OPTIMAL":
        # no search found a better plan in time (or none ran): the plan is the fallback, FEASIBLE
        ctx.stats["fallback"] = incumbent.fallback
    ctx.stats["interrupted"] = ctx.cb.interrupted
    ctx.stats["stop_deferred"] = ctx.cb.stop_deferred
    if status == "OPTIMAL" and ctx.stats.get("wall_limit_hit"):
        # a later stage (a probe) proved the objective: the wall clock that stopped the main search
        # no longer decides it, so the result is not reported as one another run may better
        ctx.stats["main_search_wall_limit_hit"], ctx.stats["wall_limit_hit"] = True, False
    plan = incumbent.plan
    if plan is not None:
        plan = plan.model_copy(update={"params": {**plan.params, "interrupted": ctx.cb.interrupted,
                                                  "wall_limit_hit": bool(ctx.stats.get("wall_limit_hit"))}})
    return SolveResult(plan=plan, status=status, objective=incumbent.objective, bound=bound, gap=gap,
                       wall_s=round(time.perf_counter() - ctx.t0, 3), stats=ctx.stats, progress=ctx.cb.points)


def _verified_plan(ctx: _SolveContext, handle: ModelHandle, solver: cp_model.CpSolver, *, params: dict,
                   created: str) -> tuple[Plan | None, float | None]:
    """The solver's plan with its objective, re-checked by the independent verifier; (None, None)
    when the verifier rejects it (a modelling bug, recorded in ``stats['model_bug']``)."""
    plan = handle.extract(solver, planner="cpsat", params=params, created=created)
    violations = verify(ctx.problem, plan, **ctx.policy.as_params())
    if violations:
        ctx.stats["model_bug"] = [str(v) for v in violations[:5]]
        return None, None
    return plan, plan_objective(ctx.problem, plan, ctx.objective)


def run_search(solver: cp_model.CpSolver, model: cp_model.CpModel, cb: "SearchProgress") -> int:
    """``solver.solve`` that a Ctrl-C stops within a moment, keeping what it found.

    CP-SAT's own SIGINT handling stops the search but says nothing, so the caller went on to
    its next stage and exited 0. Here the search runs in a thread while this one waits, so
    Python's KeyboardInterrupt arrives at once: the search is stopped, its incumbent kept, and
    ``cb.interrupted`` tells every later stage not to start.

    One moment is not safe to stop in: CP-SAT 9.15 loads the model into its workers after presolve
    ("Preloading model."), takes a complete feasible hint as its first solution there, and a stop
    before its search has started ("Starting ... search at") aborts the process in postsolve
    ("Check failed: solution->size() == postsolve_mapping.size()", exit -6; measured: 4 of 6
    Ctrl-Cs right after the first incumbent of a step search on a loaded machine). CP-SAT's log
    (read here, not printed) says when that moment begins and ends; a Ctrl-C inside it stops the
    search as soon as the search starts (a moment later), after STOP_DEFERRED_S at most (should
    a later OR-Tools word its log otherwise), or at once on a second Ctrl-C (a library caller's: the
    command line counts a second Ctrl-C without raising it, so that the plan's save is not cut)."""
    if cb.interrupted:
        return cp_model.UNKNOWN
    solver.parameters.catch_sigint_signal = False
    if threading.current_thread() is not threading.main_thread():
        return solver.solve(model, cb)
    loading, searching = threading.Event(), threading.Event()

    def read_log(line: str) -> None:
        if line.startswith("Preloading model"):
            loading.set()
        elif line.startswith("Starting") and " search at " in line:
            searching.set()

    solver.parameters.log_search_progress = True  # read by read_log only
    solver.parameters.log_to_stdout = False
    solver.log_callback = read_log
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
    stop_by: float | None = None  # a deferred stop: due when the search starts, or at this time
    while True:
        try:
            while not done.wait(0.1):
                if stop_by is not None and (searching.is_set() or time.perf_counter() >= stop_by):
                    stop_by = None
                    solver.stop_search()
            break
        except KeyboardInterrupt:
            cb.interrupted = True
            if stop_by is None and loading.is_set() and not searching.is_set():
                stop_by = time.perf_counter() + STOP_DEFERRED_S
                cb.stop_deferred = True
                if cb.say:
                    cb.say(f"stopping as soon as CP-SAT's workers have started (within {STOP_DEFERRED_S:.0f} s)")
            else:
                stop_by = None
                solver.stop_search()  # then wait for the search to hand back its incumbent
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0]


def _problem_bound(handle: ModelHandle, solver_bound: float) -> float:
    """The solver's bound in the objective's units: a step model's ns less its rounding slack
    (one ns per event and per duration) in ms."""
    if handle.objective != "step":
        return solver_bound
    return (solver_bound - handle.stats["step_slack_ns"]) / NS_PER_MS


def configured_solver(workers: int, seed: int, wall_s: float, deterministic_s: float,
                       subsolvers: tuple[str, ...] = ()) -> cp_model.CpSolver:
    """CP-SAT with this package's search settings (deterministic for a fixed seed and workers);
    ``subsolvers`` replaces CP-SAT's default full-problem portfolio."""
    solver = cp_model.CpSolver()
    solver.parameters.catch_sigint_signal = False  # Ctrl-C is ours (solver.run_search)
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




# -- the anchored mode of planner.plan (planner.search.planners.MODES) ------------------------------


def check_anchored(spec) -> None:
    """What an anchored spec must be (``planning.PlanSpec``): the CP-SAT model keeps torch's
    overlap and has no peak cap, and the free and robust modes' fields are theirs."""
    from planner.core.policy import Policy

    if spec.policy is not None and spec.policy != Policy(**{f: getattr(spec.policy, f) for f in SolveOptions.POLICY_FIELDS}):
        raise arguments.ArgumentError("policy", "the anchored CP-SAT search keeps torch's overlap and has no peak "
                                                "cap: keep_overlap and peak_memory_bytes are the free mode's")
    spec.only_defaults(("prove_s", "starts", "scenarios", "per_block", "anchored_start"), "anchored")


def plan_anchored(problem: Problem, spec, calls, started: float) -> SolveResult:
    """CP-SAT's plan for ``spec`` (``solve`` with its options, hint, count plan and fallbacks)."""
    result = solve(problem, spec.anchored_options(), hint=spec.hint, count_plan=spec.count_plan,
                   fallback_plans=spec.fallback_plans, progress=calls.search_progress)
    calls.on_plan(result.plan)
    return result
