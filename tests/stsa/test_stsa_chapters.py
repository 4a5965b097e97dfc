"""The STSA chapters' checks, studies and tables (fedlib.stsa.algorithm, moved out of the notebooks), and
report.paired_table: real values, tolerances a wrong aggregation or estimator fails."""
from functools import partial

import numpy as np
import pandas as pd
import pytest
import torch

from fedlib.core.linalg import synthetic_features
from fedlib.data.features import Features
from fedlib.data.partition import make_partition
from fedlib.evaluation.report import paired_table
from fedlib.data.streams import make_stream
from fedlib.federated.incremental import run_class_incremental
from fedlib.stsa import algorithm as stsa
from fedlib.stsa import studies as stsa_studies


@pytest.fixture(scope="module")
def toy():
    x, y = synthetic_features(900, 6, 4, kind="mean_dominated", seed=0)
    rf = stsa.RandomFeatures(6, 24, seed=0)
    return x, y, rf, rf(x)


def test_closed_form_checks_solve_eq6(toy):
    x, y, rf, phi = toy
    out = stsa_studies.closed_form_checks(phi, y, 4, 1.0)
    assert out["tol_w"] == pytest.approx(100 * np.finfo(np.float64).eps * out["kappa"]) and out["kappa"] > 1
    assert max(out["checks"].values()) < out["tol_w"]
    g = phi.T @ phi
    expected = np.linalg.solve((g + torch.eye(24)).numpy(), (phi.T @ torch.eye(4, dtype=phi.dtype)[y]).numpy())
    np.testing.assert_allclose(out["w_star"].numpy(), expected, rtol=1e-6)


def test_spatial_check_sums_equal_the_centralized_statistics(toy):
    x, y, rf, phi = toy
    out = stsa_studies.closed_form_checks(phi, y, 4, 1.0)
    table = stsa_studies.spatial_check(x, y, 4, rf, [0.05, None], [1, 7], 0, out["stats"], out["w_star"], rf(x[:50]), 1.0)
    assert list(table.beta) == [0.05, 0.05, "IID", "IID"] and list(table.K) == [1, 7, 1, 7]
    assert table["rel. err. sum G_k"].max() < 1e-12 and table["rel. err. W"].max() < out["tol_w"]
    assert table["same predictions"].all()


def test_temporal_check_and_order_and_split(toy):
    x, y, rf, phi = toy
    stream = make_stream(y, y[:40], 2, seed=0)
    heads = []
    learner = stsa.STSALearner(6, 4, 24, 1.0, rf_seed=0,
                               on_stage_end=[lambda t, lrn: heads.append(lrn.weights.clone())])
    run_class_incremental(learner, stream, x, y, x[:40], y[:40], num_clients=3, beta=0.5, seed=0, progress=False)
    table = stsa_studies.temporal_check(heads, stream, phi, stream.relabel(y), 1.0)
    assert list(table["classes seen"]) == [2, 4] and table["samples seen"].iloc[-1] == len(y)
    assert table["rel. err. vs joint ridge"].max() < 1e-8
    err_rev, err_split = stsa_studies.order_and_split_errors(stream, x, stream.relabel(y), rf, 24, 4, 1.0, heads[-1])
    assert err_rev < 1e-8 and err_split < 1e-8
    _, wrong = stsa_studies.order_and_split_errors(stream, x, stream.relabel(y), rf, 24, 4, 5.0, heads[-1])
    assert wrong > 1e-3   # another gamma is another head: the check can fail


def test_eq9_identity_checks(toy):
    _, y, _, phi = toy
    identity, exact = stsa_studies.eq9_identity_checks(phi[y == 0][:30], np.array([2, 3, 5, 20]))
    assert identity < 1e-10 and exact < 1e-10


def test_dummy_client_bias_global_k_is_low_and_per_class_k_is_not(toy):
    _, y, _, phi = toy
    parts = make_partition(y, 5, "dirichlet", alpha=0.1, seed=0, min_size=10)
    bias = stsa_studies.dummy_client_bias(phi, y, parts, [1, 10], 150, np.random.default_rng(0))
    assert list(bias.columns) == ["K_D", "K = 5 K_D", "K_i (holding class 0)", "k_mode", "covariance ratio"]
    assert list(bias["K = 5 K_D"]) == [5, 5, 50, 50]
    per_class = bias[bias.k_mode == "per_class"]["covariance ratio"]
    assert (abs(per_class - 1) < 0.2).all()
    low = bias[(bias.k_mode == "global") & (bias.K_D == 10)]["covariance ratio"].iloc[0]
    k_i = bias[bias.K_D == 10]["K_i (holding class 0)"].iloc[0]
    assert low < 0.9 and low == pytest.approx((k_i - 1) / 49, abs=0.2)


