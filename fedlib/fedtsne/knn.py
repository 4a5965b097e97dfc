"""Exact k nearest neighbours of a low-rank score matrix, computed in row blocks: never n x n.

Every score matrix the Fed-tSNE pipelines rank is an inner product of n x r factors plus row and
column offsets,

    S_ij = F_i . G_j + r_i + c_j,                       F, G (n, r), r, c (n,),

(the Nystrom estimate B W^+ B^T = (B V) diag(mu) (B V)^T with W^+ = V diag(mu) V^T:
F = B V, G = F diag(mu), no offsets, :func:`fedlib.fedtsne.nystrom.nystrom_knn`; exact squared
Euclidean distances: F = X, G = -2 X, r = c = ||x||^2, :func:`exact_sq_knn`). :func:`blockwise_knn`
forms S a block of rows at a time (block rows chosen by a memory budget), clips it at 0 (the
``clip_0`` of Eq. 22 / Alg. 3), excludes i itself and keeps the k smallest (distances) or largest
(kernel values) of each row: O(n^2 r) time, O(n k + block n) memory. Ties are broken by the lower
column index, so the result does not depend on the block size. :func:`knn_graph` turns the lists
into a sparse symmetric (n, n) matrix.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from fedlib.core.validate import check_int, check_positive

BLOCK_BYTES = 256 * 2**20       # default memory budget of one block of scores (and its work arrays)
_BYTES_PER_SCORE = 24           # float64 score + the float64 / bool / int64 work arrays of one block


def check_k(k, n: int, name: str = "k") -> int:
    """k as an int in [1, n - 1] (a point is not its own neighbour), else ValueError naming ``name``."""
    if n < 2:
        raise ValueError(f"{name}: need at least 2 points, got {n}")
    return check_int(name, k, 1, n - 1)


def block_rows(n: int, block_bytes: float = BLOCK_BYTES) -> int:
    """Rows per block so that a (rows, n) block of scores and its work arrays fit ``block_bytes``."""
    check_positive("block_bytes", block_bytes)
    return int(max(1, min(n, block_bytes // (_BYTES_PER_SCORE * max(n, 1)))))


def select_extreme(S: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k smallest entries of every row of S (rows, n): (indices, values), ascending by value,
    ties by the lower index."""
    idx = np.argpartition(S, k - 1, axis=1)[:, :k]
    val = np.take_along_axis(S, idx, axis=1)
    thr = val.max(axis=1)
    # rows where more than k entries reach the k-th value: argpartition picked arbitrarily among them
    tied = np.flatnonzero((S <= thr[:, None]).sum(axis=1) > k)
    for r in tied:
        idx[r] = np.argsort(S[r], kind="stable")[:k]
        val[r] = S[r, idx[r]]
    order = np.lexsort((idx, val))                  # by value, then index, along each row
    return np.take_along_axis(idx, order, axis=1), np.take_along_axis(val, order, axis=1)


def blockwise_knn(F, G, k: int, *, largest: bool = False, row_offset=None, col_offset=None, clip: bool = True,
                  block_bytes: float = BLOCK_BYTES, rows: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The k nearest neighbours of every row under S = F G^T + r 1^T + 1 c^T (see the module docstring).

    ``largest=False``: the k smallest S_ij (distances), ``True``: the k largest (similarities);
    S is clipped at 0 first (``clip``), the diagonal is excluded. ``rows`` (or else ``block_bytes``,
    :func:`block_rows`) sets the block; the result does not depend on it. Returns (indices (n, k)
    int64, values (n, k) float64), each row sorted best first, ties by the lower index."""
    F = np.asarray(F, dtype=np.float64)
    G = np.asarray(G, dtype=np.float64)
    if F.ndim != 2 or G.shape != F.shape:
        raise ValueError(f"F and G must be (n, r) of the same shape, got {F.shape} and {G.shape}")
    n = len(F)
    k = check_k(k, n)
    r = np.zeros(n) if row_offset is None else np.asarray(row_offset, dtype=np.float64)
    c = np.zeros(n) if col_offset is None else np.asarray(col_offset, dtype=np.float64)
    if r.shape != (n,) or c.shape != (n,):
        raise ValueError(f"row_offset and col_offset must have shape ({n},), got {r.shape} and {c.shape}")
    step = block_rows(n, block_bytes) if rows is None else check_int("rows", rows, 1)
    sign = -1.0 if largest else 1.0
    out_idx = np.empty((n, k), dtype=np.int64)
    out_val = np.empty((n, k), dtype=np.float64)
    Gt = np.ascontiguousarray(G.T)
    for i0 in range(0, n, step):
        i1 = min(n, i0 + step)
        S = F[i0:i1] @ Gt
        S += r[i0:i1, None]
        S += c[None, :]
        if clip:
            np.maximum(S, 0.0, out=S)
        if largest:
            np.negative(S, out=S)
        S[np.arange(i1 - i0), np.arange(i0, i1)] = np.inf           # not one's own neighbour
        out_idx[i0:i1], v = select_extreme(S, k)
        out_val[i0:i1] = sign * v
    return out_idx, out_val


def exact_sq_knn(X, k: int, **kw) -> tuple[np.ndarray, np.ndarray]:
    """k nearest neighbours of the rows of X (n, m) under exact squared Euclidean distances,
    ||x_i||^2 + ||x_j||^2 - 2 x_i . x_j clipped at 0, by :func:`blockwise_knn` (keywords go there)."""
    X = np.asarray(X, dtype=np.float64)
    sq = np.einsum("ij,ij->i", X, X)
    return blockwise_knn(X, -2.0 * X, k, row_offset=sq, col_offset=sq, **kw)


def knn_graph(indices, values, symmetrize: str = "mean") -> sp.csr_matrix:
    """The sparse (n, n) matrix with ``values[i, t]`` at (i, ``indices[i, t]``); ``symmetrize``
    "mean" gives (A + A^T)/2, "max" the elementwise max, "none" A itself."""
    indices = np.asarray(indices)
    values = np.asarray(values, dtype=np.float64)
    if indices.ndim != 2 or values.shape != indices.shape:
        raise ValueError(f"indices and values must be (n, k) of the same shape, got {indices.shape} and {values.shape}")
    n, k = indices.shape
    A = sp.csr_matrix((values.ravel(), indices.ravel(), np.arange(0, n * k + 1, k)), shape=(n, n))
    if symmetrize == "mean":
        return ((A + A.T) * 0.5).tocsr()
    if symmetrize == "max":
        return A.maximum(A.T).tocsr()
    if symmetrize == "none":
        return A
    raise ValueError(f"unknown symmetrize {symmetrize!r}; allowed: mean, max, none")
