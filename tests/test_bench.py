"""``examples/train_compiled.py bench`` (``fxglue.run.bench``): the compiled step measured under
torch's bucketing, torch's manual per-block pass and the plans, each beside its simulated step,
with a profiler trace of each that ``--profile`` reads back.

On this CPU the run is 2 gloo ranks of a 1-layer FSDP model: plumbing and the table are checked
(every simulated figure recomputed here from the files the run left, the traces read back into a
recorded problem), never a timing. The contention a GPU trace shows is checked on a trace written
here, against a figure worked out by hand.
"""

from __future__ import annotations

import json
import re
import shutil

import pytest

import planner
from fxglue.run.bench import Graph, Result, contention_from_trace, order_lines, simulated, table
from fxglue.run.compile import GraphEvent, Session
from planner.jobs.plan_dir import GREEDY, PLAN, PROBLEM, fingerprint_digest
from tests.chain import chain_problem, pairs_plan
from tests.test_training_flow import ROOT, flow_env, graph_lines, run

pytestmark = pytest.mark.slow  # compiles on gloo ranks; the flag checks start the example


def _kernel(name, ts, dur, *, grid=(132, 1, 1), device=0, nccl=False) -> dict:
    args = {"device": device, "grid": list(grid), "block": [128, 1, 1]}
    if nccl:
        args.update({"Collective name": "_allgather_base"})
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "ts": ts, "dur": dur, "args": args}


def test_contention_in_a_gpu_trace_compares_each_kernel_with_itself():
    events = [
        _kernel("ncclDevKernel_AllGather", 1000, 500, nccl=True),  # device 0 busy 1000-1500
        # another device's, at the time of device 0's first gemms: they still ran alone
        _kernel("ncclDevKernel_AllGather", 0, 600, nccl=True, device=1),
        _kernel("gemm", 0, 100), _kernel("gemm", 200, 100), _kernel("gemm", 400, 110),  # alone
        _kernel("gemm", 1010, 150), _kernel("gemm", 1200, 130),  # inside the NCCL kernel
        _kernel("gemm", 1450, 100),  # half beside it: neither alone nor overlapped, left out
        _kernel("gemm", 1100, 200, grid=(66, 1, 1)),  # another launch of gemm: never alone, left out
        _kernel("gemm", 3000, 100, device=1),  # alone on device 1: gemm alone takes a median 100 us
    ]
    factor, kernels, ms = contention_from_trace({"traceEvents": events})
    # the two overlapped gemms took 150 + 130 = 280 us where alone they take 100 each: 280 / 200
    assert factor == pytest.approx(1.4) and kernels == 2 and ms == pytest.approx(0.28)
    assert contention_from_trace({"traceEvents": [e for e in events if e["ts"] < 1000]}) is None  # nothing overlapped


def _result(config, measured, simulated_ms) -> Result:
    return Result(config, [measured], [Graph("0/0/forward", "sha256:" + "a" * 64, (4, 2), "x", "y", simulated_ms)])


def test_the_table_sets_each_measured_step_beside_its_simulated_one():
    results = [_result("torch", 12.0, 4.0), _result("manual", 10.0, 5.0), _result("plan", 6.0, 3.0)]
    lines = table(results, "h100-8nodes")
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ") for line in lines
            if line.startswith("| ") and not line.startswith("| configuration") and "0/0/forward" not in line}
    assert [rows[c][-1].rstrip(" |") for c in ("torch", "manual", "plan")] == ["3.000", "2.000", "2.000"]
    said = "\n".join(order_lines(results))
    assert "Fastest measured: plan; fastest simulated: plan" in said
    # manual is measured faster than torch (10 < 12) and simulated slower (5 > 4)
    assert "torch vs manual: measured +20.0%, simulated -20.0% (DISAGREE" in said
    assert "torch vs plan: measured +100.0%, simulated +33.3% (agree" in said


def test_each_configuration_is_simulated_with_the_plan_it_ran(tmp_path):
    """A plan directory and a record directory as the contexts leave them: ``plan`` takes the
    plan where ``use`` applied it and torch's greedy plan where it fell back; ``torch`` takes
    torch's greedy plan; ``manual`` its problem as it is."""
    problem = chain_problem(60)
    greedy, plan = pairs_plan(problem), pairs_plan(problem).model_copy(update={"buckets": pairs_plan(problem).buckets[:1]})
    for root in (tmp_path / "plans", tmp_path / "out" / "record"):
        folder = root / fingerprint_digest(problem.fingerprint)
        planner.save(problem, folder / PROBLEM)
        planner.save(greedy, folder / GREEDY)
    planner.save(plan, tmp_path / "plans" / fingerprint_digest(problem.fingerprint) / PLAN)
    assert planner.simulate(problem, plan).step_ms != planner.simulate(problem, greedy).step_ms

    def session(outcome):
        s = Session(None, "x", [GraphEvent("0/0/backward", 0, "backward", problem.fingerprint, 8, 4, outcome)])
        s.problems[problem.fingerprint] = problem
        return s

    def priced(config, outcome):
        (g,) = simulated(config, session(outcome), tmp_path / "plans", tmp_path / "out")
        return g.priced_as, g.simulated_ms

    assert priced("plan", "planned") == ("its plan", planner.simulate(problem, plan).step_ms)
    assert priced("plan", "fallback: no plan") == ("torch's greedy plan (fallback)",
                                                   planner.simulate(problem, greedy).step_ms)
    assert priced("torch", "recorded") == ("torch's greedy plan", planner.simulate(problem, greedy).step_ms)
    assert priced("manual", "manual")[1] == planner.simulate(problem).step_ms
    shutil.rmtree(tmp_path / "out")
    how, ms = priced("torch", "recorded")
    assert ms is None and how.startswith("not priced: no readable greedy.json")


