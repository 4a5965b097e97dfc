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
# # STSA / STSA-E: deriving spatial-temporal aggregation and the Gram estimate, and checking them
#
# ```{include} /book/generated/findings/stsa_derivation.md
# ```
#
# *STSA* {cite:p}`guan2025stsa` ("Enhancing Federated Class-Incremental Learning via Spatial-Temporal
# Statistics Aggregation"; two versions with identical numbers) freezes a backbone $F$ after the
# first task, expands its features by a random ReLU layer $R$ ({term}`random features`, as RanPAC
# {cite:p}`mcdonnell2024ranpac`), and from then on learns only a ridge
# head from **statistics**: each client uploads its {term}`Gram matrix` and {term}`class sums` once per task
# (federated class-incremental learning was introduced by {cite:t}`dong2022glfc`). The
# paper claims the result is *exactly* joint ridge on all data seen (so heterogeneity and client
# count cannot matter once $F$ is fixed), and that the communication-efficient STSA-E, which
# uploads only class sums and counts, estimates the Gram matrix without bias (Prop. 3.1) when the
# data are non-i.i.d. by **label skew only** (every client draws a class's features from the same
# distribution; the paper's App. B).
#
# This chapter derives both claims and checks them in float64 with asserted tolerances. It also
# shows where the printed estimator is biased (clients that lack a class, which label skew and
# "dummy clients" make common), a corrected form that is not, what happens under **feature skew**
# (client-specific shifts of the features, outside the paper's assumption), the estimator's true
# error law (the paper's Lemma 3.5 is false), the per-sample error of the STSA-E head against $n$
# and against $K\cdot K_D$, and the communication table. All code is in `fedlib.stsa.algorithm`,
# `fedlib.federated.incremental` and `fedlib.core.linalg`; each headline claim is registered in the claims ledger
# by the cell that checks it.

# %% tags=["parameters"]
profile = "quick"          # set by the runner; recorded for the reader
n_samples = 6000           # synthetic samples for the exactness checks
dim = 64                   # backbone feature dimension d
M = 512                    # random features
num_classes = 10
num_tasks = 5
client_counts = [1, 2, 5, 50]
betas = [0.01, 0.1, 0.5, 1.0, 100.0]   # Dirichlet label skew; None is added for IID
gamma = 1.0
mc_reps = 4000             # Monte Carlo repetitions for Prop. 3.1
mse_reps = 2000            # Monte Carlo repetitions for the error law (C5)
mse_clients = [2, 3, 5, 10, 30, 60, 120]
mse_n = 120
bias_dummy = [1, 5, 25]    # K_D for the bias study
rate_ns = [500, 2000, 8000, 32000]  # per-stage sizes for the plug-in rate (Thm. 3.3)
rate_clients = [2, 5, 10, 25, 50, 100]  # K * K_D for the per-sample error at fixed n (rate_n_fixed)
rate_n_fixed = 4000
rate_reps = 40
skew_scales = [0.0, 0.05, 0.1, 0.2, 0.5]   # feature skew: client shift in units of the feature std
skew_reps = 200            # Monte Carlo repetitions for the covariance ratio under feature skew
skew_seeds = [0, 1, 2, 3, 4]   # seeds of the accuracy comparison under feature skew
skew_accuracy_scale = 0.2  # the shift scale of that comparison
skew_dummy = 10            # K_D of STSA-E in that comparison
comm_M = [512, 768, 1250, 2500, 5000, 10000]
seed = 0

# %% tags=["hide-input"]
import matplotlib as mpl
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from myst_nb import glue
from IPython.display import Markdown, display

from fedlib.evaluation import claims

from fedlib.stsa import tables as paper_results

from fedlib.stsa import algorithm as stsa
from fedlib.stsa import studies as stsa_studies
from fedlib.core.linalg import synthetic_features
from fedlib.evaluation.report import paired_table
from fedlib.data.streams import make_stream
from fedlib.federated.incremental import run_class_incremental
from fedlib.data.partition import make_partition
from fedlib.runner import specs

