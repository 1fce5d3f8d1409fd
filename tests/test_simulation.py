"""Strategies of the FedAvg family, the simulator, History, plots and the command line."""

import dataclasses
import math
import re
import subprocess
import sys
from collections.abc import Mapping

import matplotlib
import numpy as np
import pytest
import torch
from torch import nn

from fedlearn_edu.data import Federation
from tests.server_steps import Server

matplotlib.use("Agg")

import copy

from fedlearn_edu import (
    IFCA,
    Ditto,
    FedAdam,
    FedAvg,
    FedAvgM,
    FedDyn,
    FedOUI,
    FedProx,
    FedVG,
    History,
    LocalOnly,
    evaluate_clients,
    federated_dataset,
    make_model,
    make_strategy,
    simulate,
)
from fedlearn_edu.engine import LocalTraining
from fedlearn_edu.params import get_params
from fedlearn_edu.plotting import plot_client_accuracy, plot_curves
from fedlearn_edu.strategies import SCAFFOLD, STRATEGIES, ClientOutput, ClientUpdates
from fedlearn_edu.utils import derive_seed
from tests.bad_client import BAD, RUN, SEED, SMALL
from tests.tiny import poison, tiny_federation, tiny_model

KW = dict(rounds=3, clients_per_round=4, lr=0.1, batch_size=8, progress=False, seed=1)


def _model(fed, seed=0):
    return make_model("mlp", fed.input_shape, fed.num_classes, hidden=(16,), seed=seed)


@pytest.fixture(scope="module")
def fed():
    return federated_dataset("digits", partition="dirichlet", num_clients=12, alpha=0.3, min_size=10, seed=1)


def _updates(deltas, n, model=None):
    m = next(iter(deltas.values())).shape[0]
    return ClientUpdates(1, torch.arange(m), deltas, torch.tensor(n), torch.zeros(m), model)


def test_fedavg_fedavgm_fedprox_formulas():
    params = {"w": torch.tensor([1.0, 2.0])}
    deltas = {"w": torch.tensor([[1.0, 0.0], [0.0, 4.0]])}
    n = [1, 3]
    new, diag = Server(FedAvg(server_lr=0.5), params).aggregate(_updates(deltas, n))
    torch.testing.assert_close(new["w"], torch.tensor([1.0 + 0.5 * 0.25, 2.0 + 0.5 * 3.0]))
    torch.testing.assert_close(diag["weights"], torch.tensor([0.25, 0.75]))

    s = FedAvgM(server_lr=1.0, momentum=0.9)
    server_s = Server(s, params)
    mean = torch.tensor([0.25, 3.0])
    p1, _ = server_s.aggregate(_updates(deltas, n))  # v1 = -mean
    torch.testing.assert_close(p1["w"], params["w"] + mean)
    p2, _ = server_s.aggregate(_updates(deltas, n))  # v2 = 0.9 v1 - mean
    torch.testing.assert_close(p2["w"], p1["w"] + 1.9 * mean)
    server_s = Server(s, params)  # a fresh server state resets the momentum
    p1b, _ = server_s.aggregate(_updates(deltas, n))
    torch.testing.assert_close(p1b["w"], p1["w"])

    prox = FedProx(mu=0.3)
    assert prox.configure_local(LocalTraining()).prox_mu == 0.3
    assert FedAvg().configure_local(LocalTraining()).prox_mu == 0.0


def test_strategy_argument_errors():
    with pytest.raises(ValueError, match="server_lr"):
        FedAvg(server_lr=0)
    with pytest.raises(ValueError, match="momentum"):
        FedAvgM(momentum=1.5)
    with pytest.raises(ValueError, match="mu"):
        FedProx(mu=-1)
    with pytest.raises(ValueError, match="Unknown strategy"):
        make_strategy("fedsgd")
    assert isinstance(make_strategy("FedAvg-M"), FedAvgM)


def test_evaluate_clients_matches_a_per_client_loop(fed):
    model = make_model("mlp", fed.input_shape, fed.num_classes, seed=0)
    acc, loss = evaluate_clients(model, get_params(model), fed, batch_size=17)
    for i, c in enumerate(fed):
        with torch.no_grad():
            logits = model(c.test_x)
        assert acc[i] == pytest.approx((logits.argmax(1) == c.test_y).double().mean().item())
        assert loss[i] == pytest.approx(torch.nn.functional.cross_entropy(logits, c.test_y).item(), rel=1e-5)


