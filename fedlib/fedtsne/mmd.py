"""Fed-tSNE's kernel primitives: squared distances, the Gaussian kernel, the unbiased MMD^2 of Eq. 10
and its gradient (Eq. 13), the data-free Lipschitz bound of the step ``lr="auto"``, and THE kernel-width
rule (:func:`kernel_width`, with its zero-scale guard). Samples are ROWS: X (n, m), landmarks Y (n_y, m).

    f_p(Y) = (1^T K_XX 1 - n_p) / (n_p (n_p-1)) - 2 1^T K_XY 1 / (n_p n_y) + (1^T K_YY 1 - n_y) / (n_y (n_y-1))
    grad f_p(Y) = -4 gamma/(n_p n_y) [K_XY^T X_p - diag(1^T K_XY) Y] + 4 gamma/(n_y (n_y-1)) [K_YY Y - diag(1^T K_YY) Y]
"""
from __future__ import annotations

from numbers import Integral
from typing import Sequence

import numpy as np

from fedlib.core.messages import Message
from fedlib.core.validate import check_choice, check_positive
from fedlib.data.partition import make_partition

WEIGHTS = ("size", "uniform")
GAMMA_RULES = ("median", "moments")


def as_matrix(name: str, x, dim: int | None = None) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"{name} must be a 2-D array (samples, features), got shape {x.shape}")
    if dim is not None and x.shape[1] != dim:
        raise ValueError(f"{name} must have {dim} features (columns), got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{name} contains NaN or inf")
    return x


def check_clients(client_data) -> list[np.ndarray]:
    if isinstance(client_data, np.ndarray) or len(client_data) == 0:
        raise ValueError("client_data must be a non-empty list of (n_p, m) arrays, one per client")
    data = [as_matrix(f"client_data[{p}]", x) for p, x in enumerate(client_data)]
    dim = data[0].shape[1]
    for p, x in enumerate(data):
        if x.shape[1] != dim:
            raise ValueError(f"client_data[{p}] has {x.shape[1]} features, client 0 has {dim}")
        if len(x) < 2:
            raise ValueError(f"client {p} holds {len(x)} sample(s); the unbiased MMD^2 (Eq. 10) needs >= 2 per "
                             "client (fewer clients, or more samples per client)")
    return data


def resolve_parts(n: int, parts, seed: int) -> list[np.ndarray]:
    """``parts``: an int P (IID split by :func:`fedlib.data.partition.make_partition`) or P index arrays that
    partition range(n) (disjoint, covering every row)."""
    if isinstance(parts, (Integral, np.integer)) and not isinstance(parts, bool):
        p = int(parts)
        if p < 1:
            raise ValueError(f"number of clients must be >= 1, got {p}")
        if 2 * p > n:
            raise ValueError(f"{p} clients for {n} samples: more clients than samples allow (each client needs "
                             ">= 2 samples for Eq. 10)")
        return make_partition(np.zeros(n, dtype=np.int64), p, "iid", seed=seed)
    if parts is None or len(parts) == 0:
        raise ValueError("parts must be a number of clients or a non-empty list of index arrays")
    parts = [np.asarray(ix, dtype=np.int64).ravel() for ix in parts]
    if 2 * len(parts) > n:
        raise ValueError(f"{len(parts)} clients for {n} samples: more clients than samples allow")
    allidx = np.concatenate(parts)
    if len(allidx) != n or not np.array_equal(np.sort(allidx), np.arange(n)):
        raise ValueError("parts must partition the rows of X: disjoint index arrays covering 0..n-1")
    return parts


def split_clients(X, parts, seed: int = 0) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """X (n, m), parts (int P or P index arrays) -> (client arrays [X[ix] ...], index arrays)."""
    X = as_matrix("X", X)
    idx = resolve_parts(len(X), parts, seed)
    return [X[ix] for ix in idx], idx


def sq_distances(A, B=None) -> np.ndarray:
    """Squared Euclidean distances A (a, m), B (b, m) -> (a, b) in float64, clipped at 0.

    With B omitted: the (a, a) self-distances with an exact zero diagonal."""
    A = np.asarray(A, dtype=np.float64)
    same = B is None
    d2 = sq_distances_from_norms(A, A if same else np.asarray(B, dtype=np.float64))
    if same:
        np.fill_diagonal(d2, 0.0)
    return d2


