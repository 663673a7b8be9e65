"""A user's model at shapes small enough to run for real: the factory protocol for `check --model`."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Tiny(nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, 2 * dim), nn.GELU(),
                                                  nn.Linear(2 * dim, dim)) for _ in range(layers))
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


def loss_fn(module, tokens, labels):
    logits = module(tokens)
    return F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1))


def build(groups, layers: int = 2):
    vocab = 32
    # `check` runs these very inputs (only a factory knows which ids its model takes), drawn
    # under a seed per data-parallel rank: random ids exercise more than zeros would
    tokens = torch.randint(0, vocab, (2, 16))
    labels = torch.randint(0, vocab, (2, 16))
    return Tiny(vocab=vocab, dim=32, layers=layers), (tokens, labels), loss_fn
