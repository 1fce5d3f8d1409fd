"""The exercise checkers pass correct solutions and catch wrong ones with a useful message."""

import json
import re
from pathlib import Path

import pytest
import torch

from fedlearn_edu.exercises import (
    CHECKERS,
    check_beta_moments,
    check_craft_direction,
    check_fedavg,
    check_fednova,
    check_fedvg_weights,
    check_oui,
    check_pca_fingerprint,
    check_scaffold_control_update,
)

REPO = Path(__file__).resolve().parents[1]


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


# --------------------------------------------------------------------------
# CRAFT: rank-deficient cases need a rank-safe solve


def _craft_by(solve):
    def craft(G, rho, ref):
        U = G / G.norm(dim=1, keepdim=True)
        rho = rho / rho.sum()
        g_hat = ref / ref.norm() if ref.norm() > 0 else torch.zeros_like(ref)
        return g_hat + U.T @ solve(U @ U.T, rho - U @ g_hat)

    return craft


def test_check_craft_direction_rejects_a_solve_on_a_singular_gram_matrix(capsys):
    assert check_craft_direction(_craft_by(torch.linalg.solve)) is False
    out = capsys.readouterr().out
    assert "duplicate clients" in out and "rank-deficient Gram matrix" in out
    assert "hint:" in out and "rank-safe" in out and "lstsq" in out and "pinv" in out


def test_check_craft_direction_passes_rank_safe_solutions(capsys):
    assert check_craft_direction(_craft_by(lambda K, r: torch.linalg.lstsq(K, r).solution)) is True
    assert check_craft_direction(_craft_by(lambda K, r: torch.linalg.pinv(K, hermitian=True) @ r)) is True
    assert capsys.readouterr().out.count("all 8 cases passed") == 2


def test_check_craft_direction_rank_deficient_cases_are_the_least_squares_compromise():
    """The expected values of the rank-deficient cases: U g is the least-squares fit of rho (duplicates
    merged with their mean target), and g - g_hat lies in U's row space (the smallest correction)."""
    import fedlearn_edu.exercises as ex

    seen = []
    original = ex.run_cases
    ex.run_cases = lambda title, fn, cases, **kw: seen.extend(cases) or True
    try:
        check_craft_direction(None)
    finally:
        ex.run_cases = original
    deficient = [c for c in seen if "rank-deficient" in c.name]
    assert len(deficient) == 3
    for case in deficient:
        G, rho, ref = case.args
        U = G / G.norm(dim=1, keepdim=True)
        assert torch.linalg.matrix_rank(U @ U.T) < U.shape[0]
        g_hat, rho = ref / ref.norm(), rho / rho.sum()
        g = case.expected
        fit = torch.linalg.lstsq(U, rho - U @ g_hat, driver="gelsd").solution  # min-norm least squares
        torch.testing.assert_close(g, g_hat + fit)
    duplicate = next(c for c in deficient if c.name.startswith("duplicate"))
    G, rho, _ = duplicate.args
    u = G[0] / G[0].norm()
    assert float(u @ duplicate.expected) == pytest.approx(float(rho[0] + rho[2]) / 2 / float(rho.sum()))


# --------------------------------------------------------------------------
# every checker: cases that say what they test, hints at the usual mistakes


def _cases_of(name):
    import fedlearn_edu.exercises as ex

    seen = {}

    def record(title, fn, cases, **kwargs):
        seen.update(cases=list(cases), mistakes=list(kwargs.get("mistakes", ())))
        return True

    original = ex.run_cases
    ex.run_cases = record
    try:
        getattr(ex, name)(None)
    finally:
        ex.run_cases = original
    return seen["cases"], seen["mistakes"]


@pytest.mark.parametrize("name", list(CHECKERS))
def test_every_case_says_what_it_tests_and_every_checker_hints(name):
    cases, mistakes = _cases_of(name)
    assert cases and mistakes, f"{name}: no cases, or no usual mistakes to recognise"
    for case in cases:
        assert not case.name.lower().startswith("random"), f"{name}: {case.name!r} says how, not what it tests"
        assert len(case.name.split()) >= 2
    assert sum(bool(c.hint) for c in cases) >= len(cases) - 1, f"{name}: cases without a hint"


@pytest.mark.parametrize(
    "checker, wrong, hint",
    [
        (check_fedavg, lambda d, w: w @ d, "unnormalised weights"),
        (check_fedavg, lambda d, w: d.mean(0), "plain mean over clients"),
        (check_fedvg_weights, lambda x: (1 / x.sum(1)) / (1 / x.sum(1)).sum(), "missing eps"),
        (check_fedvg_weights, lambda x: x.sum(1) / x.sum(1).sum(), "proportional to G_k (not to 1 / G_k)"),
        (check_beta_moments, lambda m, v: ((1 - m) * (m * (1 - m) / v - 1), m * (m * (1 - m) / v - 1)), "swapped"),
        (
            check_scaffold_control_update,
            lambda ci, c, d, k, lr: ci - c + d / (k[:, None] * lr),
            "the wrong sign, (y_i - x) for (x - y_i)",
        ),
        (check_fednova, lambda d, k, w: (w / w.sum()) @ d, "plain FedAvg"),
        (
            check_craft_direction,
            lambda G, rho, ref: (
                (ref / ref.norm() if ref.norm() > 0 else ref)
                - torch.linalg.pinv(G / G.norm(dim=1, keepdim=True))
                @ (rho / rho.sum() - (G / G.norm(dim=1, keepdim=True)) @ (ref / ref.norm() if ref.norm() > 0 else ref))
            ),
            "wrong sign of the correction",
        ),
    ],
)
def test_failure_messages_hint_at_the_usual_mistake(capsys, checker, wrong, hint):
    assert checker(wrong) is False
    out = capsys.readouterr().out
    assert "case '" in out and "hint:" in out and hint in out, out


def test_a_hint_is_printed_when_the_mistake_is_not_recognised(capsys):
    assert check_fedavg(lambda d, w: 2 * (w / w.sum()) @ d) is False
    out = capsys.readouterr().out
    assert "case 'unequal weights, 5 clients' failed" in out
    assert "hint: divide the weights by their sum" in out and "your output is what" not in out


# --------------------------------------------------------------------------
# one list of checkers: CHECKERS, the module, the README and the chapters


def test_checkers_lists_every_checker_of_the_module():
    import inspect

    import fedlearn_edu.exercises as ex

    defined = {n for n, f in inspect.getmembers(ex, inspect.isfunction) if n.startswith("check_")}
    assert set(CHECKERS) == defined
    assert defined <= set(ex.__all__)


def test_readme_lists_exactly_the_checkers():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    listed = re.findall(r"^- `(check_\w+)`: (.+)$", readme, re.M)
    assert listed == list(CHECKERS.items())


@pytest.mark.parametrize("name", list(CHECKERS))
def test_the_chapter_a_checker_names_uses_it(name):
    chapter = int(re.search(r"\(chapter (\d+)\)$", CHECKERS[name]).group(1))
    (notebook,) = (REPO / "book").glob(f"ch{chapter:02d}_*.ipynb")
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    assert any(f"{name}(" in "".join(c["source"]) for c in cells if c["cell_type"] == "code"), notebook.name
