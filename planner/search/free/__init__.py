"""Free positions: plans that also choose where each bucket starts and waits, within a peak.

``planner.py`` is the free mode of ``planner.plan`` (CP-SAT's anchored start, then the search,
the floor as its bound, optionally the capped model over the search plan's candidate space);
``position_search.py`` the local search over membership and positions; ``gather_split.py`` the best
split of a chain of gathers issued together (one of its moves); ``model.py`` the CP-SAT step model
with positions and the memory cap; ``cuts.py`` inequalities every plan of that model meets;
``capped.py`` that model solved from the best plans given, within a cap.
"""
