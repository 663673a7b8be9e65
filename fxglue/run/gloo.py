"""Run a workload's original and bucketed graphs for real on gloo and compare every output.

Why this exists: a plan is only worth applying if the bucketed graph computes exactly what
the original computed, on every rank. This module runs a built-in workload's structure (same
layers, same collectives) at tiny fp32 shapes on N processes over gloo on 127.0.0.1 (a
FileStore in a temporary folder), with real tensors from a fixed seed. Each rank traces its
own graph, makes its problem with ``fxglue.pipeline.prepare`` (torch's scheduler, extraction,
blocks: the one way in, as ``bucketplan extract`` and the compile hook take it), plans and
buckets it itself -- the rank is baked into gathered offsets, so graphs are per rank -- and
compares loss and every gradient of the bucketed graph with the original one.
"""

from __future__ import annotations

import copy
import os
import queue as queue_module
import tempfile
import time
import traceback
from dataclasses import dataclass, field, replace

import torch
import torch.distributed as dist

import planner.core.arguments as arguments
from planner.core.options import SolveOptions
from planner.search.solver import PlanMismatchError

SUM_ORDER_EPS_PER_RANK = 8  # see CheckResult.sum_order_tolerance
# Rank 0's search parameters at these tiny shapes: one worker (every rank is a process on this
# machine) and a fixed seed; CP-SAT starts from torch's greedy plan.
RANK0_SOLVE = SolveOptions(time_limit_s=20, workers=1, seed=0)
RANK0_REPAIR = SolveOptions(time_limit_s=10, workers=1)


@dataclass(frozen=True)
class CheckOptions:
    """How ``check_workload`` runs a workload: on ``ranks`` gloo processes, bucketed by ``planner``
    (a name of ``planner.search.planners``) or by ``plan`` (a plan file for every rank, or a folder of
    ``rank<R>/plan.json``), torch's ``bucket_mode`` and FSDP ``pre_bucketing``, its parameters
    drawn from torch's ``seed``, every rank within ``timeout_s``; ``save_problems``: a folder that
    gets each rank's problem and torch's greedy plan (``rank<R>/``), to solve offline and check with
    ``plan`` (``bucketplan extract --tiny``)."""

    ranks: int = 2
    planner: str = "greedy"
    plan: str | None = None
    bucket_mode: str | None = None
    pre_bucketing: bool = False
    seed: int = 0
    timeout_s: float = 900.0
    save_problems: str | None = None

    def __post_init__(self) -> None:
        from planner.search import planners

        arguments.positive_integer(self.ranks, "ranks")
        if not self.plan:
            planners.get(self.planner)  # an unknown name: one line naming every planner
        arguments.flag(self.pre_bucketing, "pre_bucketing")
        arguments.seed(self.seed, "seed")
        arguments.positive_number(self.timeout_s, "timeout_s")


@dataclass
class RankResult:
    rank: int
    bitwise_equal: bool = False
    max_abs_diff: float = float("nan")
    max_rel_diff: float = float("nan")  # per output, max |diff| / max |reference|; the largest
    outputs: int = 0
    collectives_before: int = 0
    collectives_after: int = 0
    plan_fingerprint: str = ""
    problem_fingerprint: str = ""
    seconds: float = 0.0
    error: str = ""
    plan_refused: str = ""  # why apply_plan refused the --plan this rank was given (see PlanRefused)


