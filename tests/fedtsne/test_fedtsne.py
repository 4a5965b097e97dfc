"""Fed-tSNE / Fed-UMAP / Fed-SpeClust: MMD^2 and its gradient (Eqs. 10, 13), the federated = pooled
gradient identity, Nystrom exactness (Eq. 22), the reconstruction attack, DP noise scales
(Thms 4, 6; the data-free kernel sensitivity; epsilon spent from the accountant), end-to-end
pipelines (Algorithms 1-3) and input checks."""
import math
import sys

import numpy as np
import pytest
from sklearn.metrics import adjusted_rand_score
from sklearn.model_selection import cross_val_score
from sklearn.neighbors import KNeighborsClassifier
from threadpoolctl import threadpool_limits

from fedlib.fedtsne import algorithm as ft
from fedlib.fedtsne import chapters as ft_chapters
from fedlib.fedtsne import checks as ft_checks
from fedlib.fedtsne import dp as ft_dp
from fedlib.fedtsne import feddl as ft_feddl
from fedlib.fedtsne import mmd as ft_mmd
from fedlib.fedtsne import nystrom as ft_nystrom
from fedlib.fedtsne import pipelines as ft_pipelines
from fedlib.fedtsne import studies as ft_studies
from fedlib.data.partition import make_partition


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny problems on a shared 2-core machine: OpenMP/BLAS oversubscription only slows them down."""
    with threadpool_limits(1):
        yield


def _blobs(n=210, m=20, seed=0, scale=4.0):
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((3, m)) * scale
    y = np.repeat(np.arange(3), n // 3)
    return centers[y] + rng.standard_normal((n, m)), y


def _knn_acc(Z, y):
    return cross_val_score(KNeighborsClassifier(5), Z, y, cv=5).mean()


# ------------------------------------------------------------------------------------------------
# Eq. 10 and Eq. 13
# ------------------------------------------------------------------------------------------------
def test_mmd2_u_matches_double_loop():
    rng = np.random.default_rng(0)
    X, Y, g = rng.standard_normal((6, 3)), rng.standard_normal((4, 3)), 0.3
    k = lambda a, b: math.exp(-g * float(((a - b) ** 2).sum()))  # noqa: E731
    n, ny = len(X), len(Y)
    xx = sum(k(X[i], X[j]) for i in range(n) for j in range(n) if i != j) / (n * (n - 1))
    xy = sum(k(X[i], Y[j]) for i in range(n) for j in range(ny)) * 2 / (n * ny)
    yy = sum(k(Y[i], Y[j]) for i in range(ny) for j in range(ny) if i != j) / (ny * (ny - 1))
    assert ft.mmd2_u(X, Y, g) == pytest.approx(xx - xy + yy, rel=1e-12, abs=1e-14)


def test_gradient_matches_finite_differences():
    rng = np.random.default_rng(1)
    X, Y, g = rng.standard_normal((7, 3)), rng.standard_normal((5, 3)), 0.4
    grad = ft.mmd2_u_grad(X, Y, g)
    fd = np.zeros_like(Y)
    h = 1e-6
    for idx in np.ndindex(*Y.shape):
        e = np.zeros_like(Y)
        e[idx] = h
        fd[idx] = (ft.mmd2_u(X, Y + e, g) - ft.mmd2_u(X, Y - e, g)) / (2 * h)
    assert np.allclose(grad, fd, rtol=1e-6, atol=1e-9)
    assert np.abs(grad).max() > 1e-3


@pytest.mark.parametrize("y_scale", [0.01, 1.0, 3.0])
def test_lipschitz_bound_dominates_the_hessian(y_scale):
    rng = np.random.default_rng(4)
    X, Y, g = rng.standard_normal((8, 3)), rng.standard_normal((5, 3)) * y_scale, 0.7
    H = np.zeros((15, 15))
    for k in range(15):
        e = np.zeros(15)
        e[k] = 1e-6
        e = e.reshape(5, 3)
        H[:, k] = ((ft.mmd2_u_grad(X, Y + e, g) - ft.mmd2_u_grad(X, Y - e, g)) / 2e-6).ravel()
    assert np.abs(np.linalg.eigvalsh(0.5 * (H + H.T))).max() <= ft.lipschitz_bound(g, 5)


def test_feddl_steps_up_to_two_over_the_bound_never_raise_the_objective():
    """Descent lemma with L >= the Lipschitz constant of grad F: every noise-free gradient step c/L,
    c <= 2 (lr_scale), gives F(Y^s) <= F(Y^{s-1}) (Eq. 11; round-off aside); far above 2/L it does not."""
    X, y = _blobs(90, 4)
    data = [X[ix] for ix in make_partition(y, 3, "iid", seed=0)]
    for c in (1.0, 2.0):
        F = ft_feddl.feddl(data, 6, rounds=60, lr_scale=c).objective
        assert np.diff(F).max() <= 1e-9 * (F[0] - F.min()), c
    F = ft_feddl.feddl(data, 6, rounds=60, lr_scale=64.0).objective
    assert np.diff(F).max() > 1e-3 * abs(F[0] - F.min())


@pytest.mark.parametrize("scheme", ["iid", "one_class"])
def test_size_weighted_client_gradients_equal_pooled_gradient(scheme):
    X, y = _blobs(90, 5)
    parts = make_partition(y, 3, scheme, seed=0)
    Y = np.random.default_rng(2).standard_normal((8, 5)) * 3
    n = len(X)
    fed = sum(len(ix) / n * ft.mmd2_u_grad(X[ix], Y, 0.05) for ix in parts)
    assert np.allclose(fed, ft.mmd2_u_grad(X, Y, 0.05), rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("scheme", ["iid", "one_class"])
def test_feddl_gradient_mode_is_centralized_gd_and_q1_averaging_equals_it(scheme):
    X, y = _blobs(90, 5)
    parts = make_partition(y, 3, scheme, seed=0)
    Y0 = np.random.default_rng(3).standard_normal((8, 5))
    kw = dict(rounds=15, init=Y0, gamma=0.05, weights="size")
    central = ft_feddl.feddl([X], 8, **kw)
    grad = ft_feddl.feddl([X[ix] for ix in parts], 8, mode="gradient", **kw)
    avg = ft_feddl.feddl([X[ix] for ix in parts], 8, mode="average", local_steps=1, **kw)
    assert np.allclose(grad.landmarks, central.landmarks, atol=1e-10)
    assert np.allclose(avg.landmarks, central.landmarks, atol=1e-10)
    # F(Y^s) = MMD_u(pooled, Y^s) + a constant, so the objective curves differ by a constant
    diff = grad.objective - central.objective
    assert np.allclose(diff, diff[0], atol=1e-12)
    assert central.objective[-1] < central.objective[0]


def test_feddl_result_bytes_and_shapes():
    X, y = _blobs(90, 4)
    data = [X[ix] for ix in make_partition(y, 3, "iid", seed=0)]
    res = ft_feddl.feddl(data, 6, rounds=4)
    m, P = 4, 3
    setup = P * (8 + 2 * m * 8 + 8)              # n, sum, sumsq, median_sqdist
    assert res.setup_upload_bytes == setup
    assert res.upload_bytes == setup + 4 * P * 6 * m * 8
    assert res.landmarks.shape == (6, 4) and res.objective.shape == (5,) and res.rounds == 4
    assert res.lr == pytest.approx(1 / ft.lipschitz_bound(res.gamma, 6))
    # lr_scale c: the step c/L, the same run as the explicit lr = c/L (server and clients)
    scaled = ft_feddl.feddl(data, 6, rounds=4, lr_scale=2.5)
    assert scaled.lr == scaled.server_lr == pytest.approx(2.5 / ft.lipschitz_bound(res.gamma, 6))
    np.testing.assert_array_equal(scaled.landmarks, ft_feddl.feddl(data, 6, rounds=4, lr=scaled.lr).landmarks)
    assert not np.allclose(scaled.landmarks, res.landmarks)
    avg = ft_feddl.feddl(data, 6, rounds=4, mode="average", local_steps=3)
    assert avg.upload_bytes == setup + 4 * P * 6 * m * 8  # one landmark matrix per client per round
    assert avg.objective[-1] < avg.objective[0] and res.objective[-1] < res.objective[0]


def test_median_gamma_is_weighted_mean_of_client_medians():
    X, y = _blobs(90, 4)
    data = [X[ix] for ix in make_partition(y, 3, "one_class", seed=0)]
    meds = [ft_mmd.client_median_sqdist(x) for x in data]
    res = ft_feddl.feddl(data, 4, rounds=1, weights="uniform")
    assert res.gamma == pytest.approx(1 / np.mean(meds))
    mom = ft_feddl.feddl(data, 4, rounds=1, gamma="moments")
    assert mom.gamma == pytest.approx(1 / (2 * X.var(0, ddof=1).sum()))


# ------------------------------------------------------------------------------------------------
# Nystrom (Eq. 22), clipping
# ------------------------------------------------------------------------------------------------
def test_nystrom_on_squared_distances_exact_with_m_plus_2_landmarks_and_improving_below():
    rng = np.random.default_rng(1)
    m = 6
    X = rng.standard_normal((60, m))
    Yall = rng.standard_normal((12, m)) * 1.5
    D = np.sqrt(ft_mmd.sq_distances(X))
    errs = []
    for ny in (2, 4, 6, 7, 8, 12):
        Y = Yall[:ny]
        Dh = ft.nystrom_distances(ft_mmd.sq_distances(X, Y), ft_mmd.sq_distances(Y))
        errs.append(np.linalg.norm(Dh - D) / np.linalg.norm(D))
    assert errs[-2] < 1e-10 and errs[-1] < 1e-10          # n_y >= m + 2
    assert all(a > b for a, b in zip(errs[:4], errs[1:5]))  # decreasing below
    assert errs[3] > 0.05
    # plain (non-squared) distances are never exact
    Y = Yall
    plain = ft_nystrom.nystrom(np.sqrt(ft_mmd.sq_distances(X, Y)), np.sqrt(ft_mmd.sq_distances(Y)))
    assert np.linalg.norm(plain - D) / np.linalg.norm(D) > 0.05


def test_distances_from_squared_symmetrizes_clips_and_takes_sqrt():
    D2 = np.array([[0.3, 4.0, -1.0], [4.0, 0.1, 9.0], [-3.0, 9.0, 0.0]])
    D = ft_nystrom.distances_from_squared(D2)
    assert np.array_equal(D, D.T)
    assert np.allclose(D, [[0, 2, 0], [2, 0, 3], [0, 3, 0]])


def test_landmark_pinv_rank_and_ridge():
    rng = np.random.default_rng(0)
    Y = rng.standard_normal((6, 2))
    W = ft_mmd.sq_distances(Y)                         # indefinite, rank 4
    lam, V = np.linalg.eigh(W)
    top = np.argsort(-np.abs(lam))[:2]
    assert np.allclose(ft_nystrom.landmark_pinv(W, rank=2), (V[:, top] / lam[top]) @ V[:, top].T)
    assert np.allclose(ft_nystrom.landmark_pinv(W), np.linalg.pinv(W, rcond=1e-10, hermitian=True), atol=1e-10)
    assert np.allclose(ft_nystrom.landmark_pinv(W, inverse="ridge", ridge=0.5), np.linalg.inv(W + 0.5 * np.eye(6)))
    K = ft.nystrom_kernel(rng.uniform(-1, 1, (5, 6)), W)
    assert K.min() >= 0 and np.array_equal(K, K.T)


def test_federated_distances_are_returned_in_the_row_order_of_x():
    X, y = _blobs(60, 3)
    rng = np.random.default_rng(0)
    perm = rng.permutation(len(X))
    X, y = X[perm], y[perm]
    parts = make_partition(y, 3, "one_class", seed=0)
    data = [X[ix] for ix in parts]
    res = ft_feddl.feddl(data, 8, rounds=5, init="gaussian")  # 8 >= m + 2 landmarks: exact Nystrom
    from fedlib.fedtsne.pipelines import _federated_matrix

    D, fres, cost = _federated_matrix(X, parts, 8, "distances", None, {}, res, 0, False, {})
    assert np.allclose(D, np.sqrt(ft_mmd.sq_distances(X)), atol=1e-6)
    assert cost.bytes_up == len(X) * 8 * 8 and cost.bytes_down == 3 * res.landmarks.nbytes   # Y^S to 3 clients


# ------------------------------------------------------------------------------------------------
# reconstruction attack
# ------------------------------------------------------------------------------------------------
def test_reconstruction_exact_with_m_plus_1_landmarks_else_projection():
    rng = np.random.default_rng(0)
    m = 5
    X = rng.standard_normal((20, m))
    Y = rng.standard_normal((m + 1, m))
    assert np.allclose(ft_checks.reconstruct_from_sq_distances(ft_mmd.sq_distances(X, Y), Y), X, atol=1e-9)
    Y3 = Y[:3]
    Xh, r = ft_checks.reconstruct_from_sq_distances(ft_mmd.sq_distances(X, Y3), Y3, return_residual=True)
    Q, _ = np.linalg.qr((Y3[1:] - Y3[0]).T)       # basis of the affine span's directions
    proj = Y3[0] + (X - Y3[0]) @ Q @ Q.T
    assert np.allclose(Xh, proj, atol=1e-9)
    assert np.allclose(r, np.linalg.norm(X - proj, axis=1), atol=1e-6)


# ------------------------------------------------------------------------------------------------
# the "+" variants: sensitivities, calibration by the accountant, enforced bounds, epsilon spent
# ------------------------------------------------------------------------------------------------
def test_sensitivity_formulas_against_hand_values():
    assert ft_dp.data_sensitivity(1.0) == 2.0
    # Theorem 6: Delta = 8 sqrt(n_y) gamma tau_X / (n_p n_y) {1 + 2 gamma (tau_X + tau_Y)(tau_X + Upsilon)}
    assert ft_dp.gradient_sensitivity(10, 4, 0.5, 1.0, 2.0, 3.0) == pytest.approx(8 * 2 * 0.5 / 40 * (1 + 12), rel=1e-12)
    # kernel bound: 4 sqrt(2 gamma / e) / (n_p sqrt(n_y))
    assert ft_dp.kernel_gradient_sensitivity(10, 4, 0.5) == pytest.approx(4 * math.sqrt(1 / math.e) / 20, rel=1e-12)
    # the paper's printed calibrations (comparison only)
    assert ft_dp.paper_noise_sd(0.5, 1e-5, 2.0, "dp_data") == pytest.approx(4.844805 * 2 / 0.5, rel=1e-6)
    assert ft_dp.paper_noise_sd(2.0, 1e-3, 0.1, "dp_gradient", compositions=10) == pytest.approx(
        0.1 * math.sqrt(80 * math.log(math.e + 2000)) / 2.0, rel=1e-12)


def _worst_pair(y, gamma, direction):
    """Two points on opposite sides of landmark y at the radius 1/sqrt(2 gamma) where
    r exp(-gamma r^2) peaks: the single-landmark change attains 2/sqrt(2 e gamma)."""
    r = 1.0 / math.sqrt(2 * gamma)
    return y + r * direction, y - r * direction


def test_kernel_sensitivity_bounds_every_replacement_and_is_tight_for_one_landmark():
    rng = np.random.default_rng(0)
    gamma, n_p, m = 0.3, 12, 5
    for n_y in (2, 7):
        X = rng.standard_normal((n_p, m)) * 2
        Y = rng.standard_normal((n_y, m)) * 2
        bound = ft_dp.kernel_gradient_sensitivity(n_p, n_y, gamma)
        worst = 0.0
        for _ in range(300):
            Xn = X.copy()
            Xn[rng.integers(n_p)] = rng.standard_normal(m) * rng.choice([0.3, 1.0, 3.0, 10.0])
            worst = max(worst, np.linalg.norm(ft.mmd2_u_grad(X, Y, gamma) - ft.mmd2_u_grad(Xn, Y, gamma)))
        assert worst <= bound
    # one landmark, the adversarial pair: the per-landmark bound is attained (so it cannot be lowered)
    Y = np.zeros((2, m))
    Y[1, 0] = 1e3                                      # far away: contributes nothing
    d = np.zeros(m)
    d[1] = 1.0
    a, b = _worst_pair(Y[0], gamma, d)
    X = rng.standard_normal((n_p, m)) + 50.0
    X1, X2 = X.copy(), X.copy()
    X1[0], X2[0] = a, b
    change = np.linalg.norm(ft.mmd2_u_grad(X1, Y, gamma) - ft.mmd2_u_grad(X2, Y, gamma))
    per_landmark = 4 * gamma / (n_p * 2) * 2 / math.sqrt(2 * math.e * gamma)
    assert change == pytest.approx(per_landmark, rel=1e-6)
    assert change <= ft_dp.kernel_gradient_sensitivity(n_p, 2, gamma)


@pytest.fixture(scope="module")
def optdigits600():
    from fedlib.data.datasets import load_dataset

    d = load_dataset("optdigits")
    x = np.concatenate([d.x_train, d.x_test]).reshape(-1, 64).astype(np.float64) / 255.0
    return x[np.random.default_rng(0).choice(len(x), 600, replace=False)]


def test_dp_gradient_20_rounds_stays_finite_and_spends_at_most_epsilon(optdigits600):
    """The issue's reproduction (600 optdigits points, 2 clients, 30 landmarks, 20 rounds, epsilon=1,
    delta=1e-5) used to diverge and crash; the noise sd must not feed on the noisy iterates."""
    X = optdigits600
    gamma = 1.0 / np.median(ft_mmd.sq_distances(X[:100]))
    for acc in ("pld", "rdp"):
        res = ft_feddl.feddl([X[:300], X[300:]], 30, rounds=20, noise="dp_gradient", epsilon=1.0, delta=1e-5,
                       gamma=gamma, init="uniform", dp_accountant=acc)
        assert np.all(np.isfinite(res.landmarks))
        assert res.epsilon <= 1.0 and res.epsilon > 0.95      # spent, from the accountant, and not wasted
        assert res.noise_sd.shape == (20, 2)
        assert np.all(res.noise_sd == res.noise_sd[0])       # fixed sd: no feedback from noisy landmarks
        sens = ft_dp.kernel_gradient_sensitivity(300, 30, gamma)
        assert res.noise_sd[0, 0] == pytest.approx(res.noise_multiplier * sens)
        assert res.setup_upload_bytes <= 2 * 64                # sizes only
        assert math.isinf(ft_dp.end_to_end_epsilon(res))           # the distance upload is not covered


def test_dp_gradient_theorem6_enforces_its_bounds():
    X, y = _blobs(60, 4)
    data = [X[:30], X[30:]]
    res = ft_feddl.feddl(data, 5, rounds=20, noise="dp_gradient", epsilon=1.0, delta=1e-5, gamma=0.05, init="gaussian",
                   dp_sensitivity="theorem6", tau_x=2.0, tau_y=3.0)
    assert np.all(np.linalg.norm(res.client_data[0], axis=1) <= 2.0 + 1e-12)     # rows clipped
    assert np.linalg.norm(res.landmarks, 2) <= 3.0 + 1e-9                         # landmarks projected
    assert res.sensitivity[0] == pytest.approx(ft_dp.gradient_sensitivity(30, 5, 0.05, 2.0, 3.0, 5.0))
    assert res.epsilon <= 1.0
    # Theorem 6's Delta / the kernel bound = sqrt(2 e gamma) tau_X {1 + 2 gamma (tau_X + tau_Y)(tau_X + Upsilon)}
    ratio = res.sensitivity[0] / ft_dp.kernel_gradient_sensitivity(30, 5, 0.05)
    assert ratio == pytest.approx(math.sqrt(2 * math.e * 0.05) * 2.0 * (1 + 2 * 0.05 * 5.0 * 7.0), rel=1e-12)
    assert ratio > 4


def test_dp_data_clips_to_public_tau_and_uses_the_analytic_gaussian():
    from fedlib.core import privacy

    X, y = _blobs(60, 4)
    data = [X[:30], X[30:]]
    tau = 3.0
    assert max(np.linalg.norm(x, axis=1).max() for x in data) > tau      # clipping is active
    for eps in (0.5, 4.0):                                                # valid for epsilon >= 1 too
        dd = ft_feddl.feddl(data, 5, rounds=3, noise="dp_data", epsilon=eps, delta=1e-5, tau_x=tau, gamma=0.05,
                      init="gaussian", seed=1)
        sd = privacy.analytic_gaussian_sigma(eps, 1e-5, 2 * tau)
        assert np.allclose(dd.noise_sd, sd)
        assert dd.epsilon <= eps and dd.epsilon == pytest.approx(eps, rel=1e-6)
        # the perturbation is applied to the CLIPPED rows
        rng = ft.client_rng(1, 0)                                         # client 0's own stream
        assert np.allclose(dd.client_data[0], ft_dp.clip_rows(data[0], tau) + sd * rng.standard_normal((30, 4)))
    assert sd < privacy.dwork_roth_sigma(4.0, 1e-5, 2 * tau)


def test_heuristic_noise_is_beta_times_gradient_sd_and_has_no_epsilon():
    X, y = _blobs(60, 4)
    data = [X[ix] for ix in make_partition(y, 2, "iid", seed=0)]
    Y0 = np.random.default_rng(0).standard_normal((5, 4))
    h = ft_feddl.feddl(data, 5, rounds=3, init=Y0, gamma=0.05, noise="heuristic", beta=0.5)
    assert h.noise_sd[0, 1] == pytest.approx(0.5 * ft.mmd2_u_grad(data[1], Y0, 0.05).std())
    assert math.isinf(h.epsilon)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_entry_sd_equals_numpy_std_and_guards_cancellation(dtype):
    """The heuristic noise's sd(g) from BLAS passes equals np.std; a mean far above the spread (where
    g.g/n - mean^2 cancels) falls back to np.std."""
    from fedlib.fedtsne.speed import entry_sd

    z = np.random.default_rng(0).standard_normal((40, 30))
    g = (1e-3 * z + 2e-4).astype(dtype)
    assert entry_sd(g) == pytest.approx(float(g.astype(np.float64).std()), rel=1e-5)
    g = (1e4 + 1e-5 * z).astype(dtype)
    naive = float(np.dot(g.ravel(), g.ravel())) / g.size - float(g.mean()) ** 2
    assert not naive == pytest.approx(float(g.var()), rel=0.5)      # the difference cancels here
    assert entry_sd(g) == float(g.std())


def test_dp_variants_reject_data_dependent_releases():
    with pytest.raises(ValueError, match="gamma"):
        ft_feddl.feddl(_DATA, 4, noise="dp_gradient", epsilon=1.0, delta=1e-5, init="gaussian")      # gamma="median"
    with pytest.raises(ValueError, match="init"):
        ft_feddl.feddl(_DATA, 4, noise="dp_gradient", epsilon=1.0, delta=1e-5, gamma=0.1)            # init="moments"
    with pytest.raises(ValueError, match="tau_x"):
        ft_feddl.feddl(_DATA, 4, noise="dp_data", epsilon=1.0, delta=1e-5)                           # no public bound
    with pytest.raises(ValueError, match="theorem6"):
        ft_feddl.feddl(_DATA, 4, noise="dp_gradient", epsilon=1.0, delta=1e-5, gamma=0.1, init="gaussian",
                 dp_sensitivity="theorem6")


def test_fed_tsne_reports_end_to_end_epsilon(blobs50):
    X, y = blobs50
    kw = dict(rounds=5, gamma=0.01, init="gaussian", epsilon=2.0, delta=1e-5, tsne_kwargs={"max_iter": 250})
    r_data = ft_pipelines.fed_tsne(X, 3, 12, noise="dp_data", tau_x=float(np.linalg.norm(X, axis=1).max()), **kw)
    r_grad = ft_pipelines.fed_tsne(X, 3, 12, noise="dp_gradient", **kw)
    assert r_data.epsilon == r_data.feddl.epsilon <= 2.0
    assert r_grad.feddl.epsilon <= 2.0 and math.isinf(r_grad.epsilon)


def test_distance_upload_reveals_the_data_whatever_feddl_noise():
    """With n_y >= m + 2 noisy (dp_gradient) landmarks, the server rebuilds every client sample."""
    X, y = _blobs(60, 4)
    res = ft_feddl.feddl([X[:30], X[30:]], 8, rounds=5, noise="dp_gradient", epsilon=0.1, delta=1e-5, gamma=0.05,
                   init="gaussian")
    up = ft.client_sq_distances(X[:30], res.landmarks)["sq_distances"]
    assert np.abs(ft_checks.reconstruct_from_sq_distances(up, res.landmarks) - X[:30]).max() < 1e-8


# ------------------------------------------------------------------------------------------------
# end to end (Algorithms 2, 3) and the centralized baselines
# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def blobs50():
    return _blobs(210, 50)


@pytest.mark.parametrize("scheme", ["iid", "one_class"])
def test_fed_tsne_keeps_blobs_separated(blobs50, scheme):
    X, y = blobs50
    parts = make_partition(y, 3, scheme, seed=0)
    res = ft_pipelines.fed_tsne(X, parts, 20, rounds=30, tsne_kwargs={"max_iter": 300})
    assert res.embedding.shape == (len(X), 2)
    assert _knn_acc(res.embedding, y) > 0.9
    assert res.distance_upload_bytes == len(X) * 20 * 8
    assert res.upload_bytes == res.distance_upload_bytes + res.feddl.upload_bytes


def test_centralized_tsne_baseline(blobs50):
    X, y = blobs50
    res = ft_pipelines.fed_tsne(X, None, centralized=True, tsne_kwargs={"max_iter": 300})
    assert res.feddl is None and res.upload_bytes == 0 and not res.federated
    assert _knn_acc(res.embedding, y) > 0.9


def test_fed_speclust_recovers_blobs_and_matches_centralized(blobs50):
    X, y = blobs50
    parts = make_partition(y, 3, "one_class", seed=0)
    fed = ft_pipelines.fed_spectral_clustering(X, parts, 3, 20, rounds=30)
    cen = ft_pipelines.fed_spectral_clustering(X, parts, 3, centralized=True)
    assert adjusted_rand_score(y, fed.labels) > 0.9
    assert adjusted_rand_score(y, cen.labels) > 0.9
    assert cen.gamma == pytest.approx(fed.gamma)       # same gamma rule on the same parts
    assert fed.kernel_upload_bytes == len(X) * 20 * 8


def test_fed_tsne_plus_variants_run(blobs50):
    X, y = blobs50
    res = ft_pipelines.fed_tsne(X, 3, 12, rounds=5, noise="heuristic", tsne_kwargs={"max_iter": 250})
    assert res.feddl.noise == "heuristic" and res.feddl.noise_sd.shape == (5, 3)


def test_fed_umap_missing_package_message(monkeypatch, blobs50):
    monkeypatch.setitem(sys.modules, "umap", None)
    with pytest.raises(ImportError, match="pip install umap-learn"):
        ft_pipelines.fed_umap(blobs50[0], 3, 10)


def test_fed_umap_keeps_blobs_separated(blobs50):
    pytest.importorskip("umap")
    X, y = blobs50
    fed = ft_pipelines.fed_umap(X, make_partition(y, 3, "iid", seed=0), 20, rounds=30, umap_kwargs={"n_epochs": 100})
    cen = ft_pipelines.fed_umap(X, None, centralized=True, umap_kwargs={"n_epochs": 100})
    assert fed.embedding.shape == cen.embedding.shape == (len(X), 2)
    assert _knn_acc(fed.embedding, y) > 0.9 and _knn_acc(cen.embedding, y) > 0.9


# ------------------------------------------------------------------------------------------------
# bad input
# ------------------------------------------------------------------------------------------------
_X, _Y = _blobs(30, 3)
_DATA = [_X[:15], _X[15:]]


@pytest.mark.parametrize("call, match", [
    (lambda: ft_feddl.feddl(_DATA, 1), "n_landmarks"),
    (lambda: ft_feddl.feddl(_DATA, 4, gamma=0.0), "gamma"),
    (lambda: ft_feddl.feddl(_DATA, 4, gamma=-1.0), "gamma"),
    (lambda: ft_feddl.feddl(_DATA, 4, gamma="silverman"), "gamma"),
    (lambda: ft_feddl.feddl(_DATA, 4, mode="sgd"), "mode"),
    (lambda: ft_feddl.feddl(_DATA, 4, init="pca"), "init"),
    (lambda: ft_feddl.feddl(_DATA, 4, init=np.zeros((3, 3))), "init"),
    (lambda: ft_feddl.feddl(_DATA, 4, noise="laplace"), "noise"),
    (lambda: ft_feddl.feddl(_DATA, 4, weights="random"), "weights"),
    (lambda: ft_feddl.feddl(_DATA, 4, local_steps=3), "local_steps"),
    (lambda: ft_feddl.feddl(_DATA, 4, lr=0.0), "lr"),
    (lambda: ft_feddl.feddl(_DATA, 4, lr_scale=-2.0), "lr_scale"),
    (lambda: ft_feddl.feddl(_DATA, 4, lr=0.5, lr_scale=2.0), "lr_scale"),
    (lambda: ft_feddl.feddl(_DATA, 4, rounds=0), "rounds"),
    (lambda: ft_feddl.feddl(_DATA, 4, noise="dp_data"), "epsilon"),
    (lambda: ft_feddl.feddl(_DATA, 4, noise="dp_gradient", epsilon=0.0, delta=1e-5), "epsilon"),
    (lambda: ft_feddl.feddl(_DATA, 4, noise="dp_gradient", epsilon=1.0, delta=1.0), "delta"),
    (lambda: ft_feddl.feddl(_DATA, 4, noise="heuristic", beta=-1.0), "beta"),
    (lambda: ft_feddl.feddl([_X[:1], _X[1:]], 4), "needs >= 2"),
    (lambda: ft_feddl.feddl([_X, _X[:, :2]], 4), "features"),
    (lambda: ft_dp.dp_noise_sd(-1.0, 1e-5, 1.0), "epsilon"),
    (lambda: ft_feddl.feddl(_DATA, 4, noise="dp_gradient", epsilon=1.0, delta=1e-5, gamma=0.1, init="gaussian",
                      dp_accountant="moments"), "dp_accountant"),
    (lambda: ft_feddl.feddl(_DATA, 4, noise="dp_gradient", epsilon=1.0, delta=1e-5, gamma=0.1, init="gaussian",
                      dp_sensitivity="exact"), "dp_sensitivity"),
    (lambda: ft_feddl.feddl(_DATA, 4, landmark_bounds=(1.0, 0.0)), "landmark_bounds"),
    (lambda: ft_dp.dp_noise_sd(0.5, 0.0, 1.0), "delta"),
    (lambda: ft_dp.dp_noise_sd(0.5, 1.5, 1.0), "delta"),
    (lambda: ft_dp.dp_noise_sd(0.5, 1e-5, 1.0, "renyi"), "mechanism"),
    (lambda: ft_mmd.gaussian_kernel(_X, None, 0.0), "gamma"),
    (lambda: ft_pipelines.fed_tsne(_X, 3, 4, perplexity=30.0), "perplexity"),
    (lambda: ft_pipelines.fed_tsne(_X, 3, 1), "n_landmarks"),
    (lambda: ft_pipelines.fed_tsne(_X, 40, 4, perplexity=5.0), "more clients than samples"),
    (lambda: ft_pipelines.fed_tsne(_X, [np.arange(10), np.arange(5, 30)], 4, perplexity=5.0), "partition"),
    (lambda: ft_pipelines.fed_tsne(_X, 3, 4, perplexity=5.0, inverse="svd"), "inverse"),
    (lambda: ft_pipelines.fed_tsne(_X, 3, 4, perplexity=5.0, rank=9), "rank"),
    (lambda: ft_pipelines.fed_tsne(_X, 3, 4, perplexity=5.0, noise="gauss"), "noise"),
    (lambda: ft_pipelines.fed_spectral_clustering(_X, 3, 3, 4, affinity_gamma=-2.0), "affinity_gamma"),
    (lambda: ft_pipelines.fed_spectral_clustering(_X, 3, 1, 4), "n_clusters"),
    (lambda: ft_nystrom.landmark_pinv(np.eye(3), inverse="pinv", ridge=1.0), "ridge"),
    (lambda: ft_checks.reconstruct_from_sq_distances(np.ones((2, 3)), np.ones((4, 3))), "sq_dists"),
])
def test_bad_input_raises_value_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_unknown_feddl_keyword_is_rejected_before_work():
    with pytest.raises(TypeError, match="unknown FedDL keyword"):
        ft_pipelines.fed_tsne(_X, 3, 4, perplexity=5.0, round=3)


# ------------------------------------------------------------------------------------------------
# data and scoring for the chapters: one rule for n points and for non-IID, the plateau rule,
# the cached scorer
# ------------------------------------------------------------------------------------------------
def test_load_points_is_a_stratified_deterministic_draw_of_exactly_n():
    X, y, classes = ft_chapters.load_points("optdigits", 500, seed=0)
    Xa, ya, _ = ft_chapters.load_points("optdigits")
    assert X.shape == (500, 64) and len(classes) == 10 and len(ya) == 1797
    assert X.min() >= 0 and X.max() <= 1
    full = np.bincount(ya, minlength=10) / len(ya)
    assert np.abs(np.bincount(y, minlength=10) - 500 * full).max() <= 1.0   # stratified
    X2, y2, _ = ft_chapters.load_points("optdigits", 500, seed=0)
    assert np.array_equal(X, X2) and np.array_equal(y, y2)
    X3, _, _ = ft_chapters.load_points("optdigits", 500, seed=1)
    assert not np.array_equal(X, X3)
    # every drawn row is a row of the pooled data
    rows = {r.tobytes() for r in Xa}
    assert all(r.tobytes() in rows for r in X)
    with pytest.raises(ValueError, match="n_points"):
        ft_chapters.load_points("optdigits", 5000)


def test_label_skew_parts_one_rule_for_multiples_and_divisors_of_the_classes():
    y = np.repeat(np.arange(10), 30)
    one = ft_chapters.label_skew_parts(y, 10, seed=0)
    assert [len(np.unique(y[p])) for p in one] == [1] * 10
    two = ft_chapters.label_skew_parts(y, 5, seed=0)             # paper Table 3, k = 5
    assert [sorted(np.unique(y[p])) for p in two] == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
    twenty = ft_chapters.label_skew_parts(y, 20, seed=0)         # two clients per class
    assert sorted(int(np.unique(y[p])[0]) for p in twenty) == sorted(list(range(10)) * 2)
    for parts in (one, two, twenty):
        assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(len(y)))
    with pytest.raises(ValueError, match="multiple or a divisor"):
        ft_chapters.label_skew_parts(y, 3)
    assert ft_chapters.client_split(y, 10, "non_iid", seed=0)[0].tolist() == one[0].tolist()
    with pytest.raises(ValueError, match="split"):
        ft_chapters.client_split(y, 10, "one_class")


def test_median_gamma_differs_between_iid_and_label_skew():
    """The kernel width of the median rule depends on the split: FedDL is NOT the same gradient
    descent for IID and non-IID data (only for a fixed gamma)."""
    X, y = _blobs(150, 6)
    iid = ft_feddl.feddl([X[p] for p in ft_chapters.client_split(y, 3, "iid", seed=0)], 5, rounds=1)
    skew = ft_feddl.feddl([X[p] for p in ft_chapters.client_split(y, 3, "non_iid", seed=0)], 5, rounds=1)
    assert skew.gamma > 2 * iid.gamma          # within-class medians are much smaller
    fixed = [ft_feddl.feddl([X[p] for p in ft_chapters.client_split(y, 3, s, seed=0)], 5, rounds=5, gamma=iid.gamma).landmarks
             for s in ("iid", "non_iid")]
    assert np.allclose(fixed[0], fixed[1], atol=1e-10)


def test_plateau_share_and_round_on_known_curves():
    F = 1.0 / (1.0 + np.arange(201.0))                  # F_s = 1/(1+s)
    s = 100
    w = max(math.ceil(0.1 * s), 10)
    assert ft_feddl.plateau_share(F, s) == pytest.approx((F[s - w] - F[s]) / (F[0] - F[s]))
    r = ft_feddl.plateau_round(F, tol=0.01)
    assert r is not None and ft_feddl.plateau_share(F, r) <= 0.01 < ft_feddl.plateau_share(F, r - 1)
    assert ft_feddl.plateau_round(np.linspace(1.0, 0.0, 300), tol=0.01) is None   # a straight line never plateaus
    assert math.isnan(ft_feddl.plateau_share(F, 5))           # fewer rounds than the window
    assert ft_feddl.plateau_share(np.ones(30)) == math.inf    # no decrease at all
    # a pause after 1 round is not a plateau: the window is at least 10 rounds
    early = np.r_[1.0, 0.5, np.full(8, 0.5), np.linspace(0.5, 0.0, 50)]
    assert ft_feddl.plateau_round(early, tol=0.01) is None


def test_feddl_until_plateau_stops_only_where_the_rule_holds_at_the_last_round(monkeypatch):
    """The rule's window grows by one round every 10 rounds, so its share can rise above tol one round after
    it first held. A stop decided on the clients' reported values alone (F up to the round before) stopped
    there; the run must go on until the rule holds at its last round too. A stand-in run replays a known
    objective curve through the protocol run's interface."""
    import importlib
    from types import SimpleNamespace

    feddl_module = importlib.import_module("fedlib.fedtsne.feddl")    # the module, not ft_feddl.feddl

    F = np.exp(-np.arange(1001) / 15.0)
    share = {e: ft_feddl.plateau_share(F, e) for e in range(10, 1000)}
    e0 = next(e for e in range(10, 999) if share[e + 1] > share[e] and share[e] < min(share[d] for d in range(10, e)))
    tol = share[e0]                       # the rule first holds at e0 and fails at e0 + 1

    class ReplayedRun:
        def __init__(self):
            self.done = 0
            self.server = SimpleNamespace(Y0=np.zeros((2, 2)), Y=np.zeros((2, 2)))

        @classmethod
        def start(cls, *args, **kwargs):
            return cls()

        def advance(self, rounds, progress=False):
            self.done += rounds

        def reported_objective(self, start=0):
            return list(F[start:self.done])

        def objective(self):
            return F[:self.done + 1].copy()

        def result(self):
            return SimpleNamespace(objective=self.objective())

    monkeypatch.setattr(feddl_module, "FedDLRun", ReplayedRun)
    tr = ft_feddl.feddl_until_plateau([np.zeros((4, 2))], 2, tol=tol, check_every=1, max_rounds=1000)
    assert tr.plateau == e0 and tr.rounds > e0 + 1
    assert ft_feddl.plateau_share(tr.objective) <= tol and ft_feddl.plateau_share(tr.objective, tr.rounds - 1) <= tol


