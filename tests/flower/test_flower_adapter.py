"""The Flower adapter in one process: equivalence with simulate(), records, errors.

The Flower side runs Flower's own round loop (``flwr.serverapp.strategy.Strategy.start``)
with :class:`FlowerStrategy`, and the ClientApp from ``make_client_app``, connected by
:class:`LocalGrid` (messages handed to the ClientApp in this process: no network, no Ray).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

flwr = pytest.importorskip("flwr", reason="the Flower adapter needs the 'flower' extra")

from flwr.app import ConfigRecord, Context, RecordDict  # noqa: E402

from fedlearn_edu import (  # noqa: E402
    CRAFT,
    IFCA,
    Ditto,
    FedAvg,
    FedOUI,
    FedVG,
    LocalOnly,
    QFedAvg,
    chain,
    clip_by_global_norm,
    federated_dataset,
    make_model,
    sgd,
    simulate,
)
from fedlearn_edu.data import server_validation_split  # noqa: E402
from fedlearn_edu.engine import LocalTraining  # noqa: E402
from fedlearn_edu.flower import (  # noqa: E402
    CLIENT_STATE_KEY,
    NODE_STATE_KEY,
    FlowerStrategy,
    LocalGrid,
    Node,
    arrays_to_params,
    bridge,
    client_state,
    make_client_app,
    node_partition,
)
from fedlearn_edu.flower.records import (  # noqa: E402
    arrays_to_state,
    config_to_record,
    diagnostics_to_metrics,
    record_to_config,
    record_to_reply,
    reply_to_record,
    state_to_arrays,
)
from fedlearn_edu.params import get_params  # noqa: E402
from tests.poisoned import REASONS, Poisoned  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
NUM_CLIENTS = 4
HYPER = dict(local_epochs=1, batch_size=16, lr=0.05, lr_decay=0.9, momentum=0.5, seed=3)


@pytest.fixture(scope="module")
def setting():
    """4 Dirichlet clients of digits, a server validation share (FedVG's), a small MLP."""
    fed = federated_dataset("digits", num_clients=NUM_CLIENTS, alpha=0.5, seed=1)
    fed, val = server_validation_split(fed, fraction=0.1, seed=1)
    model = make_model("mlp", fed.input_shape, fed.num_classes, seed=2, hidden=(32, 16))
    return fed, val, model


def node_configs(n: int = NUM_CLIENTS) -> list[dict]:
    return [{"partition-id": i, "num-partitions": n} for i in range(n)]


def simulate_every_client(fed, model, strategy, rounds=3):
    """``simulate`` as the Flower runs here: every client every round, the loop engine, on the CPU."""
    return simulate(
        fed,
        model,
        strategy,
        rounds=rounds,
        clients_per_round=NUM_CLIENTS,
        engine="loop",
        device="cpu",
        progress=False,
        diagnostics=("conflicts",),  # the Flower strategy reports them every round
        **HYPER,
    )


def flower_run(fed, model, server_strategy, client_strategy, rounds=3, errors="raise", node_fn=None, **kwargs):
    """Run ``rounds`` rounds through Flower's Strategy.start on a LocalGrid; return (strategy, grid, result)."""

    def default_node_fn(context: Context) -> Node:
        pid, data = node_partition(context, fed)
        return Node(model, data, pid, fed.num_classes, client_strategy)

    app = make_client_app(node_fn or default_node_fn)
    strategy = FlowerStrategy(server_strategy, model, **{**HYPER, **kwargs})
    with LocalGrid(app, node_configs(len(fed)), errors=errors) as grid:
        result = strategy.run(grid, rounds=rounds)
    return strategy, grid, result


class Diverging(FedAvg):
    """Client side only: local training whose update comes out NaN (a diverged client)."""

    def client_update(self, work, params, state):
        out = super().client_update(work, params, state)
        out.deltas = {k: torch.full_like(v, float("nan")) for k, v in out.deltas.items()}
        return out


class CountingFedAvg(FedAvg):
    """FedAvg plus a per-client counter (client state ``visits``, ``Tensor[N]``) that shapes the update.

    Client i's update is scaled by ``1 / (1 + visits_i)`` before it is sent, so the global
    parameters depend on the state having been kept across rounds; the counter starts at
    ``i`` (``init_state`` gives each client its own first row).
    """

    def init_state(self, params, model, num_clients, seed):
        server, _ = super().init_state(params, model, num_clients, seed)
        return server, {"visits": torch.arange(num_clients, dtype=torch.int64)}

    def client_update(self, work, params, state):
        out = super().client_update(work, params, state)
        scale = 1.0 / (1.0 + state["visits"].to(torch.float32))
        out.deltas = {k: v * scale.reshape(-1, *([1] * (v.dim() - 1))) for k, v in out.deltas.items()}
        out.state = {"visits": state["visits"] + 1}
        return out


STRATEGIES = {
    "fedavg": lambda val: (FedAvg(), FedAvg()),
    "craft": lambda val: (CRAFT(server_lr=0.5), CRAFT()),
    "fedvg": lambda val: (FedVG(val), FedAvg()),  # FedVG's signals are computed on the server
    "fedoui": lambda val: (FedOUI(probe_size=16), FedOUI(probe_size=16)),
    # the one-line server-side clipping: the rounds' directions have norms 0.26 to 0.35 here, so C = 0.2 clips
    "fedavg-clipped": lambda val: (FedAvg(optimizer=chain(clip_by_global_norm(0.2), sgd(1.0))), FedAvg()),
}


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_flower_equals_simulate_after_three_rounds(setting, name):
    """Same partition, seed, strategy and hyper-parameters, every client every round:
    Flower (Strategy.start + ClientApp messages) gives simulate()'s global parameters."""
    fed, val, model = setting
    server, client = STRATEGIES[name](val)
    theta0 = get_params(model)
    flower_strategy, _, result = flower_run(fed, model, server, client)
    sim_strategy, _ = STRATEGIES[name](val)
    history = simulate_every_client(fed, model, sim_strategy)
    flower_params = arrays_to_params(result.arrays)
    assert flower_params.keys() == history.final_params.keys()
    moved = 0.0
    for k, v in history.final_params.items():
        torch.testing.assert_close(flower_params[k], v, rtol=1e-6, atol=1e-7)
        moved += float((v - theta0[k]).abs().sum())
    assert moved > 1e-3, "the run did not move the parameters, so the comparison proves nothing"
    for k, v in flower_strategy.final_params().items():
        assert torch.equal(v, flower_params[k])
    # The strategy's per-round diagnostics and the per-client evaluation agree too.
    for d_flower, d_sim in zip(flower_strategy.diagnostics, history.diagnostics):
        assert d_flower["conflicts"] == d_sim["conflicts"]
        if "weights" in d_sim:
            torch.testing.assert_close(d_flower["weights"], d_sim["weights"], rtol=1e-6, atol=1e-9)
    final = flower_strategy.evaluations[-1]
    assert final["round"] == 3
    acc = [final["client_accuracy"][i] for i in range(NUM_CLIENTS)]
    assert acc == pytest.approx(history.client_accuracy[-1].tolist(), abs=1e-12)
    # theta_0 was taken from the model, which nobody modified.
    for k, v in get_params(model).items():
        assert torch.equal(v, theta0[k])


def test_core_package_does_not_import_flower():
    """`import fedlearn_edu` works with flwr blocked, and the adapter then says how to install it."""
    code = textwrap.dedent(
        """
        import sys
        sys.modules["flwr"] = None          # any `import flwr` now raises ImportError
        import fedlearn_edu
        from fedlearn_edu import simulate, FedAvg
        try:
            import fedlearn_edu.flower
        except ImportError as err:
            print("MESSAGE:", err)
        else:
            raise SystemExit("fedlearn_edu.flower imported without flwr")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert 'pip install "flwr>=1.42,<2"' in out.stdout and "fedlearn_edu[" not in out.stdout  # not the index's name
    plain = subprocess.run(
        [sys.executable, "-c", "import sys, fedlearn_edu; print('flwr' in sys.modules)"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert plain.returncode == 0, plain.stderr[-3000:]
    assert plain.stdout.strip() == "False"


def test_fedoui_without_oui_metric_is_a_clear_error(setting):
    """A FedOUI server whose nodes do not report OUI stops with a message naming what is missing."""
    fed, _, model = setting
    with pytest.raises(ValueError, match=r"lacks the signal\(s\) \['oui'\].*FedOUI"):
        flower_run(fed, model, FedOUI(probe_size=16), FedAvg(), rounds=1)


def test_qfedavg_losses_travel_in_metric_records(setting):
    """q-FedAvg's per-client losses F_k(theta_t) reach the server, as the simulator computes them."""
    fed, _, model = setting
    strategy, _, _ = flower_run(fed, model, QFedAvg(q=1.0), QFedAvg(q=1.0), rounds=1)
    history = simulate_every_client(fed, model, QFedAvg(q=1.0), rounds=1)
    torch.testing.assert_close(strategy.diagnostics[0]["losses"], history.diagnostics[0]["losses"])


def test_non_finite_client_is_dropped_without_touching_the_others(setting):
    """One node's diverged update ruins only itself: the round aggregates the others, as if it were absent.

    (ClientData refuses NaN inputs, so node 1 diverges through its client update instead.)
    """
    fed, _, model = setting

    def node_fn(context):
        pid, data = node_partition(context, fed)
        return Node(model, data, pid, fed.num_classes, Diverging() if pid == 1 else FedAvg())

    strategy, _, result = flower_run(fed, model, FedAvg(), FedAvg(), rounds=1, node_fn=node_fn)
    assert strategy.diagnostics[0]["dropped"] == [1]
    assert strategy.diagnostics[0]["clients"] == [0, 2, 3]
    # The same round without client 1, computed through the bridge from the clean nodes' replies.
    config = bridge.round_config(FedAvg(), LocalTraining(1, 16, 0.05, 0.5), 0.9, 1)
    theta0 = get_params(model)
    replies = [
        bridge.train_client(
            FedAvg(), model, {"params": theta0}, (fed[i].train_x, fed[i].train_y), config, HYPER["seed"], 1, i
        )[0]
        for i in (0, 2, 3)
    ]
    updates = bridge.client_updates(FedAvg(), 1, model, theta0, replies, config)
    server_state = bridge.begin_run(FedAvg(), theta0, model, NUM_CLIENTS, HYPER["seed"])
    expected = bridge.server_update(FedAvg(), server_state, updates)[0]["params"]
    got = arrays_to_params(result.arrays)
    for k in expected:
        torch.testing.assert_close(got[k], expected[k])
    assert all(torch.isfinite(v).all() for v in got.values())


def test_simulate_and_flower_drop_the_same_bad_clients_for_the_same_reasons():
    """A NaN signal, a NaN update and a NaN new client state: simulate and Flower drop the same
    three clients each round, give the same reasons (naming the bad part) and aggregate the same
    honest clients; the dropped clients keep their old client state on the nodes as in simulate.

    Before the shared policy, Flower aggregated the NaN-signal and the NaN-state clients, the
    node kept the NaN-signal client's new state, and simulate blamed all three on the update."""
    fed = federated_dataset("digits", num_clients=6, alpha=0.5, seed=1)
    model = make_model("mlp", fed.input_shape, fed.num_classes, seed=2, hidden=(32, 16))
    history = simulate(
        fed,
        model,
        Poisoned(probe_size=16),
        rounds=2,
        clients_per_round=len(fed),
        engine="loop",
        device="cpu",
        progress=False,
        on_nonfinite="skip",
        **HYPER,
    )
    strategy, grid, result = flower_run(fed, model, Poisoned(probe_size=16), Poisoned(probe_size=16), rounds=2)
    assert history.dropped == [REASONS, REASONS]
    for t, d in enumerate(strategy.diagnostics):
        assert d["dropped_reasons"] == history.dropped[t]
        assert d["dropped"] == sorted(REASONS)
        assert d["clients"] == [0, 4, 5]
    for k, v in history.final_params.items():
        torch.testing.assert_close(arrays_to_params(result.arrays)[k], v, rtol=1e-6, atol=1e-7)
    visits = {int(c.node_config["partition-id"]): client_state(c)["visits"] for c in grid.contexts.values()}
    assert torch.equal(torch.cat([visits[i] for i in range(len(fed))]), history.final_state["visits"])
    assert history.final_state["visits"].tolist() == [2, 0, 0, 0, 2, 2]


def test_failed_node_is_recorded_and_the_round_goes_on(setting):
    fed, _, model = setting

    def node_fn(context):
        pid, data = node_partition(context, fed)
        if pid == 2:
            raise RuntimeError("disk full on node 2")
        return Node(model, data, pid, fed.num_classes)

    strategy, grid, _ = flower_run(fed, model, FedAvg(), FedAvg(), rounds=2, errors="reply", node_fn=node_fn)
    assert [d["clients"] for d in strategy.diagnostics] == [[0, 1, 3], [0, 1, 3]]
    failed_node = next(n for n, c in grid.contexts.items() if c.node_config["partition-id"] == 2)
    assert strategy.diagnostics[0]["failed"] == [failed_node]


def test_node_state_stays_on_the_node(setting):
    """Each node counts its rounds in Context.state; nothing of it is in the replies."""
    fed, _, model = setting
    strategy, grid, _ = flower_run(fed, model, FedAvg(), FedAvg(), rounds=3, eval_every=2)
    for context in grid.contexts.values():
        state = context.state[NODE_STATE_KEY]
        assert state["rounds-trained"] == 3 and state["last-round"] == 3
        assert state["last-train-loss"] > 0
    assert [e["round"] for e in strategy.evaluations] == [2, 3]  # every 2nd round and the last


def test_reply_records_round_trip_exactly():
    """Parameters, losses and signals (dtype and shape kept) survive the trip through Flower's records."""
    gen = torch.Generator().manual_seed(0)
    reply = bridge.ClientReply(
        client_id=7,
        deltas={"a.weight": torch.randn(3, 4, generator=gen), "a.bias": torch.randn(3, generator=gen)},
        num_samples=42,
        train_loss=torch.tensor(0.123456789, dtype=torch.float32),
        recorded_loss=torch.tensor(0.5, dtype=torch.float32),
        signals={
            "oui": torch.tensor(0.3141592653589793, dtype=torch.float64),
            "vec": torch.randn(2, 3, generator=gen),
        },
    )
    content = reply_to_record(reply)
    assert len(content.array_records) == 1 and len(content.metric_records) == 1
    back = record_to_reply(content, node=9)
    assert back.client_id == 7 and back.num_samples == 42
    assert torch.equal(back.train_loss, reply.train_loss) and torch.equal(back.recorded_loss, reply.recorded_loss)
    for k, v in reply.deltas.items():
        assert torch.equal(back.deltas[k], v) and back.deltas[k].dtype == v.dtype
    for k, v in reply.signals.items():
        assert back.signals[k].dtype == v.dtype and torch.equal(back.signals[k], v)


def test_config_record_round_trip_and_malformed_messages():
    config = LocalTraining(epochs=2, batch_size=7, lr=0.01, momentum=0.9, weight_decay=1e-4, prox_mu=0.1)
    assert record_to_config(config_to_record(config, 4, 11)) == (config, 4, 11)
    with pytest.raises(ValueError, match="FlowerStrategy"):
        record_to_config(ConfigRecord({"lr": 0.1}))
    with pytest.raises(ValueError, match="no ArrayRecord 'deltas'"):
        record_to_reply(RecordDict({}), node=3)


def test_diagnostics_to_metrics_keeps_numbers_only():
    metrics = diagnostics_to_metrics(
        {
            "weights": torch.tensor([0.25, 0.75]),
            "beta_alpha": 2.0,
            "fit_method": "moments",
            "conflicts": 1,
            "conflicts_per_layer": {"fc1": 0, "fc2": 1},
            "clients": [0, 3],
            "empty": [],
        }
    )
    assert dict(metrics) == {
        "weights": [0.25, 0.75],
        "beta_alpha": 2.0,
        "conflicts": 1.0,
        "conflicts_per_layer.fc1": 0.0,
        "conflicts_per_layer.fc2": 1.0,
        "clients": [0.0, 3.0],
    }


def test_client_updates_refuses_inconsistent_replies(setting):
    fed, _, model = setting
    theta = get_params(model)
    good = bridge.ClientReply(0, {k: torch.zeros_like(v) for k, v in theta.items()}, 10, torch.tensor(1.0))
    with pytest.raises(ValueError, match="more than one reply"):
        bridge.client_updates(FedAvg(), 1, model, theta, [good, good])
    bad_shape = bridge.ClientReply(1, {k: v[..., :1].clone() for k, v in theta.items()}, 10, torch.tensor(1.0))
    with pytest.raises(ValueError, match="shape"):
        bridge.client_updates(FedAvg(), 1, model, theta, [good, bad_shape])
    other = bridge.ClientReply(2, dict(good.deltas), 10, torch.tensor(1.0), {"oui": torch.tensor(0.5)})
    with pytest.raises(ValueError, match="different signals"):
        bridge.client_updates(FedAvg(), 1, model, theta, [good, other])
    with pytest.raises(ValueError, match="no client replies"):
        bridge.client_updates(FedAvg(), 1, model, theta, [])


def test_node_partition_checks_the_node_config(setting):
    fed, _, _ = setting

    def ctx(config):
        return Context(run_id=1, node_id=5, node_config=config, state=RecordDict(), run_config={})

    assert node_partition(ctx({"partition-id": 2, "num-partitions": NUM_CLIENTS}), fed)[0] == 2
    with pytest.raises(ValueError, match="lacks \\['partition-id'\\]"):
        node_partition(ctx({"num-partitions": NUM_CLIENTS}), fed)
    with pytest.raises(ValueError, match="num-partitions=9"):
        node_partition(ctx({"partition-id": 0, "num-partitions": 9}), fed)
    with pytest.raises(ValueError, match="0 <= partition-id < num-partitions"):
        node_partition(ctx({"partition-id": NUM_CLIENTS, "num-partitions": NUM_CLIENTS}), fed)


def test_flower_strategy_checks_its_arguments(setting):
    _, _, model = setting
    with pytest.raises(TypeError, match="fedlearn_edu Strategy"):
        FlowerStrategy(object(), model)
    with pytest.raises(ValueError, match="lr_decay"):
        FlowerStrategy(FedAvg(), model, lr_decay=0)
    with pytest.raises(ValueError, match="fraction_train"):
        FlowerStrategy(FedAvg(), model, fraction_train=1.5)
    with pytest.raises(ValueError, match="lr must be > 0"):
        FlowerStrategy(FedAvg(), model, lr=0)


@pytest.mark.parametrize("name", ["ditto", "counter"])
def test_client_state_stays_on_the_nodes_and_matches_simulate(setting, name):
    """A strategy with client state (Ditto's personal models; a per-client counter) keeps each
    node's rows in its Context.state across rounds, and gives simulate()'s global parameters,
    client state and per-client accuracies (loop engine, same seeds, every client every round)."""
    fed, _, model = setting
    make = {"ditto": lambda: Ditto(lam=0.5, base=FedAvg()), "counter": CountingFedAvg}[name]
    flower_strategy, grid, result = flower_run(fed, model, make(), make(), rounds=3)
    history = simulate_every_client(fed, model, make())
    flower_params = arrays_to_params(result.arrays)
    for k, v in history.final_params.items():
        torch.testing.assert_close(flower_params[k], v, rtol=1e-6, atol=1e-7)
    # Each node's state rows equal its row of the simulator's final client state.
    for context in grid.contexts.values():
        pid = context.node_config["partition-id"]
        state = client_state(context)
        assert CLIENT_STATE_KEY in context.state
        if name == "counter":
            assert state["visits"].tolist() == [pid + 3] == [int(history.final_state["visits"][pid])]
        else:
            assert state["personal"].keys() == history.final_state["personal"].keys()
            for k, v in history.final_state["personal"].items():
                torch.testing.assert_close(state["personal"][k][0], v[pid], rtol=1e-6, atol=1e-7)
    # Nothing of the state is sent: the train replies hold Delta_i and metrics only.
    assert not any("personal" in k or "visits" in k for d in flower_strategy.diagnostics for k in d)
    losses = [d["train_loss"] for d in flower_strategy.diagnostics]
    assert losses == pytest.approx(history.train_loss, rel=1e-5)
    final = flower_strategy.evaluations[-1]
    acc = [final["client_accuracy"][i] for i in range(NUM_CLIENTS)]
    assert acc == pytest.approx(history.client_accuracy[-1].tolist(), abs=1e-12)
    if name == "ditto":  # the personal models are evaluated first, the global one beside them
        other = [final["other_accuracy"]["global"][i] for i in range(NUM_CLIENTS)]
        assert other == pytest.approx(history.other_accuracy["global"][-1].tolist(), abs=1e-12)


def test_client_state_records_round_trip():
    state = {
        "visits": torch.tensor([4]),
        "personal": {"fc.weight": torch.randn(1, 3, 2, dtype=torch.float64), "fc.bias": torch.randn(1, 3)},
    }
    back = arrays_to_state(state_to_arrays(state))
    assert back.keys() == state.keys() and back["personal"].keys() == state["personal"].keys()
    assert torch.equal(back["visits"], state["visits"]) and back["visits"].dtype == torch.int64
    for k, v in state["personal"].items():
        assert torch.equal(back["personal"][k], v) and back["personal"][k].dtype == v.dtype
    with pytest.raises(ValueError, match="may not contain '/'"):
        state_to_arrays({"a/b": torch.zeros(1)})


def test_several_server_models_are_refused(setting):
    _, _, model = setting
    with pytest.raises(ValueError, match="server_model='clusters'"):
        FlowerStrategy(IFCA(2), model)
    with pytest.raises(ValueError, match="server_model='none'"):
        FlowerStrategy(LocalOnly(), model)


@pytest.mark.parametrize("decay", [0, -1, float("nan"), 2.0])
def test_round_config_names_lr_decay_not_lr(decay):
    """``lr_decay=0`` gave "lr must be > 0, got 0.0" (and NaN "lr must be finite"): the rate
    the caller never set was blamed."""
    with pytest.raises(ValueError, match=r"lr_decay must be (in \(0, 1\]|finite), got"):
        bridge.round_config(FedAvg(), LocalTraining(), decay, 2)
    with pytest.raises(TypeError, match="lr_decay must be a real number, got '0.5'"):
        bridge.round_config(FedAvg(), LocalTraining(), "0.5", 2)
    for bad_round in (0, 2.5, True):
        with pytest.raises((TypeError, ValueError), match="round must be"):
            bridge.round_config(FedAvg(), LocalTraining(), 0.5, bad_round)
    assert bridge.round_config(FedAvg(), LocalTraining(lr=0.1), 0.5, 3).lr == 0.1 * 0.5**2


def _scaffold():
    from fedlearn_edu import SCAFFOLD

    return SCAFFOLD()


def test_client_ids_out_of_range_negative_or_fractional_are_refused(setting):
    """``init_client_state`` with id 5 of 4 clients raised a bare IndexError; id -1 silently
    took the last client's row; 1.7 became 1."""
    fed, _, model = setting
    p0 = get_params(model)
    rows = bridge.init_client_state(_scaffold(), model, p0, 3, NUM_CLIENTS, 0)
    assert rows["control"]["out.bias"].shape[0] == 1
    for bad, error, match in (
        (NUM_CLIENTS, ValueError, r"client_id must be in \[0, 4\) \(one of the 4 clients\), got 4"),
        (-1, ValueError, r"client_id must be in \[0, 4\)"),
        (1.7, TypeError, "client_id must be an integer, got 1.7"),
        ("1", TypeError, "client_id must be an integer"),
    ):
        with pytest.raises(error, match=match):
            bridge.init_client_state(_scaffold(), model, p0, bad, NUM_CLIENTS, 0)
    data = (fed[0].train_x, fed[0].train_y)
    view = {"params": p0}
    for bad, error in ((-1, ValueError), (1.5, TypeError), (True, TypeError)):
        with pytest.raises(error, match="client_id must be"):
            bridge.train_client(FedAvg(), model, view, data, LocalTraining(), 0, 1, bad)


def test_float_bool_or_negative_seeds_are_refused_not_truncated(setting):
    fed, _, model = setting
    p0 = get_params(model)
    data = (fed[0].train_x, fed[0].train_y)
    for seed, error in ((2.5, TypeError), (True, TypeError), (-1, ValueError), ("3", TypeError)):
        with pytest.raises(error, match="seed must be"):
            FlowerStrategy(FedAvg(), model, seed=seed)
        with pytest.raises(error, match="seed must be"):
            bridge.begin_run(FedAvg(), p0, model, NUM_CLIENTS, seed)
        with pytest.raises(error, match="seed must be"):
            bridge.init_client_state(_scaffold(), model, p0, 0, NUM_CLIENTS, seed)
        with pytest.raises(error, match="seed must be"):
            bridge.train_client(FedAvg(), model, {"params": p0}, data, LocalTraining(), seed, 1, 0)
    for n, error in ((0, ValueError), (2.5, TypeError)):
        with pytest.raises(error, match="num_clients must be"):
            bridge.begin_run(FedAvg(), p0, model, n, 0)
    assert FlowerStrategy(FedAvg(), model, seed=7).seed == 7


@pytest.mark.parametrize("state", [None, {}, {"other": {}}])
def test_train_client_without_the_strategys_client_state_says_what_to_pass(setting, state):
    """SCAFFOLD without its rows ended in ``KeyError: 'control'``."""
    fed, _, model = setting
    p0 = get_params(model)
    server = bridge.begin_run(_scaffold(), p0, model, NUM_CLIENTS, 0)
    data = (fed[0].train_x, fed[0].train_y)
    view = _scaffold().client_view(server)
    with pytest.raises(ValueError, match=r"SCAFFOLD keeps the client state \['control'\]; state lacks \['control'\]"):
        bridge.train_client(_scaffold(), model, view, data, LocalTraining(), 0, 1, 0, state)
    rows = bridge.init_client_state(_scaffold(), model, p0, 0, NUM_CLIENTS, 0)
    with pytest.raises(ValueError, match="returned the signal 'delta_c' as a dict of tensors"):
        bridge.train_client(_scaffold(), model, view, data, LocalTraining(), 0, 1, 0, rows)
    ditto = Ditto(lam=0.5, base=FedAvg())
    view = ditto.client_view(bridge.begin_run(ditto, p0, model, NUM_CLIENTS, 0))
    with pytest.raises(ValueError, match=r"Ditto keeps the client state \['personal'\]; state lacks \['personal'\]"):
        bridge.train_client(ditto, model, view, data, LocalTraining(), 0, 1, 0, state)
    rows = bridge.init_client_state(ditto, model, p0, 0, NUM_CLIENTS, 0)
    reply, new_rows = bridge.train_client(ditto, model, view, data, LocalTraining(), 0, 1, 0, rows)
    assert reply.client_id == 0 and new_rows.keys() == {"personal"}


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(fraction_train="1"), TypeError, "fraction_train must be a real number, got '1'"),
        (dict(fraction_evaluate=True), TypeError, "fraction_evaluate must be a real number, got True"),
        (dict(fraction_evaluate=float("nan")), ValueError, "fraction_evaluate must be finite"),
        (dict(min_train_nodes=2.0), TypeError, "min_train_nodes must be an integer, got 2.0"),
        (dict(min_available_nodes="2"), TypeError, "min_available_nodes must be an integer, got '2'"),
        (dict(eval_every=0), ValueError, "eval_every must be >= 1, got 0"),
        (dict(wait_s=True), TypeError, "wait_s must be a real number, got True"),
        (dict(wait_s=float("inf")), ValueError, "wait_s must be finite"),
    ],
)
def test_flower_strategy_refuses_strings_bools_and_fractional_counts(setting, kwargs, error, match):
    _, _, model = setting
    with pytest.raises(error, match=match):
        FlowerStrategy(FedAvg(), model, **kwargs)


def test_nodes_and_grids_refuse_negative_or_fractional_ids(setting):
    fed, _, model = setting
    for client_id, error in ((-1, ValueError), (1.5, TypeError)):
        app = make_client_app(lambda context, i=client_id: Node(model, fed[0], i, fed.num_classes))
        with LocalGrid(app, node_configs(1)) as grid, pytest.raises(error, match="Node.client_id must be"):
            FlowerStrategy(FedAvg(), model, **HYPER).run(grid, rounds=1)
    for run_id, error in ((1.5, TypeError), (-1, ValueError)):
        with pytest.raises(error, match="run_id must be"):
            LocalGrid(make_client_app(lambda context: None), node_configs(1), run_id=run_id)
    with pytest.raises(TypeError, match="rounds must be an integer, got 2.5"):
        FlowerStrategy(FedAvg(), model).run(None, rounds=2.5)
