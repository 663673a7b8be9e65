"""Local search on the simulated step: split, shift and merge buckets of a plan while the
simulator says the step gets shorter.

Why this exists: at 8 layers and more the step model's CP-SAT search spends most of its time in
presolve and returns the plan it was started from (measured: llama3-8b-fsdp-8 on 8 nodes, the
step search ended on the count plan, 8 buckets of 9-53 members, 253.0 ms). Big buckets save
latencies but issue late and hold the FIFO stream; which split pays is exactly what
``planner.simulate`` answers in milliseconds, so the search asks it directly.

Every move keeps each bucket's members and re-chooses its anchors as the repair does
(``anchored``: the earliest start and the latest wait the members allow; ``reanchored``
uses it too), is scored by ``simulate`` and, only
when it is faster, checked by the independent verifier: the result is a verified plan never
slower than the one given. First improvement, moves in a seeded random order, until a sweep finds
no improvement (a local optimum for these moves). Time left then goes to an iterated local
search: a few random moves kick the best plan (kept only if the verifier accepts it), descent
starts again, the best verified plan is kept; KICKS_WITHOUT_GAIN fruitless kicks in a row end it.
Then, while the budget lasts, the same from each of the other starts the caller gives.
Measured (llama3-8b-fsdp-8 @ h100-8nodes, from the committed step plan, 60 s): the first local
optimum, 245.6 ms, is reached in 2 s; the kicks reach 241.4 ms (7 of 74 kicks found better).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import planner.core.arguments as arguments
from planner.cost.bounds import fixed_limits
from planner.core.policy import Policy
from planner.core.problem import Bucket, Collective, Plan, Problem
from planner.cost.simulator import replay_index, step_ms
from planner.rules.verifier import verify
from planner.search.local_search import MIN_GAIN_MS, LocalSearch
from planner.search.result import SolveResult

# anchored buckets remembered by member list (a move changes one or two lists; the rest are known);
# bounded so that hours of search at 80 layers stay within memory
BUCKETS_REMEMBERED = 100_000
# kicks in a row that find nothing better end the search (without a deadline it would not end)
KICKS_WITHOUT_GAIN = 50


@dataclass(frozen=True)
class Anchoring:
    """What ``anchored`` reads of a problem, computed once by ``anchoring`` (polish anchors
    hundreds of candidates on one problem): each collective's fixed limits and hiders' positions."""

    colls: dict[str, Collective]
    limits: dict[str, tuple[int, int]]  # planner.cost.bounds.fixed_limits
    hider_pos: dict[str, list[int]]  # fully hidden collective -> positions of its hiding nodes
    end: int  # past the last position


def anchoring(problem: Problem) -> Anchoring:
    pos = {n.name: n.pos for n in problem.nodes}
    return Anchoring(colls={c.name: c for c in problem.collectives}, limits=fixed_limits(problem),
                     hider_pos={c.name: [pos[h] for h in c.hiding] for c in problem.collectives
                                if c.status == "hidden"},
                     end=problem.n_scheduled + 1)


def anchored(problem: Problem, plan: Plan, where: Anchoring | None = None) -> Plan:
    """Every bucket of ``plan`` with its anchors moved to the earliest start and latest wait its
    members allow (``anchored_bucket``); a bucket with no such anchors is dropped. Not verified:
    ``reanchored`` and ``polish`` check. ``where``: ``anchoring(problem)`` when the caller has it."""
    where = where or anchoring(problem)
    buckets = (anchored_bucket(b.members, where) for b in plan.buckets)
    return plan.model_copy(update={"buckets": tuple(b for b in buckets if b is not None)})


def anchored_bucket(members: tuple[str, ...], where: Anchoring) -> Bucket | None:
    """``members`` as a bucket anchored at the earliest start and latest wait they allow (after
    every fixed predecessor of a member's start, before a fully hidden member's hiding nodes;
    after those, before every fixed consumer of a wait), or None if there are no such anchors."""
    colls, limits = where.colls, where.limits
    ms = [colls[m] for m in members]
    hiders = [p for m in ms for p in where.hider_pos.get(m.name, ())]
    lo, hi_s = max(limits[m.name][0] for m in ms), min(hiders, default=where.end)
    lo_w, hi_w = max(hiders, default=-1), min(limits[m.name][1] for m in ms)
    starts = [m for m in sorted(ms, key=lambda m: m.start_pos) if lo < m.start_pos < hi_s]
    waits = [m for m in sorted(ms, key=lambda m: -m.wait_pos) if lo_w < m.wait_pos < hi_w]
    if starts and waits and starts[0].start_pos < waits[0].wait_pos:
        return Bucket(members=members, start=starts[0].name, wait=waits[0].name)
    return None


def _groups(problem: Problem, plan: Plan) -> list[list[str]]:
    """Every collective in exactly one member list (singletons included), each list sorted by
    start position; lists ordered by their first start."""
    pos = {c.name: c.start_pos for c in problem.collectives}
    placed = {m for b in plan.buckets for m in b.members}
    groups = [sorted(b.members, key=pos.__getitem__) for b in plan.buckets]
    groups += [[c.name] for c in problem.collectives if c.name not in placed]
    return sorted(groups, key=lambda g: pos[g[0]])


def _moves(groups: list[list[str]], key_of: dict[str, tuple]) -> list[tuple]:
    """Candidate moves: split a list in two at a start-order boundary; shift the boundary member
    between a list and the next list of the same key; merge a list with the next of its key."""
    moves: list[tuple] = []
    next_same: dict[int, int] = {}
    last_of_key: dict[tuple, int] = {}
    for i, g in enumerate(groups):
        k = key_of[g[0]]
        if k in last_of_key:
            next_same[last_of_key[k]] = i
        last_of_key[k] = i
    for i, g in enumerate(groups):
        moves += [("split", i, cut) for cut in range(1, len(g))]
        j = next_same.get(i)
        if j is not None:
            moves.append(("merge", i, j))
            if len(g) > 1:
                moves.append(("give_last", i, j))
            if len(groups[j]) > 1:
                moves.append(("take_first", i, j))
    return moves


def _apply(groups: list[list[str]], move: tuple, pos: dict[str, int]) -> list[list[str]]:
    kind, i, arg = move
    out = [list(g) for g in groups]
    if kind == "split":
        out[i:i + 1] = [out[i][:arg], out[i][arg:]]
    elif kind == "merge":
        out[i] = sorted(out[i] + out[arg], key=pos.__getitem__)
        del out[arg]
    elif kind == "give_last":
        out[arg] = sorted([out[i].pop()] + out[arg], key=pos.__getitem__)
    elif kind == "take_first":
        out[i] = sorted(out[i] + [out[arg].pop(0)], key=pos.__getitem__)
    return sorted((g for g in out if g), key=lambda g: pos[g[0]])


def reanchored(problem: Problem, plan: Plan) -> Plan:
    """A fast repair: keep every bucket's members, re-anchor them (``anchored``), and break up
    buckets the verifier still rejects. Never fewer buckets than ``plan``."""
    candidate = anchored(problem, plan)
    for _ in range(len(candidate.buckets) + 1):
        bad = {v.bucket for v in verify(problem, candidate) if v.bucket is not None}
        if not bad:
            break
        candidate = candidate.model_copy(update={"buckets": tuple(
            b for k, b in enumerate(candidate.buckets) if k not in bad)})
    return candidate


def polish(problem: Problem, starts: Sequence[Plan], *, deadline: float, max_evaluations: int | None = None,
           seed: int = 0, policy: Policy = Policy(), progress: Callable[[str], None] | None = None,
           objective: Callable[[Plan], float] | None = None) -> SolveResult:
    """The best plan found by single moves from the first of ``starts`` before ``deadline`` (a
    ``time.perf_counter`` value) or ``max_evaluations`` simulations (the reproducible limit), then
    from each other start in turn while the budget lasts. Every start must be feasible; the result
    is never slower than the first and carries its record (planner, params). ``objective``: what
    is minimized instead of the simulated step (``planner.search.scenarios``: the worst-case
    regret); the result's ``objective`` is then that objective's value, else the step (ms). Local
    search proves nothing: the status is FEASIBLE and there is no bound."""
    _validate(problem, starts, deadline, max_evaluations, seed, policy, progress, objective)
    t0 = time.perf_counter()
    plan, *restarts = starts
    stats = {"evaluations": 0, "accepted": 0, "rejected_by_verifier": 0, "local_optimum": False}
    moves = _MembershipMoves(problem, plan, policy, objective, stats, random.Random(seed))
    start_ms = moves.score(plan)
    stats["start_ms"] = round(start_ms, 6)
    search = LocalSearch(moves, rng=moves.rng, deadline=deadline, max_evaluations=max_evaluations,
                         stats=stats, name="polish", progress=progress)
    best_plan, best_ms = _iterate(search, moves, plan, start_ms)
    # Time left when the kicks stop finding anything: the same search from each other start.
    # Local optima differ by start (llama3-8b-fsdp-8 @ h100-8nodes: 249.0 ms from the unbucketed
    # schedule, 245.6 from the fewest-collectives plan), and the kicks end in seconds at 8 layers.
    for other in restarts:
        if search.out_of_budget():
            break
        stats["restarts"] = stats.get("restarts", 0) + 1
        found, found_ms = _iterate(search, moves, other, moves.score(other))
        if found_ms < best_ms - MIN_GAIN_MS:
            best_plan, best_ms = found, found_ms
            stats["restart_gains"] = stats.get("restart_gains", 0) + 1
            stats["best_from"] = other.planner  # not the plan given: say which start it came from
    stats["end_ms"] = round(best_ms, 6)
    return SolveResult(plan=plan.model_copy(update={"buckets": best_plan.buckets}), status="FEASIBLE",
                       objective=best_ms, bound=None, gap=None, wall_s=time.perf_counter() - t0, stats=stats)


def _validate(problem, starts, deadline, max_evaluations, seed, policy, progress, objective) -> None:
    """``polish``'s arguments, before any search: one ``ArgumentError`` naming the argument,
    ``PlanMismatchError`` for a start of another problem."""
    arguments.problem_and_plan(problem, None, optional=True)
    arguments.plans_of(problem, starts, "starts")
    if not starts:
        raise arguments.ArgumentError("starts", "starts must hold at least one plan (polish: no plan to start from)")
    arguments.deadline(deadline, "deadline")
    if max_evaluations is not None:  # 0: the start itself (a deterministic solve's share may round to none)
        arguments.non_negative_integer(max_evaluations, "max_evaluations")
    arguments.seed(seed, "seed")
    if not isinstance(policy, Policy):
        raise arguments.ArgumentError("policy", f"policy must be a planner.Policy, not {type(policy).__name__}")
    arguments.callback(progress, "progress")
    arguments.callback(objective, "objective")


def _iterate(search: LocalSearch, moves: "_MembershipMoves", start: Plan, start_ms: float) -> tuple[Plan, float]:
    """The engine's iterated local search from ``start`` (``KICKS_WITHOUT_GAIN`` fruitless kicks
    end it). Why kicks: at 32 layers one descent ends in under a minute (measured on
    llama3-8b-fsdp-32 @ h100-8nodes, 54 s) while a step search gives polish more."""
    _, plan, ms = search.search(_groups(moves.problem, start), start, start_ms, kicks=KICKS_WITHOUT_GAIN)
    return plan, ms


class _MembershipMoves:
    """Polish's move set for ``planner.search.local_search``: a state is every collective's member
    list (``_groups``); moves split, merge and shift the boundary member between same-key lists;
    a state's plan anchors each list (``anchored_bucket``); the judge scores first and verifies
    only a faster plan (the verifier is the costly part)."""

    def __init__(self, problem: Problem, plan: Plan, policy: Policy, objective: Callable[[Plan], float] | None,
                 stats: dict, rng: random.Random):
        self.problem, self.plan, self.policy = problem, plan, policy
        self.stats, self.rng = stats, rng  # the engine's too
        self.pos = {c.name: c.start_pos for c in problem.collectives}
        self.key_of = {c.name: (c.kind, c.pg, c.key) for c in problem.collectives}
        self.where, self.index = anchoring(problem), replay_index(problem)  # of the problem alone: once
        self.score = objective or (lambda candidate: step_ms(problem, candidate, self.index))
        self.bucket_of: dict[tuple[str, ...], Bucket | None] = {}  # a move changes one or two lists

    def as_plan(self, gs: list[list[str]]) -> Plan | None:
        buckets = []
        for g in gs:
            if len(g) > 1:
                members = tuple(g)
                if members not in self.bucket_of:
                    if len(self.bucket_of) >= BUCKETS_REMEMBERED:
                        self.bucket_of.clear()
                    self.bucket_of[members] = anchored_bucket(members, self.where)
                if self.bucket_of[members] is None:  # no anchors for these members: not the move asked for
                    return None
                buckets.append(self.bucket_of[members])
        return self.plan.model_copy(update={"buckets": tuple(buckets)})

    def _one_key(self, gs: list[list[str]]) -> bool:
        return all(len({self.key_of[m] for m in g}) == 1 for g in gs)  # never mixes keys (rule 2)

    def neighbours(self, gs: list[list[str]]):
        moves = _moves(gs, self.key_of)
        self.rng.shuffle(moves)
        for move in moves:
            trial = _apply(gs, move, self.pos)
            yield move[0], trial if self._one_key(trial) else None

    def random_move(self, gs: list[list[str]]) -> list[list[str]] | None:
        moves = _moves(gs, self.key_of)
        if not moves:
            return None
        trial = _apply(gs, self.rng.choice(moves), self.pos)
        return trial if self._one_key(trial) else None

    def judge(self, gs: list[list[str]], than: float) -> tuple[Plan, float] | None:
        candidate = self.as_plan(gs)
        if candidate is None:
            return None
        self.stats["evaluations"] += 1
        ms = self.score(candidate)
        if ms >= than - MIN_GAIN_MS:  # no better: not worth the verifier
            return None
        if verify(self.problem, candidate, **self.policy.as_params()):
            self.stats["rejected_by_verifier"] += 1
            return None
        return candidate, ms

    def escape(self, gs, score: float):
        return None
