"""FedVG: validation-gradient norms (signals), weights (aggregators), the strategy, validation sets."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from fedlearn_edu import FedAvg, FedAvgM, FedProx, FedVG, federated_dataset, make_model, simulate
from fedlearn_edu.aggregators import (
    fedavg,
    fedvg_aggregate,
    fedvg_layerwise_weights,
    fedvg_mixed_weights,
    fedvg_weights,
)
from fedlearn_edu.data import external_validation_set, resize_images, server_validation_split
from fedlearn_edu.engine import LocalTraining
from fedlearn_edu.params import get_params, stack_params, unstack_params
from fedlearn_edu.signals import validation_gradient_norms, validation_gradients
from fedlearn_edu.strategies import ClientUpdates, make_strategy
from tests.server_steps import Server

norm_values = st.floats(0.0, 1e3, allow_nan=False, width=64)


def _clients(model, m, scale=0.3, seed=0):
    """m perturbed copies of the model's parameters, stacked."""
    g = torch.Generator().manual_seed(seed)
    base = get_params(model)
    return stack_params([{k: v + scale * torch.randn(v.shape, generator=g) for k, v in base.items()} for _ in range(m)])


def _val(n, shape=(1, 8, 8), seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, *shape, generator=g), torch.randint(0, 10, (n,), generator=g)


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


# ---------------------------------------------------------------- weights (pure math)
@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 7), L=st.integers(1, 5), data=st.data())
def test_clientwise_weights_sum_to_one_positive_and_inverse_to_G(m, L, data):
    norms = data.draw(arrays(np.float64, (m, L), elements=norm_values))
    eps = 1e-8
    s = fedvg_weights(torch.tensor(norms), eps).numpy()
    G = norms.sum(axis=1)
    inv = 1.0 / (G + eps)
    np.testing.assert_allclose(s, inv / inv.sum(), rtol=1e-10)
    assert np.all(s > 0)
    assert s.sum() == pytest.approx(1.0, abs=1e-12)
    # inversely proportional: s_k (G_k + eps) is the same for every client
    prod = s * (G + eps)
    np.testing.assert_allclose(prod, np.full(m, prod[0]), rtol=1e-9)
    # a 1-D input is G itself
    np.testing.assert_allclose(fedvg_weights(torch.tensor(G), eps).numpy(), s, rtol=1e-12)


@settings(max_examples=30, deadline=None)
@given(m=st.integers(1, 7), L=st.integers(1, 5), data=st.data())
def test_layerwise_weights_equal_numpy_and_columns_sum_to_one(m, L, data):
    norms = data.draw(arrays(np.float64, (m, L), elements=norm_values))
    s = fedvg_layerwise_weights(torch.tensor(norms), 1e-8).numpy()
    inv = 1.0 / (norms + 1e-8)
    np.testing.assert_allclose(s, inv / inv.sum(axis=0, keepdims=True), rtol=1e-10)
    np.testing.assert_allclose(s.sum(axis=0), np.ones(L), rtol=1e-12)
    assert np.all(s > 0)


@pytest.mark.parametrize("value", [0.0, 1e-9, 3.7, 1e4])
def test_equal_norms_give_uniform_weights(value):
    norms = torch.full((5, 3), value, dtype=torch.float64)
    torch.testing.assert_close(fedvg_weights(norms), torch.full((5,), 0.2, dtype=torch.float64))
    torch.testing.assert_close(fedvg_layerwise_weights(norms), torch.full((5, 3), 0.2, dtype=torch.float64))


def test_smaller_gradient_gets_larger_weight_and_eps_matters_only_near_zero():
    s = fedvg_weights(torch.tensor([[1.0], [2.0], [4.0]], dtype=torch.float64))
    torch.testing.assert_close(s, torch.tensor([4.0, 2.0, 1.0], dtype=torch.float64) / 7)
    s0 = fedvg_weights(torch.tensor([[0.0], [1.0]], dtype=torch.float64), eps=1e-8)
    assert float(s0[0]) > 1 - 1e-7  # a zero-gradient client takes (almost) all the weight


def test_mixed_weights_equal_the_authors_formula():
    s = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    n = torch.tensor([10, 30, 60])
    expected = (s.numpy() + n.numpy() / n.numpy().sum()) / 2
    np.testing.assert_allclose(fedvg_mixed_weights(s, n).numpy(), expected, rtol=1e-12)
    layer = torch.tensor([[0.5, 0.1], [0.3, 0.1], [0.2, 0.8]], dtype=torch.float64)
    got = fedvg_mixed_weights(layer, n).numpy()
    np.testing.assert_allclose(got, (layer.numpy() + (n.numpy() / 100)[:, None]) / 2, rtol=1e-12)
    np.testing.assert_allclose(got.sum(axis=0), [1.0, 1.0], rtol=1e-12)


