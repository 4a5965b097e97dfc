"""STSA / STSA-E: exactness (eqs. 2-8), the Gram estimate (eq. 9, Prop. 3.1), learners, costs."""
import numpy as np
import pytest
import torch

from fedlib.stsa import algorithm as stsa
from fedlib.stsa import speed as stsa_speed
from fedlib.stsa import noise as stsa_noise
from fedlib.stsa import studies as stsa_studies
from fedlib.core.linalg import SufficientStats, ridge_fit
from fedlib.data.streams import make_stream
from fedlib.federated.incremental import run_class_incremental
from fedlib.core.messages import Message


def _toy(n=600, d=5, classes=6, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    x = rng.standard_normal((n, d)) + y[:, None] * 0.3
    return x, y


@pytest.mark.parametrize("clients, beta", [(1, None), (3, 0.1), (7, 1.0), (20, 100.0)])
def test_stsa_equals_joint_ridge_on_all_data_seen_for_any_partition(clients, beta):
    x, y = _toy()
    xt, yt = _toy(60, seed=1)
    stream = make_stream(y, yt, 3, seed=0)
    learner = stsa.STSALearner(5, 6, M=40, gamma=0.5, rf_seed=3)
    res = run_class_incremental(learner, stream, x, y, xt, yt, clients, beta, progress=False)
    # after the last stage: joint ridge on the random features of all training data
    ref = ridge_fit(learner.features(x), stream.relabel(y), 6, lam=0.5)
    assert float((learner.weights - ref).abs().max() / ref.abs().max()) < 1e-10
    # and after stage 1 it was joint ridge on task 1 only: recompute with a fresh learner
    first = stsa.STSALearner(5, 6, M=40, gamma=0.5, rf_seed=3)
    idx = stream.tasks[0].train_idx
    parts = stream.client_partitions(0, y, clients, beta)
    first.learn_task(0, [(torch.from_numpy(x[p]), torch.from_numpy(stream.relabel(y[p]))) for p in parts], 2)
    ref1 = ridge_fit(first.features(x[idx]), stream.relabel(y[idx]), 2, lam=0.5)
    assert torch.allclose(first.weights, ref1, rtol=0, atol=1e-10 * float(ref1.abs().max()))
    assert res.acc.shape == (3, 3)


def test_temporal_aggregation_is_order_free():
    x, y = _toy()
    phi = stsa.RandomFeatures(5, 30, seed=1)(x)
    stages = [np.flatnonzero(y // 2 == t) for t in range(3)]
    grams = []
    for order in ([0, 1, 2], [2, 0, 1]):
        server = stsa.STSAServer(30, 6, gamma=1.0)
        for t in order:
            msg = Message("c", {"G": phi[stages[t]].T @ phi[stages[t]],
                                "C": SufficientStats.from_data(phi[stages[t]], y[stages[t]] - 2 * t, 2).xty})
            server.receive_stage([msg], 2 * t, 2)
        grams.append(server.solve(6))
    assert torch.allclose(grams[0], grams[1], atol=1e-12)


def _scattered(rng, j=12, m=7, c=4, high=5):
    counts = torch.from_numpy(rng.integers(0, high, (j, c))).double()
    sums = torch.from_numpy(rng.standard_normal((j, m, c))).double() * counts[:, None, :] + counts[:, None, :]
    return sums, counts


@pytest.mark.parametrize("k_mode", stsa.K_MODES)
def test_vectorized_gram_estimate_equals_printed_eq9(k_mode):
    sums, counts = _scattered(np.random.default_rng(0))
    fast, slow = stsa.gram_estimate(sums, counts, k_mode), stsa_studies.gram_estimate_eq9(sums, counts, k_mode)
    assert float((fast - slow).abs().max() / slow.abs().max()) < 1e-12
    assert float(torch.linalg.eigvalsh(fast)[0]) > -1e-9 * float(fast.abs().max())  # PSD


@pytest.mark.parametrize("k_mode", stsa.K_MODES)
@pytest.mark.parametrize("clip", [False, True])
def test_gram_estimate_with_a_noisy_class_total_below_one_is_finite_and_psd(k_mode, clip):
    # class 0: one sample on one client, its count perturbed by upload noise to 0.9 (>= MIN_COUNT,
    # so the server keeps it); the printed (n-1)/(K-1) is negative there: it gave NaN (sqrt) before
    rng = np.random.default_rng(3)
    sums = torch.from_numpy(rng.random((3, 5, 2)))
    counts = torch.tensor([[0.9, 4.0], [0.0, 3.0], [0.0, 2.0]], dtype=torch.float64)
    sums[1:, :, 0] = 0.0
    g = stsa.gram_estimate(sums, counts, k_mode, clip)
    assert bool(torch.isfinite(g).all())
    assert float(torch.linalg.eigvalsh(g)[0]) > -1e-12 * float(g.abs().max())
    # at most one sample: no within-class scatter, so class 0 adds only its mean term n m m^T
    # (nothing with the authors' clipping, as their max(0, .) on both coefficients gives)
    s0 = sums[0, :, 0]
    only_class1 = stsa.gram_estimate(sums[:, :, 1:], counts[:, 1:], k_mode, clip)
    expected = only_class1 + (0.0 if clip else 1.0) * torch.outer(s0, s0) / 0.9
    assert torch.allclose(g, expected, rtol=1e-12, atol=1e-12)
    # continuous at n = 1, where the printed eq. 9 is exact (one sample)
    counts[0, 0] = 1.0
    if not clip:
        assert torch.allclose(stsa.gram_estimate(sums, counts, k_mode), stsa_studies.gram_estimate_eq9(sums, counts, k_mode),
                              rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="counts must be >= 0"):
        stsa.gram_estimate(sums, -counts, k_mode)


def test_gram_estimate_is_exact_with_one_sample_per_client():
    rng = np.random.default_rng(1)
    x = torch.from_numpy(rng.random((9, 6)))
    sums, counts = x[:, :, None], torch.ones(9, 1, dtype=torch.float64)
    assert torch.allclose(stsa.gram_estimate(sums, counts), x.T @ x, atol=1e-12)


def _design_mc(x, counts, k_mode, reps, seed=0):
    """Mean of G_hat over random assignments of the class's samples to clients of fixed sizes."""
    rng = np.random.default_rng(seed)
    cuts = np.cumsum(counts)[:-1]
    acc = torch.zeros(x.shape[1], x.shape[1], dtype=torch.float64)
    sq = torch.zeros_like(acc)
    for _ in range(reps):
        groups = np.split(rng.permutation(len(x)), cuts)
        sums = torch.stack([x[g].sum(0) for g in groups])[:, :, None]
        g = stsa.gram_estimate(sums, torch.tensor(counts, dtype=torch.float64)[:, None], k_mode)
        acc += g
        sq += g * g
    mean = acc / reps
    se = torch.sqrt((sq / reps - mean * mean).clamp_min(0) / reps)
    return mean, se


def test_prop_3_1_unbiased_by_monte_carlo_when_every_client_holds_the_class():
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.random((40, 4)) ** 2)
    mean, se = _design_mc(x, [1, 3, 6, 10, 20], "global", reps=3000)
    z = ((mean - x.T @ x) / se).abs()
    assert float(z.max()) < 5.0  # within 5 standard errors in every entry


def test_printed_eq9_is_biased_with_empty_clients_and_per_class_k_is_not():
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.random((40, 4)) ** 2)
    g = x.T @ x
    m = x.mean(0)
    scatter = g - 40 * torch.outer(m, m)
    counts = [0, 0, 5, 15, 20]  # two of K = 5 clients lack the class (label skew)
    mean_g, se_g = _design_mc(x, counts, "global", reps=2000)
    mean_c, se_c = _design_mc(x, counts, "per_class", reps=2000)
    assert float(((mean_c - g) / se_c).abs().max()) < 5.0
    assert float(((mean_g - g) / se_g).abs().max()) > 20.0
    # E[B] = (K_i - 1) S / (n - 1), so the covariance part shrinks by (K_i - 1)/(K - 1) = 2/4
    ratio = torch.trace(mean_g - 40 * torch.outer(m, m)) / torch.trace(scatter)
    assert float(ratio) == pytest.approx(0.5, rel=0.05)


def test_random_features_are_seeded_and_raw_at_m_equal_d():
    a, b = stsa.RandomFeatures(8, 50, seed=4), stsa.RandomFeatures(8, 50, seed=4)
    assert torch.equal(a.weight, b.weight) and not torch.equal(a.weight, stsa.RandomFeatures(8, 50, seed=5).weight)
    x = np.random.default_rng(0).standard_normal((3, 8))
    assert (a(x) >= 0).all() and a(x).shape == (3, 50)
    assert torch.equal(stsa.RandomFeatures(8, 8)(x), torch.from_numpy(x))


def test_dummy_splits_partition_the_client():
    labels = np.repeat([0, 1, 2], [7, 5, 1])
    for split in stsa.SPLITS:
        parts = stsa.dummy_split(labels, 4, split, seed=0)
        assert sorted(np.concatenate(parts).tolist()) == list(range(13)) and len(parts) == 4
    strat = stsa.dummy_split(labels, 4, "stratified")
    assert all(np.isin([0, 1], labels[p]).all() for p in strat)  # classes with >= 4 samples reach every dummy


def test_stsae_message_holds_sums_and_counts_of_each_dummy_client():
    x, y = _toy(50, classes=3)
    rf = stsa.RandomFeatures(5, 11)
    msg = stsa.stsae_client(x, y, 3, rf, num_dummy=4, seed=1)
    assert msg["C"].shape == (4, 11, 3) and msg["n"].shape == (4, 3)
    assert torch.allclose(msg["C"].sum(0), SufficientStats.from_data(rf(x), y, 3).xty)
    assert msg["n"].sum(0).tolist() == np.bincount(y, minlength=3).tolist()
    assert msg.nbytes == (4 * 11 * 3 + 4 * 3) * 8
    full = stsa.stsa_client(x, y, 3, rf)
    assert full.nbytes == (11 * 11 + 11 * 3) * 8


def test_stsae_approaches_stsa_as_dummy_clients_grow():
    x, y = _toy(3000, d=6, classes=4, seed=2)
    xt, yt = _toy(400, d=6, classes=4, seed=3)
    stream = make_stream(y, yt, 2)
    errs = []
    exact = stsa.STSALearner(6, 4, M=60, gamma=1.0)
    run_class_incremental(exact, stream, x, y, xt, yt, 3, 0.5, progress=False, min_size=64)
    for kd in (1, 4, 64):
        est = stsa.STSALearner(6, 4, M=60, gamma=1.0, variant="stsa_e", num_dummy=kd, k_mode="per_class")
        run_class_incremental(est, stream, x, y, xt, yt, 3, 0.5, progress=False, min_size=64)
        errs.append(float((est.server.gram - exact.server.gram).norm() / exact.server.gram.norm()))
    assert errs[0] > errs[1] > errs[2]


def _noisy_count_servers(sd, round_counts):
    gen = torch.Generator().manual_seed(0)
    rng = np.random.default_rng(0)
    x, y = rng.random((40, 3)), np.repeat([0, 1], 20)
    rf = stsa.RandomFeatures(3, 3)
    clean = [stsa.stsae_client(x[k::2], y[k::2], 2, rf, num_dummy=4, seed=k) for k in range(2)]
    noisy = [stsa_noise.add_upload_noise(m, 0.1, sd / 0.1, gen, entries=("n",)) for m in clean]
    servers = [stsa.STSAServer(3, 2, 1.0, "stsa_e", round_counts=round_counts, noisy_counts=True) for _ in range(2)]
    servers[0].receive_stage(clean, 0, 2)
    servers[1].receive_stage(noisy, 0, 2)
    return servers


def test_upload_noise_keeps_g_symmetric_and_scales_with_q_s():
    gen = torch.Generator().manual_seed(0)
    msg = Message("c", {"G": torch.eye(4, dtype=torch.float64), "C": torch.zeros(40, 20, dtype=torch.float64),
                        "n": torch.zeros(3, 2, dtype=torch.float64)})
    noisy = stsa_noise.add_upload_noise(msg, q=1.0, s=2.0, generator=gen)
    assert torch.allclose(noisy["G"], noisy["G"].T)
    assert 1.8 < float(noisy["C"].std()) < 2.2
    assert torch.equal(stsa_noise.add_upload_noise(msg, 0.0, 1.0, gen)["G"], msg["G"])


def test_small_count_noise_reaches_the_gram_estimate_unless_counts_are_rounded():
    # count noise of sd 0.01 (q=0.1, s=0.1 of Table 7): rounding would erase it bit for bit
    clean, noisy = _noisy_count_servers(0.01, round_counts=False)
    rel = float((noisy.gram - clean.gram).norm() / clean.gram.norm())
    assert 1e-6 < rel < 1e-2
    clean_r, noisy_r = _noisy_count_servers(0.01, round_counts=True)
    assert torch.equal(clean_r.gram, noisy_r.gram)


def test_counts_below_min_count_are_empty_clients():
    sums = torch.zeros(3, 2, 1, dtype=torch.float64)
    sums[:, :, 0] = torch.tensor([[1.0, 2.0], [3.0, 1.0], [0.0, 0.0]])
    noisy_counts = torch.tensor([[1.0], [2.0], [0.2]], dtype=torch.float64)  # a true 0 with noise +0.2
    server = stsa.STSAServer(2, 1, 1.0, "stsa_e", k_mode="per_class", noisy_counts=True)
    server.receive_stage([Message("c", {"C": sums, "n": noisy_counts})], 0, 1)
    ref = stsa.gram_estimate(sums[:2], noisy_counts[:2], "per_class")
    assert torch.allclose(server.gram, ref, rtol=0, atol=1e-12)


def test_cosine_head_differs_from_argmax_where_column_norms_differ():
    w = torch.tensor([[1.0, 3.0], [0.0, 3.0]], dtype=torch.float64)
    phi = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    # scores <phi, w_c> = (1, 3): argmax picks 1; cosines (1, 1/sqrt 2): the cosine head picks 0
    assert stsa.predict(w, phi).item() == 1
    assert stsa.predict(w, phi, "cosine").item() == 0
    # normalizing phi changes neither rule
    assert stsa.predict(w, 5 * phi, "cosine").item() == 0 and stsa.predict(w, 5 * phi).item() == 1


def test_afl_stagewise_learner_fits_each_task_alone():
    x, y = _toy()
    xt, yt = _toy(60, seed=1)
    stream = make_stream(y, yt, 3)
    learner = stsa_studies.AFLStagewiseLearner(5, 6, M=30, gamma=0.5)
    res = run_class_incremental(learner, stream, x, y, xt, yt, 4, 0.5, progress=False)
    idx = stream.tasks[2].train_idx
    # like for like with STSA: the aggregated head carries gamma in total (gamma / K per client)
    ref = ridge_fit(learner.features(x[idx]), stream.relabel(y[idx]) - 4, 2, lam=0.5)
    assert torch.allclose(learner.weights[:, 4:6], ref, atol=1e-9 * float(ref.abs().max()))
    assert res.bytes_up.min() > 0


@pytest.mark.parametrize("solver", stsa_studies.JointRidgeLearner.SOLVERS)
def test_joint_learner_is_ridge_on_all_data_seen_by_lstsq(solver):
    x, y = _toy()
    xt, yt = _toy(60, seed=1)
    stream = make_stream(y, yt, 3, seed=0)
    joint = stsa_studies.JointRidgeLearner(5, 6, M=40, gamma=0.5, rf_seed=3, solver=solver)
    res = run_class_incremental(joint, stream, x, y, xt, yt, 4, 0.5, progress=False)
    assert res.bytes_up.sum() == 0
    # independent reference: numpy lstsq of [Phi; sqrt(gamma) I] W = [Y; 0] on the pooled data
    phi = joint.features(x).numpy()
    a = np.vstack([phi, np.sqrt(0.5) * np.eye(40)])
    b = np.vstack([np.eye(6)[stream.relabel(y)], np.zeros((40, 6))])
    ref = np.linalg.lstsq(a, b, rcond=None)[0]
    assert np.abs(joint.weights.numpy() - ref).max() < 1e-8 * np.abs(ref).max()
    # and STSA, federated over 4 clients, gives the same head
    fed = stsa.STSALearner(5, 6, M=40, gamma=0.5, rf_seed=3)
    res_fed = run_class_incremental(fed, stream, x, y, xt, yt, 4, 0.5, progress=False)
    assert np.abs(fed.weights.numpy() - ref).max() < 1e-8 * np.abs(ref).max()
    assert np.allclose(res.acc, res_fed.acc, equal_nan=True)


def _skew_covariance_ratio(shift_scale, reps=400, seed=0):
    """tr(E[G_hat] - n m m^T) / E[tr S] for one class of 60 samples on 4 clients of 15, each client's
    samples shifted by its own delta_k (feature skew; scale 0 = label skew only)."""
    rng = np.random.default_rng(seed)
    base = rng.standard_normal((60, 3))
    shifts = stsa_studies.client_shifts(4, 3, shift_scale, np.ones(3), seed=1)
    est, true = 0.0, 0.0
    for _ in range(reps):
        x = torch.from_numpy(base[rng.permutation(60)] + np.repeat(shifts, 15, axis=0))
        sums = torch.stack([x[15 * k:15 * (k + 1)].sum(0) for k in range(4)])[:, :, None]
        g_hat = stsa.gram_estimate(sums, torch.full((4, 1), 15.0, dtype=torch.float64), "per_class")
        m = x.mean(0)
        mean_term = 60 * torch.outer(m, m)
        est += float(torch.trace(g_hat - mean_term))
        true += float(torch.trace(x.T @ x - mean_term))
    return est / true


def test_gram_estimate_unbiased_under_label_skew_but_overestimates_scatter_under_feature_skew():
    assert _skew_covariance_ratio(0.0) == pytest.approx(1.0, abs=0.1)
    assert _skew_covariance_ratio(1.0) > 1.5


def test_feature_skew_learner_shifts_each_client_and_checks_the_client_count():
    x, y = _toy()
    xt, yt = _toy(60, seed=1)
    stream = make_stream(y, yt, 3, seed=0)
    shifts = stsa_studies.client_shifts(3, 5, 0.5, x.std(0), seed=0)
    assert shifts.shape == (3, 5)
    joint = stsa_studies.FeatureSkewLearner(stsa_studies.JointRidgeLearner(5, 6, M=20, gamma=0.5), shifts)
    run_class_incremental(joint, stream, x, y, xt, yt, 3, 0.5, progress=False)
    parts = [stream.client_partitions(t, y, 3, 0.5) for t in range(3)]
    pooled = np.concatenate([x[p] + shifts[k] for t in range(3) for k, p in enumerate(parts[t])])
    assert np.allclose(np.sort(np.concatenate(joint.learner._x), axis=0),
                       np.sort(joint.learner.features(pooled).numpy(), axis=0))
    with pytest.raises(ValueError, match="num_clients"):
        run_class_incremental(stsa_studies.FeatureSkewLearner(stsa_studies.JointRidgeLearner(5, 6, 20, 0.5), shifts),
                              stream, x, y, xt, yt, 4, 0.5, progress=False)


def test_between_client_scatter_is_independent_of_s_minus_b_not_of_s():
    """The derivation's step: for Gaussian features, B ~ Wishart(Sigma, K-1) and S - B ~ Wishart(Sigma,
    n-K) are independent; B and S = B + (S - B) are not (corr(tr B, tr S) = sqrt((K-1)/(n-1)))."""
    n, k = 12, 4
    tb, ts = stsa_studies.scatter_traces(n, k, 4000, np.random.default_rng(0))
    assert abs(np.corrcoef(tb, ts - tb)[0, 1]) < 0.06
    assert np.corrcoef(tb, ts)[0, 1] == pytest.approx(np.sqrt((k - 1) / (n - 1)), abs=0.06)


def test_communication_formulas_reproduce_table5():
    assert round(stsa_studies.communication_mib("stsa", 5000, 10), 2) == 955.58
    assert round(stsa_studies.communication_mib("stsa_e", 5000, 10, num_dummy=50), 2) == 95.39
    assert round(stsa_studies.communication_mib("stsa", 1250, 10), 2) == 60.08
    assert round(stsa_studies.communication_mib("stsa_e", 1250, 10, num_dummy=10), 2) == 4.77


def test_measured_message_bytes_match_the_formula():
    x, y = _toy(80, classes=3)
    rf = stsa.RandomFeatures(5, 20)
    full = stsa.stsa_client(x, y, 3, rf, upload_dtype=torch.float32)
    est = stsa.stsae_client(x, y, 3, rf, num_dummy=5, upload_dtype=torch.float32)
    assert full.nbytes == stsa_studies.upload_floats("stsa", 20, 3) * 4
    assert est.nbytes == stsa_studies.upload_floats("stsa_e", 20, 3, 5) * 4


def test_stsae_refuses_a_partition_with_clients_smaller_than_k_d_before_any_work():
    x, y = _toy()
    stream = make_stream(y, y[:60], 3)
    learner = stsa.STSALearner(5, 6, 10, 1.0, variant="stsa_e", num_dummy=8)
    with pytest.raises(ValueError, match="min_size >= 8"):
        run_class_incremental(learner, stream, x, y, x[:60], y[:60], 3, 0.5, progress=False)


@pytest.mark.parametrize("call, match", [
    (lambda: stsa.RandomFeatures(5, 0), "M"),
    (lambda: stsa.dummy_split(np.zeros(3, int), 4), "K_D"),
    (lambda: stsa.gram_estimate(torch.ones(1, 3, 1), torch.ones(1, 1)), "K_D"),
    (lambda: stsa.STSAServer(3, 2, gamma=-1.0), "gamma"),
    (lambda: stsa.STSALearner(5, 2, 10, 1.0, variant="stsa_x"), "variant"),
    (lambda: stsa.STSALearner(5, 2, 10, 1.0, head="softmax"), "head"),
    (lambda: stsa.STSALearner(5, 2, 10, 1.0, num_dummy=0), "K_D"),
    (lambda: stsa_studies.JointRidgeLearner(5, 2, 10, 1.0, solver="qr"), "solver"),
    (lambda: stsa_studies.client_shifts(3, 2, -1.0, 1.0), "scale"),
])
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# ----------------------------------------------------------------------------------------------
# the one protocol: client program, server, broadcast, measured cost, per-client seeds, callbacks
# ----------------------------------------------------------------------------------------------
def _stage_clients(x, y, stream, t, k, beta=0.5, min_size=1):
    parts = stream.client_partitions(t, y, k, beta, min_size=min_size)
    return [(torch.from_numpy(x[p]), torch.from_numpy(stream.relabel(y[p]))) for p in parts]


@pytest.mark.parametrize("variant, extra", [("stsa", {}), ("stsa_e", {"num_dummy": 2})])
def test_learner_cost_is_measured_and_counts_the_broadcast(variant, extra):
    from fedlib.core.protocol import simulate
    from fedlib.core.seeds import derive_seed

    x, y = _toy()
    xt, yt = _toy(60, seed=1)
    stream = make_stream(y, yt, 3, seed=0)
    learner = stsa.STSALearner(5, 6, M=16, gamma=0.5, variant=variant, rf_seed=3, seed=4, **extra)
    res = run_class_incremental(learner, stream, x, y, xt, yt, 4, 0.5, min_size=2, progress=False)
    assert learner.cost.bytes_up == int(res.bytes_up.sum()) > 0
    # the broadcast: rf_seed, M, stage, offset, num_classes (5 numbers of 8 bytes) to 4 clients, 3 stages
    assert learner.cost.bytes_down == 3 * 4 * 5 * 8
    assert learner.cost.seconds > 0
    # the clients' states persist across stages: R was regenerated once per client, from the broadcast seed
    assert sorted(learner.states) == [0, 1, 2, 3]
    assert all(torch.equal(s["features"].weight, learner.features.weight) for s in learner.states.values())
    if variant == "stsa_e":  # dummy split of client k at stage t from derive_seed(seed, "dummy_split", t, k)
        server = stsa.STSAServer(16, 6, 0.5, "stsa_e")
        server.begin_stage(rf_seed=3, M=16, stage=1, offset=2, num_classes=2)
        clients = _stage_clients(x, y, stream, 1, 2, min_size=2)
        simulate(server, learner.client, clients)
        for k, (xk, yk) in enumerate(clients):
            expect = stsa.stsae_client(xk, yk.numpy() - 2, 2, learner.features, 2,
                                       seed=derive_seed(4, "dummy_split", 1, k))
            got = learner.client.step((xk, yk), learner.client.init_state(k), server.broadcast())
            assert torch.equal(got["C"], expect["C"]) and torch.equal(got["n"], expect["n"])


def test_upload_noise_is_drawn_per_client_from_its_own_stream():
    from fedlib.core.seeds import torch_generator

    x, y = _toy()
    client = stsa.STSAClient("stsa", seed=7, noise=(0.1, 1.0), noise_entries=("C",))
    server = stsa.STSAServer(8, 6, 1.0)
    server.begin_stage(rf_seed=0, M=8, stage=2, offset=0, num_classes=6)
    data = (torch.from_numpy(x[:50]), torch.from_numpy(y[:50]))
    clean = stsa.STSAClient("stsa").step(data, {"k": 1, "name": "client1", "features": None}, server.broadcast())
    noisy = client.step(data, client.init_state(1), server.broadcast())
    expect = stsa_noise.add_upload_noise(clean, 0.1, 1.0, torch_generator(7, "upload_noise", 2, 1), entries=("C",))
    assert torch.equal(noisy["C"], expect["C"]) and torch.equal(noisy["G"], clean["G"])
    other = client.step(data, client.init_state(2), server.broadcast())
    assert not torch.equal(other["C"], noisy["C"])   # another client, another stream
    # the draws are kept per (seed, stage, client) and reused by every noise level: bit for bit the same
    for q, s in [(0.2, 0.5), (0.1, 5.0)]:
        level = stsa.STSAClient("stsa", seed=7, noise=(q, s), noise_entries=("G", "C"))
        got = level.step(data, level.init_state(1), server.broadcast())
        ref = stsa_noise.add_upload_noise(clean, q, s, torch_generator(7, "upload_noise", 2, 1), entries=("G", "C"))
        assert torch.equal(got["G"], ref["G"]) and torch.equal(got["C"], ref["C"])
    assert {key[0] for key in stsa_noise._UNIT_NOISE} == {7}


def test_on_stage_end_callbacks_see_every_stage_head():
    x, y = _toy()
    xt, yt = _toy(60, seed=1)
    stream = make_stream(y, yt, 3, seed=0)
    seen = []
    keep = [lambda t, lrn: seen.append((t, lrn.weights.clone()))]
    learner = stsa.STSALearner(5, 6, M=16, gamma=0.5, on_stage_end=keep)
    run_class_incremental(learner, stream, x, y, xt, yt, 3, 0.5, progress=False)
    assert [t for t, _ in seen] == [0, 1, 2] and [w.shape[1] for _, w in seen] == [2, 4, 6]
    assert torch.equal(seen[-1][1], learner.weights)


def test_afl_stagewise_learner_runs_on_the_protocol_with_its_cost():
    x, y = _toy()
    xt, yt = _toy(60, seed=1)
    stream = make_stream(y, yt, 3, seed=0)
    learner = stsa_studies.AFLStagewiseLearner(5, 6, M=16, gamma=2.0)
    res = run_class_incremental(learner, stream, x, y, xt, yt, 4, 0.5, progress=False)
    # each client: W (M, c_t), C (M, M), gamma; broadcast adds the per-client gamma (6 numbers)
    assert int(res.bytes_up.sum()) == learner.cost.bytes_up == 3 * 4 * ((16 * 2 + 16 * 16) * 8 + 8)
    assert learner.cost.bytes_down == 3 * 4 * 6 * 8


def test_server_receive_stage_equals_broadcast_then_receive():
    x, y = _toy()
    rf = stsa.RandomFeatures(5, 12, seed=1)
    msgs = [stsa.stsa_client(x[k::3], y[k::3], 6, rf) for k in range(3)]
    a, b = stsa.STSAServer(12, 8, 1.0), stsa.STSAServer(12, 8, 1.0)
    a.receive_stage(msgs, offset=2, num_classes=6)
    b.begin_stage(rf_seed=1, M=12, stage=0, offset=2, num_classes=6)
    b.receive(msgs)
    assert torch.equal(a.solve(8), b.result())


def test_run_fcil_and_the_learner_factory():
    from fedlib.data.features import Features

    x, y = _toy()
    xt, yt = _toy(60, seed=1)
    feats = Features("toy", x.astype(np.float32), y, xt.astype(np.float32), yt, tuple(range(6)))
    kw = dict(num_tasks=3, num_clients=3, gamma=1.0, num_dummy=2)
    for method in list(stsa_studies.ANALYTIC) + [stsa_studies.JOINT]:
        res, lrn = stsa_studies.run_fcil(method, feats, 0.5, 0, "toy", 16, return_learner=True, **kw)
        assert res.method == method and res.acc.shape == (3, 3) and lrn.cost.bytes_up == int(res.bytes_up.sum())
    skewed = stsa_studies.run_fcil("STSA", feats, 0.5, 0, "toy", 16, skew=0.5, **kw)
    plain = stsa_studies.run_fcil("STSA", feats, 0.5, 0, "toy", 16, **kw)
    assert not np.array_equal(skewed.acc, plain.acc)   # the features arrive shifted per client


def test_shared_expansion_and_final_only_equal_the_per_client_path():
    from fedlib.data.features import Features

    x, y = _toy(240)
    xt, yt = _toy(90, seed=1)
    feats = Features("toy", x.astype(np.float32), y, xt.astype(np.float32), yt, tuple(range(6)))
    kw = dict(num_tasks=3, num_clients=3, gamma=1.0, num_dummy=2)
    for method in list(stsa_studies.ANALYTIC) + [stsa_studies.JOINT]:
        (own, lo), (shared, ls) = (stsa_studies.run_fcil(method, feats, 0.5, 1, "toy", 24, return_learner=True,
                                                 share_expansion=flag, **kw) for flag in (False, True))
        assert np.array_equal(own.acc, shared.acc, equal_nan=True), method
        assert torch.allclose(ls.weights, lo.weights, rtol=1e-9, atol=1e-12), method
        assert np.array_equal(own.bytes_up, shared.bytes_up) and (shared.wall_s > 0).all()
        if method != stsa_studies.JOINT:   # feature skew: each client's rows moved by its own delta_k, then expanded once
            own, shared = (stsa_studies.run_fcil(method, feats, 0.5, 1, "toy", 24, skew=0.5, share_expansion=flag, **kw)
                           for flag in (False, True))
            assert np.array_equal(own.acc, shared.acc, equal_nan=True), method
    phi, per_row = stsa_speed.expanded_features(feats, 1, 24)
    assert stsa_speed.expanded_features(feats, 1, 24)[0] is phi and per_row >= 0   # computed once
    assert np.allclose(phi.x_train, stsa.RandomFeatures(5, 24, seed=1)(feats.x_train).numpy(), rtol=1e-12)
    # final_only: one evaluation, after the last stage; STSA solves once, for the same head
    full = stsa_studies.run_fcil("STSA-E", feats, 0.5, 1, "toy", 24, **kw)
    last, lrn = stsa_studies.run_fcil("STSA-E", feats, 0.5, 1, "toy", 24, final_only=True, return_learner=True, **kw)
    assert np.array_equal(last.acc[-1], full.acc[-1]) and np.isnan(last.acc[:-1]).all()
    assert last.summary()["A_T"] == full.summary()["A_T"] and np.isnan(last.summary()["A_avg"])
    assert not lrn.solve_every_stage
    with pytest.raises(ValueError, match="evaluate must be"):
        run_class_incremental(lrn, make_stream(y, yt, 3), x, y, xt, yt, 3, 0.5, evaluate="sometimes")


def test_derivation_helpers():
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((30, 4)))
    errors, mean = stsa_studies.design_monte_carlo(x, [10, 10, 10], "global", 50, np.random.default_rng(1))
    assert list(errors.columns) == ["repetitions", "rel. error of the mean"] and mean.shape == (4, 4)
    row = stsa_studies.plugin_errors(200, 5, 0)
    assert row["n"] == 200 and row["K K_D"] == 5 and row["plug-in (1/n)||X(W_E - W*)||"] > 0
    tensors = [torch.ones(3, 3) * k for k in range(4)]
    masked = stsa_studies.pairwise_masked([t.double() for t in tensors], np.random.default_rng(0))
    assert torch.allclose(sum(masked), sum(t.double() for t in tensors), atol=1e-9)
    assert float((masked[0] - tensors[0]).abs().max()) > 1.0


