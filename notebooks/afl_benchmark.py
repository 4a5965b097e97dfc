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
# # AFL against gradient-based federated learning on frozen features
#
# The AFL paper (Zhuang et al., 2024) compares its one-round analytic head with FedAvg, FedProx,
# MOON, FedGen, FedDyn, FedNTD and FedDisco, all training a head on the same **frozen** ImageNet
# ResNet-18, on CIFAR-10/100 and Tiny-ImageNet with 100 clients. Those datasets and weights cannot
# be downloaded on the machines this book is built on, so this chapter runs the same protocol on
# **Fashion-MNIST** with an ImageNet-pretrained **EfficientNet-Lite0** (both install from package
# registries). Our numbers are therefore *not* a reproduction of the paper's numbers: section 7
# shows the paper's tables beside ours, labelled. What does carry over is the structure of the
# claims: AFL's accuracy does not depend on the partition, the number of clients or the seed
# (std exactly 0), it needs one round, and the RI process makes $\gamma$ irrelevant.
#
# Re-run with other parameters, e.g. `python -m fedlib.profiles afl_benchmark alphas=[0.01]`; see
# the page *Reproducing and re-running*.

# %% tags=["parameters"]
profile = "quick"
dataset = "fashion_mnist"        # any name of fedlib.data.DATASETS
backbone = "efficientnet_lite0"  # efficientnet_lite0 | resnet18 (needs its weights) | raw
input_size = 64                  # backbone input resolution (px)
n_train = 20000                  # stratified subset of the training split; null keeps all
n_test = 5000
device = "auto"                  # auto | cpu | cuda
num_clients = 100
alphas = [0.1, 0.05]             # NIID-1: Dirichlet label skew (the paper's CIFAR-10 values)
shards = [4, 2]                  # NIID-2: shards per client
methods = ["fedavg", "fedprox", "feddyn", "fedntd", "moon", "feddisco"]
seeds = [0, 1, 2]
rounds = 20
local_epochs = 1
batch_size = 64
lr = 0.01
participation = 1.0
gamma = 1.0                      # AFL's ridge parameter (removed by RI)
client_counts = [100, 500, 1000]  # client-number invariance (paper Fig. 1), Dirichlet alpha below
invariance_alpha = 0.1
table3_alphas = [0.005, 0.01, 0.1, 1.0]  # heterogeneity sweep, FedAvg vs AFL (paper Table 3)
gammas = [0.0, 0.1, 1.0, 10.0, 100.0]    # RI ablation (paper Table 4)
ri_clients = [100, 500, 1000]

# %%
import functools
import time
import numpy as np
import pandas as pd
import seaborn as sns
import matplotlib.pyplot as plt
import torch
from tqdm import tqdm

from fedlib import afl, paper_results
from fedlib.analytic import SufficientStats, accuracy as head_accuracy, gram_report, ridge_solve
from fedlib.data import load_dataset
from fedlib.features import BACKBONES, extract_features
from fedlib.federated import FedConfig, LinearHead, MLPHead, make_algorithm, run_federated
from fedlib.partition import make_partition, partition_report, plot_partition
from fedlib.utils import check_choice, check_positive, resolve_device

sns.set_theme(style="whitegrid")
dev = resolve_device(device)
print(f"profile={profile}, device={dev}, torch threads={torch.get_num_threads()}")

# %% [markdown]
# ## 1. Data, partitions and frozen features
#
# Every parameter is checked first (unknown method or backbone, $\alpha\le 0$, $\gamma<0$, more
# clients than samples, shards that do not divide the data...), and every partition is drawn
# from the labels, so bad input fails in seconds, before the feature extraction and training.

# %%
@functools.lru_cache(maxsize=None)
def partition(setting, k, seed):
    """Client index arrays (drawn once, then reused) for a setting ("alpha", a) / ("shards", s) / ("iid", None)."""
    kind, value = setting
    if kind == "alpha":
        return make_partition(data.y_train, k, "dirichlet", alpha=value, seed=seed)
    if kind == "shards":
        return make_partition(data.y_train, k, "shards", shards_per_client=value, seed=seed)
    return make_partition(data.y_train, k, "iid", seed=seed)


def label(setting):
    return {"alpha": f"α={setting[1]}", "shards": f"s={setting[1]}", "iid": "IID"}[setting[0]]


for method in methods:
    make_algorithm(method)
check_choice("backbone", backbone, BACKBONES)
for g in [gamma, *gammas]:
    check_positive("gamma", g, strict=False)
