"""A model of your own, planned by bucketplan: the factory protocol in one file.

    bucketplan extract --model examples/my_model.py:build --layers 4 -o out/my_model
    bucketplan solve out/my_model/problem.json -o out/my_model/plan.json --objective step \\
        --hint out/my_model/greedy-plan.json
    bucketplan verify out/my_model/problem.json out/my_model/plan.json
    bucketplan apply --model examples/my_model.py:build --layers 4 out/my_model/plan.json

``build(groups)`` runs inside the tracing fake mode: no memory is allocated for weights, so
production sizes are fine. It returns the module (built in the dtype it trains in), example
inputs, and ``loss_fn(module, *inputs)``. bucketplan wraps the module (SimpleFSDP by default;
``--parallel ddp``) and traces forward + backward of one training step.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


class MyModel(nn.Module):
    def __init__(self, vocab: int, dim: int, hidden: int, layers: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, hidden) for _ in range(layers))
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def loss_fn(module, tokens, labels):
    logits = module(tokens)
    return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.view(-1))


def build(groups, layers: int = 4):
    torch.set_default_dtype(torch.bfloat16)
    try:
        module = MyModel(vocab=32000, dim=2048, hidden=8192, layers=layers)
    finally:
        torch.set_default_dtype(torch.float32)
    tokens = torch.zeros((1, 2048), dtype=torch.long)
    return module, (tokens, tokens.clone()), loss_fn
