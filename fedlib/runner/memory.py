"""Peak-memory estimates of each chapter from its parameters, checked by the runner before any work.

:func:`estimate` returns the dominant arrays a chapter holds at once (a lower bound of its peak:
the named terms only, interpreter, libraries and small arrays not counted), on the host and, for
chapters that train on ``device: cuda``, on the GPU. :func:`check_fits` refuses a run whose
estimate exceeds the memory the machine has (host RAM from ``psutil``; the GPU's total memory from
``torch.cuda``), with the numbers, so a ``paper`` run on a small machine fails in a second instead
of after an hour.

Sizes of the datasets (images x values per image) are the public sizes of the datasets registered
in :data:`fedlib.data.datasets.DATASETS` (train + test).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import psutil
import torch

from fedlib.core.parallel import resolve_workers
from fedlib.fedtsne.knn import BLOCK_BYTES
from fedlib.fedtsne.pipelines import DENSE_MAX_POINTS

F32, F64 = 4, 8

#: name -> (images, values per image) of the registered datasets (train + test)
DATASET_SIZES = {"optdigits": (1797, 64), "mnist5k": (5000, 784), "fashion_mnist": (70000, 784),
                 "mnist": (70000, 784), "animal_mnist": (10000, 784), "cifar10": (60000, 3072),
                 "cifar100": (60000, 3072)}
#: backbone -> feature dimension (raw: the image's values)
FEATURE_DIMS = {"efficientnet_lite0": 1280, "resnet18": 512}
#: float32 values of ResNet-18's activations kept for the backward pass, per 32x32 image (forward
#: outputs of every conv / norm / ReLU layer of the CIFAR variant, counted from its layer shapes)
RESNET18_ACTIVATIONS_32PX = 2_500_000
RESNET18_PARAMS = 11_200_000
#: classes of the datasets that do not have 10
NUM_CLASSES = {"cifar100": 100}
#: parameters of the frozen backbones (counted from the modules)
BACKBONE_PARAMS = {"efficientnet_lite0": 4_652_008, "resnet18": RESNET18_PARAMS}
#: float32 values of the largest layer's input + output per input pixel, in inference (forward hooks
#: on every leaf module; the same at 64 and 224 px)
INFERENCE_ACTIVATIONS_PER_PIXEL = {"efficientnet_lite0": 50, "resnet18": 32}
#: images per batch of fedlib.data.features.extract_features
EXTRACTION_BATCH = 256


@dataclass
class Estimate:
    """Named byte counts of the dominant arrays on the host and on the device."""

    host: dict[str, float] = field(default_factory=dict)
    device: dict[str, float] = field(default_factory=dict)

    @property
    def host_bytes(self) -> float:
        return sum(self.host.values())

    @property
    def device_bytes(self) -> float:
        return sum(self.device.values())


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def _points(dataset: str, n: int | None) -> int:
    total = DATASET_SIZES.get(dataset, (0, 0))[0]
    return total if n is None else min(int(n), total)


def _features(v: Mapping[str, Any], dataset: str, n: int | None) -> tuple[int, int]:
    """(rows, feature dim) of a chapter's frozen-backbone features."""
    dim = FEATURE_DIMS.get(v.get("backbone", "raw"), DATASET_SIZES.get(dataset, (0, 0))[1])
    return _points(dataset, n), dim


def _afl_benchmark(v) -> Estimate:
    """Host: images, features and AFL's d x d statistics. Device (``device`` other than ``cpu``): the
    larger of the two phases that run there, feature extraction (the backbone's weights, one batch
    of images and its live activations) and training on the cached features (the features and their
    stacked copy, every client's head with gradient, momentum and previous copy, the gathered
    mini-batch, AFL's float64 features and d x d statistics)."""
    n, d = _features(v, v["dataset"], None if v["n_train"] is None and v["n_test"] is None
                     else (v["n_train"] or 0) + (v["n_test"] or 0))
    host = {"images (uint8)": n * DATASET_SIZES.get(v["dataset"], (0, 0))[1],
            "features (float32)": n * d * F32, "AFL statistics C, C_agg, inverse (4 d x d float64)": 4 * d * d * F64}
    if v["device"] == "cpu":
        return Estimate(host)
    backbone, px = v["backbone"], int(v["input_size"]) ** 2
    batch = EXTRACTION_BATCH
    extraction = {f"{backbone} weights (float32)": BACKBONE_PARAMS.get(backbone, 0) * F32,
                  f"one extraction batch of {batch} images (float32)": batch * 3 * px * F32,
                  f"its live activations (2 x the largest layer's input + output, {batch} images, float32)":
                      2 * batch * INFERENCE_ACTIVATIONS_PER_PIXEL.get(backbone, 0) * px * F32}
    # FedAvg's linear head runs at every K of the client-count sweep, the other methods at num_clients
    k = max([int(v["num_clients"]), *map(int, v["client_counts"])])
    c = NUM_CLASSES.get(v["dataset"], 10)
    hidden = d if v["moon_hidden"] is None else int(v["moon_hidden"])
    moon = (d * hidden + hidden + hidden * 256 + 256 + 256 * c + c) if "moon" in v["methods"] else 0
    heads = max(k * (d * c + c), int(v["num_clients"]) * moon)
    training = {"features on the device and their stacked copy (2 x float32)": 2 * n * d * F32,
                "stacked heads of a round's clients: weights, gradients, momentum, previous (4 x float32)": 4 * heads * F32,
                f"gathered mini-batch ({k} clients x {v['batch_size']} rows x d, float32)": k * int(v["batch_size"]) * d * F32,
                "AFL: features and d x d statistics (float64)": (n * d + 4 * d * d) * F64}
    device = extraction if sum(extraction.values()) > sum(training.values()) else training
    return Estimate(host, device)