@dataclass
class CheckResult:
    workload: str
    ranks: int
    planner: str
    bucket_mode: str | None
    pre_bucketing: bool
    per_rank: list[RankResult] = field(default_factory=list)
    # Sums over more than two ranks: gloo's ring all_reduce cuts its buffer into chunks by size,
    # so a merged buffer sums each element in another order, and the bits may differ. Measured
    # with plain dist.all_reduce, no FX at all: two tensors reduced separately vs concatenated
    # are bitwise equal on 2 ranks and differ by up to 9.5e-7 (values ~1) on 3 and 4 ranks. For
    # such groups the check accepts a difference within this many float32 epsilons per extra
    # rank, relative to the output's largest magnitude; all_gather-only and 2-rank groups must
    # stay bitwise equal.
    sum_order_tolerance: float | None = None

    @property
    def ok(self) -> bool:
        same_plan = len({r.plan_fingerprint for r in self.per_rank}) == 1
        return bool(self.per_rank) and same_plan and all(self._rank_ok(r) for r in self.per_rank)

    def _rank_ok(self, r: RankResult) -> bool:
        if r.error:
            return False
        return r.bitwise_equal or (self.sum_order_tolerance is not None and r.max_rel_diff <= self.sum_order_tolerance)

    @property
    def bitwise(self) -> bool:
        return self.ok and all(r.bitwise_equal for r in self.per_rank)

    def summary(self) -> str:
        lines = [f"{self.workload}: {self.ranks} ranks, planner {self.planner}, bucket mode "
                 f"{self.bucket_mode or 'default'}, pre-bucketing {'on' if self.pre_bucketing else 'off'}"]
        for r in self.per_rank:
            state = f"error: {r.error}" if r.error else (
                f"{'bitwise equal' if r.bitwise_equal else 'within the sum-order tolerance' if self._rank_ok(r) else 'DIFFERENT'}"
                f" (max |diff| {r.max_abs_diff:.3g}, relative {r.max_rel_diff:.3g}) over "
                f"{r.outputs} outputs, collectives {r.collectives_before} -> {r.collectives_after}")
            lines.append(f"  rank {r.rank}: {state} [{r.seconds:.1f}s]")
        lines.append("OK" if self.ok else "FAILED")
        return "\n".join(lines)


def rank_plan_file(plan: str, rank: int) -> str:
    """The plan a rank applies: ``plan`` itself, or, for a folder as ``extract --tiny`` writes,
    that rank's ``rank<R>/plan.json`` (ranks of a 2-D mesh have different problems)."""
    return os.path.join(plan, f"rank{rank}", "plan.json") if os.path.isdir(plan) else plan


class PlanRefused(PlanMismatchError):
    """A ``--plan`` that cannot be a rank's plan: a file that cannot be read as a plan, or a
    plan that does not fit the rank's problem (made for another problem, or breaking a rule).
    The user's input, not a failure of the check: one line per offending file or rank, and, as
    a ``PlanMismatchError``, reported by the command line without a traceback, exit 2."""


PLAN_HINT = ("`bucketplan extract WORKLOAD --tiny --ranks N -o DIR` writes the problems check runs, one per rank; "
             "solve DIR/rank<R>/problem.json to DIR/rank<R>/plan.json and pass --plan DIR")


def _load_rank_plans(plan: str, ranks: int) -> list:
    """Every rank's plan, read here before any rank is spawned: a missing, unreadable or
    malformed file is one line naming it, not a traceback from every rank."""
    import planner

    plans = []
    for r in range(ranks):
        try:
            plans.append(planner.load_plan(rank_plan_file(plan, r)))
        except ValueError as e:  # every error of load_plan: the file named, one line
            raise PlanRefused(f"--plan {plan}: {e}" + (f" ({PLAN_HINT})" if os.path.isdir(plan) else "")) from None
    return plans


def _save_rank_problem(folder: str, problem, greedy) -> None:
    import planner

    where = os.path.join(folder, f"rank{dist.get_rank()}")
    planner.save(greedy, os.path.join(where, "greedy-plan.json"))
    planner.save(problem, os.path.join(where, "problem.json"))


def _bucket(traced, options: CheckOptions, given_plan, result: RankResult):
    """Schedule and bucket ``traced.gm`` in place with ``options.planner`` (a name of
    ``planner.search.planners``) or ``given_plan`` (this rank's ``--plan``; ``apply_plan`` raises
    ``PlanError`` if it does not fit this rank's problem); returns it. ``options.save_problems``: a
    folder that gets this rank's problem and torch's greedy plan (``rank<R>/``) first."""
    from planner.search import planners
    from fxglue.apply import apply_plan
    from fxglue.cpu_compat import cpu_compat
    from fxglue.pipeline import PipelineOptions, finalize_with_torch, prepare

    gm, fake_mode = traced.gm, traced.fake_mode
    bucket_mode, save_problems = options.bucket_mode, options.save_problems
    prepared = prepare(traced, pipeline=PipelineOptions(pre_bucketing=options.pre_bucketing, bucket_mode=bucket_mode),
                       greedy=False)
    problem, inputs, est = prepared.problem, prepared.inputs, prepared.estimator
    result.problem_fingerprint = problem.fingerprint
    if save_problems:
        _save_rank_problem(save_problems, problem, prepared.record_greedy())
    if given_plan is not None:
        plan = given_plan
    else:
        entry = planners.get(options.planner)
        if entry.finalize is not None:  # torch buckets by itself, on every rank
            with cpu_compat(est), fake_mode:
                finalize_with_torch(inputs, **entry.finalize.as_kwargs())
            result.plan_fingerprint = f"torch-{entry.name}"
            return gm
        plan = _rank0_plan(entry, problem, prepared.record_greedy)
    result.plan_fingerprint = repr([(b.members, b.start, b.wait) for b in plan.buckets])
    with fake_mode:
        apply_plan(gm.graph, inputs.collective_info, inputs.scheduled, plan, bucket_mode=bucket_mode,
                   problem=problem)
    return gm


