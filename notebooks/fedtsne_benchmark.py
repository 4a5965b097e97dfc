# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Fed-tSNE and Fed-UMAP: visualization benchmark
#
# The experiments of Qiao, Ma and Fan (AAAI 2025), Sec. 6.1 and App. A: $P=10$ clients hold the
# data, IID (a random split) or non-IID (one class per client, "the hardest setting"). The server
# learns $n_y$ landmarks by federated distribution learning (FedDL, Algorithm 1), every client
# uploads its squared distances to the landmarks, and the server runs t-SNE or UMAP on the Nyström
# estimate of the global distance matrix (Algorithm 2). Three columns per embedding:
#
# * **central**: t-SNE / UMAP on the exact pooled distances (the paper's only baseline);
# * **Fed**: Fed-tSNE / Fed-UMAP;
# * **Fed+**: the same with the noise of the paper's experiments, $\mathcal N(0,\beta^2\,
#   \mathrm{sd}^2(\nabla f_p))$ on every client gradient, $\beta=1$ (data-dependent; no
#   $\varepsilon$ is attached to it, see `fedlib.fedtsne`).
#
# Metrics (App. A.2, recipes in `fedlib.embedding_metrics`): k-NN classification accuracy in the
# embedding (CA, 70/30 split), neighbour preservation against the original space (NPA), NMI of
# k-means against the labels, and the silhouette coefficient (SC) of the k-means labels.
#
# **Our datasets are stand-ins.** The paper uses 40,000 MNIST and 40,000 Fashion-MNIST images.
# Here: MNIST-5k (5,000 real MNIST digits, the only MNIST that installs offline), a stratified
# Fashion-MNIST subset (10,000 at `quick`, the paper's 40,000 at `paper`), and optdigits
# (1,797 8x8 digits). Features are pixels / 255. The paper's tables are shown beside ours and
# labelled as the paper's numbers on the paper's data, never as reproduced.
#
# Choices the paper leaves open (notes `papers/fedtsne.md` Sec. 2.8; `fedlib.fedtsne` defaults):
# gradient-averaging FedDL with one step per round and size weights, $\gamma$ from the clients'
# median squared distances, landmarks initialized from the pooled moments, step $1/L$ from a
# data-free Lipschitz bound, Nyström on **squared** distances (the paper does not say which;
# the plain-distance version is an ablation in Sec. 6), sklearn t-SNE (perplexity 30, random
# init) and umap-learn (15 neighbours, min_dist 0.1). To fit the `quick` budget on two CPU cores,
# t-SNE runs 500 iterations (sklearn's default is 1000), UMAP 200 epochs and FedDL 10 rounds; the
# `paper` profile restores the defaults and more rounds. Centralized and federated runs always share
# these settings, so every comparison is like for like.
#
# Re-run with other values, e.g. `python -m fedlib.profiles fedtsne_benchmark rounds=100`.

# %% tags=["parameters"]
profile = "quick"
datasets = ["mnist5k", "fashion_mnist", "optdigits"]
n_points = {"mnist5k": 5000, "fashion_mnist": 10000, "optdigits": 1797}   # stratified subset of train and test, null keeps all
seeds = {"mnist5k": [0], "fashion_mnist": [0], "optdigits": [0, 1, 2]}   # per dataset, fewer for the slow ones
num_clients = 10           # clients of the main tables
n_landmarks = 500          # the paper uses 500
rounds = 10                # FedDL rounds, one gradient step each
beta = 1.0                 # noise level of the Fed plus runs, the paper uses 1
methods = ["tsne", "umap"]
perplexity = 30.0
tsne_max_iter = 500        # sklearn default is 1000
umap_neighbors = 15
umap_min_dist = 0.1
umap_epochs = 200          # null takes the umap default
sweep_dataset = "mnist5k"  # client and landmark sweeps
sweep_points = 2000
sweep_seeds = [0]
iid_client_counts = [5, 10, 20, 50, 100]
noniid_client_counts = [5, 10]
landmark_counts = [50, 100, 200, 500, 1000]
landmark_rounds = 30       # FedDL rounds in the landmark sweep
landmark_splits = ["iid"]
landmark_methods = ["tsne", "umap"]
landmark_variants = ["Fed"]
scatter_points = 2500      # points drawn per scatter panel
num_threads = 2

# %%
import os

# OpenMP threads that wait passively: sklearn's t-SNE and k-means and numba's UMAP otherwise spin
# against each other on a shared 2-core machine (10x slower); must be set before sklearn loads
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import time
import warnings

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from sklearn.metrics import silhouette_score
from sklearn.neighbors import NearestNeighbors
from threadpoolctl import threadpool_limits

from fedlib import embedding_metrics as em
from fedlib import fedtsne as ft
from fedlib import paper_results
from fedlib.data import DATASETS, load_dataset
from fedlib.partition import make_partition

sns.set_theme(style="whitegrid")
threadpool_limits(num_threads)
warnings.filterwarnings("ignore", category=FutureWarning)
T_START = time.perf_counter()
timings = {}

METHOD_NAMES = {"tsne": "t-SNE", "umap": "UMAP"}
FED_NAMES = {"tsne": "Fed-tSNE", "umap": "Fed-UMAP"}
SPLIT_NAMES = {"iid": "IID", "one_class": "non-IID"}
VARIANTS = ["Fed", "Fed+"]
SETTINGS = paper_results.FEDTSNE_SETTINGS          # central, then Fed and Fed+ for IID and non-IID
METRICS = paper_results.FEDTSNE_METRICS
KS = em.PAPER_KS


