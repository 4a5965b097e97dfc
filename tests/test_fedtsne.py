"""Fed-tSNE / Fed-UMAP / Fed-SpeClust: MMD^2 and its gradient (Eqs. 10, 13), the federated = pooled
gradient identity, Nystrom exactness (Eq. 22), the reconstruction attack, DP noise scales
(Thms 4, 6), end-to-end pipelines (Algorithms 1-3) and input checks."""
import math
import sys

import numpy as np
import pytest
from sklearn.metrics import adjusted_rand_score
from sklearn.model_selection import cross_val_score
from sklearn.neighbors import KNeighborsClassifier
from threadpoolctl import threadpool_limits

from fedlib import fedtsne as ft
from fedlib.partition import make_partition


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
    central = ft.feddl([X], 8, **kw)
    grad = ft.feddl([X[ix] for ix in parts], 8, mode="gradient", **kw)
    avg = ft.feddl([X[ix] for ix in parts], 8, mode="average", local_steps=1, **kw)
    assert np.allclose(grad.landmarks, central.landmarks, atol=1e-10)
    assert np.allclose(avg.landmarks, central.landmarks, atol=1e-10)
    # F(Y^s) = MMD_u(pooled, Y^s) + a constant, so the objective curves differ by a constant
    diff = grad.objective - central.objective
    assert np.allclose(diff, diff[0], atol=1e-12)
    assert central.objective[-1] < central.objective[0]


def test_feddl_result_bytes_and_shapes():
    X, y = _blobs(90, 4)
    data = [X[ix] for ix in make_partition(y, 3, "iid", seed=0)]
    res = ft.feddl(data, 6, rounds=4)
    m, P = 4, 3
    setup = P * (8 + 2 * m * 8 + 8)              # n, sum, sumsq, median_sqdist
    assert res.setup_upload_bytes == setup
    assert res.upload_bytes == setup + 4 * P * 6 * m * 8
    assert res.landmarks.shape == (6, 4) and res.objective.shape == (5,) and res.rounds == 4
    assert res.lr == pytest.approx(1 / ft.lipschitz_bound(res.gamma, 6))
    avg = ft.feddl(data, 6, rounds=4, mode="average", local_steps=3)
    assert avg.upload_bytes == setup + 4 * P * 6 * m * 8  # one landmark matrix per client per round
    assert avg.objective[-1] < avg.objective[0] and res.objective[-1] < res.objective[0]


def test_median_gamma_is_weighted_mean_of_client_medians():
    X, y = _blobs(90, 4)
    data = [X[ix] for ix in make_partition(y, 3, "one_class", seed=0)]
    meds = [ft.client_median_sqdist(x) for x in data]
    res = ft.feddl(data, 4, rounds=1, weights="uniform")
    assert res.gamma == pytest.approx(1 / np.mean(meds))
    mom = ft.feddl(data, 4, rounds=1, gamma="moments")
    assert mom.gamma == pytest.approx(1 / (2 * X.var(0, ddof=1).sum()))


# ------------------------------------------------------------------------------------------------
# Nystrom (Eq. 22), clipping
# ------------------------------------------------------------------------------------------------
def test_nystrom_on_squared_distances_exact_with_m_plus_2_landmarks_and_improving_below():
    rng = np.random.default_rng(1)
    m = 6
    X = rng.standard_normal((60, m))
    Yall = rng.standard_normal((12, m)) * 1.5
    D = np.sqrt(ft.sq_distances(X))
    errs = []
    for ny in (2, 4, 6, 7, 8, 12):
        Y = Yall[:ny]
        Dh = ft.nystrom_distances(ft.sq_distances(X, Y), ft.sq_distances(Y))
        errs.append(np.linalg.norm(Dh - D) / np.linalg.norm(D))
    assert errs[-2] < 1e-10 and errs[-1] < 1e-10          # n_y >= m + 2
    assert all(a > b for a, b in zip(errs[:4], errs[1:5]))  # decreasing below
    assert errs[3] > 0.05
    # plain (non-squared) distances are never exact
    Y = Yall
    plain = ft.nystrom(np.sqrt(ft.sq_distances(X, Y)), np.sqrt(ft.sq_distances(Y)))
    assert np.linalg.norm(plain - D) / np.linalg.norm(D) > 0.05


