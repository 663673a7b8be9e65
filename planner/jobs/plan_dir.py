"""A plan directory: problems recorded from ``torch.compile`` (``fxglue.run.compile.record``),
solved here offline (``bucketplan solve-dir``), used by ``fxglue.run.compile.use``.

Layout (one place; the torch side imports it)::

    plan_dir/index.jsonl                 one line per graph and rank that record saw
    plan_dir/<hex fingerprint>/problem.json
    plan_dir/<hex fingerprint>/greedy.json  torch's greedy plan, recorded
    plan_dir/<hex fingerprint>/plan.json    the solved plan (verified; written atomically)
    plan_dir/summary.csv, summary.md        one row per problem with a plan, rebuilt from the plans
    plan_dir/.solve-dir.lock                held (flock) by the one solve_dir running on the directory, while it runs

A plan counts as solved when it is a regular file that loads, is for its folder's problem and was
not cut short by Ctrl-C (``params.interrupted``); anything else is solved again. Each plan
carries its own summary row (``params.solve_dir``), written with it in one atomic rename, so
the summary is rebuilt from the plans on disk and no interrupt can separate the two.

Torch-free: solving needs no torch, so the directory can be copied to a machine without it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import stat
import signal
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterator

from planner.core.io import (BOOKKEEPING_MAX_BYTES, BadFileError, OutputFolderError, SchemaError, append_line,
                        folder_lock, load_plan, load_problem,
                        read_regular_text)
import planner.core.arguments as arguments
from planner.jobs.interrupted import save_plan
from planner.search.result import mark_interrupted
from planner.core.options import SolveOptions
from planner.jobs.tables import MEANING, TableStyle, write_table

INDEX, LOCK = "index.jsonl", ".solve-dir.lock"
PROBLEM, GREEDY, PLAN = "problem.json", "greedy.json", "plan.json"
SUMMARY_COLUMNS = ("problem", "graphs", "collectives", "greedy_after", "plan_after", "unbucketed_ms", "greedy_ms",
                   "plan_ms", "floor_ms", "status", "bound_ms", "gap_pct", "unbucketed_peak_gb", "greedy_peak_gb",
                   "plan_peak_gb", "wall_s", "note")
SUMMARY_LEGEND = {
    **{c: MEANING[c] for c in ("greedy_after", "plan_after", "unbucketed_ms", "greedy_ms", "plan_ms", "floor_ms",
                               "status", "bound_ms", "gap_pct", "greedy_peak_gb", "plan_peak_gb", "note")},
    "problem": "the problem's fingerprint (its folder under the plan directory), cut to 12 characters",
    "graphs": "the compiled graphs (and ranks) that recorded this problem",
    "collectives": MEANING["collectives_before"], "unbucketed_peak_gb": "peak memory with nothing merged, GB",
    "wall_s": "wall seconds of the solve",
}
SUMMARY_PARAM = "solve_dir"  # the plan's params key holding its summary row
_HEX = re.compile(r"[0-9a-f]{8,128}")


class PlanDirError(BadFileError):
    """The plan directory cannot be used as asked (a bookkeeping file or problem folder that is
    not what it must be, or another solve-dir running on it); the one-line message names it."""


def problem_dir(plan_dir: str | os.PathLike, fingerprint: str) -> Path:
    """Where a problem with this fingerprint lives (the hex digest, without the ``sha256:``).
    ``PlanDirError`` when the fingerprint is no hex digest (it must not name a path elsewhere)
    or something other than a folder is in the way."""
    digest = fingerprint_digest(fingerprint)
    if digest is None:
        raise PlanDirError(f"{fingerprint!r}: not a problem fingerprint (sha256:<hex digest>)")
    path = Path(plan_dir) / digest
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return path
    except OSError as e:
        raise PlanDirError(f"{path}: cannot use it as a problem folder ({e.strerror})") from None
    if not stat.S_ISDIR(mode):
        raise PlanDirError(f"{path}: exists and is not a folder; it is where this problem's files go")
    return path


def read_index(plan_dir: str | os.PathLike) -> list[dict]:
    """The graphs ``record`` saw, one dict per graph and rank. A line that does not parse or
    whose graph, rank or fingerprint has the wrong type is skipped: the index is informative,
    the problems are the record. An index that is no regular file raises ``BadFileError``."""
    text = read_regular_text(Path(plan_dir) / INDEX, BOOKKEEPING_MAX_BYTES, "plan index", missing_ok=True)
    out = []
    for line in (text or "").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if (isinstance(entry, dict) and isinstance(entry.get("fingerprint"), str)
                and isinstance(entry.get("graph", ""), str) and type(entry.get("rank", 0)) is int):
            out.append(entry)
    return out


def append_index(plan_dir: str | os.PathLike, entry: dict) -> None:
    """One line for ``entry``; ``BadFileError`` when the index is a directory, FIFO or device."""
    # one write of one short line with O_APPEND: whole lines even when ranks append at once
    append_line(Path(plan_dir) / INDEX, json.dumps(entry, sort_keys=True), "plan index")


@contextmanager
def locked(plan_dir: str | os.PathLike) -> Iterator[None]:
    """Hold the directory's solve-dir lock for the block (``planner.core.io.folder_lock``), or raise
    ``PlanDirError`` at once when another process holds it: two runs would solve every problem
    twice and race on the summary."""
    path = Path(plan_dir) / LOCK
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(folder_lock(path, plan_dir))
        except OutputFolderError as e:
            if e.errno == errno.EAGAIN:
                raise PlanDirError(f"{plan_dir}: another solve-dir is running on this directory; wait for it to "
                                   "finish (one solve-dir per directory at a time)") from None
            raise PlanDirError(f"{path}: cannot open the solve-dir lock: {e.strerror}") from None
        yield


def recorded_problems(plan_dir: str | os.PathLike) -> list[Path]:
    """Every problem folder of the directory, sorted (a folder counts once problem.json exists,
    as anything: a dangling or looping symlink there is a problem that fails to load, reported,
    not one dropped unseen)."""
    return sorted(p for p in Path(plan_dir).glob("*/") if os.path.lexists(p / PROBLEM))


POSITIONS = ("anchored", "free")


@dataclass(frozen=True)
class SolveDirOptions:
    """How ``solve_dir`` solves each problem, checked once when built: the ``objective`` and
    ``time_limit_s`` of each solve, ``jobs`` problems at once in worker processes, each with
    ``workers`` CP-SAT workers (None: the machine's cores shared among the jobs), CP-SAT's
    ``seed``, and ``positions`` ("free": each step solve ends with the positioned search within the
    higher of torch's greedy plan's and the unbucketed schedule's peak memory)."""

    objective: str = "step"
    time_limit_s: float = 60.0
    jobs: int = 1
    workers: int | None = None
    seed: int = 0
    positions: str = "anchored"

    def __post_init__(self) -> None:
        SolveOptions(time_limit_s=self.time_limit_s, objective=self.objective, seed=self.seed)  # their rules
        arguments.positive_integer(self.jobs, "jobs")
        if self.workers is not None:
            arguments.worker_count(self.workers, "workers")
        if self.positions not in POSITIONS:
            raise arguments.ArgumentError("positions", f"unknown positions {self.positions!r}; use one of {POSITIONS}")
        if self.positions == "free" and self.objective != "step":  # as the command line's rule
            raise arguments.ArgumentError("positions", "positions free needs objective step (positions are chosen "
                                          "by the simulated step)")

    def spec(self, start=None, problem=None):
        """The ``planner.plan`` spec of one problem's solve, from torch's greedy plan ``start``
        (repaired if needed; None: none recorded): CP-SAT's hint and a plan the result is never
        worse than; with free positions also a start of the positioned search, and the peak it
        is held to (the higher of its and the unbucketed schedule's), and, on a small ``problem``
        (``planning.proof_seconds``), a share of the time for CP-SAT over the plan's candidate space."""
        from planner.search.planning import Budget, PlanSpec, proof_seconds

        prove = proof_seconds(problem, self.time_limit_s) if self.positions == "free" and problem is not None else None
        return PlanSpec(mode=self.positions, objective=self.objective, budget=Budget(self.time_limit_s - (prove or 0.0)),
                        seed=self.seed, workers=self.workers or 2, hint=start, prove_s=prove,
                        fallback_plans=(start,) if start is not None else ())


@dataclass
class SolveJob:
    """One recorded problem's solve as a worker process gets it: its folder, and the run's options
    with this job's share of the CP-SAT workers."""

    folder: str
    options: SolveDirOptions


def start_plan(problem, greedy, what: str = "greedy.json"):
    """Torch's recorded greedy plan as the start and a floor of a solve, repaired when it breaks a
    rule: (plan, note); (None, why) when there is none or it is for another problem."""
    from planner.search.repair import repair
    from planner.rules.verifier import verify

    if greedy is None:
        return None, f"no usable {what}"
    if greedy.problem_fingerprint != problem.fingerprint:
        return None, f"{what} is for another problem"
    if verify(problem, greedy):
        repaired = repair(problem, greedy, SolveOptions(time_limit_s=20))
        if repaired.stats.get("interrupted"):  # the repair took the Ctrl-C: the caller must stop too
            raise KeyboardInterrupt
        return repaired.plan, "torch's greedy breaks a rule as recorded; compared as its repair"
    return greedy, ""


def _start_plan(problem, folder: Path):
    try:
        greedy = load_plan(folder / GREEDY)
    except (OSError, SchemaError):
        greedy = None
    return start_plan(problem, greedy)


def solve_one(job: SolveJob) -> dict:
    """Solve one recorded problem; write plan.json (verified, carrying this row) and return its
    summary row."""
    from planner.search.planning import plan

    folder = Path(job.folder)
    row: dict = {"problem": folder.name}
    try:
        problem = load_problem(folder / PROBLEM)
    except (OSError, SchemaError) as e:
        note = str(e).splitlines()[0][:300]
        if (folder / PROBLEM).is_symlink():  # dangling or looping: listed, yet it does not load
            note += f" (a symlink to {os.readlink(folder / PROBLEM)[:200]!r})"
        return {**row, "status": "ERROR", "note": note}
    run = job.options
    began = time.perf_counter()
    start, note, result, known = None, "", None, None
    try:
        start, note = _start_plan(problem, folder)

        def kept(plan_) -> None:  # the best verified plan so far, for a Ctrl-C between stages
            nonlocal known
            known = plan_ if plan_ is not None else known

        result = plan(problem, run.spec(start, problem), on_plan=kept, started=began)
    except KeyboardInterrupt:  # between searches (a repair, a floor, seeding): the best plan known
        result = _kept_at_ctrl_c(problem, result, start, began, known)
    try:
        return _write_row(folder, problem, run, result, start, note)
    except KeyboardInterrupt:  # after the search (verifying, pricing, writing); a solve gets one
        # Ctrl-C (the driver forwards one), so writing again, marked interrupted, runs to its end
        return _write_row(folder, problem, run, _kept_at_ctrl_c(problem, result, start, began, known), start, note)


def _write_row(folder: Path, problem, run: SolveDirOptions, result, start, note: str) -> dict:
    """Verify ``result``'s plan, write it as plan.json carrying its summary row, return the row. A
    cut-short plan that went beside a finished plan.json (``save_plan``) returns the finished
    plan's row: the summary is the plans on disk."""
    from planner.core.problem import collectives_after
    from planner.cost.simulator import simulate
    from planner.rules.verifier import check, recorded_policy

    row: dict = {"problem": folder.name}
    row.update(_problem_figures(problem), status=result.status, wall_s=round(result.wall_s, 1),
               interrupted=bool(result.stats.get("interrupted")))
    if start is not None:
        row.update(greedy_after=collectives_after(problem, start),
                   greedy_ms=round(simulate(problem, start).step_ms, 3), greedy_peak_gb=_peak_gb(problem, start))
    if result.plan is None:
        return {**row, "note": "; ".join(x for x in (note, "no plan found") if x)}
    report = check(problem, result.plan, **recorded_policy(result.plan))  # the solver verifies; the file's own guard
    if not report.feasible:
        return {**row, "status": "ERROR", "note": f"solver plan failed verification: {report.violations[0]}"}
    bound = result.bound if run.objective == "step" else None
    proof = result.plan.params.get("candidate_bound")  # CP-SAT over the plan's candidate space
    proved = (f"CP-SAT over the plan's candidate space ({proof['scope']}): {proof['status']}, none of it under "
              f"{proof['bound_ms']:.3f} ms, gap {100 * proof['gap']:.2f}%") if proof else ""
    planned = {**row, **_plan_figures(problem, result.plan), "bound_ms": None if bound is None else round(bound, 3),
               "bound_scope": result.bound_scope if bound is not None else None,
               "gap_pct": None if result.gap is None else round(100 * result.gap, 2),
               "note": "; ".join(x for x in (note, proved, "stopped by the wall clock" if result.stats.get("wall_limit_hit")
                                             else "", "interrupted: solved again by the next run"
                                             if row["interrupted"] else "") if x)}
    # the row travels inside the plan: one atomic rename writes both, so a Ctrl-C between the
    # plan and the summary cannot lose the row (the summary is rebuilt from the plans)
    plan = result.plan.model_copy(update={"params": {**result.plan.params,
                                                     SUMMARY_PARAM: {k: v for k, v in planned.items()
                                                                     if k != "problem"}}})
    try:
        written = save_plan(plan, folder / PLAN, problem)
    except OSError as e:  # a directory in its place, a read-only folder
        return {**row, "status": "ERROR", "note": f"{folder / PLAN}: cannot write the plan ({e.strerror})"}
    kept = plan_row(folder, problem) if written != folder / PLAN else None
    if kept is not None:  # --force cut short: the finished plan.json stands, and its row
        return {**kept, "note": "; ".join(x for x in (kept.get("note"), f"kept: this run was interrupted, its "
                                                      f"plan is in {written.name}") if x)}
    return planned


def _kept_at_ctrl_c(problem, result, start, began: float, known=None):
    """A solve stopped by Ctrl-C outside a search, which keeps its own best: the last verified
    plan a stage found (``known``: CP-SAT's when its search had returned, the positioned
    search's), else the faster of torch's start plan (when it verifies) and the unbucketed one;
    marked interrupted."""
    from planner.core.problem import unbucketed_plan
    from planner.cost.simulator import simulate
    from planner.rules.verifier import recorded_policy, verify
    from planner.search.result import SolveResult

    if result is None or result.plan is None:
        known = [(simulate(problem, p).step_ms, p) for p in (known, start, unbucketed_plan(problem))
                 if p is not None and not verify(problem, p, **recorded_policy(p))]
        step_ms, plan = min(known, key=lambda known_plan: known_plan[0])
        result = SolveResult(plan=plan, status="FEASIBLE", objective=step_ms, bound=None, gap=None,
                             wall_s=time.perf_counter() - began)
    return replace(result, plan=mark_interrupted(result.plan), stats={**result.stats, "interrupted": True})


# how long an interrupted run waits for the solves in flight to save their best plans (s): a
# stopped CP-SAT search returns within a second or two, and verifying and writing an 80-layer
# plan takes about one more
STOP_WAIT_S = 30.0


@dataclass
class _Running:
    """One problem solved in its own process: the process, the pipe its row comes back on, its job."""

    index: int
    job: SolveJob
    process: object  # multiprocessing.Process
    rows: object  # the receiving end of a multiprocessing.Pipe


def _solve_in_process(job: SolveJob, conn) -> None:
    """``solve_one`` in a child process of its own process group: Ctrl-C at the terminal reaches
    only the driver, which forwards one SIGINT per solve (two would cut a plan's save short); the
    child dies with the driver (Linux), so a killed run leaves no solve behind."""
    os.setpgrp()
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        # started with SIGINT blocked (``_run_jobs``): one forwarded before this line waited here
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        conn.send(solve_one(job))
    except KeyboardInterrupt:  # before the search began (loading): nothing to keep
        conn.send({"problem": Path(job.folder).name, "status": "", "interrupted": True,
                   "note": "interrupted before a plan was found: solved again by the next run"})
    finally:
        conn.close()


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent dies (prctl PR_SET_PDEATHSIG); a no-op
    elsewhere."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _died(job: SolveJob, exitcode: int | None) -> dict:
    """The row of a solve whose process ended without sending one (a native abort, the OOM killer)."""
    if exitcode is not None and exitcode < 0:
        try:
            how = f"signal {signal.Signals(-exitcode).name}"
        except ValueError:
            how = f"signal {-exitcode}"
    else:
        how = f"exit status {exitcode}"
    return {"problem": Path(job.folder).name, "status": "ERROR",
            "note": f"the solve's process died ({how}) before it wrote a plan: solved again by the next run"}


def _run_jobs(batch: list[SolveJob], jobs: int, done: Callable[[int, dict], None],
              say: Callable[[str], None]) -> None:
    """Every job in a process of its own, ``jobs`` at a time, each row handed to ``done`` as it comes
    back. A process that dies costs its own problem only (reported, and solved again by the next
    run); the others finish. On Ctrl-C no further job starts, each running one is sent one SIGINT
    (it stops its search and saves its best verified plan, marked interrupted), and its row is
    awaited (STOP_WAIT_S at most: the command line counts a second Ctrl-C without stopping, so the
    plans are saved) before KeyboardInterrupt goes on."""
    import multiprocessing
    from multiprocessing.connection import wait as wait_any

    context = multiprocessing.get_context("fork")  # the caller's state, no re-import: a problem a second
    queue, running, started = list(batch), [], 0

    def start() -> None:
        nonlocal started
        job = queue.pop(0)
        started += 1
        say(f"[{started}/{len(batch)}] solving {Path(job.folder).name[:12]}…")
        receive, send = context.Pipe(duplex=False)
        process = context.Process(target=_solve_in_process, args=(job, send), daemon=True)
        # the child starts with SIGINT blocked until its handler and try are in place: a Ctrl-C
        # forwarded at once would otherwise end it with a traceback before it could keep anything
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            process.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        send.close()
        running.append(_Running(started, job, process, receive))

    def collect(timeout: float | None) -> None:
        ready = wait_any([r.rows for r in running] + [r.process.sentinel for r in running], timeout)
        for r in list(running):
            if r.rows not in ready and r.process.sentinel not in ready:
                continue
            try:
                row = r.rows.recv() if r.rows.poll() else None
            except (EOFError, OSError):
                row = None
            if row is None and r.process.is_alive():
                continue  # readable only because the pipe closed a moment before the process ended
            r.process.join()
            r.rows.close()
            running.remove(r)
            done(r.index, row if row is not None else _died(r.job, r.process.exitcode))

    try:
        while queue or running:
            while queue and len(running) < jobs:
                start()
            collect(None)
    except KeyboardInterrupt:
        queue.clear()
        for r in running:
            with contextlib.suppress(ProcessLookupError):
                os.kill(r.process.pid, signal.SIGINT)
        if running:
            say(f"interrupted: waiting for {len(running)} solve(s) to save their best plan (at most {STOP_WAIT_S:.0f} s)")
        try:
            deadline = time.monotonic() + STOP_WAIT_S
            while running and time.monotonic() < deadline:
                collect(max(0.0, deadline - time.monotonic()))
        finally:
            for r in running:  # past the wait (or a library caller's second Ctrl-C): their plans are not saved
                r.process.kill()
                r.process.join()
        raise


def _problem_figures(problem) -> dict:
    from planner.cost.bounds import step_floor
    from planner.cost.simulator import simulate

    return {"collectives": len(problem.collectives), "unbucketed_ms": round(simulate(problem).step_ms, 3),
            "floor_ms": round(step_floor(problem).floor_ms, 3), "unbucketed_peak_gb": _peak_gb(problem, None)}


def _peak_gb(problem, plan) -> float:
    """Peak memory of a plan's schedule in GB (1e9 bytes), as torch's estimator counts it."""
    from planner.cost.memory import peak_bytes

    return round(peak_bytes(problem, plan) / 1e9, 3)


def _plan_figures(problem, plan) -> dict:
    from planner.core.problem import collectives_after
    from planner.cost.simulator import simulate

    return {"plan_after": collectives_after(problem, plan), "plan_ms": round(simulate(problem, plan).step_ms, 3),
            "plan_peak_gb": _peak_gb(problem, plan)}


def plan_row(folder: Path, problem=None) -> dict | None:
    """The summary row of the folder's plan when it has one that counts -- a regular file that
    loads, is for the problem beside it and passes the verifier under the policy it records (as
    ``use`` will check it) -- else None (the problem is solved again). The row says
    ``interrupted`` when Ctrl-C cut the plan's search short (solved again too). ``problem``: the
    folder's, when the caller has it loaded."""
    from planner.rules.verifier import recorded_policy, verify

    try:
        problem = problem if problem is not None else load_problem(folder / PROBLEM)
        plan = load_plan(folder / PLAN)
        if verify(problem, plan, **recorded_policy(plan)):  # another problem's fingerprint included
            return None
    except (OSError, ValueError):  # SchemaError, BadFileError, a policy that is none
        return None
    stored = plan.params.get(SUMMARY_PARAM)
    if isinstance(stored, dict):
        row = {k: stored[k] for k in SUMMARY_COLUMNS if k in stored}
    else:  # a plan solve-dir did not write (`bucketplan solve -o DIR/<fingerprint>/plan.json`)
        row = {**_problem_figures(problem), **_plan_figures(problem, plan),
               "note": "figures recomputed: the plan carries no row"}
    return {**row, "problem": folder.name, "interrupted": bool(plan.params.get("interrupted"))}


def fingerprint_digest(fingerprint) -> str | None:
    """The hex digest of a ``sha256:<hex>`` fingerprint (a problem folder's name); None for
    anything else, which must never become a path."""
    digest = fingerprint.split(":")[-1] if isinstance(fingerprint, str) else ""
    return digest if _HEX.fullmatch(digest) else None


def _graphs_by_problem(plan_dir: Path) -> dict[str, str]:
    seen: dict[str, dict[str, set]] = {}
    for e in read_index(plan_dir):
        fp = fingerprint_digest(e["fingerprint"])
        if fp is not None:
            seen.setdefault(fp, {}).setdefault(str(e.get("graph", "?")), set()).add(e.get("rank"))
    return {fp: ", ".join(f"{g} ({len(r)} rank{'s' if len(r) > 1 else ''})" for g, r in graphs.items())
            for fp, graphs in seen.items()}


def write_summary(plan_dir: Path, rows: list[dict]) -> None:
    """``summary.csv`` and ``summary.md``, fingerprints cut to 12 characters in the Markdown."""
    try:
        write_table(plan_dir, "summary", SUMMARY_COLUMNS, rows, legend=SUMMARY_LEGEND, style=TableStyle(first_width=12))
    except OSError as e:  # a directory named summary.csv, a read-only plan directory
        # filename2: the rename's target (summary.csv), where filename is the temporary file
        where = e.filename2 or e.filename or plan_dir
        raise PlanDirError(f"{where}: cannot write the summary ({e.strerror})") from None


def solve_dir(plan_dir: str | os.PathLike, options: SolveDirOptions = SolveDirOptions(), *, force: bool = False,
              progress: Callable[[str], None] | None = None) -> list[dict]:
    """Solve, as ``options`` says, every recorded problem of ``plan_dir`` without a plan that
    counts (``plan_row``): none, unreadable, another problem's, or interrupted by Ctrl-C;
    ``force``: all of them. One run per directory at a time (``locked``). The summary is rebuilt
    from the plans on disk first and rewritten after every problem and when the run ends, Ctrl-C
    included."""
    root = Path(plan_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: no such plan directory")
    with locked(root):
        return _solve_dir(root, options, force, progress or (lambda msg: None))


def _solve_dir(root: Path, options: SolveDirOptions, force: bool, say: Callable[[str], None]) -> list[dict]:
    folders = recorded_problems(root)
    graphs = _graphs_by_problem(root)  # before any solve: a broken index stops the run here
    rows = {f.name: r for f in folders if (r := plan_row(f)) is not None}
    todo = [f for f in folders if force or f.name not in rows or rows[f.name]["interrupted"]]
    resumed = sum(1 for f in todo if rows.get(f.name, {}).get("interrupted"))

    def table() -> list[dict]:
        return [{**rows[f.name], "graphs": graphs.get(f.name, "")} for f in folders if f.name in rows]

    write_summary(root, table())  # a summary lost or cut short by an earlier run is whole again
    cores = os.cpu_count() or 1
    jobs = max(1, min(options.jobs, len(todo) or 1))
    per_job = options.workers or max(1, cores // jobs)
    say(f"{len(folders)} recorded problem(s) in {root}; {len(todo)} to solve"
        + (f" ({resumed} interrupted earlier)" if resumed else "")
        + f" ({options.objective}, {options.time_limit_s:g}s each, {jobs} at a time x {per_job} CP-SAT workers)")
    batch = [SolveJob(str(f), replace(options, workers=per_job)) for f in todo]
    finished: set[str] = set()

    def done(i: int, row: dict) -> None:
        rows[row["problem"]] = row
        finished.add(row["problem"])
        write_summary(root, table())
        figures = (f"{row.get('collectives')} -> {row.get('plan_after')} collectives, step {row.get('plan_ms')} ms "
                   f"(greedy {row.get('greedy_ms')}, floor {row.get('floor_ms')}), gap {row.get('gap_pct')}%"
                   if row.get("plan_ms") is not None else row.get("note", ""))
        say(f"[{i}/{len(batch)}] {row['problem'][:12]}…: {row.get('status')}: {figures}")

    try:
        _run_jobs(batch, jobs, done, say)
    finally:
        # a Ctrl-C ends the loop above before the rows of the solves in flight come back; their
        # plans, saved by the workers, carry the rows
        for f in todo:
            if f.name not in finished and (r := plan_row(f)) is not None:
                rows[f.name] = r
        write_summary(root, table())
    return table()
