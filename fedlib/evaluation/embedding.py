"""Embedding and clustering metrics of "Federated t-SNE and UMAP" (Qiao, Ma, Fan; AAAI 2025), App. A.2.

The paper names its metrics but not their recipes. Every choice below is ours and is written in the
function's docstring:

* **CA k-NN**  (:func:`knn_accuracy`): k-NN classifier (Euclidean, uniform vote) fitted on a seeded,
  stratified 70 % of the embedded points, accuracy on the other 30 %. k in {1, 10, 50}.
* **NPA k-NN** (:func:`neighborhood_preservation`): mean over points of
  ``|N_k^X(i) ∩ N_k^Z(i)| / k``, with N_k the k nearest *other* points by Euclidean distance in the
  original space X and in the embedding Z. Not label-based (the paper's wording says "according to
  the true labels", its numbers only fit this kNN-set overlap).
* **NMI**, **SC** (:func:`kmeans_nmi`, :func:`kmeans_silhouette`): ``KMeans(n_clusters = number of
  classes, n_init=10, random_state=seed)`` on Z; NMI (arithmetic normalisation) of its labels against
  the true labels; silhouette (Euclidean, in Z) of *the k-means labels*, not of the true labels.
* **ARI** (:func:`clustering_ari`): adjusted Rand index of predicted vs. true labels (Table 5, spectral
  clustering); :func:`embedding_report` also gives it for the k-means labels on Z.

:func:`embedding_report` returns all of them, keyed as the paper's table rows ("CA 10-NN",
"NPA 10-NN", "NMI", "SC") plus "ARI", so a result lines up with ``paper_results.fedtsne_table1()``.
Every function raises ``ValueError`` naming the offending parameter on bad input.
"""
from __future__ import annotations

from numbers import Integral
from typing import Sequence

import numpy as np
from sklearn.cluster import KMeans
from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score, silhouette_score
from sklearn.model_selection import train_test_split
from sklearn.neighbors import KNeighborsClassifier, NearestNeighbors

from fedlib.core.validate import check_int, check_real

PAPER_KS = (1, 10, 50)
TEST_SIZE = 0.3  # the paper's train:test = 7:3
KMEANS_N_INIT = 10

__all__ = ["PAPER_KS", "TEST_SIZE", "KMEANS_N_INIT", "knn_accuracy", "neighborhood_preservation",
           "kmeans_labels", "kmeans_nmi", "kmeans_silhouette", "clustering_nmi", "clustering_ari",
           "embedding_report", "distance_estimate_quality", "neighbour_lists"]


# ----------------------------------------------------------------------------- input checks
def _points(a, name: str) -> np.ndarray:
    arr = np.asarray(a, dtype=float)
    if arr.ndim != 2:
        raise ValueError(f"{name} must be a 2-D array (n_points, n_dims), got shape {arr.shape}")
    if arr.shape[0] < 2 or arr.shape[1] < 1:
        raise ValueError(f"{name} needs at least 2 points and 1 dimension, got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} contains NaN or inf")
    return arr


def _labels(labels, n: int, name: str = "labels") -> np.ndarray:
    arr = np.asarray(labels)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    if arr.shape[0] != n:
        raise ValueError(f"{name} has {arr.shape[0]} entries but there are {n} points")
    if arr.dtype.kind == "f" and not np.isfinite(arr).all():
        raise ValueError(f"{name} contains NaN or inf")
    return arr


def _k(k, name: str = "k") -> int:
    return check_int(name, k, 1)


def _ks(ks, name: str = "ks") -> tuple[int, ...]:
    if isinstance(ks, Integral):
        ks = (ks,)
    ks = tuple(ks)
    if not ks:
        raise ValueError(f"{name} must name at least one k")
    return tuple(_k(k, name) for k in ks)


def _seed(seed) -> int:
    return check_int("seed", seed, 0)


def _same_length(Z: np.ndarray, X: np.ndarray, z_name: str, x_name: str) -> None:
    if Z.shape[0] != X.shape[0]:
        raise ValueError(f"{z_name} has {Z.shape[0]} points but {x_name} has {X.shape[0]}")


# ----------------------------------------------------------------------------- CA
def _split(labels: np.ndarray, test_size: float, seed: int, stratify: bool):
    check_real("test_size", test_size, low=0.0, high=1.0)
    if stratify:
        _, counts = np.unique(labels, return_counts=True)
        if counts.min() < 2:
            raise ValueError("labels: a stratified split needs at least 2 points of every class")
    idx = np.arange(labels.shape[0])
    try:
        return train_test_split(idx, test_size=float(test_size), random_state=seed,
                                stratify=labels if stratify else None)
    except ValueError as err:  # e.g. fewer test points than classes
        raise ValueError(f"labels/test_size: cannot make the split ({err})") from err