def test_feddl_until_plateau_evaluates_the_last_objective_once(monkeypatch):
    """F(Y^S) is evaluated by the clients only where the rule held at S - 1 (a plateau check), and the
    check at the last round and the result share that evaluation."""
    X, y = _blobs(90, 5)
    data = [X[p] for p in ft_chapters.client_split(y, 3, "iid", seed=0)]
    calls = []
    original = ft.FedDLClient.objective
    monkeypatch.setattr(ft.FedDLClient, "objective", lambda self, *a: calls.append(1) or original(self, *a))
    tr = ft_feddl.feddl_until_plateau(data, 8, tol=0.01, check_every=1, max_rounds=400, seed=1)
    checks = sum(1 for s in range(2, tr.rounds + 1) if ft_feddl.plateau_share(tr.objective, s - 1) <= 0.01)
    assert checks >= 1 and len(calls) == 3 * checks


def test_feddl_until_plateau_equals_one_long_run_and_stops_at_the_plateau():
    X, y = _blobs(90, 5)
    data = [X[p] for p in ft_chapters.client_split(y, 3, "iid", seed=0)]
    tr = ft_feddl.feddl_until_plateau(data, 8, tol=0.01, check_every=20, max_rounds=400, checkpoints=[5], seed=1)
    # checked every 20 rounds: the rule holds at the last round and the one before, not at the check before
    assert tr.plateau is not None and tr.plateau < tr.rounds <= tr.plateau + 20
    assert tr.rounds % 20 == 0 and len(tr.objective) == tr.rounds + 1
    assert ft_feddl.plateau_share(tr.objective) <= 0.01 and ft_feddl.plateau_share(tr.objective, tr.rounds - 1) <= 0.01
    assert ft_feddl.plateau_round(tr.objective[:tr.rounds - 19], 0.01) is None
    one = ft_feddl.feddl(data, 8, rounds=tr.rounds, seed=1)
    # one run of the protocol advanced in chunks: bit for bit the long run
    assert np.array_equal(tr.objective, one.objective)
    assert np.array_equal(tr.landmarks[tr.rounds], one.landmarks)
    assert np.array_equal(tr.landmarks[0], one.init_landmarks) and 5 in tr.landmarks
    assert tr.plateau == ft_feddl.plateau_round(one.objective, 0.01)
    # the joined result is the long run, bytes included
    assert np.array_equal(tr.result.step_sq_norms, one.step_sq_norms)
    assert np.array_equal(tr.result.init_landmarks, one.init_landmarks) and tr.result.rounds == tr.rounds
    assert (tr.result.upload_bytes, tr.result.setup_upload_bytes, tr.result.broadcast_bytes) == \
        (one.upload_bytes, one.setup_upload_bytes, one.broadcast_bytes)
    fixed = ft_feddl.feddl_until_plateau(data, 8, tol=0.01, check_every=20, max_rounds=tr.rounds + 40,
                                   stop_at_plateau=False, seed=1)
    assert fixed.rounds == tr.rounds + 40 and fixed.plateau == tr.plateau
    assert set(fixed.landmarks) == {0, fixed.rounds}           # no checkpoints: Y^0 and the last round only
    # checked after every round: the run stops one round after its plateau round, the same run as a long one
    every = ft_feddl.feddl_until_plateau(data, 8, tol=0.01, check_every=1, max_rounds=400, seed=1)
    assert every.rounds == every.plateau + 1 == tr.plateau + 1
    assert np.array_equal(every.objective, one.objective[:every.rounds + 1])
    with pytest.raises(ValueError, match="noise"):
        ft_feddl.feddl_until_plateau(data, 8, noise="heuristic")


