"""Fed-tSNE / Fed-UMAP / Fed-SpeClust without an n x n matrix: the blockwise kNN of the Nystrom
estimate equals the kNN of the dense estimate (any block size, ties to the lower index), the
server's kNN comes back in the row order of X, and the sparse pipelines embed / cluster as well as
the dense ones on sizes where both fit; bad inputs name their parameter."""
import numpy as np
import pytest
from sklearn.datasets import load_digits
from sklearn.neighbors import NearestNeighbors
from threadpoolctl import threadpool_limits

from fedlib.evaluation.embedding import clustering_nmi, knn_accuracy, neighborhood_preservation
from fedlib.fedtsne import algorithm as ft
from fedlib.fedtsne import feddl as ft_feddl
from fedlib.fedtsne import knn as ft_knn
from fedlib.fedtsne import mmd as ft_mmd
from fedlib.fedtsne import nystrom as ft_nystrom
from fedlib.fedtsne import pipelines as ft_pipelines
from fedlib.fedtsne import pipelines


@pytest.fixture(autouse=True)
def _one_thread():
    with threadpool_limits(1):
        yield


@pytest.fixture(scope="module")
def digits600():
    X, y = load_digits(return_X_y=True)
    return X[:600] / 16.0, y[:600]


@pytest.fixture(scope="module")
def feddl600(digits600):
    """One FedDL run (5 IID clients as ``parts=5`` splits them, 40 landmarks, 10 rounds)."""
    X, _ = digits600
    with threadpool_limits(1):
        data, _ = ft_mmd.split_clients(X, 5, 0)
        return ft_feddl.feddl(data, 40, rounds=10, seed=0)


@pytest.fixture(scope="module")
def blocks(digits600, feddl600):
    X, _ = digits600
    Y = feddl600.landmarks
    return X, ft_mmd.sq_distances(X, Y), ft_mmd.sq_distances(Y), ft_mmd.gaussian_kernel(X, Y, feddl600.gamma), \
        ft_mmd.gaussian_kernel(Y, None, feddl600.gamma)


def _dense_knn(M, k, largest=False):
    """kNN of a dense (n, n) score matrix, diagonal excluded: (sorted values (n, k), k-th gap (n,))."""
    M = np.array(M, dtype=np.float64)
    np.fill_diagonal(M, -np.inf if largest else np.inf)
    s = np.sort(-M if largest else M, axis=1)
    return (-s if largest else s)[:, :k], np.abs(s[:, k] - s[:, k - 1])


def _assert_same_knn(idx, val, M, k, largest=False):
    """Same values as the dense kNN, and the same neighbour SETS on every row without a tie at the k-th."""
    dense_val, gap = _dense_knn(M, k, largest)
    scale = np.abs(dense_val).max()
    np.testing.assert_allclose(val, dense_val, rtol=0, atol=1e-9 * scale)
    np.testing.assert_allclose(np.take_along_axis(M, idx, axis=1), val, rtol=0, atol=1e-9 * scale)
    clear = gap > 1e-7 * scale
    assert clear.mean() > 0.9                                   # the comparison below is not vacuous
    order = np.argsort(-M if largest else M, axis=1, kind="stable")
    for i in np.flatnonzero(clear):
        row = order[i][order[i] != i][:k]
        assert set(row) == set(idx[i]), i
    assert not (idx == np.arange(len(M))[:, None]).any()       # self excluded


@pytest.mark.parametrize("inverse_kw", [{}, {"rank": 20}, {"inverse": "ridge", "ridge": 1e-3}])
def test_distance_knn_equals_dense_estimate(blocks, inverse_kw):
    X, B, W, _, _ = blocks
    k = 15
    idx, val = ft_nystrom.nystrom_knn(B, W, k, **inverse_kw)
    assert idx.shape == val.shape == (len(X), k) and idx.dtype == np.int64
    assert (np.diff(val, axis=1) >= 0).all()                    # nearest first
    _assert_same_knn(idx, val, ft.nystrom_distances(B, W, **inverse_kw), k)


def test_kernel_knn_equals_dense_estimate(blocks):
    X, _, _, C, K = blocks
    k = 12
    idx, val = ft_nystrom.nystrom_knn(C, K, k, "kernel")
    assert (np.diff(val, axis=1) <= 0).all() and (val >= 0).all()   # largest first, clipped at 0
    _assert_same_knn(idx, val, ft.nystrom_kernel(C, K), k, largest=True)


