"""Fed-tSNE metrics (fedlib.evaluation.embedding): hand-made cases with exactly known values, and bad input."""
import numpy as np
import pytest
from sklearn.model_selection import train_test_split
from sklearn.neighbors import KNeighborsClassifier

from fedlib.evaluation import embedding as em


def _blobs(n_per=40, n_classes=2, dim=2, sep=100.0, seed=0):
    """Tight, far-apart clusters: class c around c * sep on every axis."""
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(n_classes), n_per)
    Z = labels[:, None] * sep + rng.normal(scale=1.0, size=(labels.size, dim))
    return Z, labels


# ---------------------------------------------------------------- NPA
def test_npa_identical_and_similarity_transform_give_one():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(120, 5))
    for k in (1, 10, 50):
        assert em.neighborhood_preservation(X, X, k) == 1.0
    theta = 0.7
    R = np.array([[np.cos(theta), -np.sin(theta)], [np.sin(theta), np.cos(theta)]])
    X2 = X[:, :2]
    assert em.neighborhood_preservation(X2, 3.0 * X2 @ R.T + 5.0, 10) == 1.0


def test_npa_hand_computed_swap():
    # X on a line at 0, 1, 10, 11; the embedding swaps points 1 and 2 (Z = 0, 10, 1, 11).
    X = np.array([[0.0], [1.0], [10.0], [11.0]])
    Z = np.array([[0.0], [10.0], [1.0], [11.0]])
    assert em.neighborhood_preservation(X, Z, 1) == 0.0      # every 1-NN changes
    assert em.neighborhood_preservation(X, Z, 2) == 0.75     # overlaps 2, 1, 1, 2 of 2
    assert em.neighborhood_preservation(X, Z, 3) == 1.0      # k = n - 1: all other points


def test_npa_random_permutation_is_chance_level():
    rng = np.random.default_rng(2)
    X = rng.normal(size=(1000, 3))
    Z = X[rng.permutation(1000)]  # point i is embedded where another point lies
    assert em.neighborhood_preservation(X, Z, 10) < 0.03  # chance = 10 / 999


def test_npa_excludes_self_by_index_with_duplicates():
    X = np.array([[0.0], [0.0], [5.0], [5.0]])  # two pairs of duplicates
    assert em.neighborhood_preservation(X, X, 1) == 1.0
    assert em.neighborhood_preservation(X, X[[2, 3, 0, 1]], 1) == 1.0  # pairs kept, places swapped
    assert em.neighborhood_preservation(X, X[[0, 2, 1, 3]], 1) == 0.0  # each partner is now far


def test_npa_precomputed_high_space():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(60, 4))
    D = np.sqrt(((X[:, None] - X[None]) ** 2).sum(-1))
    Z = rng.normal(size=(60, 2))
    assert em.neighborhood_preservation(D, Z, 5, metric_high="precomputed") == \
        em.neighborhood_preservation(X, Z, 5)


# ---------------------------------------------------------------- CA
def test_ca_separated_clusters_is_one():
    Z, y = _blobs(n_per=60, n_classes=3)
    for k in (1, 10, 50):
        assert em.knn_accuracy(Z, y, k) == 1.0


def test_ca_matches_documented_recipe_and_order_preserving_relabel():
    rng = np.random.default_rng(4)
    Z = rng.normal(size=(200, 2))
    y = (Z[:, 0] + rng.normal(scale=0.8, size=200) > 0).astype(int)
    train, test = train_test_split(np.arange(200), test_size=0.3, random_state=7, stratify=y)
    expected = np.mean(KNeighborsClassifier(10).fit(Z[train], y[train]).predict(Z[test]) == y[test])
    got = em.knn_accuracy(Z, y, 10, seed=7)
    assert got == expected and 0.5 < got < 1.0
    # same split and same vote-tie breaking when the relabelling keeps the label order
    assert em.knn_accuracy(Z, np.where(y == 1, "b", "a"), 10, seed=7) == got
    assert em.knn_accuracy(Z, y, 10, seed=7, stratify=False) == pytest.approx(got, abs=0.2)


def test_ca_stratified_split_keeps_class_shares():
    # 3 classes of 10: stratified 70/30 gives 3 test points per class; embedding puts all at one spot
    # except class 2, which is far away: 1-NN then classifies class 2 perfectly and classes 0/1
    # by the vote among coincident points, so accuracy is at least 1/3 and exactly reproducible.
    y = np.repeat([0, 1, 2], 10)
    Z = np.where(y[:, None] == 2, 100.0, 0.0) * np.ones((30, 2))
    a = em.knn_accuracy(Z, y, 1, seed=0)
    assert a == em.knn_accuracy(Z, y, 1, seed=0)
    assert 1 / 3 <= a <= 1.0


# ---------------------------------------------------------------- NMI, SC, ARI
def test_kmeans_metrics_on_separated_clusters():
    Z, y = _blobs(n_per=30, n_classes=4)
    assert em.kmeans_nmi(Z, y) == pytest.approx(1.0)
    assert em.kmeans_nmi(Z, (y + 2) % 4) == pytest.approx(1.0)  # relabelled classes
    assert em.kmeans_silhouette(Z, y) > 0.95


def test_silhouette_exact_two_pairs():
    # clusters {0, 1} and {10, 11}: s(0) = 1 - 1/10.5, s(1) = 1 - 1/9.5, symmetric for the other pair
    Z = np.array([[0.0], [1.0], [10.0], [11.0]])
    expected = 1 - (1 / 10.5 + 1 / 9.5) / 2
    assert em.kmeans_silhouette(Z, [0, 0, 1, 1]) == pytest.approx(expected, abs=1e-12)


