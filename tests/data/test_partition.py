"""Tests for fedlib.data.partition: coverage, disjointness, seeds, skew, shapes of each scheme, bad input."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from fedlib.data.partition import (  # noqa: E402
    SCHEMES,
    dirichlet_partition,
    iid_partition,
    make_partition,
    one_class_partition,
    partition_report,
    plot_partition,
    shard_partition,
)

C = 10
LABELS = np.repeat(np.arange(C), 200)  # N = 2000, balanced, class blocks (worst case for sorting bugs)
N = len(LABELS)

CASES = {
    "iid": dict(),
    "dirichlet": dict(alpha=0.5),
    "shards": dict(shards_per_client=2),
    "one_class": dict(),
}


def _run(scheme, labels=LABELS, k=20, seed=0, **kw):
    return make_partition(labels, k, scheme, seed=seed, **{**CASES[scheme], **kw})


def _check_cover(parts, n):
    allidx = np.concatenate(parts)
    assert allidx.dtype == np.int64
    assert all(p.dtype == np.int64 and p.ndim == 1 for p in parts)
    assert len(allidx) == n  # counts sum to N
    assert len(np.unique(allidx)) == n  # disjoint
    assert set(allidx.tolist()) == set(range(n))


@pytest.mark.parametrize("scheme", SCHEMES)
def test_cover_disjoint_and_seeded(scheme):
    parts = _run(scheme)
    assert len(parts) == 20
    _check_cover(parts, N)
    again = _run(scheme)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))
    other = _run(scheme, seed=1)
    assert not all(np.array_equal(a, b) for a, b in zip(parts, other))


@pytest.mark.parametrize("scheme", SCHEMES)
def test_shuffled_labels_and_report(scheme):
    rng = np.random.default_rng(3)
    y = rng.permutation(LABELS)
    parts = _run(scheme, labels=y)
    _check_cover(parts, N)
    rep = partition_report(y, parts)
    assert rep.shape == (20, C)
    assert rep.index.name == "client" and rep.columns.name == "class"
    assert int(rep.values.sum()) == N
    np.testing.assert_array_equal(rep.sum(axis=0).to_numpy(), np.bincount(y))
    np.testing.assert_array_equal(rep.sum(axis=1).to_numpy(), [len(p) for p in parts])


def test_iid_sizes():
    parts = iid_partition(np.arange(103) % 7, 10, seed=0)
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == 103


def _mean_entropy(labels, parts):
    rep = partition_report(labels, parts).to_numpy().astype(float)
    rep = rep[rep.sum(1) > 0]
    q = rep / rep.sum(1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        h = -np.where(q > 0, q * np.log(q), 0.0).sum(1)
    return h.mean()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dirichlet_smaller_alpha_more_skew(seed):
    y = np.repeat(np.arange(C), 500)
    ent = [_mean_entropy(y, dirichlet_partition(y, 20, a, seed=seed)) for a in (100, 1, 0.1, 0.01)]
    assert all(a > b for a, b in zip(ent, ent[1:])), ent
    assert ent[0] > 0.9 * np.log(C)  # alpha=100 is close to IID
    assert ent[-1] < 0.3  # alpha=0.01: clients hold ~one class


def test_dirichlet_min_size_and_empty_clients():
    y = np.repeat(np.arange(C), 1000)
    parts = dirichlet_partition(y, 100, 0.005, seed=1)  # AFL's most skewed setting
    _check_cover(parts, len(y))
    assert any(len(p) == 0 for p in parts)  # empty clients allowed with min_size=0
    parts = dirichlet_partition(y, 100, 0.1, seed=1, min_size=10)
    assert min(len(p) for p in parts) >= 10
    _check_cover(parts, len(y))


def test_dirichlet_unreachable_min_size_raises():
    with pytest.raises(ValueError, match="lower min_size or raise alpha"):
        dirichlet_partition(LABELS, 50, 0.001, seed=0, min_size=30, max_tries=3)
    with pytest.raises(ValueError, match="min_size"):
        dirichlet_partition(LABELS, 50, 1.0, min_size=41)  # 50 * 41 > 2000


def test_dirichlet_caps_clients_at_n_over_k():
    # a client stops receiving data once it holds >= N/K samples, so no client exceeds N/K + one class
    y = np.repeat(np.arange(C), 200)
    parts = dirichlet_partition(y, 10, 0.05, seed=0)
    assert max(len(p) for p in parts) <= len(y) / 10 + 200


@pytest.mark.parametrize("s", [1, 2, 5])
def test_shards_at_most_s_classes(s):
    parts = shard_partition(LABELS, 20, s, seed=0)  # shard size 2000/(20 s) divides 200
    _check_cover(parts, N)
    assert {len(p) for p in parts} == {N // 20}
    for p in parts:
        assert len(np.unique(LABELS[p])) <= s


def test_one_class_clients():
    parts = one_class_partition(LABELS, 30, seed=0)
    _check_cover(parts, N)
    for i, p in enumerate(parts):
        assert np.unique(LABELS[p]).tolist() == [i // 3]
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(scheme="bogus"), "scheme"),
        (dict(scheme="iid", num_clients=0), "num_clients"),
        (dict(scheme="iid", num_clients=-3), "num_clients"),
        (dict(scheme="iid", num_clients=2.5), "num_clients"),
        (dict(scheme="iid", num_clients=N + 1), "more clients than samples"),
        (dict(scheme="dirichlet", num_clients=N + 1, alpha=1.0), "num_clients"),
        (dict(scheme="dirichlet"), "alpha"),
        (dict(scheme="dirichlet", alpha=0.0), "alpha"),
        (dict(scheme="dirichlet", alpha=-1.0), "alpha"),
        (dict(scheme="dirichlet", alpha=float("nan")), "alpha"),
        (dict(scheme="dirichlet", alpha=1.0, min_size=-1), "min_size"),
        (dict(scheme="shards"), "shards_per_client"),
        (dict(scheme="shards", shards_per_client=0), "shards_per_client"),
        (dict(scheme="shards", num_clients=30, shards_per_client=2), "shards_per_client"),  # 60 does not divide 2000
        (dict(scheme="shards", num_clients=30, shards_per_client=2), "2000"),
        (dict(scheme="one_class", num_clients=15), "num_clients"),
    ],
)
def test_bad_input_raises(kwargs, match):
    kw = {"num_clients": 20, **kwargs}
    with pytest.raises(ValueError, match=match):
        make_partition(LABELS, kw.pop("num_clients"), kw.pop("scheme"), **kw)


def test_direct_calls_validate():
    with pytest.raises(ValueError, match="alpha"):
        dirichlet_partition(LABELS, 10, alpha=0)
    with pytest.raises(ValueError, match="shards_per_client"):
        shard_partition(LABELS, 10, 0)
    with pytest.raises(ValueError, match="shards_per_client"):
        shard_partition(LABELS, 7, 3)
    with pytest.raises(ValueError, match="num_clients"):
        one_class_partition(LABELS, 11)
    with pytest.raises(ValueError, match="num_clients"):
        iid_partition(LABELS[:5], 6)
    with pytest.raises(ValueError, match="labels"):
        iid_partition(np.zeros((4, 2), int), 2)


def test_plot_partition():
    parts = make_partition(LABELS, 80, "dirichlet", alpha=0.1, seed=0)
    rep = partition_report(LABELS, parts)
    ax = plot_partition(rep, max_clients=50)
    assert ax.get_xlabel() == "class" and ax.get_ylabel() == "client"
    assert "first 50 of 80" in ax.get_title()
    assert ax.figure.axes[-1].get_ylabel() == "samples"  # colorbar
    plt.close(ax.figure)
    fig, ax2 = plt.subplots()
    assert plot_partition(partition_report(LABELS, iid_partition(LABELS, 5, 0)), ax=ax2) is ax2
    assert "5 clients" in ax2.get_title()
    plt.close(fig)
