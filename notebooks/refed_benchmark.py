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
# # Re-Fed: replay selection in federated incremental learning, benchmarked
#
# ```{include} /book/generated/findings/refed_benchmark.md
# ```
#
# Re-Fed {cite:p}`li2024refed` keeps a per-client replay cache under a storage budget $M$ ({term}`memory budget`). When a
# task ends, every client trains a throw-away *personalised informative model* ({term}`PIM`) from the
# global model with a proximal pull of weight $q(\lambda)=(1-\lambda)/(2\lambda)$ ({eq}`refed-eq-pim` of the theory chapter), records every
# sample's squared gradient norm $G^p$ at every PIM epoch $p$, and caches the samples with the
# largest early-emphasis score $I=\sum_p G^p/p$. Training is then plain FedAvg on cache $\cup$ new
# task ({cite:t}`mcmahan2017fedavg`). The implementation and the decisions the paper leaves open are in
# `fedlib.refed.algorithm`; the theory chapter checks {prf:ref}`refed-lemma-1` and {prf:ref}`refed-thm-3-1`.
#
# This chapter runs the paper's two protocols on data that installs offline:
#
# * **class-incremental**: Fashion-MNIST, 5 tasks of 2 classes (the paper's CIFAR10 split),
#   a stratified subset, class order drawn from the seed;
# * **domain-incremental**: digit domains built from MNIST-5k and UCI optdigits
#   (`fedlib.data.domains.digit_domains`: plain MNIST, rotated MNIST, optdigits resized, inverted MNIST)
#   standing in for Digit10 (MNIST, EMNIST, USPS, SVHN), run by the same runner.
#
# K clients, a fraction of them per round, a Dirichlet($\alpha$) label skew ({term}`Dirichlet concentration`) redrawn for every task.
# Accuracy after each stage is measured on the test data of every task (domain) seen so far;
# $A_T$ is the final accuracy averaged over tasks, $A_{avg}$ the average over stages of the
# accuracy on the tasks seen (the paper's "Avg"), $F_T$ the average forgetting (not in the paper).
#
# **Our datasets and models are stand-ins**, and so is the scale (few rounds per task, one or two
# local epochs, a small CNN): the paper's numbers are shown beside ours, labelled, never as reproduced.
#
# Methods (`fedlib.refed.algorithm.LEARNERS`): Re-Fed with the exact squared gradient norms of Eq. 4 (all
# parameters, `grad_norm="exact"`); **Re-Fed (last-layer proxy)** (`refed_proxy`: the closed-form
# norm of the output layer only, a cheaper stand-in for Eq. 4, labelled as such wherever it appears);
# **class-balanced Re-Fed** (`refed_balanced`, ours, not in the paper: the same scores, but every
# class of a client's pool gets the same share of the budget, capped at what the pool holds of it,
# and its own top-$k$); FedAvg without memory; FedAvg and FedProx with a uniformly random cache
# under the same budget rule (the paper's "FedAvg"/"FedProx" with a "naive caching method" it does not specify);
# Fixed (trained on task 1 only); FedEWC and FedLwF (memory-free regularisation baselines, not in
# the paper; off by default at `quick` to keep its runtime). **Not run**: FCIL (= GLFC: gradient-compensation
# losses, relation distillation and a proxy server that reconstructs samples from gradients),
# FedCIL (an ACGAN generator per client plus server-side consolidation) and DANN+FL (a domain
# discriminator whose domain labels the paper does not specify): each is a separate method with
# many settings the paper does not give, far beyond a CPU budget; their numbers appear only in the
# paper's tables below. "Shared" (one head per task) is not run either: it needs the task identity
# at test time, which the protocol here does not give.

# %% tags=["parameters"]
profile = "quick"          # set by the runner; recorded for the reader
dataset = "fashion_mnist"  # class-incremental data
n_train = 4000             # stratified subset; null keeps the whole split
n_test = 1000
num_tasks = 5
domain = True              # run the domain-incremental part
domains = ["mnist", "rotated", "optdigits", "inverted"]
n_per_domain = 600         # training images per domain (test: a quarter); null keeps all
num_clients = 10
participation = 0.4        # fraction of the clients sampled per round (the paper: 0.4)
alpha = 1.0                # Dirichlet concentration, class-incremental (the paper's CIFAR10 value)
alpha_domain = 0.1         # Dirichlet concentration, domain-incremental (the paper's Digit10 value)
model = "smallcnn"         # smallcnn | resnet18 (resnet18_cifar, the paper's backbone)
cnn_width = 8
cnn_hidden = 64
device = "cpu"             # cpu | cuda
rounds = 6                 # communication rounds per task, class-incremental
local_epochs = 1
rounds_domain = 10         # communication rounds per task after the first, domain-incremental
first_rounds_domain = 40   # rounds of the first domain: it must be learned before forgetting can be measured
first_task_min_acc = 0.6   # every method must reach this accuracy on domain 1 after task 1 (checked)
local_epochs_domain = 2
batch_size = 32
lr = 0.05                  # plain SGD, class-incremental
lr_domain = 0.1            # plain SGD, domain-incremental
momentum = 0.0
memory = 60                # M, samples per client (about 3/4 of a client's new task)
memory_domain = 100
memory_mode = "replay"     # replay (M old samples on top of the new task) | total (M counts both)
lam = 0.8                  # Re-Fed lambda, class-incremental (Table 2's CIFAR10 choice)
lam_domain = 0.2           # Re-Fed lambda, domain-incremental (our choice for alpha 0.1, as Table 2 implies)
pim_epochs = 2
grad_norm = "exact"        # Re-Fed's norms (Eq. 4): exact (all parameters, ghost norms) | last_layer (closed-form proxy)
methods = ["refed", "refed_balanced", "refed_proxy", "fedavg_replay", "fedprox_replay", "fedavg", "fixed"]
methods_domain = ["refed", "fedavg_replay", "fedprox_replay", "fedavg", "fixed"]
method_hparams = {"fedprox_replay": {"mu": 0.01}, "fedewc": {"lam": 10.0}}   # our choices (FedEWC's default 100 diverged at lr 0.05)
seeds = [0, 1, 2, 3, 4]
converge_pp = 0.5          # convergence rule: the last task's mean curve moves < this (pp) over its last 20 % of rounds
sweep_seeds = [0]          # the sweeps below are one-seed explorations, labelled as such
memories = [30, 200]       # accuracy versus M (Table 4) besides `memory`, class-incremental
alphas = [0.1]             # accuracy versus alpha (Fig. 3) besides `alpha`
lams = [0.2]               # Re-Fed versus lambda (Table 2) besides `lam`, at lam_alphas
lam_alphas = [0.1]
sweep_methods = ["refed", "fedavg_replay"]
weightings = ["early", "late"]   # Table 10; early is Re-Fed itself
exact_check = True         # rank agreement of exact and last-layer gradient norms on one pool
num_threads = 1
workers = None             # processes running the runs (forked, CPU only); None: the CPU cores (1 on a GPU)

