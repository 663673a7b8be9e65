"""Shared fixtures: traced and scheduled built-in workloads, cached per test session; a
one-collective problem file (``problem_file``, ``edit_json``) for the file tests of
test_io.py and test_problem.py.

Tracing and scheduling an 8-layer workload takes seconds; many tests read the same
problem, so each (workload, pre-bucketing) pair is built once. Tests that mutate a graph
build their own copy with ``fresh_schedule``.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from dataclasses import dataclass

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


@dataclass
class Scheduled:
    name: str
    traced: object
    inputs: object
    estimator: object
    problem: object
    greedy: object
    graph_before_greedy: str


def fresh_schedule(name: str, pre_bucketing: bool = False, preset: str | None = None):
    from fxglue.pipeline import estimator_for, resolve_preset, schedule
    from fxglue.models.workloads import trace

    p = resolve_preset(preset)
    traced = trace(name, world_size=p.world_size, tp=p.tp) if p else trace(name)
    est = estimator_for(traced, preset=p)
    return traced, schedule(traced, est, pre_bucketing=pre_bucketing), est


@functools.lru_cache(maxsize=None)
def scheduled(name: str, pre_bucketing: bool = False, preset: str | None = None) -> Scheduled:
    from fxglue.pipeline import prepare

    p = prepare(name, pre_bucketing=pre_bucketing, preset=preset, greedy=False)
    before = str(p.inputs.gm.graph)
    p.record_greedy()
    return Scheduled(name, p.traced, p.inputs, p.estimator, p.problem, p.greedy, before)


@pytest.fixture
def get_scheduled():
    return scheduled


@pytest.fixture
def problem_file(tmp_path):
    """A valid problem file: one exposed all_gather around one matmul, written by ``planner.save``."""
    import planner

    p = planner.Problem(
        bucket_mode="default", bucket_cap_bytes=1 << 30, n_scheduled=3,
        collectives=(planner.Collective(name="ag", wait="w", kind="all_gather", pg="0", key="all_gather/0/bf16",
                                        dtype="bfloat16", size_bytes=10, wire_bytes=10, est_ms=1.0, exposed_ms=1.0,
                                        start_pos=0, wait_pos=2, status="exposed"),),
        nodes=(planner.Node(name="ag", kind="start", pos=0, est_ms=1.0),
               planner.Node(name="mm", kind="compute", pos=1, est_ms=1.0),
               planner.Node(name="w", kind="wait", pos=2, est_ms=0.0, deps=(0,))),
        timelines=(planner.Timeline(pg="0", nodes=(0, 1, 2), types="scw"),),
        links=(planner.Link(pg="0", group_size=8, latency_ms=0.025, bandwidth_gbps=40.0),),
    ).with_fingerprint()
    path = tmp_path / "problem.json"
    planner.save(p, path)
    return path


def edit_json(path, fn) -> None:
    """Rewrite the JSON file at ``path`` after ``fn`` edits its data in place."""
    data = json.loads(path.read_text())
    fn(data)
    path.write_text(json.dumps(data))


def load_fails_naming_file_and_field(path, breaker, expected: str) -> None:
    """Break the problem file at ``path`` with ``breaker``; loading it then fails with a
    SchemaError naming the file and saying ``expected`` (test_io's and test_problem's cases)."""
    import planner

    breaker(path)
    with pytest.raises(planner.SchemaError) as err:
        planner.load_problem(path)
    assert str(path) in str(err.value)
    assert expected in str(err.value)
