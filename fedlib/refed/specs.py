"""Typed parameters of the Re-Fed chapters (``notebooks/refed_theory.py``,
``refed_benchmark.py``, ``refed_beyond.py``): one :class:`Spec` per chapter covering every name of its ``parameters``
cell, and the cross-parameter rules (each raises ValueError naming the parameters).

:func:`check_total_memory` is the one data-dependent check (``memory_mode="total"`` needs M above
every client's new task); the benchmark chapter calls it once its data is loaded.
"""
from __future__ import annotations

from typing import Callable, Iterable

from fedlib.core.specs import NULL, Bool, Choice, Dict, Int, List, Real, Seeds, Spec, Str
from fedlib.data.datasets import DATASETS, RGB_DATASETS
from fedlib.data.domains import DOMAIN_NAMES
from fedlib.federated.models import MODEL_NAMES
from fedlib.refed.algorithm import GRAD_NORMS, LEARNERS, MEMORY_MODES, WEIGHTINGS, q_lambda
from fedlib.refed.beyond import RULES

DEVICES = ("auto", "cpu", "cuda")

# "refed_proxy" is Re-Fed with the last-layer closed form (grad_norm="last_layer"), not a learner of its own
METHOD_NAMES = tuple(LEARNERS) + ("refed_proxy",)
POSITIVE = Real(0.0)                                 # > 0
LAMBDA = Real(0.0, 1.0)                              # Re-Fed's lambda in (0, 1) (Eq. 3)
FRACTION = Real(0.0, 1.0, strict=False)              # [0, 1]
METHODS = List(Choice(METHOD_NAMES), distinct=True)


def _contains(name: str, value: str, why: str):
    """Rule: ``value`` is one of the list ``v[name]``."""
    def rule(v):
        if value not in v[name]:
            raise ValueError(f"{name} must contain {value!r} ({why}), got {v[name]}")
    return rule


def _below(name: str, bound: float):
    """Rule: ``v[name] < bound`` (the type already checked the lower end)."""
    def rule(v):
        if not v[name] < bound:
            raise ValueError(f"{name} must be < {bound}, got {v[name]!r}")
    return rule


def _pim_step_stable(v):
    """lr * q(lambda) < 2 for every (lr, lambda) the chapter runs, else the PIM's proximal step diverges."""
    pairs = [("lr", "lam", lam) for lam in [v["lam"], *v["lams"]]] + [("lr_domain", "lam_domain", v["lam_domain"])]
    for lr_name, lam_name, lam in pairs:
        if v[lr_name] * q_lambda(lam) >= 2.0:
            raise ValueError(f"{lr_name} * q({lam_name}) = {v[lr_name] * q_lambda(lam):.3g} >= 2 for {lam_name} = {lam}: "
                             f"the PIM step diverges; lower {lr_name} or raise {lam_name}")


def _participation_positive(v):
    if v["participation"] <= 0:
        raise ValueError(f"participation must lie in (0, 1], got {v['participation']}")


def _one_channel_count(v):
    """With the domain-incremental part on, one model serves both streams: the class-incremental
    dataset must be grayscale like the digit domains."""
    if v["domain"] and v["dataset"] in RGB_DATASETS:
        raise ValueError(f"dataset {v['dataset']!r} has RGB images but the digit domains are grayscale: with "
                         "domain = true pick a grayscale dataset or set domain = false")


def _curvatures(v):
    """mu (strong convexity) must not exceed any largest curvature of the quadratics."""
    largest = [v["L_smooth"], *v["thm_L"]]
    if v["mu"] > min(largest):
        raise ValueError(f"mu must be <= L_smooth and every thm_L (largest curvatures), got mu = {v['mu']}, "
                         f"L_smooth = {v['L_smooth']}, thm_L = {v['thm_L']}")


def _tasks_fit_classes(v):
    if v["num_tasks"] > v["num_classes"]:
        raise ValueError(f"num_tasks must be <= num_classes = {v['num_classes']}, got {v['num_tasks']}")


