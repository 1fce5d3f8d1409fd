"""FedOUI as a strategy: its server step, its signals and its runs in the driver.

The rule itself, as a pure function, is tested in tests/aggregators/test_fedoui.py.
"""

import pytest
import torch

from fedlearn_edu import FedAlign, FedAvg, FedOUI, make_strategy, simulate
from fedlearn_edu.aggregators import (
    fedalign_weights,
    fedavg,
    fedoui_weights,
    fit_beta,
)
from fedlearn_edu.data import federated_dataset
from fedlearn_edu.engine import LocalResult
from fedlearn_edu.models import make_model
from fedlearn_edu.params import get_params, stack_params
from fedlearn_edu.signals import (
    oui,
    penultimate_preactivations,
    probe_batch,
)
from fedlearn_edu.strategies import ClientUpdates
from tests.server_steps import Server


def _updates(model, m=4, seed=0, oui_values=None):
    g = torch.Generator().manual_seed(seed)
    params = get_params(model)
    deltas = {k: 0.1 * torch.randn((m, *v.shape), generator=g) for k, v in params.items()}
    signals = {} if oui_values is None else {"oui": torch.tensor(oui_values, dtype=torch.float64)}
    return params, ClientUpdates(
        1, torch.arange(m), deltas, torch.tensor([10, 20, 30, 40][:m]), torch.zeros(m), model, signals
    )


def test_fedoui_aggregate_applies_the_weighted_mean_of_deltas():
    model = make_model("mlp", (1, 8, 8), 10, hidden=(8,))
    o = [0.2, 0.35, 0.3, 0.6]
    params, updates = _updates(model, oui_values=o)
    new, diag = Server(FedOUI(), params).aggregate(updates)
    w = fedoui_weights(torch.tensor(o, dtype=torch.float64), updates.num_samples)
    step = fedavg(updates.deltas, w)
    for k in params:
        torch.testing.assert_close(new[k], params[k] + step[k])
    torch.testing.assert_close(diag["weights"], w)
    alpha, beta, method = fit_beta(o)
    assert diag["fit_method"] == method and diag["beta_alpha"] == pytest.approx(alpha)
    new2, _ = Server(FedOUI(server_lr=0.5), params).aggregate(updates)
    for k in params:
        torch.testing.assert_close(new2[k], params[k] + 0.5 * step[k])
    with pytest.raises(ValueError, match="signals\\['oui'\\]"):
        theta, bare = _updates(model)
        Server(FedOUI(), theta).aggregate(bare)


def test_fedalign_aggregate_and_registry():
    model = make_model("mlp", (1, 8, 8), 10, hidden=(8,))
    params, updates = _updates(model)
    new, diag = Server(FedAlign(), params).aggregate(updates)
    w = fedalign_weights(updates.deltas, updates.num_samples)
    step = fedavg(updates.deltas, w)
    for k in params:
        torch.testing.assert_close(new[k], params[k] + step[k])
    assert isinstance(make_strategy("fedoui", probe_size=16), FedOUI)
    assert isinstance(make_strategy("FedAlign"), FedAlign)
    with pytest.raises(ValueError, match="probe_size"):
        FedOUI(probe_size=1)
    with pytest.raises(ValueError, match="eps"):
        FedAlign(eps=-1)


def test_client_signals_use_each_clients_own_fixed_probe():
    model = make_model("smallcnn", (1, 8, 8), 10, seed=0)
    g = torch.Generator().manual_seed(1)
    datasets = [(torch.rand(n, 1, 8, 8, generator=g), torch.zeros(n, dtype=torch.long)) for n in (50, 12, 40)]
    clients = [
        {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in get_params(model).items()} for _ in range(3)
    ]
    local = LocalResult(stack_params(clients), torch.zeros(3), torch.ones(3, dtype=torch.long))
    strategy = FedOUI(probe_size=16, probe_seed=7)
    got = strategy.client_signals(model, get_params(model), local, datasets)["oui"]
    expected = [
        oui(penultimate_preactivations(model, probe_batch(x, 16, 7), p)) for (x, _), p in zip(datasets, clients)
    ]
    assert got.tolist() == pytest.approx(expected, abs=1e-12)
    again = strategy.client_signals(model, get_params(model), local, datasets)["oui"]
    assert torch.equal(got, again)


@pytest.fixture(scope="module")
def small_federation():
    return federated_dataset("digits", "dirichlet", num_clients=6, alpha=0.3, seed=0, num_samples=300)


def test_fedoui_in_the_simulator_and_large_eps_is_fedavg(small_federation):
    model = make_model("mlp", small_federation.input_shape, 10, seed=0, hidden=(32,))
    kw = dict(rounds=2, clients_per_round=4, batch_size=16, lr=0.05, seed=0, progress=False)
    h = simulate(small_federation, model, FedOUI(), **kw)
    for d in h.diagnostics:
        assert d["oui"].shape == (4,) and bool(((d["oui"] >= 0) & (d["oui"] <= 1)).all())
        assert float(d["weights"].sum()) == pytest.approx(1.0, abs=1e-9)
        assert d["fit_method"] in {"moments", "mle", "empirical"}
    # eps >> 1 makes (eps + s_k) nearly constant: FedOUI's weights become FedAvg's
    a = simulate(small_federation, model, FedOUI(eps=1e9), **kw).final_params
    b = simulate(small_federation, model, FedAvg(), **kw).final_params
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6)
    loop = simulate(small_federation, model, FedOUI(), engine="loop", **kw)
    for d1, d2 in zip(h.diagnostics, loop.diagnostics):
        torch.testing.assert_close(d1["oui"], d2["oui"], rtol=0, atol=1e-12)