def sq_distances_from_norms(A: np.ndarray, B: np.ndarray, a_sq: np.ndarray | None = None,
                  b_sq: np.ndarray | None = None) -> np.ndarray:
    """||a_i||^2 - 2 a_i.b_j + ||b_j||^2, clipped at 0, in the dtype of A and B (one dtype: FedDL's
    float32 rounds stay float32); ``a_sq`` / ``b_sq``: their squared row norms when already known."""
    dtype = A.dtype
    a_sq = np.einsum("ij,ij->i", A, A) if a_sq is None else a_sq.astype(dtype, copy=False)
    b_sq = (a_sq if B is A else np.einsum("ij,ij->i", B, B)) if b_sq is None else b_sq.astype(dtype, copy=False)
    d2 = A @ B.T
    d2 *= dtype.type(-2.0)
    d2 += a_sq[:, None]
    d2 += b_sq[None, :]
    np.maximum(d2, dtype.type(0.0), out=d2)
    return d2


def gaussian_kernel(A, B=None, gamma: float = 1.0) -> np.ndarray:
    """k(a, b) = exp(-gamma ||a - b||^2): A (a, m), B (b, m) -> (a, b) (self-kernel when B is None)."""
    check_positive("gamma", gamma)
    return np.exp(-gamma * sq_distances(A, B))


def xx_term(X: np.ndarray, gamma: float, chunk: int = 2048) -> float:
    """(1^T K_XX 1 - n) / (n (n-1)): the Y-independent first term of Eq. 10, in row blocks."""
    n = len(X)
    total = 0.0
    for s in range(0, n, chunk):
        total += float(np.exp(-gamma * sq_distances(X[s:s + chunk], X)).sum())
    # the diagonal contributes exactly n (k(x, x) = 1 up to rounding of the clipped distances)
    return (total - n) / (n * (n - 1))


def yy_terms(Y: np.ndarray, gamma: float) -> tuple[float, np.ndarray]:
    """Y-Y term of Eq. 10 and of Eq. 13 (the repulsion part of the gradient, (n_y, m)), in Y's dtype
    (float32 under FedDL's ``dtype="float32"``; the value summed in float64)."""
    ny, gamma = len(Y), float(gamma)   # a Python float keeps float32 arrays float32
    d2 = sq_distances_from_norms(Y, Y)
    np.fill_diagonal(d2, 0.0)
    kyy = np.exp(-gamma * d2)
    value = (kyy.sum(dtype=np.float64) - ny) / (ny * (ny - 1))
    grad = (4.0 * gamma / (ny * (ny - 1))) * (kyy @ Y - kyy.sum(0)[:, None] * Y)
    return float(value), grad


def cross_terms(X: np.ndarray, Y: np.ndarray, gamma: float, x_sq: np.ndarray | None = None,
                 y_sq: np.ndarray | None = None, sq_dist: np.ndarray | None = None) -> tuple[float, np.ndarray]:
    """Cross term of Eq. 10 (-2 1^T K_XY 1/(n_p n_y)) and of Eq. 13 (the attraction part, (n_y, m)),
    in the inputs' dtype when X and Y share one (float32 under FedDL's ``dtype="float32"``; the value
    summed in float64), else in float64. ``x_sq`` / ``y_sq``: the squared row norms of X / Y when
    already known (FedDL's clients keep theirs); ``sq_dist``: :func:`sq_distances_from_norms` (X, Y) (n, n_y)
    when already computed, overwritten."""
    n, ny, gamma = len(X), len(Y), float(gamma)   # a Python float keeps float32 arrays float32
    if X.dtype != Y.dtype:
        X, Y = np.asarray(X, dtype=np.float64), np.asarray(Y, dtype=np.float64)
    kxy = sq_distances_from_norms(X, Y, x_sq, y_sq) if sq_dist is None else sq_dist
    kxy *= -gamma
    np.exp(kxy, out=kxy)
    value = -2.0 * kxy.sum(dtype=np.float64) / (n * ny)
    # c (K^T X - diag(K^T 1) Y) with the scalar c folded into the (n, n_y) kernel and the (n_y,) column sums,
    # so the (n_y, m) result is written by the product and updated once in place
    c = -4.0 * gamma / (n * ny)
    col = kxy.sum(0)
    col *= c
    kxy *= c
    grad = kxy.T @ X
    grad -= col[:, None] * Y
    return float(value), grad