# ---- every parameter is checked before any long work
def _is_int(v, lo):
    return isinstance(v, int) and not isinstance(v, bool) and v >= lo


def check_int(name, v, lo):
    if not _is_int(v, lo):
        raise ValueError(f"{name} must be an integer >= {lo}, got {v!r}")


def check_seeds(name, s):
    if not isinstance(s, (list, tuple)) or not s or not all(_is_int(x, 0) for x in s):
        raise ValueError(f"{name} must be a non-empty list of integers >= 0, got {s!r}")


if not datasets:
    raise ValueError("datasets must name at least one dataset")
for name in datasets + [sweep_dataset]:
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; allowed: {', '.join(DATASETS)}")
for name in datasets:
    if name not in n_points or name not in seeds:
        raise ValueError(f"n_points and seeds need an entry for {name!r}")
    if n_points[name] is not None:
        check_int(f"n_points[{name}]", n_points[name], 200)
    check_seeds(f"seeds[{name}]", seeds[name])
check_seeds("sweep_seeds", sweep_seeds)
if umap_epochs is not None:
    check_int("umap_epochs", umap_epochs, 1)
for name, v, lo in [("num_clients", num_clients, 2), ("n_landmarks", n_landmarks, 2), ("rounds", rounds, 1),
                    ("landmark_rounds", landmark_rounds, 1),
                    ("tsne_max_iter", tsne_max_iter, 250), ("umap_neighbors", umap_neighbors, 2),
                    ("sweep_points", sweep_points, 200), ("scatter_points", scatter_points, 10),
                    ("num_threads", num_threads, 1)]:
    check_int(name, v, lo)
for name, v, strict in [("beta", beta, False), ("perplexity", perplexity, True), ("umap_min_dist", umap_min_dist, False)]:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v) or (v <= 0 if strict else v < 0):
        raise ValueError(f"{name} must be a finite number {'> 0' if strict else '>= 0'}, got {v!r}")
for m in methods + landmark_methods:
    if m not in METHOD_NAMES:
        raise ValueError(f"unknown method {m!r}; allowed: tsne, umap")
if not methods:
    raise ValueError("methods must name at least one of tsne, umap")
for s in landmark_splits:
    if s not in SPLIT_NAMES:
        raise ValueError(f"unknown split {s!r}; allowed: iid, one_class")
for v in landmark_variants:
    if v not in VARIANTS:
        raise ValueError(f"unknown landmark variant {v!r}; allowed: Fed, Fed+")
for k in iid_client_counts + noniid_client_counts:
    check_int("client count", k, 2)
CLIENT_RUNS = [("iid", k) for k in iid_client_counts] + [("one_class", k) for k in noniid_client_counts]
for ny in landmark_counts:
    check_int("landmark_counts entry", ny, 2)


# %% [markdown]
# ## 1. Data and client splits
#
# Every dataset is pooled (train + test) and, when `n_points` is smaller, cut to a stratified
# subset (`Dataset.subset`, seed 0) that stays the same for every seed; the seeds change the client
# split, the landmark initialization, FedDL's noise, the t-SNE / UMAP initialization, the CA split and
# k-means. Non-IID with $k$ clients and $C$ classes: one class per client when $k$ is a multiple of
# $C$ ($k/C$ clients share a class), $C/k$ classes per client when $k$ divides $C$ (the paper's
# Table 3 with $k=5$: two classes per client, classes $\{0,1\},\{2,3\},\dots$).

# %%
def pooled(name, n):
    """(X in [0,1] (n, m), labels, class names): stratified subset of train + test."""
    ds = load_dataset(name)
    total = len(ds.y_train) + len(ds.y_test)
    if n is not None and n > total:
        raise ValueError(f"n_points[{name}] = {n} but {name} has {total} images")
    if n is not None and n < total:
        n_tr = min(len(ds.y_train), int(round(n * len(ds.y_train) / total)))
        ds = ds.subset(n_tr, n - n_tr, seed=0)
    x = np.concatenate([ds.x_train, ds.x_test]).reshape(len(ds.y_train) + len(ds.y_test), -1)
    return x.astype(np.float64) / 255.0, np.concatenate([ds.y_train, ds.y_test]), ds.classes


def split_parts(y, k, split, seed):
    """k client index arrays: IID, or non-IID label skew as described above."""
    if split == "iid":
        return make_partition(y, k, "iid", seed=seed)
    c = len(np.unique(y))
    if k % c == 0:
        return make_partition(y, k, "one_class", seed=seed)
    if c % k == 0:
        base = make_partition(y, c, "one_class", seed=seed)
        g = c // k
        return [np.sort(np.concatenate(base[i * g:(i + 1) * g])) for i in range(k)]
    raise ValueError(f"non-IID with {k} clients and {c} classes: k must be a multiple or a divisor of {c}")


def check_split(k, split, y, where):
    c, n = len(np.unique(y)), len(y)
    if split == "one_class" and k % c and c % k:
        raise ValueError(f"{where}: non-IID with {k} clients needs k to be a multiple or a divisor of the {c} classes")
    if 2 * k > n:
        raise ValueError(f"{where}: {k} clients for {n} points (each client needs at least 2 points)")


t0 = time.perf_counter()
data = {name: pooled(name, n_points[name]) for name in datasets}
sweep_X, sweep_y, _ = pooled(sweep_dataset, sweep_points)
# checks that need the data, still before the long work
for name, (X, y, _) in data.items():
    for split in ["iid", "one_class"]:
        check_split(num_clients, split, y, f"datasets[{name}]")
    if n_landmarks >= len(y) or max(KS) >= len(y) or perplexity >= len(y):
        raise ValueError(f"{name}: n_landmarks, the metrics' k and the perplexity must be < {len(y)} points")
