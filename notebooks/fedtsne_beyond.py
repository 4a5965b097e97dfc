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
# # Fed-tSNE / Fed-UMAP: beyond the paper
#
# ```{include} /book/generated/findings/fedtsne_beyond.md
# ```
#
# Fed-tSNE and Fed-UMAP {cite}`qiao2025fedtsne` ask every client to upload the squared distances
# from its points to $n_y$ landmarks, and complete the $n\times n$ distance matrix by the Nyström
# method {cite}`williams2001nystrom`. Three questions the paper does not ask, each answered by a
# derivation, a numerical check and a measurement on the data of the benchmark chapter
# (`mnist5k`, 1,000 points, 10 IID clients at `quick`):
#
# 1. **What is the upload?** With $n_y\le m+1$ landmarks (here $m=784$ pixels) the upload of a point
#    *is* its projection onto the landmarks' affine hull and its distance to that hull, nothing more
#    and nothing less; the Nyström estimate has a closed form in these two quantities.
# 2. **Can the server do better with the same upload?** Other estimators of the distances from the
#    projection and the residual, and landmarks from federated k-means {cite}`lloyd1982kmeans`
#    (Lloyd's step needs only per-client sums and counts) instead of FedDL.
# 3. **Can the points stay off the server?** The server embeds only the landmarks; each client places
#    its own points into that map with openTSNE's `transform` {cite}`policar2024opentsne` (UMAP's
#    `transform` {cite}`mcinnes2018umap` in the `paper` profile).
#
# Library code: `fedlib.fedtsne.beyond`; tests: `tests/fedtsne/test_fedtsne_beyond.py`. Samples are rows.

# %% tags=["parameters"]
profile = "quick"
dataset = "mnist5k"        # the benchmark chapter's sweep dataset
n_points = 1000            # stratified subset (fedtsne.load_points, seed 0), as in the benchmark at quick
num_clients = 10           # IID clients
seeds = [0, 1, 2, 3, 4]    # client split, FedDL's Y^0, t-SNE, CA split, k-means of the metrics
rounds = 50                # FedDL rounds, also the round budget of federated k-means (same upload per round)
landmark_grid = [50, 200]  # n_y for the neighbour recall (the paper profile: 50, 100, 200, 500)
metric_grid = [50, 200]    # n_y where the paper's metrics are measured (values of landmark_grid)
metric_combos = ["feddl/nystrom", "kmeans/nystrom"]   # landmarks/estimator embedded (paper profile: + projection)
placement_landmarks = 200  # n_y of Sec. 3 (one of landmark_grid)
placement_kinds = ["feddl", "kmeans"]   # landmarks the clients place against (quick: kmeans only)
methods = ["tsne"]         # the paper profile adds "umap" (numba compiles for ~40 s on first use)
perplexity = 30.0
tsne_max_iter = 500        # 250 early-exaggeration iterations + the rest
umap_neighbors = 15
umap_min_dist = 0.1
umap_epochs = 200
knn_k = 10                 # neighbour recall: k nearest neighbours under the estimate vs the exact ones
num_threads = None         # OpenMP threads of the work in this process (t-SNE, k-means); null: the default, the cores
                           # or, in `fedlib.runner all --jobs N`, this chapter's share of them (OMP_NUM_THREADS)

# %% tags=["hide-input"]
import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")   # sklearn / numba threads must not spin on a shared machine
import time
import warnings
from functools import partial

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from IPython.display import Markdown
from myst_nb import glue
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from sklearn.cluster import KMeans
from threadpoolctl import threadpool_limits

from fedlib.core.linalg import relative_error
from fedlib.evaluation import claims, report
from fedlib.evaluation.stats import mean_std, paired_difference
from fedlib.fedtsne import algorithm as ft
from fedlib.fedtsne import chapters as ft_chapters
from fedlib.fedtsne import checks as ft_checks
from fedlib.fedtsne import mmd as ft_mmd
from fedlib.fedtsne import nystrom as ft_nystrom
from fedlib.fedtsne import beyond as bd
from fedlib.fedtsne import verdicts as ft_verdicts
from fedlib.runner import specs

specs.check("fedtsne_beyond", globals())
from fedlib.evaluation.style import book_style, captioned, fit_column, human, legend_below
book_style()   # the book's figure theme and table number style
threadpool_limits(num_threads)
threadpool_limits(1, user_api="blas")       # many small products: a second BLAS thread only spins (benchmark chapter)
warnings.filterwarnings("ignore", category=FutureWarning)
T_START = time.perf_counter()
timings = {}

X, y, classes = ft_chapters.load_points(dataset, n_points, seed=0)
n, m = X.shape
COMBOS = bd.parse_combos(metric_combos)
bd.check_beyond_inputs(X, landmark_grid, [e for _, e in COMBOS])
parts_of_seed = partial(ft_chapters.client_split, y, num_clients, "iid")   # parts_of_seed(seed): the benchmark's IID split
scorer = ft_chapters.EmbeddingScorer(X, y)
EMBED = dict(perplexity=perplexity, tsne_max_iter=tsne_max_iter, umap_neighbors=umap_neighbors,
             umap_min_dist=umap_min_dist, umap_epochs=umap_epochs)
print(f"profile={profile}: {human(dataset)}, {n} points in R^{m}, {num_clients} IID clients, seeds {seeds}, "
      f"FedDL / k-means rounds {rounds}, n_y in {landmark_grid}")
if len(seeds) < 5:
    print(f"NOTE: {len(seeds)} seeds (fewer than 5): the intervals below carry no conclusion.")

