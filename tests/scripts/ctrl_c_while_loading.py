"""A Ctrl-C while CP-SAT loads a complete hint (tests/test_solver.py): prints ``kept OBJECTIVE``
when the step solve kept a verified plan, and fails an assertion otherwise.

Its precondition is made certain, not hoped for on a busy machine: the step search starts from a
complete hint, which CP-SAT 9.15 reports as its first solution while it loads the model. The
unbucketed plan is given as the fewest-collectives plan, so no count search runs first; the hint's
twin solve gets all the time it needs (``hint_every_variable``, asserted); limits are
deterministic time, so load cuts nothing; and the loading is held until the main thread has
handled the Ctrl-C.

    python -m tests.scripts.ctrl_c_while_loading PROBLEM.json.gz
"""

import _thread
import signal
import sys
import time

signal.signal(signal.SIGINT, signal.default_int_handler)

import planner  # noqa: E402
import planner.search.solver as solver_module  # noqa: E402


def main(problem_path: str) -> None:
    problem = planner.load_problem(problem_path)
    real_hint = solver_module.hint_every_variable
    solver_module.hint_every_variable = lambda handle, twin, plan, time_limit_s: real_hint(handle, twin, plan,
                                                                                          time_limit_s=600)
    unbucketed = planner.Plan(problem_fingerprint=problem.fingerprint, planner="unbucketed", created="t", buckets=())
    real = solver_module.SearchProgress.on_solution_callback
    fired = []

    def first_step_solution(self):
        real(self)
        if not fired:
            fired.append(self.objective_value)  # the complete hint, reported while CP-SAT loads its workers
            _thread.interrupt_main()
            held = time.monotonic() + 120  # bounded: a stop that is never deferred fails below
            while not self.stop_deferred and time.monotonic() < held:
                time.sleep(0.01)

    solver_module.SearchProgress.on_solution_callback = first_step_solution
    result = solver_module.solve(problem, planner.SolveOptions(time_limit_s=60, objective="step", workers=2, deterministic=True), count_plan=unbucketed)
    assert result.stats["hint_every_variable"], result.stats
    assert fired and fired[0] > 1e6, fired  # a step in ns: the step search's first solution
    assert result.stats["interrupted"] and result.stats["stop_deferred"], result.stats
    assert result.plan is not None and not planner.verify(problem, result.plan)
    print("kept", result.objective)


if __name__ == "__main__":
    main(sys.argv[1])
