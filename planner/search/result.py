"""What every search returns: one type for CP-SAT, polish, the positioned search and the capped
positioned model, so callers read a plan's objective, bound, its scope and gap in one way."""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.core.problem import Plan


@dataclass
class SolveResult:
    """A search's answer. ``objective``: the plan's score in its objective's units (ms of
    simulated step for a step search, collectives for a count search, the worst regret for a
    robust polish); ``bound``: a value no plan of ``stats['bound_scope']`` beats (None: nothing
    proved); ``gap``: (objective - bound) / objective; ``peak_bytes``: the plan's peak by
    ``planner.cost.memory`` where the search was held to a memory cap; ``stats``: how the search
    went (its keys are each search's own)."""

    plan: Plan | None
    status: str
    objective: float | None
    bound: float | None
    gap: float | None
    wall_s: float
    stats: dict = field(default_factory=dict)
    progress: list[tuple[float, float, float]] = field(default_factory=list)  # (t, incumbent, bound)
    peak_bytes: int | None = None

    @property
    def bound_scope(self) -> str | None:
        """The plans ``bound`` holds for, in words."""
        return self.stats.get("bound_scope")

    def summary(self) -> str:
        gap = f"{self.gap:.1%}" if self.gap is not None else "n/a"
        return (f"status {self.status}, objective {self.objective}, bound {self.bound}, gap {gap}, "
                f"{self.wall_s:.1f}s")


def gap_of(objective: float | None, bound: float | None) -> float | None:
    """(objective - bound) / |objective|, never below 0; None without an objective or a bound."""
    if objective is None or bound is None:
        return None
    if objective == 0:
        return 0.0
    return max(0.0, (objective - bound) / abs(objective))


def mark_interrupted(plan: Plan) -> Plan:
    """``plan`` as a search cut short by Ctrl-C keeps it: ``params.interrupted``."""
    return plan.model_copy(update={"params": {**plan.params, "interrupted": True}})