# %% [markdown]
# ## 1. The upload is a projection and a residual
#
# Take landmarks $y_0,\dots,y_r$, $n_y=r+1\le m+1$ of them, affinely independent (random or trained
# landmarks are, with probability one). Stack their differences $C=[y_1-y_0;\dots;y_r-y_0]$
# ($r\times m$) and factor $C^\top=QR$ ($Q$ is $m\times r$ orthonormal, $R$ is $r\times r$ upper
# triangular and invertible). Every point splits into a part in the landmarks' affine hull and a
# part orthogonal to it:
#
# $$
# x=y_0+Qz+h,\qquad z=Q^\top(x-y_0)\in\mathbb R^r,\qquad h\perp\operatorname{range}Q,\qquad \rho=\lVert h\rVert .
# $$ (ftsb-split)
#
# The landmarks themselves have hull coordinates $\zeta_0=0$ and $\zeta_j=R_{:,j}$ (column $j$ of $R$),
# and $h$ is orthogonal to every $y_j-y_0$, so the client's upload (Algorithm 2, step 3) is
#
# $$
# b_j=\lVert x-y_j\rVert^2=\lVert z-\zeta_j\rVert^2+\rho^2,\qquad j=0,\dots,r .
# $$ (ftsb-upload)
#
# Subtracting the equation for $j=0$ removes $\lVert z\rVert^2+\rho^2$ and leaves a triangular system:
#
# $$
# R^\top z=\tfrac12\bigl(\lVert y_j-y_0\rVert^2-(b_j-b_0)\bigr)_{j=1..r},\qquad \rho^2=b_0-\lVert z\rVert^2 .
# $$ (ftsb-decompose)
#
# {eq}`ftsb-upload` maps $(z,\rho)$ to the upload and {eq}`ftsb-decompose` maps the upload back, so the
# two are the same information: **the server learns exactly each point's projection onto the hull
# ($p=y_0+Qz$, in pixel space, since it knows the landmarks; equivalently its barycentric landmark
# coordinates $\lambda=R^{-1}z$ completed by $\lambda_0=1-\sum_j\lambda_j$) and its distance $\rho$ to
# the hull, and nothing else**: every point $p+\rho u$ with $u$ a unit vector orthogonal to the hull
# uploads the same numbers. With $n_y=m+1$ the hull is the whole space, $\rho=0$, and the upload is
# the point itself (the attack of the derivation chapter).
#
# ### The Nyström estimate in closed form
#
# The Nyström estimate is a closed-form function of the projections, the residuals and the landmarks'
# circumsphere; it errs by a term of that sphere and by the angle between residuals, which the upload
# cannot see.
#
# :::{folded} The derivation, and its checks on the data: closed form against fedlib's Nyström estimate, projection and residual rebuilt from the upload, moved points that upload the same numbers
# :::
#
# The landmarks lie on a sphere inside their hull: its
# centre $\zeta^\ast$ solves $R^\top\zeta^\ast=\tfrac12(\lVert y_j-y_0\rVert^2)_j$, its radius is
# $a=\lVert\zeta^\ast\rVert$. Call $\pi=\lVert z-\zeta^\ast\rVert^2+\rho^2-a^2$ the *power* of $x$
# with respect to that sphere. For a point $p=\sum_j\lambda_jy_j$ of the hull ($\sum_j\lambda_j=1$),
# expanding the squares gives $\lVert p-y_j\rVert^2=(W\lambda)_j-\tfrac12\lambda^\top W\lambda$ with
# $W=D_{YY}$, and $\tfrac12\lambda^\top W\lambda=\sum_k\lambda_k\lVert y_k-p\rVert^2=a^2-\lVert p-c\rVert^2$
# ($c$ the sphere's centre). With {eq}`ftsb-upload` the upload is therefore $b=W\lambda+\pi\mathbf 1$, so
#
# $$
# W^{-1}b=\lambda+\pi\,W^{-1}\mathbf 1,\qquad \mathbf 1^\top W^{-1}\mathbf 1=\frac{1}{2a^2},
# $$ (ftsb-kappa)
#
# the second identity from the centre itself ($b=a^2\mathbf 1$, $\pi=-a^2$, $\lambda=\lambda^\ast$,
# $\mathbf 1^\top\lambda^\ast=1$). Multiplying out $b_i^\top W^{-1}b_j$ and using
# $(\lambda_i-\lambda_j)^\top W(\lambda_i-\lambda_j)=-2\lVert p_i-p_j\rVert^2$:
#
# $$
# \hat D_{ij}=b_i^\top W^{-1}b_j=\lVert z_i-z_j\rVert^2+\rho_i^2+\rho_j^2+\frac{\pi_i\pi_j}{2a^2},
# $$ (ftsb-closed)
#
# while the true squared distance is, with $\theta_{ij}$ the angle between $h_i$ and $h_j$,
#
# $$
# D_{ij}=\lVert z_i-z_j\rVert^2+\rho_i^2+\rho_j^2-2\rho_i\rho_j\cos\theta_{ij} .
# $$ (ftsb-true)
#
# So the Nyström error is $\pi_i\pi_j/(2a^2)+2\rho_i\rho_j\cos\theta_{ij}$: a term the landmarks'
# circumsphere adds, and the angle the upload cannot see. (Even with $n_y=m+1$, where $\rho=0$ and the
# upload determines $x$, the estimate is off by $\pi_i\pi_j/2a^2$: exactness needs $n_y\ge m+2$.)
#
# **Checks** (first seed, both landmark kinds of Sec. 2 at the largest $n_y$ of the grid): the closed
# form {eq}`ftsb-closed` (`fedlib.fedtsne.beyond.nystrom_closed_form`) against fedlib's Nyström
# estimate $BW^{+}B^\top$ (`fedlib.fedtsne.nystrom`) to a relative $10^{-10}$;
# {eq}`ftsb-kappa` against a linear solve; the projection rebuilt from the upload by
# {eq}`ftsb-decompose` against the orthogonal projection of the true points computed from them by an
# SVD (`fedlib.fedtsne.checks.affine_projection`), and $\rho$ against the true distance to the hull; and
# points moved around the hull ({eq}`ftsb-split` with another $h$ of the same length) upload the same
# numbers.

