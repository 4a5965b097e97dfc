"""The final upload and the Nystrom estimate (Eqs. 18-22; Algorithm 2 step 3-4, Algorithm 3 step 3-4):
the clients' distance / kernel blocks (:class:`NystromClient`), the server's assembly
(:class:`NystromServer`: D2_hat = B W^+ B^T on squared distances, or C W^+ C^T for the kernel), its
k nearest neighbours without the n x n matrix (:func:`nystrom_knn`: W^+ = V diag(mu) V^T makes the
estimate the Gram of the n x r features B V, ranked blockwise by :mod:`~fedlib.fedtsne.knn`),
and what the server learns from the distance upload (:func:`reconstruct_from_sq_distances`)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedlib.core import uploads
from fedlib.core.messages import Message
from fedlib.core.protocol import Server
from fedlib.core.validate import check_choice, check_int, check_positive
from fedlib.fedtsne.knn import BLOCK_BYTES, blockwise_knn, check_k
from fedlib.fedtsne.mmd import _as_matrix, gaussian_kernel, sq_distances


INVERSES = ("pinv", "ridge")


def client_sq_distances(X_p, Y, sender: str = "client") -> Message:
    """Fed-tSNE/UMAP upload (Alg. 2 step 3): {"sq_distances": ||x_i - y_j||^2 (n_p, n_y)}."""
    return Message(sender, {"sq_distances": sq_distances(_as_matrix("X_p", X_p), _as_matrix("Y", Y))})


def client_kernel(X_p, Y, gamma: float, sender: str = "client") -> Message:
    """Fed-SpeClust upload (Alg. 3 step 3): {"kernel": K_{X_p,Y} (n_p, n_y)}."""
    return Message(sender, {"kernel": gaussian_kernel(_as_matrix("X_p", X_p), _as_matrix("Y", Y), gamma)})


def _check_inverse(inverse: str, rank, ridge, ny: int | None = None) -> None:
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
    (the notes' trace rule is 0 for a distance matrix); mu = 1/(lambda_i + lambda)."""
    W = np.asarray(W, dtype=np.float64)
    if W.ndim != 2 or W.shape[0] != W.shape[1]:
        raise ValueError(f"W must be square, got shape {W.shape}")
    _check_inverse(inverse, rank, ridge, len(W))
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


def nystrom_distances(B_sq, W_sq, **inverse_kw) -> np.ndarray:
    """Alg. 2 step 4 on SQUARED distances: sqrt(clip_0(B W^+ B^T)) with zero diagonal, (n, n)."""
    return distances_from_squared(nystrom(B_sq, W_sq, **inverse_kw))


def nystrom_kernel(C, W, **inverse_kw) -> np.ndarray:
    """Alg. 3 step 4: K_hat = clip_0(sym(C W^+ C^T)), (n, n)."""
    return np.maximum(nystrom(C, W, **inverse_kw), 0.0)


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


@dataclass(frozen=True)
class NystromClient:
    """Client program of the final upload, :class:`fedlib.core.protocol.Client`: from the broadcast
    landmarks Y (n_y, m), client p uploads {"sq_distances": D_p (n_p, n_y)} (Alg. 2 step 3,
    :func:`client_sq_distances`) or, for ``kind="kernel"``, {"kernel": K_{X_p,Y} (n_p, n_y)} with the
    broadcast gamma (Alg. 3 step 3, :func:`client_kernel`)."""

    kind: str = "distances"

    def init_state(self, k: int) -> dict:
        return {"k": k}

    def step(self, data, state: dict, broadcast: Message) -> Message:
        sender = f"client{state['k']}"
        if self.kind == "distances":
            return client_sq_distances(data, broadcast["landmarks"], sender)
        return client_kernel(data, broadcast["landmarks"], broadcast["gamma"], sender)


