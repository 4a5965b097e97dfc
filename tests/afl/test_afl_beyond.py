"""Issue 14, AFL: TSQR aggregation, what the upload reveals, secure aggregation, ridge path,
leave-one-client-out validation and unlearning (fedlib.afl.beyond), each checked against an
independent reference (NumPy lstsq / QR, explicit retraining)."""
import numpy as np
import pytest
import torch

from fedlib.core.linalg import SufficientStats, lstsq_reference, one_hot, relative_error, synthetic_features
from fedlib.data.partition import make_partition
from fedlib.afl import algorithm as afl
from fedlib.afl import beyond as ab

C = 4


@pytest.fixture(scope="module")
def data():
    x, y = synthetic_features(600, 12, C, "gaussian", seed=3)
    return x, y, make_partition(y, 6, "dirichlet", alpha=0.5, seed=1)


# ------------------------------------------------------------------ TSQR
def test_trapezoid_pack_roundtrip_and_length():
    rng = np.random.default_rng(0)
    for rows, cols in [(3, 7), (7, 7), (0, 5)]:
        r = np.triu(rng.standard_normal((rows, cols)))
        p = ab.pack_trapezoid(r)
        assert p.shape == (ab.trapezoid_length(rows, cols),)
        np.testing.assert_array_equal(ab.unpack_trapezoid(p, rows, cols), r)
    assert ab.trapezoid_length(5, 5) == 15 and ab.trapezoid_length(2, 5) == 9


def test_client_factor_is_qr_of_augmented_and_small_when_few_samples(data):
    x, y, _ = data
    msg = ab.tsqr_client_update(x[:5], y[:5], C)
    r = ab.upload_factor(msg)
    a = np.hstack([x[:5], np.eye(C)[y[:5]]])
    assert r.shape == (5, 12 + C)
    np.testing.assert_allclose(r.T @ r, a.T @ a, rtol=0, atol=1e-12 * np.abs(a.T @ a).max())
    # the upload: only the trapezoid, fewer bytes than AFL's packed Gram + W
    assert msg["R_packed"].size == ab.trapezoid_length(5, 16) < (16 * 17) // 2
    assert msg.nbytes < afl.client_update(x[:5], y[:5], C).nbytes


def test_tsqr_equals_lstsq_float64(data):
    x, y, parts = data
    ref = lstsq_reference(x, y, C)
    res = ab.run_tsqr(x, y, parts, C)
    assert relative_error(res.weights, ref) < 1e-10
    assert res.cost.bytes_up == sum(res.upload_bytes) > 0
    # the ridge head through appended rows equals lstsq on [X; sqrt(g) I]
    assert relative_error(ab.run_tsqr(x, y, parts, C, gamma=3.0).weights, lstsq_reference(x, y, C, lam=3.0)) < 1e-10
    # streaming (tiny flush) and one-shot reduction agree
    assert relative_error(ab.run_tsqr(x, y, parts, C, flush=1).weights, ref) < 1e-10


def test_tsqr_dead_feature_gets_zero_weight(data):
    x, y, parts = data
    x0 = x.copy()
    x0[:, 3] = 0.0
    w = ab.run_tsqr(x0, y, parts, C).weights
    assert float(w[3].abs().max()) == 0.0
    keep = [j for j in range(12) if j != 3]
    ref = lstsq_reference(x0[:, keep], y, C)
    assert relative_error(w[keep], ref) < 1e-10


def test_tsqr_beats_normal_equations_at_cond_1e8():
    x, y = synthetic_features(800, 16, C, "ill_conditioned", seed=0, condition=1e16)   # cond(X) = 1e8
    parts = make_partition(y, 4, "iid", seed=0)
    ref = lstsq_reference(x, y, C)
    e_qr = relative_error(ab.run_tsqr(x, y, parts, C).weights, ref)
    w_ne = ab.normal_equation_head(x, y, parts, C, "one_solve", 1.0)
    e_ne = relative_error(w_ne, ref) if bool(torch.isfinite(w_ne).all()) else np.inf
    assert e_qr < 1e-5          # ~ cond(X) eps
    assert e_ne > 1e3 * e_qr    # normal equations: ~ cond(X)^2 eps, i.e. no digit left


def test_conditioning_study_rows_and_slopes():
    study = ab.conditioning_study([1e2, 1e4], 300, 8, C, 3, [0, 1], progress=False)
    assert len(study) == 2 * 2 * 2 * 3
    slopes = ab.error_slopes(study)
    assert set(slopes.index.get_level_values("method")) == {"TSQR", "one-solve (normal eq.)", "pairwise AA law (paper)"}


