"""Domain-incremental digit streams: offline stand-ins for Re-Fed's Digit-10 (MNIST -> EMNIST -> USPS -> SVHN).

**These are stand-ins, not the paper's data.** Digit-10's sources (MNIST, EMNIST-Digits, USPS, SVHN)
are not available offline, so :func:`digit_domains` builds
digit domains with the same 10 labels from what ships offline:

=========  =========================================================================================
name       images (all uint8, 28x28, labels 0..9)
=========  =========================================================================================
mnist      MNIST-5k digits as they are
optdigits  UCI optdigits (8x8) resized bilinearly to 28x28: a different writer population, a
           frame-filling digit and blocky strokes (a USPS-like shift: USPS digits fill their frame too)
inverted   255 - x: white background, dark strokes (a crude SVHN-like contrast shift)
rotated    MNIST rotated by a fixed per-image angle drawn uniformly from [30, 60] degrees (seeded)
noisy      MNIST + Gaussian noise (sd 60 gray levels, seeded), clipped to 0..255
thick      grey dilation with a 3x3 cross (bolder strokes)
thin       grey erosion with a 2x2 square (thinner strokes)
=========  =========================================================================================

**No shared images.** The MNIST-based domains requested (mnist, inverted, rotated, noisy, thick,
thin) each get their own disjoint part of MNIST-5k: each split of the loader's fixed 80/20 split
(4,000 / 1,000) is cut into as many parts as there are MNIST-based domains, stratified by class and
seeded, so with the default names (four MNIST-based domains) every one holds 1,000 train / 250 test
images (100 / 25 per class) and no two domains share a source image. optdigits keeps the loader's
own split (1,437 / 360). A domain's ``name`` records its part and the seed, so it can key a cache.

:func:`make_domain_stream` concatenates the domains and returns a :class:`DomainIncrementalStream`,
a :class:`fedlib.data.streams.ClassIncrementalStream` whose tasks are the domains: every task holds
all C classes (``offset`` 0, ``classes`` = 0..C-1), ``relabel`` is the identity and
``num_seen(t) = C``. The class-incremental runner :func:`fedlib.federated.incremental.run_class_incremental`
then runs domain-incremental learning unchanged: stage t partitions domain t's training data over
the clients (Dirichlet(beta) label skew inside the domain, redrawn per task; beta None
= IID) and ``A[t, tau]`` is the accuracy on domain tau's test set after stage t, predicted by argmax
over all C classes (no task identity at test time).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from scipy.ndimage import generate_binary_structure, grey_dilation, grey_erosion, rotate

from fedlib.core.validate import check_int
from fedlib.data.datasets import Dataset, load_dataset
from fedlib.data.streams import ClassIncrementalStream, Task

__all__ = ["DOMAIN_NAMES", "MNIST_DOMAINS", "digit_domains", "DomainIncrementalStream", "make_domain_stream"]

#: Domains built on MNIST-5k (each gets a disjoint part of it).
MNIST_DOMAINS = ("mnist", "inverted", "rotated", "noisy", "thick", "thin")
#: Every name :func:`digit_domains` accepts.
DOMAIN_NAMES = MNIST_DOMAINS + ("optdigits",)

ROTATION_RANGE = (30.0, 60.0)  # degrees, counter-clockwise
NOISE_SD = 60.0  # gray levels
IMAGE_SIZE = 28


# --------------------------------------------------------------------------------------------
# transforms (uint8 (N, 28, 28) -> uint8 (N, 28, 28))
# --------------------------------------------------------------------------------------------


def _to_uint8(x: np.ndarray) -> np.ndarray:
    return np.clip(np.rint(x), 0, 255).astype(np.uint8)


def _invert(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return 255 - x


def _rotate(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    angles = rng.uniform(*ROTATION_RANGE, size=len(x))
    out = [rotate(img.astype(np.float32), a, reshape=False, order=1, mode="constant", cval=0.0)
           for img, a in zip(x, angles)]
    return _to_uint8(np.stack(out)) if out else x.copy()


def _noise(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return _to_uint8(x.astype(np.float32) + rng.normal(0.0, NOISE_SD, size=x.shape))


def _thick(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return grey_dilation(x, footprint=generate_binary_structure(2, 1)[None])


def _thin(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return grey_erosion(x, size=(1, 2, 2))


_TRANSFORMS = {"mnist": None, "inverted": _invert, "rotated": _rotate, "noisy": _noise,
               "thick": _thick, "thin": _thin}


def _resize(x: np.ndarray, size: int = IMAGE_SIZE) -> np.ndarray:
    """Bilinear resize of uint8 (N, h, w) to (N, size, size), uint8 0..255."""
    t = torch.from_numpy(x.astype(np.float32))[:, None]
    out = F.interpolate(t, size=(size, size), mode="bilinear", align_corners=False)[:, 0].numpy()
    return _to_uint8(out)


# --------------------------------------------------------------------------------------------
# domains
# --------------------------------------------------------------------------------------------


def _stratified_parts(labels: np.ndarray, parts: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Cut the indices of ``labels`` into ``parts`` disjoint, class-stratified, sorted index arrays."""
    out: list[list[np.ndarray]] = [[] for _ in range(parts)]
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        for p, chunk in enumerate(np.array_split(idx, parts)):
            out[p].append(chunk)
    return [np.sort(np.concatenate(p)) for p in out]


