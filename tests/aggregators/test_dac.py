"""DAC: the softmax sampling probabilities and the score update with its two-hop rule, against a
per-client NumPy transcription of the authors' train_DAC (github.com/edvinli/DAC, utils.py), run
synchronously."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedlearn_edu.aggregators import dac_probabilities, dac_tau_schedule, dac_update_similarities, sample_neighbours


def _authors_client_step(priors, n_sampled, i, neighbour_sampled, losses, tau):
    """Client i's body of ``train_DAC`` in ``utils.py`` of github.com/edvinli/DAC (lines "for j in
    neighbour_sampled" to "priors_norm = softmax_scale(...)"), transcribed in NumPy: ``priors`` is
    the N x N matrix of the clients' ``priors`` rows, ``n_sampled`` their ``n_sampled`` counts,
    ``losses[k]`` the loss of neighbour k's model on i's training data. Returns i's new
    ``priors`` row, ``n_sampled`` row and ``priors_norm`` row."""
    N = priors.shape[0]
    prior_i, sampled_i = priors[i].copy(), n_sampled[i].copy()
    for j in neighbour_sampled:
        sampled_i[j] += 1
    n = len(neighbour_sampled)
    ik_similarity = [1 / losses[k] for k in range(n)]
    neighbour_idx = list(neighbour_sampled)
    for k in range(n):
        prior_i[neighbour_idx[k]] = ik_similarity[k]
    neighbour_list = np.arange(N)
    new_neighbours = []
    for k in neighbour_idx:
        new_neighbours += list(set(neighbour_list[priors[k] > 0]) - set(neighbour_list[sampled_i > 0]) - {i})
    for j in np.unique(new_neighbours):
        score_kj_array = np.zeros(n)
        ki_scores = []
        for k in range(n):
            score_kj = priors[neighbour_idx[k]][j]
            score_kj_array[k] = score_kj
            if score_kj > 0:
                ki_scores.append((prior_i[neighbour_idx[k]], k))
        ki_scores.sort(key=lambda x: x[0])  # stable: of equal scores the last drawn ends last
        ki_max = ki_scores[-1][1]
        prior_i[j] = score_kj_array[ki_max]
    not_i = np.arange(N) != i
    norm = np.zeros(N)
    norm[not_i] = np.exp(prior_i[not_i] * tau) / sum(np.exp(prior_i[not_i] * tau))  # softmax_scale
    return prior_i, sampled_i, norm


def _reference_update(S, C, nb, L, tau=2.0):
    """A synchronous round of the authors' client step: every client reads the others' scores as
    they were at the start of the round (the package's one difference from their loop)."""
    new, newC, P = S.copy(), C.copy(), np.zeros_like(S)
    for i in range(S.shape[0]):
        new[i], sampled, P[i] = _authors_client_step(S, C.astype(float), i, nb[i], L[i], tau)
        newC[i] = sampled > 0
    return new, newC, P


@settings(max_examples=40, deadline=None)
@given(
    N=st.integers(3, 9),
    n=st.integers(1, 3),
    seed=st.integers(0, 10_000),
    rounds=st.integers(1, 4),
    ties=st.booleans(),
)
def test_update_matches_a_transcription_of_the_authors_code(N, n, seed, rounds, ties):
    """Scores, who has met whom and the next round's probabilities; ``ties``: losses from a
    set of three values, so that equally similar neighbours know the same client (the
    authors' stable sort then takes the last one drawn)."""
    n = min(n, N - 1)
    rng = np.random.default_rng(seed)
    S = np.zeros((N, N))
    C = np.zeros((N, N), dtype=bool)
    g = torch.Generator().manual_seed(seed)
    for _ in range(rounds):
        P = dac_probabilities(torch.tensor(S), tau=2.0)
        nb = sample_neighbours(P, n, seed=g).numpy()
        L = rng.choice([0.5, 1.0, 2.0], size=(N, n)) if ties else rng.uniform(0.1, 3.0, size=(N, n))
        got_S, got_C = dac_update_similarities(torch.tensor(S), torch.tensor(C), torch.tensor(nb), torch.tensor(L))
        ref_S, ref_C, ref_P = _reference_update(S, C, nb, L)
        np.testing.assert_allclose(got_S.numpy(), ref_S, rtol=1e-15)
        assert (got_C.numpy() == ref_C).all()
        np.testing.assert_allclose(dac_probabilities(got_S, tau=2.0).numpy(), ref_P, rtol=1e-12, atol=1e-300)
        S, C = ref_S, ref_C


def test_ties_take_the_last_equally_similar_neighbour_as_the_authors_stable_sort():
    S = torch.zeros(4, 4, dtype=torch.float64)
    S[1, 3], S[2, 3] = 5.0, 7.0  # clients 1 and 2 both know client 3 ...
    C = torch.zeros(4, 4, dtype=torch.bool)
    nb = torch.tensor([[1, 2], [0, 2], [0, 1], [0, 1]])
    L = torch.ones(4, 2, dtype=torch.float64)  # ... and are equally similar to client 0
    last, _ = dac_update_similarities(S, C, nb, L)
    first, _ = dac_update_similarities(S, C, nb, L, ties="first")
    authors, _, _ = _authors_client_step(S.numpy(), C.numpy().astype(float), 0, [1, 2], [1.0, 1.0], 1.0)
    assert float(last[0, 3]) == authors[3] == 7.0  # client 2, drawn last
    assert float(first[0, 3]) == 5.0
    swapped, _ = dac_update_similarities(S, C, torch.tensor([[2, 1], [0, 2], [0, 1], [0, 1]]), L)
    assert float(swapped[0, 3]) == 5.0  # the order of the draw decides
    with pytest.raises(ValueError, match="ties"):
        dac_update_similarities(S, C, nb, L, ties="random")


def test_probabilities_match_numpy_softmax_and_start_uniform():
    rng = np.random.default_rng(0)
    S = rng.uniform(0, 3, size=(5, 5))
    P = dac_probabilities(torch.tensor(S), tau=1.7).numpy()
    for i in range(5):
        others = [j for j in range(5) if j != i]
        e = np.exp(1.7 * S[i, others])
        np.testing.assert_allclose(P[i, others], e / e.sum(), rtol=1e-12)
        assert P[i, i] == 0
    U = dac_probabilities(torch.zeros(4, 4), tau=30.0)
    torch.testing.assert_close(U, (torch.ones(4, 4) - torch.eye(4)).double() / 3)
    big = dac_probabilities(torch.tensor([[0.0, 100.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]), tau=50.0)
    assert torch.isfinite(big).all() and float(big[0, 1]) == pytest.approx(1.0)


def test_two_hop_takes_the_score_of_the_most_similar_neighbour():
    S = torch.zeros(4, 4, dtype=torch.float64)
    S[1, 3], S[2, 3] = 5.0, 7.0  # clients 1 and 2 both know client 3
    C = torch.zeros(4, 4, dtype=torch.bool)
    nb = torch.tensor([[1, 2], [0, 2], [0, 1], [0, 1]])
    L = torch.tensor([[0.5, 1.0], [1.0, 1.0], [1.0, 1.0], [1.0, 1.0]], dtype=torch.float64)
    new, contacted = dac_update_similarities(S, C, nb, L)
    assert float(new[0, 1]) == 2.0 and float(new[0, 2]) == 1.0
    assert float(new[0, 3]) == 5.0  # client 1 (score 2) is more similar to 0 than client 2 (score 1)
    assert bool(contacted[0, 1]) and not bool(contacted[0, 3])
    assert torch.equal(S[0], torch.zeros(4, dtype=torch.float64))  # inputs untouched


def test_tau_schedule():
    assert dac_tau_schedule(0, 30.0) == 1.0
    taus = [dac_tau_schedule(t, 30.0) for t in range(100)]
    assert all(a < b for a, b in zip(taus, taus[1:])) and taus[-1] == pytest.approx(31.0, abs=1e-3)
    assert dac_tau_schedule(5, 10.0, rate=0.5) == pytest.approx(2 * 10 / (1 + math.exp(-2.5)) - 10 + 1)


def test_bad_input_is_rejected():
    S, C = torch.zeros(3, 3), torch.zeros(3, 3, dtype=torch.bool)
    nb, L = torch.tensor([[1], [2], [0]]), torch.ones(3, 1)
    with pytest.raises(ValueError, match="losses"):
        dac_update_similarities(S, C, nb, torch.tensor([[1.0], [0.0], [1.0]]))
    with pytest.raises(ValueError, match="other clients"):
        dac_update_similarities(S, C, torch.tensor([[0], [2], [0]]), L)
    with pytest.raises(ValueError, match="contacted"):
        dac_update_similarities(S, torch.zeros(3, 3), nb, L)
    with pytest.raises(ValueError, match="similarity"):
        dac_probabilities(-torch.ones(3, 3), tau=1.0)
    with pytest.raises(ValueError, match="tau"):
        dac_probabilities(S, tau=-1.0)
    with pytest.raises(ValueError, match="round_index"):
        dac_tau_schedule(-1, 1.0)


def test_dac_sampling_survives_a_softmax_that_underflows():
    """Scores 1/L differ by hundreds once a neighbour's model fits a client's data: exp(tau s) underflows
    to exact zeros for the others, yet every client must still draw n distinct neighbours."""
    from fedlearn_edu.strategies.decentralized import _dac_neighbours

    S = torch.zeros(6, 6, dtype=torch.float64)
    S[0, 1] = 200.0  # client 0: one neighbour with a tiny loss ...
    S[0, 2] = 150.0  # ... a second one less close, the rest with scores near 1
    S[0, 3:] = torch.tensor([1.0, 1.5, 0.5], dtype=torch.float64)
    assert int((dac_probabilities(S, tau=30.0)[0] > 0).sum()) < 3  # what multinomial alone would refuse
    seen = []
    for seed in range(40):
        nb = _dac_neighbours(S, 30.0, 3, seed=seed)
        assert nb.shape == (6, 3)
        for i, row in enumerate(nb.tolist()):
            assert len(set(row)) == 3 and i not in row
        assert nb[0, 0] == 1 and nb[0, 1] == 2  # the law: the two dominant scores first, in order
        seen.append(int(nb[0, 2]))
    assert set(seen) <= {3, 4, 5} and seen.count(4) > seen.count(5)  # then exp(30 s) among the rest
    # where the softmax does not underflow, the draw is the one sample_neighbours makes
    small = torch.rand(6, 6, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    torch.testing.assert_close(
        _dac_neighbours(small, 2.0, 3, seed=7), sample_neighbours(dac_probabilities(small, 2.0), 3, seed=7)
    )