def _theory_stream(v):
    """The synthetic stream: equal tasks (num_tasks divides num_classes), and no task with fewer training
    samples than clients (each task's Dirichlet partition gives every client at least one)."""
    if v["num_classes"] % v["num_tasks"]:
        raise ValueError(f"num_tasks must divide num_classes = {v['num_classes']} (equal tasks), got {v['num_tasks']}")
    per_task = v["num_classes"] // v["num_tasks"] * v["n_per_class"]
    if v["num_clients"] > per_task:
        raise ValueError(f"num_clients must be <= the {per_task} training samples of a task "
                         f"(num_classes / num_tasks * n_per_class), got {v['num_clients']}")


def _theory_sizes(v):
    if v["num_classes"] < 3:   # the gradient-norm checks score labels 0..2 of num_classes outputs
        raise ValueError(f"num_classes must be >= 3, got {v['num_classes']}")
    if v["grad_samples"] > v["num_classes"] * v["n_per_class"]:
        raise ValueError(f"grad_samples must be <= num_classes * n_per_class = {v['num_classes'] * v['n_per_class']}, "
                         f"got {v['grad_samples']}")


def _noise_rules_run_clean(v):
    """Every rule run with label noise is also run without (the noise's paired effect), and so is refed."""
    missing = [r for r in v["noise_rules"] if r not in v["rules"] + v["split_rules"]]
    if missing:
        raise ValueError(f"noise_rules must be rules run without noise too (in rules or split_rules), got {missing}")
    if v["noise_rules"] and "refed" not in v["noise_rules"]:
        raise ValueError(f"noise_rules must contain 'refed' (the reference), got {v['noise_rules']}")


def _fork_on_cpu(v):
    """Forked worker processes cannot share a CUDA context: workers > 1 needs device cpu (None: the
    chapter picks, one process on a GPU)."""
    if v["workers"] is not None and v["workers"] > 1 and v["device"] != "cpu":
        raise ValueError(f"workers must be 1 with device {v['device']!r} (forked processes cannot share CUDA), "
                         f"got workers = {v['workers']}")


def _beyond_pim_stable(v):
    """lr * q(lambda) < 2 for lam and lam_local, else the PIM's proximal step diverges."""
    for name in ("lam", "lam_local"):
        if v["lr"] * q_lambda(v[name]) >= 2.0:
            raise ValueError(f"lr * q({name}) = {v['lr'] * q_lambda(v[name]):.3g} >= 2: the PIM step diverges; "
                             f"lower lr or raise {name}")