def test_embedding_scorer_equals_embedding_report_and_distance_quality():
    from fedlib.evaluation import embedding as em

    X, y = _blobs(240, 8)
    Z = X[:, :2] + 0.1 * np.random.default_rng(0).standard_normal((len(X), 2))
    sc = ft_chapters.EmbeddingScorer(X, y)
    ours, ref = sc(Z, seed=3), em.embedding_report(X, Z, y, seed=3)
    assert set(ours) <= set(ref)
    assert all(abs(ours[k] - ref[k]) < 1e-12 for k in ours)
    D = np.sqrt(ft_mmd.sq_distances(X))
    q = sc.distance_quality(D)
    assert q["D-hat rel. error"] == 0.0 and q["D-hat 10-NN"] == 1.0
    q2 = sc.distance_quality(D + np.random.default_rng(1).uniform(0, 3, D.shape))
    assert q2["D-hat rel. error"] > 0.01 and q2["D-hat 10-NN"] < 1.0
    with pytest.raises(ValueError, match="D_hat"):
        sc.distance_quality(D[:5, :5])


def test_both_fedtsne_chapters_draw_points_and_split_clients_by_the_one_rule():
    from pathlib import Path

    import inspect

    root = Path(__file__).resolve().parents[2] / "notebooks"
    # the chapters' study loops (fedtsne.studies) split the clients by the one rule too
    from fedlib.fedtsne.studies import _plateau_job     # the runs of convergence_study and step_study

    for helper in (ft_studies.speclust_data, _plateau_job, ft_studies.benchmark_runs, ft_studies.check_splits, ft_studies.client_sweep,
                   ft_studies.landmark_sweep, ft_studies.gamma_control):
        code = inspect.getsource(helper)
        assert "client_split(" in code, helper.__name__
        assert not any(rule in code for rule in ("make_partition", "train_test_split", ".subset(", "dirichlet"))
    assert "load_points(" in inspect.getsource(ft_studies.speclust_data)
    for chapter in ("fedtsne_benchmark", "fedspeclust"):
        src = (root / f"{chapter}.py").read_text()
        assert "ft_chapters.load_points(" in src or "ft_studies.speclust_data(" in src, chapter
        for own_rule in ("make_partition", "train_test_split", ".subset(", "dirichlet"):
            assert own_rule not in src, (chapter, own_rule)


