"""The one registry of planners: each name, what it means, and how its plan is made.

Why this exists: the pipeline, the gloo check, the experiments and the command line each kept
their own tuple of planner names and their own if/elif over them, and the tuples had drifted
apart. Here every planner is one entry: its name, a one-line description (the command line's
``--help``), the function that makes its plan from a ``PlanRequest``, and how the plan reaches
the graph -- torch's own finalize (``TorchFinalize``: torch searches and merges by itself) or
``fxglue.apply.apply_plan`` (``finalize`` None). Callers keep their own search parameters
(time limits, workers, seeds, hint) and pass them in the request.

Torch-free at import (the command line builds its parser from it for every command); the
searches are imported when a plan is made. Imports nothing of ``fxglue``, so every room above
may read it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import planner
    from planner.core.options import SolveOptions
    from planner.search.solver import SolveResult

AUTOFIX_CONFIG = "aten_distributed_optimizations.overlap_scheduling_autofix_cycles"


@dataclass(frozen=True)
class TorchFinalize:
    """Why: some planners are torch's own bucketer, run inside torch's
    ``finalize_overlap_scheduling``, not a plan we apply. ``collective_bucketing``: torch merges
    collectives (False: its schedule only); ``autofix_cycles``: torch's ``AUTOFIX_CONFIG`` set
    to this while it runs (None: torch's config as it is)."""

    collective_bucketing: bool = True
    autofix_cycles: bool | None = None

    def as_kwargs(self) -> dict:
        """The keywords of ``fxglue.pipeline.finalize_with_torch``."""
        return {"collective_bucketing": self.collective_bucketing, "autofix_cycles": self.autofix_cycles}


@dataclass(frozen=True)
class PlanRequest:
    """What a planner is given: the problem, torch's greedy plan on the same schedule (where the
    caller recorded it: CP-SAT's hint, the plan repaired), the options of ``planner.solve``
    (cpsat, which also never loses to ``count_plan`` and ``fallback_plans``) and of
    ``planner.search.repair`` (greedy-repaired), the planner's one-line ``progress`` and the search's own
    lines (``search_progress``: incumbents and bounds; None: none)."""

    problem: planner.Problem
    greedy: planner.Plan | None = None
    solve: SolveOptions | None = None  # None: planner.SolveOptions()
    repair: SolveOptions | None = None  # None: planner.search.repair.REPAIR_OPTIONS
    count_plan: planner.Plan | None = None
    fallback_plans: tuple = ()
    progress: Callable[[str], None] = lambda msg: None
    search_progress: Callable[[str], None] | None = None


@dataclass(frozen=True)
class PlannerOutput:
    """One result type for every planner. ``plan``: what the planner chose (torch's greedy: the
    plan its search records; none: None); ``solve_result``: the search's result where one ran
    (status, objective, bound, gap); ``wall_s``: seconds to make it (torch's greedy search,
    recorded before, not included)."""

    plan: planner.Plan | None
    solve_result: SolveResult | None = None
    wall_s: float = 0.0


@dataclass(frozen=True)
class Planner:
    """A registry entry. ``make`` turns a request into the plan; ``finalize``: torch buckets the
    graph itself (None: ``apply_plan`` applies ``plan``); ``needs_greedy``: ``make`` reads
    ``request.greedy``, torch's greedy plan, which the caller records first."""

    name: str
    description: str
    make: Callable[[PlanRequest], PlannerOutput]
    finalize: TorchFinalize | None = None
    needs_greedy: bool = False

    @property
    def torch_applies(self) -> bool:
        return self.finalize is not None

    def plan(self, request: PlanRequest) -> PlannerOutput:
        """``make``, timed; a missing greedy plan is refused naming this planner."""
        if self.needs_greedy and request.greedy is None:
            raise ValueError(f"planner {self.name!r} starts from torch's greedy plan; record it first")
        t0 = time.perf_counter()
        out = self.make(request)
        return replace(out, wall_s=time.perf_counter() - t0)


def _torch_greedy(request: PlanRequest) -> PlannerOutput:
    # the graph is bucketed by torch's finalize itself; this is the plan its search records
    return PlannerOutput(plan=request.greedy)


def _unbucketed(request: PlanRequest) -> PlannerOutput:
    return PlannerOutput(plan=None)


def _repaired_greedy(request: PlanRequest) -> PlannerOutput:
    from planner.search.repair import REPAIR_OPTIONS, repair

    request.progress("repairing torch's greedy plan")
    result = repair(request.problem, request.greedy, request.repair or REPAIR_OPTIONS)
    return PlannerOutput(plan=result.plan or request.greedy, solve_result=result)


def _cpsat(request: PlanRequest) -> PlannerOutput:
    # the anchored mode's search itself (``MODES['anchored']`` runs the same): this registry is
    # what the front door (``planner.search.planning``) reads, so it never calls the front door
    from planner.core.options import SolveOptions
    from planner.search.solver import solve

    request.progress("solving with CP-SAT")
    result = solve(request.problem, request.solve or SolveOptions(), hint=request.greedy,
                   count_plan=request.count_plan, fallback_plans=request.fallback_plans,
                   progress=request.search_progress)
    return PlannerOutput(plan=result.plan, solve_result=result)


def _registry(*entries: Planner) -> dict[str, Planner]:
    return {p.name: p for p in entries}


PLANNERS: dict[str, Planner] = _registry(
    Planner("greedy", "torch's own greedy, searched and applied by torch", _torch_greedy,
            TorchFinalize(autofix_cycles=False), needs_greedy=True),
    # torch's escape hatch for its own cycle error (it drops the cyclic extra dependencies it
    # added); torch's plain greedy on llama3-8b-ddp-2 needs it
    Planner("greedy-autofix", "torch's greedy with its overlap_scheduling_autofix_cycles on, applied by torch",
            _torch_greedy, TorchFinalize(autofix_cycles=True), needs_greedy=True),
    Planner("greedy-repaired", "torch's greedy plan repaired to keep every rule, applied by bucketplan",
            _repaired_greedy, needs_greedy=True),
    Planner("cpsat", "CP-SAT's plan (planner.solve), applied by bucketplan", _cpsat),
    Planner("none", "torch's schedule, nothing merged", _unbucketed, TorchFinalize(collective_bucketing=False)),
)


# -- search modes: what ``planner.plan`` runs ---------------------------------------------------


@dataclass(frozen=True)
class Mode:
    """A search mode of ``planner.plan`` (``PlanSpec.mode``): its name, a one-line description, and
    the module and functions that check a spec and make its plan (imported when used: this
    registry is read at every command's start). Adding a planner is an entry here and its module:
    ``check(spec)`` refuses what the mode cannot honour (``ArgumentError``), ``run(problem, spec,
    calls, started)`` returns a ``SolveResult`` whose plan is verified."""

    name: str
    description: str
    module: str
    run_name: str
    check_name: str | None = None

    def _function(self, name: str):
        import importlib

        return getattr(importlib.import_module(self.module), name)

    def check(self, spec) -> None:
        if self.check_name is not None:
            self._function(self.check_name)(spec)

    def run(self, problem, spec, calls, started: float):
        return self._function(self.run_name)(problem, spec, calls, started)


MODES: dict[str, Mode] = {m.name: m for m in (
    Mode("anchored", "CP-SAT's plan, each bucket started and waited where torch scheduled a member",
         "planner.search.solver", "plan_anchored", "check_anchored"),
    Mode("free", "also where each bucket starts and waits: CP-SAT's anchored plan, then the positioned "
         "search within a peak, bounded by the floor of every plan with any positions",
         "planner.search.free.planner", "plan_free", "check"),
    Mode("robust", "the least worst-case regret across cost scenarios",
         "planner.search.scenarios", "plan_robust", "check_robust"),
)}


def names() -> tuple[str, ...]:
    """Every planner name, in the registry's order."""
    return tuple(PLANNERS)


def get(name: str, *, or_else: str = "") -> Planner:
    """The entry ``name``. An unknown name is a one-line ``ValueError`` naming every entry
    (``or_else``: what else the caller accepts, e.g. "a Plan or a plan file")."""
    if name in PLANNERS:
        return PLANNERS[name]
    raise ValueError(f"unknown planner {name!r}; use one of {', '.join(PLANNERS)}{f', {or_else}' if or_else else ''}")


def select(*chosen: str) -> tuple[str, ...]:
    """A caller's choice of planners (an experiment's), each checked against the registry now."""
    return tuple(get(name).name for name in chosen)


def help_text() -> str:
    """``name: description`` of every entry, for ``--help``."""
    return "; ".join(f"{p.name}: {p.description}" for p in PLANNERS.values())
