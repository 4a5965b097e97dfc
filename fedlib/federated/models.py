"""Image networks trained from scratch, image tensors and frozen-backbone embeddings.

Every model here exposes ``.features(x)`` (N, C, H, W) -> (N, dim), ``.head(z)`` -> logits
(N, num_classes) and ``forward = head(features(x))``, like the heads of :mod:`fedlib.federated.gradient`,
so they run in :func:`fedlib.federated.gradient.run_federated` (MOON included).

SmallResNet     CIFAR-style ResNet (He et al., CVPR 2016, Sec. 4.2): 3x3 stem, no max-pool,
                BasicBlock stages, global average pool; BatchNorm or GroupNorm
resnet18_cifar  the CIFAR ResNet-18 (64-128-256-512, 2-2-2-2 blocks, 512-d features) used by
                the STSA and Re-Fed papers; 11,173,962 parameters for 3 channels / 10 classes
SmallCNN        LeNet-style CNN (two 5x5 conv + max-pool, one hidden fc layer)

``train_fedavg_backbone`` is stage 1 of STSA: train a network from scratch with FedAvg on the
first task, then freeze it; ``embed`` maps images through the frozen ``.features``.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedlib.core.devices import resolve_device
from fedlib.core.validate import check_choice, check_int, check_int_list
from fedlib.federated.gradient import ClientData, FedConfig, History, run_federated

__all__ = [
    "NORMS", "BasicBlock", "SmallResNet", "resnet18_cifar", "SmallCNN", "group_norm_groups",
    "images_to_tensor", "embed", "train_fedavg_backbone", "MODEL_NAMES", "make_model",
]

NORMS = ("batch", "group")


# ----------------------------------------------------------------------------------------------
# argument checks
# ----------------------------------------------------------------------------------------------
def _check_images(x: Tensor, in_channels: int) -> None:
    if x.ndim != 4 or x.shape[1] != in_channels:
        raise ValueError(f"x must have shape (N, {in_channels}, H, W), got {tuple(x.shape)}")


# ----------------------------------------------------------------------------------------------
# ResNet
# ----------------------------------------------------------------------------------------------
def group_norm_groups(channels: int) -> int:
    """GroupNorm groups for ``channels``: the largest divisor of ``channels`` that is at most
    min(32, channels // 4), i.e. Wu & He's (ECCV 2018) 32 groups where a layer is wide enough,
    with at least 4 channels per group in narrow layers (16 -> 4, 64 -> 16, 128+ -> 32; >= 1)."""
    g = max(1, min(32, channels // 4))
    while channels % g:
        g -= 1
    return g


def _norm(kind: str, channels: int) -> nn.Module:
    if kind == "batch":
        return nn.BatchNorm2d(channels)
    return nn.GroupNorm(group_norm_groups(channels), channels)


def _conv3x3(c_in: int, c_out: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)


class BasicBlock(nn.Module):
    """ReLU(norm(conv3x3(ReLU(norm(conv3x3(x))))) + shortcut(x)), (N, c_in, H, W) ->
    (N, c_out, H/stride, W/stride); shortcut = identity, or 1x1 conv + norm when the shape changes."""

    def __init__(self, c_in: int, c_out: int, stride: int = 1, norm: str = "batch"):
        super().__init__()
        self.conv1 = _conv3x3(c_in, c_out, stride)
        self.bn1 = _norm(norm, c_out)
        self.conv2 = _conv3x3(c_out, c_out)
        self.bn2 = _norm(norm, c_out)
        self.shortcut = nn.Sequential()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False),
                                          _norm(norm, c_out))

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class SmallResNet(nn.Module):
    """CIFAR-style ResNet: stem (3x3 conv stride 1 + norm + ReLU, no max-pool) -> one stage of
    ``blocks[i]`` BasicBlocks of width ``widths[i]`` per i (stride 2 at the start of every stage
    after the first) -> global average pool -> ``features`` (N, widths[-1]); ``head`` is a linear
    classifier (``self.classifier``). Any H, W >= 1 works (28x28, 32x32, 8x8, ...).

    ``norm``: ``"batch"`` (BatchNorm2d) or ``"group"`` (GroupNorm, groups from
    :func:`group_norm_groups`; no running statistics, works with batch size 1 and non-IID clients).
    Convolutions have no bias; He (fan-out) initialisation, norm weights 1 and biases 0.
    """

    def __init__(self, in_channels: int = 1, num_classes: int = 10, widths: Sequence[int] = (16, 32, 64),
                 blocks: Sequence[int] = (1, 1, 1), norm: str = "batch"):
        super().__init__()
        self.in_channels = check_int("in_channels", in_channels, 1)
        self.num_classes = check_int("num_classes", num_classes, 1)
        widths, blocks = tuple(check_int_list("widths", widths, 1)), tuple(check_int_list("blocks", blocks, 1))
        if len(widths) != len(blocks):
            raise ValueError(f"widths and blocks must have the same length (one entry per stage), "
                             f"got {len(widths)} widths and {len(blocks)} blocks")
        check_choice("norm", norm, NORMS)
        self.widths, self.blocks, self.norm = widths, blocks, norm
        self.dim = widths[-1]

        self.stem = nn.Sequential(_conv3x3(in_channels, widths[0]), _norm(norm, widths[0]), nn.ReLU())
        stages, c_in = [], widths[0]
        for i, (w, b) in enumerate(zip(widths, blocks)):
            layers = []
            for j in range(b):
                layers.append(BasicBlock(c_in, w, stride=2 if (i > 0 and j == 0) else 1, norm=norm))
                c_in = w
            stages.append(nn.Sequential(*layers))
        self.stages = nn.Sequential(*stages)
        self.classifier = nn.Linear(self.dim, num_classes)

        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, (nn.BatchNorm2d, nn.GroupNorm)):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def features(self, x: Tensor) -> Tensor:
        """(N, in_channels, H, W) float -> (N, dim) pooled features."""
        _check_images(x, self.in_channels)
        return self.stages(self.stem(x)).mean(dim=(2, 3))

    def head(self, z: Tensor) -> Tensor:
        """(N, dim) -> logits (N, num_classes)."""
        return self.classifier(z)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.features(x))


def resnet18_cifar(in_channels: int = 3, num_classes: int = 100, norm: str = "batch") -> SmallResNet:
    """The CIFAR ResNet-18 (widths 64-128-256-512, 2 BasicBlocks per stage, 512-d features), as
    used by the STSA and Re-Fed papers: 11,173,962 parameters for 3 channels and 10 classes."""
    return SmallResNet(in_channels, num_classes, widths=(64, 128, 256, 512), blocks=(2, 2, 2, 2), norm=norm)


# ----------------------------------------------------------------------------------------------
# LeNet-style CNN
# ----------------------------------------------------------------------------------------------
class _MaxPool2(torch.autograd.Function):
    """``F.max_pool2d(x, 2)`` through the channels-last CPU kernel, about 4x faster than the
    contiguous one on the SmallCNN's small maps (measured, one thread): the maxima are the same
    numbers and the indices the same (the first maximum of each window in row-major order, the
    convention of both kernels), and the backward is the built-in one on the contiguous input, so
    values and gradients equal ``F.max_pool2d``'s bit for bit (``tests/refed/test_refed.py``)."""

    @staticmethod
    def forward(ctx, x):
        out, idx = F.max_pool2d(x.contiguous(memory_format=torch.channels_last), 2, return_indices=True)
        ctx.save_for_backward(x, idx)
        return out.contiguous()

    @staticmethod
    def backward(ctx, g):
        x, idx = ctx.saved_tensors
        return torch.ops.aten.max_pool2d_with_indices_backward(g.contiguous(), x, [2, 2], [2, 2], [0, 0], [1, 1],
                                                               False, idx.contiguous())


def max_pool2(x: Tensor) -> Tensor:
    """``F.max_pool2d(x, 2)`` for x (N, C, H, W), bit for bit, faster on the CPU (:class:`_MaxPool2`); the
    plain call on other devices, inside ``torch.func`` transforms and for double backward."""
    if x.device.type != "cpu" or x.ndim != 4 or not x.is_floating_point() or not x.is_contiguous() \
            or torch._C._functorch.is_functorch_wrapped_tensor(x):
        return F.max_pool2d(x, 2)
    if not (torch.is_grad_enabled() and x.requires_grad):
        return F.max_pool2d(x.contiguous(memory_format=torch.channels_last), 2).contiguous()
    return _MaxPool2.apply(x)


class SmallCNN(nn.Module):
    """LeNet-style CNN (the FedAvg paper's CNN shape, McMahan et al. 2017, narrower):
    conv5x5(width, pad 2) -> ReLU -> max-pool 2 -> conv5x5(2*width, pad 2) -> ReLU -> max-pool 2
    -> flatten -> Linear(2*width*(image_size//4)**2, hidden) -> ReLU = ``features`` (N, hidden);
    ``head`` = Linear(hidden, num_classes) (``self.classifier``). Inputs must be
    (N, in_channels, image_size, image_size), image_size >= 4.
    """

    def __init__(self, in_channels: int = 1, num_classes: int = 10, image_size: int = 28,
                 width: int = 32, hidden: int = 128):
        super().__init__()
        self.in_channels = check_int("in_channels", in_channels, 1)
        self.num_classes = check_int("num_classes", num_classes, 1)
        self.image_size = check_int("image_size", image_size, 4)
        width, hidden = check_int("width", width, 1), check_int("hidden", hidden, 1)
        self.dim = hidden
        self.conv1 = nn.Conv2d(in_channels, width, 5, padding=2)
        self.conv2 = nn.Conv2d(width, 2 * width, 5, padding=2)
        self.fc = nn.Linear(2 * width * (image_size // 4) ** 2, hidden)
        self.classifier = nn.Linear(hidden, num_classes)

    def features(self, x: Tensor) -> Tensor:
        """(N, in_channels, image_size, image_size) float -> (N, hidden)."""
        _check_images(x, self.in_channels)
        if x.shape[2] != self.image_size or x.shape[3] != self.image_size:
            raise ValueError(f"x must be {self.image_size}x{self.image_size} images (image_size), "
                             f"got {x.shape[2]}x{x.shape[3]}")
        h = max_pool2(F.relu(self.conv1(x)))   # = F.max_pool2d(..., 2), bit for bit, faster
        h = max_pool2(F.relu(self.conv2(h)))
        return F.relu(self.fc(h.flatten(1)))

    def head(self, z: Tensor) -> Tensor:
        """(N, hidden) -> logits (N, num_classes)."""
        return self.classifier(z)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.features(x))


MODEL_NAMES = ("smallcnn", "resnet18")


def make_model(name: str, in_channels: int, num_classes: int, *, image_size: int = 28, width: int = 32,
               hidden: int = 128) -> nn.Module:
    """A fresh network by name, for ``functools.partial(make_model, ...)`` as a ``model_fn``:
    ``"smallcnn"``: SmallCNN(in_channels, num_classes, image_size, width, hidden); ``"resnet18"``:
    :func:`resnet18_cifar` (in_channels, num_classes; any image size, ``width``/``hidden`` unused)."""
    check_choice("name", name, MODEL_NAMES)
    if name == "smallcnn":
        return SmallCNN(in_channels, num_classes, image_size, width, hidden)
    return resnet18_cifar(in_channels, num_classes)


# ----------------------------------------------------------------------------------------------
# inputs, embeddings, stage-1 training
# ----------------------------------------------------------------------------------------------
def images_to_tensor(images: np.ndarray) -> Tensor:
    """uint8 (N, H, W) grayscale or (N, H, W, 3) RGB -> float32 (N, C, H, W) with C = 1 or 3,
    ``(x / 255 - 0.5) / 0.5`` per channel (ToTensor + Normalize(0.5, 0.5)): values in [-1, 1]."""
    if not isinstance(images, np.ndarray):
        raise ValueError(f"images must be a numpy array, got {type(images).__name__}")
    if images.dtype != np.uint8:
        raise ValueError(f"images must have dtype uint8, got {images.dtype}")
    if images.ndim == 3:
        images = images[:, None]
    elif images.ndim == 4 and images.shape[3] == 3:
        images = images.transpose(0, 3, 1, 2)
    else:
        raise ValueError(f"images must have shape (N, H, W) or (N, H, W, 3), got {images.shape}")
    x = torch.from_numpy(np.ascontiguousarray(images)).float()
    return x.div_(127.5).sub_(1.0)  # == (x / 255 - 0.5) / 0.5


def embed(model: nn.Module, x: Tensor, batch_size: int = 256, device="cpu") -> np.ndarray:
    """``model.features`` over x (N, ...) in eval mode under ``torch.inference_mode``, in batches of
    ``batch_size`` on ``device`` -> float32 numpy (N, dim). The model is moved to ``device`` for the
    call and back afterwards; every submodule's train/eval mode is restored. (256 rather than 1024:
    2x faster for the 28x28 SmallResNet on a CPU, the activations staying in the cache; the same
    features bit for bit, tested.)"""
    if not isinstance(x, Tensor):
        raise ValueError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if not callable(getattr(model, "features", None)):
        raise ValueError(f"model must have a .features(x) method; {type(model).__name__} has none")
    batch_size = check_int("batch_size", batch_size, 1)
    device = resolve_device(device)
    modes = [(m, m.training) for m in model.modules()]
    home = next(model.parameters(), None)
    home = None if home is None else home.device
    try:
        model.to(device).eval()
        with torch.inference_mode():
            n = int(x.shape[0])
            outs = [model.features(x[s:s + batch_size].to(device)).float().cpu() for s in range(0, n, batch_size)]
            if not outs:
                outs = [model.features(x[:0].to(device)).float().cpu()]
        return torch.cat(outs).numpy()
    finally:
        if home is not None:
            model.to(home)
        for m, training in modes:
            m.training = training


def train_fedavg_backbone(model_fn: Callable[[], nn.Module], clients: ClientData,
                          test: tuple[Tensor, Tensor], config: FedConfig,
                          progress: bool = True) -> tuple[nn.Module, History]:
    """STSA stage 1: train ``model_fn()`` from scratch with FedAvg (``run_federated(model_fn,
    clients, test, "fedavg", config, progress)``) and return a fresh ``model_fn()`` holding the
    final global weights, frozen (``requires_grad_(False)``, eval mode, on CPU), and the History."""
    if not isinstance(config, FedConfig):
        raise ValueError(f"config must be a FedConfig, got {type(config).__name__}")
    history = run_federated(model_fn, clients, test, "fedavg", config, progress)
    model = model_fn()
    model.load_state_dict(history.final_state)
    return model.requires_grad_(False).eval(), history