def test_ari_nmi_exact_values():
    assert em.clustering_ari([0, 0, 1, 1], [0, 0, 1, 2]) == pytest.approx(4 / 7)
    assert em.clustering_nmi([0, 0, 1, 1], [0, 0, 1, 2]) == pytest.approx(0.8)  # ln2 / (1.25 ln2)
    rng = np.random.default_rng(5)
    y = rng.integers(0, 10, 3000)
    perm = rng.permutation(10)
    assert em.clustering_ari(y, perm[y]) == pytest.approx(1.0)  # relabelled permutation
    assert em.clustering_nmi(y, perm[y]) == pytest.approx(1.0)
    assert abs(em.clustering_ari(y, rng.integers(0, 10, 3000))) < 0.01  # independent labels


def test_embedding_report_keys_and_values():
    Z, y = _blobs(n_per=40, n_classes=3, dim=2)
    rng = np.random.default_rng(6)
    X = np.hstack([Z, rng.normal(scale=1e-9, size=(Z.shape[0], 3))])  # high-dim copy of Z
    r = em.embedding_report(X, Z, y, ks=(1, 10, 50), seed=0)
    assert list(r) == ["CA 1-NN", "CA 10-NN", "CA 50-NN", "NPA 1-NN", "NPA 10-NN", "NPA 50-NN",
                       "NMI", "SC", "ARI"]
    assert all(isinstance(v, float) for v in r.values())
    assert r["CA 1-NN"] == r["CA 10-NN"] == r["CA 50-NN"] == 1.0
    assert r["NPA 10-NN"] == 1.0
    assert r["NMI"] == pytest.approx(1.0) and r["ARI"] == pytest.approx(1.0) and r["SC"] > 0.9
    assert r["SC"] == pytest.approx(em.kmeans_silhouette(Z, y, seed=0))


# ---------------------------------------------------------------- bad input
def test_bad_input_raises_naming_the_parameter():
    rng = np.random.default_rng(7)
    X, Z = rng.normal(size=(20, 5)), rng.normal(size=(20, 2))
    y = np.repeat([0, 1], 10)
    with pytest.raises(ValueError, match="k=20 must be smaller than the number of points"):
        em.neighborhood_preservation(X, Z, 20)
    with pytest.raises(ValueError, match="k must be an integer >= 1"):
        em.neighborhood_preservation(X, Z, 0)
    with pytest.raises(ValueError, match="k must be an integer >= 1"):
        em.knn_accuracy(Z, y, 2.5)
    with pytest.raises(ValueError, match="Z has 19 points but X_high has 20"):
        em.neighborhood_preservation(X, Z[:-1], 3)
    with pytest.raises(ValueError, match="labels has 19 entries"):
        em.knn_accuracy(Z, y[:-1], 1)
    with pytest.raises(ValueError, match="k=15 exceeds the 14 training points"):
        em.knn_accuracy(Z, y, 15)
    with pytest.raises(ValueError, match="test_size"):
        em.knn_accuracy(Z, y, 1, test_size=1.5)
    with pytest.raises(ValueError, match="labels: a stratified split"):
        em.knn_accuracy(Z, np.r_[y[:-1], 2], 1)
    with pytest.raises(ValueError, match="Z must be a 2-D array"):
        em.knn_accuracy(Z[:, 0], y, 1)
    with pytest.raises(ValueError, match="Z contains NaN"):
        em.kmeans_nmi(np.where(np.eye(20, 2) > 0, np.nan, Z), y)
    with pytest.raises(ValueError, match="labels must contain at least 2 classes"):
        em.kmeans_silhouette(Z, np.zeros(20))
    with pytest.raises(ValueError, match="labels_pred has 3 entries"):
        em.clustering_ari([0, 1, 1, 0], [0, 1, 1])
    with pytest.raises(ValueError, match="metric_high"):
        em.neighborhood_preservation(X, Z, 3, metric_high="cosine")
    with pytest.raises(ValueError, match="X_high must be a square distance matrix"):
        em.neighborhood_preservation(X, Z, 3, metric_high="precomputed")
    with pytest.raises(ValueError, match="ks: k=20"):
        em.embedding_report(X, Z, y, ks=(1, 20))
    with pytest.raises(ValueError, match="ks must name at least one k"):
        em.embedding_report(X, Z, y, ks=())
    with pytest.raises(ValueError, match="seed"):
        em.embedding_report(X, Z, y, ks=(1,), seed=-1)


def test_distance_estimate_quality_and_neighbour_lists():
    from fedlib.evaluation.embedding import distance_estimate_quality, neighbour_lists

    rng = np.random.default_rng(0)
    X = rng.standard_normal((40, 3))
    D = np.sqrt(((X[:, None] - X[None]) ** 2).sum(-1))
    assert distance_estimate_quality(D, D, 5) == (0.0, 1.0)
    err, overlap = distance_estimate_quality(D * 2.0, D, 5)
    assert err == pytest.approx(1.0) and overlap == 1.0                      # scaling keeps every neighbour
    nn = neighbour_lists(D, 5, "precomputed")
    assert nn.shape == (40, 5) and not np.any(nn == np.arange(40)[:, None])  # the point itself excluded
    assert np.array_equal(nn, neighbour_lists(X, 5))
    assert distance_estimate_quality(D * 2.0, D, 5, nn_exact=nn) == (err, overlap)
    with pytest.raises(ValueError, match="square of one shape"):
        distance_estimate_quality(D[:5], D, 5)
