"""Measured against predicted: the compiled training step timed under torch's bucketing, torch's
manual per-block pass and a plan, each beside the step the simulator predicts for it.

Why this exists: every step time bucketplan reports is simulated, on a cost model of a cluster.
Only a measurement says whether a prediction holds: how far each configuration's measured step
is from its simulated one (the ratio), and whether the configuration predicted faster is the
one measured faster. The same runs leave a ``torch.profiler`` trace of each configuration
(``record_shapes=True``), which ``--profile`` reads to price the next plans by the cluster's own
times (``fxglue.profile``), and, on a GPU, the slow-down of compute beside NCCL kernels that the
``contention`` scenario of ``planner.search.scenarios`` charges (``contention_from_trace``).
``examples/train_compiled.py bench`` drives it; a training script of your own calls the same
functions (``docs/training.md``).

Configurations (``CONFIGS``), each compiled afresh with inductor's caches off (a cache hit would
skip the pass that records what was compiled):
- ``torch``: ``fxglue.run.compile.record`` into ``OUT/record``: torch's overlap scheduler and its
  greedy bucketer, as ``record`` runs them (torch's FSDP pre-bucketing off, so not quite torch's
  stock pipeline, which pre-buckets first; inductor's own ``enable_overlap_scheduling=True``
  benchmarks compute on the GPU and has no problem to simulate). Simulated: each graph's problem
  with torch's greedy plan (``greedy.json``).
- ``manual``: ``fxglue.run.compile.manual``: torch's manual per-block pass, as torchtitan's
  ``transformer_block_bucketing`` runs it in a compile (FSDP all_gathers and reduce_scatters only;
  a DDP graph stays unbucketed). Simulated: the problem of the order it leaves, as it is.
- ``plan``: ``fxglue.run.compile.use`` on the plan directory. Simulated: each graph's problem
  with its plan (torch's greedy plan where ``use`` fell back to it).
- ``unbucketed`` (on request): torch's schedule, nothing merged.

What is timed: the compiled forward and backward of one step (the graphs the simulator prices),
from after a barrier and a device synchronisation to a device synchronisation; the optimizer runs
outside it. A step's time is its slowest rank's (the ranks wait for each other at the next
collective); the table gives the median of the timed steps. What is simulated: the sum over the
configuration's compiled graphs with collectives of ``planner.simulate(problem, plan).step_ms``,
on the preset the contexts were given (``--profile`` and measured collectives included). A graph
without collectives (DDP's forward) has no problem and is timed but not simulated.

Files under ``OUT``: the table (written by the caller: ``examples/train_compiled.py`` writes
``bench.md``), ``traces/<config>.rank<R>.json``, ``problems/<config>/<digest>.json`` (every problem
simulated) and ``record/`` (the ``torch`` configuration's plan directory).
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

import planner
from planner.jobs.plan_dir import GREEDY, PLAN, problem_dir

CONFIGS = ("torch", "manual", "plan")
ALL_CONFIGS = ("unbucketed",) + CONFIGS
WHAT = {"unbucketed": "torch's schedule, nothing merged",
        "torch": "torch's overlap scheduler + greedy bucketer (record)",
        "manual": "torch's manual per-block pass",
        "plan": "the plans (use)"}


@contextlib.contextmanager
def configuration(config: str, plan_dir, out_dir, **pricing):
    """The compile context of one configuration (the module docstring), inductor's caches off;
    ``pricing``: the keywords every context takes (``preset``, ``collectives``, ``profile``,
    ``profile_cpu``, ``tp_group``, ``tp_size``). Yields the ``fxglue.run.compile.Session``."""
    import torch._functorch.config as functorch_config
    from torch._inductor import config as inductor_config

    from fxglue.run import compile as bucketplan_compile

    if config == "torch":
        ctx = bucketplan_compile.record(record_dir(out_dir), **pricing)
    elif config == "manual":
        ctx = bucketplan_compile.manual(**pricing)
    elif config == "plan":
        ctx = bucketplan_compile.use(plan_dir, **pricing)
    elif config == "unbucketed":
        ctx = bucketplan_compile.unbucketed(**pricing)
    else:
        raise ValueError(f"unknown configuration {config!r}: choose from {', '.join(ALL_CONFIGS)}")
    with inductor_config.patch(fx_graph_cache=False), functorch_config.patch(enable_autograd_cache=False), \
            ctx as session:
        yield session


def written(out_dir) -> list[Path]:
    """What a bench run writes under ``OUT`` (the module docstring), each folder as a whole: no
    input (the plan directory, a ``--profile`` trace) may be among them, or the run would write
    over what it reads (a trace of an earlier run given back as ``--profile``)."""
    out = Path(out_dir)
    return [out / "bench.md", out / "traces", out / "problems", record_dir(out)]


def record_dir(out_dir) -> Path:
    """Where the ``torch`` configuration records its problems and torch's greedy plans."""
    return Path(out_dir) / "record"