for split, k in CLIENT_RUNS:
    check_split(k, split, sweep_y, "client sweep")
if max(landmark_counts, default=0) >= len(sweep_y) or n_landmarks >= len(sweep_y):
    raise ValueError(f"landmark counts must be < sweep_points = {len(sweep_y)}")
for split in landmark_splits:
    check_split(num_clients, split, sweep_y, "landmark sweep")

sizes = pd.DataFrame([{"dataset": name, "points": X.shape[0], "features m": X.shape[1], "classes": len(c),
                       "seeds": len(seeds[name])} for name, (X, y, c) in data.items()]).set_index("dataset")
display(sizes)
print(f"sweeps: {sweep_dataset}, {len(sweep_y)} points; {num_clients} clients, n_y = {n_landmarks}, "
      f"{rounds} FedDL rounds; t-SNE {tsne_max_iter} iterations")
timings["data"] = time.perf_counter() - t0

# %% [markdown]
# ## 2. Scoring, and the runs
#
# `embedding_report` recomputes the high-dimensional neighbours for every embedding; here they are
# computed once per dataset and reused (`Scorer`). On the first embedding of every dataset the
# scorer is checked against `embedding_report` (equal to 1e-12). Every federated run also records
# how good the server's distance matrix is before any embedding: the relative Frobenius error
# $\lVert\hat D-D\rVert_F/\lVert D\rVert_F$ and the 10-NN overlap of $\hat D$ with the exact
# neighbours ("D-hat 10-NN").

# %%
def knn_indices(A, k, metric="euclidean"):
    return NearestNeighbors(n_neighbors=k, metric=metric).fit(A).kneighbors(return_distance=False)


def overlap(a, b):
    """Row-wise fraction of common indices of two (n, k) neighbour lists."""
    s = np.sort(np.concatenate([a, b], axis=1), axis=1)
    return float((s[:, 1:] == s[:, :-1]).sum(1).mean() / a.shape[1])


class Scorer:
    """The paper's metrics of one dataset with the high-dimensional neighbours cached."""

    def __init__(self, X, y):
        self.X, self.y, self.c = X, y, len(np.unique(y))
        self.nn = knn_indices(X, max(KS))
        self.D = None

    def exact_distances(self):
        if self.D is None:
            self.D = np.sqrt(ft.sq_distances(self.X))
        return self.D

    def __call__(self, Z, seed):
        out = {f"CA {k}-NN": em.knn_accuracy(Z, self.y, k, seed=seed) for k in KS}
        nz = knn_indices(Z, max(KS))
        out.update({f"NPA {k}-NN": overlap(self.nn[:, :k], nz[:, :k]) for k in KS})
        pred = em.kmeans_labels(Z, self.c, seed=seed)
        out["NMI"] = em.clustering_nmi(self.y, pred)
        out["SC"] = float(silhouette_score(Z, pred))
        return out

    def check(self, Z, seed):
        ref = em.embedding_report(self.X, Z, self.y, seed=seed)
        ours = self(Z, seed)
        assert all(abs(ours[k] - ref[k]) < 1e-12 for k in ours), (ours, ref)

    def distance_quality(self, D_hat):
        D = self.exact_distances()
        rel = float(np.linalg.norm(D_hat - D) / np.linalg.norm(D))
        return {"D-hat rel. error": rel, "D-hat 10-NN": overlap(self.nn[:, :10], knn_indices(D_hat, 10, "precomputed"))}


def embed(method, X, parts, seed, res=None, n_y=n_landmarks, keep=False):
    """Central (res None) or federated t-SNE / UMAP with the chapter's settings."""
    central = res is None
    if method == "tsne":
        return ft.fed_tsne(X, parts, n_y, centralized=central, feddl_result=res, perplexity=perplexity,
                           tsne_kwargs={"max_iter": tsne_max_iter}, seed=seed, keep_distances=keep)
    return ft.fed_umap(X, parts, n_y, centralized=central, feddl_result=res, n_neighbors=umap_neighbors,
                       min_dist=umap_min_dist, umap_kwargs={"n_epochs": umap_epochs}, seed=seed, keep_distances=keep)


def learn_landmarks(X, parts, variant, seed, n_y=n_landmarks, n_rounds=rounds):
    return ft.feddl([X[p] for p in parts], n_y, rounds=n_rounds, noise="heuristic" if variant == "Fed+" else "none",
                    beta=beta, seed=seed)


