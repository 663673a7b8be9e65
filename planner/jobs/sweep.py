"""Many problems, many objectives, many machines: the torch-free half of ``bucketplan sweep``.

A sweep spec (TOML, below) names cases -- built-in workloads, ``--model`` factories or Hugging
Face configs at cluster presets and world sizes, or problem files already extracted -- and the
objectives to solve each with. The sweep extracts every case's problem once (``fxglue.run.sweep``
does the torch part, handed in as a callable), turns each (problem, objective) into one task,
runs the tasks -- one by one in this process, or on Ray -- and checks every returned plan here,
in the driver, with the independent verifier before it counts.

Layout of the output folder (one place)::

    DIR/cases/<case>/problem.json.gz    extracted once (a rerun reuses it)
    DIR/cases/<case>/greedy.json.gz     torch's greedy plan on it, recorded (when there is one)
    DIR/cases/<case>/stages.json        extraction stages: wall seconds and peak memory
    DIR/cases/<case>/<objective>-plan.json   the verified plan of each task
    DIR/rows.jsonl                      one line per finished task (the sweep resumes from it: a task
                                        counts when its row is whole, under the same settings, and
                                        has a verified plan, saved, not cut short by Ctrl-C)
    DIR/results.csv, results.md, results.png   the results table: no timings, so the same plans
                                        give the same bytes on any backend
    DIR/stages.csv, stages.md           wall time, peak memory and attempts of every stage and task
    DIR/.sweep.lock                     held by the one sweep writing the folder (removed as it ends)

Spec::

    objectives = ["count", "step"]     # defaults for every case; a case may override these
    time_limit_s = 20                  # per task
    workers_per_task = 1               # CP-SAT workers of one task (Ray reserves as many CPUs)
    seed = 0
    deterministic = true               # time_limit_s is CP-SAT's deterministic time: same plans anywhere

    [[case]]                           # the cross product of workloads x presets x ranks
    workloads = ["llama3-8b-fsdp-2", "llama3-8b-ddp-2"]
    presets = ["h100-1node"]           # default: the command line's default cluster
    ranks = [8]                        # optional world sizes
    # also: tp, pre_bucketing, apply (apply the step/count plan to the traced graph), layers,
    # collectives = ["all_gather_perf.txt"] (measured times, planner.cost.measured; relative to the spec),
    # contention = 1.19 (compute that many times slower beside a collective: Problem.contention)

    [[case]]
    model = "my_model.py:build"        # or hf_config = "config.json", hf = "org/model", graph = "step.py"
    parallel = "fsdp"
    layers = 4

    [[case]]
    problems = ["runs/*/problem.json"] # extracted problems (globs, relative to the spec file)
"""

from __future__ import annotations

import glob
import hashlib
import json
import math
import os
import re
import time
import tomllib
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Callable, Iterator

from planner.core.io import (BOOKKEEPING_MAX_BYTES, BadFileError, SchemaError, append_line, atomic_write_text, dumps,
                        folder_lock, load_plan, load_problem, read_regular_file, read_regular_text, save)
from planner.core.problem import MAX_CONTENTION
from planner.jobs.interrupted import save_plan
from planner.cost.memory import peak_bytes
from planner.jobs.tables import MEANING, pyplot, write_table

OBJECTIVES = ("count", "step", "exposure")
CASES, ROWS = "cases", "rows.jsonl"
LOCK = ".sweep.lock"  # held (flock) by the one sweep writing the folder
# gzipped: a 405B-shaped problem is 3 MB of JSON, 10x less compressed, and sweeps are committed
PROBLEM, GREEDY, STAGES = "problem.json.gz", "greedy.json.gz", "stages.json"
# where a problem file's sibling greedy plan may be, in this order (extract's, compile's, experiments')
GREEDY_SIBLINGS = ("greedy.json", "greedy-plan.json", "torch-greedy-plan.json", "torch-greedy-plan.json.gz")
RESULT_COLUMNS = ("case", "objective", "graph_nodes", "collectives", "greedy_after", "plan_after", "unbucketed_ms",
                  "greedy_ms", "plan_ms", "floor_ms", "vs_greedy_pct", "above_floor_pct", "closed_pct", "status",
                  "bound_ms", "bound_collectives", "gap_pct", "greedy_peak_gb", "plan_peak_gb", "plan_sha", "note")
RESULT_LEGEND = {
    **{c: MEANING[c] for c in ("graph_nodes", "greedy_after", "plan_after", "unbucketed_ms", "greedy_ms", "plan_ms",
                               "floor_ms", "bound_ms", "bound_collectives", "gap_pct", "greedy_peak_gb",
                               "plan_peak_gb", "note")},
    "case": "workload--cluster preset (or the problem file) of the row",
    "objective": "what the search minimized: `step` (simulated step), `count` (collectives), `exposure`",
    "collectives": MEANING["collectives_before"],
    "vs_greedy_pct": "how much faster than torch's greedy the plan is, % of greedy's step (negative: slower)",
    "above_floor_pct": "the plan's step above the floor, % of the floor",
    "closed_pct": "share of greedy's distance to the floor the plan closes, % (empty: greedy already within 1% of the "
                  "floor, or the plan no faster than greedy; the note says which)",
    "status": MEANING["status"] + "; REJECTED / FAILED / NOT EXTRACTED: no plan counted (the note says why)",
    "plan_sha": "hash of the plan's buckets (equal: the same plan)",
}
STAGE_LEGEND = {
    "case": "workload--cluster preset of the row", "stage": "what ran: tracing, scheduling, extraction, or a solve",
    "wall_s": "wall seconds", "peak_rss_gb": "peak resident memory of the process, GB",
    "attempts": "how many times it ran (a failed task runs once more)", "note": "how it ended",
}
STAGE_COLUMNS = ("case", "stage", "wall_s", "peak_rss_gb", "attempts", "note")
# closed_pct is given where torch's greedy is more than this share above the floor (the step
# objective's 32-layer target: 'where greedy is more than 1% above the floor')
CLOSED_MIN_DISTANCE = 0.01
MAX_ATTEMPTS = 2  # a task that fails or whose worker dies is retried once, then reported
HEARTBEAT_S = 30.0  # on Ray, a line at least this often while tasks run (their solver lines stay there)