# %% tags=["hide-input"]
import time
from functools import partial

T_START = time.perf_counter()

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
import torch
from myst_nb import glue
from IPython.display import Markdown, display

from fedlib.core.parallel import resolve_workers
from fedlib.evaluation import claims
from fedlib.evaluation.compare import refed_label
from fedlib.evaluation.report import mean_std_by, stacked
from fedlib.evaluation.records import differences, load_record, record_source
from fedlib.evaluation.stats import paired_difference, plateau, power_statement
from fedlib.federated.models import make_model
from fedlib.refed.studies import (REPLAY_METHODS, cache_diagnostics, compare_grad_norms, cost_lines, final_task_accuracy, first_task_accuracies, first_task_table, largest_pools, benchmark_runs, benchmark_scenarios, last_task_curves, last_task_hypothesis, last_task_share, paired_differences, prefetch_summary, refed_paper_gaps, replay_verdict, round_curves, stage_curves, summary_lines)
from fedlib.runner import specs
from fedlib.refed.specs import check_total_memory

# "refed_proxy" is Re-Fed with the last-layer closed form instead of Eq. 4's exact norms (a learner
# option, not a method of its own: fedlib.refed.studies.PIM_METHODS); every other name is a method of
# fedlib.refed.algorithm.LEARNERS (fedlib.refed.specs.METHOD_NAMES)
specs.check("refed_benchmark", globals())   # the runner ran the same checks before executing
from fedlib.evaluation.style import book_style, captioned, facet_size, fit_column, human, method_colour, method_hue, named
book_style()   # the book's figure theme and table number style

torch.set_num_threads(num_threads)
workers = resolve_workers(workers, device)   # None: the cores; 1 on a GPU

# %% tags=["hide-input"]
SCEN = benchmark_scenarios(globals())   # the class-incremental stream and, with `domain`, the digit domains
print(f"{human(dataset)}: {len(SCEN['class']['y_train'])} train / {len(SCEN['class']['y_test'])} test images, {num_tasks} tasks")
if domain:
    print(f"digit domains {', '.join(domains)}: {len(SCEN['domain']['y_train'])} train / "
          f"{len(SCEN['domain']['y_test'])} test images")
channels = int(SCEN["class"]["x_train"].shape[1])   # the same in both scenarios (checked by the spec)

# memory_mode 'total' needs M above every client's new-task size: checked for every run now
check_total_memory(memory_mode, [(key, s["stream"], s["y_train"], [s["memory"]] + (memories if key == "class" else []),
                                  [s["alpha"]] + (alphas + lam_alphas if key == "class" else [])) for key, s in SCEN.items()],
                   set(seeds) | set(sweep_seeds), num_clients)

model_fn = partial(make_model, model, channels, 10, image_size=28, width=cnn_width, hidden=cnn_hidden)
print("model:", model, f"{sum(p.numel() for p in model_fn().parameters()):,} parameters; device {device}")

# %% [markdown]
# ## The paper's numbers (transcribed)
#
# The paper's Tables 1-4 and 10, **the paper's numbers on the paper's datasets** (CIFAR10,
# CIFAR100, Tiny-ImageNet, Digit10, Office31, DomainNet; ResNet-18, 20 clients, 150 rounds per
# task, 20 local epochs), transcribed from the paper (values checked against it line by
# line). Mean ± std over 3 runs; Tiny-ImageNet and DomainNet report Top-10 accuracy. The cell
# checks the cross-references between the tables.

# %% [markdown]
# :::{folded} The cross-checks between the paper's tables (its Table 1 stands beside ours below)
# :::

# %%
from fedlib.refed import tables as paper_tables

paper1, paper2, paper3, paper4, paper10 = (f(printed=True) for f in (
    paper_tables.refed_table1, paper_tables.refed_table2, paper_tables.refed_table3, paper_tables.refed_table4,
    paper_tables.refed_table10))
print("\n".join(paper_tables.refed_consistency()))   # cross-references between the paper's tables

# %% [markdown]
# ## The runs
#
# `fedlib.refed.studies.run_scenario` runs one method through one stream and returns its metrics row;
# `ScenarioRuns` caches the runs by their settings.
#
# :::{folded} The protocol in detail (seeds and pairing, Re-Fed's cache rule and PIM start, the memory modes and their checks, the shared first task, parallel workers) and the log of the runs
# :::
#
# Every learner gets the same `FedConfig`
# (plain SGD as Eqs. 3 and 6; the paper names no optimizer). The run's seed drives the model
# initialisation, the class order and the partitions; every task draws its own participating
# clients and mini-batch orders
# from a seed derived from the run's seed and the task (`fedlib.federated.learner.stage_config`; task 1 uses
# the run's seed itself; every client shuffles its mini-batches with its own generator), so the methods of one seed share data, partitions and client draws and pair
# by seed. Re-Fed's cache is rebuilt once per task, at the task boundary, by all clients (the paper's
# Algorithm 1 caches inside every round, which cannot be literal once old samples are discarded), its
# PIM starts at the global model (the paper does not say which model) and selects a plain top-$k$
# (the paper mentions no class balance; class-balanced Re-Fed: per-class top-$k$ with equal quotas).
# `memory_mode = "replay"` reads $M$ as the replay-buffer size (Sec. 4.1 of the paper); under
# `"total"` (Sec. 3.1) a Dirichlet partition with small $\alpha$ gives some client a new task larger
# than any small $M$, so the $\alpha$ sweep would be infeasible. After every run the storage
# constraint of the mode is checked on what the clients hold (`GradientLearner.check_memory`:
# earlier-task samples counted from their task ids; `"replay"`: at most $M$ of them; `"total"`:
# cache plus new task at most $M$; both: the cache is as full as the rule allows). In the
# domain-incremental stream the first domain gets `first_rounds_domain` rounds so that it is
# learned before anything can be forgotten (checked below). The main runs evaluate the global
# model after every round (for the rounds-to-best count and the curves); the sweeps only after
# every task. A run is cached by its settings, so the sweeps reuse the main runs. Task 1 has no cache,
# so every method with the plain loss (all but FedProx) trains the same model on it: that training
# is done once per scenario, seed and setting and restored, bit for bit, by the other runs
# (`fedlib.federated.learner.FirstStageShare`; the per-method task-1 check below still holds), and its
# measured seconds count in the cost of every run that uses it. Every run seeds what it draws, so
# the runs go to `workers` forked processes (`ScenarioRuns.prefetch`) and give the same results,
# bit for bit, as one after the other (tested: `tests/refed/test_refed_parallel.py`). The main runs of one
# scenario and seed go to one process together and share their task 1 as above; the one-seed sweeps
# below are all run at the memory sweep, every run in a group of its own, which trains its task 1
# again (the same bits) so that the processes work side by side.