data = load_dataset(dataset)
data = data.subset(n_train, n_test) if (n_train or n_test) else data
settings = [("alpha", a) for a in alphas] + [("shards", s) for s in shards]
sweep = [("alpha", a) for a in table3_alphas] + [("iid", None)]
for setting in settings:
    for seed in seeds:
        partition(setting, num_clients, seed)
for k in sorted(set(client_counts) | set(ri_clients)):
    partition(("alpha", invariance_alpha), k, seeds[0])
for setting in sweep:
    partition(setting, num_clients, seeds[0])
print(f"{data.name}: {len(data.y_train)} train / {len(data.y_test)} test images; all partitions valid")

# %% [markdown]
# Every method sees the same cached embeddings: the backbone runs once per image (AFL's "one
# epoch"), and the cache makes re-running with new federated parameters take seconds.
# EfficientNet-Lite uses ReLU6, so a few channels can be zero for every image ("zero features"
# below); they carry no information, and the solver gives them weight 0 (the minimum-norm
# least-squares choice). The least-squares head is unique when the remaining Gram is invertible.

# %%
t0 = time.perf_counter()
feats = extract_features(data, backbone=backbone, input_size=input_size, device=str(dev))
feature_seconds = time.perf_counter() - t0
print(f"{feats.name}: train {feats.x_train.shape}, test {feats.x_test.shape}, {feats.num_classes} classes "
      f"({feature_seconds:.1f} s, cached after the first run)")
x_tr, y_tr = torch.from_numpy(feats.x_train), torch.from_numpy(feats.y_train)
x_te, y_te = torch.from_numpy(feats.x_test), torch.from_numpy(feats.y_test)
C = feats.num_classes

stats = SufficientStats.from_data(feats.x_train, feats.y_train, C, device=dev)
w_joint = ridge_solve(stats.gram, stats.xty)
joint_acc = head_accuracy(w_joint, feats.x_test, feats.y_test)
print("pooled Gram:", {k: f"{v:.3g}" for k, v in gram_report(stats.gram).items()})
print(f"centralized least-squares head (what AFL must reproduce): test accuracy {joint_acc:.4f}")

# %% [markdown]
# ## 2. Partitions
#
# NIID-1 is Dirichlet label skew with concentration $\alpha$ (smaller is more skewed); NIID-2
# gives each client $s$ shards of the label-sorted data. All methods share each partition.

# %%
fig, axes = plt.subplots(1, len(settings), figsize=(4 * len(settings), 4), squeeze=False)
for ax, setting in zip(axes[0], settings):
    plot_partition(partition_report(feats.y_train, partition(setting, num_clients, seeds[0]), C), ax=ax,
                   max_clients=30)
    ax.set_title(f"{label(setting)} (first 30 of {num_clients} clients)")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## 3. AFL: one round, every partition, every seed
#
# Each seed draws a new partition. Weight-invariance says the head, hence the accuracy, is the
# same for all of them and equals the centralized least-squares head.

# %%
afl_rows = []
for setting in settings:
    for seed in seeds:
        res = afl.run_afl(feats.x_train, feats.y_train, partition(setting, num_clients, seed), C, gamma=gamma,
                          device=dev)
        afl_rows.append({"setting": label(setting), "seed": seed,
                         "accuracy": head_accuracy(res.weights, feats.x_test, feats.y_test),
                         "seconds": res.client_seconds + res.server_seconds,
                         "upload MB/client": np.mean(res.upload_bytes) / 1e6,
                         "max|W - W_joint|": float((res.weights - w_joint).abs().max())})
afl_runs = pd.DataFrame(afl_rows)
afl_summary = afl_runs.groupby("setting", sort=False)["accuracy"].agg(["mean", "std"])
display(afl_summary.style.format("{:.6f}"))
print(f"largest |W_AFL - W_joint| over all runs: {afl_runs['max|W - W_joint|'].max():.2e}")

# %%
assert (afl_summary["std"] == 0).all(), "AFL's accuracy must not vary with the seed"
assert (afl_runs["accuracy"] == joint_acc).all(), "AFL must predict exactly like the centralized head"

