"""Tests for fedlib.data.features: backbones, extraction, the on-disk cache (small synthetic data)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import fedlib.data.features as ff
from conftest import write_resnet18_weights
from fedlib.data.datasets import Dataset
from fedlib.data.features import BACKBONES, Features, extract_features, feature_cache_path, load_backbone


def make_dataset(n_train=12, n_test=6, rgb=False, seed=0, name="synthetic") -> Dataset:
    rng = np.random.default_rng(seed)
    shape = (28, 28, 3) if rgb else (28, 28)
    return Dataset(
        name=name,
        x_train=rng.integers(0, 256, (n_train, *shape), dtype=np.uint8),
        y_train=rng.integers(0, 3, n_train).astype(np.int64),
        x_test=rng.integers(0, 256, (n_test, *shape), dtype=np.uint8),
        y_test=rng.integers(0, 3, n_test).astype(np.int64),
        classes=("a", "b", "c"),
    )


def test_registry_and_unknown_backbone():
    assert set(BACKBONES) == {"efficientnet_lite0", "resnet18", "raw"}
    with pytest.raises(ValueError, match="backbone.*efficientnet_lite0"):
        load_backbone("vgg")
    with pytest.raises(ValueError, match="backbone"):
        extract_features(make_dataset(), backbone="vgg", cache_dir=False)


def test_efficientnet_features_shape_and_determinism():
    ds = make_dataset()
    a = extract_features(ds, input_size=32, cache_dir=False, progress=False)
    b = extract_features(ds, input_size=32, cache_dir=False, progress=False)
    assert isinstance(a, Features)
    assert a.x_train.shape == (12, 1280) and a.x_test.shape == (6, 1280)
    assert a.x_train.dtype == np.float32 and a.y_train.dtype == np.int64
    assert np.isfinite(a.x_train).all() and np.isfinite(a.x_test).all()
    assert a.dim == 1280 and a.num_classes == 3
    assert a.name == "synthetic/efficientnet_lite0@32"
    np.testing.assert_array_equal(a.x_train, b.x_train)
    np.testing.assert_array_equal(a.x_test, b.x_test)
    np.testing.assert_array_equal(a.y_train, ds.y_train)
    assert a.x_train.std(axis=0).max() > 0  # features depend on the image


def test_rgb_input():
    f = extract_features(make_dataset(4, 2, rgb=True), input_size=32, cache_dir=False, progress=False)
    assert f.x_train.shape == (4, 1280) and f.x_test.shape == (2, 1280)
    assert np.isfinite(f.x_train).all()


def test_cache_hit_skips_backbone(tmp_path, monkeypatch):
    ds = make_dataset()
    first = extract_features(ds, input_size=32, cache_dir=tmp_path, progress=False)
    files = list(tmp_path.glob("*.npz"))
    assert len(files) == 1 and files[0] == feature_cache_path(ds, "efficientnet_lite0", 32, tmp_path)
    assert not list(tmp_path.glob("*.tmp"))

    def boom(*args, **kwargs):
        raise AssertionError("backbone must not run on a cache hit")

    monkeypatch.setattr(ff, "load_backbone", boom)
    second = extract_features(ds, input_size=32, cache_dir=tmp_path, progress=False)
    assert second.name == first.name and second.classes == first.classes
    for k in ("x_train", "y_train", "x_test", "y_test"):
        np.testing.assert_array_equal(getattr(second, k), getattr(first, k))
    assert second.x_train.dtype == np.float32 and second.y_train.dtype == np.int64


def test_cache_env_default_and_disable(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDLIB_CACHE", str(tmp_path / "env"))
    # only the cache placement is tested here: a stub replaces the backbone pass
    monkeypatch.setattr(ff, "extract_batches", lambda module, dim, images, *a, **k: np.zeros((len(images), dim), np.float32))
    ds = make_dataset(3, 2)
    assert ff.paths.cache_dir() == tmp_path / "env"
    extract_features(ds, input_size=32, progress=False)
    assert len(list((tmp_path / "env").glob("*.npz"))) == 1
    extract_features(ds, input_size=32, cache_dir=False, progress=False)
    assert len(list((tmp_path / "env").glob("*.npz"))) == 1


def test_changed_data_changes_cache_file(tmp_path):
    ds = make_dataset(name="my data/[n=12]")
    other = Dataset(ds.name, ds.x_train, (ds.y_train + 1) % 3, ds.x_test, ds.y_test, ds.classes)
    p1 = feature_cache_path(ds, "efficientnet_lite0", 64, tmp_path)
    p2 = feature_cache_path(other, "efficientnet_lite0", 64, tmp_path)
    assert p1 != p2 and p1.parent == tmp_path
    assert "/" not in p1.name and " " not in p1.name and "[" not in p1.name
    assert p1 != feature_cache_path(ds, "efficientnet_lite0", 96, tmp_path)
    assert p1 != feature_cache_path(ds, "resnet18", 64, tmp_path)
    pixels = ds.x_train.copy()
    pixels[0, 0, 0] ^= 1
    changed = Dataset(ds.name, pixels, ds.y_train, ds.x_test, ds.y_test, ds.classes)
    assert p1 != feature_cache_path(changed, "efficientnet_lite0", 64, tmp_path)


def test_raw_backbone():
    ds = make_dataset()
    f = extract_features(ds, backbone="raw", cache_dir=False, progress=False)
    assert f.x_train.shape == (12, 28 * 28) and f.x_test.shape == (6, 28 * 28)
    assert f.x_train.dtype == np.float32
    assert f.x_train.min() >= 0.0 and f.x_train.max() <= 1.0
    np.testing.assert_allclose(f.x_train[0], ds.x_train[0].ravel() / 255.0, rtol=1e-6)
    rgb = extract_features(make_dataset(4, 2, rgb=True), backbone="raw", cache_dir=False, progress=False)
    assert rgb.x_train.shape == (4, 28 * 28 * 3)


def test_resnet18_without_weights_raises_helpful_error(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path / "hub"))
    with pytest.raises(FileNotFoundError) as err:
        load_backbone("resnet18", root=tmp_path / "data")
    msg = str(err.value)
    assert "resnet18-f37072fd.pth" in msg and str(tmp_path / "hub" / "checkpoints") in msg
    assert str(tmp_path / "data" / "weights") in msg and "IMAGENET1K_V1" in msg
    with pytest.raises(FileNotFoundError):
        extract_features(make_dataset(2, 1), backbone="resnet18", input_size=32, cache_dir=False,
                         progress=False, root=tmp_path / "data")


def test_resnet18_with_weights_file(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path / "hub"))
    write_resnet18_weights(tmp_path / "data" / "weights")
    module, dim = load_backbone("resnet18", root=tmp_path / "data")
    assert dim == 512 and not module.training
    f = extract_features(make_dataset(3, 2), backbone="resnet18", input_size=32, cache_dir=False,
                         progress=False, root=tmp_path / "data")
    assert f.x_train.shape == (3, 512) and np.isfinite(f.x_train).all()


@pytest.mark.parametrize("bad", [8, 31, 0, 32.5])
def test_bad_input_size(bad):
    with pytest.raises(ValueError, match="input_size"):
        extract_features(make_dataset(), input_size=bad, cache_dir=False)


@pytest.mark.parametrize("bad", [0, -1])
def test_bad_batch_size(bad):
    with pytest.raises(ValueError, match="batch_size"):
        extract_features(make_dataset(), input_size=32, batch_size=bad, cache_dir=False)


def test_small_batches_and_empty_test_split():
    ds = make_dataset(3, 0)
    f = extract_features(ds, input_size=32, batch_size=2, cache_dir=False, progress=False)
    assert f.x_train.shape == (3, 1280) and f.x_test.shape == (0, 1280)


def test_efficientnet_weights_are_imagenet_pretrained():
    """The ImageNet head on sklearn's flower photo says 985 (daisy), top-1."""
    sklearn_datasets = pytest.importorskip("sklearn.datasets")
    img = sklearn_datasets.load_sample_image("flower.jpg")  # (427, 640, 3) uint8
    module, dim = load_backbone("efficientnet_lite0")
    assert dim == 1280 and not module.training
    with torch.inference_mode():
        x = ff._to_input(img[None], 224, torch.device("cpu"))
        logits = module.net((x - 0.498) / 0.502)
    assert int(logits.argmax(1)) == 985


def test_cpu_batch_default_gives_the_same_features_as_large_batches():
    """The CPU default (batches of at most 32 images, fast) and one forward of 256 give the same
    features bit for bit at the chapters' 64 px, on one thread and on two, so a cache written with
    either serves both. (Batches under 16 images would not: another convolution kernel.)"""
    ds = make_dataset(70, 0)
    assert ff.CPU_BATCH == 32
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            small = extract_features(ds, input_size=64, cache_dir=False, progress=False)
            large = extract_features(ds, input_size=64, batch_size=256, cache_dir=False, progress=False)
            np.testing.assert_array_equal(small.x_train, large.x_train)
    finally:
        torch.set_num_threads(threads)
