"""The convergence chapter's checkers: the right answer passes, each usual wrong answer fails with its hint."""

from __future__ import annotations

import pytest
import torch

from fedlearn_edu.exercises import check_gradient_dissimilarity, check_participation_estimate


def right_zeta2(grads, weights):
    p = weights / weights.sum()
    return float(p @ ((grads - p @ grads) ** 2).sum(1))


def right_estimate(deltas, sizes, num_clients, total):
    return num_clients / deltas.shape[0] * (sizes / total) @ deltas


def test_the_right_answers_pass(capsys):
    assert check_gradient_dissimilarity(right_zeta2) is True
    assert check_participation_estimate(right_estimate) is True
    out = capsys.readouterr().out
    assert "check_gradient_dissimilarity: all 5 cases passed." in out
    assert "check_participation_estimate: all 5 cases passed." in out


def _p(w):
    return w / w.sum()


@pytest.mark.parametrize(
    "wrong, hint",
    [
        (lambda x, w: float(_p(w) @ (x**2).sum(1)), "without subtracting the federation's gradient g"),
        (lambda x, w: float(((x - x.mean(0)) ** 2).sum(1).mean()), "the plain mean over clients"),
        (lambda x, w: float(_p(w) @ ((x - x.mean(0)) ** 2).sum(1)), "centring on the plain mean"),
        (lambda x, w: float(_p(w) @ (x - _p(w) @ x).norm(dim=1)), "(not squared)"),
        (lambda x, w: float(w @ ((x - _p(w) @ x) ** 2).sum(1)), "unnormalised weights"),
    ],
)
def test_usual_mistakes_in_the_dissimilarity_get_their_hint(capsys, wrong, hint):
    assert check_gradient_dissimilarity(wrong) is False
    out = capsys.readouterr().out
    assert "hint: your output is what" in out and hint in out


@pytest.mark.parametrize(
    "wrong, hint",
    [
        (lambda d, n, N, t: (n @ d) / n.sum(), "renormalising over the sampled clients"),
        (lambda d, n, N, t: (n / t) @ d, "leaving out the factor N / m"),
        (lambda d, n, N, t: d.mean(0), "the plain mean of the sampled updates"),
        (lambda d, n, N, t: (n / t) @ d / d.shape[0], "dividing by m instead of multiplying by N / m"),
    ],
)
def test_usual_mistakes_in_the_estimate_get_their_hint(capsys, wrong, hint):
    assert check_participation_estimate(wrong) is False
    out = capsys.readouterr().out
    assert "hint: your output is what" in out and hint in out


def test_an_answer_that_raises_or_has_the_wrong_shape_fails(capsys):
    assert check_participation_estimate(lambda d, n, N, t: (n / t) @ d.T) is False
    assert check_gradient_dissimilarity(lambda x, w: torch.zeros(3)) is False
    assert "failed" in capsys.readouterr().out
