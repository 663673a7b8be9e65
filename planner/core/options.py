"""The settings of the library's searches: one frozen, validated value per entry point.

Why this exists: a search's settings pass through several levels; as a dozen keywords each level
would check them again. Here each is checked once, when its options object is built (one
``planner.core.arguments.ArgumentError`` naming the field), and then passed down whole;
``dataclasses.replace`` makes a checked variant. The command line builds the same objects from
its flags (``bucketplan/cli/solve.py`` lists which flag sets which field).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import planner.core.arguments as arguments
from planner.core.arguments import ArgumentError
from planner.core.policy import Policy

OBJECTIVES = ("count", "exposure", "step")


@dataclass(frozen=True)
class SolveOptions:
    """How ``planner.solve`` (and ``repair``, ``robust_plan``) search: ``time_limit_s`` of wall
    clock (with ``deterministic``, CP-SAT's deterministic time; the wall clock is then a guard
    only), the ``objective`` minimized, CP-SAT's ``workers`` and ``seed``, the candidate
    ``window`` ("auto", None for the full model, or N same-key neighbours), ``probe`` (a count
    search on a full model probes its bound with the time left) and the rules a plan keeps
    (``policy``: ``protect_partly`` and ``memory_budget_bytes``; the CP-SAT model always keeps
    torch's overlap and has no peak budget, which are ``position_search``'s)."""

    time_limit_s: float = 60.0
    objective: str = "count"
    workers: int = 2
    seed: int = 0
    window: int | str | None = "auto"
    deterministic: bool = False
    probe: bool = True
    policy: Policy = field(default_factory=Policy)
    # the fields of a policy the CP-SAT model takes (keep_overlap and peak_memory_bytes are
    # position_search's)
    POLICY_FIELDS = ("protect_partly", "memory_budget_bytes")

    def __post_init__(self) -> None:
        arguments.positive_number(self.time_limit_s, "time_limit_s")
        if self.objective not in OBJECTIVES:
            raise ArgumentError("objective", f"unknown objective {self.objective!r}; use one of {OBJECTIVES}")
        arguments.worker_count(self.workers, "workers")
        arguments.seed(self.seed, "seed")
        arguments.window(self.window, "window")
        arguments.flag(self.deterministic, "deterministic")
        arguments.flag(self.probe, "probe")
        if not isinstance(self.policy, Policy):
            raise ArgumentError("policy", f"policy must be a planner.core.policy.Policy, not {type(self.policy).__name__}")
        if self.policy != Policy(**{f: getattr(self.policy, f) for f in self.POLICY_FIELDS}):
            raise ArgumentError("policy", "the CP-SAT search keeps torch's overlap and has no peak budget: "
                                          "keep_overlap=False and peak_memory_bytes are position_search's")


@dataclass(frozen=True)
class PositionSearchOptions:
    """How ``planner.search.free.position_search`` searches, its memory budget and clock apart: ``seed`` of its
    random moves, ``max_evaluations`` (the reproducible limit; None: the deadline alone),
    ``per_block`` (start from the per-block plan too) and ``keep_overlap`` (every candidate keeps
    torch's overlap, rules 4, 7 and 8)."""

    seed: int = 0
    max_evaluations: int | None = None
    per_block: bool = True
    keep_overlap: bool = False

    def __post_init__(self) -> None:
        arguments.seed(self.seed, "seed")
        if self.max_evaluations is not None:
            arguments.positive_number(self.max_evaluations, "max_evaluations")
        arguments.flag(self.per_block, "per_block")
        arguments.flag(self.keep_overlap, "keep_overlap")