def _rank0_plan(entry, problem, record_greedy):
    """``entry``'s plan, made on rank 0 from torch's greedy plan there (CP-SAT's hint, or the plan
    repaired) and sent to every rank by node names: a solver cut by the wall clock on a busy
    machine need not give every rank the same plan. Ranks of other groups have other problems
    (group names differ), so each rank re-fingerprints the buckets for its own problem, and
    apply_plan verifies them against it."""
    from planner.search import planners

    box = [None]
    if dist.get_rank() == 0:
        greedy = record_greedy()
        request = planners.PlanRequest(problem, greedy=greedy, solve=RANK0_SOLVE, repair=RANK0_REPAIR)
        box[0] = entry.plan(request).plan
    dist.broadcast_object_list(box, src=0)
    return box[0].model_copy(update={"problem_fingerprint": problem.fingerprint})


def _rank_workload(spec: dict):
    """The workload a rank runs: a built-in one at tiny shapes, or a user's factory (``--model``)
    at the shapes it builds -- rebuilt in the rank from its spec (functions do not travel)."""
    from fxglue.models.workloads import get_workload

    if spec.get("model"):
        from fxglue.models.custom import factory_workload

        return factory_workload(spec["model"], spec.get("parallel", "fsdp"), spec.get("layers"))
    return get_workload(spec["workload"], small=True)


def _rank_inputs(wl, groups, inputs: tuple, dp_rank: int, *, from_factory: bool) -> tuple:
    """The inputs a rank runs; data differs across data-parallel ranks, as in training.

    A built-in workload's inputs are zeros of the right shape (token ids, labels), and every
    built-in model at tiny shapes takes ids below 16, so they are drawn anew. A user's factory
    is the only one that knows what its inputs may hold (class ids below its class count, a
    mask of 0 and 1): its own inputs are kept, from a second call of the factory under a
    per-rank seed, so inputs it draws from torch's RNG differ across data-parallel ranks (the
    first call's seed is the same on every rank: it makes the parameters)."""
    if from_factory:
        torch.manual_seed(1000 + dp_rank)
        return wl.build(groups)[1]
    gen = torch.Generator().manual_seed(1000 + dp_rank)
    return tuple(torch.randint(0, 16, x.shape, generator=gen) if not x.is_floating_point()
                 else torch.randn(x.shape, generator=gen, dtype=x.dtype) for x in inputs)