def test_feature_skew_study_is_unbiased_without_shifts_and_high_with_them(toy):
    x, y, rf, _ = toy
    skew = stsa_studies.feature_skew_study(x, y, rf, [0.0, 1.0], 5, 0, 150, np.random.default_rng(0))
    ratio = skew["covariance ratio E[tr(G_hat - n m m^T)] / E[tr S]"]
    assert abs(ratio.iloc[0] - 1) < 4 * skew["MC std. error"].iloc[0] + 0.02
    assert ratio.iloc[1] - 1 > 4 * skew["MC std. error"].iloc[1]


def test_feature_skew_accuracy_pairs_by_seed(toy):
    x, y, _, _ = toy
    acc = stsa_studies.feature_skew_accuracy(x[:600], y[:600], x[600:], y[600:], 2, 4, 24, 1.0, [0, 1], 0.5, 2)
    assert list(acc.index) == [0, 1]
    assert list(acc.columns) == [(0.0, "STSA"), (0.0, "STSA-E"), (0.5, "STSA"), (0.5, "STSA-E")]
    assert ((acc >= 0) & (acc <= 100)).all().all() and acc.nunique().max() >= 1
    again = stsa_studies.feature_skew_accuracy(x[:600], y[:600], x[600:], y[600:], 2, 4, 24, 1.0, [0], 0.5, 2)
    assert again.loc[0].equals(acc.loc[0])   # seeded: the same run twice


def test_gram_error_table_lemma_and_correlations():
    sigma = np.diag([1.0, 2.0, 3.0])
    law = stsa_studies.gram_error_table(np.full(3, 2.0), sigma, 30, [2, 5, 30], 400, np.random.default_rng(0))
    assert list(law.K) == [2, 5, 30]
    assert law["exact law"].tolist() == [stsa_studies.gram_error_law(30, k, sigma) for k in [2, 5, 30]]
    inner = law[law.K < 30]
    assert (abs(inner["Monte Carlo"] - inner["exact law"]) < 5 * inner["MC std. error"]).all()
    assert law["Monte Carlo"].iloc[-1] < 1e-9 * law["Monte Carlo"].iloc[0]
    assert law["paper shape (scaled at K=2)"].iloc[0] == law["Monte Carlo"].iloc[0]
    assert law["paper shape (scaled at K=2)"].iloc[1] == pytest.approx(law["Monte Carlo"].iloc[0] * (6 / 4) ** 2 / 9)
    lemma = stsa_studies.lemma_3_5_check(sigma, 10, 2000, np.random.default_rng(1))
    assert lemma["Wishart (n-1)[n tr S^2 + (tr S)^2]"] == 9 * (10 * 14 + 36)
    assert lemma["paper's Lemma 3.5 ((n-1)/n)(tr S)^2"] == pytest.approx(0.9 * 36)
    assert abs(lemma["Monte Carlo"] / lemma["Wishart (n-1)[n tr S^2 + (tr S)^2]"] - 1) < 0.1
    corr = stsa_studies.scatter_correlations(12, 4, 3000, np.random.default_rng(2))
    assert abs(corr["corr(tr B, tr(S - B))"]) < 0.08
    assert abs(corr["corr(tr B, tr S)"] - np.sqrt(3 / 11)) < 0.08


def test_plugin_rate_study_shapes_and_slopes():
    rate, rate_k, slopes, slope_k = stsa_studies.plugin_rate_study([200, 800], [2, 20], 400, 3)
    assert list(rate.index) == [200, 800] and list(rate_k.index) == [2, 20]
    per_sample = "plug-in, per sample ||X(W_E - W*)||/sqrt(n)"
    assert set(slopes) == {per_sample, "plug-in (1/n)||X(W_E - W*)||", "oracle (1/n)||XW* - Y||"}
    assert slopes["plug-in (1/n)||X(W_E - W*)||"] == pytest.approx(slopes[per_sample] - 0.5, abs=1e-9)
    assert -0.8 < slopes["oracle (1/n)||XW* - Y||"] < -0.2 and slope_k < 0