def test_simulate_history_and_determinism(fed):
    model = make_model("mlp", fed.input_shape, fed.num_classes, seed=0)
    before = [p.clone() for p in model.parameters()]
    kw = dict(rounds=6, clients_per_round=5, eval_every=2, seed=3, progress=False, engine="loop")
    h1 = simulate(fed, model, FedAvg(), diagnostics=("conflicts",), **kw)
    h2 = simulate(fed, model, FedAvg(), **kw)
    h3 = simulate(fed, model, FedAvg(), **{**kw, "seed": 4})
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters())), "model must not be modified"
    assert isinstance(h1, History)
    assert h1.eval_rounds == [0, 2, 4, 6]
    assert h1.client_accuracy.shape == h1.client_loss.shape == (4, fed.num_clients)
    assert len(h1.selected) == len(h1.diagnostics) == len(h1.train_loss) == 6
    assert all(len(set(s.tolist())) == 5 for s in h1.selected)
    np.testing.assert_array_equal(h1.client_accuracy, h2.client_accuracy)
    assert [s.tolist() for s in h1.selected] == [s.tolist() for s in h2.selected]
    assert [s.tolist() for s in h1.selected] != [s.tolist() for s in h3.selected]
    m = h1.metrics()
    assert set(m) == {"round", "mean", "std", "worst10", "best10"} and m["round"] == 6
    assert h1.curve("mean").shape == (4,)
    assert h1.metrics()["mean"] > h1.metrics(0)["mean"], "training must help"
    assert "worst10" in h1.summary()
    assert h1.conflicts.shape == (6,)
    assert set(h1.diagnostics[0]["conflicts_per_layer"]) == {"hidden.0", "hidden.1", "out"}
    assert h1.config["diagnostics"] == ("conflicts",) and h2.config["diagnostics"] == ()
    # not asked for, not computed: the same run without them, and a clear error when read
    assert all("conflicts" not in d for d in h2.diagnostics)
    np.testing.assert_array_equal(h1.client_accuracy, h2.client_accuracy)
    with pytest.raises(ValueError, match="diagnostics=\\('conflicts',\\)"):
        _ = h2.conflicts
    with pytest.raises(ValueError, match="Unknown diagnostics"):
        simulate(fed, model, FedAvg(), diagnostics=("conflict",), **kw)


@pytest.mark.parametrize("strategy", [FedAvg(), FedAvgM(server_lr=0.5), FedProx(mu=0.1)])
def test_vmap_and_loop_simulations_agree(fed, strategy):
    # float64: in float32 the two engines' convolutions round differently and three rounds of
    # training amplify that to ~3e-4 on some machines, which would hide nothing but noise.
    model = make_model("cnn", fed.input_shape, fed.num_classes, seed=0).double()
    fed = Federation(
        [dataclasses.replace(c, train_x=c.train_x.double(), test_x=c.test_x.double()) for c in fed],
        fed.num_classes,
        fed.name,
    )
    kw = dict(rounds=3, clients_per_round=6, seed=0, progress=False, batch_size=10)
    h_loop = simulate(fed, model, strategy, engine="loop", **kw)
    h_vmap = simulate(fed, model, strategy, engine="vmap", **kw)
    assert h_vmap.config["engine"] == "vmap"
    np.testing.assert_allclose(h_vmap.client_loss, h_loop.client_loss, rtol=1e-3, atol=1e-4)
    for k in h_loop.final_params:
        torch.testing.assert_close(h_vmap.final_params[k], h_loop.final_params[k], rtol=1e-3, atol=1e-4)


def test_non_iid_creates_conflicts_and_spread():
    """With label-skewed clients some updates point against the aggregate; IID ones rarely do."""
    kw = dict(rounds=12, clients_per_round=10, local_epochs=2, progress=False, seed=0, diagnostics=("conflicts",))
    skew = federated_dataset("digits", partition="shards", num_clients=20, shards_per_client=1, seed=0)
    iid = federated_dataset("digits", partition="iid", num_clients=20, seed=0)
    model = make_model("mlp", skew.input_shape, skew.num_classes, seed=0)
    h_skew = simulate(skew, model, FedAvg(), **kw)
    h_iid = simulate(iid, model, FedAvg(), **kw)
    assert h_skew.conflicts.sum() > h_iid.conflicts.sum()
    assert h_skew.metrics()["std"] > h_iid.metrics()["std"]


