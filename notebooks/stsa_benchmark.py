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
# # STSA / STSA-E: class-incremental benchmark
#
# ```{include} /book/generated/findings/stsa_benchmark.md
# ```
#
# The protocol of the paper {cite:p}`guan2025stsa` (Sec. 4.1), on data that installs offline: $T$ tasks of disjoint
# classes in a seeded order, $K$ clients, a Dirichlet($\beta$) label-skew partition redrawn for
# every task ({term}`Dirichlet concentration` $\beta$), accuracy on all classes seen after each {term}`stage`. Two stage-1 backbones, as in the paper:
#
# * **pretrained** (the paper's ViT-B/16 setting): a frozen ImageNet EfficientNet-Lite0 (1280-d,
#   the foundation's backbone; the ViT and its adapter cannot be downloaded here);
# * **scratch** (the paper's ResNet-18 setting): a small CIFAR-style ResNet trained by FedAvg on
#   task 1 only, then frozen.
#
# Methods: STSA ({eq}`stsa-eq-temporal` of the derivation chapter), STSA-E ({eq}`stsa-eq-ghat` of the derivation chapter, the paper's eq. 9 as printed, global $K$), STSA-E with the per-class $K_i$ of the
# derivation chapter, AFL applied stage by stage (no temporal aggregation; each client regularizes
# with $\gamma/K$ so the aggregate carries the same total $\gamma$ as STSA, like for like), the
# gradient baselines Finetune, FedEWC and FedLwF trained through the same protocol, and **Joint**:
# centralized ridge on all training data seen so far, with the same random features and $\gamma$
# (the upper bound of an analytic head; no federation).
#
# **What the gradient baselines are here.** In the pretrained setting they train a **linear head
# (with bias) on the same frozen backbone features**, by FedAvg, nothing else: the paper's
# baselines fine-tune a ViT with prompts / adapters / LoRA or a whole ResNet. In the scratch setting
# Finetune and FedLwF train the small ResNet end to end.
#
# **Our datasets are stand-ins** (Fashion-MNIST, MNIST-5k for CIFAR-100, Tiny-ImageNet, ImageNet-R):
# the paper's numbers are shown beside ours, labelled, never as reproduced. Spreads are sample
# standard deviations over seeds (`fedlib.evaluation.stats`); comparisons are paired differences over seeds
# (the runs of one seed share the class order, the partitions and the random features) with 95 %
# t-intervals.
#
# Not implemented: MFCL, LANDER, TARGET (data-free generator replay: a generator per stage on the
# server, far beyond a CPU budget and with many unstated settings), and the PEFT baselines Fed-DualP,
# Fed-CODAP, Fed-CPrompt and PILoRA (they need a pretrained ViT, which cannot be obtained offline).

# %% tags=["parameters"]
profile = "quick"          # set by the runner; recorded for the reader
datasets = ["fashion_mnist", "mnist5k"]
subsets = {"fashion_mnist": [20000, 5000]}   # a stratified subset drawn first (the AFL chapter's paper subset) ...
n_train = 6000             # ... then the stratified subset the experiments use (null keeps all of the first)
n_test = 2000
backbone = "efficientnet_lite0"
input_size = 64
device = "cpu"
num_tasks = 5
num_clients = 5
betas = [1.0, 0.5, 0.1]
seeds = [0, 1, 2, 3, 4]    # every table: mean ± sample std over these seeds, paired differences by seed
M = 1000                   # random features (pretrained backbone: d is 1280)
M_scratch = 1000           # random features on the scratch backbone's 32-d features
gamma = 1000.0             # ridge coefficient (absolute; see the gamma sweep)
num_dummy = 10             # K_D for STSA-E
head = "argmax"            # argmax (paper) | cosine (authors' code)
baselines = ["finetune", "fedewc", "fedlwf"]
baseline_hparams = {"fedewc": {"lam": 10.0}, "fedlwf": {"lam": 10.0}}   # our choices (the paper gives none)
baseline_seeds = [0, 1, 2, 3, 4]   # seeds of the gradient baselines (a subset of seeds)
rounds_per_task = 5        # gradient baselines: FedAvg rounds per stage
converge_pp = 0.5          # convergence rule: a baseline's mean last-task curve moves < this (pp) over its last 20 % of rounds
local_epochs = 1
lr = 0.01
scratch = True             # run the from-scratch setting
scratch_dataset = "fashion_mnist"
scratch_seeds = [0, 1, 2]  # fewer than 5: every (beta, seed) trains its own stage-1 backbone (CPU cost)
scratch_rounds = 8         # stage-1 FedAvg rounds (scratch backbone)
scratch_widths = [8, 16, 32]
scratch_baselines = ["finetune", "fedlwf"]   # trained end to end through all stages (beta 0.5, one seed: cost)
scratch_baseline_rounds = 3
ablation_M = [1280, 1000, 2000]
ablation_M_scratch = [32, 250, 1000, 2000]
ablation_K = [5, 10, 25]            # clients; STSA-E keeps K times K_D fixed (next line)
ablation_clients_total = 250        # the paper's Fig. 6 (ResNet): K times K_D is 250
ablation_dummy = [1, 5, 25, 50]
ablation_gamma = [1.0, 1000.0, 1e5]
noise_grid = [[0.1, 0.1], [0.1, 1.0], [0.1, 5.0], [0.2, 0.05]]
noise_seeds = [0, 1, 2, 3, 4]
skew_scale = 0.2           # feature skew: client shifts in units of the feature std; 0 means label skew only
first_task_classes = 4     # large-first-task variant: a base task of this many classes
later_task_classes = 2     # then tasks of this many classes
num_threads = 1            # torch threads; 1 costs the least CPU (the book runs two chapters side by side)
workers = None             # processes running the pretrained table's seeds (forked, one thread each); null: the cores

