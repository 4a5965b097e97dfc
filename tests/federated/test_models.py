"""Tests for fedlib.federated.models: from-scratch image networks, image tensors, embeddings, STSA stage 1."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedlib.federated.gradient import FedConfig
from fedlib.evaluation.metrics import model_accuracy as accuracy
from fedlib.federated.models import (
    SmallCNN, SmallResNet, embed, group_norm_groups, images_to_tensor, resnet18_cifar,
    train_fedavg_backbone,
)

# (in_channels, H=W): 28x28 grayscale, 32x32 RGB, 8x8 grayscale
INPUTS = [(1, 28), (3, 32), (1, 8)]


def _x(c: int, s: int, n: int = 2, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, c, s, s, generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------------------------
# shapes
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("c,s", INPUTS)
@pytest.mark.parametrize("norm", ["batch", "group"])
def test_small_resnet_shapes(c, s, norm):
    model = SmallResNet(in_channels=c, num_classes=7, norm=norm).eval()
    x = _x(c, s)
    z = model.features(x)
    assert model.dim == 64 and z.shape == (2, 64)
    assert model.head(z).shape == (2, 7)
    torch.testing.assert_close(model(x), model.head(z))


def test_small_resnet_custom_widths():
    model = SmallResNet(in_channels=3, num_classes=4, widths=(8, 12), blocks=(2, 1)).eval()
    assert model.dim == 12
    assert model(_x(3, 32)).shape == (2, 4)
    assert len(model.stages) == 2 and len(model.stages[0]) == 2 and len(model.stages[1]) == 1


@pytest.mark.parametrize("c,s", INPUTS)
def test_resnet18_cifar_shapes(c, s):
    torch.manual_seed(0)
    model = resnet18_cifar(in_channels=c, num_classes=100).eval()
    x = _x(c, s)
    z = model.features(x)
    assert model.dim == 512 and z.shape == (2, 512)
    assert model(x).shape == (2, 100)


@pytest.mark.parametrize("c,s", INPUTS)
def test_small_cnn_shapes(c, s):
    model = SmallCNN(in_channels=c, num_classes=5, image_size=s, width=8, hidden=24).eval()
    x = _x(c, s)
    z = model.features(x)
    assert model.dim == 24 and z.shape == (2, 24)
    assert (z >= 0).all()  # ReLU hidden layer
    torch.testing.assert_close(model(x), model.head(z))
    with pytest.raises(ValueError, match="image_size"):
        model.features(_x(c, s + 4))


def test_wrong_channel_count_is_rejected():
    with pytest.raises(ValueError, match=r"\(N, 3, H, W\)"):
        SmallResNet(in_channels=3).features(_x(1, 8))


# ----------------------------------------------------------------------------------------------
# parameter count, gradients, normalisation
# ----------------------------------------------------------------------------------------------
def _resnet_param_count(in_ch: int, num_classes: int, widths, blocks, norm_params_per_channel: int = 2) -> int:
    """By hand: bias-free 3x3 convs, 2 affine parameters per channel per norm layer, a 1x1
    conv + norm shortcut at every block whose shape changes, a linear head with bias."""
    nrm = norm_params_per_channel
    total = 9 * in_ch * widths[0] + nrm * widths[0]  # stem
    c_in = widths[0]
    for i, (w, b) in enumerate(zip(widths, blocks)):
        for j in range(b):
            total += 9 * c_in * w + nrm * w + 9 * w * w + nrm * w
            if (i > 0 and j == 0) or c_in != w:
                total += c_in * w + nrm * w
            c_in = w
    return total + widths[-1] * num_classes + num_classes


def test_resnet18_cifar_parameter_count():
    # stem 1,728 + 128; stage 1: 4 * (36,864 + 128); stages 2-4 (c -> 2c, stride 2):
    # 9c*2c + 9*(2c)^2 + c*2c + 3*2*2c for the first block, 2 * (9*(2c)^2 + 2*2c) for the second;
    # fc 512*10 + 10.  Sum: 11,173,962 (the well-known CIFAR ResNet-18 count).
    expected = _resnet_param_count(3, 10, (64, 128, 256, 512), (2, 2, 2, 2))
    assert expected == 11_173_962
    for norm in ("batch", "group"):
        model = resnet18_cifar(in_channels=3, num_classes=10, norm=norm)
        assert sum(p.numel() for p in model.parameters()) == expected
    model = resnet18_cifar()  # 100 classes: + 90 * (512 + 1)
    assert sum(p.numel() for p in model.parameters()) == expected + 90 * 513
    small = SmallResNet(in_channels=1, num_classes=10)
    assert sum(p.numel() for p in small.parameters()) == _resnet_param_count(1, 10, (16, 32, 64), (1, 1, 1))


@pytest.mark.parametrize("model_fn", [
    lambda: SmallResNet(in_channels=1, num_classes=3),
    lambda: SmallCNN(in_channels=1, num_classes=3, image_size=8, width=4, hidden=8),
])
def test_gradients_reach_the_stem(model_fn):
    torch.manual_seed(0)
    model = model_fn().train()
    x, y = _x(1, 8, n=4), torch.tensor([0, 1, 2, 0])
    F.cross_entropy(model(x), y).backward()
    first = model.stem[0] if isinstance(model, SmallResNet) else model.conv1
    assert first.weight.grad is not None and first.weight.grad.abs().sum() > 0
    assert all(p.grad is not None for p in model.parameters())


def test_group_norm_trains_with_batch_size_one():
    model = SmallResNet(in_channels=1, num_classes=3, widths=(8, 16, 32, 64), blocks=(1, 1, 1, 1),
                        norm="group").train()
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())
    out = model(_x(1, 8, n=1))  # the last stage is 1x1: BatchNorm would refuse this in train mode
    assert out.shape == (1, 3)
    out.sum().backward()
    with pytest.raises(ValueError):  # contrast: BatchNorm needs > 1 value per channel
        SmallResNet(in_channels=1, widths=(8, 16, 32, 64), blocks=(1, 1, 1, 1)).train()(_x(1, 8, n=1))


def test_group_norm_groups():
    assert [group_norm_groups(c) for c in (1, 4, 8, 16, 64, 128, 512, 18, 6)] == [1, 1, 2, 4, 16, 32, 32, 3, 1]
    for c in range(1, 600):
        g = group_norm_groups(c)
        assert c % g == 0 and 1 <= g <= 32


# ----------------------------------------------------------------------------------------------
# images_to_tensor, embed
# ----------------------------------------------------------------------------------------------
def test_images_to_tensor_grayscale_and_rgb():
    gray = np.array([[[0, 255], [51, 127]]], dtype=np.uint8)  # (1, 2, 2)
    x = images_to_tensor(gray)
    assert x.dtype == torch.float32 and x.shape == (1, 1, 2, 2)
    expected = (torch.tensor([[0, 255], [51, 127]], dtype=torch.float32) / 255 - 0.5) / 0.5
    torch.testing.assert_close(x[0, 0], expected)
    assert x.min() == -1.0 and x.max() == 1.0

    rgb = np.random.default_rng(0).integers(0, 256, size=(3, 5, 4, 3), dtype=np.uint8)
    x = images_to_tensor(rgb)
    assert x.shape == (3, 3, 5, 4) and x.is_contiguous()
    torch.testing.assert_close(x[1, 2], torch.from_numpy(rgb[1, :, :, 2]).float() / 127.5 - 1.0)
    assert -1.0 <= x.min() and x.max() <= 1.0


@pytest.mark.parametrize("bad, what", [
    (np.zeros((2, 4, 4), dtype=np.float32), "uint8"),
    (np.zeros((2, 4, 4), dtype=np.int64), "uint8"),
    (np.zeros((4, 4), dtype=np.uint8), "shape"),
    (np.zeros((2, 4, 4, 1), dtype=np.uint8), "shape"),
    (np.zeros((2, 3, 4, 4), dtype=np.uint8), "shape"),
    (np.zeros((1, 2, 2, 4, 3), dtype=np.uint8), "shape"),
    ([[[0, 1]]], "numpy array"),
])
def test_images_to_tensor_rejects_bad_input(bad, what):
    with pytest.raises(ValueError, match=what):
        images_to_tensor(bad)


def test_embed_matches_features_and_restores_mode():
    torch.manual_seed(0)
    model = SmallResNet(in_channels=1, num_classes=3, widths=(8, 16), blocks=(1, 1)).train()
    model.stages[0].eval()  # mixed modes must be restored exactly
    x = _x(1, 8, n=10)
    z = embed(model, x, batch_size=3)
    assert isinstance(z, np.ndarray) and z.dtype == np.float32 and z.shape == (10, 16)
    assert model.training and not model.stages[0].training and model.stages[1].training
    assert all(p.requires_grad for p in model.parameters())
    model.eval()
    with torch.no_grad():
        ref = model.features(x).numpy()
    np.testing.assert_allclose(z, ref, rtol=1e-5, atol=1e-6)
    assert embed(model, x[:0]).shape == (0, 16)
    with pytest.raises(ValueError, match="batch_size"):
        embed(model, x, batch_size=0)


def test_embed_batch_size_does_not_change_the_features():
    """The default batch (256) gives the features of the former default (1024) bit for bit, so the
    cached scratch backbones' features stay valid."""
    torch.manual_seed(0)
    model = SmallResNet(in_channels=1, num_classes=2, widths=(8, 16, 32), blocks=(1, 1, 1)).eval()
    x = _x(1, 28, n=600)
    np.testing.assert_array_equal(embed(model, x), embed(model, x, batch_size=1024))