def test_simulate_argument_errors(fed):
    model = make_model("mlp", fed.input_shape, fed.num_classes)
    with pytest.raises(ValueError, match="rounds"):
        simulate(fed, model, FedAvg(), rounds=0)
    with pytest.raises(TypeError, match="Strategy"):
        simulate(fed, model, "fedavg")
    with pytest.raises(ValueError, match="lr_decay"):
        simulate(fed, model, FedAvg(), lr_decay=0)
    with pytest.raises(FloatingPointError, match="diverged"):
        simulate(fed, model, FedAvg(), rounds=3, lr=1e6, local_epochs=3, progress=False)
    with pytest.raises(FloatingPointError, match="global parameters"):
        simulate(fed, model, FedAvg(server_lr=1e308), rounds=3, lr=1.0, progress=False)


def test_plots_draw(fed):
    model = make_model("mlp", fed.input_shape, fed.num_classes, seed=0)
    h = simulate(fed, model, FedAvg(), rounds=2, clients_per_round=4, progress=False)
    axes = plot_curves({"a": h, "b": h}, metrics=("mean", "worst10"))
    assert len(axes) == 2 and len(axes[0].lines) == 2
    ax = plot_client_accuracy([h])
    assert ax.get_ylabel().startswith("accuracy")
    with pytest.raises(ValueError, match="Unknown metric"):
        plot_curves(h, metrics=("median",))


def test_cli_prints_metrics_table_and_saves_plot(tmp_path):
    png = tmp_path / "curves.png"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "fedlearn_edu",
            "run",
            "--dataset",
            "digits",
            "--strategy",
            "fedavg",
            "--clients",
            "20",
            "--alpha",
            "0.1",
            "--rounds",
            "4",
            "--no-progress",
            "--plot",
            str(png),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert "worst10" in out.stdout and "fedavg" in out.stdout
    assert png.stat().st_size > 1000
    bad = subprocess.run(
        [sys.executable, "-m", "fedlearn_edu", "run", "--strategy", "nope"], capture_output=True, text=True, timeout=120
    )
    assert bad.returncode != 0 and "invalid choice" in bad.stderr


@pytest.mark.parametrize("bad_value", [math.nan, math.inf], ids=["nan", "inf"])
def test_both_engines_and_fedoui_blame_only_the_bad_client(bad_value):
    fed = poison(tiny_federation(sizes=(23, 27, 50, 20)), 2, bad_value)
    model = tiny_model(fed)
    for strategy in (FedAvg(), FedOUI()):
        for engine in ("loop", "vmap"):
            with pytest.raises((FloatingPointError, ValueError)) as err:
                simulate(
                    fed, model, strategy, rounds=1, clients_per_round=4, batch_size=7, engine=engine, progress=False
                )
            msg = str(err.value)
            blamed = {int(v) for v in re.findall(r"client\(?s?\)? \[?(\d+)", msg)}
            assert blamed == {2}, f"{type(strategy).__name__}/{engine}: {msg}"


@pytest.mark.parametrize("change", ["missing", "misspelt"])
def test_evaluate_clients_refuses_a_wrong_parameter_dict(change):
    fed = tiny_federation()
    model = tiny_model(fed)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    key = next(iter(params))
    value = params.pop(key)
    if change == "misspelt":
        params[key + "x"] = value
    with pytest.raises(ValueError, match=re.escape(key)):
        evaluate_clients(model, params, fed)


def test_simulate_refuses_fractional_and_negative_seeds():
    fed = tiny_federation()
    for seed, err in ((1.5, TypeError), (-1, ValueError)):
        with pytest.raises(err, match="seed"):
            simulate(fed, tiny_model(fed), FedAvg(), rounds=1, seed=seed, progress=False)


def test_model_data_mismatches_are_caught_up_front_naming_model_and_data():
    fed = tiny_federation()  # inputs (1, 4, 4), 3 classes, name "tiny"
    cases = [
        (make_model("mlp", (1, 8, 8), 3, hidden=(8,)), "cannot take the inputs"),
        (make_model("mlp", (1, 4, 4), 10, hidden=(8,)), "10 logits but .* 3 classes"),
        (make_model("mlp", (1, 4, 4), 3, hidden=(8,)).double(), "float64"),
    ]
    for model, match in cases:
        with pytest.raises((ValueError, TypeError), match=match) as err:
            simulate(fed, model, FedAvg(), rounds=1, progress=False)
        assert "MLP" in str(err.value) and "'tiny'" in str(err.value)