# %% tags=["hide-input"]
import time

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
import torch

from myst_nb import glue
from IPython.display import Markdown

from fedlib.evaluation import claims
from fedlib.evaluation.records import differences, load_record, record_source
from fedlib.evaluation.stats import seeds_for_power

from fedlib.stsa import tables as paper_results

from fedlib.stsa import studies as stsa_studies
from fedlib.core.devices import resolve_device
from fedlib.core.parallel import resolve_workers
from fedlib.evaluation.report import paired_table, stacked
from fedlib.runner import specs

specs.check("stsa_benchmark", globals())   # every parameter is checked before any long work
# the pretrained table's seeds go to `workers` forked processes (1 on an accelerator); every run is seeded by
# its seed, so the results are those of one process (tests/stsa/test_stsa_chapters.py)
workers = resolve_workers(workers, resolve_device(device))
from fedlib.evaluation.style import book_style, captioned, facet_size, fit_column, human, method_colour, method_hue, named
book_style()   # the book's figure theme and table number style
torch.set_num_threads(num_threads)

names = datasets + ([scratch_dataset] if scratch else [])
data = stsa_studies.benchmark_data(names, subsets, n_train, n_test, num_tasks)
for name in names:  # every dataset's classes divide into num_tasks tasks (checked)
    print(f"{name}: {len(data[name].y_train)} train / {len(data[name].y_test)} test images, "
          f"{len(data[name].classes)} classes, {num_tasks} tasks")

# %% [markdown]
# ## Frozen pretrained features
#
# Every image passes once through the frozen backbone; the features are cached on disk, so every
# method below (and any re-run with new federated parameters) starts from the same vectors.

# %% tags=["hide-input"]
feats = {}
for name in datasets:
    t0 = time.perf_counter()
    feats[name] = stsa_studies.benchmark_features(name, subsets, n_train, n_test, backbone=backbone,
                                          input_size=input_size, device=device)  # same draw as data[name]
    assert np.array_equal(feats[name].y_train, data[name].y_train)
    print(f"{feats[name].name}: train {feats[name].x_train.shape}, test {feats[name].x_test.shape} "
          f"({time.perf_counter() - t0:.1f} s, cached after the first run)")

# %% [markdown]
# ## The methods
#
# STSA-E's $K_D$ dummy clients need every client to hold at least $K_D$ samples of a task, so every
# method of a comparison uses the same partitions, drawn with that minimum client size.

# %% [markdown]
# :::{folded} The runs: every method on every pretrained setting, β and seed (the baselines' FedConfig and the shared random features)
# :::

# %%
# the gradient baselines' FedConfig keywords (rounds_per_task rounds per stage, lr, local_epochs, batch 64) and
# one run: run(method, features, beta, seed, setting, M, **changes) -> IncrementalResult (stsa_studies.run_fcil).
# The linear-head baselines train all clients of a round at once (batched_clients: the per-client loop's
# result up to float round-off); the analytic methods of a seed share one random-feature expansion.
fed_kwargs, run = stsa_studies.benchmark_runner(globals())

results, own_curves = [], {}
for name in datasets:  # Joint ignores the partition: one run per seed, listed under every beta
    # curves: each baseline's test accuracy after every round of the last task (the training is unchanged)
    res, curves_ = stsa_studies.pretrained_grid(run, feats[name], f"pretrained / {name}", betas, seeds, baselines,
                                                baseline_seeds, M, workers=workers, curves=True)
    results += res
    own_curves[f"pretrained / {name}"] = {str(beta): c for beta, c in curves_.items()}
    print(f"{name}: done")

# %% [markdown]
# ## The from-scratch setting
#
# A SmallResNet (widths `scratch_widths`, 32-d features) is trained by FedAvg on task 1's clients
# only, for every $\beta$ and seed, then frozen (the number of seeds here is printed below; when it is
# under 5 the reason is the CPU cost of one backbone per $\beta$ and seed); its stage-1 cost is reported separately (as the
# paper's Table 5 does). The gradient baselines train the same network end to end through all
# stages; like the backbones, their runs are cached on disk, keyed by the data, every setting and the
# source of the training code (any change re-trains them).

# %% [markdown]
# :::{folded} The scratch backbones' stage 1, and every method's A_avg, A_T and F_T by β (mean ± sample std)
# :::

# %%
stage1 = []
if scratch:
    scratch_results, stage1 = stsa_studies.scratch_grid(run, data[scratch_dataset], f"scratch / {scratch_dataset}", betas,
                                                scratch_seeds, num_tasks, num_clients, fed_kwargs, scratch_rounds,
                                                scratch_widths, M_scratch)
    results += scratch_results + stsa_studies.scratch_baseline_runs(
        scratch_baselines, data[scratch_dataset], f"scratch / {scratch_dataset}", num_tasks, num_clients, gamma,
        fed_kwargs, scratch_baseline_rounds, baseline_hparams, scratch_widths, min_size=num_dummy)
    print(pd.DataFrame(stage1).to_string(index=False))
    if len(scratch_seeds) < 5:
        print(f"scratch setting: {len(scratch_seeds)} seeds (fewer than 5 because each beta and seed trains its own "
              f"stage-1 backbone by FedAvg, the dominant CPU cost of this chapter); its spreads and paired "
              f"intervals rest on n={len(scratch_seeds)}.")
    if scratch_baselines:
        print(f"scratch end-to-end baselines ({', '.join(scratch_baselines)}): ONE seed (0) at beta=0.5, because "
              "each trains a CNN through all stages; their rows carry no std and no paired interval, "
              "and no conclusion rests on them.")