# %%
run = benchmark_runs(globals(), SCEN)   # the runs of every section, cached by their settings
SCEN_METHODS = {"class": methods, "domain": methods_domain}
# one group per scenario and seed: its runs share their task-1 training (FirstStageShare) and PIMs
print(prefetch_summary(run.prefetch([dict(kind=scen, method=m, seed=seed, track=True) for scen in SCEN for seed in seeds
                                     for m in SCEN_METHODS[scen]], workers, desc="main runs"), "main runs"))
main_rows = {}
for scen in SCEN:
    main_rows[scen] = [run(scen, m, seed, track=True)["row"] for seed in seeds for m in SCEN_METHODS[scen]]
    print(f"{SCEN[scen]['name']}: {len(SCEN_METHODS[scen])} methods x {len(seeds)} seeds")
print(f"storage constraint of memory_mode {memory_mode!r} checked after every run: {run.memory_checks['runs']} runs, "
      f"{run.memory_checks['client-stages']} (client, task) caches of the replay methods, no violation")

# %% [markdown]
# ## Final and average accuracy (the paper's Table 1)
#
# Mean ± sample standard deviation (ddof 1) over the seeds, `n` runs each. $A_T$ averages the
# final accuracy over tasks (domains); `top1_T` is the final accuracy on all test samples pooled
# (for the domain stream the two differ: the domains' test sets have different sizes, and the paper
# does not say which it reports). The paper averages the last 10 rounds of the final task; we report
# the final global model.
# The spread is between seeds, each seed with its own class order, partitions, client draws and
# initialisation.

# %%
main = pd.DataFrame([r for rows in main_rows.values() for r in rows])
table = mean_std_by(main, ["scenario", "method"], ["A_T", "A_avg", "F_T", "top1_T"], digits=2, count="seed")
# the paper's Table 1 and our final accuracies in one table, the paper's methods in its order (our
# fedavg_replay is its FedAvg with naive caching, fedprox_replay its FedProx)
TO_PAPER = {refed_label(m, grad_norm): name for m, name in
            {"fedavg_replay": "FedAvg", "fedprox_replay": "FedProx", "fixed": "Fixed", "refed": "Re-Fed"}.items()}
STREAMS = {"class": human(dataset), "domain": f"{len(domains)} digit domains"}
ours1 = table["A_T"].unstack("method").reindex(columns=[m for m in TO_PAPER if m in set(main.method)])
ours1 = ours1.rename(index={SCEN[k]["name"]: STREAMS[k] for k in SCEN}, columns=TO_PAPER)
PAPER_ROWS = {"class": paper1.iloc[:3], "domain": paper1.iloc[3:]}   # Table 1: 3 class-, then 3 domain-incremental
for kind in SCEN:   # one table per kind of stream: the paper's methods as rows, its datasets and ours as columns
    display(stacked(PAPER_ROWS[kind], ours1.loc[[STREAMS[kind]]], ("paper", "ours")).T.style.set_caption(
        f"Final accuracy A_T (%), {kind}-incremental, mean ± sample std: the paper's Table 1 on its datasets and "
        f"ours on {STREAMS[kind]}" + (f" ({', '.join(domains)})" if kind == "domain" else "")
        + f", {len(seeds)} seeds. — : not run. Every method and metric of ours is in the next table."))
display(table.rename(index=lambda v: human(v) if v in set(main.method) else v).style.set_caption("Ours, every method: A_T, A_avg, F_T and pooled top-1 (%), mean ± sample std "
                                "over the seeds (n: seeds)"))

# Task 1 has no cache: every method except the regularised ones trains the same model on it (Tables 5-9)
same_first = ["refed", "refed_balanced", "refed_proxy", "fedavg", "fedavg_replay", "fixed"]
first = first_task_accuracies(run, SCEN_METHODS, seeds, same_first)   # {(scenario, seed): {method: accuracy}}
assert all(len(set(acc.values())) == 1 for acc in first.values()), first
print("Checked: on task 1, " + ", ".join(m for m in same_first if m in methods + methods_domain)
      + " reach identical accuracy for every seed and scenario (no cache yet), as in the paper's Tables 5-9.")

# %% [markdown]
# The table's $A_T$ column as a figure: mean over seeds, bars = sample standard deviation, one panel
# per scenario.

# %% mystnb={"figure": {"caption": "Final accuracy A_T of each method: the point is the mean over seeds and the error bar the sample standard deviation, one panel per scenario (class-incremental and domain-incremental). Compare Re-Fed with the other methods; the paired differences below say which gaps the seeds resolve."}, "image": {"alt": "Point plots with error bars, one per scenario: final accuracy per method"}}
g = sns.catplot(data=named(main), x="method", y="A_T", col="scenario", kind="point",
                errorbar="sd", linestyle="none", capsize=0.15, **facet_size(main["scenario"].nunique(), 1.3, legend=False),
                sharey=False, sharex=False)
g.set_axis_labels("method", "final accuracy A_T (%)")
g.set_titles("{col_name}")
for ax in g.axes.flat:
    plt.setp(ax.get_xticklabels(), rotation=30, ha="right")
g.figure.suptitle("A_T: mean ± sample std over seeds", y=1.03, wrap=True)
plt.show()

# %% [markdown]
# ### Paired differences
#
# The runs of one seed share data, class order, partitions and client draws, so methods are
# compared by the per-seed difference: its mean and a 95 % Student-t confidence interval over the
# seeds (`fedlib.evaluation.stats.paired_difference`). An interval that excludes 0 is a difference these runs
# resolve; one that contains 0 is not.

# %% [markdown]
# :::{folded} The paired table: Re-Fed against each baseline and variant, A_T and A_avg, mean difference and 95 % t-interval per scenario
# :::

# %%
PAIRS = [("refed", "fedavg_replay"), ("refed", "fedprox_replay"), ("refed_balanced", "fedavg_replay"),
         ("refed_balanced", "refed"), ("refed", "refed_proxy"), ("refed", "fedavg")]
DIFFS, diff_table = paired_differences(main, SCEN, SCEN_METHODS, PAIRS, seeds, grad_norm, metrics=["A_T", "A_avg"])
if len(diff_table):
    display(captioned(diff_table.set_index(["scenario", "comparison", "metric"]),
                      "Paired differences between methods, by seed (points, 95 % CI)"))
