"""What the Fed-tSNE chapters share: the one rule for "n points of a dataset" (:func:`load_points`),
the non-IID split (:func:`label_skew_parts`), the cached embedding scorer (:class:`EmbeddingScorer`),
the data-dependent size checks and the privacy chapter's table."""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import pandas as pd

from fedlib.core.validate import check_choice, check_int
from fedlib.data.datasets import load_dataset
from fedlib.data.partition import make_partition
from fedlib.evaluation import embedding as em
from fedlib.evaluation.stats import mean_std, paired_difference
from fedlib.fedtsne.knn import BLOCK_BYTES, block_rows, select_extreme
from fedlib.fedtsne.mmd import as_matrix, sq_distances
from fedlib.fedtsne.nystrom import landmark_pinv_factors

SPLITS = ("iid", "non_iid")


def load_points(name: str, n_points: int | None = None, seed: int = 0, root=None):
    """n points of a registered dataset (``fedlib.data.datasets.DATASETS``), the one rule of the Fed-tSNE chapters.

    Train and test are pooled (nothing here is trained on labels), images flattened and scaled to
    [0, 1] (pixels / 255). With ``n_points`` below the pooled size: a stratified draw of exactly
    ``n_points`` (``sklearn.model_selection.train_test_split(stratify=labels, random_state=seed)``),
    kept in the pooled order; ``None`` keeps everything. Returns (X (n, m) float64, labels (n,) int64,
    class names)."""
    from sklearn.model_selection import train_test_split

    ds = load_dataset(name, root=root)
    total = len(ds.y_train) + len(ds.y_test)
    if n_points is not None:
        n_points = check_int("n_points", n_points, len(ds.classes))
        if n_points > total:
            raise ValueError(f"n_points must be <= the {total} images of {name}, got {n_points}")
    X = np.concatenate([ds.x_train, ds.x_test]).reshape(total, -1)
    y = np.concatenate([ds.y_train, ds.y_test]).astype(np.int64)
    if n_points is not None and n_points < total:
        keep, _ = train_test_split(np.arange(total), train_size=n_points, stratify=y, random_state=seed)
        keep = np.sort(keep)
        X, y = X[keep], y[keep]
    return X.astype(np.float64) / 255.0, y, tuple(ds.classes)      # the kept rows only are converted


def label_skew_parts(labels, num_clients: int, seed: int = 0) -> list[np.ndarray]:
    """The one non-IID rule of the Fed-tSNE chapters (the paper's "one class per client", Tables 1-3).

    C classes, k clients: k a multiple of C -> one class per client, k/C clients share a class
    (``make_partition(..., "one_class")``); k a divisor of C -> C/k classes per client, the sorted
    classes in consecutive groups ({0, 1}, {2, 3}, ... for k = 5, C = 10: the paper's Table 3).
    Anything else raises ValueError. labels (n,) -> k index arrays."""
    y = np.asarray(labels).ravel()
    k = check_int("num_clients", num_clients, 1)
    c = len(np.unique(y))
    if k % c == 0:
        parts = make_partition(y, k, "one_class", seed=seed)
    elif c % k == 0:
        base = make_partition(y, c, "one_class", seed=seed)
        g = c // k
        parts = [np.sort(np.concatenate(base[i * g:(i + 1) * g])) for i in range(k)]
    else:
        raise ValueError(f"non-IID split with num_clients={k} and {c} classes: num_clients must be a multiple "
                         f"or a divisor of {c}")
    if min(len(p) for p in parts) < 2:
        raise ValueError(f"non-IID split with num_clients={k}: a client holds < 2 points (Eq. 10 needs 2)")
    return parts


def client_split(labels, num_clients: int, split: str, seed: int = 0) -> list[np.ndarray]:
    """``split="iid"`` (a random split, ``make_partition(..., "iid")``) or ``"non_iid"``
    (:func:`label_skew_parts`): k index arrays covering range(n)."""
    check_choice("split", split, SPLITS)
    y = np.asarray(labels).ravel()
    k = check_int("num_clients", num_clients, 1)
    if 2 * k > len(y):
        raise ValueError(f"num_clients={k} for {len(y)} points: each client needs >= 2 points")
    if split == "iid":
        return make_partition(y, k, "iid", seed=seed)
    return label_skew_parts(y, k, seed)