# %%
summary = pd.DataFrame([r.summary() for r in results])
table, seeds_per_method = stsa_studies.results_table(summary)
print("Ours: mean ± sample std over seeds (%), A_avg / A_T / F_T as in eqs. 60-62; seeds per method: "
      + ", ".join(f"{m}: {n}" for m, n in seeds_per_method.items()))
display(captioned(table,
                  "Pretrained setting: the gradient baselines are linear heads on the frozen features. Joint = centralized ridge on all data seen (same features and γ), one run per seed listed under every β."))

# %% [markdown]
# :::{unfold}
# :::

# %%
# the paper's final accuracies (Table 2: pretrained ViT-B/16; Table 1: ResNet-18 from scratch) and ours in one
# table, one column per beta
paper_at = pd.concat({f"{d}, {how}": t.xs("A_T", axis=1, level="metric").xs(d, level=0)
                      for t, how in ((paper_results.stsa_table2(), "pretrained ViT-B/16 (Table 2)"),
                                     (paper_results.stsa_table1(), "ResNet-18 from scratch (Table 1)"))
                      for d in t.index.get_level_values(0).unique()}, names=["data", "method"])
ours_at = table.xs("A_T", axis=1, level=-1).rename_axis(["data", "method"]).rename(index=human, level=0)
display(stacked(paper_at, ours_at, ("paper", "ours")).style.set_caption(
    f"Final accuracy A_T (%) by Dirichlet β, T = {num_tasks} tasks, K = {num_clients} clients: the paper's (mean) and "
    f"ours (mean ± sample std over the seeds). The paper's baselines are prompt and LoRA methods on a ViT; ours are "
    "linear heads on the frozen features (or CNNs from scratch): compare the gap to Joint and to STSA, not the "
    "values. — : not run."))

# %% [markdown]
# The table's $A_T$ column as a figure: mean over seeds, bars = sample standard deviation, one
# colour per Dirichlet $\beta$, one panel per setting.

# %% mystnb={"figure": {"caption": "Final accuracy A_T of each method: the point is the mean over seeds and the error bar the sample standard deviation, one colour per Dirichlet beta, one panel per setting (dataset and backbone). Compare the analytic methods with the gradient baselines, and each method across beta."}, "image": {"alt": "Point plots with error bars, one per setting: final accuracy per method, coloured by beta"}}
g = sns.catplot(data=named(summary, "method", "setting").assign(beta=summary["beta"].astype(str)), x="method", y="A_T", hue="beta", col="setting",
                kind="point", errorbar="sd", dodge=0.4 if summary["beta"].nunique() > 1 else False, linestyle="none",
                capsize=0.15, **facet_size(summary["setting"].nunique(), 1.3), sharey=False, sharex=False)
g.set_axis_labels("method", "final accuracy A_T (%)")
g.set_titles("{col_name}")
for ax in g.axes.flat:
    plt.setp(ax.get_xticklabels(), rotation=30, ha="right")
g.figure.suptitle("A_T: mean ± sample std over seeds", y=1.03, wrap=True)
plt.show()

# %% [markdown]
# With a frozen backbone STSA's head is *exactly* joint ridge (derivation chapter), so its numbers
# do not move with $\beta$ at all in the pretrained setting (up to the class order, which follows
# the seed). In the scratch setting $\beta$ acts through stage 1 only. Checked below: in the
# pretrained setting, STSA's A_T is identical across $\beta$ for every seed.

# %%
pre, spread, gap_joint = stsa_studies.exactness_check(summary)
print("max spread of STSA's A_T across beta (pretrained, per seed):", float(spread.max()))
assert spread.max() < 1e-9
print(f"largest |A_T(STSA) - A_T(Joint)| over all runs: {gap_joint:.2e} points")
assert gap_joint < 0.05, "STSA is the joint ridge head (up to argmax ties from round-off)"
claims.register(
    "stsa-exact-joint", "stsa",
    "STSA's statistics aggregation makes its head identical to joint training on all data seen, so with a fixed "
    "backbone its accuracy is invariant to the data heterogeneity.",
    holds=bool(spread.max() < 1e-9 and gap_joint < 0.05),
    evidence=f"{len(pre)} pretrained runs ({len(betas)} betas x {len(seeds)} seeds x {len(datasets)} datasets): "
             f"spread of A_T across beta {spread.max():.1e} points; largest |A_T(STSA) - A_T(Joint ridge)| "
             f"{gap_joint:.1e} points.")

# %% [markdown]
# ### Paired differences
#
# A_T of STSA minus each other method, paired by seed (same class order, partitions and random
# features within a seed), with 95 % t-intervals. A comparison is "resolved" when its interval
# excludes 0.

# %% [markdown]
# :::{folded} The paired table: A_T of STSA minus each other method, per setting and β, with 95 % t-intervals
# :::

# %%
paired = stsa_studies.paired_against(summary, "STSA", "A_T")
display(captioned(paired.drop(columns=["mean", "low", "high", "n"]).set_index(["setting", "beta", "STSA minus"]),
                  "STSA minus each method, A_T paired by seed (points, 95 % CI)"))

