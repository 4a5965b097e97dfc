"""Accuracy: the one definition every chapter uses, and the model/head wrappers around it."""
from __future__ import annotations

import numpy as np
import torch
from torch import Tensor, nn

from fedlib.core.linalg import Array, as_tensor, predict


def accuracy(predictions, labels) -> float:
    """Fraction of ``predictions`` (N,) equal to ``labels`` (N,); NaN when N = 0."""
    pred = torch.as_tensor(np.asarray(predictions) if not isinstance(predictions, Tensor) else predictions)
    lab = torch.as_tensor(np.asarray(labels) if not isinstance(labels, Tensor) else labels)
    if pred.shape != lab.shape:
        raise ValueError(f"predictions {tuple(pred.shape)} and labels {tuple(lab.shape)} must have the same shape")
    n = int(lab.numel())
    if n == 0:
        return float("nan")
    return int((pred.to(lab.device).long() == lab.long()).sum()) / n


@torch.no_grad()
def predict_classes(model: nn.Module, x: Tensor, batch_size: int = 8192) -> Tensor:
    """``argmax`` class of ``model`` on x (N, ...) in eval mode, in batches; (N,) int64 on x's device."""
    was_training = model.training
    model.eval()
    out = [model(x[s:s + batch_size]).argmax(1) for s in range(0, int(x.shape[0]), batch_size)]
    model.train(was_training)
    return torch.cat(out) if out else torch.empty(0, dtype=torch.long, device=x.device)


def model_accuracy(model: nn.Module, x: Tensor, y: Tensor, batch_size: int = 8192) -> float:
    """Top-1 accuracy of ``model`` on (x, y): :func:`accuracy` of :func:`predict_classes`."""
    return accuracy(predict_classes(model, x, batch_size), y)


def head_accuracy(weights: torch.Tensor, x: Array, labels: Array) -> float:
    """Top-1 accuracy of the linear head ``weights`` (d, C) on (x, labels)."""
    return accuracy(predict(weights, x).cpu(), as_tensor(labels, torch.int64))
