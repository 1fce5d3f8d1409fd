"""Decentralised averaging: communication graphs, mixing matrices and one gossip step.

No server model: each of the N clients keeps its own parameters, stacked on the leading
axis (``Tensor[N, d]`` or a dict of ``Tensor[N, ...]``), and one gossip step replaces
them by ``X <- W X`` with a row-stochastic mixing matrix ``W`` (``W >= 0``, rows summing
to 1), row i mixing client i with the clients it hears from.

* On a fixed connected graph, the Metropolis--Hastings weights (Xiao & Boyd 2004; Boyd et
  al. 2006) ``W_ij = 1 / (1 + max(deg_i, deg_j))`` on edges, ``W_ii = 1 - sum_{j != i} W_ij``,
  are symmetric and doubly stochastic with a positive diagonal, so ``W^t X`` converges to
  every client holding the average ``(1/N) sum_j X_j`` (the mean is kept at every step).
* Randomised gossip (Hegedus et al. 2019; the "Random" baseline of Zec et al. 2022) lets
  client i average its model with a few sampled neighbours, weighted by data size:
  :func:`sample_neighbours` and :func:`neighbour_average_matrix` (row-stochastic only).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..checks import Updates, check_int, check_range, check_seed, check_updates, check_weights
from ._tree import map_updates

__all__ = [
    "random_graph",
    "is_connected",
    "metropolis_hastings_weights",
    "gossip_mix",
    "sample_neighbours",
    "neighbour_average_matrix",
]


def _check_adjacency(adjacency) -> Tensor:
    A = torch.as_tensor(adjacency)
    if A.dim() != 2 or A.shape[0] != A.shape[1] or A.shape[0] == 0:
        raise ValueError(f"adjacency must be a square Tensor[N, N] with N >= 1; got shape {tuple(A.shape)}.")
    if A.dtype != torch.bool:
        if not bool(((A == 0) | (A == 1)).all()):
            raise ValueError("adjacency must hold 0/1 (or booleans).")
        A = A != 0
    if not bool((A == A.T).all()):
        raise ValueError("adjacency must be symmetric (an undirected graph).")
    if bool(torch.diagonal(A).any()):
        raise ValueError("adjacency must have no self-loops (a zero diagonal).")
    return A.cpu()


def is_connected(adjacency) -> bool:
    """Whether the undirected graph with this ``Tensor[N, N]`` adjacency matrix is connected.

    Args:
        adjacency: ``Tensor[N, N]`` symmetric 0/1 adjacency matrix.

    Returns:
        ``True`` when every client reaches every other one.
    """
    A = _check_adjacency(adjacency)
    seen = torch.zeros(A.shape[0], dtype=torch.bool)
    seen[0] = True
    frontier = seen.clone()
    while bool(frontier.any()):
        reach = A[frontier].any(dim=0) & ~seen
        seen |= reach
        frontier = reach
    return bool(seen.all())


def random_graph(num_clients: int, edge_prob: float, seed: int = 0, max_tries: int = 1000) -> Tensor:
    """A connected Erdos--Renyi graph G(N, p): each edge present with probability ``edge_prob``.

    Graphs are drawn until one is connected (so the result is G(N, p) conditioned on
    connectivity).

    Args:
        num_clients: N >= 1.
        edge_prob: p in (0, 1].
        seed: seeds the draw (same seed, same graph).
        max_tries: draws before giving up.

    Returns:
        Boolean ``Tensor[N, N]`` adjacency matrix, symmetric, zero diagonal.

    Example:
        >>> random_graph(4, 1.0).int()
        tensor([[0, 1, 1, 1],
                [1, 0, 1, 1],
                [1, 1, 0, 1],
                [1, 1, 1, 0]], dtype=torch.int32)
    """
    num_clients = check_int(num_clients, "num_clients", 1)
    check_range(edge_prob, "edge_prob", 0, 1, low_open=True)
    max_tries = check_int(max_tries, "max_tries", 1)
    g = torch.Generator().manual_seed(check_seed(seed))
    n = num_clients
    for _ in range(max_tries):
        upper = torch.triu(torch.rand(n, n, generator=g) < edge_prob, diagonal=1)
        A = upper | upper.T
        if is_connected(A):
            return A
    raise ValueError(
        f"No connected G({n}, {edge_prob}) graph in {max_tries} draws: raise edge_prob "
        f"(connectivity needs about p > ln(N)/N = {torch.log(torch.tensor(float(n))).item() / n:.3f})."
    )


def metropolis_hastings_weights(adjacency) -> Tensor:
    """The Metropolis--Hastings mixing matrix of an undirected graph.

    ``W_ij = 1 / (1 + max(deg_i, deg_j))`` for every edge (i, j), ``W_ij = 0`` for non-edges,
    ``W_ii = 1 - sum_{j != i} W_ij``. Symmetric and doubly stochastic, ``W_ii > 0``; on a
    connected graph ``W^t -> (1/N) 1 1^T``.

    Args:
        adjacency: ``Tensor[N, N]`` boolean or 0/1, symmetric, zero diagonal.

    Returns:
        ``Tensor[N, N]`` (float64).

    Example:
        >>> metropolis_hastings_weights(torch.tensor([[0, 1, 0], [1, 0, 1], [0, 1, 0]]))  # a path
        tensor([[0.6667, 0.3333, 0.0000],
                [0.3333, 0.3333, 0.3333],
                [0.0000, 0.3333, 0.6667]], dtype=torch.float64)
    """
    A = _check_adjacency(adjacency)
    deg = A.sum(dim=1).to(torch.float64)
    W = torch.where(A, 1.0 / (1.0 + torch.maximum(deg.unsqueeze(0), deg.unsqueeze(1))), 0.0).to(torch.float64)
    W = W + torch.diag(1.0 - W.sum(dim=1))
    return W


def _check_mixing(mixing, n: int) -> Tensor:
    W = torch.as_tensor(mixing)
    if W.shape != (n, n):
        raise ValueError(
            f"mixing must be Tensor[N, N] with N = {n} (the clients on the leading axis); got {tuple(W.shape)}."
        )
    W = W.to(torch.float64)
    if not bool(torch.isfinite(W).all()) or bool((W < 0).any()):
        raise ValueError("mixing must be finite and >= 0.")
    rows = W.sum(dim=1)
    if not bool(torch.allclose(rows, torch.ones_like(rows), atol=1e-9)):
        i = int((rows - 1).abs().argmax())
        raise ValueError(f"mixing must be row-stochastic (rows summing to 1); row {i} sums to {float(rows[i])}.")
    return W


def gossip_mix(params: Updates, mixing, *, check: bool = True) -> Updates:
    """One gossip step: client i's new parameters are ``sum_j W_ij X_j``.

    Args:
        params: the N clients' parameters, ``Tensor[N, d]`` or dict of ``Tensor[N, ...]``.
        mixing: ``Tensor[N, N]`` row-stochastic mixing matrix (e.g.
            :func:`metropolis_hastings_weights` or :func:`neighbour_average_matrix`).
        check: scan ``params`` for NaN/Inf (``False``: the caller has, e.g. the round driver).

    Returns:
        New stacked parameters with the structure and dtype of ``params``.

    Example:
        >>> W = metropolis_hastings_weights(random_graph(3, 1.0))
        >>> gossip_mix(torch.tensor([[0.0], [3.0], [6.0]]), W)
        tensor([[3.],
                [3.],
                [3.]])
    """
    n = check_updates(params, "params", finite=check)
    W = _check_mixing(mixing, n)

    def mix(x: Tensor) -> Tensor:
        flat = x.reshape(n, -1)
        work = torch.promote_types(flat.dtype, torch.float64) if flat.device.type != "mps" else flat.dtype
        return (W.to(device=x.device, dtype=work) @ flat.to(work)).to(x.dtype).reshape(x.shape)

    return map_updates(mix, params)


def sample_neighbours(probabilities, num_sampled: int, seed: int | torch.Generator = 0) -> Tensor:
    """Each client draws ``num_sampled`` distinct neighbours from its row of ``probabilities``.

    Args:
        probabilities: ``Tensor[N, N]``, row i the (unnormalised, non-negative) chance that
            client i contacts client j; the diagonal is ignored (no client samples itself).
            Uniform over a graph's neighbours: the adjacency matrix itself.
        num_sampled: n, neighbours per client (each row needs at least n positive entries).
        seed: an int or a ``torch.Generator``.

    Returns:
        Integer ``Tensor[N, n]`` of neighbour indices (without replacement per row).

    Example:
        >>> sample_neighbours(torch.ones(3, 3), 2, seed=0).sort(dim=1).values
        tensor([[1, 2],
                [0, 2],
                [0, 1]])
    """
    P = torch.as_tensor(probabilities, dtype=torch.float64).detach().cpu().clone()
    if P.dim() != 2 or P.shape[0] != P.shape[1]:
        raise ValueError(f"probabilities must be Tensor[N, N]; got shape {tuple(P.shape)}.")
    if not bool(torch.isfinite(P).all()) or bool((P < 0).any()):
        raise ValueError("probabilities must be finite and >= 0.")
    num_sampled = check_int(num_sampled, "num_sampled", 1)
    P.fill_diagonal_(0)
    short = (P > 0).sum(dim=1) < num_sampled
    if bool(short.any()):
        i = int(short.nonzero()[0])
        raise ValueError(
            f"Client {i} has {int((P[i] > 0).sum())} possible neighbours, fewer than num_sampled = {num_sampled}."
        )
    g = seed if isinstance(seed, torch.Generator) else torch.Generator().manual_seed(check_seed(seed))
    return torch.multinomial(P, num_sampled, replacement=False, generator=g)


def neighbour_average_matrix(neighbours, num_samples) -> Tensor:
    """Row-stochastic mixing for "average with my sampled neighbours, weighted by data size".

    ``W_ij = n_j / (n_i + sum_{k in S_i} n_k)`` for ``j in {i} and S_i``, 0 otherwise.

    Args:
        neighbours: integer ``Tensor[N, n]``, row i the neighbours ``S_i`` client i received
            models from (no repeats, not i itself).
        num_samples: ``Tensor[N]`` training-set sizes ``n_j`` (> 0).

    Returns:
        ``Tensor[N, N]`` (float64), rows summing to 1.

    Example:
        >>> neighbour_average_matrix(torch.tensor([[1], [0], [0]]), torch.tensor([1.0, 3.0, 1.0]))
        tensor([[0.2500, 0.7500, 0.0000],
                [0.2500, 0.7500, 0.0000],
                [0.5000, 0.0000, 0.5000]], dtype=torch.float64)
    """
    S = torch.as_tensor(neighbours)
    if S.dim() != 2 or S.is_floating_point() or S.dtype == torch.bool:
        raise ValueError(f"neighbours must be an integer Tensor[N, n]; got {S.dtype} of shape {tuple(S.shape)}.")
    n_clients = S.shape[0]
    S = S.long().cpu()
    if bool(((S < 0) | (S >= n_clients)).any()):
        raise ValueError(f"neighbours must index the N = {n_clients} clients.")
    w = check_weights(num_samples, n_clients, "num_samples").to(torch.float64).cpu()
    if bool((w <= 0).any()):
        raise ValueError(f"num_samples must be > 0; got {w.tolist()}.")
    M = torch.zeros(n_clients, n_clients, dtype=torch.bool)
    M.scatter_(1, S, True)
    rows = torch.arange(n_clients)
    if bool(M[rows, rows].any()):
        raise ValueError("neighbours must not contain the client itself (row i holds i).")
    if bool((M.sum(dim=1) != S.shape[1]).any()):
        raise ValueError("neighbours must not repeat a client within a row.")
    M[rows, rows] = True
    W = torch.where(M, w.unsqueeze(0), 0.0)
    return W / W.sum(dim=1, keepdim=True)