# %%
t0 = time.perf_counter()
seed0, ny_top = seeds[0], max(landmark_grid)
parts0 = parts_of_seed(seed0)
data0 = [X[p] for p in parts0]
order0 = np.concatenate(parts0)
learned0 = bd.learn_landmark_sets(data0, ny_top, rounds, seed0)      # reused by the runs of Sec. 2
sets0 = learned0[0]
check_rows = []
for kind, Y in sets0.items():
    B = np.vstack([ft.client_sq_distances(x, Y)["sq_distances"] for x in data0])      # the uploads, stacked
    dec = bd.decompose_upload(B, Y)                                                    # server side, Eq. ftsb-decompose
    W = ft_mmd.sq_distances(Y)
    ref = ft_nystrom.nystrom(B, W)                                                             # fedlib: B W^+ B^T
    P_true, hull_dim = ft_checks.affine_projection(X[order0], Y)                              # from the points (SVD)
    rho_true = np.linalg.norm(X[order0] - P_true, axis=1)
    moved = bd.points_with_same_upload(X[order0], Y, np.random.default_rng(seed0))
    check_rows.append({
        "landmarks": bd.LANDMARK_NAMES[kind], "n_y": ny_top, "hull dimension": hull_dim,
        "closed form vs B W+ B^T (rel.)": relative_error(bd.nystrom_closed_form(dec), ref),
        "1'W^-1 1 vs 1/(2a^2) (rel.)": abs(np.ones(ny_top) @ np.linalg.solve(W, np.ones(ny_top))
                                           * 2 * dec.geometry.radius2 - 1),
        "projection from upload (rel.)": relative_error(dec.projection, P_true),
        "barycentric -> projection (rel.)": relative_error(dec.barycentric @ Y, P_true),
        "residual from upload (max abs)": float(np.abs(dec.residual - rho_true).max()),
        "moved points: upload change (rel.)": relative_error(ft_mmd.sq_distances(moved, Y), B),
        "moved points: distance moved (rel.)": relative_error(moved, X[order0]),
        "variance revealed": 1 - float((dec.residual ** 2).sum() / ((X - X.mean(0)) ** 2).sum()),
    })
checks = pd.DataFrame(check_rows).set_index("landmarks")
display(captioned(checks.T.style.format(lambda v: f"{v:.2e}" if isinstance(v, float) else str(v), na_rep="—"),
                  "Checks of the closed form and of what the server rebuilds from the upload"))
assert (checks["closed form vs B W+ B^T (rel.)"] < 1e-10).all()
assert (checks["1'W^-1 1 vs 1/(2a^2) (rel.)"] < 1e-8).all()
assert (checks["projection from upload (rel.)"] < 1e-10).all() and (checks["barycentric -> projection (rel.)"] < 1e-8).all()
assert (checks["residual from upload (max abs)"] < 1e-6).all()
assert (checks["moved points: upload change (rel.)"] < 1e-12).all() and (checks["moved points: distance moved (rel.)"] > 0.01).all()
timings["1. checks"] = time.perf_counter() - t0

# %% [markdown]
# ### What the upload reveals
#
# The table says what the server learns from Algorithm 2's upload: for every point, its projection
# onto the hull, exactly (relative error at round-off), and its residual distance, exactly; and the
# moved points show it learns no more. "Variance revealed" is the share of the data's variance
# (around its mean) that lies in the projections, $1-\sum_i\rho_i^2/\sum_i\lVert x_i-\bar x\rVert^2$:
# it is what the server sees of the images themselves.

# %%
revealed = checks["variance revealed"]
claims.register(
    "fedtsne-no-data-to-server", "fedtsne",
    "Fed-tSNE / Fed-UMAP visualize the distributed data without sending the data to the central server "
    "(the clients upload only distances to the landmarks).",
    holds=bool(revealed.max() < 0.5),
    evidence=(f"with n_y = {ny_top} <= m + 1 = {m + 1} landmarks the upload of each point is equivalent to its "
              f"projection onto the landmarks' affine hull plus its distance to the hull (this chapter, Sec. 1; "
              f"rebuilt to relative {checks['projection from upload (rel.)'].max():.0e}); the projections "
              f"hold {', '.join(f'{v:.0%} ({k})' for k, v in revealed.items())} of the data's variance on {human(dataset)}, "
              f"{rounds} rounds (holds = below 50 %)"),
    key=f"upload reveals {revealed.max():.0%} of the data's variance (n_y = {ny_top})")

