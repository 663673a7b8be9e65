"""The compile hook's plan cache without compiling: the pass ``record``/``use`` install, called
on a traced training graph exactly as inductor calls it on a post-grad graph.

(The real ``torch.compile`` runs, with numbers, are in test_compile.py.)"""

from __future__ import annotations

import logging
import os

import pytest

import planner
from fxglue.run import compile as bucketplan_compile
from fxglue.pipeline import count_collectives
from planner.jobs.plan_dir import GREEDY, PLAN, PROBLEM, read_index, recorded_problems, SolveDirOptions, solve_dir
from tests.bounded import bounded

pytestmark = pytest.mark.slow  # torch's compile pass on traced graphs

WORKLOAD = "llama3-8b-ddp-2"


def _run_pass(ctx, caplog, workload=WORKLOAD):
    """Trace ``workload`` afresh and run the installed post-grad pass on it; returns the
    session, the graph's collectives after the pass and the warnings logged."""
    from torch._inductor import config

    from fxglue.models.workloads import trace

    traced = trace(workload)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="bucketplan.compile"), ctx as session:
        with traced.fake_mode:
            config.post_grad_custom_post_pass(traced.gm.graph)
    warnings = [r.getMessage() for r in caplog.records if r.name == "bucketplan.compile"]
    return session, sum(count_collectives(traced.gm).values()), warnings


@pytest.fixture(scope="module")
def solved(tmp_path_factory):
    """A plan directory recorded from one traced graph and solved (count objective, 10 s)."""
    plan_dir = tmp_path_factory.mktemp("plans")
    from fxglue.models.workloads import trace

    traced = trace(WORKLOAD)
    with bucketplan_compile.record(plan_dir) as session:
        from torch._inductor import config

        with traced.fake_mode:
            config.post_grad_custom_post_pass(traced.gm.graph)
    solve_dir(plan_dir, SolveDirOptions(objective="count", time_limit_s=10))
    return plan_dir, session


def test_record_writes_problem_greedy_and_index(solved):
    plan_dir, session = solved
    (folder,) = recorded_problems(plan_dir)
    problem = planner.load_problem(folder / PROBLEM)
    greedy = planner.load_plan(folder / GREEDY)
    assert greedy.problem_fingerprint == problem.fingerprint
    (event,) = session.events
    assert event.outcome == "recorded" and event.fingerprint == problem.fingerprint
    assert folder.name == problem.fingerprint.split(":")[-1]
    (entry,) = read_index(plan_dir)
    assert entry["fingerprint"] == problem.fingerprint and entry["collectives"] == len(problem.collectives)
    # torch's own bucketing ran on the graph, as it would have without record
    assert event.collectives_after < event.collectives_before == len(problem.collectives)


def test_use_applies_the_plan(solved, caplog):
    plan_dir, _ = solved
    (folder,) = recorded_problems(plan_dir)
    problem, plan = planner.load_problem(folder / PROBLEM), planner.load_plan(folder / PLAN)
    session, after, warnings = _run_pass(bucketplan_compile.use(plan_dir), caplog)
    assert warnings == []
    (event,) = session.events
    assert event.outcome == "planned" and after == planner.collectives_after(problem, plan) == event.collectives_after


def _break(plan_dir, how: str) -> None:
    (folder,) = recorded_problems(plan_dir)
    path = folder / PLAN
    if how == "corrupt":
        path.write_text("{ not json")
    elif how == "foreign":
        greedy = planner.load_plan(folder / GREEDY)
        planner.save(greedy.model_copy(update={"problem_fingerprint": "sha256:" + "0" * 64}), path)
    elif how == "infeasible":  # a bucket that breaks a rule: every collective of one key in one bucket
        problem = planner.load_problem(folder / PROBLEM)
        names = [c.name for c in problem.collectives]
        bucket = planner.Bucket(members=tuple(names), start=names[0], wait=names[0])
        planner.save(planner.Plan(problem_fingerprint=problem.fingerprint, planner="hand", buckets=(bucket,),
                                  created="2026-11-30T00:00:00+00:00"), path)
    elif how == "missing":
        path.unlink()
    elif how == "directory":
        path.unlink()
        path.mkdir()
    elif how == "fifo":  # reading it would block the compile forever
        path.unlink()
        os.mkfifo(path)
    elif how == "endless":  # reading it would never end
        path.unlink()
        path.symlink_to("/dev/zero")