def digit_domains(names: Sequence[str] = ("mnist", "optdigits", "inverted", "rotated", "noisy"),
                  seed: int = 0, n_per_domain: int | None = None) -> list[Dataset]:
    """Digit domains (stand-ins for Re-Fed's Digit-10, **not the paper's data**), in the order of ``names``.

    Each is a :class:`fedlib.data.datasets.Dataset` of uint8 28x28 images with labels 0..9 (``DIGIT_CLASSES``)
    and its own train/test split. The MNIST-based domains (``MNIST_DOMAINS``) use disjoint,
    class-stratified parts of MNIST-5k's fixed train and test splits (one part per MNIST-based
    domain requested, drawn with ``seed``); ``optdigits`` keeps the loader's split and is resized
    to 28x28. ``seed`` also draws the rotation angles and the noise. ``n_per_domain`` = n keeps a
    stratified, seeded subset of n training and ``max(10, round(n / 4))`` test images per domain
    (``None``: all). See the module docstring for the transforms.
    """
    if isinstance(names, str):
        names = (names,)
    names = tuple(names)
    if not names:
        raise ValueError(f"names is empty: give at least one domain from {', '.join(DOMAIN_NAMES)}")
    unknown = [n for n in names if n not in DOMAIN_NAMES]
    if unknown:
        raise ValueError(f"unknown domain name(s) {', '.join(map(repr, unknown))}; allowed: {', '.join(DOMAIN_NAMES)}")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"domain name(s) {', '.join(map(repr, dup))} given more than once")
    if n_per_domain is not None:
        check_int("n_per_domain", n_per_domain, 10)   # None, or at least one image per class
    seed = int(seed)

    mnist_names = [n for n in names if n in MNIST_DOMAINS]
    parts = {}
    if mnist_names:
        base = load_dataset("mnist5k")
        k = len(mnist_names)
        tr = _stratified_parts(base.y_train, k, np.random.default_rng([seed, 0]))
        te = _stratified_parts(base.y_test, k, np.random.default_rng([seed, 1]))
        parts = {n: (i, tr[i], te[i]) for i, n in enumerate(mnist_names)}

    out = []
    for n in names:
        if n == "optdigits":
            d = load_dataset("optdigits")
            ds = Dataset("optdigits28", _resize(d.x_train), d.y_train.copy(), _resize(d.x_test), d.y_test.copy(), d.classes)
        else:
            i, tr, te = parts[n]
            xtr, xte = base.x_train[tr], base.x_test[te]
            fn = _TRANSFORMS[n]
            if fn is not None:
                stream = DOMAIN_NAMES.index(n) + 1
                xtr = fn(xtr, np.random.default_rng([seed, stream, 0]))
                xte = fn(xte, np.random.default_rng([seed, stream, 1]))
            ds = Dataset(f"mnist5k-{n}[part={i + 1}/{len(mnist_names)},seed={seed}]",
                         np.ascontiguousarray(xtr), base.y_train[tr], np.ascontiguousarray(xte), base.y_test[te],
                         base.classes)
        if n_per_domain is not None:
            n_train, n_test = int(n_per_domain), max(10, int(round(n_per_domain / 4)))
            if n_train > len(ds.y_train) or n_test > len(ds.y_test):
                raise ValueError(f"n_per_domain={n_per_domain} asks for {n_train} train / {n_test} test images but "
                                 f"domain {n!r} has {len(ds.y_train)} / {len(ds.y_test)} (with {len(mnist_names)} "
                                 "MNIST-based domains sharing MNIST-5k)")
            ds = ds.subset(n_train, n_test, seed=seed)
        out.append(ds)
    return out