def test_benchmark_runs_feddl_until_its_objective_plateaus():
    """10 FedDL rounds left the landmarks near their random start (50 in Fed-SpeClust had not plateaued
    either); the benchmark's profiles and Fed-SpeClust at quick must use the plateau rule."""
    from fedlib.runner.profiles import load_profiles, notebook_parameters

    for chapter in ("fedtsne_benchmark", "fedspeclust"):
        assert notebook_parameters(chapter)["rounds"] == "plateau", chapter
    for name, profile in load_profiles().items():
        assert (profile or {}).get("fedtsne_benchmark", {}).get("rounds", "plateau") == "plateau", name
    assert (load_profiles()["quick"] or {}).get("fedspeclust", {}).get("rounds", "plateau") == "plateau"
    # and the rule tells 10 rounds from a plateau on a small problem
    X, y = _blobs(120, 10)
    data = [X[p] for p in ft_chapters.client_split(y, 3, "iid", seed=0)]
    short = ft_feddl.feddl(data, 6, rounds=10)
    assert not ft_feddl.plateau_share(short.objective) <= 0.01
    assert ft_feddl.feddl_until_plateau(data, 6, max_rounds=2000).plateau is not None
    s = ft_feddl.plateau_rounds(data, 6, max_rounds=2000)
    assert ft_feddl.plateau_share(ft_feddl.feddl(data, 6, rounds=s).objective) <= 0.01
    # the plateau search is one FedDL run: its result is the run of its S rounds (reused by Fed-SpeClust)
    run = ft_feddl.plateau_run(data, 6, max_rounds=2000, check_every=5)
    again = ft_feddl.feddl(data, 6, rounds=run.rounds)
    assert np.array_equal(run.landmarks, again.landmarks) and np.array_equal(run.objective, again.objective)
    assert run.rounds <= s and run.rounds % 5 == 0 and ft_feddl.plateau_share(run.objective) <= 0.01
    with pytest.raises(RuntimeError, match="max_rounds=20"):
        ft_feddl.plateau_rounds(data, 6, max_rounds=20)


