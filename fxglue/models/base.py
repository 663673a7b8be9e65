"""The types every workload definition shares (the registry in ``workloads``, the Hugging Face
models in ``hf_models``, a user's factory in ``custom``): here, so those modules import this one
and not each other."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.fx as fx
import torch.nn as nn


class WorkloadError(ValueError):
    pass


@dataclass(frozen=True)
class Groups:
    """Process-group names a workload uses: ``dp`` shards/replicates, ``tp`` splits layers."""

    dp: str
    dp_size: int
    tp: str | None = None
    tp_size: int = 1


@dataclass(frozen=True)
class Workload:
    """A named training step: how to build the module and its inputs, and how to parallelize.

    ``build(groups)`` returns ``(module, example_inputs, loss_fn)`` and is called inside the
    tracing fake mode (or for real, at small shapes, by the gloo runner).
    """

    name: str
    description: str
    style: str  # "fsdp" | "2d" | "ddp"
    build: Callable[[Groups], tuple[nn.Module, tuple[torch.Tensor, ...], Callable]]
    layers: int
    family: str = "llama3-8b"
    # FSDP gathers each parameter in this dtype (mixed precision: fp32 shards, bf16 gathers and
    # compute, as SimpleFSDP's and FSDP2's param_dtype); None: in the parameter's own dtype
    gather_dtype: torch.dtype | None = None
    # a workload traced by another framework's own code (torchtitan's parallelize function and
    # tracer, ``fxglue.models.titan``): ``tracer(world_size, tp) -> TracedWorkload``, called on the
    # fake process group of ``world_size`` ranks, replaces build, wrap and make_fx; ``build`` is
    # never called
    tracer: Callable[[int, int], "TracedWorkload"] | None = None


@dataclass
class TracedWorkload:
    """A traced training step graph and what produced it."""

    name: str
    gm: fx.GraphModule
    fake_mode: object
    groups: Groups
    trace_s: float
    meta: dict = field(default_factory=dict)


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype):
    # Build parameters directly in the model dtype: Module.to() cannot swap fake parameters.
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def transformer_block_plans(module: nn.Module) -> list[list[str] | str]:
    """torchtitan's ``get_transformer_block_buckets`` for any decoder: one entry per block.

    torchtitan returns ``[tok_embeddings, [norm, output], layers.0, ..., layers.N-1]``. Here the
    blocks are the children of the ``ModuleList``/``ModuleDict`` holding the most parameters;
    the modules owning parameters registered before the first block form the first entry
    (the embedding), those after the last block the second (final norm and output head).
    An entry of one module is its FQN, of several a list, as in torchtitan.
    """
    containers = [(name, m) for name, m in module.named_modules()
                  if isinstance(m, (nn.ModuleList, nn.ModuleDict)) and len(m) > 0]
    if not containers:
        raise ValueError("no ModuleList/ModuleDict of blocks in the module")
    name, blocks = max(containers, key=lambda c: sum(p.numel() for p in c[1].parameters()))
    prefix = f"{name}." if name else ""
    block_fqns = [f"{prefix}{k}" for k, _ in blocks.named_children()]
    pre: list[str] = []
    post: list[str] = []
    seen_block = False
    for pname, _ in module.named_parameters():
        owner = pname.rpartition(".")[0]
        if any(owner == b or owner.startswith(b + ".") for b in block_fqns):
            seen_block = True
            continue
        side = post if seen_block else pre
        if owner not in side:
            side.append(owner)
    plans: list[list[str] | str] = []
    for side in (pre, post):
        if side:
            plans.append(side[0] if len(side) == 1 else list(side))
    return plans + block_fqns


def block_meta(module: nn.Module) -> dict:
    """A module's parameter names (the order ``parallel.wrap`` stores and the traced step takes
    them) and transformer blocks, as the traced step's meta that ``fxglue.blocks.block_source``
    reads: taken from the module before wrapping renames its parameters, so nothing is rebuilt
    later and a user's factory, which cannot be rebuilt by name, gets blocks too. No ModuleList of
    blocks: no blocks."""
    try:
        blocks = transformer_block_plans(module)
    except ValueError:
        blocks = []
    return {"saved_parameters": [n for n, _ in module.named_parameters()], "saved_blocks": blocks}
