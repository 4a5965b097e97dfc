"""STSA and STSA-E against the gradient baselines at a converged budget (the STSA benchmark chapter's
pretrained table, the paper's Table 2 margin claim).

The chapter's data, frozen features, partitions, methods and hyperparameters at a profile (default
``quick``), on its baseline seeds, with the baselines trained ``rounds_per_task`` rounds per stage
(:data:`DEFAULTS`: 100, the budget at which every baseline's mean last-task curve at ``quick`` meets
the chapter's convergence rule; at 40 and 60 FedLwF's still moved by more than ``converge_pp`` in one
case) instead of the profile's budget. Stores, per setting (dataset) and beta: A_avg and
A_T (%) per seed of STSA, STSA-E and every baseline, and every baseline's last-task curve (test
accuracy, %, on all seen classes after each round of the last task) per seed.
"""
from __future__ import annotations

from typing import Any

import pandas as pd
import torch

from fedlib.core.devices import resolve_device
from fedlib.core.parallel import resolve_workers
from fedlib.stsa import studies

CHAPTER = "stsa_benchmark"
DEFAULTS = {"rounds_per_task": 100}


def run(p: dict[str, Any], progress: bool = True) -> dict[str, Any]:
    """The comparison for the chapter parameters ``p`` (its ``rounds_per_task`` overridden); JSON-ready."""
    torch.set_num_threads(p["num_threads"])   # as the chapter does
    _, run_one = studies.benchmark_runner(p)
    workers = resolve_workers(p["workers"], resolve_device(p["device"]))
    seeds = [s for s in p["seeds"] if s in p["baseline_seeds"]]
    methods = [*studies.MARGIN_METHODS, *p["baselines"]]
    results, curves = [], {}
    for name in p["datasets"]:
        feats = studies.benchmark_features(name, p["subsets"], p["n_train"], p["n_test"], backbone=p["backbone"],
                                           input_size=p["input_size"], device=p["device"])
        setting = f"pretrained / {name}"
        res, curves[setting] = studies.pretrained_grid(run_one, feats, setting, p["betas"], seeds, p["baselines"],
                                                       seeds, p["M"], workers=workers, curves=True, progress=progress)
        results += res
        curves[setting] = {str(beta): c for beta, c in curves[setting].items()}
    summary = pd.DataFrame([r.summary() for r in results])
    return {"seeds": seeds, "methods": methods, **studies.margin_values(summary, methods, seeds), "curves": curves}
