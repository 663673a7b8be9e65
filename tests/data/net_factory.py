"""A user's model factory outside the package (tests/test_custom.py copies it into a temporary
folder): ``build`` as the factory protocol asks, ``wrong`` returning a module alone."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self, layers):
        super().__init__()
        self.embed = nn.Embedding(512, 256)
        self.blocks = nn.ModuleList(nn.Linear(256, 256) for _ in range(layers))
        self.head = nn.Linear(256, 512, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        for b in self.blocks:
            x = x + F.relu(b(x))
        return self.head(x)


def loss(module, tokens, labels):
    return F.cross_entropy(module(tokens).view(-1, 512), labels.view(-1))


def build(groups, layers=2):
    tokens = torch.zeros((1, 128), dtype=torch.long)
    return Net(layers), (tokens, tokens.clone()), loss


def wrong(groups):
    return Net(1)