# %%
rows, keep_Z, dist_rows, cost_rows = [], {}, [], []
scorers = {}
for name, (X, y, classes) in data.items():
    t0 = time.perf_counter()
    sc = scorers[name] = Scorer(X, y)
    for seed in seeds[name]:
        for method in methods:
            res = embed(method, X, None, seed)
            if seed == seeds[name][0] and method == methods[0]:
                sc.check(res.embedding, seed)
            rows.append({"dataset": name, "seed": seed, "embedding": METHOD_NAMES[method], "variant": "central",
                         "split": "pooled", "seconds": res.seconds, **sc(res.embedding, seed)})
            keep_Z[name, method, "central", "pooled", seed] = res.embedding
        for split in ["iid", "one_class"]:
            parts = split_parts(y, num_clients, split, seed)
            for variant in VARIANTS:
                fd = learn_landmarks(X, parts, variant, seed)
                cost_rows.append({"dataset": name, "seed": seed, "variant": variant, "split": SPLIT_NAMES[split],
                                  "FedDL s": fd.seconds, "gamma": fd.gamma,
                                  "FedDL upload MiB": fd.upload_bytes / 2**20})
                for i, method in enumerate(methods):
                    res = embed(method, X, parts, seed, res=fd, keep=i == 0)
                    if i == 0:
                        dist_rows.append({"dataset": name, "seed": seed, "variant": variant,
                                          "split": SPLIT_NAMES[split], **sc.distance_quality(res.distances)})
                        cost_rows[-1]["distance upload MiB"] = res.distance_upload_bytes / 2**20
                    rows.append({"dataset": name, "seed": seed, "embedding": METHOD_NAMES[method], "variant": variant,
                                 "split": SPLIT_NAMES[split], "seconds": res.seconds, **sc(res.embedding, seed)})
                    keep_Z[name, method, variant, SPLIT_NAMES[split], seed] = res.embedding
                    del res
    sc.D = None  # free the exact distance matrix
    print(f"{name}: {len(seeds[name])} seed(s) in {time.perf_counter() - t0:.0f} s", flush=True)
    timings[f"main: {name}"] = time.perf_counter() - t0
results = pd.DataFrame(rows)
dist_q = pd.DataFrame(dist_rows)
costs = pd.DataFrame(cost_rows)

# %% [markdown]
# ## 3. The embeddings
#
# First seed, every dataset: centralized, Fed and Fed+ under both splits, coloured by the true
# class (at most `scatter_points` points drawn per panel, the same points in every panel).

# %%
SETTING_ORDER = [("central", "pooled"), ("Fed", "IID"), ("Fed+", "IID"), ("Fed", "non-IID"), ("Fed+", "non-IID")]
palette = sns.color_palette("tab10", 10)
for name, (X, y, classes) in data.items():
    seed = seeds[name][0]
    idx = np.random.default_rng(0).permutation(len(y))[:scatter_points]
    fig, axes = plt.subplots(len(methods), 5, figsize=(17, 3.4 * len(methods) + 0.6), squeeze=False)
    for r, method in enumerate(methods):
        for c, (variant, split) in enumerate(SETTING_ORDER):
            ax = axes[r, c]
            Z = keep_Z[name, method, variant, split, seed]
            sns.scatterplot(x=Z[idx, 0], y=Z[idx, 1], hue=np.asarray(classes, dtype=object)[y[idx]],
                            hue_order=list(classes), palette=palette[:len(classes)], s=4, linewidth=0, ax=ax,
                            legend=(r == 0 and c == 4), rasterized=True)
            title = (f"{METHOD_NAMES[method]} (centralized)" if variant == "central" else
                     f"{FED_NAMES[method]}{'+' if variant == 'Fed+' else ''}, {split}")
            ax.set_title(title, fontsize=10)
            ax.set_xlabel(f"{METHOD_NAMES[method]} 1 (arbitrary units)", fontsize=9)
            ax.set_ylabel(f"{METHOD_NAMES[method]} 2 (arbitrary units)", fontsize=9)
            ax.tick_params(labelsize=7)
    handles, labels = axes[0, 4].get_legend_handles_labels()
    axes[0, 4].legend_.remove()
    fig.legend(handles, labels, loc="center right", markerscale=3, fontsize=8, title="class")
    fig.suptitle(f"{name}: {len(y)} points, {num_clients} clients, n_y = {n_landmarks}, seed {seed}", y=1.0)
    fig.tight_layout(rect=(0, 0, 0.93, 1))
    plt.show()

# %% [markdown]
# ## 4. Metric tables: ours beside the paper's
#
# Ours: mean ± std over the seeds of each dataset (one seed: the value alone). The paper's
# Tables 1 (MNIST) and 2 (Fashion-MNIST) are **the paper's numbers on 40,000 points of the
# paper's data**; ours are on the stand-ins and sizes listed in Sec. 1. Rows alternate between the
# two sources, metric by metric.

# %%
def mean_std(v):
    v = np.asarray(v, dtype=float)
    return f"{v.mean():.4f} ± {v.std(ddof=1):.4f}" if len(v) > 1 else f"{v.mean():.4f}"


def ours_table(name):
    sub = results[results.dataset == name]
    long = sub.melt(id_vars=["embedding", "variant", "split"], value_vars=METRICS, var_name="metric")
    t = long.groupby(["embedding", "metric", "variant", "split"])["value"].agg(mean_std).unstack(["variant", "split"])
    order = [(METHOD_NAMES[m], k) for m in methods for k in METRICS]
    return t.reindex(index=pd.MultiIndex.from_tuples(order, names=["embedding", "metric"]),
                     columns=pd.MultiIndex.from_tuples(SETTING_ORDER, names=["variant", "split"]))


def paper_fmt(frame):
    out = pd.DataFrame(index=frame.index)
    for variant, split in SETTING_ORDER:
        out[(variant, split)] = [f"{m:.4f} ± {s:.4f}" for m, s in zip(frame[(variant, split, "mean")],
                                                                        frame[(variant, split, "std")])]
    out.columns = pd.MultiIndex.from_tuples(out.columns, names=["variant", "split"])
    return out


def beside(paper, paper_label, ours, ours_label):
    both = pd.concat({paper_label: paper.reindex(ours.index), ours_label: ours}, names=["source"])
    both = both.reorder_levels(["embedding", "metric", "source"])
    return both.reindex(pd.MultiIndex.from_tuples([(e, m, s) for e, m in ours.index for s in (paper_label, ours_label)],
                                                  names=both.index.names))