def test_aggregate_clientwise_is_fedavg_and_layerwise_is_per_tensor():
    g = torch.Generator().manual_seed(0)
    deltas = {
        "a.weight": torch.randn(3, 4, 2, generator=g, dtype=torch.float64),
        "a.bias": torch.randn(3, 4, generator=g, dtype=torch.float64),
    }
    s = torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64)
    got = fedvg_aggregate(deltas, s)
    ref = fedavg(deltas, s)
    for k in deltas:
        torch.testing.assert_close(got[k], ref[k])
    W = torch.tensor([[0.2, 0.6], [0.5, 0.1], [0.3, 0.3]], dtype=torch.float64)
    got = fedvg_aggregate(deltas, W)
    for j, k in enumerate(deltas):
        expected = np.einsum("k,k...->...", W[:, j].numpy(), deltas[k].numpy())
        np.testing.assert_allclose(got[k].numpy(), expected, rtol=1e-12)
    with pytest.raises(ValueError, match=r"\[3, 2\]"):
        fedvg_aggregate(deltas, torch.ones(3, 5) / 3)


def test_weight_errors_are_clear():
    with pytest.raises(ValueError, match="client 1"):
        fedvg_weights(torch.tensor([[1.0, 2.0], [float("nan"), 1.0]]))
    with pytest.raises(ValueError, match="client 0"):
        fedvg_layerwise_weights(torch.tensor([[float("inf")], [1.0]]))
    with pytest.raises(ValueError, match="negative"):
        fedvg_weights(torch.tensor([[1.0], [-2.0]]))
    with pytest.raises(ValueError, match="m = 0"):
        fedvg_weights(torch.zeros(0, 3))
    with pytest.raises(ValueError, match="eps"):
        fedvg_weights(torch.ones(2, 2), eps=0)
    with pytest.raises(ValueError, match="Tensor\\[m, L\\]"):
        fedvg_layerwise_weights(torch.ones(3))
    with pytest.raises(ValueError, match="num_samples"):
        fedvg_mixed_weights(torch.tensor([0.5, 0.5]), torch.tensor([1, 2, 3]))


# ---------------------------------------------------------------- validation gradients (signals)
@pytest.mark.parametrize("n_val", [70, 32, 5])
def test_batched_gradients_equal_a_plain_per_client_loop(n_val):
    model = make_model("mlp", (1, 8, 8), 10, hidden=(12,), seed=0)
    stacked = _clients(model, 4)
    x, y = _val(n_val)
    ref = _loop_reference(model, stacked, x, y)
    for kwargs in ({}, {"sample_chunk": 9}, {"memory_budget": 1}, {"engine": "loop"}):
        got = validation_gradients(model, stacked, (x, y), **kwargs)
        for k in stacked:
            torch.testing.assert_close(got[k], torch.stack([r[k] for r in ref]), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("p", [1, 2])
def test_norms_p1_p2_equal_numpy_on_the_reference_gradients(p):
    model = make_model("mlp", (1, 8, 8), 10, hidden=(12,), seed=0)
    stacked = _clients(model, 3, seed=2)
    x, y = _val(45)
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
    validation_gradient_norms(model, _clients(model, 2), _val(10))
    assert not model.training
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())


def test_a_model_fit_to_the_validation_set_has_the_smaller_gradient():
    model = make_model("mlp", (1, 8, 8), 10, hidden=(16,), seed=0)
    x, y = _val(64)
    from fedlearn_edu.engine import LoopEngine

    fit = LoopEngine().train(model, get_params(model), [(x, y)], LocalTraining(epochs=40, batch_size=16, lr=0.2), [0])
    far = _clients(model, 1, scale=1.0)
    both = {k: torch.cat([fit.params[k], far[k]]) for k in far}
    s = fedvg_weights(validation_gradient_norms(model, both, (x, y)))
    assert float(s[0]) > 0.7