# %% [markdown]
# ## 2. Better estimates from the same upload, and better landmarks
#
# ### Estimators
#
# The server knows $z_i$ and $\rho_i$ but not the angle $\theta_{ij}$ in {eq}`ftsb-true`, so the uploads
# allow exactly the interval
#
# $$
# \lVert z_i-z_j\rVert^2+(\rho_i-\rho_j)^2\;\le\;D_{ij}\;\le\;\lVert z_i-z_j\rVert^2+(\rho_i+\rho_j)^2 .
# $$ (ftsb-interval)
#
# Choices of $\cos\theta_{ij}$ give the estimators compared below
# (`fedlib.fedtsne.beyond.ESTIMATORS`):
#
# * **projection + residual gap**, $\cos\theta=1$: the lower end of {eq}`ftsb-interval`; right when
#   neighbours leave the hull in the same direction;
# * **projection + residuals**, $\cos\theta=0$: the interval's midpoint, the estimate with the
#   smallest worst-case error; right on average for independent, isotropic residuals;
# * **projection only**: $\lVert z_i-z_j\rVert^2$, the distance between projections (the gap estimator
#   when all residuals are equal);
# * **Nyström** {eq}`ftsb-closed`: the midpoint plus $\pi_i\pi_j/2a^2$, a term that depends on the
#   landmarks' circumsphere, not on the data, and may leave the interval (the share of pairs where it
#   does is measured).
#
# Each is an $n\times n$ matrix of rank at most $r+2$, $S=FG^\top+r\mathbf 1^\top+\mathbf 1c^\top$, so
# the server ranks neighbours blockwise without forming it (`fedlib.fedtsne.knn.blockwise_knn`).
# **Neighbour recall** = the share of each point's 10 nearest neighbours under the estimate that are
# among its 10 exact nearest neighbours (averaged over points).
#
# ### Federated k-means landmarks
#
# All four estimators depend on the landmarks only through their hull, and they lose what the hull
# misses, $\sum_i\rho_i^2$. Since the nearest landmark lies in the hull,
#
# $$
# \sum_i\rho_i^2\;\le\;\sum_i\min_k\lVert x_i-c_k\rVert^2,
# $$ (ftsb-kmeans-bound)
#
# the k-means objective bounds the residual energy from above: k-means centres $c_k$ are landmarks
# chosen to make the hull fit the data, which FedDL's MMD objective does not aim at.
#
# :::{folded} Lloyd's step from per-client sums and counts is centralized Lloyd exactly (checked against scikit-learn), and what the server sees without secure aggregation
# :::
#
# Lloyd's algorithm is federated as is: with the centres broadcast, client $p$ assigns its points to the
# nearest centre and uploads per-cell sums $S_{pk}$ and counts $N_{pk}$, and
#
# $$
# c_k\leftarrow\frac{\sum_pS_{pk}}{\sum_pN_{pk}}
# $$ (ftsb-lloyd)
#
# is centralized Lloyd exactly (`KMeansClient`, `KMeansServer` on `fedlib.core.protocol`; an empty
# cell keeps its centre). The server needs only the totals, so additive secure aggregation of the
# uploads suffices; **without it the server sees each client's cell means, and a cell holding a
# single point of a client is that point** (counted below as "singleton cells"). Both methods start
# from the same landmarks (FedDL's $Y^0$ from the pooled moments, one set-up round), and k-means gets
# at most FedDL's number of rounds: the same upload per round, $n_y\times m$ numbers per client.
#
# Check of {eq}`ftsb-lloyd`: 10 federated rounds from 50 data points against scikit-learn's Lloyd
# (`KMeans(init=..., n_init=1, algorithm="lloyd", tol=0)`) on the pooled data.

# %%
t0 = time.perf_counter()
init_check = X[np.random.default_rng(seed0).choice(n, 50, replace=False)]
fed_km = bd.federated_kmeans(data0, init_check, 10)
sk_km = KMeans(50, init=init_check, n_init=1, max_iter=fed_km.rounds, tol=0.0, algorithm="lloyd").fit(X)
km_gap = relative_error(fed_km.centers, sk_km.cluster_centers_)
print(f"federated Lloyd ({fed_km.rounds} rounds, {num_clients} clients) vs scikit-learn's Lloyd: relative difference "
      f"{km_gap:.1e}; empty cells {fed_km.empty[-1]}; upload per round {fed_km.cost.bytes_up / fed_km.rounds / 2**20:.2f} MiB "
      f"(measured), = {num_clients} x 50 x ({m} + 1) float64")
assert km_gap < 1e-10
assert fed_km.cost.bytes_up == fed_km.rounds * num_clients * 50 * (m + 1) * 8

# %% [markdown]
# ### The runs
#
# For every seed and $n_y$: FedDL (noise-free, `rounds` rounds, the benchmark's settings otherwise)
# and federated k-means from FedDL's $Y^0$; the uploads, decomposed; the neighbour recall of every
# estimator; and, where `metric_grid` and `metric_combos` say, t-SNE on the estimate's nearest
# neighbours (openTSNE on the perplexity affinities of the $3\times$perplexity nearest neighbours,
# the server path of the benchmark's large runs) scored with the paper's metrics (CA, NPA, NMI, SC;
# `fedlib.fedtsne.chapters.EmbeddingScorer`).

# %%
t0 = time.perf_counter()
recall, metrics, costs, kept = bd.landmark_study(
    X, y, parts_of_seed, landmark_grid, seeds, rounds, scorer, metric_grid=metric_grid, metric_combos=COMBOS,
    methods=methods, knn_k=knn_k, embed_kwargs=EMBED, known={(seed0, ny_top): learned0})
timings["2. landmarks, estimators, embeddings"] = time.perf_counter() - t0
RECALL = f"{knn_k}-NN recall"
COST_COLUMNS = ["rounds", "upload MiB", "plateau share", "empty cells", "singleton cells", "residual share",
                "Nyström outside feasible"]
display(captioned(costs.groupby(["landmarks", "n_y"], sort=False)[COST_COLUMNS]
        .agg(lambda v: mean_std(v.dropna(), 3) if v.notna().any() else "-"),
                  "Cost and geometry of the two landmark choices"))

# %% [markdown]
# "plateau share" is FedDL's share of its objective's decrease made in the last 10 % of its rounds
# (the benchmark's rule stops at 0.01: above that FedDL was still moving); "residual share" is
# $\sum_i\rho_i^2/\sum_i\lVert x_i-\bar x\rVert^2$, what the hull misses; "Nyström outside
# feasible" the share of pairs where {eq}`ftsb-closed` leaves the interval {eq}`ftsb-interval`.

