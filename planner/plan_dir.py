"""A plan directory: problems recorded from ``torch.compile`` (``fxglue.run.compile.record``),
solved here offline (``bucketplan solve-dir``), used by ``fxglue.run.compile.use``.

Layout (one place; the torch side imports it)::

    plan_dir/index.jsonl                 one line per graph and rank that record saw
    plan_dir/<hex fingerprint>/problem.json
    plan_dir/<hex fingerprint>/greedy.json  torch's greedy plan, recorded
    plan_dir/<hex fingerprint>/plan.json    the solved plan (verified; written atomically)
    plan_dir/summary.csv, summary.md        one row per problem solved by solve_dir

Torch-free: solving needs no torch, so the directory can be copied to a machine without it.
"""

from __future__ import annotations

import csv
import json
import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from planner.io import SchemaError, load_plan, load_problem, save
from planner.report import write_table

INDEX = "index.jsonl"
PROBLEM, GREEDY, PLAN = "problem.json", "greedy.json", "plan.json"
SUMMARY_COLUMNS = ("problem", "graphs", "collectives", "greedy_after", "plan_after", "unbucketed_ms", "greedy_ms",
                   "plan_ms", "floor_ms", "status", "bound_ms", "gap_pct", "wall_s", "note")


def problem_dir(plan_dir: str | os.PathLike, fingerprint: str) -> Path:
    """Where a problem with this fingerprint lives (the hex digest, without the ``sha256:``)."""
    return Path(plan_dir) / fingerprint.split(":")[-1]


def read_index(plan_dir: str | os.PathLike) -> list[dict]:
    """The graphs ``record`` saw, one dict per graph and rank (lines that do not parse are skipped:
    the index is informative, the problems are the record)."""
    path = Path(plan_dir) / INDEX
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict):
            out.append(entry)
    return out


