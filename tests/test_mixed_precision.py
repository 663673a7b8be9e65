"""Mixed-precision FSDP (``llama3-8b-fsdp-mp-*``: fp32 shards gathered and computed in bf16).

Every all_gather is fed by a dtype conversion torch's merge folds into the bucket's copy
(``Collective.folded``); torch's scheduler makes some of those conversions hide other
collectives (on the built-in shapes at h100-8nodes: only partly hidden reduce_scatters, which
the default policy does not protect). The planner models such a conversion where it then runs
(the bucket's copy-in, ``planner.core.positions``); merging its all_gather elsewhere loses that
relation, which the quality figures count.
"""

from __future__ import annotations

import pytest
import torch

import planner
from fxglue.pipeline import prepare, run_pipeline

pytestmark = pytest.mark.slow  # traces a workload


def test_mixed_precision_gathers_fold_their_conversions_and_plans_merge_them():
    prepared = prepare("llama3-8b-fsdp-mp-2", preset="h100-8nodes", greedy=False)
    p = prepared.problem
    gathers = [c for c in p.collectives if c.kind == "all_gather"]
    # on the graph: each all_gather's input is a conversion of an fp32 shard to bf16
    by_name = {n.name: n for n in prepared.traced.gm.graph.nodes}
    for c in gathers:
        conversion = by_name[c.name].args[0]
        assert conversion.target in (torch.ops.aten._to_copy.default, torch.ops.prims.convert_element_type.default)
        assert conversion.args[0].meta["val"].dtype == torch.float32 and c.dtype == "bfloat16"
    folder = {f: c.name for c in p.collectives for f in c.folded}
    hiders = {folder[h] for c in p.collectives if c.status != "exposed" for h in c.hiding if h in folder}
    assert hiders, "torch's scheduler lets some conversions hide a collective"
    result = planner.solve(p, planner.SolveOptions(time_limit_s=10, workers=1))
    report = planner.check(p, result.plan)
    assert report.feasible, report.violations
    merged = {m for b in result.plan.buckets if len(b.members) > 1 for m in b.members}
    assert hiders & merged, "all_gathers whose conversion hides a collective are merged"
    assert report.quality.partly_kept < report.quality.partly_relations
    applied = run_pipeline("llama3-8b-fsdp-mp-2", planner_=result.plan, preset="h100-8nodes")
    assert sum(applied.collectives_after.values()) == result.objective
    left = {n.name for n in applied.gm.graph.nodes}
    assert not any(f in left for m in merged for f in {c.name: c for c in p.collectives}[m].folded)