# %% [markdown]
# ## 4. Gradient-based baselines on the same features
#
# The paper gives no baseline hyperparameters; ours are documented choices (SGD, momentum 0.9,
# weight decay 1e-5, the values below), identical for every method. FedProx $\mu=0.01$,
# FedDyn $\alpha=0.01$, FedNTD $\beta=1,\tau=1$, MOON $\mu=1,\tau=0.5$, FedDisco $a=0.5,b=0.1$
# with the KL discrepancy (the authors' defaults).
#
# *What was not run, and why.* **MOON** contrasts representations; a purely linear head on frozen
# features has none, so MOON trains a 2-layer head (1280→256→C) whose hidden layer is the
# contrasted representation (all other methods use a linear head, as AFL). **FedGen** (a
# server-side generator of latent features, distilled into the clients' heads) would apply to
# frozen features, but it is not implemented in this version: it needs a generator architecture
# and several hyperparameters that the AFL paper does not give. FedDisco, which reweights the
# aggregation by each client's label-distribution discrepancy, is the server-side method we run.

# %%
def clients_for(parts):
    return [(x_tr[p], y_tr[p]) for p in parts]


def model_fn(method):
    d = feats.dim
    return (lambda: MLPHead(d, C)) if method == "moon" else (lambda: LinearHead(d, C))


config = dict(rounds=rounds, local_epochs=local_epochs, batch_size=batch_size, lr=lr,
              participation=participation, device=str(dev))
runs, curves = [], []
jobs = [(s, m, sd) for s in settings for m in methods for sd in seeds]
for setting, method, seed in tqdm(jobs, desc="baseline runs"):
    hist = run_federated(model_fn(method), clients_for(partition(setting, num_clients, seed)), (x_te, y_te),
                         make_algorithm(method), FedConfig(seed=seed, **config), progress=False)
    runs.append({"setting": label(setting), "method": method, "seed": seed, "accuracy": hist.final_acc,
                 "best accuracy": hist.best_acc, "seconds": hist.wall_s[-1],
                 "seconds to final accuracy": hist.time_to_final(),
                 "upload MB/client": hist.bytes_up[-1] / 1e6 / num_clients})
    frame = hist.to_frame()
    frame[["setting", "method", "seed"]] = label(setting), method, seed
    curves.append(frame)
runs = pd.DataFrame(runs)
curves = pd.concat(curves, ignore_index=True)

# %%
ours = runs.groupby(["setting", "method"], sort=False)["accuracy"].agg(["mean", "std"]).mul(100)
ours = ours.unstack("method")
table = pd.DataFrame({m: [f"{ours[('mean', m)][s]:.2f} ± {ours[('std', m)][s]:.2f}" for s in ours.index]
                      for m in methods}, index=ours.index)
table["AFL"] = [f"{100 * afl_summary['mean'][s]:.2f} ± {100 * afl_summary['std'][s]:.2f}" for s in table.index]
print(f"Ours: {dataset}, {backbone}@{input_size}px, K={num_clients}, {len(seeds)} seeds, "
      f"{rounds} rounds x {local_epochs} local epochs; test accuracy (%) mean ± std")
display(table)

# %% [markdown]
# The baselines train for the profile's `rounds` x `local_epochs` (the paper: 200 rounds; our
# `quick` profile uses far fewer to fit a 2-core CPU, so their curves below may still be rising:
# their numbers are a lower bound at this budget). AFL has no such budget: its one round is final.

# %%
first = curves[curves.seed == seeds[0]]
fig, axes = plt.subplots(1, len(settings), figsize=(4.2 * len(settings), 3.6), sharey=True, squeeze=False)
for ax, setting in zip(axes[0], settings):
    sub = first[first.setting == label(setting)]
    sns.lineplot(data=sub, x="wall_s", y="test_acc", hue="method", ax=ax, legend=ax is axes[0][-1])
    afl_row = afl_runs[(afl_runs.setting == label(setting)) & (afl_runs.seed == seeds[0])].iloc[0]
    ax.scatter([afl_row["seconds"]], [afl_row["accuracy"]], marker="*", s=200, color="black", zorder=5,
               label="AFL (one round)")
    ax.set(xscale="log", xlabel="wall-clock (s, log scale)", ylabel="test accuracy", title=label(setting))
axes[0][-1].legend(loc="lower right", fontsize=8)
plt.tight_layout()
plt.show()

# %% [markdown]
# ## 5. Time and communication
#
# Wall-clock on this machine (features already cached, so the backbone's cost, identical for all
# methods, is excluded): AFL's one round (client solves + aggregation) against each baseline's
# time to reach its own final accuracy. Bytes are the measured sizes of the uploads.