def test_distances_from_squared_symmetrizes_clips_and_takes_sqrt():
    D2 = np.array([[0.3, 4.0, -1.0], [4.0, 0.1, 9.0], [-3.0, 9.0, 0.0]])
    D = ft.distances_from_squared(D2)
    assert np.array_equal(D, D.T)
    assert np.allclose(D, [[0, 2, 0], [2, 0, 3], [0, 3, 0]])


def test_landmark_pinv_rank_and_ridge():
    rng = np.random.default_rng(0)
    Y = rng.standard_normal((6, 2))
    W = ft.sq_distances(Y)                         # indefinite, rank 4
    lam, V = np.linalg.eigh(W)
    top = np.argsort(-np.abs(lam))[:2]
    assert np.allclose(ft.landmark_pinv(W, rank=2), (V[:, top] / lam[top]) @ V[:, top].T)
    assert np.allclose(ft.landmark_pinv(W), np.linalg.pinv(W, rcond=1e-10, hermitian=True), atol=1e-10)
    assert np.allclose(ft.landmark_pinv(W, inverse="ridge", ridge=0.5), np.linalg.inv(W + 0.5 * np.eye(6)))
    K = ft.nystrom_kernel(rng.uniform(-1, 1, (5, 6)), W)
    assert K.min() >= 0 and np.array_equal(K, K.T)


def test_federated_distances_are_returned_in_the_row_order_of_x():
    X, y = _blobs(60, 3)
    rng = np.random.default_rng(0)
    perm = rng.permutation(len(X))
    X, y = X[perm], y[perm]
    parts = make_partition(y, 3, "one_class", seed=0)
    data = [X[ix] for ix in parts]
    res = ft.feddl(data, 8, rounds=5, init="gaussian")  # 8 >= m + 2 landmarks: exact Nystrom
    D, fres, nbytes = ft._federated_matrix(X, parts, 8, "distances", None, {}, res, 0, False, {})
    assert np.allclose(D, np.sqrt(ft.sq_distances(X)), atol=1e-6)
    assert nbytes == len(X) * 8 * 8


# ------------------------------------------------------------------------------------------------
# reconstruction attack
# ------------------------------------------------------------------------------------------------
def test_reconstruction_exact_with_m_plus_1_landmarks_else_projection():
    rng = np.random.default_rng(0)
    m = 5
    X = rng.standard_normal((20, m))
    Y = rng.standard_normal((m + 1, m))
    assert np.allclose(ft.reconstruct_from_sq_distances(ft.sq_distances(X, Y), Y), X, atol=1e-9)
    Y3 = Y[:3]
    Xh, r = ft.reconstruct_from_sq_distances(ft.sq_distances(X, Y3), Y3, return_residual=True)
    Q, _ = np.linalg.qr((Y3[1:] - Y3[0]).T)       # basis of the affine span's directions
    proj = Y3[0] + (X - Y3[0]) @ Q @ Q.T
    assert np.allclose(Xh, proj, atol=1e-9)
    assert np.allclose(r, np.linalg.norm(X - proj, axis=1), atol=1e-6)


# ------------------------------------------------------------------------------------------------
# noise scales (Theorems 4 and 6) and the "+" variants
# ------------------------------------------------------------------------------------------------
def test_noise_scale_formulas_against_hand_values():
    # Thm 4: c = sqrt(2 ln(1.25/1e-5)) = 4.84481..., Delta = 2 tau = 2
    assert ft.data_sensitivity(1.0) == 2.0
    assert ft.dp_noise_sd(0.5, 1e-5, 2.0, "dp_data") == pytest.approx(4.844805 * 2 / 0.5, rel=1e-6)
    # Thm 6: sd = Delta sqrt(8 S log(e + eps/delta)) / eps
    assert ft.dp_noise_sd(2.0, 1e-3, 0.1, "dp_gradient", compositions=10) == pytest.approx(
        0.1 * math.sqrt(80 * math.log(math.e + 2000)) / 2.0, rel=1e-12)
    # Delta = 8 sqrt(n_y) gamma tau_X / (n_p n_y) {1 + 2 gamma (tau_X + tau_Y)(tau_X + Upsilon)}
    assert ft.gradient_sensitivity(10, 4, 0.5, 1.0, 2.0, 3.0) == pytest.approx(8 * 2 * 0.5 / 40 * (1 + 12), rel=1e-12)
    with pytest.warns(UserWarning, match="epsilon < 1"):
        ft.dp_noise_sd(2.0, 1e-5, 1.0, "dp_data")


