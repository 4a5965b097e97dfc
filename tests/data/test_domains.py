"""Digit domain stand-ins and the domain-incremental stream run by the class-incremental runner."""
import numpy as np
import pytest
import torch

from fedlib.core.messages import Cost
from fedlib.data.datasets import DIGIT_CLASSES, Dataset, load_dataset
from fedlib.data.domains import DOMAIN_NAMES, DomainIncrementalStream, _stratified_parts, digit_domains, make_domain_stream
from fedlib.data.streams import ClassIncrementalStream
from fedlib.federated.incremental import run_class_incremental, task_offset

DEFAULT = ("mnist", "optdigits", "inverted", "rotated", "noisy")


@pytest.fixture(scope="module")
def domains():
    return digit_domains()


@pytest.fixture(scope="module")
def built(domains):
    return make_domain_stream(domains)


def test_each_domain_is_28x28_uint8_with_all_ten_digits(domains):
    assert len(domains) == 5
    for d in domains:
        assert d.x_train.dtype == np.uint8 and d.x_test.dtype == np.uint8
        assert d.x_train.shape[1:] == (28, 28) and d.x_test.shape[1:] == (28, 28)
        assert d.y_train.dtype == np.int64 and len(d.x_train) == len(d.y_train) and len(d.x_test) == len(d.y_test)
        assert d.classes == DIGIT_CLASSES
        assert np.array_equal(np.unique(d.y_train), np.arange(10)) and np.array_equal(np.unique(d.y_test), np.arange(10))
    sizes = [(len(d.y_train), len(d.y_test)) for d in domains]
    # four MNIST-based domains share MNIST-5k's 4,000 / 1,000 in disjoint quarters; optdigits keeps its split
    opt = load_dataset("optdigits")
    assert sizes == [(1000, 250), (len(opt.y_train), len(opt.y_test)), (1000, 250), (1000, 250), (1000, 250)]
    assert all(np.bincount(domains[i].y_train).tolist() == [100] * 10 for i in (0, 2, 3, 4))
    assert len({d.name for d in domains}) == 5


def test_mnist_based_domains_do_not_share_source_images(domains):
    base = load_dataset("mnist5k")
    src = {x.tobytes() for x in base.x_train}
    mnist = {x.tobytes() for x in domains[0].x_train}
    undone = {(255 - x).tobytes() for x in domains[2].x_train}  # inverted, turned back
    assert mnist <= src and undone <= src and not (mnist & undone)
    # the seeded parts are disjoint, cover everything and are stratified
    parts = _stratified_parts(base.y_train, 4, np.random.default_rng(0))
    allidx = np.concatenate(parts)
    assert len(allidx) == len(base.y_train) and len(np.unique(allidx)) == len(allidx)
    assert all(np.bincount(base.y_train[p], minlength=10).tolist() == [100] * 10 for p in parts)


def test_domains_look_different(domains):
    means = [d.x_train.astype(float).mean(0) for d in domains]
    m = domains[0].x_train.astype(float)
    within = np.linalg.norm(m[::2].mean(0) - m[1::2].mean(0))  # two halves of one domain
    for i in range(5):
        for j in range(i):
            assert np.linalg.norm(means[i] - means[j]) > 3 * within, (domains[i].name, domains[j].name)
    assert domains[2].x_train.mean() > 150 > domains[0].x_train.mean()  # inverted
    assert (domains[4].x_train[:, :3, :3] > 0).mean() > 0.3 > (domains[0].x_train[:, :3, :3] > 0).mean()  # noisy corners


def test_seed_and_subset_and_the_other_transforms():
    a = digit_domains(("mnist", "thick", "thin"), seed=1, n_per_domain=50)
    b = digit_domains(("mnist", "thick", "thin"), seed=1, n_per_domain=50)
    c = digit_domains(("mnist",), seed=2, n_per_domain=50)
    assert all(np.array_equal(x.x_train, y.x_train) and x.name == y.name for x, y in zip(a, b))
    assert not np.array_equal(a[0].x_train, c[0].x_train)
    assert [(len(d.y_train), len(d.y_test)) for d in a] == [(50, 12)] * 3
    assert all(np.bincount(d.y_train).tolist() == [5] * 10 for d in a)
    assert a[1].x_train.mean() > a[0].x_train.mean() > a[2].x_train.mean()  # thick > plain > thin


