"""Searches for plans: the CP-SAT models, the solver's stages, local search, repair, the planners.

``result`` (``SolveResult``, what every search returns), ``cpsat`` (the rule model), ``step``
(the step objective on it), ``solver`` (the stages of ``planner.solve``), ``repair``, ``polish``
(local search scored by the simulator), ``position_search`` (membership and named positions
within a memory budget), ``positioned`` and ``positioned_solve`` (CP-SAT with positions and the
memory cap), ``scenarios`` (re-priced problems and the robust search), ``planners`` (the
registry of planner names). Imports core, cost, rules.
"""