class SpecError(ValueError):
    """A sweep spec that cannot be run: the message names the file, the case and the field."""


@dataclass(frozen=True)
class Settings:
    """How one task is solved; a finished row is reused by a rerun only under the same settings."""

    time_limit_s: float
    workers: int
    seed: int
    deterministic: bool


@dataclass(frozen=True)
class Case:
    """One problem of the sweep: what to extract (or which file to read) and how to solve it."""

    key: str  # the folder under DIR/cases, unique in the spec
    source: str  # "workload", "model", "hf_config", "hf", "graph" or "problem"
    name: str  # the workload name, factory spec, config path, model id or problem file
    objectives: tuple[str, ...]
    settings: Settings
    preset: str | None = None
    ranks: int | None = None
    tp: int | None = None
    parallel: str = "fsdp"
    layers: int | None = None
    pre_bucketing: bool = False
    apply: bool = False
    collectives: tuple[str, ...] = ()  # measured collective files (planner.cost.measured), resolved against the spec
    contention: float = 1.0  # the problems' (Problem.contention): compute slowed beside collectives


@dataclass(frozen=True)
class Spec:
    path: Path
    cases: tuple[Case, ...]

    def tasks(self) -> list[tuple[Case, str]]:
        return [(c, o) for c in self.cases for o in c.objectives]


# -- the spec ---------------------------------------------------------------------------------

_TOP = {"objectives", "time_limit_s", "workers_per_task", "seed", "deterministic", "case"}
_SOURCES = ("workloads", "model", "hf_config", "hf", "graph", "problems")
# what shapes a traced case: none of it applies to problem files, extracted already
_TRACE_KEYS = {"presets", "ranks", "tp", "parallel", "layers", "pre_bucketing", "apply", "collectives", "contention"}
_CASE = set(_SOURCES) | _TRACE_KEYS | {"objectives", "time_limit_s", "workers_per_task", "seed", "deterministic"}


def _typed(where: str, key: str, value, kind: str):
    """``value`` checked as TOML gives it: no coercion ("12" is not a number, true is not 1)."""
    if kind == "str" and isinstance(value, str) and value:
        return value
    if kind == "bool" and isinstance(value, bool):
        return value
    if kind == "posint" and type(value) is int and value > 0:
        return value
    if kind == "seed" and type(value) is int and 0 <= value < 2**31:
        return value
    if kind == "seconds" and type(value) in (int, float) and math.isfinite(value) and value > 0:
        return float(value)
    if kind == "contention" and type(value) in (int, float):
        from planner.cost.simulator import check_contention

        try:
            return check_contention(value)
        except ValueError:
            pass
    if kind.startswith("list:") and isinstance(value, list) and value:
        return tuple(_typed(where, key, v, kind[5:]) for v in value)
    want = {"str": "a non-empty string", "bool": "true or false", "posint": "a positive integer",
            "seed": "an integer in [0, 2^31)", "seconds": "a positive number of seconds",
            "contention": f"a slow-down factor from 1 (overlap is free) to {MAX_CONTENTION:g}"}
    what = f"a non-empty list of {want[kind[5:]].removeprefix('a ').removeprefix('an ')}s" if kind.startswith(
        "list:") else want[kind]
    raise SpecError(f"{where}: {key}: must be {what}, not {value!r}")


def _settings(where: str, table: dict, base: Settings) -> Settings:
    out = base
    if "time_limit_s" in table:
        out = replace(out, time_limit_s=_typed(where, "time_limit_s", table["time_limit_s"], "seconds"))
    if "workers_per_task" in table:
        out = replace(out, workers=_typed(where, "workers_per_task", table["workers_per_task"], "posint"))
    if "seed" in table:
        out = replace(out, seed=_typed(where, "seed", table["seed"], "seed"))
    if "deterministic" in table:
        out = replace(out, deterministic=_typed(where, "deterministic", table["deterministic"], "bool"))
    return out


def _objectives(where: str, table: dict, base: tuple[str, ...]) -> tuple[str, ...]:
    if "objectives" not in table:
        return base
    objs = _typed(where, "objectives", table["objectives"], "list:str")
    for o in objs:
        if o not in OBJECTIVES:
            raise SpecError(f"{where}: objectives: unknown objective {o!r}; choose from {', '.join(OBJECTIVES)}")
    if len(set(objs)) != len(objs):
        raise SpecError(f"{where}: objectives: {list(objs)} lists one twice")
    return objs


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._@-]+", "_", text).strip("_.") or "case"


def _problem_files(where: str, patterns: tuple[str, ...], root: Path) -> list[Path]:
    files: list[Path] = []
    for pat in patterns:
        full = pat if os.path.isabs(pat) else str(root / pat)
        found = sorted(Path(f) for f in glob.glob(full))
        if not found:
            raise SpecError(f"{where}: problems: {pat!r} matches no file")
        files += found
    return files