def _knn_accuracies(Z, labels, ks, test_size, seed, stratify) -> dict[int, float]:
    train, test = _split(labels, test_size, seed, stratify)
    if max(ks) > train.size:
        raise ValueError(f"k={max(ks)} exceeds the {train.size} training points of the "
                         f"{1 - test_size:.0%} split")
    out = {}
    for k in ks:
        clf = KNeighborsClassifier(n_neighbors=k, metric="euclidean", weights="uniform").fit(Z[train], labels[train])
        out[k] = float(np.mean(clf.predict(Z[test]) == labels[test]))
    return out


def knn_accuracy(Z, labels, k: int = 10, *, test_size: float = TEST_SIZE, seed: int = 0,
                 stratify: bool = True) -> float:
    """CA k-NN: accuracy of a k-NN classifier in the embedding (paper App. A.2, train:test = 7:3).

    Exactly: ``train, test = sklearn.model_selection.train_test_split(arange(n), test_size=0.3,
    random_state=seed, stratify=labels)`` (stratified by default, so every class keeps its share in
    both parts; ``stratify=False`` for a plain random split); ``KNeighborsClassifier(n_neighbors=k,
    metric="euclidean", weights="uniform")`` fitted on ``Z[train]``; returned value = fraction of
    ``Z[test]`` whose predicted label equals the true one (scikit-learn breaks vote ties toward the
    smallest label). Unchanged by an order-preserving relabelling; a relabelling that reorders the
    classes can change the stratified split and the tie-breaking, hence the value slightly.

    Raises ValueError for: Z not 2-D / non-finite, ``labels`` of another length, k < 1 or k larger
    than the number of training points, ``test_size`` outside (0, 1), a class with < 2 points when
    stratifying.
    """
    Z = _points(Z, "Z")
    labels = _labels(labels, Z.shape[0])
    return _knn_accuracies(Z, labels, (_k(k),), test_size, _seed(seed), stratify)[int(k)]


# ----------------------------------------------------------------------------- NPA
def _neighbour_indices(A: np.ndarray, k: int, metric: str) -> np.ndarray:
    """Indices of the k nearest other points of every row (self excluded by index), nearest first."""
    return NearestNeighbors(n_neighbors=k, metric=metric).fit(A).kneighbors(return_distance=False)


