"""Analytic Federated Learning (AFL; Zhuang et al., arXiv:2405.16240 v1).

Client k (Alg. 1, local stage) fits a ridge head on its frozen features and uploads
``{W_k^r, C_k^r, gamma}`` with ``C_k^r = X_k^T X_k + gamma I`` (eq. 14) and
``W_k^r = (C_k^r)^{-1} X_k^T Y_k`` (eq. 12). The server combines the uploads in one round:

* ``PairwiseAAServer``: the paper's recursive absolute-aggregation (AA) law, eqs. (9)-(10) with
  C -> C^r (Appendix C), **with the sign of the third term corrected** (the paper prints "-",
  the derivation and the authors' code give "+"; see ``aa_weights``).
* ``OneSolveServer``: the equivalent one-solve form from summed statistics,
  ``W^r = (sum_k C_k^r)^{-1} sum_k C_k^r W_k^r`` (eq. 56-57), O(K d^2 C + d^3) instead of O(K d^3).

Both end with the RI restoration (eq. 15), which removes the accumulated ``K gamma I`` and returns
the unregularized joint least-squares head ``(X^T X)^{-1} X^T Y``: weight-invariance (Thm. 1-2).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np
import torch
from tqdm import tqdm

from fedlib.core.linalg import Array, SufficientStats, as_tensor, numerical_rank, one_hot, ridge_solve
from fedlib.core.messages import Message
from fedlib.core.validate import check_choice, check_positive

SERVERS = ("pairwise", "one_solve")


def client_update(x: Array, labels: Array, num_classes: int, gamma: float = 1.0, client: str = "client",
                  dtype: torch.dtype = torch.float64, device: str | torch.device = "cpu") -> Message:
    """AFL local stage (Alg. 1) for one client with features x (N_k, d) and labels (N_k,).

    Returns the paper's upload ``{"W": W_k^r (d, C), "C": C_k^r (d, d), "gamma": gamma}``:
    ``C_k^r = X_k^T X_k + gamma I`` (eq. 14), ``W_k^r = (C_k^r)^{-1} X_k^T Y_k`` (eq. 12).
    When N_k < d the same W is computed in the dual form ``X_k^T (X_k X_k^T + gamma I)^{-1} Y_k``.
    With ``gamma = 0`` the head is the Moore-Penrose solution ``X_k^+ Y_k`` (eq. 4). An empty
    client (N_k = 0) uploads ``C = gamma I`` and ``W = 0``.
    """
    check_positive("gamma", gamma, strict=False)
    dim = int(x.shape[1])
    stats = SufficientStats.from_data(x, labels, num_classes, dtype, device) if len(labels) else \
        SufficientStats.zeros(dim, num_classes, dtype, device)
    eye = torch.eye(dim, dtype=dtype, device=device)
    n_k = len(labels)
    if gamma > 0 and 0 < n_k < dim:  # dual form X^T (X X^T + gamma I)^{-1} Y: O(N_k^2 d) not O(d^3)
        xk = as_tensor(x, dtype, device)
        weights = xk.T @ ridge_solve(xk @ xk.T, one_hot(labels, num_classes, dtype, device), gamma)
    elif gamma > 0:
        weights = ridge_solve(stats.gram, stats.xty, gamma)
    elif n_k:
        weights = torch.linalg.pinv(as_tensor(x, dtype, device)) @ one_hot(labels, num_classes, dtype, device)
    else:
        weights = torch.zeros(dim, num_classes, dtype=dtype, device=device)
    return Message(client, {"W": weights, "C": stats.gram + gamma * eye, "gamma": float(gamma)})


def aa_weights(c_agg: torch.Tensor, c_k: torch.Tensor, sign: int = +1, inverse: str = "solve"):
    """Matrix weights of the AA law (Thm. 1, eq. 8; eq. 10 for the recursive form).

    ``W_agg = I - R_a C_k + sign * R_a C_k S^{-1} C_k`` and
    ``W_k   = I - R_k C_a + sign * R_k C_a S^{-1} C_a`` with ``R = C^{-1}``, ``S = C_a + C_k``.
    ``sign=+1`` is the corrected law (then ``W_agg = S^{-1} C_a`` and ``W_agg + W_k = I``);
    ``sign=-1`` is the law as printed in the paper, kept to show that it fails.
    ``inverse="solve"`` applies ``R`` by linear solves; ``"pinv"`` by a pseudo-inverse, as the
    authors' dummy-data notebook does for rank-deficient ``C`` (gamma = 0).
    """
    if sign not in (1, -1):
        raise ValueError(f"sign must be +1 (corrected) or -1 (as printed), got {sign!r}")
    check_choice("inverse", inverse, ("solve", "pinv"))
    eye = torch.eye(c_agg.shape[0], dtype=c_agg.dtype, device=c_agg.device)
    inv_agg, inv_k, inv_s = (_inverse_applier(a, inverse, what) for a, what in
                             ((c_agg, "the aggregated C"), (c_k, "the client's C_k"), (c_agg + c_k, "C_agg + C_k")))
    ra_ck, rk_ca = inv_agg(c_k), inv_k(c_agg)
    w_agg = eye - ra_ck + sign * ra_ck @ inv_s(c_k)
    w_k = eye - rk_ca + sign * rk_ca @ inv_s(c_agg)
    return w_agg, w_k


def _inverse_applier(a: torch.Tensor, inverse: str, what: str = "matrix"):
    """``b -> a^{-1} b``: one Cholesky (LU if ``a`` is not positive definite) reused for every
    right-hand side, or a pseudo-inverse when ``inverse == "pinv"``. An exactly singular ``a``
    raises a ValueError that says what to do instead (not torch's raw LU error)."""
    if inverse == "pinv":
        a_pinv = torch.linalg.pinv(a, hermitian=True)
        return lambda b: a_pinv @ b
    factor, info = torch.linalg.cholesky_ex(a)
    if int(info) == 0:
        return lambda b: torch.cholesky_solve(b, factor)
    lu, pivots, info = torch.linalg.lu_factor_ex(a)
    if int(info) != 0:
        raise ValueError(_singular_message(what))
    return lambda b: torch.linalg.lu_solve(lu, pivots, b)


def _singular_message(what: str, rank: int | None = None, dim: int | None = None) -> str:
    detail = f" (numerical rank {rank} < d = {dim})" if rank is not None else ""
    return (f"the pairwise AA law inverts every client's Gram matrix, and {what} is singular{detail}: "
            "a client with fewer samples than features (N_k < d), collinear features or a feature that is "
            "0 in all its samples has no "
            "inverse at gamma = 0 (Thm. 1 assumes full column rank). Use gamma > 0 (the RI process, "
            "which removes gamma afterwards), server='one_solve' (exact at gamma = 0), or "
            "inverse='pinv' (the paper's Table 1 'w/o RI' recipe)")


class PairwiseAAServer:
    """Recursive AA law, eq. (9): ``W_agg,k = W_agg W_agg,k-1 + W_k W_k`` and ``C_agg,k = C_agg,k-1 + C_k``.

    Starts from the first upload (Alg. 1's ``C_agg,0 = 0`` cannot be inverted). Streaming:
    each upload is consumed and dropped, so K = 1000 clients at d = 1280 fit in memory.
    """

    def __init__(self, sign: int = +1, inverse: str = "solve"):
        self.sign, self.inverse = sign, inverse
        self.weights: torch.Tensor | None = None
        self.gram: torch.Tensor | None = None
        self.gamma_sum = 0.0
        self.count = 0

    def receive(self, msg: Message) -> None:
        w_k, c_k = msg["W"], msg["C"]
        if self.inverse == "solve" and msg["gamma"] == 0:
            # gamma = 0: C_k = X_k^T X_k may be singular; a Cholesky can still "succeed" on rounding
            # noise and return garbage, so test the rank (eigendecomposition, relative tolerance)
            rank, _ = numerical_rank(c_k)
            if rank < c_k.shape[0]:
                raise ValueError(_singular_message(f"{msg.sender}'s C_k", rank, c_k.shape[0]))
        if self.weights is None:
            self.weights, self.gram = w_k.clone(), c_k.clone()
        else:
            w_agg, w_kk = aa_weights(self.gram, c_k, self.sign, self.inverse)
            self.weights = w_agg @ self.weights + w_kk @ w_k
            self.gram = self.gram + c_k
        self.gamma_sum += msg["gamma"]
        self.count += 1

    def result(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Aggregated ``(W^r_agg,K (d, C), C^r_agg,K (d, d))``."""
        if self.weights is None:
            raise ValueError("the server has received no upload")
        return self.weights, self.gram


class OneSolveServer:
    """Summed statistics: ``C^r = sum_k C_k^r`` and ``B = sum_k C_k^r W_k^r (= sum_k X_k^T Y_k)``; one solve."""

    def __init__(self):
        self.gram: torch.Tensor | None = None
        self.rhs: torch.Tensor | None = None
        self.gamma_sum = 0.0
        self.count = 0

    def receive(self, msg: Message) -> None:
        w_k, c_k = msg["W"], msg["C"]
        if self.gram is None:
            self.gram, self.rhs = c_k.clone(), c_k @ w_k
        else:
            self.gram += c_k
            self.rhs.addmm_(c_k, w_k)
        self.gamma_sum += msg["gamma"]
        self.count += 1

    def result(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(W^r_agg,K = (C^r)^{-1} B (d, C), C^r_agg,K (d, d))``, identical to the recursive law."""
        if self.gram is None:
            raise ValueError("the server has received no upload")
        return ridge_solve(self.gram, self.rhs), self.gram


def make_server(server: str = "one_solve", sign: int = +1, inverse: str = "solve"):
    """``"pairwise"`` -> :class:`PairwiseAAServer`; ``"one_solve"`` -> :class:`OneSolveServer`."""
    check_choice("server", server, SERVERS)
    return PairwiseAAServer(sign, inverse) if server == "pairwise" else OneSolveServer()


def ri_restore(weights_r: torch.Tensor, gram_r: torch.Tensor, gamma_sum: float) -> torch.Tensor:
    """RI restoration, eq. (15): ``W = (C^r - K gamma I)^{-1} C^r W^r`` (K gamma = ``gamma_sum``).

    Needs the pooled ``X^T X = C^r - K gamma I`` to be non-singular.
    """
    if gamma_sum == 0:
        return weights_r
    return ridge_solve(gram_r, gram_r @ weights_r, -gamma_sum)


@dataclass
class AFLResult:
    """Outcome of one AFL run: the restored head and what it cost."""

    weights: torch.Tensor            # (d, C): RI-restored head (or W^r when restore=False)
    weights_regularized: torch.Tensor  # (d, C): W^r_agg,K before restoration
    gram_regularized: torch.Tensor   # (d, d): C^r_agg,K
    num_clients: int
    gamma_sum: float
    upload_bytes: list[int] = field(default_factory=list)
    client_seconds: float = 0.0
    server_seconds: float = 0.0

    @property
    def total_upload_bytes(self) -> int:
        return int(sum(self.upload_bytes))


def aggregate(uploads: Iterable[Message], server: str = "one_solve", restore: bool = True,
              sign: int = +1, inverse: str = "solve") -> AFLResult:
    """Aggregate already computed uploads (a list, or a generator to stream them)."""
    srv = make_server(server, sign, inverse)
    sizes, t_server = [], 0.0
    for msg in uploads:
        sizes.append(msg.nbytes)
        t0 = time.perf_counter()
        srv.receive(msg)
        t_server += time.perf_counter() - t0
    t0 = time.perf_counter()
    w_r, c_r = srv.result()
    weights = ri_restore(w_r, c_r, srv.gamma_sum) if restore else w_r
    t_server += time.perf_counter() - t0
    return AFLResult(weights, w_r, c_r, srv.count, srv.gamma_sum, sizes, 0.0, t_server)


def run_afl(x: Array, labels: Array, parts: Sequence[np.ndarray], num_classes: int, gamma: float = 1.0,
            server: str = "one_solve", restore: bool = True, order: Sequence[int] | None = None,
            sign: int = +1, inverse: str = "solve", dtype: torch.dtype = torch.float64,
            device: str | torch.device = "cpu", progress: bool = False) -> AFLResult:
    """Full AFL: every client of ``parts`` (index arrays into x (N, d) / labels (N,)) computes its
    upload, the server aggregates in ``order`` (default 0..K-1) and restores (eq. 15).

    Uploads are streamed: at most one client's matrices are alive at a time.
    """
    check_positive("gamma", gamma, strict=False)
    check_choice("server", server, SERVERS)
    order = list(range(len(parts))) if order is None else list(order)
    if sorted(order) != list(range(len(parts))):
        raise ValueError(f"order must be a permutation of range({len(parts)})")
    if server == "pairwise" and gamma == 0 and inverse == "solve":
        small = [k for k, p in enumerate(parts) if len(p) < int(x.shape[1])]
        if small:
            raise ValueError(_singular_message(f"C_k of {len(small)} client(s) with N_k < d = {int(x.shape[1])} "
                                               f"(e.g. client {small[0]}, N_k = {len(parts[small[0]])})"))
    x_dev = as_tensor(x, dtype, device)
    labels = np.asarray(labels)
    clock = {"client": 0.0}

    def uploads():
        for k in tqdm(order, desc=f"AFL clients ({server})", disable=not progress):
            t0 = time.perf_counter()
            idx = torch.as_tensor(np.asarray(parts[k], dtype=np.int64), device=x_dev.device)
            msg = client_update(x_dev[idx], labels[np.asarray(parts[k], dtype=np.int64)], num_classes,
                                gamma, f"client{k}", dtype, device)
            clock["client"] += time.perf_counter() - t0
            yield msg

    result = aggregate(uploads(), server, restore, sign, inverse)
    result.client_seconds = clock["client"]
    return result