@pytest.mark.parametrize("kind", ["distances", "kernel"])
def test_block_size_does_not_change_the_result(blocks, kind):
    _, B, W, C, K = blocks
    M, Wm = (B, W) if kind == "distances" else (C, K)
    ref_idx, ref_val = ft_nystrom.nystrom_knn(M, Wm, 10, kind, rows=600)
    for kw in [{"rows": 1}, {"rows": 7}, {"rows": 599}, {"block_bytes": 50_000}]:
        idx, val = ft_nystrom.nystrom_knn(M, Wm, 10, kind, **kw)
        np.testing.assert_array_equal(idx, ref_idx)
        np.testing.assert_allclose(val, ref_val, rtol=1e-12, atol=1e-12)


def test_ties_go_to_the_lower_index_whatever_the_block():
    # 4 groups of 5 identical points: every point has 4 neighbours at distance 0, then ties at the group gap
    X = np.repeat(np.arange(4.0)[:, None] * np.array([[1.0, 0.0]]), 5, axis=0)
    for rows in (1, 3, 20):
        idx, val = ft_knn.exact_sq_knn(X, 6, rows=rows)
        for i in range(20):
            g = i // 5
            same = [j for j in range(5 * g, 5 * g + 5) if j != i]
            nxt = 5 * (g - 1) if g > 0 else 5        # both neighbouring groups tie: the lower indices win
            assert list(idx[i, :4]) == same, (rows, i)
            assert list(idx[i, 4:]) == [nxt, nxt + 1], (rows, i)
        np.testing.assert_array_equal(val[:, :4], 0.0)


def test_exact_sq_knn_matches_sklearn(digits600):
    X, _ = digits600
    idx, val = ft_knn.exact_sq_knn(X, 8, rows=64)
    d, j = NearestNeighbors(n_neighbors=8).fit(X).kneighbors()
    np.testing.assert_allclose(np.sqrt(val), d, atol=1e-9)
    assert np.mean([set(a) == set(b) for a, b in zip(idx, j)]) > 0.99


def test_knn_graph_symmetrizes():
    idx = np.array([[1], [2], [0]])
    val = np.array([[1.0], [2.0], [4.0]])
    A = ft_knn.knn_graph(idx, val).toarray()
    np.testing.assert_allclose(A, A.T)
    assert A[0, 1] == 0.5 and A[0, 2] == 2.0
    np.testing.assert_allclose(ft_knn.knn_graph(idx, val, "max").toarray()[0, 2], 4.0)


def test_server_knn_comes_back_in_the_row_order_of_X(digits600):
    """Non-contiguous parts: the server's kNN lists (uploads, NystromServer(neighbors=k), reordering)
    equal nystrom_knn computed directly in the row order of X, for both kinds."""
    X, _ = digits600
    parts = [np.flatnonzero(np.arange(600) % 5 == p) for p in range(5)]
    fd = ft_feddl.feddl([X[p] for p in parts], 30, rounds=3, seed=1)
    Y = fd.landmarks
    direct = {"distances": ft_nystrom.nystrom_knn(ft_mmd.sq_distances(X, Y), ft_mmd.sq_distances(Y), 5),
              "kernel": ft_nystrom.nystrom_knn(ft_mmd.gaussian_kernel(X, Y, fd.gamma), ft_mmd.gaussian_kernel(Y, None, fd.gamma), 5,
                                       "kernel")}
    for kind, (idx, val) in direct.items():
        (got_idx, got_val), _, cost = pipelines._federated_matrix(X, parts, 30, kind, None, {}, fd, 0, False, {},
                                                                  neighbors=5)
        assert cost.bytes_up == 600 * 30 * 8
        assert np.mean([set(a) == set(b) for a, b in zip(got_idx, idx)]) > 0.99, kind
        np.testing.assert_allclose(got_val, val, atol=1e-8)


def test_sparse_tsne_quality_matches_dense(digits600, feddl600):
    X, y = digits600
    kw = dict(feddl_result=feddl600, tsne_kwargs={"max_iter": 500}, seed=0)
    dense = ft_pipelines.fed_tsne(X, 5, 40, sparse=False, **kw)
    sparse = ft_pipelines.fed_tsne(X, 5, 40, sparse=True, **kw)
    assert sparse.embedding.shape == (600, 2) and np.isfinite(sparse.embedding).all()
    assert sparse.distance_upload_bytes == dense.distance_upload_bytes
    ca_d, ca_s = knn_accuracy(dense.embedding, y, 10), knn_accuracy(sparse.embedding, y, 10)
    npa_d, npa_s = (neighborhood_preservation(X, Z, 10) for Z in (dense.embedding, sparse.embedding))
    assert ca_s > ca_d - 0.04, (ca_s, ca_d)
    assert npa_s > npa_d - 0.06, (npa_s, npa_d)


