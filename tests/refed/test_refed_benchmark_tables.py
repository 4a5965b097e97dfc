"""Tests for the benchmark chapter's tables and evidence in fedlib.refed.algorithm (paired differences,
cache diagnostics, curves, the exact / last-layer comparison, the cost and summary sentences), on a
small ScenarioRuns of the toy data of tests/refed/test_refed.py, each against a direct computation."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from test_refed import SETTINGS, SEED, T, _scenario, data  # noqa: F401  (data: the module fixture)
from fedlib.evaluation.compare import refed_label
from fedlib.evaluation.stats import PairedDifference, paired_difference
from fedlib.refed.studies import (ScenarioRuns, cache_diagnostics, compare_grad_norms, cost_lines, final_task_accuracy, first_task_accuracies, first_task_table, largest_pools, last_task_hypothesis, last_task_share, make_scenario, paired_differences, replay_verdict, round_curves, stage_curves, summary_lines)

METHODS = ["refed", "fedavg_replay", "fedavg"]
SEEDS = [0, 1]


@pytest.fixture(scope="module")
def runs(data):
    runs = ScenarioRuns({"class": _scenario(data)}, **SETTINGS)
    for seed in SEEDS:
        for m in METHODS:
            runs("class", m, seed, track=True)
    return runs


@pytest.fixture(scope="module")
def main(runs):
    return pd.DataFrame([runs("class", m, seed, track=True)["row"] for seed in SEEDS for m in METHODS])


def test_make_scenario(data):
    _, x_tr, y_tr, x_te, y_te = data
    img = np.full((len(y_tr), 2, 4), 255, dtype=np.uint8)
    s = make_scenario("toy", img, y_tr, img[:len(y_te)], y_te, None, alpha=1.0, lr=0.1,
                      memory=5, lam=0.5, rounds=1, first_rounds=None, epochs=1)
    assert s["x_train"].shape == (len(y_tr), 1, 2, 4) and s["x_train"].dtype == torch.float32 and s["memory"] == 5
    assert float(s["x_test"].min()) == 1.0 and s["y_train"] is y_tr and s["first_rounds"] is None
    with pytest.raises(ValueError, match="epochs, first_rounds"):
        make_scenario("toy", x_tr, y_tr, x_te, y_te, None, alpha=1.0, lr=0.1, memory=5, lam=0.5, rounds=1)


def test_first_task_accuracies(runs):
    first = first_task_accuracies(runs, {"class": METHODS}, SEEDS, ["refed", "fedavg_replay", "fedavg", "fixed"])
    assert set(first) == {("class", 0), ("class", 1)} and set(first["class", 0]) == set(METHODS)
    assert all(len(set(acc.values())) == 1 for acc in first.values())      # no cache on task 1
    assert first["class", 1]["refed"] == runs("class", "refed", 1)["result"].acc[0, 0]


def test_paired_differences_and_verdict(runs, main):
    scen = {"class": _scenario_name()}
    diffs, table = paired_differences(main, scen, {"class": METHODS}, [("refed", "fedavg_replay"), ("refed", "fixed")],
                                      SEEDS, "exact", metrics=["A_T"])
    assert list(diffs) == [("class", "refed", "fedavg_replay", "A_T")] and len(table) == 1   # fixed was not run
    a = [runs("class", "refed", s)["row"]["A_T"] for s in SEEDS]
    b = [runs("class", "fedavg_replay", s)["row"]["A_T"] for s in SEEDS]
    d = paired_difference(a, b)
    assert diffs["class", "refed", "fedavg_replay", "A_T"] == d
    assert table["comparison"][0] == "refed [exact Eq. 4] - fedavg_replay" and table["metric"][0] == "A_T"
    assert table["seeds a > b"][0] == f"{int((np.array(a) > np.array(b)).sum())} of 2"
    assert paired_differences(main, scen, {"class": METHODS}, [("refed", "fedavg")], [0], "exact")[0] == {}
    up = PairedDifference(2.0, 1.0, 3, 1.0, 3.0, 0.95)
    down = PairedDifference(-2.0, 1.0, 3, -3.0, -1.0, 0.95)
    zero = PairedDifference(0.0, 1.0, 3, -1.0, 1.0, 0.95)
    v = replay_verdict({("c", "refed", "fedavg_replay", "A_T"): up, ("c", "refed", "fedprox_replay", "A_T"): up}, "c")
    assert v["holds"] and v["baselines"] == ["fedavg_replay", "fedprox_replay"] and v["verdict"] == "resolved in Re-Fed's favour"
    v = replay_verdict({("c", "refed", "fedavg_replay", "A_T"): down, ("c", "refed", "fedprox_replay", "A_T"): zero}, "c")
    assert not v["holds"] and v["worse"] == ["fedavg_replay"] and v["verdict"] == "Re-Fed resolved below fedavg_replay"
    v = replay_verdict({("c", "refed", "fedavg_replay", "A_T"): zero}, "c")
    assert not v["holds"] and not v["worse"] and v["verdict"].startswith("not supported")
    assert replay_verdict({}, "c") is None


def _scenario_name():
    return {"name": "toy"}


def test_cache_diagnostics_and_final_tasks(runs):
    diag = cache_diagnostics(runs, ["refed", "fedavg_replay"], SEEDS, "replay", "exact")
    assert len(diag) == 2 * 2 * (T - 2) and set(diag.boundary) == set(range(2, T))
    lrn = runs("class", "refed", 1)["learner"]
    log = lrn.memory_log[2]
    row = diag[(diag.method == "refed [exact Eq. 4]") & (diag.seed == 1)].iloc[0]
    assert row["last old task, share of the cache (%)"] == pytest.approx(100 * log["old_tasks"][:, 1].sum() / log["old"].sum())
    assert row["unused cache storage (samples, all clients)"] == int((lrn.replay.memory - log["old"]).clip(min=0).sum())
    assert diag.groupby(["seed", "boundary"])["unused cache storage (samples, all clients)"].nunique().max() == 1
    final = final_task_accuracy(runs, ["refed", "fedavg_replay"], SEEDS, "exact")
    assert list(final.columns) == ["method", "seed"] + [f"task {t + 1}" for t in range(T)]
    assert np.allclose(final.iloc[1, 2:].to_numpy(float), 100 * runs("class", "refed", 1)["result"].acc[-1])
    per_seed = diag.groupby(["method", "seed"], sort=False).mean(numeric_only=True).drop(columns="boundary")
    h = last_task_hypothesis(per_seed, final, T, "exact")
    ref = paired_difference(final[final.method == "refed [exact Eq. 4]"]["task 1"],
                            final[final.method == "fedavg_replay"]["task 1"])
    assert h["first"] == ref and h["confirmed"] == (h["share"].high < 0 and h["last"].high < 0)
    dom = first_task_table(runs, "class", ["refed"], SEEDS, "exact")
    assert list(dom["domain 1 after task 1 (%)"]) == [100 * runs("class", "refed", s)["result"].acc[0, 0] for s in SEEDS]


def test_curves(runs):
    curves = stage_curves(runs)
    assert len(curves) == T * len(SEEDS) * len(METHODS) and set(curves.method) == {
        refed_label(m) for m in METHODS}
    per_round = round_curves(runs, 0)
    assert len(per_round) == len(METHODS) * T * SETTINGS_ROUNDS
    fedavg = per_round[per_round.method == "fedavg"]
    assert list(fedavg["round"]) == list(range(1, T * SETTINGS_ROUNDS + 1))
    h = runs("class", "fedavg", 0)["learner"].histories[1]
    assert list(fedavg["accuracy"][SETTINGS_ROUNDS:2 * SETTINGS_ROUNDS]) == [100 * a for a in h.test_acc]


SETTINGS_ROUNDS = 2   # rounds per task of the toy scenario


def test_memory_sweep_helpers(runs):
    share = last_task_share(runs, [15], SEEDS)
    logs = [log for s in SEEDS for t, log in enumerate(runs("class", "refed", s)["learner"].memory_log) if t >= 2]
    assert share[15] == pytest.approx(100 * sum(l["old_tasks"][:, -1].sum() for l in logs) / sum(l["old"].sum() for l in logs))
    pools = largest_pools(runs, ["refed", "fedavg"], SEEDS, memory=15)
    assert len(pools) == len(SEEDS) * T and pools[0] == 0     # fedavg keeps no cache; an empty pool at task 1
    assert max(pools) == max(int(l["pool"].max()) for s in SEEDS for l in runs("class", "refed", s)["learner"].memory_log if len(l))


def test_compare_grad_norms(runs):
    lrn = runs("class", "refed", 0)["learner"]
    cmp = compare_grad_norms(lrn, lam=0.8, epochs=2, lr=0.1, batch_size=32, memory=10, num_seen=6)
    k = cmp["client"]
    assert len(cmp["y"]) == max(len(s[1]) for s in lrn.local_sets) == len(lrn.local_sets[k][1])
    assert cmp["budget"] == min(10, len(cmp["y"]) // 2) and 0 <= cmp["overlap"] <= 1
    # a linear model is all last layer: the two norms, scores and selections agree
    assert cmp["rho"] == pytest.approx(1.0) and cmp["overlap"] == 1.0 and cmp["share"] == pytest.approx(1.0, abs=1e-5)
    assert cmp["results"]["exact"].seconds > 0


def test_cost_and_summary_lines(runs, main):
    scen = {"class": {"name": "toy", "rounds": 2, "epochs": 1}}
    lines = cost_lines(main, scen, pim_epochs=2, participation=0.5, grad_norm="exact")
    assert len(lines) == 2 and lines[0].startswith("toy: 2 PIM epochs per client and task against about 1.0 ")
    assert "(200%;" in lines[0] and lines[1].endswith("upload equal to random replay: True")
    diffs, _ = paired_differences(main, scen, {"class": METHODS}, [("refed", "fedavg")], SEEDS, "exact")
    summary = summary_lines(main, scen, diffs, SEEDS, "exact")
    best = main.groupby("method")["A_T"].mean().sort_values(ascending=False)
    assert summary[0] == "toy: mean final accuracy over 2 seeds: " + ", ".join(f"{m} {v:.1f}" for m, v in best.items())
    assert summary[1].startswith("  A_T refed [exact Eq. 4] - fedavg: ")
    f = main.groupby("key")["F_T"].mean()
    assert summary[2] == (f"  forgetting F_T (mean): no memory {f['fedavg']:.1f}, random replay "
                          f"{f['fedavg_replay']:.1f}, Re-Fed {f['refed']:.1f}")
