"""Hardening (issue 16): one bad client never poisons another, no silent garbage, no hangs,
no code run from a data folder, clear errors naming the cause."""

from __future__ import annotations

import gc
import math
import os
import pickle
import re
import threading

import numpy as np
import pytest
import torch
from torch import nn

from fedlearn_edu import FedAvg, FedOUI, FedVG, History, fairness_metrics, make_model, simulate
from fedlearn_edu.aggregators import (
    config_direction,
    count_conflicts,
    craft_direction,
    fedavg,
    fedfv_kept,
    fedvg_layerwise_weights,
    fedvg_weights,
    pinv_solve,
    qfedavg_step,
)
from fedlearn_edu.conditional import compare_methods, make_conditional_model
from fedlearn_edu.data import (
    ClientData,
    Federation,
    concept_permutations,
    load_dataset,
    make_federation,
    quantity_skew_partition,
    shifted_federation,
)
from fedlearn_edu.engine import LocalTraining, LoopEngine, VmapEngine
from fedlearn_edu.simulation import evaluate_clients
from fedlearn_edu.strategies.base import Strategy


# --------------------------------------------------------------------------- #
# helpers
# --------------------------------------------------------------------------- #
def tiny_federation(sizes=(50, 27, 23, 20), num_classes=3, shape=(1, 4, 4), seed=0) -> Federation:
    g = torch.Generator().manual_seed(seed)
    n = sum(sizes)
    x = torch.rand(n, *shape, generator=g)
    y = torch.arange(n) % num_classes
    cuts = np.cumsum((0, *sizes))
    parts = [np.arange(a, b) for a, b in zip(cuts[:-1], cuts[1:])]
    return make_federation(x, y, parts, test_fraction=0.2, seed=seed, name="tiny")


def poison(fed: Federation, client: int, value: float) -> Federation:
    """A copy of ``fed`` whose client ``client`` has every training input set to ``value``."""
    clients = [ClientData(c.train_x.clone(), c.train_y, c.test_x, c.test_y, dict(c.info)) for c in fed]
    clients[client].train_x[:] = value  # in place, after construction: ClientData refuses NaN/Inf inputs
    return Federation(clients, fed.num_classes, fed.name)


def tiny_model(fed: Federation, seed: int = 0) -> nn.Module:
    return make_model("mlp", fed.input_shape, fed.num_classes, hidden=(8,), seed=seed)


def finite_rows(params: dict, m: int) -> list[bool]:
    return torch.stack([torch.isfinite(v.reshape(m, -1)).all(1) for v in params.values()]).all(0).tolist()


# --------------------------------------------------------------------------- #
# Serious: one client's NaN/Inf never reaches another client
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("bad_value", [math.nan, math.inf], ids=["nan", "inf"])
def test_vmap_padding_never_reads_another_clients_data(bad_value):
    """The largest client (first in the vmap chunk, whose first sample padding used to read)
    holds NaN/Inf: only its own row diverges, in both engines."""
    fed = tiny_federation(sizes=(23, 27, 50, 20))  # client 2 is the largest
    bad = 2
    fed = poison(fed, bad, bad_value)
    model = tiny_model(fed)
    params = {k: v.detach() for k, v in model.named_parameters()}
    datasets = [(c.train_x, c.train_y) for c in fed]
    config = LocalTraining(epochs=1, batch_size=7, lr=0.1)  # 7 divides no client size: padding everywhere
    expected = [i != bad for i in range(4)]
    for engine in (LoopEngine(), VmapEngine()):
        result = engine.train(model, params, datasets, config, [11, 12, 13, 14])
        assert finite_rows(result.params, 4) == expected, engine.name


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


def test_padded_schedule_pads_with_the_clients_own_samples():
    from fedlearn_edu.engine import _padded_schedule

    sizes = [5, 3, 8]
    index, mask, steps = _padded_schedule(sizes, 2, 4, [1, 2, 3])
    offsets = np.cumsum([0, *sizes[:-1]])
    for j, n in enumerate(sizes):
        own = (index[j] >= offsets[j]) & (index[j] < offsets[j] + n)
        assert bool(own.all()), f"client {j} reads outside its own samples"
    assert int(mask.sum()) == 2 * sum(sizes)


# --------------------------------------------------------------------------- #
# Serious: no code run from a data folder
# --------------------------------------------------------------------------- #
class _Exploit:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _write_malicious_cifar(folder, marker):
    folder.mkdir(parents=True)
    for f in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        with open(folder / f, "wb") as fh:
            pickle.dump({"data": _Exploit(marker), "labels": [0]}, fh, protocol=2)


