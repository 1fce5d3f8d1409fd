"""Property: every strategy constructor and every ``simulate`` option, on drawn arguments, gives
either a completed run or a ``ValueError``/``TypeError`` whose message names the argument; so do
DP-FedAvg's settings, an attack's fields, ``secure_sum``, the benchmark's grid objects and the
public aggregation functions and partitions (never a NumPy/torch internal error, a hang or a crash
of another kind).

Valid values, wrong types (strings such as ``'0.1'``, bools, ``None``, bytes, empty containers),
NaN, infinities, huge and negative numbers are drawn for one argument at a time; the others keep
valid values. Any other exception type, or a message that does not name the argument, fails;
a run may also stop with the package's ``FloatingPointError`` (it diverged), which must name the
argument too unless the value is a finite magnitude >= 1e6.
A value the constructor accepts must also survive a one-round run (or be refused there, by
name): a constructor that lets a bad value through to round 1 fails too.

Kept fast (one tiny federation of four clients x 8 samples and a 4-unit MLP, built once; one
round of one local step), with a fixed hypothesis seed so CI draws the same examples.
"""

from __future__ import annotations

import inspect
import json
import math
import os
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from fedlearn_edu import AFL, CRAFT, DAC, IFCA, Ditto, FedDyn, FedLF, Gossip, simulate
from fedlearn_edu import aggregators as agg
from fedlearn_edu.attacks import Attack
from fedlearn_edu.data import make_federation
from fedlearn_edu.data import partition as part
from fedlearn_edu.engine import LoopEngine
from fedlearn_edu.models import make_model
from fedlearn_edu.params import get_params
from fedlearn_edu.strategies import STRATEGIES, FedAvg, FedProx
from fedlearn_edu.strategies.server_optim import ServerAdam, ServerMomentum, ServerSGD

SHAPE, CLASSES = (1, 2, 2), 3


def _federation():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(40, *SHAPE, generator=g)
    y = torch.arange(40) % CLASSES
    return make_federation(x, y, [np.arange(10 * i, 10 * i + 10) for i in range(4)], test_fraction=0.2, seed=0)


FED = _federation()  # 4 clients, 8 training samples each
MODEL = make_model("mlp", SHAPE, CLASSES, hidden=(4,), seed=0)
VAL = (torch.rand(6, *SHAPE, generator=torch.Generator().manual_seed(1)), torch.arange(6) % CLASSES)

# the run's settings when none is spoiled: one round, every client, one local step (batch = 8 samples)
RUN = dict(rounds=1, clients_per_round=4, batch_size=8, engine="vmap", device="cpu", progress=False)
SETTINGS = settings(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)

# wrong types and odd values, drawn for every argument
ODD = [
    "0.1",
    "1",
    "",
    b"x",
    True,
    False,
    None,
    math.nan,
    math.inf,
    -math.inf,
    2**64,
    -(2**64),
    10**30,
    -1,
    -0.5,
    0,
    0.0,
    1e308,
    [],
    {},
    (),
    [1.0],
    1.5,
    np.float64(0.5),
    np.int64(2),
    torch.tensor(0.5),
    object(),
]

# valid (or plausible) values per parameter name, drawn beside ODD
PLAUSIBLE = {
    "server_lr": [0.5, 1.0, 0.01],
    "optimizer": [None, ServerSGD(0.5), ServerAdam(), ServerMomentum(), "adam", ServerAdam],
    "momentum": [0.0, 0.5, 0.9, 0.999],
    "server_momentum": [0.0, 0.5, 0.9],
    "beta1": [0.0, 0.5, 0.9],
    "beta2": [0.0, 0.5, 0.99],
    "tau": [1e-3, 1.0, 30.0],
    "weighting": ["size", "uniform", "mean"],
    "layerwise": [True, False],
    "merge_norm": [True, False],
    "mix": [True, False],
    "fairness": [True, False],
    "warmup": [True, False],
    "alpha": [0.01, 0.1, 0.9],
    "mu": [0.0, 0.01, 1.0],
    "q": [0.0, 1.0, 5.0],
    "lambda_lr": [0.1, 1.0],
    "eps": [1e-8, 1e-3],
    "nu": [1e-6, 1e-2],
    "ftol": [1e-6, 0.0],
    "clip": [0.1, 1.0],
    "noise_multiplier": [0.0, 1.0],
    "edge_prob": [0.0, 0.3, 1.0],
    "beta": [0.0, 0.1, 0.25, 0.49],
    "prox_mu": [0.0, 0.01],
    "tau_rate": [None, 0.5, 1.0],
    "f": [None, 0, 1, 2, 3],
    "k": [None, 1, 2, 4],
    "num_neighbours": [None, 1, 2, 3, 10],
    "denominator": [None, 1, 4],
    "iterations": [1, 3],
    "batch_size": [1, 4, 32, 2**40],
    "probe_size": [2, 4, 32],
    "probe_seed": [0, 5, 2**64 - 1],
    "norm_order": [1, 2, math.inf, 0.5, "fro"],
    "mode": ["clientwise", "layerwise", "Clientwise"],
    "engine": ["vmap", "loop", "auto", LoopEngine(), "gpu"],
    "base": [None, FedAvg(), FedProx(0.01), "fedavg", FedAvg],
    "layer": [None, "hidden", "hidden.0", "out", "nonexistent", ""],
    "loss": ["global", "local", "other"],
    "iterate": ["last", "average", "mean"],
    "groups": ["tensor", "module", "layer"],
    "prox_tau_eff": ["steps", "norms", "other"],
    "val_data": [VAL, (VAL[0], VAL[1][:3]), (VAL[0],), VAL[0], (VAL[0].numpy(), VAL[1].numpy()), (VAL[0], VAL[1] + 5)],
}
REQUIRED = {"fedvg": {"val_data": VAL}, "ifca": {"num_clusters": 2}}  # extra inputs a strategy needs, valid, built once


