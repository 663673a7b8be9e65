"""Valid lower bounds on the objective that need no solver, for problems too large to prove.

Why this exists: when the full CP-SAT model is too large to build and solve in the time given,
``solve`` searches a restricted space (a candidate window) whose optimum is not a bound for the
problem. The bound reported then comes from here: every plan that passes the rules needs at
least this many buckets. It is weak but true.

Per bucket key (buckets never mix keys):
- a collective whose start or wait hides a fully hidden collective is alone (rule 4);
- the others need at least ceil(total bytes / cap) buckets (rule 3);
- collectives whose possible start positions are pairwise disjoint open intervals cannot share
  a start, so they need distinct buckets; the same for wait positions (rules 7 and 9 fix the
  intervals: after the last fixed predecessor of the start, before the first hiding node of a
  fully hidden collective; after its last hiding node, before the first fixed consumer of the
  wait). The largest such set is found exactly by interval scheduling.
"""

from __future__ import annotations

import math

from planner.problem import Problem


def _max_disjoint(intervals: list[tuple[int, int]]) -> int:
    """Largest set of pairwise disjoint open intervals (a, b) (greedy by right end is optimal)."""
    count, last_end = 0, None
    for a, b in sorted(intervals, key=lambda iv: iv[1]):
        if last_end is None or a >= last_end - 1:  # open intervals on integers: (a,b) holds a+1..b-1
            if b - a >= 2:
                count += 1
                last_end = b
    return count


def fixed_limits(problem: Problem) -> dict[str, tuple[int, int]]:
    """Per collective (start name): (position of the last fixed predecessor of its start, position
    of the first fixed consumer of its wait). Whatever a plan does, its final start lies after the
    first and its final wait before the second (rule 9): fixed nodes never move."""
    index = {n.name: i for i, n in enumerate(problem.nodes)}
    pos = [n.pos for n in problem.nodes]
    succ: dict[int, list[int]] = {}
    for i, n in enumerate(problem.nodes):
        for d in n.deps:
            succ.setdefault(d, []).append(i)
    out = {}
    for c in problem.collectives:
        s_lo = max((pos[d] for d in problem.nodes[index[c.name]].deps
                    if problem.nodes[d].kind not in ("start", "wait")), default=-1)
        w_hi = min((pos[t] for t in succ.get(index[c.wait], []) if problem.nodes[t].kind != "start"),
                   default=problem.n_scheduled + 1)
        out[c.name] = (s_lo, w_hi)
    return out


def lower_bound(problem: Problem, objective: str = "count", protect_partly: bool = False) -> float:
    """A lower bound on ``objective`` valid for every feasible plan.

    For ``time`` (exposure x (n+1) + count, see planner.cpsat.TimeTerms) only the count part is
    bounded: exposure can be zero as far as this bound knows.
    """
    index = {n.name: i for i, n in enumerate(problem.nodes)}
    pos = [n.pos for n in problem.nodes]
    limits = fixed_limits(problem)
    protected = {h for c in problem.collectives if c.status == "hidden" for h in c.hiding}
    groups: dict[tuple, list] = {}
    for c in problem.collectives:
        groups.setdefault((c.kind, c.pg, c.key), []).append(c)
    total = 0.0
    for (kind, pg, key), cs in groups.items():
        alone = [c for c in cs if c.name in protected or c.wait in protected]
        rest = [c for c in cs if not (c.name in protected or c.wait in protected)]
        need = len(alone)
        if rest:
            by_cap = math.ceil(sum(c.size_bytes for c in rest) / problem.bucket_cap_bytes)
            starts, waits = [], []
            for c in rest:
                s_lo, w_hi = limits[c.name]
                guarded = c.status == "hidden" or (protect_partly and c.status == "partly")
                hp = sorted(pos[index[h]] for h in c.hiding) if guarded else []
                s_hi = hp[0] if hp else w_hi
                w_lo = hp[-1] if hp else s_lo
                starts.append((s_lo, s_hi))
                waits.append((w_lo, w_hi))
            need += max(by_cap, _max_disjoint(starts), _max_disjoint(waits), 1)
        total += need
    return float(total)
