"""The one local-search engine: descent by first improvement, kicks at a local optimum, and
simulated annealing, over any move set; the best judged plan is kept.

Why one: polish (membership moves on anchored plans) and the positioned search (positions and
membership under a peak) each had their own descent, kick loop, budget check and gain threshold,
and drifted apart. Here the loops are written once; a search is a ``MoveSet`` (its states, its
moves, and its judge: whether a state is a legal plan, and its score) plus the engine's settings.

A ``MoveSet`` gives:
- ``neighbours(state)``: the candidate states a descent tries from ``state``, in order, each as
  ``(label, state or None)`` (None: a move that does not apply, counted as tried); the descent is
  at a local optimum when they are exhausted with no gain;
- ``random_move(state)``: one random move's state, or None (kicks and annealing);
- ``judge(state, than)``: ``(plan, score)`` when ``state`` is a legal plan, else None; a judge may
  also return None for a legal state no better than ``than`` (polish verifies only faster plans);
- ``escape(state, score)``: a larger move tried at a local optimum before a kick (the positioned
  search's re-splits): ``(state, plan, score)`` better than ``score``, or None.
The judge counts ``engine.stats['evaluations']``: the budget the engine checks.
"""

from __future__ import annotations

import math
import random
import time
from typing import Callable, Protocol

# an improvement smaller than this is float noise, not a faster step
MIN_GAIN_MS = 1e-6
# random moves per kick (enough to leave a local optimum's basin, few enough that the descent after
# it starts from a plan near the best one)
KICK_MOVES = 3


class MoveSet(Protocol):
    def neighbours(self, state): ...

    def random_move(self, state): ...

    def judge(self, state, than: float): ...

    def escape(self, state, score: float): ...