def trace_path(out_dir, config: str, rank: int) -> Path:
    return Path(out_dir) / "traces" / f"{config}.rank{rank}.json"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(step, *, steps: int, warmup: int, device: torch.device, after=None) -> list[float]:
    """This rank's time of ``steps`` calls of ``step()`` in ms, after ``warmup`` untimed ones.
    Each call starts after a barrier, so every rank starts it together; ``after()`` (the
    optimizer) runs after each call, untimed."""
    times = []
    for i in range(warmup + steps):
        if dist.is_initialized():
            dist.barrier()
        _sync(device)
        t0 = time.perf_counter()
        step()
        _sync(device)
        if i >= warmup:
            times.append((time.perf_counter() - t0) * 1e3)
        if after is not None:
            after()
    return times


def slowest_rank(times: list[float], device: torch.device) -> list[float]:
    """Each step's time on its slowest rank (every rank calls this with its own times)."""
    if not dist.is_initialized():
        return list(times)
    t = torch.tensor(times, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def profile_steps(step, path, *, steps: int = 1, device: torch.device) -> Path:
    """A Chrome trace of ``steps`` calls of ``step()`` (``record_shapes=True``, what
    ``--profile`` reads; with the GPU's kernels on a GPU)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with profile(activities=activities, record_shapes=True) as prof:
        for _ in range(steps):
            step()
        _sync(device)
    prof.export_chrome_trace(str(path))
    return path


@dataclass
class Graph:
    """One compiled graph of a configuration and what the simulator makes of it."""

    graph: str
    fingerprint: str
    collectives: tuple[int, int]  # before, after bucketing
    outcome: str
    priced_as: str  # the plan it is simulated with
    simulated_ms: float | None  # None: no problem to simulate (why: priced_as)


@dataclass
class Result:
    config: str
    step_ms: list[float]  # each timed step, its slowest rank's
    graphs: list[Graph] = field(default_factory=list)
    trace: str = ""

    @property
    def measured_ms(self) -> float:
        return statistics.median(self.step_ms)

    @property
    def simulated_ms(self) -> float | None:
        if not self.graphs or any(g.simulated_ms is None for g in self.graphs):
            return None
        return sum(g.simulated_ms for g in self.graphs)

    @property
    def ratio(self) -> float | None:
        sim = self.simulated_ms
        return self.measured_ms / sim if sim else None


def _running_graphs(events) -> list:
    """The events of the graphs a step runs: a recompiled frame's last compile per graph kind
    (dynamo's compile id is ``frame/recompile``; a graph break gives another frame)."""
    latest = {}
    for e in events:
        frame = e.graph.rsplit("/", 1)[0].rsplit("/", 1)[0]
        latest[frame, e.kind] = e
    return list(latest.values())


def simulated(config: str, session, plan_dir, out_dir) -> list[Graph]:
    """Each running graph of ``session`` simulated with the plan the configuration bucketed it by."""
    out = []
    for e in _running_graphs(session.events):
        problem = session.problems.get(e.fingerprint)
        plan = None
        if problem is None:  # manual's extraction failed (its outcome says why) or no problem was kept
            how = e.outcome if e.outcome.startswith("manual (not priced") else "not priced: " + e.outcome
        elif config == "manual":
            how = "torch's manual buckets, as they are"
        elif config == "unbucketed":
            how = "unbucketed"
        else:
            if config == "torch":
                root, name, how = record_dir(out_dir), GREEDY, "torch's greedy plan"
            elif e.outcome == "planned":
                root, name, how = Path(plan_dir), PLAN, "its plan"
            else:  # use fell back to torch's greedy bucketer: the greedy plan record saved
                root, name, how = Path(plan_dir), GREEDY, "torch's greedy plan (fallback)"
            plan = _plan_file(root, e.fingerprint, name)
            if plan is None:
                problem, how = None, f"not priced: no readable {name} for this problem in {root}"
        sim = planner.simulate(problem, plan).step_ms if problem is not None else None
        out.append(Graph(e.graph, e.fingerprint, (e.collectives_before, e.collectives_after), e.outcome, how, sim))
    return out


def save_problems(config: str, session, out_dir) -> Path:
    """Every problem of the configuration's running graphs at ``OUT/problems/<config>/<digest>.json``
    (``manual`` and ``unbucketed`` keep theirs in memory only), to inspect, simulate or plan."""
    from planner.jobs.plan_dir import fingerprint_digest

    where = Path(out_dir) / "problems" / config
    where.mkdir(parents=True, exist_ok=True)
    for e in _running_graphs(session.events):
        problem = session.problems.get(e.fingerprint)
        if problem is not None:
            planner.save(problem, where / f"{fingerprint_digest(e.fingerprint)}.json")
    return where


def _plan_file(root: Path, fingerprint: str, name: str):
    try:
        plan = planner.load_plan(problem_dir(root, fingerprint) / name)
    except (OSError, ValueError):
        return None
    return plan if plan.problem_fingerprint == fingerprint else None


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def table(results: list[Result], preset: str) -> list[str]:
    """Markdown: per configuration the measured and simulated step and their ratio, then which
    configuration each says is faster."""
    lines = [f"| configuration | what | graphs | collectives | measured step ms (median of {len(results[0].step_ms)}) "
             "| measured min-max | simulated step ms | measured / simulated |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        before = sum(g.collectives[0] for g in r.graphs)
        after = sum(g.collectives[1] for g in r.graphs)
        ratio = "-" if r.ratio is None else f"{r.ratio:.3f}"
        lines.append(f"| {r.config} | {WHAT[r.config]} | {len(r.graphs)} | {before} -> {after} | "
                     f"{r.measured_ms:.3f} | {min(r.step_ms):.3f}-{max(r.step_ms):.3f} | {_ms(r.simulated_ms)} | "
                     f"{ratio} |")
    lines += ["", f"Simulated on the preset {preset} (`planner.simulate` of each graph's problem and plan, summed "
                  "over the step's graphs); measured: the compiled forward and backward, the slowest rank's."]
    lines += order_lines(results)
    lines += ["", "Per graph:", "", "| configuration | graph | problem | collectives | outcome | simulated as | "
              "simulated ms |", "|---|---|---|---|---|---|---|"]
    for r in results:
        for g in r.graphs:
            lines.append(f"| {r.config} | {g.graph} | {g.fingerprint.split(':')[-1][:12] or '-'} | "
                         f"{g.collectives[0]} -> {g.collectives[1]} | {g.outcome} | {g.priced_as} | "
                         f"{_ms(g.simulated_ms)} |")
    return lines


def order_lines(results: list[Result]) -> list[str]:
    """Which configuration is fastest measured and simulated, and each pair's difference both ways."""
    priced = [r for r in results if r.simulated_ms is not None]
    if not results:
        return []
    out = ["", f"Fastest measured: {min(results, key=lambda r: r.measured_ms).config}"
           + (f"; fastest simulated: {min(priced, key=lambda r: r.simulated_ms).config}" if priced else "")]
    for i, a in enumerate(priced):
        for b in priced[i + 1:]:
            measured = a.measured_ms / b.measured_ms - 1
            predicted = a.simulated_ms / b.simulated_ms - 1
            agree = "agree" if (measured < 0) == (predicted < 0) else "DISAGREE"
            out.append(f"- {a.config} vs {b.config}: measured {measured:+.1%}, simulated {predicted:+.1%} ({agree} on "
                       "which is faster)")
    return out


# ---------------------------------------------------------------------------------------
# Contention measured in a GPU trace
# ---------------------------------------------------------------------------------------


def _is_nccl(ev: dict) -> bool:
    return "Collective name" in (ev.get("args") or {}) or str(ev.get("name", "")).startswith("nccl")


def contention_from_trace(data: dict) -> tuple[float, int, float] | None:
    """The slow-down of compute kernels that ran beside an NCCL kernel, from a GPU trace (the
    ``contention`` scenario's factor, measured): ``(factor, kernels, ms)`` or None when the trace
    has no kernel that ran both ways.

    Kernels are compared with themselves: the same kernel (name, grid and block) timed alone (no
    NCCL kernel running on its device at any point) and overlapped (an NCCL kernel running for at
    least 90% of it). The factor is the overlapped instances' time over what the same instances
    take alone (each kernel's median alone), so it weighs kernels by the time they spend
    overlapped; ``kernels`` and ``ms``: how many overlapped instances and how much time it rests
    on."""
    events = [e for e in data.get("traceEvents", []) if isinstance(e, dict) and e.get("cat") == "kernel"
              and isinstance(e.get("ts"), (int, float)) and isinstance(e.get("dur"), (int, float))
              and math.isfinite(e["ts"]) and math.isfinite(e["dur"]) and e["dur"] > 0]
    busy: dict = defaultdict(list)
    for e in events:
        if _is_nccl(e):
            busy[_device(e)].append((e["ts"], e["ts"] + e["dur"]))
    spans = {d: _merged(s) for d, s in busy.items()}
    alone: dict = defaultdict(list)
    overlapped: dict = defaultdict(list)
    for e in events:
        if _is_nccl(e):
            continue
        covered = _covered(spans.get(_device(e), []), e["ts"], e["ts"] + e["dur"])
        key = (e.get("name"), str((e.get("args") or {}).get("grid")), str((e.get("args") or {}).get("block")))
        if covered == 0:
            alone[key].append(e["dur"])
        elif covered >= 0.9 * e["dur"]:
            overlapped[key].append(e["dur"])
    slow = fast = 0.0
    kernels = 0
    for key, durs in overlapped.items():
        if key in alone:
            slow += sum(durs)
            fast += statistics.median(alone[key]) * len(durs)
            kernels += len(durs)
    return (slow / fast, kernels, slow / 1e3) if fast > 0 else None


def _device(ev: dict):
    args = ev.get("args") or {}
    return ev.get("pid"), args.get("device")


def _merged(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _covered(spans: list[tuple[float, float]], a: float, b: float) -> float:
    return sum(max(0.0, min(b, y) - max(a, x)) for x, y in spans)