else:
    print(f"one seed ({seeds}): no paired differences; the table above carries no comparison")

# %% [markdown]
# ### The paper's headline, and what these runs can resolve
#
# The verdict's criteria were fixed before the runs: Re-Fed **beats** a baseline when the paired
# 95 % interval of Re-Fed − baseline ($A_T$) lies above 0, **loses** when it lies below 0; a
# comparison counts only if every method's last task has **converged** (its mean test-accuracy
# curve moves by less than `converge_pp` over the last 20 % of the task's rounds). An interval that
# contains 0 is reported with what it does rule out and with the number of paired seeds that would
# detect the paper's own effect (its smallest Re-Fed − FedAvg or − FedProx gap in Table 1 for this
# kind of stream) with 80 % power at the spread measured here.

# %% mystnb={"figure": {"caption": "Recorded run: test accuracy against the round of the last task, mean over seeds, one line per method (Re-Fed and FedAvg and FedProx with random replay), one panel per scenario. The curves show whether every method had levelled off by the end of the task, which the verdict requires."}, "image": {"alt": "Line charts, one per scenario: test accuracy against round of the last task for each method"}}
_prose = []   # the cell's sentences, shown as Markdown below (glue)
paper_gap = refed_paper_gaps(paper_tables.refed_table1())   # {scenario: smallest Re-Fed - baseline gap, pp}
RECORD_KEYS = ["dataset", "n_train", "n_test", "num_tasks", "domain", "domains", "n_per_domain", "num_clients",
               "participation", "alpha", "alpha_domain", "lr", "lr_domain", "memory", "memory_domain", "lam", "lam_domain",
               "local_epochs", "local_epochs_domain", "first_rounds_domain", "model", "cnn_width", "cnn_hidden",
               "batch_size", "momentum", "memory_mode", "pim_epochs", "grad_norm", "method_hparams"]
record = load_record("refed_resolved", missing_ok=True)
mismatch = differences(record, globals(), RECORD_KEYS)
_prose.append(record_source(record, mismatch, "this profile's own runs"))
HEADLINE = ["refed", "fedavg_replay", "fedprox_replay"]
if mismatch:   # the verdict rests on this run: A_T per seed and last-task curves of the runs above
    src_seeds = {scen: seeds for scen in SCEN}
    src = {scen: ({m: [run(scen, m, sd, track=True)["row"]["A_T"] for sd in seeds] for m in HEADLINE if m in SCEN_METHODS[scen]},
                  last_task_curves(run, scen, [m for m in HEADLINE if m in SCEN_METHODS[scen]], seeds)) for scen in SCEN}
    src_rounds = {scen: SCEN[scen]["rounds"] for scen in SCEN}
else:   # each stream ran its own seeds (the class-incremental one more, for the power to resolve the headline)
    src_seeds = record["results"]["seeds"]
    src = {scen: (record["results"]["A_T"][scen], record["results"]["curves"][scen]) for scen in record["results"]["A_T"]}
    src_rounds = {"class": record["parameters"]["rounds"], "domain": record["parameters"]["rounds_domain"]}
    fig, axes = plt.subplots(1, len(src), figsize=fit_column(4.6 * len(src), 3.4), squeeze=False)
    for ax, (scen, (_, curves_)) in zip(axes[0], src.items()):
        for m, c in curves_.items():
            ax.plot(np.arange(1, len(c[0]) + 1), np.mean(c, axis=0), label=human(m), lw=1.2, color=method_colour(m, "refed"))
        ax.set(xlabel="round of the last task", ylabel="test accuracy (%)",
               title=f"{SCEN[scen]['name']}, {len(src_seeds[scen])} seeds")
    axes[0][-1].legend(fontsize=8)
    fig.suptitle("Recorded run: last task, mean over seeds", y=1.02, wrap=True)
    plt.tight_layout()
    plt.show()
glue('refed_benchmark_prose_1', Markdown("\n\n".join(_prose)), display=False)

# %% [markdown]
# ```{glue:md} refed_benchmark_prose_1
# :format: myst
# ```

# %%
for scen, (finals, curves_) in src.items():
    baselines_here = [b for b in ("fedavg_replay", "fedprox_replay") if b in finals]
    if "refed" not in finals or not baselines_here or len(src_seeds[scen]) < 2:
        continue
    diffs = {b: paired_difference(finals["refed"], finals[b]) for b in baselines_here}
    v = replay_verdict({(scen, "refed", b, "A_T"): d for b, d in diffs.items()}, scen, baselines_here)
    plateaus = {m: plateau(np.mean(c, axis=0), converge_pp) for m, c in curves_.items()}
    slowest = max(plateaus, key=lambda m: abs(plateaus[m].change) if np.isfinite(plateaus[m].change) else np.inf)
    converged = all(p.converged for p in plateaus.values())
    beats, loses = v["holds"], bool(v["worse"])
    rules_out = "; ".join(power_statement(d, paper_gap[scen], f"Re-Fed − {human(b)}", unit=" pp") for b, d in diffs.items())
    claims.register(
        f"refed-beats-random-replay-{scen}", "refed",
        f"In the {'class' if scen == 'class' else 'domain'}-incremental streams of Table 1, Re-Fed's final accuracy "
        "exceeds FedAvg's and FedProx's with their naive caching under the same memory (Sec. 4.2: the best in all "
        "cases; we implement the naive caching as random replay).",
        holds=bool(beats), inconclusive=(not beats and not loses) or not converged,
        evidence="; ".join(f"A_T, Re-Fed [{'last-layer proxy' if grad_norm == 'last_layer' else 'exact Eq. 4'}] "
                           f"minus {human(b)}: {d} points" for b, d in diffs.items())
                 + f" ({SCEN[scen]['name']} stand-in data, SmallCNN, M = {SCEN[scen]['memory']}, paired by seed).",
        key=("" if converged else f"not converged at {src_rounds[scen]} rounds per task; ")
            + "; ".join(f"Re-Fed − {human(b)}: {d.format(2).split(' (')[0]} pp" for b, d in diffs.items()),
        rules_out=None if (beats or loses) and converged else
        (rules_out if converged else f"the comparison did not converge at its budget; {rules_out}"),
        methods=HEADLINE, ran=["refed", *baselines_here],
        budget=f"{src_rounds[scen]} rounds per task, {len(src_seeds[scen])} seeds, {SCEN[scen]['name']}"
               + ("" if mismatch else " (recorded run)"),
        convergence=f"last task, every method's mean curve: {plateaus[slowest].describe(unit=' pp')} "
                    f"(largest move: {slowest})", converged=converged, record=None if mismatch else record["name"])