# %%
cost = runs.groupby("method", sort=False)[["seconds to final accuracy", "seconds", "upload MB/client"]].mean()
afl_seconds = afl_runs["seconds"].mean()
cost.loc["AFL"] = [afl_seconds, afl_seconds, afl_runs["upload MB/client"].mean()]
cost["time ratio vs AFL"] = cost["seconds to final accuracy"] / afl_seconds
display(cost.style.format("{:.2f}"))
fedavg_time = cost.loc["fedavg", "seconds to final accuracy"]
print(f"Ours: AFL {afl_seconds:.2f} s for its final head; FedAvg {fedavg_time:.2f} s to its final accuracy "
      f"({fedavg_time / afl_seconds:.1f}x) after {rounds} rounds x {local_epochs} epoch(s).")
print(f"Paper (GPU, CIFAR-100, Fig. 2, incl. 224-px feature extraction): AFL "
      f"{paper_results.AFL_TRAINING_SECONDS['CIFAR-100']} s vs baselines "
      f"{paper_results.AFL_BASELINE_SECONDS['CIFAR-100']} s for 200 rounds.")

# %% [markdown]
# The time ratio depends on the training budget: a linear head on cached features is cheap to
# train by SGD too, so with the few rounds of the `quick` profile the baselines finish in about
# AFL's time, *at a lower accuracy*. The paper's 50-100x counts 200 rounds of 5 local epochs
# against one pass; the `paper` profile runs that budget.
#
# AFL uploads one $d\times d$ Gram matrix and one $d\times C$ head per client, once
# ($d=1280$: 13 MB in float64; half of it would do, the matrix is symmetric). A linear-head
# baseline uploads $d\cdot C$ weights per round, so its total passes AFL's after about $d$ rounds:
# AFL trades one larger message for no iterations.

# %% [markdown]
# ## 6. Client-number invariance and the RI ablation

# %%
rows = []
for k in tqdm(client_counts, desc="client counts"):
    parts = partition(("alpha", invariance_alpha), k, seeds[0])
    res = afl.run_afl(feats.x_train, feats.y_train, parts, C, gamma=gamma, device=dev)
    hist = run_federated(model_fn("fedavg"), clients_for(parts), (x_te, y_te), make_algorithm("fedavg"),
                         FedConfig(seed=seeds[0], **config), progress=False)
    rows += [{"K": k, "method": "AFL", "accuracy": head_accuracy(res.weights, feats.x_test, feats.y_test)},
             {"K": k, "method": "FedAvg", "accuracy": hist.final_acc}]
knum = pd.DataFrame(rows)
fig, ax = plt.subplots(figsize=(5, 3.5))
sns.lineplot(data=knum, x="K", y="accuracy", hue="method", marker="o", ax=ax)
ax.set(xscale="log", xlabel="number of clients K (log scale)", ylabel="test accuracy",
       title=f"α={invariance_alpha}, {dataset}")
plt.show()
display(knum.pivot(index="K", columns="method", values="accuracy"))
assert knum.query("method == 'AFL'")["accuracy"].nunique() == 1, "AFL must not depend on K"

# %%
rows = []
for k in ri_clients:
    parts = partition(("alpha", invariance_alpha), k, seeds[0])
    for g in gammas:  # one run gives both: W^r before the restoration and W after it (eq. 15)
        res = afl.run_afl(feats.x_train, feats.y_train, parts, C, gamma=g, device=dev)
        for ri_label, w in [("w/o RI", res.weights_regularized), ("w/ RI", res.weights)]:
            rows.append({"K": k, "γ": g, "RI": ri_label,
                         "accuracy (%)": 100 * head_accuracy(w, feats.x_test, feats.y_test)})
ri = pd.DataFrame(rows).pivot_table(index="K", columns=["γ", "RI"], values="accuracy (%)")
ri = ri.reindex(columns=pd.MultiIndex.from_product([gammas, ["w/o RI", "w/ RI"]], names=["γ", "RI"]))
print(f"Ours ({dataset}): accuracy (%) without / with the RI restoration (one-solve server)")
display(ri.style.format("{:.2f}"))
with_ri = ri.xs("w/ RI", axis=1, level="RI")
assert len(np.unique(with_ri.to_numpy())) == 1, "with RI the accuracy must not depend on K or gamma"
# without RI the head is a joint ridge with lambda = K*gamma: equal K*gamma, equal accuracy (paper Table 4)
no_ri = ri.xs("w/o RI", axis=1, level="RI").stack().rename("acc").reset_index()
no_ri["K·γ"] = no_ri["K"] * no_ri["γ"]
same_kgamma = no_ri.groupby("K·γ")["acc"].agg(["min", "max", "count"]).query("count > 1")
display(same_kgamma.rename(columns={"min": "min acc (%)", "max": "max acc (%)", "count": "(K, γ) cells"}))
assert same_kgamma.empty or (same_kgamma["max"] - same_kgamma["min"]).max() <= 100 / len(feats.y_test) + 1e-9, \
    "cells with the same K·gamma must agree (to one test sample)"

