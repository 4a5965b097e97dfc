"""AFL exactness (AA law, RI process) on random data, with tolerances a wrong formula fails."""
import warnings

import numpy as np
import pytest
import torch

from fedlib.papers import afl
from fedlib.core.linalg import (SufficientStats, gram_report, normal_equations_tolerance, relative_error, ridge_fit,
                             ridge_solve, synthetic_features)
from fedlib.data.partition import make_partition

N, D, C = 1500, 24, 5
EPS64, EPS32 = np.finfo(np.float64).eps, np.finfo(np.float32).eps


def lstsq(x, y, num_classes=C):
    """Independent reference: NumPy's SVD least squares on X itself (not the normal equations)."""
    return torch.from_numpy(np.linalg.lstsq(np.asarray(x, dtype=np.float64), np.eye(num_classes)[y], rcond=None)[0])


@pytest.fixture(scope="module")
def data():
    x, y = synthetic_features(N, D, C, "gaussian", seed=3)
    return x, y, lstsq(x, y)


def test_stats_add_across_clients(data):
    x, y, _ = data
    parts = np.array_split(np.arange(N), 7)
    total = SufficientStats.zeros(D, C)
    for p in parts:
        total += SufficientStats.from_data(x[p], y[p], C)
    whole = SufficientStats.from_data(x, y, C, chunk=100)
    assert total.n == N
    torch.testing.assert_close(total.gram, whole.gram, rtol=1e-12, atol=1e-10)
    torch.testing.assert_close(total.xty, whole.xty, rtol=1e-12, atol=1e-10)


def test_ridge_fit_matches_numpy(data):
    x, y, _ = data
    y1 = np.eye(C)[y]
    expected = np.linalg.solve(x.T @ x + 3.0 * np.eye(D), x.T @ y1)
    np.testing.assert_allclose(ridge_fit(x, y, C, 3.0).numpy(), expected, rtol=1e-10, atol=1e-12)


def test_client_update_is_local_ridge(data):
    x, y, _ = data
    msg = afl.client_update(x[:40], y[:40], C, gamma=2.0)
    y1 = np.eye(C)[y[:40]]
    np.testing.assert_allclose(msg["C"].numpy(), x[:40].T @ x[:40] + 2.0 * np.eye(D), rtol=1e-12)
    np.testing.assert_allclose(msg["W"].numpy(), np.linalg.solve(msg["C"].numpy(), x[:40].T @ y1), rtol=1e-9)
    assert msg.nbytes == (D * D + D * C) * 8 + 8


def test_empty_client_uploads_gamma_identity():
    msg = afl.client_update(np.zeros((0, D)), np.zeros(0, dtype=int), C, gamma=1.5)
    torch.testing.assert_close(msg["C"], 1.5 * torch.eye(D, dtype=torch.float64))
    assert float(msg["W"].abs().max()) == 0.0


@pytest.mark.parametrize("server", ["pairwise", "one_solve"])
@pytest.mark.parametrize("k", [1, 2, 7, 60])
def test_aggregate_equals_joint_least_squares(data, server, k):
    x, y, w_joint = data
    parts = make_partition(y, k, "iid", seed=k)
    res = afl.run_afl(x, y, parts, C, gamma=1.0, server=server)
    tol = 1e-10 if server == "one_solve" else 1e-7
    assert relative_error(res.weights, w_joint) < tol
    assert res.num_clients == k and len(res.upload_bytes) == k


@pytest.mark.parametrize("alpha", [1.0, 0.01])
def test_heterogeneity_and_order_invariance(data, alpha):
    x, y, w_joint = data
    parts = make_partition(y, 40, "dirichlet", alpha=alpha, seed=1)
    order = np.random.default_rng(0).permutation(40)
    for server in ["pairwise", "one_solve"]:
        w = afl.run_afl(x, y, parts, C, gamma=1.0, server=server, order=order).weights
        assert relative_error(w, w_joint) < 1e-7


def test_aa_weights_corrected_sign_identities(data):
    x, y, _ = data
    a, b = (afl.client_update(x[p], y[p], C, 0.0)["C"] for p in np.array_split(np.arange(N), 2))
    w_a, w_b = afl.aa_weights(a, b, sign=+1)
    s_inv_a = torch.linalg.solve(a + b, a)
    assert float((w_a - s_inv_a).abs().max()) < 1e-10
    assert float((w_a + w_b - torch.eye(D, dtype=torch.float64)).abs().max()) < 1e-10


def test_printed_sign_fails(data):
    x, y, w_joint = data
    parts = np.array_split(np.arange(N), 2)
    printed = afl.run_afl(x, y, parts, C, gamma=0.0, server="pairwise", sign=-1, restore=False)
    corrected = afl.run_afl(x, y, parts, C, gamma=0.0, server="pairwise", sign=+1, restore=False)
    assert relative_error(corrected.weights, w_joint) < 1e-10
    assert relative_error(printed.weights, w_joint) > 0.5