def _check_rank(rank: int, world: int, spec: dict) -> RankResult:
    """One rank of ``check_workload``: trace, run, bucket, run again, compare."""
    result = RankResult(rank=rank)
    t0 = time.perf_counter()
    from torch._guards import detect_fake_mode

    from fxglue.apply import PlanError
    from fxglue.models import parallel
    from fxglue.pipeline import count_collectives
    from fxglue.models.workloads import TracedWorkload, block_meta, mesh_groups, trace_step, wrap_module

    wl = _rank_workload(spec)
    groups = mesh_groups(wl.style, world, tp_size=spec.get("tp_size", 1))
    dp_rank = rank // groups.tp_size
    options = spec["options"]
    torch.manual_seed(options.seed)  # identical full parameters on every rank
    module, inputs, loss_fn = wl.build(groups)
    blocks = block_meta(module)  # before wrapping renames the parameters
    wrapped = wrap_module(wl, module, groups, dp_rank)
    inputs = _rank_inputs(wl, groups, inputs, dp_rank, from_factory=bool(spec.get("model")))
    args = [p.detach() for p in parallel.stored_params(wrapped)] + list(inputs)
    step = parallel.make_train_step(wrapped, loss_fn)
    params = parallel.stored_params(wrapped)
    gm = trace_step(step, [*params, *inputs])
    result.collectives_before = sum(count_collectives(gm).values())
    with torch.no_grad():
        reference = gm(*args)
    given = spec["plans"][rank] if spec.get("plans") else None
    graph = copy.deepcopy(gm)
    fake_mode = detect_fake_mode([n.meta.get("val") for n in graph.graph.find_nodes(op="placeholder")])
    traced = TracedWorkload(name=wl.name, gm=graph, fake_mode=fake_mode, groups=groups, trace_s=0.0, meta=blocks)
    try:
        bucketed = _bucket(traced, options, given, result)
    except PlanError as e:
        if given is None:
            raise  # a planner's own plan refused: a bug, reported with its traceback
        result.plan_refused = str(e)
    if given is not None:
        # every rank learns whether any rank refused its plan: a rank that went on to run its
        # bucketed graph would wait in a collective for the one that stopped, until killed
        verdicts = [None] * world
        dist.all_gather_object(verdicts, result.plan_refused)
        if any(verdicts):
            result.seconds = time.perf_counter() - t0
            return result
    bucketed.recompile()
    result.collectives_after = sum(count_collectives(bucketed).values())
    with torch.no_grad():
        out = bucketed(*args)
    result.outputs = len(reference)
    result.bitwise_equal = all(bitwise_equal(a, b) for a, b in zip(reference, out))
    diffs = [(float((a.float() - b.float()).abs().max()), float(a.float().abs().max())) for a, b in zip(reference, out)]
    result.max_abs_diff = max(d for d, _ in diffs)
    result.max_rel_diff = max(d / max(scale, 1e-30) for d, scale in diffs)
    result.seconds = time.perf_counter() - t0
    return result


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype, shape and bytes (NaNs with equal bits count as equal, -0.0 != 0.0)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.reshape(-1).contiguous().view(torch.uint8), b.reshape(-1).contiguous().view(torch.uint8))


class RankError(RuntimeError):
    """A function failed on one rank of a ``GlooWorld`` (the rank's traceback is in the message)."""


def _world_loop(rank: int, world: int, store_path: str, inbox, outbox) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, store=dist.FileStore(store_path, world))
    try:
        while (job := inbox.get()) is not None:
            fn, args = job
            try:
                outbox.put((rank, True, fn(rank, world, *args)))
            except Exception as e:  # noqa: BLE001 - sent to the parent, which raises it
                outbox.put((rank, False, f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=8)}"))
    finally:
        dist.destroy_process_group()