def test_cifar_in_the_working_directory_is_never_unpickled(tmp_path, monkeypatch):
    monkeypatch.delenv("FEDLEARN_DATA", raising=False)
    monkeypatch.chdir(tmp_path)
    marker = tmp_path / "pwned"
    _write_malicious_cifar(tmp_path / "data" / "cifar-10-batches-py", marker)
    with pytest.raises(FileNotFoundError, match="cifar10"):
        load_dataset("cifar10")
    assert not marker.exists()


def test_a_crafted_cifar_batch_in_a_named_folder_raises_instead_of_running_code(tmp_path):
    marker = tmp_path / "pwned"
    _write_malicious_cifar(tmp_path / "root" / "cifar-10-batches-py", marker)
    with pytest.raises(ValueError, match="refusing to load posix.system|refusing to load"):
        load_dataset("cifar10", root=tmp_path / "root")
    assert not marker.exists()


def test_cifar_is_searched_only_where_the_user_points(tmp_path, monkeypatch):
    from fedlearn_edu.data import sources as src_mod

    monkeypatch.setenv("FEDLEARN_DATA", str(tmp_path / "env"))
    dirs = src_mod.search_dirs("cifar10", tmp_path / "root")
    assert all(str(d).startswith((str(tmp_path / "root"), str(tmp_path / "env"))) for d in dirs)


def test_library_knows_no_shared_folder_beside_the_repository():
    import fedlearn_edu.data as data_pkg

    folder = os.path.dirname(data_pkg.__file__)
    for name in os.listdir(folder):
        if name.endswith(".py"):
            with open(os.path.join(folder, name)) as fh:
                text = fh.read()
                assert '"shared"' not in text and "/shared/" not in text and "SHARED" not in text, name


# --------------------------------------------------------------------------- #
# Serious: two hangs
# --------------------------------------------------------------------------- #
def _returns_within(fn, seconds=20.0):
    out = {}

    def run():
        try:
            out["value"] = fn()
        except Exception as err:  # noqa: BLE001 - the test inspects it
            out["error"] = err

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), "hangs"
    return out


def test_concept_permutations_raises_at_once_when_too_few_exist():
    out = _returns_within(lambda: concept_permutations(3, 4))
    assert isinstance(out.get("error"), ValueError) and "only 2 exist" in str(out["error"])
    assert len(concept_permutations(3, 3)) == 3  # identity + both derangements of 3 classes


def test_shifted_federation_concept_on_two_classes_raises_at_once():
    x = torch.rand(200, 1, 4, 4)
    y = torch.arange(200) % 2
    out = _returns_within(lambda: shifted_federation((x, y), "concept", num_clusters=3, clients_per_cluster=2))
    assert isinstance(out.get("error"), ValueError) and "only 1 exist" in str(out["error"])


# --------------------------------------------------------------------------- #
# Silent garbage
# --------------------------------------------------------------------------- #
def test_fedavg_refuses_integer_updates():
    with pytest.raises(TypeError, match="deltas.*floating"):
        fedavg(torch.tensor([[1, 2], [3, 4]]), torch.tensor([1.0, 1.0]))


def test_fedavg_weights_near_float_max_do_not_overflow():
    big = torch.finfo(torch.float32).max / 2
    d = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    out = fedavg(d, torch.tensor([big, big, big]))
    torch.testing.assert_close(out, torch.tensor([2 / 3, 2 / 3]))


def test_quantity_skew_with_huge_sigma_keeps_min_size_and_a_partition():
    parts = quantity_skew_partition(1000, 10, sigma=1000.0, min_size=10, seed=0)
    allidx = np.concatenate(parts)
    assert min(len(p) for p in parts) >= 10
    assert np.array_equal(np.sort(allidx), np.arange(1000))


@pytest.mark.parametrize("rcond", [math.nan, -1.0, math.inf])
def test_bad_rcond_raises_instead_of_a_zero_vector(rcond):
    g = torch.randn(3, 5, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="rcond"):
        craft_direction(g, torch.ones(3), rcond=rcond)
    with pytest.raises(ValueError, match="rcond"):
        pinv_solve(g, torch.ones(3), rcond=rcond)
    with pytest.raises(ValueError, match="rcond"):
        config_direction(g, rcond=rcond)


def test_qfedavg_with_a_large_q_is_finite_and_right():
    g = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    losses = torch.tensor([2.0, 3.0], dtype=torch.float64)
    out = qfedavg_step(g, losses, lr=0.1, q=1000.0)
    assert bool(torch.isfinite(out).all())
    # the written-out rule, in exact rational arithmetic on the ratios (F_0/F_1)^1000 ~ 1e-176
    from fractions import Fraction

    F = [Fraction(2), Fraction(3)]
    lr, q = Fraction(1, 10), 1000
    sq = [Fraction(1) / lr**2] * 2
    h = [q * f ** (q - 1) * s + f**q / lr for f, s in zip(F, sq)]
    coef = [float(f**q / lr / sum(h)) for f in F]
    torch.testing.assert_close(out, torch.tensor(coef, dtype=torch.float64))


