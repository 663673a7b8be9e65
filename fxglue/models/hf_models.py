"""Hugging Face ``transformers`` decoders as workloads: Qwen3 (dense) and Qwen3-MoE.

Why this module exists: planners should also be measured on graphs from model code this
project did not write. The built-in Llama is as tidy as we made it; ``transformers`` models
bring what a bucketer meets in practice: Qwen3's per-head q/k RMSNorms (tiny parameters
between large ones), a q_proj wider than the hidden size, and, in the MoE, a router plus
3-D expert weight stacks whose gather is one very large collective per layer. Each model is
built from a config written here -- never ``from_pretrained``, no hub, no network -- and
traced on CPU under ``FakeTensorMode`` with the same SimpleFSDP wrapping as every workload.

Names: ``hf-qwen3-{2,8}`` (Qwen3-4B shapes) and ``hf-qwen3-moe-{2,8}`` (Qwen3-30B-A3B
shapes: 128 experts, top-8), bf16, batch 1, sequence 4096, SimpleFSDP over the 8-rank fake
world. ``small_variant`` gives the same layers and collectives at hidden size 64, fp32.

MoE routing: transformers' reference expert loop (``nonzero``/``torch.where`` over an expert
mask) has data-dependent shapes, which fake tensors cannot trace. transformers 5 dispatches
experts through ``config.experts_implementation``; its ``"grouped_mm"`` forward sorts the
(token, expert) pairs by expert, counts them with ``histc`` and runs one
``torch._grouped_mm`` per projection with the cumulative counts as offsets. Every shape is
static (the counts are values, not shapes), routing is exactly top-k, and the expert weights
stay the module's own ``(experts, out, in)`` parameters, so FSDP shards and gathers them like
any other. This is transformers' default for these models; we request it explicitly and
check it stuck, because a fallback to the eager loop would only fail later, mid-trace. No
monkeypatching is involved. (The tiny fp32 variant uses ``"batched_mm"``; see ``ARCHS``.)
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

# Never touch the hub: every model here is built from a config, but a stray lookup (a
# tokenizer, a remote config) must fail fast instead of hanging on a machine without network.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import transformers  # noqa: E402  (ImportError here means the `models` extra is absent)

from fxglue.models.base import Groups, Workload, WorkloadError, default_dtype  # noqa: E402

LAYERS = (2, 8)
FAMILY = "hf"


@dataclass(frozen=True)
class Arch:
    """One ``transformers`` architecture at production and at tiny shapes."""

    key: str  # the <arch> in ``hf-<arch>-<layers>``
    model_cls: str  # a ``transformers`` *ForCausalLM class name
    config_cls: str
    shape_of: str  # the released model whose shapes ``full`` copies
    full: dict[str, Any]
    tiny: dict[str, Any]
    seq_len: int = 4096
    batch: int = 1
    tiny_seq_len: int = 16
    tiny_batch: int = 2
    moe: bool = False
    extra: dict[str, Any] = field(default_factory=dict)  # config keys common to both sizes


# Causal SDPA without a materialized mask. With plain "sdpa", transformers checks the
# position ids for packed sequences; under fake tensors it cannot read them, so it builds a
# (seq x seq) boolean mask and, because a mask is present, also repeats K/V to every query
# head. Production training (one unpadded sequence per row) runs flash attention with
# ``is_causal=True`` and native GQA instead. Registering transformers' own SDPA forward under
# a name that has no mask function makes the model skip mask creation, so the forward sees
# ``attention_mask=None`` and calls SDPA with ``is_causal=True, enable_gqa=True``. That is
# exact here because the inputs are never padded or packed.
ATTN_IMPLEMENTATION = "bucketplan_causal_sdpa"


def _register_attention() -> None:
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    AttentionInterface.register(ATTN_IMPLEMENTATION, sdpa_attention_forward)


# Config keys every workload sets, whatever the architecture: a training step (no KV cache),
# separate input/output embeddings (as the larger models of both families ship; a tied
# embedding would be one parameter read in two places), no dropout, and the attention above.
_COMMON = dict(
    use_cache=False,
    tie_word_embeddings=False,
    attention_dropout=0.0,
    attn_implementation=ATTN_IMPLEMENTATION,
)

_TINY_ATTN = dict(vocab_size=256, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16)

ARCHS: dict[str, Arch] = {
    a.key: a
    for a in (
        Arch(
            key="qwen3",
            model_cls="Qwen3ForCausalLM",
            config_cls="Qwen3Config",
            shape_of="Qwen3-4B",
            # Qwen/Qwen3-4B config.json (tie_word_embeddings overridden, see _COMMON).
            full=dict(vocab_size=151936, hidden_size=2560, intermediate_size=9728, num_attention_heads=32,
                      num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6, max_position_embeddings=40960,
                      rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0}),
            tiny=dict(_TINY_ATTN, intermediate_size=128),
        ),
        Arch(
            key="qwen3-moe",
            model_cls="Qwen3MoeForCausalLM",
            config_cls="Qwen3MoeConfig",
            shape_of="Qwen3-30B-A3B",
            # Qwen/Qwen3-30B-A3B config.json: 128 experts, 8 routed per token, every layer sparse.
            full=dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                      num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128,
                      num_experts_per_tok=8, norm_topk_prob=True, rms_norm_eps=1e-6,
                      max_position_embeddings=40960,
                      rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0}),
            # 8 experts, top-2: over 8 ranks each FSDP shard of an expert stack is one expert.
            # fp32 cannot use grouped_mm under fake tensors: torch's meta kernel for
            # _grouped_mm mirrors the CUDA one and accepts only bf16 (the CPU kernel runs fp32
            # fine). "batched_mm" gathers each routed token's expert weights and runs bmm:
            # same routing, parameters and collectives, static shapes, any dtype. Its
            # per-token weight copies are why it is not used at full size.
            tiny=dict(_TINY_ATTN, intermediate_size=128, moe_intermediate_size=32, num_experts=8,
                      num_experts_per_tok=2, norm_topk_prob=True, experts_implementation="batched_mm"),
            moe=True,
            # The static-shape experts path (see the module docstring). The router's
            # load-balancing loss is part of how these models train, so it is in the step.
            extra=dict(experts_implementation="grouped_mm", output_router_logits=True,
                       router_aux_loss_coef=0.001, decoder_sparse_step=1, mlp_only_layers=[]),
        ),
    )
}


def make_config(arch: Arch, layers: int, *, tiny: bool = False):
    """The ``transformers`` config for ``arch`` with ``layers`` decoder layers."""
    _register_attention()
    cls = getattr(transformers, arch.config_cls)
    kwargs = {**_COMMON, **arch.extra, **(arch.tiny if tiny else arch.full), "num_hidden_layers": layers}
    return cls(**kwargs)


def _experts_implementation(arch: Arch, tiny: bool) -> str | None:
    return {**arch.extra, **(arch.tiny if tiny else arch.full)}.get("experts_implementation")


def lm_loss(module: nn.Module, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Next-token cross entropy on the logits (fp32), plus the MoE router's auxiliary loss.

    The labels are given already aligned with the logits (as in ``fxglue.models.llama.lm_loss``);
    the shift HF's own loss performs changes no collective, only a slice.
    """
    out = module(input_ids=input_ids)
    logits = out.logits
    loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.view(-1))
    aux = getattr(out, "aux_loss", None)
    if aux is not None:
        loss = loss + module.config.router_aux_loss_coef * aux.to(loss.dtype)
    return loss


