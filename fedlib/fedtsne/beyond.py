"""Beyond the Fed-tSNE / Fed-UMAP paper: what the distance upload of Algorithm 2 is,
better estimates from the same upload, federated k-means landmarks, and local placement.

**1. The upload is a projection and a residual** (chapter ``fedtsne_beyond``, Sec. 1). Landmarks
y_0..y_r (n_y = r + 1 <= m + 1 rows, affinely independent) span an r-dimensional affine hull. With
C = [y_1 - y_0; ...; y_r - y_0] (r, m) and its QR factors C^T = Q R (Q (m, r) orthonormal, R (r, r)
upper triangular), every x splits into hull coordinates z = Q^T (x - y_0) (r,) and a residual
rho = dist(x, hull) >= 0. Client p's upload b_j = ||x - y_j||^2 (Alg. 2 step 3) satisfies

    R^T z = (||c_j||^2 - (b_j - b_0)) / 2   (j = 1..r),      rho^2 = b_0 - ||z||^2,          (ftsb-decompose)

a triangular system: the upload and (z, rho) determine each other (:func:`decompose_upload`). With
the circumcentre c* of the landmarks (R^T c* = ||c_j||^2 / 2, circumradius^2 a^2 = ||c*||^2) and the
power pi = ||z - c*||^2 + rho^2 - a^2 of x, the Nystrom estimate on squared distances (Eq. 22,
W = D_YY invertible) is exactly

    D2_hat_ij = ||z_i - z_j||^2 + rho_i^2 + rho_j^2 + pi_i pi_j / (2 a^2)                     (ftsb-closed)

(:func:`nystrom_closed_form`; derivation in the chapter), against the truth
D2_ij = ||z_i - z_j||^2 + rho_i^2 + rho_j^2 - 2 rho_i rho_j cos(theta_ij).

**2. Estimators from the same upload** (:data:`ESTIMATORS`, :func:`estimator_factors`): "nystrom"
(ftsb-closed), "projection" ||z_i - z_j||^2, "residual_sum" ||z_i - z_j||^2 + rho_i^2 + rho_j^2
(cos theta = 0, the centre of the interval the upload allows), "residual_gap"
||z_i - z_j||^2 + (rho_i - rho_j)^2 (cos theta = 1, its lower end). Every one is
S = F G^T + r 1^T + 1 c^T of low rank, so its k nearest neighbours come from
:func:`~fedlib.fedtsne.knn.blockwise_knn` without the n x n matrix. Federated k-means landmarks
(:class:`KMeansClient`, :class:`KMeansServer`, :func:`federated_kmeans`): Lloyd's step needs only
per-client sums and counts.

**3. Local placement** (:class:`PlacementClient`, :class:`PlacementServer`, :func:`local_placement`):
the server embeds only the landmarks (openTSNE / umap-learn) and broadcasts them with their
embedding; each client places its own points with openTSNE's ``TSNEEmbedding.transform`` or UMAP's
``transform`` and uploads (at most) its 2-D positions.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import pandas as pd
import scipy.linalg as sla
import scipy.sparse as sp
from tqdm.auto import tqdm

from fedlib.core import uploads
from fedlib.core.messages import Cost, Message
from fedlib.core.protocol import ClientStates, Server, simulate
from fedlib.core.validate import check_choice, check_int, check_positive
from fedlib.fedtsne.algorithm import client_sq_distances
from fedlib.fedtsne.chapters import list_overlap
from fedlib.fedtsne.feddl import feddl, plateau_share
from fedlib.fedtsne.knn import blockwise_knn, check_k, exact_sq_knn
from fedlib.fedtsne.mmd import as_matrix, check_clients, sq_distances
from fedlib.fedtsne.pipelines import METHOD_NAMES, opentsne_runner

ESTIMATORS = ("nystrom", "projection", "residual_sum", "residual_gap")
ESTIMATOR_NAMES = {"nystrom": "Nyström (Eq. 22)", "projection": "projection only",
                   "residual_sum": "projection + residuals", "residual_gap": "projection + residual gap"}
LANDMARK_KINDS = ("feddl", "kmeans")
LANDMARK_NAMES = {"feddl": "FedDL", "kmeans": "federated k-means"}
AFFINE_TOL = 1e-10          # |R_jj| <= AFFINE_TOL max |R_jj|: the landmarks are affinely dependent


# ------------------------------------------------------------------------------------------------
# 1. The closed form and the decomposition of the upload
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class HullGeometry:
    """The landmarks' affine hull: origin y_0 (m,), orthonormal basis Q (m, r), R (r, r) with
    C^T = Q R (C = Y[1:] - y_0), the circumcentre in hull coordinates (r,) and circumradius^2."""

    landmarks: np.ndarray
    origin: np.ndarray
    Q: np.ndarray
    R: np.ndarray
    center: np.ndarray
    radius2: float

    @property
    def dim(self) -> int:
        """r = n_y - 1, the dimension of the hull."""
        return self.R.shape[0]


def hull_geometry(landmarks) -> HullGeometry:
    """:class:`HullGeometry` of landmarks Y (n_y, m). ValueError (naming ``n_landmarks``) unless
    2 <= n_y <= m + 1 and the landmarks are affinely independent (then W = D_YY is invertible)."""
    Y = as_matrix("landmarks", landmarks)
    ny, m = Y.shape
    if ny < 2:
        raise ValueError(f"n_landmarks must be >= 2, got {ny}")
    if ny > m + 1:
        raise ValueError(f"n_landmarks must be <= m + 1 = {m + 1} for the closed form (affinely independent "
                         f"landmarks), got {ny}")
    C = Y[1:] - Y[0]
    Q, R = np.linalg.qr(C.T)                           # C^T = Q R, Q (m, r), R (r, r)
    d = np.abs(np.diag(R))
    if d.min() <= AFFINE_TOL * d.max():
        raise ValueError("landmarks are affinely dependent (W = D_YY is singular): the closed form needs "
                         f"n_landmarks = {ny} affinely independent landmarks")
    c2 = np.einsum("ij,ij->i", C, C)
    center = sla.solve_triangular(R, 0.5 * c2, trans="T")  # R^T c* = ||c_j||^2 / 2
    return HullGeometry(Y, Y[0].copy(), Q, R, center, float(center @ center))


@dataclass(frozen=True)
class UploadDecomposition:
    """What the upload B (n, n_y) is, point by point: hull coordinates ``coords`` z (n, r), residual
    distance ``residual`` rho (n,) and the power ``power`` pi = ||z - c*||^2 + rho^2 - a^2 (n,)."""

    geometry: HullGeometry
    coords: np.ndarray
    residual: np.ndarray
    power: np.ndarray

    @property
    def projection(self) -> np.ndarray:
        """The projections p_i = y_0 + Q z_i onto the hull, in feature space (n, m)."""
        return self.geometry.origin + self.coords @ self.geometry.Q.T

    @property
    def barycentric(self) -> np.ndarray:
        """Landmark (barycentric) coordinates lambda (n, n_y) of the projections: p_i = sum_j lambda_ij y_j,
        sum_j lambda_ij = 1 (lambda_{1..r} = R^{-1} z, lambda_0 = 1 - their sum)."""
        lam = sla.solve_triangular(self.geometry.R, self.coords.T).T
        return np.hstack([1.0 - lam.sum(1, keepdims=True), lam])


def decompose_upload(sq_dists, landmarks, geometry: HullGeometry | None = None) -> UploadDecomposition:
    """The server's side of Eq. (ftsb-decompose): from the upload B (n, n_y) of squared distances to the
    landmarks (n_y, m) alone, z (n, r) from the triangular system R^T z = (||c_j||^2 - (b_j - b_0)) / 2
    and rho = sqrt(max(b_0 - ||z||^2, 0)). O(n r^2)."""
    g = hull_geometry(landmarks) if geometry is None else geometry
    B = np.asarray(sq_dists, dtype=np.float64)
    if B.ndim != 2 or B.shape[1] != g.dim + 1:
        raise ValueError(f"sq_dists must have shape (n, n_landmarks={g.dim + 1}), got {B.shape}")
    C = g.landmarks[1:] - g.origin
    c2 = np.einsum("ij,ij->i", C, C)
    rhs = 0.5 * (c2[None, :] - (B[:, 1:] - B[:, :1]))                      # (n, r)
    Z = sla.solve_triangular(g.R, rhs.T, trans="T").T
    rho2 = np.maximum(B[:, 0] - np.einsum("ij,ij->i", Z, Z), 0.0)
    power = np.einsum("ij,ij->i", Z - g.center, Z - g.center) + rho2 - g.radius2
    return UploadDecomposition(g, Z, np.sqrt(rho2), power)


def nystrom_closed_form(dec: UploadDecomposition) -> np.ndarray:
    """Eq. (ftsb-closed): the Nystrom estimate B W^{-1} B^T of the squared distances (n, n), from the
    decomposition alone: ||z_i - z_j||^2 + rho_i^2 + rho_j^2 + pi_i pi_j / (2 a^2)."""
    F, G, r, c = estimator_factors(dec, "nystrom")
    return F @ G.T + r[:, None] + c[None, :]


def points_with_same_upload(X, landmarks, rng: np.random.Generator) -> np.ndarray:
    """Other points with the SAME upload: each x (n, m) moved to p + rho u, u a random unit vector
    orthogonal to the hull (the points the server cannot tell from x). Needs n_y <= m."""
    X = as_matrix("X", X)
    g = hull_geometry(landmarks)
    if g.dim >= X.shape[1]:
        raise ValueError(f"n_landmarks = {g.dim + 1} = m + 1: the hull is the whole space, x is determined")
    U = X - g.origin
    Z = U @ g.Q
    H = U - Z @ g.Q.T
    rho = np.linalg.norm(H, axis=1)
    V = rng.standard_normal(X.shape)
    V -= (V @ g.Q) @ g.Q.T
    V /= np.linalg.norm(V, axis=1, keepdims=True)
    return g.origin + Z @ g.Q.T + rho[:, None] * V


# ------------------------------------------------------------------------------------------------
# 2. Estimators from the same upload
# ------------------------------------------------------------------------------------------------
def estimator_factors(dec: UploadDecomposition, estimator: str):
    """The estimate of the squared distances as S = F G^T + r 1^T + 1 c^T: returns (F, G, r, c), F and
    G (n, k), r = c (n,). ``estimator``: "nystrom" (ftsb-closed: F = [z, pi], G = [-2 z, pi / (2 a^2)]),
    "projection" (F = z, G = -2 z, r = ||z||^2), "residual_sum" (r = ||z||^2 + rho^2),
    "residual_gap" (F = [z, rho], G = -2 F, r = ||z||^2 + rho^2)."""
    check_choice("estimator", estimator, ESTIMATORS)
    z, rho = dec.coords, dec.residual
    zz = np.einsum("ij,ij->i", z, z)
    if estimator == "projection":
        return z, -2.0 * z, zz, zz
    off = zz + rho ** 2
    if estimator == "residual_sum":
        return z, -2.0 * z, off, off
    if estimator == "residual_gap":
        F = np.hstack([z, rho[:, None]])
        return F, -2.0 * F, off, off
    pi = dec.power[:, None]
    return np.hstack([z, pi]), np.hstack([-2.0 * z, pi / (2.0 * dec.geometry.radius2)]), off, off


def estimate_sq_distances(dec: UploadDecomposition, estimator: str) -> np.ndarray:
    """The dense estimate (n, n) of the squared distances by ``estimator`` (see :func:`estimator_factors`)."""
    F, G, r, c = estimator_factors(dec, estimator)
    return F @ G.T + r[:, None] + c[None, :]


def estimator_knn(dec: UploadDecomposition, estimator: str, k: int, **kw) -> tuple[np.ndarray, np.ndarray]:
    """The k nearest neighbours of every point under ``estimator`` (clipped at 0, the point itself
    excluded), blockwise without the n x n matrix: (indices (n, k), squared distances (n, k))."""
    F, G, r, c = estimator_factors(dec, estimator)
    return blockwise_knn(F, G, k, row_offset=r, col_offset=c, **kw)


def knn_recall(indices, exact_indices) -> float:
    """Mean over points of |N_hat(i) ∩ N(i)| / k for two (n, k) neighbour lists."""
    a, b = np.asarray(indices), np.asarray(exact_indices)
    if a.shape != b.shape:
        raise ValueError(f"indices and exact_indices must have one shape, got {a.shape} and {b.shape}")
    return list_overlap(a, b)


def feasible_violations(dec: UploadDecomposition, block: int = 1024) -> float:
    """Share of pairs i != j whose Nystrom estimate lies outside the interval of squared distances the
    upload allows, [||z_i - z_j||^2 + (rho_i - rho_j)^2, ||z_i - z_j||^2 + (rho_i + rho_j)^2]
    (relative slack 1e-9), computed in row blocks."""
    n = len(dec.coords)
    F, G, r, c = estimator_factors(dec, "nystrom")
    z, rho = dec.coords, dec.residual
    zz = np.einsum("ij,ij->i", z, z)
    bad = 0
    for i0 in range(0, n, block):
        i1 = min(n, i0 + block)
        est = F[i0:i1] @ G.T + r[i0:i1, None] + c[None, :]
        proj = zz[i0:i1, None] + zz[None, :] - 2.0 * z[i0:i1] @ z.T
        lo = proj + (rho[i0:i1, None] - rho[None, :]) ** 2
        hi = proj + (rho[i0:i1, None] + rho[None, :]) ** 2
        slack = 1e-9 * np.maximum(np.abs(hi), 1e-300)
        out = (est < lo - slack) | (est > hi + slack)
        out[np.arange(i1 - i0), np.arange(i0, i1)] = False
        bad += int(out.sum())
    return bad / (n * (n - 1))


# ------------------------------------------------------------------------------------------------
# 2b. Federated k-means landmarks (Lloyd's step from per-client sums and counts)
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class KMeansClient:
    """Client program of federated Lloyd, :class:`fedlib.core.protocol.Client`: from the broadcast
    centres C (n_y, m), client p assigns each of its points to the nearest centre (ties: the lower
    index) and uploads {"sums": S_p (n_y, m), "counts": N_p (n_y,)}, S_pk = sum of its points in cell k."""

    def init_state(self, k: int) -> dict:
        return {"k": k}

    def step(self, data, state: dict, broadcast: Message) -> Message:
        C = broadcast["centers"]
        X = np.asarray(data, dtype=np.float64)
        lab = np.argmin(sq_distances(X, C), axis=1)
        onehot = sp.csr_matrix((np.ones(len(X)), (lab, np.arange(len(X)))), shape=(len(C), len(X)))
        return Message(f"client{state['k']}", {"sums": np.asarray(onehot @ X),
                                               "counts": np.bincount(lab, minlength=len(C)).astype(np.float64)})


class KMeansServer(Server):
    """Server of federated Lloyd: broadcasts the centres; from the uploads, c_k <- sum_p S_pk / sum_p N_pk
    (a cell nobody fills keeps its centre). It needs only the totals, so additive secure aggregation of
    the uploads suffices; without it each client's cell means are visible, and a cell holding one of a
    client's points is that point (counted in ``singleton_cells``)."""

    def __init__(self, init):
        self.C = as_matrix("init", init).copy()
        self.shifts: list[float] = []
        self.empty: list[int] = []
        self.singleton_cells: list[int] = []

    def broadcast(self) -> Message:
        return Message("server", {"centers": self.C})

    def expects(self) -> uploads.Expected:
        """Per client: cell sums (n_y, m) and counts (n_y,), float64, finite, counts whole numbers >= 0."""
        form = {"sums": uploads.Tensor(self.C.shape, ("float64",), array="numpy"),
                "counts": uploads.Tensor((len(self.C),), ("float64",), array="numpy", low=0.0, integral=True)}
        return uploads.Expected((form,), what="k-means upload")

    def absorb(self, messages: list[Message]) -> None:
        S = sum(msg["sums"] for msg in messages)
        N = sum(msg["counts"] for msg in messages)
        new = self.C.copy()
        filled = N > 0
        new[filled] = S[filled] / N[filled, None]
        self.shifts.append(float(np.linalg.norm(new - self.C)))
        self.empty.append(int((~filled).sum()))
        self.singleton_cells.append(int(sum((msg["counts"] == 1).sum() for msg in messages)))
        self.C = new

    def result(self) -> np.ndarray:
        return self.C


