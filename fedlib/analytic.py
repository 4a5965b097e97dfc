"""Analytic-learning primitives shared by AFL and STSA: sufficient statistics and ridge solves.

A linear head W (d x C) fitted by least squares on features X (N x d) with one-hot targets
Y (N x C) depends on the data only through the Gram matrix G = X^T X (d x d) and the
cross-correlation B = X^T Y (d x C). Both are sums over samples, so they add across clients
and across time; that additivity is what AFL's AA law (Zhuang et al. 2024, Thm. 1) and STSA's
spatial-temporal aggregation rest on. Statistics are accumulated in float64 and every solve
uses a Cholesky/LU solve, never an explicit inverse.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch

from .utils import check_positive

Array = np.ndarray | torch.Tensor


def as_tensor(x: Array, dtype: torch.dtype = torch.float64, device: str | torch.device = "cpu") -> torch.Tensor:
    """Array or tensor -> tensor of ``dtype`` on ``device`` (no copy when already there)."""
    if isinstance(x, np.ndarray):
        x = torch.from_numpy(np.ascontiguousarray(x))
    return x.to(device=device, dtype=dtype)


def one_hot(labels: Array, num_classes: int, dtype: torch.dtype = torch.float64,
            device: str | torch.device = "cpu") -> torch.Tensor:
    """Labels (N,) int in [0, C) -> one-hot targets Y (N, C) with 0/1 entries (AFL eq. 2)."""
    y = as_tensor(labels, torch.int64, device)
    if y.numel() and (int(y.min()) < 0 or int(y.max()) >= num_classes):
        raise ValueError(f"labels must lie in [0, num_classes={num_classes}), got range "
                         f"[{int(y.min())}, {int(y.max())}]")
    return torch.nn.functional.one_hot(y, num_classes).to(dtype)


@dataclass
class SufficientStats:
    """Gram ``G = X^T X`` (d, d), cross-correlation ``B = X^T Y`` (d, C) and sample count ``n``.

    Statistics of disjoint data sets add: ``stats(D1 u D2) = stats(D1) + stats(D2)``.
    """

    gram: torch.Tensor
    xty: torch.Tensor
    n: int

    @classmethod
    def zeros(cls, dim: int, num_classes: int, dtype: torch.dtype = torch.float64,
              device: str | torch.device = "cpu") -> "SufficientStats":
        return cls(torch.zeros(dim, dim, dtype=dtype, device=device),
                   torch.zeros(dim, num_classes, dtype=dtype, device=device), 0)

    @classmethod
    def from_data(cls, x: Array, labels: Array, num_classes: int, dtype: torch.dtype = torch.float64,
                  device: str | torch.device = "cpu", chunk: int = 8192) -> "SufficientStats":
        """Accumulate G and B over ``x`` (N, d) and ``labels`` (N,) in chunks of ``chunk`` rows.

        The features are cast to ``dtype`` (float64 by default) before the products, so float32
        features lose nothing in the accumulation.
        """
        n, dim = int(x.shape[0]), int(x.shape[1])
        stats = cls.zeros(dim, num_classes, dtype, device)
        for start in range(0, n, chunk):
            xc = as_tensor(x[start:start + chunk], dtype, device)
            yc = one_hot(labels[start:start + chunk], num_classes, dtype, device)
            stats.gram.addmm_(xc.T, xc)
            stats.xty.addmm_(xc.T, yc)
        stats.n = n
        return stats

    def __add__(self, other: "SufficientStats") -> "SufficientStats":
        return SufficientStats(self.gram + other.gram, self.xty + other.xty, self.n + other.n)

    def __iadd__(self, other: "SufficientStats") -> "SufficientStats":
        self.gram += other.gram
        self.xty += other.xty
        self.n += other.n
        return self


def ridge_solve(gram: torch.Tensor, rhs: torch.Tensor, lam: float = 0.0) -> torch.Tensor:
    """Solve ``(G + lam I) W = rhs`` for W (d, C): Cholesky, LU if not positive definite.

    ``lam`` may be negative (AFL's RI restoration subtracts ``K gamma I``, eq. 15). A feature that
    is zero in every sample (a dead ReLU channel of a frozen CNN) has a zero row and column in G,
    so the system decouples: its weight is set to 0, the minimum-norm least-squares choice, and
    the rest is solved exactly. Warns if what remains is singular (then the least-squares head
    is not unique). Never forms an explicit inverse.
    """
    a = gram if lam == 0 else gram + lam * torch.eye(gram.shape[0], dtype=gram.dtype, device=gram.device)
    diag = torch.diagonal(a)
    active = diag.abs() > diag.abs().max() * a.shape[0] * torch.finfo(a.dtype).eps
    if not bool(active.all()):
        out = torch.zeros(a.shape[0], rhs.shape[1], dtype=rhs.dtype, device=rhs.device)
        out[active] = ridge_solve(a[active][:, active], rhs[active])
        return out
    factor, info = torch.linalg.cholesky_ex(a)
    if int(info) == 0:
        return torch.cholesky_solve(rhs, factor)
    warnings.warn("ridge_solve: the matrix is singular or not positive definite (fewer samples than "
                  "features, or collinear features); the least-squares solution is not unique",
                  RuntimeWarning, stacklevel=2)
    return torch.linalg.lstsq(a, rhs).solution if a.device.type == "cpu" else torch.linalg.pinv(a) @ rhs


def ridge_fit(x: Array, labels: Array, num_classes: int, lam: float = 0.0, dtype: torch.dtype = torch.float64,
              device: str | torch.device = "cpu") -> torch.Tensor:
    """Centralized ridge / least-squares head ``W = (X^T X + lam I)^{-1} X^T Y`` (d, C).

    ``lam = 0`` is the joint least-squares solution AFL claims to reproduce (AFL eq. 54); it
    needs ``X^T X`` non-singular.
    """
    check_positive("lam", lam, strict=False)
    stats = SufficientStats.from_data(x, labels, num_classes, dtype, device)
    return ridge_solve(stats.gram, stats.xty, lam)


def predict(weights: torch.Tensor, x: Array) -> torch.Tensor:
    """Class predictions ``argmax_c (x W)_c`` (N,) for features x (N, d)."""
    xt = as_tensor(x, weights.dtype, weights.device)
    return (xt @ weights).argmax(dim=1)


def accuracy(weights: torch.Tensor, x: Array, labels: Array) -> float:
    """Top-1 accuracy of the linear head ``weights`` (d, C) on (x, labels)."""
    pred = predict(weights, x).cpu()
    return float((pred == as_tensor(labels, torch.int64)).double().mean())


def synthetic_features(n: int, dim: int, num_classes: int, kind: str = "gaussian", seed: int = 0):
    """Synthetic features (n, dim) float64 and labels (n,) for the exactness checks.

    ``gaussian``: standard normal, uniform random labels (AFL's dummy data, Sec. 4.1).
    ``mean_dominated``: non-negative, class-dependent ReLU features on a large common mean, so
    ``cond(X^T X)`` is large (~1e7), like real uncentred CNN features.
    """
    from .utils import check_choice

    check_choice("kind", kind, ("gaussian", "mean_dominated"))
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, num_classes, n)
    if kind == "gaussian":
        return rng.standard_normal((n, dim)), labels
    centers = rng.standard_normal((num_classes, dim))
    x = np.maximum(centers[labels] + rng.standard_normal((n, dim)), 0.0) * rng.uniform(0.05, 1.0, dim)
    return x + 5.0, labels


def gram_report(gram: torch.Tensor) -> dict:
    """Conditioning of a pooled Gram matrix (d, d): features that are zero in every sample, and
    the extreme eigenvalues and condition number over the remaining ones (what a solve sees)."""
    diag = torch.diagonal(gram)
    active = diag > diag.max() * gram.shape[0] * torch.finfo(gram.dtype).eps
    eig = torch.linalg.eigvalsh(gram[active][:, active])
    return {"zero features": int((~active).sum()), "lambda_min": float(eig[0]), "lambda_max": float(eig[-1]),
            "condition number": float(eig[-1] / eig[0])}


def relative_error(weights: torch.Tensor, reference: torch.Tensor) -> float:
    """``max|W - W*| / max|W*|``: the deviation measure of the exactness checks."""
    return float((weights - reference).abs().max() / reference.abs().max())
