"""A tiny federation (four clients of unequal size, 4x4 inputs, three classes), its model, and a copy
whose one client holds NaN/Inf data: for the engine's and the simulator's tests of one bad client."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from fedlearn_edu import make_model
from fedlearn_edu.data import ClientData, Federation, make_federation


def tiny_federation(sizes=(50, 27, 23, 20), num_classes=3, shape=(1, 4, 4), seed=0) -> Federation:
    g = torch.Generator().manual_seed(seed)
    n = sum(sizes)
    x = torch.rand(n, *shape, generator=g)
    y = torch.arange(n) % num_classes
    cuts = np.cumsum((0, *sizes))
    parts = [np.arange(a, b) for a, b in zip(cuts[:-1], cuts[1:])]
    return make_federation(x, y, parts, test_fraction=0.2, seed=seed, name="tiny")


def poison(fed: Federation, client: int, value: float) -> Federation:
    """A copy of ``fed`` whose client ``client`` has every training input set to ``value``."""
    clients = [ClientData(c.train_x.clone(), c.train_y, c.test_x, c.test_y, dict(c.info)) for c in fed]
    clients[client].train_x[:] = value  # in place, after construction: ClientData refuses NaN/Inf inputs
    return Federation(clients, fed.num_classes, fed.name)


def tiny_model(fed: Federation, seed: int = 0) -> nn.Module:
    return make_model("mlp", fed.input_shape, fed.num_classes, hidden=(8,), seed=seed)
