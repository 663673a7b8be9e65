"""Torch-free planning of collective bucketing: problem and plan types, verifier, planners.

This package never imports torch (checked in CI): everything it needs arrives as a
``Problem`` extracted by ``fxglue``.
"""

from planner.io import SchemaError, load_plan, load_problem, save
from planner.problem import (
    SCHEMA_VERSION,
    Bucket,
    Collective,
    Link,
    Node,
    Plan,
    Problem,
    Timeline,
    collectives_after,
)

__all__ = [
    "SCHEMA_VERSION", "Bucket", "Collective", "Link", "Node", "Plan", "Problem", "SchemaError",
    "Timeline", "collectives_after", "load_plan", "load_problem", "save",
]
