"""Greedy vs optimal on the same graphs: counts, simulated step time, exposed communication.

Why this exists: users come to learn how far torch's greedy bucketing is from optimal on their
models and what the difference is worth. For each workload this runs, on the same traced
graph: torch's default pipeline (FSDP pre-bucketing + greedy), torch's greedy alone, and
torch's manual bucketing of one bucket per transformer block (``fxglue.manual``), and
CP-SAT (fewest collectives; and the simulated step itself, started from that plan), verifies
every plan, simulates each one
(``planner.simulate``), and writes one table (CSV and Markdown), plots and Chrome traces (the
table and plots are ``bucketplan.report``'s: torch-free).
Every row is set against the step floor (``planner.cost.bounds.step_floor``): the step no plan can
beat on that cluster, so "ms above the floor" is what a planner leaves on the table.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import time
from pathlib import Path

import planner
from planner.search import planners
import planner.core.io
from planner.core.io import atomic_write_text, replace_dir_atomically
from planner.cost.bounds import peak_memory_floor, step_floor
from planner.cost.memory import peak_bytes
from planner.core.options import SolveOptions
from planner.search import planning
from planner.search.planning import Budget, PlanSpec
from planner.search.free.position_search import PeakNotReached
from planner.search.repair import repair
from planner.cost.simulator import simulate, write_chrome_trace
from planner.jobs.interrupted import beside
from planner.search.result import gap_of, mark_interrupted
from planner.jobs.progress import LiveLine
from bucketplan.report import (COMPARE_TIME_LIMIT_S, MemoryBudget, PlanRow, WorkloadRow, excess_text, table_rows,
                               write_compare_table)
from bucketplan.report import plots
from planner.rules.verifier import check

DEFAULT_SUITE = ("llama3-8b-fsdp-2", "llama3-8b-2d-2", "llama3-8b-ddp-2", "llama3-8b-fsdp-8")
# (label, objective): the step search starts from the count plan, which it never loses to
CPSAT_VARIANTS = (("cpsat (count)", "count"), ("cpsat (step)", "step"))
MANUAL_LABEL = "torch manual (a bucket per block)"
DEFAULT_LABEL = "torch default (pre-bucketing + greedy)"
GREEDY_LABEL = "torch greedy"
PRE_STEP_LABEL = "cpsat (step, pre-bucketed)"
POSITIONED_LABEL = "bucketplan (step, free positions)"  # within torch default's peak
POSITIONED_MANUAL_LABEL = "bucketplan (free positions, manual's peak)"  # within torch manual's peak
# every row of a built-in workload, in table order (the unbucketed row is not planned)
WORKLOAD_PLANNERS = (DEFAULT_LABEL, GREEDY_LABEL, MANUAL_LABEL, *(label for label, _ in CPSAT_VARIANTS),
                     PRE_STEP_LABEL, POSITIONED_LABEL, POSITIONED_MANUAL_LABEL)
SEARCHING = {label for label, _ in CPSAT_VARIANTS} | {PRE_STEP_LABEL, POSITIONED_LABEL, POSITIONED_MANUAL_LABEL}
# torch's rows, which ours are set against at equal memory (``bucketplan.report.equal_memory_lines``)
TORCH_ROWS = ("unbucketed", DEFAULT_LABEL, GREEDY_LABEL, MANUAL_LABEL)
# everything run_compare writes into its folder: the folder is replaced as a whole, so one
# holding anything else (`-o .`, `-o ~`) is refused rather than wiped
OUTPUTS = ("compare.csv", "compare.md", "compare.json", "scenarios.md", "step_time.png", "collectives_and_exposed.png",
           "timeline.png", "traces", "plans", "problems")


# a problem file's rows: torch's greedy from its sibling file, then CP-SAT's
PROBLEM_FILE_PLANNERS = (GREEDY_LABEL, *(label for label, _ in CPSAT_VARIANTS))
# a workload that is not built in (your model, a Hugging Face config, a graph file): no manual row
OWN_WORKLOAD_PLANNERS = tuple(p for p in WORKLOAD_PLANNERS if p not in (MANUAL_LABEL, POSITIONED_MANUAL_LABEL))


class Steps:
    """compare's progress: one line as each planner starts, "workload 2/4 NAME, planner 3/8 LABEL,
    about 0:41 left". Time left = the searches still to run at their time limit (this workload's,
    and a built-in workload's five for each workload not yet started), plus, for each workload not yet started, the mean
    time the finished ones spent outside search (tracing, torch's scheduler, simulation, traces);
    10 s each before any has finished."""

    def __init__(self, say, n_workloads: int, time_limit_s: float):
        self.say, self.n, self.limit = say, n_workloads, time_limit_s
        self.index, self.name, self.started, self.planners, self.searches_left = 0, "", 0.0, WORKLOAD_PLANNERS, 0
        self.overheads: list[float] = []

    def workload(self, name: str, planners: tuple[str, ...] = WORKLOAD_PLANNERS) -> None:
        """The next workload starts; ``planners``: its rows, in order."""
        self.index, self.name, self.started, self.planners = self.index + 1, name, time.perf_counter(), planners
        self.searches_left = sum(label in SEARCHING for label in planners)

    def planner(self, label: str, k: str | None = None) -> None:
        """``label`` starts; ``k``: its number as shown (default: its place among the planners)."""
        overhead = sum(self.overheads) / len(self.overheads) if self.overheads else 10.0
        left = self.searches_left * self.limit + (self.n - self.index) * (len(SEARCHING) * self.limit + overhead)
        k = k or str(self.planners.index(label) + 1)
        self.say(f"workload {self.index}/{self.n} {self.name}, planner {k}/{len(self.planners)} {label}, "
                 f"about {int(left) // 60}:{int(left) % 60:02d} left")
        if label in SEARCHING:
            self.searches_left -= 1

    def done(self, rows: list[PlanRow]) -> None:
        """The workload's rows are done: what it spent outside search informs the estimate."""
        searched = sum(p.plan_s for p in rows if p.planner in SEARCHING)
        self.overheads.append(max(0.0, time.perf_counter() - self.started - searched))


def _problems_for(name, announce, preset=None):
    """(problem without pre-bucketing, torch's greedy on it, problem with pre-bucketing, greedy on it);
    what the measurements leave out of the first in its ``meta["warnings"]``
    (``fxglue.presets.measurement_warnings``: beside the rows, never a refusal, as compare reports)."""
    from fxglue.pipeline import PipelineOptions, prepare
    from fxglue.presets import measurement_warnings, pricing_lines

    announce("torch default, torch greedy (tracing, torch's scheduler)", "1-2")
    out = []
    for pre in (False, True):
        p = prepare(name, preset=preset, pipeline=PipelineOptions(pre_bucketing=pre))
        problem = p.problem
        if not pre:  # before the second trace; both schedules have the same groups
            warnings = measurement_warnings(p.preset, problem)
            extra = {"warnings": warnings} if warnings else {}
            if getattr(p.preset, "measured", None) is not None:  # what priced each group, where it is not the model
                extra["pricing"] = pricing_lines(p.preset, problem)
            if extra:
                problem = problem.model_copy(update={"meta": {**problem.meta, **extra}})
        out.append((problem, p.greedy, p.timings["greedy_s"], p.traced.gm))
    return out


def _announcer(name: str, say, steps: Steps | None):
    """What compare_workload says as each row starts: a ``Steps`` line, or ``say("NAME: LABEL")``."""
    def announce(label: str, k: str | None = None) -> None:
        if steps is None:
            if say is not None:
                say(f"{name}: {label}")
        else:
            steps.planner(label, k)
    return announce


def _stop_if_interrupted(stats: dict, cut: PlanRow | None = None) -> None:
    """A search that Ctrl-C cut short keeps its plan, but a table of cut-short rows is not a
    compare run: stop here; ``run_compare`` leaves the output folder as it was and keeps the plans
    made so far beside it, ``cut`` (the cut-short search's row) among them."""
    if stats.get("interrupted"):
        stop = KeyboardInterrupt()
        stop.cut_row = cut
        raise stop


@contextlib.contextmanager
def _rows_kept_on_ctrl_c(row: WorkloadRow):
    """A Ctrl-C inside carries this workload's rows so far (the cut-short search's too) up to
    ``run_compare`` as the interrupt's ``partial_row``."""
    try:
        yield
    except KeyboardInterrupt as stop:
        cut = getattr(stop, "cut_row", None)
        if cut is not None and cut.plan is not None:
            row.plans.append(cut)
        stop.partial_row = row
        raise


def _greedy_row(label: str, problem, plan, seconds: float) -> PlanRow:
    row = PlanRow(label, problem, plan, seconds)
    report = check(problem, plan)
    if not report.feasible:
        fixed = repair(problem, plan, SolveOptions(time_limit_s=20))
        _stop_if_interrupted(fixed.stats)
        row.note = (f"breaks rule(s) {sorted(report.by_rule())} as recorded; simulated as its repair "
                    f"({fixed.objective} collectives)")
        row.plan = fixed.plan
    return row


def compare_workload(workload, *, time_limit_s: float, traces_to: Path | None, say, preset=None, manual: bool = True,
                     steps: Steps | None = None) -> WorkloadRow:
    """Every row for one workload (a built-in name or a ``Workload``, e.g. a user's model); each
    row's Chrome trace under ``traces_to/traces/`` (None: none). ``manual``: torch's manual
    per-block row too (built-in workloads only). ``steps``: compare's progress, one line per row
    (``say`` then gets only the searches' detail);
    without it every stage and search line goes to ``say``. ``say`` None: no detail at all."""
    name = workload if isinstance(workload, str) else workload.name
    announce = _announcer(name, say, steps)
    live, say = say is not None, say or _silent  # say None: no search detail (compare without -v)
    (prob, greedy, greedy_s, gm), (prob_pre, greedy_pre, greedy_pre_s, _) = _problems_for(workload, announce, preset)
    row = WorkloadRow(name, prob.n_scheduled, len(prob.collectives), preset=prob.meta.get("preset") or "",
                      warnings=list(prob.meta.get("warnings", [])), pricing=list(prob.meta.get("pricing", [])),
                      baselines=TORCH_ROWS)
    row.problem, row.problem_pre = prob, prob_pre
    with _rows_kept_on_ctrl_c(row):
        # the floor of each problem holds for every plan on it; their minimum holds for every row
        row.floor_ms = min(step_floor(prob).floor_ms, step_floor(prob_pre).floor_ms)
        row.plans.append(_greedy_row(DEFAULT_LABEL, prob_pre, greedy_pre, greedy_pre_s))
        row.plans.append(_greedy_row(GREEDY_LABEL, prob, greedy, greedy_s))
        # torch's manual pass needs the module's block names: built-in workloads only
        manual_row = _manual_row(name, preset, announce) if manual and isinstance(workload, str) else None
        if manual_row is not None:
            row.plans.append(manual_row)
            row.floor_ms = min(row.floor_ms, step_floor(manual_row.problem).floor_ms)
        _cpsat_rows(row, prob, row.plans[1].plan, time_limit_s, say, announce, live)
        announce(PRE_STEP_LABEL)
        row.plans.append(pre_step_row(name, prob_pre, row.plans[0].plan, time_limit_s, say))
        # our free-position rows, each within the peak of one of torch's rows, exactly
        default = row.plans[0]
        row.budgets.append(MemoryBudget("torch default's peak", peak_bytes(default.problem, default.plan),
                                        POSITIONED_LABEL))
        if manual_row is not None:
            row.budgets.append(MemoryBudget("torch manual's peak", peak_bytes(manual_row.problem, manual_row.plan),
                                            POSITIONED_MANUAL_LABEL))
        schedules = [prob, prob_pre]
        if manual_row is not None:  # the order torch's manual pass plans on, too
            row.problem_graph = _graph_order_problem(name, preset)
            schedules.append(row.problem_graph)
        for budget in row.budgets:
            announce(budget.ours)
            row.plans.append(positioned_row(schedules, row, budget, time_limit_s))
        _best_within_each_budget(row)
        row.floor_ms = min(row.floor_ms, *(planning.floor(p).floor_ms  # positioned plans: their own floor
                                           for p in (prob, prob_pre, row.problem_graph) if p is not None))
        _flag_over_default_peak(row)
        _simulate_rows(row, prob, traces_to)
        if steps is not None:
            steps.done(row.plans)
    return row


def _flag_over_default_peak(row: WorkloadRow) -> None:
    """A row whose plan holds more than torch default's peak says by how much in its note: the
    rows are compared at the memory torch would use (``bucketplan.report.equal_memory_lines`` sets
    each of our capped rows against torch's rows within its own budget)."""
    default = next((r for r in row.plans if r.planner == DEFAULT_LABEL and r.plan is not None), None)
    if default is None:
        return
    cap = peak_bytes(default.problem, default.plan)
    for r in row.plans:
        if r is not default and r.plan is not None:
            peak = peak_bytes(r.problem, r.plan)
            if peak > cap:
                # the excess itself: at 3 decimals of GB a small one reads as equal to the budget
                over = f"peak {peak / 1e9:.3f} GB, {excess_text(peak - cap)} above torch default's peak {cap / 1e9:.3f} GB"
                r.note = f"{r.note}; {over}" if r.note else over


def _simulate_rows(row: WorkloadRow, prob, traces_to: Path | None) -> None:
    """Each row's simulated step (and its Chrome trace when ``traces_to`` is a folder)."""
    runs = [("unbucketed", prob, None)] + [(p.planner, p.problem, p.plan) for p in row.plans if p.plan is not None]
    for label, problem, plan in runs:
        row.sims[label] = simulate(problem, plan)
        if traces_to is not None:
            write_chrome_trace(row.sims[label], problem, traces_to / "traces" / f"{_slug(row.name)}--{_slug(label)}.json")


def _silent(msg: str) -> None:
    pass


def _cpsat_rows(row: WorkloadRow, prob, hint, time_limit_s: float, say, announce, live: bool = True) -> None:
    """CP-SAT's rows: fewest collectives, then the step objective started from that plan. ``live``:
    the search's detail kept alive as a live line (``planner.jobs.progress.LiveLine``), else none."""
    count_plan = None
    for label, objective in CPSAT_VARIANTS:
        announce(label)
        with (LiveLine(lambda msg: say(f"{row.name}: {label}: {msg}")) if live  # never silent for long
              else contextlib.nullcontext(None)) as progress:
            row.plans.append(_solved_row(label, planners.PlanRequest(
                prob, greedy=hint, solve=_row_options(time_limit_s, objective), count_plan=count_plan,
                search_progress=progress)))
        if objective == "count" and row.plans[-1].plan is not None:
            count_plan = row.plans[-1].plan  # the step row starts from it rather than search again


def _row_options(time_limit_s: float, objective: str) -> SolveOptions:
    """A CP-SAT row's search: two workers, as every compare row."""
    return SolveOptions(time_limit_s=time_limit_s, objective=objective, workers=2)


def _solved_row(label: str, request: planners.PlanRequest, note: str = "") -> PlanRow:
    """A row planned by ``planner.plan``'s anchored mode (``request.greedy`` is its hint)."""
    res = planner.plan(request.problem, PlanSpec.of_solve_options(
        request.solve, hint=request.greedy, count_plan=request.count_plan,
        fallback_plans=tuple(request.fallback_plans)), search_progress=request.search_progress)
    note = "; ".join(x for x in (note, "stopped by the wall clock" if res.stats.get("wall_limit_hit") else "") if x)
    row = PlanRow(label, request.problem, res.plan, res.wall_s, res.status, res.bound, res.gap, note,
                  bound_unit="collectives" if request.solve.objective == "count" else "ms")
    _stop_if_interrupted(res.stats, row)
    return row


def pre_step_row(name: str, prob_pre, default_plan, time_limit_s: float, say) -> PlanRow:
    """The step objective on torch's pre-bucketed schedule, started from torch's default
    pipeline (its greedy plan there, repaired if it breaks a rule), which it never loses to.
    On 64 nodes pre-bucketing before scheduling gave torch's default pipeline a better schedule
    than any plan on the unbucketed one (llama3-8b-2d-8: 98.6 ms against 165.6)."""
    return _solved_row(PRE_STEP_LABEL, planners.PlanRequest(
        prob_pre, greedy=default_plan, solve=_row_options(time_limit_s, "step"),
        fallback_plans=(default_plan,) if default_plan is not None else (),
        search_progress=lambda msg: say(f"{name}: {PRE_STEP_LABEL}: {msg}")), note="on torch's pre-bucketed schedule")


SCHEDULE_NAMES = ("torch's schedule", "torch's pre-bucketed schedule", "the graph's own order")


def positioned_row(schedules: list, row: WorkloadRow, budget: MemoryBudget, time_limit_s: float) -> PlanRow:
    """``planner.plan``'s free positions (the positioned search from the plans of the rows above, no
    CP-SAT search of its own) within ``budget``, the peak of one of torch's rows exactly
    (``planner.cost.memory``, as torch's estimator counts it): a plan never holds more than what
    torch would run. The time is shared out over ``schedules`` (torch's schedule, from the
    per-block seed and the plans there: CP-SAT's, torch's greedy, our rows above; torch's
    pre-bucketed schedule, from torch's default plan and the plans there, so the row within torch
    default's peak is never slower than torch's default pipeline: measured on llama3-8b-2d-8 @
    h100-8nodes, 10 s, 104.7 ms on torch's schedule alone against default's 98.8; and, for a
    built-in workload, the graph's own order, which torch's manual pass plans on, from the
    per-block seed). Its bound is
    the least free-position floor within the budget over the schedules: no plan on any of them,
    with any positions and a peak within it, is faster. Where nothing within the budget is found,
    the row has no plan and its note says why: proved (``peak_memory_floor``) or the lowest peak
    the search reached. On a small problem (``planning.proof_seconds``) CP-SAT over the best plan's
    candidate space gets its share of the time (``prove``), the search the rest."""
    found, misses = [], []
    bounds = []  # per schedule where a plan within the budget may exist: the least step of any
    t0 = time.perf_counter()
    proof_s = planning.proof_seconds(schedules[0], time_limit_s)
    proving, search_s = proof_s is not None, time_limit_s - (proof_s or 0.0)
    for k, problem in enumerate(schedules):
        where = SCHEDULE_NAMES[k]
        starts = tuple(p.plan for p in row.plans if p.problem is problem and p.plan is not None)
        seconds = t0 + search_s * (k + 1) / len(schedules) - time.perf_counter()  # earlier leftovers too
        spec = PlanSpec(mode="free", budget=Budget(max(seconds, 1e-3)), starts=starts, anchored_start=False,
                        policy=planner.Policy(keep_overlap=False, peak_memory_bytes=budget.peak_bytes))
        try:
            found.append((planner.plan(problem, spec), k))
        except PeakNotReached as e:  # nothing on this schedule found within the budget
            misses.append(f"on {where}: {e}")
            if peak_memory_floor(problem) <= budget.peak_bytes:  # not proved: a plan may still fit
                bounds.append(planning.floor(problem, budget.peak_bytes).floor_ms)
            continue
        bounds.append(found[-1][0].bound)
        _stop_if_interrupted(found[-1][0].stats, PlanRow(budget.ours, problem, found[-1][0].plan,
                                                         time.perf_counter() - t0))
    within = f"within {budget.name} ({budget.peak_bytes / 1e9:.3f} GB)"
    if not found:
        return PlanRow(budget.ours, schedules[0], None, time.perf_counter() - t0, "NOT FOUND",
                       round(min(bounds), 3) if bounds else None, None, f"{within}: " + "; ".join(misses))
    result, k = min(found, key=lambda f: f[0].objective)
    bound, problem, where = min(bounds), schedules[k], SCHEDULE_NAMES[k]
    proof = scope = ""
    if proving:
        result, proof, scope = prove(problem, result, budget, t0 + time_limit_s - time.perf_counter())
    return PlanRow(budget.ours, problem, result.plan, time.perf_counter() - t0, "FEASIBLE",
                   round(bound, 3), gap_of(result.objective, bound),
                   f"on {where}, {within}; local search, best from {result.stats['best_from']}"
                   + "".join(f"; nothing found {m}" for m in misses) + (f"; {proof} (scope: {scope})" if proof else ""),
                   proof=proof)


def prove(problem, found, budget: MemoryBudget, seconds: float):
    """CP-SAT over the candidate space of ``found``'s plan within ``budget`` for ``seconds``
    (``planner.plan``'s free mode with ``prove_s``, from that plan alone: its search gets a fifth
    of the time, enough to take the plan in): ``(result, line, scope)``, the result CP-SAT's plan
    where it is faster, the line its status, bound and gap, the scope what that bound holds for."""
    seconds = max(seconds, 1.0)
    spec = PlanSpec(mode="free", budget=Budget(seconds / 5), starts=(found.plan,), anchored_start=False,
                    per_block=False, prove_s=seconds * 4 / 5,
                    policy=planner.Policy(keep_overlap=False, peak_memory_bytes=budget.peak_bytes))
    proved = planner.plan(problem, spec)
    _stop_if_interrupted(proved.stats, PlanRow(budget.ours, problem, proved.plan, 0.0))
    proof = proved.stats.get("proof")
    if proof is None:
        return found, "", ""
    best = proved if proved.objective < found.objective - 1e-9 else found
    stopped = "; stopped by the wall clock" if proof.stats.get("wall_limit_hit") else ""
    return best, (f"CP-SAT over its plan's candidate space: {proof.status}, none of it under {proof.bound:.3f} ms, "
                  f"gap {100 * proof.gap:.2f}%{stopped}"), proof.bound_scope


def _best_within_each_budget(row: WorkloadRow) -> None:
    """Each of our capped rows takes the plan of another of them where that plan is within its
    budget and faster (a plan searched within the lower of torch's peaks is within the higher
    too), saying so; its bound, over the same schedules within its own budget, stands."""
    ours = {b.ours: b for b in row.budgets}
    rows = [r for r in row.plans if r.planner in ours]
    steps = {r.planner: simulate(r.problem, r.plan).step_ms for r in rows if r.plan is not None}
    for r in rows:
        fits = [o for o in rows if o is not r and o.plan is not None
                and peak_bytes(o.problem, o.plan) <= ours[r.planner].peak_bytes]
        best = min(fits, key=lambda o: steps[o.planner], default=None)
        if best is None or (r.plan is not None and steps[best.planner] >= steps[r.planner] - 1e-9):
            continue
        own = f"its own search's best {steps[r.planner]:.3f} ms" if r.plan is not None else "its own search found none"
        r.problem, r.plan, r.status, r.proof = best.problem, best.plan, "FEASIBLE", ""
        r.gap = gap_of(steps[best.planner], r.bound)
        r.note = f"the plan of row {best.planner!r}, within this budget too and faster ({own}); {r.note}"


def _graph_order_problem(name: str, preset):
    """The workload's problem on the graph's own order (``--schedule graph``: torch's scheduler not
    run), priced as the other rows are."""
    from fxglue.pipeline import PipelineOptions, prepare

    return prepare(name, preset=preset, pipeline=PipelineOptions(schedule="graph"), greedy=False).problem


def _manual_row(name: str, preset, announce) -> PlanRow | None:
    """Torch's manual per-block bucketing on a fresh trace (the pass replaces the scheduler),
    simulated as it leaves the graph; None for a workload whose blocks it cannot name."""
    from fxglue.blocks import with_blocks
    from fxglue.manual import manual_bucketing_problem
    from fxglue.pipeline import estimator_for, resolve_preset
    from fxglue.models.workloads import trace

    announce(MANUAL_LABEL)
    p = resolve_preset(preset)
    traced = trace(name, world_size=p.world_size, tp=p.tp) if p else trace(name)
    t0 = time.perf_counter()
    problem, info = manual_bucketing_problem(traced, estimator_for(traced, preset=p),
                                             meta={**traced.meta, "preset": p.name if p else None})
    problem = with_blocks(problem, traced, traced.gm, merged=True)  # its blocks, for the timeline's layer spans
    plan = planner.Plan(problem_fingerprint=problem.fingerprint, planner="torch-manual", created="",
                        buckets=())  # torch merged its buckets in the graph: the problem is the plan
    return PlanRow(MANUAL_LABEL, problem, plan, time.perf_counter() - t0,
                   note="all_reduce never bucketed by this pass" if any(
                       c.kind == "all_reduce" for c in problem.collectives) else "")


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def compare_problem_file(path: Path, *, time_limit_s: float, out: Path, say, steps: Steps | None = None) -> WorkloadRow:
    """A problem file: torch's greedy from the sibling greedy-plan.json when there is one, CP-SAT."""
    prob = planner.load_problem(path)
    name = str(path)
    announce = _announcer(name, say, steps)
    live, say = say is not None, say or _silent
    row = WorkloadRow(name, prob.n_scheduled, len(prob.collectives), preset=prob.meta.get("preset") or "",
                      floor_ms=step_floor(prob).floor_ms, problem=prob, own_costs=True)
    with _rows_kept_on_ctrl_c(row):
        greedy_path = path.parent / "greedy-plan.json"
        hint = None
        if greedy_path.exists():
            g = planner.load_plan(greedy_path)
            row.plans.append(_greedy_row(GREEDY_LABEL, prob, g, float(g.params.get("wall_s", 0.0))))
            hint = row.plans[-1].plan
        _cpsat_rows(row, prob, hint, time_limit_s, say, announce, live)
        _simulate_rows(row, prob, out)
        if steps is not None:
            steps.done(row.plans)
    return row


def keep_interrupted_plans(rows: list[WorkloadRow], out: Path) -> Path | None:
    """At a Ctrl-C: every verified plan made so far, marked interrupted, as ``save_plans`` writes
    them, in a new folder beside ``out`` (``<out>.interrupted``, ``-2``, ...: never one that
    exists, so no earlier run is replaced); None when no plan was made yet."""
    marked = []
    for row in rows:
        plans = [dataclasses.replace(p, plan=mark_interrupted(p.plan))
                 for p in row.plans if p.plan is not None and p.planner != MANUAL_LABEL]
        if plans:
            marked.append(dataclasses.replace(row, plans=plans))
    if not marked:
        return None
    kept = next(p for p in beside(out) if p != out and not os.path.lexists(p))
    with replace_dir_atomically(kept, owned=OUTPUTS) as tmp:
        save_plans(marked, tmp)
    return kept


def save_plans(rows: list[WorkloadRow], out: Path) -> Path:
    """Every plan compare computed as ``plans/<workload>--<planner>.json``, beside the problems they
    are for (``problems/<workload>.json``: torch's schedule; ``...--graph-order.json``: the graph's own
    order; ``...--pre-bucketed.json``: torch's
    pre-bucketed one), and ``plans/index.md`` naming each plan's problem and the commands that take
    it. Each was verified where it was made: CP-SAT's and the positioned search's by the solver,
    torch's by ``_greedy_row`` (or its repair). Torch's manual row is not a plan of ours (its pass
    merged inside the graph), so it has no file."""
    lines = ["# Plans of this compare run", "",
             "Each plan verifies against its problem: `bucketplan verify PROBLEM PLAN`. A plan on torch's "
             "schedule applies to the workload with `bucketplan apply WORKLOAD PLAN --preset PRESET`; one on the "
             "pre-bucketed schedule needs `--pre-bucketing` too, one on the graph's own order `--schedule graph`. Torch's manual per-block row is torch's own pass "
             "(it merges inside the graph), not a plan, so it has no file.", "",
             "| workload | planner | plan | problem |", "|---|---|---|---|"]
    for row in rows:
        schedules = {id(row.problem): "", id(row.problem_pre): "--pre-bucketed", id(row.problem_graph): "--graph-order"}
        saved = set()
        for p in row.plans:
            if p.plan is None or p.planner == MANUAL_LABEL:
                continue
            problem_file = Path("problems") / f"{_slug(row.name)}{schedules[id(p.problem)]}.json"
            if problem_file not in saved:
                planner.core.io.save(p.problem, out / problem_file)
                saved.add(problem_file)
            plan_file = Path("plans") / f"{_slug(row.name)}--{_slug(p.planner)}.json"
            planner.core.io.save(p.plan, out / plan_file)
            lines.append(f"| {row.name} | {p.planner} | {plan_file} | {problem_file} |")
    (out / "plans").mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "plans" / "index.md", "\n".join(lines) + "\n")
    return out / "plans"


