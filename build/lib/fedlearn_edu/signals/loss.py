"""The global model's loss on each selected client's training data, F_k(theta_t)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

from ..params import Params

__all__ = ["global_model_loss"]


@torch.no_grad()
def global_model_loss(
    model: nn.Module, global_params: Params, datasets: Sequence[tuple[Tensor, Tensor]], batch_size: int = 2048
) -> Tensor:
    """Mean cross-entropy of the global model ``theta_t`` on each client's training data.

    This is F_k(theta_t) of q-FedAvg and the loss FedFV sorts clients by: what each
    client measures on the model it *receives*, before local training. Runs on the
    clients' device; all clients' samples go through the model in shared batches.

    Args:
        model: the architecture (used through ``torch.func.functional_call``).
        global_params: theta_t, ``{name: Tensor}``.
        datasets: per selected client ``(x: Tensor[n_k, ...], y: Tensor[n_k])``.
        batch_size: samples per forward pass.

    Returns:
        ``Tensor[m]`` (float32 on the data's device), one mean loss per client.

    Example:
        >>> from fedlearn_edu.models import make_model
        >>> from fedlearn_edu.params import get_params
        >>> model = make_model("mlp", (4,), 3, hidden=(5,))
        >>> data = [(torch.zeros(6, 4), torch.zeros(6, dtype=torch.long))] * 2
        >>> global_model_loss(model, get_params(model), data).shape
        torch.Size([2])
    """
    if len(datasets) == 0:
        raise ValueError("global_model_loss needs at least one client dataset.")
    x = torch.cat([d[0] for d in datasets])
    y = torch.cat([d[1] for d in datasets])
    sizes = [int(d[1].shape[0]) for d in datasets]
    if min(sizes) < 1:
        raise ValueError(f"Every client needs training samples; sizes were {sizes}.")
    owner = torch.repeat_interleave(torch.arange(len(datasets), device=y.device), torch.tensor(sizes, device=y.device))
    total = torch.zeros(len(datasets), dtype=torch.float64, device=y.device)
    for start in range(0, y.shape[0], batch_size):
        sl = slice(start, start + batch_size)
        loss = F.cross_entropy(functional_call(model, global_params, (x[sl],)), y[sl], reduction="none")
        total.index_add_(0, owner[sl], loss.double())
    return (total / torch.tensor(sizes, dtype=torch.float64, device=y.device)).float()
