"""planner/core/policy.py: the policy a plan must keep travels as one value, is recorded in a plan's
``params``, and reads back (``planner.rules.verifier.recorded_policy``) as the same policy, which then
decides the verdict.

The command line's side (``bucketplan verify`` reporting the recorded policy, flags overriding
it, a recorded value that is no policy as a one-line error) is in test_verify_cli.py; the rules
each policy changes in test_rules.py and test_verify_regressions.py.
"""

from __future__ import annotations

import inspect

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import planner
from planner.search.cpsat import build_model
from planner.core.policy import Policy
from planner.core.problem import MAX_BYTES
from planner.rules.verifier import check, recorded_policy, verify
from tests.test_verify_cli import MERGED, P

# rs_a's input: MERGED issues it at rs_b's start, later than its own (positions 0 -> 4), so its
# input stays alive until then (rule 10, torch's accounting; P has no memory profile, so the input
# is its size_bytes). Waiting it later holds nothing.
EXTRA = next(c.size_bytes for c in P.collectives if c.name == "rs_a")


def _plan(params: dict, buckets=MERGED) -> planner.Plan:
    return planner.Plan(problem_fingerprint=P.fingerprint, planner="hand", created="t", buckets=buckets,
                        params=params)


@pytest.mark.parametrize("fn", [verify, check], ids=lambda f: f.__name__)
def test_as_params_are_keywords_of_every_function_that_takes_a_policy_with_the_same_defaults(fn):
    params = inspect.signature(fn).parameters
    for key, default in Policy().as_params().items():
        assert params[key].kind is inspect.Parameter.KEYWORD_ONLY, (fn.__name__, key)
        assert params[key].default == default, (fn.__name__, key)


@pytest.mark.parametrize("fn", [planner.solve, planner.repair], ids=lambda f: f.__name__)
def test_the_searches_take_the_policy_inside_their_options_with_the_same_default(fn):
    options = inspect.signature(fn).parameters["options"].default
    assert isinstance(options, planner.SolveOptions) and options.policy == Policy()


def test_the_model_takes_the_policy_whole_with_the_same_default():
    assert inspect.signature(build_model).parameters["policy"].default == Policy()


def test_the_model_reads_both_policy_fields():
    # P's first collective is partly hidden: protect_partly keeps it alone (fewer merge variables);
    # a budget adds rule 10's constraints
    free, protected = build_model(P).stats, build_model(P, policy=Policy(protect_partly=True)).stats
    budget = build_model(P, policy=Policy(memory_budget_bytes=1)).stats
    assert protected["x_vars"] < free["x_vars"]
    assert "rule10_memory" in budget and "rule10_memory" not in free


@pytest.mark.parametrize("fields, name", [({"protect_partly": "no"}, "protect_partly"),
                                          ({"memory_budget_bytes": -1}, "memory_budget_bytes"),
                                          ({"keep_overlap": 1}, "keep_overlap"),
                                          ({"peak_memory_bytes": 2.5}, "peak_memory_bytes")])
def test_a_policy_is_checked_when_built(fields, name):
    with pytest.raises(ValueError, match=f"^{name} must be"):
        Policy(**fields)


def test_the_cp_sat_search_refuses_a_policy_it_cannot_keep():
    for policy in (Policy(keep_overlap=False), Policy(peak_memory_bytes=10**9)):
        with pytest.raises(ValueError, match="^the CP-SAT search keeps torch's overlap"):
            planner.SolveOptions(policy=policy)


@settings(max_examples=40, deadline=None)
@given(st.booleans(), st.none() | st.integers(0, MAX_BYTES - 1))
def test_a_policy_recorded_in_a_plan_file_reads_back_as_itself(tmp_path_factory, protect_partly, budget):
    policy = Policy(protect_partly=protect_partly, memory_budget_bytes=budget)
    path = tmp_path_factory.mktemp("policy") / "plan.json"
    planner.save(_plan({"planner_knob": 3, **policy.as_params()}), path)
    recorded = recorded_policy(planner.load_plan(path))
    assert recorded == {"protect_partly": protect_partly, "memory_budget_bytes": budget}
    assert Policy(**recorded) == policy


def test_recorded_policy_reads_only_the_keys_present_and_not_overridden():
    assert recorded_policy(_plan({})) == {}  # nothing recorded: verify's defaults apply
    assert recorded_policy(_plan({"memory_budget_bytes": 0})) == {"memory_budget_bytes": 0}
    broken = _plan({"protect_partly": "yes", "memory_budget_bytes": 5})
    with pytest.raises(ValueError, match="params.protect_partly: 'yes' is not a policy"):
        recorded_policy(broken)
    # a key the caller overrides is not read, so a broken value there does not matter
    assert recorded_policy(broken, ignore=("protect_partly",)) == {"memory_budget_bytes": 5}
    assert recorded_policy(broken, ignore=("protect_partly", "memory_budget_bytes")) == {}


@pytest.mark.parametrize("policy, rules", [
    (Policy(), set()),  # torch's policy: rs_a is only partly hidden, its hider may end up outside
    (Policy(protect_partly=True), {7}),  # mm_1, rs_a's hider, is no longer between its start and wait
    (Policy(memory_budget_bytes=EXTRA), set()),  # at the budget is within it
    (Policy(memory_budget_bytes=EXTRA - 1), {10}),
], ids=["default", "protect_partly", "budget of the extra bytes", "budget a byte short"])
def test_the_recorded_policy_decides_the_verdict_on_the_merged_plan(policy, rules):
    plan = _plan(policy.as_params())
    assert {v.rule for v in verify(P, plan, **recorded_policy(plan))} == rules


@pytest.mark.parametrize("policy", [Policy(), Policy(protect_partly=True), Policy(memory_budget_bytes=0)],
                         ids=["default", "protect_partly", "no extra memory"])
def test_a_solved_plan_records_its_policy_and_verifies_under_it(policy):
    result = planner.solve(P, planner.SolveOptions(time_limit_s=5, workers=1, policy=policy))
    recorded = recorded_policy(result.plan)
    assert recorded == policy.as_params()
    assert verify(P, result.plan, **recorded) == []
    # the merge is the optimum under torch's policy and breaks both stricter ones (above)
    assert result.plan.buckets == (MERGED if policy == Policy() else ())