# ------------------------------------------------------------------------------------------------
# FedDL on the one protocol (fedlib.core.protocol): client program, server, measured cost, streams
# ------------------------------------------------------------------------------------------------
def test_feddl_is_reproducible_and_its_cost_is_measured():
    X, y = _blobs(90, 4)
    data = [X[ix] for ix in make_partition(y, 3, "iid", seed=0)]
    kw = dict(rounds=4, noise="heuristic", beta=0.5, seed=7)
    a, b = ft_feddl.feddl(data, 6, **kw), ft_feddl.feddl(data, 6, **kw)
    assert np.array_equal(a.landmarks, b.landmarks) and np.array_equal(a.noise_sd, b.noise_sd)
    other = ft_feddl.feddl(data, 6, **{**kw, "seed": 8})
    assert not np.array_equal(a.landmarks, other.landmarks)
    P, ny, m = 3, 6, 4
    assert (a.cost.bytes_up, a.cost.bytes_down, a.cost.seconds) == (a.upload_bytes, a.broadcast_bytes, a.seconds)
    # each round broadcasts Y, gamma and the step to every client (Y^S goes out with the Nystrom step)
    assert a.cost.bytes_down == 4 * P * (ny * m * 8 + 16)
    assert a.cost.seconds > 0
    emb = ft_pipelines.fed_tsne(X, [np.arange(30), np.arange(30, 60), np.arange(60, 90)], 6, feddl_result=a, perplexity=5.0,
                      tsne_kwargs={"max_iter": 250})
    assert emb.cost.bytes_up == emb.upload_bytes == a.upload_bytes + 90 * 6 * 8
    assert emb.cost.bytes_down == a.cost.bytes_down + P * a.landmarks.nbytes


