"""FedVG's client signal (:mod:`fedlearn_edu.signals.validation_gradients`): the batched gradients on the
server's validation set against a plain per-client loop, their norms against NumPy, clear errors.

FedVG's weights (the aggregation math) are tested in tests/aggregators/test_fedvg.py, the strategy in
tests/strategies/test_fedvg.py.
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedlearn_edu import FedVG, make_model
from fedlearn_edu.aggregators import fedvg_weights
from fedlearn_edu.engine import LocalTraining
from fedlearn_edu.params import get_params, unstack_params
from fedlearn_edu.signals import validation_gradient_norms, validation_gradients
from tests.fedvg_inputs import perturbed_clients, validation_set


def _loop_reference(model, stacked, x, y, batch_size=32):
    """The authors' procedure with nn.Module + .backward(): load theta_k, batches of 32, summed CE,
    accumulate .grad over batches, divide by the number of batches."""
    out = []
    for theta in unstack_params(stacked):
        net = make_model("mlp", (1, 8, 8), 10, hidden=(12,))
        net.load_state_dict(theta)
        net.train()
        net.zero_grad()
        batches = 0
        for s in range(0, y.shape[0], batch_size):
            F.cross_entropy(net(x[s : s + batch_size]), y[s : s + batch_size], reduction="sum").backward()
            batches += 1
        out.append({k: p.grad.detach().clone() / batches for k, p in net.named_parameters()})
    return out


@pytest.mark.parametrize("n_val", [70, 32, 5])
def test_batched_gradients_equal_a_plain_per_client_loop(n_val):
    model = make_model("mlp", (1, 8, 8), 10, hidden=(12,), seed=0)
    stacked = perturbed_clients(model, 4)
    x, y = validation_set(n_val)
    ref = _loop_reference(model, stacked, x, y)
    for kwargs in ({}, {"sample_chunk": 9}, {"memory_budget": 1}, {"engine": "loop"}):
        got = validation_gradients(model, stacked, (x, y), **kwargs)
        for k in stacked:
            torch.testing.assert_close(got[k], torch.stack([r[k] for r in ref]), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("p", [1, 2])
def test_norms_p1_p2_equal_numpy_on_the_reference_gradients(p):
    model = make_model("mlp", (1, 8, 8), 10, hidden=(12,), seed=0)
    stacked = perturbed_clients(model, 3, seed=2)
    x, y = validation_set(45)
    ref = _loop_reference(model, stacked, x, y)
    norms = validation_gradient_norms(model, stacked, (x, y), norm_order=p)
    assert norms.shape == (3, len(stacked))
    expected = np.array(
        [[np.abs(r[k].numpy()).sum() if p == 1 else np.sqrt((r[k].numpy() ** 2).sum()) for k in stacked] for r in ref]
    )
    np.testing.assert_allclose(norms.numpy(), expected, rtol=1e-4)


def test_validation_gradients_do_not_touch_the_model_and_keep_its_mode():
    model = make_model("mlp", (1, 8, 8), 10, hidden=(12,), seed=0).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    validation_gradient_norms(model, perturbed_clients(model, 2), validation_set(10))
    assert not model.training
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())


def test_a_model_fit_to_the_validation_set_has_the_smaller_gradient():
    model = make_model("mlp", (1, 8, 8), 10, hidden=(16,), seed=0)
    x, y = validation_set(64)
    from fedlearn_edu.engine import LoopEngine

    fit = LoopEngine().train(model, get_params(model), [(x, y)], LocalTraining(epochs=40, batch_size=16, lr=0.2), [0])
    far = perturbed_clients(model, 1, scale=1.0)
    both = {k: torch.cat([fit.params[k], far[k]]) for k in far}
    s = fedvg_weights(validation_gradient_norms(model, both, (x, y)))
    assert float(s[0]) > 0.7


def test_signal_errors_are_clear():
    model = make_model("mlp", (1, 8, 8), 10, hidden=(12,), seed=0)
    stacked = perturbed_clients(model, 3)
    with pytest.raises(ValueError, match="empty"):
        validation_gradient_norms(model, stacked, (torch.zeros(0, 1, 8, 8), torch.zeros(0, dtype=torch.long)))
    bad = {k: v.clone() for k, v in stacked.items()}
    bad["out.bias"][2, 0] = float("nan")
    with pytest.raises(ValueError, match="client 2"):
        validation_gradient_norms(model, bad, validation_set(10))
    huge = {k: v * 1e30 for k, v in stacked.items()}  # overflows: NaN/Inf gradients
    with pytest.raises(ValueError, match="NaN or Inf"):
        validation_gradient_norms(model, huge, validation_set(10))
    with pytest.raises(ValueError, match="labels"):
        validation_gradient_norms(model, stacked, (torch.zeros(4, 1, 8, 8), torch.zeros(3, dtype=torch.long)))
    with pytest.raises(ValueError, match="norm_order"):
        validation_gradient_norms(model, stacked, validation_set(10), norm_order=0)
    with pytest.raises(ValueError, match="engine"):
        validation_gradient_norms(model, stacked, validation_set(10), engine="magic")
    with pytest.raises(ValueError, match="empty"):
        FedVG((torch.zeros(0, 4), torch.zeros(0, dtype=torch.long)))
