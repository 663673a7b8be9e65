"""The best verified plan a command holds, kept at a Ctrl-C at any moment (``solve``, its
``--positions free`` and ``--robust``).

Imports only the standard library at its top, as every module of the command line.
"""

from __future__ import annotations

from bucketplan.cli.common import CLIError, inputs_of, stamped


class BestPlan:
    """The best verified plan a command holds at each moment, so that a Ctrl-C anywhere (while a
    floor is computed, a model built, the plan written) saves it, marked interrupted, instead of
    nothing. Each stage offers its plan once verified (later stages only improve on earlier ones);
    ``write`` saves the finished plan, after which a Ctrl-C has nothing left to keep."""

    def __init__(self, output: str, args) -> None:
        self.output, self.args = output, args
        self.problem = None  # set once loaded: a cut-short plan is weighed against one already there
        self.plan = None
        self.written: str | None = None
        self.finished = False  # what ``written`` names is a finished plan

    def load_problem(self, path: str):
        """The problem at ``path``, and from now on its unbucketed plan held: what solve itself
        returns when stopped before any search."""
        import planner
        from planner.core.problem import unbucketed_plan

        self.problem = planner.load_problem(path)
        self.offer(unbucketed_plan(self.problem))
        return self.problem

    def offer(self, plan) -> None:
        if plan is not None:
            self.plan = plan

    def write(self, plan) -> str:
        """Save ``plan`` (``planner.jobs.interrupted.save_plan``: a cut-short one never replaces
        a finished plan, an input or a faster cut-short one) and return the path it went to."""
        from planner.jobs.interrupted import is_interrupted, save_plan

        self.offer(plan)
        try:
            written = save_plan(stamped(plan, self.args), self.output, self.problem, inputs_of(self.args))
        except OSError as e:  # checked up front; a race (the folder changed during the search)
            raise CLIError(f"{self.output}: cannot write the plan ({e.strerror or e})") from None
        self.written, self.finished = str(written), not is_interrupted(plan)
        return self.written

    def write_interrupted(self) -> str:
        """At a Ctrl-C: the line to print, after saving the best plan held, marked interrupted,
        unless a plan was written already."""
        if self.written is not None:
            return (f"interrupted after the plan was written to {self.written}" if self.finished
                    else f"interrupted: wrote the best verified plan so far, marked interrupted, to {self.written}")
        if self.plan is None or self.problem is None:
            return "interrupted before a plan was found"
        from planner.search.result import mark_interrupted

        try:
            written = self.write(mark_interrupted(self.plan))
        except CLIError as e:  # the exit stays 130: what was lost is said
            return f"interrupted; {e}"
        return f"interrupted: wrote the best verified plan so far, marked interrupted, to {written}"

    def wrote_line(self) -> str:
        """The report's last line: where the plan went, and why when not where asked."""
        if self.written is None or self.written == str(self.output):
            return f"wrote               {self.output}"
        return (f"wrote               {self.written} (interrupted: {self.output} holds a finished plan, "
                "an input or a faster cut-short plan, and is left as it was)")