@dataclass
class KMeansResult:
    """:func:`federated_kmeans`: ``centers`` (n_y, m); ``rounds`` run; per round the centre shift
    ||C^s - C^{s-1}||_F, the empty cells and the (client, cell) pairs with one point; measured ``cost``."""

    centers: np.ndarray
    rounds: int
    shifts: np.ndarray
    empty: np.ndarray
    singleton_cells: np.ndarray
    cost: Cost = field(default_factory=Cost)

    @property
    def converged(self) -> bool:
        return bool(len(self.shifts) and self.shifts[-1] == 0.0)


def federated_kmeans(client_data: Sequence, init, rounds: int = 100, *, progress: bool = False) -> KMeansResult:
    """Lloyd's algorithm over :func:`fedlib.core.protocol.simulate`: at most ``rounds`` rounds of
    (:class:`KMeansClient` uploads, :class:`KMeansServer` update) from the centres ``init`` (n_y, m),
    stopping after the first round that leaves the centres unchanged (then the assignments are
    stable: Lloyd has converged). Equals centralized Lloyd on the pooled data to round-off."""
    data = check_clients(client_data)
    rounds = check_int("rounds", rounds, 1)
    init = as_matrix("init", init, data[0].shape[1])
    check_int("n_landmarks", len(init), 2)
    server, client = KMeansServer(init), KMeansClient()
    states = ClientStates(client)
    cost = Cost()
    iterator = range(rounds)
    if progress:
        iterator = tqdm(iterator, desc="k-means rounds", leave=False)
    for _ in iterator:
        cost = cost + simulate(server, client, data, 1, states=states)
        if server.shifts[-1] == 0.0:
            break
    return KMeansResult(server.result(), len(server.shifts), np.array(server.shifts), np.array(server.empty),
                        np.array(server.singleton_cells), cost)


