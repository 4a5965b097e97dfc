"""Typed parameters of the AFL chapters (``notebooks/afl_derivation.py``, ``afl_benchmark.py``, ``afl_beyond.py``):
one :class:`Spec` per chapter covering every name of its ``parameters`` cell, and the
cross-parameter rules (each raises ValueError naming the parameters)."""
from __future__ import annotations

from fedlib.core.specs import NULL, Bool, Choice, Int, List, Real, Seeds, Spec
from fedlib.data.datasets import DATASETS, TRAIN_SIZES
from fedlib.data.features import BACKBONES
from fedlib.federated.gradient import ALGORITHMS

DEVICES = ("auto", "cpu", "cuda")
POSITIVE = Real(0.0)                     # > 0
NON_NEGATIVE = Real(0.0, strict=False)   # >= 0
CONDITION = Real(1.0, strict=False)      # a condition number, >= 1


def rule_at_most(small: str, large: str):
    """Rule: ``v[small]`` (an int or every entry of a list) <= ``v[large]``."""
    def rule(v):
        values = v[small] if isinstance(v[small], list) else [v[small]]
        if any(x > v[large] for x in values):
            raise ValueError(f"{small} must be <= {large} = {v[large]}, got {v[small]}")
    return rule


def rule_subset(part: str, whole: str):
    """Rule: every entry of ``v[part]`` is in ``v[whole]``."""
    def rule(v):
        extra = sorted(set(v[part]) - set(v[whole]))
        if extra:
            raise ValueError(f"{part} must be a subset of {whole} {v[whole]}, got extra {extra}")
    return rule


def _some_setting(v):
    if not v["alphas"] and not v["shards"]:
        raise ValueError("alphas and shards are both empty: give at least one setting")


def _shards_divide_the_data(v):
    """NIID-2 cuts the training samples into num_clients * s equal shards: their number must divide the
    samples (``n_train``, or the dataset's training split), and there must be no more clients than samples."""
    n = v["n_train"] if v["n_train"] is not None else TRAIN_SIZES.get(v["dataset"])
    if n is None:
        return
    n = min(n, TRAIN_SIZES.get(v["dataset"], n))
    for name in ("num_clients", "client_counts", "ri_clients"):
        most = max(v[name]) if isinstance(v[name], list) else v[name]
        if most > n:
            raise ValueError(f"{name} must be <= the {n} training samples, got {v[name]}")
    for s in v["shards"]:
        total = v["num_clients"] * s
        if n % total:
            fits = [k for k in range(1, n + 1) if n % (k * s) == 0]
            near = sorted(fits, key=lambda k: abs(k - v["num_clients"]))[:3]
            raise ValueError(f"shards: num_clients * s = {v['num_clients']} * {s} = {total} shards do not divide the "
                             f"{n} training samples (n_train); with s = {s}, num_clients may be e.g. "
                             f"{', '.join(map(str, sorted(near)))}")


def _participation_positive(v):
    if v["participation"] <= 0:
        raise ValueError(f"participation must lie in (0, 1], got {v['participation']}")


def _unlearn_client_exists(v):
    if v["unlearn_client"] >= v["loco_clients"]:
        raise ValueError(f"unlearn_client must be < loco_clients = {v['loco_clients']} (a client index), "
                         f"got {v['unlearn_client']}")


SPECS = {
    "afl_derivation": Spec({
        "n_samples": Int(2), "dim": Int(1), "num_classes": Int(2),
        "client_counts": List(Int(1), distinct=True), "dirichlet_alphas": List(POSITIVE),
        "shards_per_client": Int(1), "sweep_clients": Int(1), "pairwise_max_clients": Int(1),
        "table1_dim": Int(1), "table1_clients": List(Int(1), distinct=True), "gammas": List(POSITIVE),
        "fp_clients": Int(1), "conditions": List(CONDITION), "f32_conditions": List(CONDITION),
        "reference_samples": Int(2), "reference_dim": Int(1), "n_orders": Int(1), "seed": Int(0),
    }, rules=[rule_at_most("sweep_clients", "n_samples"), rule_at_most("fp_clients", "n_samples"),
              rule_at_most("table1_clients", "n_samples"), rule_at_most("reference_dim", "reference_samples"),
              rule_at_most("sweep_clients", "reference_samples")]),
    "afl_benchmark": Spec({
        "dataset": Choice(DATASETS), "backbone": Choice(BACKBONES), "input_size": Int(1),
        "n_train": Int(1) | NULL, "n_test": Int(1) | NULL, "device": Choice(DEVICES),
        "num_clients": Int(1), "alphas": List(POSITIVE, least=0), "shards": List(Int(1), least=0),
        "methods": List(Choice(ALGORITHMS), distinct=True), "partition_seed": Int(0), "seeds": Seeds(least=2),
        "resample_methods": List(Choice(ALGORITHMS), least=0, distinct=True),
        "rounds": Int(1), "local_epochs": Int(1), "batch_size": Int(1), "lr": POSITIVE,
        "participation": Real(0.0, 1.0, strict=False), "batched_clients": Bool(), "moon_hidden": Int(1) | NULL,
        "gamma": NON_NEGATIVE,
        "client_counts": List(Int(1), distinct=True), "invariance_alpha": POSITIVE,
        "table3_alphas": List(POSITIVE), "gammas": List(NON_NEGATIVE), "ri_clients": List(Int(1), distinct=True),
        "paper_rounds": Int(1), "workers": Int(1) | NULL, "converge_pp": POSITIVE,
    }, rules=[rule_subset("resample_methods", "methods"), _some_setting, _participation_positive,
              _shards_divide_the_data]),
    "afl_beyond": Spec({
        "dataset": Choice(DATASETS), "backbone": Choice(BACKBONES), "input_size": Int(1),
        "n_train": Int(1) | NULL, "n_test": Int(1) | NULL,
        "num_clients": Int(1), "alpha": POSITIVE, "partition_seed": Int(0), "gamma": NON_NEGATIVE,
        "check_samples": Int(2), "check_dim": Int(1),
        "conditions": List(CONDITION, distinct=True, increasing=True), "cond_samples": Int(2), "cond_dim": Int(1),
        "cond_clients": Int(1), "seeds": Seeds(least=2),
        "mask_clients": Int(2), "feature_bound": POSITIVE | NULL, "mask_secret": Int(0),
        "loco_clients": Int(2), "loco_alpha": POSITIVE, "ridge_grid": List(POSITIVE, distinct=True, increasing=True),
        "negligible_pp": NON_NEGATIVE, "unlearn_client": Int(0),
    }, rules=[rule_at_most("check_dim", "check_samples"), rule_at_most("cond_dim", "cond_samples"),
              rule_at_most("cond_clients", "cond_samples"), _unlearn_client_exists]),
}

