"""A Ctrl-C (simulated from another thread, as a real one may come) at the first incumbent of a
search, in a process that handles SIGINT whatever its parent passed on; prints what the solve
returned as one JSON line (tests/test_solver.py).

    python -m tests.scripts.ctrl_c_at_first_solution PROBLEM.json.gz count|step
"""

import _thread
import json
import signal
import sys
import threading

signal.signal(signal.SIGINT, signal.default_int_handler)

import planner  # noqa: E402
import planner.search.solver as solver_module  # noqa: E402


def main(problem_path: str, objective: str) -> None:
    problem = planner.load_problem(problem_path)
    real = solver_module.SearchProgress.on_solution_callback
    fired = []

    def interrupt_at_first_solution(self):
        real(self)
        if not fired:
            fired.append(self.objective_value)
            threading.Timer(0.0, _thread.interrupt_main).start()

    solver_module.SearchProgress.on_solution_callback = interrupt_at_first_solution
    result = solver_module.solve(problem, planner.SolveOptions(time_limit_s=120, objective=objective, workers=2))
    verified = result.plan is not None and not planner.verify(problem, result.plan)
    print(json.dumps({"fired": fired, "interrupted": result.stats["interrupted"], "verified": verified,
                      "probes": "probes" in result.stats, "objective": result.objective, "bound": result.bound,
                      "bound_scope": result.stats.get("bound_scope"),
                      "simulated": planner.simulate(problem, result.plan).step_ms if result.plan else None}))


if __name__ == "__main__":
    main(*sys.argv[1:3])
