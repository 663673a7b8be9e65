"""Which overlap a plan must keep, and how much extra memory it may hold alive: one frozen value.

The verifier, the model, the bounds and the search each take the two options as keyword
arguments (their public signatures); inside the search they travel as one ``Policy`` so a stage
cannot drop or misspell one, and a plan records them in its ``params`` (``as_params``), which
``bucketplan verify`` reads back (``planner.rules.verifier.recorded_policy``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import planner.core.arguments as arguments


@dataclass(frozen=True)
class Policy:
    """``protect_partly``: rules 4, 7 and 8 protect partly hidden collectives too, not only fully
    hidden ones. ``memory_budget_bytes``: the extra bytes moved starts and waits keep alive stay
    within it at every position (rule 10); None: no budget. ``keep_overlap`` False: rules 4, 7 and 8
    (overlap preservation) do not apply: the policy of step plans with named positions.
    ``peak_memory_bytes``: the planned schedule's peak (``planner.cost.memory``) stays within it (rule
    11); like ``keep_overlap`` it is judged by the verifier only (the CP-SAT model does not take
    it), and appears in ``as_params`` only when set."""

    protect_partly: bool = False
    memory_budget_bytes: int | None = None
    keep_overlap: bool = True
    peak_memory_bytes: int | None = None

    def __post_init__(self) -> None:
        # the one check of these four, wherever a policy is built (solve, repair, the CLI)
        arguments.flag(self.protect_partly, "protect_partly")
        arguments.memory_budget_bytes(self.memory_budget_bytes, "memory_budget_bytes")
        arguments.flag(self.keep_overlap, "keep_overlap")
        arguments.memory_budget_bytes(self.peak_memory_bytes, "peak_memory_bytes")

    def as_params(self) -> dict:
        """The keyword arguments of verify/check, and what a plan records.
        ``keep_overlap`` appears only when False: the CP-SAT model always keeps overlap (it is never
        built for positioned plans), and plans made under the default record what they did before."""
        out = asdict(self)
        if self.keep_overlap:
            del out["keep_overlap"]
        if self.peak_memory_bytes is None:
            del out["peak_memory_bytes"]
        return out
