"""Faults round 4: one property per kind of fault, over every public function the kind applies to.

1. a value of the wrong kind is refused, never taken for another (``'no'`` for a flag, ``2.5``
   for a count, a count outside its domain);
2. an argument the call would ignore is refused, never dropped without a word;
3. a NaN/Inf the caller's argument caused is blamed on that argument, not on another;
4. a bad input gets the package's ``TypeError``/``ValueError``, not a library's internals;
5. a sweep's folder is not trusted beyond what it proves (``tests/benchmark/test_store.py``
   and ``tests/benchmark/test_federations.py`` hold the properties of the benchmark);
6. a grid that could never succeed is refused before its first run (``tests/benchmark``).

Each property draws inputs with hypothesis (fixed seed, few examples: the unit tier) and asserts
that the error names the argument (a whole word of the message).
"""

from __future__ import annotations

import inspect
import math
import re
import warnings

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedlearn_edu import aggregators as agg
from fedlearn_edu import simulate
from fedlearn_edu.attacks import ATTACKS, Attack, alie_z
from fedlearn_edu.params import get_params
from fedlearn_edu.strategies import STRATEGIES, FedAvg

from .test_argument_properties import FED, MODEL, REQUIRED, RUN, VAL

SETTINGS = settings(deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow])


def names_it(message: str, param: str) -> bool:
    return re.search(rf"(?<![A-Za-z0-9_]){re.escape(param)}(?![A-Za-z0-9_])", message) is not None


def refused_naming(call, param: str, errors=(TypeError, ValueError)):
    """``call()`` raises one of ``errors`` whose message names ``param``; returns the error."""
    with pytest.raises(errors) as info:
        call()
    assert names_it(str(info.value), param), f"{type(info.value).__name__} not naming {param!r}: {info.value}"
    return info.value


# --------------------------------------------------------------------------- 1. wrong kind of value
NOT_BOOLS = st.one_of(
    st.sampled_from(["no", "False", "True", "0", "yes", "", None, 0, 1, 0.0, 1.0, [], [True], b"x"]),
    st.text(max_size=4),
    st.integers(-3, 3),
    st.floats(allow_nan=True),
)
NOT_INTS = st.one_of(
    st.sampled_from([1.7, 2.5, 2.0, -0.5, "2", "", None, True, False, math.nan, math.inf, [2], b"2"]),
    st.floats(allow_nan=True),
    st.text(max_size=3),
)

_DELTAS = torch.randn(5, 3, generator=torch.Generator().manual_seed(0))
_LABELS = np.arange(40) % 4


def _strategy_args(kind: str) -> list:
    """Every strategy constructor's parameters of ``kind`` (a bool default; an int-annotated count)."""
    out = []
    for name, make in sorted(STRATEGIES.items()):
        for param, p in inspect.signature(make).parameters.items():
            ann = str(p.annotation)
            if kind == "bool" and type(p.default) is bool:
                out.append((f"{name}()", make, REQUIRED.get(name, {}), param))
            if kind == "int" and type(p.default) is int and "float" not in ann:
                out.append((f"{name}()", make, REQUIRED.get(name, {}), param))
    return out