def test_sparse_centralized_tsne_uses_opentsne_on_X(digits600):
    X, y = digits600
    res = ft_pipelines.fed_tsne(X, None, centralized=True, sparse=True, tsne_kwargs={"max_iter": 300}, keep_distances=True)
    assert res.distances is None and res.embedding.shape == (600, 2)
    assert knn_accuracy(res.embedding, y, 10) > 0.9


def test_sparse_umap_quality_matches_dense(digits600, feddl600):
    X, y = digits600
    kw = dict(feddl_result=feddl600, umap_kwargs={"n_epochs": 50}, seed=0)
    ca = [knn_accuracy(ft_pipelines.fed_umap(X, 5, 40, sparse=s, **kw).embedding, y, 10) for s in (False, True)]
    assert ca[1] > ca[0] - 0.05, ca


def test_sparse_spectral_clustering_nmi_matches_dense(digits600, feddl600):
    X, y = digits600
    fed = [clustering_nmi(y, ft_pipelines.fed_spectral_clustering(X, 5, 10, 40, feddl_result=feddl600, sparse=s).labels)
           for s in (False, True)]
    cen = [clustering_nmi(y, ft_pipelines.fed_spectral_clustering(X, 5, 10, centralized=True, sparse=s).labels)
           for s in (False, True)]
    assert fed[1] > fed[0] - 0.05 and cen[1] > cen[0] - 0.05, (fed, cen)
    res = ft_pipelines.fed_spectral_clustering(X, 5, 10, 40, feddl_result=feddl600, sparse=True, n_neighbors=8,
                                     keep_affinity=True)
    A = res.affinity
    assert A.shape == (600, 600) and abs(A - A.T).max() < 1e-12 and A.nnz <= 2 * 8 * 600


def test_automatic_path_above_dense_max_points(monkeypatch, digits600, feddl600):
    X, _ = digits600
    monkeypatch.setattr(pipelines, "DENSE_MAX_POINTS", 599)
    res = ft_pipelines.fed_tsne(X, 5, 40, feddl_result=feddl600, keep_distances=True, tsne_kwargs={"max_iter": 250})
    assert res.distances.shape == (600, 600) and res.distances.nnz == 600 * 90     # kNN lists, not n x n
    monkeypatch.setattr(pipelines, "DENSE_MAX_POINTS", 600)
    res = ft_pipelines.fed_tsne(X, 5, 40, feddl_result=feddl600, keep_distances=True, tsne_kwargs={"max_iter": 250})
    assert isinstance(res.distances, np.ndarray)


def test_bad_inputs_name_the_parameter(blocks, digits600, feddl600):
    X, B, W, _, _ = blocks
    with pytest.raises(ValueError, match="k must be an integer >= 1 and <= 599"):
        ft_nystrom.nystrom_knn(B, W, 600)
    with pytest.raises(ValueError, match="k must be an integer"):
        ft_nystrom.nystrom_knn(B, W, 0)
    with pytest.raises(ValueError, match="unknown kind"):
        ft_nystrom.nystrom_knn(B, W, 3, "graph")
    with pytest.raises(ValueError, match="B must be"):
        ft_nystrom.nystrom_knn(B, W[:5, :5], 3)
    with pytest.raises(ValueError, match="rows must be"):
        ft_nystrom.nystrom_knn(B, W, 3, rows=0)
    with pytest.raises(ValueError, match="block_bytes"):
        ft_nystrom.nystrom_knn(B, W, 3, block_bytes=0)
    with pytest.raises(ValueError, match="rank"):
        ft_nystrom.nystrom_knn(B, W, 3, rank=10_000)
    with pytest.raises(ValueError, match="F and G"):
        ft_knn.blockwise_knn(np.zeros((5, 2)), np.zeros((5, 3)), 2)
    with pytest.raises(ValueError, match="need at least 2 points"):
        ft_knn.blockwise_knn(np.zeros((1, 2)), np.zeros((1, 2)), 1)
    with pytest.raises(ValueError, match="neighbors must be"):
        ft.NystromServer(feddl600.landmarks, neighbors=0)
    with pytest.raises(ValueError, match="sparse must be"):
        ft_pipelines.fed_tsne(X, 5, 40, feddl_result=feddl600, sparse="yes")
    with pytest.raises(ValueError, match="n_neighbors must be an integer >= 1 and <= 599"):
        ft_pipelines.fed_spectral_clustering(X, 5, 10, 40, feddl_result=feddl600, sparse=True, n_neighbors=600)
    with pytest.raises(ValueError, match="n_neighbors applies to the sparse path"):
        ft_pipelines.fed_spectral_clustering(X, 5, 10, 40, feddl_result=feddl600, sparse=False, n_neighbors=5)
    with pytest.raises(ValueError, match="max_iter must be"):
        ft_pipelines.fed_tsne(X, 5, 40, feddl_result=feddl600, sparse=True, tsne_kwargs={"max_iter": -1})
    with pytest.raises(ValueError, match="symmetrize"):
        ft_knn.knn_graph(np.zeros((2, 1), int), np.zeros((2, 1)), "both")