def append_index(plan_dir: str | os.PathLike, entry: dict) -> None:
    # one write of one short line with O_APPEND: whole lines even when ranks append at once
    line = (json.dumps(entry, sort_keys=True) + "\n").encode()
    fd = os.open(Path(plan_dir) / INDEX, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def recorded_problems(plan_dir: str | os.PathLike) -> list[Path]:
    """Every problem folder of the directory, sorted (a folder counts once problem.json exists)."""
    return sorted(p.parent for p in Path(plan_dir).glob(f"*/{PROBLEM}"))


@dataclass
class SolveJob:
    folder: str
    objective: str
    time_limit_s: float
    workers: int
    seed: int


def start_plan(problem, greedy, what: str = "greedy.json"):
    """Torch's recorded greedy plan as the start and a floor of a solve, repaired when it breaks a
    rule: (plan, note); (None, why) when there is none or it is for another problem."""
    from planner.repair import repair
    from planner.verifier import verify

    if greedy is None:
        return None, f"no usable {what}"
    if greedy.problem_fingerprint != problem.fingerprint:
        return None, f"{what} is for another problem"
    if verify(problem, greedy):
        fixed = repair(problem, greedy, time_limit_s=20).plan
        return fixed, "torch's greedy breaks a rule as recorded; compared as its repair"
    return greedy, ""


def _start_plan(problem, folder: Path):
    try:
        greedy = load_plan(folder / GREEDY)
    except (OSError, SchemaError):
        greedy = None
    return start_plan(problem, greedy)


def solve_one(job: SolveJob) -> dict:
    """Solve one recorded problem; write plan.json (verified) and return its summary row."""
    from planner.bounds import step_floor
    from planner.problem import collectives_after
    from planner.simulator import simulate
    from planner.solver import solve
    from planner.verifier import check

    folder = Path(job.folder)
    row: dict = {"problem": folder.name}
    try:
        problem = load_problem(folder / PROBLEM)
    except (OSError, SchemaError) as e:
        return {**row, "status": "ERROR", "note": str(e).splitlines()[0][:300]}
    start, note = _start_plan(problem, folder)
    result = solve(problem, time_limit_s=job.time_limit_s, objective=job.objective, workers=job.workers,
                   seed=job.seed, hint=start, floor_plans=(start,) if start is not None else ())
    row.update(collectives=len(problem.collectives), unbucketed_ms=round(simulate(problem).step_ms, 3),
               floor_ms=round(step_floor(problem).floor_ms, 3), status=result.status, wall_s=round(result.wall_s, 1),
               interrupted=bool(result.stats.get("interrupted")))
    if start is not None:
        row.update(greedy_after=collectives_after(problem, start),
                   greedy_ms=round(simulate(problem, start).step_ms, 3))
    if result.plan is None:
        return {**row, "note": "; ".join(x for x in (note, "no plan found") if x)}
    report = check(problem, result.plan)  # the solver verifies; this is the file's own guard
    if not report.feasible:
        return {**row, "status": "ERROR", "note": f"solver plan failed verification: {report.violations[0]}"}
    save(result.plan, folder / PLAN)
    bound = result.bound if job.objective == "step" else None
    row.update(plan_after=collectives_after(problem, result.plan),
               plan_ms=round(simulate(problem, result.plan).step_ms, 3),
               bound_ms=None if bound is None else round(bound, 3),
               gap_pct=None if result.gap is None else round(100 * result.gap, 2),
               note="; ".join(x for x in (note, "stopped by the wall clock" if result.stats.get("wall_limit_hit")
                                          else "") if x))
    return row


def _graphs_by_problem(plan_dir: Path) -> dict[str, str]:
    seen: dict[str, dict[str, set]] = {}
    for e in read_index(plan_dir):
        fp = problem_dir(plan_dir, str(e.get("fingerprint", ""))).name
        seen.setdefault(fp, {}).setdefault(str(e.get("graph", "?")), set()).add(e.get("rank"))
    return {fp: ", ".join(f"{g} ({len(r)} rank{'s' if len(r) > 1 else ''})" for g, r in graphs.items())
            for fp, graphs in seen.items()}


def write_summary(plan_dir: Path, rows: list[dict]) -> None:
    """``summary.csv`` and ``summary.md``, fingerprints cut to 12 characters in the Markdown."""
    write_table(plan_dir, "summary", SUMMARY_COLUMNS, rows, first_width=12)


def solve_dir(plan_dir: str | os.PathLike, *, objective: str = "step", time_limit_s: float = 60.0, jobs: int = 1,
              workers: int | None = None, seed: int = 0, force: bool = False,
              progress: Callable[[str], None] | None = None) -> list[dict]:
    """Solve every recorded problem of ``plan_dir`` that has no plan yet (``force``: all of them).

    ``jobs`` problems at once in worker processes, each solve with ``workers`` CP-SAT workers
    (default: the machine's cores shared among the jobs). Rows of problems solved earlier are
    kept from the previous summary; the summary is rewritten after every problem."""
    say = progress or (lambda msg: None)
    root = Path(plan_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: no such plan directory")
    folders = recorded_problems(root)
    todo = [f for f in folders if force or not (f / PLAN).exists()]
    previous = {}
    if (root / "summary.csv").exists():
        with open(root / "summary.csv", newline="", encoding="utf-8") as fh:
            previous = {r["problem"]: r for r in csv.DictReader(fh) if r.get("problem")}
    rows = {f.name: previous[f.name] for f in folders if f not in todo and f.name in previous}
    graphs = _graphs_by_problem(root)
    cores = os.cpu_count() or 1
    jobs = max(1, min(jobs, len(todo) or 1))
    per_job = workers or max(1, cores // jobs)
    say(f"{len(folders)} recorded problem(s) in {root}; {len(todo)} to solve ({objective}, {time_limit_s:g}s each, "
        f"{jobs} at a time x {per_job} CP-SAT workers)")
    batch = [SolveJob(str(f), objective, time_limit_s, per_job, seed) for f in todo]

    def done(i: int, row: dict) -> None:
        row["graphs"] = graphs.get(row["problem"], "")
        rows[row["problem"]] = row
        write_summary(root, [rows[f.name] for f in folders if f.name in rows])
        figures = (f"{row.get('collectives')} -> {row.get('plan_after')} collectives, step {row.get('plan_ms')} ms "
                   f"(greedy {row.get('greedy_ms')}, floor {row.get('floor_ms')}), gap {row.get('gap_pct')}%"
                   if row.get("plan_ms") is not None else row.get("note", ""))
        say(f"[{i}/{len(batch)}] {row['problem'][:12]}…: {row.get('status')}: {figures}")

    if jobs == 1:
        for i, job in enumerate(batch, 1):
            say(f"[{i}/{len(batch)}] solving {Path(job.folder).name[:12]}…")
            row = solve_one(job)
            done(i, row)
            if row.get("interrupted"):  # Ctrl-C: that plan (the best verified so far) is kept; stop here
                say(f"interrupted: {len(batch) - i} problem(s) left; run again to resume")
                break
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            futures = [pool.submit(solve_one, job) for job in batch]
            try:
                for i, fut in enumerate(as_completed(futures), 1):
                    done(i, fut.result())
            except KeyboardInterrupt:
                for fut in futures:
                    fut.cancel()
                raise
    return [rows[f.name] for f in folders if f.name in rows]
