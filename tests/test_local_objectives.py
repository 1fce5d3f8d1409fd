"""The local-objective terms SCAFFOLD and FedDyn are built from: gradients, vmap over a client axis, bad input;
the engines' linear-term hook (both engines, uneven clients)."""

import pytest
import torch
import torch.nn.functional as F
from torch.func import grad, vmap

from fedlearn_edu.engine import LocalTraining, LoopEngine, VmapEngine
from fedlearn_edu.local_objectives import linear_term, proximal_term
from fedlearn_edu.params import get_params, stack_params
from tests.test_simulation import _model


def scaffold_correction(p, ci, c):
    """SCAFFOLD's local term ``<c - c_i, y>``, as the strategy builds it."""
    return linear_term(p, {k: c[k] - ci[k] for k in p})


def feddyn_regulariser(p, phi, anchor, alpha):
    """FedDyn's local term ``-<phi_k, theta> + (alpha/2) ||theta - anchor||^2``."""
    return proximal_term(p, anchor, alpha) - linear_term(p, phi)


def _params(seed, shapes=(("w", (3, 2)), ("b", (2,)))):
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(*s, generator=g, dtype=torch.float64) for k, s in shapes}


def test_scaffold_term_turns_the_gradient_into_the_corrected_one():
    y, ci, c = _params(0), _params(1), _params(2)
    g = grad(lambda p: scaffold_correction(p, ci, c))(y)
    for k in y:
        torch.testing.assert_close(g[k], c[k] - ci[k])


def test_terms_match_numpy_values():
    p, v, a = _params(0), _params(1), _params(2)
    flat = {k: torch.cat([t[k].reshape(-1) for k in t]).numpy() for k, t in (("p", p), ("v", v), ("a", a))}
    assert float(linear_term(p, v)) == pytest.approx(float(flat["p"] @ flat["v"]), rel=1e-12)
    assert float(proximal_term(p, a, 0.3)) == pytest.approx(0.15 * float(((flat["p"] - flat["a"]) ** 2).sum()))
    ref = 0.5 * 2.0 * float(((flat["p"] - flat["a"]) ** 2).sum()) - float(flat["p"] @ flat["v"])
    assert float(feddyn_regulariser(p, v, a, 2.0)) == pytest.approx(ref, rel=1e-12)


def test_vmap_over_stacked_clients_equals_the_loop():
    m = 4
    ys = [_params(i) for i in range(m)]
    cis = [_params(10 + i) for i in range(m)]
    c = _params(99)
    anchor = _params(98)
    Y, CI = stack_params(ys), stack_params(cis)
    batched = vmap(grad(lambda p, ci: scaffold_correction(p, ci, c) + feddyn_regulariser(p, ci, anchor, 0.5)))(Y, CI)
    for i in range(m):
        one = grad(lambda p, i=i: scaffold_correction(p, cis[i], c) + feddyn_regulariser(p, cis[i], anchor, 0.5))(ys[i])
        for k in one:
            torch.testing.assert_close(batched[k][i], one[k])


def test_mismatched_keys_are_rejected():
    p = _params(0)
    with pytest.raises(ValueError, match="anchor"):
        proximal_term(p, {"x": torch.zeros(1)}, 1.0)
    with pytest.raises(ValueError, match="vector"):
        linear_term(p, torch.zeros(3))


# ------------------------------------------------------------ local-objective hook
def test_linear_term_follows_its_formula_in_both_engines():
    """One full-batch step on CE + (mu/2)||w - anchor||^2 + <c_j, w>: w - lr (grad CE + mu (w - a) + c_j)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    theta = get_params(model)
    x, y = torch.randn(6, 4), torch.tensor([0, 1, 2, 0, 1, 2])
    start = stack_params([{k: v + 0.2 * torch.randn_like(v) for k, v in theta.items()} for _ in range(2)])
    linear = {k: torch.randn(2, *v.shape) for k, v in theta.items()}
    cfg = LocalTraining(epochs=1, batch_size=6, lr=0.3, prox_mu=0.4)
    for engine in (LoopEngine(), VmapEngine()):
        out = engine.train(model, theta, [(x, y)] * 2, cfg, [0, 1], start=start, linear=linear)
        for j in range(2):
            w = {k: v[j].clone().requires_grad_(True) for k, v in start.items()}
            ce = F.cross_entropy(x @ w["weight"].T + w["bias"], y)
            grads = dict(zip(w, torch.autograd.grad(ce, list(w.values()))))
            for k in theta:
                want = start[k][j] - 0.3 * (grads[k] + 0.4 * (start[k][j] - theta[k]) + linear[k][j])
                torch.testing.assert_close(out.params[k][j], want)


def test_loop_and_vmap_agree_with_linear_terms_over_uneven_clients(fed):
    model = _model(fed)
    theta = get_params(model)
    ds = [(c.train_x[: 10 + 7 * i], c.train_y[: 10 + 7 * i]) for i, c in enumerate(fed)][:4]
    g = torch.Generator().manual_seed(0)
    linear = {k: 0.01 * torch.randn(4, *v.shape, generator=g) for k, v in theta.items()}
    cfg = LocalTraining(epochs=2, batch_size=8, lr=0.1, momentum=0.5, prox_mu=0.1)
    a = LoopEngine().train(model, theta, ds, cfg, [3, 4, 5, 6], linear=linear)
    b = VmapEngine(max_chunk=3).train(model, theta, ds, cfg, [3, 4, 5, 6], linear=linear)
    plain = LoopEngine().train(model, theta, ds, cfg, [3, 4, 5, 6])
    for k in theta:
        torch.testing.assert_close(a.params[k], b.params[k], rtol=1e-5, atol=1e-6)
    assert not torch.allclose(a.params["out.bias"], plain.params["out.bias"])
    with pytest.raises(ValueError, match="linear must be stacked"):
        LoopEngine().train(model, theta, ds, cfg, [3, 4, 5, 6], linear={k: v[:2] for k, v in linear.items()})