def test_scale_bench_tiny_report(tmp_path):
    import re

    from fedlib.fedtsne import bench_scale as fedtsne_scale

    out = tmp_path / "fedtsne_scale.txt"
    argv = ["--dataset", "optdigits", "--points", "300", "--clients", "3", "--landmarks", "12", "--rounds", "2",
            "--tsne-max-iter", "250", "--threads", "1", "--out", str(out)]
    assert fedtsne_scale.main(argv) == 0
    text = out.read_text()
    assert text.startswith("machine: ") and "optdigits, 300 points x 64 features" in text
    assert "3 IID clients, n_y=12 landmarks" in text and "fixed: 2 rounds" in text
    assert re.search(r"time ratio Fed-tSNE / centralized\s+[\d.]+x", text)
    values = [float(v) for v in re.findall(r"(?:CA|NPA) 10-NN (?:centralized|Fed-tSNE|best route)\s+([\d.]+)", text)]
    assert len(values) == 6 and all(0.0 <= v <= 1.0 for v in values)
    recalls = [float(v) for v in re.findall(r"10-NN recall of the (?:Nystrom estimate|best route)\s+([\d.]+)", text)]
    assert len(recalls) == 2 and all(0.0 <= v <= 1.0 for v in recalls)
    assert "best route: federated k-means landmarks" in text and "estimate: projection + residuals" in text
    # the goal rows say met, or name every missed target with its number
    goals = re.findall(r"goal (?:Fed-tSNE|best route) \(CA -0.02, NPA -0.05, time 2x\)\s+(met|missed: .+)", text)
    assert len(goals) == 2 and all(g == "met" or re.fullmatch(r"missed: .*[\d.]+.*", g) for g in goals)
    assert "check < 8: passed" in text
    with pytest.raises(SystemExit):
        fedtsne_scale.main(argv[:-2] + ["--rounds", "zero", "--out", "-"])
    with pytest.raises(SystemExit):        # the best route's closed form needs n_y <= m + 1
        fedtsne_scale.main(["--dataset", "optdigits", "--points", "300", "--landmarks", "66", "--out", "-"])
    assert fedtsne_scale.overlap([[1, 2]], [[2, 3]]) == 0.5


@pytest.mark.parametrize("squared", [True, False])
def test_landmark_quality_equals_the_dense_distance_quality(squared):
    """The chapters' D-hat quality from landmarks, in row blocks, equals distance_quality on the dense
    Nystrom estimate (relative error to round-off, the same 10-NN overlap), for any block size."""
    from fedlib.fedtsne.chapters import EmbeddingScorer
    from fedlib.fedtsne.checks import nystrom_estimate

    g = np.random.default_rng(5)
    X = np.concatenate([g.normal(c, 1.0, (60, 7)) for c in (0.0, 3.0, 6.0)])
    Y = g.normal(3.0, 2.0, (9, 7))
    scorer = EmbeddingScorer(X, np.repeat([0, 1, 2], 60), ks=[5])
    dense = scorer.distance_quality(nystrom_estimate(X, Y, squared))
    for block in (None, 7 * 24 * len(X)):   # the default budget (one block) and 7-row blocks
        blocked = scorer.landmark_quality(Y, squared, block_bytes=block)
        assert blocked["D-hat rel. error"] == pytest.approx(dense["D-hat rel. error"], rel=1e-9)
        assert blocked["D-hat 10-NN"] == dense["D-hat 10-NN"]
    # one block reads the scorer's cached exact distances and leaves them as they were
    exact = scorer.exact_distances().copy()
    scorer.landmark_quality(Y, squared)
    np.testing.assert_array_equal(scorer.exact_distances(), exact)
    with pytest.raises(ValueError, match="landmarks must have 7 columns"):
        scorer.landmark_quality(Y[:, :3])