def test_feddl_noise_variants_use_the_calibrated_sd():
    X, y = _blobs(60, 4)
    data = [X[ix] for ix in make_partition(y, 2, "iid", seed=0)]
    Y0 = np.random.default_rng(0).standard_normal((5, 4))
    base = dict(rounds=3, init=Y0, gamma=0.05)
    clean = ft.feddl(data, 5, **base)
    tau = max(np.linalg.norm(x, axis=1).max() for x in data)
    # data perturbation: Thm 4 sd, applied to the data the clients keep for the uploads
    dd = ft.feddl(data, 5, noise="dp_data", epsilon=0.5, delta=1e-5, **base)
    assert np.allclose(dd.noise_sd, ft.dp_noise_sd(0.5, 1e-5, 2 * tau, "dp_data"))
    assert not np.allclose(dd.client_data[0], data[0])
    # heuristic: sd = beta * sd(gradient) at Y^0 in round 1
    h = ft.feddl(data, 5, noise="heuristic", beta=0.5, **base)
    g0 = ft.mmd2_u_grad(data[1], Y0, 0.05)
    assert h.noise_sd[0, 1] == pytest.approx(0.5 * g0.std())
    assert not np.allclose(h.landmarks, clean.landmarks)
    # gradient perturbation: Thm 6 with tau_Y = ||Y||_2, Upsilon = max ||y - x|| at Y^0, T = S rounds
    dg = ft.feddl(data, 5, noise="dp_gradient", epsilon=1.0, delta=1e-5, **base)
    ups = np.sqrt(ft.sq_distances(Y0, data[0]).max())
    sens = ft.gradient_sensitivity(len(data[0]), 5, 0.05, tau, np.linalg.norm(Y0, 2), ups)
    assert dg.noise_sd[0, 0] == pytest.approx(ft.dp_noise_sd(1.0, 1e-5, sens, "dp_gradient", compositions=3))


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
    res = ft.fed_tsne(X, parts, 20, rounds=30, tsne_kwargs={"max_iter": 300})
    assert res.embedding.shape == (len(X), 2)
    assert _knn_acc(res.embedding, y) > 0.9
    assert res.distance_upload_bytes == len(X) * 20 * 8
    assert res.upload_bytes == res.distance_upload_bytes + res.feddl.upload_bytes


def test_centralized_tsne_baseline(blobs50):
    X, y = blobs50
    res = ft.fed_tsne(X, None, centralized=True, tsne_kwargs={"max_iter": 300})
    assert res.feddl is None and res.upload_bytes == 0 and not res.federated
    assert _knn_acc(res.embedding, y) > 0.9


def test_fed_speclust_recovers_blobs_and_matches_centralized(blobs50):
    X, y = blobs50
    parts = make_partition(y, 3, "one_class", seed=0)
    fed = ft.fed_spectral_clustering(X, parts, 3, 20, rounds=30)
    cen = ft.fed_spectral_clustering(X, parts, 3, centralized=True)
    assert adjusted_rand_score(y, fed.labels) > 0.9
    assert adjusted_rand_score(y, cen.labels) > 0.9
    assert cen.gamma == pytest.approx(fed.gamma)       # same gamma rule on the same parts
    assert fed.kernel_upload_bytes == len(X) * 20 * 8


def test_fed_tsne_plus_variants_run(blobs50):
    X, y = blobs50
    res = ft.fed_tsne(X, 3, 12, rounds=5, noise="heuristic", tsne_kwargs={"max_iter": 250})
    assert res.feddl.noise == "heuristic" and res.feddl.noise_sd.shape == (5, 3)


def test_fed_umap_missing_package_message(monkeypatch, blobs50):
    monkeypatch.setitem(sys.modules, "umap", None)
    with pytest.raises(ImportError, match="pip install umap-learn"):
        ft.fed_umap(blobs50[0], 3, 10)


def test_fed_umap_keeps_blobs_separated(blobs50):
    pytest.importorskip("umap")
    X, y = blobs50
    fed = ft.fed_umap(X, make_partition(y, 3, "iid", seed=0), 20, rounds=30, umap_kwargs={"n_epochs": 100})
    cen = ft.fed_umap(X, None, centralized=True, umap_kwargs={"n_epochs": 100})
    assert fed.embedding.shape == cen.embedding.shape == (len(X), 2)
    assert _knn_acc(fed.embedding, y) > 0.9 and _knn_acc(cen.embedding, y) > 0.9