def scenario_tables(rows: list[WorkloadRow], scenarios: list[str]) -> list[str]:
    """Markdown lines: per workload, each row's plan re-priced under each scenario, with its regret
    (``planner.search.scenarios``); the same plans as the main table, nothing searched again."""
    from planner.search.scenarios import ScenarioError, describe, judge_each

    lines = ["Scenarios: " + "; ".join(f"`{s}`: {describe(s)}" for s in scenarios),
             ""]
    for row in rows:
        unbucketed = {"unbucketed": (row.problem, None)} if row.problem is not None else {}
        try:
            judged = judge_each({**unbucketed, **{p.planner: (p.problem, p.plan) for p in row.plans
                                                  if p.plan is not None}}, scenarios)
        except ScenarioError as e:  # an α-β problem has no layout to re-price by: the run keeps its rows
            lines += [f"**{row.name}** ({row.preset}): not re-priced ({e})", ""]
            continue
        lines += [f"**{row.name}** ({row.preset})", "", *judged.markdown("planner")]
        lines.append("")
    lines.append("regret: the step over the least step of any row of that workload under that scenario, minus 1; "
                 "each plan simulated (planner.simulate) on its own problem re-priced by the scenario. The plans "
                 "were searched under the cluster's own model; `bucketplan solve --robust` searches across "
                 "scenarios.")
    return lines


