"""Mutation harness: random mutants of solved plans, judged by the verifier, by ``apply_plan`` on
the real graph, and by the real graph's final order.

Why this exists: the verifier is what certifies every plan we return, and ``apply_plan`` trusts
it. A plan the verifier accepts but torch's merge cannot apply (or applies and breaks an overlap
relation) is a soundness hole; a plan it refuses that would have applied is a lost plan. Each
mutant of a feasible plan (a member moved to another bucket or out of its own, two buckets
merged, a bucket split, an anchor moved to another member, a bucket dropped, a member listed
twice) is judged three ways, on a fresh copy of the scheduled graph:

- the verifier accepts it  -> ``apply_plan`` applies it; the real graph then has exactly
  ``collectives_after`` collectives, each merged collective reads exactly its bucket's members'
  inputs, and every fully hidden member's hiding nodes lie strictly between its merged start and
  merged wait in the graph's final order (read here from the graph, not from apply's own check);
- the verifier refuses it -> ``apply_plan`` raises ``PlanError`` and leaves the graph as it was.

The default run checks ``MUTANTS_QUICK`` mutants of two cases; ``pytest -m long`` checks
``MUTANTS_PER_CASE`` mutants of each of 16 cases (4 workloads x 4 bucket modes): over 1,000.
"""

from __future__ import annotations

import copy
import operator
import random
from collections import Counter

import pytest

import planner
from planner.search.repair import repair
from planner.rules.verifier import verify

pytestmark = pytest.mark.slow  # traces workloads and applies each mutant to a fresh graph

WORKLOADS = ("llama3-8b-fsdp-2", "llama3-8b-2d-2", "llama3-8b-ddp-2", "hf-qwen3-moe-2")
MODES = ("default", "custom_ops", "custom_ops_multidtype", "coalesced")
MUTANTS_PER_CASE = 70
MUTANTS_QUICK = 25
OPERATORS = ("move", "move_out", "merge", "split", "start_anchor", "wait_anchor", "drop", "duplicate")


# ---- mutants -------------------------------------------------------------------------------------

def _bucket(members, start=None, wait=None, *, rng: random.Random):
    members = tuple(members)
    return planner.Bucket.model_construct(members=members, start=start or rng.choice(members),
                                          wait=wait or rng.choice(members))


def mutate(problem: planner.Problem, plan: planner.Plan, rng: random.Random) -> tuple[str, planner.Plan]:
    """One random edit of ``plan`` (built without the Plan type's validation, so that a member
    listed twice reaches the verifier and apply as a hand-made file would)."""
    buckets = list(plan.buckets)
    in_bucket = {m for b in buckets for m in b.members}
    loose = [c.name for c in problem.collectives if c.name not in in_bucket]
    op = rng.choice(OPERATORS)
    multi = [i for i, b in enumerate(buckets) if len(b.members) >= 2]
    if op == "move" and buckets:
        from_a_bucket = rng.random() < 0.5 or not loose
        src = rng.randrange(len(buckets)) if from_a_bucket else None
        name = rng.choice(buckets[src].members) if src is not None else rng.choice(loose)
        dst = rng.randrange(len(buckets))
        if src is not None:
            rest = [m for m in buckets[src].members if m != name]
            buckets[src] = _bucket(rest, rng=rng) if rest else None
        if dst != src:
            buckets[dst] = _bucket(buckets[dst].members + (name,), buckets[dst].start, rng=rng)
    elif op == "move_out" and multi:
        i = rng.choice(multi)
        name = rng.choice(buckets[i].members)
        buckets[i] = _bucket([m for m in buckets[i].members if m != name], rng=rng)
    elif op == "merge" and len(buckets) + len(loose) >= 2:
        pool = [("b", i) for i in range(len(buckets))] + [("c", n) for n in loose]
        (ka, a), (kb, b) = rng.sample(pool, 2)
        members = (buckets[a].members if ka == "b" else (a,)) + (buckets[b].members if kb == "b" else (b,))
        for k, v in ((ka, a), (kb, b)):
            if k == "b":
                buckets[v] = None
        buckets.append(_bucket(members, rng=rng))
    elif op == "split" and multi:
        i = rng.choice(multi)
        members = list(buckets[i].members)
        rng.shuffle(members)
        cut = rng.randrange(1, len(members))
        buckets[i] = _bucket(members[:cut], rng=rng)
        buckets.append(_bucket(members[cut:], rng=rng))
    elif op in ("start_anchor", "wait_anchor") and multi:
        i = rng.choice(multi)
        b = buckets[i]
        new = rng.choice(b.members)
        buckets[i] = _bucket(b.members, new if op == "start_anchor" else b.start,
                             new if op == "wait_anchor" else b.wait, rng=rng)
    elif op == "drop" and buckets:
        buckets[rng.randrange(len(buckets))] = None
    elif op == "duplicate" and len(buckets) >= 2:
        a, b = rng.sample(range(len(buckets)), 2)
        buckets[b] = _bucket(buckets[b].members + (rng.choice(buckets[a].members),), buckets[b].start,
                             buckets[b].wait, rng=rng)
    else:
        op = "unchanged"
    kept = tuple(b for b in buckets if b is not None)
    return op, planner.Plan.model_construct(**{**dict(plan), "buckets": kept})