def _overlap(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise |a_i ∩ b_i| for rows of distinct indices, vectorised (sort, count equal neighbours)."""
    s = np.sort(np.concatenate([a, b], axis=1), axis=1)
    return (s[:, 1:] == s[:, :-1]).sum(axis=1)


def _npa_many(X_high, Z, ks, metric_high) -> dict[int, float]:
    n = Z.shape[0]
    if max(ks) >= n:
        raise ValueError(f"k={max(ks)} must be smaller than the number of points ({n}): "
                         "each point has only n - 1 neighbours")
    kmax = max(ks)
    nx = _neighbour_indices(X_high, kmax, metric_high)
    nz = _neighbour_indices(Z, kmax, "euclidean")
    return {k: float(_overlap(nx[:, :k], nz[:, :k]).mean() / k) for k in ks}


def _high(X_high, metric_high: str) -> np.ndarray:
    if metric_high not in ("euclidean", "precomputed"):
        raise ValueError(f"metric_high must be 'euclidean' or 'precomputed', got {metric_high!r}")
    X = _points(X_high, "X_high")
    if metric_high == "precomputed":
        if X.shape[0] != X.shape[1]:
            raise ValueError(f"X_high must be a square distance matrix with metric_high='precomputed', "
                             f"got shape {X.shape}")
        if (X < 0).any():
            raise ValueError("X_high (precomputed distances) has negative entries")
    return X


def neighborhood_preservation(X_high, Z, k: int = 10, *, metric_high: str = "euclidean") -> float:
    """NPA k-NN: mean fraction of each point's k nearest neighbours kept by the embedding.

    Exactly ``NPA@k = (1/n) Σ_i |N_k^X(i) ∩ N_k^Z(i)| / k`` where N_k^X(i) are the indices of the k
    nearest points to i in the original space (Euclidean distance on the rows of ``X_high``; or the
    given distances with ``metric_high="precomputed"``, e.g. a federated D̂ to separate Nyström from
    embedding error) and N_k^Z(i) the same in the embedding Z (Euclidean). Point i itself is excluded
    from both sets by index (so duplicates count as neighbours); both come from scikit-learn's exact
    ``NearestNeighbors.kneighbors()``, ties at the k-th distance are broken by its ordering. Not
    label-based (the paper's numbers only fit this kNN-set overlap). 1 for any similarity transform of X;
    k = n - 1 always gives 1.

    Raises ValueError for: non-2-D / non-finite inputs, ``Z`` and ``X_high`` with different numbers
    of points, k < 1 or k >= number of points, an unknown ``metric_high`` or a non-square /
    negative precomputed matrix.
    """
    X = _high(X_high, metric_high)
    Z = _points(Z, "Z")
    _same_length(Z, X, "Z", "X_high")
    return _npa_many(X, Z, (_k(k),), metric_high)[int(k)]


# ----------------------------------------------------------------------------- clustering
def _n_classes(labels: np.ndarray, n: int) -> int:
    c = np.unique(labels).size
    if c < 2:
        raise ValueError("labels must contain at least 2 classes (k-means uses one cluster per class)")
    if c >= n:
        raise ValueError(f"labels has {c} classes for {n} points: need fewer classes than points")
    return c


def kmeans_labels(Z, n_clusters: int, *, seed: int = 0, n_init: int = KMEANS_N_INIT) -> np.ndarray:
    """k-means cluster labels on the embedding: ``KMeans(n_clusters, n_init=10, random_state=seed)``.

    scikit-learn's Lloyd k-means with k-means++ initialisation, best of ``n_init`` restarts by
    inertia. Raises ValueError if n_clusters < 2 or >= number of points, or n_init < 1.
    """
    Z = _points(Z, "Z")
    n_clusters = _k(n_clusters, "n_clusters")
    if not 2 <= n_clusters < Z.shape[0]:
        raise ValueError(f"n_clusters must be in [2, {Z.shape[0] - 1}], got {n_clusters}")
    n_init = _k(n_init, "n_init")
    return KMeans(n_clusters=n_clusters, n_init=n_init, random_state=_seed(seed)).fit_predict(Z)


def clustering_nmi(labels_true, labels_pred) -> float:
    """NMI of two labellings: ``sklearn.metrics.normalized_mutual_info_score`` (arithmetic mean of the
    two entropies as normaliser, natural log; in [0, 1], 1 for identical partitions up to relabelling).
    Raises ValueError if the lengths differ."""
    labels_true = np.asarray(labels_true)
    labels_true = _labels(labels_true, labels_true.shape[0] if labels_true.ndim else 0, "labels_true")
    labels_pred = _labels(labels_pred, labels_true.shape[0], "labels_pred")
    return float(normalized_mutual_info_score(labels_true, labels_pred, average_method="arithmetic"))


def clustering_ari(labels_true, labels_pred) -> float:
    """ARI (Table 5): ``sklearn.metrics.adjusted_rand_score`` = (RI - E[RI]) / (max RI - E[RI]) over
    pairs of points (Hubert-Arabie). 1 for identical partitions up to relabelling, about 0 for
    independent ones, can be negative. Raises ValueError if the lengths differ."""
    labels_true = np.asarray(labels_true)
    labels_true = _labels(labels_true, labels_true.shape[0] if labels_true.ndim else 0, "labels_true")
    labels_pred = _labels(labels_pred, labels_true.shape[0], "labels_pred")
    return float(adjusted_rand_score(labels_true, labels_pred))


def kmeans_nmi(Z, labels, *, seed: int = 0, n_init: int = KMEANS_N_INIT) -> float:
    """NMI of k-means on the embedding (paper App. A.2): :func:`kmeans_labels` with n_clusters = number
    of distinct ``labels``, n_init=10, random_state=seed, then :func:`clustering_nmi` (arithmetic)
    against ``labels``. Raises ValueError for a length mismatch or fewer than 2 classes."""
    Z = _points(Z, "Z")
    labels = _labels(labels, Z.shape[0])
    pred = kmeans_labels(Z, _n_classes(labels, Z.shape[0]), seed=seed, n_init=n_init)
    return clustering_nmi(labels, pred)


def kmeans_silhouette(Z, labels, *, seed: int = 0, n_init: int = KMEANS_N_INIT,
                      sample_size: int | None = None) -> float:
    """SC (paper App. A.2, "we use k-means to attain clustering results"): mean silhouette coefficient,
    Euclidean in Z, of the **k-means labels** (:func:`kmeans_labels`, n_clusters = number of classes,
    n_init=10, random_state=seed), not of the true labels. ``labels`` only sets the number of clusters.
    ``sample_size`` (default: all points, O(n²)) subsamples with ``random_state=seed``.
    Raises ValueError for a length mismatch or fewer than 2 classes."""
    Z = _points(Z, "Z")
    labels = _labels(labels, Z.shape[0])
    pred = kmeans_labels(Z, _n_classes(labels, Z.shape[0]), seed=seed, n_init=n_init)
    return _silhouette(Z, pred, seed, sample_size)


def _silhouette(Z, pred, seed, sample_size) -> float:
    if np.unique(pred).size < 2:  # k-means returned fewer clusters than asked (duplicate points)
        raise ValueError("Z: k-means found fewer than 2 distinct clusters (too many duplicate points)")
    if sample_size is not None:
        sample_size = _k(sample_size, "sample_size")
        if sample_size >= Z.shape[0]:
            sample_size = None
    return float(silhouette_score(Z, pred, metric="euclidean", sample_size=sample_size, random_state=seed))


# ----------------------------------------------------------------------------- everything
def embedding_report(X_high, Z, labels, ks: Sequence[int] = PAPER_KS, seed: int = 0, *,
                     test_size: float = TEST_SIZE, n_init: int = KMEANS_N_INIT,
                     metric_high: str = "euclidean", silhouette_sample_size: int | None = None) -> dict:
    """All metrics of Tables 1-2 (plus ARI) for one embedding, keyed as the paper's rows.

    Keys: ``"CA {k}-NN"`` and ``"NPA {k}-NN"`` for k in ``ks`` (see :func:`knn_accuracy`, one seeded
    stratified 70/30 split shared by all k; :func:`neighborhood_preservation`, Euclidean in both
    spaces unless ``metric_high="precomputed"``), then ``"NMI"``, ``"SC"`` and ``"ARI"`` computed from
    one k-means run (n_clusters = number of classes, ``n_init``, ``random_state=seed``) on Z: NMI and
    ARI against ``labels``, SC of the k-means labels. Values are Python floats.
    """
    X = _high(X_high, metric_high)
    Z = _points(Z, "Z")
    _same_length(Z, X, "Z", "X_high")
    labels = _labels(labels, Z.shape[0])
    ks = _ks(ks)
    seed = _seed(seed)
    n_classes = _n_classes(labels, Z.shape[0])
    if max(ks) >= Z.shape[0]:
        raise ValueError(f"ks: k={max(ks)} must be smaller than the number of points ({Z.shape[0]})")
    ca = _knn_accuracies(Z, labels, ks, test_size, seed, True)
    npa = _npa_many(X, Z, ks, metric_high)
    pred = kmeans_labels(Z, n_classes, seed=seed, n_init=n_init)
    report = {f"CA {k}-NN": ca[k] for k in ks}
    report.update({f"NPA {k}-NN": npa[k] for k in ks})
    report["NMI"] = clustering_nmi(labels, pred)
    report["SC"] = _silhouette(Z, pred, seed, silhouette_sample_size)
    report["ARI"] = clustering_ari(labels, pred)
    return report


def distance_estimate_quality(D_hat, D, k: int = 10, nn_exact=None) -> tuple[float, float]:
    """How good an estimated distance matrix D_hat (n, n) is against the exact D (n, n): (relative
    Frobenius error ||D_hat - D||_F / ||D||_F, mean over points of the share of their k nearest
    neighbours under D_hat that are among those under D; the point itself excluded). ``nn_exact``:
    the exact (n, k) neighbour lists, when already computed."""
    D_hat, D = _points(D_hat, "D_hat"), _points(D, "D")
    if D_hat.shape != D.shape or D.shape[0] != D.shape[1]:
        raise ValueError(f"D_hat and D must be square of one shape, got {D_hat.shape} and {D.shape}")
    k = _k(k)
    if nn_exact is None:
        nn_exact = neighbour_lists(D, k, "precomputed")
    nn_hat = neighbour_lists(D_hat, k, "precomputed")
    overlap = float(np.mean([len(set(a) & set(b)) / k for a, b in zip(nn_exact, nn_hat)]))
    return float(np.linalg.norm(D_hat - D) / np.linalg.norm(D)), overlap


def neighbour_lists(A, k: int, metric: str = "euclidean") -> np.ndarray:
    """(n, k) indices of the k nearest other points of every row of A (points (n, m), or an (n, n)
    distance matrix with ``metric="precomputed"``), nearest first, the point itself excluded."""
    return _neighbour_indices(_points(A, "A"), _k(k), metric)