def _function_args(kind: str) -> list:
    from fedlearn_edu.aggregators.gossip import random_graph, sample_neighbours
    from fedlearn_edu.aggregators.robust import max_bulyan_f, max_krum_f
    from fedlearn_edu.conditional import make_conditional_model
    from fedlearn_edu.data.noise import flip_labels
    from fedlearn_edu.data.partition import dirichlet_partition
    from fedlearn_edu.engine import VmapEngine
    from fedlearn_edu.signals.oui import oui_pairwise
    from fedlearn_edu.utils import derive_seed

    def call(f, *args):
        return lambda **kw: f(*args, **kw)

    flags = [
        ("dirichlet_partition", call(dirichlet_partition, _LABELS, 4, 1.0), {"min_size": 1}, "balance"),
        ("dirichlet_partition", call(dirichlet_partition, _LABELS, 4, 1.0), {"min_size": 1}, "repair"),
        ("flip_labels", call(flip_labels, _LABELS, 0.5, 4), {}, "return_mask"),
        ("oui_pairwise", call(oui_pairwise, torch.randn(4, 6)), {}, "clamp"),
        ("make_conditional_model", call(make_conditional_model, "mlp", (1, 2, 2), 3, 2), {}, "zero_init"),
        ("VmapEngine", VmapEngine, {}, "tune_allocator"),
        ("craft_direction", call(agg.craft_direction, _DELTAS, 0.5), {}, "normalize_reference"),
    ]
    flags += [
        (f.__name__, call(f, _DELTAS, *args), {}, "check")
        for f, args in [
            (agg.fedavg, (torch.ones(5),)),
            (agg.coordinate_median, ()),
            (agg.trimmed_mean, (0.2,)),
            (agg.krum, (1,)),
            (agg.geometric_median, ()),
            (agg.norm_clip, (1.0,)),
            (agg.centered_clipping, (1.0,)),
        ]
    ]
    counts = [
        ("derive_seed", lambda key: derive_seed(3, key), {}, "derive_seed"),
        ("random_graph", call(random_graph, 4, 0.5), {}, "seed"),
        ("random_graph", call(random_graph, 4, 0.5), {}, "max_tries"),
        ("sample_neighbours", call(sample_neighbours, torch.ones(3, 3), 2), {}, "seed"),
        ("alie_z", alie_z, {"n": 10, "f": 2}, "n"),
        ("alie_z", alie_z, {"n": 10, "f": 2}, "f"),
        ("max_krum_f", max_krum_f, {}, "m"),
        ("max_bulyan_f", max_bulyan_f, {}, "m"),
        ("krum", call(agg.krum, _DELTAS), {"f": 1}, "f"),
        ("krum", call(agg.krum, _DELTAS), {"f": 1}, "k"),
    ]
    return flags if kind == "bool" else counts


CASES_1 = [("bool", *c) for c in _strategy_args("bool") + _function_args("bool")] + [
    ("int", *c) for c in _strategy_args("int") + _function_args("int")
]
# out-of-domain integers, returned as numbers before
DOMAIN = [
    ("max_krum_f", "m", st.integers(-(2**40), -1).map(lambda m: {"m": m})),
    ("max_bulyan_f", "m", st.integers(-(2**40), -1).map(lambda m: {"m": m})),
    ("alie_z", "f", st.integers(1, 50).flatmap(lambda n: st.integers(n + 1, n + 50).map(lambda f: {"n": n, "f": f}))),
    ("alie_z", "n", st.integers(-50, 0).map(lambda n: {"n": n, "f": 0})),
]


def _domain_call(name, kwargs):
    from fedlearn_edu.aggregators.robust import max_bulyan_f, max_krum_f

    return {"max_krum_f": max_krum_f, "max_bulyan_f": max_bulyan_f, "alie_z": alie_z}[name](**kwargs)


@settings(SETTINGS, max_examples=300)
@given(data=st.data())
def test_1_a_value_of_the_wrong_kind_is_refused_naming_the_argument(data):
    if data.draw(st.integers(0, 9), label="domain case?") == 0:
        name, param, draws = data.draw(st.sampled_from(DOMAIN), label="function")
        kwargs = data.draw(draws, label="kwargs")
        refused_naming(lambda: _domain_call(name, kwargs), param)
        return
    kind, what, make, valid, param = data.draw(st.sampled_from(CASES_1), label="call")
    value = data.draw(NOT_BOOLS if kind == "bool" else NOT_INTS, label=param)
    if param == "derive_seed":
        refused_naming(lambda: make(value), param)
    else:
        refused_naming(lambda: make(**{**valid, param: value}), param)