# ---- the real graph's verdict, read independently of apply_plan ------------------------------------

def _graph_facts(graph, problem: planner.Problem) -> dict:
    """Per original collective (by name): the names of the nodes its start reads."""
    by_name = {n.name: n for n in graph.nodes}
    return {c.name: {a.name for a in by_name[c.name].all_input_nodes} for c in problem.collectives}


def _merged_collectives(graph, original_names: set[str]) -> list[tuple[object, list[object], set[str]]]:
    """(start node, its wait nodes, the original nodes it reads through nodes the merge made)
    for every collective of the final graph."""
    from torch._inductor.fx_passes.bucketing import _get_collective_node_from_wait

    waits: dict[object, list[object]] = {}
    for n in graph.nodes:
        start = _get_collective_node_from_wait(n)
        while start is not None and start.target is operator.getitem:  # coalesced: wait(getitem(start, i))
            start = start.args[0]
        if start is not None:
            waits.setdefault(start, []).append(n)
    out = []
    for start, ws in waits.items():
        reads, frontier, seen = set(), list(start.all_input_nodes), set()
        while frontier:  # back through the copies and views the merge put before the collective
            n = frontier.pop()
            if n in seen:
                continue
            seen.add(n)
            if n.name in original_names:
                reads.add(n.name)
            else:
                frontier.extend(n.all_input_nodes)
        out.append((start, ws, reads))
    return out


def check_applied(graph, problem: planner.Problem, plan: planner.Plan, inputs_of: dict, original_names: set) -> None:
    """The final graph holds the plan: one collective per bucket (and per loose collective); each
    bucket is a new collective reading exactly its members' inputs (buckets reading the same
    inputs -- a parameter gathered in forward and again in backward -- are matched in schedule
    order); every hidden member's hiders lie between its start and its first wait."""
    position = {n: i for i, n in enumerate(graph.nodes)}
    by_name = {n.name: n for n in graph.nodes}
    merged = _merged_collectives(graph, original_names)
    assert len(merged) == planner.collectives_after(problem, plan)
    colls = {c.name: c for c in problem.collectives}
    new = [(s, ws, frozenset(reads)) for s, ws, reads in merged if s.name not in original_names]
    buckets = [b for b in plan.buckets if len(b.members) >= 2]
    assert len(new) == len(buckets), f"{len(new)} new collectives for {len(buckets)} buckets"
    by_reads: dict[frozenset, list] = {}
    for s, ws, reads in sorted(new, key=lambda t: position[t[0]]):
        by_reads.setdefault(reads, []).append((s, ws))
    for b in sorted(buckets, key=lambda b: colls[b.start].start_pos):
        want = frozenset(set().union(*(inputs_of[m] for m in b.members)))
        assert by_reads.get(want), f"bucket {list(b.members)}: no collective reads exactly its inputs"
        s, ws = by_reads[want].pop(0)
        first_wait = min(position[w] for w in ws)
        for m in b.members:
            if colls[m].status != "hidden":
                continue
            for h in colls[m].hiding:
                assert h in by_name, f"hiding node {h} of {m} is gone from the graph"
                assert position[s] < position[by_name[h]] < first_wait, f"{h} no longer hides {m}"


