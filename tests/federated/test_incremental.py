"""The class-incremental protocol: tasks, per-task partitions, metrics (STSA eqs. 60-62)."""
import numpy as np
import pytest
import torch

from fedlib.core.messages import Cost
from fedlib.federated.incremental import accuracy_matrix_metrics, run_class_incremental, task_offset
from fedlib.data.streams import make_stream

Y_TRAIN = np.repeat(np.arange(10), 30)
Y_TEST = np.repeat(np.arange(10), 5)


def test_tasks_are_disjoint_cover_all_classes_and_follow_the_seeded_order():
    s = make_stream(Y_TRAIN, Y_TEST, 5, seed=0)
    assert np.array_equal(s.class_order, np.random.RandomState(0).permutation(10))
    seen = np.concatenate([t.classes for t in s.tasks])
    assert sorted(seen.tolist()) == list(range(10))
    for t in s.tasks:
        assert set(Y_TRAIN[t.train_idx]) == set(t.classes.tolist()) and set(Y_TEST[t.test_idx]) == set(t.classes.tolist())
        assert np.array_equal(np.unique(s.relabel(Y_TRAIN[t.train_idx])), np.arange(t.offset, t.offset + 2))
    assert [s.num_seen(t) for t in range(5)] == [2, 4, 6, 8, 10]
    assert not np.array_equal(make_stream(Y_TRAIN, Y_TEST, 5, seed=1).class_order, s.class_order)


def test_large_first_task_variant():
    s = make_stream(Y_TRAIN, Y_TEST, 4, first_task_classes=4)
    assert [t.num_classes for t in s.tasks] == [4, 2, 2, 2]


def test_partitions_are_redrawn_per_task_and_stay_inside_the_task():
    s = make_stream(Y_TRAIN, Y_TEST, 2, seed=0)
    p0 = s.client_partitions(0, Y_TRAIN, 3, beta=0.5, seed=0)
    p1 = s.client_partitions(1, Y_TRAIN, 3, beta=0.5, seed=0)
    for t, parts in enumerate([p0, p1]):
        allidx = np.concatenate(parts)
        assert sorted(allidx.tolist()) == sorted(s.tasks[t].train_idx.tolist())
        assert min(len(p) for p in parts) >= 1
    counts = lambda parts, t: [np.bincount(s.relabel(Y_TRAIN[p]) - s.tasks[t].offset, minlength=5).tolist() for p in parts]
    assert counts(p0, 0) != counts(p1, 1)  # a fresh Dirichlet draw, not the same proportions


def test_metrics_on_a_hand_computed_matrix():
    acc = np.array([[0.9, np.nan, np.nan], [0.6, 0.8, np.nan], [0.5, 0.7, 0.9]])
    m = accuracy_matrix_metrics(acc)
    assert m["A_T"] == pytest.approx((0.5 + 0.7 + 0.9) / 3)
    assert m["A_avg"] == pytest.approx((0.9 + 0.7 + 0.7) / 3)
    assert m["F_T"] == pytest.approx(((0.9 - 0.5) + (0.8 - 0.7)) / 2)
    assert np.isnan(accuracy_matrix_metrics(np.array([[0.5]]))["F_T"])


class _Oracle:
    """Predicts the true label when it is seen, else class 0: checks the runner's bookkeeping."""

    name = "oracle"

    def __init__(self, truth):
        self.truth, self.calls = truth, []

    def learn_task(self, t, clients, num_seen):
        self.calls.append((t, task_offset(clients), num_seen, sum(len(y) for _, y in clients)))
        return Cost(bytes_up=7, bytes_down=3, seconds=0.5)

    def predict(self, x, num_seen):
        y = torch.from_numpy(self.truth[x[:, 0].long().numpy()])
        return torch.where(y < num_seen, y, torch.zeros_like(y))


def test_runner_feeds_stages_in_order_and_scores_only_seen_classes():
    s = make_stream(Y_TRAIN, Y_TEST, 5, seed=3)
    x_tr = np.arange(len(Y_TRAIN))[:, None].astype(np.float32)
    x_te = np.arange(len(Y_TEST))[:, None].astype(np.float32)
    learner = _Oracle(s.relabel(Y_TEST))
    res = run_class_incremental(learner, s, x_tr, Y_TRAIN, x_te, Y_TEST, num_clients=4, beta=1.0, progress=False)
    assert [c[:3] for c in learner.calls] == [(t, 2 * t, 2 * t + 2) for t in range(5)]
    assert [c[3] for c in learner.calls] == [60] * 5
    assert np.allclose(np.tril(res.acc), np.tril(np.ones((5, 5)))) and np.isnan(res.acc[0, 1])
    assert res.metrics == {"A_T": 1.0, "A_avg": 1.0, "F_T": 0.0}
    assert res.bytes_up.tolist() == [7] * 5 and (res.top1 == 1).all()
    assert res.cost == Cost(bytes_up=35, bytes_down=15, seconds=2.5)


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_tasks=3), "divide"), (dict(num_tasks=0), "num_tasks"), (dict(num_tasks=11), "num_tasks"),
    (dict(num_tasks=4, first_task_classes=5), "first_task_classes"),
])
def test_bad_stream_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_stream(Y_TRAIN, Y_TEST, **kwargs)


