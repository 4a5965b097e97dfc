"""Typed parameters of the STSA chapters (``notebooks/stsa_derivation.py``, ``stsa_benchmark.py``, ``stsa_beyond.py``):
one :class:`Spec` per chapter covering every name of its ``parameters`` cell, and the
cross-parameter rules (each raises ValueError naming the parameters)."""
from __future__ import annotations

from fedlib.afl.specs import DEVICES, NON_NEGATIVE, POSITIVE, rule_at_most, rule_subset
from fedlib.core.privacy import ACCOUNTANTS
from fedlib.core.specs import NULL, Bool, Choice, Dict, Int, List, Real, Seeds, Spec, Str
from fedlib.data.datasets import DATASETS
from fedlib.data.features import BACKBONES
from fedlib.federated.fcil import METHODS
from fedlib.stsa.algorithm import HEADS
from fedlib.stsa.beyond import AGGREGATIONS


def _tasks_divide_classes(v):
    if v["num_classes"] % v["num_tasks"]:
        raise ValueError(f"num_tasks = {v['num_tasks']} must divide num_classes = {v['num_classes']}")


def _noise_pairs(v):
    bad = [pair for pair in v["noise_grid"] if len(pair) != 2]
    if bad:
        raise ValueError(f"noise_grid must hold [q, s] pairs, got {bad}")


def _subsets_known(v):
    extra = sorted(set(v["subsets"]) - set(v["datasets"]) - {v["scratch_dataset"]})
    if extra:
        raise ValueError(f"subsets has entries for datasets not used ({extra}); datasets: {v['datasets']}")


def _gamma_range(v):
    if v["gamma_max"] < v["gamma_min"]:
        raise ValueError(f"gamma_max = {v['gamma_max']} must be >= gamma_min = {v['gamma_min']}")


def _paper_noise_pair(v):
    if v["paper_noise"] is not None and len(v["paper_noise"]) != 2:
        raise ValueError(f"paper_noise must be a [q, s] pair or null, got {v['paper_noise']}")


def _beyond_subsets(v):
    extra = sorted(set(v["subsets"]) - {v["dataset"]})
    if extra:
        raise ValueError(f"subsets has entries for datasets not used ({extra}); dataset: {v['dataset']}")


SPECS = {
    "stsa_derivation": Spec({
        "n_samples": Int(2), "dim": Int(1), "M": Int(1), "num_classes": Int(2), "num_tasks": Int(1),
        "client_counts": List(Int(1), distinct=True), "betas": List(POSITIVE), "gamma": NON_NEGATIVE,
        "mc_reps": Int(10), "mse_reps": Int(2), "mse_clients": List(Int(2), distinct=True), "mse_n": Int(2),
        "bias_dummy": List(Int(1), distinct=True), "rate_ns": List(Int(2), least=2, distinct=True),
        "rate_clients": List(Int(2), least=2, distinct=True), "rate_n_fixed": Int(2), "rate_reps": Int(1),
        "skew_scales": List(NON_NEGATIVE), "skew_reps": Int(2), "skew_seeds": Seeds(least=2),
        "skew_accuracy_scale": POSITIVE, "skew_dummy": Int(1), "comm_M": List(Int(1)), "seed": Int(0),
    }, rules=[_tasks_divide_classes, rule_at_most("mse_clients", "mse_n"), rule_at_most("rate_clients", "rate_n_fixed"),
              rule_at_most("client_counts", "n_samples")]),
    "stsa_benchmark": Spec({
        "datasets": List(Choice(DATASETS), distinct=True), "subsets": Dict(Choice(DATASETS), List(Int(1) | NULL)),
        "n_train": Int(1) | NULL, "n_test": Int(1) | NULL, "backbone": Choice(BACKBONES), "input_size": Int(1),
        "device": Choice(DEVICES), "num_tasks": Int(1), "num_clients": Int(1), "betas": List(POSITIVE),
        "seeds": Seeds(least=2), "M": Int(1), "M_scratch": Int(1), "gamma": NON_NEGATIVE, "num_dummy": Int(1),
        "head": Choice(HEADS), "baselines": List(Choice(METHODS), least=0, distinct=True),
        "baseline_hparams": Dict(Choice(METHODS), Dict(Str(), Real())), "baseline_seeds": List(Int(0), least=0),
        "rounds_per_task": Int(1), "converge_pp": POSITIVE, "local_epochs": Int(1), "lr": POSITIVE, "scratch": Bool(),
        "scratch_dataset": Choice(DATASETS), "scratch_seeds": Seeds(), "scratch_rounds": Int(1),
        "scratch_widths": List(Int(1)), "scratch_baselines": List(Choice(METHODS), least=0, distinct=True),
        "scratch_baseline_rounds": Int(1), "ablation_M": List(Int(1)), "ablation_M_scratch": List(Int(1)),
        "ablation_K": List(Int(1)), "ablation_clients_total": Int(1), "ablation_dummy": List(Int(1)),
        "ablation_gamma": List(NON_NEGATIVE), "noise_grid": List(List(NON_NEGATIVE), least=0),
        "noise_seeds": Seeds(), "skew_scale": NON_NEGATIVE, "first_task_classes": Int(1),
        "later_task_classes": Int(1), "num_threads": Int(1), "workers": Int(1) | NULL,
    }, rules=[rule_subset("baseline_seeds", "seeds"), _noise_pairs, _subsets_known]),
    "stsa_beyond": Spec({
        "dataset": Choice(DATASETS), "subsets": Dict(Choice(DATASETS), List(Int(1) | NULL)),
        "n_train": Int(1) | NULL, "n_test": Int(1) | NULL, "backbone": Choice(BACKBONES), "input_size": Int(1),
        "device": Choice(DEVICES), "num_tasks": Int(1), "num_clients": Int(1), "beta": POSITIVE,
        "seeds": Seeds(least=2), "M": Int(1), "gamma_min": POSITIVE, "gamma_max": POSITIVE, "gamma_points": Int(2),
        "fixed_gammas": List(POSITIVE, distinct=True), "sweep_gammas": List(POSITIVE, distinct=True),
        "check_samples": Int(2), "check_gammas": List(POSITIVE, distinct=True), "clip_norm": POSITIVE,
        "epsilons": List(POSITIVE, distinct=True), "delta": Real(0.0, 1.0),
        "aggregations": List(Choice(AGGREGATIONS), distinct=True), "paper_noise": List(NON_NEGATIVE) | NULL,
        "accountant": Choice(ACCOUNTANTS), "num_threads": Int(1),
    }, rules=[_gamma_range, _paper_noise_pair, _beyond_subsets]),
}
