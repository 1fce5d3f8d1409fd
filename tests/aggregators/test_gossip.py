"""Gossip: random graphs, Metropolis-Hastings mixing (doubly stochastic, converges to the average),
neighbour sampling and data-size-weighted neighbour averaging."""

import numpy as np
import pytest
import scipy.sparse
import scipy.sparse.csgraph
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedlearn_edu.aggregators import (
    gossip_mix,
    is_connected,
    metropolis_hastings_weights,
    neighbour_average_matrix,
    random_graph,
    sample_neighbours,
)


def _mh_numpy(A):
    """Metropolis-Hastings weights written entry by entry."""
    n = A.shape[0]
    deg = A.sum(1)
    W = np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            if A[i, j]:
                W[i, j] = 1.0 / (1 + max(deg[i], deg[j]))
        W[i, i] = 1.0 - W[i].sum()
    return W


@settings(max_examples=30, deadline=None)
@given(n=st.integers(2, 15), p=st.floats(0.3, 1.0), seed=st.integers(0, 1000))
def test_random_graph_is_connected_symmetric_and_mh_weights_are_doubly_stochastic(n, p, seed):
    A = random_graph(n, p, seed=seed)
    An = A.numpy()
    assert (An == An.T).all() and not An.diagonal().any()
    assert scipy.sparse.csgraph.connected_components(scipy.sparse.csr_matrix(An), directed=False)[0] == 1
    W = metropolis_hastings_weights(A).numpy()
    np.testing.assert_allclose(W, _mh_numpy(An.astype(int)), atol=1e-15)
    np.testing.assert_allclose(W, W.T)
    np.testing.assert_allclose(W.sum(0), 1.0, atol=1e-12)
    np.testing.assert_allclose(W.sum(1), 1.0, atol=1e-12)
    assert (W >= 0).all() and (W.diagonal() > 0).all()
    assert torch.equal(random_graph(n, p, seed=seed), A)  # same seed, same graph


def test_is_connected_agrees_with_scipy():
    rng = np.random.default_rng(0)
    for _ in range(50):
        n = int(rng.integers(1, 12))
        U = np.triu(rng.random((n, n)) < 0.2, 1)
        A = U | U.T
        ref = scipy.sparse.csgraph.connected_components(scipy.sparse.csr_matrix(A), directed=False)[0] == 1
        assert is_connected(torch.tensor(A)) == ref


@pytest.mark.parametrize("seed", range(5))
def test_gossip_keeps_the_mean_and_converges_to_the_average(seed):
    n = 12
    W = metropolis_hastings_weights(random_graph(n, 0.3, seed=seed))
    X = {
        "w": torch.randn(n, 3, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)),
        "b": torch.randn(n, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(seed + 1)),
    }
    mean = {k: v.mean(0) for k, v in X.items()}
    lam2 = np.sort(np.abs(np.linalg.eigvalsh(W.numpy())))[-2]  # second largest |eigenvalue|
    assert lam2 < 1
    err0 = max(float((X[k] - mean[k]).norm()) for k in X)
    Y = X
    for t in range(1, 301):
        Y = gossip_mix(Y, W)
        for k in X:
            torch.testing.assert_close(Y[k].mean(0), mean[k])
        if t in (10, 50, 300):  # ||W^t X - 1 mean|| <= lam2^t ||X - 1 mean||
            assert max(float((Y[k] - mean[k]).norm()) for k in X) <= lam2**t * err0 * np.sqrt(2) + 1e-12
    for k in X:
        torch.testing.assert_close(Y[k], mean[k].expand_as(Y[k]), atol=1e-6, rtol=0)


def test_gossip_mix_matches_numpy_and_keeps_dtype():
    W = metropolis_hastings_weights(random_graph(5, 0.6, seed=1))
    X = torch.randn(5, 7)
    got = gossip_mix(X, W)
    assert got.dtype == torch.float32
    np.testing.assert_allclose(got.numpy(), W.numpy() @ X.double().numpy(), rtol=1e-6, atol=1e-6)


def test_sample_neighbours_respects_support_and_frequencies():
    A = random_graph(8, 0.5, seed=3)
    S = sample_neighbours(A, 2, seed=0)
    assert S.shape == (8, 2)
    for i in range(8):
        assert len(set(S[i].tolist())) == 2 and all(bool(A[i, j]) for j in S[i].tolist())
    assert torch.equal(S, sample_neighbours(A, 2, seed=0))
    # one draw from probabilities (0, 0.75, 0.25): frequencies match
    P = torch.tensor([[0.0, 3.0, 1.0], [1.0, 0.0, 1.0], [1.0, 1.0, 0.0]])
    g = torch.Generator().manual_seed(0)
    counts = torch.zeros(3)
    for _ in range(4000):
        counts[sample_neighbours(P, 1, seed=g)[0, 0]] += 1
    assert abs(float(counts[1]) / 4000 - 0.75) < 0.03 and counts[0] == 0


def test_neighbour_average_matrix_matches_the_authors_fedavg():
    S = torch.tensor([[1, 2], [3, 0], [0, 1], [2, 1]])
    n = torch.tensor([10.0, 20.0, 30.0, 40.0])
    W = neighbour_average_matrix(S, n)
    X = torch.randn(4, 3, dtype=torch.float64)
    got = gossip_mix(X, W)
    for i in range(4):
        members = [i] + S[i].tolist()
        w = n[members].double() / n[members].sum()
        torch.testing.assert_close(got[i], (w[:, None] * X[members]).sum(0))


def test_bad_input_is_rejected():
    with pytest.raises(ValueError, match="symmetric"):
        metropolis_hastings_weights(torch.tensor([[0, 1], [0, 0]]))
    with pytest.raises(ValueError, match="self-loops"):
        metropolis_hastings_weights(torch.tensor([[1, 1], [1, 0]]))
    with pytest.raises(ValueError, match="edge_prob"):
        random_graph(5, 0.0)
    with pytest.raises(ValueError, match="connected"):
        random_graph(30, 0.01, max_tries=5)
    with pytest.raises(ValueError, match="row-stochastic"):
        gossip_mix(torch.zeros(2, 3), torch.tensor([[0.5, 0.6], [0.5, 0.5]]))
    with pytest.raises(ValueError, match="mixing"):
        gossip_mix(torch.zeros(3, 3), torch.eye(2))
    with pytest.raises(ValueError, match="fewer than num_sampled"):
        sample_neighbours(torch.tensor([[0, 1, 0], [1, 0, 1], [0, 1, 0]]), 2)
    with pytest.raises(ValueError, match="itself"):
        neighbour_average_matrix(torch.tensor([[0], [0]]), torch.ones(2))
    with pytest.raises(ValueError, match="repeat"):
        neighbour_average_matrix(torch.tensor([[1, 1], [0, 0]]), torch.ones(2))
    with pytest.raises(ValueError, match="num_samples"):
        neighbour_average_matrix(torch.tensor([[1], [0]]), torch.tensor([1.0, 0.0]))