specs.check("stsa_derivation", globals())
from fedlib.evaluation.style import book_style, captioned, fit_column, method_hue
book_style()   # the book's figure theme and table number style
rng = np.random.default_rng(seed)
x_all, y_all = synthetic_features(n_samples + n_samples // 5, dim, num_classes, kind="mean_dominated", seed=seed)
x_all, y_all, x_test, y_test = x_all[:n_samples], y_all[:n_samples], x_all[n_samples:], y_all[n_samples:]
rf = stsa.RandomFeatures(dim, M, seed=seed)
phi = rf(x_all)
print(f"profile={profile}: N={n_samples}, d={dim}, M={M}, C={num_classes}, T={num_tasks}")

# %% [markdown]
# ## 1. Features, statistics and the ridge head
#
# $\Phi(x)=\mathrm{ReLU}(F(x)^\top W_{\text{rand}})\in\mathbb R^{1\times M}$ with $W_{\text{rand}}$
# i.i.d. $\mathcal N(0,1)$ regenerated on every client from a shared seed (eq. 1; the authors'
# code: no bias, no scaling). Client $k$ at stage $t$ stacks its rows into $X_{t,k}$ and one-hot
# labels $Y_{t,k}$ (over the $c_t$ classes of the stage) and computes
#
# $$G_{t,k}=X_{t,k}^\top X_{t,k}\in\mathbb R^{M\times M},\qquad C_{t,k}=X_{t,k}^\top Y_{t,k}\in\mathbb R^{M\times c_t}.$$ (stsa-eq-stats)
#
# The head minimises $\lVert X W-Y\rVert_F^2+\gamma\lVert W\rVert_F^2$ (eq. 6), whose gradient
# $2(X^\top XW-X^\top Y+\gamma W)$ vanishes at (the paper's eq. 7)
#
# $$W^*=(X^\top X+\gamma I)^{-1}X^\top Y=(G+\gamma I)^{-1}C :$$ (stsa-eq-ridge)
#
# the data enter only through $G=X^\top X$ and $C=X^\top Y$ of {eq}`stsa-eq-stats`, which are sums over samples
# ($\gamma$ is the {term}`ridge parameter`).
#
# :::{folded} Eq. 7 checked in float64 against its gradient and scikit-learn's Ridge, and the tolerance 100 ε κ that every "same head" check below uses
# :::
#
# The next cell (`stsa_studies.closed_form_checks`) checks
# {eq}`stsa-eq-ridge` against its gradient and against scikit-learn's `Ridge`.
#
# A solve in float64 is accurate to about $\varepsilon\,\kappa$ in relative terms, where
# $\kappa=\lambda_{\max}/(\lambda_{\min}+\gamma)$ is the condition number of $G+\gamma I$; ReLU features
# of non-negative backbone outputs are highly collinear, so $\kappa$ is large. Every "same head"
# check below therefore uses the tolerance $100\,\varepsilon\,\kappa$ (printed): far below any
# difference a wrong aggregation would cause, which is of order one.

# %%
closed = stsa_studies.closed_form_checks(phi, y_all, num_classes, gamma)   # stats, head, tolerance and the two checks
stats, w_star, tol_w, checks = closed["stats"], closed["w_star"], closed["tol_w"], closed["checks"]
print(f"condition number of G + gamma I: {closed['kappa']:.2e}; tolerance for equal heads: {tol_w:.1e}")
print(pd.Series(checks).to_string())
assert checks["max |gradient| / max |X^T Y|"] < tol_w and checks["max |W - W_sklearn| / max |W|"] < tol_w

# %% [markdown]
# ## 2. Spatial aggregation (eqs. 2-3): invariant to partition and client count
#
# For any split of the stage's data over $K$ clients, $\sum_k G_{t,k}=\sum_k\sum_{x\in\mathcal D_{t,k}}
# \Phi(x)^\top\Phi(x)=\sum_{x\in\mathcal D_t}\Phi(x)^\top\Phi(x)$ and likewise for $C$. The check:
# Dirichlet label skew from $\beta=0.01$ (nearly one class per client) to $\beta=100$ and IID, and
# $K$ from 1 to 50; the summed statistics, the heads and the test predictions are compared with the
# centralized ones.

# %%
spatial = stsa_studies.spatial_check(x_all, y_all, num_classes, rf, betas + [None], client_counts, seed, stats, w_star,
                             rf(x_test), gamma)
display(captioned(spatial.style.format({c: "{:.1e}" for c in spatial.columns if c.startswith("rel")}, na_rep="—"),
                  "Spatial invariance: the sums of the clients' statistics and the head against the pooled ones"))
assert spatial["rel. err. sum G_k"].max() < 1e-12 and spatial["rel. err. sum C_k"].max() < 1e-12
assert spatial["rel. err. W"].max() < tol_w and spatial["same predictions"].all()
claims.register(
    "stsa-spatial-invariance", "stsa",
    "Spatial aggregation (eqs. 2-3): the summed client statistics equal the centralized ones, so the head is "
    "invariant to the partition and the data heterogeneity.",
    holds=bool(spatial["rel. err. W"].max() < tol_w and spatial["same predictions"].all()),
    evidence=f"{len(spatial)} partitions (Dirichlet beta {min(betas)}-{max(betas)} and IID, K {min(client_counts)}-"
             f"{max(client_counts)}): max rel. error of sum G_k {spatial['rel. err. sum G_k'].max():.1e}, of the head "
             f"{spatial['rel. err. W'].max():.1e} (tolerance {tol_w:.1e}); test predictions identical in every case.")

# %% [markdown]
# :::{folded} fedlib's code: the STSA client's upload (eqs. 1-3) and the server's spatial sum (eqs. 2-3)
# :::
#
# A client's upload is {eq}`stsa-eq-stats` on its rows, and the server adds the uploads of a stage
# (eqs. 2-3); with STSA-E it estimates the Gram matrix instead (section 4):
#
# ```{literalinclude} /fedlib/stsa/algorithm.py
# :pyobject: stsa_client
# :lineno-match:
# :caption: fedlib/stsa/algorithm.py: the STSA upload (eq. 1 features, eqs. 2-3 statistics)
# ```
#
# ```{literalinclude} /fedlib/stsa/algorithm.py
# :pyobject: STSAServer.absorb
# :lineno-match:
# :caption: fedlib/stsa/algorithm.py: spatial aggregation (eqs. 2-3), and eq. 9 for STSA-E
# ```

# %% [markdown]
# ## 3. Temporal aggregation (eqs. 4-5, 8): exactly joint ridge on all data seen
#
# Classes of different stages are disjoint, so a sample's one-hot row is zero in the columns of
# every other stage: the joint $C$ over all $\sum_i c_i$ classes is the column concatenation
# $[C_1,\dots,C_t]$, and the joint Gram is $\sum_i G_i$. Hence
#
# $$W_t=(G_{1:t}+\gamma I)^{-1}C_{1:t},\qquad G_{1:t}=\sum_{i\le t}\sum_k G_{i,k},\quad C_{1:t}=[C_1,\dots,C_t]$$ (stsa-eq-temporal)
#
# **is** the joint ridge head {eq}`stsa-eq-ridge` after every {term}`stage` (the paper's eq. 8).
#
# We run the full protocol (`fedlib.federated.incremental`: seeded class order, a Dirichlet partition redrawn
# per task) and compare the head after each stage with joint ridge on the data seen so far; then the
# same with the stages in reverse order, and with every stage cut into two sub-stages.

# %%
stream = make_stream(y_all, y_test, num_tasks, seed=seed)
pos = stream.relabel(y_all)


heads = []   # the head after every stage, kept by the learner's on_stage_end callback
learner = stsa.STSALearner(dim, num_classes, M, gamma, rf_seed=seed,
                           on_stage_end=[lambda t, lrn: heads.append(lrn.weights.clone())])
result = run_class_incremental(learner, stream, x_all, y_all, x_test, y_test, num_clients=5, beta=0.1,
                               seed=seed, progress=False)
temporal = stsa_studies.temporal_check(heads, stream, phi, pos, gamma)
print(temporal.to_string(index=False))
assert temporal["rel. err. vs joint ridge"].max() < tol_w

# reverse arrival order and sub-stages: the statistics commute and split
err_rev, err_split = stsa_studies.order_and_split_errors(stream, x_all, pos, rf, M, num_classes, gamma, heads[-1])
print(f"reverse order: {err_rev:.1e}; two sub-stages per task: {err_split:.1e}")
assert err_rev < tol_w and err_split < tol_w
claims.register(
    "stsa-temporal-invariance", "stsa",
    "Temporal aggregation (eqs. 4-5, 8): after every stage the head equals joint ridge on all data seen so far "
    "(our extension, checked as well: whatever the order of the stages).",
    holds=bool(temporal["rel. err. vs joint ridge"].max() < tol_w and err_rev < tol_w and err_split < tol_w),
    evidence=f"{num_tasks} stages, 5 clients, β = 0.1: max rel. error vs joint ridge "
             f"{temporal['rel. err. vs joint ridge'].max():.1e}; reversed order {err_rev:.1e}; two sub-stages per task "
             f"{err_split:.1e} (tolerance {tol_w:.1e}).")

# %% [markdown]
# :::{folded} The server's solve in code, and STSA's accuracy matrix on the synthetic stream (old tasks keep their joint head but can lose accuracy to each new task's classes)
# :::
#
# The server's solve after each stage, {eq}`stsa-eq-temporal`:
#
# ```{literalinclude} /fedlib/stsa/algorithm.py
# :pyobject: STSAServer.solve
# :lineno-match:
# :caption: fedlib/stsa/algorithm.py: temporal aggregation and the ridge solve (eqs. 4-5, 8)
# ```
#
# The accuracy matrix $A_{t,\tau}$ (accuracy on task $\tau$'s test classes after stage $t$) of this
# run shows what "forgetting" means for STSA: the head of old classes is not overwritten (it is
# the joint solution), but every new task adds competitors in the argmax, so old-task accuracy
# can drop. With a fixed $F$ this matrix is the same for every partition and client count.

# %% mystnb={"figure": {"caption": "STSA's accuracy matrix on the synthetic stream as a heat map: row t is the stage after which the head is tested, column tau the task whose test classes are scored, colour and number the accuracy (%). Old tasks keep their joint head but can lose accuracy as every new task adds competing classes."}, "image": {"alt": "Annotated heat map of accuracy by stage and task"}}
fig, ax = plt.subplots(figsize=fit_column(4.5, 3.6))
sns.heatmap(pd.DataFrame(100 * result.acc, index=range(1, num_tasks + 1), columns=range(1, num_tasks + 1)),
            annot=True, fmt=".1f", cmap="viridis", ax=ax, cbar_kws={"label": "accuracy (%)"})
ax.set(xlabel=r"task $\tau$ (test classes)", ylabel="after stage $t$", title=r"STSA accuracy matrix $A_{t,\tau}$ (synthetic)")
plt.show()
print("; ".join(f"{k} {100 * v:.2f} %" for k, v in result.metrics.items()))

# %% [markdown]
# ## 4. STSA-E: a Gram matrix from first-order statistics (Prop. 3.1, eq. 9)
#
# STSA-E uploads only $C_{t,k}$ and the label counts $\mathbf n_{t,k}$. For class $i$ write
# $s_k=C^{(i)}_{t,k}$ (client $k$'s class sum), $n_k$ its count, $n=\sum_k n_k$, $s=\sum_k s_k$,
# $m=s/n$ and $m_k=s_k/n_k$. The server forms (eq. 9, with $C\,C^\top$ outer products; the revised version's
# main text prints the scalar $C^\top C$, a typo)
#
# $$\hat G^{(i)}=\frac{n-1}{K-1}\sum_k\frac{s_ks_k^\top}{n_k}-\frac{n-K}{n(K-1)}ss^\top .$$ (stsa-eq-ghat)
#
# ### Why the estimate is unbiased under label skew (Prop. 3.1)
#
# Eq. 9 keeps the class's mean term exactly and replaces its within-class scatter by the scaled
# between-client scatter; the estimate is unbiased when the class's samples are assigned to the clients
# at random (label skew).
#
# :::{folded} The derivation: eq. 9 in positive semidefinite form, fedlib's STSA-E upload and estimate, Prop. 3.1 with its proof, and the Monte Carlo check that the mean of the estimate converges to G
# :::
#
# Since $\sum_k s_ks_k^\top/n_k=\sum_k n_k(m_k-m)(m_k-m)^\top+n\,mm^\top$ and $ss^\top=n^2mm^\top$,
#
# $$\hat G^{(i)}=n\,mm^\top+\frac{n-1}{K-1}B,\qquad B=\sum_k n_k(m_k-m)(m_k-m)^\top ,$$ (stsa-eq-ghat-psd)
#
# while the true class Gram is $G^{(i)}=n\,mm^\top+S$ with $S=\sum_{x}(\Phi(x)-m)(\Phi(x)-m)^\top$.
# So STSA-E keeps the mean term exactly and replaces the within-class scatter $S$ ($n-1$ degrees of
# freedom) by the scaled between-client scatter ($K-1$ degrees of freedom). This form is positive
# semidefinite, and `fedlib` computes it for all classes and clients as one product $DD^\top+EE^\top$
# (`stsa_studies.eq9_identity_checks` compares {eq}`stsa-eq-ghat` with {eq}`stsa-eq-ghat-psd`).
#
# The STSA-E upload and the server's estimate, {eq}`stsa-eq-ghat-psd` for every class at once:
#
# ```{literalinclude} /fedlib/stsa/algorithm.py
# :pyobject: stsae_client
# :lineno-match:
# :caption: fedlib/stsa/algorithm.py: the STSA-E upload: class sums and counts of dummy clients
# ```
#
# ```{literalinclude} /fedlib/stsa/algorithm.py
# :pyobject: gram_estimate
# :lineno-match:
# :caption: fedlib/stsa/algorithm.py: the Gram estimate (eq. 9) as D D^T + E E^T
# ```
#
# ```{prf:proposition} Unbiased Gram estimate; STSA paper, under label skew
# :label: stsa-prop-unbiased
# :class: number-3-1
#
# {cite:t}`guan2025stsa`, in the form we prove:
# If the $n$ samples of class $i$ are assigned at random to $K\ge2$ clients of fixed sizes $n_1,\dots,n_K\ge1$,
# then $E[\hat G^{(i)}]=G^{(i)}$ for the estimate {eq}`stsa-eq-ghat`, whatever the feature values.
# ```
#
# ```{prf:proof}
# By {eq}`stsa-eq-ghat-psd` it suffices that $E[B]=\frac{K-1}{n-1}S$, the ANOVA identity for sampling
# without replacement (below).
# ```
#
# **Unbiasedness, under label skew** ({prf:ref}`stsa-prop-unbiased`). If the class's $n$ samples are assigned to clients of fixed
# sizes $n_1,\dots,n_K\ge1$ at random, then $E[B]=\frac{K-1}{n-1}S$ (the classical ANOVA identity
# for sampling without replacement), so $E[\hat G^{(i)}]=G^{(i)}$ for any feature values: this is
# the situation the paper's "i.i.d. global feature set" assumption describes. Random assignment
# within a class is exactly **label skew**: the clients' class proportions differ, but given the
# class every client draws from the same distribution. It fails under **feature skew** (a client's
# features carry its own shift, e.g. another camera or domain), treated after the bias study below. Checks: the printed and
# the PSD forms agree; one sample per client ($K=n$) is exact; the Monte Carlo mean converges to $G$
# at the rate $R^{-1/2}$.

# %% mystnb={"figure": {"caption": "Relative Frobenius error of the Monte Carlo mean of the Gram estimate against the true class Gram matrix versus the number of repetitions R (log-log), with a dashed reference line of slope minus one half. The mean converges at that rate, as it does for an unbiased estimator."}, "image": {"alt": "Log-log line chart: relative error of the averaged Gram estimate against number of repetitions, with a dashed reference slope"}}
cls_idx = np.flatnonzero(y_all == 0)[:60]
xc = phi[cls_idx]
counts = np.array([1, 3, 6, 10, 15, 25])
identity_err, exact_err = stsa_studies.eq9_identity_checks(xc, counts)
print(f"printed eq. 9 vs PSD form: {identity_err:.1e};  one sample per client (K = n): {exact_err:.1e}")
assert identity_err < 1e-10 and exact_err < 1e-10

mc, mean_ghat = stsa_studies.design_monte_carlo(xc[:, :48], counts, "global", mc_reps, rng)
slope = np.polyfit(np.log(mc["repetitions"]), np.log(mc["rel. error of the mean"]), 1)[0]
fig, ax = plt.subplots(figsize=fit_column(5, 3.5))
ax.loglog(mc["repetitions"], mc["rel. error of the mean"], "o-", label=f"Monte Carlo (slope {slope:.2f})".replace("-", "−"))
ax.loglog(mc["repetitions"], mc["rel. error of the mean"].iloc[0] * (mc["repetitions"] / mc["repetitions"].iloc[0]) ** -0.5,
          "k--", label="$R^{-1/2}$")
ax.set(xlabel="Monte Carlo repetitions R", ylabel=r"$\|\bar G_R-G\|_F/\|G\|_F$", title="Prop. 3.1: the mean converges to G")
ax.legend()
plt.show()
print(f"fitted slope {slope:.2f} (unbiased: -0.5)")
assert -0.85 < slope < -0.25

# %% [markdown]
# ### Where the printed estimator is biased: clients without the class
#
# Eq. 9's $K$ is the **total** number of (dummy) clients. Under label skew, and much more with
# $K_D$ dummy clients cut from each client (the authors' code splits a client's whole local set into
# $K_D$ random chunks), many clients hold **no** sample of a class. Their terms are 0/0 and are
# skipped, but they still count in $K$. Then $E[B]=\frac{K_i-1}{n-1}S$ with
# $K_i=\#\{k:n_k>0\}$, and the covariance part of $\hat G$ shrinks by the factor
# $(K_i-1)/(K-1)$. Replacing $K$ by $K_i$ per class removes the bias (`k_mode="per_class"`).
#
# :::{folded} The covariance ratio measured for K_D dummy clients per client, with the printed global K (biased low) and with the per-class K_i (unbiased)
# :::
#
# Below: a Dirichlet $\beta=0.1$ partition over 5 clients and $K_D$ dummy clients each; ratio of
# the estimated to the true covariance part, $\operatorname{tr}(E[\hat G]-n\,mm^\top)/\operatorname{tr}S$
# for class 0, the expectation taken (by Monte Carlo) over which of its samples land in which
# dummy client, with the per-client counts fixed by the partition and one dummy split.

# %%
parts = make_partition(y_all, 5, "dirichlet", alpha=0.1, seed=seed, min_size=max(bias_dummy))
# class-0 counts of the 5 x K_D dummy clients from one dummy split (many are 0), then the expectation over
# which class-0 samples land in which dummy client (design-based)
bias = stsa_studies.dummy_client_bias(phi, y_all, parts, bias_dummy, max(100, mc_reps // 10), rng)
print(bias.to_string(index=False))
per_class = bias[bias.k_mode == "per_class"]["covariance ratio"]
assert (abs(per_class - 1) < 0.15).all(), "the per-class K estimator is unbiased (up to Monte Carlo noise)"
global_low = bias[(bias.k_mode == "global") & (bias.K_D == max(bias_dummy))]["covariance ratio"].iloc[0]
assert global_low < 0.8

# %% [markdown]
# ### Outside the assumption: feature skew
#
# Under feature skew client $k$'s samples of class $i$ are $x+\delta_k$: its own shift $\delta_k$ of
# the backbone features (here $\delta_k=s\,\sigma\odot z_k$, $z_k\sim\mathcal N(0,I)$, $\sigma$
# the per-dimension std of the features, $s$ the scale; `stsa_studies.client_shifts`). The pooled data and
# hence STSA's exact $G$ contain the shifts as well; but the client means $m_k$ now differ by the
# shifts on top of sampling noise, so $B$ holds the spread of the shifts with weight $n_k$, and the
# factor $(n-1)/(K-1)$ blows it up: $\hat G$ **overestimates** the within-class scatter. Below: class
# 0 split over 5 clients of equal size, the expectation over which samples land on which client
# (design-based Monte Carlo, `skew_reps` repetitions), $K_i=K$ (every client holds the class, so
# global and per-class $K$ agree), ratio
# $E[\operatorname{tr}(\hat G-n\,mm^\top)]/E[\operatorname{tr}S]$ against the shift scale $s$.

# %%
skew = stsa_studies.feature_skew_study(x_all, y_all, rf, skew_scales, 5, seed, skew_reps, rng)
print(skew.to_string(index=False, float_format="%.3f"))
ratio_col = skew.columns[1]
unskewed = skew[skew["shift scale s"] == 0]
ratios_skewed = skew.loc[skew["shift scale s"] > 0, ratio_col]
assert (abs(unskewed[ratio_col] - 1) < 4 * unskewed["MC std. error"]).all(), "label skew only: unbiased"
assert (skew.loc[skew["shift scale s"] > 0, ratio_col] - 1 > 4 * skew.loc[skew["shift scale s"] > 0, "MC std. error"]).all(), \
    "feature skew: the within-class scatter is overestimated"

# %%
ratio_max = float(ratios_skewed.max()) if len(ratios_skewed) else float("nan")
claims.register(
    "stsae-unbiased", "stsa",
    "Prop. 3.1: STSA-E's Gram estimate (eq. 9) is an unbiased plug-in estimator of the global Gram matrix "
    "when the global feature set is i.i.d.",
    holds=bool(-0.85 < slope < -0.25 and (abs(per_class - 1) < 0.15).all()),
    condition="the data are non-i.i.d. by label skew only (same class-conditional feature distribution on every "
              "client) and K counts only the (dummy) clients that hold the class; with the printed global K and "
              "empty dummy clients the covariance part is biased low, under feature skew it is biased high",
    evidence=f"Monte Carlo mean -> G at slope {slope:.2f} (unbiased: -0.5); covariance ratio with per-class K_i "
             f"{per_class.min():.2f}-{per_class.max():.2f}, with the printed global K "
             f"{bias[bias.k_mode == 'global']['covariance ratio'].min():.2f}-"
             f"{bias[bias.k_mode == 'global']['covariance ratio'].max():.2f} (K_D {min(bias_dummy)}-{max(bias_dummy)}); "
             f"under feature skew {ratios_skewed.min():.2f}-{ratio_max:.2f} "
             f"(shift scales {min(s for s in skew_scales if s > 0)}-{max(skew_scales)}).")

# %% [markdown]
# :::{folded} Does the overestimate cost accuracy? STSA and STSA-E on the full protocol, with label skew only and with client shifts, paired by seed
# :::
#
# Does the overestimate cost accuracy? The full protocol on the synthetic features ($T$ tasks,
# 5 clients, Dirichlet $\beta=0.5$, STSA-E with `skew_dummy` dummy clients each and per-class $K_i$),
# once with label skew only and once with client shifts of scale `skew_accuracy_scale`
# (`stsa_studies.FeatureSkewLearner`; the test samples carry the shift of a uniformly drawn client). The
# runs pair by seed (same data, class order, partition, shifts), so differences are paired.

# %%
skew_acc = stsa_studies.feature_skew_accuracy(x_all, y_all, x_test, y_test, num_tasks, num_classes, M, gamma, skew_seeds,
                                      skew_accuracy_scale, skew_dummy)
skew_table, effect = paired_table(skew_acc, [0.0, skew_accuracy_scale], "STSA", "STSA-E")
display(captioned(skew_table, f"A_T (%) with feature shifts over {len(skew_seeds)} seeds (mean ± sample std; paired "
                              f"differences with their 95 % CI), synthetic features, K = 5, β = 0.5, K_D = {skew_dummy}"))
glue("stsa_skew_effect_stsae", Markdown(str(effect["STSA-E"])), display=False)
glue("stsa_skew_effect_stsa", Markdown(str(effect["STSA"])), display=False)

# %% [markdown]
# Effect of the shifts on each method (skewed − label skew only, paired by seed, in points):
# STSA-E {glue:md}`stsa_skew_effect_stsae`; STSA {glue:md}`stsa_skew_effect_stsa`.

# %% [markdown]
# ## 5. How large is the error? Prop. 3.2 against the exact law
#
# For Gaussian class features $\Phi\sim\mathcal N(\mu,\Sigma)$ split over $K$ non-empty clients,
# $B\sim\mathrm{Wishart}(\Sigma,K-1)$ and the within-client scatter $S-B\sim\mathrm{Wishart}(\Sigma,n-K)$
# are independent (so $S=B+(S-B)\sim\mathrm{Wishart}(\Sigma,n-1)$, which is **not** independent of
# $B$; checked by Monte Carlo after the plot). Writing $\hat G-G=(a-1)B-(S-B)$ with $a=(n-1)/(K-1)$,
#
# $$E\lVert\hat G^{(i)}-G^{(i)}\rVert_F^2=\frac{n-K}{K-1}\big[(n-K)\operatorname{tr}\Sigma^2+(n-1)(\operatorname{tr}\Sigma)^2\big]+(n-K)\operatorname{tr}\Sigma^2$$ (stsa-eq-error-law)
#
# (our derivation, not the paper's; $\approx n^2(\operatorname{tr}\Sigma^2+(\operatorname{tr}\Sigma)^2)/(K-1)$).
# It vanishes at $K=n$. The paper's bound (Prop. 3.2) has the shape $((K+1)/(K-1))^2n^2$, which
# does **not** vanish as $K$ grows: it is loose by a factor that grows like $K$. Its proof rests on
# Lemma 3.5, $E\lVert\mathbf M\rVert_F^2=\frac{n-1}{n}(\operatorname{tr}\Sigma)^2$, which is false:
# $\mathbf M\sim\mathrm{Wishart}(\Sigma,n-1)$ gives $(n-1)[n\operatorname{tr}\Sigma^2+(\operatorname{tr}\Sigma)^2]$.
#
# :::{folded} The exact law against Monte Carlo and the paper's bound, table and figure
# :::

# %%
d_small = 5
sigma = np.diag(np.arange(1.0, d_small + 1))
law = stsa_studies.gram_error_table(np.full(d_small, 2.0), sigma, mse_n, mse_clients, mse_reps, rng)
print(law.drop(columns="paper shape ((K+1)/(K-1))^2").to_string(index=False, float_format="%.4g"))
inner = law[law.K < mse_n]
assert (abs(inner["Monte Carlo"] - inner["exact law"]) < 5 * inner["MC std. error"] + 1e-9).all()
assert law["Monte Carlo"].iloc[-1] < 1e-9 * law["Monte Carlo"].iloc[0] if mse_clients[-1] == mse_n else True

# %% mystnb={"figure": {"caption": "Expected squared Frobenius error of the Gram estimate against the number of clients K (class split evenly; log-log): Monte Carlo points, the exact law derived above (line) and the shape of the paper's bound scaled to agree at K = 2 (dashed). The Monte Carlo points follow the exact law, which falls as K grows, while the paper's bound shape does not vanish."}, "image": {"alt": "Log-log chart: Gram-estimate error against number of clients, Monte Carlo points with the exact law and the paper's bound shape"}}
fig, ax = plt.subplots(figsize=fit_column(5.5, 3.8))
ax.loglog(inner["K"], inner["Monte Carlo"], "o", label="Monte Carlo")
ax.loglog(inner["K"], inner["exact law"], "-", label="exact law (derived)")
ax.loglog(law["K"], law["paper shape (scaled at K=2)"], "--", label="paper's bound shape, scaled at K=2")
ax.set(xlabel="clients K (class split evenly)", ylabel=r"$E\|\hat G-G\|_F^2$", title=f"Gram-estimate error, n={mse_n}, d={d_small}")
ax.legend()
plt.show()

# %% [markdown]
# :::{unfold}
# :::

# %%
# Lemma 3.5 by Monte Carlo (d=5, Sigma=diag(1..5), n=10)
n_l = 10
lemma = stsa_studies.lemma_3_5_check(sigma, n_l, mse_reps, rng)
print(pd.Series(lemma).to_string(float_format="%.1f"))
assert abs(lemma["Monte Carlo"] / lemma["Wishart (n-1)[n tr S^2 + (tr S)^2]"] - 1) < 0.1
assert lemma["Monte Carlo"] > 10 * lemma["paper's Lemma 3.5 ((n-1)/n)(tr S)^2"]
lemma_paper = lemma["paper's Lemma 3.5 ((n-1)/n)(tr S)^2"]
claims.register(
    "stsa-lemma-3-5", "stsa",
    "Lemma 3.5: E||M||_F^2 = ((n-1)/n)(tr Sigma)^2 for the centred scatter M of n Gaussian samples.",
    holds=bool(abs(lemma["Monte Carlo"] / lemma_paper - 1) < 0.1),
    evidence=f"n={n_l}, Sigma=diag(1..{d_small}): Monte Carlo {lemma['Monte Carlo']:.1f} against the lemma's "
             f"{lemma_paper:.1f}; the Wishart value "
             f"{lemma['Wishart (n-1)[n tr S^2 + (tr S)^2]']:.1f} matches.")

# B is independent of S - B, not of S (Gaussian, one class, K equal clients): correlation of the traces
n_b, k_b = 12, 4
corr = stsa_studies.scatter_correlations(n_b, k_b, mse_reps, rng)
print(pd.Series(corr).to_string(float_format="%.3f"))
se_corr = 4 / np.sqrt(mse_reps)
assert abs(corr["corr(tr B, tr(S - B))"]) < se_corr
assert abs(corr["corr(tr B, tr S)"] - corr["sqrt((K-1)/(n-1)) (Wishart)"]) < se_corr

# %% [markdown]
# ### The plug-in rate of Theorem 3.3, and what it hides
#
# Theorem 3.3 claims that the extra error of STSA-E's head, $\frac1n E\lVert X(W_E-W^*)\rVert_F$,
# falls like $t/n$ at a fixed number of stages, while the oracle error $\frac1nE\lVert XW^*-Y\rVert_F$
# falls like $n^{-1/2}$. Both are Frobenius norms over $n$ rows divided by $n$: even an error of the
# same size on every sample falls like $n^{-1/2}$ in this normalization. The **per-sample** (RMS)
# error $\lVert X(W_E-W^*)\rVert_F/\sqrt n$ is what says whether STSA-E's predictions approach
# STSA's. Since $\hat G$'s relative error depends on the number of (dummy) clients and not on $n$
# (section 5), we expect it to stay flat in $n$ and to fall only with $K\cdot K_D$.
# Synthetic Gaussian classes (20 features, 5 classes), $\gamma=1$, one stage, `rate_reps` draws:
# first $K=5$ and $n$ from `rate_ns`; then $n$ = `rate_n_fixed` and $K\cdot K_D$ from `rate_clients`.

# %%
rate, rate_k, slopes, slope_k = stsa_studies.plugin_rate_study(rate_ns, rate_clients, rate_n_fixed, rate_reps)
per_sample = "plug-in, per sample ||X(W_E - W*)||/sqrt(n)"
print(f"K = 5, against n (mean of {rate_reps} draws):")
print(rate.drop(columns="K K_D").to_string(float_format="%.3e"))
print("fitted log-log slopes in n:", ", ".join(f"{k} {v:.2f}" for k, v in slopes.items()),
      "(paper: -1 for the plug-in term, -0.5 for the oracle)")
print(f"\nn = {rate_n_fixed}, against K K_D:")
print(rate_k[[per_sample]].to_string(float_format="%.3e"))
print(f"fitted log-log slope of the per-sample error in K K_D: {slope_k:.2f}")

# %% mystnb={"figure": {"caption": "Plug-in error of the STSA-E head on synthetic Gaussian classes (log-log). Left: against the number of samples n at K = 5, per sample (RMS) and in the paper's normalization (Frobenius norm over n). Right: the per-sample error against the number of (dummy) clients K times K_D at fixed n. The paper's normalization falls with n while the per-sample error hardly moves; only more clients lower it."}, "image": {"alt": "Two log-log line charts: plug-in error against sample count in two normalizations, and per-sample error against number of clients"}}
fig, axes = plt.subplots(1, 2, figsize=fit_column(10, 4.6))
axes[0].loglog(rate.index, rate[per_sample], "o-", label="per sample (RMS)")
axes[0].loglog(rate.index, rate["plug-in (1/n)||X(W_E - W*)||"], "s--", label=r"paper's $\frac{1}{n}\|\cdot\|_F$")
axes[0].set(xlabel="samples $n$ ($K$ = 5)", ylabel="plug-in error of the head", title="against $n$")
axes[1].loglog(rate_k.index, rate_k[per_sample], "o-")
axes[1].set(xlabel=r"clients $K\,K_D$", ylabel="per-sample plug-in error", title=rf"against $K\,K_D$ ($n$ = {rate_n_fixed})")
for ax, values in [(axes[0], rate.index), (axes[1], rate_k.index)]:   # x ticks at the values run, no minor labels
    ax.xaxis.set_major_locator(mpl.ticker.FixedLocator(values))
    ax.xaxis.set_major_formatter(mpl.ticker.FixedFormatter([f"{v:g}" for v in values]))
    ax.xaxis.set_minor_formatter(mpl.ticker.NullFormatter())
fig.legend(loc="lower center", ncol=2, frameon=False, bbox_to_anchor=(0.5, 0.0))
fig.tight_layout(rect=(0, 0.08, 1, 1))
plt.show()

# %%
assert slopes["plug-in (1/n)||X(W_E - W*)||"] > -0.75, "the plug-in term does not fall like 1/n"
assert slopes[per_sample] > -0.25, "the per-sample error does not fall like n^{-1/2} or faster"
assert slope_k < -0.3, "the per-sample error falls with the number of (dummy) clients"
claims.register(
    "stsae-plugin-rate", "stsa",
    "Thm. 3.3 / Cor. 3.4: the plug-in error (1/n)E||X(W_E - W*)||_F of STSA-E falls like t/n at a fixed number of "
    "stages, so STSA-E approaches STSA as the data grow.",
    holds=bool(slopes["plug-in (1/n)||X(W_E - W*)||"] < -0.75 and slopes[per_sample] < -0.25),
    evidence=f"slope of (1/n)||.||_F in n: {slopes['plug-in (1/n)||X(W_E - W*)||']:.2f} (claimed -1); per-sample RMS "
             f"error {rate[per_sample].iloc[0]:.3f} at n={rate.index[0]} and {rate[per_sample].iloc[-1]:.3f} at "
             f"n={rate.index[-1]} (slope {slopes[per_sample]:.2f}); it falls only with K K_D (slope {slope_k:.2f}, "
             f"{rate_k[per_sample].iloc[0]:.3f} at {rate_k.index[0]} to {rate_k[per_sample].iloc[-1]:.3f} at "
             f"{rate_k.index[-1]} clients).")

# %% [markdown]
# ## 6. Rank and the role of $\gamma$
#
# $\hat G_t$ has rank at most $\sum_i K_i$ (one mean direction plus $K_i-1$ scatter directions per
# class), so with few (dummy) clients it is far from full rank and $\gamma I$ is what makes eq. 10
# solvable. The true $G_t$ has rank $\min(n_t, M)$.

# %%
rk = stsa_studies.gram_estimate_rank(x_all, y_all, parts, num_classes, rf, num_dummy=2)
print(f"rank(G_hat) = {rk['rank']} <= sum_i K_i = {rk['bound']} (M = {M}); lambda_min = {rk['lambda_min']:.2e} (PSD)")
assert rk["rank"] <= rk["bound"] and rk["lambda_min"] > -1e-9 * rk["lambda_max"]

# %% [markdown]
# ## 7. Privacy: secure aggregation and the upload noise
#
# With pairwise additive masks (client $k$ adds $\sum_{j>k}R_{kj}-\sum_{j<k}R_{jk}$) the server sees
# only masked uploads, but the masks cancel in the **sum**. STSA needs only $\sum_kG_{t,k}$ and
# $\sum_kC_{t,k}$, so it works unchanged. STSA-E's eq. 9 needs each client's $s_ks_k^\top/n_k$, which
# is not a sum of the uploads: masked uploads break it.

# %%
err_sum, err_masked = stsa_studies.secure_aggregation_check(x_all, y_all, parts, num_classes, rf, rng)
print(f"STSA, sum of masked G_k vs sum of G_k: {err_sum:.1e}")
print(f"STSA-E, G_hat from masked class sums vs from the true ones: {err_masked:.1e}")
assert err_sum < 1e-9 and err_masked > 1.0

# %% [markdown]
# ## 8. Communication (Sec. 4.4, Table 5)
#
# Per client and stage
#
# $$\text{STSA: }(M+c_t)M,\qquad \text{STSA-E: }(M+1)\,c_t\,K_D$$ (stsa-eq-upload)
#
# numbers (STSA-E sends the counts as one extra row; $K_D$ {term}`dummy clients`). The paper's Table 5 follows with float32, "MB" = MiB, all $T=10$ stages (stage 1 included)
# and the full $M\times M$ Gram. Below the formula, and the bytes of real upload messages
# (float32, one stage, one client, measured by `Message.nbytes`) times $T$; STSA-E is cheaper iff
# roughly $c_tK_D<M$.

# %% mystnb={"figure": {"caption": "Upload per client over T = 10 stages (MiB, float32) against the number of random features M (log-log), one line per method, in the paper's CIFAR-100 setting (10 classes per task, 50 dummy clients). STSA's upload grows with the square of M and STSA-E's linearly, so STSA-E is the cheaper once M exceeds about c_t times K_D."}, "image": {"alt": "Log-log line chart: upload per client against number of random features for STSA and STSA-E"}}
comm = stsa_studies.communication_table(paper_results.stsa_table5(), rng)
print(comm.to_string(index=False))
assert np.allclose(comm["formula (MiB)"], comm["paper (MB)"], atol=0.05)
assert np.allclose(comm["measured messages (MiB)"], comm["formula (MiB)"], atol=0.01)
claims.register(
    "stsa-communication-table", "stsa",
    "Table 5: per-client upload over T=10 stages is 955.6 MB (STSA) vs 95.4 MB (STSA-E) with ResNet-18 "
    "(M=5000, K_D=50) and 60.1 MB vs 4.77 MB with ViT-B/16 (M=1250, K_D=10).",
    holds=bool(np.allclose(comm["formula (MiB)"], comm["paper (MB)"], atol=0.05)
               and np.allclose(comm["measured messages (MiB)"], comm["formula (MiB)"], atol=0.01)),
    evidence="formula / measured float32 messages (MiB): " + "; ".join(
        f"{r['method']} {r['setting'].split(',')[0]} {r['formula (MiB)']:.2f} / {r['measured messages (MiB)']:.2f} "
        f"(paper {r['paper (MB)']})" for _, r in comm.iterrows()) + ". Counted as float32, MiB, stage 1 included.")

curve = stsa_studies.communication_curve(comm_M, num_dummy=50)
fig, ax = plt.subplots(figsize=fit_column(5, 3.5))
# the method names in mathtext for the legend ("STSA-E (K_D=50)" -> "STSA-E ($K_D$ = 50)")
shown = curve.assign(method=curve["method"].str.replace(r"\(K_D=(\d+)\)", r"($K_D$ = \1)", regex=True))
sns.lineplot(data=shown, x="M", y="MiB per client (T=10)", hue="method", **method_hue(shown["method"], "stsa"), marker="o",
             ax=ax)
ax.set(xscale="log", yscale="log", xlabel="random features $M$", ylabel="upload per client (MiB, float32)",
       title="Communication vs $M$ (paper Fig. 7, CIFAR-100, $c_t$ = 10)")
plt.show()

# %% [markdown]
# ## 9. The paper's quoted margins, recomputed from its own tables
#
# Each margin the paper quotes in its text, beside the smallest and largest value its own tables give.
#
# :::{folded} The quoted margins against the recomputed ones (not every quoted margin holds in every case)
# :::

# %%
print(stsa_studies.recomputed_margins().to_string(index=False))

# %% [markdown]
# ## Summary of the checks
#
# :::{table} What each claim was checked against, and what the check found
# | claim | check | result |
# |---|---|---|
# | eq. 7 solves eq. 6 | gradient, scikit-learn `Ridge` | to round-off |
# | spatial invariance (eqs. 2-3) | Dirichlet $\beta$ 0.01-100, IID, $K$ 1-50 | identical statistics, heads, predictions |
# | temporal invariance (eqs. 4-5, 8) | every stage vs joint ridge; reversed order; sub-stages | identical |
# | Prop. 3.1 (unbiased) | printed = PSD form; $K=n$ exact; Monte Carlo $R^{-1/2}$ | holds under label skew when every client counted in $K$ has the class |
# | eq. 9 with empty clients | label skew + dummy clients | biased low (factor $(K_i-1)/(K-1)$); per-class $K_i$ fixes it |
# | eq. 9 under feature skew | client-specific shifts | covariance part biased high (ratios printed in section 4) |
# | Prop. 3.2 / Lemma 3.5 | exact error law vs Monte Carlo | bound loose in $K$; Lemma 3.5 false |
# | Thm. 3.3 rate | fitted slopes, per-sample error | the paper's normalization falls like $n^{-1/2}$; the per-sample error is flat in $n$ and falls only with $K\cdot K_D$ (asserted) |
# | secure aggregation | pairwise masks | fine for STSA, breaks STSA-E |
# | Table 5 | formula and measured messages | 955.58 / 95.39 / 60.08 / 4.77 MiB |
# :::
#
# All assertions above passed when this page was built.

# %% [markdown]
# ## Exercises
#
# Re-run with `make run NB=stsa_derivation ARGS="..."`. Under an exercise that changes a parameter,
# the self-check line compares this run's measurement with the prediction
# (`fedlib.evaluation.selfcheck`).
#
# :::{folded} The exercises, with their solutions and the self-checks of this run
# :::
#
# ```{exercise} Exactness is not accuracy
# :label: stsa-deriv-ex-exactness
#
# Sections 2-3 show that STSA's head does not depend on the partition once $F$ is fixed. Why then do
# the paper's Tables 1-2 change with $\beta$? Change `betas` or `client_counts` and check that the
# head of {eq}`stsa-eq-temporal` does not move.
# ```
#
# ````{solution} stsa-deriv-ex-exactness
# :class: dropdown
#
# Only stage 1 depends on the partition: the backbone $F$ is trained by FedAvg on task 1 under label
# skew, and a worse $F$ gives worse features for every later stage. With a fixed $F$ (our frozen
# pretrained backbone) the accuracy is identical for every $\beta$ and $K$.
# ````

# %%
from fedlib.stsa import selfcheck

selfcheck.stsa_partition_invariance(spatial, tol_w)

# %% [markdown]
# ```{exercise} Dummy clients
# :label: stsa-deriv-ex-dummy
#
# With `k_mode="global"`, predict the covariance ratio of section 4 for a class that only 2 of 5
# clients hold, with $K_D=25$ random chunks each. Fill in your prediction below, and check it by
# changing `bias_dummy`.
# ```
#
# ````{solution} stsa-deriv-ex-dummy
# :class: dropdown
#
# Each holding client splits its samples of the class over $K_D=25$ chunks; if it has many samples
# of the class, nearly all chunks hold some, so $K_i\approx 2\cdot25=50$ of $K=125$: ratio
# $(K_i-1)/(K-1)\approx 49/124\approx0.4$. Fewer samples per client means fewer non-empty chunks and
# a smaller ratio.
# ````

# %%
my_ratio = None  # your answer: the covariance ratio with the global K at the largest K_D of bias_dummy
print(selfcheck.stsa_dummy_ratio(my_ratio, bias, max(bias_dummy)))

# %% [markdown]
# ```{exercise} Break-even
# :label: stsa-deriv-ex-break-even
#
# For $c_t=10$ and $M=1250$, at which $K_D$ does STSA-E stop saving communication? Use
# `stsa_studies.communication_mib`. Count with {eq}`stsa-eq-upload`, then fill in your answer below.
# ```
#
# ````{solution} stsa-deriv-ex-break-even
# :class: dropdown
#
# $(M+1)c_tK_D<(M+c_t)M$ gives $K_D<(1260\cdot1250)/(1251\cdot10)\approx125.9$: STSA-E is cheaper up
# to $K_D=125$.
# ````

# %%
my_K_D = None  # your answer: the largest K_D at which STSA-E uploads less than STSA (M = 1250, c_t = 10)
print(selfcheck.stsa_break_even(my_K_D, M=1250, c_t=10))

# %% [markdown]
# ```{exercise} Rank
# :label: stsa-deriv-ex-rank
#
# In section 6, how small can $\gamma$ be before the solve of eq. 10 becomes ill-conditioned, and
# why does STSA (exact $G$) not have this problem when $n_t > M$? Use {eq}`stsa-eq-ridge` with $\hat G$
# in place of $G$.
# ```
#
# ````{solution} stsa-deriv-ex-rank
# :class: dropdown
#
# $\hat G$ has rank $\le\sum_iK_i$, so its smallest eigenvalues are exactly 0 and the condition
# number of $\hat G+\gamma I$ is $\approx\lambda_{\max}/\gamma$; the exact $G$ of $n_t>M$ samples in
# general position is full rank, so $\gamma$ only regularizes.
# ````

# %%
selfcheck.stsa_rank(rk, M)