def _afl_derivation(v) -> Estimate:
    n, d = max(v["n_samples"], v["reference_samples"]), max(v["dim"], v["reference_dim"], v["table1_dim"])
    return Estimate({"data X and copies (3 n x d float64)": 3 * n * d * F64, "Gram matrices (6 d x d float64)": 6 * d * d * F64})


def _stsa_benchmark(v, extra_gram_copies: int = 0) -> Estimate:
    M = max([v["M"], v["M_scratch"], *v["ablation_M"], *v["ablation_M_scratch"]])
    n, d = max((_features(v, ds, None if v["n_train"] is None else v["n_train"] + (v["n_test"] or 0))
                for ds in v["datasets"]), default=(0, 0))
    grams = 4 + extra_gram_copies
    host = {"features (float32)": n * d * F32, "random features of one chunk (4096 x M float64)": 4096 * M * F64,
            f"Gram G, its solve and the server's sums ({grams} M x M float64)": grams * M * M * F64}
    device = dict(host) if v["device"] == "cuda" else {}
    return Estimate(host, device)


def _afl_beyond(v) -> Estimate:
    n, d = _features(v, v["dataset"], None if v["n_train"] is None and v["n_test"] is None
                     else (v["n_train"] or 0) + (v["n_test"] or 0))
    p = d + NUM_CLASSES.get(v["dataset"], 10)
    return Estimate({"images (uint8)": n * DATASET_SIZES.get(v["dataset"], (0, 0))[1],
                     "features (float32)": n * d * F32,
                     "stacked client factors R_k for TSQR (at most n x (d+C) float64)": n * p * F64,
                     f"statistics of the {v['loco_clients']} leave-one-out clients and the sums ((k+2) (d+C)^2 float64)":
                         (v["loco_clients"] + 2) * p * p * F64,
                     "conditioning study: data, its copy and QR (3 n x d float64)": 3 * v["cond_samples"] * v["cond_dim"] * F64})


def _stsa_beyond(v) -> Estimate:
    """As :func:`_stsa_benchmark` at one dataset and one M, plus GCV's eigenvectors of the M x M Gram."""
    return _stsa_benchmark({**v, "datasets": [v["dataset"]], "M_scratch": 0, "ablation_M": [], "ablation_M_scratch": []},
                           extra_gram_copies=2)


def _stsa_derivation(v) -> Estimate:
    n, M = v["n_samples"], max(v["M"], v["dim"])
    return Estimate({"random features Phi (n x M float64)": n * M * F64, "Gram matrices (4 M x M float64)": 4 * M * M * F64})


def _workers(v: Mapping[str, Any]) -> int:
    """Processes a chapter's ``workers`` parameter runs at once (fedlib.core.parallel.resolve_workers)."""
    return resolve_workers(v.get("workers", 1), v.get("device", "cpu"))


def _dense(n: int, count: int, what: str) -> dict[str, float]:
    return {f"{what} ({count} n x n float64, n = {n})": count * n * n * F64}


def _fedtsne_benchmark(v) -> Estimate:
    """Up to ``DENSE_MAX_POINTS`` points a dataset takes the dense path (four n x n matrices); above
    it the kNN path (the points, their neighbour lists and one block of scores, knn.BLOCK_BYTES)."""
    best: dict[str, float] = {}
    for ds in v["datasets"]:
        n = _points(ds, v["n_points"].get(ds))
        if n <= DENSE_MAX_POINTS:
            terms = _dense(n, 4, "pooled distances, Nystrom estimate, its square root, t-SNE affinities")
        else:
            m, k = DATASET_SIZES[ds][1], max(int(3 * v["perplexity"]) + 1, v["umap_neighbors"], 90)
            terms = {f"points and a copy (2 n x m float64, n = {n})": 2 * n * m * F64,
                     f"neighbour lists and affinities (4 n x {k} x 8 bytes)": 4 * n * k * F64,
                     "one block of scores (knn.BLOCK_BYTES)": float(BLOCK_BYTES)}
        if sum(terms.values()) > sum(best.values()):
            best = terms
    runs = _workers(v)   # forked workers, each with its own run's arrays
    return Estimate(best if runs == 1 else {f"{name}, x {runs} runs at once": b * runs for name, b in best.items()})