def test_signal_errors_are_clear():
    model = make_model("mlp", (1, 8, 8), 10, hidden=(12,), seed=0)
    stacked = _clients(model, 3)
    with pytest.raises(ValueError, match="empty"):
        validation_gradient_norms(model, stacked, (torch.zeros(0, 1, 8, 8), torch.zeros(0, dtype=torch.long)))
    bad = {k: v.clone() for k, v in stacked.items()}
    bad["out.bias"][2, 0] = float("nan")
    with pytest.raises(ValueError, match="client 2"):
        validation_gradient_norms(model, bad, _val(10))
    huge = {k: v * 1e30 for k, v in stacked.items()}  # overflows: NaN/Inf gradients
    with pytest.raises(ValueError, match="NaN or Inf"):
        validation_gradient_norms(model, huge, _val(10))
    with pytest.raises(ValueError, match="labels"):
        validation_gradient_norms(model, stacked, (torch.zeros(4, 1, 8, 8), torch.zeros(3, dtype=torch.long)))
    with pytest.raises(ValueError, match="norm_order"):
        validation_gradient_norms(model, stacked, _val(10), norm_order=0)
    with pytest.raises(ValueError, match="engine"):
        validation_gradient_norms(model, stacked, _val(10), engine="magic")
    with pytest.raises(ValueError, match="empty"):
        FedVG((torch.zeros(0, 4), torch.zeros(0, dtype=torch.long)))


# ---------------------------------------------------------------- the strategy
def _updates(model, deltas, n, round_=1):
    m = next(iter(deltas.values())).shape[0]
    return ClientUpdates(round_, torch.arange(m), deltas, torch.tensor(n), torch.zeros(m), model)


@pytest.fixture(scope="module")
def round_data():
    model = make_model("mlp", (1, 8, 8), 10, hidden=(12,), seed=0)
    params = get_params(model)
    thetas = _clients(model, 3, seed=4)
    deltas = {k: thetas[k] - params[k] for k in params}
    return model, params, thetas, deltas, _val(50), [10, 20, 70]


