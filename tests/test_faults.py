"""Faults: one bad client under every strategy, on both engines."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from fedlearn_edu import IFCA, Ditto, FedVG, LocalOnly, federated_dataset, make_model, simulate
from fedlearn_edu.data import server_validation_split
from fedlearn_edu.data.federation import ClientData, Federation
from fedlearn_edu.strategies import SCAFFOLD, STRATEGIES, ClientOutput
from fedlearn_edu.utils import derive_seed

BAD = 4  # the client with NaN data; with SEED it is selected every round, at row 2
SEED = 1
RUN = dict(rounds=3, clients_per_round=4, batch_size=16, lr=0.05, seed=SEED, progress=False)


@pytest.fixture(scope="module")
def setting():
    fed = federated_dataset("digits", num_clients=6, alpha=0.5, seed=0)
    fed, val = server_validation_split(fed, fraction=0.2, seed=0)
    clients = [ClientData(c.train_x.clone(), c.train_y, c.test_x, c.test_y, c.info) for c in fed]
    clients[BAD].train_x[0, 0, 0, 0] = float("nan")  # after construction: ClientData refuses NaN inputs
    bad = Federation(clients, fed.num_classes, fed.name)
    model = make_model("mlp", fed.input_shape, fed.num_classes, hidden=(8,), seed=0)
    return fed, bad, val, model


def _make(name, val):
    extra = {
        "fedvg": lambda: FedVG(val, engine="loop"),
        "dac": lambda: STRATEGIES["dac"](num_neighbours=2),
        "ditto": lambda: Ditto(0.5),
        "ditto_scaffold": lambda: Ditto(0.5, base=SCAFFOLD()),
        "fedvg_scaffold": lambda: FedVG(val, base=SCAFFOLD(), engine="loop"),
        "ifca": lambda: IFCA(2),
        "local": lambda: LocalOnly(),
    }
    return extra[name]() if name in extra else STRATEGIES[name]()


NAMES = sorted(set(STRATEGIES) | {"ditto", "ditto_scaffold", "fedvg_scaffold", "ifca", "local"})


def _excluding(strategy, client: int):
    """The same strategy, except that ``client``'s update is left out of every aggregation and
    its client state is not changed: the run "without that client's update that round"."""
    cls = type(strategy)

    class Excluding(cls):
        def client_update(self, work, server_state, state):
            out = cls.client_update(self, work, server_state, state)
            row = work.client_ids == client
            keep_old = {}
            for k, v in out.state.items():
                if isinstance(v, dict):
                    keep_old[k] = {n: torch.where(_col(row, x), state[k][n], x) for n, x in v.items()}
                else:
                    keep_old[k] = torch.where(_col(row, v), state[k], v)
            return ClientOutput(out.deltas, out.train_loss, out.signals, keep_old, out.recorded_loss)

        def aggregate(self, server_state, updates):
            return cls.aggregate(self, server_state, updates.subset(updates.client_ids != client))

    twin = copy.copy(strategy)
    twin.__class__ = Excluding
    return twin


def _col(row: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return row.to(like.device).reshape(-1, *([1] * (like.dim() - 1)))


def _same(a, b, path=""):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), path
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            _same(a[k], b[k], f"{path}/{k}")
    else:
        assert a == b, path


def test_the_bad_client_is_selected_every_round_at_another_row():
    """The setting is what the tests below assume: client 4 is selected in all 3 rounds at row 2."""
    g = torch.Generator().manual_seed(derive_seed(SEED, 0xC11E47))
    picks = [torch.randperm(6, generator=g)[:4].sort().values.tolist() for _ in range(3)]
    assert all(BAD in p and p.index(BAD) != BAD for p in picks)


@pytest.mark.parametrize("engine", ["loop", "vmap"])
@pytest.mark.parametrize("name", NAMES)
def test_skip_drops_only_the_bad_client_and_equals_the_run_without_its_update(setting, name, engine):
    """With on_nonfinite="skip", one client whose data make its update NaN is dropped (and only it)
    by every strategy, and the run is bitwise the run on clean data where that client's update is
    left out of every round's aggregation and its client state kept (AFL: the dropped client
    counts as not selected, so its N/m uses the m - 1 survivors; see AFL's docstring)."""
    fed, bad, val, model = setting
    h = simulate(bad, model, _make(name, val), engine=engine, on_nonfinite="skip", **RUN)
    assert h.dropped == [{BAD: "its training data hold NaN/Inf values"}] * 3
    ref = simulate(fed, model, _excluding(_make(name, val), BAD), engine=engine, **RUN)
    _same(h.final_params, ref.final_params, "final_params")
    _same(h.final_state, ref.final_state, "final_state")
    _same(h.final_server_state, ref.final_server_state, "final_server_state")
    others = [i for i in range(6) if i != BAD]
    np.testing.assert_array_equal(h.client_accuracy[:, others], ref.client_accuracy[:, others])
    np.testing.assert_array_equal(h.client_loss[:, others], ref.client_loss[:, others])
    for label in ref.other_accuracy:
        np.testing.assert_array_equal(h.other_accuracy[label][:, others], ref.other_accuracy[label][:, others])
    assert np.isfinite(h.train_loss).all()


