"""Local search over bucket membership *and* where each bucket starts and waits, under a peak
memory budget, scored by the simulated step.

Why this exists: an anchored bucket starts at one member's scheduled start and waits at one
member's scheduled wait, so no anchored plan can prefetch the next block's all_gather or defer a
reduce_scatter's wait, which is how torch's manual per-block pass beats every anchored plan on
FSDP at depth. With named positions (``planner.core.positions``) those plans are in the search space;
memory is what stops a search from gathering everything ahead (unbudgeted searches drift to
gigabytes extra), so every candidate's peak (``planner.cost.memory``) must stay within the budget.

The search: from the fastest seed, first improvement in random order to a local optimum, then
simulated annealing from the seed over the rest of the time or evaluation budget, in one run per
``ANNEAL_RUN_EVALUATIONS`` of it; with neither limit, first improvement and then kicks, as
``planner.search.polish``:
- state: every collective in one bucket (singletons included, which may be positioned too);
- position moves: a bucket's start or wait to its anchor, to the earliest start / latest wait
  its members' data allow, just before the previous same-key bucket's wait (prefetch) or just
  after the next one's start (defer), or a few pinned nodes earlier or later;
- membership moves: merge with the next same-key bucket, split in two, move the boundary member;
- at a local optimum (before a kick; annealing: every ``RESPLIT_EVERY`` evaluations), and on
  every seed: re-splits of gathers as one pipeline (``planner.search.free.gather_split.best_split``): each
  chain issued at one time, each prefix of it in the order due, and each phase's gathers of one
  key lifted to where its first is issued;
- a candidate counts when it is within the budget and accepted by the independent verifier under
  the positioned policy (rules 4, 7 and 8 off: the step prices lost overlap); it is taken when
  faster, or (annealing) slower with a probability that falls over the budget.
Seeds: a per-block plan built from the problem itself (``Collective.module`` / ``phase``, one
bucket per block, phase and key, the next block's gather issued before the current one's wait,
reduce_scatter waits deferred past the next bucket's start; and the same with each merged gather
bucket waited just before its first reader; and both with buckets packed up to the bucket cap
across the blocks' bounds), fitted to the budget, and any plans
the caller gives (torch's greedy, the count or step plan). Every plan returned is verified.
"""

from __future__ import annotations

import math
import random
import time

import planner.core.arguments as arguments
from planner.cost.bounds import peak_memory_floor
from planner.cost.memory import MemoryCounter, peak_bytes
from planner.core.options import PositionSearchOptions
from planner.core.policy import Policy
from planner.core.problem import Bucket, Plan, Problem, with_buckets
from planner.cost.simulator import replay_index, step_ms
from planner.rules.verifier import Verifier, verify
from planner.search.local_search import MIN_GAIN_MS, LocalSearch
from planner.search.free.gather_split import ChainCosts, best_split
from planner.search.result import SolveResult

# pinned-node steps a start or wait is shifted by (a block of a Llama layer is ~100 pinned nodes)
SHIFTS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
# how far a packed seed's bucket looks for members that still fit: that many bucket caps of them
# (llama3-70b-fsdp-80 @ h100-8nodes, the seed waited at first use, fitted to torch default's peak:
# 4856 ms at 1.5 caps, 4694 at 2, 4676 at 3, 4701 at 4, 4702 at 6)
PACK_AHEAD = 3
# fruitless kicks in a row that end a search without a deadline (polish: 50; its moves are fewer)
KICKS_WITHOUT_GAIN = 200
# the annealing's temperature, as a share of the step it starts from: from ANNEAL_START down to
# ANNEAL_END, geometrically over the rest of the budget (a move slower by d ms is taken with
# probability exp(-d / temperature)). Why annealing, from the seed, after a first descent, and
# these values: measured, docs/results.md "The positioned search's constants"
ANNEAL_START = 0.01
ANNEAL_END = 1e-4
# evaluations between re-splits of the annealing's current plan (each costs up to RESPLITS)
RESPLIT_EVERY = 3000
# the least budget left after the first descent, in evaluations, that is annealed (from the seed
# again); less goes on with first improvement and kicks (a short budget annealed did worse:
# docs/results.md "The positioned search's constants"). 40,000 since the judge stopped checking
# the peak and rules of slower plans: an evaluation got cheaper, and 20,000 of them annealed lost
ANNEAL_MIN_EVALUATIONS = 40_000
# the evaluations per annealing run: a budget of several is annealed from the seed in as many runs,
# the fastest plan of all the answer (runs of one budget end far apart, so the best of several
# beats one longer run: docs/results.md "The positioned search's constants")
ANNEAL_RUN_EVALUATIONS = 50_000
# re-split candidates judged per seed and per kick, the longest chains first (each is an
# evaluation: the per-block seed of llama3-8b-fsdp-8 offers about 230, which took half of the 500
# evaluations `bucketplan compare` gives the search at 5 s)
RESPLITS = 16
# the seed that is the unbucketed schedule (no walk into the budget where it fits: judged even past
# the deadline when no other seed was)
UNBUCKETED = "unbucketed"
# rounds of dropping the positions of buckets the verifier names, when a seed is made legal
LEGALIZE_ROUNDS = 50
# evaluations per second of time limit in a deterministic search (``max_evaluations``), times the
# problem's pinned nodes: an evaluation (a replay, a peak and a verification) costs about linearly
# in the graph's size. A third of the least rate measured (docs/results.md "The positioned
# search's constants"), so a loaded machine still ends within the time limit or near it (the
# wall-clock guard is solver.DETERMINISTIC_WALL_FACTOR times it)
EVALUATION_NODES_PER_S = 225_000


