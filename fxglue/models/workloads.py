"""Built-in workloads: named ATen FX training-step graphs traced on CPU.

Why this exists: every planner is measured on the same graphs, so each graph has a stable
name (``llama3-8b-fsdp-32``) and one way to be built. A workload is a module factory plus a
parallelism style; tracing happens under ``FakeTensorMode`` with torch's fake process group
(rank 0 of 8), so shapes are real (Llama-3-8B) and no memory or GPU is needed.

Names: ``llama3-8b-{fsdp,2d,ddp}-{2,8,32,80}``, ``llama3-8b-fsdp-mp-{2,8,32}`` (fp32
parameters gathered in bf16), ``llama3-70b-{fsdp,2d}-{2,8,80}``,
``llama3-405b-{fsdp,2d}-126`` and, with the
``models`` extra, ``hf-<arch>-<layers>`` (see ``fxglue.models.hf_models``), and with the ``torchtitan``
extra ``titan-<arch>-<layers>``, traced by torchtitan's own code (``fxglue.models.titan``). The world size and TP degree
are chosen when tracing (``trace(..., world_size, tp)``; the cluster presets of
``fxglue.estimator`` fix both).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
import torch.fx as fx

from fxglue.models import parallel
from fxglue.models.base import (Groups, TracedWorkload, Workload, WorkloadError, block_meta,  # noqa: F401 (re-exported)
                                default_dtype)
from fxglue.models.llama import LLAMA3_8B, LLAMA3_70B, LLAMA3_405B, Llama, LlamaConfig, lm_loss

FAKE_WORLD_SIZE = 8
TP_SIZE = 2
LLAMA_LAYERS = (2, 8, 32, 80)
LLAMA_VARIANTS = ("fsdp", "2d", "ddp")
LLAMA70B_LAYERS = (2, 8, 80)  # 80 is the real depth; 2 and 8 for quick runs
LLAMA70B_VARIANTS = ("fsdp", "2d")  # a 70B model does not fit one GPU: no DDP
LLAMA405B_LAYERS = (126,)  # the real depth only: the production-scale case of the sweep
LLAMA405B_VARIANTS = ("fsdp", "2d")
LLAMA_MP_LAYERS = (2, 8, 32)  # llama3-8b-fsdp-mp-*: mixed-precision FSDP




def _llama_builder(cfg: LlamaConfig, variant: str):
    def build(groups: Groups):
        tp_group = groups.tp if variant == "2d" else None
        with default_dtype(cfg.dtype):
            module = Llama(cfg, tp_size=groups.tp_size if tp_group else 1, tp_group=tp_group)
        tokens = torch.zeros((cfg.batch, cfg.seq_len), dtype=torch.long)
        labels = torch.zeros((cfg.batch, cfg.seq_len), dtype=torch.long)
        return module, (tokens, labels), lm_loss

    return build


def _registry() -> dict[str, Workload]:
    reg: dict[str, Workload] = {}
    what = {
        "fsdp": "SimpleFSDP over every rank",
        "2d": "FSDP x Megatron TP (the mesh is the preset's: TP 8 x FSDP 8 on the default h100-8nodes)",
        "ddp": "DDP over every rank (gradient all_reduce)",
    }
    shapes = (("llama3-8b", "Llama-3-8B", LLAMA3_8B, LLAMA_VARIANTS, LLAMA_LAYERS),
              ("llama3-70b", "Llama-3-70B", LLAMA3_70B, LLAMA70B_VARIANTS, LLAMA70B_LAYERS),
              ("llama3-405b", "Llama-3.1-405B", LLAMA3_405B, LLAMA405B_VARIANTS, LLAMA405B_LAYERS))
    for family, title, cfg, variants, depths in shapes:
        for variant in variants:
            for layers in depths:
                name = f"{family}-{variant}-{layers}"
                reg[name] = Workload(
                    name=name,
                    description=f"{title}-shaped decoder, {layers} layers, bf16, seq 4096; {what[variant]}",
                    style=variant,
                    build=_llama_builder(cfg.with_(n_layers=layers), variant),
                    layers=layers,
                    family=family,
                )
    for layers in LLAMA_MP_LAYERS:  # mixed precision: fp32 shards, bf16 gathers and compute
        name = f"llama3-8b-fsdp-mp-{layers}"
        reg[name] = Workload(
            name=name, description=f"Llama-3-8B-shaped decoder, {layers} layers, fp32 parameters gathered and "
                                   f"computed in bf16, seq 4096; {what['fsdp']}",
            style="fsdp", build=_llama_builder(LLAMA3_8B.with_(n_layers=layers, dtype=torch.float32), "fsdp"),
            layers=layers, family="llama3-8b", gather_dtype=torch.bfloat16)
    try:
        from fxglue.models import hf_models
    except ImportError:  # the optional `models` extra is not installed
        hf_models = None
    if hf_models is not None:
        reg.update(hf_models.workloads())
    from fxglue.models import titan  # imports no torchtitan: its workloads are listed when it is installed

    reg.update(titan.workloads())
    return reg


def workloads() -> dict[str, Workload]:
    """All built-in workloads by name (Hugging Face ones only with the ``models`` extra)."""
    return _registry()


def get_workload(name: str, *, small: bool = False) -> Workload:
    reg = workloads()
    if name not in reg:
        from fxglue.models import titan

        titan.check_available(name)  # a torchtitan workload without torchtitan: say what to install
        raise WorkloadError(f"unknown workload {name!r}; `bucketplan workloads` lists them")
    wl = reg[name]
    if small:
        return small_variant(wl)
    return wl


def small_variant(wl: Workload) -> Workload:
    """The same structure (layers, collectives) at shapes small enough to run for real."""
    if wl.tracer is not None:
        raise WorkloadError(f"{wl.name}: traced by {wl.family}'s own code on fake tensors; `bucketplan check` runs "
                            "only bucketplan's own wrappers on gloo ranks (extract, solve, compare and apply take it)")
    if wl.family in ("llama3-8b", "llama3-70b", "llama3-405b"):
        from fxglue.models.llama import LLAMA_TINY

        return Workload(wl.name, wl.description + " (tiny shapes)", wl.style,
                        _llama_builder(LLAMA_TINY.with_(n_layers=wl.layers), wl.style), wl.layers, wl.family,
                        wl.gather_dtype)
    from fxglue.models import hf_models

    return hf_models.small_variant(wl)


# ---------------------------------------------------------------------------------------
# Process groups
# ---------------------------------------------------------------------------------------

_MESH_CACHE: dict[tuple[int, int, int], Groups] = {}


def ensure_fake_world(world_size: int = FAKE_WORLD_SIZE) -> None:
    """Initialize torch's fake process group (rank 0) of ``world_size`` ranks, once per size: a
    fake world of another size is replaced (a real one is refused)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if world_size < 1:
        raise WorkloadError(f"world size must be at least 1, not {world_size}")
    if dist.is_initialized():
        if dist.get_world_size() == world_size:
            return
        if dist.get_backend() != "fake":
            raise WorkloadError(
                f"a process group of world size {dist.get_world_size()} is already initialized; need {world_size}")
        dist.destroy_process_group()
        _MESH_CACHE.clear()
    dist.init_process_group(backend="fake", rank=0, world_size=world_size, store=FakeStore())