# ------------------------------------------------------------------------------------------------
# bad input
# ------------------------------------------------------------------------------------------------
_X, _Y = _blobs(30, 3)
_DATA = [_X[:15], _X[15:]]


@pytest.mark.parametrize("call, match", [
    (lambda: ft.feddl(_DATA, 1), "n_landmarks"),
    (lambda: ft.feddl(_DATA, 4, gamma=0.0), "gamma"),
    (lambda: ft.feddl(_DATA, 4, gamma=-1.0), "gamma"),
    (lambda: ft.feddl(_DATA, 4, gamma="silverman"), "gamma"),
    (lambda: ft.feddl(_DATA, 4, mode="sgd"), "mode"),
    (lambda: ft.feddl(_DATA, 4, init="pca"), "init"),
    (lambda: ft.feddl(_DATA, 4, init=np.zeros((3, 3))), "init"),
    (lambda: ft.feddl(_DATA, 4, noise="laplace"), "noise"),
    (lambda: ft.feddl(_DATA, 4, weights="random"), "weights"),
    (lambda: ft.feddl(_DATA, 4, local_steps=3), "local_steps"),
    (lambda: ft.feddl(_DATA, 4, lr=0.0), "lr"),
    (lambda: ft.feddl(_DATA, 4, rounds=0), "rounds"),
    (lambda: ft.feddl(_DATA, 4, noise="dp_data"), "epsilon"),
    (lambda: ft.feddl(_DATA, 4, noise="dp_gradient", epsilon=0.0, delta=1e-5), "epsilon"),
    (lambda: ft.feddl(_DATA, 4, noise="dp_gradient", epsilon=1.0, delta=1.0), "delta"),
    (lambda: ft.feddl(_DATA, 4, noise="heuristic", beta=-1.0), "beta"),
    (lambda: ft.feddl([_X[:1], _X[1:]], 4), "needs >= 2"),
    (lambda: ft.feddl([_X, _X[:, :2]], 4), "features"),
    (lambda: ft.dp_noise_sd(-1.0, 1e-5, 1.0), "epsilon"),
    (lambda: ft.dp_noise_sd(0.5, 0.0, 1.0), "delta"),
    (lambda: ft.dp_noise_sd(0.5, 1.5, 1.0), "delta"),
    (lambda: ft.dp_noise_sd(0.5, 1e-5, 1.0, "renyi"), "mechanism"),
    (lambda: ft.gaussian_kernel(_X, None, 0.0), "gamma"),
    (lambda: ft.fed_tsne(_X, 3, 4, perplexity=30.0), "perplexity"),
    (lambda: ft.fed_tsne(_X, 3, 1), "n_landmarks"),
    (lambda: ft.fed_tsne(_X, 40, 4, perplexity=5.0), "more clients than samples"),
    (lambda: ft.fed_tsne(_X, [np.arange(10), np.arange(5, 30)], 4, perplexity=5.0), "partition"),
    (lambda: ft.fed_tsne(_X, 3, 4, perplexity=5.0, inverse="svd"), "inverse"),
    (lambda: ft.fed_tsne(_X, 3, 4, perplexity=5.0, rank=9), "rank"),
    (lambda: ft.fed_tsne(_X, 3, 4, perplexity=5.0, noise="gauss"), "noise"),
    (lambda: ft.fed_spectral_clustering(_X, 3, 3, 4, affinity_gamma=-2.0), "affinity_gamma"),
    (lambda: ft.fed_spectral_clustering(_X, 3, 1, 4), "n_clusters"),
    (lambda: ft.landmark_pinv(np.eye(3), inverse="pinv", ridge=1.0), "ridge"),
    (lambda: ft.reconstruct_from_sq_distances(np.ones((2, 3)), np.ones((4, 3))), "sq_dists"),
])
def test_bad_input_raises_value_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_unknown_feddl_keyword_is_rejected_before_work():
    with pytest.raises(TypeError, match="unknown FedDL keyword"):
        ft.fed_tsne(_X, 3, 4, perplexity=5.0, round=3)