class PeakNotReached(ValueError):
    """No plan within the peak asked for: either proved (the peak is below every plan's,
    ``peak_memory_floor``) or not found in time (the message says the lowest peak reached)."""


def deterministic_evaluations(problem: Problem, seconds: float) -> int:
    """The evaluations a deterministic search of ``problem`` gets for ``seconds`` of time limit
    (``EVALUATION_NODES_PER_S``)."""
    arguments.problem_and_plan(problem, None, optional=True)
    arguments.positive_number(seconds, "seconds")
    return max(1, int(EVALUATION_NODES_PER_S * seconds / max(1, len(problem.nodes))))


def positioned_policy(peak_memory_bytes: int | None, keep_overlap: bool = False) -> Policy:
    """The policy of a positioned step plan: overlap rules off (``keep_overlap``: on, as torch's
    bucketer keeps what hid each member), the peak within the budget."""
    return Policy(keep_overlap=keep_overlap, peak_memory_bytes=peak_memory_bytes)


class _Index:
    """What the moves read of a problem, computed once."""

    def __init__(self, problem: Problem):
        self.problem = problem
        self.colls = {c.name: c for c in problem.collectives}
        self.names = [n.name for n in problem.nodes]
        self.at = {n.name: i for i, n in enumerate(problem.nodes)}
        self.key_of = {c.name: (c.kind, c.pg, c.key) for c in problem.collectives}
        succ: dict[int, list[int]] = {}
        for i, n in enumerate(problem.nodes):
            for d in n.deps:
                succ.setdefault(d, []).append(i)
        # per collective: the node index its start must follow (last pinned predecessor) and the
        # one its wait must precede (first pinned consumer)
        self.after = {c.name: max(problem.nodes[self.at[c.name]].deps, default=-1) for c in problem.collectives}
        end = len(problem.nodes)
        self.before = {c.name: min(succ.get(self.at[c.wait], []), default=end) for c in problem.collectives}
        self.replay = replay_index(problem)

    def start_index(self, b: Bucket) -> int:
        """The node index a bucket's start sits at (anchor) or just before (named)."""
        return self.at[b.issue_before] if b.issue_before is not None else self.at[b.start]

    def wait_index(self, b: Bucket) -> int:
        return self.at[b.wait_before] if b.wait_before is not None else self.at[self.colls[b.wait].wait]

    def latest_wait(self, members) -> str | None:
        """The node a bucket of ``members`` waits just before at the latest: the members' first
        pinned consumer (None: no member's wait has one)."""
        first = min(self.before[m] for m in members)
        return self.names[first] if first < len(self.names) else None

    def anchors(self, members: tuple[str, ...]) -> tuple[str, str]:
        """Torch's merge anchors: an all_gather at its first start and first wait, a reduce_scatter
        or all_reduce at its last start and last wait."""
        cs = [self.colls[m] for m in members]
        if cs[0].kind == "all_gather":
            return min(cs, key=lambda c: c.start_pos).name, min(cs, key=lambda c: c.wait_pos).name
        return max(cs, key=lambda c: c.start_pos).name, max(cs, key=lambda c: c.wait_pos).name


def _bucket(ix: _Index, members, issue_before=None, wait_before=None) -> Bucket:
    members = tuple(sorted(members, key=lambda m: ix.colls[m].start_pos))
    start, wait = ix.anchors(members)
    return Bucket(members=members, start=start, wait=wait, issue_before=issue_before, wait_before=wait_before)


def _as_plan(template: Plan, buckets: list[Bucket]) -> Plan:
    """The plan of ``buckets`` (merged or positioned ones; the rest are singletons anyway), with
    the template's record (planner, params, created)."""
    kept = [b for b in buckets if len(b.members) > 1 or b.issue_before is not None or b.wait_before is not None]
    return with_buckets(template, kept)


def _shape(b: Bucket) -> tuple:
    """What a bucket is, its members' order apart."""
    return tuple(sorted(b.members)), b.start, b.wait, b.issue_before or "", b.wait_before or ""


def _all_buckets(ix: _Index, plan: Plan) -> list[Bucket]:
    placed = {m for b in plan.buckets for m in b.members}
    return list(plan.buckets) + [_bucket(ix, (c.name,)) for c in ix.problem.collectives if c.name not in placed]


