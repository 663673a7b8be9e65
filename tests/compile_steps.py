"""One training step of a tiny Llama under ``torch.compile`` on a gloo rank, for test_compile.

``compiled_step(rank, world, spec)`` runs on every rank of a ``fxglue.run.gloo.GlooWorld``:
eager (``mode="eager"``), compiled as torch compiles by default, without overlap scheduling or
bucketing (``"plain"``), with torch's overlap schedule and nothing merged
(``"unbucketed"``), with torch's manual per-block pass (``"manual"``), or compiled inside
``fxglue.run.compile.record`` / ``use`` on ``spec["plan_dir"]``. It returns the loss, every stored parameter's gradient and the pass's events.
"""

from __future__ import annotations

import logging
import re
import os


def build(rank: int, world: int, style: str, layers: int, seq: int):
    """``style`` fsdp, ddp, or 2d: FSDP over both ranks x Megatron TP over one rank (each rank its
    own TP group, so the ranks' graphs and problems differ by the group's name)."""
    import torch

    from fxglue.models import parallel
    from fxglue.models.llama import LLAMA_TINY, Llama, lm_loss
    from fxglue.models.workloads import mesh_groups

    groups = mesh_groups(style, world, tp_size=1)
    torch.manual_seed(0)  # the same full model on every rank
    module = Llama(LLAMA_TINY.with_(n_layers=layers), tp_size=1, tp_group=groups.tp)
    wrapped = parallel.wrap(module, "ddp" if style == "ddp" else "fsdp", groups.dp_size, groups.dp, rank=rank,
                            regather=False)
    gen = torch.Generator().manual_seed(100 + rank)  # each rank its own batch
    tokens = torch.randint(0, LLAMA_TINY.vocab_size, (2, seq), generator=gen)
    labels = torch.randint(0, LLAMA_TINY.vocab_size, (2, seq), generator=gen)
    return module, wrapped, (tokens, labels), lm_loss, groups


def compiled_step(rank: int, world: int, spec: dict) -> dict:
    import torch
    import torch._inductor.config as inductor_config

    from fxglue.run import compile as bucketplan_compile
    from fxglue.models import parallel

    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(spec["cache_dir"], f"rank{rank}")
    inductor_config.compile_threads = 1
    module, wrapped, inputs, loss_fn, groups = build(rank, world, spec["style"], spec.get("layers", 2), spec.get("seq", 16))

    def step(*args):
        return loss_fn(module, *args)

    warnings: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: warnings.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("bucketplan.compile").addHandler(handler)
    torch._dynamo.reset()
    mode = spec["mode"]
    fn = step if mode == "eager" else torch.compile(step, backend="inductor")
    session = None
    # inductor's caches as a user has them (on by default), in this test's own folder
    if mode in ("record", "use", "unbucketed", "manual"):
        where = () if mode in ("unbucketed", "manual") else (spec["plan_dir"],)
        ctx = getattr(bucketplan_compile, mode)(*where, preset=spec.get("preset", "h100-8nodes"),
                                                tp_group=groups.tp, tp_size=groups.tp_size)
        with ctx as session:
            loss = fn(*inputs)
            loss.backward()
    else:
        loss = fn(*inputs)
        loss.backward()
    logging.getLogger("bucketplan.compile").removeHandler(handler)
    grads = [p.grad.detach().clone() for p in parallel.stored_params(wrapped)]
    return {"loss": loss.detach().clone(), "grads": grads, "warnings": warnings,
            "events": [vars(e) for e in session.events] if session else []}


# ---------------------------------------------------------------------------------------
# The order of communication and matmuls: in the post-grad graph the pass leaves, and in the
# code inductor generates from it (test_compile: the compiled graph keeps the planned order)
# ---------------------------------------------------------------------------------------

_KINDS = {"all_gather_into_tensor": "AG", "reduce_scatter_tensor": "RS", "all_reduce": "AR"}
_MATMULS = ("mm", "addmm", "bmm")


