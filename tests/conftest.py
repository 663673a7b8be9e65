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


def fresh_schedule(name: str, pre_bucketing: bool = False):
    from fxglue.pipeline import estimator_for, schedule
    from fxglue.workloads import trace

    traced = trace(name)
    est = estimator_for(traced)
    return traced, schedule(traced, est, pre_bucketing=pre_bucketing), est


@functools.lru_cache(maxsize=None)
def scheduled(name: str, pre_bucketing: bool = False) -> Scheduled:
    from fxglue.extract import extract_problem
    from fxglue.greedy import greedy_plan

    traced, inputs, est = fresh_schedule(name, pre_bucketing)
    problem = extract_problem(inputs.gm.graph, inputs.collective_info, inputs.scheduled, estimator=est,
                              meta=traced.meta)
    before = str(inputs.gm.graph)
    plan = greedy_plan(inputs.gm.graph, inputs.collective_info, inputs.scheduled, estimator=est,
                       problem_fingerprint=problem.fingerprint, **inputs.bucketer_kwargs)
    return Scheduled(name, traced, inputs, est, problem, plan, before)


@pytest.fixture
def get_scheduled():
    return scheduled
