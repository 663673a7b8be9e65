"""fxglue/profile.py: ``--profile TRACE.json`` prices a graph by a Chrome trace of the step, read
by torch's own profile-guided estimation. The trace is synthetic, written here: one matmul shape
of llama3-8b-fsdp-2 timed at 1.234 ms, and NCCL all_gather / reduce_scatter kernels on the
64-rank data-parallel group of h100-8nodes at published nccl-tests rates (all_gather ~320 GB/s
bus bandwidth across 8 nodes: issue 28).
"""

from __future__ import annotations

import json
import re
import sys

import pytest
import torch

from tests.support import run_cli

pytestmark = pytest.mark.slow  # traces workloads priced by profiles

MM_SHAPE = [[4096, 4096], [4096, 4096]]
MM_US = 1234.0
RANKS = list(range(64))
BUSBW_GBPS = 320.0
WIRES = [64 << 20, 256 << 20, 1 << 30]  # full-tensor bytes of the measured messages


def _nccl_us(wire: int) -> float:
    # nccl-tests: busbw = algbw * (n - 1) / n, algbw = size / time
    return wire * (len(RANKS) - 1) / len(RANKS) / (BUSBW_GBPS * 1e9) * 1e6


def write_trace(path) -> None:
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 10,
         "args": {"External id": 1, "Input Dims": MM_SHAPE, "Input Strides": [[4096, 1], [1, 4096]],
                  "Input type": ["c10::BFloat16", "c10::BFloat16"]}},
        {"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_bf16bf16_bf16f32", "ts": 20, "dur": MM_US,
         "args": {"External id": 1}},
    ]
    for kind, name in (("all_gather", "_allgather_base"), ("reduce_scatter", "_reduce_scatter_base")):
        for wire in WIRES:
            full, shard = wire // 2, wire // 2 // len(RANKS)  # bf16 elements
            events.append({"ph": "X", "cat": "kernel", "name": "ncclDevKernel_" + kind, "ts": 0,
                           "dur": _nccl_us(wire),
                           "args": {"Collective name": name, "Process Group Name": "0",
                                    "Process Group Ranks": json.dumps(RANKS), "Group size": len(RANKS),
                                    "In msg nelems": shard if kind == "all_gather" else full,
                                    "Out msg nelems": full if kind == "all_gather" else shard,
                                    "dtype": "BFloat16"}})
    path.write_text(json.dumps({"traceEvents": events}))


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    from fxglue.pipeline import prepare
    from fxglue.presets import get_preset
    from fxglue.profile import with_profile

    path = tmp_path_factory.mktemp("profile") / "trace.json"
    write_trace(path)
    preset = with_profile(get_preset("h100-8nodes"), path)
    return path, prepare("llama3-8b-fsdp-2", preset=preset, greedy=False)


def test_a_profiled_matmul_costs_what_torchs_own_profile_estimator_says(profiled):
    from torch._inductor.fx_passes.profile_guided_estimation import ProfileGuidedEstimator

    path, prepared = profiled
    torchs = ProfileGuidedEstimator(str(path))
    graph = {n.name: n for n in prepared.inputs.gm.graph.nodes}
    mms = [n for n in prepared.problem.nodes if graph[n.name].target == torch.ops.aten.mm.default]
    hit = [n for n in mms if torchs(graph[n.name]) is not None]
    assert len(hit) >= 4 and len(hit) < len(mms)  # the one shape the trace has, and only it
    for n in hit:
        assert n.est_ms == pytest.approx(MM_US / 1e3, rel=1e-12) == torchs(graph[n.name])
    assert all(n.est_ms != pytest.approx(MM_US / 1e3) for n in mms if n not in hit)


def test_profiled_collectives_price_the_problem_and_torchs_scheduler_alike(profiled):
    _, prepared = profiled
    problem = prepared.problem
    (link,) = problem.links
    for wire in WIRES:
        for kind in ("all_gather", "reduce_scatter"):
            assert link.time_ms(kind, wire) == pytest.approx(_nccl_us(wire) / 1e3, rel=5e-3), (kind, wire)
    for c in problem.collectives:
        assert c.est_ms == pytest.approx(link.time_ms(c.kind, c.wire_bytes), rel=1e-9), c.name
    assert "profile" in link.hardware or "trace.json" in link.hardware