# ------------------------------------------------------------------ what the upload reveals
def test_recover_class_sums_and_gram_from_paper_upload(data):
    x, y, parts = data
    p = parts[0]
    msg = afl.client_update(x[p], y[p], C, gamma=1.0)
    gram, xty = ab.recover_statistics(msg)
    direct = SufficientStats.from_data(x[p], y[p], C)
    assert relative_error(xty, direct.xty) < 1e-12
    assert relative_error(gram, direct.gram) < 1e-12
    sums = np.stack([x[p][y[p] == c].sum(0) for c in range(C)], 1)   # per-class feature sums, independently
    np.testing.assert_allclose(xty.numpy(), sums, rtol=0, atol=1e-12 * np.abs(sums).max())


@pytest.mark.parametrize("gamma", [1.0, 0.0])
def test_recover_one_sample_client(data, gamma):
    x, y, _ = data
    msg = afl.client_update(x[7:8], y[7:8], C, gamma=gamma)
    vec, label = ab.recover_single_sample(msg)
    assert label == y[7]
    assert relative_error(vec, torch.from_numpy(x[7])) < 1e-12


def test_recover_single_sample_refuses_other_clients(data):
    x, y, _ = data
    with pytest.raises(ValueError, match="msg must be the upload of a one-sample client"):
        ab.recover_single_sample(afl.client_update(x[:0], y[:0], C))          # empty client
    two = np.flatnonzero(y != y[0])[0]
    with pytest.raises(ValueError, match="msg must be the upload of a one-sample client"):
        ab.recover_single_sample(afl.client_update(x[[0, two]], y[[0, two]], C))


def test_masks_cancel_exactly():
    k, length = 5, 1000
    total = np.zeros(length, dtype=np.uint64)
    for i in range(k):
        total = total + ab.client_mask(42, i, k, length)
    assert not total.any()
    assert ab.client_mask(42, 0, k, length).any()


def test_fixed_point_roundtrip_and_range():
    v = np.array([-3.25, 0.0, 1e5, -1e-9, 1.0 / 3.0, -2.0 ** -60])
    bits = ab.fixed_point_bits(1e6, 10)
    assert bits[0] == 62 - 20 and bits[1] == bits[0] + 62 - 4
    # two words: the round trip keeps every float64 bit of these values (grid 2^-f_lo ~ 1e-30)
    np.testing.assert_array_equal(ab.decode_fixed(ab.encode_fixed(v, bits), bits), v)
    with pytest.raises(ValueError, match="fixed-point range"):
        ab.encode_fixed(np.array([1e7]), bits)


def test_masked_aggregation_equals_unmasked(data):
    x, y, parts = data
    bound = float(np.abs(x).max())
    masked = ab.run_secure_aggregation(x, y, parts, C, secret=7, feature_bound=bound)
    plain = ab.run_secure_aggregation(x, y, parts, C, secret=7, feature_bound=bound, masked=False)
    np.testing.assert_array_equal(masked.raw_sum, plain.raw_sum)          # the masks cancel in the ring
    assert masked.sums.n == len(y)
    one_solve = afl.run_afl(x, y, parts, C, gamma=1.0, server="one_solve").weights
    assert relative_error(masked.weights, one_solve) < 1e-10
    assert relative_error(masked.weights, lstsq_reference(x, y, C)) < 1e-10
    # what the server saw from client 0 is unrelated to client 0's statistics
    view = ab.masked_view(masked.seen[0], ab.encode_fixed(ab.stats_vector(x[parts[0]], y[parts[0]], C),
                                                          masked.frac_bits), masked.frac_bits)
    n = masked.seen[0].shape[1]     # independent vectors: correlation ~ N(0, 1/n)
    assert abs(view["correlation"]) < 4 / np.sqrt(n) and view["relative error"] > 100


def test_secure_aggregation_refuses_features_above_bound(data):
    x, y, parts = data
    with pytest.raises(ValueError, match="feature_bound"):
        ab.run_secure_aggregation(x, y, parts, C, secret=1, feature_bound=0.1)


# ------------------------------------------------------------------ ridge path, LOCO, unlearning
def test_ridge_path_equals_direct_solves(data):
    x, y, _ = data
    st = SufficientStats.from_data(x, y, C)
    lams = [0.0, 1e-3, 1.0, 50.0, 1e4]
    path = ab.ridge_path(st.gram, st.xty, lams)
    for lam, w in zip(lams, path):
        assert relative_error(w, lstsq_reference(x, y, C, lam=lam)) < 1e-10


def test_validation_error_from_statistics(data):
    x, y, parts = data
    w = torch.from_numpy(np.random.default_rng(0).standard_normal((12, C)))
    p = parts[2]
    direct = float(((one_hot(y[p], C) - torch.from_numpy(x[p]) @ w) ** 2).sum())
    assert ab.validation_error(SufficientStats.from_data(x[p], y[p], C), w) == pytest.approx(direct, rel=1e-10)