class NystromServer(Server):
    """Server of the Nystrom step, :class:`fedlib.core.protocol.Server`: broadcasts Y (and gamma for
    ``kind="kernel"``), stacks the clients' blocks B = [D_1; ...; D_P] (Eq. 21) and ``result()`` is
    the estimate in the clients' stacked row order: sqrt(clip_0(B W^+ B^T)) with W = D_YY (Eq. 22,
    :func:`nystrom_distances`) or clip_0(C W^+ C^T) with W = K_YY (Alg. 3 step 4, :func:`nystrom_kernel`).
    With ``neighbors=k`` the server never forms the n x n estimate: ``result()`` is its k nearest
    neighbours (indices, values) from :func:`nystrom_knn` (``block_bytes`` bounds its work memory).
    Keywords go to :func:`landmark_pinv`."""

    def __init__(self, landmarks, kind: str = "distances", gamma: float | None = None, *,
                 neighbors: int | None = None, block_bytes: float = BLOCK_BYTES, **inverse_kw):
        check_choice("kind", kind, NYSTROM_KINDS)
        self.Y, self.kind, self.inverse_kw = _as_matrix("landmarks", landmarks), kind, inverse_kw
        self.gamma = check_positive("gamma", gamma) if kind == "kernel" else None
        self.neighbors = None if neighbors is None else check_int("neighbors", neighbors, 1)
        self.block_bytes = check_positive("block_bytes", block_bytes)
        self.estimate = None

    def broadcast(self) -> Message:
        payload = {"landmarks": self.Y}
        if self.kind == "kernel":
            payload["gamma"] = self.gamma
        return Message("server", payload)

    def expects(self) -> uploads.Expected:
        key, high = ("sq_distances", None) if self.kind == "distances" else ("kernel", 1.0)
        entry = uploads.Tensor(("n", len(self.Y)), ("float64",), array="numpy", low=0.0, high=high)
        return uploads.Expected(({key: entry},), local=("n",), what="Nystrom upload")

    def absorb(self, messages: list[Message]) -> None:
        if self.kind == "distances":
            B = np.vstack([msg["sq_distances"] for msg in messages])                      # Eq. 21
            W = sq_distances(self.Y)
        else:
            B = np.vstack([msg["kernel"] for msg in messages])
            W = gaussian_kernel(self.Y, None, self.gamma)
        if self.neighbors is not None:
            self.estimate = nystrom_knn(B, W, self.neighbors, self.kind, block_bytes=self.block_bytes,
                                        **self.inverse_kw)
        elif self.kind == "distances":
            self.estimate = nystrom_distances(B, W, **self.inverse_kw)                    # Eq. 22
        else:
            self.estimate = nystrom_kernel(B, W, **self.inverse_kw)

    def result(self):
        """The estimate (n, n), or with ``neighbors`` its (indices, values) (n, k), stacked row order."""
        return self.estimate


def reconstruct_from_sq_distances(sq_dists, landmarks, return_residual: bool = False):
    """Multilateration: recover samples from their squared distances (n, n_y) to known landmarks (n_y, m).

    With c_j = y_j - y_bar and u = x - y_bar, ||x - y_j||^2 = ||u||^2 - 2 u^T c_j + ||c_j||^2; subtracting
    the mean over j removes ||u||^2 and leaves the linear system

        C u = (||c_j||^2 - mean_j ||c_j||^2 - (d_j - mean_j d_j)) / 2,     C = [c_1; ...; c_{n_y}] (n_y, m).

    Its least-squares minimum-norm solution is the component of u in span{y_j - y_bar}, so
    x_hat = y_bar + P(x - y_bar): exact when n_y >= m + 1 landmarks are in general position, the
    orthogonal projection of x onto the landmarks' affine span otherwise. ``return_residual`` also
    gives the distance of each x from that span, sqrt(max(d_j - ||x_hat - y_j||^2, 0)) averaged over j,
    which the uploads reveal as well. Returns x_hat (n, m) [, residual (n,)]."""
    Y = _as_matrix("landmarks", landmarks)
    D = np.asarray(sq_dists, dtype=np.float64)
    if D.ndim != 2 or D.shape[1] != len(Y):
        raise ValueError(f"sq_dists must have shape (n, n_landmarks={len(Y)}), got {D.shape}")
    if len(Y) < 2:
        raise ValueError(f"n_landmarks must be >= 2, got {len(Y)}")
    ybar = Y.mean(0)
    C = Y - ybar
    c2 = np.einsum("ij,ij->i", C, C)
    rhs = 0.5 * ((c2 - c2.mean())[None, :] - (D - D.mean(1, keepdims=True)))       # (n, n_y)
    U = np.linalg.lstsq(C, rhs.T, rcond=None)[0].T                                   # (n, m)
    Xhat = ybar + U
    if not return_residual:
        return Xhat
    resid = np.sqrt(np.maximum(D - sq_distances(Xhat, Y), 0.0).mean(1))
    return Xhat, resid


def nystrom_estimate(X, landmarks, squared: bool = True) -> np.ndarray:
    """The server's distance estimate (n, n) from landmarks Y (n_y, m), in the row order of X (n, m):
    ``squared=True`` is Eqs. 21-22 on squared distances (:func:`nystrom_distances`, the method);
    ``squared=False`` is Eq. 22 read literally on plain distances, symmetrized, clipped at 0, zero
    diagonal (an ablation: never exact)."""
    if squared:
        return nystrom_distances(sq_distances(X, landmarks), sq_distances(landmarks))
    H = np.maximum(nystrom(np.sqrt(sq_distances(X, landmarks)), np.sqrt(sq_distances(landmarks))), 0.0)
    np.fill_diagonal(H, 0.0)
    return H