def _problem_key(path: Path) -> str:
    stem = path.name.removesuffix(".gz").removesuffix(".json")
    return _slug(path.parent.name if stem == "problem" else stem)


def _case_tables(where: str, table: dict, defaults: tuple[tuple[str, ...], Settings], root: Path,
                 default_preset: str | None) -> list[Case]:
    unknown = sorted(set(table) - _CASE)
    if unknown:
        raise SpecError(f"{where}: unknown field {unknown[0]!r}; a case takes {', '.join(sorted(_CASE))}")
    given = [k for k in _SOURCES if k in table]
    if len(given) != 1:
        raise SpecError(f"{where}: give exactly one of {', '.join(_SOURCES)}" + (f" (found {', '.join(given)})"
                                                                                 if given else ""))
    source = given[0]
    objectives = _objectives(where, table, defaults[0])
    settings = _settings(where, table, defaults[1])
    common = dict(objectives=objectives, settings=settings)
    if source == "problems":
        extra = sorted(set(table) & _TRACE_KEYS)
        if extra:
            raise SpecError(f"{where}: {extra[0]}: does not apply to problem files (they are extracted already)")
        files = _problem_files(where, _typed(where, "problems", table["problems"], "list:str"), root)
        return [Case(key=_problem_key(f), source="problem", name=str(f), **common) for f in files]
    presets = _typed(where, "presets", table["presets"], "list:str") if "presets" in table else (default_preset,)
    ranks = _typed(where, "ranks", table["ranks"], "list:posint") if "ranks" in table else (None,)
    tp = _typed(where, "tp", table["tp"], "posint") if "tp" in table else None
    parallel = _typed(where, "parallel", table["parallel"], "str") if "parallel" in table else "fsdp"
    layers = _typed(where, "layers", table["layers"], "posint") if "layers" in table else None
    pre = _typed(where, "pre_bucketing", table["pre_bucketing"], "bool") if "pre_bucketing" in table else False
    apply = _typed(where, "apply", table["apply"], "bool") if "apply" in table else False
    collectives = tuple(str(root / c) if not os.path.isabs(c) else c for c in
                        _typed(where, "collectives", table["collectives"], "list:str")) if "collectives" in table else ()
    for c in collectives:
        if not os.path.isfile(c):
            raise SpecError(f"{where}: collectives: no such file {c}")
    contention = _typed(where, "contention", table["contention"], "contention") if "contention" in table else 1.0
    if source == "graph":
        extra = sorted(set(table) & {"ranks", "tp", "parallel", "layers"})
        if extra:
            raise SpecError(f"{where}: {extra[0]}: a graph file carries its groups, depth and parallelism "
                            "(its get_pg_config() sizes the groups)")
        names = (_typed(where, source, table[source], "str"),)
    elif source == "workloads":
        if layers is not None or "parallel" in table:
            raise SpecError(f"{where}: {'layers' if layers is not None else 'parallel'}: built-in workloads carry "
                            "their depth and parallelism in the name")
        names = _typed(where, "workloads", table["workloads"], "list:str")
    else:
        names = (_typed(where, source, table[source], "str"),)
    if source == "graph" and not (root / names[0]).is_file() and not os.path.isfile(names[0]):
        raise SpecError(f"{where}: graph: no such file {names[0]}")
    out = []
    for name in names:
        label = (name if source == "workloads" else f"graph-{Path(name).stem}" if source == "graph"
                 else f"{source}-{Path(name).stem if source != 'hf' else name}-{parallel}")
        for preset in presets:
            for r in ranks:
                key = _slug(label + (f"@{layers}" if layers else "") + (f"--{preset}" if preset else "")
                            + (f"@{r}" if r else "") + (f"-tp{tp}" if tp else "") + ("-pre" if pre else "")
                            + (f"-contention{contention:g}" if contention != 1.0 else ""))
                path_like = source in ("model", "hf_config", "graph") and not os.path.isabs(name.split(":")[0])
                resolved = str(root / name) if path_like and (root / name.split(":")[0]).exists() else name
                out.append(Case(key=key, source="workload" if source == "workloads" else source, name=resolved,
                                preset=preset, ranks=r, tp=tp, parallel=parallel, layers=layers, pre_bucketing=pre,
                                apply=apply, collectives=collectives, contention=contention, **common))
    return out


def load_spec(path: str | os.PathLike, *, default_preset: str | None = None) -> Spec:
    """A sweep spec read and checked whole before any work (``SpecError`` names the offending item)."""
    p = Path(path)
    try:
        text = read_regular_text(p, BOOKKEEPING_MAX_BYTES, "sweep spec", missing_ok=True)
        if text is None:
            raise SpecError(f"{p}: no such spec file")
        data = tomllib.loads(text)
    except BadFileError as e:
        raise SpecError(str(e)) from None
    except tomllib.TOMLDecodeError as e:
        raise SpecError(f"{p}: not valid TOML: {e}") from None
    unknown = sorted(set(data) - _TOP)
    if unknown:
        raise SpecError(f"{p}: unknown top-level field {unknown[0]!r}; the spec takes {', '.join(sorted(_TOP))}")
    base = Settings(time_limit_s=30.0, workers=1, seed=0, deterministic=True)
    defaults = (_objectives(str(p), data, ("step",)), _settings(str(p), data, base))
    tables = data.get("case")
    if not isinstance(tables, list) or not tables or not all(isinstance(t, dict) for t in tables):
        raise SpecError(f"{p}: no [[case]] tables: a sweep needs at least one case")
    cases: list[Case] = []
    for i, table in enumerate(tables, 1):
        cases += _case_tables(f"{p}: [[case]] {i}", table, defaults, p.parent, default_preset)
    seen: dict[str, Case] = {}
    for c in cases:
        if c.key in seen:
            raise SpecError(f"{p}: case {c.key!r} is listed twice ({seen[c.key].name} and {c.name})")
        seen[c.key] = c
    return Spec(path=p, cases=tuple(cases))