def _parameters(name: str) -> list[str]:
    return list(inspect.signature(STRATEGIES[name]).parameters)


def values(param: str):
    """Values drawn for ``param``: its plausible ones, the odd ones, small numbers."""
    return st.one_of(
        st.sampled_from(PLAUSIBLE.get(param, []) + ODD),
        st.integers(-3, 6),
        st.floats(-2.0, 2.0, allow_nan=False),
    )


def names_it(message: str, param: str) -> bool:
    """``param`` appears in ``message`` as a whole word (``lr`` is not named by ``lr_decay``)."""
    return re.search(rf"(?<![A-Za-z0-9_]){re.escape(param)}(?![A-Za-z0-9_])", message) is not None


def _refused_by_name(err: Exception, param: str, what: str) -> None:
    assert names_it(str(err), param), f"{what} raised {type(err).__name__} not naming {param!r}: {err}"


def _diverged(err: FloatingPointError, param: str, value, what: str) -> None:
    """A run that diverged must name the argument, unless ``value`` is a finite magnitude >= 1e6:
    a step that large overflows by arithmetic (the message then names the round and a knob)."""
    try:
        huge = math.isfinite(float(value)) and abs(float(value)) >= 1e6
    except (TypeError, ValueError, RuntimeError):
        huge = False
    assert huge or names_it(str(err), param), f"{what} raised FloatingPointError not naming {param!r}: {err}"
    assert str(err).startswith("Round "), f"{what}: {err}"


@st.composite
def spoiled_strategy(draw):
    """(strategy name, spoiled parameter, its value, kwargs)."""
    name = draw(st.sampled_from(sorted(n for n in STRATEGIES if _parameters(n))), label="strategy")  # not LocalOnly
    param = draw(st.sampled_from(_parameters(name)), label="parameter")
    value = draw(values(param), label="value")
    return name, param, value, {**REQUIRED.get(name, {}), param: value}


def build(name, param, value, kwargs):
    """The strategy, or ``None`` when its constructor refuses ``value`` by name."""
    try:
        return STRATEGIES[name](**kwargs)
    except (ValueError, TypeError) as err:
        _refused_by_name(err, param, f"{name}({param}={value!r})")
        return None


@settings(SETTINGS, max_examples=2000)
@given(spoiled_strategy())
def test_a_constructor_accepts_or_refuses_by_name(case):
    build(*case)  # any other exception type fails (hypothesis shows the drawn call)


@settings(SETTINGS, max_examples=400)
@given(spoiled_strategy())
def test_what_a_constructor_accepts_runs_or_is_refused_by_name(case):
    name, param, value, _ = case
    strategy = build(*case)
    if strategy is None:
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            simulate(FED, MODEL, strategy, **RUN)
        except (ValueError, TypeError) as err:
            _refused_by_name(err, param, f"simulate with {name}({param}={value!r})")
        except FloatingPointError as err:
            _diverged(err, param, value, f"simulate with {name}({param}={value!r})")


# --------------------------------------------------------------------------- simulate's options
@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("ckpt")


