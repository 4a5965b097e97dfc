"""AFL exactness (AA law, RI process) on random data, with tolerances a wrong formula fails."""
import numpy as np
import pytest
import torch

from fedlib import afl
from fedlib.analytic import SufficientStats, relative_error, ridge_fit, ridge_solve, synthetic_features
from fedlib.partition import make_partition

N, D, C = 1500, 24, 5


@pytest.fixture(scope="module")
def data():
    x, y = synthetic_features(N, D, C, "gaussian", seed=3)
    return x, y, ridge_fit(x, y, C, 0.0)


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