def test_gram_estimate_rank_and_secure_aggregation(toy):
    x, y, rf, _ = toy
    parts = make_partition(y, 3, "dirichlet", alpha=0.5, seed=0, min_size=2)
    rk = stsa_studies.gram_estimate_rank(x, y, parts, 4, rf, num_dummy=2)
    assert rk["rank"] <= rk["bound"] <= 3 * 2 * 4 and rk["lambda_min"] > -1e-9 * rk["lambda_max"]
    err_sum, err_masked = stsa_studies.secure_aggregation_check(x, y, parts, 4, rf, np.random.default_rng(0))
    assert err_sum < 1e-9 and err_masked > 1.0


def test_communication_table_curve_and_margins():
    from fedlib.stsa import tables

    comm = stsa_studies.communication_table(tables.stsa_table5(), np.random.default_rng(0))
    assert list(comm.method) == ["STSA", "STSA-E"] * 2
    np.testing.assert_allclose(comm["formula (MiB)"], [955.58, 95.39, 60.08, 4.77], atol=0.01)
    np.testing.assert_allclose(comm["measured messages (MiB)"], comm["formula (MiB)"], atol=0.01)
    curve = stsa_studies.communication_curve([512, 5000], num_dummy=50)
    assert list(curve.method) == ["STSA", "STSA-E (K_D=50)"] * 2
    assert curve["MiB per client (T=10)"].iloc[2] == pytest.approx(comm["formula (MiB)"].iloc[0], abs=0.01)
    margins = stsa_studies.recomputed_margins()
    assert list(margins.columns) == ["claim", "quoted", "recomputed (min)", "recomputed (max)"] and len(margins)
    assert (margins["recomputed (min)"] <= margins["recomputed (max)"]).all()


def test_paired_table():
    pivot = pd.DataFrame({(0.0, "a"): [1.0, 2.0, 3.0], (0.0, "b"): [2.0, 3.0, 5.0],
                          (1.0, "a"): [1.0, 1.0, 1.0], (1.0, "b"): [0.0, 1.0, 2.0]})
    table, eff = paired_table(pivot, [0.0, 1.0], "a", "b")
    assert list(table.index) == [0.0, 1.0] and table.index.name == "shift scale"
    assert list(table.columns) == ["a", "b", "b − a (paired)"]
    assert table.loc[0.0, "a"] == "2.00 ± 1.00" and table.loc[0.0, "b"] == "3.33 ± 1.53"
    assert table.loc[0.0, "b − a (paired)"].startswith("+1.33 [") and table.loc[1.0, "a"] == "1.00 ± 0.00"
    assert eff["a"].mean == pytest.approx(-1.0) and eff["b"].mean == pytest.approx(-7 / 3) and eff["a"].n == 3


@pytest.fixture(scope="module")
def feats():
    x, y = synthetic_features(720, 6, 4, kind="mean_dominated", seed=1)
    return Features("toy", x[:600].astype(np.float32), y[:600], x[600:].astype(np.float32), y[600:], tuple(range(4)))


@pytest.fixture(scope="module")
def run():
    return partial(stsa_studies.run_fcil, num_tasks=2, num_clients=3, gamma=1.0, num_dummy=2, head="argmax",
                   fed_kwargs=dict(rounds=1, local_epochs=1, batch_size=64, lr=0.05, device="cpu", eval_every=10**6))


