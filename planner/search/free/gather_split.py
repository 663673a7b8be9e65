"""The best split of a chain of gathers issued together, by a shortest path over their consumers.

Why this exists: on a stream-bound forward (llama3-8b-fsdp-8 @ h100-8nodes within torch manual's
peak) the positioned search issues every forward gather at the top of the step and levels off
with the last layers' gathers alone or in small buckets (117 MB, 34 MB, 487 MB, the 1,051 MB
output weight), each move changing one bucket. Gathers issued together are a pipeline: the
stream carries their buckets one after another, every consumer of a bucket waits for all of it,
and the compute between consumers overlaps the next bucket. Big buckets are cheaper per byte
but make the first consumers wait; the best split weighs both, and one move cannot find it.

The model (the simulator's, for such a chain alone): the members in the order they are due
(their first fixed consumer, ``fixed_limits``), buckets of consecutive members within the cap;
a bucket takes its link's time for its wire bytes, then its copy-out runs on the compute stream
before its first consumer, and the compute stream needs the fixed compute between that consumer
and the chain's last one. ``best_split`` minimizes the time from the first bucket's start to the
last consumer, ``V(i) = min_j f(i..j) + max(copy(i..j) + compute(due_i .. last), V(j))``, exactly
over every split into consecutive buckets (O(members x members per bucket)). What the chain does
not see (other buckets on the stream, memory) the caller's judge (``planner.simulate``, the
peak, the verifier) does.
"""

from __future__ import annotations

import bisect
import math

from planner.core.problem import Problem, copy_bytes
from planner.cost.simulator import ReplayIndex, replay_index


class ChainCosts:
    """What ``best_split`` reads from a problem, computed once: each collective's due position,
    and the compute the stream runs before each place (the simulator's ``ReplayIndex``)."""

    def __init__(self, problem: Problem, replay: ReplayIndex | None = None):
        from planner.cost.bounds import fixed_limits

        self.problem = problem
        self.due = {name: w for name, (_, w) in fixed_limits(problem).items()}
        self.colls = {c.name: c for c in problem.collectives}
        before = (replay or replay_index(problem)).compute_before
        self.positions = [n.pos for n in problem.nodes]
        # the fixed compute of the nodes before each one (the unpinned compute just before it not yet
        # run), and of all of them
        self.fixed = [before[n.pos] - n.unpinned_ms for n in problem.nodes] + [before[problem.n_scheduled]]
        # per node index: the compute the stream has run when a bucket issued there is issued (the
        # nodes before it and the unpinned compute scheduled just before it): places with the same
        # are the same place in time
        self.ahead = [round(before[n.pos], 9) for n in problem.nodes]

    def compute_between(self, a: int, b: int) -> float:
        """The fixed compute of the nodes at positions in [a, b)."""
        return self.fixed[bisect.bisect_left(self.positions, b)] - self.fixed[bisect.bisect_left(self.positions, a)]


def best_split(costs: ChainCosts, members: list[str]) -> list[list[str]]:
    """``members`` (collectives of one bucket key, issued together) split into consecutive buckets
    in the order they are due, the split that reaches the last consumer soonest (module docstring)."""
    problem = costs.problem
    cs = sorted((costs.colls[m] for m in members), key=lambda c: (costs.due[c.name], c.start_pos))
    n = len(cs)
    if n < 2:
        return [[c.name for c in cs]]
    link = problem.link(cs[0].pg)
    group = link.group_size
    last = costs.due[cs[-1].name]
    value = [math.inf] * n + [0.0]
    cut = [n] * (n + 1)
    for i in range(n - 1, -1, -1):
        wires: list[int] = []
        size = wire = 0
        after = costs.compute_between(costs.due[cs[i].name], last)
        for j in range(i + 1, n + 1):
            c = cs[j - 1]
            wires.append(c.wire_bytes)
            wire += c.wire_bytes
            size += c.size_bytes
            if j - i > 1 and size > problem.bucket_cap_bytes:
                break
            copy_ms = 0.0
            if problem.bucketing is not None:
                copy_ms = problem.bucketing.copy_ms(copy_bytes(c.kind, wires, group, problem.bucket_mode)[1])
            v = link.time_ms(c.kind, wire) + max(copy_ms + after, value[j])
            if v < value[i]:
                value[i], cut[i] = v, j
    out, i = [], 0
    while i < n:
        out.append([c.name for c in cs[i:cut[i]]])
        i = cut[i]
    return out