# %% [markdown]
# ## Where the class-incremental replay goes: the caches
#
# Re-Fed keeps the samples with the largest gradient norms under a PIM started at the global model.
# **The hypothesis checked here:** at the boundary before task $t+1$ that model has just been
# trained on task $t$, so task $t$'s samples, the *last old task*, fit best and score lowest; the
# top-$k$ would then keep mostly older, partly forgotten samples and few of the last old task's,
# whose classes enter the next stage with little replay: Re-Fed would trade accuracy on the last
# old task for accuracy on the older ones. The verdict is printed under the tables, from paired
# differences.
#
# :::{folded} The caches at every task boundary (share of the last old task, smallest class count, classes lost, unused storage), the final accuracy per task, and the hypothesis's paired verdict
# :::
#
# Random replay keeps every task in proportion to the pool (in expectation), and
# class-balanced Re-Fed gives every class of the pool the same quota by construction. Measured at every
# boundary with at least two old tasks, over all clients and seeds: the last old task's share of
# the pool and of the cache, the smallest per-class count in the union of all caches, how many
# (client, class) pairs lose a class that the client's pool held, and the cache storage left
# unused (the budget minus the cache; it is the same for every method, because every method fills
# its budget and only a client whose pool is smaller than $M$ leaves some unused, so the methods
# differ in what they keep, not in how much). The final accuracy per task shows where the
# forgetting lands; the accuracy gap against $M$ is in the memory sweep below.

# %% mystnb={"figure": {"caption": "Share of the last old task in the clients' caches at each task boundary, box plots over the seeds, one colour per replay method. If Re-Fed's boxes lie below random replay's, its importance-based cache keeps less of the task it has just learned, as the hypothesis predicts."}, "image": {"alt": "Box plots: share of the last old task in the cache against task boundary, coloured by method"}}
_prose = []   # the cell's sentences, shown as Markdown below (glue)
replay_methods = [m for m in REPLAY_METHODS if m in methods]
diag = cache_diagnostics(run, replay_methods, seeds, memory_mode, grad_norm)   # one row per (method, seed, boundary)
if len(diag):
    # every method fills its budget: the unused storage is the same for all methods of a seed and boundary
    assert diag.groupby(["seed", "boundary"])["unused cache storage (samples, all clients)"].nunique().max() == 1
    per_seed = diag.groupby(["method", "seed"], sort=False).mean(numeric_only=True).drop(columns="boundary")
    display(captioned(mean_std_by(per_seed, "method", list(per_seed.columns), digits=1),
                      "What the caches hold: mean over task boundaries per seed, then mean ± sample std over seeds"))
    final_task = final_task_accuracy(run, replay_methods, seeds, grad_norm)
    display(captioned(mean_std_by(final_task, "method", [c for c in final_task.columns if c.startswith("task")], digits=1),
                      "Final accuracy per task (%), mean ± sample std over seeds"))
    if {"refed", "fedavg_replay"} <= set(replay_methods) and len(seeds) > 1:
        h = last_task_hypothesis(per_seed, final_task, num_tasks, grad_norm)   # Re-Fed - random replay, paired
        _prose.append(
            f"Re-Fed minus random replay, paired by seed: share of the last old task in the cache "
            f"{h['share'].format(1)} points; final accuracy on task {num_tasks - 1} (the last old task at the last "
            f"boundary) {h['last'].format(1)} points; on task 1 {h['first'].format(1)} points. The hypothesis is "
            + ("**consistent with these runs**: Re-Fed's caches hold less of the last old task, and that task "
               "ends less accurate" if h["confirmed"] else "**not confirmed by these runs** (a CI contains 0 or "
               "points the other way)") + ".")
    ax = sns.boxplot(data=named(diag), x="boundary", y="last old task, share of the cache (%)", hue="method",
                     **method_hue(named(diag)["method"], "refed"))
    ax.set(xlabel="boundary before task t+1 (t tasks learned)", title="Share of the last old task in the caches")
    plt.show()
glue('refed_benchmark_prose_2', Markdown("\n\n".join(_prose)), display=False)

# %% [markdown]
# ```{glue:md} refed_benchmark_prose_2
# :format: myst
# ```

# %% [markdown]
# ## Domain-incremental: the first domain is learned before it can be forgotten
#
# Forgetting is only measurable for a domain that was learned. Accuracy on domain 1 right after
# task 1 (`first_rounds_domain` rounds), and after the last task, by method; the run fails if any
# method stays below `first_task_min_acc` on domain 1 after task 1.

# %%
if "domain" in SCEN:
    first_dom = first_task_table(run, "domain", methods_domain, seeds, grad_norm)
    display(captioned(mean_std_by(first_dom, "method", ["domain 1 after task 1 (%)", "domain 1 after the last task (%)"],
                                  digits=1), "Accuracy on the first domain after it was learned and at the end, "
                                             "mean ± sample std over seeds"))
    low = first_dom["domain 1 after task 1 (%)"].min() / 100
    assert low >= first_task_min_acc, (f"domain 1 reached only {low:.1%} after task 1: raise first_rounds_domain "
                                       f"(now {first_rounds_domain})")
    print(f"Checked: every method and seed reaches >= {first_task_min_acc:.0%} on domain 1 after task 1 "
          f"(lowest {low:.1%}, {first_rounds_domain} rounds).")

# %% [markdown]
# ## Accuracy after each task
#
# Two views of forgetting over the stream: the mean accuracy over the tasks seen after each task, and
# the accuracy after every communication round.
#
# :::{folded} The accuracy curves: A_t after each task (mean ± sd over seeds) and the global model after every round (first seed)
# :::

# %% mystnb={"figure": {"caption": "Accuracy of every method over the stream, one panel per scenario: in the first figure the mean accuracy over the tasks seen so far after each task (mean over seeds, sample-standard-deviation bands), in the second the global model's test accuracy on the seen tasks after every communication round, for one seed. Drops at the task boundaries show forgetting."}, "image": {"alt": "Line charts, one per scenario, of each method's accuracy, after each task or after every communication round"}}
by_stage = stage_curves(run).pipe(named)
g = sns.relplot(data=by_stage, x="stage", y="A_t", hue="method", **method_hue(by_stage["method"], "refed"), col="scenario",
                kind="line", marker="o",
                errorbar="sd", **facet_size(len(SCEN), 1.15), facet_kws={"sharey": False, "sharex": False})
g.set_axis_labels("task t (tasks seen)", "A_t: mean accuracy over seen tasks (%)")
g.set_titles("{col_name}")
g.figure.suptitle("Accuracy after each task (mean ± sample sd over seeds)", y=1.03, wrap=True)
plt.show()

by_round = round_curves(run, seeds[0]).pipe(named)
g = sns.relplot(data=by_round, x="round", y="accuracy", hue="method", **method_hue(by_round["method"], "refed"),
                col="scenario", kind="line",
                **facet_size(len(SCEN), 1.3), facet_kws={"sharey": False, "sharex": False})