@pytest.mark.parametrize("beta, clients, match", [(0.0, 3, "beta"), (-1.0, 3, "beta"), (0.5, 0, "num_clients"),
                                                    (0.5, 61, "num_clients")])
def test_bad_run_input(beta, clients, match):
    s = make_stream(Y_TRAIN, Y_TEST, 5)
    x = np.zeros((len(Y_TRAIN), 1), np.float32)
    with pytest.raises(ValueError, match=match):
        run_class_incremental(_Oracle(Y_TEST), s, x, Y_TRAIN, x[:50], Y_TEST, clients, beta, progress=False)


def test_scratch_backbone_is_trained_on_task_one_frozen_and_cached(tmp_path):
    from fedlib.data.datasets import Dataset
    from fedlib.federated.gradient import FedConfig
    from fedlib.federated.incremental import scratch_backbone_features

    rng = np.random.default_rng(0)
    y_tr, y_te = np.repeat(np.arange(4), 20), np.repeat(np.arange(4), 5)
    img = lambda y: (rng.integers(0, 40, (len(y), 8, 8)) + 50 * y[:, None, None]).astype(np.uint8)
    ds = Dataset("toy", img(y_tr), y_tr, img(y_te), y_te, ("a", "b", "c", "d"))
    stream = make_stream(y_tr, y_te, 2, seed=0)
    cfg = FedConfig(rounds=2, local_epochs=1, batch_size=8, lr=0.05, device="cpu")
    feats, cost = scratch_backbone_features(ds, stream, 2, 0.5, 0, cfg, widths=(4, 8), cache_dir=tmp_path, progress=False)
    assert feats.x_train.shape == (80, 8) and feats.x_test.shape == (20, 8)
    assert cost["bytes_up"] > 0 and cost["rounds"] == 2 and 0 <= cost["task1_test_acc"] <= 1
    again, cost2 = scratch_backbone_features(ds, stream, 2, 0.5, 0, cfg, widths=(4, 8), cache_dir=tmp_path, progress=False)
    assert np.array_equal(again.x_train, feats.x_train) and cost2 == cost
    other, _ = scratch_backbone_features(ds, stream, 2, 1.0, 0, cfg, widths=(4, 8), cache_dir=tmp_path, progress=False)
    assert len(list(tmp_path.glob("*.npz"))) == 2 and not np.array_equal(other.x_train, feats.x_train)


def test_result_carries_each_stage_cost_and_partitions_use_the_one_seed_derivation():
    """Stage costs come from the learner's measured Messages (STSA: R's seed broadcast, statistics
    uploaded); task t's partition is drawn with derive_seed(seed, "partition", t)."""
    from fedlib.core.seeds import derive_seed
    from fedlib.data.partition import make_partition
    from fedlib.stsa.algorithm import STSALearner

    s = make_stream(Y_TRAIN, Y_TEST, 2, seed=0)
    labels = Y_TRAIN[s.tasks[1].train_idx]
    expected = make_partition(labels, 3, "dirichlet", alpha=0.5, seed=derive_seed(7, "partition", 1))
    got = s.client_partitions(1, Y_TRAIN, 3, beta=0.5, seed=7)
    assert all(np.array_equal(g, s.tasks[1].train_idx[e]) for g, e in zip(got, expected))

    x = np.random.default_rng(0).normal(size=(len(Y_TRAIN), 6))
    learner = STSALearner(6, 10, M=16, gamma=1.0)
    res = run_class_incremental(learner, s, x, Y_TRAIN, x[:len(Y_TEST)], Y_TEST, 3, 0.5, progress=False)
    assert len(res.costs) == 2 and all(c.bytes_up > 0 and c.bytes_down > 0 for c in res.costs)
    assert res.bytes_up.tolist() == [c.bytes_up for c in res.costs]
    assert res.cost.bytes_up == learner.cost.bytes_up and res.cost.bytes_down == learner.cost.bytes_down


def test_scratch_backbone_cache_is_keyed_by_the_training_scheme(tmp_path, monkeypatch):
    """A backbone cached under another batch-order scheme is retrained, not silently reused."""
    from fedlib.data.datasets import Dataset
    from fedlib.federated import incremental
    from fedlib.federated.gradient import FedConfig
    from fedlib.federated.incremental import scratch_backbone_features

    rng = np.random.default_rng(0)
    x = rng.integers(0, 255, size=(len(Y_TRAIN), 8, 8), dtype=np.uint8)
    ds = Dataset("tiny", x, Y_TRAIN, x[:len(Y_TEST)], Y_TEST, [str(c) for c in range(10)])
    stream = make_stream(Y_TRAIN, Y_TEST, 2, seed=0)
    cfg = FedConfig(rounds=1, local_epochs=1, batch_size=32, lr=0.05, seed=0, device="cpu", num_threads=1)
    scratch_backbone_features(ds, stream, 2, 0.5, 0, cfg, widths=(4, 8), cache_dir=tmp_path, progress=False)
    monkeypatch.setattr(incremental, "SCRATCH_TRAINING", {"batches": "shared"})
    scratch_backbone_features(ds, stream, 2, 0.5, 0, cfg, widths=(4, 8), cache_dir=tmp_path, progress=False)
    assert len(list(tmp_path.glob("*.npz"))) == 2