def test_fedvg_validation_set_of_the_wrong_shape_fails_before_round_1():
    fed = tiny_federation()
    val = (torch.rand(10, 1, 8, 8), torch.zeros(10, dtype=torch.long))
    with pytest.raises(ValueError, match="validation set.*shape"):
        simulate(fed, tiny_model(fed), FedVG(val), rounds=1, progress=False)


class _BNNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 8)
        self.bn = nn.BatchNorm1d(8)
        self.out = nn.Linear(8, 3)

    def forward(self, x):
        return self.out(torch.relu(self.bn(self.fc(x.flatten(1)))))


@pytest.mark.parametrize("engine", ["auto", "loop", "vmap"])
def test_batchnorm_is_rejected_once_clearly_for_every_engine(engine):
    fed = tiny_federation()
    with pytest.raises(ValueError, match="BatchNorm.*GroupNorm"):
        simulate(fed, _BNNet(), FedAvg(), rounds=1, engine=engine, progress=False)


@pytest.mark.parametrize(
    "kwargs, err, match",
    [
        ({"rounds": "2"}, TypeError, "rounds"),
        ({"rounds": math.nan}, TypeError, "rounds"),
        ({"rounds": 2.5}, TypeError, "rounds"),
        ({"clients_per_round": "3"}, TypeError, "clients_per_round"),
        ({"eval_every": None}, TypeError, "eval_every"),
        ({"lr_decay": "1"}, TypeError, "lr_decay"),
    ],
)
def test_run_arguments_get_clear_messages(kwargs, err, match):
    fed = tiny_federation()
    with pytest.raises(err, match=match):
        simulate(fed, tiny_model(fed), FedAvg(), progress=False, **{"rounds": 1, **kwargs})


def test_history_curve_names_the_valid_metrics():
    h = History(strategy="x", eval_rounds=[0], client_accuracy=np.array([[0.5, 0.7]]))
    with pytest.raises(ValueError, match="worst10"):
        h.curve("worst")
    assert h.curve("mean").tolist() == [0.6]


def test_allocator_setting_is_documented_with_its_opt_out():
    doc = simulate.__doc__
    assert "tune_cpu_allocator" in doc and "tune_allocator=False" in doc and "never reverted" in doc


def test_simulate_skips_only_the_client_the_fused_check_sends_to_the_detail():
    """A NaN client among finite ones: the driver's fused pass fails, the per-row detail drops
    exactly that client, and the others are aggregated."""
    fed = poison(tiny_federation(sizes=(23, 27, 50, 20)), 1, math.nan)
    h = simulate(fed, tiny_model(fed), FedAvg(), rounds=2, clients_per_round=4, batch_size=7, on_nonfinite="skip",
                 engine="vmap", progress=False)  # fmt: skip
    assert [list(d) for d in h.dropped] == [[1], [1]]
    assert all(bool(torch.isfinite(v).all()) for v in h.final_params.values())


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
        wraps = getattr(cls, "wraps", frozenset()) | {"client", "server"}  # a Wrapper declares what it changes

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
    elif isinstance(a, Mapping):  # a dict or a typed server state
        assert type(a) is type(b) and a.keys() == b.keys(), path
        for k in a:
            _same(a[k], b[k], f"{path}/{k}")
    elif isinstance(a, (tuple, list)):  # a chain's optimizer state: one state per piece
        assert type(a) is type(b) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{path}/{i}")
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


NAN = float("nan")


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


# ------------------------------------------------------------------ the driver
def test_caller_model_is_untouched_and_runs_repeat(fed):
    model = _model(fed)
    model.train(False)
    before = {k: (p.data_ptr(), p.detach().clone(), p.device) for k, p in model.named_parameters()}
    h1 = simulate(fed, model, FedAdam(server_lr=0.05), **KW)
    h2 = simulate(fed, model, FedAdam(server_lr=0.05), **KW)
    for k, p in model.named_parameters():
        ptr, value, device = before[k]
        assert p.data_ptr() == ptr and p.device == device and torch.equal(p, value)
    assert model.training is False
    np.testing.assert_array_equal(h1.client_accuracy, h2.client_accuracy)
    assert all(torch.equal(h1.final_params[k], h2.final_params[k]) for k in h1.final_params)