# -------------------------------------------------------------------------------------------
# The run itself: record, solve-dir, bench, and a trace read back by record
# -------------------------------------------------------------------------------------------

MODEL = "--parallel fsdp --layers 1"  # FSDP: torch's manual pass buckets only FSDP collectives


@pytest.fixture(scope="module")
def benched(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("bench")
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    env = flow_env(tmp_path)
    for command in (f"python examples/train_compiled.py record plans/ {MODEL}",
                    "bucketplan solve-dir plans/ --time-limit 3",
                    f"python examples/train_compiled.py bench plans/ {MODEL} --steps 2 --warmup 0 --out out"):
        r = run(command, tmp_path, env)
        assert r.returncode == 0, f"{command}: exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return tmp_path, env, r


def _rows(text: str, header: str) -> list[list[str]]:
    block = text[text.index(header):]
    rows = []
    for line in block.splitlines()[2:]:
        if not line.startswith("| "):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


@pytest.mark.slow  # three 2-rank compiles, a solve and three more: about 3 minutes on 2 cores
def test_bench_measures_and_simulates_every_configuration(benched):
    tmp_path, _, r = benched
    assert "Traceback" not in r.stderr
    text = (tmp_path / "out" / "bench.md").read_text()
    assert text in r.stdout + "\n" or text.strip() in r.stdout
    main = {row[0]: row for row in _rows(text, "| configuration | what |")}
    assert list(main) == ["torch", "manual", "plan"]
    # every simulated figure again, from the files the run left: torch's recorded problems with
    # torch's greedy plans, the plans' problems with their plans, manual's problems unbucketed
    graphs = _rows(text, "| configuration | graph |")
    expected = {"torch": 0.0, "manual": 0.0, "plan": 0.0}
    out, plans = tmp_path / "out", tmp_path / "plans"
    for config, graph, digest, collectives, outcome, how, ms in graphs:
        if config == "manual":
            (path,) = [p for p in (out / "problems" / "manual").iterdir() if p.name.startswith(digest)]
            got = planner.simulate(planner.load_problem(path)).step_ms
            before, after = map(int, collectives.split(" -> "))
            assert outcome == "manual" and after < before  # torch's pass merged each block's collectives
        else:
            root, name = (out / "record", GREEDY) if config == "torch" else (plans, PLAN)
            (folder,) = [p for p in root.iterdir() if p.name.startswith(digest)]
            assert outcome == ("recorded" if config == "torch" else "planned")
            got = planner.simulate(planner.load_problem(folder / PROBLEM), planner.load_plan(folder / name)).step_ms
        assert float(ms) == pytest.approx(got, abs=1e-3)
        expected[config] += got
    for config, total in expected.items():
        measured, simulated_ms, ratio = float(main[config][4]), float(main[config][6]), float(main[config][7])
        assert simulated_ms == pytest.approx(total, abs=2e-3) and total > 0
        assert measured > 0 and ratio == pytest.approx(measured / total, rel=1e-3)
    for config in main:
        for rank in (0, 1):
            assert (out / "traces" / f"{config}.rank{rank}.json").is_file()
    assert "no compute kernel ran both beside an NCCL kernel and alone" in text  # a CPU run: no GPU kernels


@pytest.mark.long  # 18 s: bench itself runs in the default run
def test_a_bench_trace_prices_the_next_record(benched):
    """The round trip: bench's trace of torch's configuration, given to record with --profile-cpu,
    prices the matmuls it timed at their CPU time in the recorded problems."""
    tmp_path, env, _ = benched
    trace = tmp_path / "out" / "traces" / "torch.rank0.json"
    r = run(f"python examples/train_compiled.py record plans-profiled/ {MODEL} --profile {trace} --profile-cpu",
            tmp_path, env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert {g[3] for g in graph_lines(r.stdout)} == {"recorded"}
    timed = {}  # the trace's matmuls: mean CPU time per input shapes, ms
    for ev in json.loads(trace.read_text())["traceEvents"]:
        if ev.get("cat") == "cpu_op" and ev.get("name") == "aten::mm":
            timed.setdefault(json.dumps(ev["args"]["Input Dims"]), []).append(ev["dur"] / 1e3)
    means = [sum(v) / len(v) for v in timed.values()]
    assert means
    profiled = [planner.load_problem(p) for p in (tmp_path / "plans-profiled").glob(f"*/{PROBLEM}")]
    plain = [planner.load_problem(p) for p in (tmp_path / "plans").glob(f"*/{PROBLEM}")]
    assert profiled and all("+cpu-profile-" in p.meta["preset"] for p in profiled)

    def at_trace_times(problems):
        return [n for p in problems for n in p.nodes if n.kind == "compute"
                and any(n.est_ms == pytest.approx(m, rel=1e-9) for m in means)]

    assert at_trace_times(profiled) and not at_trace_times(plain)
    # without the flag the same trace is refused in one line that names it and the flag
    r = run(f"python examples/train_compiled.py record plans-again/ {MODEL} --profile {trace}", tmp_path, env)
    assert r.returncode == 2 and re.search(r"--profile-cpu", r.stderr) and "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize("flags,says", [("--configs torch,nope", "--configs torch,nope: give distinct configurations"),
                                        ("--configs plan,plan", "give distinct configurations"),
                                        ("--steps 0", "--steps must be at least 1"),
                                        ("--profile-cpu", "--profile-cpu: give the CPU run's trace")])
def test_bad_bench_flags_are_one_line_exit_2(tmp_path, flags, says):
    r = run(f"python {ROOT / 'examples' / 'train_compiled.py'} bench plans/ {flags}", tmp_path, flow_env(tmp_path))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and says in r.stderr, r.stderr
    assert not (tmp_path / "bench").exists()