def mesh_groups(style: str, world_size: int | None = None, tp_size: int = TP_SIZE) -> Groups:
    """Groups for a style on the current default group (a 2-D mesh ``rank = dp_rank * tp + tp_rank``)."""
    world = world_size or dist.get_world_size()
    rank = dist.get_rank()
    if style != "2d":
        return Groups(dp=dist.group.WORLD.group_name, dp_size=world)
    key = (world, tp_size, rank)
    if key not in _MESH_CACHE:
        if world % tp_size:
            raise WorkloadError(f"world size {world} is not divisible by TP size {tp_size}")
        dp = world // tp_size
        dp_group = tp_group = None
        # new_group must be called by every rank for every group, in the same order.
        for t in range(tp_size):
            g = dist.new_group([d * tp_size + t for d in range(dp)])
            if rank % tp_size == t:
                dp_group = g
        for d in range(dp):
            g = dist.new_group([d * tp_size + t for t in range(tp_size)])
            if rank // tp_size == d:
                tp_group = g
        _MESH_CACHE[key] = Groups(dp=dp_group.group_name, dp_size=dp, tp=tp_group.group_name, tp_size=tp_size)
    return _MESH_CACHE[key]


# ---------------------------------------------------------------------------------------
# Tracing
# ---------------------------------------------------------------------------------------


def _strip_detach(gm: fx.GraphModule) -> None:
    # make_fx records autograd's detach() of saved tensors; they are no-ops for the schedule
    # but would count as users between a collective and its consumers.
    g = gm.graph
    for n in list(g.find_nodes(op="call_function", target=torch.ops.aten.detach.default)):
        n.replace_all_uses_with(n.args[0])
        g.erase_node(n)
    g.lint()
    gm.recompile()


def prepare(wl: Workload, groups: Groups, dp_rank: int = 0):
    """Build and wrap the workload's module; returns (wrapped, step, inputs)."""
    module, inputs, loss_fn = wl.build(groups)
    wrapped = wrap_module(wl, module, groups, dp_rank)
    return wrapped, parallel.make_train_step(wrapped, loss_fn), inputs