def test_pretrained_grid_tables_and_findings(feats, run):
    results = stsa_studies.pretrained_grid(run, feats, "pretrained / toy", [0.5, 1.0], [0, 1], ["finetune"], [0], 16)
    assert len(results) == 2 * 2 + 2 * 2 * len(stsa_studies.ANALYTIC) + 2
    summary = pd.DataFrame([r.summary() for r in results])
    # the seeds in two forked processes: the same runs, in the same order
    forked = stsa_studies.pretrained_grid(run, feats, "pretrained / toy", [0.5, 1.0], [0, 1], ["finetune"], [0], 16, workers=2)
    timing = [c for c in summary if c.endswith("_s")]        # measured seconds differ
    pd.testing.assert_frame_equal(pd.DataFrame([r.summary() for r in forked]).drop(columns=timing),
                                  summary.drop(columns=timing))
    joint = summary[summary.method == stsa_studies.JOINT]
    assert sorted(joint.beta) == [0.5, 0.5, 1.0, 1.0] and joint.groupby("seed").A_T.nunique().max() == 1
    table, seeds_per_method = stsa_studies.results_table(summary)
    assert seeds_per_method["finetune"] == 1 and seeds_per_method["STSA"] == 2
    assert [c[0] for c in table.columns[:3]] == [1.0] * 3
    assert " ± " in table.loc[("pretrained / toy", "STSA"), (1.0, "A_T")]
    paired = stsa_studies.paired_against(summary, "STSA", "A_T")
    assert "finetune" not in set(paired["STSA minus"]) and len(paired) == 2 * (len(stsa_studies.ANALYTIC) - 1 + 1)
    stsa_e = paired[(paired["STSA minus"] == "STSA-E") & (paired.beta == 0.5)].iloc[0]
    a = summary[(summary.method == "STSA") & (summary.beta == 0.5)].sort_values("seed").A_T.to_numpy()
    b = summary[(summary.method == "STSA-E") & (summary.beta == 0.5)].sort_values("seed").A_T.to_numpy()
    assert stsa_e["mean"] == pytest.approx((a - b).mean()) and stsa_e["n"] == 2
    pre, spread, gap = stsa_studies.exactness_check(summary)
    assert len(pre) == 4 and spread.max() < 1e-9 and gap < 0.05
    fnd = stsa_studies.benchmark_findings(summary, paired, ["finetune"])
    assert fnd["kmode_gap"] >= 0 and list(fnd["ft_mean"].index) == ["finetune"] and len(fnd["e_vs"]) == 2
    assert fnd["stsa_ft"] == pytest.approx(summary[summary.method == "STSA"].F_T.mean())


def test_ablation_skew_and_large_first_task(feats, run):
    abl = stsa_studies.ablation_runs(run, feats, 0.5, 0, 16, [6, 16], [3, 6], 12, [1, 2], [1.0, 100.0])
    assert list(abl.ablation.unique()) == ["M (pretrained)", "K (K·K_D fixed)", "K_D", "gamma"]
    assert len(abl) == 4 + 6 + 4 + 4
    k_rows = abl[(abl.ablation == "K (K·K_D fixed)") & (abl.method == "STSA")]
    assert k_rows.A_T.max() - k_rows.A_T.min() < 1e-9
    skew = stsa_studies.skew_grid(run, feats, 0.5, [0, 1], 16, 0.5)
    assert list(skew.columns) == [(0.0, "STSA"), (0.0, "STSA-E (per-class K)"), (0.5, "STSA"),
                                  (0.5, "STSA-E (per-class K)")] and list(skew.index) == [0, 1]
    large = stsa_studies.large_first_task(run, feats, 0.5, [0, 1], 16, 2, 1, ["STSA", "STSA-E"])
    assert list(large.index) == ["STSA", "STSA-E"] and list(large.columns) == ["A_avg", "A_T", "F_T"]


def test_noise_study_reuses_equal_q_s_runs_and_builds_the_tables(feats, run):
    grid = [[0.1, 0.5], [0.5, 0.1], [1.0, 2.0]]
    runs, grams = stsa_studies.noise_study(run, feats, 0.5, [0, 1], 16, grid)
    assert len(runs) == (2 + 3 * 5) * 2 + 3 * 2   # clean STSA / STSA-E, 5 variants per grid point, E copies
    a = runs[(runs.setting == "q=0.1, s=0.5")].set_index(["variant", "seed"]).A_T
    b = runs[(runs.setting == "q=0.5, s=0.1")].set_index(["variant", "seed"]).A_T
    assert a.equals(b)   # equal q * s: the same run
    assert torch.equal(grams[("q=0.1, s=0.5", "STSA", 0)], grams[("q=0.5, s=0.1", "STSA", 0)])
    table, moved, changes = stsa_studies.noise_tables(runs, grams, grid, 0)
    assert list(table.index) == ["Original"] + [f"q={q}, s={s}" for q, s in grid]
    assert list(table.columns) == list(stsa_studies.NOISE_VARIANTS) and table.isna().sum().sum() == 0
    assert (moved[("||G_noisy - G|| / ||G||", "STSA-E2")] > 0).all()
    assert (moved[("||G_noisy - G|| / ||G||", "STSA-E2, counts rounded")] == 0).sum() >= 1
    assert list(changes.setting.unique()) == ["q=0.1, s=0.5", "q=0.5, s=0.1"] and len(changes) == 10
    assert changes["max |change|"].min() >= 0 and changes.d.iloc[0].n == 2