# -- peak memory of a stage ---------------------------------------------------------------------

@contextmanager
def peak_memory() -> Iterator[dict]:
    """The process's peak resident memory during the block, in GB (``out["peak_rss_gb"]``).

    Linux resets the high-water mark when 5 is written to /proc/self/clear_refs; without that
    (another system) the figure is the process's peak so far, an upper bound of the stage's."""
    out: dict = {}
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass
    try:
        yield out
    finally:
        out["peak_rss_gb"] = round(_peak_rss_bytes() / 1e9, 3)


def _peak_rss_bytes() -> int:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# -- one task -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Task:
    """One (problem, objective) solve; carries the problem as JSON so it runs anywhere."""

    case: str
    objective: str
    problem_json: str
    greedy_json: str | None
    settings: Settings


def run_task(task: Task, progress: Callable[[str], None] | None = None) -> dict:
    """Solve one task (in whatever process runs it) and return the plan as JSON with the figures.

    Torch-free and self-contained, so a Ray worker needs only this package. The driver verifies
    the plan again before it counts (the worker's answer is not trusted). ``progress``: the
    solver's incumbent/bound lines (in this process; a Ray worker's stay there)."""
    from planner.jobs.plan_dir import start_plan
    from planner.core.problem import Plan, Problem
    from planner.search.planning import Budget, PlanSpec, plan

    with peak_memory() as mem:
        t0 = time.perf_counter()
        problem = Problem.model_validate_json(task.problem_json)
        greedy = Plan.model_validate_json(task.greedy_json) if task.greedy_json else None
        start, note = start_plan(problem, greedy)
        s = task.settings
        spec = PlanSpec(objective=task.objective, budget=Budget(s.time_limit_s, s.deterministic), workers=s.workers,
                        seed=s.seed, hint=start, fallback_plans=(start,) if start is not None else ())
        result = plan(problem, spec, search_progress=progress)
    return {"plan_json": dumps(result.plan) if result.plan is not None else None, "status": result.status,
            "objective_value": result.objective, "bound": result.bound, "gap": result.gap,
            "wall_s": round(time.perf_counter() - t0, 2), "peak_rss_gb": mem["peak_rss_gb"],
            "wall_limit_hit": bool(result.stats.get("wall_limit_hit")),
            "interrupted": bool(result.stats.get("interrupted")), "start_note": note,
            "start_json": dumps(start) if start is not None and start is not greedy else None}


# -- running many tasks ---------------------------------------------------------------------------

Done = Callable[[Task, dict, int], None]  # (task, result or {"error": ...}, attempts)


def _error_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[-1] if text else ''}"[:300]


def run_sequential(tasks: list[Task], done: Done, say: Callable[[str], None]) -> None:
    """Each task in this process, one after the other; a failure is retried once, then reported."""
    for task in tasks:
        for attempt in range(1, MAX_ATTEMPTS + 1):
            try:
                result = run_task(task, progress=lambda msg, t=task: say(f"  {t.case} {t.objective}: {msg}"))
            except Exception as e:  # noqa: BLE001 - reported in the table, never dropped
                if attempt < MAX_ATTEMPTS:
                    say(f"{task.case} {task.objective}: failed ({_error_line(e)}); retrying once")
                    continue
                result = {"error": _error_line(e)}
            done(task, result, attempt)
            if result.get("interrupted"):
                raise KeyboardInterrupt  # the interrupted solve's best verified plan is kept; stop here
            break


def ray_available() -> bool:
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


def check_cpus(tasks: list[Task], cpus: int, where: str) -> None:
    """``SpecError`` when a task reserves more CPUs than the cluster has: Ray would keep it
    pending forever, waiting for a node that never comes."""
    worst = max(tasks, key=lambda t: t.settings.workers, default=None)
    if worst is not None and worst.settings.workers > cpus:
        raise SpecError(f"case {worst.case}: workers_per_task = {worst.settings.workers} but {where} has {cpus} "
                        f"CPU(s); Ray could never start the task (lower workers_per_task, or --cpus)")


