"""The federated class-incremental (FCIL) protocol: learners run on a
:class:`~fedlib.data.streams.ClassIncrementalStream` (tasks of disjoint classes, per-task client
partitions), and its metrics.

A learner implements :class:`IncrementalLearner`; :func:`run_class_incremental` feeds it the
stages one by one and fills the accuracy matrix ``A[t, tau]`` (accuracy on the test classes of
task tau after stage t, predictions by argmax over all classes seen so far), from which come

    A_T   = (1/T) sum_tau A[T, tau]                                   (STSA eq. 61)
    A_avg = (1/T) sum_t (1/t) sum_{tau<=t} A[t, tau]                  (STSA eq. 60 with its 1/T)
    F_T   = 1/(T-1) sum_{tau<T} max_{tau<=t'<T} A[t', tau] - A[T, tau]  (STSA eq. 62)

and the sample-weighted accuracy on all seen test samples (what the STSA code reports).
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol, Sequence

import numpy as np
import pandas as pd
import torch
from torch import Tensor
from tqdm.auto import tqdm

from fedlib.core import paths
from fedlib.core.messages import Cost
from fedlib.core.validate import check_int
from fedlib.data.features import Features, feature_fingerprint, load_cached_features, save_cached_features
from fedlib.data.streams import ClassIncrementalStream
from fedlib.federated.models import SmallResNet, embed, images_to_tensor, train_fedavg_backbone

__all__ = ["IncrementalLearner", "IncrementalResult", "run_class_incremental", "accuracy_matrix_metrics",
           "task_offset"]


class IncrementalLearner(Protocol):
    """What :func:`run_class_incremental` drives.

    ``learn_task(t, clients, num_seen)``: one stage; ``clients`` is a list of K (x_k, y_k) with y_k
    re-indexed labels in the task's block ``[task_offset(clients), num_seen)``; returns the stage's
    measured :class:`fedlib.core.messages.Cost` (bytes up / down of its Messages, seconds). ``predict(x, num_seen)``: (N,)
    labels by argmax over the first ``num_seen`` classes.
    """

    name: str

    def learn_task(self, t: int, clients: list[tuple[Tensor, Tensor]], num_seen: int) -> Cost: ...

    def predict(self, x: Tensor, num_seen: int) -> Tensor: ...


def task_offset(clients: Sequence[tuple[Tensor, Tensor]]) -> int:
    """First label of the stage's class block: the smallest label over all clients (every class of a
    task occurs in its training data, so the union of the clients' labels is the whole block)."""
    labels = [int(y.min()) for _, y in clients if len(y)]
    if not labels:
        raise ValueError("every client of the stage is empty")
    return min(labels)


def accuracy_matrix_metrics(acc: np.ndarray) -> dict[str, float]:
    """A_T, A_avg and F_T (eqs. 60-62, with A_avg's 1/T) from the (T, T) matrix ``acc[t, tau]``
    (NaN above the diagonal). F_T is NaN when T = 1."""
    acc = np.asarray(acc, dtype=float)
    t_count = acc.shape[0]
    a_t = float(np.mean(acc[-1]))
    a_avg = float(np.mean([np.mean(acc[t, :t + 1]) for t in range(t_count)]))
    if t_count == 1:
        return {"A_T": a_t, "A_avg": a_avg, "F_T": float("nan")}
    forgetting = [np.max(acc[tau:t_count - 1, tau]) - acc[-1, tau] for tau in range(t_count - 1)]
    return {"A_T": a_t, "A_avg": a_avg, "F_T": float(np.mean(forgetting))}


