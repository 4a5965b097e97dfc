"""The AFL chapters' checks and tables (fedlib.afl.algorithm, moved out of the notebooks): real values,
tolerances a wrong aggregation fails."""
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from fedlib.core.linalg import (live_columns_with_bias, lstsq_reference, normal_equations_tolerance, synthetic_features)
from fedlib.data.partition import make_partition
from fedlib.afl import studies as afl_studies

N, D, C = 600, 12, 4


@pytest.fixture(scope="module")
def data():
    x, y = synthetic_features(N, D, C, "gaussian", seed=5)
    return x, y, lstsq_reference(x, y, C)


def _feats(x, y, n_test=150):
    return SimpleNamespace(x_train=x[n_test:], y_train=y[n_test:], x_test=x[:n_test], y_test=y[:n_test],
                           num_classes=C, dim=x.shape[1], name="toy")


def test_two_client_check_corrected_sign_is_exact_and_printed_sign_fails(data):
    x, y, w = data
    table, ids = afl_studies.two_client_check(x, y, C, w)
    assert list(table["AA law"]) == ["corrected (+)", "as printed (-)"]
    assert table.loc[0, "max rel. error"] < 1e-10 and table.loc[1, "max rel. error"] > 0.5
    assert ids["max|W_u - S^-1 C_u|"] < 1e-10 and ids["max|W_u + W_v - I|"] < 1e-10


def test_partition_sweep_heads_equal_joint_for_every_partition(data):
    x, y, w = data
    settings = [("iid", {}), ("dirichlet", {"alpha": 0.05}), ("shards", {"shards_per_client": 2})]
    table, agree, checks = afl_studies.partition_sweep(x, y, C, settings, 20, 0, w)
    assert list(table.partition.unique()) == ["iid", "dirichlet alpha=0.05", "shards shards_per_client=2"]
    assert len(table) == 6 and table["max rel. error vs joint"].max() < 1e-8
    assert agree.max() < 1e-8 and checks["spread"] < 1e-8 and checks["same predictions"]
    assert (table.groupby("partition")["smallest N_k"].first() <= N / 20).all()