def _fedspeclust(v) -> Estimate:
    n = max(_points(ds, v["max_points"]) for ds in v["datasets"])
    return Estimate(_dense(n, 4, "kernel estimate, affinity, Laplacian, a copy"))


def _fedtsne_small(v) -> Estimate:
    return Estimate(_dense(v["n_points"], 4, "pooled distances, Nystrom estimate, square root, affinities"))


def _refed_benchmark(v, runs_at_once: int | None = None) -> Estimate:
    runs_at_once = _workers(v) if runs_at_once is None else runs_at_once
    dataset = v["dataset"]
    n = _points(dataset, None if v["n_train"] is None else v["n_train"] + (v["n_test"] or 0))
    px = DATASET_SIZES.get(dataset, (0, 0))[1]
    host = {"images as float32 tensors": n * px * F32}
    if v["model"] == "resnet18":
        scale = px / 3072
        train = {"ResNet-18 weights, gradients, momentum, global and PIM copies (5 x float32)": 5 * RESNET18_PARAMS * F32,
                 "activations of one batch (float32)": v["batch_size"] * RESNET18_ACTIVATIONS_32PX * scale * F32}
        if runs_at_once > 1:
            train = {f"{name}, x {runs_at_once} runs at once": b * runs_at_once for name, b in train.items()}
        (host if v["device"] == "cpu" else {}).update(train)
        device = train if v["device"] != "cpu" else {}
        return Estimate(host, device)
    return Estimate(host)


def _refed_theory(v) -> Estimate:
    """The Monte Carlo check of the exact recursion (its rounds x repetitions, and each repetition's state),
    every Theorem 3.1 curve (error and Lemma 2 ratio per round), the lambda grid's PIM solutions and the
    synthetic 8 x 8 images."""
    rounds = min(v["horizon"], 300) + 1
    cases = len(v["thm_L"]) * len(v["thm_lambdas"])
    images = v["num_classes"] * (v["n_per_class"] + v["n_test_per_class"]) * 64
    return Estimate({"Monte Carlo errors and states (float64)": rounds * v["mc_reps"] * (1 + v["dim"]) * F64,
                     "Theorem 3.1 curves (float64)": 2 * cases * (v["horizon"] + 1) * F64,
                     "PIM solutions over the lambda grid (float64)": v["n_lambda"] * v["dim"] * F64,
                     "synthetic images (float32)": images * F32})


ESTIMATORS: dict[str, Callable[[Mapping[str, Any]], Estimate]] = {
    "afl_derivation": _afl_derivation, "afl_benchmark": _afl_benchmark, "stsa_derivation": _stsa_derivation,
    "stsa_benchmark": _stsa_benchmark, "fedtsne_benchmark": _fedtsne_benchmark, "fedspeclust": _fedspeclust,
    "fedtsne_derivation": _fedtsne_small, "fedtsne_privacy": _fedtsne_small, "refed_benchmark": _refed_benchmark,
    "afl_beyond": _afl_beyond, "stsa_beyond": _stsa_beyond, "fedtsne_beyond": _fedtsne_small,
    "refed_beyond": lambda v: _refed_benchmark(v, runs_at_once=_workers(v)), "refed_theory": _refed_theory,
}


def estimate(chapter: str, values: Mapping[str, Any]) -> Estimate:
    """The dominant arrays of ``chapter`` run with ``values`` (all its parameters)."""
    fn = ESTIMATORS.get(chapter)
    return fn(values) if fn is not None else Estimate()


def available() -> tuple[float, float | None]:
    """(host RAM bytes, the first GPU's bytes or None without CUDA)."""
    gpu = torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else None
    return float(psutil.virtual_memory().total), gpu


def check_fits(chapter: str, values: Mapping[str, Any], host_limit: float | None = None,
               device_limit: float | None = None) -> Estimate:
    """:func:`estimate`, refused with a MemoryError naming every term when it exceeds the host's RAM
    (or ``host_limit``) or the GPU's memory (or ``device_limit``)."""
    est = estimate(chapter, values)
    host, gpu = available()
    host = host if host_limit is None else host_limit
    gpu = gpu if device_limit is None else device_limit
    for where, need, have, terms in (("host RAM", est.host_bytes, host, est.host),
                                     ("GPU memory", est.device_bytes, gpu, est.device)):
        if have is not None and need > have:
            detail = "; ".join(f"{name}: {gib(b)}" for name, b in terms.items())
            raise MemoryError(f"{chapter} needs at least {gib(need)} of {where} with these parameters, this machine "
                              f"has {gib(have)} ({detail}). Lower the sizes named above or use a larger machine.")
    return est