def _token_sequence(events) -> list[str]:
    """``events``: (what, keys) in order, what a collective kind, "wait" or "mm"; a start's keys
    are the names its output goes by, a wait's the one it waits on. Starts are numbered in order and a wait takes its start's
    number, so two orders compare equal exactly when the same starts, waits and matmuls come in
    the same sequence and each wait waits the same start."""
    started: dict = {}
    out = []
    for what, keys in events:
        if what == "wait":
            out.append(f"W{started.get(keys[0], '?')}")
        elif what == "mm":
            out.append("mm")
        else:
            number = len(set(started.values()))
            started.update({k: number for k in keys})
            out.append(f"{what}{number}")
    return out


def graph_order(gm) -> list[str]:
    """The post-grad graph's sequence, looking through the ``control_deps`` wrappers that
    ``insert_overlap_deps`` puts around nodes (each wraps one op; its ``*args`` follow the deps
    and the subgraph)."""
    import torch
    from torch._inductor.fx_passes.control_dependencies import control_deps

    events = []
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        target, args, kwargs = n.target, list(n.args), dict(n.kwargs)
        if target is control_deps:
            sub = getattr(gm, n.args[1].target)
            (inner,) = [m for m in sub.graph.nodes if m.op == "call_function"]
            params = [m for m in sub.graph.nodes if m.op == "placeholder"]
            target = inner.target
            outer = {p: n.args[2 + i] for i, p in enumerate(params)}
            args = [outer.get(a, a) for a in inner.args]
            kwargs = {k: outer.get(v, v) for k, v in inner.kwargs.items()}
        name = getattr(target, "__name__", str(target)).split(".")[0]
        namespace = getattr(target, "namespace", None)
        if namespace == "_c10d_functional" and name == "wait_tensor":
            events.append(("wait", [args[0]]))
        elif namespace == "_c10d_functional":
            kind = next(v for k, v in _KINDS.items() if name.startswith(k))
            events.append((kind, [n, kwargs["out"]] if name.endswith("_out") else [n]))
        elif target in tuple(getattr(torch.ops.aten, m).default for m in _MATMULS):
            events.append(("mm", []))
    return _token_sequence(events)


_CODE_EVENT = re.compile(r"^\s*(?:(buf\d+) = )?(?:torch\.ops\._c10d_functional\.(\w+)\.default|extern_kernels\.(\w+))"
                         r"\((.*)\)\s*$")


def code_order(code: str) -> list[str]:
    """The same sequence in inductor's generated wrapper code (one call per line, in the order the
    kernels run): ``bufN = ...all_gather_into_tensor.default(...)``, ``..._out.default(..., out=bufN)``,
    ``..._c10d_functional.all_reduce_.default(bufN, ...)`` (in place), ``...wait_tensor.default(bufN)``,
    ``extern_kernels.mm(..., out=bufN)``."""
    events = []
    for line in code.splitlines():
        m = _CODE_EVENT.match(line)
        if not m:
            continue
        assigned, collective, extern, args = m.groups()
        if collective == "wait_tensor":
            events.append(("wait", [args.strip()]))
        elif collective:
            kind = next(v for k, v in _KINDS.items() if collective.startswith(k))
            out = re.search(r"out=(buf\d+)", args)
            # an in-place collective (``all_reduce_.default(buf5, 'sum', '1')``) works on its first argument
            first = args.split(",")[0].strip()
            events.append((kind, [out.group(1) if out else assigned or first]))
        elif extern in _MATMULS:
            events.append(("mm", []))
    return _token_sequence(events)


def compiled_step_with_orders(rank: int, world: int, spec: dict) -> dict:
    """``compiled_step``, and per compiled graph (in compile order) the sequence the pass left in
    the post-grad graph and the one in inductor's generated code."""
    from unittest import mock

    from torch._inductor.graph import GraphLowering

    from fxglue.run.compile import PlanPass

    graphs, codes = [], []
    run_pass = PlanPass.__call__

    def recording_pass(self, graph):
        run_pass(self, graph)
        graphs.append(graph_order(graph.owning_module))

    with mock.patch.object(PlanPass, "__call__", recording_pass), \
            mock.patch.object(GraphLowering, "save_output_code", lambda code: codes.append(code_order(code))):
        out = compiled_step(rank, world, spec)
    return {**out, "graph_orders": graphs, "code_orders": codes}
