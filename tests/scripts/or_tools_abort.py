"""OR-Tools' abort, reduced (docs/results.md, "An OR-Tools abort"): three Booleans whose odd cycle
cover needs two, at most one allowed -- infeasible, which the LP finds while loading --, two
workers, interleaved search, and with ``hint`` a hint. Prints the status; with the hint, OR-Tools
9.15 aborts the process instead (tests/test_solver_configurations.py).

    python -X faulthandler -m tests.scripts.or_tools_abort hint|nohint
"""

import sys

from ortools.sat.python import cp_model


def main(hinted: bool) -> None:
    m = cp_model.CpModel()
    x = [m.new_bool_var(f"x{i}") for i in range(3)]
    for i in range(3):
        m.add(x[i] + x[(i + 1) % 3] >= 1)
    m.add(sum(x) <= 1)
    if hinted:
        for v in x:
            m.add_hint(v, 1)
    s = cp_model.CpSolver()
    s.parameters.num_workers = 2
    s.parameters.interleave_search = True
    s.parameters.cp_model_presolve = False
    print(s.status_name(s.solve(m)))


if __name__ == "__main__":
    main(sys.argv[1] == "hint")
