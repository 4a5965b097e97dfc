"""Heads trained on (frozen) features by the gradient methods: x (N, ...) -> logits (N, C).

Each has ``features(x)`` (the representation a method may use: MOON contrasts it) and
``head(z)`` (the logits), with ``forward(x) = head(features(x))``.
"""
from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from fedlib.core.validate import check_positive

__all__ = ["LinearHead", "MLPHead", "MOONHead"]


class LinearHead(nn.Module):
    """Linear classifier with bias on (flattened) features; ``features`` is the identity."""

    def __init__(self, in_dim: int, num_classes: int):
        super().__init__()
        self.linear = nn.Linear(in_dim, num_classes)

    def features(self, x: Tensor) -> Tensor:
        return x.flatten(1)

    def head(self, z: Tensor) -> Tensor:
        return self.linear(z)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear(x.flatten(1))


class MLPHead(nn.Module):
    """Two-layer head: ``features`` = ReLU(Linear(in_dim, hidden)), ``head`` = Linear(hidden, C).

    A small trainable representation for methods that need one. (MOON's own head, with the
    authors' 2-layer projection, is :class:`MOONHead`.)
    """

    def __init__(self, in_dim: int, num_classes: int, hidden: int = 256):
        super().__init__()
        self.proj = nn.Linear(in_dim, hidden)
        self.classifier = nn.Linear(hidden, num_classes)

    def features(self, x: Tensor) -> Tensor:
        return F.relu(self.proj(x.flatten(1)))

    def head(self, z: Tensor) -> Tensor:
        return self.classifier(z)

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(F.relu(self.proj(x.flatten(1))))


class MOONHead(nn.Module):
    """MOON's projection head on (frozen) features, as in the authors' ``ModelFedCon``:
    ``z = l2(ReLU(l1(h)))`` (``features``, the contrasted representation, no ReLU on z) and
    logits ``l3(z)`` (``head``). ``l1``: in_dim -> hidden (the authors use hidden = in_dim, the
    default), ``l2``: hidden -> out_dim (256), ``l3``: out_dim -> C.
    """

    def __init__(self, in_dim: int, num_classes: int, hidden: int | None = None, out_dim: int = 256):
        super().__init__()
        hidden = in_dim if hidden is None else hidden
        check_positive("hidden", hidden)
        check_positive("out_dim", out_dim)
        self.l1 = nn.Linear(in_dim, hidden)
        self.l2 = nn.Linear(hidden, out_dim)
        self.l3 = nn.Linear(out_dim, num_classes)

    def features(self, x: Tensor) -> Tensor:
        return self.l2(F.relu(self.l1(x.flatten(1))))

    def head(self, z: Tensor) -> Tensor:
        return self.l3(z)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.features(x))