def test_1_every_flag_and_count_of_a_strategy_is_drawn():
    assert {p for _, _, _, p in _strategy_args("bool")} >= {"layerwise", "merge_norm", "fairness", "mix", "warmup"}
    assert {p for _, _, _, p in _strategy_args("int")} >= {"iterations", "probe_size", "batch_size"}


# --------------------------------------------------------------------------- 2. an argument ignored without a word
_FIELDS = {
    "scale": st.floats(-1e6, 1e6).filter(lambda v: v != 1.0),
    "sigma": st.floats(0, 1e6).filter(lambda v: v != 1.0),
}
_TARGET = {k: v + 1.0 for k, v in get_params(MODEL).items()}


@settings(SETTINGS, max_examples=120)
@given(data=st.data())
def test_2_an_argument_the_call_would_ignore_is_refused(data):
    from fedlearn_edu.secagg import decode, encode

    case = data.draw(st.sampled_from(["attack_field", "client_ids", "decode"]), label="case")
    if case == "attack_field":
        kind = data.draw(st.sampled_from(ATTACKS), label="kind")
        unused = [
            f
            for f in ("scale", "sigma", "target")
            if f
            not in {"sign_flip": "scale", "scale": "scale", "gaussian": "sigma", "model_replacement": "target"}.get(
                kind, ""
            )
        ]
        field = data.draw(st.sampled_from(unused), label="field it ignores")
        value = _TARGET if field == "target" else data.draw(_FIELDS[field], label=field)
        kwargs = {"target": _TARGET} if kind == "model_replacement" else {}
        refused_naming(lambda: Attack(kind, 0.25, **{**kwargs, field: value}), field)
    elif case == "client_ids":
        kind = data.draw(st.sampled_from([k for k in ATTACKS if k != "label_flip"]), label="kind")
        m = data.draw(st.integers(2, 6), label="m")
        n_ids = data.draw(st.integers(1, 8).filter(lambda n: n != m), label="ids given")
        deltas = {"w": torch.randn(m, 3), "b": torch.randn(m)}
        attack = Attack(
            kind, 0.5, target={"w": torch.zeros(3), "b": torch.zeros(())} if kind == "model_replacement" else None
        )
        theta = {"w": torch.zeros(3), "b": torch.zeros(())}
        refused_naming(
            lambda: attack.apply(deltas, torch.arange(n_ids), torch.tensor([0]), 1, theta, 1.0, theta), "client_ids"
        )
    else:
        x = data.draw(st.lists(st.floats(-100, 100), min_size=1, max_size=6), label="x")
        dtype = data.draw(st.sampled_from([torch.float32, torch.float64, torch.float16]), label="dtype")
        codes = encode(torch.tensor(x, dtype=torch.float64)).to(dtype)  # codes passed as floats: garbage out
        refused_naming(lambda: decode(codes), "y", TypeError)


# --------------------------------------------------------------------------- 3. the right error, the wrong culprit
HUGE = st.floats(1e39, 1e308) | st.sampled_from([1e300, 1e308, 3.5e38])