def _options(folder: Path) -> dict:
    target = {k: v + 1.0 for k, v in get_params(MODEL).items()}
    return {
        "federation": [FED, None, "digits", [FED]],
        "model": [MODEL, "mlp", None, torch.nn.Linear(3, 3)],
        "strategy": [FedAvg(), "fedavg", FedAvg, None],
        "rounds": [1, 2],
        "clients_per_round": [1, 4, 100],
        "local_epochs": [1, 2],
        "batch_size": [1, 8, 10**6, 2**40, 2**62],
        "lr": [0.05, 1.0],
        "lr_decay": [1.0, 0.5],
        "momentum": [0.0, 0.9],
        "weight_decay": [0.0, 0.01],
        "eval_every": [1, 5],
        "seed": [0, 7, 2**64 - 1],
        "device": ["cpu", "auto", torch.device("cpu"), "cuda", "meta", "nope", "cpu:0"],
        "engine": ["loop", "vmap", "auto", LoopEngine(), "nope"],
        "progress": [True, False],
        "on_nonfinite": ["raise", "skip", "Skip", "ignore"],
        "checkpoint": [None, folder / "run.pt", str(folder / "run.pt"), str(folder), str(folder / "no" / "x.pt")],
        "checkpoint_every": [1, 2],
        "resume": [True, False],
        "diagnostics": [(), ("conflicts",), "conflicts", ["nope"], [None]],
        "attack": [
            None,
            Attack("sign_flip", 0.25),
            Attack("label_flip", 0.5),
            Attack("model_replacement", 0.25, target=target),
            Attack("free_rider", 0.25),
            "sign_flip",
        ],
        "secure_aggregation": [True, False],
    }


def test_every_option_of_simulate_is_drawn():
    options = set(_options(Path("."))) - {"federation", "model", "strategy"}
    assert options == set(inspect.signature(simulate).parameters) - {"federation", "model", "strategy"}


@settings(SETTINGS, max_examples=400)
@given(data=st.data())
def test_simulate_runs_or_refuses_an_option_by_name(folder, data):
    options = _options(folder)
    param = data.draw(st.sampled_from(sorted(options)), label="option")
    value = data.draw(
        st.one_of(st.sampled_from(options[param] + ODD), st.integers(-3, 6), st.floats(-2.0, 2.0)), label="value"
    )
    # the run's length: a huge count is a long run, not a bad input (seed and epochs have a bound)
    assume(not (param == "rounds" and isinstance(value, int) and not isinstance(value, bool) and value > 100))
    args = {"federation": FED, "model": MODEL, "strategy": FedAvg(), **RUN, param: value}
    if param == "checkpoint" and value is not None:
        args["resume"] = data.draw(st.booleans(), label="resume")
    here = os.getcwd()
    os.chdir(folder)  # a drawn string such as '0.1' is a relative checkpoint path: keep its file in the tmp folder
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                simulate(**args)
            except (ValueError, TypeError) as err:
                _refused_by_name(err, param, f"simulate({param}={value!r})")
            except FloatingPointError as err:
                _diverged(err, param, value, f"simulate({param}={value!r})")
    finally:
        os.chdir(here)


# --------------------------------------------------------------------------- what the properties found
def test_local_settings_are_refused_by_simulate_s_names():
    for option, value, error in [
        ("local_epochs", "1", TypeError),  # was: "epochs must be a positive integer, got 1."
        ("local_epochs", math.inf, TypeError),  # was: OverflowError
        ("local_epochs", 2**64, ValueError),  # was: OverflowError in the step count (and would never end)
        ("batch_size", None, TypeError),  # was: int()'s message
        ("batch_size", True, TypeError),  # was: torch's split() error in round 1
        ("lr", object(), TypeError),  # was: "'<' not supported ..."
        ("lr", True, TypeError),  # was: accepted as 1.0
        ("momentum", 1, ValueError),
        ("weight_decay", "0", TypeError),
    ]:
        with pytest.raises(error, match=rf"^{option} must"):
            simulate(FED, MODEL, FedAvg(), **{**RUN, option: value})


@pytest.mark.parametrize("engine", ["loop", "vmap"])
def test_a_batch_larger_than_the_data_is_one_full_batch(engine):
    """2**40 and 2**64 overflowed int64 or asked for terabytes; now the same run as batch_size = n."""
    full = simulate(FED, MODEL, FedAvg(), **{**RUN, "engine": engine, "batch_size": 8}).final_params
    for huge in (9, 2**40, 2**64):
        got = simulate(FED, MODEL, FedAvg(), **{**RUN, "engine": engine, "batch_size": huge}).final_params
        assert all(torch.equal(got[k], full[k]) for k in full), huge


def test_flags_of_simulate_are_bools():
    for option in ("progress", "secure_aggregation"):
        for value in (0, 1, "no", None):  # progress=0 / "no" were taken as truthy or falsy
            with pytest.raises(TypeError, match=rf"^{option} must be True or False"):
                simulate(FED, MODEL, FedAvg(), **{**RUN, option: value})


def test_a_device_that_is_not_a_device_is_refused_by_name():
    with pytest.raises(ValueError, match="device"):  # was: torch's "Overflow when unpacking long long"
        simulate(FED, MODEL, FedAvg(), **{**RUN, "device": 2**64})
    with pytest.raises(TypeError, match="device must be"):  # True was CUDA device 1
        simulate(FED, MODEL, FedAvg(), **{**RUN, "device": True})


