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