class GlooWorld:
    """``ranks`` gloo processes on 127.0.0.1 (a FileStore in a temporary folder), kept alive
    between jobs: starting a rank (importing torch, joining the group) costs seconds, a job on
    small graphs milliseconds, so the fuzz tests keep one world for many examples.

    ``run(fn, *args)`` calls the module-level function ``fn(rank, world, *args)`` on every rank
    and returns the results in rank order; a failure on any rank raises ``RankError`` and closes
    the world (the other ranks may be stuck in a collective with the failed one).
    """

    def __init__(self, ranks: int):
        import torch.multiprocessing as mp

        self.ranks = ranks
        self.closed = False
        self._tmp = tempfile.TemporaryDirectory(prefix="bucketplan-gloo-")
        ctx = mp.get_context("spawn")
        self._inboxes = [ctx.Queue() for _ in range(ranks)]
        self._outbox = ctx.Queue()
        store = os.path.join(self._tmp.name, "store")
        self._procs = [ctx.Process(target=_world_loop, args=(r, ranks, store, self._inboxes[r], self._outbox),
                                   daemon=True) for r in range(ranks)]
        for proc in self._procs:
            proc.start()

    def run(self, fn, *args, timeout_s: float = 600.0) -> list:
        if self.closed:
            raise RankError("this gloo world is closed (a job failed or timed out); start a new one")
        name = getattr(fn, "__name__", repr(fn))
        for inbox in self._inboxes:
            inbox.put((fn, args))
        deadline = time.monotonic() + timeout_s
        answers = {}
        while len(answers) < self.ranks:
            try:
                rank, ok, value = self._outbox.get(timeout=max(1.0, deadline - time.monotonic()))
            except queue_module.Empty:
                dead = [r for r, p in enumerate(self._procs) if not p.is_alive()]
                self.close()
                raise RankError(f"{name}: no answer from rank(s) {sorted(set(range(self.ranks)) - set(answers))} "
                                f"within {timeout_s:.0f}s{f'; rank(s) {dead} died' if dead else ''}") from None
            if not ok:
                # the other ranks may be blocked in a collective with this one: end the world
                self.close()
                raise RankError(f"{name} failed on rank {rank}: {value}")
            answers[rank] = value
        return [answers[r] for r in range(self.ranks)]

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for inbox, proc in zip(self._inboxes, self._procs):
            if proc.is_alive():
                inbox.put(None)
        for proc in self._procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
        self._tmp.cleanup()

    def __enter__(self) -> "GlooWorld":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def check_workload(workload: str | None, options: CheckOptions = CheckOptions(), *, model: str | None = None,
                   parallel: str = "fsdp", layers: int | None = None) -> CheckResult:
    """Run ``workload`` original vs bucketed as ``options`` say; compare every output.
    ``model`` (instead of a built-in name): a user's factory, ``MODULE:FACTORY`` or
    ``FILE.py:FACTORY``, run at the shapes it builds (``layers`` deep, where it takes them),
    wrapped for ``parallel``. Raises ``PlanRefused`` for an ``options.plan`` that cannot be read
    (before anything is spawned) or that a rank's problem refuses."""
    from fxglue.models.workloads import WorkloadError, get_workload

    if not isinstance(options, CheckOptions):
        raise ValueError(f"options must be a fxglue.run.gloo.CheckOptions, not {type(options).__name__}")
    ranks, plan = options.ranks, options.plan
    if model:
        from fxglue.models.custom import factory_workload

        wl = factory_workload(model, parallel, layers)  # a factory that does not import: one line, nothing spawned
        workload = wl.name
    else:
        wl = get_workload(workload)  # a clear error for an unknown name before spawning anything
    # 2-D: FSDP x TP over 2 from 4 ranks; on 2 ranks FSDP over 2 x TP over 1 (the same graph, its
    # TP all_reduces on one-rank groups), since a one-rank data-parallel group is refused below
    tp = 2 if wl.style == "2d" and ranks >= 4 and ranks % 2 == 0 else 1
    dp = ranks // tp
    if ranks < 2 or dp < 2:
        # measured: with a one-rank data-parallel group, merged all_gathers of the FSDP workload
        # are not equal to the unmerged ones (llama3-8b-fsdp-2 on 1 rank: torch greedy max |diff|
        # 0.0069; CP-SAT's plan, even with only its all_gather bucket kept, 4.1e6), while
        # reordering alone, DDP's all_reduce buckets and a two-member all_gather bucket of
        # handmade tensors up to 4096x64 are exact there. Not minimized further; such a group is
        # no FSDP anyway, so it is refused rather than reported as a difference
        raise WorkloadError(f"{workload}: {ranks} rank(s) leave a data-parallel group of {dp}; use at least 2 ranks")
    plans = _load_rank_plans(plan, ranks) if plan else None
    if options.save_problems:  # the ranks' working folder is another
        options = replace(options, save_problems=os.path.abspath(options.save_problems))
    spec = {"workload": workload, "options": options, "plans": plans, "tp_size": tp, "model": model,
            "parallel": parallel, "layers": layers}
    result = CheckResult(workload, ranks, "plan" if plan else options.planner, options.bucket_mode,
                         options.pre_bucketing)
    if dp > 2:  # see CheckResult.sum_order_tolerance
        result.sum_order_tolerance = SUM_ORDER_EPS_PER_RANK * (dp - 1) * torch.finfo(torch.float32).eps
    with GlooWorld(ranks) as world:
        try:
            result.per_rank = world.run(_check_rank, spec, timeout_s=options.timeout_s)
        except RankError as e:
            # every rank is reported; the failing one carries the message
            result.per_rank = [RankResult(rank=r, error=str(e)[:2000]) for r in range(ranks)]
    refused = [r for r in result.per_rank if r.plan_refused]
    if refused:
        raise PlanRefused(f"--plan {plan}: refused by {len(refused)} of {ranks} ranks ({PLAN_HINT})\n"
                          + "\n".join(f"  rank {r.rank}: {rank_plan_file(plan, r.rank)}: {r.plan_refused}"
                                      for r in refused))
    return result
