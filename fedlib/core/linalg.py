"""Analytic-learning primitives shared by AFL and STSA: sufficient statistics and ridge solves.

A linear head W (d x C) fitted by least squares on features X (N x d) with one-hot targets
Y (N x C) depends on the data only through the Gram matrix G = X^T X (d x d) and the
cross-correlation B = X^T Y (d x C). Both are sums over samples, so they add across clients
and across time; that additivity is what AFL's AA law (Zhuang et al. 2024, Thm. 1) and STSA's
spatial-temporal aggregation rest on. Statistics are accumulated in float64; every solve is a
Cholesky solve of the equilibrated system, with a rank-revealing eigendecomposition (relative
tolerance) deciding the doubtful cases, never an explicit inverse (see :func:`ridge_solve`).
"""
from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass

import numpy as np
import torch
from threadpoolctl import threadpool_limits

from fedlib.core.validate import check_choice, check_positive

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


def _default_rcond(a: torch.Tensor, rcond: float | None) -> float:
    """Relative rank tolerance: ``rcond`` or NumPy's ``matrix_rank`` default ``d * eps(dtype)``."""
    if rcond is None:
        return a.shape[-1] * torch.finfo(a.dtype).eps
    if not 0 <= rcond < 1:
        raise ValueError(f"rcond must be in [0, 1), got {rcond!r}")
    return float(rcond)


def _decoupled(a: torch.Tensor) -> torch.Tensor:
    """(d,) bool: features whose row of ``a`` is exactly 0 off the diagonal (e.g. a ReLU channel that
    is 0 in every sample). Exact test, so it does not depend on the scale of any feature."""
    off = a - torch.diag_embed(torch.diagonal(a))
    return (off == 0).all(dim=1)