def test_fedvg_weights_in_float16_are_finite():
    norms = torch.tensor([[0.0, 0.0], [1.0, 2.0], [3.0, 0.5]], dtype=torch.float16)
    for w in (fedvg_weights(norms), fedvg_layerwise_weights(norms)):
        assert w.dtype == torch.float16 and bool(torch.isfinite(w).all())
        torch.testing.assert_close(w.sum(0).float(), torch.ones(w.shape[1:]), atol=2e-3, rtol=0)


def test_count_conflicts_refuses_nan_in_the_update():
    d = torch.tensor([[1.0, 0.0], [-1.0, 0.0]])
    with pytest.raises(ValueError, match="update"):
        count_conflicts(d, torch.tensor([math.nan, 1.0]))


def test_fedfv_kept_refuses_nan_alpha_and_nan_losses():
    with pytest.raises(ValueError, match="alpha"):
        fedfv_kept(torch.tensor([0.1, 0.2, 0.3]), math.nan)
    with pytest.raises(ValueError, match="losses"):
        fedfv_kept(torch.tensor([0.1, math.nan, 0.3]), 0.5)


@pytest.mark.parametrize(
    "parts, match",
    [
        ([np.arange(0, 12), np.arange(8, 20)], "overlap"),
        ([np.arange(0, 10).astype(float), np.arange(10, 20)], "integer"),
    ],
    ids=["overlapping", "non-integer"],
)
def test_make_federation_refuses_bad_partitions(parts, match):
    x, y = torch.rand(20, 1, 4, 4), torch.arange(20) % 2
    with pytest.raises((ValueError, TypeError), match=match):
        make_federation(x, y, parts)


def test_make_federation_refuses_bad_labels_and_inputs():
    parts = [np.arange(0, 10), np.arange(10, 20)]
    x, y = torch.rand(20, 1, 4, 4), torch.arange(20) % 2
    with pytest.raises(ValueError, match="integer"):
        make_federation(x, y.double() + 0.5, parts)
    with pytest.raises(ValueError, match="outside"):
        make_federation(x, y, parts, num_classes=1)
    with pytest.raises(ValueError, match=">= 0"):
        make_federation(x, y - 1, parts)
    bad = x.clone()
    bad[3, 0, 0, 0] = math.nan
    with pytest.raises(ValueError, match="NaN"):
        make_federation(bad, y, parts)
    with pytest.raises(ValueError, match="labels"):
        make_federation(x, y[:19], parts)


def test_client_data_and_federation_check_their_tensors():
    x, y = torch.rand(10, 3), torch.arange(10) % 2
    with pytest.raises(ValueError, match="one label per input"):
        ClientData(x, y[:9], x[:2], y[:2])
    with pytest.raises(TypeError, match="integer"):
        ClientData(x, y.float(), x[:2], y[:2])
    bad = x.clone()
    bad[0, 0] = math.inf
    with pytest.raises(ValueError, match="NaN or Inf"):
        ClientData(bad, y, x[:2], y[:2])
    ok = ClientData(x, y, x[:2], y[:2])
    with pytest.raises(ValueError, match="outside"):
        Federation([ok], num_classes=1)
    with pytest.raises(TypeError, match="num_classes"):
        Federation([ok], num_classes=2.5)


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


def test_make_model_refuses_fractional_counts_and_empty_layers():
    with pytest.raises(TypeError, match="num_classes"):
        make_model("mlp", (1, 8, 8), 10.7)
    with pytest.raises(ValueError, match="hidden"):
        make_model("mlp", (1, 8, 8), 10, hidden=(0,))
    with pytest.raises(TypeError, match="seed"):
        make_model("mlp", (1, 8, 8), 10, seed=1.5)
    with pytest.raises(ValueError, match="seed"):
        make_model("mlp", (1, 8, 8), 10, seed=-1)


def test_simulate_refuses_fractional_and_negative_seeds():
    fed = tiny_federation()
    for seed, err in ((1.5, TypeError), (-1, ValueError)):
        with pytest.raises(err, match="seed"):
            simulate(fed, tiny_model(fed), FedAvg(), rounds=1, seed=seed, progress=False)


def test_fairness_metrics_refuses_inf_and_negative_accuracies():
    for bad in ([0.5, math.inf], [0.5, -0.1], [0.5, 1.5]):
        with pytest.raises(ValueError, match=r"\[0, 1\]"):
            fairness_metrics(bad)
    assert fairness_metrics([0.5, math.nan])["mean"] == 0.5  # NaN: a client without test data