PAPER_TABLES = {"mnist5k": (paper_results.fedtsne_table1, "paper Table 1: MNIST, 40,000 points"),
                "fashion_mnist": (paper_results.fedtsne_table2, "paper Table 2: Fashion-MNIST, 40,000 points")}
for name in datasets:
    n, s = len(data[name][1]), len(seeds[name])
    label = f"ours: {name}, {n} points, {s} seed{'s' if s > 1 else ''}"
    print(f"=== {name} ===")
    if name in PAPER_TABLES:
        fn, plabel = PAPER_TABLES[name]
        display(beside(paper_fmt(fn()), plabel, ours_table(name), label))
    else:
        print(f"{label} (the paper has no table for this dataset)")
        display(ours_table(name))

# %% [markdown]
# ### Change against centralized, paper and ours
#
# Absolute values differ (other data, sizes, settings); the *change* that federation causes is
# the quantity to compare: federated minus centralized, per metric (negative = a drop).

# %%
def deltas_ours(name, metrics=("CA 10-NN", "NPA 10-NN", "NMI")):
    mean = results[results.dataset == name].groupby(["embedding", "variant", "split"])[list(metrics)].mean()
    out = {}
    for emb in [METHOD_NAMES[m] for m in methods]:
        base = mean.loc[(emb, "central", "pooled")]
        for metric in metrics:
            out[(emb, metric)] = {f"{v} {s}": mean.loc[(emb, v, s), metric] - base[metric] for v, s in SETTING_ORDER[1:]}
    return pd.DataFrame(out).T


def deltas_paper(frame, metrics=("CA 10-NN", "NPA 10-NN", "NMI")):
    out = {}
    for emb in [METHOD_NAMES[m] for m in methods]:
        for metric in metrics:
            row = frame.loc[(emb, metric)]
            out[(emb, metric)] = {f"{v} {s}": row[(v, s, "mean")] - row[("central", "pooled", "mean")]
                                  for v, s in SETTING_ORDER[1:]}
    return pd.DataFrame(out).T


delta_frames = {}
for name in datasets:
    parts_ = {"ours: " + name: deltas_ours(name)}
    if name in PAPER_TABLES:
        parts_ = {"paper: " + PAPER_TABLES[name][1].split(": ")[1]: deltas_paper(PAPER_TABLES[name][0]()), **parts_}
    delta_frames[name] = pd.concat(parts_, names=["source"])
    display(delta_frames[name].style.format("{:+.4f}").set_caption(f"federated minus centralized: {name}"))

# %% [markdown]
# ### How good is the server's distance matrix?
#
# The Nyström estimate on squared distances is exact once the landmarks' affine span contains the
# data (rank argument, notes Sec. 3): with $n_y\ge m+2$ landmarks in general position, whatever
# their positions. That is the case for optdigits' 64 pixels with $n_y=500$. For 784 pixels it is
# not, and the estimate is as good as the landmarks' span covers the data's variance. The table
# gives the relative error of $\hat D$ and its 10-NN overlap with the exact neighbours, mean over
# seeds. Checked below: (1) exactness (relative error below 1e-6) for every dataset with
# $m+2\le n_y$; (2) the heuristic noise barely moves the estimate (Fed+ and Fed differ by at most
# 0.05 in 10-NN overlap, every dataset, split and seed); (3) so does the split (IID and non-IID Fed
# differ by at most 0.05).

# %%
dq = dist_q.groupby(["dataset", "variant", "split"])[["D-hat rel. error", "D-hat 10-NN"]].mean()
display(dq.style.format({"D-hat rel. error": "{:.2e}", "D-hat 10-NN": "{:.4f}"}))
for name, (X, y, _) in data.items():
    if X.shape[1] + 2 <= n_landmarks:
        worst = dist_q[dist_q.dataset == name]["D-hat rel. error"].max()
        print(f"{name}: m + 2 = {X.shape[1] + 2} <= n_y = {n_landmarks}, largest relative error {worst:.1e}")
        assert worst < 1e-6
wide = dist_q.pivot_table(index=["dataset", "seed"], columns=["variant", "split"], values="D-hat 10-NN")
noise_shift = max((wide[("Fed+", s)] - wide[("Fed", s)]).abs().max() for s in ["IID", "non-IID"])
split_shift = (wide[("Fed", "IID")] - wide[("Fed", "non-IID")]).abs().max()
print(f"largest |Fed+ - Fed| in D-hat 10-NN overlap: {noise_shift:.4f}; largest |IID - non-IID| (Fed): {split_shift:.4f}")
assert noise_shift <= 0.05 and split_shift <= 0.05

# %% [markdown]
# ### Cost
#
# Seconds are this machine's (2 shared CPU cores: noisy); FedDL runs once per (split, variant,
# seed) and its landmarks serve both t-SNE and UMAP. Upload = measured message bytes (float64):
# FedDL's per-round gradients plus the setup scalars, and the final distance upload
# ($n\times n_y$ values in all).

# %%
emb_s = results.groupby(["dataset", "embedding", "variant"])["seconds"].mean().unstack(["embedding", "variant"])
display(emb_s.style.format("{:.1f}").set_caption("embedding seconds (Nyström + t-SNE/UMAP; central: exact distances + embedding)"))
display(costs.groupby(["dataset", "variant", "split"])[["FedDL s", "FedDL upload MiB", "distance upload MiB", "gamma"]]
        .mean().style.format({"FedDL s": "{:.1f}", "FedDL upload MiB": "{:.1f}", "distance upload MiB": "{:.1f}",
                              "gamma": "{:.4f}"}))