@pytest.mark.parametrize("how,says", [
    ("corrupt", "unreadable plan"),
    ("foreign", "is for another problem"),
    ("infeasible", "fails verification"),
    ("missing", "no plan in"),
    ("directory", "unreadable plan"),
    ("fifo", "unreadable plan"),
    ("endless", "unreadable plan"),
])
def test_a_bad_cache_entry_falls_back_to_torch_with_one_warning(solved, tmp_path, caplog, how, says):
    import shutil

    plan_dir = tmp_path / "plans"
    shutil.copytree(solved[0], plan_dir)
    _break(plan_dir, how)
    before = {p.name: p.read_bytes() for p in plan_dir.rglob("*") if p.is_file() and not p.is_symlink()}
    with bounded(120, "the pass"):  # a FIFO plan once blocked the compile, /dev/zero read without end
        session, after, warnings = _run_pass(bucketplan_compile.use(plan_dir), caplog)
        key = config_uuid(bucketplan_compile.use(plan_dir))  # inductor's cache key reads every plan
    assert len(key) == 64
    (event,) = session.events
    assert event.outcome.startswith("fallback") and len(warnings) == 1 and says in warnings[0], warnings
    assert after == event.collectives_after < event.collectives_before  # torch's greedy bucketed it
    assert {p.name: p.read_bytes() for p in plan_dir.rglob("*")
            if p.is_file() and not p.is_symlink()} == before  # nothing touched


def test_another_model_has_another_fingerprint_and_falls_back(solved, caplog):
    plan_dir, _ = solved
    session, _, warnings = _run_pass(bucketplan_compile.use(plan_dir), caplog, workload="llama3-8b-fsdp-2")
    assert [e.outcome.split(":")[0] for e in session.events] == ["fallback"]
    assert len(warnings) == 1 and "no plan in" in warnings[0] and "1 recorded problem(s)" in warnings[0]


def test_fingerprints_are_stable_across_traces(solved, tmp_path, caplog):
    session, _, _ = _run_pass(bucketplan_compile.record(tmp_path), caplog)
    assert session.events[0].fingerprint == solved[1].events[0].fingerprint  # a fresh trace, same problem


def test_record_refuses_a_directory_it_cannot_write(tmp_path):
    from pathlib import Path

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    # /sys is read-only even for root (the CI user); a path below a file cannot be created either
    for where in (Path("/sys/bucketplan-plans"), blocker / "plans"):
        with pytest.raises(bucketplan_compile.PlanCacheError, match="cannot record plans there"):
            bucketplan_compile.record(where)
    assert not Path("/sys/bucketplan-plans").exists()


def test_an_unknown_preset_is_refused_before_anything_compiles(tmp_path):
    for enter in (bucketplan_compile.record, bucketplan_compile.use):
        with pytest.raises(ValueError, match="no-such-cluster"):
            enter(tmp_path / "p", preset="no-such-cluster")


@pytest.mark.parametrize("how,says", [
    ("missing directory", "no plan directory"),
    ("file for the directory", "not a directory"),
])
def test_use_without_a_plan_directory_falls_back_with_one_warning(tmp_path, caplog, how, says):
    # compilation never fails because of the plan cache: no directory is one more missing plan
    plan_dir = tmp_path / "plans"
    if how == "file for the directory":
        plan_dir.write_text("")
    session, after, warnings = _run_pass(bucketplan_compile.use(plan_dir), caplog)
    (event,) = session.events
    assert event.outcome.startswith("fallback") and len(warnings) == 1 and says in warnings[0], warnings
    assert after == event.collectives_after < event.collectives_before  # torch's greedy bucketed it


def config_uuid(ctx) -> str:
    """The cache key part of the pass ``ctx`` installs, as inductor asks for it."""
    from torch._inductor import config

    with ctx:
        return config.post_grad_custom_post_pass.uuid()


def _pass_uuid(mode: str, plan_dir) -> str:
    enter = bucketplan_compile.use if mode == "use" else bucketplan_compile.record
    return config_uuid(enter(plan_dir))