def test_without_ri_is_ridge_with_k_gamma(data):
    x, y, w_joint = data
    k, gamma = 30, 0.7
    parts = make_partition(y, k, "iid", seed=0)
    res = afl.run_afl(x, y, parts, C, gamma=gamma, restore=False)
    assert relative_error(res.weights, ridge_fit(x, y, C, k * gamma)) < 1e-10
    assert relative_error(res.weights, w_joint) > 1e-3  # the penalty K*gamma is visible
    assert res.gamma_sum == pytest.approx(k * gamma)
    restored = afl.ri_restore(res.weights_regularized, res.gram_regularized, res.gamma_sum)
    assert relative_error(restored, w_joint) < 1e-10


def test_rank_deficient_clients_need_ri(data):
    """N_k < d: gamma = 0 with the paper's recursion (pinv) breaks, RI restores exactness."""
    x, y, w_joint = data
    parts = np.array_split(np.arange(N), 100)  # 15 samples per client < d = 24
    broken = afl.run_afl(x, y, parts, C, gamma=0.0, server="pairwise", inverse="pinv")
    fixed = afl.run_afl(x, y, parts, C, gamma=1.0, server="pairwise")
    assert float((broken.weights - w_joint).abs().sum()) > 1e-3
    assert relative_error(fixed.weights, w_joint) < 1e-7


def test_one_solve_exact_at_gamma_zero(data):
    """C_k X_k^+ Y_k = X_k^T Y_k even for rank-deficient clients: one-solve is exact at gamma = 0."""
    x, y, w_joint = data
    parts = np.array_split(np.arange(N), 100)
    res = afl.run_afl(x, y, parts, C, gamma=0.0, server="one_solve")
    assert relative_error(res.weights, w_joint) < 1e-8


def test_singular_pooled_gram_warns():
    x, y = synthetic_features(10, 20, 3, seed=0)  # N < d
    with pytest.warns(RuntimeWarning, match="singular"):
        afl.run_afl(x, y, [np.arange(5), np.arange(5, 10)], 3, gamma=1.0)


def test_ridge_solve_handles_negative_shift():
    g = torch.diag(torch.tensor([5.0, 6.0], dtype=torch.float64))
    out = ridge_solve(g, torch.eye(2, dtype=torch.float64), lam=-1.0)
    torch.testing.assert_close(out, torch.diag(torch.tensor([0.25, 0.2], dtype=torch.float64)))


@pytest.mark.parametrize("kwargs, match", [
    ({"gamma": -1.0}, "gamma"),
    ({"server": "recursive"}, "server"),
    ({"sign": 2, "server": "pairwise"}, "sign"),
    ({"inverse": "inv", "server": "pairwise"}, "inverse"),
    ({"order": [0, 0]}, "order"),
])
def test_bad_input(data, kwargs, match):
    x, y, _ = data
    parts = [np.arange(0, 100), np.arange(100, 200)]
    with pytest.raises(ValueError, match=match):
        afl.run_afl(x, y, parts, C, **kwargs)


def test_labels_out_of_range():
    with pytest.raises(ValueError, match="num_classes"):
        afl.client_update(np.ones((3, 2)), np.array([0, 1, 5]), 3)


def test_client_update_dual_form_for_small_clients(data):
    """N_k < d uses X^T (X X^T + gamma I)^{-1} Y: must equal the primal ridge solve."""
    x, y, _ = data
    msg = afl.client_update(x[:10], y[:10], C, gamma=0.5)
    y1 = np.eye(C)[y[:10]]
    primal = np.linalg.solve(x[:10].T @ x[:10] + 0.5 * np.eye(D), x[:10].T @ y1)
    np.testing.assert_allclose(msg["W"].numpy(), primal, rtol=1e-9, atol=1e-12)


# ---- references independent of the normal equations, on ill-conditioned features ----------------
@pytest.mark.parametrize("condition", [1e5, 1e8, 1e10])
@pytest.mark.parametrize("server", ["pairwise", "one_solve"])
def test_afl_matches_lstsq_on_ill_conditioned_features(condition, server):
    """Tolerance derived from the conditioning: safety * cond(X^T X) * eps; the unrestored ridge
    (a wrong answer) must fall outside it."""
    x, y = synthetic_features(2000, D, C, "ill_conditioned", seed=1, condition=condition)
    ref = lstsq(x, y)
    kappa = np.linalg.cond(x.T @ x)
    assert kappa == pytest.approx(condition, rel=0.05)
    tol = normal_equations_tolerance(kappa)
    parts = make_partition(y, 30, "iid", seed=0)
    res = afl.run_afl(x, y, parts, C, gamma=1.0, server=server)
    assert relative_error(res.weights, ref) < tol
    assert relative_error(res.weights_regularized, ref) > 100 * tol  # K*gamma ridge is visibly off