class _OneByOne:
    """A FedDL client program without ``step_many``: simulate then runs the per-client loop."""

    def __init__(self, client):
        self.client = client

    def init_state(self, k):
        return self.client.init_state(k)

    def step(self, data, state, broadcast):
        return self.client.step(data, state, broadcast)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("noise", ["none", "heuristic", "dp_gradient"])
def test_feddl_step_many_equals_the_per_client_steps(dtype, noise):
    """One product over the stacked clients (step_many) = each client's own step: clients of unequal sizes,
    a participant set that changes between rounds (the stacked rows are rebuilt), each client's own noise."""
    from fedlib.core.protocol import ClientStates, simulate

    X, _ = _blobs(90, 6)
    data = [X[:10], X[10:35], X[35:60], X[60:]]
    who = {2: [0, 1, 2, 3], 3: [1, 3], 4: [1, 3], 5: [0, 2, 3], 6: [2]}
    runs = []
    for one_by_one in (False, True):
        client = ft.FedDLClient(seed=4, noise=noise, beta=0.5, noise_multiplier=0.3, setup=("median",), dtype=dtype)
        server = ft.FedDLServer(5, 6, init="gaussian", seed=4, dtype=dtype)
        states = ClientStates(client)
        simulate(server, _OneByOne(client) if one_by_one else client, data, 6, states=states,
                 participants=lambda r: who.get(r, range(4)))
        runs.append((server.result()[0], [states[k]["objective"] for k in range(4)],
                     [states[k]["noise_sd"] for k in range(4)], client.cache.stacked is not None))
    (Y, obj, sd, stacked), (Y1, obj1, sd1, stacked1) = runs
    assert stacked and not stacked1            # the first run went through step_many's stacked product
    rtol = 1e-12 if dtype == "float64" else 1e-5
    np.testing.assert_allclose(Y, Y1, rtol=rtol, atol=rtol * np.abs(Y1).max())
    for a, b in zip(obj + sd, obj1 + sd1):
        np.testing.assert_allclose(a, b, rtol=rtol)
    assert [len(o) for o in obj] == [2, 3, 3, 4]    # the rounds 2..6 each client took part in