# ------------------------------------------------------------------------------------------------
# 3. Local placement: the server embeds only the landmarks
# ------------------------------------------------------------------------------------------------
PLACEMENT_METHODS = tuple(METHOD_NAMES)           # "tsne" (openTSNE), "umap" (umap-learn)


def _tsne_reference(Y: np.ndarray, seed: int, perplexity: float):
    """openTSNE's affinities on the landmarks (exact neighbours; perplexity <= (n_y - 1) / 3)."""
    from openTSNE.affinity import PerplexityBasedNN

    p = min(perplexity, (len(Y) - 1) / 3.0)
    return PerplexityBasedNN(Y, perplexity=p, method="exact", n_jobs=1, random_state=seed)


def _umap_reference(Y: np.ndarray, seed: int, n_neighbors: int, min_dist: float, epochs):
    import umap

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*n_jobs value.*overridden.*")
        return umap.UMAP(n_components=2, n_neighbors=min(n_neighbors, len(Y) - 1), min_dist=min_dist,
                         random_state=seed, n_epochs=epochs).fit(Y)


def landmark_embedding(landmarks, method: str = "tsne", *, seed: int = 0, perplexity: float = 30.0,
                       tsne_max_iter: int = 500, umap_neighbors: int = 15, umap_min_dist: float = 0.1,
                       umap_epochs: int | None = None) -> np.ndarray:
    """The server's embedding of the landmarks alone (n_y, 2): openTSNE (PCA initialization, 250
    early-exaggeration iterations + the rest of ``tsne_max_iter``, perplexity <= (n_y - 1)/3), or
    umap-learn (n_neighbors <= n_y - 1); centred at the midpoint of its bounding box (what
    ``TSNEEmbedding.transform`` does to its reference first)."""
    check_choice("method", method, PLACEMENT_METHODS)
    Y = as_matrix("landmarks", landmarks)
    check_int("n_landmarks", len(Y), 4)
    if method == "tsne":
        from openTSNE import TSNEEmbedding
        from openTSNE.initialization import pca

        max_iter = check_int("tsne_max_iter", tsne_max_iter, 250)
        emb = TSNEEmbedding(pca(Y, random_state=seed), _tsne_reference(Y, seed, perplexity), random_state=seed,
                            n_jobs=1)
        emb = emb.optimize(250, exaggeration=12, momentum=0.5).optimize(max_iter - 250, momentum=0.8)
        Z = np.asarray(emb, dtype=np.float64)
    else:
        Z = np.asarray(_umap_reference(Y, seed, umap_neighbors, umap_min_dist, umap_epochs).embedding_,
                       dtype=np.float64)
    return Z - (Z.max(0) + Z.min(0)) / 2