g.set_axis_labels("communication round (all tasks)", "test accuracy on seen tasks (%)")
g.set_titles("{col_name}")
g.figure.suptitle(f"Global model after every round, seed {seeds[0]}", y=1.03, wrap=True)
plt.show()

# %% [markdown]
# ## Rounds to the best accuracy (the paper's Table 3)
#
# Per task, the first round at which the global model reaches that task's best accuracy on the
# seen test data (`fedlib.refed.studies.rounds_to_best`), summed over tasks.
#
# :::{folded} Rounds to the best accuracy per method and scenario, and the paper's Table 3 (only the ordering of methods compares)
# :::
#
# Our tasks have `rounds`
# (class-incremental) or `rounds_domain` rounds each (`first_rounds_domain` for the first
# domain), the paper's 150, so only the ordering of methods can be compared. Fixed trains task 1
# only and counts 0 afterwards.

# %%
cor = mean_std_by(main, ["scenario", "method"], ["CoR_sum"], digits=1)["CoR_sum"].unstack("method")
display(captioned(cor, "Ours: rounds to best, summed over tasks, mean ± sample std over seeds"))
assert all(v["cor"][1:] == [0] * (len(v["cor"]) - 1) for k, v in run.runs.items() if v["tracked"] and k[1] == "fixed")
display(captioned(paper3, "Paper, Table 3 (150 rounds per task) - the paper's numbers on the paper's datasets"))

# %% [markdown]
# ## Accuracy versus memory size $M$ (the paper's Table 4): the gap against $M$
#
# **One-seed sweep (`sweep_seeds`), no conclusion drawn.** Class-incremental stream, the methods of
# `sweep_methods`. When $M$ holds a client's whole pool, Re-Fed keeps exactly what random replay
# keeps, so the two coincide (the paper's ties at $M=3000$); checked below when the largest $M$ is
# that large. Beside the accuracy gap, the last old task's share of the Re-Fed caches at each $M$.

# %% [markdown]
# :::{folded} The memory sweep: A_T against M (figure and table, with the Re-Fed − random gap and the last old task's share of the caches), the check at a memory that holds every pool, and the paper's Table 4
# :::

# %% mystnb={"figure": {"caption": "Final accuracy A_T against the memory size M (samples per client) in the class-incremental stream, one line per method, from a one-seed sweep (no error bars, no conclusion drawn). When M holds a client's whole pool, Re-Fed and random replay keep the same samples and coincide."}, "image": {"alt": "Line chart with markers: final accuracy against memory size for each method"}}
m_grid = sorted(set(memories) | {memory})
a_grid = sorted(set(alphas) | {alpha})
l_grid = sorted(set(lams) | {lam})
# the runs of all the one-seed sweeps below (memory, alpha, lambda, weighting) at once, so that both processes
# stay busy; a run per group (they share no more than task 1)
SWEEPS = [dict(kind="class", method=m, seed=seed, memory=M) for M in m_grid for m in sweep_methods for seed in sweep_seeds]
SWEEPS += [dict(kind="class", method=m, seed=seed, alpha=a) for a in a_grid for m in sweep_methods for seed in sweep_seeds]
SWEEPS += [dict(kind="class", method="refed", seed=seed, alpha=a, lam=l) for a in lam_alphas for l in l_grid
           for seed in sweep_seeds]
SWEEPS += [dict(kind="class", method="refed", seed=seed, weighting=w) for w in weightings for seed in sweep_seeds]
print(prefetch_summary(run.prefetch(SWEEPS, workers, group=lambda request: tuple(sorted(request.items())), desc="sweeps"),
                       "sweeps (memory, alpha, lambda, weighting)"))
rows = [run("class", m, seed, memory=M)["row"] for M in m_grid for m in sweep_methods for seed in sweep_seeds]
by_m = pd.DataFrame(rows)
ax = sns.lineplot(data=named(by_m), x="M", y="A_T", hue="method", **method_hue(named(by_m)["method"], "refed"), marker="o",
                  errorbar=None)
ax.set(xlabel="memory M (samples per client)", ylabel="final accuracy A_T (%)",
       title=f"Accuracy versus M, {SCEN['class']['name']} ({len(sweep_seeds)} seed(s))")
plt.show()
gap = by_m.pivot_table(index="M", columns="key", values="A_T", aggfunc="mean")
if {"refed", "fedavg_replay"} <= set(sweep_methods):
    gap["Re-Fed - random (points)"] = gap["refed"] - gap["fedavg_replay"]
    gap["Re-Fed: last old task's share of the cache (%)"] = pd.Series(last_task_share(run, m_grid, sweep_seeds))
display(captioned(gap.round(2), f"Ours: A_T (%) by M, {len(sweep_seeds)} seed(s) (a pattern, not a result)"))
pools = largest_pools(run, sweep_methods, sweep_seeds, memory=max(m_grid))
if {"refed", "fedavg_replay"} <= set(sweep_methods) and pools and max(m_grid) >= max(pools):
    assert all(np.array_equal(run("class", "refed", seed, memory=max(m_grid))["result"].acc,
                              run("class", "fedavg_replay", seed, memory=max(m_grid))["result"].acc, equal_nan=True)
               for seed in sweep_seeds)
    print(f"Checked: at M = {max(m_grid)} (>= every pool, largest {max(pools)}) Re-Fed and random replay "
          "give identical accuracy matrices.")
elif pools:
    print(f"Largest pool at M = {max(m_grid)}: {max(pools)} samples; M does not hold every pool, "
          "so Re-Fed and random replay select differently at every M here.")
display(paper4.T.style.set_caption("The paper's Table 4 on its datasets: final accuracy (%) by method and memory "
                                   "size M (its FedAvg caches at random)"))

# %% [markdown]
# ## Accuracy versus heterogeneity $\alpha$ and $\lambda$ (the paper's Fig. 3 and Table 2)
#
# **One-seed sweep, no conclusion drawn.** Smaller $\alpha$ means more label skew. $\lambda\to 0$
# pins the PIM to the global model, $\lambda\to 1$ lets it fit the client's pool; the paper finds
# $\lambda=0.2$ best at $\alpha=0.1$ and $\lambda=0.8$ best for $\alpha\ge 1$.

# %% [markdown]
# :::{folded} The α and λ sweeps: A_T against α for every method and against λ for every α (figure and tables), and the paper's Table 2
# :::