def _builder(arch: Arch, layers: int, *, tiny: bool):
    dtype = torch.float32 if tiny else torch.bfloat16
    seq_len, batch = (arch.tiny_seq_len, arch.tiny_batch) if tiny else (arch.seq_len, arch.batch)

    def build(groups: Groups):
        cfg = make_config(arch, layers, tiny=tiny)
        # Parameters are created in the model dtype directly: under FakeTensorMode,
        # Module.to() cannot swap fake parameters (see workloads.default_dtype).
        with default_dtype(dtype):
            module = getattr(transformers, arch.model_cls)(cfg)
        module.train()  # a training step (the constructor leaves train mode on; be explicit)
        wanted = _experts_implementation(arch, tiny)
        got = getattr(module.config, "_experts_implementation", None)  # absent before transformers 5
        if arch.moe and got != wanted:
            # transformers falls back to the eager expert loop when an implementation is
            # unavailable; that loop has data-dependent shapes and would fail later, under
            # FakeTensorMode, with a far less clear error.
            raise WorkloadError(
                f"{arch.model_cls}: experts implementation is {got!r}, need {wanted!r} (static shapes) "
                "to trace under FakeTensorMode; this needs transformers >= 5")
        input_ids = torch.zeros((batch, seq_len), dtype=torch.long)
        labels = torch.zeros((batch, seq_len), dtype=torch.long)
        return module, (input_ids, labels), lm_loss

    return build


def _workload(arch: Arch, layers: int, *, tiny: bool = False) -> Workload:
    name = f"hf-{arch.key}-{layers}"
    if tiny:
        what = f"tiny {arch.model_cls} (hidden {arch.tiny['hidden_size']}), {layers} layers, fp32, " \
               f"seq {arch.tiny_seq_len}, batch {arch.tiny_batch}"
    else:
        what = f"{arch.shape_of}-shaped {arch.model_cls}, {layers} layers, bf16, seq {arch.seq_len}, batch {arch.batch}"
    if arch.moe:
        f = arch.tiny if tiny else arch.full
        what += f", {f['num_experts']} experts top-{f['num_experts_per_tok']} ({_experts_implementation(arch, tiny)})"
    return Workload(name=name, description=f"HF transformers {what}; SimpleFSDP over 8 ranks", style="fsdp",
                    build=_builder(arch, layers, tiny=tiny), layers=layers, family=FAMILY)


def workloads() -> dict[str, Workload]:
    """The Hugging Face workloads by name: ``hf-<arch>-<layers>``."""
    reg = {}
    for arch in ARCHS.values():
        for layers in LAYERS:
            wl = _workload(arch, layers)
            reg[wl.name] = wl
    return reg


def _arch_of(wl: Workload) -> Arch:
    key = wl.name[len("hf-"):].rsplit("-", 1)[0] if wl.name.startswith("hf-") else None
    if wl.family != FAMILY or key not in ARCHS:
        raise WorkloadError(f"{wl.name!r} is not a Hugging Face workload")
    return ARCHS[key]


def small_variant(wl: Workload) -> Workload:
    """Same architecture, layer count and collectives at tiny fp32 shapes that run for real."""
    return _workload(_arch_of(wl), wl.layers, tiny=True)