# %% [markdown]
# ### The margin over the gradient baselines, at a converged budget (recorded run)
#
# The paper's Table 2 claim: STSA and STSA-E beat the best baseline by over 10 % (points of accuracy)
# in A_avg and in A_T, in every case. The verdict below rests on baselines trained to convergence.
#
# :::{folded} The criteria, fixed before the run; the recorded run's table and the baselines' curves
# :::
#
# The criteria:
#
# * a baseline has **converged** when its mean (over seeds) test-accuracy curve over the rounds of
#   the **last task** (accuracy on all seen classes, so its last point is the final A_T) moves by
#   less than `converge_pp` percentage points over the last 20 % of those rounds
#   (`fedlib.evaluation.stats.plateau`);
# * a case (dataset, $\beta$, A_avg or A_T, STSA or STSA-E) **holds** when the paired 95 % interval
#   of method − baseline lies above 10 points for **every** baseline (beating the best by more than 10
#   points is beating each by more), **fails** when some baseline's interval lies below 10 points,
#   and is unresolved otherwise.
#
# The profile's `rounds_per_task` is short, so the verdict rests on a **recorded run**: the same data,
# features, partitions, hyperparameters and baseline seeds, with the baselines trained for longer,
# run once by the command in its caption and committed with the book. Where no record matches this
# run's parameters, the verdict rests on this run.

# %%
_prose = []   # the cell's sentences, shown as Markdown below (glue)
MARGIN = 10.0                                   # the paper's margin, points of A_avg / A_T
REFS = list(stsa_studies.MARGIN_METHODS)        # STSA, STSA-E
margin_seeds = [s for s in seeds if s in baseline_seeds]
if baselines and len(margin_seeds) >= 2:
    own_values = stsa_studies.margin_values(summary, REFS + baselines, margin_seeds)
    own_cells = stsa_studies.margin_comparison(own_values, REFS, baselines, MARGIN)
    own_plateaus = stsa_studies.curve_plateaus(own_curves, converge_pp)
    for setting, by_beta in own_curves.items():   # the curve is the run's own: its last point is the final A_T
        for beta, by_method in by_beta.items():
            for m, per_seed in by_method.items():
                final = own_values["A_T"][setting][beta][m]
                assert np.allclose([c[-1] for c in per_seed], final, atol=1e-6), (setting, beta, m)
    _prose.append(f"At this profile's budget ({rounds_per_task} rounds per stage): "
                     f"{stsa_studies.convergence_text(own_plateaus)}; smallest margin over the best baseline "
                     f"{own_cells.d.map(lambda d: d.mean).min():+.2f} points (paired mean).")
glue('stsa_benchmark_prose_1', Markdown("\n\n".join(_prose)), display=False)

# %% [markdown]
# ```{glue:md} stsa_benchmark_prose_1
# :format: myst
# ```

# %% mystnb={"figure": {"caption": "Test accuracy on the seen classes during the last task against the round, mean over seeds, one line per gradient baseline, one panel per setting (row) and beta (column); the dashed line is STSA's final accuracy A_T. The end of each curve is that baseline's A_T, so its distance to the dashed line is the margin the claim tests; a curve still rising has not converged."}, "image": {"alt": "Grid of line charts by setting and beta: baseline test accuracy against round of the last task, with a dashed line for STSA"}}
_prose = []   # the cell's sentences, shown as Markdown below (glue)
RECORD_KEYS = ["datasets", "subsets", "n_train", "n_test", "backbone", "input_size", "num_tasks", "num_clients",
               "betas", "baseline_seeds", "M", "gamma", "num_dummy", "head", "baselines", "baseline_hparams",
               "local_epochs", "lr"]
record = load_record("stsa_converged", missing_ok=True)
mismatch = differences(record, globals(), RECORD_KEYS)
if baselines and len(margin_seeds) >= 2:
    _prose.append(record_source(record, mismatch, f"this profile's own {rounds_per_task} rounds per stage"))
if baselines and len(margin_seeds) >= 2 and mismatch:   # the verdict rests on this run
    values, cells, plateaus, budget_rounds, rec_name = own_values, own_cells, own_plateaus, rounds_per_task, None
    curves_shown = own_curves
elif baselines and len(margin_seeds) >= 2:
    res = record["results"]
    values = {k: res[k] for k in stsa_studies.MARGIN_METRICS}
    cells = stsa_studies.margin_comparison(values, REFS, baselines, MARGIN)
    plateaus = stsa_studies.curve_plateaus(res["curves"], converge_pp)
    budget_rounds, rec_name, curves_shown = record["parameters"]["rounds_per_task"], record["name"], res["curves"]
if baselines and len(margin_seeds) >= 2:
    display(stsa_studies.margin_table(values, cells, REFS, baselines).style.set_caption(
        f"Ours ({', '.join(map(human, datasets))}, pretrained features, {len(margin_seeds)} seeds, baselines trained "
        f"{budget_rounds} rounds per stage): A_avg and A_T (%) mean ± sample std; method − best baseline "
        f"(highest mean), paired by seed, 95 % CI (points)"))
    settings_ = list(curves_shown)
    fig, axes = plt.subplots(len(settings_), len(betas), figsize=fit_column(max(5.0, 3.6 * len(betas)), 3.0 * len(settings_)),
                             sharex=True, squeeze=False)
    for i, setting in enumerate(settings_):
        for j, beta in enumerate(betas):
            ax = axes[i][j]
            for m in baselines:
                mean_curve = np.mean(curves_shown[setting][str(beta)][m], axis=0)
                ax.plot(np.arange(1, len(mean_curve) + 1), mean_curve, lw=1.2, label=human(m), color=method_colour(m, "stsa"),
                        marker="o" if len(mean_curve) < 10 else None)
            ax.axhline(np.mean(values["A_T"][setting][str(beta)]["STSA"]), color="black", ls="--", lw=1, label="STSA (A_T)")
            ax.set_title(f"{human(setting.split(' / ')[-1])}, β = {beta}")
    axes[0][-1].legend(fontsize=7, loc="center right")
    fig.supxlabel("round of the last task")
    fig.supylabel("test accuracy on the seen classes (%)")
    fig.suptitle(f"Gradient baselines during the last task (mean over {len(margin_seeds)} seeds; the end is A_T)", y=1.0, wrap=True)
    plt.tight_layout()
    plt.show()