# %% mystnb={"figure": {"caption": "Left: final accuracy A_T against the Dirichlet alpha (log scale; smaller means more label skew), one line per method. Right: Re-Fed's A_T against its lambda, one line per alpha. One-seed sweeps without error bars: a pattern, not a result."}, "image": {"alt": "Two line charts: final accuracy against alpha for each method, and against lambda for each alpha"}}
# the runs come from the cache: the memory sweep's cell made them (ScenarioRuns.prefetch)
rows = [run("class", m, seed, alpha=a)["row"] for a in a_grid for m in sweep_methods for seed in sweep_seeds]
by_alpha = pd.DataFrame(rows)
rows = [run("class", "refed", seed, alpha=a, lam=l)["row"] for a in lam_alphas for l in l_grid for seed in sweep_seeds]
by_lam = pd.DataFrame(rows)
fig, axes = plt.subplots(1, 2, figsize=fit_column(10, 3.6))
sns.lineplot(data=named(by_alpha), x="alpha", y="A_T", hue="method", **method_hue(named(by_alpha)["method"], "refed"),
             marker="o", errorbar=None, ax=axes[0])
axes[0].set(xscale="log", xlabel="Dirichlet alpha (log scale)", ylabel="final accuracy A_T (%)",
            title=f"Accuracy versus Dirichlet α ({len(sweep_seeds)} seed(s))")
sns.lineplot(data=by_lam.assign(alpha=by_lam.alpha.astype(str)), x="lambda", y="A_T", hue="alpha", marker="o",
             errorbar=None, ax=axes[1])
axes[1].set(xlabel="Re-Fed's λ", ylabel="final accuracy $A_T$ (%)", title=f"Re-Fed versus λ ({len(sweep_seeds)} seed(s))")
plt.tight_layout()
plt.show()
display(captioned(by_alpha.pivot_table(index="method", columns="alpha", values="A_T", aggfunc="mean").round(2),
                  f"Ours: A_T (%) by Dirichlet α, {len(sweep_seeds)} seed(s) (an exploration, not a comparison)"))
ours2 = by_lam.pivot_table(index="scenario", columns=["alpha", "lambda"], values="A_T", aggfunc="mean")
ours2 = ours2.rename(index={SCEN["class"]["name"]: STREAMS["class"]})
display(stacked(paper2, ours2, ("paper", "ours")).T.style.set_caption(
    f"Re-Fed's final accuracy A_T (%) by Dirichlet α and λ: the paper's Table 2 (mean ± std) on its datasets and "
    f"ours on {STREAMS['class']} ({len(sweep_seeds)} seed(s), an exploration). — : not run."))

# %% [markdown]
# ## Early, Average and Late weighting (the paper's Table 10)
#
# **One-seed sweep, no conclusion drawn.** Early-Emphasis is Eq. 5 ($\sum_p G^p/p$),
# Average-Weighting $\sum_p G^p$, and Late-Emphasis the Early ranking reversed (the paper's
# definition: keep the lowest scores). With `pim_epochs` epochs the Early and Average weights
# differ only through $1/p$ for $p\le$ `pim_epochs`.

# %% [markdown]
# :::{folded} A_T and A_avg for the Early, Average and Late weightings, and the paper's Table 10
# :::

# %%
# the runs come from the cache: the memory sweep's cell made them (ScenarioRuns.prefetch)
rows = [run("class", "refed", seed, weighting=w)["row"] for w in weightings for seed in sweep_seeds]
by_w = pd.DataFrame(rows)
by_w["weighting"] = pd.Categorical(by_w["weighting"], weightings)
display(captioned(by_w.groupby("weighting", observed=True)[["A_T", "A_avg"]].mean().round(2),
                  f"Ours: A_T and A_avg (%) by weighting, {len(sweep_seeds)} seed(s) (an exploration, not a comparison)"))
display(captioned(paper10, "Paper, Table 10 (final accuracy, %) - the paper's numbers on the paper's datasets"))

# %% [markdown]
# ## Exact against last-layer gradient norms
#
# The exact $G^p$ (all parameters, ghost norms: `fedlib.core.persample.grad_sq_norms`) and the last layer's closed form
# $\|\pi-e_y\|^2(\|h\|^2+1)$ are computed on the same PIM trajectory (the scoring does not change
# the PIM's steps): one client's final pool of the first seed's Re-Fed run, the final global
# model, all classes seen. How similar are the rankings, and the caches they select? The
# accuracy that each choice gives is the paired difference `refed [exact Eq. 4] - refed
# [last-layer proxy]` above.

# %% [markdown]
# :::{folded} Exact against last-layer scores on one pool: their rank correlation, the overlap of the caches they select, the last layer's share of the norm, the PIM's seconds, and the scatter plot
# :::

# %% mystnb={"figure": {"caption": "Early score of every sample in one client's pool from exact all-parameter gradient norms (x) against the last-layer closed form (y), both log scale, coloured by class; the title gives the Spearman rank correlation. The closer the points lie to an increasing curve, the more alike the two rank the samples."}, "image": {"alt": "Log-log scatter plot: exact against last-layer importance scores for the samples of one pool, coloured by class"}}
if exact_check:
    cmp = compare_grad_norms(run("class", "refed", seeds[0], track=True)["learner"], lam=lam, epochs=pim_epochs, lr=lr,
                             batch_size=batch_size, memory=memory, num_seen=10, device=device)   # same PIM trajectory
    res_g, y_pool = cmp["results"], cmp["y"]
    print(f"pool of client {cmp['client']}: {len(y_pool)} samples, {pim_epochs} PIM epochs")
    print(f"Spearman rank correlation of the Early scores, exact vs last layer: {cmp['rho']:.3f}")
    print(f"overlap of the top-{cmp['budget']} selections: {cmp['overlap']:.1%}")
    print(f"median share of the last layer in the exact norm: {cmp['share']:.3f}")
    print(f"PIM seconds with exact norms {res_g['exact'].seconds:.2f}, with the closed form "
          f"{res_g['last_layer'].seconds:.2f} (this machine, other load included)")
    ax = sns.scatterplot(x=res_g["exact"].scores("early").numpy(), y=res_g["last_layer"].scores("early").numpy(),
                         hue=[str(int(v)) for v in y_pool.cpu()], s=14)
    ax.set(xscale="log", yscale="log", xlabel="Early score, exact norms (all parameters)",
           ylabel="Early score, last-layer closed form", title=f"Scores of one pool (Spearman {cmp['rho']:.2f})")
    ax.legend(title="class", fontsize=7, ncol=2)
    plt.show()

# %% [markdown]
# ## Cost, measured
#
# Seconds of learning per run (evaluation excluded; this shared machine's load included, and that
# of the other worker process running beside it) and upload per run. Re-Fed and random replay
# train on the same amount of data; the difference of their times is the cost of the PIM and the
# scoring. Re-Fed uploads nothing extra.