def test_an_adaptive_server_step_refuses_a_tau_that_underflows():
    from fedlearn_edu.strategies import FedYogi

    # was: a FloatingPointError in round 1 blaming server_lr (0/0 at a zero coordinate)
    with pytest.raises(ValueError, match=r"^tau=1e-30 is too small for torch.float32"):
        simulate(FED, MODEL, FedYogi(tau=1e-30), **RUN)
    with pytest.raises(ValueError, match=r"^tau=1e\+308 is too large for torch.float32"):  # was: OverflowError
        simulate(FED, MODEL, STRATEGIES["fedadagrad"](tau=1e308), **RUN)
    state = ServerAdam(tau=1e-30).init_state({"w": torch.zeros(3, dtype=torch.float64)})  # fine in float64
    assert float(state["v"]["w"][0]) == pytest.approx(1e-60)


def test_robust_iterations_are_bounded():
    from fedlearn_edu.aggregators.robust import MAX_ITERATIONS, centered_clipping, geometric_median

    deltas = torch.rand(4, 3)
    for make in (STRATEGIES["centeredclipping"], STRATEGIES["geometricmedian"]):
        with pytest.raises(ValueError, match=r"^iterations must be <= 100000"):  # 2**64 hung
            make(iterations=2**64)
        make(iterations=MAX_ITERATIONS)
    with pytest.raises(ValueError, match="iterations"):
        centered_clipping(deltas, 1.0, iterations=10**30)
    with pytest.raises(ValueError, match="iterations"):
        geometric_median(deltas, iterations=10**30)


def test_fedoui_refuses_an_unknown_layer_before_round_one():
    strategy = STRATEGIES["fedoui"](layer="nope")
    with pytest.raises(ValueError, match=r"^layer='nope' names no submodule of MLP; choose one of \['hidden'"):
        strategy.init_state(get_params(MODEL), MODEL, len(FED), 0)  # was: "No submodule", in round 1
    with pytest.raises(ValueError, match="layer='nope'"):
        simulate(FED, MODEL, strategy, **RUN)


def test_fedvg_norm_order_message():
    from fedlearn_edu.signals.validation_gradients import validation_gradient_norms

    fedvg = STRATEGIES["fedvg"]
    assert fedvg(VAL, norm_order=math.inf).norm_order == math.inf
    with pytest.raises(TypeError, match=r"^norm_order must be a real number, got 'fro'"):
        fedvg(VAL, norm_order="fro")
    with pytest.raises(ValueError, match=r"^norm_order must be > 0 or inf \(p of the norm: 1, 2, inf, ...\), got 0"):
        fedvg(VAL, norm_order=0)  # was: "norm_order (1, 2, inf, ...) must be > 0, got 0."
    stacked = {k: v.unsqueeze(0) for k, v in get_params(MODEL).items()}
    with pytest.raises(TypeError, match="norm_order"):  # was: float()'s "could not convert string to float"
        validation_gradient_norms(MODEL, stacked, VAL, norm_order="fro")


def test_fedvg_validation_data_messages_name_it():
    fedvg = STRATEGIES["fedvg"]
    for bad in [(VAL[0], VAL[1][:3]), (torch.tensor(1.0), VAL[1]), (("a",), ("b",))]:
        with pytest.raises((TypeError, ValueError), match=r"^val_data"):
            fedvg(bad)


def test_a_client_lr_beyond_the_dtype_is_refused_up_front():
    with pytest.raises(ValueError, match=r"^lr=1e\+308 is too large for torch.float32"):  # was: torch's RuntimeError
        simulate(FED, MODEL, FedAvg(), **{**RUN, "lr": 1e308})


def test_feddyn_overflow_hint_names_server_lr_too():
    with pytest.raises(FloatingPointError, match=r"or a smaller server_lr \(now 1e\+308\)"):
        simulate(FED, MODEL, STRATEGIES["feddyn"](server_lr=1e308), **RUN)


def test_dpfedavg_denominator_beyond_float_range_is_refused():
    try:
        strategy = STRATEGIES["dpfedavg"](denominator=2**1100)
    except ValueError as err:
        assert names_it(str(err), "denominator")
        return
    with pytest.raises(ValueError, match="denominator"):
        simulate(FED, MODEL, strategy, **RUN)


def test_fedvg_validation_labels_outside_the_classes_are_refused_naming_val_data():
    strategy = STRATEGIES["fedvg"]((VAL[0], VAL[1] + CLASSES))
    with pytest.raises(ValueError, match=r"^val_data of FedVG \(the server validation set\) has labels outside"):
        simulate(FED, MODEL, strategy, **RUN)


