"""Shared fixtures: traced and scheduled built-in workloads, cached per test session; a
one-collective problem file (``problem_file``, ``edit_json``) for the file tests of
test_io.py and test_problem.py; and the test tiers.

Tracing and scheduling an 8-layer workload takes seconds; many tests read the same
problem, so each (workload, pre-bucketing) pair is built once. Tests that mutate a graph
build their own copy with ``fresh_schedule``.

Tiers (tests/README.md, "Tiers"): ``long`` tests leave the default run (pyproject's addopts);
``slow`` ones stay in it but leave the fast tier; every other test is marked ``fast`` here, so
``pytest -m fast`` is the edit-test loop. A test that asks for ``get_scheduled`` is slow without
saying so (it traces a workload); one that calls ``scheduled`` or ``fresh_schedule`` from the fast
tier fails, naming the marker it needs; and a fast test that takes longer than ``FAST_BUDGET_S`` is
listed at the end of the run.
"""

from __future__ import annotations

import collections
import functools
import json
import os
import sys
from dataclasses import dataclass

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# A fast test's setup, call and teardown together, on 2 shared cores; the whole fast tier is meant
# to stay under 4 minutes there (tests/README.md)
FAST_BUDGET_S = 10.0
_running: list = []  # the test being run now
_fast_seconds: dict[str, float] = collections.defaultdict(float)


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: absent without it
def pytest_xdist_auto_num_workers(config):
    """``-n auto`` (pyproject's addopts): one worker per CPU this process may run on. xdist's own
    count is the physical cores where psutil is installed (1 on a 2-thread VM), the logical ones
    where not; this makes it the same on every machine."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config, items):
    for item in items:
        if "get_scheduled" in item.fixturenames and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)  # it traces and schedules a built-in workload
        if not item.get_closest_marker("slow") and not item.get_closest_marker("long"):
            item.add_marker(pytest.mark.fast)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _running[:] = [item]
    yield
    _running.clear()


def pytest_runtest_logreport(report):
    if "fast" in report.keywords:
        _fast_seconds[report.nodeid] += report.duration


def pytest_terminal_summary(terminalreporter):
    over = sorted(((s, n) for n, s in _fast_seconds.items() if s > FAST_BUDGET_S), reverse=True)
    if over:
        terminalreporter.section(f"fast tests over {FAST_BUDGET_S:g} s: speed them up or mark them slow")
        for seconds, nodeid in over:
            terminalreporter.write_line(f"{seconds:6.1f}s {nodeid}")


def _not_in_the_fast_tier(what: str) -> None:
    if _running and _running[0].get_closest_marker("fast"):
        pytest.fail(f"{what}: a fast test may not; mark it slow (tests/README.md, Tiers)", pytrace=False)


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
    _not_in_the_fast_tier(f"fresh_schedule({name!r}) traces a workload")
    from fxglue.pipeline import estimator_for, resolve_preset, schedule
    from fxglue.models.workloads import trace

    p = resolve_preset(preset)
    traced = trace(name, world_size=p.world_size, tp=p.tp) if p else trace(name)
    est = estimator_for(traced, preset=p)
    return traced, schedule(traced, est, pre_bucketing=pre_bucketing), est


def scheduled(name: str, pre_bucketing: bool = False, preset: str | None = None) -> Scheduled:
    _not_in_the_fast_tier(f"scheduled({name!r}) traces a workload")
    return _scheduled(name, pre_bucketing, preset)


@functools.lru_cache(maxsize=None)
def _scheduled(name: str, pre_bucketing: bool, preset: str | None) -> Scheduled:
    from fxglue.pipeline import PipelineOptions, prepare

    p = prepare(name, pipeline=PipelineOptions(pre_bucketing=pre_bucketing), preset=preset, greedy=False)
    before = str(p.inputs.gm.graph)
    p.record_greedy()
    return Scheduled(name, p.traced, p.inputs, p.estimator, p.problem, p.greedy, before)


@pytest.fixture(scope="session")
def get_scheduled():
    """``scheduled``, for a test (or a fixture of any scope) that traces a workload: asking for it
    makes a test slow (``pytest_collection_modifyitems``)."""
    return lambda name, pre_bucketing=False, preset=None: _scheduled(name, pre_bucketing, preset)


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
