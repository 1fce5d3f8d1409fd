"""The exercise checkers pass correct solutions and catch wrong ones with a useful message."""

import torch

from fedlearn_edu.exercises import (
    check_beta_moments,
    check_craft_direction,
    check_fedavg,
    check_fedvg_weights,
    check_oui,
    check_pca_fingerprint,
)


def test_check_fedavg_passes_a_correct_solution(capsys):
    def mine(deltas, weights):
        p = weights / weights.sum()
        return (p[:, None] * deltas).sum(0)

    assert check_fedavg(mine) is True
    assert "all 6 cases passed" in capsys.readouterr().out


def test_check_fedavg_reports_the_first_failing_input(capsys):
    def unnormalised(deltas, weights):  # forgets to divide by the sum of weights
        return (weights[:, None] * deltas).sum(0)

    assert check_fedavg(unnormalised) is False
    out = capsys.readouterr().out
    assert "failed" in out and "input:" in out and "expected:" in out and "received:" in out


def test_check_fedavg_reports_exceptions_and_wrong_shapes(capsys):
    def crashes(deltas, weights):
        raise RuntimeError("boom")

    assert check_fedavg(crashes) is False
    assert "raised RuntimeError: boom" in capsys.readouterr().out

    def wrong_shape(deltas, weights):
        return deltas.mean(1)

    assert check_fedavg(wrong_shape) is False
    assert "shape" in capsys.readouterr().out


def test_check_fedvg_weights(capsys):
    def right(norms):
        inv = 1.0 / (norms.sum(1) + 1e-8)
        return inv / inv.sum()

    def size_free_but_wrong(norms):  # proportional to G instead of 1/G
        g = norms.sum(1)
        return g / g.sum()

    assert check_fedvg_weights(right) is True
    assert check_fedvg_weights(size_free_but_wrong) is False
    assert "failed" in capsys.readouterr().out


def test_check_fedvg_weights_catches_a_missing_epsilon(capsys):
    def without_eps(norms):  # the classic mistake: 1 / G_k with no floor
        inv = 1.0 / norms.sum(1)
        return inv / inv.sum()

    assert check_fedvg_weights(without_eps) is False
    assert "exactly zero gradient" in capsys.readouterr().out


def test_check_oui(capsys):
    def right(z):
        b = z.shape[0]
        s = (z > 0).sum(0).double()
        return float(torch.minimum(s, b - s).mean() / (b // 2))

    def uses_b_over_two(z):  # forgets the floor for odd B
        b = z.shape[0]
        s = (z > 0).sum(0).double()
        return float(torch.minimum(s, b - s).mean() / (b / 2))

    assert check_oui(right) is True
    assert check_oui(uses_b_over_two) is False
    assert "odd batch size" in capsys.readouterr().out


def test_check_oui_catches_zeros_counted_as_active(capsys):
    def counts_zeros_as_on(z):  # the classic mistake: z >= 0 instead of z > 0
        b = z.shape[0]
        s = (z >= 0).sum(0).double()
        return float(torch.minimum(s, b - s).mean() / (b // 2))

    assert check_oui(counts_zeros_as_on) is False
    assert "exactly 0" in capsys.readouterr().out


def test_check_beta_moments(capsys):
    def right(m, v):
        c = m * (1 - m) / v - 1
        return m * c, (1 - m) * c

    def swapped(m, v):
        c = m * (1 - m) / v - 1
        return (1 - m) * c, m * c

    assert check_beta_moments(right) is True
    assert check_beta_moments(swapped) is False
    assert "expected" in capsys.readouterr().out


def test_check_pca_fingerprint(capsys):
    import numpy as np

    def right(x, y, c, l):
        a = np.hstack([x.numpy(), np.eye(c)[y.numpy()]])
        ev = np.sort(np.linalg.eigvalsh(np.cov(a, rowvar=False)))[::-1].clip(min=0)
        ev = ev / ev.sum()
        out = np.zeros(l)
        out[: min(l, ev.size)] = ev[:l]
        return torch.tensor(out)

    def population_covariance_unnormalised(x, y, c, l):  # ddof = 0 and no trace division
        a = np.hstack([x.numpy(), np.eye(c)[y.numpy()]])
        ev = np.sort(np.linalg.eigvalsh(np.cov(a, rowvar=False, ddof=0)))[::-1]
        out = np.zeros(l)
        out[: min(l, ev.size)] = ev[:l]
        return torch.tensor(out)

    assert check_pca_fingerprint(right) is True
    assert check_pca_fingerprint(population_covariance_unnormalised) is False
    assert "failed" in capsys.readouterr().out


def test_check_craft_direction(capsys):
    def right(G, rho, ref):
        U = G / G.norm(dim=1, keepdim=True)
        rho = rho / rho.sum()
        g_hat = ref / ref.norm() if ref.norm() > 0 else torch.zeros_like(ref)
        return g_hat + torch.linalg.pinv(U) @ (rho - U @ g_hat)

    def forgets_to_normalise_rows(G, rho, ref):
        rho = rho / rho.sum()
        g_hat = ref / ref.norm() if ref.norm() > 0 else torch.zeros_like(ref)
        return g_hat + torch.linalg.pinv(G) @ (rho - G @ g_hat)

    assert check_craft_direction(right) is True
    assert check_craft_direction(forgets_to_normalise_rows) is False
    assert "failed" in capsys.readouterr().out


def test_check_craft_direction_needs_both_normalisations(capsys):
    def raw_rho(G, rho, ref):  # equation (2.2) with rho as given
        U = G / G.norm(dim=1, keepdim=True)
        g_hat = ref / ref.norm() if ref.norm() > 0 else torch.zeros_like(ref)
        return g_hat + torch.linalg.pinv(U) @ (rho - U @ g_hat)

    def raw_reference(G, rho, ref):  # the reference not scaled to unit length
        U = G / G.norm(dim=1, keepdim=True)
        rho = rho / rho.sum()
        return ref + torch.linalg.pinv(U) @ (rho - U @ ref)

    assert check_craft_direction(raw_rho) is False
    assert check_craft_direction(raw_reference) is False
    assert capsys.readouterr().out.count("failed") == 2