@pytest.mark.parametrize("name", NAMES)
def test_raise_names_the_bad_client_by_its_id(setting, name):
    """With "raise" the error names client 4 (its id), not its row (2) in the round's stack."""
    _, bad, val, model = setting
    with pytest.raises(FloatingPointError, match=rf"Round 1: the training data of client\(s\) \[{BAD}\] hold NaN"):
        simulate(bad, model, _make(name, val), engine="loop", **RUN)


# ----------------------------------------------------------- errors that point the right way
from fedlearn_edu import AFL, CRAFT, DAC, FedAdam, FedAvg, FedDyn, FedLF, FedProx, Gossip  # noqa: E402
from fedlearn_edu.aggregators import project_simplex  # noqa: E402


def _small(fed):
    return make_model("mlp", fed.input_shape, fed.num_classes, hidden=(8,), seed=0)


SMALL = dict(rounds=2, clients_per_round=3, batch_size=16, progress=False, engine="loop")


@pytest.mark.parametrize("strategy", [FedAvg(server_lr=1e30), FedAdam(server_lr=1e30)], ids=["fedavg", "fedadam"])
def test_a_huge_server_step_is_blamed_on_server_lr(setting, strategy):
    fed, _, _, model = setting
    with pytest.raises(FloatingPointError, match=r"lower server_lr \(now 1e\+30\)") as err:
        simulate(fed, model, strategy, **SMALL)
    assert "lower the client lr" not in str(err.value)


def test_a_tiny_client_lr_is_told_to_be_raised(setting):
    fed, _, _, model = setting
    with pytest.raises(FloatingPointError, match=r"client lr \(now 1e-45\) is too small.*raise it") as err:
        simulate(fed, model, SCAFFOLD(), **dict(SMALL, lr=1e-45))
    assert "lower the client lr" not in str(err.value)


def test_a_tiny_feddyn_alpha_is_named(setting):
    fed, _, _, model = setting
    with pytest.raises(FloatingPointError, match=r"alpha \(now 1e-300\).*larger alpha"):
        simulate(fed, model, FedDyn(alpha=1e-300), **SMALL)


@pytest.mark.parametrize("strategy, named", [(FedDyn(alpha=1e6), "FedDyn's alpha"), (FedProx(mu=1e6), "FedProx's mu")])
def test_a_huge_proximal_coefficient_is_named_not_the_lr(setting, strategy, named):
    """FedDyn(alpha=1e6) diverged in local training and was told to lower the client lr only:
    lr * alpha = 5e4 > 2 makes SGD on the proximal term oscillate and grow."""
    fed, _, _, model = setting
    with pytest.raises(FloatingPointError) as err:
        simulate(fed, model, strategy, **dict(SMALL, lr=0.05))
    msg = str(err.value)
    assert f"lower {named} (now 1e+06)" in msg, msg
    assert "lr * prox_mu = 0.05 * 1e+06 = 5e+04" in msg and "above 2" in msg, msg


def test_a_moderate_proximal_coefficient_keeps_the_lr_advice(setting):
    fed, _, _, model = setting
    with pytest.raises(FloatingPointError, match=r"lower the client lr \(now 1e\+30\)") as err:
        simulate(fed, model, FedDyn(alpha=0.01), **dict(SMALL, lr=1e30))
    assert "alpha" not in str(err.value)


def test_huge_values_project_onto_the_simplex():
    """[1e300, -1e300] used to give 'index -1 is out of bounds' (u_1 - (u_1 - 1) rounds to 0)."""
    w = project_simplex(torch.tensor([1e300, -1e300], dtype=torch.float64))
    assert w.tolist() == [1.0, 0.0]
    rows = project_simplex(torch.tensor([[1.7e308, -1.7e308, 0.0], [0.2, 0.1, 0.0]], dtype=torch.float64))
    assert rows[0].tolist() == [1.0, 0.0, 0.0]
    # the ordinary row: all three in the support, theta = (0.3 - 1) / 3, w = v - theta
    torch.testing.assert_close(rows[1], torch.tensor([13 / 30, 10 / 30, 7 / 30], dtype=torch.float64))
    assert (rows >= 0).all() and torch.allclose(rows.sum(1), torch.ones(2, dtype=torch.float64))


