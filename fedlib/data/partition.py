"""Client partitions shared by all papers: IID, Dirichlet, shards, one class per client.

Every partition function takes a label array ``labels`` (N,) of ints and returns a list of
``num_clients`` int64 index arrays into it, each sorted ascending. The arrays are disjoint and
cover all N samples. Results depend only on ``seed`` (``np.random.default_rng(seed)``): the
same seed gives the same partition.

=============  ==============================================================================
scheme         origin
=============  ==============================================================================
iid            uniform random equal split
dirichlet      label-skew Dir(alpha) of NIID-Bench (Li et al., 2022) / PFLlib, after Lin et
               al. (2020); AFL's NIID-1. Smaller alpha = more skew.
shards         McMahan et al. (2017) pathological non-IID sharding; AFL's NIID-2 (paper
               definition, not the AFL code's ``pat`` split). Smaller s = more skew.
one_class      each client holds a single class (extreme label skew)
=============  ==============================================================================
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from fedlib.core.validate import check_choice, check_int, check_positive
from fedlib.evaluation.style import fit_column

SCHEMES = ("iid", "dirichlet", "shards", "one_class")


# --------------------------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------------------------


def _as_labels(labels) -> np.ndarray:
    y = np.asarray(labels)
    if y.ndim != 1:
        raise ValueError(f"labels must be a 1-D array of class ids, got shape {y.shape}")
    if y.size == 0:
        raise ValueError("labels is empty: there is nothing to partition")
    if not np.issubdtype(y.dtype, np.integer):
        if np.issubdtype(y.dtype, np.floating) and np.all(y == np.round(y)):
            y = y.astype(np.int64)
        else:
            raise ValueError(f"labels must be integer class ids, got dtype {y.dtype}")
    if y.min() < 0:
        raise ValueError(f"labels must be >= 0, got min {y.min()}")
    return y.astype(np.int64, copy=False)


def check_clients(y: np.ndarray, num_clients) -> int:
    k = check_int("num_clients", num_clients, 1)
    if k > len(y):
        raise ValueError(f"num_clients={k} is larger than the number of samples ({len(y)}): more clients than samples")
    return k


def _check_alpha(alpha) -> float:
    if alpha is None:
        raise ValueError("alpha is required for the dirichlet scheme (a float > 0; smaller = more skew)")
    return check_positive("alpha", alpha)


def _finish(parts: list) -> list[np.ndarray]:
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


# --------------------------------------------------------------------------------------------
# schemes
# --------------------------------------------------------------------------------------------


def iid_partition(labels, num_clients: int, seed: int = 0) -> list[np.ndarray]:
    """IID: shuffle all N indices and cut them into ``num_clients`` parts (sizes differ by <= 1).

    labels: (N,) ints. Returns ``num_clients`` sorted int64 index arrays.
    """
    y = _as_labels(labels)
    k = check_clients(y, num_clients)
    rng = np.random.default_rng(seed)
    return _finish(np.array_split(rng.permutation(len(y)), k))


def dirichlet_partition(labels, num_clients: int, alpha: float, seed: int = 0,
                        min_size: int = 0, max_tries: int = 1000) -> list[np.ndarray]:
    """Label-skew Dirichlet partition, the NIID-Bench / PFLlib recipe (Lin et al., 2020; AFL NIID-1).

    For each class c: shuffle its indices, draw p ~ Dir(alpha * 1_K), set p_j = 0 for clients
    already holding >= N/K samples, renormalise and cut the class by the cumulative proportions.
    The whole draw is repeated until the smallest client holds >= ``min_size`` samples; after
    ``max_tries`` draws a ValueError says to lower ``min_size`` or raise ``alpha``. With the
    default ``min_size=0`` clients may be empty (common for alpha <= 0.01).

    If every eligible entry of p underflows to exactly 0 (tiny alpha), p is redrawn from
    Dir(alpha) over the eligible clients only, which is the same distribution as the masked,
    renormalised p (Dirichlet aggregation property) without the 0/0.

    labels: (N,) ints. Returns ``num_clients`` sorted int64 index arrays.
    """
    y = _as_labels(labels)
    k = check_clients(y, num_clients)
    alpha = _check_alpha(alpha)
    min_size = check_int("min_size", min_size, 0)
    max_tries = check_int("max_tries", max_tries, 1)
    n = len(y)
    if min_size * k > n:
        raise ValueError(f"min_size={min_size} is impossible: {k} clients x {min_size} > {n} samples; lower min_size")
    rng = np.random.default_rng(seed)
    classes = np.unique(y)
    cap = n / k
    for _ in range(max_tries):
        parts: list[list[np.ndarray]] = [[] for _ in range(k)]
        sizes = np.zeros(k, dtype=np.int64)
        for c in classes:
            idx = np.flatnonzero(y == c)
            rng.shuffle(idx)
            p = rng.dirichlet(np.full(k, alpha))
            eligible = sizes < cap
            p = np.where(eligible, p, 0.0)
            if p.sum() <= 0:
                p = np.zeros(k)
                p[eligible] = rng.dirichlet(np.full(int(eligible.sum()), alpha))
            p = p / p.sum()
            cuts = (np.cumsum(p) * len(idx)).astype(np.int64)[:-1]
            for j, chunk in enumerate(np.split(idx, cuts)):
                parts[j].append(chunk)
                sizes[j] += len(chunk)
        if sizes.min() >= min_size:
            return _finish([np.concatenate(p) for p in parts])
    raise ValueError(
        f"dirichlet_partition: no draw in max_tries={max_tries} gave every client >= min_size={min_size} "
        f"samples (alpha={alpha}, num_clients={k}, N={n}); lower min_size or raise alpha (or max_tries)"
    )


def shard_partition(labels, num_clients: int, shards_per_client: int, seed: int = 0) -> list[np.ndarray]:
    """McMahan et al. (2017) sharding; AFL's NIID-2 (paper definition).

    Sort the samples by label (stable; ties in random order from ``seed``), cut them into
    ``num_clients * shards_per_client`` equal shards, and give each client ``shards_per_client``
    shards at random. N must be divisible by ``num_clients * shards_per_client``. A client holds at
    most ``shards_per_client`` classes when every class size is a multiple of the shard size;
    otherwise a shard straddling a class boundary contributes two classes.

    labels: (N,) ints. Returns ``num_clients`` sorted int64 index arrays of N/K samples each.
    """
    y = _as_labels(labels)
    k = check_clients(y, num_clients)
    s = check_int("shards_per_client", shards_per_client, 1)
    n = len(y)
    total = k * s
    if n % total != 0:
        raise ValueError(
            f"shards do not divide the data: num_clients * shards_per_client = {k} * {s} = {total} "
            f"shards, but the {n} samples are not a multiple of {total}; pick num_clients/shards_per_client "
            f"so that N is divisible (or subset the data)"
        )
    rng = np.random.default_rng(seed)
    perm = rng.permutation(n)
    order = perm[np.argsort(y[perm], kind="stable")]
    shards = order.reshape(total, n // total)
    owner = rng.permutation(total).reshape(k, s)
    return _finish([shards[row].ravel() for row in owner])


def one_class_partition(labels, num_clients: int, seed: int = 0) -> list[np.ndarray]:
    """Each client holds a single class: C classes present, ``num_clients`` = m * C.

    Class ``classes[i]`` (sorted) goes to clients i*m .. i*m+m-1, its shuffled indices split
    equally among them (sizes differ by <= 1). labels: (N,) ints.
    """
    y = _as_labels(labels)
    k = check_clients(y, num_clients)
    classes = np.unique(y)
    c = len(classes)
    if k % c != 0:
        raise ValueError(f"num_clients={k} must be a multiple of the number of classes ({c}) for one_class")
    m = k // c
    rng = np.random.default_rng(seed)
    parts: list[np.ndarray] = []
    for cls in classes:
        idx = rng.permutation(np.flatnonzero(y == cls))
        parts.extend(np.array_split(idx, m))
    return _finish(parts)


def make_partition(labels, num_clients: int, scheme: str, *, alpha: float | None = None,
                   shards_per_client: int | None = None, seed: int = 0, min_size: int = 0) -> list[np.ndarray]:
    """Dispatch to a scheme in {"iid", "dirichlet", "shards", "one_class"}.

    ``alpha`` is required by "dirichlet" (with ``min_size``), ``shards_per_client`` by "shards";
    arguments a scheme does not use are ignored. All checks run before any work.
    """
    check_choice("scheme", scheme, SCHEMES)
    y = _as_labels(labels)
    check_clients(y, num_clients)
    if scheme == "iid":
        return iid_partition(y, num_clients, seed)
    if scheme == "dirichlet":
        return dirichlet_partition(y, num_clients, _check_alpha(alpha), seed, min_size=min_size)
    if scheme == "shards":
        return shard_partition(y, num_clients, check_int("shards_per_client", shards_per_client, 1), seed)
    return one_class_partition(y, num_clients, seed)


# --------------------------------------------------------------------------------------------
# reports and plots
# --------------------------------------------------------------------------------------------


def partition_report(labels, parts: list[np.ndarray], num_classes: int | None = None) -> pd.DataFrame:
    """Per-client class counts: DataFrame (K rows ``client`` 0..K-1) x (C columns ``class`` 0..C-1).

    ``num_classes`` defaults to ``max(labels) + 1``.
    """
    y = _as_labels(labels)
    c = int(y.max()) + 1 if num_classes is None else check_int("num_classes", num_classes, 1)
    if c <= y.max():
        raise ValueError(f"num_classes={c} but labels go up to {y.max()}")
    counts = np.stack([np.bincount(y[np.asarray(p, dtype=np.int64)], minlength=c) for p in parts]) \
        if len(parts) else np.zeros((0, c), dtype=np.int64)
    return pd.DataFrame(counts, index=pd.RangeIndex(len(parts), name="client"),
                        columns=pd.RangeIndex(c, name="class"))


def plot_partition(report: pd.DataFrame, ax=None, max_clients: int = 50):
    """Seaborn heat map of a :func:`partition_report`: clients (rows) x classes (columns).

    Only the first ``max_clients`` clients are drawn (the title says so). Returns the Axes.
    """
    import matplotlib.pyplot as plt
    import seaborn as sns

    max_clients = check_int("max_clients", max_clients, 1)
    if ax is None:
        _, ax = plt.subplots(figsize=fit_column(max(4.0, 0.45 * report.shape[1] + 2), max(3.0, 0.22 * min(len(report), max_clients) + 1.5)))
    k = len(report)
    shown = report.iloc[:max_clients]
    annot = shown.shape[0] <= 20 and shown.shape[1] <= 12
    step = max(1, -(-shown.shape[0] // 10))  # at most ~10 client labels, so they never overlap
    sns.heatmap(shown, ax=ax, cmap="viridis", annot=annot, fmt="d", yticklabels=step,
                cbar_kws={"label": "samples"})
    ax.set_xlabel("class")
    ax.set_ylabel("client")
    if k > max_clients:
        ax.set_title(f"per-client class counts (first {max_clients} of {k} clients shown)")
    else:
        ax.set_title(f"per-client class counts ({k} clients)")
    return ax