@dataclass(frozen=True)
class PlacementClient:
    """Client program of local placement, :class:`fedlib.core.protocol.Client`. From the broadcast
    {"landmarks" Y (n_y, m), "landmark_embedding" Z_Y (n_y, 2)} the client rebuilds the reference
    model locally (openTSNE: the landmarks' perplexity affinities + Z_Y; UMAP: the same seeded fit on Y,
    its embedding replaced by Z_Y) and places its own points with ``transform``; it uploads
    {"embedding": (n_p, 2)} (``upload=False``: nothing; the positions stay with the client)."""

    method: str = "tsne"
    seed: int = 0
    perplexity: float = 30.0
    umap_neighbors: int = 15
    umap_min_dist: float = 0.1
    umap_epochs: int | None = None
    upload: bool = True

    def init_state(self, k: int) -> dict:
        return {"k": k}

    def place(self, X, Y, Z_Y) -> np.ndarray:
        """Positions (n_p, 2) of the points X (n_p, m) against the landmarks Y and their embedding Z_Y."""
        X = np.asarray(X, dtype=np.float64)
        if self.method == "tsne":
            from openTSNE import TSNEEmbedding

            ref = TSNEEmbedding(np.array(Z_Y, dtype=np.float64), _tsne_reference(Y, self.seed, self.perplexity),
                                random_state=self.seed, n_jobs=1)
            k = min(25, len(Y) - 1)
            return np.asarray(ref.transform(X, perplexity=min(5.0, k / 3.0), k=k), dtype=np.float64)
        model = _umap_reference(Y, self.seed, self.umap_neighbors, self.umap_min_dist, self.umap_epochs)
        model.embedding_ = np.asarray(Z_Y, dtype=np.float32)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*n_jobs value.*overridden.*")
            return np.asarray(model.transform(X), dtype=np.float64)

    def step(self, data, state: dict, broadcast: Message) -> Message:
        Z = self.place(data, broadcast["landmarks"], broadcast["landmark_embedding"])
        state["embedding"] = Z
        return Message(f"client{state['k']}", {"embedding": Z} if self.upload else {})