@pytest.mark.parametrize("condition", [1e3, 1e5])
def test_afl_float32_statistics_match_lstsq(condition):
    """float32 accumulation (the authors' code): error within 2 cond * eps32 of lstsq on the same
    (float32-rounded) features; float64 accumulation is 1e7x tighter."""
    x, y = synthetic_features(2000, D, C, "ill_conditioned", seed=2, condition=condition)
    x32 = x.astype(np.float32)
    ref = lstsq(x32, y)
    kappa = np.linalg.cond(x32.astype(np.float64).T @ x32.astype(np.float64))
    parts = make_partition(y, 30, "iid", seed=0)
    w32 = afl.run_afl(x32, y, parts, C, gamma=1.0, dtype=torch.float32).weights
    w64 = afl.run_afl(x32, y, parts, C, gamma=1.0).weights
    assert w32.dtype == torch.float32
    assert relative_error(w32.double(), ref) < normal_equations_tolerance(kappa, torch.float32)
    assert relative_error(w64, ref) < normal_equations_tolerance(kappa)


def test_one_solve_gamma0_matches_lstsq_ill_conditioned():
    x, y = synthetic_features(2000, D, C, "ill_conditioned", seed=3, condition=1e8)
    parts = np.array_split(np.arange(2000), 100)  # 20 samples per client < d
    res = afl.run_afl(x, y, parts, C, gamma=0.0, server="one_solve")
    assert relative_error(res.weights, lstsq(x, y)) < normal_equations_tolerance(1e8)


# ---- rank handling of ridge_solve / gram_report ----------------------------------------------------
def test_tiny_live_feature_keeps_its_weight(data):
    """A live column scaled by 1e-8 is not 'dead': its weight scales by 1e8, as lstsq says."""
    x, y, _ = data
    xs = x.copy()
    xs[:, 3] *= 1e-8
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        w = ridge_fit(xs, y, C, 0.0)
    ref = lstsq(xs, y)
    assert float(ref[3].abs().max()) > 1e6
    assert relative_error(w, ref) < 1e-6


def test_duplicated_column_warns_and_returns_min_norm(data):
    x, y, _ = data
    xd = np.hstack([x, x[:, :1]])
    with pytest.warns(RuntimeWarning, match="rank 24 of 25"):
        w = ridge_fit(xd, y, C, 0.0)
    ref = lstsq(xd, y)  # minimum-norm: splits the weight equally over the two copies
    assert relative_error(w, ref) < 1e-8
    torch.testing.assert_close(w[0], w[-1])
    report = gram_report(SufficientStats.from_data(xd, y, C).gram)
    assert report["rank"] == D and report["condition number"] == float("inf")


def test_dead_features_get_zero_weight_without_warning(data):
    x, y, w_ref = data
    xz = np.hstack([x, np.zeros((N, 2))])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        w = ridge_fit(xz, y, C, 0.0)
        res = afl.run_afl(xz, y, make_partition(y, 40, "iid", seed=0), C, gamma=1.0)
    assert float(w[D:].abs().max()) == 0.0 and float(res.weights[D:].abs().max()) == 0.0
    assert relative_error(w[:D], w_ref) < 1e-10 and relative_error(res.weights[:D], w_ref) < 1e-10
    report = gram_report(SufficientStats.from_data(xz, y, C).gram)
    assert report["zero features"] == 2 and report["rank"] == D and report["condition number"] > 0


def test_pairwise_gamma0_rank_deficient_clear_error(data):
    x, y, _ = data
    parts = np.array_split(np.arange(N), 100)  # N_k = 15 < d = 24
    with pytest.raises(ValueError, match="gamma > 0.*one_solve"):
        afl.run_afl(x, y, parts, C, gamma=0.0, server="pairwise")


def test_rcond_validated():
    with pytest.raises(ValueError, match="rcond"):
        ridge_solve(torch.eye(2, dtype=torch.float64), torch.ones(2, 1, dtype=torch.float64), rcond=2.0)


def test_pairwise_gamma0_fails_before_any_client_work(data, monkeypatch):
    x, y, _ = data
    calls = []
    monkeypatch.setattr(afl, "client_update", lambda *a, **k: calls.append(1))
    with pytest.raises(ValueError, match="N_k < d"):
        afl.run_afl(x, y, np.array_split(np.arange(N), 100), C, gamma=0.0, server="pairwise")
    assert not calls


def test_pairwise_gamma0_collinear_client_clear_error(data):
    """N_k >= d but a duplicated feature: C_k is singular although Cholesky may pass on round-off."""
    x, y, _ = data
    xd = np.hstack([x, x[:, :1]])
    with pytest.raises(ValueError, match="numerical rank 24 < d = 25"):
        afl.run_afl(xd, y, np.array_split(np.arange(N), 2), C, gamma=0.0, server="pairwise")