def run_on_ray(tasks: list[Task], done: Done, say: Callable[[str], None], *, address: str | None = None,
               cpus: int | None = None) -> None:
    """Every task as a Ray task reserving ``workers`` CPUs (so tasks x workers <= cores); a task
    that raises or whose worker dies is submitted once more, then reported.

    ``address`` None: a Ray instance on this machine with ``cpus`` CPUs (default all), shut
    down at the end; otherwise the cluster there, which gets this package with each task."""
    import ray

    if address is None:
        n_cpus = cpus or os.cpu_count() or 1
        check_cpus(tasks, n_cpus, "the local Ray instance")  # before starting Ray: it is known here
        # worker_niceness 0: Ray runs its workers at nice 15, so any other busy process on the
        # machine starved the solves (a 3 s deterministic step solve took 69 s next to two busy
        # loops, 5.9 s outside Ray), its wall-clock guard cut them short, and the table differed
        # from the one-by-one run's
        # Ray's notice that token authentication is on for the instance it starts here (Ray's
        # default, kept) went to stderr between our progress lines on every sweep: the instance
        # lives on 127.0.0.1 for this run only, so the notice is noise there, and it is hushed
        # for that one call
        import logging

        notice = logging.getLogger("ray._private.authentication.authentication_token_setup")
        level = notice.level
        notice.setLevel(logging.ERROR)
        try:
            ray.init(num_cpus=n_cpus, include_dashboard=False, log_to_driver=False, configure_logging=False,
                     _system_config={"worker_niceness": 0})
        finally:
            notice.setLevel(level)
    else:
        ray.init(address=address, log_to_driver=False, configure_logging=False,
                 runtime_env={"py_modules": [str(Path(__file__).resolve().parent)]})
    try:
        if address is not None:
            check_cpus(tasks, int(ray.cluster_resources().get("CPU", 0)), f"the Ray cluster at {address}")
        remote = ray.remote(run_task)
        pending: dict = {}

        def submit(task: Task, attempt: int) -> None:
            ref = remote.options(num_cpus=task.settings.workers, max_retries=0, name=f"solve:{task.case}:"
                                 f"{task.objective}").remote(task)
            pending[ref] = (task, attempt)

        for t in tasks:
            submit(t, 1)
        t0 = time.perf_counter()
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=HEARTBEAT_S)
            if not ready:  # a long task: say the sweep is alive, with what is in flight
                say(f"{len(pending)} task(s) in flight after {time.perf_counter() - t0:.0f}s: "
                    + ", ".join(sorted({f"{t.case} {t.objective}" for t, _ in pending.values()})[:4])
                    + (" ..." if len(pending) > 4 else ""))
                continue
            task, attempt = pending.pop(ready[0])
            try:
                result = ray.get(ready[0])
            except ray.exceptions.RayError as e:
                if attempt < MAX_ATTEMPTS:
                    say(f"{task.case} {task.objective}: failed ({_error_line(e)}); retrying once")
                    submit(task, attempt + 1)
                    continue
                result = {"error": _error_line(e)}
            done(task, result, attempt)
    finally:
        ray.shutdown()


# -- the sweep ---------------------------------------------------------------------------------

Extract = Callable[[Case, Path, Callable[[str], None]], None]
Apply = Callable[[Case, Path, Path, str, Callable[[str], None]], None]  # (case, folder, plan file, plan sha, say)


def case_dir(out: Path, case: Case) -> Path:
    return out / CASES / case.key


def _copy_problem_case(case: Case, folder: Path) -> None:
    """A problem-file case: the problem (and a sibling greedy plan) copied into the case folder."""
    src = Path(case.name)
    problem = load_problem(src)
    greedy = None
    for name in GREEDY_SIBLINGS:
        if (src.parent / name).is_file():
            greedy = load_plan(src.parent / name)
            break
    if greedy is not None:
        save(greedy, folder / GREEDY)
    save(problem, folder / PROBLEM)
    atomic_write_text(folder / STAGES, json.dumps({"stages": [], "note": f"read from {src}"}))


def plan_sha(plan) -> str:
    """The plan's content (its buckets), hashed: equal for the same plan however it was found."""
    buckets = [[list(b.members), b.start, b.wait] for b in plan.buckets]
    return hashlib.sha256(json.dumps(buckets).encode()).hexdigest()[:12]


def _result_row(case: Case, objective: str, problem, greedy, result: dict) -> dict:
    """The task's result as a table row, after the driver's own check of the plan."""
    from planner.cost.bounds import step_floor
    from planner.core.problem import Plan, collectives_after
    from planner.cost.simulator import simulate
    from planner.rules.verifier import check

    unbucketed = simulate(problem).step_ms
    floor = step_floor(problem).floor_ms
    row = {"case": case.key, "objective": objective, "nodes": problem.n_scheduled,
           "collectives": len(problem.collectives),
           "unbucketed_ms": round(unbucketed, 3), "floor_ms": round(floor, 3)}
    # torch's greedy as recorded, or the repair the task started from where it breaks a rule
    # (checked here too: the worker's answer is not trusted)
    repaired = Plan.model_validate_json(result["start_json"]) if result.get("start_json") else None
    for baseline in (greedy, repaired):
        if baseline is not None and baseline.problem_fingerprint == problem.fingerprint \
                and check(problem, baseline).feasible:
            row.update(greedy_after=collectives_after(problem, baseline),
                       greedy_ms=round(simulate(problem, baseline).step_ms, 3),
                       greedy_peak_gb=round(peak_bytes(problem, baseline) / 1e9, 3))
            break
    notes = [result.get("start_note") or ""]
    if "error" in result:
        return {**row, "status": "FAILED", "note": result["error"]}
    if not result.get("plan_json"):
        return {**row, "status": result.get("status", ""), "note": "; ".join(x for x in (*notes, "no plan") if x)}
    plan = Plan.model_validate_json(result["plan_json"])
    report = check(problem, plan)  # the policy every task is solved under: the default
    if not report.feasible:
        return {**row, "status": "REJECTED", "note": f"the worker's plan fails verification: {report.violations[0]}"}
    step = simulate(problem, plan).step_ms
    bound = result.get("bound")
    unit = " ms" if objective == "step" else " collectives" if objective == "count" else ""
    if result.get("wall_limit_hit"):
        notes.append("stopped by the wall clock")
    if result.get("interrupted"):
        notes.append("interrupted")
    row.update(plan_after=collectives_after(problem, plan), plan_ms=round(step, 3), status=result.get("status"),
               plan_peak_gb=round(peak_bytes(problem, plan) / 1e9, 3),
               bound=None if bound is None else f"{bound:.3f}{unit}" if objective == "step" else f"{bound:g}{unit}",
               gap_pct=None if result.get("gap") is None else round(100 * result["gap"], 2), plan_sha=plan_sha(plan),
               above_floor_pct=round(100 * (step - floor) / floor, 2) if floor > 0 else None,
               vs_greedy_pct=(round(100 * (row["greedy_ms"] - step) / row["greedy_ms"], 2)
                              if row.get("greedy_ms") else None),
               note="; ".join(x for x in notes if x))
    row["_plan"] = plan
    return row


