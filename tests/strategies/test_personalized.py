"""The personalised and clustered strategies (:mod:`fedlearn_edu.strategies.personalized`): IFCA refuses
more clusters than clients before building them; the personalised methods are strategies run by simulate, alike
on both engines."""

import numpy as np
import pytest
import torch

from fedlearn_edu import IFCA, Ditto, FedAdam, LocalOnly, simulate
from fedlearn_edu.personalization import simulate_ditto, simulate_ifca, simulate_local
from tests.test_simulation import KW, _model


@pytest.mark.parametrize("k", [7, 2**64])
def test_ifca_with_more_clusters_than_clients_is_refused_by_name(fed, mlp, k):
    """IFCA(num_clusters=2**64) used to build cluster models until memory ran out; K > N is refused up front."""
    with pytest.raises(ValueError, match=r"num_clusters=\d+\) needs at most one cluster per client.*6 clients"):
        simulate(fed, mlp(fed), IFCA(num_clusters=k), rounds=1, progress=False)


def test_personalised_methods_are_strategies_run_by_simulate(fed):
    model = _model(fed)
    for conv, strategy in (
        (lambda: simulate_local(fed, model, **KW), LocalOnly()),
        (lambda: simulate_ifca(fed, model, 2, warmup_rounds=1, **KW), IFCA(2, warmup_rounds=1)),
        (lambda: simulate_ditto(fed, model, 0.3, FedAdam(server_lr=0.05), **KW), Ditto(0.3, FedAdam(server_lr=0.05))),
    ):
        a, b = conv(), simulate(fed, model, strategy, **KW)
        np.testing.assert_array_equal(a.client_accuracy, b.client_accuracy)
        assert a.evaluated == b.evaluated == strategy.evaluates != "global"
    assert b.strategy == "ditto+fedadam" and set(b.other_accuracy) == {"global"}
    assert b.final_state["personal"]["out.weight"].shape == (fed.num_clients, 10, 16)
    ifca = simulate(fed, model, IFCA(2, warmup_rounds=1), **KW)
    assert ifca.model_index.shape == (4, fed.num_clients) and set(np.unique(ifca.model_index)) <= {0, 1}
    picked = ifca.final_state["cluster"]
    assert ((picked >= 0) == torch.as_tensor(np.isin(np.arange(6), np.concatenate(ifca.selected)))).all()


@pytest.mark.parametrize("make", [lambda: Ditto(0.3), LocalOnly])
def test_personalised_strategies_agree_across_engines(fed, make):
    model = _model(fed)
    a = simulate(fed, model, make(), engine="loop", **KW)
    b = simulate(fed, model, make(), engine="vmap", **KW)
    assert (a.config["engine"], b.config["engine"]) == ("loop", "vmap")
    np.testing.assert_allclose(a.client_loss, b.client_loss, rtol=1e-4, atol=1e-5)
    for k, v in a.final_state["personal"].items():
        torch.testing.assert_close(b.final_state["personal"][k], v, rtol=1e-4, atol=1e-5)