glue('stsa_benchmark_prose_2', Markdown("\n\n".join(_prose)), display=False)

# %% [markdown]
# ```{glue:md} stsa_benchmark_prose_2
# :format: myst
# ```

# %% [markdown]
# :::{unfold}
# :::

# %%
if baselines and len(margin_seeds) >= 2:
    converged = bool(plateaus.plateau.map(lambda q: q.converged).all())
    above, below = bool(cells.above.all()), cells[cells.below]
    short = cells.loc[cells.d.map(lambda d: d.mean).idxmin()]
    lowest = cells.loc[cells.low.idxmin()]
    cell_name = lambda c: f"{c.method} − {c.best}, {c.metric}, {c.setting.split(' / ')[-1]} beta={c.beta}"  # noqa: E731
    unresolved = cells[~cells.above & ~cells.below]
    ran = ["stsa", "stsa-e", *baselines]
    rules_out = None
    if not converged or (not above and below.empty):
        rules_out = (f"the 95 % intervals rule out, in every case, a margin over any baseline below {lowest.low:+.2f} "
                     f"points (the smallest lower bound: {cell_name(lowest)})")
        if not converged:
            rules_out = f"at this unconverged budget, {rules_out}"
        for _, c in unresolved.head(3).iterrows():   # the cases left open, and the seeds that would close them
            n_more = seeds_for_power(c.d.mean - MARGIN, c.d.std) if c.d.std > 0 else None
            rules_out += (f"; {cell_name(c)}: {c.d.format(2)} points"
                          + (f", {n_more} paired seeds would resolve the 10-point threshold at this spread"
                             if n_more and n_more > c.d.n else ""))
    claims.register(
        "stsa-beats-baselines", "stsa",
        "STSA and STSA-E beat the best baseline by over 10 % in A_avg and A_T in all cases (Table 2, pretrained).",
        holds=above if below.empty else False, inconclusive=(not converged) or (not above and below.empty),
        evidence=f"{len(cells)} cases ({len(datasets)} dataset(s) x {len(betas)} beta(s) x A_avg, A_T x STSA, STSA-E), "
                 f"{len(margin_seeds)} paired seeds, baselines {', '.join(baselines)} at {budget_rounds} rounds per "
                 f"stage: {int(cells.above.sum())} cases resolved above 10 points against every baseline, "
                 f"{len(below)} with a baseline's interval below 10 points; smallest margin over the best baseline "
                 f"{cell_name(short)} {short.d.format(2)} points",
        key=f"STSA/STSA-E − best baseline ≥ {short.d.mean:+.1f} points (lowest 95 % bound {lowest.low:+.1f}) at "
            f"{budget_rounds} rounds per stage",
        condition=(f"the baselines are the {len(baselines)} that ran ({', '.join(baselines)}): linear heads on the same "
                   "frozen EfficientNet-Lite0 features of our stand-in data, in place of the paper's ViT PEFT baselines "
                   "(Fed-DualP, Fed-CODAP, Fed-CPrompt, PILoRA), which are not implemented") if above and converged else None,
        rules_out=rules_out,
        methods=["stsa", "stsa-e", "finetune", "fedewc", "fedlwf", "fed-dualp", "fed-codap", "fed-cprompt", "pilora"],
        ran=ran,
        budget=f"{budget_rounds} FedAvg rounds per stage x {local_epochs} local epoch(s), {num_tasks} stages, "
               f"{len(margin_seeds)} seeds, {', '.join(datasets)}" + (" (recorded run)" if rec_name else ""),
        convergence=stsa_studies.convergence_text(plateaus), converged=converged, record=rec_name)

# %% [markdown]
# ## The paper's tables beside ours
#
# The paper's Table 2 (pretrained ViT-B/16 on CIFAR-100 and ImageNet-R) and Table 1 (ResNet-18 from
# scratch on CIFAR-100 and Tiny-ImageNet) are **the paper's numbers on the paper's datasets**. Ours
# are on Fashion-MNIST / MNIST-5k with a different backbone: compare the pattern (ranking, spread
# across $\beta$, forgetting), not the values.

# %% [markdown]
# :::{folded} The paper's Table 2 (pretrained ViT-B/16) and Table 1 (ResNet-18 from scratch): its numbers on its datasets
# :::

# %%
display(paper_results.stsa_table2().style.format("{:.2f}", na_rep="—").set_caption(
    "Paper, Table 2 (pretrained ViT-B/16, T = 10, K = 5): A_avg, A_T and F_T (%) by β, the paper's numbers"))
display(paper_results.stsa_table1().style.format("{:.2f}", na_rep="—").set_caption(
    "Paper, Table 1 (ResNet-18 from scratch, T = 10, K = 5): A_avg, A_T and F_T (%) by β, the paper's numbers"))

# %% [markdown]
# ## Accuracy after each stage ($A_t$)