@pytest.mark.parametrize(
    "mode,mix", [("clientwise", False), ("layerwise", False), ("clientwise", True), ("layerwise", True)]
)
def test_strategy_aggregate_equals_the_formula(round_data, mode, mix):
    model, params, thetas, deltas, val, n = round_data
    strategy = FedVG(val, mode=mode, mix=mix, server_lr=0.5)
    server_strategy = Server(strategy, params)
    new, diag = server_strategy.aggregate(_updates(model, deltas, n))
    norms = validation_gradient_norms(model, thetas, val)  # theta_k computed here, not rebuilt
    s = fedvg_weights(norms) if mode == "clientwise" else fedvg_layerwise_weights(norms)
    if mix:
        s = fedvg_mixed_weights(s, torch.tensor(n))
    step = fedvg_aggregate(deltas, s)
    for k in params:
        torch.testing.assert_close(new[k], params[k] + 0.5 * step[k], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(diag["grad_norms"], norms, rtol=1e-5, atol=1e-6)
    assert diag["weights"].shape == (3,) and float(diag["weights"].sum()) == pytest.approx(1.0, abs=1e-6)
    assert ("layer_weights" in diag) == (mode == "layerwise")


def test_server_momentum_is_fedavgm_on_the_fedvg_weighted_pseudo_gradient(round_data):
    model, params, thetas, deltas, val, n = round_data
    s = FedVG(val, server_momentum=0.9, server_lr=0.7)
    server_s = Server(s, params)
    p1, d1 = server_s.aggregate(_updates(model, deltas, n))
    step1 = fedvg_aggregate(deltas, d1["weights"])  # v1 = -step1
    for k in params:
        torch.testing.assert_close(p1[k], params[k] + 0.7 * step1[k], rtol=1e-5, atol=1e-6)
    p2, d2 = server_s.aggregate(_updates(model, deltas, n, 2))  # v2 = 0.9 v1 - step2
    step2 = fedvg_aggregate(deltas, d2["weights"])
    for k in params:
        torch.testing.assert_close(p2[k], p1[k] + 0.7 * (0.9 * step1[k] + step2[k]), rtol=1e-5, atol=1e-6)
    server_s = Server(s, params)  # a fresh server state resets the momentum
    p1b, _ = server_s.aggregate(_updates(model, deltas, n))
    for k in params:
        torch.testing.assert_close(p1b[k], p1[k])


def test_composition_with_fedprox_and_fedavgm():
    val = _val(8)
    prox = FedVG.on_top_of(FedProx(mu=0.3, server_lr=0.5), val)
    assert prox.prox_mu == 0.3 and prox.server_lr == 0.5 and prox.server_momentum == 0
    assert prox.configure_local(LocalTraining()).prox_mu == 0.3
    assert FedVG(val).configure_local(LocalTraining()).prox_mu == 0.0
    avgm = FedVG.on_top_of(FedAvgM(server_lr=0.2, momentum=0.8), val, mode="layerwise")
    assert (avgm.server_momentum, avgm.server_lr, avgm.mode) == (0.8, 0.2, "layerwise")
    assert FedVG.on_top_of(FedAvg(), val).server_momentum == 0
    with pytest.raises(TypeError, match="FedVG.s base must be a fedlearn_edu Strategy"):
        FedVG.on_top_of(object(), val)
    with pytest.raises(ValueError, match="mode"):
        FedVG(val, mode="spectral")
    with pytest.raises(ValueError, match="server_momentum"):
        FedVG(val, server_momentum=1.0)
    assert isinstance(make_strategy("fedvg", val_data=val), FedVG)


def test_simulate_with_fedvg_records_weights_and_downweights_noisy_clients():
    from fedlearn_edu.data import add_label_noise

    fed = federated_dataset("digits", "iid", num_clients=6, seed=0)
    fed, val = server_validation_split(fed, 0.1, seed=0)
    fed = add_label_noise(fed, [0, 1], 0.9, seed=0)
    model = make_model("mlp", fed.input_shape, fed.num_classes, hidden=(32,), seed=0)
    h = simulate(fed, model, FedVG(val), rounds=12, clients_per_round=6, local_epochs=2, progress=False)
    w = torch.stack([d["weights"] for d in h.diagnostics])
    torch.testing.assert_close(w.sum(1), torch.ones(12), rtol=1e-5, atol=1e-5)
    assert h.diagnostics[0]["grad_norms"].shape == (6, 4)
    # once the global model is trained, the two pure-noise clients weigh less than the clean ones
    assert float(w[-4:, :2].mean()) < float(w[-4:, 2:].mean())
    assert h.metrics()["mean"] > 0.7


# ---------------------------------------------------------------- validation sets
def test_server_validation_split_moves_samples_without_loss():
    fed = federated_dataset("digits", num_clients=5, alpha=1.0, seed=0)
    clients, (xv, yv) = server_validation_split(fed, fraction=0.1, seed=3)
    for before, after in zip(fed, clients):
        k = after.info["num_val"]
        assert k == max(1, round(0.1 * before.num_train))
        assert after.num_train == before.num_train - k
        assert torch.equal(after.test_y, before.test_y)
    assert yv.shape[0] == sum(c.info["num_val"] for c in clients)

    # every training sample ends up exactly once on a client or at the server
    def rows(x):
        return sorted(map(tuple, x.reshape(x.shape[0], -1).tolist()))

    assert rows(torch.cat([c.train_x for c in clients] + [xv])) == rows(torch.cat([c.train_x for c in fed]))
    with pytest.raises(ValueError, match="fraction"):
        server_validation_split(fed, fraction=1.0)


def test_resize_images_is_block_averaging_when_shrinking():
    x = torch.rand(3, 1, 28, 28)
    small = resize_images(x, 8, crop=2)  # 24x24 -> 8x8: mean of 3x3 blocks
    expected = x[:, :, 2:-2, 2:-2].numpy().reshape(3, 1, 8, 3, 8, 3).mean(axis=(3, 5))
    np.testing.assert_allclose(small.numpy(), expected, rtol=1e-5)
    big = resize_images(torch.rand(2, 1, 8, 8), 28, pad=4, channels=3)
    assert big.shape == (2, 3, 28, 28) and float(big[..., :4, :].abs().max()) == 0.0
    with pytest.raises(ValueError, match="crop"):
        resize_images(x, 8, crop=14)


def test_external_validation_set_from_digits():
    x, y = external_validation_set("digits", (1, 28, 28), num_samples=50, pad=4, seed=0)
    assert x.shape == (50, 1, 28, 28) and y.shape == (50,)
    assert float(x.min()) >= 0 and float(x.max()) <= 1
    with pytest.raises(ValueError, match="num_samples"):
        external_validation_set("digits", (1, 8, 8), num_samples=10**6)


def test_cli_runs_fedvg(capsys):
    from fedlearn_edu.cli import main

    assert (
        main(
            [
                "run",
                "--strategy",
                "fedvg",
                "--rounds",
                "2",
                "--clients",
                "6",
                "--clients-per-round",
                "3",
                "--alpha",
                "1.0",
                "--no-progress",
            ]
        )
        == 0
    )
    assert "fedvg" in capsys.readouterr().out
