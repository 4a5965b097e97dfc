"""The final upload and the Nystrom estimate (Eqs. 18-22; Algorithm 2 step 3-4, Algorithm 3 step 3-4):
the estimate B W^+ B^T (:func:`nystrom`) with its middle factor (:func:`landmark_pinv`), and its k nearest
neighbours without the n x n matrix (:func:`nystrom_knn`: W^+ = V diag(mu) V^T makes the estimate the
Gram of the n x r features B V, ranked blockwise by :mod:`~fedlib.fedtsne.knn`). The clients and the
server of the step are in :mod:`fedlib.fedtsne.algorithm`."""
from __future__ import annotations

import numpy as np

from fedlib.core.validate import check_choice, check_int, check_positive
from fedlib.fedtsne.knn import BLOCK_BYTES, blockwise_knn, check_k

INVERSES = ("pinv", "ridge")


def check_inverse(inverse: str, rank, ridge, ny: int | None = None) -> None:
    check_choice("inverse", inverse, INVERSES)
    if rank is not None:
        if inverse != "pinv":
            raise ValueError("rank applies to inverse='pinv' only")
        check_int("rank", rank, 1)
        if ny is not None and rank > ny:
            raise ValueError(f"rank must be <= n_landmarks = {ny}, got {rank}")
    if ridge is not None:
        if inverse != "ridge":
            raise ValueError("ridge applies to inverse='ridge' only")
        check_positive("ridge", ridge)


def landmark_pinv_factors(W, *, inverse: str = "pinv", rank: int | None = None, ridge: float | None = None,
                          rcond: float = 1e-10) -> tuple[np.ndarray, np.ndarray]:
    """The middle factor of the Nystrom estimate in eigen-form, W^+ = V diag(mu) V^T: (V (n_y, r), mu (r,)).

    ``"pinv"``: W_k^+ (Eq. 19), the pseudo-inverse of the best rank-k approximation; W may be
    indefinite (a distance matrix), so the k eigenvalues of largest |lambda| are kept (k = ``rank``,
    default all), and those with |lambda| <= rcond max|lambda| dropped; mu = 1/lambda. ``"ridge"``:
    (W + lambda I)^{-1} ("add an identity matrix", Sec. 4.1), lambda = ``ridge``, default 1e-8 ||W||_2
    (a rule scaled by tr W would give 0: a distance matrix has a zero diagonal); mu = 1/(lambda_i + lambda)."""
    W = np.asarray(W, dtype=np.float64)
    if W.ndim != 2 or W.shape[0] != W.shape[1]:
        raise ValueError(f"W must be square, got shape {W.shape}")
    check_inverse(inverse, rank, ridge, len(W))
    W = 0.5 * (W + W.T)
    lam, V = np.linalg.eigh(W)
    if inverse == "ridge":
        r = 1e-8 * np.abs(lam).max() if ridge is None else ridge
        return V, 1.0 / (lam + r)
    order = np.argsort(-np.abs(lam))
    keep = order[: rank if rank is not None else len(lam)]
    keep = keep[np.abs(lam[keep]) > rcond * np.abs(lam).max()]
    return V[:, keep], 1.0 / lam[keep]


def landmark_pinv(W, *, inverse: str = "pinv", rank: int | None = None, ridge: float | None = None,
                  rcond: float = 1e-10) -> np.ndarray:
    """The middle factor of the Nystrom estimate, W symmetric (n_y, n_y) -> (n_y, n_y): V diag(mu) V^T
    from :func:`landmark_pinv_factors` (see there for ``inverse``, ``rank``, ``ridge``, ``rcond``)."""
    V, mu = landmark_pinv_factors(W, inverse=inverse, rank=rank, ridge=ridge, rcond=rcond)
    return (V * mu) @ V.T


def nystrom(B, W, **inverse_kw) -> np.ndarray:
    """Nystrom estimate B W^+ B^T (Eq. 19/22; C W^{-1} C^T of Alg. 3), symmetrized: B (n, n_y) -> (n, n).
    Keywords go to :func:`landmark_pinv`. Each upload is checked first: one (n_p, n_y) float64 block,
    finite, squared distances >= 0 or kernel values in [0, 1]."""
    B = np.asarray(B, dtype=np.float64)
    W = np.asarray(W, dtype=np.float64)
    if B.ndim != 2 or W.shape != (B.shape[1], B.shape[1]):
        raise ValueError(f"B must be (n, n_y) and W (n_y, n_y); got {B.shape} and {W.shape}")
    H = B @ landmark_pinv(W, **inverse_kw) @ B.T
    return 0.5 * (H + H.T)


def distances_from_squared(D2) -> np.ndarray:
    """Estimated squared distances (n, n) -> Euclidean distances: symmetrize, clip at 0, zero the
    diagonal, square root (what sklearn's TSNE and umap-learn expect with metric="precomputed")."""
    D2 = np.asarray(D2, dtype=np.float64)
    if D2.ndim != 2 or D2.shape[0] != D2.shape[1]:
        raise ValueError(f"D2 must be square, got shape {D2.shape}")
    D = np.maximum(0.5 * (D2 + D2.T), 0.0)
    np.fill_diagonal(D, 0.0)
    return np.sqrt(D)


NYSTROM_KINDS = ("distances", "kernel")


def nystrom_knn(B, W, k: int, kind: str = "distances", *, block_bytes: float = BLOCK_BYTES, rows: int | None = None,
                **inverse_kw) -> tuple[np.ndarray, np.ndarray]:
    """The k nearest neighbours of every row under the Nystrom estimate, without the n x n matrix.

    With W^+ = V diag(mu) V^T (:func:`landmark_pinv_factors`, keywords ``inverse_kw``) the estimate is
    the Gram B W^+ B^T = F diag(mu) F^T of the n x r features F = B V, so :func:`~fedlib.fedtsne.knn.blockwise_knn`
    ranks it a block of rows at a time (``block_bytes`` or ``rows``). ``kind="distances"`` (B, W squared
    distances, Eq. 22): the k smallest clip_0(b_i W^+ b_j^T), returned as distances
    sqrt(clip_0(.)) (what :func:`nystrom_distances` holds at those entries), nearest first.
    ``kind="kernel"`` (C, W = K_YY, Alg. 3): the k largest clip_0(c_i W^+ c_j^T) (:func:`nystrom_kernel`'s
    entries), largest first. The diagonal is excluded; ties go to the lower row index. Returns
    (indices (n, k) int64, values (n, k) float64) in the row order of B."""
    check_choice("kind", kind, NYSTROM_KINDS)
    B = np.asarray(B, dtype=np.float64)
    W = np.asarray(W, dtype=np.float64)
    if B.ndim != 2 or W.shape != (B.shape[1], B.shape[1]):
        raise ValueError(f"B must be (n, n_y) and W (n_y, n_y); got {B.shape} and {W.shape}")
    check_k(k, len(B))
    V, mu = landmark_pinv_factors(W, **inverse_kw)
    F = B @ V
    idx, val = blockwise_knn(F, F * mu, k, largest=kind == "kernel", block_bytes=block_bytes, rows=rows)
    return idx, (np.sqrt(val) if kind == "distances" else val)
