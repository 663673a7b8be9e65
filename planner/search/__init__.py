"""Searches for plans: the front door, the CP-SAT models, the solver's stages, local search, repair, the planners.

``planning`` (``planner.plan``, the one front door, and its time shares), ``planners`` (the
registries: the modes ``planner.plan`` runs, the planner names of the pipeline), ``result``
(``SolveResult``, what every search returns), ``cpsat`` (the rule model), ``step`` (the step
objective on it), ``solver`` (the stages of ``planner.solve``), ``repair``, ``local_search`` (the
one local-search engine), ``polish`` (membership moves scored by the simulator), ``free`` (free
positions: the positioned search, its CP-SAT model and cuts, the capped solve, the free mode),
``scenarios`` (re-priced problems and the robust search). Imports core, cost, rules.
"""
