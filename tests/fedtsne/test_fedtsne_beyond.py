"""Issue 14, Fed-tSNE / Fed-UMAP items (``fedlib.fedtsne.beyond``): the closed form of the Nystrom
estimate and the upload's decomposition against fedlib's Nystrom and numpy's least squares; the
estimators against direct computations; federated k-means against centralized Lloyd (numpy loop and
scikit-learn); local placement; bad inputs."""
import numpy as np
import pytest
from scipy.spatial.distance import cdist

from fedlib.core.linalg import relative_error
from fedlib.core.messages import Message
from fedlib.fedtsne import algorithm as ft
from fedlib.fedtsne import checks as ft_checks
from fedlib.fedtsne import mmd as ft_mmd
from fedlib.fedtsne import nystrom as ft_nystrom
from fedlib.fedtsne import beyond as bd


def _data(n=60, m=9, ny=5, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, m)), rng.standard_normal((ny, m)) * 1.5 + 0.3


def _lstsq_projection(X, Y):
    """Independent reference: orthogonal projection onto the affine hull by numpy least squares."""
    C = Y[1:] - Y[0]
    coef = np.linalg.lstsq(C.T, (X - Y[0]).T, rcond=None)[0]
    P = Y[0] + (C.T @ coef).T
    return P, np.linalg.norm(X - P, axis=1)


@pytest.mark.parametrize("ny", [2, 3, 6, 10])                  # m = 9: n_y = m + 1 = 10 included
def test_closed_form_equals_fedlib_nystrom(ny):
    X, Y = _data(ny=ny, seed=ny)
    B, W = ft_mmd.sq_distances(X, Y), ft_mmd.sq_distances(Y)
    dec = bd.decompose_upload(B, Y)
    ref = ft_nystrom.nystrom(B, W)                                       # B W^+ B^T (eigendecomposition)
    assert relative_error(bd.nystrom_closed_form(dec), ref) < 1e-10
    # 1' W^-1 1 = 1 / (2 a^2), a the landmarks' circumradius (Eq. bf-kappa)
    kappa = np.ones(ny) @ np.linalg.solve(W, np.ones(ny))
    assert abs(kappa * 2 * dec.geometry.radius2 - 1) < 1e-10
    # the circumcentre is equidistant from every landmark
    c = dec.geometry.origin + dec.geometry.Q @ dec.geometry.center
    assert np.ptp(np.linalg.norm(Y - c, axis=1) ** 2) < 1e-10 * dec.geometry.radius2


@pytest.mark.parametrize("ny", [3, 6, 10])
def test_upload_reconstructs_projection_and_residual_exactly(ny):
    X, Y = _data(ny=ny, seed=10 + ny)
    B = ft.client_sq_distances(X, Y)["sq_distances"]
    dec = bd.decompose_upload(B, Y)
    P, rho = _lstsq_projection(X, Y)
    assert relative_error(dec.projection, P) < 1e-12
    assert np.abs(dec.residual - rho).max() < 1e-7 * np.abs(X).max()
    lam = dec.barycentric
    assert np.abs(lam.sum(1) - 1).max() < 1e-12 and relative_error(lam @ Y, P) < 1e-12
    # the existing multilateration attack agrees
    assert relative_error(ft_checks.reconstruct_from_sq_distances(B, Y), P) < 1e-10
    # and the upload depends on x only through (projection, residual)
    if ny <= X.shape[1]:
        moved = bd.points_with_same_upload(X, Y, np.random.default_rng(0))
        assert relative_error(ft_mmd.sq_distances(moved, Y), B) < 1e-12
        assert relative_error(moved, X) > 0.05