class PlacementServer(Server):
    """Server of local placement: broadcasts the landmarks and their embedding; ``result()`` = the
    uploaded positions, one (n_p, 2) array per client (empty list when clients keep them)."""

    def __init__(self, landmarks, landmark_embedding):
        self.Y = as_matrix("landmarks", landmarks)
        self.Z_Y = as_matrix("landmark_embedding", landmark_embedding)
        if self.Z_Y.shape != (len(self.Y), 2):
            raise ValueError(f"landmark_embedding must be (n_landmarks, 2) = ({len(self.Y)}, 2), got {self.Z_Y.shape}")
        self.embeddings: list[np.ndarray] = []

    def broadcast(self) -> Message:
        return Message("server", {"landmarks": self.Y, "landmark_embedding": self.Z_Y})

    def expects(self) -> uploads.Expected:
        """Per client: its positions (n_p, 2), finite, or nothing (the positions stay with the client)."""
        return uploads.Expected(({"embedding": uploads.Tensor(("n", 2), array="numpy")}, {}), local=("n",),
                                what="placement upload")

    def absorb(self, messages: list[Message]) -> None:
        self.embeddings = [msg["embedding"] for msg in messages if "embedding" in msg.payload]

    def result(self) -> list[np.ndarray]:
        return self.embeddings