# ---- the harness ---------------------------------------------------------------------------------

def _fresh(prepared):
    """A copy of the scheduled graph with its collective info and schedule pointing at the copy's
    nodes (``Graph.graph_copy`` maps old nodes to new; the rest is deep-copied through that map,
    so the recursion never walks the nodes' linked list)."""
    from torch import fx

    gm = prepared.inputs.gm
    graph, node_map = fx.Graph(), {}
    out = graph.graph_copy(gm.graph, node_map)
    graph.output(out)
    memo = {id(old): new for old, new in node_map.items()}
    memo[id(gm.graph)] = graph
    with prepared.traced.fake_mode:
        info, sched = copy.deepcopy((prepared.inputs.collective_info, prepared.inputs.scheduled), memo)
    return fx.GraphModule(gm, graph), info, sched


def run_case(workload: str, mode: str, mutants: int, seed: int) -> Counter:
    from fxglue.apply import PlanError, apply_plan
    from fxglue.pipeline import PipelineOptions, prepare

    prepared = prepare(workload, pipeline=PipelineOptions(bucket_mode=mode), greedy=True)
    problem = prepared.problem
    start = repair(problem, prepared.greedy, planner.SolveOptions(time_limit_s=10, workers=1)).plan
    assert start is not None and not verify(problem, start)
    graph_copy = _fresh(prepared)
    original = str(graph_copy[0].graph)
    original_names = {n.name for n in graph_copy[0].graph.nodes}
    inputs_of = _graph_facts(graph_copy[0].graph, problem)
    rng = random.Random(seed)
    tally: Counter = Counter()
    for k in range(mutants):
        op, mutant = mutate(problem, start if rng.random() < 0.7 else planner.Plan.model_construct(
            **{**dict(start), "buckets": ()}), rng)
        violations = verify(problem, mutant)
        gm, info, sched = graph_copy
        try:
            with prepared.traced.fake_mode:
                apply_plan(gm.graph, info, sched, mutant, bucket_mode=mode, problem=problem,
                           estimator=prepared.estimator)
        except PlanError as e:
            assert violations, f"{workload}/{mode} mutant {k} ({op}): verified, but apply refused it: {e}"
            assert str(gm.graph) == original, f"{workload}/{mode} mutant {k} ({op}): a refused plan changed the graph"
            tally[f"rejected rule {violations[0].rule}"] += 1
            continue
        assert not violations, f"{workload}/{mode} mutant {k} ({op}): applied, but the verifier says {violations[0]}"
        check_applied(gm.graph, problem, mutant, inputs_of, original_names)
        tally["applied"] += 1
        graph_copy = _fresh(prepared)  # that copy is bucketed now
    return tally


@pytest.mark.parametrize("workload,mode", [("llama3-8b-2d-2", "custom_ops_multidtype"), ("hf-qwen3-moe-2", "default")])
def test_verifier_and_apply_agree_on_mutants(workload, mode):
    tally = run_case(workload, mode, MUTANTS_QUICK, seed=1)
    assert sum(tally.values()) == MUTANTS_QUICK


@pytest.mark.long
def test_verifier_and_apply_agree_on_a_thousand_mutants():
    total: Counter = Counter()
    for i, workload in enumerate(WORKLOADS):
        for j, mode in enumerate(MODES):
            total += run_case(workload, mode, MUTANTS_PER_CASE, seed=100 * i + j)
    print(dict(total))
    assert sum(total.values()) >= 1000
    assert total["applied"] >= 100  # the harness also exercises plans that apply, not only refusals