def test_stream_tasks_cover_the_concatenated_arrays_exactly(domains, built):
    s, x_tr, y_tr, x_te, y_te = built
    assert isinstance(s, DomainIncrementalStream) and isinstance(s, ClassIncrementalStream)
    assert s.num_tasks == 5 and s.num_classes == 10 and s.domain_names == tuple(d.name for d in domains)
    assert len(x_tr) == len(y_tr) == sum(len(d.y_train) for d in domains)
    assert len(x_te) == len(y_te) == sum(len(d.y_test) for d in domains)
    for split, n in (("train_idx", len(y_tr)), ("test_idx", len(y_te))):
        allidx = np.concatenate([getattr(t, split) for t in s.tasks])
        assert np.array_equal(np.sort(allidx), np.arange(n)) and len(np.unique(allidx)) == n
    for t, (task, d) in enumerate(zip(s.tasks, domains)):
        assert task.index == t and task.offset == 0 and np.array_equal(task.classes, np.arange(10))
        assert np.array_equal(x_tr[task.train_idx], d.x_train) and np.array_equal(y_te[task.test_idx], d.y_test)
        assert s.num_seen(t) == 10
    assert np.array_equal(s.relabel(y_tr), y_tr)


def test_partitions_stay_inside_the_domain_and_are_redrawn(built):
    s, _, y_tr, _, _ = built
    for beta in (0.1, None):
        for t in range(s.num_tasks):
            parts = s.client_partitions(t, y_tr, 5, beta, seed=0)
            allidx = np.concatenate(parts)
            assert np.array_equal(np.sort(allidx), s.tasks[t].train_idx) and min(map(len, parts)) >= 1
    counts = lambda t: [np.bincount(y_tr[p], minlength=10).tolist() for p in s.client_partitions(t, y_tr, 5, 0.1)]
    assert counts(0) != counts(2)


class _Lookup:
    """Predicts the true label of a test image by looking up its bytes: checks the runner's bookkeeping."""

    name = "lookup"

    def __init__(self, x_test, y_test):
        self.table = {x.tobytes(): int(y) for x, y in zip(x_test, y_test)}
        self.calls = []

    def learn_task(self, t, clients, num_seen):
        self.calls.append((t, task_offset(clients), num_seen, sum(len(y) for _, y in clients)))
        return Cost()

    def predict(self, x, num_seen):
        return torch.tensor([self.table[row.tobytes()] for row in x.numpy()])


def test_class_incremental_runner_runs_the_domain_stream(domains, built):
    s, x_tr, y_tr, x_te, y_te = built
    learner = _Lookup(x_te, y_te)
    res = run_class_incremental(learner, s, x_tr, y_tr, x_te, y_te, num_clients=4, beta=0.1, progress=False)
    assert [c[:3] for c in learner.calls] == [(t, 0, 10) for t in range(5)]
    assert [c[3] for c in learner.calls] == [len(d.y_train) for d in domains]
    assert np.allclose(np.tril(res.acc), np.tril(np.ones((5, 5)))) and np.isnan(res.acc[0, 1])
    assert res.metrics == {"A_T": 1.0, "A_avg": 1.0, "F_T": 0.0} and (res.top1 == 1).all()


def _tiny(name="a", classes=DIGIT_CLASSES, shape=(4, 4), labels=10):
    y = np.arange(20) % labels
    x = np.zeros((20, *shape), np.uint8)
    return Dataset(name, x, y, x[:10], y[:10], classes)


@pytest.mark.parametrize("kwargs, match", [
    ({"names": ("mnist", "svhn")}, r"unknown domain name.*'svhn'.*allowed: mnist, inverted"),
    ({"names": ()}, "names is empty"),
    ({"names": ("mnist", "mnist")}, "more than once"),
    ({"n_per_domain": 5}, "n_per_domain must be"),
    ({"names": DOMAIN_NAMES, "n_per_domain": 900}, "n_per_domain=900"),
])
def test_bad_domain_requests(kwargs, match):
    with pytest.raises(ValueError, match=match):
        digit_domains(**kwargs)


@pytest.mark.parametrize("domains, match", [
    ([], "domains is empty"),
    ([_tiny(), _tiny("b", classes=tuple("abcdefghij"))], "one shared label set"),
    ([_tiny(), _tiny("b", labels=9)], "every domain must hold every class"),
    ([_tiny(), _tiny("b", shape=(5, 5))], "one shape"),
])
def test_bad_domain_lists(domains, match):
    with pytest.raises(ValueError, match=match):
        make_domain_stream(domains)


def test_tiny_stream_relabel_rejects_foreign_labels():
    s, *_ = make_domain_stream([_tiny(), _tiny("b")])
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 10\)"):
        s.relabel([3, 10])