@dataclass
class IncrementalResult:
    """Outcome of one FCIL run. ``acc`` (T, T): A[t, tau] in [0, 1], NaN for tau > t;
    ``top1`` (T,): sample-weighted accuracy on all seen test samples; ``bytes_up`` / ``wall_s``
    (T,): uploads and seconds of learning (evaluation excluded) per stage; ``costs`` (T,): each
    stage's measured :class:`Cost` as the learner reported it, ``cost`` their sum."""

    method: str
    acc: np.ndarray
    top1: np.ndarray
    bytes_up: np.ndarray
    wall_s: np.ndarray
    config: dict = field(default_factory=dict)
    costs: list[Cost] = field(default_factory=list)

    @property
    def cost(self) -> Cost:
        return sum(self.costs, Cost())

    @property
    def metrics(self) -> dict[str, float]:
        return accuracy_matrix_metrics(self.acc)

    def summary(self) -> dict:
        """One row: method, config, A_T, A_avg, F_T (in %), mean seen-sample accuracy, total MiB up, seconds."""
        m = {k: 100 * v for k, v in self.metrics.items()}
        return {"method": self.method, **self.config, **m, "top1_avg": 100 * float(np.mean(self.top1)),
                "MiB_up": float(self.bytes_up.sum()) / 2**20, "wall_s": float(self.wall_s.sum())}

    def curve(self) -> pd.DataFrame:
        """Per stage: classes seen, A_t (task-averaged, %) and the sample-weighted accuracy (%)."""
        t_count = self.acc.shape[0]
        return pd.DataFrame({"method": self.method, **self.config, "stage": np.arange(1, t_count + 1),
                             "A_t": [100 * np.mean(self.acc[t, :t + 1]) for t in range(t_count)],
                             "top1": 100 * self.top1})


def _as_tensor(x) -> Tensor:
    return x if isinstance(x, Tensor) else torch.from_numpy(np.ascontiguousarray(x))


def run_class_incremental(learner: IncrementalLearner, stream: ClassIncrementalStream, x_train, y_train,
                          x_test, y_test, num_clients: int, beta: float | None, seed: int = 0,
                          config: dict | None = None, progress: bool = True, min_size: int = 1,
                          evaluate: str = "every_stage") -> IncrementalResult:
    """Run ``learner`` through every stage of ``stream``.

    x_train (N, ...), y_train (N,) original labels; the same for test. Stage t: partition task t's
    training data over ``num_clients`` clients (Dirichlet ``beta``, redrawn per task), call
    ``learner.learn_task``, then evaluate on the test samples of every task seen so far.
    Every client holds >= ``min_size`` samples of every task; a learner that needs more (STSA-E's
    K_D dummy clients) states it as ``learner.min_client_size`` and is refused before any work.
    ``evaluate="last_stage"`` evaluates after the last stage only (for studies that report A_T
    alone): the earlier rows of ``acc`` and entries of ``top1`` stay NaN, and so do A_avg and F_T.
    """
    if evaluate not in ("every_stage", "last_stage"):
        raise ValueError(f"evaluate must be 'every_stage' or 'last_stage', got {evaluate!r}")
    if beta is not None and not beta > 0:
        raise ValueError(f"beta must be > 0 (Dirichlet concentration) or None for IID, got {beta!r}")
    check_int("num_clients", num_clients, 1)
    needed = getattr(learner, "min_client_size", 1)
    if min_size < needed:
        raise ValueError(f"{learner.name} needs every client to hold >= {needed} samples per task "
                         f"(K_D dummy clients); pass min_size >= {needed} (got min_size={min_size})")
    y_train = np.asarray(y_train, dtype=np.int64)
    y_test = np.asarray(y_test, dtype=np.int64)
    pos_train, pos_test = stream.relabel(y_train), stream.relabel(y_test)
    partitions = [stream.client_partitions(t, y_train, num_clients, beta, seed, min_size) for t in range(stream.num_tasks)]
    t_count = stream.num_tasks
    acc = np.full((t_count, t_count), np.nan)
    top1, bytes_up, wall = np.full(t_count, np.nan), np.zeros(t_count, dtype=np.int64), np.zeros(t_count)
    costs: list[Cost] = []
    for t in tqdm(range(t_count), desc=learner.name, disable=not progress):
        clients = [(_as_tensor(x_train[p]), torch.from_numpy(pos_train[p])) for p in partitions[t]]
        start = time.perf_counter()
        costs.append(learner.learn_task(t, clients, stream.num_seen(t)))
        bytes_up[t] = costs[-1].bytes_up
        wall[t] = time.perf_counter() - start
        if evaluate == "last_stage" and t < t_count - 1:
            continue
        correct, total = 0, 0
        for tau in range(t + 1):
            idx = stream.tasks[tau].test_idx
            pred = learner.predict(_as_tensor(x_test[idx]), stream.num_seen(t)).cpu().numpy()
            hits = int((pred == pos_test[idx]).sum())
            acc[t, tau] = hits / len(idx)
            correct, total = correct + hits, total + len(idx)
        top1[t] = correct / total
    return IncrementalResult(learner.name, acc, top1, bytes_up, wall, dict(config or {}), costs)