def _closed(row: dict) -> tuple[float | None, str]:
    """(closed_pct, why it is empty) of a row: see ``closed_pct``."""
    greedy, plan, floor = row.get("greedy_ms"), row.get("plan_ms"), row.get("floor_ms")
    if greedy is None or plan is None or floor is None:
        return None, ""
    if greedy <= floor * (1 + CLOSED_MIN_DISTANCE):
        return None, "greedy already at the floor"
    if plan > greedy:
        return None, "slower than greedy"
    return round(100 * (greedy - plan) / (greedy - floor), 1), ""


def closed_pct(row: dict) -> float | None:
    """How much of torch greedy's distance to the step floor the plan closes, in %:
    100 * (greedy - plan) / (greedy - floor) (100: the plan reaches the floor); None where greedy
    is within CLOSED_MIN_DISTANCE of the floor (a share of a sliver is noise: -208.9% once said
    only that), where the plan is slower than greedy (a share is no measure of that; vs_greedy_pct
    is), or where a figure is missing. ``closed_note`` says which."""
    return _closed(row)[0]


def closed_note(row: dict) -> str:
    """Why ``closed_pct`` is empty on a row with figures ("" when it is not)."""
    return _closed(row)[1]


def _bound_columns(row: dict) -> None:
    """``bound_ms`` / ``bound_collectives`` from the row's "39.838 ms" / "25 collectives" bound text
    (one unit per column; rows.jsonl keeps the text, so rows of any age read the same)."""
    row["bound_ms"] = row["bound_collectives"] = None
    value, _, unit = str(row.get("bound") or "").partition(" ")
    try:
        number = float(value)
    except ValueError:
        return
    if unit == "ms":
        row["bound_ms"] = number
    elif unit == "collectives":
        row["bound_collectives"] = round(number)


def _usable_row(line: bytes):
    """The row of one line of rows.jsonl, or None when it is not one (not UTF-8, not JSON, not an
    object naming its case, objective and status)."""
    try:
        row = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not (isinstance(row, dict) and all(isinstance(row.get(k), str) for k in ("case", "objective", "status"))):
        return None
    return row


def load_rows(path: Path, say: Callable[[str], None] = lambda m: None) -> list[dict]:
    """The rows of ``rows.jsonl``, and the file made safe to append to: a last line without its
    newline (a crash mid-write) would swallow the next row appended, so it is dropped, with any
    line that is no row, and the file rewritten atomically without them. Their tasks run again."""
    data = read_regular_file(path, BOOKKEEPING_MAX_BYTES, "sweep rows file", missing_ok=True)
    if data is None:
        return []
    lines = data.split(b"\n")
    cut = lines.pop()  # b"" when the file ends with its newline; else a line cut short
    rows = [r for line in lines if (r := _usable_row(line)) is not None]
    dropped = len(lines) - len(rows) + (cut != b"")
    if dropped:
        say(f"{path}: dropped {dropped} line(s) that are not whole rows (a crash mid-write?); their tasks run again")
        atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows))
    return rows


def _interrupted(row: dict) -> bool:
    # rows written before the field existed say it in their note
    return bool(row.get("interrupted")) or "interrupted" in str(row.get("note", "")).split("; ")


@dataclass
class SweepReport:
    results: list[dict] = field(default_factory=list)
    stages: list[dict] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