# %% [markdown]
# ## 5. Number of clients (paper Tables 3 and 4)
#
# Fed-tSNE and Fed-tSNE+ on `sweep_dataset` (MNIST-5k subset at `quick`), $k$ clients, NMI and
# NPA 10-NN. Paper Table 3 is non-IID with $k\in\{5,10\}$ (two classes / one class per client),
# Table 4 IID with $k$ from 5 to 100; we run `iid_client_counts` IID and `noniid_client_counts`
# non-IID (with $k\ge 10$: one class per client, $k/10$ clients per class; add e.g. 20 and 50 to
# see it). With size weights and one step per round,
# FedDL without noise is exactly centralized gradient descent whatever $k$ (notes Sec. 2.2), so
# Fed-tSNE can change with $k$ only through $\gamma$ (a weighted mean of the clients' medians) and
# the random seeds. Fed+ adds one noise draw per client, so the aggregate noise shrinks as $k$ grows.

# %%
t0 = time.perf_counter()
sweep_scorer = Scorer(sweep_X, sweep_y)
crow = []
for seed in sweep_seeds:
    for split, k in CLIENT_RUNS:
        parts = split_parts(sweep_y, k, split, seed)
        for variant in VARIANTS:
            fd = learn_landmarks(sweep_X, parts, variant, seed)
            res = embed("tsne", sweep_X, parts, seed, res=fd)
            crow.append({"seed": seed, "split": SPLIT_NAMES[split], "clients": k,
                         "method": "Fed-tSNE" + ("+" if variant == "Fed+" else ""),
                         "gamma": fd.gamma, **sweep_scorer(res.embedding, seed)})
clients_df = pd.DataFrame(crow)
timings["client sweep"] = time.perf_counter() - t0

fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
for ax, metric in zip(axes, ["NMI", "NPA 10-NN"]):
    sns.lineplot(data=clients_df, x="clients", y=metric, hue="method", style="split", markers=True, ax=ax,
                 errorbar=("sd" if len(sweep_seeds) > 1 else None))
    ax.set_xscale("log")
    ax.set_xticks(sorted(set(clients_df.clients)), [str(k) for k in sorted(set(clients_df.clients))])
    ax.minorticks_off()
    ax.set_xlabel("number of clients k (log scale)")
    ax.set_ylabel(f"{metric} (fraction)")
    sns.move_legend(ax, "upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, title_fontsize=8)
fig.suptitle(f"Client sweep: {sweep_dataset}, {len(sweep_y)} points, n_y = {n_landmarks}, {len(sweep_seeds)} seed(s)",
             y=1.02)
fig.tight_layout()
plt.show()

ours_c = (clients_df.melt(id_vars=["split", "clients", "method"], value_vars=["NMI", "NPA 10-NN"], var_name="metric")
          .groupby(["split", "method", "metric", "clients"])["value"].agg(mean_std).unstack("clients"))
print(f"Ours: {sweep_dataset}, {len(sweep_y)} points, mean ± std over {len(sweep_seeds)} seed(s)")
display(ours_c)


def paper_clients(frame):
    ks = frame.columns.get_level_values(0).unique()
    return pd.DataFrame({k: [f"{m:.3f} ± {s:.3f}" for m, s in zip(frame[(k, "mean")], frame[(k, "std")])] for k in ks},
                        index=frame.index)


print("Paper, Table 3 (non-IID MNIST, 40,000 points) - the paper's numbers")
display(paper_clients(paper_results.fedtsne_table3()))
print("Paper, Table 4 (IID MNIST, 40,000 points) - the paper's numbers")
display(paper_clients(paper_results.fedtsne_table4()))

span = clients_df.groupby(["split", "method"])[["NMI", "NPA 10-NN"]].agg(lambda v: v.max() - v.min())
print("Ours: spread (max - min) over k of the per-run values")
display(span.style.format("{:.4f}"))

# %% [markdown]
# How to read the spread: NMI comes from one k-means run on one t-SNE embedding per $k$, so with
# few seeds its spread over $k$ is mostly the run-to-run variation of t-SNE and k-means; NPA 10-NN
# varies far less. Compare the spread with the std of the optdigits rows in Sec. 4, which has
# several seeds at fixed $k$.

# %% [markdown]
# ## 6. Number of landmarks (paper Fig. 6)
#
# The paper reports that NMI grows with $n_y$ "regardless of the method or conditions" (no numbers
# printed). Here, for every $n_y$ and the splits in `landmark_splits` (10 clients, `landmark_rounds`
# FedDL rounds): NMI of Fed-tSNE / Fed-UMAP, and the quality of the server's $\hat D$ for three
# variants of the Nyström step:
#
# * **FedDL landmarks, squared distances**: the method as run in this chapter;
# * **untrained landmarks**: the same with FedDL's initial landmarks $Y^0$ (what training buys);
# * **FedDL landmarks, plain distances**: Eq. 22 read literally, $\hat D = B W_k^{+} B^\top$ on
#   Euclidean distances, clipped at 0 (an ablation; never exact).
#
# Checked below: with $n_y\ge m+2$ landmarks the squared-distance estimate is exact (relative error
# below 1e-6) whenever the grid reaches that size, and at the largest $n_y$ the squared estimate
# keeps more true 10-NN neighbours than the plain one.

# %%
def plain_nystrom(data_parts, Y):
    """Eq. 22 on plain Euclidean distances, symmetrized, clipped at 0, zero diagonal."""
    B = np.sqrt(np.vstack([ft.sq_distances(x, Y) for x in data_parts]))
    H = np.maximum(ft.nystrom(B, np.sqrt(ft.sq_distances(Y))), 0.0)
    np.fill_diagonal(H, 0.0)
    return H


def squared_nystrom(data_parts, Y):
    B = np.vstack([ft.sq_distances(x, Y) for x in data_parts])
    return ft.nystrom_distances(B, ft.sq_distances(Y))


def in_x_order(est, parts):
    order = np.concatenate(parts)
    out = np.empty_like(est)
    out[np.ix_(order, order)] = est
    return out


t0 = time.perf_counter()
lrow, qrow = [], []
m_dim = sweep_X.shape[1]
for seed in sweep_seeds:
    for split in landmark_splits:
        parts = split_parts(sweep_y, num_clients, split, seed)
        chunks = [sweep_X[p] for p in parts]
        for ny in landmark_counts:
            for variant in landmark_variants:
                fd = learn_landmarks(sweep_X, parts, variant, seed, n_y=ny, n_rounds=landmark_rounds)
                for estimate, D_hat in [("FedDL landmarks, squared", squared_nystrom(chunks, fd.landmarks)),
                                        ("untrained landmarks, squared", squared_nystrom(chunks, fd.init_landmarks)),
                                        ("FedDL landmarks, plain", plain_nystrom(chunks, fd.landmarks))]:
                    qrow.append({"seed": seed, "split": SPLIT_NAMES[split], "n_y": ny, "variant": variant,
                                 "estimate": estimate, **sweep_scorer.distance_quality(in_x_order(D_hat, parts))})
                for method in landmark_methods:
                    res = embed(method, sweep_X, parts, seed, res=fd, n_y=ny)
                    lrow.append({"seed": seed, "split": SPLIT_NAMES[split], "n_y": ny,
                                 "method": FED_NAMES[method] + ("+" if variant == "Fed+" else ""),
                                 **sweep_scorer(res.embedding, seed)})
landmarks_df, quality_df = pd.DataFrame(lrow), pd.DataFrame(qrow)
sweep_scorer.D = None
timings["landmark sweep"] = time.perf_counter() - t0

fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
sns.lineplot(data=landmarks_df, x="n_y", y="NMI", hue="method", style="split", markers=True, ax=axes[0],
             errorbar=("sd" if len(sweep_seeds) > 1 else None))
axes[0].set_ylabel("NMI of k-means on the embedding (fraction)")
for ax, col in zip(axes[1:], ["D-hat 10-NN", "D-hat rel. error"]):
    sns.lineplot(data=quality_df, x="n_y", y=col, hue="estimate", style="split", markers=True, ax=ax,
                 errorbar=("sd" if len(sweep_seeds) > 1 else None))
axes[1].set_ylabel("10-NN overlap of D-hat with exact (fraction)")
axes[2].set_ylabel("relative Frobenius error of D-hat")
axes[2].set_yscale("log")
for ax in axes:
    ax.set_xscale("log")
    ax.set_xticks(landmark_counts, [str(v) for v in landmark_counts])
    ax.minorticks_off()
    ax.set_xlabel("number of landmarks n_y (log scale)")
    ax.axvline(m_dim + 2, color="grey", ls=":", lw=1)
    sns.move_legend(ax, "upper center", bbox_to_anchor=(0.5, -0.22), ncol=2, fontsize=8, title_fontsize=8)
fig.suptitle(f"Landmark sweep: {sweep_dataset}, {len(sweep_y)} points, {num_clients} clients; dotted line: n_y = m + 2",
             y=1.02)
fig.tight_layout()
plt.show()

print("Ours: NMI against n_y (mean over seeds)")
display(landmarks_df.groupby(["method", "split", "n_y"])["NMI"].mean().unstack("n_y").style.format("{:.4f}"))
print("Ours: 10-NN overlap of D-hat with the exact neighbours (mean over seeds)")
display(quality_df.groupby(["estimate", "split", "n_y"])["D-hat 10-NN"].mean().unstack("n_y").style.format("{:.4f}"))

exact = quality_df[(quality_df.n_y >= m_dim + 2) & (quality_df.estimate != "FedDL landmarks, plain")]
if len(exact):
    print(f"n_y >= m + 2 = {m_dim + 2}: largest relative error of the squared estimate "
          f"{exact['D-hat rel. error'].max():.1e}")
    assert exact["D-hat rel. error"].max() < 1e-6
else:
    print(f"the grid stays below m + 2 = {m_dim + 2} landmarks: no exactness check")
top = quality_df[quality_df.n_y == max(landmark_counts)].groupby("estimate")["D-hat 10-NN"].mean()
print(f"largest n_y = {max(landmark_counts)}: 10-NN overlap squared {top['FedDL landmarks, squared']:.4f} "
      f"vs plain {top['FedDL landmarks, plain']:.4f}")
assert top["FedDL landmarks, squared"] > top["FedDL landmarks, plain"]

# %% [markdown]
# ## 7. Reading the results
#
# The numbers quoted here are computed from the runs above.

# %%
mean_all = results.groupby(["dataset", "embedding", "variant", "split"])[list(METRICS)].mean()
gap = []
for name in datasets:
    for emb in [METHOD_NAMES[m] for m in methods]:
        base = mean_all.loc[(name, emb, "central", "pooled")]
        for v, s in SETTING_ORDER[1:]:
            gap.append({"dataset": name, "embedding": emb, "setting": f"{v} {s}",
                        **{m: mean_all.loc[(name, emb, v, s), m] - base[m] for m in ["CA 10-NN", "NPA 10-NN", "NMI"]}})
gap = pd.DataFrame(gap)
summary = gap.groupby("dataset")[["CA 10-NN", "NPA 10-NN", "NMI"]].mean().add_prefix("mean change ")
summary["D-hat 10-NN overlap"] = dist_q.groupby("dataset")["D-hat 10-NN"].mean()
summary = summary.sort_values("D-hat 10-NN overlap")
print("Ours: federated minus centralized, mean over embeddings, Fed/Fed+ and splits; with the mean D-hat 10-NN overlap")
display(summary.style.format("{:+.4f}").format("{:.4f}", subset=["D-hat 10-NN overlap"]))
paper_gap = pd.concat([deltas_paper(fn(), ("CA 10-NN", "NPA 10-NN", "NMI")) for fn, _ in PAPER_TABLES.values()],
                      keys=[lbl.split(": ")[1] for _, lbl in PAPER_TABLES.values()])
print("Paper: the same mean change (Tables 1-2, the paper's numbers on 40,000 points)")
display(paper_gap.groupby(level=[0, 2]).mean().mean(axis=1).unstack()[["CA 10-NN", "NPA 10-NN", "NMI"]]
        .add_prefix("mean change ").style.format("{:+.4f}"))
if len(summary) > 1:
    worst = summary["mean change NPA 10-NN"].idxmin()
    print(f"largest mean NPA 10-NN drop: {worst}, which has the lowest D-hat overlap: {summary.index[0]}")
    assert worst == summary.index[0]
fed_plus = gap[gap.setting.str.startswith("Fed+")].set_index(["dataset", "embedding", "setting"])
fed_only = gap[gap.setting.str.startswith("Fed ")].set_index(["dataset", "embedding", "setting"])
print(f"ours: Fed+ minus Fed (beta = {beta}), largest |change| of CA 10-NN: "
      f"{np.abs(fed_plus['CA 10-NN'].values - fed_only['CA 10-NN'].values).max():.4f}")
timings["total"] = time.perf_counter() - T_START
display(pd.Series(timings, name="seconds").to_frame().style.format("{:.0f}"))

# %% [markdown]
# * **What decides the drop is the server's distance matrix.** Where $\hat D$ is exact (optdigits,
#   $n_y\ge m+2$) federation changes nothing beyond the run-to-run variation of t-SNE and UMAP. Where
#   it is not, the neighbour metrics drop first; the dataset with the lowest 10-NN overlap of
#   $\hat D$ has the largest NPA drop (asserted above when several datasets run). Fashion-MNIST's
#   variance is spread over more directions than MNIST's, so 500 landmarks cover it less well.
# * **IID and non-IID behave alike without noise**, as in the paper: with size weights and one
#   step per round FedDL is the same gradient descent for every split, and the split changes the
#   estimate by little (asserted in Sec. 4).
# * **The paper's heuristic noise ($\beta=1$) costs little here, unlike in the paper.** It moves the
#   landmarks, but the squared-distance estimate depends on their span, which the noise does not
#   shrink (asserted in Sec. 4). The paper's larger Fed+ losses, non-IID above all, suggest a
#   Nyström step that depends on where the landmarks are, such as Eq. 22 on plain distances (Sec. 6
#   shows how much worse that estimate is). The noise is no privacy guarantee either: the final
#   distance upload reveals every sample's projection on the landmarks' span
#   (`fedlib.fedtsne.reconstruct_from_sq_distances`).
# * **Absolute values** (CA, NMI, SC) differ from the paper's: other data, 1,797 to 10,000 instead
#   of 40,000 points, and fewer t-SNE iterations at `quick`.

# %% [markdown]
# ## Exercises
#
# 1. **Plain distances.** In the landmark sweep, compare the plain-distance estimate with the
#    squared one beyond $n_y=m+2$. Why can $B W^{+} B^\top$ on squared distances be exact while on
#    plain distances it cannot?
# 2. **Stronger noise.** Run `python -m fedlib.profiles fedtsne_benchmark datasets=[optdigits] beta=20`,
#    then again with `n_landmarks=40`. Why can the noise not change the federated columns in the
#    first run, and what changes in the second?
# 3. **Fewer landmarks.** Run the main experiment with `n_landmarks=50` on optdigits. Compare the
#    drop of NPA 1-NN with that of CA 10-NN. Which one measures what Nyström loses?
#
# ```{admonition} Solutions
# :class: dropdown
# 1. Squared Euclidean distances are $\lVert x\rVert^2-2x^\top y+\lVert y\rVert^2$: the matrix
#    over all points and landmarks has rank at most $m+2$, and a Nyström estimate from columns that
#    span the whole range reproduces a low-rank matrix exactly. Plain distances are square roots of
#    those entries; the square root destroys the low rank, so no finite set of landmarks makes the
#    estimate exact.
# 2. optdigits has $m=64$, so 500 landmarks are more than $m+2$: the squared-distance estimate is
#    exact for any landmarks in general position, noisy or not, and the federated columns equal the
#    centralized ones up to t-SNE / UMAP randomness. With 40 landmarks the estimate depends on
#    where they are: noise that pushes them away from the data lowers the 10-NN overlap of D-hat,
#    and the neighbour metrics (NPA, then CA 1-NN) follow it.
# 3. Expect NPA 1-NN to drop much more: it asks for each point's exact nearest neighbour, which
#    a low-rank estimate moves easily, while a vote over 10 neighbours in a well-separated class
#    still finds the right label. NPA measures what Nyström loses; CA what a reader of the plot loses.
# ```