def test_the_cache_key_is_stable_for_the_same_plans_and_changes_with_them(solved, tmp_path):
    """Inductor calls ``uuid()`` whenever its FX-graph cache is on (the default): the key must be
    computable (it once read sibling files by name and raised after a move), equal in another
    process for the same plans (or nothing is ever served from the cache) and different when a
    plan changes (or a stale compiled graph would be served)."""
    import shutil
    import subprocess
    import sys

    plan_dir = tmp_path / "plans"
    shutil.copytree(solved[0], plan_dir)
    key = _pass_uuid("use", plan_dir)
    assert key == _pass_uuid("use", plan_dir)
    code = ("import sys; from tests.test_plan_cache import _pass_uuid; "
            "print(_pass_uuid('use', sys.argv[1]))")
    other = subprocess.run([sys.executable, "-c", code, str(plan_dir)], capture_output=True, text=True, timeout=300,
                           cwd=str(__import__("pathlib").Path(__file__).parents[1]))
    assert other.returncode == 0, other.stderr[-2000:]
    assert other.stdout.strip().splitlines()[-1] == key

    (plan_file,) = plan_dir.glob(f"*/{PLAN}")
    plan_file.write_bytes(plan_file.read_bytes().replace(b"}", b" }", 1))
    assert _pass_uuid("use", plan_dir) != key
    # record never serves a graph from the cache: it must see every graph to write its problem
    assert _pass_uuid("record", tmp_path / "r") != _pass_uuid("record", tmp_path / "r")


def test_the_code_digest_changes_with_any_module_of_the_package_wherever_it_lives(tmp_path, monkeypatch):
    """A package laid out like ours (a module in a subfolder, as compile.py in fxglue/run/): an
    edit, a new module or a move anywhere in it changes the digest; nothing is read by name."""
    import sys

    root = tmp_path / "pkgdigest"
    (root / "run").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "run" / "__init__.py").write_text("")
    (root / "run" / "mod.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    def digest() -> str:
        bucketplan_compile._source_digest.cache_clear()
        sys.modules.pop("pkgdigest", None)
        return bucketplan_compile._source_digest(("pkgdigest",))

    seen = [digest()]
    (root / "run" / "mod.py").write_text("X = 2\n")  # an edit
    seen.append(digest())
    (root / "run" / "other.py").write_text("")  # a new module
    seen.append(digest())
    (root / "run" / "other.py").rename(root / "other.py")  # a move
    seen.append(digest())
    assert len(set(seen)) == 4, seen
    bucketplan_compile._source_digest.cache_clear()
    # and the real key reads both of ours
    assert bucketplan_compile._source_digest() == bucketplan_compile._source_digest(("planner", "fxglue"))


def test_the_cache_key_depends_on_the_tp_layout(tmp_path):
    # the TP group and size price the groups, so they pick the problem and the plan
    keys = {config_uuid(bucketplan_compile.use(tmp_path, tp_group=g, tp_size=n)) for g, n in
            ((None, 1), ("tp0", 2), ("tp0", 4))}
    assert len(keys) == 3


def test_record_with_a_directory_where_the_index_goes_records_and_warns_once(tmp_path, caplog):
    from planner.jobs.plan_dir import INDEX

    plan_dir = tmp_path / "plans"
    (plan_dir / INDEX).mkdir(parents=True)
    session, after, warnings = _run_pass(bucketplan_compile.record(plan_dir), caplog)
    (event,) = session.events
    assert event.outcome == "recorded" and len(recorded_problems(plan_dir)) == 1  # the problem is the record
    assert len(warnings) == 1 and "cannot append to the index" in warnings[0] and str(plan_dir) in warnings[0]
    assert after == event.collectives_after < event.collectives_before  # torch's greedy bucketed it


def test_record_into_a_directory_that_cannot_take_the_problem_warns_and_compiles(tmp_path, caplog):
    """A file where the problem's folder goes: one warning, torch's bucketing still runs
    (compilation never fails because of the plan cache)."""
    from planner.jobs.plan_dir import problem_dir

    plan_dir = tmp_path / "plans"
    probe, _, _ = _run_pass(bucketplan_compile.record(tmp_path / "probe"), caplog)
    fingerprint = probe.events[0].fingerprint
    plan_dir.mkdir()
    in_the_way = problem_dir(plan_dir, fingerprint)
    in_the_way.write_text("in the way")
    session, after, warnings = _run_pass(bucketplan_compile.record(plan_dir), caplog)
    (event,) = session.events
    assert event.outcome.startswith("not recorded") and len(warnings) == 1, warnings
    assert str(in_the_way) in warnings[0]
    assert after == event.collectives_after < event.collectives_before  # torch's greedy bucketed it
    assert in_the_way.read_text() == "in the way"