# %% [markdown]
# :::{folded} Learner seconds and upload per run for every method and scenario, and what the PIM and the scoring cost
# :::

# %%
cost = main.groupby(["scenario", "method"], sort=False)[["wall_s", "MiB_up"]].mean()
display(captioned(cost.rename(columns={"wall_s": "learner seconds per run", "MiB_up": "upload per run, all clients (MiB)"})
                  .style.format("{:.2f}", na_rep="—"), "Cost per run, mean over seeds: learner time and total upload"))
print("\n".join(cost_lines(main, SCEN, pim_epochs=pim_epochs, participation=participation, grad_norm=grad_norm)))

# %% [markdown]
# ## Summary of the measurements
#
# Every number below is computed from the runs above; differences come with their paired 95 %
# confidence intervals, and only the main runs (`seeds`) carry a comparison.

# %%
print("\n".join(summary_lines(main, SCEN, DIFFS, seeds, grad_norm)))
print(f"\nnotebook compute time: {time.perf_counter() - T_START:.0f} s (profile {profile}, "
      f"{len(run.runs)} runs, {num_threads} torch thread(s), device {device})")

# %% [markdown]
# The paper's absolute numbers (ResNet-18, 150 rounds of 20 local epochs per task) are not
# comparable with ours; the sweeps (one seed) show patterns only.
#
# **Profiles.** `quick` (the default) runs the SmallCNN on the CPU with the exact norms of Eq. 4
# for the Re-Fed rows (the proxy rows are labelled), a few PIM epochs and `len(seeds)` seeds:
# relative to the local training the PIM is far longer than in the paper (the ratio is printed in
# the cost section), because with fewer epochs the Early and Average weightings could not differ
# (with one epoch they are identical). FedEWC and FedLwF are off at `quick` (add them to
# `methods`). `paper` uses `resnet18_cifar`, exact norms, 40 PIM epochs, the paper's rounds,
# epochs, learning rates and memory sizes on the GPU (`device: cuda`); it is a specification for a
# GPU machine (hours per run), not something the 2-core CPU can execute. `smoke` only checks that
# every cell runs.

# %% [markdown]
# ## Exercises
#
# Re-run with `make run NB=refed_benchmark ARGS="..."`. The self-check line under an exercise
# compares this run's measurement with the prediction (`fedlib.evaluation.selfcheck`).
#
# :::{folded} The exercises, with their solutions and the self-checks of this run
# :::
#
# ```{exercise} Local or global importance
# :label: refed-bench-ex-importance
#
# Re-run with `lams=[0.05, 0.95] lam_alphas=[0.1]` and compare the PIM's distance to the global
# model (`learner.pim_log[t][k]["dist_sq"]`) for the two values. Which way does Lemma 1 say it must
# move? See {prf:ref}`refed-lemma-1`. The self-check compares the distances of the $\lambda$ sweep
# at the first task boundary.
# ```
#
# ````{solution} refed-bench-ex-importance
# :class: dropdown
#
# Lemma 1: $\|\hat v(\lambda)-\hat w\|^2$ does not decrease as $\lambda$ grows, since $q(\lambda)$
# falls and the proximal pull weakens; after a few PIM epochs the PIM is far from its optimum, but
# the distance still grows with $\lambda$ because every step is pulled back less.
# ````

# %%
from fedlib.refed import selfcheck

# Lemma 1 at the first task boundary (the same global model and pools for every lambda): mean ||v - w||^2
# over the clients of the lambda sweep's runs
pim_dist = {}
for lam_ in l_grid:
    first_pims = next((p for p in run("class", "refed", sweep_seeds[0], alpha=lam_alphas[0], lam=lam_)["learner"].pim_log
                       if p), None)
    if first_pims:
        pim_dist[lam_] = float(np.nanmean([p["dist_sq"] for p in first_pims]))
print(selfcheck.refed_pim_distance(pim_dist))

# %% [markdown]
# ```{exercise} Class balance of the cache
# :label: refed-bench-ex-balance
#
# Re-Fed's top-$k$ is not class-balanced. For the first seed's Re-Fed run, count the classes in
# every client's cache (`learner.memory_log`, `learner.local_sets`) and compare with random replay.
# What happens to a class whose samples are all easy? Predict first whose caches stay closer to
# the pools' class proportions (fill in `my_prediction` below), then count and compare.
# ```
#
# ````{solution} refed-bench-ex-balance
# :class: dropdown
#
# Samples the model already fits have small $\|\pi-e_y\|$ and hence small scores at every PIM epoch;
# a class that is easy for the global model can vanish from a client's cache, and the global model
# then forgets it first. Random replay keeps classes in proportion to the pool. `class_balanced` (an
# option of the learner: `True`/`"proportional"` or `"equal"`, the `refed_balanced` method) restores
# per-class quotas.
# ````

# %%
my_prediction = None  # your answer: "refed" or "random": whose caches keep the pools' class proportions more closely?
if {"refed", "fedavg_replay"} <= set(methods):
    print(selfcheck.refed_class_balance(my_prediction,
                                        run("class", "refed", seeds[0], track=True)["learner"].memory_log,
                                        run("class", "fedavg_replay", seeds[0], track=True)["learner"].memory_log))
else:
    print("self-check needs 'refed' and 'fedavg_replay' in methods")

# %% [markdown]
# ```{exercise} When does Re-Fed equal random replay?
# :label: refed-bench-ex-full-memory
#
# Find the smallest $M$ at which the two methods give the same accuracy matrix in the
# class-incremental stream, using `learner.memory_log[t]["pool"]`. Change `memories` (the largest
# $M$ of the sweep) and re-run; the self-check compares the two accuracy matrices at the largest $M$
# with the prediction.
# ```
#
# ````{solution} refed-bench-ex-full-memory
# :class: dropdown
#
# With `memory_mode="replay"` the budget is $\min(M, |\text{pool}|)$, so once $M$ is at least the
# largest pool of any client at any boundary, both methods keep every sample (in the same order) and
# train identically: the smallest such $M$ is the maximum of `memory_log[t]["pool"]` over clients
# and tasks of a run with a large $M$ (pools grow with $M$ until everything is kept).
# ````

# %%
from fedlib.refed import selfcheck

if {"refed", "fedavg_replay"} <= set(sweep_methods):
    M_big, seed0 = max(m_grid), sweep_seeds[0]
    print(selfcheck.refed_full_memory(run("class", "refed", seed0, memory=M_big)["result"].acc,
                                      run("class", "fedavg_replay", seed0, memory=M_big)["result"].acc,
                                      M_big, max(largest_pools(run, sweep_methods, [seed0], memory=M_big))))
else:
    print("self-check needs 'refed' and 'fedavg_replay' in sweep_methods")
