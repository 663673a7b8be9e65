"""Shared fixtures: traced and scheduled built-in workloads, cached per test session.

Tracing and scheduling an 8-layer workload takes seconds; many tests read the same
problem, so each (workload, pre-bucketing) pair is built once. Tests that mutate a graph
build their own copy with ``fresh_schedule``.
"""

from __future__ import annotations

import functools
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