def test_validators_name_the_parameter():
    with pytest.raises(ValueError, match=r"num_dummy \(K_D\) must be an integer >= 1"):
        stsa.STSALearner(5, 6, M=8, gamma=1.0, num_dummy=0)
    with pytest.raises(ValueError, match="M must be an integer >= 1"):
        stsa.RandomFeatures(5, 0)
    with pytest.raises(ValueError, match="num_clients must be an integer >= 1"):
        stsa_studies.client_shifts(True, 3, 0.1, 1.0)


def test_gram_error_law_matches_monte_carlo_and_vanishes_at_k_equal_n():
    sigma = np.diag([1.0, 2.0, 3.0])
    mean, se = stsa_studies.gram_error_monte_carlo(np.ones(3), sigma, 20, 4, 800, np.random.default_rng(0))
    assert abs(mean - stsa_studies.gram_error_law(20, 4, sigma)) < 5 * se
    assert stsa_studies.gram_error_law(20, 20, sigma) == 0.0
    with pytest.raises(ValueError, match="k must be an integer >= 2"):
        stsa_studies.gram_error_law(20, 1, sigma)


def test_feature_skew_scatter_ratio_is_one_without_shifts_and_above_with_them():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((60, 4))
    rf = stsa.RandomFeatures(4, 4)
    sizes = np.array([15, 15, 15, 15])
    flat, se = stsa_studies.feature_skew_scatter_ratio(x, rf, sizes, np.zeros((4, 4)), 300, rng)
    assert abs(flat - 1) < 4 * se
    skewed, se2 = stsa_studies.feature_skew_scatter_ratio(x, rf, sizes, stsa_studies.client_shifts(4, 4, 1.0, 1.0), 300, rng)
    assert skewed - 1 > 4 * se2


def test_lemma_3_5_quantity_follows_the_wishart_law_not_the_paper():
    sigma = np.diag([1.0, 2.0])
    value = stsa_studies.centred_scatter_sq_norm_monte_carlo(sigma, 6, 3000, np.random.default_rng(0))
    tr1, tr2 = 3.0, 5.0
    assert value == pytest.approx(5 * (6 * tr2 + tr1 ** 2), rel=0.1)   # (n-1)[n tr S^2 + (tr S)^2]
    with pytest.raises(ValueError, match="n = 10 must be a multiple of k = 4"):
        stsa_studies.scatter_traces(10, 4, 5, np.random.default_rng(0))
