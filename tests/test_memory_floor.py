"""``planner.cost.bounds.peak_memory_floor``: never above the least peak of any plan (brute force
over every plan with free positions of tiny problems, each peak counted by
``planner.cost.memory``), and what ``position_search`` says when nothing fits a cap: "no plan
fits" only below that floor, else what it found and in how long."""

from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import planner
from planner.cost.bounds import peak_memory_floor
from planner.cost.memory import peak_bytes
from planner.search.free.position_search import position_search, positioned_policy
from tests.strategies import problems

GB = 10**9


@pytest.mark.slow  # brute force: every positioned plan of 40 problems, each peak counted (~13 s)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_the_memory_floor_is_never_above_the_least_peak_of_any_plan(data):
    from tests.brute import positioned_plans
    from tests.strategies import exact_memory, gathers_before_use

    if data.draw(st.booleans()):
        problem = data.draw(exact_memory(data.draw(problems(max_collectives=2, max_compute=3, costs=True,
                                                            dtypes=("bfloat16",)))))
    else:  # FSDP's shape: gathers held until their users, where the floor counts them
        problem = data.draw(gathers_before_use())
    rules = positioned_policy(None).as_params()
    least = min(peak_bytes(problem, plan) for plan in positioned_plans(problem) if not planner.verify(problem, plan,
                                                                                                      **rules))
    floor = peak_memory_floor(problem)
    assert floor <= least, (floor, least)
    # never below what the graph holds by itself at its fullest (every plan holds that)
    assert floor >= max(problem.memory.run_peak_bytes)


def _spike(unit: int = 10**7) -> planner.Problem:
    """mm0 (the graph holds 120 units while it runs), an all_gather of 100 units started at 1 and
    waited at 3, read by mm2 at 4. Worked by hand: every plan holds the gather's output until its
    wait and the wait's storage from it (200 units at the wait: the least peak), the wait's storage
    alone at mm2 (100), and the graph's 120 at mm0 whatever the plan: the floor is 120 units."""
    N = planner.Node
    nodes = (N(name="mm0", kind="compute", pos=0, est_ms=2.0), N(name="ag", kind="start", pos=1, est_ms=0.0),
             N(name="mm1", kind="compute", pos=2, est_ms=2.0), N(name="w", kind="wait", pos=3, est_ms=0.0, deps=(1,)),
             N(name="mm2", kind="compute", pos=4, est_ms=1.0, deps=(3,)))
    size = 100 * unit
    gather = planner.Collective(name="ag", wait="w", kind="all_gather", pg="0", key="ag/0", dtype="bfloat16",
                                size_bytes=size, wire_bytes=size, est_ms=3.0, exposed_ms=1.0, start_pos=1, wait_pos=3,
                                hiding=("mm1",), status="partly")
    memory = planner.MemoryProfile(
        segment_peak_bytes=(0,) * 6, run_starts=(0, 1, 2, 3, 4), run_peak_bytes=(120 * unit, 0, 0, 0, 0),
        before_bytes=(0,) * 5,
        buffers={"ag": planner.CollectiveBuffers(out_bytes=size, out_last_use=3, wait_bytes=size, wait_last_use=4)})
    link = planner.Link(pg="0", group_size=2, latency_ms=3.0, bandwidth_gbps=1e9)
    return planner.Problem(bucket_mode="default", bucket_cap_bytes=1 << 40, n_scheduled=5, collectives=(gather,),
                           nodes=nodes, links=(link,), timelines=(), memory=memory).with_fingerprint()


def test_the_memory_floor_of_a_hand_worked_problem():
    from tests.brute import positioned_plans

    problem = _spike()
    assert peak_memory_floor(problem) == 120 * 10**7
    rules = positioned_policy(None).as_params()
    assert min(peak_bytes(problem, p) for p in positioned_plans(problem)
               if not planner.verify(problem, p, **rules)) == 200 * 10**7


def test_below_the_floor_the_search_says_no_plan_fits_and_does_not_search():
    """A cap of 1.0 GB under a floor of 1.2: proved, so refused at once (a deadline already past
    would otherwise answer 'give it more time')."""
    with pytest.raises(ValueError) as caught:
        position_search(_spike(), [], peak_memory_bytes=1 * GB, deadline=time.perf_counter())
    message = str(caught.value)
    assert message.startswith("no plan of this problem fits a peak of 1000000000 bytes: every plan peaks at "
                              "1200000000 bytes or more"), message


def test_above_the_floor_the_search_says_what_it_reached_not_that_none_fits():
    """A cap of 1.5 GB: above the floor (1.2), below every plan's peak (2.0 by brute force above),
    so nothing is found, and nothing proves that none fits: the message says what was found."""
    with pytest.raises(ValueError) as caught:
        position_search(_spike(), [], peak_memory_bytes=15 * GB // 10, deadline=time.perf_counter() + 30)
    message = str(caught.value)
    assert "no plan of this problem fits" not in message
    assert message.startswith("no plan within a peak of 1500000000 bytes (1.500 GB) found in "), message
    assert "the lowest peak reached was 2.000 GB (no plan can peak below 1.200 GB)" in message


def test_the_cli_keeps_the_one_line_form(tmp_path, capsys):
    from bucketplan.cli import main
    from tests.test_hostile import assert_one_line_error

    path, out = tmp_path / "problem.json", tmp_path / "plan.json"
    planner.save(_spike(), path)
    code = main(["solve", str(path), "-o", str(out), "-q", "--time-limit", "2", "--objective", "step",
                 "--positions", "free", "--peak-memory-gb", "1.5"])
    assert_one_line_error(code, capsys.readouterr().err, "--peak-memory-gb: no plan within a peak of 1500000000 bytes",
                          "the lowest peak reached was 2.000 GB")
    assert not out.exists()
