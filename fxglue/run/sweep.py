"""The torch half of ``bucketplan sweep``: turn a sweep case into its problem, and apply a plan.

Each case is traced, scheduled and extracted in a fresh process (spawned, so one case's graphs
and torch's caches never weigh on the next, and a case that runs out of memory does not take the
sweep down): the process writes ``stages.json`` after every stage with its wall time and peak
memory, so when it dies the table still says at which stage. ``planner.jobs.sweep`` does the rest.
"""

from __future__ import annotations

import json
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Callable

from planner.core.io import atomic_write_text, save
from planner.core.io import BadFileError
from planner.jobs.sweep import GREEDY, PROBLEM, STAGES, Case, SpecError, peak_memory, read_stages, stage_list

# prepare()'s progress messages open these stages (the first word of each message)
_STAGE_OF = {"tracing": "trace", "scheduling": "schedule", "extracting": "extract", "running": "greedy",
             "applying": "apply"}


class StageMeter:
    """Wall time and peak memory per stage, cut at ``prepare``'s progress messages, written to a
    stages file after each stage (so a process that dies leaves where it was)."""

    def __init__(self, path: Path, prefix: str = "", keep: list[dict] | None = None):
        self.path, self.prefix, self.stages = path, prefix, list(keep or [])
        self._open: tuple[str, float, object, dict] | None = None

    def say(self, msg: str) -> None:
        stage = _STAGE_OF.get(msg.split(" ", 1)[0])
        if stage is None:
            return
        self.close()
        mem = peak_memory()
        self._open = (self.prefix + stage, time.perf_counter(), mem, mem.__enter__())
        self._write(running=self.prefix + stage)

    def close(self, note: str = "") -> None:
        if self._open is None:
            return
        stage, t0, mem, figures = self._open
        mem.__exit__(None, None, None)
        self.stages.append({"stage": stage, "wall_s": round(time.perf_counter() - t0, 2),
                            "peak_rss_gb": figures["peak_rss_gb"], "note": note})
        self._open = None
        self._write()

    def _write(self, running: str | None = None) -> None:
        atomic_write_text(self.path, json.dumps({"stages": self.stages, "running": running}))


def resolve(case: Case):
    """The case's workload and cluster preset (``SpecError`` naming the case when either is unknown)."""
    from fxglue.models.custom import factory_workload, hf_config_workload
    from fxglue.presets import get_preset, with_contention, with_measurements
    from fxglue.models.workloads import WorkloadError, workloads

    try:
        if case.source == "workload":
            if case.name not in workloads():
                raise SpecError(f"case {case.key}: unknown workload {case.name!r} (`bucketplan workloads` lists them)")
            workload = case.name
        elif case.source == "model":
            workload = factory_workload(case.name, case.parallel, case.layers)
        elif case.source == "graph":  # loaded when traced; its groups are the file's own
            from fxglue.graph_file import GraphFile

            workload = GraphFile(case.name)
        else:
            workload = hf_config_workload(case.name if case.source == "hf_config" else None,
                                          model_id=case.name if case.source == "hf" else None,
                                          parallel=case.parallel, layers=case.layers)
        preset = with_measurements(with_contention(get_preset(case.preset, ranks=case.ranks, tp=case.tp),
                                                   case.contention), case.collectives)
    except (WorkloadError, ValueError) as e:
        if isinstance(e, SpecError):
            raise
        raise SpecError(f"case {case.key}: {e}") from None
    return workload, preset


def check_cases(cases) -> None:
    """Every case's workload and preset resolve, before any of them is traced."""
    for case in cases:
        if case.source != "problem":
            resolve(case)


def _extract_child(case: Case, folder: str) -> None:
    import logging

    from fxglue.pipeline import PipelineOptions, prepare

    logging.getLogger("torch._inductor").setLevel(logging.WARNING)
    folder_p = Path(folder)
    meter = StageMeter(folder_p / STAGES)
    workload, preset = resolve(case)
    prepared = prepare(workload, preset=preset, pipeline=PipelineOptions(pre_bucketing=case.pre_bucketing),
                       progress=meter.say)
    meter.close()
    if prepared.greedy is not None:
        save(prepared.greedy, folder_p / GREEDY)
    save(prepared.problem, folder_p / PROBLEM)  # last: its presence marks the case extracted
    meter._write()


def _in_child(fn, *args) -> None:
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        pool.submit(fn, *args).result()


def _died_at(stages_file: Path) -> str:
    try:
        data = read_stages(stages_file)
    except BadFileError:
        data = None
    if data is None:
        return "before its first stage"
    return f"in stage {data.get('running')!r}" if data.get("running") else "between stages"


def extract_case(case: Case, folder: Path, say: Callable[[str], None]) -> None:
    """Trace, schedule and extract ``case`` into ``folder`` (problem.json, greedy.json, stages.json)
    in a fresh process. A process that dies (out of memory) raises RuntimeError naming the stage."""
    folder.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    try:
        _in_child(_extract_child, case, str(folder))
    except BrokenProcessPool:
        raise RuntimeError(f"case {case.key}: the extraction process died {_died_at(folder / STAGES)} "
                           "(killed: out of memory?)") from None
    stages = stage_list(folder / STAGES)
    say(f"  {case.key}: extracted in {time.perf_counter() - t0:.1f}s: "
        + ", ".join(f"{s.get('stage')} {s.get('wall_s')}s/{s.get('peak_rss_gb')} GB" for s in stages))


def _apply_child(case: Case, folder: str, plan_file: str, sha: str) -> None:
    from fxglue.pipeline import PipelineOptions, run_pipeline

    folder_p = Path(folder)
    keep = stage_list(folder_p / STAGES)
    meter = StageMeter(folder_p / STAGES, prefix=f"apply {Path(plan_file).stem.removesuffix('-plan')}: ",
                       keep=[s for s in keep if not str(s.get("stage")).startswith("apply")])
    workload, preset = resolve(case)
    result = run_pipeline(workload, planner_=plan_file, preset=preset,
                          pipeline=PipelineOptions(pre_bucketing=case.pre_bucketing), progress=meter.say)
    after = sum(result.collectives_after.values())
    meter.close(note=f"plan {sha}: {sum(result.collectives_before.values())} -> {after} collectives in the graph")


def apply_case(case: Case, folder: Path, plan_file: Path, sha: str, say: Callable[[str], None]) -> None:
    """Trace the case again and apply ``plan_file`` to its graph with ``apply_plan`` (in a fresh
    process; the stages are added to stages.json as ``apply <objective>: ...``)."""
    try:
        _in_child(_apply_child, case, str(folder), str(plan_file), sha)
    except BrokenProcessPool:
        raise RuntimeError(f"case {case.key}: the apply process died {_died_at(folder / STAGES)}") from None
    stages = stage_list(folder / STAGES)
    say(f"  {case.key}: applied {plan_file.name}: {stages[-1].get('note') if stages else '(no stages written)'}")
