"""The exercise checkers pass correct solutions and catch wrong ones with a useful message."""

import importlib.util
import json
import re
from pathlib import Path

import pytest
import torch

from fedlearn_edu.exercises import (
    CHECKERS,
    check_beta_moments,
    check_craft_direction,
    check_fair_comparison,
    check_fedavg,
    check_fednova,
    check_fedvg_weights,
    check_interval_reading,
    check_oui,
    check_pca_fingerprint,
    check_personal_model,
    check_scaffold_control_update,
)

REPO = Path(__file__).resolve().parents[1]
# check_personal_model reads Flower Contexts: without the flower extra (flwr needs Python >= 3.11, so
# the 3.10 and lowest-versions jobs leave it out) its tests skip, as tests/flower/ does; .ci/run has it
NEEDS_FLWR = pytest.mark.skipif(
    importlib.util.find_spec("flwr") is None, reason="check_personal_model needs Flower: the 'flower' extra"
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
    assert check_craft_direction(_craft_by(lambda K, r: torch.linalg.lstsq(K, r, driver="gelsd").solution)) is True
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


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=NEEDS_FLWR) if n == "check_personal_model" else n for n in CHECKERS]
)
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
# chapters 7 and 9: each usual wrong answer is named, and no other mistake


def _fingerprint(x, y, c, l, ddof=1, scale="trace", center=True, labels=True, order="desc", root=False):
    import numpy as np

    a = np.hstack([x.numpy(), np.eye(c)[y.numpy()]]) if labels else x.numpy()
    a = a - a.mean(0) if center else a
    ev = np.linalg.eigvalsh(a.T @ a / (len(a) - ddof)).clip(min=0)  # ascending
    ev = np.sqrt(ev) if root else ev
    ev = ev / {"trace": ev.sum(), "kept": ev[::-1][:l].sum(), "largest": ev.max(), None: 1.0}[scale]
    ev = {"desc": ev[::-1][:l], "asc_top": ev[::-1][:l][::-1], "asc": ev[:l]}[order]
    out = np.zeros(l)
    out[: ev.size] = ev
    return torch.tensor(out)


def _verdict(d, h):
    return "inconclusive" if abs(d) <= h else ("better" if d > 0 else "worse")


def _is_fair(plan, count=lambda seeds: len(set(seeds)), steps=lambda v: len(set(v)), every=all, disjoint=True):
    tune, ev = set(plan["tuning_seeds"]), set(plan["eval_seeds"])
    tuned = len(plan["server_lr"]) > 0 and every(steps(v) >= 2 for v in plan["server_lr"].values())
    return bool(tune) and count(plan["eval_seeds"]) >= 3 and not (disjoint and tune & ev) and tuned


def _hints(out):
    return [line.strip() for line in out.splitlines() if line.strip().startswith("hint:")]


def test_right_answers_of_chapters_6_and_8_pass(capsys):
    assert check_pca_fingerprint(_fingerprint) is True
    assert check_pca_fingerprint(lambda *a: _fingerprint(*a, ddof=0)) is True  # the trace cancels 1 / (n - ddof)
    assert check_interval_reading(_verdict) is True
    assert check_fair_comparison(_is_fair) is True
    assert capsys.readouterr().out.count("cases passed") == 4


@pytest.mark.parametrize(
    "checker, wrong, named",
    [
        (check_pca_fingerprint, lambda *a: _fingerprint(*a, scale="kept"), "sum of the num_eigenvalues kept"),
        (check_pca_fingerprint, lambda *a: _fingerprint(*a, scale="largest"), "divided by the largest one"),
        (check_pca_fingerprint, lambda *a: _fingerprint(*a, scale=None), "not divided by their total"),
        (check_pca_fingerprint, lambda *a: _fingerprint(*a, center=False), "uncentred columns"),
        (check_pca_fingerprint, lambda *a: _fingerprint(*a, labels=False), "the features alone"),
        (check_pca_fingerprint, lambda *a: _fingerprint(*a, order="asc"), "the smallest eigenvalues"),
        (check_pca_fingerprint, lambda *a: _fingerprint(*a, order="asc_top"), "largest eigenvalues in ascending"),
        (check_pca_fingerprint, lambda *a: _fingerprint(*a, root=True), "singular values"),
        (check_interval_reading, lambda d, h: "better" if d > 0 else "worse" if d < 0 else "inconclusive", "sign"),
        (check_interval_reading, lambda d, h: _verdict(d, h / 2), "half the half-width"),
        (check_interval_reading, lambda d, h: _verdict(d, 2 * h), "widened again"),
        (check_interval_reading, lambda d, h: _verdict(d, 1.96 * h), "widened again"),
        (check_interval_reading, lambda d, h: _verdict(-d, h), "'better' and 'worse' swapped"),
        (check_interval_reading, lambda d, h: "better" if d > h else "worse" if d < h else "inconclusive", "wholly"),
        (check_interval_reading, lambda d, h: "better" if d > h else "inconclusive", "for an interval below 0"),
        (
            check_interval_reading,
            lambda d, h: "inconclusive" if abs(d) < h else "better" if d > 0 else "worse",
            "touches 0",
        ),
        (check_fair_comparison, lambda p: _is_fair(p, count=len), "a seed listed twice is one seed"),
        (check_fair_comparison, lambda p: _is_fair(p, count=lambda s: len(set(s)) + 1), "accepting 2 evaluation"),
        (check_fair_comparison, lambda p: _is_fair(p, disjoint=False), "disjoint"),
        (check_fair_comparison, lambda p: _is_fair(p, steps=len), "a step listed twice is one candidate"),
        (check_fair_comparison, lambda p: _is_fair(p, every=any), "every method's steps"),
        (check_fair_comparison, lambda p: _is_fair({**p, "server_lr": {"x": [1, 2]}}), "every method's steps"),
        (
            check_fair_comparison,
            lambda p: _is_fair({**p, "tuning_seeds": p["tuning_seeds"] or [99]}),
            "without a tuning seed",
        ),
    ],
)
def test_a_usual_mistake_is_named_and_no_other(capsys, checker, wrong, named):
    assert checker(wrong) is False
    out = capsys.readouterr().out
    hints = _hints(out)
    assert len(hints) == 1 and named in hints[0], out