def client_median_sqdist(X, max_points: int = 1000, seed: int = 0) -> float:
    """What one client reveals for ``gamma="median"``: the median of its own pairwise squared distances
    (pairs i < j; on a random subset of ``max_points`` rows when n_p is larger). X (n_p, m) -> float."""
    X = as_matrix("X", X)
    if len(X) > max_points:
        X = X[np.random.default_rng(seed).choice(len(X), max_points, replace=False)]
    d2 = sq_distances(X)
    return float(np.median(d2[np.triu_indices(len(X), 1)]))


def _width(name: str, spread: float) -> float:
    """gamma = 1 / ``spread`` (a median or mean squared distance); a spread of 0 (duplicated points)
    has no width: ValueError, never a division by zero or an infinite gamma."""
    if not spread > 0:
        raise ValueError(f"the {name} kernel-width rule gave a squared-distance scale of {spread!r} (duplicated "
                         "points); pass gamma explicitly")
    return 1.0 / spread


def kernel_width(rule: str, setup: Sequence[Message], weights: str = "size") -> float:
    """THE kernel-width rule of every Fed-tSNE caller, from the clients' set-up uploads (one per client,
    :class:`FedDLClient` with ``setup`` naming ``rule``'s statistic):

    * ``"median"``: 1 / sum_p w_p med_p, med_p the median squared distance within client p;
    * ``"moments"``: 1 / E||x - x'||^2 = 1 / (2 sum_f var_f), var from the pooled sums (unbiased).

    w_p from ``weights`` ("size": n_p / n, "uniform": 1/P). A zero scale raises ValueError."""
    check_choice("gamma", rule, GAMMA_RULES)
    w = client_weights(np.array([msg["n"] for msg in setup], dtype=np.float64), weights)
    if rule == "median":
        return _width("median", float(np.dot(w, [msg["median_sqdist"] for msg in setup])))
    _, var = pooled_moments(setup)
    return _width("moments", 2.0 * float(var.sum()))


def median_kernel_width(X) -> float:
    """The median rule on one data set X (n, m), n >= 2: 1 / median of its pairwise squared distances
    (pairs i < j; every pair, no subsampling). Duplicated points (median 0) raise ValueError."""
    X = as_matrix("X", X)
    if len(X) < 2:
        raise ValueError(f"the median kernel width needs >= 2 rows, got {len(X)}")
    return _width("median", float(np.median(sq_distances(X)[np.triu_indices(len(X), 1)])))


def client_weights(n_p: np.ndarray, weights: str) -> np.ndarray:
    """w_p (P,): n_p / n ("size", Thm 1) or 1/P ("uniform", Alg. 1)."""
    check_choice("weights", weights, WEIGHTS)
    return n_p / n_p.sum() if weights == "size" else np.full(len(n_p), 1.0 / len(n_p))


def pooled_moments(setup: Sequence[Message]) -> tuple[np.ndarray, np.ndarray]:
    """Exact pooled mean and unbiased variance (m,) from the clients' sums and sums of squares."""
    n = float(sum(msg["n"] for msg in setup))
    mean = sum(msg["sum"] for msg in setup) / n
    var = np.maximum(sum(msg["sumsq"] for msg in setup) / n - mean ** 2, 0.0) * n / max(n - 1.0, 1.0)
    return mean, var


def expected_gaussian_kernel(s2: float, dmu2: float, gamma: float, dim: int) -> float:
    """E k(x, y) for x ~ N(mu_1, s_1^2 I), y ~ N(mu_2, s_2^2 I) in R^dim, k = exp(-gamma ||x - y||^2):
    (1 + 2 gamma s2)^{-dim/2} exp(-gamma dmu2 / (1 + 2 gamma s2)), s2 = s_1^2 + s_2^2,
    dmu2 = ||mu_1 - mu_2||^2 (the exact MMD^2 of two Gaussians from three such terms, Eq. 10)."""
    return (1 + 2 * gamma * s2) ** (-dim / 2) * np.exp(-gamma * dmu2 / (1 + 2 * gamma * s2))
