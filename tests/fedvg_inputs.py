"""Inputs shared by the FedVG tests: perturbed client models and a random validation set."""

import torch

from fedlearn_edu.params import get_params, stack_params


def perturbed_clients(model, m, scale=0.3, seed=0):
    """m perturbed copies of the model's parameters, stacked."""
    g = torch.Generator().manual_seed(seed)
    base = get_params(model)
    return stack_params([{k: v + scale * torch.randn(v.shape, generator=g) for k, v in base.items()} for _ in range(m)])


def validation_set(n, shape=(1, 8, 8), seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, *shape, generator=g), torch.randint(0, 10, (n,), generator=g)
