"""A 4-class classifier for `check --model`: its targets are class ids, valid only below 4.

Why it exists: `check` used to replace a factory's integer inputs by ids below 16, which no
4-class loss accepts (IndexError: Target 14 is out of bounds); the factory's own inputs are
the only ones that obey its model's contract.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

CLASSES = 4


def loss_fn(module, features, targets):
    return F.cross_entropy(module(features), targets)


def build(groups, layers: int = 2):
    dims = [8] * layers + [CLASSES]
    blocks = []
    for a, b in zip(dims, dims[1:]):
        blocks += [nn.Linear(a, b), nn.ReLU()]
    module = nn.Sequential(*blocks[:-1])  # logits, no ReLU after the last layer
    features = torch.randn(4, 8)
    targets = torch.randint(0, CLASSES, (4,))
    return module, (features, targets), loss_fn