class LocalSearch:
    """One search's engine: the move set, the random stream, the budget (a ``deadline`` as a
    ``time.perf_counter`` value, ``max_evaluations`` the reproducible limit), ``stats`` and the
    best score met so far (``progress`` says what beats it, as ``"<name>: <move> -> <ms> ms"``)."""

    def __init__(self, moves: MoveSet, *, rng: random.Random, deadline: float, max_evaluations: int | None,
                 stats: dict, name: str = "local search", progress: Callable[[str], None] | None = None):
        self.moves, self.rng, self.stats = moves, rng, stats
        self.deadline, self.max_evaluations = deadline, max_evaluations
        self.name, self.progress = name, progress
        self.best_score = math.inf
        for key in ("evaluations", "accepted", "kicks"):
            stats.setdefault(key, 0)

    def out_of_budget(self) -> bool:
        return time.perf_counter() >= self.deadline or (
            self.max_evaluations is not None and self.stats["evaluations"] >= self.max_evaluations)

    def _met(self, label: str, score: float) -> None:
        if score < self.best_score - MIN_GAIN_MS:
            if self.progress is not None and math.isfinite(self.best_score):
                self.progress(f"{self.name}: {label} -> {score:.3f} ms")
            self.best_score = score

    def descend(self, state, plan, score) -> tuple:
        """First improvement from a judged ``(state, plan, score)``: the first of its
        ``neighbours`` that is judged better is taken, and so on, until none is (a local optimum,
        ``stats['local_optimum']``) or the budget ends."""
        while not self.out_of_budget():
            for label, trial in self.moves.neighbours(state):
                if self.out_of_budget():
                    return state, plan, score
                judged = self.moves.judge(trial, score) if trial is not None else None
                if judged is not None and judged[1] < score - MIN_GAIN_MS:
                    state, (plan, score) = trial, judged
                    self.stats["accepted"] += 1
                    self._met(label, score)
                    break
            else:
                self.stats["local_optimum"] = True
                return state, plan, score
        return state, plan, score

    def kick(self, state):
        """``KICK_MOVES`` random moves from ``state`` (a move that does not apply is skipped)."""
        for _ in range(KICK_MOVES):
            trial = self.moves.random_move(state)
            state = trial if trial is not None else state
        return state

    def search(self, state, plan, score, *, kicks: int) -> tuple:
        """Iterated local search from a judged ``(state, plan, score)``: descent; at its local
        optimum the move set's ``escape`` from the best, else a kick of the best (taken when
        legal) and descent again; ``kicks`` fruitless kicks in a row, or the budget, end it
        (``kicks`` 0: the first local optimum no escape improves). The best ``(state, plan,
        score)`` met."""
        self._met("start", score)
        best = current = (state, plan, score)
        fruitless = 0
        while not self.out_of_budget():
            current = self.descend(*current)
            if current[2] < best[2] - MIN_GAIN_MS:
                best, fruitless = current, 0
            if self.out_of_budget():
                break
            escaped = self.moves.escape(best[0], best[2])
            if escaped is not None:
                best = current = escaped
                self._met("escape", best[2])
                fruitless = 0
                continue
            if fruitless >= kicks:
                break
            fruitless += 1
            self.stats["kicks"] += 1
            kicked = self.kick(best[0])
            judged = self.moves.judge(kicked, math.inf)
            current = (kicked, *judged) if judged is not None else best
        return best

    def budget_used(self, since_evaluations: int, since_s: float) -> float | None:
        """The share of the budget used since ``since_evaluations`` evaluations and ``since_s``:
        evaluations against ``max_evaluations`` when set, else the clock against the deadline;
        None with neither."""
        if self.max_evaluations is not None:
            left = self.max_evaluations - since_evaluations
            return (self.stats["evaluations"] - since_evaluations) / left if left > 0 else 1.0
        if math.isfinite(self.deadline):
            left = self.deadline - since_s
            return (time.perf_counter() - since_s) / left if left > 0 else 1.0
        return None

    def evaluations_left(self, since_evaluations: int, since_s: float) -> float:
        """The evaluations the budget has left: counted under ``max_evaluations``, else the time
        left at the rate since ``since_evaluations`` and ``since_s``; inf with neither limit."""
        if self.max_evaluations is not None:
            return self.max_evaluations - self.stats["evaluations"]
        if not math.isfinite(self.deadline):
            return math.inf
        spent = time.perf_counter() - since_s
        rate = (self.stats["evaluations"] - since_evaluations) / spent if spent > 0 else 0.0
        return rate * max(self.deadline - time.perf_counter(), 0.0)

    def anneal(self, state, plan, score, *, start: float, end: float, escape_every: int) -> tuple:
        """Random moves until the budget ends, each taken when legal and better, or worse by d
        with probability exp(-d / T), T falling geometrically from ``start`` to ``end`` times the
        starting score over the budget (``budget_used``); every ``escape_every`` evaluations the
        move set's ``escape`` from the current state when better. The best ``(state, plan,
        score)`` met."""
        best = current = (state, plan, score)
        hot, cold = max(start * score, 1e-9), max(end * score, 1e-9)  # a score of 0: no division by 0
        since_evaluations, since_s = self.stats["evaluations"], time.perf_counter()
        next_escape = since_evaluations + escape_every
        while not self.out_of_budget():
            if self.stats["evaluations"] >= next_escape:
                next_escape = self.stats["evaluations"] + escape_every
                escaped = self.moves.escape(current[0], current[2])
                if escaped is not None:
                    current = escaped
                    if current[2] < best[2] - MIN_GAIN_MS:
                        best = current
                continue
            temperature = hot * (cold / hot) ** min(self.budget_used(since_evaluations, since_s), 1.0)
            trial = self.moves.random_move(current[0])
            if trial is None:
                continue
            # Taken when slower by less than ``reach``: with u uniform, P(d < -T ln u) = exp(-d / T),
            # the docstring's rule. Drawn before the judge, so it is told the slowest step worth
            # judging in full (the rest are most of the moves, and their rules are never checked).
            u = self.rng.random()
            reach = -temperature * math.log(u) if u > 0.0 else math.inf
            judged = self.moves.judge(trial, current[2] + reach + MIN_GAIN_MS)
            if judged is None:
                continue
            worse = judged[1] - current[2]
            if worse < -MIN_GAIN_MS:
                self.stats["accepted"] += 1
            elif worse < reach:
                self.stats["accepted_slower"] = self.stats.get("accepted_slower", 0) + 1
            else:
                continue
            current = (trial, *judged)
            if current[2] < best[2] - MIN_GAIN_MS:
                best = current
                self._met("annealing", best[2])
        return best
