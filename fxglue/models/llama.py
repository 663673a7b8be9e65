"""A Llama-3-shaped decoder as a plain ``nn.Module``, optionally tensor-parallel (Megatron).

Why this exists: it is the built-in workload family. Its parameters are ordinary
``nn.Linear``/``nn.Embedding`` weights, so the generic wrappers in ``fxglue.models.parallel`` shard
it exactly as they would any user module. With ``tp_group`` set, attention and MLP are split
Megatron-style over a second process group: column-parallel q/k/v and w1/w3 behind an
identity whose backward all-reduces (``tp_copy``), row-parallel o and w2 followed by an
all_reduce (``tp_reduce``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn as nn
import torch.nn.functional as F

from fxglue.models.parallel import tp_copy, tp_reduce


@dataclass(frozen=True)
class LlamaConfig:
    dim: int = 4096
    n_layers: int = 32
    n_heads: int = 32
    n_kv_heads: int = 8
    ffn_dim: int = 14336
    vocab_size: int = 128256
    seq_len: int = 4096
    batch: int = 1
    dtype: torch.dtype = torch.bfloat16
    norm_eps: float = 1e-5

    def with_(self, **changes) -> "LlamaConfig":
        return replace(self, **changes)


LLAMA3_8B = LlamaConfig()
# Llama-3-70B's shape (Meta's published config: 80 layers, dim 8192, 64 heads, 8 KV heads,
# FFN 28672, vocabulary 128256).
LLAMA3_70B = LlamaConfig(dim=8192, n_layers=80, n_heads=64, n_kv_heads=8, ffn_dim=28672)
# Llama-3.1-405B's shape (Meta's published config: 126 layers, dim 16384, 128 heads, 8 KV heads,
# FFN 53248, vocabulary 128256): the production scale of the sweep.
LLAMA3_405B = LlamaConfig(dim=16384, n_layers=126, n_heads=128, n_kv_heads=8, ffn_dim=53248)
# Same structure (every layer, every collective) at shapes small enough to run for real.
LLAMA_TINY = LlamaConfig(dim=64, n_heads=4, n_kv_heads=2, ffn_dim=128, vocab_size=256,
                         seq_len=16, batch=2, dtype=torch.float32)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return y.type_as(x) * self.weight


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig, tp_size: int, tp_group: str | None):
        super().__init__()
        self.head_dim = cfg.dim // cfg.n_heads
        self.n_heads = cfg.n_heads // tp_size
        self.n_kv_heads = cfg.n_kv_heads // tp_size
        self.tp_group = tp_group
        self.wq = nn.Linear(cfg.dim, self.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(cfg.dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(self.n_heads * self.head_dim, cfg.dim, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        if self.tp_group:
            x = tp_copy(x, self.tp_group)
        q = self.wq(x).view(b, s, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, s, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, s, self.n_kv_heads, self.head_dim).transpose(1, 2)
        rep = self.n_heads // self.n_kv_heads
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out = self.wo(a.transpose(1, 2).reshape(b, s, self.n_heads * self.head_dim))
        return tp_reduce(out, self.tp_group) if self.tp_group else out


class FeedForward(nn.Module):
    def __init__(self, cfg: LlamaConfig, tp_size: int, tp_group: str | None):
        super().__init__()
        self.tp_group = tp_group
        self.w1 = nn.Linear(cfg.dim, cfg.ffn_dim // tp_size, bias=False)
        self.w3 = nn.Linear(cfg.dim, cfg.ffn_dim // tp_size, bias=False)
        self.w2 = nn.Linear(cfg.ffn_dim // tp_size, cfg.dim, bias=False)

    def forward(self, x):
        if self.tp_group:
            x = tp_copy(x, self.tp_group)
        out = self.w2(F.silu(self.w1(x)) * self.w3(x))
        return tp_reduce(out, self.tp_group) if self.tp_group else out


class Block(nn.Module):
    def __init__(self, cfg: LlamaConfig, tp_size: int, tp_group: str | None):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attn = Attention(cfg, tp_size, tp_group)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.ffn = FeedForward(cfg, tp_size, tp_group)

    def forward(self, h):
        h = h + self.attn(self.attn_norm(h))
        return h + self.ffn(self.ffn_norm(h))


class Llama(nn.Module):
    def __init__(self, cfg: LlamaConfig, tp_size: int = 1, tp_group: str | None = None):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg, tp_size, tp_group) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)

    def forward(self, tokens):
        h = self.tok_emb(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))


def lm_loss(module: nn.Module, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    logits = module(tokens)
    return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.view(-1))