class _Ledger:
    """What the sweep knows: the rows finished (``rows.jsonl``, in spec order in the tables), the
    problems loaded once, and the progress line after each task."""

    def __init__(self, spec: Spec, out: Path, unextracted: dict[str, str], say: Callable[[str], None]):
        self.spec, self.out, self.say = spec, out, say
        self.by_key = {c.key: c for c in spec.cases}
        self.rows = {(r["case"], r["objective"]): r for r in load_rows(out / ROWS, say) if self._finished(r)}
        for case, objective in spec.tasks():
            if case.key in unextracted:  # in the table, saying why; tried again by the next run
                self.rows[(case.key, objective)] = {"case": case.key, "objective": objective,
                                                    "status": "NOT EXTRACTED", "note": unextracted[case.key]}
        self._problems: dict[str, tuple] = {}
        self.finished = self.failed = 0
        self.best: tuple[float, str] | None = None

    def _finished(self, row: dict) -> bool:
        """A row a rerun keeps: a task of this spec, solved under its settings, to a verified plan
        that is still on disk as the row says, and not cut short by Ctrl-C. Anything else
        (failed, rejected, no plan, interrupted, plan lost) is solved again."""
        case = self.by_key.get(row["case"])
        if case is None or row["objective"] not in case.objectives or row.get("settings") != asdict(case.settings) \
                or _interrupted(row):
            return False
        if row["status"] == "FAILED" or row.get("plan_ms") is None:
            return False
        try:
            plan = load_plan(case_dir(self.out, case) / f"{row['objective']}-plan.json")
        except SchemaError:
            return False
        return plan_sha(plan) == row.get("plan_sha")

    def loaded(self, key: str):
        if key not in self._problems:
            folder = case_dir(self.out, self.by_key[key])
            greedy = load_plan(folder / GREEDY) if (folder / GREEDY).exists() else None
            self._problems[key] = (load_problem(folder / PROBLEM), greedy)
        return self._problems[key]

    def todo(self) -> list[Task]:
        tasks = []
        for case, objective in self.spec.tasks():
            if (case.key, objective) not in self.rows:
                problem, greedy = self.loaded(case.key)
                tasks.append(Task(case.key, objective, dumps(problem),
                                  dumps(greedy) if greedy is not None else None, case.settings))
        return tasks

    def done(self, task: Task, result: dict, attempts: int, *, left: int) -> None:
        case = self.by_key[task.case]
        problem, greedy = self.loaded(task.case)
        row = _result_row(case, task.objective, problem, greedy, result)
        plan = row.pop("_plan", None)
        if plan is not None:  # a cut-short plan goes beside a finished one, never over it
            save_plan(plan, case_dir(self.out, case) / f"{task.objective}-plan.json", problem)
        row.update(settings=asdict(case.settings), attempts=attempts, wall_s=result.get("wall_s"),
                   peak_rss_gb=result.get("peak_rss_gb"), interrupted=bool(result.get("interrupted")))
        append_line(self.out / ROWS, json.dumps(row), "sweep rows file")
        self.rows[(task.case, task.objective)] = row
        self.finished += 1
        self.failed += plan is None
        if row.get("vs_greedy_pct") is not None and (self.best is None or row["vs_greedy_pct"] > self.best[0]):
            self.best = (row["vs_greedy_pct"], f"{task.case} {task.objective}")
        n_done = sum(r.get("plan_ms") is not None for r in self.rows.values())
        figures = (f"{row['collectives']} -> {row['plan_after']} collectives, step {row['plan_ms']} ms (greedy "
                   f"{row.get('greedy_ms')}, floor {row['floor_ms']})" if plan is not None else row.get("note", ""))
        lead = f"; best so far {self.best[0]:+.1f}% vs greedy ({self.best[1]})" if self.best else ""
        self.say(f"[{n_done}/{len(self.spec.tasks())} done, {left} running, {self.failed} failed] {task.case} "
                 f"{task.objective}: {row.get('status')}: {figures}{lead}")
        self.write_tables()

    def write_tables(self) -> SweepReport:
        order = [self.rows[(c.key, o)] for c, o in self.spec.tasks() if (c.key, o) in self.rows]
        for r in order:  # rows written before the column existed
            if "nodes" not in r and r.get("status") != "NOT EXTRACTED":
                r["nodes"] = self.loaded(r["case"])[0].n_scheduled
            r["graph_nodes"] = r.get("nodes")
            r["closed_pct"] = closed_pct(r)
            _bound_columns(r)
        shown = [{**r, "note": "; ".join(x for x in (r.get("note"), closed_note(r)) if x)} for r in order]
        stage_rows = [{"case": c.key, **st} for c in self.spec.cases for st in _stages(self.out, c)]
        stage_rows += [{"case": r["case"], "stage": f"solve {r['objective']}", "wall_s": r.get("wall_s"),
                        "peak_rss_gb": r.get("peak_rss_gb"), "attempts": r.get("attempts"), "note": r.get("status")}
                       for r in order if r.get("status") != "NOT EXTRACTED"]
        name = self.spec.path.name
        write_table(self.out, "results", RESULT_COLUMNS, shown, legend=RESULT_LEGEND,
                    title=f"Sweep {name}: simulated step per case and objective (every plan verified by the driver)")
        write_table(self.out, "stages", STAGE_COLUMNS, stage_rows, legend=STAGE_LEGEND,
                    title=f"Sweep {name}: wall time and peak memory of each stage")
        if any(r.get("plan_ms") is not None for r in order):
            sweep_plot(self.out, order)
        return SweepReport(order, stage_rows, [f"{r['case']} {r['objective']}" for r in order
                                               if r.get("plan_ms") is None])


def run_sweep(spec: Spec, out: str | os.PathLike, *, extract: Extract | None, apply: Apply | None = None,
              ray: bool | None = None, address: str | None = None, cpus: int | None = None,
              say: Callable[[str], None] = lambda m: None) -> SweepReport:
    """Extract every case once, solve every (case, objective) not already in ``rows.jsonl`` under the
    same settings, verify and tabulate. ``ray`` None: on Ray when it is installed, else one by one
    here; ``extract`` (fxglue.run.sweep.extract_case) is needed only for cases that are not problem files;
    ``apply`` (fxglue.run.sweep.apply_case) applies the plans of cases with ``apply = true``. One sweep
    writes a folder at a time (``LOCK``; another is refused at once with ``OutputFolderError``): two
    would solve every task twice and append the same rows."""
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # -o under a file, a read-only parent
        raise BadFileError(f"{out}: cannot make the output folder ({e.strerror})") from None
    with folder_lock(out / LOCK, out):
        return _sweep(spec, out, extract=extract, apply=apply, ray=ray, address=address, cpus=cpus, say=say)


