"""planner/core/problem.py: the Problem and Plan types refuse what breaks their schema, each error
naming the file (read by ``planner.core.io``) and the field.

Round trips, atomic writes and files refused before the types see them are in test_io.py; the
numbers and structures no torch graph produces (non-finite, beyond any machine, hiding nodes
outside their interval) in test_hostile.py; ``copy_bytes`` and ``Link`` pricing in test_costs.py
and test_simulator.py.
"""

from __future__ import annotations

import json

import pytest

import planner
from tests.conftest import edit_json, load_fails_naming_file_and_field

# a valid file (the ``problem_file`` fixture) edited to break the Problem type: its fields, its
# references between collectives and nodes, its fingerprint
BROKEN = {
    "unknown top field": (lambda p: edit_json(p, lambda d: d.update(colour="red")), "colour: unknown field"),
    "unknown nested field": (lambda p: edit_json(p, lambda d: d["collectives"][0].update(extra=1)),
                             "collectives[0].extra: unknown field"),
    "missing nested field": (lambda p: edit_json(p, lambda d: d["collectives"][0].pop("kind")),
                             "collectives[0].kind: missing field"),
    "bad kind": (lambda p: edit_json(p, lambda d: d["collectives"][0].update(kind="broadcast")),
                 "collectives[0].kind"),
    "edited content": (lambda p: edit_json(p, lambda d: d["nodes"][1].update(est_ms=9.0)),
                       "fingerprint does not match"),
    "dangling wait": (lambda p: edit_json(p, lambda d: d["collectives"][0].update(wait="nope")),
                      "collectives[0] (ag): wait node 'nope' is not among nodes"),
    # unpinned compute is version 2's: a version-1 reader would undercount it
    "unpinned compute in version 1": (lambda p: edit_json(p, lambda d: d["nodes"][1].update(unpinned_ms=2.0)),
                                      "nodes[1] (mm): unpinned_ms is new in problem version 2"),
}


def test_a_version_1_problem_reads_and_fingerprints_as_before(problem_file):
    """Problems written before version 2 keep their fingerprints (plans stay bound to them): the
    new field is fingerprinted only when set, and a problem without unpinned compute stays at 1."""
    data = json.loads(problem_file.read_text())
    assert data["schema_version"] == 1
    # what bucketplan at 9f68a77, before version 2, fingerprinted the fixture's problem as
    assert planner.load_problem(problem_file).fingerprint == \
        "sha256:c7dfeef0a7a429442d479f9425620cd3062bef457d79ff451143a3daa20506c7"


def test_unpinned_compute_makes_a_version_2_problem_and_runs_on_the_compute_stream(problem_file):
    problem = planner.load_problem(problem_file)
    nodes = list(problem.nodes)
    nodes[1] = nodes[1].model_copy(update={"unpinned_ms": 2.0})
    v2 = problem.model_copy(update={"nodes": tuple(nodes)}).with_fingerprint()
    assert v2.schema_version == 2 and v2.fingerprint != problem.fingerprint
    path = problem_file.parent / "v2.json"
    planner.save(v2, path)
    assert planner.load_problem(path) == v2
    # mm (1 ms) now runs 2 ms of unpinned compute before it: the exposed all_gather waits as before
    # (issued first), so the step grows by exactly 2 ms
    assert planner.simulate(v2).compute_ms == pytest.approx(planner.simulate(problem).compute_ms + 2.0)


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_problem_file_names_file_and_field(problem_file, case):
    load_fails_naming_file_and_field(problem_file, *BROKEN[case])


def test_plan_with_anchor_outside_bucket_is_rejected(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"schema_version": 1, "problem_fingerprint": "x", "planner": "hand",
                                "created": "now", "buckets": [{"members": ["a", "b"], "start": "c", "wait": "a"}]}))
    with pytest.raises(planner.SchemaError, match=r"plan.json: invalid plan: buckets\[0\].*start anchor 'c' is not a member"):
        planner.load_plan(path)


def test_plan_with_collective_in_two_buckets_is_rejected(tmp_path):
    path = tmp_path / "plan.json"
    b = {"members": ["a", "b"], "start": "a", "wait": "b"}
    path.write_text(json.dumps({"schema_version": 1, "problem_fingerprint": "x", "planner": "hand",
                                "created": "now", "buckets": [b, {"members": ["b", "c"], "start": "b", "wait": "c"}]}))
    with pytest.raises(planner.SchemaError, match="collective 'b' is in bucket 0 and bucket 1"):
        planner.load_plan(path)