@dataclass
class PlacementResult:
    """:func:`local_placement`: ``embedding`` (n, 2) in the clients' stacked row order, the landmarks'
    ``landmark_embedding`` (n_y, 2) and the placement round's measured ``cost``."""

    embedding: np.ndarray
    landmark_embedding: np.ndarray
    cost: Cost


def local_placement(client_data: Sequence, landmarks, method: str = "tsne", *, seed: int = 0,
                    perplexity: float = 30.0, tsne_max_iter: int = 500, umap_neighbors: int = 15,
                    umap_min_dist: float = 0.1, umap_epochs: int | None = None) -> PlacementResult:
    """Item 3: the server embeds the landmarks (:func:`landmark_embedding`), one protocol round
    (:class:`PlacementServer`, :class:`PlacementClient`) places every client's points locally.
    Deterministic for a given ``seed``. Returns a :class:`PlacementResult`."""
    check_choice("method", method, PLACEMENT_METHODS)
    data = check_clients(client_data)
    Y = as_matrix("landmarks", landmarks, data[0].shape[1])
    check_positive("perplexity", perplexity)
    Z_Y = landmark_embedding(Y, method, seed=seed, perplexity=perplexity, tsne_max_iter=tsne_max_iter,
                             umap_neighbors=umap_neighbors, umap_min_dist=umap_min_dist, umap_epochs=umap_epochs)
    server = PlacementServer(Y, Z_Y)
    client = PlacementClient(method, seed, perplexity, umap_neighbors, umap_min_dist, umap_epochs)
    cost = simulate(server, client, data, 1)
    return PlacementResult(np.vstack(server.result()), Z_Y, cost)


# ------------------------------------------------------------------------------------------------
# The chapter's runs
# ------------------------------------------------------------------------------------------------
def embed_knn(indices, sq_values, method: str, *, seed: int = 0, perplexity: float = 30.0,
              tsne_max_iter: int = 500, umap_neighbors: int = 15, umap_min_dist: float = 0.1,
              umap_epochs: int | None = None) -> np.ndarray:
    """t-SNE / UMAP from each point's nearest neighbours (n, k) and their squared distances, the sparse
    server path of :func:`~fedlib.fedtsne.pipelines.fed_tsne` / ``fed_umap``: openTSNE on the
    perplexity affinities (needs k >= min(n - 1, 3 perplexity)), umap-learn with ``precomputed_knn``
    (the first n_neighbors - 1 neighbours plus the point itself)."""
    check_choice("method", method, PLACEMENT_METHODS)
    idx = np.asarray(indices)
    dist = np.sqrt(np.maximum(np.asarray(sq_values, dtype=np.float64), 0.0))
    n = len(idx)
    if method == "tsne":
        run, k = opentsne_runner(perplexity, {"max_iter": tsne_max_iter}, seed, n)
        if idx.shape[1] < k:
            raise ValueError(f"t-SNE with perplexity {perplexity} needs {k} neighbours per point, got {idx.shape[1]}")
        return run((idx[:, :k], dist[:, :k]))
    import umap

    kk = umap_neighbors - 1
    if idx.shape[1] < kk:
        raise ValueError(f"UMAP with umap_neighbors={umap_neighbors} needs {kk} neighbours per point, got {idx.shape[1]}")
    knn = (np.hstack([np.arange(n)[:, None], idx[:, :kk]]), np.hstack([np.zeros((n, 1)), dist[:, :kk]]))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*n_jobs value.*overridden.*")
        warnings.filterwarnings("ignore", message=".*knn_search_index.*")
        return umap.UMAP(n_components=2, n_neighbors=umap_neighbors, min_dist=umap_min_dist, random_state=seed,
                         n_epochs=umap_epochs, precomputed_knn=knn,
                         force_approximation_algorithm=True).fit_transform(np.zeros((n, 1)))


def neighbours_needed(n: int, methods: Sequence[str], perplexity: float, umap_neighbors: int, knn_k: int) -> int:
    """Neighbours per point the chapter's embeddings and recall need: max(3 perplexity, umap_neighbors
    - 1, knn_k), at most n - 1."""
    need = [knn_k] + [min(n - 1, int(3 * perplexity)) if m == "tsne" else umap_neighbors - 1 for m in methods]
    return check_k(max(need), n)