def per_block_seed(problem: Problem, prefetch: bool = True, defer: bool = True,
                   wait_at_first_use: bool = False, packed: bool = False) -> list[Bucket]:
    """One bucket per (block, phase, key) from ``Collective.module`` / ``phase``; with ``prefetch``
    each gather bucket but the first of its phase and key is issued just before the previous
    one's wait, with ``defer`` each reduce_scatter / all_reduce bucket but the last is waited
    just after the next one's start. ``wait_at_first_use``: each merged gather bucket is waited
    just before the first node that uses any member (its merged wait is otherwise its first
    member's wait, which torch may have scheduled a whole backward early for a block's smallest
    weight, holding the block's gathered bytes from there), and prefetched only where that is
    before its own start. ``packed``: buckets filled up to the bucket cap across the blocks'
    bounds (``_packed_groups``) in place of one per block. Not verified (``legal`` makes it so)."""
    ix = _Index(problem)
    groups: dict[tuple, list[str]] = {}
    for c in problem.collectives:
        label = (c.module, c.phase, ix.key_of[c.name]) if c.module is not None else ("alone", c.name)
        groups.setdefault(label, []).append(c.name)
    if packed:
        groups = _packed_groups(problem, ix)
    buckets = [_bucket(ix, ms) for ms in groups.values()]
    if wait_at_first_use:
        for k, b in enumerate(buckets):
            latest = ix.latest_wait(b.members)
            if ix.key_of[b.start][0] == "all_gather" and len(b.members) > 1 \
                    and latest is not None and ix.at[latest] > ix.wait_index(b) + 1:
                buckets[k] = b.model_copy(update={"wait_before": latest})
    by_key: dict[tuple, list[int]] = {}
    for k, b in enumerate(buckets):
        c = ix.colls[b.start]
        if c.module is not None:
            by_key.setdefault((c.phase, ix.key_of[c.name]), []).append(k)
    for (_, key), ks in by_key.items():
        if key[0] == "all_gather" and prefetch:
            ks.sort(key=lambda k: ix.wait_index(buckets[k]))
            for prev, k in zip(ks, ks[1:]):
                if wait_at_first_use and ix.wait_index(buckets[prev]) >= ix.start_index(buckets[k]):
                    continue
                buckets[k] = buckets[k].model_copy(update={"issue_before": ix.names[ix.wait_index(buckets[prev])]})
        elif key[0] != "all_gather" and defer:
            ks.sort(key=lambda k: ix.start_index(buckets[k]))
            for k, nxt in zip(ks, ks[1:]):
                after = ix.start_index(buckets[nxt]) + 1
                if after < len(ix.names):
                    buckets[k] = buckets[k].model_copy(update={"wait_before": ix.names[after]})
    return buckets


def _packed_groups(problem: Problem, ix: _Index) -> dict[tuple, list[str]]:
    """Per phase and key, the blocks' collectives in the order they are due (gathers: their first
    fixed consumer) or ready (the rest: their start), packed across the blocks' bounds: the first
    left opens a bucket, which takes every later one that still fits the bucket cap
    (``size_bytes``) among the next ``PACK_AHEAD`` caps of them. Why: on a stream-bound step a
    bucket's time per byte falls with its size (llama3-70b-fsdp-80 @ h100-8nodes: 0.0111 ns a
    byte at one block's 1.74 GB, 0.0107 at the 2.15 GB cap), a block's collectives are well under
    the cap, and next to one block's the next one's first (its attention weights, 0.31 GB) fit
    and its MLP weights (0.48 GB each) do not, so a bucket of consecutive ones stays one block's
    size; one that skips those and takes the attention weights of the block after fills the cap."""
    from planner.cost.bounds import fixed_limits

    due = {name: w for name, (_, w) in fixed_limits(problem).items()}
    chains: dict[tuple, list] = {}
    groups: dict[tuple, list[str]] = {}
    for c in problem.collectives:
        if c.module is None:
            groups[("alone", c.name)] = [c.name]
        else:
            chains.setdefault((c.phase, ix.key_of[c.name]), []).append(c)
    for (phase, key), cs in chains.items():
        cs.sort(key=lambda c: (due[c.name], c.start_pos) if key[0] == "all_gather" else (c.start_pos, due[c.name]))
        cap, left = problem.bucket_cap_bytes, list(cs)
        while left:  # the first left opens a bucket, which takes each later one that still fits
            bucket, size, ahead = [], 0, 0
            for c in list(left):
                ahead += c.size_bytes
                if bucket and ahead > PACK_AHEAD * cap:
                    break
                if not bucket or size + c.size_bytes <= cap:
                    bucket.append(c)
                    size += c.size_bytes
                    left.remove(c)
            groups[(phase, key, len(groups))] = [c.name for c in bucket]
    return groups


def _block_seeds(problem: Problem) -> list[tuple[str, list[Bucket]]]:
    """The seeds built from the problem's blocks (none where no collective names one)."""
    if not any(c.module is not None for c in problem.collectives):
        return []
    seeds = [("per-block", per_block_seed(problem)),
             ("per-block, gathers waited at first use", per_block_seed(problem, wait_at_first_use=True))]
    if _blocks_fill_the_cap(problem):
        seeds += [("packed", per_block_seed(problem, packed=True)),
                  ("packed, gathers waited at first use", per_block_seed(problem, wait_at_first_use=True, packed=True))]
    return seeds


def _blocks_fill_the_cap(problem: Problem) -> bool:
    """Whether one block's collectives of a phase and key hold, on average, at least half the
    bucket cap: where they hold less, one bucket per block is already far from the cap's rate
    and the packed seed merges several whole blocks (llama3-8b-fsdp-8: about 0.4 GB of 2.15, its
    packed seed 177.5 ms against 153.6 for the best seed, and its walks took half of a 20 s
    search); at llama3-70b-fsdp-80's 1.74 GB it is the best seed."""
    sizes: dict[tuple, int] = {}
    for c in problem.collectives:
        if c.module is not None:
            label = (c.module, c.phase, c.kind, c.pg, c.key)
            sizes[label] = sizes.get(label, 0) + c.size_bytes
    return bool(sizes) and sum(sizes.values()) / len(sizes) >= problem.bucket_cap_bytes / 2