def _equilibrate(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(D^{-1/2} a D^{-1/2}, D^{1/2})`` with ``D = |diag a|`` (1 where 0): unit diagonal, so the
    rank test below is invariant to rescaling a feature (a column of X times s scales its row and
    column of X^T X by s)."""
    s = torch.diagonal(a).abs().sqrt()
    s = torch.where(s > 0, s, torch.ones_like(s))
    return a / s[:, None] / s[None, :], s


def smallest_eig_estimate(factor: torch.Tensor, iters: int = 6) -> float:
    """Upper estimate of lambda_min(A) from A's Cholesky factor: inverse power iteration from a
    fixed random start (the Rayleigh quotient of A^{-1} never exceeds its largest eigenvalue)."""
    gen = torch.Generator(device="cpu").manual_seed(12345)
    v = torch.randn(factor.shape[0], 1, generator=gen, dtype=factor.dtype).to(factor.device)
    v = v / torch.linalg.vector_norm(v)
    rq = 0.0
    for _ in range(iters):
        w = torch.cholesky_solve(v, factor)
        rq = float((v * w).sum())
        v = w / torch.linalg.vector_norm(w)
    return 1.0 / rq if rq > 0 else 0.0


def numerical_rank(a: torch.Tensor, rcond: float | None = None) -> tuple[int, torch.Tensor]:
    """Rank of a symmetric (d, d) matrix by a symmetric eigendecomposition (rank-revealing) of its
    equilibrated form: ``#{|lambda_i| > rcond * max|lambda|}``, ``rcond = d * eps(dtype)`` by default
    (NumPy's ``matrix_rank``). Returns ``(rank, eigenvalues of the equilibrated matrix)``."""
    tol = _default_rcond(a, rcond)
    eq, _ = _equilibrate((a + a.T) / 2)
    lam = torch.linalg.eigvalsh(eq)
    top = float(lam.abs().max()) if lam.numel() else 0.0
    return int((lam.abs() > tol * top).sum()) if top > 0 else 0, lam


def inverse_applier(a: torch.Tensor, inverse: str = "solve", singular: str = "the matrix is singular"):
    """``b -> a^{-1} b`` for a (d, d) ``a``: one Cholesky (LU if ``a`` is not positive definite) reused for
    every right-hand side, or a pseudo-inverse when ``inverse == "pinv"`` (:func:`pinv_applier`). An
    exactly singular ``a`` raises ValueError(``singular``): say what to do instead (not torch's raw LU error)."""
    if inverse == "pinv":
        return pinv_applier(a)
    factor, info = torch.linalg.cholesky_ex(a)
    if int(info) == 0:
        return lambda b: torch.cholesky_solve(b, factor)
    lu, pivots, info = torch.linalg.lu_factor_ex(a)
    if int(info) != 0:
        raise ValueError(singular)
    return lambda b: torch.linalg.lu_solve(lu, pivots, b)


def pinv_applier(a: torch.Tensor):
    """``b -> pinv(a) b`` for a symmetric (d, d) ``a``, as ``torch.linalg.pinv(a, hermitian=True) @ b``
    (eigenvalues with ``|lambda| <= d eps max|lambda|`` dropped) without forming the pseudo-inverse:
    one eigendecomposition, applied in O(d^2 C). Where ``a`` is clearly positive definite - its
    Cholesky factorization succeeds and the inverse-iteration estimate of its smallest eigenvalue
    exceeds that cutoff (relative to the Gershgorin bound on the largest) 1000-fold, the screen of
    :func:`~fedlib.core.linalg.ridge_solve` - no eigenvalue is dropped, ``pinv(a) = a^{-1}``, and
    the Cholesky factor applies it (to round-off, the same numbers)."""
    rtol = a.shape[0] * torch.finfo(a.dtype).eps
    factor, info = torch.linalg.cholesky_ex(a)
    if int(info) == 0 and smallest_eig_estimate(factor) > 1e3 * rtol * float(a.abs().sum(1).max()):
        return lambda b: torch.cholesky_solve(b, factor)
    lam, vec = torch.linalg.eigh(a)
    keep = lam.abs() > rtol * float(lam.abs().max()) if lam.numel() else lam.bool()
    lam, vec = lam[keep], vec[:, keep]
    return lambda b: vec @ ((vec.T @ b) / lam[:, None])


def ridge_solve(gram: torch.Tensor, rhs: torch.Tensor, lam: float = 0.0, rcond: float | None = None) -> torch.Tensor:
    """Solve ``(G + lam I) W = rhs`` for W (d, C); G (d, d) symmetric, rhs (d, C).

    ``lam`` may be negative (AFL's RI restoration subtracts ``K gamma I``, eq. 15).

    * A feature whose row of ``A = G + lam I`` is exactly zero off the diagonal (a dead ReLU channel)
      decouples: ``w_j = rhs_j / A_jj``, or 0 (the minimum-norm choice) where ``rhs_j = 0`` or
      ``A_jj = 0``. No threshold, so a live feature of any scale is never dropped.
    * The rest is equilibrated to unit diagonal (scale-invariant) and factorized by Cholesky; an
      inverse-iteration estimate of its smallest eigenvalue screens the conditioning. Where Cholesky
      fails or the estimate comes within 1e3 of the tolerance, a symmetric eigendecomposition
      (rank-revealing) decides: rank = ``#{|lambda| > rcond * max|lambda|}``, ``rcond = d * eps``
      by default. Full rank: the solve. Rank-deficient: a ``RuntimeWarning`` and the minimum-norm
      solution ``A^+ rhs`` (the ``lstsq`` / ``pinv`` answer, truncated to that rank).

    Never forms an explicit inverse of a full-rank matrix.
    """
    a = gram if lam == 0 else gram + lam * torch.eye(gram.shape[0], dtype=gram.dtype, device=gram.device)
    a = (a + a.T) / 2
    tol = _default_rcond(a, rcond)
    dec = _decoupled(a)
    if bool(dec.any()):
        out = torch.zeros(a.shape[0], rhs.shape[1], dtype=rhs.dtype, device=rhs.device)
        diag = torch.diagonal(a)[dec]
        r = rhs[dec]
        safe = torch.where(diag != 0, diag, torch.ones_like(diag))
        out[dec] = torch.where((r != 0) & (diag != 0)[:, None], r / safe[:, None], torch.zeros_like(r))
        if bool((~dec).any()):
            keep = ~dec
            out[keep] = ridge_solve(a[keep][:, keep], rhs[keep], 0.0, rcond)
        return out
    eq, s = _equilibrate(a)
    factor, info = torch.linalg.cholesky_ex(eq)
    if int(info) == 0 and smallest_eig_estimate(factor) > 1e3 * tol * eq.shape[0]:
        # unit diagonal => lambda_max(eq) <= d: clearly well conditioned, skip the eigendecomposition
        return torch.cholesky_solve(rhs / s[:, None], factor) / s[:, None]
    rank, lam_eq = numerical_rank(a, rcond)
    if rank == a.shape[0]:
        if int(info) == 0:
            return torch.cholesky_solve(rhs / s[:, None], factor) / s[:, None]
        return torch.linalg.solve(eq, rhs / s[:, None]) / s[:, None]
    warnings.warn(f"ridge_solve: the matrix is singular (numerical rank {rank} of {a.shape[0]} at relative "
                  f"tolerance {tol:.1e}; fewer samples than features, or collinear features): the "
                  "least-squares solution is not unique, returning the minimum-norm one",
                  RuntimeWarning, stacklevel=2)
    mu, vec = torch.linalg.eigh(a)
    idx = mu.abs().argsort(descending=True)[:rank]
    mu, vec = mu[idx], vec[:, idx]
    return vec @ ((vec.T @ rhs) / mu[:, None])


def ridge_fit(x: Array, labels: Array, num_classes: int, lam: float = 0.0, dtype: torch.dtype = torch.float64,
              device: str | torch.device = "cpu") -> torch.Tensor:
    """Centralized ridge / least-squares head ``W = (X^T X + lam I)^{-1} X^T Y`` (d, C).

    ``lam = 0`` is the joint least-squares solution AFL claims to reproduce (AFL eq. 54); if
    ``X^T X`` is singular, :func:`ridge_solve` warns and returns the minimum-norm solution.
    """
    check_positive("lam", lam, strict=False)
    stats = SufficientStats.from_data(x, labels, num_classes, dtype, device)
    return ridge_solve(stats.gram, stats.xty, lam)


def predict(weights: torch.Tensor, x: Array) -> torch.Tensor:
    """Class predictions ``argmax_c (x W)_c`` (N,) for features x (N, d)."""
    xt = as_tensor(x, weights.dtype, weights.device)
    return (xt @ weights).argmax(dim=1)


def synthetic_features(n: int, dim: int, num_classes: int, kind: str = "gaussian", seed: int = 0,
                       condition: float = 1e8):
    """Synthetic features (n, dim) float64 and labels (n,) for the exactness checks.

    ``gaussian``: standard normal, uniform random labels (AFL's dummy data, Sec. 4.1).
    ``mean_dominated``: non-negative, class-dependent ReLU features on a large common mean, so
    ``cond(X^T X)`` is large (~1e7), like real uncentred CNN features.
    ``ill_conditioned``: ``X = sqrt(n) Q diag(s) V^T`` with orthonormal Q (n, dim), V (dim, dim) and
    singular values s log-spaced so that ``cond(X^T X) = condition`` exactly; labels
    ``argmax(X W0 + noise)``, so the least-squares residual is not zero.
    """
    check_choice("kind", kind, ("gaussian", "mean_dominated", "ill_conditioned"))
    rng = np.random.default_rng(seed)
    if kind == "ill_conditioned":
        check_positive("condition", condition)
        if n < dim:
            raise ValueError(f"ill_conditioned features need n >= dim, got n={n}, dim={dim}")
        q, _ = np.linalg.qr(rng.standard_normal((n, dim)))
        v, _ = np.linalg.qr(rng.standard_normal((dim, dim)))
        s = np.logspace(0.0, -0.5 * np.log10(max(condition, 1.0)), dim)
        x = np.sqrt(n) * (q * s) @ v.T
        labels = np.argmax(x @ rng.standard_normal((dim, num_classes)) + rng.standard_normal((n, num_classes)), 1)
        return x, labels
    labels = rng.integers(0, num_classes, n)
    if kind == "gaussian":
        return rng.standard_normal((n, dim)), labels
    centers = rng.standard_normal((num_classes, dim))
    x = np.maximum(centers[labels] + rng.standard_normal((n, dim)), 0.0) * rng.uniform(0.05, 1.0, dim)
    return x + 5.0, labels


def _one_blas_thread(fn):
    """Run ``fn`` with NumPy's BLAS / LAPACK on one thread: its threads busy-wait on a shared, loaded
    machine (a 10,000 x 1280 QR beside another chapter: 2.9 s on one thread; the afl_beyond cell that
    ran it on the default threads took 25.6 s)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with threadpool_limits(limits=1, user_api="blas"):
            return fn(*args, **kwargs)

    return wrapper


@_one_blas_thread
def lstsq_reference(x: Array, labels: Array, num_classes: int, lam: float = 0.0) -> torch.Tensor:
    """Independent reference for the least-squares head (d, C): NumPy's SVD-based ``lstsq`` on X
    itself (never on X^T X), float64, minimum-norm when X is rank-deficient. With ``lam`` > 0 the
    ridge head ``(X^T X + lam I)^{-1} X^T Y`` from the augmented system [X; sqrt(lam) I] W = [Y; 0].
    One BLAS thread (:func:`_one_blas_thread`)."""
    check_positive("lam", lam, strict=False)
    xn = np.asarray(x.cpu() if isinstance(x, torch.Tensor) else x, dtype=np.float64)
    yn = np.eye(num_classes)[np.asarray(labels.cpu() if isinstance(labels, torch.Tensor) else labels)]
    if lam > 0:
        xn = np.vstack([xn, np.sqrt(lam) * np.eye(xn.shape[1])])
        yn = np.vstack([yn, np.zeros((xn.shape[1], num_classes))])
    return torch.from_numpy(np.linalg.lstsq(xn, yn, rcond=None)[0])


@_one_blas_thread
def qr_reference(x: Array, labels: Array, num_classes: int) -> torch.Tensor:
    """Independent reference for the least-squares head (d, C): a Householder QR of X's live columns
    (NumPy, float64; never X^T X), ``W = R^{-1} Q^T Y``; a column that is 0 in every sample gets weight 0
    (the minimum-norm choice). Needs the live columns to have full column rank; with fewer samples than
    live columns (n < d: X cannot have it, R is not square) the minimum-norm solution from NumPy's
    SVD-based ``lstsq`` on X instead (:func:`lstsq_reference`). One BLAS thread (:func:`_one_blas_thread`)."""
    xn = np.asarray(x.cpu() if isinstance(x, torch.Tensor) else x)
    yn = np.asarray(labels.cpu() if isinstance(labels, torch.Tensor) else labels)
    live = np.abs(xn).max(axis=0) > 0
    xl, targets = xn[:, live].astype(np.float64), np.eye(num_classes)[yn]
    w = np.zeros((xn.shape[1], num_classes))
    if xl.shape[0] < xl.shape[1]:
        w[live] = np.linalg.lstsq(xl, targets, rcond=None)[0]
    else:
        q, r = np.linalg.qr(xl)
        w[live] = np.linalg.solve(r, q.T @ targets)
    return torch.from_numpy(w)


def normal_equations_tolerance(condition: float, dtype: torch.dtype | str = torch.float64, safety: float = 2.0) -> float:
    """Tolerance for ``relative_error`` of a head solved from X^T X against an lstsq reference:
    ``safety * cond(X^T X) * eps(dtype)`` (first-order perturbation bound of a normal-equations solve:
    the Gram is formed and solved with relative errors ~ eps, amplified by its condition number)."""
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype.removeprefix("torch."))
    return safety * float(condition) * torch.finfo(dtype).eps


def gram_report(gram: torch.Tensor, rcond: float | None = None) -> dict:
    """Conditioning of a pooled Gram matrix (d, d) as a solve sees it.

    ``zero features``: rows exactly 0 (dead features, weight 0); ``rank``: numerical rank of the
    rest (equilibrated eigendecomposition, relative tolerance ``d * eps``, see :func:`ridge_solve`);
    ``lambda_min`` / ``lambda_max`` / ``condition number`` of the rest; the condition number is
    ``inf`` when the rest is rank-deficient (never negative).
    """
    g = (gram + gram.T) / 2
    dead = _decoupled(g) & (torch.diagonal(g) == 0)
    live = g[~dead][:, ~dead]
    if live.numel() == 0:
        return {"zero features": int(dead.sum()), "rank": 0, "lambda_min": 0.0, "lambda_max": 0.0,
                "condition number": float("inf")}
    rank, _ = numerical_rank(live, rcond)
    eig = torch.linalg.eigvalsh(live)
    lo, hi = float(eig[0]), float(eig[-1])
    full = rank == live.shape[0] and lo > 0
    return {"zero features": int(dead.sum()), "rank": rank, "lambda_min": lo, "lambda_max": hi,
            "condition number": hi / lo if full else float("inf")}


def relative_error(a, b) -> float:
    """``max|a - b| / max|b|`` (NumPy arrays or torch tensors of one shape, float64 arithmetic): ``a``'s
    deviation from the reference ``b``, the one error measure of the library's checks."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        a, b = torch.as_tensor(a).double(), torch.as_tensor(b).double().to(torch.as_tensor(a).device)
        return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.abs(a - b).max() / max(float(np.abs(b).max()), 1e-300))


def live_columns_with_bias(x_train: np.ndarray, x_test: np.ndarray, scale: float = 255.0):
    """Flatten images (N, ...) to rows, divide by ``scale``, drop the columns that are constant on the
    training set (they make the pooled X^T X singular) and append a bias column of ones.

    Returns ``(x_train (N, d'+1), x_test (N', d'+1), keep)`` with ``keep`` the (d,) mask of kept columns.
    """
    x = x_train.reshape(len(x_train), -1).astype(np.float64) / scale
    keep = x.max(axis=0) > x.min(axis=0)   # not std > 0: a constant column's std can round to 1e-18
    x = np.hstack([x[:, keep], np.ones((len(x), 1))])
    xt = np.hstack([x_test.reshape(len(x_test), -1)[:, keep] / scale, np.ones((len(x_test), 1))])
    return x, xt, keep