def run_compare(workloads, *, out: Path, time_limit_s: float = COMPARE_TIME_LIMIT_S, progress=None, preset=None,
                detail=None, scenarios: list[str] | None = None) -> list[dict]:
    """Every row for every target; writes the table, plots, traces and plans into ``out``.

    ``progress``: one line as each planner of each workload starts (``Steps``); ``detail``: the
    searches' own lines (incumbents, bounds, polish moves), none by default.

    ``out`` is replaced as a whole, and only when the run completes: everything is written into a
    fresh folder beside it first (``planner.core.io.replace_dir_atomically``). A run that fails or is
    interrupted leaves ``out`` as it was, so it never holds one run's table beside another's
    traces, nor traces of workloads the last run did not have. An existing ``out`` is replaced only
    while it holds nothing but what an earlier compare wrote (its manifest), checked again at the
    swap, and one compare writes it at a time (``OutputFolderError`` otherwise)."""
    steps = Steps(progress or _silent, len(workloads), time_limit_s)
    rows: list[WorkloadRow] = []
    try:
        with replace_dir_atomically(out, owned=OUTPUTS) as tmp:
            for target in workloads:
                if isinstance(target, str) and target.endswith(".json"):
                    steps.workload(target, PROBLEM_FILE_PLANNERS)
                    rows.append(compare_problem_file(Path(target), time_limit_s=time_limit_s, out=tmp, say=detail,
                                                     steps=steps))
                else:
                    steps.workload(target if isinstance(target, str) else target.name,
                                   WORKLOAD_PLANNERS if isinstance(target, str) else OWN_WORKLOAD_PLANNERS)
                    rows.append(compare_workload(target, time_limit_s=time_limit_s, traces_to=tmp, say=detail,
                                                 preset=preset, steps=steps))
            table = table_rows(rows)
            write_compare_table(tmp, table)
            if scenarios:
                atomic_write_text(tmp / "scenarios.md", "\n".join(scenario_tables(rows, scenarios)) + "\n")
            plots(rows, tmp)
            save_plans(rows, tmp)
    except KeyboardInterrupt as stop:  # out stays as it was; the plans made so far go beside it
        partial = getattr(stop, "partial_row", None)
        stop.kept = keep_interrupted_plans(rows + ([partial] if partial is not None else []), out)
        raise
    return table
