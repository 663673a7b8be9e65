"""Every CP-SAT configuration the project runs, on an 8-layer problem, in this one process.

Run by tests/test_solver_configurations.py in a subprocess under ``python -X faulthandler``: a
native abort in OR-Tools (a C++ CHECK ends the process with SIGABRT, no Python error) then shows
as the subprocess's exit status and its stack on stderr, where an in-process test would take
pytest down with it.

Each configuration is one ``planner.solve`` (or ``planner.search.repair``) with a short time limit; the
count search's probe, which starts only after PROBE_MIN_MAIN_S of main search, is brought forward
so that the probes run within the short limit too. One line per configuration on stdout:
``ok <config> <status> <objective>``; the plan of every run is verified here as well.

    python -X faulthandler -m tests.scripts.solver_configurations [--quick]
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import planner
import planner.search.solver as solver
from planner.search.repair import repair
from planner.rules.verifier import recorded_policy, verify

DATA = Path(__file__).resolve().parent.parent / "data" / "problems"
PROBLEM = DATA / "llama3-8b-fsdp-8--ab-ib8.json.gz"
GREEDY = DATA / "llama3-8b-fsdp-8--ab-ib8-greedy-plan.json.gz"
# the configuration that aborted OR-Tools 9.15 before probes stopped hinting their models: a count
# search on a full model with two workers, its probe asked for fewer collectives than any plan has
QUICK = [("count", 2, True, "auto")]


def configurations(quick: bool) -> list[tuple[str, int, bool, str | int | None]]:
    """(objective, workers, hinted, window): both objectives, 1/2/4 workers, with and without
    torch's greedy plan as the hint, the automatic (full) model and a window of 4 (the windowed
    searches' default portfolio)."""
    if quick:
        return QUICK
    return list(itertools.product(("count", "step"), (1, 2, 4), (False, True), ("auto", 4)))


def main(argv: list[str] | None = None) -> int:
    args = argparse.ArgumentParser()
    args.add_argument("--quick", action="store_true", help="only the configuration that once aborted")
    args.add_argument("--time-limit", type=float, default=8.0)
    opts = args.parse_args(argv)
    solver.PROBE_MIN_MAIN_S = 0.5 * opts.time_limit  # probes within the short limit (see the docstring)
    problem = planner.load_problem(PROBLEM)
    greedy = planner.load_plan(GREEDY)
    for objective, workers, hinted, window in configurations(opts.quick):
        name = f"{objective}/workers={workers}/hint={hinted}/window={window}"
        print(f"start {name}", flush=True)
        options = planner.SolveOptions(time_limit_s=opts.time_limit, objective=objective, workers=workers,
                                       window=window)
        result = planner.solve(problem, options, hint=greedy if hinted else None)
        assert result.plan is not None and not verify(problem, result.plan, **recorded_policy(result.plan)), name
        probes = len(result.stats.get("probes", ()))
        print(f"ok {name} {result.status} {result.objective} probes={probes}", flush=True)
    if not opts.quick:  # the repair: a search within the buckets of a rule-breaking plan
        fixed = repair(problem, greedy, planner.SolveOptions(time_limit_s=opts.time_limit, workers=2))
        assert fixed.plan is not None and not verify(problem, fixed.plan, **recorded_policy(fixed.plan))
        print(f"ok repair {fixed.status} {fixed.objective}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
