"""Flower's DP wrappers and SecAgg+ against the adapter: what they do to its replies, and what to use instead.

The statements of :mod:`fedlearn_edu.flower.server`'s docstring, checked in one process
(:class:`LocalGrid`, no SuperLink).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

flwr = pytest.importorskip("flwr", reason="the Flower adapter needs the 'flower' extra")

from flwr.app import ConfigRecord, Context, RecordDict  # noqa: E402
from flwr.clientapp.mod import fixedclipping_mod  # noqa: E402
from flwr.compat.common.recorddict_compat import recorddict_to_fitres  # noqa: E402
from flwr.server.strategy import Strategy as LegacyStrategy  # noqa: E402
from flwr.server.workflow import SecAggPlusWorkflow  # noqa: E402
from flwr.serverapp.strategy import (  # noqa: E402
    DifferentialPrivacyClientSideFixedClipping,
    DifferentialPrivacyServerSideFixedClipping,
)

from fedlearn_edu import DPFedAvg, FedAvg, federated_dataset, make_model, simulate  # noqa: E402
from fedlearn_edu.flower import FlowerStrategy, LocalGrid, Node, make_client_app, node_partition  # noqa: E402
from fedlearn_edu.flower.bridge import ClientReply  # noqa: E402
from fedlearn_edu.flower.records import arrays_to_params, params_to_arrays, reply_to_record  # noqa: E402
from fedlearn_edu.params import get_params  # noqa: E402
from fedlearn_edu.strategies import STRATEGIES, ClientUpdates  # noqa: E402

N = 4
HYPER = dict(local_epochs=1, batch_size=16, lr=0.05, seed=3)


@pytest.fixture(scope="module")
def setting():
    fed = federated_dataset("digits", num_clients=N, alpha=0.5, seed=1)
    model = make_model("mlp", fed.input_shape, fed.num_classes, seed=2, hidden=(16,))
    return fed, model


def _app(fed, model):
    def node_fn(context: Context) -> Node:
        pid, data = node_partition(context, fed)
        return Node(model, data, pid, fed.num_classes)

    return make_client_app(node_fn)


def _configs():
    return [{"partition-id": i, "num-partitions": N} for i in range(N)]


class _Spy(FedAvg):
    """FedAvg that keeps the updates it is given (test only)."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def direction(self, server_state, updates):
        self.seen.append({k: v.clone() for k, v in updates.deltas.items()})
        return super().direction(server_state, updates)


def _start(fed, model, outer, rounds):
    with LocalGrid(_app(fed, model), _configs()) as grid:
        return outer.start(grid, params_to_arrays(get_params(model)), num_rounds=rounds)


def test_the_client_side_wrapper_is_refused_and_fixedclipping_mod_would_reject_the_reply(setting):
    fed, model = setting
    inner = FlowerStrategy(FedAvg(), model, fraction_evaluate=0.0, **HYPER)
    outer = DifferentialPrivacyClientSideFixedClipping(
        inner, noise_multiplier=1.0, clipping_norm=1.0, num_sampled_clients=N
    )
    with pytest.raises(ValueError, match="cannot run inside Flower's DifferentialPrivacyClientSideFixedClipping"):
        _start(fed, model, outer, 1)
    # The mod itself, on the adapter's train message and reply:
    app = _app(fed, model)
    with LocalGrid(app, _configs()) as grid:
        strategy = FlowerStrategy(FedAvg(), model, fraction_evaluate=0.0, **HYPER)
        msg = list(strategy.configure_train(1, params_to_arrays(get_params(model)), ConfigRecord(), grid))[0]
        context = grid.contexts[msg.metadata.dst_node_id]
        reply = fixedclipping_mod(msg, context, app)  # the adapter's config has no clipping norm
        assert reply.has_error() and "requires the key 'clipping_norm'" in reply.error.reason
        msg.content["config"]["clipping_norm"] = 1.0  # had the norm arrived: the names differ
        reply = fixedclipping_mod(msg, context, app)
        assert reply.has_error() and "keys in the ArrayRecord of the reply message to match" in reply.error.reason
        assert list(msg.content["arrays"].keys())[0].startswith("params/")


def _flat(tree):
    return np.concatenate([np.asarray(v, dtype=np.float64).reshape(-1) for v in tree.values()])


