"""Cost scenarios: a problem re-priced under another estimate, and plans judged by their regret.

Why this exists: every step time here rests on a cost model, and the models disagree with the
cluster (torch's NCCL model prices cross-node collectives 2.5-8x slower than published
nccl-tests figures; simulated compute runs at ~60% MFU where published Llama-3-8B training runs
at 33-43%). A plan that is best under one estimate may be poor under another. A scenario
re-prices a problem without re-tracing it (torch-free): its links' curves and its compute
nodes' times change, its collectives, nodes and schedule do not, so every plan of the problem is
a plan of the re-priced one.

Scenarios (``SCENARIOS``; or a measurement file, ``planner.cost.measured``):
- ``torch``: the problem as extracted (torch's NCCL model on the preset, roofline compute).
- ``published-comm``: cross-node groups at published nccl-tests bus bandwidths (figures and
  sources in ``PUBLISHED_BUSBW``), each collective's fixed cost kept from the problem's curve;
  groups inside one node keep the model (no published figure is held here for them).
- ``published-mfu``: compute at published MFU: every compute node 1.5x slower (the presets'
  achievable 800 TFLOP/s is ~60% of H100's dense bf16 peak, published training 33-43%: ~40%).
- ``published``: both.
- ``contention``: overlap is not free. NCCL's kernels take SMs and memory bandwidth from the
  compute they run beside, so compute that runs while a collective is in flight is slower
  (``CONTENTION_SLOWDOWN``, a published measurement; ``contention=F`` for a factor measured on
  your own cluster, e.g. from ``examples/train_compiled.py bench``'s traces). Which compute
  overlaps a collective depends on the plan, so this is not a re-pricing of the problem: the
  costs stay as extracted and the simulator slows the overlapped compute
  (``planner.simulate(..., contention=F)``). It charges for what the other scenarios let
  overlap hide for free, so it is where a plan's gain from overlap can turn out smaller than
  simulated.
``regret`` of a plan under a scenario: its step over the best step any candidate reaches there,
minus 1. ``robust_choice`` picks the candidate with the least worst-case regret.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass, replace

import planner.core.arguments as arguments
from planner.core.arguments import ArgumentError
from planner.core.options import SolveOptions
from planner.core.problem import Link, Plan, Problem

# Published nccl-tests bus bandwidths (GB/s) for large messages, by group layout. Sources:
# - whole 8-GPU nodes over 8x400G InfiniBand NDR, 8 nodes: all_gather ~320 GB/s at 1 GiB
#   (public nccl-tests runs); all_reduce 400-450 GB/s at 8 GB and more on
#   H100 SXM with NVLink + IB NDR (saturncloud.io, "Validating Multi-Node GPU Clusters with NCCL
#   Tests", expected-performance table): 400 taken;
# - 256 H100s (32 nodes and more): ~200 GB/s at 2 GiB (public nccl-tests runs);
# - one rank per node (a 2-D mesh's data-parallel group, 64 ranks): ~48 GB/s measured on a
#   production cluster, one 400G NIC's worth.
PUBLISHED_BUSBW = {
    "whole_nodes": {"all_gather": 320.0, "reduce_scatter": 320.0, "all_reduce": 400.0},
    "whole_nodes_32_plus": {"all_gather": 200.0, "reduce_scatter": 200.0, "all_reduce": 200.0},
    "one_per_node": {"all_gather": 48.0, "reduce_scatter": 48.0, "all_reduce": 48.0},
}
PUBLISHED_COMPUTE_SCALE = 1.5
# Compute slow-down while a collective runs. Lee et al., "Characterizing Compute-Communication
# Overlap in GPU-Accelerated Distributed Deep Learning: Performance and Power Implications"
# (arXiv:2507.03114, 2025), measured GPT and Llama training on 4 A100s, 4 H100s, MI250 and MI210:
# compute overlapped with communication ran on average 18.9% slower than the same compute alone
# (at most 40.0%). The average is taken. A single GEMM can fare worse: one H100 GEMM sized to
# one wave of 132 SMs ran ~2x slower beside an all_gather whose 24 blocks pushed part of it into a
# second wave (NVIDIA developer forums, "Compute-Communication Overlap Causes Severe GEMM
# Performance Degradation because of Tail Effect", 2025); ``contention=2`` prices that case.
CONTENTION_SLOWDOWN = 1.189
KINDS = ("all_gather", "reduce_scatter", "all_reduce")
SCENARIOS = {
    "torch": "as extracted: torch's NCCL model on the preset, roofline compute at the preset's rates",
    "published-comm": "cross-node groups at published nccl-tests bus bandwidths (planner.search.scenarios.PUBLISHED_BUSBW)",
    "published-mfu": f"compute {PUBLISHED_COMPUTE_SCALE:g}x slower (published MFU ~40%, the presets' ~60%)",
    "published": "published-comm and published-mfu together",
    "contention": f"compute {CONTENTION_SLOWDOWN:g}x slower while a collective runs (measured average over A100 "
                  "and H100 training, arXiv:2507.03114); contention=F for another factor",
}
_CONTENTION = "contention="
_PER_NODE = re.compile(r"(\d+) ranks on (\d+) node\(s\), (\d+) per node")


class ScenarioError(ValueError):
    """A scenario that cannot be applied to this problem (unknown name, no group layout)."""


def contention_of(scenario: str) -> float:
    """The compute slow-down a scenario simulates while a collective runs: 1 (overlap is free)
    but for ``contention`` and ``contention=F``; a bad factor raises ScenarioError."""
    if scenario == "contention":
        return CONTENTION_SLOWDOWN
    if not scenario.startswith(_CONTENTION):
        return 1.0
    from planner.cost.simulator import check_contention

    text = scenario[len(_CONTENTION):]
    try:
        factor = float(text)
    except ValueError:
        raise ScenarioError(f"scenario {scenario!r}: {text!r} is not a number (e.g. contention=1.3)") from None
    try:
        return check_contention(factor)
    except ValueError as e:
        raise ScenarioError(f"scenario {scenario!r}: {e}") from None


def simulated_contention(scenario: str) -> float | None:
    """The contention a scenario is simulated at: the factor ``contention`` and ``contention=F``
    name, None for the others (the problem's own, ``Problem.contention``: re-pricing the
    collectives or the compute does not make overlap free)."""
    if scenario == "contention" or scenario.startswith(_CONTENTION):
        return contention_of(scenario)
    return None


def is_named(scenario: str) -> bool:
    """A scenario given by name (``SCENARIOS`` or ``contention=F``), not by a measurement file."""
    return scenario in SCENARIOS or scenario.startswith(_CONTENTION)


def scenario_value(scenario: str) -> tuple:
    """What a scenario prices, so that two spellings of one compare equal: the costs as extracted
    at a contention factor (``torch``, ``contention``, ``contention=F``: ``contention=1`` is
    ``torch``), another named scenario, or a measured file by its real path."""
    if scenario == "torch" or scenario == "contention" or scenario.startswith(_CONTENTION):
        return ("as extracted", contention_of(scenario))
    if scenario in SCENARIOS:
        return (scenario,)
    from pathlib import Path

    return ("measured", str(Path(scenario).resolve()))


def describe(scenario: str) -> str:
    """One line saying what a scenario prices."""
    if scenario in SCENARIOS:
        return SCENARIOS[scenario]
    if scenario.startswith(_CONTENTION):
        return f"compute {contention_of(scenario):g}x slower while a collective runs (your factor)"
    return "measured collectives file"


def layout(problem: Problem, link: Link) -> tuple[int, int]:
    """(ranks, ranks per node) of a link's group: ``meta["layout"]`` where extraction recorded
    it, else the layout torch's model was given (its description in ``link.hardware``)."""
    recorded = (problem.meta or {}).get("layout", {}).get(link.pg)
    if recorded:
        return int(recorded["ranks"]), int(recorded["ranks_per_node"])
    m = _PER_NODE.search(link.hardware)
    if m:
        return int(m.group(1)), int(m.group(3))
    raise ScenarioError(f"group {link.pg}: its layout over nodes is not recorded (an α-β problem, or extracted "
                        "before layouts were); re-extract on an NCCL preset")