def check_beyond_inputs(X, n_landmarks: Sequence[int], estimators: Sequence[str]) -> None:
    """The chapter's checks before any work: every n_y in [2, min(n, m + 1)] (ValueError naming
    ``n_landmarks``), every estimator known (naming ``estimator``)."""
    n, m = as_matrix("X", X).shape
    for ny in n_landmarks:
        check_int("n_landmarks", ny, 2)
        if ny > n:
            raise ValueError(f"n_landmarks must be <= the number of points n = {n}, got {ny}")
        if ny > m + 1:
            raise ValueError(f"n_landmarks must be <= m + 1 = {m + 1} (the closed form), got {ny}")
    for est in estimators:
        check_choice("estimator", est, ESTIMATORS)


def parse_combos(combos: Sequence) -> list[tuple[str, str]]:
    """``metric_combos`` entries "kind/estimator" (or (kind, estimator) pairs) -> (kind, estimator) pairs,
    kind in :data:`LANDMARK_KINDS`, estimator in :data:`ESTIMATORS`; else ValueError naming the entry."""
    out = []
    for i, c in enumerate(combos):
        pair = tuple(c.split("/")) if isinstance(c, str) else tuple(c)
        if len(pair) != 2:
            raise ValueError(f"metric_combos[{i}] must be 'kind/estimator', got {c!r}")
        check_choice(f"metric_combos[{i}] landmark kind", pair[0], LANDMARK_KINDS)
        check_choice(f"metric_combos[{i}] estimator", pair[1], ESTIMATORS)
        out.append(pair)
    return out


def learn_landmark_sets(client_data: Sequence, n_landmarks: int, rounds: int, seed: int) -> tuple[dict, dict]:
    """FedDL (noise-free, ``rounds`` rounds) and federated k-means (at most ``rounds`` rounds, from
    FedDL's Y^0: the same set-up round, the same starting landmarks) on the same clients. Returns
    ({"feddl": Y, "kmeans": C}, {kind: dict of measured quantities})."""
    res = feddl(list(client_data), n_landmarks, rounds=rounds, seed=seed)
    km = federated_kmeans(client_data, res.init_landmarks, rounds)
    info = {"feddl": {"rounds": res.rounds, "upload MiB": res.cost.mib_up, "plateau share": plateau_share(res.objective),
                      "empty cells": math.nan, "singleton cells": math.nan, "seconds": res.cost.seconds},
            "kmeans": {"rounds": km.rounds, "upload MiB": (km.cost.bytes_up + res.setup_upload_bytes) / 2**20,
                       "plateau share": math.nan, "empty cells": int(km.empty[-1]),
                       "singleton cells": int(km.singleton_cells[-1]), "seconds": km.cost.seconds}}
    return {"feddl": res.landmarks, "kmeans": km.centers}, info


def landmark_study(X, y, parts_of_seed, grid: Sequence[int], seeds: Sequence[int], rounds: int, scorer, *,
                   metric_grid: Sequence[int] = (), metric_combos: Sequence[tuple] = (), methods: Sequence[str] = ("tsne",),
                   knn_k: int = 10, embed_kwargs: dict | None = None, known: dict | None = None,
                   progress: bool = True):
    """Item 2's runs. For every seed and n_y of ``grid``: the clients ``[X[p] for p in parts_of_seed(seed)]``,
    both landmark sets (:func:`learn_landmark_sets`), the Nystrom upload decomposed
    (:func:`decompose_upload`), and per estimator the ``knn_k``-NN recall against the exact neighbours;
    for n_y in ``metric_grid`` and each (landmark kind, estimator) of ``metric_combos`` the embeddings of
    ``methods`` (:func:`embed_knn`) scored by ``scorer`` (an :class:`~fedlib.fedtsne.chapters.EmbeddingScorer`).
    ``known``: {(seed, n_y): :func:`learn_landmark_sets` output} already computed (reused, not rerun).
    Returns (recall frame, metrics frame, costs frame, kept: {(seed, n_y, kind): landmarks, ...,
    ("embedding", seed, n_y, kind, estimator, method): Z})."""
    X = as_matrix("X", X)
    embed_kwargs = dict(embed_kwargs or {})
    metric_combos = parse_combos(metric_combos)
    check_beyond_inputs(X, list(grid) + list(metric_grid), [e for _, e in metric_combos])
    missing = sorted(set(metric_grid) - set(grid))
    if missing:
        raise ValueError(f"metric_grid values must be in grid {list(grid)}; missing: {missing}")
    k_all = neighbours_needed(len(X), methods if metric_combos else (), embed_kwargs.get("perplexity", 30.0),
                              embed_kwargs.get("umap_neighbors", 15), knn_k)
    exact_idx, exact_d2 = exact_sq_knn(X, k_all)
    recall_rows, metric_rows, cost_rows, kept = [], [], [], {}
    jobs = [(s, ny) for s in seeds for ny in grid]
    if progress:
        jobs = tqdm(jobs, desc="seeds x n_y", leave=False)
    for seed, ny in jobs:
        parts = parts_of_seed(seed)
        data = [X[p] for p in parts]
        order = np.concatenate(parts)
        sets, info = (known or {}).get((seed, ny)) or learn_landmark_sets(data, ny, rounds, seed)
        for kind, Y in sets.items():
            kept[seed, ny, kind] = Y
            B = np.vstack([client_sq_distances(x, Y)["sq_distances"] for x in data])
            dec = decompose_upload(B, Y)
            cost_rows.append({"seed": seed, "n_y": ny, "landmarks": LANDMARK_NAMES[kind], **info[kind],
                              "residual share": float((dec.residual ** 2).sum() / ((X - X.mean(0)) ** 2).sum()),
                              "Nyström outside feasible": feasible_violations(dec)})
            for est in ESTIMATORS:
                idx_s, d2_s = estimator_knn(dec, est, k_all)
                idx = np.empty_like(idx_s)
                d2 = np.empty_like(d2_s)
                idx[order], d2[order] = order[idx_s], d2_s          # back to the row order of X
                recall_rows.append({"seed": seed, "n_y": ny, "landmarks": LANDMARK_NAMES[kind],
                                    "estimator": ESTIMATOR_NAMES[est],
                                    f"{knn_k}-NN recall": knn_recall(idx[:, :knn_k], exact_idx[:, :knn_k])})
                if ny in metric_grid and (kind, est) in metric_combos:
                    for method in methods:
                        Z = embed_knn(idx, d2, method, seed=seed, **embed_kwargs)
                        kept["embedding", seed, ny, kind, est, method] = Z
                        metric_rows.append({"seed": seed, "n_y": ny, "landmarks": LANDMARK_NAMES[kind],
                                            "estimator": ESTIMATOR_NAMES[est], "method": METHOD_NAMES[method],
                                            **scorer(Z, seed)})
    return pd.DataFrame(recall_rows), pd.DataFrame(metric_rows), pd.DataFrame(cost_rows), kept