# ----------------------------------------------------------------------------------------------
# STSA stage 1
# ----------------------------------------------------------------------------------------------
def _bright_vs_dark(n: int, seed: int):
    """Class 1: bright 8x8 images (pixels in [150, 255]); class 0: dark (pixels in [0, 105])."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, size=n)
    low = np.where(y == 1, 150, 0)[:, None, None]
    img = (low + rng.integers(0, 106, size=(n, 8, 8))).astype(np.uint8)
    return images_to_tensor(img), torch.from_numpy(y)


@pytest.mark.parametrize("norm", ["batch", "group"])
def test_train_fedavg_backbone_freezes_a_working_model(norm):
    clients = [_bright_vs_dark(64, seed) for seed in (1, 2)]
    test = _bright_vs_dark(100, 3)
    cfg = FedConfig(rounds=3, local_epochs=1, batch_size=16, lr=0.05, device="cpu")

    def model_fn():
        return SmallResNet(in_channels=1, num_classes=2, widths=(8, 16), blocks=(1, 1), norm=norm)

    model, hist = train_fedavg_backbone(model_fn, clients, test, cfg, progress=False)
    assert isinstance(model, SmallResNet) and not model.training
    assert not any(m.training for m in model.modules())
    assert not any(p.requires_grad for p in model.parameters())
    assert hist.round == [1, 2, 3] and hist.algorithm == "FedAvg()"
    acc = accuracy(model, *test)
    assert acc > 0.9 and acc == pytest.approx(hist.final_acc)
    assert embed(model, test[0]).shape == (100, 16)


# ----------------------------------------------------------------------------------------------
# bad constructor arguments
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, match", [
    (dict(widths=(16, 32), blocks=(1, 1, 1)), "same length"),
    (dict(widths=(), blocks=()), "widths"),
    (dict(widths=(16, 0), blocks=(1, 1)), "widths"),
    (dict(blocks=(1, 0, 1)), "blocks"),
    (dict(widths=16), "widths"),
    (dict(norm="layer"), "norm"),
    (dict(in_channels=0), "in_channels"),
    (dict(in_channels=1.5), "in_channels"),
    (dict(num_classes=0), "num_classes"),
])
def test_small_resnet_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SmallResNet(**kwargs)


@pytest.mark.parametrize("kwargs, match", [
    (dict(norm="instance"), "norm"),
    (dict(in_channels=0), "in_channels"),
    (dict(num_classes=-1), "num_classes"),
])
def test_resnet18_cifar_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        resnet18_cifar(**kwargs)


@pytest.mark.parametrize("kwargs, match", [
    (dict(in_channels=0), "in_channels"),
    (dict(num_classes=0), "num_classes"),
    (dict(image_size=3), "image_size"),
    (dict(width=0), "width"),
    (dict(hidden=True), "hidden"),
])
def test_small_cnn_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SmallCNN(**kwargs)


def test_train_fedavg_backbone_rejects_bad_config():
    with pytest.raises(ValueError, match="config"):
        train_fedavg_backbone(lambda: SmallCNN(), [], (torch.zeros(0), torch.zeros(0)), config={})