def _sweep(spec: Spec, out: Path, *, extract: Extract | None, apply: Apply | None, ray: bool | None,
           address: str | None, cpus: int | None, say: Callable[[str], None]) -> SweepReport:
    ledger = _Ledger(spec, out, _extract_all(spec, out, extract, say), say)
    todo = ledger.todo()
    use_ray = ray_available() if ray is None else ray
    cores = cpus or os.cpu_count() or 1
    # tasks that can run at once: Ray reserves workers_per_task CPUs for each
    slots = max(1, cores // max(1, min((t.settings.workers for t in todo), default=1))) if use_ray else 1
    say(f"{len(spec.cases)} case(s), {len(spec.tasks())} task(s), {len(todo)} to solve "
        + (f"on Ray ({address or f'local, {cores} CPUs'})" if use_ray else "one by one in this process"))

    def done(task: Task, result: dict, attempts: int) -> None:
        ledger.done(task, result, attempts, left=min(slots, len(todo) - ledger.finished - 1))

    if todo:
        (partial(run_on_ray, address=address, cpus=cpus) if use_ray else run_sequential)(todo, done, say)
    _apply_all(spec, out, ledger.rows, apply, say)
    return ledger.write_tables()


def read_stages(path: Path) -> dict | None:
    """A case's stages file as written (``{"stages": [...], "running": ...}``); None when there is
    none or it is not such a JSON object (it is informative). ``BadFileError`` when it is no
    regular file."""
    text = read_regular_text(path, BOOKKEEPING_MAX_BYTES, "stages file", missing_ok=True)
    try:
        data = json.loads(text) if text is not None else None
    except ValueError:
        return None
    return data if isinstance(data, dict) and isinstance(data.get("stages"), list) else None


def stage_list(path: Path) -> list[dict]:
    """The stages a stages file records ([] when there is none or it is no such file's JSON)."""
    data = read_stages(path)
    return [s for s in data["stages"] if isinstance(s, dict)] if data else []


def _stages(out: Path, case: Case) -> list[dict]:
    return stage_list(case_dir(out, case) / STAGES)


def _extract_all(spec: Spec, out: Path, extract: Extract | None, say: Callable[[str], None]) -> dict[str, str]:
    """Every case's problem, extracted once; {case: why} for those that could not be (they stay
    in the table as NOT EXTRACTED and are tried again by the next run)."""
    failed: dict[str, str] = {}
    for i, case in enumerate(spec.cases, 1):
        folder = case_dir(out, case)
        if (folder / PROBLEM).exists():
            continue
        say(f"[case {i}/{len(spec.cases)}] {case.key}: extracting")
        try:
            if case.source == "problem":
                _copy_problem_case(case, folder)
            elif extract is None:
                raise SpecError(f"case {case.key}: extracting it needs torch (fxglue)")
            else:
                extract(case, folder, say)
        except (KeyboardInterrupt, SpecError):
            raise
        except Exception as e:  # noqa: BLE001 - one case's failure is a row of the table, not the sweep's end
            failed[case.key] = f"extraction failed: {_error_line(e)}"
            say(f"  {case.key}: {failed[case.key]}")
    return failed


def _apply_all(spec: Spec, out: Path, rows: dict, apply: Apply | None, say: Callable[[str], None]) -> None:
    """For cases with ``apply = true``: the fastest verified plan applied to the re-traced graph,
    once per plan (a rerun skips a plan already applied)."""
    for case in spec.cases:
        mine = [rows[(case.key, o)] for o in case.objectives if rows.get((case.key, o), {}).get("plan_ms") is not None]
        if not case.apply or not mine or apply is None:
            continue
        best = min(mine, key=lambda r: r["plan_ms"])
        tag = f"apply {best['objective']}: "
        if any(str(st.get("stage")).startswith(tag) and best["plan_sha"] in str(st.get("note"))
               for st in _stages(out, case)):
            continue
        say(f"{case.key}: applying the {best['objective']} plan to the traced graph")
        try:
            apply(case, case_dir(out, case), case_dir(out, case) / f"{best['objective']}-plan.json", best["plan_sha"],
                  say)
        except KeyboardInterrupt:
            raise
        except Exception as e:  # noqa: BLE001 - reported in the stages table
            say(f"  {case.key}: apply failed: {_error_line(e)}")
            stages = _stages(out, case) + [{"stage": f"{tag}failed", "wall_s": None, "peak_rss_gb": None,
                                            "note": _error_line(e)}]
            atomic_write_text(case_dir(out, case) / STAGES, json.dumps({"stages": stages, "running": None}))



def sweep_plot(out: Path, rows: list[dict]) -> None:
    """A sweep's ``results.png``: each case's simulated step relative to its floor (unbucketed,
    torch's greedy, each objective), written atomically."""
    plt = pyplot()
    cases = list(dict.fromkeys(r["case"] for r in rows))
    objectives = list(dict.fromkeys(r["objective"] for r in rows))
    series = {"unbucketed": "unbucketed_ms", "torch greedy": "greedy_ms"}
    fig, ax = plt.subplots(figsize=(max(7.0, 1.1 * len(cases)), 4.6))
    labels = list(series) + [f"cpsat ({o})" for o in objectives]
    width = 0.8 / len(labels)
    for k, label in enumerate(labels):
        ys = []
        for c in cases:
            mine = [r for r in rows if r["case"] == c]
            r = next((x for x in mine if f"cpsat ({x['objective']})" == label), None) if label.startswith(
                "cpsat") else mine[0]
            key = "plan_ms" if label.startswith("cpsat") else series[label]
            v, floor = (r or {}).get(key), (r or {}).get("floor_ms")
            ys.append(100 * (v - floor) / floor if v is not None and floor else 0.0)
        ax.bar([i + k * width for i in range(len(cases))], ys, width, label=label)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(cases))], cases, rotation=25, ha="right", fontsize=7)
    ax.set_ylabel("simulated step above the floor (% of floor)")
    ax.set_title("Sweep: distance to the step floor per case (lower is better)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    tmp = out / ".results.png.tmp.png"
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, out / "results.png")