def test_fedalign_with_a_huge_eps_weighs_clients_by_size():
    from fedlearn_edu.aggregators import fedalign_weights

    deltas, n = torch.tensor([[1.0, 0.0], [1.0, 0.1], [-1.0, 0.0]]), torch.tensor([1.0, 2.0, 5.0])
    w = fedalign_weights(deltas, n, eps=1e308)  # was: NaN weights (n * eps overflowed)
    torch.testing.assert_close(w, (n / n.sum()).double())
    simulate(FED, MODEL, STRATEGIES["fedalign"](eps=1e308), **RUN)


def test_fedoui_probe_size_is_bounded():
    from fedlearn_edu.signals.oui import MAX_PROBE_SIZE, probe_indices

    with pytest.raises(ValueError, match=r"^probe_size must be <= 100000"):  # was: torch's randint overflow
        STRATEGIES["fedoui"](probe_size=2**64)
    with pytest.raises(ValueError, match=r"^probe_size must be <= 100000"):
        probe_indices(10, 2**64)
    assert probe_indices(10, MAX_PROBE_SIZE).shape == (MAX_PROBE_SIZE,)


def test_fedvg_overflowing_small_p_norms_blame_norm_order():
    strategy = STRATEGIES["fedvg"](VAL, norm_order=2**-7)  # was: "the validation gradient ... is NaN or Inf"
    with pytest.raises(ValueError, match=r"norm_order=0.0078125 norms of client \d+'s \(finite\) validation gradient"):
        simulate(FED, MODEL, strategy, **RUN)


# --------------------------------------------------------------------------- DPFedAvg, Attack, secure_sum
# The same property for DP-FedAvg's settings (fixed and adaptive clipping), an Attack's fields (the
# attack run under FedAvg) and secure_sum's arguments: a completed call or an error naming the argument.
DP_BASES = {"fixed": {}, "adaptive": {"target_quantile": 0.5, "count_noise": 2.0}}
DP_PLAUSIBLE = {
    "target_quantile": [None, 0.0, 0.5, 1.0],
    "clip_lr": [None, 0.2, 1.0, 1e3, 1e308],
    "count_noise": [None, 0.0, 0.5, 2.0, 1e300],
    "noise_multiplier": [0.0, 1.0, 1e-200, 1e200, 1e300],
    "clip": [1e-320, 0.1, 1.0, 1e200, 1e308],
    "denominator": [None, 1, 4, 2**53],
}


@st.composite
def spoiled_dpfedavg(draw):
    """(clipping mode, spoiled parameter, its value, kwargs)."""
    from fedlearn_edu.strategies import DPFedAvg

    mode = draw(st.sampled_from(sorted(DP_BASES)), label="mode")
    param = draw(st.sampled_from(list(inspect.signature(DPFedAvg).parameters)), label="parameter")
    extra = DP_PLAUSIBLE.get(param, []) + PLAUSIBLE.get(param, [])
    value = draw(st.one_of(st.sampled_from(extra + ODD), st.integers(-3, 6), st.floats(-2.0, 2.0)), label="value")
    return mode, param, value, {**DP_BASES[mode], param: value}


@settings(SETTINGS, max_examples=300)
@given(spoiled_dpfedavg())
def test_dpfedavg_runs_or_refuses_a_setting_by_name(case):
    from fedlearn_edu.strategies import DPFedAvg

    mode, param, value, kwargs = case
    what = f"DPFedAvg({kwargs!r})"
    try:
        strategy = DPFedAvg(**kwargs)
    except (ValueError, TypeError) as err:
        _refused_by_name(err, param, what)
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:  # two rounds: the second uses the clipping norm adaptive clipping moved
            simulate(FED, MODEL, strategy, **{**RUN, "rounds": 2})
        except (ValueError, TypeError) as err:
            _refused_by_name(err, param, f"simulate with {what}")
        except FloatingPointError as err:
            _diverged(err, param, value, f"simulate with {what}")


def _attack_values() -> dict:
    from fedlearn_edu.attacks import ATTACKS

    target = {k: v + 1.0 for k, v in get_params(MODEL).items()}
    return {
        "kind": list(ATTACKS) + ["flip", "Sign_flip"],
        "fraction": [0.25, 0.5, 0.75, 0.01, 0.99, 1.0, 0.0],
        "seed": [0, 5, 2**64 - 1],
        "scale": [1.0, -2.0, 0.0, 1e308],
        "sigma": [0.0, 1.0, 1e308],
        "target": [None, target, {}, {"nope": torch.zeros(1)}, {"out.bias": torch.zeros(7)}],
    }