BAD = {
    "missing": (None, "no such file"),
    "not JSON": ("{not json", "not a Chrome trace (not JSON"),
    "no events": (json.dumps({"meta": 1}), "no traceEvents list"),
    "nothing usable": (json.dumps({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::add"}]}),
                       "no GPU kernel with an op's input shapes"),
}


def _nccl_event(**over) -> dict:
    args = {"Collective name": "_allgather_base", "Process Group Name": "0", "Process Group Ranks": json.dumps(RANKS),
            "Group size": len(RANKS), "In msg nelems": 1024, "Out msg nelems": 1024 * len(RANKS),
            "dtype": "BFloat16"}
    dur = over.pop("dur", 100.0)
    args.update(over)
    return {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllGather", "ts": 0, "dur": dur, "args": args}


def _trace(*events) -> str:
    return json.dumps({"traceEvents": list(events)}, allow_nan=True)


# what torch's parser took silently and priced wrongly (a 1-byte dtype, 4 ranks of one, 0 ms)
BAD.update({
    "unknown dtype": (_trace(_nccl_event(dtype="Weird")), "dtype 'Weird' is not a dtype torch knows"),
    "a rank twice": (_trace(_nccl_event(**{"Process Group Ranks": "[0, 0, 0, 0]"})), "names a rank twice"),
    "nan duration": (_trace(_nccl_event(dur=float("nan"))), "dur nan is not a duration"),
    "inf duration": (_trace(_nccl_event(dur=float("inf"))), "dur inf is not a duration"),
    "huge duration": (_trace(_nccl_event(dur=1e15)), "is not a duration"),
    "huge nelems": (_trace(_nccl_event(**{"Out msg nelems": 1e30})), "Out msg nelems 1e+30 is not a whole number"),
    "negative nelems": (_trace(_nccl_event(**{"In msg nelems": -5})), "In msg nelems -5 is not a whole number"),
    "huge kernel": (_trace({"ph": "X", "cat": "kernel", "name": "gemm", "ts": 0, "dur": 1e12, "args": {}}),
                    "is not a duration"),
    "falling": (_trace(_nccl_event(dur=100.0), _nccl_event(dur=50.0, **{"In msg nelems": 2048,
                                                                        "Out msg nelems": 2048 * len(RANKS)})),
                "cannot be extended above it"),
})


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_trace_is_one_line_naming_the_file_exit_2(tmp_path, capfd, case):
    """`bucketplan extract --profile BAD`: in this process (its file descriptors captured), and for
    one case in a child process as a shell runs it."""
    from bucketplan.cli import main

    text, message = BAD[case]
    path = tmp_path / "trace.json"
    if text is not None:
        path.write_text(text)
    argv = ["extract", "llama3-8b-fsdp-2", "--profile", str(path), "-o", str(tmp_path / "out")]
    if case == "not JSON":
        r = run_cli(*argv)
        code, err = r.returncode, r.stderr
    else:
        code, err = main(argv), capfd.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and message in lines[0], err
    assert not (tmp_path / "out").exists()


def _op_trace(*durs) -> str:
    """A matmul whose kernels ran ``durs`` µs (torch's parser sums an op's kernels)."""
    op = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 10,
          "args": {"External id": 1, "Input Dims": MM_SHAPE, "Input Strides": [[4096, 1], [1, 4096]],
                   "Input type": ["c10::BFloat16", "c10::BFloat16"]}}
    kernels = [{"ph": "X", "cat": "kernel", "name": "gemm", "ts": 20, "dur": d, "args": {"External id": 1}}
               for d in durs]
    return _trace(op, *kernels)


def _nested(depth: int) -> str:
    dims = "[" * depth + "4" + "]" * depth
    return ('{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "args": {"External id": 1, '
            f'"Input Dims": [{dims}]}}}}, {{"ph": "X", "cat": "kernel", "name": "g", "dur": 5, '
            '"args": {"External id": 1}}]}')


# the same checks, read directly (no CLI start-up): where torch's parser, json or Python itself
# raised something else than one line naming the file
DIRECT = {
    "an op kernel of inf": (_op_trace(float("inf")), "traceEvents[1] (gemm): dur inf is not a duration"),
    "an op's kernels summing past a step": (_op_trace(6e11, 6e11), "op aten::mm ran 1.2e+12 µs in its kernels"),
    # JSON integers have no bound: float() of this one overflows
    "a duration of 400 digits": (_trace(_nccl_event(dur=10**400)),
                                 "traceEvents[0] (ncclDevKernel_AllGather): dur 1000"),
    "an integer of 5000 digits": ('{"traceEvents": [{"cat": "kernel", "dur": 1' + "0" * 5000 + "}]}",
                                  "not a Chrome trace (Exceeds the limit"),
    # torch's parser takes a group's ranks from distributedInfo.pg_config where the event lists none
    "a rank twice in pg_config": (
        json.dumps({"distributedInfo": {"pg_config": [{"pg_name": "0", "ranks": [0, 0, 0, 0]}]},
                    "traceEvents": [_nccl_event(**{"Process Group Ranks": ""})]}),
        "distributedInfo.pg_config '0': ranks [0, 0, 0, 0] names a rank twice"),
    "a rank that is no integer in pg_config": (
        json.dumps({"distributedInfo": {"pg_config": {"0": {"ranks": [0.5, 1.5]}}},
                    "traceEvents": [_nccl_event(**{"Process Group Ranks": ""})]}), "is not a list of ranks"),
    "JSON nested past the stack": ("[" * 100_000 + "]" * 100_000, "nested deeper than Python can read"),
}


@pytest.mark.parametrize("case", sorted(DIRECT))
def test_a_bad_trace_read_directly_is_one_line_naming_the_file(tmp_path, case):
    from fxglue.profile import ProfileError, read_profile

    text, message = DIRECT[case]
    path = tmp_path / "trace.json"
    path.write_text(text)
    with pytest.raises(ProfileError) as e:
        read_profile(path, 8)
    assert len(str(e.value).splitlines()) == 1 and str(e.value).startswith(str(path)) and message in str(e.value), \
        str(e.value)
    assert len(str(e.value)) < 300


def test_shapes_nested_past_the_stack_are_one_line_however_deep_the_reader_gets(tmp_path):
    """Shallow enough for json, deep enough for torch's parser, which recurses into shapes (which
    of the two gives up depends on the stack already in use; either is one line)."""
    from fxglue.profile import ProfileError, read_profile

    path = tmp_path / "trace.json"
    path.write_text(_nested(sys.getrecursionlimit() - 50))
    with pytest.raises(ProfileError, match="^" + re.escape(str(path))):
        read_profile(path, 8)