# %% [markdown]
# Without RI the aggregate is a joint ridge with $\lambda=K\gamma$ (checked in the derivation
# chapter), so accuracy depends on $K\gamma$ only (the table above groups the cells with equal
# $K\gamma$; the paper's Table 4 shows the same pattern) and drops as it grows; with RI every cell is the
# least-squares accuracy. At $\gamma=0$ the one-solve server is exact for every $K$: since
# $C_k\,X_k^{+}Y_k = X_k^\top Y_k$ even for rank-deficient clients, the sum of the uploads is
# the pooled statistics. The paper's $\gamma=0$ collapse at $K=500$ and $1000$ (Table 4: 1.11 %
# and 0.75 %) comes from the recursive form, which inverts each singular $C_k$; the derivation
# chapter reproduces that breakdown on dummy data (Table 1).

# %% [markdown]
# ## 7. The paper's tables beside ours
#
# **The paper's numbers are on CIFAR-10/100 and Tiny-ImageNet with a frozen ImageNet ResNet-18;
# ours are on Fashion-MNIST with a frozen EfficientNet-Lite0.** Compare patterns (AFL flat across
# settings, baselines dropping with heterogeneity), not values.

# %%
print("Paper, Table 2 (accuracy %, K=100, mean over 3 runs; AFL std 0.00):")
display(paper_results.afl_table2())
print(f"Ours, same protocol on {dataset} (accuracy %, K={num_clients}, mean ± std over {len(seeds)} seeds):")
display(table)

# %%
rows = []
for setting in tqdm(sweep, desc="heterogeneity sweep"):
    parts = partition(setting, num_clients, seeds[0])
    hist = run_federated(model_fn("fedavg"), clients_for(parts), (x_te, y_te), make_algorithm("fedavg"),
                         FedConfig(seed=seeds[0], **config), progress=False)
    res = afl.run_afl(feats.x_train, feats.y_train, parts, C, gamma=gamma, device=dev)
    rows.append({"setting": label(setting), "FedAvg": 100 * hist.final_acc,
                 "AFL": 100 * head_accuracy(res.weights, feats.x_test, feats.y_test)})
table3 = pd.DataFrame(rows).set_index("setting").T
print("Paper, Table 3 (CIFAR-100, K=100, accuracy %):")
display(paper_results.afl_table3())
print(f"Ours ({dataset}, K={num_clients}, seed {seeds[0]}, accuracy %):")
display(table3.style.format("{:.2f}"))
assert table3.loc["AFL"].nunique() == 1

# %%
print("Paper, Table 4 (CIFAR-100 inferred, α=0.1, accuracy %):")
display(paper_results.afl_table4())
print(f"Ours ({dataset}, α={invariance_alpha}, accuracy %):")
display(ri.style.format("{:.2f}"))

# %% [markdown]
# ## Exercises
#
# 1. **Heterogeneity.** Re-run with `alphas=[0.01]` and `shards=[1]`. Predict AFL's accuracy
#    before running, then compare FedAvg's drop with the paper's Table 3.
# 2. **More clients than the data can carry.** Set `client_counts=[100, 1000, 5000]`. What happens
#    to AFL, to FedAvg, and to the no-RI column of the ablation at $\gamma=1$?
# 3. **A better backbone.** Change `input_size` to 96. Which numbers move, and which do not?
#
# ```{admonition} Solutions
# :class: dropdown
# 1. AFL's accuracy is exactly the centralized least-squares accuracy of section 1, for any
#    partition. FedAvg loses accuracy as the skew grows (fewer classes per client); with `s=1`
#    each client holds about one class, the hardest case.
# 2. AFL is unchanged (every client, even an empty one, contributes its exact statistics).
#    FedAvg degrades further (less data per client, client drift). Without RI the penalty is
#    $K\gamma=5000$, a strong ridge, so that column drops.
# 3. Features improve (the notes on offline data report a linear probe at 0.81 → 0.84 from 64 to
#    96 px), so every method's accuracy moves; AFL's invariances (std 0, flat in $K$, flat in
#    $\gamma$ with RI) do not. The feature cache is keyed by input size, so the first run
#    extracts features again (minutes on a CPU).
# ```