@settings(SETTINGS, max_examples=300)
@given(data=st.data())
def test_an_attack_runs_or_refuses_a_field_by_name(data):
    from fedlearn_edu.attacks import ATTACKS

    options = _attack_values()
    kind = data.draw(st.sampled_from(ATTACKS), label="kind of the valid attack")
    kwargs = {"kind": kind, "fraction": 0.25}
    if kind == "model_replacement":
        kwargs["target"] = options["target"][1]
    param = data.draw(st.sampled_from(sorted(options)), label="field")
    value = data.draw(
        st.one_of(st.sampled_from(options[param] + ODD), st.integers(-3, 6), st.floats(-2.0, 2.0)), label="value"
    )
    kwargs[param] = value
    what = f"Attack({param}={value!r}) of {kind}"
    try:
        attack = Attack(**kwargs)
    except (ValueError, TypeError) as err:
        _refused_by_name(err, param, what)
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:  # four clients: a fraction must leave 1 to 3 attackers
            simulate(FED, MODEL, FedAvg(), attack=attack, **{**RUN, "rounds": 2})
        except (ValueError, TypeError) as err:
            _refused_by_name(err, param, f"simulate with {what}")
        except FloatingPointError as err:
            _diverged(err, param, value, f"simulate with {what}")


def _secure_sum_values() -> dict:
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    return {
        "inputs": [x, {"w": x, "b": x[:, :1]}, x.float(), x * 2**30, x[:, :0], x[:1], x * math.nan, x.int(), x[0]],
        "client_ids": [
            torch.arange(4),
            [3, 1, 2, 0],
            torch.arange(4).float(),
            torch.tensor([0, 1, 1, 2]),
            torch.arange(5),
            [0, 1, 2, -1],
            torch.arange(4)[None],
            [0, 1, 2, 3.0],
        ],
        "seed": [0, 7, 2**64 - 1, 1.5],
        "scale_bits": [0, 8, 16, 46, 60],
        "modulus_bits": [8, 20, 32, 48, 62, 63],
        "dropped": [None, [], [1], [0, 1], [0, 1, 2, 3], torch.tensor([2]), torch.tensor([2.0]), [7], (1,), {3}],
        "threshold": [None, 1, 2, 3, 4, 5],
    }


def test_every_argument_of_secure_sum_is_drawn():
    from fedlearn_edu.secagg import secure_sum

    assert set(_secure_sum_values()) == set(inspect.signature(secure_sum).parameters)


@settings(SETTINGS, max_examples=400)
@given(data=st.data())
def test_secure_sum_returns_or_refuses_an_argument_by_name(data):
    from fedlearn_edu.secagg import secure_sum

    options = _secure_sum_values()
    param = data.draw(st.sampled_from(sorted(options)), label="argument")
    value = data.draw(
        st.one_of(st.sampled_from(options[param] + ODD), st.integers(-3, 6), st.floats(-2.0, 2.0)), label="value"
    )
    args = {"inputs": options["inputs"][0], "client_ids": torch.arange(4), "seed": 0, param: value}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a threshold <= m / 2 is warned about, and computed
        try:
            total, masked = secure_sum(**args)
        except (ValueError, TypeError) as err:
            _refused_by_name(err, param, f"secure_sum({param}={value!r})")
            return
    leaves = total.values() if isinstance(total, dict) else [total]
    assert all(bool(torch.isfinite(t).all()) for t in leaves), f"secure_sum({param}={value!r}) gave {total}"


# --------------------------------------------------------------------------- the benchmark's grid objects
def _benchmark_values() -> dict:
    from fedlearn_edu import benchmark

    return {
        benchmark.BenchmarkProtocol: {
            "tuning_seeds": [(0, 1, 2), (0,), [0, 1], range(3), np.arange(2), (), (0, 0), (2**64,), (3,), 5],
            "eval_seeds": [(3, 4), tuple(range(3, 13)), (3,), [5, 6], (2**64 - 1, 7), (-1, 4), 7],
            "rounds": [1, 4, 30],
            "clients_per_round": [1, 10],
            "local_epochs": [1, 2],
            "batch_size": [1, 10],
            "lr": [0.1, 1.0],
            "last_k": [None, 1, 5, 30, 31],
            "target": [0.5, 0.8, 1.0, 1.01],
            "engine": ["auto", "loop", "vmap", "bogus", LoopEngine()],
            "alpha": [0.05, 0.01],
            "margin": [0.02, 0.5],
            "edge_cap": [0, 3],
        },
        benchmark.Method: {
            "name": ["fedavg", "x", ""],
            "strategy": [None, "fedavg", "nope"],
            "fixed": [{}, {"mu": 0.1}, [("mu", 1)]],
            "tune": [{}, {"server_lr": [1.0, 2.0]}, {"server_lr": []}, {"server_lr": 1.0}, {"server_lr": [0.0, 1.0]}],
            "factory": [None, FedAvg, "fedavg"],
            "server_validation": [0.0, 0.1, 0.99, 1.0],
            "note": ["", "a note"],
            "extend": [None, (), ("server_lr",), "server_lr", ("mu",)],
        },
        benchmark.FederationSpec: {
            "name": ["d", "", "dirichlet:0.1"],
            "dataset": ["digits", "mnist", "Fashion-MNIST", "nope"],
            "partition": ["iid", "dirichlet", "shards", "quantity", "clusters", "nope"],
            "partition_params": [{}, {"alpha": 0.5}, {"alpha": -1}, {"beta": 1}, {"min_size": 2}, {"alpha": True}],
            "num_clients": [2, 4, 20],
            "model": ["mlp", "cnn", "MLP", "nope"],
            "noisy_clients": [0.0, 0.3, 1.0],
            "noise_fraction": [0.0, 0.8],
            "num_samples": [None, 4, 300, 3],
            "attack": ["", "sign_flip", "alie", "model_replacement", "nope"],
            "attack_fraction": [0.0, 0.25, 0.5, 0.01, 0.9, 1.0],
            "attack_params": [{}, {"scale": 2.0}, {"sigma": -1}, {"seed": 5}, {"nope": 1}, {1: 2}],
            "root": [None, "/tmp", Path("/tmp")],
        },
    }