def test_loco_equals_explicit_retraining(data):
    x, y, parts = data
    lams = [0.0, 0.5, 20.0]
    err = ab.loco_errors(ab.client_statistics(x, y, parts, C), lams)
    assert err.shape == (len(parts), len(lams))
    for k, p in enumerate(parts):
        rest = np.concatenate([q for j, q in enumerate(parts) if j != k])
        for i, lam in enumerate(lams):
            w = lstsq_reference(x[rest], y[rest], C, lam=lam)                     # retrain without client k
            direct = float(((one_hot(y[p], C) - torch.from_numpy(x[p]) @ w) ** 2).sum())   # evaluate on k
            assert err[k, i] == pytest.approx(direct, rel=1e-9)
    np.testing.assert_allclose(ab.loco_errors_explicit(x, y, parts, C, lams), err, rtol=1e-9)


def test_unlearning_equals_retraining(data):
    x, y, parts = data
    clients = ab.client_statistics(x, y, parts, C)
    total = ab.sum_stats(clients)
    for k in (0, 3):
        rest = np.concatenate([q for j, q in enumerate(parts) if j != k])
        assert relative_error(ab.unlearn(total, clients[k]), lstsq_reference(x[rest], y[rest], C)) < 1e-10
    check = ab.unlearning_check(x, y, parts, C, 2)
    assert check["rel. error vs lstsq (remaining data)"] < 1e-10 and check["rel. error vs AFL retrained"] < 1e-10
    assert check["removed samples"] == len(parts[2])


# ------------------------------------------------------------------ bad input
def test_bad_inputs_name_the_parameter(data):
    x, y, parts = data
    st = SufficientStats.from_data(x, y, C)
    with pytest.raises(ValueError, match="gamma"):
        ab.run_tsqr(x, y, parts, C, gamma=-1.0)
    with pytest.raises(ValueError, match="gamma"):
        ab.tsqr_weights(np.eye(12 + C), C, gamma=-0.5)
    with pytest.raises(ValueError, match=r"lams\[1\]"):
        ab.ridge_path(st.gram, st.xty, [1.0, -2.0])
    with pytest.raises(ValueError, match="clients .* hold no sample"):
        ab.loco_errors(ab.client_statistics(x, y, [parts[0], np.array([], dtype=np.int64)], C), [1.0])
    with pytest.raises(ValueError, match="labels must be 1-D"):
        ab.tsqr_client_update(x[:5], y[:4], C)
    with pytest.raises(ValueError, match="x must be a 2-D"):
        ab.tsqr_client_update(x[0], y[:1], C)
    with pytest.raises(ValueError, match="gram must be"):
        ab.ridge_path(st.gram[:, :5], st.xty, [1.0])
    with pytest.raises(ValueError, match="weights must be"):
        ab.validation_error(st, torch.zeros(3, C))
    with pytest.raises(ValueError, match="removed must have the shapes"):
        ab.unlearn(st, SufficientStats.zeros(5, C))
    with pytest.raises(ValueError, match=r"parts\[0\]"):
        ab.run_tsqr(x, y, [np.array([0, 10**6])], C)
    with pytest.raises(ValueError, match="unknown dtype"):
        ab.run_tsqr(x, y, parts, C, dtype="float16")
    with pytest.raises(ValueError, match="parts must hold at least 2"):
        ab.run_secure_aggregation(x, y, parts[:1], C, secret=0, feature_bound=10.0)


# ------------------------------------------------------------------ the chapter's typed parameters
@pytest.mark.parametrize("name, bad, message", [
    ("gamma", -1.0, "gamma must be a finite number >= 0"),
    ("conditions", [1e4, 0.5], r"conditions\[1\] must be a finite number >= 1"),
    ("conditions", [1e6, 1e4], "conditions must be strictly increasing"),
    ("seeds", [0], "seeds must hold at least 2"),
    ("mask_clients", 1, "mask_clients must be an integer >= 2"),
    ("loco_clients", 1, "loco_clients must be an integer >= 2"),
    ("ridge_grid", [0.0, 1.0], r"ridge_grid\[0\] must be a finite number > 0"),
    ("feature_bound", 0.0, "feature_bound must be"),
    ("unlearn_client", 99, "unlearn_client must be < loco_clients"),
    ("cond_dim", 10**6, "cond_dim must be <= cond_samples"),
    ("backbone", "vgg", "unknown backbone 'vgg'"),
])
def test_chapter_parameters_are_checked(name, bad, message):
    from conftest import chapter_values
    from fedlib.runner import specs

    with pytest.raises(ValueError, match=message):
        specs.check("afl_beyond", chapter_values("afl_beyond", **{name: bad}))
    specs.check("afl_beyond", chapter_values("afl_beyond"))   # the defaults pass
