"""Data-parallel wrappers that turn any ``nn.Module`` into a traced training step.

Why this module exists: the bucketing problem only looks realistic on graphs whose
collectives sit where production frameworks put them. SimpleFSDP (the torch.compile-native
FSDP) gathers every parameter with ``all_gather_into_tensor`` + ``wait_tensor`` right before
the parameter is used, gathers it again in backward instead of keeping it alive, and
reduce-scatters its gradient. DDP keeps full parameters and all-reduces each gradient as soon
as it is produced. Both are expressed here with parametrizations, so they apply to any module
(ours or a Hugging Face one) without touching its code.

The graph is traced with ``make_fx`` under ``FakeTensorMode``: no memory is allocated for
weights, so an 80-layer 8B-shaped model traces on a laptop CPU.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Callable, Literal, Sequence

import torch
import torch.nn as nn
import torch.nn.utils.parametrize as parametrize

c10d = torch.ops._c10d_functional

Style = Literal["fsdp", "ddp", "none"]


def all_gather(shard: torch.Tensor, group_size: int, group_name: str) -> torch.Tensor:
    return c10d.wait_tensor(c10d.all_gather_into_tensor(shard.contiguous(), group_size, group_name))


def reduce_scatter(full: torch.Tensor, group_size: int, group_name: str) -> torch.Tensor:
    return c10d.wait_tensor(c10d.reduce_scatter_tensor(full.contiguous(), "sum", group_size, group_name))


def all_reduce(x: torch.Tensor, group_name: str) -> torch.Tensor:
    return c10d.wait_tensor(c10d.all_reduce(x.contiguous(), "sum", group_name))


class _GatherShard(torch.autograd.Function):
    """Forward: all_gather a dim-0 shard. Backward: reduce_scatter the gradient (FSDP)."""

    @staticmethod
    def forward(ctx, shard, group_size: int, group_name: str):
        ctx.group = (group_size, group_name)
        return all_gather(shard, group_size, group_name)

    @staticmethod
    def backward(ctx, grad):
        return reduce_scatter(grad, *ctx.group), None, None


class _AllReduceGrad(torch.autograd.Function):
    """Forward: identity. Backward: all_reduce the gradient (DDP, Megatron's "f")."""

    @staticmethod
    def forward(ctx, x, group_name: str):
        ctx.group_name = group_name
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return all_reduce(grad, ctx.group_name), None


class _AllReduceOut(torch.autograd.Function):
    """Forward: all_reduce. Backward: identity (Megatron's "g" after a row-parallel layer)."""

    @staticmethod
    def forward(ctx, x, group_name: str):
        return all_reduce(x, group_name)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def tp_copy(x: torch.Tensor, group_name: str) -> torch.Tensor:
    return _AllReduceGrad.apply(x, group_name)


def tp_reduce(x: torch.Tensor, group_name: str) -> torch.Tensor:
    return _AllReduceOut.apply(x, group_name)


class _Regather:
    """Registry of gathered parameters, so backward gathers again instead of saving them.

    SimpleFSDP recomputes the all_gather in backward (activation checkpointing of the
    gather). Autograd's saved-tensor hooks see the tensors a backward formula keeps; when one
    of them is (a view of) a gathered parameter we save the shard and a view recipe instead.
    Keys are the gathered tensors themselves (identity), held only for one trace.
    """

    def __init__(self) -> None:
        self._by_id: dict[int, tuple[torch.Tensor, torch.Tensor, int, str, int]] = {}

    def record(self, full: torch.Tensor, shard: torch.Tensor, group_size: int, group_name: str, numel: int,
               gather_dtype: torch.dtype | None = None) -> None:
        self._by_id[id(full)] = (full, shard, group_size, group_name, numel, gather_dtype)

    def pack(self, t: torch.Tensor):
        root = t._base if t._base is not None else t
        entry = self._by_id.get(id(root))
        if entry is None or entry[0] is not root:
            return t
        _, shard, group_size, group_name, _, gather_dtype = entry
        return ("regather", shard, group_size, group_name, gather_dtype, tuple(t.shape), tuple(t.stride()),
                t.storage_offset())

    @staticmethod
    def unpack(packed):
        if isinstance(packed, tuple) and packed and packed[0] == "regather":
            _, shard, group_size, group_name, gather_dtype, size, stride, offset = packed
            full = all_gather(_in_gather_dtype(shard, gather_dtype), group_size, group_name)
            return full.as_strided(size, stride, offset)
        return packed

    def clear(self) -> None:
        self._by_id.clear()


class _FSDPParam(nn.Module):
    """Parametrization: the stored tensor is a dim-0 shard; reading the attribute gathers it."""

    def __init__(self, full_shape: Sequence[int], group_size: int, group_name: str, registry: _Regather | None,
                 rank: int = 0, gather_dtype: torch.dtype | None = None):
        super().__init__()
        self.rank = rank
        self.gather_dtype = gather_dtype
        self.full_shape = tuple(full_shape)
        self.group_size = group_size
        self.group_name = group_name
        self.registry = registry

    def forward(self, shard: torch.Tensor) -> torch.Tensor:
        # mixed precision: the conversion feeds the all_gather, as torch's merge expects to fold it
        gathered = _GatherShard.apply(_in_gather_dtype(shard, self.gather_dtype), self.group_size, self.group_name)
        numel = math.prod(self.full_shape)
        if gathered.numel() != numel:  # dim 0 was padded to a multiple of the group size
            full = gathered.flatten()[:numel].view(self.full_shape)
        elif tuple(gathered.shape) != self.full_shape:
            full = gathered.view(self.full_shape)
        else:
            full = gathered
        if self.registry is not None:
            self.registry.record(gathered, shard, self.group_size, self.group_name, numel, self.gather_dtype)
        return full

    def right_inverse(self, full: torch.Tensor) -> torch.Tensor:
        return shard_of(full, self.group_size, self.rank)


def _in_gather_dtype(shard: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    return shard if dtype is None or shard.dtype == dtype else shard.to(dtype)


class _DDPParam(nn.Module):
    """Parametrization: identity in forward, gradient all_reduce in backward."""

    def __init__(self, group_name: str):
        super().__init__()
        self.group_name = group_name

    def forward(self, p: torch.Tensor) -> torch.Tensor:
        return _AllReduceGrad.apply(p, self.group_name)


def shard_rows(dim0: int, group_size: int) -> int:
    return -(-dim0 // group_size)


def shard_of(full: torch.Tensor, group_size: int, rank: int) -> torch.Tensor:
    """Rank ``rank``'s dim-0 shard of ``full`` (zero-padded so every rank holds the same size)."""
    rows = shard_rows(full.shape[0] if full.dim() else 1, group_size)
    flat0 = full.reshape(full.shape[0] if full.dim() else 1, -1)
    pad = rows * group_size - flat0.shape[0]
    if pad:
        flat0 = torch.cat([flat0, flat0.new_zeros((pad, flat0.shape[1]))])
    shard = flat0[rank * rows:(rank + 1) * rows]
    if full.dim() <= 1:
        return shard.reshape(rows).clone()
    return shard.reshape((rows,) + tuple(full.shape[1:])).clone()


@dataclass
class WrappedModule:
    """A module whose parameters were replaced by what each rank stores (shards or replicas).

    ``param_names`` are the keys that ``functional_call`` needs, in the order the traced step
    takes them as inputs; ``full_names`` the module's own parameter names, in the same order.
    """

    module: nn.Module
    param_names: list[str]
    full_names: list[str]
    registry: _Regather | None
    style: Style


def wrap(module: nn.Module, style: Style, group_size: int, group_name: str, rank: int = 0, *,
         regather: bool = True, gather_dtype: torch.dtype | None = None) -> WrappedModule:
    """Wrap every parameter of ``module`` in place for ``style`` ("fsdp", "ddp" or "none").

    For FSDP the stored parameter becomes ``rank``'s dim-0 shard within the group (padded when
    dim 0 does not divide); its gradient is the reduce-scattered shard gradient.
    ``regather=False`` (for ``torch.compile``): backward keeps the gathered parameters instead of
    gathering again -- the registry's ``id()`` lookups break dynamo's graph at every parameter
    (measured: a 2-layer tiny Llama compiled into 16 graphs of at most one collective each;
    without the registry, one forward graph with 21 all_gathers and one backward graph with 21
    reduce_scatters).
    """
    registry = _Regather() if style == "fsdp" and regather else None
    full_names: list[str] = []
    param_names: list[str] = []
    for name, param in list(module.named_parameters()):
        owner_name, _, attr = name.rpartition(".")
        owner = module.get_submodule(owner_name) if owner_name else module
        full_names.append(name)
        if style == "fsdp":
            p = _FSDPParam(param.shape, group_size, group_name, registry, rank, gather_dtype)
            parametrize.register_parametrization(owner, attr, p, unsafe=True)
            param_names.append(f"{owner_name + '.' if owner_name else ''}parametrizations.{attr}.original")
        elif style == "ddp":
            parametrize.register_parametrization(owner, attr, _DDPParam(group_name))
            param_names.append(f"{owner_name + '.' if owner_name else ''}parametrizations.{attr}.original")
        else:
            param_names.append(name)
    return WrappedModule(module, param_names, full_names, registry, style)


def make_train_step(
    wrapped: WrappedModule,
    loss_fn: Callable[..., torch.Tensor],
) -> Callable[..., tuple[torch.Tensor, ...]]:
    """The function to trace: ``step(*stored_params, *inputs) -> (loss, *param_grads)``.

    ``loss_fn(module, *inputs)`` runs the forward and returns a scalar loss.
    """
    names = wrapped.param_names
    registry = wrapped.registry

    def step(*args):
        params = dict(zip(names, args[: len(names)]))
        inputs = args[len(names):]
        hooks = (
            torch.autograd.graph.saved_tensors_hooks(registry.pack, registry.unpack)
            if registry is not None
            else contextlib.nullcontext()
        )
        with hooks:
            loss = _call(wrapped.module, params, loss_fn, inputs)
        grads = torch.autograd.grad(loss, args[: len(names)], allow_unused=True)
        if registry is not None:
            registry.clear()
        grads = tuple(torch.zeros_like(p) if g is None else g for g, p in zip(grads, args[: len(names)]))
        return (loss, *grads)

    return step


def _call(module: nn.Module, params: dict[str, torch.Tensor], loss_fn, inputs) -> torch.Tensor:
    from torch.nn.utils.stateless import _reparametrize_module

    with _reparametrize_module(module, params, tie_weights=False, strict=False):
        return loss_fn(module, *inputs)


def stored_params(wrapped: WrappedModule) -> list[torch.Tensor]:
    """The tensors each rank stores, in the order ``make_train_step`` takes them."""
    state = dict(wrapped.module.named_parameters())
    return [state[n] for n in wrapped.param_names]