def test_repeated_evaluation_seeds_are_not_three(capsys):
    # [1, 1, 2] is two seeds; a plan counting it as three used to pass
    assert check_fair_comparison(lambda p: _is_fair(p, count=len)) is False
    out = capsys.readouterr().out
    assert "case 'an evaluation seed listed twice is one seed' failed" in out, out


@pytest.mark.parametrize(
    "checker, wrong, allowed",
    [
        (check_interval_reading, lambda d, h: _verdict(d, h).capitalize(), "'better', 'worse', 'inconclusive'"),
        (check_interval_reading, lambda d, h: abs(d) > h, "'better', 'worse', 'inconclusive'"),
        (check_fair_comparison, lambda p: set(p["tuning_seeds"]) and _is_fair(p), "True, False"),
    ],
)
def test_an_answer_outside_the_allowed_ones_is_named_as_such(capsys, checker, wrong, allowed):
    assert checker(wrong) is False
    hints = _hints(capsys.readouterr().out)
    assert len(hints) == 1 and f"must be one of {allowed}" in hints[0], hints


def test_a_mistake_that_fails_a_passed_case_is_not_named(capsys):
    # the strict reading of a touching interval gives 'better' at (0.02, 0.02), as the sign alone
    # and half the half-width do; those two fail earlier cases this answer passed
    assert (
        check_interval_reading(lambda d, h: "inconclusive" if abs(d) < h else "better" if d > 0 else "worse") is False
    )
    out = capsys.readouterr().out
    assert "case 'interval touching zero' failed" in out
    assert "sign" not in out and "half the half-width" not in out, out


# --------------------------------------------------------------------------
# chapter 8: a Flower node's personal model, found by its node_config


def _personal(contexts, pid, by="config", axis=False):
    from fedlearn_edu.flower import client_state

    if by == "config":
        (context,) = [c for c in contexts.values() if c.node_config["partition-id"] == pid]
    else:
        context = contexts[pid] if by == "key" else list(contexts.values())[pid]
    rows = client_state(context)["personal"]
    return dict(rows) if axis else {k: v[0] for k, v in rows.items()}


@NEEDS_FLWR
def test_check_personal_model_passes_a_right_answer(capsys):
    assert check_personal_model(_personal) is True
    assert check_personal_model(_personal, seed=3) is True
    assert "check_personal_model: all 5 cases passed." in capsys.readouterr().out


@NEEDS_FLWR
@pytest.mark.parametrize(
    "wrong, named",
    [
        (lambda c, pid: _personal(c, pid, axis=True), "hint: your output is what the rows with their client axis"),
        (lambda c, pid: _personal(c, pid, by="key"), "contexts are keyed by node id"),
        (lambda c, pid: _personal(c, pid, by="position"), "the partition_id-th context in the dict's order"),
    ],
)
def test_check_personal_model_names_the_mistake(capsys, wrong, named):
    assert check_personal_model(wrong) is False
    out = capsys.readouterr().out
    hints = _hints(out)
    assert len(hints) == 1 and named in hints[0], out
    assert "state=...)" in out and "Array(" not in out  # the input shows node ids and configs, not the bytes


@NEEDS_FLWR
def test_check_personal_model_does_not_read_the_whole_state(capsys):
    def whole_state(contexts, pid):
        from fedlearn_edu.flower import client_state

        (context,) = [c for c in contexts.values() if c.node_config["partition-id"] == pid]
        return {k: v[0] for rows in client_state(context).values() for k, v in rows.items()}

    assert check_personal_model(whole_state) is False
    assert "not the whole state" in capsys.readouterr().out


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