# how run_federated trains (part of the scratch-backbone cache key: a change here must not reuse old files)
SCRATCH_TRAINING = {"batches": "per-client"}   # each client draws its mini-batch order from its own stream


def scratch_backbone_features(dataset, stream: ClassIncrementalStream, num_clients: int, beta: float | None,
                              seed: int, config, widths=(8, 16, 32), cache_dir=None, progress: bool = True):
    """Stage 1 of the paper's "training from scratch" setting, on a small CIFAR-style ResNet.

    A :class:`fedlib.federated.models.SmallResNet` is trained by FedAvg (``config``: a FedConfig) on task 1's
    clients only (the partition :func:`run_class_incremental` draws for task 1 with the same
    ``num_clients``, ``beta``, ``seed``), then frozen; every train / test image is embedded once.
    Returns ``(features, stage1)``: a :class:`fedlib.data.features.Features` (N, widths[-1]) and a dict
    with the stage-1 upload bytes, seconds and test accuracy on task 1. Both are cached on disk
    (same directory as the pretrained-feature cache), keyed by the data and every setting.
    """
    settings = json.dumps({"K": num_clients, "beta": beta, "seed": seed, "widths": list(widths),
                           "order": stream.class_order.tolist(), "config": asdict(config) | {"device": None},
                           **SCRATCH_TRAINING}, sort_keys=True)
    key = hashlib.sha1((settings + feature_fingerprint(dataset, "scratch", 0)).encode()).hexdigest()[:12]
    directory = paths.cache_dir() if cache_dir is None else Path(cache_dir)
    path = directory / f"scratch_resnet__{dataset.name.replace('/', '_')}__{key}.npz"
    name = f"{dataset.name}/scratch-resnet(beta={beta}, seed={seed})"
    meta_path = path.with_suffix(".json")
    if path.is_file() and meta_path.is_file():
        cached = load_cached_features(path, dataset, name)
        if cached is not None:
            return cached, json.loads(meta_path.read_text())

    x_train, x_test = images_to_tensor(dataset.x_train), images_to_tensor(dataset.x_test)
    pos_train, pos_test = stream.relabel(dataset.y_train), stream.relabel(dataset.y_test)
    task = stream.tasks[0]
    parts = stream.client_partitions(0, dataset.y_train, num_clients, beta, seed)
    clients = [(x_train[p], torch.from_numpy(pos_train[p])) for p in parts]
    test = (x_test[task.test_idx], torch.from_numpy(pos_test[task.test_idx]))
    channels = int(x_train.shape[1])
    model, history = train_fedavg_backbone(
        lambda: SmallResNet(channels, task.num_classes, widths=tuple(widths), blocks=(1,) * len(widths)), clients, test, config, progress)
    feats = Features(name, embed(model, x_train), np.asarray(dataset.y_train), embed(model, x_test),
                     np.asarray(dataset.y_test), tuple(dataset.classes))
    stage1 = {"bytes_up": int(history.bytes_up[-1]), "wall_s": float(history.wall_s[-1]),
              "task1_test_acc": float(history.final_acc), "rounds": config.rounds}
    save_cached_features(path, feats)
    meta_path.write_text(json.dumps(stage1))
    return feats, stage1