# --------------------------------------------------------------------------------------------
# stream
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DomainIncrementalStream(ClassIncrementalStream):
    """One task per domain, every task over all C classes: ``offset`` 0, ``classes`` 0..C-1,
    ``relabel`` the identity, ``num_seen(t) = C``. ``client_partitions`` is the inherited one
    (Dirichlet(beta) label skew inside task t's = domain t's training data, redrawn per task).
    ``domain_names[t]`` names task t's domain."""

    domain_names: tuple[str, ...] = ()

    def relabel(self, labels) -> np.ndarray:
        y = np.asarray(labels, dtype=np.int64)
        if y.size and (y.min() < 0 or y.max() >= self.num_classes):
            raise ValueError(f"labels must lie in [0, {self.num_classes}), got [{y.min()}, {y.max()}]")
        return y.copy()

    def num_seen(self, t: int) -> int:
        self.tasks[t]  # IndexError for a stage that does not exist
        return self.num_classes


def make_domain_stream(domains: Sequence[Dataset]):
    """Concatenate ``domains`` (in order) into one train and one test array and cut one task per domain.

    Returns ``(stream, x_train, y_train, x_test, y_test)``; task t's ``train_idx`` / ``test_idx``
    are the (contiguous) positions of domain t in the concatenated arrays. Pass them straight to
    :func:`fedlib.federated.incremental.run_class_incremental`. All domains must share ``classes``, image
    shape and dtype, and each domain's training split must hold every one of the C labels 0..C-1
    (its test labels a subset of them).
    """
    domains = list(domains)
    if not domains:
        raise ValueError("domains is empty: give at least one Dataset (e.g. digit_domains())")
    ref = domains[0]
    c = len(ref.classes)
    for t, d in enumerate(domains):
        if tuple(d.classes) != tuple(ref.classes):
            raise ValueError(f"domain {t} ({d.name}) has classes {tuple(d.classes)}, domain 0 ({ref.name}) has "
                             f"{tuple(ref.classes)}: a domain stream needs one shared label set")
        if d.x_train.shape[1:] != ref.x_train.shape[1:] or d.x_test.shape[1:] != ref.x_train.shape[1:]:
            raise ValueError(f"domain {t} ({d.name}) has images of shape {d.x_train.shape[1:]} / {d.x_test.shape[1:]}, "
                             f"domain 0 has {ref.x_train.shape[1:]}: resize them to one shape")
        if d.x_train.dtype != ref.x_train.dtype or d.x_test.dtype != ref.x_train.dtype:
            raise ValueError(f"domain {t} ({d.name}) has dtype {d.x_train.dtype}/{d.x_test.dtype}, domain 0 has {ref.x_train.dtype}")
        ytr, yte = np.asarray(d.y_train), np.asarray(d.y_test)
        if not np.array_equal(np.unique(ytr), np.arange(c)):
            raise ValueError(f"domain {t} ({d.name}): training labels {np.unique(ytr).tolist()[:20]} are not all of "
                             f"0..{c - 1}: every domain must hold every class")
        if len(yte) == 0 or np.setdiff1d(np.unique(yte), np.arange(c)).size:
            raise ValueError(f"domain {t} ({d.name}): test labels must be a non-empty subset of 0..{c - 1}, "
                             f"got {np.unique(yte).tolist()[:20]}")
    n_tr = np.cumsum([0] + [len(d.y_train) for d in domains])
    n_te = np.cumsum([0] + [len(d.y_test) for d in domains])
    classes = np.arange(c)
    tasks = tuple(Task(t, classes, 0, np.arange(n_tr[t], n_tr[t + 1]), np.arange(n_te[t], n_te[t + 1]))
                  for t in range(len(domains)))
    stream = DomainIncrementalStream(classes, tasks, tuple(d.name for d in domains))
    x_train = np.concatenate([d.x_train for d in domains])
    y_train = np.concatenate([np.asarray(d.y_train, dtype=np.int64) for d in domains])
    x_test = np.concatenate([d.x_test for d in domains])
    y_test = np.concatenate([np.asarray(d.y_test, dtype=np.int64) for d in domains])
    return stream, x_train, y_train, x_test, y_test