def test_make_conditional_model_is_deterministic_and_leaves_the_global_rng_alone():
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    a = make_conditional_model("mlp", (1, 8, 8), 10, cond_dim=4, seed=0, zero_init=False)
    b = make_conditional_model("mlp", (1, 8, 8), 10, cond_dim=4, seed=0, zero_init=False)
    assert torch.equal(torch.random.get_rng_state(), before)
    for (k, va), (_, vb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(va, vb), k


def test_compare_methods_leaves_the_global_rng_alone():
    fed = shifted_federation("digits", "label", num_clusters=2, clients_per_cluster=2, samples_per_client=30, seed=0)
    torch.manual_seed(7)
    before = torch.random.get_rng_state()
    compare_methods(fed, ("fedavg", "conditional"), rounds=1, model_kwargs={"hidden": (8,)}, num_eigenvalues=4)
    assert torch.equal(torch.random.get_rng_state(), before)


# --------------------------------------------------------------------------- #
# Errors that name the real cause
# --------------------------------------------------------------------------- #
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


def test_server_lr_as_a_string_names_the_argument():
    with pytest.raises(TypeError, match="server_lr"):
        FedAvg(server_lr="1")
    with pytest.raises(ValueError, match="server_lr"):
        Strategy(server_lr=math.nan)


def test_non_tensor_inputs_to_aggregators_name_the_argument():
    with pytest.raises(TypeError, match="deltas"):
        fedavg([[1.0, 2.0]], torch.ones(1))
    with pytest.raises(TypeError, match="weights"):
        fedavg(torch.ones(1, 2), "w")
    with pytest.raises(TypeError, match="grad_norms"):
        fedvg_weights("abc")


def test_history_curve_names_the_valid_metrics():
    h = History(strategy="x", eval_rounds=[0], client_accuracy=np.array([[0.5, 0.7]]))
    with pytest.raises(ValueError, match="worst10"):
        h.curve("worst")
    assert h.curve("mean").tolist() == [0.6]


# --------------------------------------------------------------------------- #
# Global state
# --------------------------------------------------------------------------- #
def test_chunk_cache_is_keyed_by_the_model_object_not_its_id():
    fed = tiny_federation()
    engine = VmapEngine()
    datasets = [(c.train_x, c.train_y) for c in fed]
    config = LocalTraining(batch_size=5)
    model = tiny_model(fed)
    params = {k: v.detach() for k, v in model.named_parameters()}
    engine.train(model, params, datasets, config, [1, 2, 3, 4])
    assert len(engine._chunk_cache) == 1 and model in engine._chunk_cache
    del model, params
    gc.collect()
    assert len(engine._chunk_cache) == 0  # a freed model leaves nothing a new one could inherit


def test_allocator_setting_is_documented_with_its_opt_out():
    doc = simulate.__doc__
    assert "tune_cpu_allocator" in doc and "tune_allocator=False" in doc and "never reverted" in doc


# ------------------------------------------------------------- the fused finiteness checks
def test_all_finite_is_exact_when_true_and_only_a_hint_when_false():
    from fedlearn_edu.checks import all_finite

    ok = [torch.randn(3, 4), torch.randn(3), torch.zeros(0, 5)]
    assert all_finite(ok) and all_finite([])
    for bad in (float("nan"), float("inf"), -float("inf")):
        t = torch.randn(3, 4)
        t[1, 2] = bad
        assert not all_finite([*ok, t])
    both = torch.tensor([[float("inf"), -float("inf")]])  # the sum is NaN, still caught
    assert not all_finite([both])
    # finite values whose sum overflows: the fused test says "look closer" ...
    huge = torch.full((2, 3), 3e38)
    assert not all_finite([huge])
    # ... and the row-by-row test behind it accepts them, as it always did
    assert fedavg({"w": huge}, torch.tensor([1.0, 1.0]))["w"].shape == (3,)


def test_check_updates_names_the_client_after_the_fused_test_fails():
    deltas = {"a": torch.randn(4, 3), "b": torch.randn(4, 2, 2)}
    deltas["b"][2, 1, 0] = float("nan")
    with pytest.raises(ValueError, match=r"deltas\['b'\]: row 2 of the stacked updates contains NaN"):
        fedavg(deltas, torch.ones(4))


def test_simulate_skips_only_the_client_the_fused_check_sends_to_the_detail():
    """A NaN client among finite ones: the driver's fused pass fails, the per-row detail drops
    exactly that client, and the others are aggregated."""
    fed = poison(tiny_federation(sizes=(23, 27, 50, 20)), 1, math.nan)
    h = simulate(fed, tiny_model(fed), FedAvg(), rounds=2, clients_per_round=4, batch_size=7, on_nonfinite="skip",
                 engine="vmap", progress=False)  # fmt: skip
    assert [list(d) for d in h.dropped] == [[1], [1]]
    assert all(bool(torch.isfinite(v).all()) for v in h.final_params.values())
