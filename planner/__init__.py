"""Torch-free planning of collective bucketing: problem and plan types, verifier, planners.

This package never imports torch (checked in CI): everything it needs arrives as a
``Problem`` extracted by ``fxglue``.
"""

from planner.cost.bounds import lower_bound
from planner.core.io import SchemaError, atomic_write_text, load_plan, load_problem, save
from planner.core.options import PositionSearchOptions, SolveOptions
from planner.core.policy import Policy
from planner.core.problem import (
    SCHEMA_VERSION,
    Bucket,
    BucketingCost,
    Collective,
    CollectiveBuffers,
    MemoryProfile,
    Link,
    Node,
    Plan,
    Problem,
    Timeline,
    collectives_after,
)
from planner.search.planning import Budget, PlanSpec, plan
from planner.search.free.position_search import position_search
from planner.search.repair import repair
from planner.cost.simulator import Simulation, simulate, to_chrome_trace, write_chrome_trace
from planner.search.solver import PlanMismatchError, SolveResult, solve
from planner.rules.verifier import RULES, Report, Violation, check, verify

__all__ = [
    "RULES", "SCHEMA_VERSION", "Bucket", "Budget", "BucketingCost", "Collective", "CollectiveBuffers", "Link", "MemoryProfile",
    "Node", "Plan", "PlanMismatchError", "PlanSpec", "Policy", "PositionSearchOptions", "Problem", "Report",
    "SchemaError", "Simulation", "SolveOptions", "SolveResult", "Timeline", "Violation", "atomic_write_text",
    "check", "collectives_after", "load_plan", "load_problem", "lower_bound", "plan", "position_search", "repair", "save", "simulate", "solve",
    "to_chrome_trace", "verify", "write_chrome_trace",
]
