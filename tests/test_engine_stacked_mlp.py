"""The vmap engine's batched MLP path: bitwise the numbers of vmap over functional_call."""

import pytest
import torch
from torch import nn

import fedlearn_edu.engine as engine
from fedlearn_edu.engine import LocalTraining, LoopEngine, VmapEngine, stacked_grads
from fedlearn_edu.models import MLP, make_model
from fedlearn_edu.params import get_params


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
