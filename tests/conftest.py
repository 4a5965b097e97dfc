"""Shared test helpers: thread limit, state comparison, configs and the small Gaussian data set.

Test modules import the helpers (``from conftest import states_equal, make_cfg, make_data``);
the thread limit applies to every test. Writers of files in real on-disk formats (CIFAR batches,
ResNet-18 weights) serve the data tests and the paper-profile test.
"""
from __future__ import annotations

import os
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    """One torch CPU thread per test: tiny models only gain OpenMP contention on a shared machine."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def states_equal(a: dict, b: dict) -> bool:
    """Two state dicts with the same keys and bit-identical tensors."""
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def make_cfg(defaults: dict, **kw):
    """A CPU, one-thread, seed-0 :class:`FedConfig` with a test module's ``defaults`` and ``kw`` on top."""
    from fedlib.federated.gradient import FedConfig

    return FedConfig(**{"seed": 0, "device": "cpu", "num_threads": 1, **defaults, **kw})


def make_data(seed: int = 0, n_train: int = 100, n_test: int = 30, shift=None, dim: int = 8, classes: int = 6,
              scale: float = 3.0):
    """Gaussian classes with means ``scale * e_c`` (+ ``shift``) and unit noise: float32 x (N, dim),
    int labels; ``n_train`` / ``n_test`` samples per class. Returns x_tr, y_tr, x_te, y_te."""
    g = np.random.RandomState(seed)
    means = np.eye(classes, dim) * scale + (0.0 if shift is None else shift)
    y_tr, y_te = np.repeat(np.arange(classes), n_train), np.repeat(np.arange(classes), n_test)
    x_tr = (means[y_tr] + g.randn(len(y_tr), dim)).astype(np.float32)
    x_te = (means[y_te] + g.randn(len(y_te), dim)).astype(np.float32)
    return x_tr, y_tr, x_te, y_te


def chapter_values(chapter: str, **changes) -> dict:
    """A chapter's default parameters (its notebook's parameters cell) with ``changes``."""
    from fedlib.runner import profiles

    return {**profiles.notebook_parameters(chapter), **changes}


def afl_ridge_reference(task, clients) -> np.ndarray:
    """Centralized reference for AFL's regularized head on ``clients``' data of a fedlib.flower Task:
    ``W = argmin ||X W - Y||^2 + K gamma ||W||^2`` (K = len(clients)) by numpy ``lstsq`` on the
    augmented system [X; sqrt(K gamma) I] W = [Y; 0] (not the normal equations AFL aggregates)."""
    f, gamma = task.features, task.config["gamma"]
    idx = np.concatenate([task.parts[k] for k in clients])
    x = np.asarray(f.x_train, dtype=np.float64)[idx]
    y = np.eye(len(f.classes))[np.asarray(f.y_train)[idx]]
    d = x.shape[1]
    a = np.vstack([x, np.sqrt(len(clients) * gamma) * np.eye(d)])
    b = np.vstack([y, np.zeros((d, y.shape[1]))])
    return np.linalg.lstsq(a, b, rcond=None)[0]


# --------------------------------------------------------------------------------------------
# files in the real on-disk formats of data the machine cannot download (CIFAR, ResNet-18 weights)
# --------------------------------------------------------------------------------------------
class Py2Str(bytes):
    """A Python-2 ``str``: the CIFAR python pickles were written by Python 2, so their keys and
    names are py2 str (SHORT_BINSTRING). They load as ``str`` with encoding="latin1" (what
    torchvision uses) and as ``bytes`` (b"data", ...) with encoding="bytes" (the CIFAR web page)."""


class _Py2Pickler(pickle._Pickler):  # the pure-python pickler lets us add an opcode writer
    dispatch = pickle._Pickler.dispatch.copy()

    def save_py2str(self, obj):
        b = bytes(obj)
        if len(b) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(b)]) + b)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(b)) + b)
        self.memoize(obj)

    dispatch[Py2Str] = save_py2str