def test_the_server_side_wrapper_clips_the_distance_to_the_model_and_its_noise_misses_the_training(setting):
    fed, model = setting
    theta0 = get_params(model)
    plain = _Spy()
    _start(fed, model, FlowerStrategy(plain, model, fraction_evaluate=0.0, **HYPER), 1)
    wrapped = _Spy()
    clip = 0.5
    outer = DifferentialPrivacyServerSideFixedClipping(
        FlowerStrategy(wrapped, model, fraction_evaluate=0.0, **HYPER), 0.0, clip, N
    )
    _start(fed, model, outer, 1)
    theta = _flat(theta0)
    for i in range(N):
        delta = _flat({k: v[i] for k, v in plain.seen[0].items()})
        got = _flat({k: v[i] for k, v in wrapped.seen[0].items()})
        gap = delta - theta  # Flower clips reply - theta_t ...
        expected = theta + gap * min(1.0, clip / np.linalg.norm(gap))  # ... and sends theta_t + the clipped gap
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
        ours = delta * min(1.0, clip / np.linalg.norm(delta))  # not DP-FedAvg's clipped update
        assert np.abs(got - ours).max() > 0.1
    # Noise: on Flower's copy of the model (the released one) only, not on the adapter's state ...
    z, c = 1.0, 1.0
    np.random.seed(0)  # Flower draws its noise from NumPy's global generator
    inner = FlowerStrategy(_Spy(), model, fraction_evaluate=0.0, **HYPER)
    released = _flat(
        arrays_to_params(_start(fed, model, DifferentialPrivacyServerSideFixedClipping(inner, z, c, N), 1).arrays)
    )
    gap = released - _flat(inner.final_params())
    assert abs(gap.std() - z * c / N) < 0.1 * z * c / N and abs(gap.mean()) < 0.1 * z * c / N
    # ... and in round 2 it clips the replies against that noised copy: theta~_1 + clip_C(Delta_i - theta~_1),
    # here (noise >> updates) every "update" the strategy gets lies at distance C from theta~_1.
    np.random.seed(0)
    spy = _Spy()
    _start(
        fed,
        model,
        DifferentialPrivacyServerSideFixedClipping(FlowerStrategy(spy, model, fraction_evaluate=0.0, **HYPER), z, c, N),
        2,
    )
    for i in range(N):
        np.testing.assert_allclose(
            np.linalg.norm(_flat({k: v[i] for k, v in spy.seen[1].items()}) - released), c, rtol=1e-4
        )


def test_dpfedavg_inside_the_adapter_is_the_simulators_private_run(setting):
    fed, model = setting

    def strategy():
        return DPFedAvg(clip=0.3, noise_multiplier=0.8, target_quantile=0.5, count_noise=1.0)

    flower = FlowerStrategy(strategy(), model, fraction_evaluate=0.0, **HYPER)
    with LocalGrid(_app(fed, model), _configs()) as grid:
        flower.run(grid, rounds=3)
    history = simulate(
        fed, model, strategy(), rounds=3, clients_per_round=N, engine="loop", device="cpu", progress=False, **HYPER
    )
    for k, v in history.final_params.items():
        torch.testing.assert_close(flower.final_params()[k], v, rtol=1e-6, atol=1e-7)
    assert flower.server_state["clip"] == pytest.approx(history.final_server_state["clip"], rel=1e-9)
    assert flower.server_state["clip"] != 0.3


def test_secaggplus_is_a_legacy_workflow_the_adapter_cannot_go_through(setting):
    fed, model = setting
    strategy = FlowerStrategy(FedAvg(), model, **HYPER)
    assert not isinstance(strategy, LegacyStrategy)  # the workflow's LegacyContext needs one
    context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    with LocalGrid(_app(fed, model), _configs()) as grid:
        with pytest.raises(TypeError, match="Expect a LegacyContext"):
            SecAggPlusWorkflow(num_shares=3, reconstruction_threshold=2)(grid, context)
    reply = ClientReply(0, {"fc.weight": torch.zeros(2, 2)}, 5, torch.tensor(0.1))
    with pytest.raises(KeyError, match="fitres.parameters"):  # secaggplus_mod reads the reply as a FitRes
        recorddict_to_fitres(reply_to_record(reply), keep_input=True)


@pytest.mark.parametrize("name", ["fedavg", "fedavgm", "fedprox", "fedadam", "fedyogi", "fedadagrad"])
def test_the_strategies_a_weighted_secure_sum_would_carry(name):
    """SecAgg+ gives the server sum n_i Delta_i / sum n_i only: these strategies' step depends on nothing else."""
    s = STRATEGIES[name]()
    assert s.needs.sums_only
    g = torch.Generator().manual_seed(0)
    d1 = {"w": torch.randn(5, 3, generator=g, dtype=torch.float64)}
    n1 = torch.tensor([1, 4, 2, 3, 5])
    avg = (n1[:, None] * d1["w"]).sum(0) / n1.sum()
    # another federation with the same weighted average: 3 clients, other sizes
    d2 = {"w": torch.stack([avg + 1.0, avg - 2.0, avg + 0.5])}
    n2 = torch.tensor([2, 1, 0])  # (2 (avg + 1) + (avg - 2) + 0) / 3 = avg
    params = {"w": torch.zeros(3, dtype=torch.float64)}
    state = s.init_state(params, None, 10, 0)[0]
    u1 = ClientUpdates(1, torch.arange(5), d1, n1, torch.zeros(5), None)
    u2 = ClientUpdates(1, torch.arange(3), d2, n2, torch.zeros(3), None)
    a, _ = s.aggregate(state, u1)
    b, _ = s.aggregate(state, u2)
    torch.testing.assert_close(a["params"]["w"], b["params"]["w"], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("z, sigma_b", [(1.0, 5.0), (0.8, 0.5), (2.0, 1.01), (1.1, 100.0)])
def test_the_noise_split_matches_flowers_adaptive_clipping(z, sigma_b):
    """Flower's adaptive-clipping wrappers split the noise multiplier by the same formula (Andrew et al.)."""
    from flwr.supercore.differential_privacy import compute_adaptive_noise_params

    from fedlearn_edu.strategies.dp import split_noise_multiplier

    _, theirs = compute_adaptive_noise_params(z, 10, sigma_b)
    assert split_noise_multiplier(z, sigma_b) == pytest.approx(theirs, rel=1e-12)