def test_afl_with_a_huge_lambda_lr_runs_or_names_it(setting):
    fed, _, _, model = setting
    h = simulate(fed, model, AFL(lambda_lr=1e300), **SMALL)
    lam = h.final_server_state["lambdas"]
    assert torch.isclose(lam.sum(), torch.tensor(1.0, dtype=torch.float64)) and (lam >= 0).all()
    with pytest.raises(ValueError, match="lambda_lr"):
        simulate(fed, model, AFL(lambda_lr=1e308), **SMALL)


NAN = float("nan")
BAD_CONSTRUCTORS = [
    (lambda: FedDyn(alpha="0.1"), TypeError, "alpha must be a real number, got '0.1'"),
    (lambda: FedDyn(alpha=NAN), ValueError, "alpha must be finite, got nan"),
    (lambda: AFL(lambda_lr="0.1"), TypeError, "lambda_lr must be a real number, got '0.1'"),
    (lambda: Ditto(lam="0.1"), TypeError, "lam must be a real number, got '0.1'"),
    (lambda: DAC(tau="30"), TypeError, "tau must be a real number, got '30'"),
    (lambda: DAC(num_neighbours=NAN), TypeError, "num_neighbours must be an integer, got nan"),
    (lambda: Gossip(num_neighbours=NAN), TypeError, "num_neighbours must be an integer, got nan"),
    (lambda: IFCA(NAN), TypeError, "num_clusters must be an integer, got nan"),
    (lambda: IFCA("2"), TypeError, "num_clusters must be an integer, got '2'"),
    (lambda: FedLF(fairness="no"), TypeError, "fairness must be True or False, got 'no'"),
    (lambda: CRAFT(layerwise="yes"), TypeError, "layerwise must be True or False, got 'yes'"),
    (lambda: Gossip(edge_prob="0.5"), TypeError, "edge_prob must be a real number, got '0.5'"),
    (lambda: STRATEGIES["fedprox"](mu="0.1"), TypeError, "mu must be a real number, got '0.1'"),
    (lambda: STRATEGIES["qfedavg"](q=NAN), ValueError, "q must be finite, got nan"),
    (lambda: STRATEGIES["fedfv"](alpha="0.1"), TypeError, "alpha must be a real number, got '0.1'"),
    (lambda: STRATEGIES["fedoui"](probe_size=32.0), TypeError, "probe_size must be an integer, got 32.0"),
]


@pytest.mark.parametrize("make, error, match", BAD_CONSTRUCTORS, ids=[m for _, _, m in BAD_CONSTRUCTORS])
def test_constructors_refuse_strings_and_nan_naming_the_argument_with_repr(make, error, match):
    with pytest.raises(error, match=match.replace("(", r"\(")):
        make()


def test_checkpoint_every_nan_is_refused(setting):
    fed, _, _, model = setting
    with pytest.raises(TypeError, match="checkpoint_every must be an integer, got nan"):
        simulate(fed, model, FedAvg(), checkpoint_every=NAN, **SMALL)


def test_bad_model_and_device_are_refused_up_front(setting):
    fed, _, _, model = setting
    with pytest.raises(TypeError, match="model must be a torch.nn.Module.*NoneType"):
        simulate(fed, None, FedAvg(), **SMALL)
    with pytest.raises(ValueError, match="device='meta'"):
        simulate(fed, model, FedAvg(), device="meta", **SMALL)


def test_a_strategy_that_drops_a_parameter_is_named(setting):
    fed, _, _, model = setting

    class Dropping(FedAvg):
        def aggregate(self, server_state, updates):
            state, diag = super().aggregate(server_state, updates)
            params = dict(state["params"])
            params.pop("out.bias")
            return {**state, "params": params}, diag

    with pytest.raises(ValueError, match=r"missing \['out.bias'\]"):
        simulate(fed, model, Dropping(), **SMALL)


@pytest.mark.parametrize("outer", ["ditto", "fedvg"])
@pytest.mark.parametrize("inner", ["ifca", "gossip", "local", "ditto", "dac"])
def test_compositions_that_cannot_work_are_refused_at_construction(setting, outer, inner):
    _, _, val, _ = setting
    base = {"ifca": lambda: IFCA(2), "gossip": Gossip, "local": LocalOnly, "ditto": lambda: Ditto(0.1), "dac": DAC}[
        inner
    ]()
    with pytest.raises(ValueError, match="cannot work"):
        Ditto(0.1, base=base) if outer == "ditto" else FedVG(val, base=base, engine="loop")


@pytest.mark.parametrize("k", [7, 2**64])
def test_ifca_with_more_clusters_than_clients_is_refused_by_name(fed, mlp, k):
    """IFCA(num_clusters=2**64) used to build cluster models until memory ran out; K > N is refused up front."""
    with pytest.raises(ValueError, match=r"num_clusters=\d+\) needs at most one cluster per client.*6 clients"):
        simulate(fed, mlp(fed), IFCA(num_clusters=k), rounds=1, progress=False)