def test_benchmark_data_and_features_share_one_draw():
    data = stsa_studies.benchmark_data(["optdigits"], {}, 300, 100, 5)
    assert len(data["optdigits"].y_train) == 300 and len(data["optdigits"].y_test) == 100
    used = stsa_studies.benchmark_features("optdigits", {}, 300, 100, backbone="raw", cache_dir=False, progress=False)
    assert np.array_equal(used.y_train, data["optdigits"].y_train) and used.x_train.shape == (300, 64)
    np.testing.assert_array_equal(used.x_train, data["optdigits"].x_train.reshape(300, -1) / np.float32(255.0))
    sub = stsa_studies.benchmark_images("optdigits", {"optdigits": [1000, 300]}, 300, 100)   # a subset of a subset
    assert len(sub.y_train) == 300 and len(sub.y_test) == 100 and "[train=1000,test=300,seed=0]" in sub.name
    with pytest.raises(ValueError):
        stsa_studies.benchmark_data(["optdigits"], {}, 300, 100, 3)   # 3 tasks do not divide 10 classes


def test_scratch_features_grid_and_end_to_end_baselines(tmp_path):
    from fedlib.data.datasets import Dataset

    rng = np.random.default_rng(0)
    y_tr, y_te = np.repeat(np.arange(4), 20), np.repeat(np.arange(4), 5)
    img = lambda y: (rng.integers(0, 40, (len(y), 8, 8)) + 50 * y[:, None, None]).astype(np.uint8)
    ds = Dataset("toy", img(y_tr), y_tr, img(y_te), y_te, ("a", "b", "c", "d"))
    fed = dict(local_epochs=1, batch_size=8, lr=0.05, device="cpu", eval_every=10**6)
    stream, f, cost = stsa_studies.scratch_features(ds, 2, 2, 0.5, 0, fed, 2, (4, 4, 8), cache_dir=tmp_path, progress=False)
    assert f.x_train.shape == (80, 8) and cost["rounds"] == 2 and stream.tasks[0].num_classes == 2
    run = partial(stsa_studies.run_fcil, num_tasks=2, num_clients=2, gamma=1.0, num_dummy=1)
    results, stage1 = stsa_studies.scratch_grid(run, ds, "scratch / toy", [0.5], [0], 2, 2, fed, 2, (4, 4, 8), 16,
                                        cache_dir=tmp_path, progress=False)
    assert [r.method for r in results] == list(stsa_studies.ANALYTIC) + [stsa_studies.JOINT]
    assert stage1 == [{"beta": 0.5, "seed": 0, **cost}]   # the cached backbone of the same (beta, seed)
    base = stsa_studies.scratch_baseline_runs(["finetune"], ds, "scratch / toy", 2, 2, 1.0, fed, 1, {}, (4, 4, 8), min_size=1,
                                      progress=False, cache_dir=tmp_path)
    assert len(base) == 1 and base[0].acc.shape == (2, 2) and base[0].config == {"setting": "scratch / toy",
                                                                                 "beta": 0.5, "seed": 0}
    # the run is cached like the backbone: the same settings read it back, equal in every field
    assert len(list(tmp_path.glob("scratch_baseline__*finetune*.npz"))) == 1
    again = stsa_studies.scratch_baseline_runs(["finetune"], ds, "scratch / toy", 2, 2, 1.0, fed, 1, {}, (4, 4, 8),
                                       min_size=1, progress=False, cache_dir=tmp_path)[0]
    assert np.array_equal(again.acc, base[0].acc, equal_nan=True) and np.array_equal(again.wall_s, base[0].wall_s)
    assert again.costs == base[0].costs and again.config == base[0].config and again.method == "finetune"
    fresh = stsa_studies.scratch_baseline_runs(["finetune"], ds, "scratch / toy", 2, 2, 1.0, fed, 2, {}, (4, 4, 8),
                                       min_size=1, progress=False, cache_dir=tmp_path)[0]   # another setting: a new run
    assert len(list(tmp_path.glob("scratch_baseline__*finetune*.npz"))) == 2 and fresh.acc.shape == (2, 2)