def _run(**kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return simulate(FED, MODEL, kw.pop("strategy", FedAvg()), **{**RUN, **kw})


@settings(SETTINGS, max_examples=25)
@given(data=st.data())
def test_3_a_nan_the_caller_caused_is_blamed_on_their_argument(data):
    case = data.draw(st.sampled_from(["scale", "sigma", "target", "noise_multiplier", "v"]), label="culprit")
    if case in ("scale", "sigma"):
        value = data.draw(HUGE, label=case)
        kind = "gaussian" if case == "sigma" else data.draw(st.sampled_from(["scale", "sign_flip"]), label="kind")
        refused_naming(lambda: _run(attack=Attack(kind, 0.25, **{case: value})), case, FloatingPointError)
    elif case == "target":
        bad = data.draw(st.sampled_from([math.nan, math.inf, -math.inf]), label="value")
        key = data.draw(st.sampled_from(sorted(_TARGET)), label="parameter")
        target = {k: (v.clone().fill_(bad) if k == key else v) for k, v in _TARGET.items()}
        refused_naming(lambda: Attack("model_replacement", 0.25, target=target), "target")
    elif case == "noise_multiplier":
        z = data.draw(st.floats(1e20, 1e36), label="noise_multiplier")
        dp = STRATEGIES["dpfedavg"](noise_multiplier=z)
        err = refused_naming(lambda: _run(strategy=dp, rounds=3), "noise_multiplier", FloatingPointError)
        assert "lower server_lr" not in str(err)
    else:
        bad = data.draw(st.sampled_from([math.nan, math.inf, -math.inf]), label="value")
        i = data.draw(st.integers(0, 2), label="coordinate")
        v = torch.zeros(3)
        v[i] = bad
        refused_naming(lambda: agg.centered_clipping(_DELTAS, 1.0, v=v), "v")


# --------------------------------------------------------------------------- 4. library internals instead of a message
NOT_STRATEGIES = st.sampled_from([None, "fedavg", "krum", 0, 1.5, [], {}, FedAvg, object(), torch.zeros(2)])


@settings(SETTINGS, max_examples=120)
@given(data=st.data())
def test_4_a_bad_input_gets_the_package_s_message(data):
    from fedlearn_edu.engine import LocalTraining, LoopEngine, VmapEngine
    from fedlearn_edu.secagg import check_secure_aggregation
    from fedlearn_edu.signals.validation_gradients import validation_gradient_norms

    case = data.draw(st.sampled_from(["alie_z", "secure", "pld", "val_data", "engine"]), label="case")
    if case == "alie_z":  # (0, 0), (1, 0), (2, 0): ZeroDivisionError or statistics' domain error before
        n = data.draw(st.integers(0, 2), label="n")
        refused_naming(lambda: alie_z(n, 0), "n", ValueError)
    elif case == "secure":
        refused_naming(lambda: check_secure_aggregation(data.draw(NOT_STRATEGIES, label="strategy")), "strategy")
    elif case == "pld":
        pytest.importorskip("dp_accounting")
        from fedlearn_edu.privacy import epsilon

        # petabytes before (a quick MemoryError); a z in [1e-3, 0.1) would take gigabytes and minutes
        z = data.draw(st.sampled_from([1e-5, 1e-6, 1e-8, 1e-12]), label="noise_multiplier")
        err = refused_naming(lambda: epsilon(100, 0.1, z, 1e-5, "pld"), "noise_multiplier", ValueError)
        assert "accountant='rdp'" in str(err)
    elif case == "val_data":
        stacked = {k: v.unsqueeze(0).repeat(2, *[1] * v.dim()) for k, v in get_params(MODEL).items()}
        x, y = VAL
        kind = data.draw(st.sampled_from(["shape", "labels", "dtype"]), label="fault")
        if kind == "shape":
            shape = data.draw(st.sampled_from([(3, 3), (1, 3, 3), (5,), (2, 2, 2), (1, 2, 3)]), label="input shape")
            bad = (torch.rand(len(y), *shape), y)
        elif kind == "labels":
            bad = (x, y + data.draw(st.integers(3, 1000), label="shift"))
        else:
            bad = (x.to(torch.float64), y)
        try:
            validation_gradient_norms(MODEL, stacked, bad)
        except (TypeError, ValueError) as err:
            assert names_it(str(err), "val_data"), err
        else:
            assert kind == "dtype"  # float64 inputs are cast to the parameters' dtype
    else:
        engine = data.draw(st.sampled_from([LoopEngine(), VmapEngine()]), label="engine")
        config = LocalTraining(lr=0.1, epochs=1, batch_size=4)
        refused_naming(lambda: engine.train(MODEL, get_params(MODEL), [], config, []), "datasets", ValueError)