# %% mystnb={"figure": {"caption": "Neighbour recall of the server's distance estimate (the share of each point's true nearest neighbours it recovers) against the number of landmarks (log scale), one line per estimator, mean over seeds with sample-standard-deviation bands; one panel per kind of landmarks (FedDL and federated k-means). Compare the estimators on the same upload, and the two kinds of landmarks."}, "image": {"alt": "Two line charts, one per landmark kind: neighbour recall against number of landmarks for several estimators"}}
fig, axes = plt.subplots(1, 2, figsize=fit_column(10, 5.0), sharey=True, layout="constrained")
for ax, (kind_name, g) in zip(axes, recall.groupby("landmarks", sort=False)):
    # a dash pattern, a marker and a width per estimator (the first the widest): lines that coincide stay visible
    widths = dict(zip(recall.estimator.unique(), np.linspace(3.2, 1.2, recall.estimator.nunique())))
    sns.lineplot(data=g, x="n_y", y=RECALL, hue="estimator", style="estimator", size="estimator", sizes=widths,
                 markers=True, dashes=True, ax=ax, errorbar="sd", legend=ax is axes[0])
    ax.set(xscale="log", xlabel="number of landmarks $n_y$ (log scale)", ylabel=f"{RECALL} (fraction)",
           title=f"{kind_name} landmarks")
    ax.set_xticks(landmark_grid, [str(v) for v in landmark_grid])
    ax.minorticks_off()
legend_below(fig, axes[0], title="estimator")
fig.suptitle(f"Neighbour recall, {human(dataset)}, {n} points, {len(seeds)} seeds")
plt.show()
display(captioned(recall.pivot_table(index=["landmarks", "estimator"], columns="n_y", values=RECALL,
                           aggfunc=lambda v: mean_std(v, 3)),
                  f"{RECALL} of the server's estimate by landmarks and estimator, mean ± sample std over seeds"))

# %% [markdown]
# Paired differences of the recall over the seeds (95 % t-intervals; every run of one seed shares the
# client split and FedDL's $Y^0$): the best estimator on FedDL's landmarks against the paper's
# Nyström estimate, and federated k-means against FedDL, both with the Nyström estimate and with the
# best estimator of each ("best" = the highest mean recall over all seeds and $n_y$ of these runs: a
# choice made on the same runs, so read its interval as descriptive).

# %%
wide = recall.pivot_table(index=["n_y", "seed"], columns=["landmarks", "estimator"], values=RECALL)
NYS, PROJ = bd.ESTIMATOR_NAMES["nystrom"], bd.ESTIMATOR_NAMES["projection"]
FED, KM = bd.LANDMARK_NAMES["feddl"], bd.LANDMARK_NAMES["kmeans"]
best = {kind: recall[recall.landmarks == kind].groupby("estimator")[RECALL].mean().idxmax() for kind in (FED, KM)}
pairs = {f"FedDL: {best[FED]} - Nyström": ((FED, best[FED]), (FED, NYS)),
         "Nyström: k-means - FedDL": ((KM, NYS), (FED, NYS)),
         f"k-means {best[KM]} - FedDL {best[FED]}": ((KM, best[KM]), (FED, best[FED]))}
recall_diff = {(label, ny): paired_difference(wide.loc[ny][a].values, wide.loc[ny][b].values)
               for label, (a, b) in pairs.items() for ny in landmark_grid}
display(captioned(pd.Series({k: d.format(3) for k, d in recall_diff.items()}, name=f"{RECALL}: mean [95% CI]")
        .rename_axis(["comparison", "n_y"]).unstack("n_y"),
                  "Paired differences of the neighbour recall (95 % CI)"))

# %% [markdown]
# ### The paper's metrics against $n_y$
#
# t-SNE on the server's estimate for the landmark/estimator pairs of `metric_combos`, mean ± sample
# std over the seeds; the centralized t-SNE (same openTSNE call on the exact neighbours) is the grey
# band (mean ± std).

