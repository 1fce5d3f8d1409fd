"""The local-objective terms SCAFFOLD and FedDyn are built from: gradients, vmap over a client axis, bad input."""

import pytest
import torch
from torch.func import grad, vmap

from fedlearn_edu.local_objectives import linear_term, proximal_term
from fedlearn_edu.params import stack_params


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
