"""torchtitan's own models, parallelized and traced by torchtitan's own code, as workloads.

Why this exists: people who train with ``torch.compile`` at scale train with torchtitan, and the
graph its ``graph_trainer`` buckets is not one of ours: its models, its SimpleFSDP (DTensor
parametrizations over device meshes), its tracer and the passes it runs before bucketing all shape
it. So these workloads are built by torchtitan 0.3.0 with nothing of ours in between: the flavor's
training config from torchtitan's config registry (sequence length, batch, mixed precision),
converted as graph_trainer converts it (``to_graph_trainer_config``); the model from graph_trainer's
model registry, built on the meta device; the flavor's parallelize function (SimpleFSDP over every
rank); graph_trainer's ``minimal_fx_tracer`` around its ``make_fwd_bwd_step`` (forward, loss and
backward in one graph); and graph_trainer's own pass list (``compile_time_passes``) up to its
transformer-block bucketing pass: dead code, canonicalization, FSDP unshard deduplication, SAC
tagging, CPU offload (nothing offloaded by default) and activation rematerialization (so backward
gathers again what forward resharded). That is the graph graph_trainer's bucketing pass receives,
and ``fxglue.run.titan``'s pass in its place. The fake process group is ours (rank 0 of the
preset's world), as for every workload.

Names: ``titan-llama3-8b-{2,8}``, ``titan-qwen3-30b-a3b-{2,8}`` (MoE, 128 experts top-8) and
``titan-deepseek-v3-16b-{2,8}`` (MoE, its first layer dense), listed when the ``torchtitan``
extra is installed (``pip install -e '.[models,torchtitan]'``: torchtitan 0.3.0, and triton,
which torchtitan's MoE kernels import at module level, so ``torchtitan.models`` does not import
without it even on a CPU).

Where a CPU and fake tensors differ from a GPU run, each adaptation is made where it is needed
and says why (docs/training.md, "torchtitan", lists them): meshes on "cpu" (``cpu_meshes``);
graph_trainer's SDPA attention instead of FlexAttention (no CPU backward); a memory policy that
saves CPU SDPA as the default one saves the GPU's (``CPU_MEMORY_POLICY``); plain cross-entropy
instead of the flavors' chunked loss; FSDP over every rank, with the flavors' expert, tensor and
pipeline parallel degrees at 1.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
import os
import re
import time
import warnings
from dataclasses import dataclass

import torch

from fxglue.models.base import Groups, TracedWorkload, Workload, WorkloadError

TORCHTITAN_VERSION = "0.3.0"
INSTALL = "pip install -e '.[models,torchtitan]'"
FAMILY = "torchtitan"
LAYERS = (2, 8)
NAME = re.compile(r"titan-(?P<arch>.+)-(?P<layers>\d+)")
# graph_trainer's FSDP bucketing pass: the workload's graph is the one it receives
BUCKETING_PASS = "joint_transformer_block_bucketing_reordering_pass"
CPU_MEMORY_POLICY = "bucketplan_cpu_sdpa"


@dataclass(frozen=True)
class Arch:
    key: str  # the <arch> of titan-<arch>-<layers>
    module: str  # graph_trainer's model package: torchtitan.experiments.graph_trainer.<module>
    config: str  # "<module path>:<function>" of torchtitan's config registry for the flavor
    shape_of: str
    what: str


ARCHS: dict[str, Arch] = {a.key: a for a in (
    Arch("llama3-8b", "llama3", "torchtitan.experiments.graph_trainer.llama3.config_registry:graph_trainer_llama3_8b",
         "Llama-3-8B", "dense"),
    # graph_trainer's registry has no Qwen3-30B-A3B config; torchtitan's own, converted as graph_trainer
    # converts its other Qwen3 configs (to_graph_trainer_config)
    Arch("qwen3-30b-a3b", "qwen3", "torchtitan.models.qwen3.config_registry:qwen3_30b_a3b", "Qwen3-30B-A3B",
         "MoE, 128 experts top-8"),
    Arch("deepseek-v3-16b", "deepseek_v3",
         "torchtitan.experiments.graph_trainer.deepseek_v3.config_registry:graph_trainer_deepseek_v3_16b",
         "DeepSeek-V3-16B", "MoE, 64 experts top-6 and 2 shared, first layer dense"),
)}


def installed() -> bool:
    """Whether the extra's packages are there (found, not imported: importing torchtitan's
    graph_trainer takes seconds, and ``bucketplan workloads`` only lists names)."""
    return all(importlib.util.find_spec(p) is not None for p in ("torchtitan", "triton"))


def check_available(name: str) -> None:
    """A torchtitan workload's name when the extra is missing: one line saying what to install."""
    if NAME.fullmatch(name) and not installed():
        missing = [p for p in ("torchtitan", "triton") if importlib.util.find_spec(p) is None]
        raise WorkloadError(f"{name}: needs {' and '.join(missing)} (not installed here): {INSTALL}")