@settings(SETTINGS, max_examples=600)
@given(data=st.data())
def test_benchmark_grid_objects_are_built_or_refused_by_name(data):
    """benchmark.BenchmarkProtocol, Method and FederationSpec: one field spoiled, the others valid."""
    import dataclasses

    from fedlearn_edu import benchmark
    from fedlearn_edu.benchmark import execution

    table = _benchmark_values()
    cls = data.draw(st.sampled_from(list(table)), label="class")
    param = data.draw(st.sampled_from(sorted(table[cls])), label="field")
    value = data.draw(
        st.one_of(st.sampled_from(table[cls][param] + ODD), st.integers(-3, 6), st.floats(-2.0, 2.0)), label="value"
    )
    base = {benchmark.Method: {"name": "x"}, benchmark.FederationSpec: {"name": "d", "num_clients": 4}}.get(cls, {})
    if cls is benchmark.FederationSpec and param in ("attack", "attack_fraction", "attack_params"):
        base = {**base, "attack": "sign_flip", "attack_fraction": 0.25}  # an attack's fields need one another
    try:
        built = cls(**{**base, param: value})
    except (ValueError, TypeError) as err:
        _refused_by_name(err, param, f"benchmark.{cls.__name__}({param}={value!r})")
        return
    if cls is benchmark.BenchmarkProtocol:
        assert built.last_k <= built.rounds and set(built.tuning_seeds).isdisjoint(built.eval_seeds)
        built.local()
    elif cls is benchmark.FederationSpec:
        json.dumps(execution._plain_record(built.config()))  # what the run's key hashes
    else:
        assert dataclasses.replace(built) == built and built.candidates()


# --------------------------------------------------------------------------- aggregators and partitions
# Random malformed inputs to the public aggregation functions and partitions: every call returns a
# result or raises ValueError/TypeError whose message names the argument that was spoiled.
M, D = 4, 6


