"""Local training: the loop engine against torch.optim.SGD, the vmap engine against the loop, and the vmap
engine's batched MLP path."""

import gc
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fedlearn_edu.engine as engine
from fedlearn_edu.engine import (
    LocalTraining,
    LoopEngine,
    VmapEngine,
    batch_loss,
    client_batches,
    make_engine,
    stacked_grads,
    vmap_unsupported_reason,
)
from fedlearn_edu.models import MLP, MODELS, make_model
from fedlearn_edu.params import get_params, unstack_params
from fedlearn_edu.utils import tune_cpu_allocator
from tests.tiny import poison, tiny_federation, tiny_model


def _datasets(sizes, shape=(1, 8, 8), seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return [(torch.rand(n, *shape, generator=g, dtype=dtype), torch.randint(0, 10, (n,), generator=g)) for n in sizes]


def test_client_batches_cover_every_sample_once_per_epoch():
    batches = client_batches(23, 3, 5, seed=7)
    assert len(batches) == 3 * 5
    for e in range(3):
        epoch = torch.cat(batches[5 * e : 5 * e + 5])
        assert sorted(epoch.tolist()) == list(range(23))
    assert [len(b) for b in batches[:5]] == [5, 5, 5, 5, 3]
    assert all(torch.equal(a, b) for a, b in zip(batches, client_batches(23, 3, 5, seed=7)))
    with pytest.raises(ValueError, match="no training samples"):
        client_batches(0, 1, 5, seed=0)


@pytest.mark.parametrize(
    "cfg",
    [
        LocalTraining(epochs=2, batch_size=4, lr=0.1),
        LocalTraining(epochs=1, batch_size=3, lr=0.05, momentum=0.9, weight_decay=0.01, prox_mu=0.5),
    ],
)
def test_loop_engine_matches_torch_optim_sgd(cfg):
    """An independent computation: nn.Module + torch.optim.SGD + the proximal term by hand."""
    model = make_model("mlp", (1, 8, 8), 10, hidden=(16,)).double()
    ((x, y),) = _datasets([11])
    result = LoopEngine().train(model, get_params(model), [(x, y)], cfg, [5])

    ref = make_model("mlp", (1, 8, 8), 10, hidden=(16,)).double()
    ref.load_state_dict(model.state_dict())
    anchor = [p.detach().clone() for p in ref.parameters()]
    opt = torch.optim.SGD(ref.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    losses = []
    for idx in client_batches(11, cfg.epochs, cfg.batch_size, 5):
        opt.zero_grad()
        ce = F.cross_entropy(ref(x[idx]), y[idx])
        prox = sum(((p - a) ** 2).sum() for p, a in zip(ref.parameters(), anchor))
        (ce + 0.5 * cfg.prox_mu * prox).backward()
        opt.step()
        losses.append(ce.item())
    trained = unstack_params(result.params)[0]
    for name, p in ref.named_parameters():
        torch.testing.assert_close(trained[name], p.detach(), rtol=1e-10, atol=1e-12)
    assert result.num_steps.tolist() == [len(losses)]
    assert abs(result.train_loss.item() - np.mean(losses)) < 1e-10


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("prox_mu", [0.0, 0.3])
def test_vmap_engine_equals_loop_engine(name, prox_mu):
    model = make_model(name, (1, 8, 8), 10, seed=3).double()
    params = get_params(model)
    sizes = [1, 4, 9, 31, 13]  # very unequal: 1 to 4 steps per epoch, ragged last batches
    data = _datasets(sizes)
    cfg = LocalTraining(epochs=2, batch_size=8, lr=0.05, momentum=0.5, prox_mu=prox_mu)
    seeds = [11, 12, 13, 14, 15]
    a = LoopEngine().train(model, params, data, cfg, seeds)
    b = VmapEngine().train(model, params, data, cfg, seeds)
    for k in params:
        torch.testing.assert_close(b.params[k], a.params[k], rtol=1e-9, atol=1e-11)
    torch.testing.assert_close(b.train_loss, a.train_loss, rtol=1e-9, atol=1e-11)
    assert b.num_steps.tolist() == a.num_steps.tolist() == [2, 2, 4, 8, 4]


def test_vmap_engine_chunks_give_the_same_result():
    model = make_model("mlp", (1, 8, 8), 10, hidden=(8,)).double()
    params = get_params(model)
    data = _datasets([5, 17, 3, 8, 12, 2, 9])
    cfg = LocalTraining(batch_size=4)
    whole = VmapEngine().train(model, params, data, cfg, list(range(7)))
    tiny = VmapEngine(memory_budget=1)  # forces one client per chunk
    assert tiny.chunk_size(model, data[0][0], 4) == 1
    chunked = tiny.train(model, params, data, cfg, list(range(7)))
    for k in params:
        torch.testing.assert_close(chunked.params[k], whole.params[k], rtol=1e-12, atol=1e-12)


def test_padding_does_not_dilute_a_small_clients_gradient():
    """A client with 1 sample in a batch-10 world takes the full-size step on that sample."""
    model = make_model("mlp", (1, 8, 8), 10, hidden=(8,)).double()
    params = get_params(model)
    data = _datasets([1, 10])
    cfg = LocalTraining(batch_size=10, lr=0.5)
    b = VmapEngine().train(model, params, data, cfg, [0, 1])
    single = LoopEngine().train(model, params, data[:1], cfg, [0])
    for k in params:
        torch.testing.assert_close(b.params[k][0], single.params[k][0], rtol=1e-12, atol=1e-12)
    assert not torch.allclose(b.params["out.bias"][0], params["out.bias"])


def test_auto_engine_falls_back_for_batchnorm():
    bn = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10), torch.nn.BatchNorm1d(10))
    assert "BatchNorm1d" in vmap_unsupported_reason(bn)
    with pytest.warns(UserWarning, match="loop engine because"):
        assert isinstance(make_engine("auto", bn), LoopEngine)
    assert isinstance(make_engine("auto", make_model("cnn", (1, 8, 8), 10)), VmapEngine)
    with pytest.raises(ValueError, match="cannot train"):
        VmapEngine().train(bn, get_params(bn), _datasets([3], dtype=torch.float32), LocalTraining(), [0])
    with pytest.raises(ValueError, match="Unknown engine"):
        make_engine("threads")