SPECS = {
    "refed_theory": Spec({
        "seed": Int(0), "dim": Int(1), "mu": POSITIVE, "L_smooth": POSITIVE, "n_lambda": Int(1),
        "pim_eta": POSITIVE, "pim_steps": List(Int(1), distinct=True), "logreg_samples": Int(2),
        "logreg_epochs": Int(1), "logreg_lambdas": List(LAMBDA, distinct=True), "sigma": Real(0.0, strict=False),
        "g0": Real(0.0, strict=False), "horizon": Int(1), "mc_reps": Int(1), "thm_L": List(POSITIVE),
        "thm_lambdas": List(LAMBDA, distinct=True), "const_eta": POSITIVE, "const_steps": Int(1),
        "n_per_class": Int(1), "n_test_per_class": Int(1), "num_classes": Int(2), "num_tasks": Int(1),
        "num_clients": Int(1), "rounds": Int(1), "local_epochs": Int(1), "pim_epochs": Int(1),
        "dnn_pim_epochs": Int(1), "dnn_lambdas": List(LAMBDA, distinct=True), "grad_samples": Int(1),
    }, rules=[_curvatures, _tasks_fit_classes, _theory_sizes, _theory_stream]),
    "refed_benchmark": Spec({
        "dataset": Choice(DATASETS), "n_train": Int(1) | NULL, "n_test": Int(1) | NULL, "num_tasks": Int(1),
        "domain": Bool(), "domains": List(Choice(DOMAIN_NAMES), distinct=True), "n_per_domain": Int(1) | NULL,
        "num_clients": Int(1), "participation": FRACTION, "alpha": POSITIVE, "alpha_domain": POSITIVE,
        "model": Choice(MODEL_NAMES), "cnn_width": Int(1), "cnn_hidden": Int(1), "device": Choice(DEVICES),
        "rounds": Int(1), "local_epochs": Int(1), "rounds_domain": Int(1), "first_rounds_domain": Int(1),
        "first_task_min_acc": FRACTION, "local_epochs_domain": Int(1), "batch_size": Int(1), "lr": POSITIVE,
        "lr_domain": POSITIVE, "momentum": FRACTION, "memory": Int(1), "memory_domain": Int(1),
        "memory_mode": Choice(MEMORY_MODES), "lam": LAMBDA, "lam_domain": LAMBDA, "pim_epochs": Int(1),
        "grad_norm": Choice(GRAD_NORMS), "methods": METHODS, "methods_domain": METHODS,
        "method_hparams": Dict(Choice(METHOD_NAMES), Dict(Str(), Real())), "seeds": Seeds(), "sweep_seeds": Seeds(), "converge_pp": Real(0.0),
        "memories": List(Int(1), least=0, distinct=True), "alphas": List(POSITIVE, least=0),
        "lams": List(LAMBDA, least=0), "lam_alphas": List(POSITIVE, least=0), "sweep_methods": METHODS,
        "weightings": List(Choice(WEIGHTINGS), distinct=True), "exact_check": Bool(), "num_threads": Int(1),
        "workers": Int(1) | NULL,
    }, rules=[_contains("methods", "refed", "Re-Fed itself"), _contains("weightings", "early", "Re-Fed itself"),
              _participation_positive, _pim_step_stable, _one_channel_count, _below("first_task_min_acc", 1.0),
              _below("momentum", 1.0), _fork_on_cpu]),
    "refed_beyond": Spec({
        "dataset": Choice(DATASETS), "n_train": Int(1) | NULL, "n_test": Int(1) | NULL, "num_tasks": Int(1),
        "num_clients": Int(1), "participation": FRACTION, "alpha": POSITIVE, "model": Choice(MODEL_NAMES),
        "cnn_width": Int(1), "cnn_hidden": Int(1), "device": Choice(DEVICES), "rounds": Int(1),
        "local_epochs": Int(1), "batch_size": Int(1), "lr": POSITIVE, "momentum": FRACTION, "memory": Int(1),
        "memory_mode": Choice(MEMORY_MODES), "lam": LAMBDA, "lam_local": LAMBDA, "pim_epochs": Int(1),
        "grad_norm": Choice(GRAD_NORMS), "seeds": Seeds(least=2), "converge_pp": Real(0.0), "rules": List(Choice(RULES), distinct=True),
        "split_rules": List(Choice(RULES), least=0, distinct=True), "noise": Real(0.0, 1.0, strict=False),
        "noise_rules": List(Choice(RULES), least=0, distinct=True), "num_threads": Int(1), "workers": Int(1) | NULL,
    }, rules=[_contains("rules", "refed", "the reference of every paired difference"), _participation_positive,
              _below("momentum", 1.0), _below("noise", 1.0), _noise_rules_run_clean, _beyond_pim_stable,
              _fork_on_cpu]),
}


def check_total_memory(memory_mode: str, streams: Iterable[tuple[str, Callable, object, list[int], list[float]]],
                       seeds: Iterable[int], num_clients: int) -> None:
    """Under ``memory_mode="total"`` every M must exceed every client's new task (Sec. 3.1's reading of M).

    ``streams``: (scenario name, ``stream(seed)`` factory or the stream itself, training labels (n,), the M values, the
    Dirichlet alphas it runs). ValueError naming the scenario, M, alpha and seed of the first
    infeasible run; nothing to check under ``"replay"``.
    """
    if memory_mode != "total":
        return
    for key, make, y_train, memories, alphas in streams:
        for seed in sorted(set(seeds)):
            st = make(seed) if callable(make) else make
            for a in sorted(set(alphas)):
                biggest = max(len(p) for t in range(st.num_tasks)
                              for p in st.client_partitions(t, y_train, num_clients, a, seed))
                if min(memories) <= biggest:
                    raise ValueError(f"{key}: memory_mode 'total' needs M > {biggest} (largest new task of a client, "
                                     f"alpha {a}, seed {seed}), got M {min(memories)}; use memory_mode 'replay'")