# %% mystnb={"figure": {"caption": "The paper's four metrics (CA 10-NN, NPA 10-NN, NMI, SC) of the embedding computed from the server's estimate against the number of landmarks (log scale), one line per pair of landmarks and estimator, mean over seeds with sample-standard-deviation bands; the grey band is the centralized embedding (mean and standard deviation). One figure per embedding method; compare each line with the grey band."}, "image": {"alt": "Four line charts against number of landmarks, one per metric, for landmark and estimator pairs, with a grey band for the centralized embedding"}}
t0 = time.perf_counter()
central, central_Z = bd.central_runs(X, scorer, seeds, methods, embed_kwargs=EMBED)
timings["central t-SNE / UMAP"] = time.perf_counter() - t0
SHOW = ["CA 10-NN", "NPA 10-NN", "NMI", "SC"]
if len(metrics):
    metrics["pair"] = metrics.landmarks + ", " + metrics.estimator
    for method_name, g in metrics.groupby("method", sort=False):
        nrows = -(-len(SHOW) // 2)
        fig, axes = plt.subplots(nrows, 2, figsize=fit_column(7.2, 3.0 * nrows + 1.2), sharex=True, squeeze=False,
                                 layout="constrained")
        cen = central[central.method == method_name]
        for i, (ax, metric) in enumerate(zip(axes.flat, SHOW)):
            sns.lineplot(data=g, x="n_y", y=metric, hue="pair", style="pair", markers=True, dashes=True, ax=ax,
                         errorbar="sd", legend=i == 0)
            mu, sd = cen[metric].mean(), cen[metric].std(ddof=1)
            ax.axhspan(mu - sd, mu + sd, color="grey", alpha=0.3)
            ax.axhline(mu, color="grey", lw=1)
            ax.set(xscale="log", ylabel=f"{metric} (fraction)",
                   xlabel="number of landmarks $n_y$ (log scale)" if i >= len(SHOW) - 2 else "")
            ax.set_xticks(metric_grid, [str(v) for v in metric_grid])
            ax.minorticks_off()
        for ax in axes.flat[len(SHOW):]:
            ax.axis("off")
        band = (Patch(facecolor="grey", alpha=0.3), Line2D([], [], color="grey", lw=1))   # the grey band and its mean
        legend_below(fig, axes.flat[0], extra=[(band, "centralized (mean ± std)")], title="landmarks, estimator")
        fig.suptitle(f"{method_name} on the server's estimate, {human(dataset)}, {len(seeds)} seeds")
        plt.show()
    display(captioned(metrics.pivot_table(index=["method", "n_y", "pair"], values=SHOW, aggfunc=lambda v: mean_std(v, 3)),
                      "Embedding quality by estimator and landmarks, mean ± sample std over seeds"))
    display(captioned(central.groupby("method")[SHOW].agg(lambda v: mean_std(v, 3)).rename_axis("centralized"),
                      "Centralized embeddings on the same points, mean ± sample std over seeds"))

# %% [markdown]
# Paired differences of the metrics (95 % t-intervals over the seeds) against Fed-tSNE as the paper
# runs it (FedDL landmarks, Nyström estimate):

# %%
metric_diff = {}
if len(metrics):
    mw = metrics.pivot_table(index=["method", "n_y", "seed"], columns="pair", values=SHOW)
    base = f"{FED}, {NYS}"
    for method_name in mw.index.get_level_values("method").unique():
        for ny in metric_grid:
            for pair in metrics.pair.unique():
                if pair == base:
                    continue
                for metric in SHOW:
                    a = mw.loc[(method_name, ny)][(metric, pair)].values
                    b = mw.loc[(method_name, ny)][(metric, base)].values
                    metric_diff[method_name, ny, pair, metric] = paired_difference(a, b)
    display(captioned(pd.Series({k: d.format(3) for k, d in metric_diff.items()}, name="mean [95% CI]")
            .rename_axis(["method", "n_y", f"pair (minus {base})", "metric"]).unstack("metric"),
                      "Paired differences of the embedding metrics (95 % CI)"))

# %% [markdown]
# The paper's Fig. 6 reads that NMI grows with $n_y$ "regardless of the method or conditions". Over
# our grid and pairs (paired over seeds, largest against smallest $n_y$ of `metric_grid`):

# %%
if len(metrics) and len(metric_grid) >= 2:
    lo_ny, hi_ny = min(metric_grid), max(metric_grid)
    nmi_gain = {(meth, pair): paired_difference(mw.loc[(meth, hi_ny)][("NMI", pair)].values,
                                                mw.loc[(meth, lo_ny)][("NMI", pair)].values)
                for meth in mw.index.get_level_values("method").unique() for pair in metrics.pair.unique()}
    for key, d in nmi_gain.items():
        print(f"{key[0]}, {key[1]}: NMI(n_y={hi_ny}) - NMI(n_y={lo_ny}) = {d.format(4)}")
    # the comparison's convergence: FedDL's plateau rule (the benchmark's, share <= 0.01) on every FedDL run of
    # the compared n_y, federated k-means stopped (centres unchanged) within its round budget
    at_grid = costs[costs.n_y.isin([lo_ny, hi_ny])]
    fed_share = at_grid[at_grid.landmarks == FED]["plateau share"]
    km_rounds = at_grid[at_grid.landmarks == KM]["rounds"]
    # the paper's Fig. 6 uses FedDL's landmarks: those decide; federated k-means (ours) is reported beside them
    judged = {k: d for k, d in nmi_gain.items() if k[1].startswith(FED)}
    fig6_converged = bool((fed_share <= 0.01).all())
    grows, falls = bool(judged) and all(d.low > 0 for d in judged.values()), any(d.high < 0 for d in judged.values())
    fig6_open = (not grows and not falls) or not fig6_converged
    ran_emb = list(metrics.method.unique())
    missing_emb = [e for e in ("t-SNE", "UMAP") if e not in ran_emb]
    claims.register(
        "fedtsne-fig6-landmarks-nmi", "fedtsne",
        "The larger n_y, the better the NMI, regardless of the method or conditions (Fig. 6).",
        holds=bool(grows) if not falls else False,
        inconclusive=bool(fig6_open),
        condition=(f"the embedding is {', '.join(ran_emb)} ({', '.join(missing_emb)} did not run in this profile)"
                   if grows and missing_emb and not fig6_open else None),
        rules_out=(("the comparison did not converge at its budget; " if not fig6_converged else "")
                   + ft_verdicts.bounds_text({f"{a}, {b}": d for (a, b), d in judged.items()})
                   + " (the paper prints no numbers for Fig. 6, so no effect size to aim at)") if fig6_open else None,
        evidence=(f"{human(dataset)}, {n} points, {len(seeds)} seeds, FedDL {rounds} rounds: paired NMI change from "
                  f"n_y = {lo_ny} to {hi_ny} with FedDL's landmarks (the paper's): "
                  f"{report.listing({f'{a}, {b}': d for (a, b), d in judged.items()})} (rule: holds when every interval "
                  "lies above 0, fails when one lies wholly below 0); with federated k-means landmarks (ours, not judged): "
                  + report.listing({f'{a}, {b}': d for (a, b), d in nmi_gain.items() if (a, b) not in judged})),
        methods=["t-SNE", "UMAP"], ran=ran_emb,
        budget=f"FedDL and federated k-means {rounds} rounds, n_y = {lo_ny} and {hi_ny}, {len(seeds)} seeds, {human(dataset)}",
        convergence=(f"FedDL's plateau share (share of its objective's decrease in the last 10 % of the rounds) up to "
                     f"{fed_share.max():.3f} (the benchmark's rule: at most 0.01); federated k-means (reported only) "
                     f"stopped with unchanged centres in {int((km_rounds < rounds).sum())} of {len(km_rounds)} runs"),
        converged=fig6_converged,
        key=(f"FedDL landmarks, NMI(n_y={hi_ny}) − NMI(n_y={lo_ny}): lowest CI bound "
             f"{min(d.low for d in judged.values()):+.3f}" if judged else "no FedDL run"))

# %% [markdown]
# ## 3. Keeping the points off the server: local placement
#
# The server embeds only the $n_y$ landmarks (openTSNE, PCA initialization; UMAP in the `paper`
# profile) and broadcasts them with their 2-D positions: $n_y(m+2)$ numbers per client. Each client
# rebuilds the landmarks' affinities, places its own points with `TSNEEmbedding.transform` (each new
# point starts at the median of its nearest landmarks' positions and moves under the t-SNE gradient
# with the landmarks fixed; `UMAP.transform` does the same with UMAP's objective), and uploads at most
# its $n_p\times2$ positions, against Fed-tSNE's $n_p\times n_y$ distances. The server then learns
# nothing about a point but where it sits in the map (and nothing at all if the clients keep their
# positions). The price: a point is placed relative to the landmarks only, never to the other points.
#
# Compared on the same points and seeds with Fed-tSNE at $n_y=$ `placement_landmarks` (the runs of
# Sec. 2, both landmark kinds with the Nyström estimate where `metric_combos` has them) and with
# centralized t-SNE.

# %%
t0 = time.perf_counter()
placement, placed = (bd.placement_study(X, parts_of_seed, kept, placement_landmarks, seeds, placement_kinds, methods,
                                        scorer, embed_kwargs=EMBED) if placement_kinds else (pd.DataFrame(), {}))
timings["3. local placement"] = time.perf_counter() - t0
if len(placement):
    rows = [placement.assign(route="local placement")]
    if len(metrics):
        rows.append(metrics[(metrics.n_y == placement_landmarks) & (metrics.estimator == NYS)]
                    .assign(route="Fed-tSNE / Fed-UMAP (Nyström)"))
    rows.append(central.assign(route="centralized", landmarks="-"))
    compare = pd.concat(rows, ignore_index=True)
    display(captioned(compare.pivot_table(index=["method", "route", "landmarks"], values=SHOW + ["NPA 1-NN"],
                                aggfunc=lambda v: mean_std(v, 3), sort=False),
                      "Local placement against the federated routes, mean ± sample std over seeds"))
    print("measured bytes per client of the placement round: broadcast "
          f"{placement['broadcast MiB'].mean() / num_clients:.3f} MiB, upload "
          f"{placement['upload MiB'].mean() / num_clients * 1024:.1f} KiB (Fed-tSNE's distance upload: "
          f"{n / num_clients * placement_landmarks * 8 / 1024:.1f} KiB)")

# %% [markdown]
# :::{folded} Paired differences of local placement against Fed-tSNE and centralized t-SNE, and the first seed's embeddings side by side
# :::
#
# Paired differences (95 % t-intervals over the seeds): placement minus Fed-tSNE / Fed-UMAP on the same
# landmarks, minus Fed-tSNE / Fed-UMAP as the paper runs them (FedDL landmarks, Nyström), and minus
# centralized.

# %%
place_diff = {}
if len(placement):
    for (method_name, kind_name), g in placement.groupby(["method", "landmarks"], sort=False):
        g = g.set_index("seed").loc[seeds]
        at = metrics[(metrics.method == method_name) & (metrics.n_y == placement_landmarks)
                     & (metrics.estimator == NYS)] if len(metrics) else metrics
        fed_same = at[at.landmarks == kind_name].set_index("seed")              # Fed on the same landmarks
        fed_paper = at[at.landmarks == FED].set_index("seed")                   # Fed-tSNE as the paper runs it
        cen = central[central.method == method_name].set_index("seed").loc[seeds]
        for metric in SHOW:
            if len(fed_same):
                place_diff[method_name, kind_name, "placement - Fed, same landmarks", metric] = paired_difference(
                    g[metric].values, fed_same.loc[seeds][metric].values)
            if len(fed_paper) and kind_name != FED:
                place_diff[method_name, kind_name, "placement - Fed-tSNE (FedDL, Nyström)", metric] = paired_difference(
                    g[metric].values, fed_paper.loc[seeds][metric].values)
            place_diff[method_name, kind_name, "placement - centralized", metric] = paired_difference(
                g[metric].values, cen[metric].values)
    display(captioned(pd.Series({k: d.format(3) for k, d in place_diff.items()}, name="mean [95% CI]")
            .rename_axis(["method", "landmarks", "comparison", "metric"]).unstack("metric"),
                      "Paired differences of local placement against the other routes (95 % CI)"))

# %% mystnb={"figure": {"caption": "Embeddings of all points for the first seed, coloured by class: centralized, Fed-tSNE with the Nyström estimate on each kind of landmarks, and local placement, where each client places its own points relative to the server's embedded landmarks (black crosses); axes in arbitrary units. Compare the class structure of local placement with the centralized and the federated embeddings."}, "image": {"alt": "Grid of scatter plots of 2-D embeddings coloured by class, with landmarks marked as crosses in the local-placement panels"}}
if len(placement):
    method = methods[0]
    panels = [("centralized", central_Z[seed0, method], None)]
    for kind in placement_kinds:
        key = ("embedding", seed0, placement_landmarks, kind, "nystrom", method)
        if key in kept:
            panels.append((f"Fed, Nyström\n({bd.LANDMARK_NAMES[kind]})", kept[key], None))
        Zp, ZY = placed[seed0, kind, method]
        panels.append((f"local placement\n({bd.LANDMARK_NAMES[kind]})", Zp, ZY))
    # a grid of panels, two or three columns, with the legend in the slot after the last panel
    ncols = 2 if len(panels) <= 3 else 3
    nrows = -(-(len(panels) + 1) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=fit_column(3.4 * ncols, 3.3 * nrows), squeeze=False,
                             layout="constrained")
    names = np.asarray(classes, dtype=object)[y]
    for i, (ax, (title, Z, ZY)) in enumerate(zip(axes.flat, panels)):
        sns.scatterplot(x=Z[:, 0], y=Z[:, 1], hue=names, hue_order=list(classes), palette="tab10", s=5, linewidth=0,
                        ax=ax, legend=i == 0, rasterized=True)
        if ZY is not None:
            ax.scatter(ZY[:, 0], ZY[:, 1], marker="x", c="black", s=12, lw=0.8)
        ax.set_title(title)
        ax.set(xlabel=f"{bd.METHOD_NAMES[method]} 1", ylabel=f"{bd.METHOD_NAMES[method]} 2")
        ax.tick_params(labelbottom=False, labelleft=False)   # arbitrary units
    handles, labels = axes.flat[0].get_legend_handles_labels()
    axes.flat[0].get_legend().remove()
    handles.append(Line2D([], [], marker="x", color="black", ls="", markersize=2, mew=0.8))
    labels.append("landmarks")
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    axes.flat[len(panels)].legend(handles, labels, loc="center", ncol=2, markerscale=3, title="class")
    fig.suptitle(f"{human(dataset)}, seed {seed0}, $n_y$ = {placement_landmarks}")
    plt.show()

# %% [markdown]
# ## 4. Results in one line each
#
# Generated from the runs above (means over the seeds with paired 95 % intervals).

# %%
lines = []
cf_err = checks["closed form vs B W+ B^T (rel.)"].max()
lines.append(f"1. **The upload is (projection, residual).** With n_y <= m + 1 the Nyström estimate equals the closed "
             f"form of Sec. 1 to a relative {cf_err:.0e}, and the server rebuilds every point's projection onto "
             f"the landmarks' hull and its distance to it exactly from the upload (and learns nothing else): here "
             f"{', '.join(f'{v:.0%} of the variance ({k})' for k, v in revealed.items())} at n_y = {ny_top}.")
for ny in landmark_grid:
    lab = f"FedDL: {best[FED]} - Nyström"
    km_lab = "Nyström: k-means - FedDL"
    mean = recall.groupby(["n_y", "landmarks", "estimator"])[RECALL].mean()
    lines.append(f"2. **n_y = {ny}, {RECALL}** (Nyström on FedDL's landmarks {mean[ny, FED, NYS]:.3f}): "
                 f"{best[FED]} on the same upload {recall_diff[lab, ny].format(3)}; federated k-means landmarks "
                 f"(same rounds and bytes) {recall_diff[km_lab, ny].format(3)}.")
SUM = bd.ESTIMATOR_NAMES["residual_sum"]
pi_term = {(kind, ny): paired_difference(wide.loc[ny][(kind, NYS)].values, wide.loc[ny][(kind, SUM)].values)
           for kind in (FED, KM) for ny in landmark_grid}
lines.append("2. **The circumsphere term** pi_i pi_j / 2a^2 (Nyström minus projection + residuals, "
             f"{RECALL}): {report.listing({f'{k}, n_y = {ny}': d for (k, ny), d in pi_term.items()}, 3)}.")
km_cells = costs[costs.landmarks == KM].groupby("n_y")[["rounds", "empty cells", "singleton cells"]].mean()
km_text = "; ".join(f"n_y = {ny}: {row.iloc[0]:.1f} rounds, {row.iloc[1]:.0f} empty cells, {row.iloc[2]:.0f} (client, cell) "
                    "pairs holding a single point" for ny, row in km_cells.iterrows())
lines.append(f"2. **Federated k-means** (budget {rounds} rounds; it stops once its centres no longer move), means over "
             f"seeds: {km_text} (of {n} points); without secure aggregation those single-point uploads are raw points.")
for (meth, ny, pair, metric), d in metric_diff.items():
    if metric == "NMI":
        lines.append(f"2. **{meth}, n_y = {ny}, NMI**: {pair} minus Fed-tSNE as in the paper {d.format(3)}.")
for (meth, kind, comp, metric), d in place_diff.items():
    if metric in ("NMI", "NPA 10-NN"):
        lines.append(f"3. **{meth}, local placement on {kind} landmarks ({comp}), {metric}**: {d.format(3)}.")
glue("beyond_findings", Markdown("\n".join(f"* Section {line}" for line in lines)), display=False)
timings["total"] = time.perf_counter() - T_START
display(captioned(pd.Series(timings, name="seconds").to_frame().style.format("{:.0f}", na_rep="—"),
                  "Where this chapter's time went (seconds)"))

# %% [markdown]
# ```{glue:md} beyond_findings
# :format: myst
# ```

# %% [markdown]
# ## Exercises
#
# :::{folded} The exercises, with their solutions and the self-checks of this run
# :::
#
# ```{exercise} Landmarks on the data
# :label: fedtsne-beyond-ex-oracle
#
# Draw the landmarks uniformly from the pooled data (an "oracle", not federated) and decompose the upload.
# Why is the residual share then close to that of k-means, and what does the server learn about the
# points that became landmarks?
# ```
#
# ````{solution} fedtsne-beyond-ex-oracle
# :class: dropdown
#
# Random data points span the data's principal directions about as well as k-means centres do, so
# the hull misses a similar share. A landmark that is a client's point has $\rho=0$ and $z$ equal to
# its own coordinates: the server holds that point exactly (it chose it), which is why the paper
# calls sampling points from the clients prohibitive.
# ````
#
# ```{exercise} The best hull
# :label: fedtsne-beyond-ex-hull
#
# Among all affine subspaces of dimension $r$, which one minimizes $\sum_i\rho_i^2$? Can it be
# learned federatedly from per-client sums, and which of the four estimators depend on the landmarks
# only through their hull?
# ```
#
# ````{solution} fedtsne-beyond-ex-hull
# :class: dropdown
#
# The PCA subspace through the mean (top $r$ principal directions), by the Eckart-Young theorem; it
# needs only $\sum_p\sum_{x\in X_p}x$ and $\sum_p\sum_{x\in X_p}xx^\top$, i.e. per-client sums again.
# Any $r+1$ affinely independent points of that subspace are landmarks with that hull. The three
# projection estimators depend on the landmarks only through the hull ($z$ up to a rotation, and
# $\rho$); the Nyström estimate {eq}`ftsb-closed` also depends on where the points sit in it
# (through $a$ and $\pi$).
# ````