def _knn_lists(A, k: int, metric: str = "euclidean") -> np.ndarray:
    from sklearn.neighbors import NearestNeighbors

    return NearestNeighbors(n_neighbors=k, metric=metric).fit(A).kneighbors(return_distance=False)


def list_overlap(a: np.ndarray, b: np.ndarray) -> float:
    """Mean over rows of |a_i ∩ b_i| / k for two (n, k) neighbour lists (rows without repeats)."""
    s = np.sort(np.concatenate([a, b], axis=1), axis=1)
    return float((s[:, 1:] == s[:, :-1]).sum(1).mean() / a.shape[1])


class EmbeddingScorer:
    """The paper's embedding metrics (``fedlib.evaluation.embedding``: CA k-NN, NPA k-NN, NMI, SC) for
    one dataset X (n, m), labels (n,), with the high-dimensional k-NN lists computed once and reused
    for every embedding (``embedding_report`` recomputes them each time; the values are equal).

    ``scorer(Z, seed)`` -> dict of metrics; ``scorer.distance_quality(D_hat)`` -> relative Frobenius
    error of an estimated distance matrix (n, n) and the 10-NN overlap of its neighbours with the exact
    ones; ``scorer.landmark_quality(Y)`` -> the same for the Nystrom estimate from landmarks Y, computed
    in row blocks (no n x n matrix: the chapters use it); ``scorer.release()`` frees the cached exact
    distance matrix."""

    def __init__(self, X, labels, ks: Sequence[int] | None = None):
        self._em = em
        self.X = as_matrix("X", X)
        self.y = np.asarray(labels).ravel()
        if len(self.y) != len(self.X):
            raise ValueError(f"labels has {len(self.y)} entries, X has {len(self.X)} rows")
        self.ks = tuple(em.PAPER_KS if ks is None else ks)
        if max(self.ks) >= len(self.X):
            raise ValueError(f"ks must be < the number of points ({len(self.X)}), got {self.ks}")
        self.n_classes = len(np.unique(self.y))
        self.nn = _knn_lists(self.X, max(max(self.ks), 10))
        self._D = None

    def exact_distances(self) -> np.ndarray:
        if self._D is None:
            self._D = np.sqrt(sq_distances(self.X))
        return self._D

    def release(self) -> None:
        self._D = None

    def __call__(self, Z, seed: int = 0) -> dict:
        from sklearn.metrics import silhouette_score

        em = self._em
        Z = as_matrix("Z", Z)
        out = {f"CA {k}-NN": em.knn_accuracy(Z, self.y, k, seed=seed) for k in self.ks}
        nz = _knn_lists(Z, max(self.ks))
        out.update({f"NPA {k}-NN": list_overlap(self.nn[:, :k], nz[:, :k]) for k in self.ks})
        pred = em.kmeans_labels(Z, self.n_classes, seed=seed)
        out["NMI"] = em.clustering_nmi(self.y, pred)
        out["SC"] = float(silhouette_score(Z, pred))
        return out

    def landmark_quality(self, landmarks, squared: bool = True, k: int = 10, block_bytes: float | None = None) -> dict:
        """:meth:`distance_quality` of ``nystrom_estimate(X, landmarks, squared)`` without any n x n
        matrix: the estimate B W^+ B^T = F diag(mu) F^T (F = B V, :func:`~fedlib.fedtsne.nystrom.landmark_pinv_factors`)
        and the exact distances are formed a block of rows at a time (:func:`~fedlib.fedtsne.knn.block_rows`),
        the squared Frobenius errors summed and each row's k nearest kept. Equal to the dense
        computation to round-off (ties in the neighbour lists aside). When one block holds every row, the
        exact distances are :meth:`exact_distances` (computed once, kept until :meth:`release`). landmarks (n_y, m)."""
        Y = as_matrix("landmarks", landmarks)
        if Y.shape[1] != self.X.shape[1]:
            raise ValueError(f"landmarks must have {self.X.shape[1]} columns, got {Y.shape[1]}")
        n = len(self.X)
        k = check_int("k", k, 1, n - 1)
        B, W = sq_distances(self.X, Y), sq_distances(Y)
        if not squared:
            B, W = np.sqrt(B), np.sqrt(W)
        V, mu = landmark_pinv_factors(W)
        F = B @ V
        G = np.ascontiguousarray((F * mu).T)
        step = block_rows(n, BLOCK_BYTES if block_bytes is None else block_bytes)
        exact = self.exact_distances() if step >= n else None
        if exact is None:
            Xt = np.ascontiguousarray(self.X.T)
            sq = np.einsum("ij,ij->i", self.X, self.X)
        err = ref = 0.0
        nbrs = np.empty((n, k), dtype=np.int64)
        for i0 in range(0, n, step):
            i1 = min(n, i0 + step)
            diag = (np.arange(i1 - i0), np.arange(i0, i1))
            H = np.maximum(F[i0:i1] @ G, 0.0)
            H[diag] = 0.0
            if squared:
                np.sqrt(H, out=H)
            if exact is not None:
                D = exact
            else:
                D = np.maximum(sq[i0:i1, None] - 2.0 * (self.X[i0:i1] @ Xt) + sq[None, :], 0.0)
                D[diag] = 0.0
                np.sqrt(D, out=D)
            err += float(np.square(H - D).sum())
            ref += float(np.square(D).sum())
            H[diag] = np.inf
            nbrs[i0:i1] = select_extreme(H, k)[0]
        return {"D-hat rel. error": float(np.sqrt(err / ref)), f"D-hat {k}-NN": list_overlap(self.nn[:, :k], nbrs)}

    def distance_quality(self, D_hat, k: int = 10) -> dict:
        D_hat = np.asarray(D_hat, dtype=np.float64)
        if D_hat.shape != (len(self.X), len(self.X)):
            raise ValueError(f"D_hat must be ({len(self.X)}, {len(self.X)}), got {D_hat.shape}")
        D = self.exact_distances()
        return {"D-hat rel. error": float(np.linalg.norm(D_hat - D) / np.linalg.norm(D)),
                f"D-hat {k}-NN": list_overlap(self.nn[:, :k], _knn_lists(D_hat, k, "precomputed"))}