def _titan(name: str):
    """torchtitan's modules this module drives, imported once they are needed; any failure is one
    line naming the package and the install command."""
    from importlib.metadata import version

    check_available(name)
    found = version("torchtitan")
    if found != TORCHTITAN_VERSION:
        raise WorkloadError(f"{name}: needs torchtitan {TORCHTITAN_VERSION} (found {found}: its graph passes and "
                            f"model code are what this drives): {INSTALL}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torchtitan's import-time deprecation notices
            for module in ("torchtitan.distributed.parallel_dims", "torchtitan.experiments.graph_trainer.passes",
                           "torchtitan.experiments.graph_trainer.trainer", "torchtitan.components.loss"):
                importlib.import_module(module)
    except Exception as e:  # an ImportError, or torchtitan's code failing against this torch
        raise WorkloadError(f"{name}: torchtitan cannot be imported here ({type(e).__name__}: {e}); {INSTALL}") \
            from None


class _FromTorchtitan(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return f"{os.sep}torchtitan{os.sep}" not in record.pathname


@contextlib.contextmanager
def quiet():
    """torchtitan logs on the root logger (``torchtitan.tools.logging``): its notes on the configs
    and passes a workload only borrows (a checkpoint setting without effect, the pass list) are
    dropped while it is built; training keeps them."""
    noise = _FromTorchtitan()
    logging.getLogger().addFilter(noise)
    try:
        yield
    finally:
        logging.getLogger().removeFilter(noise)


@contextlib.contextmanager
def cpu_meshes():
    """Build torchtitan's device meshes on "cpu". torchtitan picks its device type at import: the
    accelerator's, or "cuda" when there is none (``torchtitan.tools.utils.device_type``), and
    ``ParallelDims.build_mesh`` builds every mesh on it; on torch for CPU, DTensor's
    ``from_local`` then moves each local tensor ``.to("cuda")`` and fails ("PyTorch is not linked
    with support for cuda devices"). Only inside this context: the module's value is restored."""
    import torchtitan.distributed.parallel_dims as parallel_dims

    saved = parallel_dims.device_type
    parallel_dims.device_type = "cpu"
    try:
        yield
    finally:
        parallel_dims.device_type = saved


def register_cpu_memory_policy() -> str:
    """graph_trainer's default memory policy (SAC: save compute-intensive ops, recompute the rest),
    with CPU SDPA saved too; its name, for ``config.compile.memory_policy``.

    On a GPU, SDPA is ``_scaled_dot_product_flash_attention``, which torch's list of compute-
    intensive ops holds, so the default policy saves it. On a CPU it is
    ``_scaled_dot_product_flash_attention_for_cpu``, which the list lacks; the policy marks it for
    recompute, and because the op is tagged ``nondeterministic_seeded`` (it could apply dropout),
    graph_trainer's ``selective_activation_remat_pass`` refuses the graph ("does not support RNG ops
    in recompute regions"). Saving it, as on a GPU, keeps the rest of the policy as it is."""
    from torchtitan.distributed.activation_checkpoint import _get_default_save_ops
    from torchtitan.distributed.fsdp import get_fsdp_reshard_after_forward_policy
    from torchtitan.experiments.graph_trainer import memory_policy
    from torchtitan.experiments.graph_trainer.registry import MEMORY_POLICY_REGISTRY, register_memory_policy

    if CPU_MEMORY_POLICY in MEMORY_POLICY_REGISTRY:
        return CPU_MEMORY_POLICY

    def policy(gm, *, config):  # graph_trainer's _default_memory_policy_pass, one op more saved
        reshard = get_fsdp_reshard_after_forward_policy(config.parallelism.fsdp_reshard_after_forward,
                                                        pp_enabled=config.parallelism.pipeline_parallel_degree > 1)
        force_save = memory_policy._find_fsdp_unshard_save_nodes(gm) if not reshard else None
        save = _get_default_save_ops() | {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default}
        memory_policy.tag_sac_policy(gm, policy_fn=memory_policy._make_default_memory_policy(save),
                                     force_save_nodes=force_save)
        return gm

    register_memory_policy(CPU_MEMORY_POLICY)(policy)
    return CPU_MEMORY_POLICY


def training_config(arch: Arch, layers: int, *, flavor: str | None = None, world_size: int = 8):
    """The flavor's graph_trainer config at ``layers`` layers, adapted to a CPU (the module
    docstring): SDPA attention, plain cross-entropy, the CPU memory policy, FSDP over every rank.
    ``flavor``: another of the model's flavors (a test's tiny ``debugmodel``) in the same config."""
    from dataclasses import replace

    from torchtitan.components.loss import CrossEntropyLoss
    from torchtitan.experiments.graph_trainer.configs import to_graph_trainer_config
    from torchtitan.experiments.graph_trainer.trainer import GraphTrainer

    gt = importlib.import_module(f"torchtitan.experiments.graph_trainer.{arch.module}")
    where, fn = arch.config.split(":")
    config = getattr(importlib.import_module(where), fn)()
    if not isinstance(config, GraphTrainer.Config):
        config = to_graph_trainer_config(config, gt.model_registry)
    # FlexAttention, the flavors' backend, has no backward on a CPU (torch raises "FlexAttention
    # does not support backward on CPU"): graph_trainer's test-only SDPA backend instead
    spec = gt.model_registry(flavor or config.model_spec.flavor, attn_backend="sdpa")
    if not 1 <= layers <= len(spec.model.layers):
        raise WorkloadError(f"{arch.shape_of} has {len(spec.model.layers)} layers; cannot take {layers}")
    spec.model.layers = spec.model.layers[:layers]
    config.model_spec = spec
    # the flavors' chunked loss calls lm_head inside the loss, with gradients gathered by a wrapper
    # of graph_trainer's own; the plain loss keeps lm_head in the model, as graph_trainer's tests do
    config.loss = CrossEntropyLoss.Config()
    config.parallelism = replace(config.parallelism, data_parallel_shard_degree=-1, data_parallel_replicate_degree=1,
                                 tensor_parallel_degree=1, context_parallel_degree=1, pipeline_parallel_degree=1,
                                 expert_parallel_degree=1)
    config.compile.memory_policy = register_cpu_memory_policy()
    return config


def parallel_dims(config, world_size: int):
    """torchtitan's ``ParallelDims`` for ``config`` on the current process group, meshes on CPU."""
    from torchtitan.distributed import ParallelDims

    dims = ParallelDims.from_config(config.parallelism, world_size)
    with cpu_meshes():
        dims.build_mesh()
    return dims


def build_model(config, dims):
    """The model on the meta device, parallelized by the flavor's parallelize function (as
    torchtitan's trainer calls it), and its transformer blocks as graph_trainer names them."""
    from torchtitan.experiments.graph_trainer.common_utils import get_transformer_block_buckets

    spec = config.model_spec
    with torch.device("meta"):
        model = spec.model.build()
    blocks = get_transformer_block_buckets(model)
    with cpu_meshes(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = spec.parallelize_fn(model, parallel_dims=dims, training=config.training,
                                    parallelism=config.parallelism, compile_config=config.compile,
                                    ac_config=config.activation_checkpoint, dump_folder=config.dump_folder)
    model.train()
    return model, blocks


def step_inputs(config, *, tokens: torch.Tensor | None = None):
    """The step's inputs as graph_trainer's trainer hands them to its traced step: tokens,
    labels, the number of valid tokens and the forward's keywords (per-document positions)."""
    batch, seq = config.training.local_batch_size, config.training.seq_len
    tokens = torch.zeros((batch, seq), dtype=torch.long) if tokens is None else tokens
    labels = torch.roll(tokens, -1, dims=1)
    positions = torch.arange(tokens.shape[1], dtype=torch.int32).unsqueeze(0).expand(tokens.shape[0], -1)
    return tokens, labels, torch.tensor(float(tokens.numel())), {"positions": positions}


def trace_step(config, model, inputs):
    """graph_trainer's trace of the step: ``minimal_fx_tracer`` around ``make_fwd_bwd_step``, as
    its trainer traces it (its ``TracedResult``)."""
    from torchtitan.experiments.graph_trainer.make_fx_tracer import minimal_fx_tracer
    from torchtitan.experiments.graph_trainer.trainer import make_fwd_bwd_step

    loss_fn = config.loss.build(compile_config=config.compile)
    with warnings.catch_warnings():
        # torchtitan's MoE router asks for float32 autocast, which CPU autocast does not offer:
        # torch disables it with a warning and the router computes in the parameters' dtype
        warnings.filterwarnings("ignore", message=".*CPU Autocast only supports")
        warnings.filterwarnings("ignore", message="In CPU autocast")
        return minimal_fx_tracer(make_fwd_bwd_step(model, loss_fn), module=model)(*inputs)


def flat_input_names(traced) -> list[str]:
    """One name per graph input: a parameter or buffer FQN, and ``<fqn>#k`` for the further
    tensors its subclass flattens into (a DTensor's device mesh) -- the placeholder order the
    graph takes, as ``fxglue.blocks`` reads ``saved_parameters`` (gradients follow the same order)."""
    names: list[str] = []
    for i, fqn in enumerate(traced.state_fqns):
        layout = traced.input_subclass_layouts.get(i)
        names += [fqn] + [f"{fqn}#{k}" for k in range(1, layout.num_tensors if layout else 1)]
    return names


def _trace(arch: Arch, layers: int, name: str, world_size: int) -> TracedWorkload:
    _titan(name)  # the fake process group is the caller's (``workloads.trace``)
    with quiet():
        return _traced(arch, layers, name, world_size)


def _traced(arch: Arch, layers: int, name: str, world_size: int) -> TracedWorkload:
    from torchtitan.experiments.graph_trainer.passes import _get_pass_name, apply_graph_passes, compile_time_passes

    t0 = time.perf_counter()
    config = training_config(arch, layers, world_size=world_size)
    dims = parallel_dims(config, world_size)
    model, blocks = build_model(config, dims)
    with torch._subclasses.fake_tensor.FakeTensorMode(allow_non_fake_inputs=True):
        model.to_empty(device="cpu")  # fake CPU tensors: the tracer re-fakes them in its own mode
    traced = trace_step(config, model, step_inputs(config))
    passes = compile_time_passes(traced, config, parallel_dims=dims, include_inductor=False)
    names = [_get_pass_name(p) for p in passes]
    before = passes[:names.index(BUCKETING_PASS)]
    gm = apply_graph_passes(traced.gm, traced.example_inputs, before, compile_config=config.compile)
    fake_mode = next(a.fake_mode for a in traced.example_inputs if isinstance(a, torch.Tensor))
    dp = dims.get_mesh("fsdp").get_group().group_name
    return TracedWorkload(
        name=name, gm=gm, fake_mode=fake_mode, groups=Groups(dp=dp, dp_size=world_size),
        trace_s=time.perf_counter() - t0,
        meta={"workload": name, "description": _description(arch, layers, config), "style": "fsdp",
              "layers": layers, "world_size": world_size, "tp": 1, "groups": {"dp": dp, "tp": None},
              "torchtitan": {"version": TORCHTITAN_VERSION, "config": arch.config, "passes": names[:len(before)]},
              "saved_parameters": flat_input_names(traced), "saved_blocks": blocks})


def _description(arch: Arch, layers: int, config=None) -> str:
    shape = "" if config is None else (f", seq {config.training.seq_len}, batch {config.training.local_batch_size}, "
                                       f"{config.training.mixed_precision_param} gathers")
    return (f"torchtitan {TORCHTITAN_VERSION} {arch.shape_of} ({arch.what}), {layers} layers{shape}; its "
            "graph_trainer's SimpleFSDP over every rank, traced and passed by graph_trainer (SDPA attention)")


def _not_built(groups: Groups):
    raise WorkloadError("torchtitan workloads are built and traced by torchtitan's own code (Workload.tracer)")


def workload(arch: Arch, layers: int) -> Workload:
    name = f"titan-{arch.key}-{layers}"
    return Workload(name=name, description=_description(arch, layers), style="fsdp", build=_not_built, layers=layers,
                    family=FAMILY, tracer=lambda world_size, tp: _trace(arch, layers, name, world_size))


def workloads() -> dict[str, Workload]:
    """The torchtitan workloads by name, when the extra is installed (else none)."""
    if not installed():
        return {}
    return {wl.name: wl for wl in (workload(a, n) for a in ARCHS.values() for n in LAYERS)}