def _valid():
    """Valid arguments of every function under test: ``{name: (function, {arg: value})}``."""
    g = torch.Generator().manual_seed(0)
    deltas = torch.randn(M, D, generator=g)
    layered = {"a.weight": torch.randn(M, 2, 3, generator=g), "a.bias": torch.randn(M, 2, generator=g)}
    w = torch.tensor([1.0, 2.0, 3.0, 4.0])
    losses = torch.tensor([0.5, 1.0, 1.5, 2.0])
    oui = torch.tensor([0.2, 0.4, 0.5, 0.7])
    labels = np.repeat(np.arange(4), 10)
    return {
        "fedavg": (agg.fedavg, {"deltas": deltas, "weights": w}),
        "count_conflicts": (agg.count_conflicts, {"deltas": deltas, "update": deltas[0]}),
        "craft_direction": (agg.craft_direction, {"pseudo_grads": deltas, "rho": w, "rcond": None}),
        "craft_direction_layers": (agg.craft_direction, {"pseudo_grads": layered, "rho": w}),
        "pinv_solve": (agg.pinv_solve, {"matrix": deltas, "r": w, "rcond": None}),
        "config_direction": (agg.config_direction, {"pseudo_grads": deltas, "rcond": None}),
        "fedfv_direction": (agg.fedfv_direction, {"pseudo_grads": deltas, "losses": losses, "alpha": 0.1}),
        "fedfv_kept": (agg.fedfv_kept, {"losses": losses, "alpha": 0.5}),
        "qfedavg_step": (agg.qfedavg_step, {"pseudo_grads": deltas, "losses": losses, "lr": 0.1, "q": 1.0}),
        "fedvg_weights": (agg.fedvg_weights, {"grad_norms": w, "eps": 1e-8}),
        "fedvg_layerwise_weights": (agg.fedvg_layerwise_weights, {"grad_norms": w.view(M, 1), "eps": 1e-8}),
        "fedvg_mixed_weights": (agg.fedvg_mixed_weights, {"weights": w / w.sum(), "num_samples": w}),
        "fedvg_aggregate": (agg.fedvg_aggregate, {"deltas": layered, "weights": w / w.sum()}),
        "fit_beta": (agg.fit_beta, {"oui_values": oui, "clip": 1e-3}),
        "beta_moments": (agg.beta_moments, {"mean": 0.4, "var": 0.01}),
        "empirical_rank_scores": (agg.empirical_rank_scores, {"oui_values": oui}),
        "fedoui_scores": (agg.fedoui_scores, {"oui_values": oui}),
        "fedoui_weights": (agg.fedoui_weights, {"oui_values": oui, "num_samples": w, "eps": 1e-3}),
        "fedalign_weights": (agg.fedalign_weights, {"deltas": deltas, "num_samples": w, "eps": 1e-3}),
        "iid_partition": (part.iid_partition, {"num_samples_or_labels": 40, "num_clients": 4, "seed": 0}),
        "dirichlet_partition": (
            part.dirichlet_partition,
            {"labels": labels, "num_clients": 4, "alpha": 0.5, "min_size": 2, "seed": 0, "max_tries": 5},
        ),
        "shard_partition": (
            part.shard_partition,
            {"labels": labels, "num_clients": 4, "shards_per_client": 2, "seed": 0},
        ),
        "quantity_skew_partition": (
            part.quantity_skew_partition,
            {"num_samples": 40, "num_clients": 4, "sigma": 1.0, "min_size": 2, "seed": 0},
        ),
        "partition_label_counts": (
            part.partition_label_counts,
            {"labels": labels, "partition": [np.arange(0, 20), np.arange(20, 40)], "num_classes": 4},
        ),
    }


VALID = _valid()


_bad_scalars = st.sampled_from(
    [None, "1", "abc", b"x", True, math.nan, math.inf, -math.inf, -1, -1.5, 0, 1e308, 2.5, 10**30, [], {}, object()]
)


@st.composite
def _bad_tensors(draw):
    kind = draw(
        st.sampled_from(["nan", "inf", "int", "bool", "empty", "shape", "scalar", "list", "f16", "neg", "huge"])
    )
    m = draw(st.sampled_from([M, 1, 3]))
    if kind == "nan":
        t = torch.rand(m, D)
        t[draw(st.integers(0, m - 1)), 0] = math.nan
        return t
    if kind == "inf":
        return torch.full((m,), math.inf)
    if kind == "int":
        return torch.ones(m, D, dtype=torch.int64)
    if kind == "bool":
        return torch.ones(m, dtype=torch.bool)
    if kind == "empty":
        return torch.zeros(0, D)
    if kind == "shape":
        return torch.rand(*draw(st.lists(st.integers(1, 3), min_size=1, max_size=4)))
    if kind == "scalar":
        return torch.tensor(0.5)
    if kind == "list":
        return draw(st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=6))
    if kind == "f16":
        return torch.rand(m, D, dtype=torch.float16)
    if kind == "neg":
        return -torch.rand(m)
    return torch.full((m,), 3e38)


_bad_dicts = st.sampled_from(
    [{"a": "x"}, {"a": torch.rand(M, 2), "b": torch.rand(M + 1, 2)}, {"a": torch.rand(M, 2, dtype=torch.float64)}]
)


_malformed = st.one_of(_bad_scalars, _bad_tensors(), _bad_dicts)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(sorted(VALID)), data=st.data())
def test_malformed_inputs_give_a_result_or_an_error_naming_the_argument(name, data):
    fn, args = VALID[name]
    spoiled = data.draw(st.sampled_from(sorted(args)), label="argument")
    value = data.draw(_malformed, label="value")
    kwargs = {**args, spoiled: value}
    try:
        fn(**kwargs)
    except (ValueError, TypeError) as err:
        message = str(err)
        named = [a for a in args if a in message]
        assert spoiled in message or named, f"{name}({spoiled}={value!r}) raised {type(err).__name__}: {message}"
    # any other exception type fails the test (hypothesis reports the input)


@pytest.mark.parametrize("name", sorted(VALID))
def test_the_valid_arguments_work(name):
    fn, args = VALID[name]
    fn(**args)


# --------------------------------------------------------------------------- constructors, by example
# The strategies' constructors on strings and NaN: the error names the argument and shows the value's repr.
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
