r"""FedProx's Synthetic(alpha, beta) federated data.

From Li et al., 2020, "Federated Optimization in Heterogeneous Networks".

Each client k has its own softmax-regression "true model" and its own input
distribution:

.. math::

    n_k &= \lfloor \mathrm{LogNormal}(4, 2) \rfloor + 50 \\
    u_k &\sim \mathcal N(0, \alpha^2), \quad B_k \sim \mathcal N(0, \beta^2) \\
    W_k &\sim \mathcal N(u_k, 1)^{60\times 10}, \quad b_k \sim \mathcal N(u_k, 1)^{10} \\
    v_k &\sim \mathcal N(B_k, 1)^{60}, \quad x \sim \mathcal N(v_k, \Sigma),\ \Sigma_{jj} = (j+1)^{-1.2} \\
    y &= \arg\max\ \mathrm{softmax}(x W_k + b_k)

(the second argument of N is the *standard deviation* in the authors' code:
``np.random.normal(0, alpha)``). ``alpha`` controls how much the local models
differ, ``beta`` how much the local input distributions differ. In the IID
variant every client has ``v_k = 0`` and one global ``W, b ~ N(0, 1)``.
"""

from __future__ import annotations

import numpy as np
import torch

from ..checks import check_bool, check_int, check_positive, check_range
from .federation import ClientData, Federation

__all__ = ["synthetic_federated", "SYNTHETIC_DIM", "SYNTHETIC_CLASSES"]

SYNTHETIC_DIM = 60
SYNTHETIC_CLASSES = 10


def synthetic_federated(
    alpha: float,
    beta: float,
    num_clients: int = 30,
    seed: int = 0,
    iid: bool = False,
    test_fraction: float = 0.1,
    max_samples: int | None = None,
) -> Federation:
    """FedProx's Synthetic(alpha, beta) data, one client per FedProx "user".

    The random draws follow the authors' generator call by call (sizes,
    ``u``, ``B``, every ``v_k``, [the IID ``W, b``], then per client ``W_k``,
    ``b_k`` and its samples) using ``np.random.RandomState(seed)``. Each
    client's samples are shuffled and split as in FedProx: the first
    ``int((1 - test_fraction) * n_k)`` for training, the rest for testing
    (90/10 by default).

    Args:
        alpha: Std of the per-client model mean ``u_k``, >= 0 (model heterogeneity).
        beta: Std of the per-client input mean ``B_k``, >= 0 (input heterogeneity).
        num_clients: number of clients (default 30).
        seed: seed of the random choices (default 0).
        iid: The IID variant: ``v_k = 0`` and one global ``W, b ~ N(0, 1)``; ``alpha`` and ``beta`` are then
            ignored (FedProx calls it with 0, 0). (default False)
        test_fraction: Share of each client's samples held out, in ``[0, 1)``. (default 0.1)
        max_samples: Cap on ``n_k``. ``LogNormal(4, 2)`` has a heavy tail (one client in thirty may get tens
            of thousands of samples); ``None`` (default) keeps the faithful sizes. Capping changes the later
            random draws too.

    Returns:
        Federation. Inputs: float32 ``[n, 60]`` (not scaled); labels int64 in ``0..9``. Each client's
            ``info`` holds its generating parameters as float64 arrays: ``"W"`` (60, 10), ``"b"`` (10,),
            ``"v"`` (60,), the scalars ``"u"`` and ``"B"`` (non-IID only) and ``"num_samples"`` (n_k).

    Example:
        >>> fed = synthetic_federated(1.0, 1.0, num_clients=5, seed=0)
        >>> fed.num_clients, fed.input_shape, fed.num_classes
        (5, (60,), 10)
        >>> c = fed[0]
        >>> c.num_train == int(0.9 * c.info["num_samples"])
        True
    """
    iid = check_bool(iid, "iid")
    alpha = check_positive(alpha, "alpha", allow_zero=True)
    beta = check_positive(beta, "beta", allow_zero=True)
    k = check_int(num_clients, "num_clients", 1)
    test_fraction = check_range(test_fraction, "test_fraction", 0, 1, high_open=True)
    if max_samples is not None:
        max_samples = check_int(max_samples, "max_samples", 1)

    d, c = SYNTHETIC_DIM, SYNTHETIC_CLASSES
    rs = np.random.RandomState(seed)
    sizes = rs.lognormal(4, 2, k).astype(int) + 50
    if max_samples is not None:
        sizes = np.minimum(sizes, max_samples)
    mean_w = rs.normal(0, alpha, k)
    mean_b = mean_w
    big_b = rs.normal(0, beta, k)
    cov_x = np.diag(np.power(np.arange(1, d + 1, dtype=np.float64), -1.2))
    mean_x = np.zeros((k, d))
    if not iid:
        for i in range(k):
            mean_x[i] = rs.normal(big_b[i], 1, d)
    if iid:
        w_global = rs.normal(0, 1, (d, c))
        b_global = rs.normal(0, 1, c)

    clients = []
    for i in range(k):
        w = rs.normal(mean_w[i], 1, (d, c))
        b = rs.normal(mean_b[i], 1, c)
        if iid:
            w, b = w_global, b_global
        n = int(sizes[i])
        x = rs.multivariate_normal(mean_x[i], cov_x, n)
        y = np.argmax(x @ w + b, axis=1)  # argmax of softmax = argmax of the logits
        order = rs.permutation(n)
        x, y = x[order], y[order]
        n_train = int((1.0 - test_fraction) * n)
        info = {"W": w.copy(), "b": b.copy(), "v": mean_x[i].copy(), "num_samples": n}
        if not iid:
            info.update(u=float(mean_w[i]), B=float(big_b[i]))
        xt = torch.from_numpy(x.astype(np.float32))
        yt = torch.from_numpy(y.astype(np.int64))
        clients.append(ClientData(xt[:n_train], yt[:n_train], xt[n_train:], yt[n_train:], info))
    name = "synthetic IID" if iid else f"synthetic({alpha:g}, {beta:g})"
    return Federation(clients, c, name)