@pytest.mark.parametrize(
    "kwargs, msg",
    [
        ({"epochs": 0}, "epochs"),
        ({"batch_size": 0}, "batch_size"),
        ({"lr": -1.0}, "lr"),
        ({"lr": float("nan")}, "lr"),
        ({"momentum": 1.0}, "momentum"),
        ({"prox_mu": -0.1}, "prox_mu"),
    ],
)
def test_local_training_validation(kwargs, msg):
    with pytest.raises(ValueError, match=msg):
        LocalTraining(**kwargs)


def test_engines_agree_from_per_client_starting_points():
    """``start``: client j begins at its own parameters (personal / cluster models); the
    proximal centre stays ``global_params``."""
    model = make_model("mlp", (1, 8, 8), 10, hidden=(8,), seed=0).double()
    anchor = get_params(model)
    g = torch.Generator().manual_seed(1)
    start = {k: v.unsqueeze(0) + 0.1 * torch.randn(3, *v.shape, generator=g, dtype=v.dtype) for k, v in anchor.items()}
    data = _datasets([5, 12, 2])
    cfg = LocalTraining(batch_size=4, lr=0.1, prox_mu=0.5, momentum=0.3)
    a = LoopEngine().train(model, anchor, data, cfg, [0, 1, 2], start=start)
    b = VmapEngine().train(model, anchor, data, cfg, [0, 1, 2], start=start)
    single = LoopEngine().train(model, {k: v[1] for k, v in start.items()}, data[1:2], cfg.replace(prox_mu=0.0), [1])
    for k in anchor:
        torch.testing.assert_close(b.params[k], a.params[k], rtol=1e-9, atol=1e-11)
    assert not torch.allclose(a.params["out.bias"][1], single.params["out.bias"][0])  # the anchor pulls
    with pytest.raises(ValueError, match="one row per client"):
        LoopEngine().train(model, anchor, data, cfg, [0, 1, 2], start={k: v[:2] for k, v in start.items()})