def wrap_module(wl: Workload, module, groups: Groups, dp_rank: int = 0) -> parallel.WrappedModule:
    """The workload's module wrapped for its style (DDP, else FSDP), in rank ``dp_rank``."""
    style = "ddp" if wl.style == "ddp" else "fsdp"
    return parallel.wrap(module, style, groups.dp_size, groups.dp, rank=dp_rank, gather_dtype=wl.gather_dtype)


def mutating_nodes(gm: fx.GraphModule) -> list[fx.Node]:
    """The nodes that write into one of their arguments (``div_``, ``index_put_``, ``copy_``)."""
    def writes(n: fx.Node) -> bool:
        schema = getattr(n.target, "_schema", None)
        return n.op == "call_function" and schema is not None and any(
            a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)

    return [n for n in gm.graph.nodes if writes(n)]


def _make_fx(fn, args, fake_mode) -> fx.GraphModule:
    from torch.fx.experimental.proxy_tensor import make_fx

    if fake_mode is None:
        # a real module (the gloo runner's) may hold real buffers that are not inputs, such as
        # Hugging Face's rotary inv_freq: they are constants of the graph, not fake inputs
        return make_fx(fn, tracing_mode="fake", _allow_non_fake_inputs=True)(*args)
    with fake_mode:
        return make_fx(fn, tracing_mode="real")(*args)


def trace_step(step, args, *, fake_mode=None) -> fx.GraphModule:
    """The step as a functional ATen graph: no node writes into a tensor another node reads.

    ``make_fx`` alone keeps a model's in-place ops, and torch's overlap scheduler -- written for
    the functional graphs AOT autograd gives it under ``torch.compile`` -- orders nodes by data
    edges only, so it may move a read of a tensor past the op that overwrites it. Measured on
    transformers' Qwen3-MoE router (``router_top_value /= router_top_value.sum(...)``): autograd
    saves a ``clone`` of the top-k values for the division's backward, with no edge to the
    ``div_``; the scheduler moved the clone into the backward, after the ``div_``, so the
    scheduled graph's gradients differed from the traced one's (``bucketplan check
    hf-qwen3-moe-2 --planner none``: up to 0.0035 on 2 ranks, nothing bucketed). A graph with
    such ops is traced once more through ``torch.func.functionalize`` (the flat ATen graph, so the
    step's autograd.Functions are gone), which turns each into its out-of-place form and points
    later readers at the result. Graphs without them (every Llama) are left as traced.
    """
    gm = _make_fx(step, args, fake_mode)
    _strip_detach(gm)
    if mutating_nodes(gm):
        gm = _make_fx(torch.func.functionalize(gm, remove="mutations"), args, fake_mode)
        _strip_detach(gm)
    return gm


def trace(name_or_workload: str | Workload, *, world_size: int = FAKE_WORLD_SIZE, tp: int = TP_SIZE) -> TracedWorkload:
    """Trace a workload's forward+backward graph under FakeTensorMode on the fake process group
    of ``world_size`` ranks (rank 0); 2-D workloads use ``tp`` of them for tensor parallelism."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    wl = get_workload(name_or_workload) if isinstance(name_or_workload, str) else name_or_workload
    if wl.tracer is not None:
        ensure_fake_world(world_size)
        return wl.tracer(world_size, tp)
    if wl.style == "2d" and (tp < 1 or world_size % tp or world_size == tp):
        raise WorkloadError(f"{wl.name}: TP degree {tp} must divide the world size {world_size} and leave a "
                            "data-parallel group of at least 2")
    ensure_fake_world(world_size)
    groups = mesh_groups(wl.style, world_size, tp)
    fake_mode = FakeTensorMode()
    t0 = time.perf_counter()
    with fake_mode:
        module, inputs, loss_fn = wl.build(groups)
        blocks = block_meta(module)  # before wrapping renames the parameters
        wrapped = wrap_module(wl, module, groups)
        step = parallel.make_train_step(wrapped, loss_fn)
        args = [*parallel.stored_params(wrapped), *inputs]
    gm = trace_step(step, args, fake_mode=fake_mode)
    trace_s = time.perf_counter() - t0
    return TracedWorkload(
        name=wl.name, gm=gm, fake_mode=fake_mode, groups=groups, trace_s=trace_s,
        meta={"workload": wl.name, "description": wl.description, "style": wl.style, "layers": wl.layers,
              "world_size": dist.get_world_size(), "tp": groups.tp_size,
              "groups": {"dp": groups.dp, "tp": groups.tp}, **blocks},
    )