def test_estimators_against_direct_computation():
    X, Y = _data(n=50, m=12, ny=6, seed=3)
    dec = bd.decompose_upload(ft_mmd.sq_distances(X, Y), Y)
    P, rho = _lstsq_projection(X, Y)
    proj = cdist(P, P, "sqeuclidean")
    direct = {"projection": proj,
              "residual_sum": proj + rho[:, None] ** 2 + rho[None, :] ** 2,
              "residual_gap": proj + (rho[:, None] - rho[None, :]) ** 2,
              "nystrom": ft_nystrom.nystrom(ft_mmd.sq_distances(X, Y), ft_mmd.sq_distances(Y))}
    true = ft_mmd.sq_distances(X)
    off = ~np.eye(len(X), dtype=bool)
    for est, ref in direct.items():
        S = bd.estimate_sq_distances(dec, est)
        assert np.abs(S - ref).max() < 1e-9 * np.abs(ref).max(), est
        # kNN blockwise equals sorting the dense estimate (clipped at 0, self excluded)
        idx, val = bd.estimator_knn(dec, est, 5, rows=7)
        dense = np.where(off, np.maximum(S, 0), np.inf)
        assert np.allclose(np.sort(dense, 1)[:, :5], val, rtol=1e-9, atol=1e-9), est
    # the true distances lie in the interval the upload allows (Eq. bf-interval)
    lo, hi = direct["residual_gap"], proj + (rho[:, None] + rho[None, :]) ** 2
    assert (true[off] >= lo[off] - 1e-9).all() and (true[off] <= hi[off] + 1e-9).all()
    assert 0.0 <= bd.feasible_violations(dec) <= 1.0
    assert bd.knn_recall(np.array([[1, 2], [0, 2]]), np.array([[2, 3], [2, 0]])) == pytest.approx(0.75)


def _lloyd(X, C, rounds):
    """Centralized Lloyd, numpy loop; an empty cell keeps its centre; stops when the centres stop moving."""
    C = C.copy()
    for _ in range(rounds):
        lab = np.argmin(cdist(X, C, "sqeuclidean"), axis=1)
        new = C.copy()
        for k in range(len(C)):
            if (lab == k).any():
                new[k] = X[lab == k].mean(0)
        done = np.array_equal(new, C)
        C = new
        if done:
            break
    return C


def test_federated_kmeans_equals_centralized_lloyd():
    rng = np.random.default_rng(1)
    X = np.vstack([rng.standard_normal((40, 6)) + 4 * rng.standard_normal(6) for _ in range(5)])
    parts = np.array_split(rng.permutation(len(X)), 4)
    data = [X[p] for p in parts]
    init = X.mean(0) + X.std(0) * rng.standard_normal((12, 6))         # FedDL-style Y^0: some cells empty
    res = bd.federated_kmeans(data, init, 30)
    assert relative_error(res.centers, _lloyd(X, init, 30)) < 1e-10
    assert res.converged and res.rounds < 30
    # measured bytes: each client uploads n_y x m sums and n_y counts per round, float64
    assert res.cost.bytes_up == res.rounds * 4 * 12 * (6 + 1) * 8
    # against scikit-learn's Lloyd from data points (no empty cell: sklearn would relocate one)
    from sklearn.cluster import KMeans

    init2 = X[rng.choice(len(X), 8, replace=False)]
    fed = bd.federated_kmeans(data, init2, 5)
    sk = KMeans(8, init=init2, n_init=1, max_iter=fed.rounds, tol=0.0, algorithm="lloyd").fit(X)
    assert fed.empty[-1] == 0 and relative_error(fed.centers, sk.cluster_centers_) < 1e-10


def test_kmeans_server_counts_singletons():
    server = bd.KMeansServer(np.zeros((2, 2)))
    server.receive([Message("a", {"sums": np.array([[1.0, 2.0], [0.0, 0.0]]), "counts": np.array([1.0, 0.0])}),
                    Message("b", {"sums": np.array([[3.0, 2.0], [0.0, 0.0]]), "counts": np.array([1.0, 0.0])})])
    assert np.array_equal(server.result(), [[2.0, 2.0], [0.0, 0.0]])
    assert server.singleton_cells[-1] == 2 and server.empty[-1] == 1


def test_local_placement_shapes_and_determinism():
    rng = np.random.default_rng(2)
    X = np.vstack([rng.standard_normal((30, 5)) + 6 * i for i in range(3)])
    Y = X[rng.choice(len(X), 20, replace=False)] + 0.1 * rng.standard_normal((20, 5))
    data = [X[:35], X[35:70], X[70:]]
    a = bd.local_placement(data, Y, "tsne", seed=3, perplexity=5.0, tsne_max_iter=300)
    b = bd.local_placement(data, Y, "tsne", seed=3, perplexity=5.0, tsne_max_iter=300)
    assert a.embedding.shape == (90, 2) and a.landmark_embedding.shape == (20, 2)
    assert np.array_equal(a.embedding, b.embedding) and np.isfinite(a.embedding).all()
    assert a.cost.bytes_up == 90 * 2 * 8 and a.cost.bytes_down == 3 * 20 * (5 + 2) * 8
    # clients that keep their positions upload nothing
    server = bd.PlacementServer(Y, a.landmark_embedding)
    client = bd.PlacementClient("tsne", 3, 5.0, upload=False)
    from fedlib.core.protocol import simulate
    assert simulate(server, client, data, 1).bytes_up == 0 and server.result() == []


