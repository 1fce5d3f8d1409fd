"""Client-conditional FL: shift generators, the conditional model, and the baselines that keep several
models (local-only, IFCA, Ditto).

The PCA fingerprints (the signal) are tested in tests/signals/test_fingerprint.py.
"""

import numpy as np
import pytest
import torch
from sklearn.metrics import adjusted_rand_score

from fedlearn_edu import FedAvg, make_model, simulate
from fedlearn_edu.conditional import (
    ConditionalModel,
    compare_methods,
    condition_federation,
    fingerprint_federation,
    make_conditional_model,
    oracle_federation,
    pack_condition,
    parameter_overhead,
    split_condition,
)
from fedlearn_edu.data import (
    ClientData,
    Federation,
    cluster_ids,
    concept_permutations,
    label_shift_classes,
    rotate_images,
    shifted_federation,
)
from fedlearn_edu.engine import LocalTraining, LoopEngine, VmapEngine
from fedlearn_edu.params import get_params
from fedlearn_edu.personalization import simulate_ditto, simulate_ifca, simulate_local
from fedlearn_edu.signals import (
    client_fingerprints,
)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """These tests use tiny models: one intra-op thread is faster than two on a busy small CPU."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# --------------------------------------------------------------------------- #
# heterogeneity generators
# --------------------------------------------------------------------------- #
def test_shift_generators():
    lab = shifted_federation("digits", "label", num_clusters=4, clients_per_cluster=2, seed=0)
    subsets = label_shift_classes(10, 4, seed=0)
    assert sorted(sum(subsets, [])) == list(range(10))
    for c in lab:
        seen = set(torch.cat([c.train_y, c.test_y]).tolist())
        assert seen <= set(subsets[c.info["cluster"]])
    assert cluster_ids(lab).tolist() == [0, 0, 1, 1, 2, 2, 3, 3]

    cov = shifted_federation(
        "digits", "covariate", num_clusters=4, clients_per_cluster=1, samples_per_client=30, seed=0
    )
    assert [c.info["angle"] for c in cov] == [0.0, 90.0, 180.0, 270.0]
    # a client's images are quarter turns of digits: turning them back gives an original image
    from fedlearn_edu import load_dataset

    tr, te = load_dataset("digits")
    pool = torch.cat([tr.tensors[0], te.tensors[0]]).reshape(-1, 64)
    back = rotate_images(cov[1].train_x[:3], -90).reshape(3, 64)
    assert all(bool((pool == row).all(1).any()) for row in back)

    con = shifted_federation("digits", "concept", num_clusters=3, clients_per_cluster=2, samples_per_client=40, seed=1)
    perms = concept_permutations(10, 3, seed=2)
    assert [c.info["permutation"] for c in con][::2] == perms
    assert perms[0] == list(range(10)) and all(p[i] != i for p in perms[1:] for i in range(10))
    assert all(c.num_train + c.num_test == 40 for c in con)

    both = shifted_federation("digits", "label+concept", num_clusters=2, clients_per_cluster=2, seed=0)
    assert both[0].info["shift"] == "label+concept"
    for c in both:
        assert set(c.train_y.tolist()) <= set(c.info["classes"])

    with pytest.raises(ValueError, match="Unknown shift"):
        shifted_federation("digits", "style")
    with pytest.raises(ValueError, match="Not enough data"):
        shifted_federation("digits", "label", 4, 4, samples_per_client=500)


def test_rotate_images_general_angle_keeps_shape():
    x = torch.rand(2, 1, 9, 9)
    out = rotate_images(x, 45)
    assert out.shape == x.shape and not torch.allclose(out, x)
    torch.testing.assert_close(rotate_images(x, 360), x)


# --------------------------------------------------------------------------- #
# the conditional model
# --------------------------------------------------------------------------- #
def test_parameter_overhead_below_one_percent_for_cnns():
    cnn = make_conditional_model("cnn", (1, 28, 28), 10, cond_dim=32)
    assert parameter_overhead(cnn) < 0.01
    small = make_conditional_model("smallcnn", (3, 32, 32), 10, cond_dim=32)
    assert parameter_overhead(small) < 0.01
    extra = sum(p.numel() for p in cnn.parameters()) - cnn.backbone_parameters
    assert extra == 32 * 384  # only fc1 grew, by cond_dim input columns


@pytest.mark.parametrize(
    "name,shape", [("mlp", (1, 8, 8)), ("cnn", (1, 8, 8)), ("smallcnn", (1, 8, 8)), ("resnet20", (3, 8, 8))]
)
def test_conditional_model_starts_as_its_backbone_and_unpacks(name, shape):
    backbone = make_model(name, shape, 10, seed=0, **({"hidden": (16, 16)} if name == "mlp" else {}))
    model = ConditionalModel(backbone, shape, cond_dim=5, cond_scale=2.0)
    x = torch.rand(4, *shape)
    cond = torch.rand(4, 5)
    torch.testing.assert_close(model(x, cond), backbone(x))  # zero-initialised columns
    torch.testing.assert_close(model(pack_condition(x, cond[0])), model(x, cond[0].expand(4, 5)))
    torch.testing.assert_close(model(x, cond, features=True), backbone(x, features=True))
    model(x, cond).sum().backward()
    grown = dict(model.named_parameters())[f"backbone.{model.cond_layer}.weight"]
    assert grown.grad[:, -5:].abs().sum() > 0  # the condition is learned
    with pytest.raises(ValueError, match="packed inputs"):
        model(torch.rand(4, 7))
    with pytest.raises(TypeError, match="package backbones"):
        ConditionalModel(torch.nn.Linear(3, 2), (3,), 4)


def test_condition_federation_and_engines_agree_on_conditional_model():
    fed = shifted_federation("digits", "label", 2, 2, samples_per_client=30, seed=0)
    ff = fingerprint_federation(fed, num_eigenvalues=6)
    s = client_fingerprints(fed, 6).float()
    for i, c in enumerate(ff):
        assert c.train_x.shape[1] == 64 + 6 and c.info["input_shape"] == (1, 8, 8)
        x, cond = split_condition(c.test_x, (1, 8, 8), 6)
        torch.testing.assert_close(x, fed[i].test_x)
        torch.testing.assert_close(cond, s[i].expand_as(cond))  # each client: its own s_i
    orc = oracle_federation(fed)
    assert orc[3].train_x[0, -2:].tolist() == [0.0, 1.0]
    model = make_conditional_model("mlp", (1, 8, 8), 10, 6, hidden=(8,), cond_scale=3.0, zero_init=False)
    params = get_params(model)
    ds = [(c.train_x, c.train_y) for c in ff]
    cfg = LocalTraining(epochs=2, batch_size=8, lr=0.1, momentum=0.5)
    a = LoopEngine().train(model, params, ds, cfg, [1, 2, 3, 4])
    b = VmapEngine().train(model, params, ds, cfg, [1, 2, 3, 4])
    for k in params:
        torch.testing.assert_close(a.params[k], b.params[k], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="Tensor\\[N, c\\]"):
        condition_federation(fed, torch.zeros(3, 2))


# --------------------------------------------------------------------------- #
# local-only, IFCA, Ditto
# --------------------------------------------------------------------------- #
def _separated_clusters(seed=0):
    """Two clusters far apart: cluster 0 holds classes 0/1 split by x_0, cluster 1 classes 2/3 split by x_1."""
    g = torch.Generator().manual_seed(seed)
    clients = []
    for k in range(2):
        for _ in range(3):
            x = torch.randn(60, 6, generator=g)
            x[:, 2 + k] += 4.0
            y = (x[:, k] > 0).long() + 2 * k
            clients.append(ClientData(x[:48], y[:48], x[48:], y[48:], {"cluster": k}))
    return Federation(clients, 4, "two separated clusters")


@pytest.mark.parametrize("seed", [0, 1])
def test_ifca_recovers_well_separated_clusters(seed):
    # one warm-up round of random balanced assignment keeps IFCA from collapsing onto a
    # single random initial model (plain IFCA does so for seed 0)
    fed = _separated_clusters(seed)
    model = make_model("mlp", (6,), 4, hidden=(16,), seed=seed)
    h = simulate_ifca(
        fed,
        model,
        2,
        rounds=6,
        clients_per_round=6,
        lr=0.1,
        batch_size=16,
        local_epochs=2,
        progress=False,
        seed=seed,
        warmup_rounds=1,
    )
    assert adjusted_rand_score(cluster_ids(fed), h.assignments[-1]) == 1.0
    assert h.client_accuracy.shape == (7, 6) and h.metrics()["mean"] > 0.8
    assert h.cluster_params["hidden.0.weight"].shape == (2, 16, 6)
    assert [int(d["cluster_sizes"].sum()) for d in h.diagnostics] == [6] * 6


def test_local_only_with_one_client_is_fedavg_and_ditto_global_is_fedavg():
    fed = shifted_federation("digits", "label", 2, 2, samples_per_client=30, seed=0)
    kw = dict(rounds=2, clients_per_round=4, lr=0.1, batch_size=8, progress=False, seed=3)
    model = make_model("mlp", (1, 8, 8), 10, hidden=(16,))
    ref = simulate(fed, model, FedAvg(), **kw)
    ditto = simulate_ditto(fed, model, lam=0.5, **kw)
    for k in ref.final_params:
        torch.testing.assert_close(ditto.final_params[k], ref.final_params[k])
    np.testing.assert_allclose(ditto.global_client_accuracy, ref.client_accuracy)
    assert ditto.personal_params["out.weight"].shape == (4, 10, 16)

    one = Federation([fed[0]], 10)
    alone = simulate_local(one, model, **kw)
    fedavg_one = simulate(one, model, FedAvg(), **kw)
    for k in fedavg_one.final_params:
        torch.testing.assert_close(alone.personal_params[k][0], fedavg_one.final_params[k])
    np.testing.assert_allclose(alone.client_accuracy, fedavg_one.client_accuracy)


def test_ditto_global_strategy_hook_is_used():
    calls = []

    class Spy(FedAvg):
        name = "spy"

        def aggregate(self, params, updates):
            calls.append(updates.num_clients)
            return super().aggregate(params, updates)

    fed = shifted_federation("digits", "label", 2, 2, samples_per_client=20, seed=0)
    h = simulate_ditto(
        fed, make_model("mlp", (1, 8, 8), 10, hidden=(8,)), 0.1, Spy(), rounds=3, clients_per_round=3, progress=False
    )
    assert calls == [3, 3, 3] and h.strategy == "ditto+spy"
    with pytest.raises(TypeError, match="Strategy"):
        simulate_ditto(fed, make_model("mlp", (1, 8, 8), 10), 0.1, "craft")


def test_ditto_with_craft_as_its_global_aggregator():
    """Ditto + CRAFT: the global model is aggregated by CRAFT, so no selected client conflicts
    with the applied global update, and the personal models still train."""
    from fedlearn_edu import CRAFT

    fed = shifted_federation("digits", "label", 2, 3, samples_per_client=30, seed=1)
    model = make_model("mlp", (1, 8, 8), 10, hidden=(16,))
    h = simulate_ditto(
        fed, model, 0.1, CRAFT(server_lr=0.5), rounds=4, clients_per_round=4, lr=0.1, progress=False,
        diagnostics=("conflicts",),
    )  # fmt: skip
    assert h.strategy == "ditto+craft"
    assert all(d["conflicts"] == 0 for d in h.diagnostics)
    assert h.client_accuracy[-1].mean() > h.client_accuracy[0].mean()


def test_compare_methods_runs_every_method_on_the_same_footing():
    fed = shifted_federation("digits", "label", 2, 2, samples_per_client=24, seed=0)
    hs = compare_methods(
        fed, model_kwargs={"hidden": (8,)}, num_eigenvalues=4, rounds=2, lr=0.1, batch_size=8, eval_every=2
    )
    assert list(hs) == ["fedavg", "local", "ifca", "ditto", "oracle", "conditional"]
    for name, h in hs.items():
        assert h.strategy == name and h.client_accuracy.shape == (2, 4)
        assert h.eval_rounds == [0, 2]
    # at round 0 the conditional model and the oracle compute what the FedAvg model computes
    np.testing.assert_allclose(hs["conditional"].client_accuracy[0], hs["fedavg"].client_accuracy[0])
    np.testing.assert_allclose(hs["oracle"].client_accuracy[0], hs["fedavg"].client_accuracy[0])
    with pytest.raises(ValueError, match="Unknown method"):
        compare_methods(fed, ["fedprox"])


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