@pytest.mark.parametrize("engine", [LoopEngine(), VmapEngine()])
def test_equal_starting_points_equal_training_from_the_anchor(engine):
    """``start`` with every row equal to ``global_params`` is the plain call."""
    model = make_model("mlp", (1, 8, 8), 10, hidden=(16,), seed=0)
    p = get_params(model)
    data = _datasets([25, 25, 25], dtype=torch.float32)
    cfg = LocalTraining(epochs=2, batch_size=7, lr=0.1, momentum=0.9, prox_mu=0.2)
    ref = engine.train(model, p, data, cfg, [5, 6, 7])
    got = engine.train(model, p, data, cfg, [5, 6, 7], start={k: v.expand(3, *v.shape).clone() for k, v in p.items()})
    for k in p:
        torch.testing.assert_close(got.params[k], ref.params[k])
    torch.testing.assert_close(got.train_loss, ref.train_loss)


@pytest.mark.parametrize("engine", ["loop", "vmap"])
def test_a_personal_step_from_start_matches_dittos_formula(engine):
    """Ditto's personal step: from v, one full-batch step on ``F(v) + (lam/2)||v - theta||^2`` is
    ``v - lr (grad F(v) + lam (v - theta))`` (the proximal centre is ``global_params``)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    theta = {k: v.detach().clone() for k, v in model.named_parameters()}
    v0 = {k: t + 0.3 * torch.randn_like(t) for k, t in theta.items()}
    x, y = torch.randn(6, 4), torch.tensor([0, 1, 2, 0, 1, 2])
    lr, lam = 0.2, 0.7
    cfg = LocalTraining(epochs=1, batch_size=6, lr=lr, prox_mu=lam)  # one full-batch step
    out = make_engine(engine).train(model, theta, [(x, y)], cfg, [0], start={k: v.unsqueeze(0) for k, v in v0.items()})
    w = {k: t.clone().requires_grad_(True) for k, t in v0.items()}
    loss = F.cross_entropy(x @ w["weight"].T + w["bias"], y)
    grads = dict(zip(w, torch.autograd.grad(loss, list(w.values()))))
    for k in theta:
        expected = v0[k] - lr * (grads[k] + lam * (v0[k] - theta[k]))
        torch.testing.assert_close(out.params[k][0], expected)


@pytest.mark.parametrize("name", ["mlp", "smallcnn"])
@pytest.mark.parametrize("prox_mu", [0.0, 0.7])
def test_stacked_grads_are_each_clients_own_gradient(name, prox_mu):
    """One backward pass of the summed objective = k separate gradients (torch.func.grad on the
    real samples only, each client at its own parameters)."""
    model = make_model(name, (1, 8, 8), 10, seed=0).double()
    anchor = get_params(model)
    g = torch.Generator().manual_seed(5)
    k, b = 4, 6
    params = {
        n: v.unsqueeze(0) + 0.05 * torch.randn(k, *v.shape, generator=g, dtype=v.dtype) for n, v in anchor.items()
    }
    x = torch.rand(k, b, 1, 8, 8, generator=g, dtype=torch.float64)
    y = torch.randint(0, 10, (k, b), generator=g)
    real = torch.tensor([6, 1, 3, 0])  # the last client's batch is all padding
    mask = (torch.arange(b).unsqueeze(0) < real.unsqueeze(1)).double()
    grads, ce = stacked_grads(model, params, x, y, mask, anchor, prox_mu)
    for j in range(k):
        pj = {n: v[j] for n, v in params.items()}
        n = int(real[j])
        if n:
            want, (_, ce_j) = torch.func.grad_and_value(batch_loss, has_aux=True)(
                pj, model, x[j, :n], y[j, :n], anchor, prox_mu
            )
            torch.testing.assert_close(ce[j], ce_j, rtol=1e-12, atol=1e-12)
        else:  # only the proximal pull is left
            want = {n_: prox_mu * (v - anchor[n_]) for n_, v in pj.items()}
            assert ce[j] == 0
        for n_ in params:
            torch.testing.assert_close(grads[n_][j], want[n_], rtol=1e-10, atol=1e-12)


def test_vmap_engine_sorts_and_chunks_unequal_clients_like_the_loop():
    """Clients arrive in increasing size and are chunked two at a time, from per-client starting
    points: the sort by step count and its inverse must put every result back in its row."""
    model = make_model("mlp", (1, 8, 8), 10, hidden=(8,), seed=0).double()
    anchor = get_params(model)
    g = torch.Generator().manual_seed(2)
    sizes = [1, 3, 3, 8, 20, 41, 2]
    start = {
        k: v.unsqueeze(0) + 0.1 * torch.randn(len(sizes), *v.shape, generator=g, dtype=v.dtype)
        for k, v in anchor.items()
    }
    data = _datasets(sizes, seed=4)
    cfg = LocalTraining(epochs=2, batch_size=4, lr=0.1, momentum=0.9, weight_decay=1e-3, prox_mu=0.2)
    seeds = [7, 3, 9, 1, 4, 4, 0]
    before = {k: v.clone() for k, v in {**start, **{"anchor." + k: v for k, v in anchor.items()}}.items()}
    a = LoopEngine().train(model, anchor, data, cfg, seeds, start=start)
    b = VmapEngine(max_chunk=2).train(model, anchor, data, cfg, seeds, start=start)
    assert b.num_steps.tolist() == a.num_steps.tolist() == [2, 2, 2, 4, 10, 22, 2]
    torch.testing.assert_close(b.train_loss, a.train_loss, rtol=1e-9, atol=1e-11)
    for k in anchor:
        torch.testing.assert_close(b.params[k], a.params[k], rtol=1e-9, atol=1e-11)
    after = {**start, **{"anchor." + k: v for k, v in anchor.items()}}
    assert all(torch.equal(after[k], v) for k, v in before.items())  # the caller's tensors are untouched


def test_vmap_engine_rejects_a_client_without_samples():
    model = make_model("mlp", (1, 8, 8), 10, hidden=(8,)).double()
    data = _datasets([4, 0, 3])
    with pytest.raises(ValueError, match="no training samples"):
        VmapEngine().train(model, get_params(model), data, LocalTraining(batch_size=2), [0, 1, 2])


def test_tune_cpu_allocator_is_applied_once_and_says_so():
    import platform
    import sys

    first = tune_cpu_allocator()
    assert tune_cpu_allocator() is first
    expected = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"
    assert first is expected
    with pytest.raises(ValueError, match="trim_threshold"):
        tune_cpu_allocator(trim_threshold=-1)
    with pytest.raises(ValueError, match="mmap_threshold"):
        tune_cpu_allocator(mmap_threshold=2**40)


def test_tuned_allocator_reuses_a_large_freed_block_without_page_faults():
    """A 128 MiB tensor (above glibc's 32 MiB mmap ceiling) freed and allocated again: with the
    heap-only setting the second one reuses the freed memory (no fresh page for each 4 KiB);
    glibc's default maps it afresh, 32,768 page faults. Measured in a fresh process: in a long
    test session the heap's earlier history decides where a freed block lands."""
    import subprocess
    import sys

    code = """
import resource, sys, torch
from fedlearn_edu.utils import tune_cpu_allocator
if not tune_cpu_allocator():
    print("unsupported"); sys.exit(0)
n = 32 * 2**20  # float32 entries: 128 MiB
a, b = torch.ones(n), torch.ones(n)  # two: an aligned block asks a little more than its size
del a, b
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
again = torch.ones(n)
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
assert float(again[-1]) == 1.0
print(faults)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    if out.stdout.strip() == "unsupported":
        pytest.skip("the allocator setting needs Linux with glibc")
    n = 32 * 2**20
    assert int(out.stdout.strip()) < n * 4 // 4096 // 10, out.stdout


@pytest.mark.parametrize("trim_padding", [False, True])
@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_vmap_engine_equals_loop_with_very_unequal_clients(name, trim_padding):
    """Clients of 1 to 120 samples (1 to 24 steps an epoch, ragged last batches, several clients of
    one size): every row back in its place, each client its own steps, with or without trimming."""
    model = make_model(name, (1, 8, 8), 10, seed=1).double()
    params = get_params(model)
    sizes = [120, 1, 2, 5, 5, 37, 3, 64, 1, 11]
    data = _datasets(sizes, seed=5)
    cfg = LocalTraining(epochs=2, batch_size=5, lr=0.05, momentum=0.3, prox_mu=0.1)
    seeds = list(range(20, 30))
    a = LoopEngine().train(model, params, data, cfg, seeds)
    b = VmapEngine(trim_padding=trim_padding).train(model, params, data, cfg, seeds)
    assert b.num_steps.tolist() == a.num_steps.tolist() == [2 * -(-n // 5) for n in sizes]
    torch.testing.assert_close(b.train_loss, a.train_loss, rtol=1e-9, atol=1e-11)
    for k in params:
        torch.testing.assert_close(b.params[k], a.params[k], rtol=1e-9, atol=1e-11)


def test_trim_padding_computes_only_the_real_samples_of_equal_clients(monkeypatch):
    """14 samples a client, batch 10: steps of 10 and 4 real samples. Untrimmed, the second step is
    padded to 10 wide (30 % of the slots); trimmed, every slot computed is a real sample."""
    import fedlearn_edu.engine as engine_module

    model = make_model("mlp", (1, 8, 8), 10, hidden=(8,), seed=0).double()
    params = get_params(model)
    data = _datasets([14] * 6, seed=1)
    cfg = LocalTraining(batch_size=10)
    widths = []
    real = engine_module.stacked_grads

    def counting(model_, live, x, y, mask, *args):
        widths.append((tuple(y.shape), int(mask.sum())))
        return real(model_, live, x, y, mask, *args)

    monkeypatch.setattr(engine_module, "stacked_grads", counting)
    full = VmapEngine().train(model, params, data, cfg, list(range(6)))
    assert widths == [((6, 10), 60), ((6, 10), 24)]
    widths.clear()
    trimmed = VmapEngine(trim_padding=True).train(model, params, data, cfg, list(range(6)))
    assert widths == [((6, 10), 60), ((6, 4), 24)]
    for k in params:
        torch.testing.assert_close(trimmed.params[k], full.params[k], rtol=1e-12, atol=1e-14)
    with pytest.raises(TypeError, match="trim_padding"):
        VmapEngine(trim_padding="yes")


def finite_rows(params: dict, m: int) -> list[bool]:
    return torch.stack([torch.isfinite(v.reshape(m, -1)).all(1) for v in params.values()]).all(0).tolist()


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
    for engine in (LoopEngine(), VmapEngine()):  # noqa: F402 (shadows the engine module here only)
        result = engine.train(model, params, datasets, config, [11, 12, 13, 14])
        assert finite_rows(result.params, 4) == expected, engine.name


def test_padded_schedule_pads_with_the_clients_own_samples():
    from fedlearn_edu.engine import _padded_schedule

    sizes = [5, 3, 8]
    index, mask, steps = _padded_schedule(sizes, 2, 4, [1, 2, 3])
    offsets = np.cumsum([0, *sizes[:-1]])
    for j, n in enumerate(sizes):
        own = (index[j] >= offsets[j]) & (index[j] < offsets[j] + n)
        assert bool(own.all()), f"client {j} reads outside its own samples"
    assert int(mask.sum()) == 2 * sum(sizes)


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


# The vmap engine's batched MLP path: bitwise the numbers of vmap over functional_call.


@pytest.fixture
def generic(monkeypatch):
    """Runs its argument with the batched MLP path switched off (vmap over functional_call)."""

    def call(fn, *args, **kwargs):
        with monkeypatch.context() as m:
            m.setattr(engine, "_is_plain_mlp", lambda model, params: False)
            return fn(*args, **kwargs)

    return call


def _stacked(model, m, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {k: v + 0.01 * torch.randn((m, *v.shape), generator=g, dtype=v.dtype) for k, v in get_params(model).items()}


def _batch(m, b, shape, dtype, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(m, b, *shape, generator=g, dtype=dtype)
    y = torch.randint(0, 10, (m, b), generator=g)
    mask = torch.ones(m, b, dtype=dtype)
    mask[0, b // 2 :] = 0  # a short batch
    return x, y, mask


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("hidden", [(200, 200), (64,), (16, 8)])
@pytest.mark.parametrize("m,b", [(1, 1), (5, 4), (7, 10), (3, 32)])
def test_stacked_grads_bitwise_as_vmap(generic, dtype, hidden, m, b):
    model = make_model("mlp", (1, 8, 8), 10, hidden=hidden).to(dtype)
    assert engine._is_plain_mlp(model, get_params(model))
    params = _stacked(model, m)
    x, y, mask = _batch(m, b, (1, 8, 8), dtype)
    anchor = {k: v[0] for k, v in params.items()}
    linear = {k: 0.1 * torch.ones_like(v) for k, v in params.items()}
    for mu, lin in [(0.0, None), (0.3, linear)]:
        fast = stacked_grads(model, params, x, y, mask, anchor, mu, lin)
        slow = generic(stacked_grads, model, params, x, y, mask, anchor, mu, lin)
        assert torch.equal(fast[1], slow[1])
        assert fast[0].keys() == slow[0].keys()
        for k in slow[0]:
            assert torch.equal(fast[0][k], slow[0][k]), k


def test_weight_gradients_come_in_the_weights_layout():
    """The point of the path: float32 weight gradients of layers with >= 16 outputs are contiguous."""
    model = make_model("mlp", (1, 8, 8), 10, hidden=(200, 64))
    params = _stacked(model, 4)
    x, y, mask = _batch(4, 10, (1, 8, 8), torch.float32)
    grads, _ = stacked_grads(model, params, x, y, mask, {k: v[0] for k, v in params.items()}, 0.0)
    assert grads["hidden.0.weight"].is_contiguous() and grads["hidden.1.weight"].is_contiguous()
    assert grads["out.weight"].shape == (4, 10, 64)  # 10 outputs: autograd's product, transposed view


def test_stacked_linear_gradients_are_the_derivatives():
    """gradcheck: the analytic gradients against finite differences (float64)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4, 5, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, 20, 5, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, 20, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(engine._StackedLinear.apply, (x, w, b))
    assert torch.autograd.gradcheck(engine._StackedLinear.apply, (x, w, None))
    ref = torch.stack([x[j] @ w[j].T + b[j] for j in range(3)])
    assert torch.allclose(engine._StackedLinear.apply(x, w, b), ref)


@pytest.mark.parametrize("trim", [False, True])
@pytest.mark.parametrize(
    "cfg",
    [
        LocalTraining(epochs=2, batch_size=10, lr=0.05),
        LocalTraining(epochs=1, batch_size=4, lr=0.1, momentum=0.9, weight_decay=0.01, prox_mu=0.5),
    ],
)
def test_vmap_engine_bitwise_with_and_without_the_path(generic, cfg, trim):
    model = make_model("mlp", (1, 8, 8), 10, hidden=(32, 16))
    g = torch.Generator().manual_seed(3)
    sizes = [23, 5, 14, 31, 9]
    data = [(torch.rand(n, 1, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g)) for n in sizes]
    theta = get_params(model)
    linear = {k: 0.01 * torch.randn((len(sizes), *v.shape), generator=g) for k, v in theta.items()}
    eng = VmapEngine(trim_padding=trim)
    fast = eng.train(model, theta, data, cfg, list(range(5)), linear=linear)
    slow = generic(eng.train, model, theta, data, cfg, list(range(5)), linear=linear)
    assert torch.equal(fast.train_loss, slow.train_loss)
    assert all(torch.equal(fast.params[k], slow.params[k]) for k in theta)
    loop = LoopEngine().train(model, theta, data, cfg, list(range(5)), linear=linear)
    assert all(torch.allclose(fast.params[k], loop.params[k], atol=1e-5) for k in theta)


class _MLPChild(MLP):
    pass


def test_other_models_take_the_generic_path():
    mlp = make_model("mlp", (1, 8, 8), 10, hidden=(16,))
    params = get_params(mlp)
    assert engine._is_plain_mlp(mlp, params)
    assert not engine._is_plain_mlp(make_model("cnn", (1, 8, 8), 10), get_params(make_model("cnn", (1, 8, 8), 10)))
    assert not engine._is_plain_mlp(mlp, {k: v for k, v in params.items() if k != "out.bias"})  # a subset
    assert not engine._is_plain_mlp(mlp, {k: v.to("meta") for k, v in params.items()})  # CPU only
    assert not engine._is_plain_mlp(_MLPChild((1, 8, 8), 10, hidden=(16,)), params)
    swapped = make_model("mlp", (1, 8, 8), 10, hidden=(16,))
    swapped.hidden[0] = nn.Sequential(nn.Linear(64, 16))
    assert not engine._is_plain_mlp(swapped, get_params(swapped))
    hooked = make_model("mlp", (1, 8, 8), 10, hidden=(16,))
    handle = hooked.out.register_forward_hook(lambda mod, inp, out: out * 2)
    assert not engine._is_plain_mlp(hooked, params)
    # the hook is honoured: the generic path runs it
    p = _stacked(hooked, 2)
    x, y, mask = _batch(2, 3, (1, 8, 8), torch.float32)
    anchor = {k: v[0] for k, v in p.items()}
    _, ce_hooked = stacked_grads(hooked, p, x, y, mask, anchor, 0.0)
    handle.remove()
    _, ce_plain = stacked_grads(hooked, p, x, y, mask, anchor, 0.0)
    assert not torch.equal(ce_hooked, ce_plain)
