"""AFL against the gradient baselines at a converged budget (the AFL benchmark chapter's Table 2).

The chapter's data, features, partitions, methods, hyperparameters and training seeds at a profile
(default ``quick``), with the baselines trained for ``rounds`` rounds (default 1200: at the paper's
200 three baselines were still rising, at 400 five still moved more than 0.5 pp over the last 20 %
of the rounds) instead of the profile's budget. Stores, per setting: AFL's
accuracy, every method's final accuracy per training seed and its test-accuracy curve per seed.
"""
from __future__ import annotations

from typing import Any

import torch

from fedlib.afl import studies as afl_studies
from fedlib.core.devices import resolve_device
from fedlib.core.parallel import resolve_workers
from fedlib.data.datasets import load_dataset
from fedlib.data.features import extract_features

CHAPTER = "afl_benchmark"
DEFAULTS = {"rounds": 1200}
SPLIT = ("methods", "alphas", "shards", "resample_methods")   # a part may run a slice of these
SPLIT_BY = "methods"   # ``--split``: one process per method


def part(p: dict[str, Any], method: str) -> dict[str, Any]:
    """The overrides of the part of run ``p`` that trains ``method`` only."""
    return {"methods": [method], "resample_methods": [m for m in p["resample_methods"] if m == method]}


def covered(p: dict[str, Any], results: dict[str, Any]) -> None:
    """ValueError unless ``results`` hold every setting x method of the run ``p`` (merged parts)."""
    labels = [afl_studies.setting_label(s) for s in [("alpha", a) for a in p["alphas"]] +
              [("shards", s) for s in p["shards"]]]
    missing = [f"{m} ({label})" for label in labels for m in p["methods"]
               if m not in results.get("final", {}).get(label, {}) or m not in results.get("curves", {}).get(label, {})]
    if missing:
        raise ValueError(f"the parts leave out {', '.join(missing)}")


def run(p: dict[str, Any], progress: bool = True) -> dict[str, Any]:
    """The comparison for the chapter parameters ``p`` (its ``rounds`` overridden); JSON-ready results."""
    dev = resolve_device(p["device"])
    data = load_dataset(p["dataset"])
    data = data.subset(p["n_train"], p["n_test"]) if (p["n_train"] or p["n_test"]) else data
    feats = extract_features(data, backbone=p["backbone"], input_size=p["input_size"], device=str(dev))
    settings = [("alpha", a) for a in p["alphas"]] + [("shards", s) for s in p["shards"]]
    partition = afl_studies.SettingPartitions(data.y_train)
    partition.draw_all(settings, [p["num_clients"]], [p["partition_seed"]])
    ref = afl_studies.centralized_reference(feats, dev)
    afl_runs = afl_studies.afl_setting_runs(feats, partition, settings, p["num_clients"], [p["partition_seed"]],
                                            p["gamma"], dev, ref["w_qr"])
    config = dict(rounds=p["rounds"], local_epochs=p["local_epochs"], batch_size=p["batch_size"], lr=p["lr"],
                  participation=p["participation"], device=str(dev), eval_every=1,
                  batched_clients=p["batched_clients"])
    train = torch.from_numpy(feats.x_train), torch.from_numpy(feats.y_train)
    test = torch.from_numpy(feats.x_test), torch.from_numpy(feats.y_test)
    runs, curves = afl_studies.run_baselines(
        "converged", [(s, m, sd, p["partition_seed"]) for s in settings for m in p["methods"] for sd in p["seeds"]],
        partitions=partition, num_clients=p["num_clients"], train=train, test=test, num_classes=feats.num_classes,
        config=config, moon_hidden=p["moon_hidden"], workers=resolve_workers(p["workers"], dev), progress=progress)
    out: dict[str, Any] = {"afl": {}, "final": {}, "curves": {}, "seconds per round": {}}
    for s in settings:
        label = afl_studies.setting_label(s)
        out["afl"][label] = float(afl_runs.loc[afl_runs.setting == label, "accuracy"].iloc[0])
        out["final"][label] = {m: afl_studies.seed_ordered_accuracies(runs, label, m).tolist() for m in p["methods"]}
        c = curves[curves.setting == label]
        out["curves"][label] = {m: [c[(c.method == m) & (c.seed == sd)].sort_values("round")["test_acc"].tolist()
                                    for sd in p["seeds"]] for m in p["methods"]}
        r = runs[runs.setting == label]
        out["seconds per round"][label] = r.groupby("method")["seconds per round"].mean().to_dict()
    return out
