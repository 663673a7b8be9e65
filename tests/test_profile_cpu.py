"""``--profile TRACE --profile-cpu``: a trace of a CPU run prices the ops it timed by their CPU
time (``fxglue.profile``); torch's parser alone reads nothing from one (it takes times from GPU
kernels only). The traces are written here, shaped as ``torch.profiler`` writes a compiled
step's on this machine (measured: an extern ``aten::mm`` called with ``out=`` lists the output as
a third input; no ``kernel`` events; no collective metadata). The round trip through a real
compile is ``tests/test_bench.py``.
"""

from __future__ import annotations

import json

import pytest
import torch

from tests.support import run_cli

pytestmark = pytest.mark.slow  # traces workloads priced by CPU profiles

MM = [[4096, 4096], [4096, 4096]]
MM_STRIDES = [[4096, 1], [1, 4096]]
CPU_US = 52_345.0  # what the CPU took for one such matmul (any figure: it is read back)


def _mm_op(dims, strides, dur=CPU_US) -> dict:
    return {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": dur,
            "args": {"External id": 1, "Input Dims": dims, "Input Strides": strides,
                     "Input type": ["c10::BFloat16"] * len(dims)}}


def _write(path, *events) -> str:
    path.write_text(json.dumps({"traceEvents": list(events),
                                "distributedInfo": {"backend": "gloo", "rank": 0, "world_size": 2}}))
    return str(path)


def _priced_mms(trace: str, cpu: bool):
    from fxglue.pipeline import prepare
    from fxglue.presets import get_preset
    from fxglue.profile import with_profile

    preset = with_profile(get_preset("h100-8nodes"), trace, cpu=cpu)
    prepared = prepare("llama3-8b-fsdp-2", preset=preset, greedy=False)
    graph = {n.name: n for n in prepared.inputs.gm.graph.nodes}
    return [n for n in prepared.problem.nodes if graph[n.name].target == torch.ops.aten.mm.default], preset


@pytest.mark.parametrize("form", ["eager", "out="])
def test_a_cpu_trace_prices_the_matmuls_it_timed_at_their_cpu_time(tmp_path, form):
    # the out= form: inductor's extern kernel lists its output, [4096, 4096] row-major, as a third input
    dims, strides = (MM, MM_STRIDES) if form == "eager" else (MM + [[4096, 4096]], MM_STRIDES + [[4096, 1]])
    trace = _write(tmp_path / "cpu.json", _mm_op(dims, strides))
    mms, preset = _priced_mms(trace, cpu=True)
    hit = [n for n in mms if n.est_ms == pytest.approx(CPU_US / 1e3, rel=1e-12)]
    assert len(hit) >= 4 and len(hit) < len(mms)  # the shape the trace has, and only it
    assert "+cpu-profile-" in preset.name and preset.measured is None  # no collective times in a CPU trace


def test_a_cpu_trace_without_the_flag_says_how_to_read_it(tmp_path):
    trace = _write(tmp_path / "cpu.json", _mm_op(MM, MM_STRIDES))
    r = run_cli("extract", "llama3-8b-fsdp-2", "--profile", trace, "-o", tmp_path / "out")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "no GPU kernel" in r.stderr and "--profile-cpu" in r.stderr and trace in r.stderr
    r = run_cli("extract", "llama3-8b-fsdp-2", "--profile", trace, "--profile-cpu", "-o", tmp_path / "out")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "out" / "problem.json").is_file()


BAD = {
    "a GPU kernel": ((_mm_op(MM, MM_STRIDES), {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 0, "dur": 5.0,
                                                "args": {"External id": 1}}), "is a GPU kernel"),
    "an op of inf": ((_mm_op(MM, MM_STRIDES, dur=float("inf")),), "dur inf is not a duration"),
    "an op of a year": ((_mm_op(MM, MM_STRIDES, dur=3.2e13),), "is not a duration"),
    "no op with shapes": (({"ph": "X", "cat": "cpu_op", "name": "aten::add", "ts": 0, "dur": 4.0, "args": {}},),
                          "no CPU op with input shapes"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_cpu_trace_is_one_line_naming_the_file(tmp_path, case):
    from fxglue.profile import ProfileError, read_profile

    events, says = BAD[case]
    trace = _write(tmp_path / "cpu.json", *events)
    with pytest.raises(ProfileError) as e:
        read_profile(trace, 8, cpu=True)
    message = str(e.value)
    assert len(message.splitlines()) == 1 and message.startswith(trace) and says in message, message


def test_profile_cpu_without_a_trace_is_refused(tmp_path):
    r = run_cli("extract", "llama3-8b-fsdp-2", "--profile-cpu", "-o", tmp_path / "out")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "--profile" in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()