def test_feddl_client_state_is_its_own_and_streams_come_from_derive_seed():
    from fedlib.core.protocol import ClientStates, simulate
    from fedlib.core.seeds import derive_seed

    X, _ = _blobs(60, 3)
    data = [X[:20], X[20:40], X[40:]]
    client = ft.FedDLClient(seed=3, noise="heuristic", setup=("median",), median_points=5)
    server = ft.FedDLServer(5, 3, init="gaussian", seed=3)
    states = ClientStates(client)
    simulate(server, client, data, 3, states=states)
    for k in range(3):
        st = states[k]
        assert st["k"] == k and st["data"] is data[k] and len(st["objective"]) == 2 and len(st["noise_sd"]) == 2
    # client k's generator and median subsample are the streams ("feddl", k) and ("median", k) of the seed
    assert np.array_equal(ft.client_rng(3, 1).standard_normal(4), np.random.default_rng(derive_seed(3, "feddl", 1))
                          .standard_normal(4))
    assert ft.median_seed(3, 1) == derive_seed(3, "median", 1) != ft.median_seed(3, 2)
    Y, Y0, steps = server.result()
    assert Y.shape == (5, 3) and len(steps) == 2 and server.setup_bytes == 3 * 16   # n and the median


def test_nystrom_step_is_a_client_upload_and_a_server_assembly():
    from fedlib.core.protocol import simulate

    rng = np.random.default_rng(0)
    data = [rng.standard_normal((n, 3)) for n in (7, 5, 9)]
    Y = rng.standard_normal((6, 3))
    server = ft.NystromServer(Y)
    cost = simulate(server, ft.NystromClient(), data)
    X = np.vstack(data)
    assert np.allclose(server.result(), np.sqrt(ft_mmd.sq_distances(X)), atol=1e-6)   # 6 >= m + 2: exact
    assert cost.bytes_up == 21 * 6 * 8 and cost.bytes_down == 3 * Y.nbytes
    ks = ft.NystromServer(Y, "kernel", 0.5)
    simulate(ks, ft.NystromClient("kernel"), data)
    assert np.allclose(ks.result(), ft.nystrom_kernel(ft_mmd.gaussian_kernel(X, Y, 0.5), ft_mmd.gaussian_kernel(Y, None, 0.5)))
    with pytest.raises(ValueError, match="kind"):
        ft.NystromServer(Y, "cosine")


# ------------------------------------------------------------------------------------------------
# the one kernel-width rule, with its zero-scale guard
# ------------------------------------------------------------------------------------------------
def test_kernel_width_rule_is_one_function_with_the_zero_median_guard():
    dup = np.ones((12, 3))                       # duplicated points: median (and variance) 0
    with pytest.raises(ValueError, match="median kernel-width rule.*pass gamma explicitly"):
        ft_feddl.feddl([dup[:6], dup[6:]], 3, rounds=1)
    # the centralized Fed-SpeClust baseline resolves gamma by the same rule: same guard (it once divided by 0)
    with pytest.raises(ValueError, match="median kernel-width rule"):
        ft_pipelines.fed_spectral_clustering(dup, 2, 2, 3, centralized=True)
    with pytest.raises(ValueError, match="moments kernel-width rule"):
        ft_pipelines.fed_spectral_clustering(dup, 2, 2, 3, centralized=True, gamma="moments")
    with pytest.raises(ValueError, match="median kernel-width rule"):
        ft_mmd.median_kernel_width(dup)
    X, _ = _blobs(30, 3)
    assert ft_mmd.median_kernel_width(X) == 1.0 / np.median(ft_mmd.sq_distances(X)[np.triu_indices(30, 1)])
    # federated and centralized resolution agree
    res = ft_feddl.feddl([X[:15], X[15:]], 4, rounds=1, gamma="moments")
    cen = ft_pipelines.fed_spectral_clustering(X, [np.arange(15), np.arange(15, 30)], 3, centralized=True, gamma="moments")
    assert res.gamma == cen.gamma == pytest.approx(1.0 / (2.0 * X.var(0, ddof=1).sum()))


# ------------------------------------------------------------------------------------------------
# the chapters' calls
# ------------------------------------------------------------------------------------------------
def test_expected_gaussian_kernel_matches_monte_carlo():
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((20000, 2)), rng.standard_normal((20000, 2)) * 0.5 + 1.0
    mc = np.exp(-0.3 * ((x - y) ** 2).sum(1)).mean()
    assert ft_mmd.expected_gaussian_kernel(1.25, 2.0, 0.3, 2) == pytest.approx(mc, rel=0.02)


def test_nystrom_estimate_squared_is_exact_and_plain_is_not():
    rng = np.random.default_rng(1)
    X, Y = rng.standard_normal((30, 3)), rng.standard_normal((6, 3))
    D = np.sqrt(ft_mmd.sq_distances(X))
    assert np.allclose(ft_checks.nystrom_estimate(X, Y), D, atol=1e-6)
    plain = ft_checks.nystrom_estimate(X, Y, squared=False)
    assert np.all(np.diag(plain) == 0) and plain.min() >= 0 and np.abs(plain - D).max() > 1e-3


def test_embed_and_learn_landmarks_are_the_pipelines_calls(blobs50):
    X, y = blobs50
    parts = ft_chapters.client_split(y, 2, "iid", 0)
    fd = ft_pipelines.learn_landmarks(X, parts, "Fed+", 6, 3, beta=0.5, seed=1)
    assert fd.noise == "heuristic" and fd.rounds == 3
    assert ft_pipelines.learn_landmarks(X, parts, "Fed", 6, 3, seed=1).noise == "none"
    fed = ft_pipelines.embed("tsne", X, parts, 6, seed=0, feddl_result=fd, perplexity=5.0, tsne_max_iter=250)
    direct = ft_pipelines.fed_tsne(X, parts, 6, feddl_result=fd, perplexity=5.0, tsne_kwargs={"max_iter": 250}, seed=0)
    assert fed.federated and np.array_equal(fed.embedding, direct.embedding)
    assert not ft_pipelines.embed("tsne", X, None, seed=0, perplexity=5.0, tsne_max_iter=250).federated
    with pytest.raises(ValueError, match="method"):
        ft_pipelines.embed("pca", X, parts)
    with pytest.raises(ValueError, match="variant"):
        ft_pipelines.learn_landmarks(X, parts, "Fed++", 6, 3)