def test_client_count_sweep_skips_too_many_clients_and_caps_the_pairwise_server(data):
    x, y, w = data
    table = afl_studies.client_count_sweep(x, y, C, [1, 30, 2 * N], 0, w, pairwise_max_clients=10)
    assert list(zip(table.K, table.server)) == [(1, "pairwise"), (1, "one_solve"), (30, "one_solve")]
    assert table["max rel. error vs joint"].max() < 1e-10 and list(table.N_k) == [N, N, N // 30]


def test_order_sweep_draws_one_permutation_per_order(data):
    x, y, _ = data
    parts = make_partition(y, 8, "dirichlet", alpha=0.1, seed=0)
    rng = np.random.default_rng(0)
    table, scale = afl_studies.order_sweep(x, y, parts, C, 3, rng)
    assert len(table) == 6 and table["max |W - W(order 0..K-1)|"].max() < 1e-8 * scale and scale > 0
    expected = np.random.default_rng(0)
    for _ in range(3):
        expected.permutation(8)
    assert rng.integers(1 << 30) == expected.integers(1 << 30)   # the same stream was consumed


def test_unrestored_head_is_ridge_with_k_gamma(data):
    x, y, w = data
    table = afl_studies.unrestored_is_ridge(x, y, C, [(10, 2.0), (3 * N, 1.0)], 0, w)
    assert list(table.K) == [10] and table.loc[0, "K·gamma"] == 20.0
    assert table.loc[0, "max rel. |W^r_agg - ridge(λ=Kγ)|"] < 1e-10
    assert table.loc[0, "max rel. |W^r_agg - W_joint|"] > 1e-3   # the ridge is not the joint head


def test_conditioning_check_meets_its_tolerance_and_rejects_the_unrestored_head():
    table = afl_studies.conditioning_check([1e6], [1e3], 400, 10, C, 5, 0)
    assert list(zip(table.dtype, table.server)) == [("float64", "one_solve"), ("float64", "pairwise"),
                                                    ("float32", "one_solve"), ("float32", "pairwise")]
    np.testing.assert_allclose(table["cond(XᵀX)"], [1e6, 1e6, 1e3, 1e3], rtol=1e-3)
    one = table[table.server == "one_solve"]
    assert (one["error / tolerance"] < 1).all()
    assert (table["unrestored (wrong) head"] > table["tolerance 2·κ·u"]).all()


def test_gamma_precision_sweep_counts_errors_and_changed_predictions(data):
    x, y, w = data
    parts = make_partition(y, 5, "iid", seed=0)
    fp = afl_studies.gamma_precision_sweep(x, y, C, parts, [1e-3, 1.0], w)
    assert len(fp) == 8 and set(fp.dtype) == {"float64", "float32"}
    f64 = fp[fp.dtype == "float64"]
    assert f64["max rel. error"].max() < 1e-8 and (f64["changed predictions"] == 0).all()
    f32 = fp[fp.dtype == "float32"]
    assert 1e-9 < f32["max rel. error"].min() < 1e-2 and (fp["rank-deficient solves"] >= 0).all()


def test_client_count_accuracy_is_the_same_for_every_k(data):
    x, y, _ = data
    w = lstsq_reference(x[150:], y[150:], C)
    real = afl_studies.client_count_accuracy(x[150:], y[150:], x[:150], y[:150], C, [1, 10, 10 ** 6], 0, w)
    assert list(real.K) == [1, 10] and real["max rel. error vs joint"].max() < 1e-8
    acc = float((np.argmax(x[:150] @ w.numpy(), 1) == y[:150]).mean())
    assert real["test accuracy"].nunique() == 1 and real["test accuracy"].iloc[0] == pytest.approx(acc)


def test_live_columns_with_bias_drops_constant_pixels():
    imgs = np.zeros((5, 2, 2), dtype=np.uint8)
    imgs[:, 0, 1] = [0, 51, 102, 153, 255]
    imgs[:, 1, 1] = 7                      # constant, not zero: dropped too
    test = np.full((2, 2, 2), 255, dtype=np.uint8)
    x, xt, keep = live_columns_with_bias(imgs, test)
    assert keep.tolist() == [False, True, False, False]
    np.testing.assert_allclose(x, [[0, 1], [0.2, 1], [0.4, 1], [0.6, 1], [1, 1]])
    np.testing.assert_allclose(xt, [[1, 1], [1, 1]])


def test_draw_all_caches_every_combination(data):
    _, y, _ = data
    parts = afl_studies.SettingPartitions(y)
    parts.draw_all([("alpha", 0.5), ("iid", None)], [4, 6], [0, 1])
    assert len(parts._cache) == 8 and parts(("alpha", 0.5), 6, 1) is parts._cache[(("alpha", 0.5), 6, 1)]
    with pytest.raises(ValueError, match="setting kind"):
        parts.draw_all([("beta", 1.0)], [4], [0])


def test_centralized_reference_and_setting_runs(data):
    x, y, _ = data
    feats = _feats(x, y)
    ref = afl_studies.centralized_reference(feats)
    assert ref["qr_error"] < 1e-12 and ref["joint_acc"] == ref["qr_acc"] and ref["report"]["rank"] == D
    assert ref["qr_tol"] == normal_equations_tolerance(ref["report"]["condition number"]) > 0
    runs = afl_studies.afl_setting_runs(feats, afl_studies.SettingPartitions(feats.y_train), [("alpha", 0.1), ("iid", None)], 6,
                                [0, 1, 0], 1.0, "cpu", ref["w_qr"])
    assert list(runs.setting) == ["α=0.1", "α=0.1", "IID", "IID"] and list(runs["partition seed"]) == [0, 1, 0, 1]
    assert (runs.accuracy == ref["joint_acc"]).all() and runs["max rel. |W - W_QR|"].max() < 1e-10
    assert (runs["uploads per client"] == 1).all()
    # float64 W_k^r and the upper triangle of C_k^r, d(d+1)/2 numbers (the default packed upload; + gamma)
    matrices = (D * (D + 1) // 2 + D * C) * 8
    assert matrices <= runs["upload bytes/client"].iloc[0] <= matrices + 64


def _runs():
    return pd.DataFrame({"setting": ["a"] * 6, "method": ["fedavg"] * 3 + ["moon"] * 3, "seed": [0, 1, 2] * 2,
                         "accuracy": [0.5, 0.6, 0.7, 0.4, 0.45, 0.5], "seconds to final accuracy": [1.0] * 6,
                         "seconds per round": [0.5] * 6, "upload bytes/client/round": [100.0] * 3 + [1000.0] * 3})


def test_accuracy_table_and_paired_differences():
    runs, afl_acc = _runs(), pd.Series({"a": 0.8})
    table = afl_studies.accuracy_table(runs, ["a"], ["fedavg", "moon"], afl_acc)
    assert table.loc["a"].tolist() == ["60.00 ± 10.00", "45.00 ± 5.00", "80.00 ± 0.00"]
    paired = afl_studies.paired_against_afl(runs, ["a"], ["fedavg", "moon"], afl_acc)
    assert paired.loc[0, "AFL − method (pp)"].startswith("+20.00 [")
    assert paired.loc[0, "afl_low"] == pytest.approx(0.2 - 4.302653 * 0.1 / np.sqrt(3), rel=1e-5)
    assert paired.loc[1, "method − FedAvg (pp)"].startswith("-15.00 [")
    assert pd.isna(paired.loc[0, "method − FedAvg (pp)"])
    adv = afl_studies.advantage_summary(runs, afl_acc, paired)
    assert adv["afl_best"].tolist() == [True] and adv["resolved"] == 1 and adv["smallest"] == pytest.approx(0.2)


def test_cost_table_and_upload_crossings():
    afl_runs = pd.DataFrame({"partition seed": [0, 1], "seconds": [2.0, 9.0], "upload bytes/client": [450.0, 450.0]})
    cost, secs, nbytes = afl_studies.cost_table(_runs(), afl_runs, 0, 200)
    assert secs == 2.0 and nbytes == 450.0
    assert cost["time ratio vs AFL (our budget)"].tolist() == [0.5, 0.5]
    assert cost["time ratio vs AFL (200 rounds)"].tolist() == [50.0, 50.0]
    assert cost["rounds until its upload passes AFL's"].tolist() == [5, 1]
    assert afl_studies.upload_crossings(cost, ["fedavg", "moon"]) == (["fedavg"], 5, 1)
    assert afl_studies.upload_crossings(cost.loc[["moon"]], ["moon"]) == ([], None, 1)


def test_final_gain_and_protocol_spread():
    curves = pd.DataFrame({"setting": ["a"] * 4, "method": ["m"] * 4, "seed": [0] * 4,
                           "test_acc": [0.1, 0.2, 0.4, 0.7]})
    gain, window = afl_studies.final_gain(curves, rounds=25)
    assert window == 2 and gain.iloc[0] == pytest.approx(0.5)
    fixed = _runs().assign(protocol="fixed partition")
    resampled = fixed[fixed.method == "fedavg"].assign(protocol="new partition per seed", accuracy=[0.3, 0.5, 0.7])
    spread, ratio = afl_studies.protocol_spread(fixed, resampled)
    assert spread.loc[("a", "fedavg")].tolist() == ["60.00 ± 10.00", "50.00 ± 20.00"]
    assert ratio.loc[("a", "fedavg")] == pytest.approx(2.0)


def test_afl_vs_fedavg_and_the_ri_ablation(data):
    x, y, _ = data
    feats = _feats(x.astype(np.float32), y)
    parts = afl_studies.SettingPartitions(feats.y_train)
    config = dict(rounds=1, local_epochs=1, batch_size=64, lr=0.05, device="cpu", eval_every=1)
    out = afl_studies.afl_vs_fedavg(feats, [(k, parts(("alpha", 0.5), k, 0)) for k in [3, 9]], config, 0, 1.0, "cpu",
                            index="K", progress=False)
    assert out.index.name == "K" and out.columns.name == "method" and list(out.columns) == ["AFL", "FedAvg (1 seed)"]
    assert out["AFL"].nunique() == 1 and ((0 <= out["FedAvg (1 seed)"]) & (out["FedAvg (1 seed)"] <= 1)).all()
    ri = afl_studies.ri_ablation(feats, [(k, parts(("alpha", 0.5), k, 0)) for k in [3, 9]], [1.0, 3.0], "cpu")
    # the other gammas from one protocol run's aggregate equal the full protocol at every gamma
    rerun = afl_studies.ri_ablation(feats, [(k, parts(("alpha", 0.5), k, 0)) for k in [3, 9]], [1.0, 3.0], "cpu", rerun=True)
    assert np.abs(ri.to_numpy() - rerun.to_numpy()).max() <= 100 / len(feats.y_test) + 1e-9
    assert list(ri.columns) == [(1.0, "w/o RI"), (1.0, "w/ RI"), (3.0, "w/o RI"), (3.0, "w/ RI")]
    with_ri = ri.xs("w/ RI", axis=1, level="RI").to_numpy()
    assert np.unique(with_ri).size == 1 and with_ri[0, 0] == pytest.approx(100 * out["AFL"].iloc[0])
    # a RunCache hands the sweep's runs (gamma = 1) to the ablation, which shifts them down and up
    cache = afl_studies.RunCache()
    cached = afl_studies.afl_vs_fedavg(feats, [(k, parts(("alpha", 0.5), k, 0)) for k in [3, 9]], config, 0, 1.0, "cpu",
                               index="K", progress=False, cache=cache)
    assert cached.equals(out) and cache.hits == 0
    again = afl_studies.afl_vs_fedavg(feats, [(k, parts(("alpha", 0.5), k, 0)) for k in [3, 9]], config, 0, 1.0, "cpu",
                              index="K", progress=False, cache=cache)
    assert again.equals(out) and cache.hits == 4   # 2 AFL + 2 FedAvg runs reused
    shifted = afl_studies.ri_ablation(feats, [(k, parts(("alpha", 0.5), k, 0)) for k in [3, 9]], [0.5, 3.0], "cpu",
                              base_gamma=1.0, cache=cache)
    assert cache.hits == 6
    rerun2 = afl_studies.ri_ablation(feats, [(k, parts(("alpha", 0.5), k, 0)) for k in [3, 9]], [0.5, 3.0], "cpu", rerun=True)
    assert np.abs(shifted.to_numpy() - rerun2.to_numpy()).max() <= 100 / len(feats.y_test) + 1e-9
    no_ri, same = afl_studies.equal_kgamma_cells(ri)
    assert sorted(no_ri["K·γ"]) == [3.0, 9.0, 9.0, 27.0]
    assert list(same.index) == [9.0] and same.loc[9.0, "count"] == 2
    assert same.loc[9.0, "max"] - same.loc[9.0, "min"] <= 100 / len(feats.y_test) + 1e-9
