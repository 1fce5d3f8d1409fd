"""The loss signal (:mod:`fedlearn_edu.signals.loss`): the global model's loss on each client's data."""

import torch

from fedlearn_edu import make_model
from fedlearn_edu.params import get_params
from fedlearn_edu.signals import global_model_loss


def test_global_model_loss_matches_direct_cross_entropy():
    model = make_model("mlp", (4,), 3, hidden=(5,))
    gen = torch.Generator().manual_seed(0)
    data = [(torch.randn(n, 4, generator=gen), torch.randint(0, 3, (n,), generator=gen)) for n in (3, 7, 1)]
    got = global_model_loss(model, get_params(model), data, batch_size=4)
    with torch.no_grad():
        want = torch.stack([torch.nn.functional.cross_entropy(model(x), y) for x, y in data])
    torch.testing.assert_close(got, want)