@pytest.mark.slow   # numba compiles umap-learn's layout for ~30-40 s in a fresh process
def test_local_placement_umap_shapes_and_determinism():
    pytest.importorskip("umap")
    rng = np.random.default_rng(4)
    X = np.vstack([rng.standard_normal((25, 4)) + 5 * i for i in range(2)])
    Y = X[rng.choice(len(X), 12, replace=False)]
    a = bd.local_placement([X[:20], X[20:]], Y, "umap", seed=1, umap_neighbors=5, umap_epochs=30)
    b = bd.local_placement([X[:20], X[20:]], Y, "umap", seed=1, umap_neighbors=5, umap_epochs=30)
    assert a.embedding.shape == (50, 2) and np.array_equal(a.embedding, b.embedding)


def test_bad_inputs_name_the_parameter():
    X, Y = _data(n=20, m=4, ny=3)
    with pytest.raises(ValueError, match="n_landmarks must be >= 2"):
        bd.hull_geometry(Y[:1])
    with pytest.raises(ValueError, match="n_landmarks must be an integer >= 2"):
        bd.check_beyond_inputs(X, [1], [])
    with pytest.raises(ValueError, match="n_landmarks must be <= the number of points n = 20"):
        bd.check_beyond_inputs(np.random.default_rng(0).standard_normal((20, 40)), [21], [])
    with pytest.raises(ValueError, match=r"n_landmarks must be <= m \+ 1 = 5"):
        bd.check_beyond_inputs(X, [6], [])
    with pytest.raises(ValueError, match=r"n_landmarks must be <= m \+ 1 = 5"):
        bd.hull_geometry(np.random.default_rng(0).standard_normal((6, 4)))
    with pytest.raises(ValueError, match="affinely dependent"):
        bd.hull_geometry(np.vstack([Y, Y.mean(0, keepdims=True)]))
    dec = bd.decompose_upload(ft_mmd.sq_distances(X, Y), Y)
    with pytest.raises(ValueError, match="unknown estimator 'mds'; allowed: nystrom, projection"):
        bd.estimator_factors(dec, "mds")
    with pytest.raises(ValueError, match="unknown estimator 'mds'"):
        bd.check_beyond_inputs(X, [3], ["mds"])
    with pytest.raises(ValueError, match=r"unknown metric_combos\[0\] landmark kind 'random'"):
        bd.parse_combos(["random/nystrom"])
    with pytest.raises(ValueError, match=r"sq_dists must have shape \(n, n_landmarks=3\)"):
        bd.decompose_upload(np.zeros((5, 4)), Y)
    with pytest.raises(ValueError, match="n_landmarks must be an integer >= 2"):
        bd.federated_kmeans([X[:10], X[10:]], Y[:1], 3)
    with pytest.raises(ValueError, match="unknown method 'pca'"):
        bd.local_placement([X], np.vstack([Y, Y + 1]), "pca")


def test_spec_matches_the_library_and_rejects_bad_grids():
    from conftest import chapter_values
    from fedlib.runner import specs
    from fedlib.fedtsne import specs as spec_module

    assert spec_module.ESTIMATORS == bd.ESTIMATORS and spec_module.LANDMARK_KINDS == bd.LANDMARK_KINDS
    with pytest.raises(ValueError, match="metric_grid must be values of landmark_grid"):
        specs.check("fedtsne_beyond", chapter_values("fedtsne_beyond", metric_grid=[300]))
    with pytest.raises(ValueError, match="placement_landmarks must be one of landmark_grid"):
        specs.check("fedtsne_beyond", chapter_values("fedtsne_beyond", placement_landmarks=77))
    with pytest.raises(ValueError, match=r"unknown metric_combos\[0\]"):
        specs.check("fedtsne_beyond", chapter_values("fedtsne_beyond", metric_combos=["feddl/mds"]))