class _Search:
    """One positioned search's state: the problem's lookups, the random stream, the time and
    evaluation budget, the memory budget, and ``stats``; its plans carry the template's record."""

    def __init__(self, problem: Problem, template: Plan, budget: int | None, deadline: float,
                 options: PositionSearchOptions):
        self.problem, self.template, self.budget = problem, template, budget
        self.rng = random.Random(options.seed)
        self.ix = _Index(problem)
        self.policy = positioned_policy(budget, options.keep_overlap)
        self.rules = positioned_policy(None, options.keep_overlap).as_params()  # the hot loop's rules, the budget apart
        self.stats = {"evaluations": 0, "accepted": 0, "rejected": 0, "kicks": 0, "resplits": 0}
        # the fastest legal plan judged so far, as (plan, step): what an interrupt returns, wherever
        # the search was (an annealing run ends on no particular plan)
        self.fastest: tuple[Plan, float] | None = None
        # per walk into the budget that failed: its seed's peak (legal: ``legal`` made it so) and
        # the lowest plan it reached, verified only when nothing fits (``lowest_legal_peak``)
        self.failed_walks: list[tuple[int, int, Plan]] = []
        self._walk: list = []  # the walk under way: [seed's peak, lowest peak, its plan]
        self.chain_costs = ChainCosts(problem, self.ix.replay)
        # every candidate's peak and rules, each one or two buckets from the last
        self.memory, self.verifier = MemoryCounter(problem), Verifier(problem)
        # the loops: descent, kicks and annealing over this move set (neighbours, random_move,
        # judge, escape below)
        self.engine = LocalSearch(self, rng=self.rng, deadline=deadline, max_evaluations=options.max_evaluations,
                                  stats=self.stats, name="positioned search")

    def out_of_budget(self) -> bool:
        return self.engine.out_of_budget()

    def judge(self, buckets: list[Bucket], than: float = math.inf) -> tuple[Plan, float] | None:
        """The plan and its step if it is legal, within the budget and faster than ``than``, else
        None. The step is replayed first: most candidates a descent or an annealing tries are
        slower, and their peak and rules (as long again as the replay) are then never counted.
        Every plan faster than ``than`` is judged in full, so the fastest legal plan seen is kept."""
        self.stats["evaluations"] += 1
        try:
            plan = _as_plan(self.template, buckets)
        except ValueError:  # a move that broke the plan's own structure
            return None
        try:
            ms = step_ms(self.problem, plan, self.ix.replay)
        except ValueError:  # a bucket waited before it is issued: the verifier below names it
            ms = None
        if ms is not None and ms >= than - MIN_GAIN_MS:
            self.stats["slower"] = self.stats.get("slower", 0) + 1
            return None
        # the budget by planner.cost.memory directly (the verifier's rule 11 counts the same, and
        # certifies the plan returned), then every other rule
        if self.budget is not None and self.memory.peak_and_segment(plan)[0] > self.budget:
            self.stats["rejected"] += 1
            return None
        if self.verifier.verify(plan, **self.rules):
            self.stats["rejected"] += 1
            return None
        if ms is None:  # a legal plan the replay refused: a bug, raised as the replay's
            ms = step_ms(self.problem, plan, self.ix.replay)
        if self.fastest is None or ms < self.fastest[1] - MIN_GAIN_MS:
            self.fastest = (plan, ms)
        return plan, ms

    def lowest_legal_peak(self) -> int | None:
        """The lowest peak of a legal plan the failed walks met (None: no walk failed)."""
        peaks = [first for first, _, _ in self.failed_walks]
        peaks += [low for first, low, plan in self.failed_walks
                  if low < first and not self.verifier.verify(plan, **self.rules)]
        return min(peaks, default=None)

    def legal(self, buckets: list[Bucket]) -> list[Bucket]:
        """``buckets`` with the positions, then the merges, of buckets the verifier names dropped
        until it accepts them (a seed built from the problem's structure may break a rule)."""
        for _ in range(LEGALIZE_ROUNDS):
            plan = _as_plan(self.template, buckets)
            violations = self.verifier.verify(plan, **self.rules)
            if not violations:
                return buckets
            bad = {v.bucket for v in violations if v.bucket is not None}
            if not bad:  # a violation no bucket is named for: give up on the seed
                return _all_buckets(self.ix, self.template)
            # the plan's buckets are the kept ones, in order (_as_plan)
            kept = [b for b in buckets if len(b.members) > 1 or b.issue_before or b.wait_before]
            out = [b for b in buckets if not (len(b.members) > 1 or b.issue_before or b.wait_before)]
            for k, b in enumerate(kept):
                if k in bad and (b.issue_before or b.wait_before):
                    out.append(b.model_copy(update={"issue_before": None, "wait_before": None}))
                elif k in bad:
                    out += [_bucket(self.ix, (m,)) for m in b.members]
                else:
                    out.append(b)
            buckets = out
        return _all_buckets(self.ix, self.template)

    def fit_budget(self, buckets: list[Bucket]) -> list[Bucket] | None:
        """Walk ``buckets`` into the budget: at the peak segment, the all_gather bucket in flight there
        with the most bytes is issued just past that segment instead (its output is then allocated
        after it; back at its anchor when even that is too late for its wait); with none, the largest
        merged bucket is split. This can take a plan below the unbucketed schedule's peak (a gather
        torch issued early is delayed). None if no such walk gets within the budget, or the search's
        time runs out first (each step is a peak: at 80 layers a walk took 2,000 steps, 86 s)."""
        if self.budget is None:
            return buckets
        self._walk = []
        fitted = self._fit_budget(list(buckets))
        if fitted is None and self._walk:
            self.failed_walks.append(tuple(self._walk))
        return fitted

    def _fit_budget(self, buckets: list[Bucket]) -> list[Bucket] | None:
        """``fit_budget``'s walk, keeping in ``_walk`` where it started and its lowest plan."""
        ix = self.ix
        for _ in range(8 * len(buckets) + 1):
            plan = _as_plan(self.template, buckets)
            peak, j = self.memory.peak_and_segment(plan)  # segment j: from node j - 1 up to node j
            if not self._walk or peak < self._walk[1]:
                self._walk = [self._walk[0] if self._walk else peak, peak, plan]
            if peak <= self.budget:
                return buckets
            if self.out_of_budget():
                return None
            # all_gathers issued at or before segment j and waited after it: their outputs are alive in j
            early = [k for k, b in enumerate(buckets) if ix.key_of[b.start][0] == "all_gather"
                     and ix.start_index(b) - (b.issue_before is not None) < j and ix.wait_index(b) > j + 1]
            if early:
                k = max(early, key=lambda k: sum(ix.colls[m].wire_bytes for m in buckets[k].members))
                b = buckets[k]
                later = j + 1 if j + 1 < ix.wait_index(b) and j + 1 < len(ix.names) else None
                buckets[k] = b.model_copy(update={"issue_before": ix.names[later] if later is not None else None})
                if later is None and b.issue_before is None:
                    buckets[k:k + 1] = [_bucket(ix, (m,)) for m in b.members]
                continue
            # reduce_scatters / all_reduces whose inputs are alive in j and could be issued before it
            # (just after their members' last pinned predecessor): issued there, they free them sooner
            ready = {k: max(ix.after[m] for m in b.members) + 1 for k, b in enumerate(buckets)
                     if ix.key_of[b.start][0] != "all_gather"}
            sooner = [k for k, r in ready.items() if r < j and ix.start_index(buckets[k]) >= j
                      and r < ix.wait_index(buckets[k]) and buckets[k].issue_before != ix.names[r]]
            if sooner:
                k = max(sooner, key=lambda k: sum(ix.colls[m].wire_bytes for m in buckets[k].members))
                buckets[k] = buckets[k].model_copy(update={"issue_before": ix.names[ready[k]]})
                continue
            merged = [k for k, b in enumerate(buckets) if len(b.members) > 1]
            if not merged:
                return None
            k = max(merged, key=lambda k: len(buckets[k].members))
            b = buckets[k]
            half = len(b.members) // 2
            buckets[k:k + 1] = [_bucket(ix, b.members[:half], b.issue_before, b.wait_before),
                                _bucket(ix, b.members[half:], b.issue_before, b.wait_before)]
        return None

    def resplits(self, buckets: list[Bucket]) -> list[tuple[str, list[Bucket]]]:
        """Per chain of all_gather buckets of one key issued at one time (no compute between
        their places: ``ChainCosts.ahead``), per prefix of it in the order its buckets are
        first due (the forward's without the backward's gathers prefetched with them), and per
        phase and key whose gathers are issued at more than one time (all of them lifted): the
        chain's first place and ``buckets`` with those buckets split again as
        ``planner.search.free.gather_split.best_split`` says, every new bucket issued there and waited at
        its anchor, or just before its first consumer (the splits that would change nothing left
        out; the ``RESPLITS`` that split the most collectives)."""
        ix, due, ahead = self.ix, self.chain_costs.due, self.chain_costs.ahead
        chains: dict[tuple, list[int]] = {}
        phases: dict[tuple, list[int]] = {}
        for k, b in enumerate(buckets):
            if ix.key_of[b.start][0] == "all_gather":
                chains.setdefault((ix.key_of[b.start], ahead[ix.start_index(b)]), []).append(k)
                phases.setdefault((ix.key_of[b.start], ix.colls[b.start].phase), []).append(k)

        def first_place_and_due_order(ks: list[int]) -> tuple[str, list[int]]:
            return (ix.names[min(ix.start_index(buckets[k]) for k in ks)],
                    sorted(ks, key=lambda k: min(due[m] for m in buckets[k].members)))

        parts = []  # (place, the chain's first buckets)
        for place, ks in map(first_place_and_due_order, chains.values()):
            parts += [(place, ks[:n]) for n in range(2 if len(ks) > 1 else 1, len(ks) + 1)]
        # a phase's gathers issued at more than one time, all lifted to where its first is issued:
        # the forward's gathers prefetched a block ahead become one pipeline from the top (a move
        # at a time never gets there: llama3-8b-fsdp-32 within torch manual's peak, 586.5 -> 547.4
        # ms in this one move); a lift beyond the budget is rejected by the judge, one evaluation
        parts += [first_place_and_due_order(ks) for ks in phases.values()
                  if len({ahead[ix.start_index(buckets[k])] for k in ks}) > 1]
        # the most collectives first (stable): each candidate costs an evaluation, so only the first
        # RESPLITS that change something are split at all
        parts.sort(key=lambda pp: -sum(len(buckets[k].members) for k in pp[1]))
        out = []
        for place, part in parts:
            split = best_split(self.chain_costs, [m for k in part for m in buckets[k].members])
            # the simulator decides which wait pays: the anchor's, or the latest (best_split's)
            for latest in (False, True):
                new = [_bucket(ix, members, place, ix.latest_wait(members) if latest else None)
                       for members in split]
                if sorted(map(_shape, new)) != sorted(_shape(buckets[k]) for k in part):
                    # where the first of them was: buckets issued at one place go in the plan's order
                    at = min(part)
                    out.append((place, [b for k, b in enumerate(buckets[:at]) if k not in part] + new
                                + [b for k, b in enumerate(buckets) if k > at and k not in part]))
                    if len(out) == RESPLITS:
                        return out
        return out

    def best_resplit(self, buckets: list[Bucket], than_ms: float) -> tuple[list[Bucket], Plan, float] | None:
        """The fastest of ``resplits(buckets)`` that is legal, within the budget and faster than
        ``than_ms``, or None."""
        best = None
        for _, trial in self.resplits(buckets):
            judged = self.judge(trial)
            if judged is not None and judged[1] < than_ms - MIN_GAIN_MS and (best is None or judged[1] < best[2]):
                best = (trial, *judged)
        return best

    # -- moves -----------------------------------------------------------------------------
    def _same_key_neighbours(self, buckets: list[Bucket], k: int) -> tuple[int | None, int | None]:
        key = self.ix.key_of[buckets[k].start]
        mine = self.ix.start_index(buckets[k])
        prev = nxt = None
        for j, b in enumerate(buckets):
            if j == k or self.ix.key_of[b.start] != key:
                continue
            s = self.ix.start_index(b)
            if s < mine and (prev is None or s > self.ix.start_index(buckets[prev])):
                prev = j
            if s > mine and (nxt is None or s < self.ix.start_index(buckets[nxt])):
                nxt = j
        return prev, nxt

    def move(self, buckets: list[Bucket]) -> list[Bucket] | None:
        ix, rng = self.ix, self.rng
        k = rng.randrange(len(buckets))
        b = buckets[k]
        out = list(buckets)
        what = rng.choice(("start", "start", "wait", "wait", "merge", "split", "shift"))
        names, n = ix.names, len(ix.names)
        prev, nxt = self._same_key_neighbours(buckets, k)
        if what == "start":
            options = [None, names[min(max(ix.after[m] for m in b.members) + 1, n - 1)]]
            if prev is not None:
                options.append(names[ix.wait_index(buckets[prev])])
            here = ix.start_index(b)
            d = rng.choice(SHIFTS) * rng.choice((-1, 1))
            options.append(names[min(max(here + d, 0), n - 1)])
            out[k] = b.model_copy(update={"issue_before": rng.choice(options)})
        elif what == "wait":
            latest = self.ix.latest_wait(b.members)
            options = [None] + ([latest] if latest is not None else [])
            if nxt is not None and ix.start_index(buckets[nxt]) + 1 < n:
                options.append(names[ix.start_index(buckets[nxt]) + 1])
            here = ix.wait_index(b)
            d = rng.choice(SHIFTS) * rng.choice((-1, 1))
            options.append(names[min(max(here + d, 0), n - 1)])
            out[k] = b.model_copy(update={"wait_before": rng.choice(options)})
        elif what == "merge":
            if nxt is None:
                return None
            other = buckets[nxt]
            merged = _bucket(ix, b.members + other.members, b.issue_before,
                             other.wait_before if ix.key_of[b.start][0] != "all_gather" else b.wait_before)
            out[k] = merged
            del out[nxt]
        elif what == "split":
            if len(b.members) < 2:
                return None
            cut = rng.randrange(1, len(b.members))
            out[k:k + 1] = [_bucket(ix, b.members[:cut], b.issue_before, b.wait_before),
                            _bucket(ix, b.members[cut:], b.issue_before, b.wait_before)]
        else:  # the boundary member to the next same-key bucket
            if nxt is None or len(b.members) < 2:
                return None
            other = buckets[nxt]
            out[k] = _bucket(ix, b.members[:-1], b.issue_before, b.wait_before)
            out[nxt] = _bucket(ix, other.members + b.members[-1:], other.issue_before, other.wait_before)
        return out

    # -- the move set of planner.search.local_search ---------------------------------------------
    def neighbours(self, buckets: list[Bucket]):
        """Random moves: a local optimum, as far as sampled, after ``20 x buckets`` in a row
        without gain."""
        for _ in range(20 * len(buckets) + 1):
            yield "move", self.move(buckets)

    def random_move(self, buckets: list[Bucket]) -> list[Bucket] | None:
        return self.move(buckets)

    def escape(self, buckets: list[Bucket], ms: float) -> tuple[list[Bucket], Plan, float] | None:
        """At a local optimum, first the best split of a chain of gathers."""
        resplit = self.best_resplit(buckets, ms)
        if resplit is not None:
            self.stats["resplits"] += 1
        return resplit

    def descend(self, buckets: list[Bucket], best: tuple[Plan, float],
                kicks: int = KICKS_WITHOUT_GAIN) -> tuple[list[Bucket], Plan, float]:
        """The engine's iterated local search from ``buckets`` (judged: ``best``) until the budget
        ends or ``kicks`` kicks in a row found nothing (0: the first local optimum no re-split
        improves)."""
        return self.engine.search(buckets, *best, kicks=kicks)

    def descend_then_anneal(self, buckets: list[Bucket], best: tuple[Plan, float]) -> tuple[list[Bucket], Plan, float]:
        """From a seed, its first local optimum by descent, as before annealing; then, when the
        budget left is ``ANNEAL_MIN_EVALUATIONS`` or more (at the descent's rate, under a clock),
        all of it annealed from the seed again, in one run per ``ANNEAL_RUN_EVALUATIONS`` of it (at
        least one), each over an equal share (``ANNEAL_START`` and ``ANNEAL_RUN_EVALUATIONS`` say
        why). The fastest of them all; a shorter budget is left to the caller (``descend``'s kicks).

        Why annealing and not only kicks: at a local optimum a kick of three random moves from the
        best plan rarely leaves its basin, so the search levels off within seconds and the rest of
        the budget finds little (module constants: measured)."""
        engine = self.engine
        from_evaluations, from_s = self.stats["evaluations"], time.perf_counter()
        found = self.descend(buckets, best, kicks=0)
        left = engine.evaluations_left(from_evaluations, from_s)
        if left < ANNEAL_MIN_EVALUATIONS:
            return found
        runs = max(1, int(left // ANNEAL_RUN_EVALUATIONS)) if math.isfinite(left) else 1
        limits = (engine.deadline, engine.max_evaluations)
        evaluations0, t0 = self.stats["evaluations"], time.perf_counter()
        try:
            for run in range(1, runs + 1):  # run k stops at k / runs of what was left
                if engine.max_evaluations is not None:
                    engine.max_evaluations = evaluations0 + (limits[1] - evaluations0) * run // runs
                else:
                    engine.deadline = t0 + (limits[0] - t0) * run / runs
                annealed = engine.anneal(buckets, *best, start=ANNEAL_START, end=ANNEAL_END,
                                         escape_every=RESPLIT_EVERY)
                self.stats["anneals"] = run
                if annealed[2] < found[2] - MIN_GAIN_MS:
                    found = annealed
        finally:
            engine.deadline, engine.max_evaluations = limits
        return found


def default_peak_budget(problem: Problem, plans=(), keep_overlap: bool = False) -> int:
    """The default budget: the peak of the unbucketed schedule or of any of ``plans`` (torch's
    greedy plan, say) that the verifier accepts under the positioned policy (``keep_overlap`` as
    the search's), whichever is higher: a positioned plan never holds more than what it replaces.
    Why only those: a plan that breaks a rule cannot be run, so its peak is no memory the user
    would ever have spent; taking it would let the search spend more than any plan it replaces
    (a hint that breaks a rule may hold gigabytes more than the legal plans)."""
    arguments.problem_and_plan(problem, None, optional=True)
    if not isinstance(plans, (list, tuple)):
        raise arguments.ArgumentError("plans", f"plans must be a list of plans, not {type(plans).__name__}")
    given = [p for p in plans if p is not None]
    arguments.plans_of(problem, given, "plans")
    arguments.flag(keep_overlap, "keep_overlap")
    rules = positioned_policy(None, keep_overlap).as_params()
    return max([peak_bytes(problem, None)] + [peak_bytes(problem, p) for p in given if not verify(problem, p, **rules)])


def _gb(nbytes: int) -> str:
    return f"{nbytes / 1e9:.3f} GB"


def _floor_within(problem: Problem, peak_memory_bytes: int | None) -> int:
    """The least peak any plan can have (``peak_memory_floor``; 0 with no budget); a budget below
    it is refused before any search, since that is proved."""
    floor = peak_memory_floor(problem) if peak_memory_bytes is not None else 0
    if peak_memory_bytes is not None and floor > peak_memory_bytes:
        raise PeakNotReached(f"no plan of this problem fits a peak of {peak_memory_bytes} bytes: every plan peaks at "
                         f"{floor} bytes or more ({_gb(floor)}: the graph's own memory and the all_gathers every "
                         f"plan holds; the unbucketed schedule peaks at {_gb(peak_bytes(problem, None))})")
    return floor


def _nothing_found(search: _Search, peak_memory_bytes: int, floor: int, seconds: float) -> None:
    """Raise what a search that fitted no seed into the budget knows: not that no plan fits (its
    walks into the budget prove nothing; ``floor`` is what is proved), but what it reached."""
    lowest = search.lowest_legal_peak()
    lowest = _gb(lowest) if lowest is not None else "none measured"
    late = search.out_of_budget()
    raise PeakNotReached(f"no plan within a peak of {peak_memory_bytes} bytes ({_gb(peak_memory_bytes)}) found "
                     + (f"before the time limit ({seconds:.1f} s)" if late else f"in {seconds:.1f} s")
                     + f"; the lowest peak reached was {lowest} (no plan can peak below {_gb(floor)})"
                     + ("; give it more time" if late else ""))


def _validate(problem, starts, options, peak_memory_bytes, deadline) -> None:
    """Refuse what ``options`` (checked when built) cannot, before any search, as ``solve`` does:
    one ValueError naming the argument; ``PlanMismatchError`` for a start made for another problem."""
    arguments.problem_and_plan(problem, None, optional=True)
    if not isinstance(options, PositionSearchOptions):
        raise arguments.ArgumentError("options", f"options must be a planner.PositionSearchOptions, "
                                                 f"not {type(options).__name__}")
    arguments.plans_of(problem, starts, "starts")
    arguments.memory_budget_bytes(peak_memory_bytes, "peak_memory_bytes")
    # inf: no time limit (max_evaluations or the kicks end the search)
    arguments.deadline(deadline, "deadline")


def position_search(problem: Problem, starts: list[Plan], options: PositionSearchOptions = PositionSearchOptions(),
                    *, peak_memory_bytes: int | None, deadline: float) -> SolveResult:
    """The fastest plan found with free positions whose peak memory is within ``peak_memory_bytes``
    (None: no budget), from the per-block seed and each of ``starts`` (any plans of the problem;
    one that does not fit the budget is fitted first), searched as ``options`` say (seed, the
    reproducible ``max_evaluations`` limit, the per-block seed, ``keep_overlap``) until
    ``deadline`` (a ``time.perf_counter`` value). The result is verified under the positioned
    policy (``positioned_policy``), which its ``params`` record; if nothing fits the budget the
    unbucketed schedule is returned when it does, else ``PeakNotReached``. ``keep_overlap``: every
    candidate keeps torch's overlap too (rules 4, 7 and 8), so a bucket may start where no member
    did and still keep what hid each member (torch's own count on its folded-conversion unit test,
    where every anchored plan keeps one collective more). The result's ``objective`` is the plan's
    simulated step (ms)."""
    _validate(problem, starts, options, peak_memory_bytes, deadline)
    t0 = time.perf_counter()
    floor = _floor_within(problem, peak_memory_bytes)
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    params = {"objective": "step", "positions": "free", "seed": options.seed,
              **positioned_policy(peak_memory_bytes, options.keep_overlap).as_params()}
    template = Plan(problem_fingerprint=problem.fingerprint, planner="bucketplan position search", params=params,
                    created=created, buckets=())
    search = _Search(problem, template, peak_memory_bytes, deadline, options)
    seeds = _block_seeds(problem) if options.per_block else []
    seeds += [(p.planner or f"start {i}", _all_buckets(search.ix, p)) for i, p in enumerate(starts)]
    seeds += [(f"{name}, gathers issued before {place} split again ({n})", trial) for name, buckets in seeds
              for n, (place, trial) in enumerate(search.resplits(buckets))]
    seeds.append((UNBUCKETED, _all_buckets(search.ix, template)))
    judged_seeds = []
    try:
        for name, buckets in seeds:
            if search.out_of_budget() and (judged_seeds or name != UNBUCKETED):
                # the time limit holds while seeding too; with no seed judged, the unbucketed one is
                # still tried (no walk, when it fits the budget), so a limit too short still answers
                search.stats["seeds_skipped"] = search.stats.get("seeds_skipped", 0) + 1
                continue
            fitted = search.fit_budget(search.legal(buckets))
            if fitted is None:
                continue
            fitted = search.legal(fitted)
            judged = search.judge(fitted)
            if judged is not None:
                judged_seeds.append((judged[1], name, fitted, judged))
    except KeyboardInterrupt:  # while seeding: the seeds judged so far, if any, are the answer
        if not judged_seeds:
            raise
        search.stats["interrupted"] = True
    if not judged_seeds:
        _nothing_found(search, peak_memory_bytes, floor, time.perf_counter() - t0)
    judged_seeds.sort(key=lambda s: s[0])
    search.stats["seeds_ms"] = {name: round(ms, 3) for ms, name, _, _ in judged_seeds}
    _, best_name, buckets, (plan, ms) = judged_seeds[0]
    searching = best_name
    try:
        if (options.max_evaluations is not None or math.isfinite(deadline)) and not search.stats.get("interrupted"):
            buckets, plan, ms = search.descend_then_anneal(buckets, (plan, ms))
            judged_seeds[0] = (ms, best_name, buckets, (plan, ms))  # kicks (if time is left) from here
        for seed_ms, name, seed_buckets, judged in judged_seeds:
            if search.out_of_budget() or search.stats.get("interrupted"):
                break
            searching = name
            _, found, found_ms = search.descend(seed_buckets, judged)
            if found_ms < ms - MIN_GAIN_MS:
                plan, ms, best_name = found, found_ms, name
    except KeyboardInterrupt:  # the best verified plan so far is the answer (a second one propagates)
        search.stats["interrupted"] = True
        if search.fastest[1] < ms - MIN_GAIN_MS:  # found by the search cut short
            plan, ms, best_name = *search.fastest, searching
    assert not verify(problem, plan, **search.policy.as_params())  # judge checked it; a last guard
    search.stats["best_from"] = best_name
    # as solve marks its plans: a plan cut short by Ctrl-C says so, and solve-dir solves it again
    plan = plan.model_copy(update={"params": {**plan.params, "interrupted": bool(search.stats.get("interrupted"))}})
    # local search proves nothing: the caller sets a floor beside it (``free_position_floor``)
    return SolveResult(plan=plan, status="FEASIBLE", objective=ms, bound=None, gap=None,
                       wall_s=time.perf_counter() - t0, stats=search.stats, peak_bytes=peak_bytes(problem, plan))