def check_fits(dataset: str, n_points: int, strict: bool = True, **sizes) -> None:
    """ValueError naming the parameter when one of ``sizes`` (name=value; None skipped) is >= the
    ``n_points`` of ``dataset`` (> with ``strict=False``): the data-dependent checks of a chapter."""
    for name, value in sizes.items():
        if value is not None and (value >= n_points if strict else value > n_points):
            raise ValueError(f"{dataset}: {name} = {value} must be {'<' if strict else '<='} its {n_points} points")


def privacy_table(runs, metric: str):
    """Privacy chapter's table of ``metric`` (one row per method and variant, in order of appearance):
    FedDL's and the end-to-end epsilon spent (largest over seeds; "inf" without a guarantee), mean ±
    sample std over seeds and the paired difference against the noise-free run of the same seeds.
    ``runs``: one row per (variant, method, seed) with columns method, variant, noise, seed,
    "FedDL epsilon", "end-to-end epsilon" and ``metric``."""
    def eps(value, none_label):
        return none_label if math.isinf(value) else f"{value:.4g}"

    out = []
    ref = runs[runs.noise == "none"].set_index(["method", "seed"])[metric]
    for (method, name), g in runs.groupby(["method", "variant"], sort=False):
        g = g.set_index("seed")
        row = {"method": method, "variant": name,
               "FedDL epsilon spent": eps(g["FedDL epsilon"].max(), "inf (no guarantee)"),
               "end-to-end epsilon": eps(g["end-to-end epsilon"].max(), "inf"),
               metric: mean_std(g[metric], 3), "paired diff vs Fed": "-"}
        if g.noise.iloc[0] != "none" and len(g) >= 2:
            row["paired diff vs Fed"] = paired_difference(g[metric].values,
                                                          ref.loc[method].loc[g.index].values).format(3)
        out.append(row)
    return pd.DataFrame(out)
