"""The local-search engine's annealing rule (``planner.search.local_search.LocalSearch.anneal``):
a move slower by d is taken with probability exp(-d / T). The engine draws its chance before the
judge and tells the judge the slowest step worth judging; here the rate it takes slower moves at
is counted and set against exp(-d / T) worked out by hand, and the judge checks what it is told."""

from __future__ import annotations

import math
import random

import pytest

from planner.search.local_search import LocalSearch


class _Staircase:
    """States are step counts; every move is one step up, ``d`` ms slower than the state it leaves
    (a judge that, as the positioned search's, answers None for what is no faster than ``than``)."""

    def __init__(self, d: float, stats: dict):
        self.d, self.stats, self.told = d, stats, []

    def neighbours(self, state):
        return iter(())

    def random_move(self, state):
        return state + 1

    def judge(self, state, than: float):
        self.stats["evaluations"] += 1  # as every judge counts the engine's budget
        self.told.append(than)
        score = 100.0 + self.d * state
        return (state, score) if score < than - 1e-6 else None

    def escape(self, state, score: float):
        return None


@pytest.mark.parametrize("d", [0.5, 1.0, 2.0])
def test_a_move_slower_by_d_is_taken_at_exp_minus_d_over_t(d):
    # start == end: the temperature stays at 1% of the starting score, T = 1 ms
    stats = {}
    moves = _Staircase(d, stats)
    engine = LocalSearch(moves, rng=random.Random(7), deadline=math.inf, max_evaluations=20_000, stats=stats)
    best = engine.anneal(0, "plan", 100.0, start=0.01, end=0.01, escape_every=10**9)
    taken = stats.get("accepted_slower", 0) / stats["evaluations"]
    p = math.exp(-d / 1.0)
    assert taken == pytest.approx(p, abs=4 * math.sqrt(p * (1 - p) / stats["evaluations"]))
    assert best[2] == 100.0  # every move was slower: the best is where it began
    # the judge was told, for each move, the step of the state it left plus a finite reach
    assert all(math.isfinite(t) for t in moves.told) and min(moves.told) > 100.0