def central_runs(X, scorer, seeds: Sequence[int], methods: Sequence[str], *, embed_kwargs: dict | None = None):
    """The centralized reference: the same embedding call (:func:`embed_knn`) on the exact neighbours.
    Returns (frame: seed, method, metrics; {(seed, method): Z})."""
    X = as_matrix("X", X)
    embed_kwargs = dict(embed_kwargs or {})
    k = neighbours_needed(len(X), methods, embed_kwargs.get("perplexity", 30.0), embed_kwargs.get("umap_neighbors", 15), 1)
    idx, d2 = exact_sq_knn(X, k)
    rows, kept = [], {}
    for seed in seeds:
        for method in methods:
            Z = embed_knn(idx, d2, method, seed=seed, **embed_kwargs)
            kept[seed, method] = Z
            rows.append({"seed": seed, "method": METHOD_NAMES[method], **scorer(Z, seed)})
    return pd.DataFrame(rows), kept


def placement_study(X, parts_of_seed, landmark_sets: dict, n_landmarks: int, seeds: Sequence[int],
                    kinds: Sequence[str], methods: Sequence[str], scorer, *, embed_kwargs: dict | None = None,
                    progress: bool = True):
    """Item 3's runs: for every seed, landmark kind and method, :func:`local_placement` of the seed's
    clients against ``landmark_sets[seed, n_landmarks, kind]``, scored on all points by ``scorer``.
    Returns (frame: seed, landmarks, method, bytes, metrics; {(seed, kind, method): (Z in X's row order,
    landmark embedding)})."""
    X = as_matrix("X", X)
    kw = dict(embed_kwargs or {})
    rows, kept = [], {}
    jobs = [(s, kind, m) for s in seeds for kind in kinds for m in methods]
    if progress:
        jobs = tqdm(jobs, desc="placements", leave=False)
    for seed, kind, method in jobs:
        parts = parts_of_seed(seed)
        order = np.concatenate(parts)
        res = local_placement([X[p] for p in parts], landmark_sets[seed, n_landmarks, kind], method, seed=seed,
                              perplexity=kw.get("perplexity", 30.0), tsne_max_iter=kw.get("tsne_max_iter", 500),
                              umap_neighbors=kw.get("umap_neighbors", 15), umap_min_dist=kw.get("umap_min_dist", 0.1),
                              umap_epochs=kw.get("umap_epochs"))
        Z = np.empty_like(res.embedding)
        Z[order] = res.embedding
        kept[seed, kind, method] = (Z, res.landmark_embedding)
        rows.append({"seed": seed, "landmarks": LANDMARK_NAMES[kind], "method": METHOD_NAMES[method],
                     "broadcast MiB": res.cost.mib_down, "upload MiB": res.cost.mib_up, **scorer(Z, seed)})
    return pd.DataFrame(rows), kept