def test_central_embedding_is_kept_on_disk_keyed_by_its_inputs(blobs50, tmp_path, monkeypatch):
    """The centralized reference is read back from the cache (no second t-SNE, the same result), and
    any change of X, seed, the method's settings or method makes a new one; cache=False always computes."""
    from fedlib.fedtsne import pipelines

    monkeypatch.setenv("FEDLIB_CACHE", str(tmp_path))
    X, _ = blobs50
    kw = dict(perplexity=5.0, tsne_max_iter=250)
    first = ft_pipelines.central_embedding("tsne", X, seed=0, **kw)
    assert not first.federated
    assert np.array_equal(first.embedding, ft_pipelines.embed("tsne", X, None, seed=0, **kw).embedding)
    assert list((tmp_path / "central_embeddings").rglob("output.pkl"))
    calls, real = [], pipelines.embed
    monkeypatch.setattr(pipelines, "embed", lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    again = ft_pipelines.central_embedding("tsne", X, seed=0, **kw)
    assert calls == [] and np.array_equal(again.embedding, first.embedding) and again.seconds == first.seconds
    ft_pipelines.central_embedding("tsne", X, seed=1, **kw)
    ft_pipelines.central_embedding("tsne", X[::-1], seed=0, **kw)
    ft_pipelines.central_embedding("tsne", X, seed=0, perplexity=6.0, tsne_max_iter=250)
    ft_pipelines.central_embedding("tsne", X, seed=0, cache=False, **kw)
    assert calls == ["tsne"] * 4
    # a UMAP setting does not key a t-SNE embedding
    assert np.array_equal(ft_pipelines.central_embedding("tsne", X, seed=0, umap_epochs=7, **kw).embedding, first.embedding)
    assert calls == ["tsne"] * 4
    with pytest.raises(ValueError, match="method"):
        ft_pipelines.central_embedding("pca", X)


def test_public_landmarks_and_check_fits():
    rng = np.random.default_rng(0)
    pub = rng.random((40, 5))
    Y = ft_feddl.public_landmarks(pub, 7, seed=2)
    assert Y.shape == (7, 5) and Y.min() >= 0 and Y.max() <= 1
    assert np.array_equal(Y, ft_feddl.public_landmarks(pub, 7, seed=2)) and not np.array_equal(Y, ft_feddl.public_landmarks(pub, 7, 3))
    ft_chapters.check_fits("d", 100, n_landmarks=99, k=None)
    with pytest.raises(ValueError, match="d: n_landmarks = 100 must be < its 100 points"):
        ft_chapters.check_fits("d", 100, n_landmarks=100)
    ft_chapters.check_fits("d", 100, strict=False, n_landmarks=100)
    with pytest.raises(ValueError, match="n_landmarks = 101 must be <="):
        ft_chapters.check_fits("d", 100, strict=False, n_landmarks=101)


def test_privacy_table_pairs_each_variant_with_the_noise_free_run():
    import pandas as pd

    rows = [{"method": "tsne", "variant": v, "noise": nz, "seed": s, "FedDL epsilon": e, "end-to-end epsilon": e2,
             "CA 10-NN": base + d}
            for v, nz, e, e2, d in [("Fed", "none", math.inf, math.inf, 0.0), ("dp", "dp_data", 1.0, 1.0, -0.1)]
            for s, base in [(0, 0.8), (1, 0.6)]]
    t = ft_chapters.privacy_table(pd.DataFrame(rows), "CA 10-NN")
    assert list(t.variant) == ["Fed", "dp"]
    assert t["FedDL epsilon spent"].tolist() == ["inf (no guarantee)", "1"] and t["end-to-end epsilon"].tolist() == ["inf", "1"]
    assert t["paired diff vs Fed"].iloc[0] == "-" and t["paired diff vs Fed"].iloc[1].startswith("-0.100")


def _dtype_problem():
    X = np.random.default_rng(3).random((120, 30))
    return [X[i::4] for i in range(4)]


def test_feddl_float64_default_gives_exactly_the_old_landmarks():
    """dtype="float64" (the default) is the arithmetic of FedDL before the dtype option: the landmarks of
    this small problem equal the values that code gave (stored: sum and sum of squares to 16 digits, up
    to the rounding of another BLAS), and dtype="float64" given explicitly is bit-identical to the default."""
    parts = _dtype_problem()
    old = {"none": (177.64435122514368, 118.66517500004768), "heuristic": (176.9378402280475, 117.73237570194667)}
    for noise, rounds in [("none", 15), ("heuristic", 10)]:
        kw = dict(rounds=rounds, noise=noise, seed=7, beta=0.5 if noise == "heuristic" else 1.0)
        r = ft_feddl.feddl(parts, 12, **kw)
        r64 = ft_feddl.feddl(parts, 12, dtype="float64", **kw)
        assert r.landmarks.dtype == np.float64
        np.testing.assert_array_equal(r.landmarks, r64.landmarks)
        np.testing.assert_array_equal(r.objective, r64.objective)
        assert r.upload_bytes == r64.upload_bytes
        np.testing.assert_allclose([r.landmarks.sum(), (r.landmarks ** 2).sum()], old[noise], rtol=1e-12)


def test_feddl_float32_is_float64_up_to_rounding():
    parts = _dtype_problem()
    r64 = ft_feddl.feddl(parts, 12, rounds=30, seed=7)
    r32 = ft_feddl.feddl(parts, 12, rounds=30, seed=7, dtype="float32")
    assert r32.landmarks.dtype == np.float64 and r32.init_landmarks.dtype == np.float64
    # Y^0: the same float64 draw, rounded to float32
    np.testing.assert_array_equal(r32.init_landmarks, r64.init_landmarks.astype(np.float32).astype(np.float64))
    rel = np.linalg.norm(r32.landmarks - r64.landmarks) / np.linalg.norm(r64.landmarks)
    assert rel < 1e-5, rel
    moved = np.linalg.norm(r64.landmarks - r64.init_landmarks)
    assert np.linalg.norm(r32.landmarks - r64.landmarks) < 1e-3 * moved
    np.testing.assert_allclose(r32.objective, r64.objective, rtol=1e-4, atol=1e-7)
    assert r32.gamma == r64.gamma
    # half the gradient bytes (the set-up scalars are float64 in both)
    grad_bytes = lambda r: r.upload_bytes - r.setup_upload_bytes
    assert grad_bytes(r32) * 2 == grad_bytes(r64)
    # float32 noise: from the client's own stream, reproducible, same sd scale as float64's
    h1 = ft_feddl.feddl(parts, 12, rounds=10, seed=7, noise="heuristic", dtype="float32")
    h2 = ft_feddl.feddl(parts, 12, rounds=10, seed=7, noise="heuristic", dtype="float32")
    h64 = ft_feddl.feddl(parts, 12, rounds=10, seed=7, noise="heuristic")
    np.testing.assert_array_equal(h1.landmarks, h2.landmarks)
    np.testing.assert_allclose(h1.noise_sd.mean(), h64.noise_sd.mean(), rtol=0.2)
    # the MMD terms in float32 against float64
    from fedlib.fedtsne.mmd import cross_terms, yy_terms
    X, Y = parts[0], r64.landmarks
    for f32, f64 in [(cross_terms(X.astype(np.float32), Y.astype(np.float32), 0.3), cross_terms(X, Y, 0.3)),
                     (yy_terms(Y.astype(np.float32), 0.3), yy_terms(Y, 0.3))]:
        assert f32[1].dtype == np.float32
        assert abs(f32[0] - f64[0]) < 1e-6 * abs(f64[0]) + 1e-9
        assert np.linalg.norm(f32[1] - f64[1]) < 1e-5 * np.linalg.norm(f64[1])
    with pytest.raises(ValueError, match="dtype"):
        ft_feddl.feddl(parts, 12, rounds=2, dtype="float16")


@pytest.mark.parametrize("options", [dict(mode="gradient"), dict(mode="average", local_steps=3),
                                     dict(noise="heuristic", beta=0.5), dict(mode="gradient", weights="uniform")])
def test_feddl_speed_path_equals_the_equations_as_written(options):
    """fedlib.fedtsne.speed (kept norms, cached Y-Y terms, in-place kernels, stacked rounds, axpy sums and
    noise) against FedDLClient / FedDLServer(fast=False), which compute Eqs. 10, 13, 15-16 as written."""
    rng = np.random.default_rng(3)
    data = [rng.standard_normal((n, 4)) + k for k, n in enumerate((15, 22, 18))]
    fast = ft_feddl.feddl(data, 6, rounds=25, seed=1, **options)
    plain = ft_feddl.feddl(data, 6, rounds=25, seed=1, fast=False, **options)
    assert np.allclose(fast.landmarks, plain.landmarks, rtol=1e-9, atol=1e-11)
    assert np.allclose(fast.objective, plain.objective, rtol=1e-9, atol=1e-12)
    with pytest.raises(ValueError, match="needs fast=True"):
        ft_feddl.feddl(data, 6, rounds=2, dtype="float32", fast=False)