# %% mystnb={"figure": {"caption": "Mean accuracy over the tasks seen so far, A_t, after each stage for every method at the middle Dirichlet beta, mean over seeds with sample-standard-deviation bands, one panel per setting. Compare how each method's accuracy falls as tasks are added."}, "image": {"alt": "Line charts, one per setting: accuracy over seen tasks against stage for each method"}}
curves = pd.concat([r.curve() for r in results], ignore_index=True)
mid = sorted(betas)[len(betas) // 2]
plot = curves[curves.beta == mid]
g = sns.relplot(data=plot, x="stage", y="A_t", hue="method", **method_hue(plot["method"], "stsa"), col="setting",
                kind="line", marker="o",
                errorbar="sd", **facet_size(plot["setting"].nunique(), 1.1), facet_kws={"sharey": False})
g.set_axis_labels("stage t (tasks seen)", "A_t: mean accuracy over seen tasks (%)")
g.figure.suptitle(f"Accuracy after each stage, beta = {mid} (mean ± sd over seeds)", y=1.03, wrap=True)
plt.show()

# %% [markdown]
# ## Cost: communication and wall-clock, measured
#
# Upload bytes are the measured sizes of every message (float64 here; the paper counts float32);
# seconds are the learner's own time on this CPU (statistics, solves, local training), evaluation
# excluded; the random-feature expansion, computed once per seed and shared by the analytic methods,
# is charged to every run at its measured seconds per training row. Stage 1 of the scratch setting
# (training the backbone) is listed separately; the paper's Table 5 also reports only the cost after
# stage 1.

# %% [markdown]
# :::{folded} Upload (MiB) and learner seconds per run for every setting and method, the scratch backbone's stage 1, and the paper's Table 5
# :::

# %%
cost = (summary.groupby(["setting", "method"])[["MiB_up", "wall_s"]].mean()
        .rename(columns={"MiB_up": "upload per run, all clients (MiB)", "wall_s": "learner seconds per run"}))
display(captioned(cost.style.format("{:.2f}", na_rep="—"), "Cost per run, mean over seeds: total upload and learner time"))
if stage1:
    s1 = pd.DataFrame(stage1)
    print(f"scratch stage 1 (FedAvg, {scratch_rounds} rounds): {s1.bytes_up.mean() / 2**20:.1f} MiB up, "
          f"{s1.wall_s.mean():.1f} s, task-1 test accuracy {100 * s1.task1_test_acc.mean():.1f} % (mean over runs)")
display(captioned(paper_results.stsa_table5(),
                  "Paper, Table 5 (per client, after stage 1; RTX 3090) - the paper's numbers"))

# %% [markdown]
# ## Ablations (pretrained features, first dataset, $\beta=0.5$, first seed)
#
# **One seed per point**: these sweeps show the shape of each dependence and carry no conclusion
# beyond the exact invariance asserted below (which holds run by run, not on average).
#
# :::{folded} The sweeps of M, K, K_D and γ (one seed per point), and STSA's invariance to K (asserted)
# :::
#
# * **M** (paper Figs. 5/8): raw features ($M=d$) against random expansions; also on the scratch
#   backbone's 32-d features, where the expansion matters more.
# * **K** (paper Fig. 6 top): STSA is exactly invariant to $K$ with a fixed backbone; STSA-E with
#   $K\cdot K_D = 250$.
# * **$K_D$** (paper Figs. 6 bottom / 9): STSA-E approaches STSA as $K_D$ grows.
# * **$\gamma$**: the statistics are unnormalized sums, so $\gamma$'s scale depends on $n$ and $M$.

# %%
abl_name, abl_beta, abl_seed = datasets[0], 0.5, seeds[0]
f0 = feats[abl_name]
scratch_abl = None
if scratch:   # the scratch backbone of (abl_beta, abl_seed), its random-feature widths
    stream0, f_s, _ = stsa_studies.scratch_features(data[scratch_dataset], num_tasks, num_clients, abl_beta, abl_seed,
                                            fed_kwargs, scratch_rounds, scratch_widths)
    scratch_abl = (stream0, f_s, ablation_M_scratch)
ablation = stsa_studies.ablation_runs(run, f0, abl_beta, abl_seed, M, ablation_M, ablation_K, ablation_clients_total,
                              ablation_dummy, ablation_gamma, scratch=scratch_abl)

# %% mystnb={"figure": {"caption": "Final accuracy A_T against each ablated parameter (log scale), one panel per ablation (random-feature width M, number of clients K with K times K_D fixed, dummy clients K_D, ridge parameter gamma) and one line per method; one seed per point. Only STSA's flat line across K is a result (exact invariance, asserted); the other shapes carry no conclusion."}, "image": {"alt": "Line charts, one per ablation: final accuracy against the parameter value on a log scale for the STSA variants"}}
g = sns.relplot(data=ablation, x="value", y="A_T", hue="method", **method_hue(ablation["method"], "stsa"), col="ablation",
                kind="line", marker="o",
                **facet_size(min(3, ablation["ablation"].nunique()), 1.0), facet_kws={"sharex": False, "sharey": False},
                col_wrap=3)
for ax in g.axes.flat:
    ax.set_xscale("log")
g.set_axis_labels("value (log scale)", "final accuracy A_T (%)")
g.figure.suptitle(f"Ablations (one seed, no conclusion): {human(abl_name)}, β = {abl_beta}, seed {abl_seed}", y=1.03, wrap=True)
plt.show()
k_rows = ablation[(ablation.ablation == "K (K·K_D fixed)") & (ablation.method == "STSA")]
print("STSA A_T across K:", k_rows.A_T.round(4).tolist())
assert k_rows.A_T.max() - k_rows.A_T.min() < 1e-9, "STSA is invariant to the number of clients"

# %% [markdown]
# ## Upload noise (Table 7 of the paper's earlier version)
#
# $q\cdot\mathcal N(0,s^2)$ added to the uploads: STSA on $G$ and $C$; STSA-E1 on the class sums,
# STSA-E2 on the counts, STSA-E3 on both. The statistics are unnormalized sums, so the same $(q,s)$
# is a much smaller perturbation for large clients than for small ones; the paper's grid is used as is.
# The server uses the noisy counts as real numbers (a count below 0.5 is read as an empty client).
# Rounding them to integers would erase count noise of sd $q s\ll0.5$ exactly (most of the paper's
# grid), making STSA-E2's column a copy of "Original": that variant is shown separately, labelled
# "counts rounded". Pretrained features, first dataset, $\beta=0.5$, seeds `noise_seeds`.

# %%
# the noise is q * s * N(0, 1) from each client's own stream (seed, stage, client): equal q*s, same run
noise_runs, grams = stsa_studies.noise_study(run, f0, abl_beta, noise_seeds, M, noise_grid)
# A_T table; how far the noise moves the server's Gram (first seed); paired changes for sd q*s <= 0.1
noise, moved, changes = stsa_studies.noise_tables(noise_runs, grams, noise_grid, noise_seeds[0])
display(captioned(noise,
                  f"Ours: A_T (%) with upload noise, {human(abl_name)}, pretrained, β = {abl_beta}, mean ± sample std over {len(noise_seeds)} seeds"))
display(captioned(moved.style.format("{:.1e}", na_rep="—"),
                  f"relative change of the server's Gram matrix (seed {noise_seeds[0]})"))
e2 = moved[("||G_noisy - G|| / ||G||", "STSA-E2")]
assert (e2 > 0).all(), "noisy counts reach the Gram estimate at every grid point"

# %%
drop = changes["max |change|"].max() if len(changes) else 0.0
mean_drop = max((abs(d.mean) for d in changes.d if d is not None), default=drop)
ds_ = [d for d in changes.d if d is not None]
# criterion fixed before the run: "barely changes" = every paired 95 % CI of noisy - clean inside (-1, +1) point
ci_bound = max((max(abs(d.low), abs(d.high)) for d in ds_), default=float("nan"))
robust, fragile = bool(ds_) and ci_bound < 1.0, any(d.low > 1.0 or d.high < -1.0 for d in ds_)
print(f"largest change of A_T for noise sd q*s <= 0.1: {drop:.2f} points in one run, {mean_drop:.2f} points "
      f"as a paired mean over seeds; largest 95 % CI bound {ci_bound:.2f} points")
display(captioned(changes.assign(d=changes.d.map(lambda d: "—" if d is None or pd.isna(d) else str(d)))
        .rename(columns={"d": "noisy - clean, paired (points)"}),
                  "Change of A_T with noise on the uploads, paired with the clean run (points, 95 % CI)"))
display(captioned(paper_results.stsa_table7(), "Paper, Table 7 (CIFAR-100, β = 0.5): the paper's numbers"))
claims.register(
    "stsa-noise-robust", "stsa",
    "The paper's earlier version, Table 7 (App. E.2): small Gaussian noise on the uploaded statistics barely changes "
    "the accuracy of STSA and STSA-E.",
    holds=robust if (robust or fragile) else None, inconclusive=not (robust or fragile),
    evidence=f"{human(abl_name)}, pretrained, β = {abl_beta}, {len(noise_seeds)} seeds: at noise sd q*s <= 0.1 every paired "
             f"95 % CI of the change of A_T lies within ±{ci_bound:.2f} points (criterion: within ±1 point; largest "
             f"paired mean {mean_drop:.2f}, {drop:.2f} in a single run), while the count noise moves STSA-E's Gram by "
             f"{e2.min():.1e}-{e2.max():.1e} (relative; counts used unrounded).",
    key=f"A_T change within ±{ci_bound:.2f} points (95 % CI)",
    rules_out=None if (robust or fragile) else
    f"the intervals reach {ci_bound:.2f} points: they rule out changes beyond that, not beyond 1 point")

# %% [markdown]
# ## Feature skew: outside STSA-E's assumption
#
# STSA-E's unbiasedness (Prop. 3.1) assumes label skew only. Here every client's features carry
# its own shift $\delta_k$ (`skew_scale` times the feature std per dimension; the test samples carry
# the shift of a uniformly drawn client), pretrained features, first dataset, $\beta=0.5$. The
# derivation chapter shows that $\hat G$ then overestimates the within-class scatter. Paired by
# seed: the effect of the shifts on each method, and STSA-E minus STSA with and without them.

# %%
skew_runs = stsa_studies.skew_grid(run, f0, abl_beta, seeds, M, skew_scale)
skew_table, eff = paired_table(skew_runs, [0.0, skew_scale], "STSA", "STSA-E (per-class K)")
display(captioned(skew_table, f"A_T (%) with feature shifts, {human(abl_name)}, {len(seeds)} seeds (mean ± sample std; "
                              "paired differences with their 95 % CI)"))
glue("stsa_bench_skew_effect_stsa", Markdown(str(eff["STSA"])), display=False)
glue("stsa_bench_skew_effect_stsae", Markdown(str(eff["STSA-E (per-class K)"])), display=False)

# %% [markdown]
# Effect of the shifts on each method (skewed − unskewed, paired by seed, in points): STSA
# {glue:md}`stsa_bench_skew_effect_stsa`; STSA-E {glue:md}`stsa_bench_skew_effect_stsae`.

# %% [markdown]
# ## Large first task (paper Table 4)
#
# A base task of `first_task_classes` classes, then tasks of `later_task_classes` classes (the paper:
# 50 + 10 x 5 on CIFAR-100). Pretrained features, first dataset, $\beta=0.5$.

# %% [markdown]
# :::{folded} A_T after a large first task: ours, and the paper's Table 4
# :::

# %%
large = stsa_studies.large_first_task(run, f0, abl_beta, seeds, M, first_task_classes, later_task_classes,
                              ["STSA", "STSA-E"] + [b for b in baselines if b == "fedlwf"])
display(captioned(large,
                  f"Ours: {human(abl_name)}, {first_task_classes} classes then {later_task_classes} per task, β = {abl_beta}; mean ± sample std over {len(seeds)} seeds"))
display(captioned(paper_results.stsa_table4(), "Paper, Table 4 (CIFAR-100, 50 + 10 x 5) - the paper's numbers"))

# %% [markdown]
# ## Reading the results
#
# Every sentence below is generated from the tables above (or backed by an assertion).

# %%
_prose = []   # the cell's sentences, shown as Markdown below (glue)
fnd = stsa_studies.benchmark_findings(summary, paired, baselines)
kmode_gap, e_vs, afl_vs, ft_mean, stsa_ft = (fnd[k] for k in ["kmode_gap", "e_vs", "afl_vs", "ft_mean", "stsa_ft"])
lines = [
    f"* **Exactness.** With the frozen pretrained backbone STSA's A_T is the same for every beta (spread "
    f"{spread.max():.1e} points) and equals Joint ridge on all data seen (largest gap {gap_joint:.1e} points).",
    f"* **STSA-E** is below STSA by {e_vs['mean'].min():.2f} to {e_vs['mean'].max():.2f} points of A_T in the "
    f"pretrained cells (paired means; intervals in the paired table). The printed global K and the per-class "
    f"K_i differ by at most {kmode_gap:.2f} points of A_T over all runs.",
    f"* **AFL stage-wise** (same total gamma) is below STSA by {afl_vs['mean'].min():.2f} to "
    f"{afl_vs['mean'].max():.2f} points: each task's head is fitted without the other tasks' data.",
]
if len(ft_mean):
    lines.append("* **Forgetting.** Mean F_T: STSA " + f"{stsa_ft:.2f}; " + "; ".join(
        f"{m} {v:.2f}" for m, v in ft_mean.items()) + " (gradient baselines: linear heads on the frozen features "
        "in the pretrained setting).")
lines.append("* Absolute numbers are not comparable with the paper's: different data, backbones, scale and hardware.")
_prose.append("\n".join(lines))
glue('stsa_benchmark_prose_4', Markdown("\n\n".join(_prose)), display=False)

# %% [markdown]
# ```{glue:md} stsa_benchmark_prose_4
# :format: myst
# ```

# %% [markdown]
# ## Exercises
#
# Re-run with `make run NB=stsa_benchmark ARGS="..."`. The self-check line under an exercise
# compares this run's measurement with the prediction (`fedlib.evaluation.selfcheck`).
#
# :::{folded} The exercises, with their solutions and the self-checks of this run
# :::
#
# ```{exercise} Heterogeneity
# :label: stsa-bench-ex-heterogeneity
#
# Run `make run NB=stsa_benchmark ARGS="betas=[0.05] baselines=[] scratch=False"`. Which numbers
# change relative to $\beta=0.1$, and which cannot?
# ```
#
# ````{solution} stsa-bench-ex-heterogeneity
# :class: dropdown
#
# STSA (and the AFL stage-wise head) with the pretrained backbone cannot change: their heads are
# exact functions of the pooled data. STSA-E changes through which clients hold which class; the
# baselines change through client drift; in the scratch setting everything changes through stage 1.
# ````

# %%
from fedlib.stsa import selfcheck

selfcheck.stsa_beta_invariance(spread, gap_joint)

# %% [markdown]
# ```{exercise} Random features
# :label: stsa-bench-ex-random-features
#
# In the M ablation, why does the expansion help the 32-d scratch features more than the 1280-d
# pretrained ones? Compare the rows of the M ablation; the self-check measures the two gains.
# ```
#
# ````{solution} stsa-bench-ex-random-features
# :class: dropdown
#
# A linear head on $d$ features separates at most what is linearly separable in $\mathbb R^d$; with
# $d=32$ that is little, while 1280 generic ImageNet features already separate 10 classes well. ReLU
# random features act like a kernel expansion (RanPAC, Cover's theorem).
# ````

# %%
if scratch:
    print(selfcheck.stsa_random_features(ablation, {"M (scratch)": f_s.x_train.shape[1], "M (pretrained)": f0.x_train.shape[1]}))
else:
    print("self-check needs the scratch setting (scratch=True)")

# %% [markdown]
# ```{exercise} Communication
# :label: stsa-bench-ex-communication
#
# From the cost table, at which $M$ would STSA's upload exceed FedLwF's in this setting? Use
# `fedlib.stsa.studies.upload_floats` and the baseline's measured bytes. Count with
# {eq}`stsa-eq-upload` of the derivation chapter. Fill in your $M$ below: the self-check compares it
# with the crossing computed from this run's measured bytes.
# ```
#
# ````{solution} stsa-bench-ex-communication
# :class: dropdown
#
# STSA uploads $(M+c_t)M$ floats per client and stage, quadratic in $M$; a linear head's FedAvg
# upload is $(d+1)C$ floats per round, times rounds. Equate the two totals and solve for $M$.
# ````

# %%
my_M = None  # your answer: the smallest M at which STSA's upload exceeds FedLwF's in this setting
setting0 = f"pretrained / {datasets[0]}"
other = "fedlwf" if "fedlwf" in baselines else (baselines[0] if baselines else None)
if other is None:
    print("self-check needs a gradient baseline (baselines)")
else:
    if other != "fedlwf":
        print(f"FedLwF was not run (baselines={baselines}): the self-check uses {other} instead")
    mib = cost["upload per run, all clients (MiB)"]
    print(selfcheck.stsa_upload_crossing(my_M, mib[setting0, other], mib[setting0, "STSA"], M,
                                         len(np.unique(feats[datasets[0]].y_train)) // num_tasks))