def write_py2_pickle(path: Path, obj) -> None:
    """Pickle ``obj`` as Python 2 wrote the CIFAR batches (protocol 2, :class:`Py2Str` strings)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        _Py2Pickler(f, protocol=2).dump(obj)


def py2_dict(d: dict) -> dict:
    """``d`` with its keys as Python-2 strings (how the CIFAR batch dicts are keyed)."""
    return {Py2Str(k.encode()): v for k, v in d.items()}


def cifar_rows(n, rng):
    """(n, 3072) uint8 rows laid out as CIFAR: 1024 R, then 1024 G, then 1024 B (row-major 32x32)."""
    return rng.integers(0, 256, (n, 3072), dtype=np.uint8)


def write_cifar(root: Path, name: str, train_per_class: int, test_per_class: int, seed: int = 0) -> None:
    """A small CIFAR-10 (``name="cifar10"``: five data batches, test batch, batches.meta) or CIFAR-100
    (``"cifar100"``: train, test, meta) in torchvision's layout under ``root``: random pixels, every
    class ``train_per_class`` / ``test_per_class`` times, labels in a shuffled order."""
    rng = np.random.default_rng(seed)
    classes = 10 if name == "cifar10" else 100

    def labels(per_class):
        return [int(v) for v in rng.permutation(np.repeat(np.arange(classes), per_class))]

    ytr, yte = labels(train_per_class), labels(test_per_class)
    if name == "cifar10":
        base = Path(root) / "cifar-10-batches-py"
        parts = np.array_split(np.arange(len(ytr)), 5)
        for i, part in enumerate(parts, 1):
            y = [ytr[j] for j in part]
            write_py2_pickle(base / f"data_batch_{i}", py2_dict({
                "batch_label": Py2Str(f"training batch {i} of 5".encode()), "labels": y,
                "data": cifar_rows(len(y), rng), "filenames": [Py2Str(b"x.png")] * len(y)}))
        write_py2_pickle(base / "test_batch", py2_dict({
            "batch_label": Py2Str(b"testing batch 1 of 1"), "labels": yte, "data": cifar_rows(len(yte), rng),
            "filenames": [Py2Str(b"t.png")] * len(yte)}))
        names = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
        write_py2_pickle(base / "batches.meta", py2_dict({"label_names": [Py2Str(n.encode()) for n in names],
                                                         "num_cases_per_batch": len(parts[0]), "num_vis": 3072}))
    elif name == "cifar100":
        base = Path(root) / "cifar-100-python"
        for split, y in (("train", ytr), ("test", yte)):
            write_py2_pickle(base / split, py2_dict({
                "filenames": [Py2Str(b"x.png")] * len(y), "batch_label": Py2Str(split.encode()), "fine_labels": y,
                "coarse_labels": [v // 5 for v in y], "data": cifar_rows(len(y), rng)}))
        write_py2_pickle(base / "meta", py2_dict({
            "fine_label_names": [Py2Str(f"class{i:02d}".encode()) for i in range(100)],
            "coarse_label_names": [Py2Str(f"super{i}".encode()) for i in range(20)]}))
    else:
        raise ValueError(f"name must be cifar10 or cifar100, got {name!r}")


def write_resnet18_weights(path: Path, seed: int = 0) -> Path:
    """A randomly initialised torchvision ResNet-18 state dict saved where fedlib looks for the ImageNet
    weights (``path``: a folder, the file is named ``resnet18-f37072fd.pth``); the real file has the
    same keys and shapes, so only the values differ."""
    import torchvision

    from fedlib.data.features import RESNET18_WEIGHTS_FILE

    path = Path(path) / RESNET18_WEIGHTS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    torch.save(torchvision.models.resnet18(weights=None).state_dict(), path)
    return path


@pytest.fixture
def ignore_cifar_md5(monkeypatch):
    """torchvision checks each CIFAR file against the md5 of the official release, both in
    ``CIFAR10._check_integrity`` and in ``_load_meta``; both call the module-level
    ``torchvision.datasets.cifar.check_integrity``. Small generated files cannot match those sums,
    so for these tests only we replace it by an existence check (what it does when md5 is None).
    Everything else (paths, pickle parsing, reshaping to HWC) is torchvision's real code."""
    import torchvision.datasets.cifar as tv_cifar

    monkeypatch.setattr(tv_cifar, "check_integrity", lambda fpath, md5=None: os.path.isfile(fpath))