def _published_link(problem: Problem, link: Link) -> Link:
    ranks, per_node = layout(problem, link)
    nodes = -(-ranks // per_node)
    if nodes <= 1:
        return link  # inside one node: no published figure held here; the model stays
    rates = PUBLISHED_BUSBW["one_per_node" if per_node == 1 else
                           "whole_nodes_32_plus" if nodes >= 32 else "whole_nodes"]
    far = 1 << 40
    table = {}
    for kind in KINDS:
        fixed = link.time_ms(kind, 0)
        table[kind] = ((0, fixed), (far, fixed + link.factor(kind) * far / (rates[kind] * 1e6)))
    return Link(pg=link.pg, group_size=link.group_size, table=table,
                hardware=f"published nccl-tests bus bandwidth ({ranks} ranks, {per_node} per node): "
                         + ", ".join(f"{k} {rates[k]:g} GB/s" for k in KINDS) + "; fixed cost as the model")


def _scaled_compute(problem: Problem, scale: float) -> tuple:
    return tuple(n.model_copy(update={"est_ms": n.est_ms * scale, "unpinned_ms": n.unpinned_ms * scale})
                 if n.kind in ("compute", "other") else n
                 for n in problem.nodes)


def reprice(problem: Problem, scenario: str) -> Problem:
    """``problem`` under a scenario: a name of ``SCENARIOS``, ``contention=F``, or a measurement
    file's path. A contention scenario keeps the costs (``contention_of`` says how much the
    simulator slows the overlapped compute); only its ``meta`` names it."""
    arguments.problem_and_plan(problem, None, optional=True)
    scenario = _scenario(scenario, "scenario")
    update: dict = {}
    if scenario == "torch":
        return problem
    if scenario == "contention" or scenario.startswith(_CONTENTION):
        contention_of(scenario)  # a factor that is none raises here
        return problem.model_copy(update={"meta": {**(problem.meta or {}), "scenario": scenario}})
    if scenario in ("published-comm", "published"):
        update["links"] = tuple(_published_link(problem, link) for link in problem.links)
    if scenario in ("published-mfu", "published"):
        update["nodes"] = _scaled_compute(problem, PUBLISHED_COMPUTE_SCALE)
    if not update:
        from pathlib import Path

        if not Path(scenario).exists():
            raise ScenarioError(f"unknown scenario {scenario!r}: choose {', '.join(SCENARIOS)}, contention=F or a "
                                "measured collectives file")
        from planner.cost.measured import Measured

        measured = Measured(list(measured_series(scenario)))  # fresh: ``used`` is per problem
        update["links"] = tuple(measured.link(link, layout(problem, link)[1]) for link in problem.links)
        if not measured.used:
            raise ScenarioError(f"{scenario}: no measurement matches a group of this problem (group sizes and "
                                "ranks per node differ)")
    meta = {**(problem.meta or {}), "scenario": scenario}
    return problem.model_copy(update={**update, "meta": meta}).with_fingerprint()


@functools.lru_cache(maxsize=16)
def measured_series(path: str) -> tuple:
    """A measured scenario file's series, parsed once (compare re-prices many problems by it)."""
    from planner.cost.measured import Measured

    return tuple(Measured.read([path]).series)


def _scenario(value, name: str) -> str:
    """A scenario as a string (a measurement file may come as a path object)."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise ArgumentError(name, f"{name} must be a scenario name, contention=F or a measured collectives file, "
                                  f"not {type(value).__name__}")
    return value


def _scenarios(value, name: str = "scenarios") -> list[str]:
    """A non-empty list of scenarios: with none, no plan is judged and no regret defined."""
    if isinstance(value, (str, os.PathLike)) or not isinstance(value, (list, tuple)):
        raise ArgumentError(name, f"{name} must be a list of scenarios, not {type(value).__name__}")
    if not value:
        raise ArgumentError(name, f"{name} must name at least one scenario (none given: nothing to judge by)")
    return [_scenario(v, f"{name}[{k}]") for k, v in enumerate(value)]


def rebound(plan: Plan, problem: Problem) -> Plan:
    """The same buckets, bound to a re-priced problem (same collectives and nodes)."""
    return plan.model_copy(update={"problem_fingerprint": problem.fingerprint})


@dataclass
class Judged:
    """Each candidate's step (ms) and regret (fraction) under each scenario."""

    scenarios: list[str]
    steps: dict[str, dict[str, float]]  # candidate -> scenario -> ms

    @functools.cached_property
    def best(self) -> dict[str, float]:
        """Scenario -> the least step of any candidate."""
        return {s: min(by[s] for by in self.steps.values()) for s in self.scenarios}

    def regret(self, candidate: str, scenario: str) -> float:
        return self.steps[candidate][scenario] / self.best[scenario] - 1

    def worst_regret(self, candidate: str) -> float:
        return max(self.regret(candidate, s) for s in self.scenarios)

    def robust_choice(self) -> str:
        return min(self.steps, key=lambda c: (self.worst_regret(c), c))

    def markdown(self, first: str = "plan") -> list[str]:
        """A table: each candidate's step and regret under each scenario, the worst regret last."""
        head = [first] + [x for s in self.scenarios for x in (f"{s} step_ms", f"{s} regret")] + ["worst regret"]
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for name in self.steps:
            cells = [name] + [x for s in self.scenarios for x in (f"{self.steps[name][s]:.3f}",
                                                                   f"{self.regret(name, s):.2%}")]
            lines.append("| " + " | ".join(cells + [f"{self.worst_regret(name):.2%}"]) + " |")
        return lines


def judge(problem: Problem, plans: dict[str, Plan | None], scenarios: list[str]) -> Judged:
    """Every plan of ``problem`` (None: unbucketed) simulated under every scenario."""
    arguments.problem_and_plan(problem, None, optional=True)
    if not isinstance(plans, dict):
        raise ArgumentError("plans", f"plans must be a dict of name -> plan, not {type(plans).__name__}")
    return judge_each({name: (problem, plan) for name, plan in plans.items()}, scenarios)


def judge_each(candidates: dict[str, tuple[Problem, Plan | None]], scenarios: list[str]) -> Judged:
    """Every (problem, plan) simulated under every scenario, each plan on its own problem re-priced
    (compare's rows: torch's default plan is of the pre-bucketed problem, manual's of its own), with
    the scenario's contention."""
    from planner.cost.simulator import step_ms

    if not isinstance(candidates, dict):
        raise ArgumentError("candidates", f"candidates must be a dict of name -> (problem, plan), "
                                          f"not {type(candidates).__name__}")
    for name, pair in candidates.items():
        if not (isinstance(pair, tuple) and len(pair) == 2):
            raise ArgumentError(f"candidates[{name!r}]", f"candidates[{name!r}] must be a (problem, plan) pair")
        # a plan of another problem would be priced on the wrong graph (``rebound`` rebinds it)
        arguments.plan_of(pair[0], pair[1], f"plans[{name!r}]", optional=True)
    scenarios = _scenarios(scenarios)

    priced: dict[tuple[str, str], Problem] = {}
    steps: dict[str, dict[str, float]] = {}
    for name, (problem, plan) in candidates.items():
        steps[name] = {}
        for s in scenarios:
            key = (problem.fingerprint, s)
            if key not in priced:
                priced[key] = reprice(problem, s)
            p = priced[key]
            steps[name][s] = step_ms(p, rebound(plan, p) if plan is not None else None,
                                     contention=simulated_contention(s))
    return Judged(list(scenarios), steps)


def _step_candidates(problem: Problem, priced: dict[str, Problem], options: SolveOptions, hint: Plan | None,
                     share: float, say) -> tuple[dict[str, Plan | None], bool, bool]:
    """robust_plan's candidates: the unbucketed plan, ``hint``, and a step-objective CP-SAT plan for
    each scenario's costs (``share`` seconds each; none again for costs searched already); whether
    the wall clock stopped a search, and whether a Ctrl-C did (no further search then)."""
    from planner.search.solver import solve

    candidates: dict[str, Plan | None] = {"unbucketed": None}
    if hint is not None:
        candidates[hint.planner or "hint"] = hint
    wall_hit = False
    searched: dict[str, str] = {}  # fingerprint of a re-priced problem -> the scenario searched on it
    for s, p in priced.items():
        if searched.setdefault(p.fingerprint, s) != s:
            say(f"scenario {s}: the costs of {searched[p.fingerprint]}, searched already (CP-SAT's step model has "
                "no contention); the regret search weighs it")
            continue
        say(f"step search under scenario {s} ({share:.0f} s)")
        r = solve(p, replace(options, time_limit_s=share, objective="step", window="auto"),
                  hint=rebound(hint, p) if hint is not None else None)
        wall_hit |= bool(r.stats.get("wall_limit_hit"))
        if r.plan is not None:
            candidates[f"step under {s}"] = rebound(r.plan, problem)
        if r.stats.get("interrupted"):  # Ctrl-C: no further search, the candidates so far are judged
            return candidates, wall_hit, True
    return candidates, wall_hit, False


def _robust_arguments(problem, scenarios, options, hint, progress) -> list[str]:
    """``robust_plan``'s arguments, before any search: one ``ArgumentError`` naming the argument,
    ``PlanMismatchError`` for a hint of another problem; the scenarios as strings."""
    arguments.plan_of(problem, hint, "hint", optional=True)
    scenarios = _scenarios(scenarios)
    if not isinstance(options, SolveOptions):
        raise ArgumentError("options", f"options must be a planner.SolveOptions, not {type(options).__name__}")
    arguments.callback(progress, "progress")
    return scenarios


@dataclass
class RobustResult:
    """``robust_plan``'s answer: the plan, and every candidate judged (the plan as ``robust``).
    ``interrupted``: Ctrl-C cut the search short; the plan is the best verified one so far."""

    plan: Plan
    judged: Judged
    wall_s: float
    wall_limit_hit: bool
    interrupted: bool = False


def robust_plan(problem: Problem, scenarios: list[str], options: SolveOptions, *, hint: Plan | None = None,
                progress=None) -> RobustResult:
    """The plan with the least worst-case regret across ``scenarios`` that this search finds, within
    ``options.time_limit_s`` (its workers, seed and policy; each scenario's search minimizes its
    step in the window it chooses, whatever ``options``' objective and window).

    Candidates: a step-objective CP-SAT plan for each scenario (its re-priced problem, an equal
    share of the time; none again for costs searched already, as a
    contention scenario's: CP-SAT's step model has no contention), ``hint`` and the unbucketed
    schedule. Then a local search (``polish``'s moves, every plan verified on ``problem``)
    minimizes the worst regret from the most robust candidate, restarting from the others, with
    the last share of the time.
    Regret is against the best step any plan judged reaches under each scenario, the result
    included. Every candidate and the result keep ``policy`` (which the plan's params record). A
    Ctrl-C stops the search at once: the most robust verified plan so far is returned, marked
    ``interrupted``."""
    import time

    from planner.search.polish import polish
    from planner.cost.simulator import replay_index, step_ms
    from planner.core.problem import unbucketed_plan
    from planner.rules.verifier import verify

    scenarios = _robust_arguments(problem, scenarios, options, hint, progress)
    say = progress or (lambda msg: None)
    policy, time_limit_s, seed = options.policy, options.time_limit_s, options.seed
    rules = policy.as_params()
    if hint is not None:
        if verify(problem, hint, **rules):  # torch's greedy can break rule 9: neither a start nor a yardstick
            say(f"the hint ({hint.planner}) breaks a rule: left out")
            hint = None
    t0 = time.perf_counter()
    share = time_limit_s / (len(scenarios) + 1)
    priced = {s: reprice(problem, s) for s in scenarios}
    candidates, wall_hit, interrupted = _step_candidates(problem, priced, options, hint, share, say)
    starts = {n: c for n, c in candidates.items() if c is not None}  # each verified (solve's, or the hint above)
    judged = None
    try:
        judged = judge(problem, candidates, scenarios)
        indexes = {s: replay_index(p, simulated_contention(s)) for s, p in priced.items()}
    except KeyboardInterrupt:  # the candidates found are judged all the same (a second Ctrl-C leaves)
        interrupted = True
        if judged is None:
            judged = judge(problem, candidates, scenarios)

    def worst_regret_pct(plan: Plan) -> float:
        return 100 * max(step_ms(p, rebound(plan, p), indexes[s]) / judged.best[s] - 1 for s, p in priced.items())

    start_name = min((n for n in judged.steps if n in starts or n == "unbucketed"), key=judged.worst_regret)
    start = starts.get(start_name) or unbucketed_plan(problem)
    best = start
    if not interrupted:
        others = tuple(c for n, c in starts.items() if n != start_name)
        say(f"worst-case regret search from {start_name} ({judged.worst_regret(start_name):.2%})")
        try:
            best = polish(problem, (start, *others), deadline=t0 + time_limit_s, seed=seed, policy=policy,
                          objective=worst_regret_pct).plan
        except KeyboardInterrupt:  # the most robust candidate stands
            interrupted = True
    plan = best.model_copy(update={"planner": "robust", "params": {
        "objective": "robust", "scenarios": list(scenarios), "time_limit_s": time_limit_s, "seed": seed,
        "workers": options.workers, **rules, "interrupted": interrupted, "wall_limit_hit": wall_hit}})
    if violations := verify(problem, plan, **rules):  # polish keeps to verified plans: a defect if this fires
        raise AssertionError(f"robust plan fails the verifier: {violations[0]}")
    final = judge(problem, {**candidates, "robust": plan}, scenarios)
    return RobustResult(plan, final, time.perf_counter() - t0, wall_hit, interrupted)


# -- the robust mode of planner.plan (planner.search.planners.MODES) --------------------------------


def check_robust(spec) -> None:
    """What a robust spec must be (``planning.PlanSpec``): its scenarios, each scenario's step
    search choosing its own window, on the wall clock (the regret search has no deterministic
    limit), anchored plans."""
    _scenarios(list(spec.scenarios))
    if spec.objective != "step":
        raise ArgumentError("objective", "the robust search judges plans by their step: objective step")
    if spec.window != "auto":
        raise ArgumentError("window", "each scenario's step search chooses its own window: window 'auto'")
    if spec.budget.deterministic:
        raise ArgumentError("deterministic", "the regret search stops on the wall clock: no deterministic budget")
    spec.only_defaults(("prove_s", "starts", "per_block", "anchored_start", "count_plan", "fallback_plans"), "robust")


def plan_robust(problem: Problem, spec, calls, started: float):
    """``robust_plan`` for ``spec``, as a ``SolveResult``: its objective the plan's worst-case
    regret, the judged candidates in ``stats['robust']`` (a ``RobustResult``); no bound."""
    from planner.search.result import SolveResult

    found = robust_plan(problem, list(spec.scenarios), spec.anchored_options(), hint=spec.hint,
                        progress=calls.progress)
    calls.on_plan(found.plan)
    return SolveResult(plan=found.plan, status="FEASIBLE", objective=found.judged.worst_regret("robust"),
                       bound=None, gap=None, wall_s=found.wall_s,
                       stats={"stage": "robust", "robust": found, "interrupted": found.interrupted,
                              "wall_limit_hit": found.wall_limit_hit})
