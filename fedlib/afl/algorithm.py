"""Analytic Federated Learning (AFL; Zhuang et al., arXiv:2405.16240 v1).

Client k (Alg. 1, local stage) fits a ridge head on its frozen features and uploads
``{W_k^r, C_k^r, gamma}`` with ``C_k^r = X_k^T X_k + gamma I`` (eq. 14) and
``W_k^r = (C_k^r)^{-1} X_k^T Y_k`` (eq. 12). The server combines the uploads in one round:

* ``PairwiseAAServer``: the paper's recursive absolute-aggregation (AA) law, eqs. (9)-(10) with
  C -> C^r (Appendix C), **with the sign of the third term corrected** (the paper prints "-",
  the derivation and the authors' code give "+"; see ``aa_weights``).
* ``OneSolveServer``: the equivalent one-solve form from summed statistics,
  ``W^r = (sum_k C_k^r)^{-1} sum_k C_k^r W_k^r`` (eq. 56-57), O(K d^2 C + d^3) instead of O(K d^3).

The symmetric ``C_k^r`` travels packed by default: only its upper triangle, ``d(d+1)/2`` numbers in
the row-major order of ``torch.triu_indices`` (entry ``"C_packed"``), about half of the paper's ``d^2``
(:func:`pack_symmetric`; ``packed=False`` uploads the paper's full ``"C"``, for the communication
table). Both servers take either form; the one-solve server adds packed uploads as they come and
unpacks once, at the end.

``statistics=True`` uploads ``B_k = X_k^T Y_k`` (entry ``"B"``, d x C) in place of ``W_k^r``: the same
bytes and the same information (``B_k = C_k^r W_k^r``; ``W_k^r = (C_k^r)^{-1} B_k``), but the
one-solve server then only sums what it reads (no ``C_k^r W_k^r`` product per upload); the pairwise
server solves for ``W_k^r`` itself. Not the paper's upload: an option, off by default.

Both end with the RI restoration (eq. 15), which removes the accumulated ``K gamma I`` and returns
the unregularized joint least-squares head ``(X^T X)^{-1} X^T Y``: weight-invariance (Thm. 1-2).

On the library's one protocol (:mod:`fedlib.core.protocol`): :class:`AFLClient` is the client
program, both servers implement ``broadcast`` (the empty :data:`~fedlib.core.protocol.EMPTY`: AFL
sends nothing down), ``receive(list)`` and ``result()``; :func:`run_afl` drives them with
:func:`~fedlib.core.protocol.simulate` and returns an :class:`AFLResult` with the measured
:class:`~fedlib.core.messages.Cost`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np
import torch

from fedlib.core.linalg import (Array, SufficientStats, _smallest_eig_estimate, as_tensor, numerical_rank, one_hot,
                                predict, relative_error, ridge_solve)
from fedlib.core.messages import Cost, Message
from fedlib.core.protocol import EMPTY, Server, simulate
from fedlib.core.uploads import Expected, Number, Tensor, check_uploads
from fedlib.core.validate import check_choice, check_positive

SERVERS = ("pairwise", "one_solve")


def client_update(x: Array, labels: Array, num_classes: int, gamma: float = 1.0, client: str = "client",
                  dtype: torch.dtype = torch.float64, device: str | torch.device = "cpu",
                  packed: bool = True, statistics: bool = False) -> Message:
    """AFL local stage (Alg. 1) for one client with features x (N_k, d) and labels (N_k,).

    Returns the upload ``{"W": W_k^r (d, C), "C_packed": upper triangle of C_k^r (d(d+1)/2,), "gamma"}``
    (``packed=False``: the paper's ``{"W", "C": C_k^r (d, d), "gamma"}``):
    ``C_k^r = X_k^T X_k + gamma I`` (eq. 14), ``W_k^r = (C_k^r)^{-1} X_k^T Y_k`` (eq. 12).
    ``C_k^r`` is symmetric, so its upper triangle (:func:`pack_symmetric`) carries all of it in
    ``d(d+1)/2`` numbers instead of ``d^2``; :func:`upload_gram` restores the full matrix.
    When N_k < d the same W is computed in the dual form ``X_k^T (X_k X_k^T + gamma I)^{-1} Y_k``.
    With ``gamma = 0`` the head is the Moore-Penrose solution ``X_k^+ Y_k`` (eq. 4). An empty
    client (N_k = 0) uploads ``C = gamma I`` and ``W = 0``. ``statistics=True``: ``"B": X_k^T Y_k``
    (d, C) in place of ``"W"`` (no local solve; see the module docstring).
    """
    check_positive("gamma", gamma, strict=False)
    dim, n_k = int(x.shape[1]), len(labels)
    if n_k:
        xk = as_tensor(x, dtype, device)
        targets = one_hot(labels, num_classes, dtype, device)
        # a packed upload whose head needs no d x d matrix (dual form, pinv) is formed block by block of the
        # triangle (packed_gram); otherwise X_k^T X_k in one product (chunked beyond 8192 rows)
        direct = packed and (statistics or n_k < dim or gamma == 0)
        gram = None if direct else xk.T @ xk if n_k <= 8192 else \
            SufficientStats.from_data(x, labels, num_classes, dtype, device).gram
    else:
        direct, gram = False, torch.zeros(dim, dim, dtype=dtype, device=device)
    if not n_k:      # an empty client: W = B = 0
        head = torch.zeros(dim, num_classes, dtype=dtype, device=device)
    elif statistics:   # B_k = X_k^T Y_k (= C_k^r W_k^r): no local solve
        head = xk.T @ targets
    elif gamma > 0 and n_k < dim:  # dual form X^T (X X^T + gamma I)^{-1} Y: O(N_k^2 d) not O(d^3)
        head = xk.T @ ridge_solve(xk @ xk.T, targets, gamma)
    elif gamma > 0:
        head = ridge_solve(xk.T @ xk if gram is None else gram, xk.T @ targets, gamma)
    else:
        head = torch.linalg.pinv(xk) @ targets
    head = {"B" if statistics else "W": head}
    if direct:   # the upper triangle of X_k^T X_k + gamma I from the rows of X_k (packed_gram)
        return Message(client, {**head, "C_packed": packed_gram(xk, shift=gamma), "gamma": float(gamma)})
    if packed:   # the upper triangle of X_k^T X_k + gamma I, read once (no d x d identity, no shifted copy)
        return Message(client, {**head, "C_packed": pack_symmetric(gram, shift=gamma), "gamma": float(gamma)})
    gram.diagonal().add_(gamma)   # C_k^r = X_k^T X_k + gamma I (eq. 14), in place: the same numbers
    return Message(client, {**head, "C": gram, "gamma": float(gamma)})


# ----------------------------------------------------------------------------------------------
# the packed symmetric upload: upper triangle, row-major (torch.triu_indices order)
# ----------------------------------------------------------------------------------------------
_TRIU_CACHE: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def _triu(dim: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    key = (int(dim), str(device))
    if key not in _TRIU_CACHE:
        rows, cols = torch.triu_indices(dim, dim, device=device)
        _TRIU_CACHE.clear()   # one size at a time: a d = 1280 pair is 13 MB
        _TRIU_CACHE[key] = rows, cols
    return _TRIU_CACHE[key]


def packed_length(dim: int) -> int:
    """Numbers in the packed upper triangle of a symmetric (dim, dim) matrix: ``dim (dim + 1) / 2``."""
    return dim * (dim + 1) // 2


def pack_symmetric(c: torch.Tensor, shift: float = 0.0) -> torch.Tensor:
    """The upper triangle (diagonal included) of a symmetric (d, d) ``c`` as a 1-D tensor of
    ``d(d+1)/2`` entries, row by row (the order of ``torch.triu_indices(d, d)``): ``c[0, 0:], c[1, 1:], ...``.
    Only the upper triangle is read (an asymmetric round-off below the diagonal is dropped).
    ``shift``: packs ``c + shift I`` instead (the diagonal entries plus ``shift``, the same numbers as
    packing the shifted matrix), without forming it. On the CPU a compiled row-by-row copy
    (:func:`_pack_block_loop` with the whole matrix as one block), elsewhere (or without numba) torch's
    indexing."""
    dim = c.shape[0]
    kernels = _kernels() if c.device.type == "cpu" and c.ndim == 2 and c.shape[1] == dim and dim else None
    if kernels is not None:
        out = torch.empty(packed_length(dim), dtype=c.dtype)
        kernels["block"](c.detach().contiguous().numpy(), 0, dim, float(shift), out.numpy())
        return out
    rows, cols = _triu(dim, c.device)
    out = c[rows, cols]
    if shift != 0:
        out[_diagonal_positions(dim, c.device)] += shift
    return out


#: rows of the triangle per block in :func:`packed_gram`
_GRAM_BLOCK = 64


def packed_gram(x: torch.Tensor, shift: float = 0.0) -> torch.Tensor:
    """The packed upper triangle (:func:`pack_symmetric`'s layout) of ``X^T X + shift I`` for X (n, d),
    without the d x d matrix: rows ``i0:i1`` of the triangle are one BLAS product
    ``X[:, i0:i1]^T X[:, i0:]`` (about half the multiply-adds of the full product), copied into place
    while in cache by a compiled loop (:func:`_pack_block_loop`). Without numba or off the CPU: the
    full product, then :func:`pack_symmetric`. Equal to packing the full product up to round-off."""
    kernels = _kernels() if x.device.type == "cpu" else None
    if kernels is None:
        return pack_symmetric(x.T @ x, shift=shift)
    dim = int(x.shape[1])
    out = torch.empty(packed_length(dim), dtype=x.dtype)
    target = out.numpy()
    for i0 in range(0, dim, _GRAM_BLOCK):
        block = x[:, i0:i0 + _GRAM_BLOCK].T @ x[:, i0:]
        kernels["block"](block.numpy(), i0, dim, float(shift), target)
    return out


def _pack_block_loop(block, i0, dim, shift, out):
    """Copy rows ``i0, i0 + 1, ...`` of the triangle from ``block`` (b, d - i0) = rows i0:i0+b of the
    symmetric matrix from column i0 on, into their packed segments of ``out``; ``shift`` added to the
    diagonal entries. NumPy arrays; compiled by numba (:func:`_kernels`)."""
    for r in range(block.shape[0]):
        i = i0 + r
        off = i * dim - (i * (i - 1)) // 2
        row = block[r]
        for j in range(dim - i):
            out[off + j] = row[r + j]
        if shift != 0.0:
            out[off] += shift


def _diagonal_positions(dim: int, device) -> torch.Tensor:
    """Indices of the diagonal entries in the packed upper triangle: ``i d - i (i - 1) / 2``."""
    i = torch.arange(dim, device=device)
    return i * dim - i * (i - 1) // 2


def unpack_symmetric(packed: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """The symmetric (d, d) matrix whose upper triangle is ``packed`` (see :func:`pack_symmetric`).
    ``dim`` defaults to the d with ``d(d+1)/2 = len(packed)``; a length that fits no d raises."""
    dim = packed_dim(packed) if dim is None else int(dim)
    if packed.ndim != 1 or packed.shape[0] != packed_length(dim):
        raise ValueError(f"a packed symmetric {dim} x {dim} matrix has {packed_length(dim)} entries "
                         f"(d(d+1)/2), got shape {tuple(packed.shape)}")
    rows, cols = _triu(dim, packed.device)
    out = torch.empty(dim, dim, dtype=packed.dtype, device=packed.device)
    out[rows, cols] = packed
    out[cols, rows] = packed
    return out


def packed_dim(packed) -> int:
    """d such that ``d(d+1)/2 = len(packed)``; ValueError when the length is not triangular."""
    n = int(np.shape(packed)[0]) if np.ndim(packed) == 1 else -1
    dim = int((np.sqrt(8 * n + 1) - 1) // 2) if n >= 0 else -1
    if n < 0 or packed_length(dim) != n:
        raise ValueError(f"a packed symmetric matrix is 1-D with d(d+1)/2 entries, got shape {tuple(np.shape(packed))}")
    return dim


def upload_gram(msg: Message) -> torch.Tensor:
    """``C_k^r`` (d, d) of an upload in either form (``"C"`` or ``"C_packed"``), checked (:func:`check_upload`)."""
    check_upload(msg)
    return msg["C"] if "C" in msg.payload else unpack_symmetric(msg["C_packed"], _head(msg).shape[0])


def upload_weights(msg: Message, c_k: torch.Tensor) -> torch.Tensor:
    """``W_k^r`` (d, C) of an upload: its ``"W"``, or ``(C_k^r)^+ B_k`` from a statistics upload."""
    return msg["W"] if "W" in msg.payload else ridge_solve(c_k, msg["B"], 0.0)


def _head(msg: Message):
    """The upload's (d, C) entry: ``"W"`` (the paper's) or ``"B"`` (``statistics=True``)."""
    return msg["W"] if "W" in msg.payload else msg["B"]


#: the four forms of an AFL upload: the head W_k^r (d, C) or B_k = X_k^T Y_k, beside C_k^r full (d, d)
#: or packed (d(d+1)/2,), and gamma >= 0 (eqs. 12, 14)
UPLOAD_FORMS = tuple({head: Tensor(("d", "C")), **gram, "gamma": Number(low=0.0)}
                     for head in ("W", "B")
                     for gram in ({"C": Tensor(("d", "d"))},
                                  {"C_packed": Tensor((lambda dims: packed_length(dims["d"]),))}))


def expected_upload(dim: int | None = None, num_classes: int | None = None) -> Expected:
    """What an AFL server accepts (:data:`UPLOAD_FORMS`); a size not given is fixed by the first upload."""
    return Expected(UPLOAD_FORMS, {"d": dim, "C": num_classes}, what="AFL upload")


def check_upload(msg: Message, dim: int | None = None, num_classes: int | None = None) -> None:
    """Refuse (ValueError naming the sender and entry) an upload that is not one of :data:`UPLOAD_FORMS`
    with finite values, d and C as given (or consistent within the upload)."""
    check_uploads([msg], expected_upload(dim, num_classes))


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


def aa_combine(c_agg: torch.Tensor, c_k: torch.Tensor, w_agg: torch.Tensor, w_k: torch.Tensor, sign: int = +1,
               inverse: str = "solve", inv_agg=None):
    """One step of the recursive AA law (eqs. 9-10): ``W_agg w_agg + W_k w_k`` with the matrix weights of
    :func:`aa_weights` (same ``sign`` and ``inverse``), applied to the heads w_agg, w_k (d, C) by
    associativity, so the d x d weights are never formed:
    ``W_agg w_agg = w_agg - R_a (u - sign C_k S^{-1} u)`` with ``u = C_k w_agg``, and
    ``W_k w_k = w_k - R_k (v - sign C_a S^{-1} v)`` with ``v = C_a w_k``. Besides the three
    factorizations (of C_agg, C_k and S = C_agg + C_k) every product is O(d^2 C), not O(d^3).

    ``inv_agg``: an applier of ``C_agg^{-1}`` already computed (the recursion's previous S is this
    step's C_agg). Returns ``(head (d, C), S, applier of S^{-1})``, the last to pass as the next
    step's ``inv_agg``.
    """
    if sign not in (1, -1):
        raise ValueError(f"sign must be +1 (corrected) or -1 (as printed), got {sign!r}")
    check_choice("inverse", inverse, ("solve", "pinv"))
    inv_agg = _inverse_applier(c_agg, inverse, "the aggregated C") if inv_agg is None else inv_agg
    inv_k = _inverse_applier(c_k, inverse, "the client's C_k")
    s = c_agg + c_k
    inv_s = _inverse_applier(s, inverse, "C_agg + C_k")
    u, v = c_k @ w_agg, c_agg @ w_k
    s_uv = inv_s(torch.cat([u, v], dim=1))
    n = u.shape[1]
    head = (w_agg - inv_agg(u - sign * (c_k @ s_uv[:, :n]))) + (w_k - inv_k(v - sign * (c_agg @ s_uv[:, n:])))
    return head, s, inv_s


def _inverse_applier(a: torch.Tensor, inverse: str, what: str = "matrix"):
    """``b -> a^{-1} b``: one Cholesky (LU if ``a`` is not positive definite) reused for every
    right-hand side, or a pseudo-inverse when ``inverse == "pinv"`` (:func:`_pinv_applier`). An
    exactly singular ``a`` raises a ValueError that says what to do instead (not torch's raw LU error)."""
    if inverse == "pinv":
        return _pinv_applier(a)
    factor, info = torch.linalg.cholesky_ex(a)
    if int(info) == 0:
        return lambda b: torch.cholesky_solve(b, factor)
    lu, pivots, info = torch.linalg.lu_factor_ex(a)
    if int(info) != 0:
        raise ValueError(_singular_message(what))
    return lambda b: torch.linalg.lu_solve(lu, pivots, b)


def _pinv_applier(a: torch.Tensor):
    """``b -> pinv(a) b`` for a symmetric (d, d) ``a``, as ``torch.linalg.pinv(a, hermitian=True) @ b``
    (eigenvalues with ``|lambda| <= d eps max|lambda|`` dropped) without forming the pseudo-inverse:
    one eigendecomposition, applied in O(d^2 C). Where ``a`` is clearly positive definite - its
    Cholesky factorization succeeds and the inverse-iteration estimate of its smallest eigenvalue
    exceeds that cutoff (relative to the Gershgorin bound on the largest) 1000-fold, the screen of
    :func:`~fedlib.core.linalg.ridge_solve` - no eigenvalue is dropped, ``pinv(a) = a^{-1}``, and
    the Cholesky factor applies it (to round-off, the same numbers)."""
    rtol = a.shape[0] * torch.finfo(a.dtype).eps
    factor, info = torch.linalg.cholesky_ex(a)
    if int(info) == 0 and _smallest_eig_estimate(factor) > 1e3 * rtol * float(a.abs().sum(1).max()):
        return lambda b: torch.cholesky_solve(b, factor)
    lam, vec = torch.linalg.eigh(a)
    keep = lam.abs() > rtol * float(lam.abs().max()) if lam.numel() else lam.bool()
    lam, vec = lam[keep], vec[:, keep]
    return lambda b: vec @ ((vec.T @ b) / lam[:, None])


def _singular_message(what: str, rank: int | None = None, dim: int | None = None) -> str:
    detail = f" (numerical rank {rank} < d = {dim})" if rank is not None else ""
    return (f"the pairwise AA law inverts every client's Gram matrix, and {what} is singular{detail}: "
            "a client with fewer samples than features (N_k < d), collinear features or a feature that is "
            "0 in all its samples has no "
            "inverse at gamma = 0 (Thm. 1 assumes full column rank). Use gamma > 0 (the RI process, "
            "which removes gamma afterwards), server='one_solve' (exact at gamma = 0), or "
            "inverse='pinv' (the paper's Table 1 'w/o RI' recipe)")


class _AAServerBase(Server):
    """What both AFL servers share: the one-shot broadcast (nothing is sent), the check of every upload
    against the sizes d and C (given, or fixed by the first upload), the loop over a round's uploads
    and the bookkeeping of K, sum gamma, upload sizes and server seconds."""

    def __init__(self, dim: int | None = None, num_classes: int | None = None):
        self.dim, self.num_classes = dim, num_classes
        self.gamma_sum = 0.0
        self.count = 0
        self.upload_bytes: list[int] = []
        self.seconds = 0.0

    def broadcast(self) -> Message:
        """AFL's clients need nothing from the server (Alg. 1 is one upload): :data:`EMPTY`, 0 bytes."""
        return EMPTY

    def expects(self) -> Expected:
        return expected_upload(self.dim, self.num_classes)

    def absorb(self, messages: Sequence[Message]) -> None:
        """Absorb uploads ``{"W", "C", "gamma"}`` in the order given (the aggregation order)."""
        t0 = time.perf_counter()
        for msg in messages:
            self.dim, self.num_classes = (int(n) for n in _head(msg).shape)
            self._absorb(msg)
            self.gamma_sum += float(msg["gamma"])
            self.count += 1
            self.upload_bytes.append(msg.nbytes)
        self.seconds += time.perf_counter() - t0

    def _absorb(self, msg: Message) -> None:
        raise NotImplementedError


class PairwiseAAServer(_AAServerBase):
    """Recursive AA law, eq. (9): ``W_agg,k = W_agg W_agg,k-1 + W_k W_k`` and ``C_agg,k = C_agg,k-1 + C_k``.

    Starts from the first upload (Alg. 1's ``C_agg,0 = 0`` cannot be inverted). Streaming:
    each upload is consumed and dropped, so K = 1000 clients at d = 1280 fit in memory. Each step
    applies the law's matrix weights to the heads (:func:`aa_combine`, O(d^2 C) products) and
    reuses the factorization of ``S = C_agg + C_k`` as the next step's ``C_agg^{-1}`` (the same
    matrix), so a step costs two factorizations (of C_k and of S), O(d^3) as in the paper.
    """

    def __init__(self, sign: int = +1, inverse: str = "solve", dim: int | None = None,
                 num_classes: int | None = None):
        super().__init__(dim, num_classes)
        self.sign, self.inverse = sign, inverse
        self.weights: torch.Tensor | None = None
        self.gram: torch.Tensor | None = None
        self._inv_gram = None   # applier of C_agg^{-1}, from the previous step (aa_combine)

    def _absorb(self, msg: Message) -> None:
        c_k = msg["C"] if "C" in msg.payload else unpack_symmetric(msg["C_packed"], self.dim)
        if self.inverse == "solve" and msg["gamma"] == 0:
            # gamma = 0: C_k = X_k^T X_k may be singular; a Cholesky can still "succeed" on rounding
            # noise and return garbage, so test the rank (eigendecomposition, relative tolerance)
            rank, _ = numerical_rank(c_k)
            if rank < c_k.shape[0]:
                raise ValueError(_singular_message(f"{msg.sender}'s C_k", rank, c_k.shape[0]))
        w_k = upload_weights(msg, c_k)
        if self.weights is None:
            self.weights, self.gram, self._inv_gram = w_k.clone(), c_k.clone(), None
        else:   # the law applied to the heads (aa_combine); this step's S is the next step's C_agg
            self.weights, self.gram, self._inv_gram = aa_combine(self.gram, c_k, self.weights, w_k, self.sign,
                                                                 self.inverse, self._inv_gram)

    def result(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Aggregated ``(W^r_agg,K (d, C), C^r_agg,K (d, d))``."""
        if self.weights is None:
            raise ValueError("the server has received no upload")
        return self.weights, self.gram


class OneSolveServer(_AAServerBase):
    """Summed statistics: ``C^r = sum_k C_k^r`` and ``B = sum_k C_k^r W_k^r (= sum_k X_k^T Y_k)``; one
    solve (eqs. 56-57).

    Per upload the server must read ``C_k^r`` once (the memory-bandwidth floor) and form
    ``C_k^r W_k^r`` (``d^2 C`` multiply-adds). Both are done in one pass over the upload
    (compiled loops, :func:`_absorb_packed` / :func:`_absorb_full`), not as an addition followed by
    a separate matrix product. A packed upload (``"C_packed"``, the upper triangle) is added to a
    packed sum, each off-diagonal entry serving ``B[i]`` and ``B[j]``: it is read once and never
    unpacked; ``result()`` unpacks the sum once. A full upload (``"C"``, the paper's form) is added
    row by row, each row's dot products with W formed while it is in cache. A statistics upload
    (``"B"`` = C_k^r W_k^r already) is only added: the Gram entry and B, each read once. All forms may
    be mixed in one round.
    """

    def __init__(self, dim: int | None = None, num_classes: int | None = None):
        super().__init__(dim, num_classes)
        self.gram_full: torch.Tensor | None = None     # (d, d): sum of the full uploads' C_k^r
        self.rhs_full_t: torch.Tensor | None = None    # (C, d): their sum of (C_k^r W_k^r)^T
        self.gram_packed: torch.Tensor | None = None   # (d(d+1)/2,): sum of the packed uploads' triangles
        self.rhs_packed_t: torch.Tensor | None = None  # (C, d): their sum of (C_k^r W_k^r)^T

    def _absorb(self, msg: Message) -> None:
        head = _head(msg)
        packed = "C_packed" in msg.payload
        c_k = msg["C_packed" if packed else "C"]
        if (self.gram_packed if packed else self.gram_full) is None:
            sums = torch.zeros_like(c_k), torch.zeros(head.shape[1], head.shape[0], dtype=c_k.dtype, device=c_k.device)
            if packed:
                self.gram_packed, self.rhs_packed_t = sums
            else:
                self.gram_full, self.rhs_full_t = sums
        gram, rhs_t = (self.gram_packed, self.rhs_packed_t) if packed else (self.gram_full, self.rhs_full_t)
        if "B" in msg.payload:   # a statistics upload: C_k^r W_k^r already formed, only sums
            gram += c_k
            rhs_t += head.T
        else:
            (_absorb_packed if packed else _absorb_full)(gram, rhs_t, c_k, head)

    @property
    def gram(self) -> torch.Tensor | None:
        """``C^r = sum_k C_k^r`` (d, d) of the uploads so far (the packed sum unpacked), or None."""
        if self.gram_packed is None:
            return self.gram_full
        gram = unpack_symmetric(self.gram_packed, self.rhs_packed_t.shape[1])
        return gram if self.gram_full is None else gram + self.gram_full

    @property
    def rhs(self) -> torch.Tensor | None:
        """``B = sum_k C_k^r W_k^r`` (d, C) of the uploads so far, or None."""
        parts = [r.T for r in (self.rhs_full_t, self.rhs_packed_t) if r is not None]
        if not parts:
            return None
        return parts[0].contiguous() if len(parts) == 1 else parts[0] + parts[1]

    def result(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(W^r_agg,K = (C^r)^{-1} B (d, C), C^r_agg,K (d, d))``, identical to the recursive law."""
        if self.gram_full is None and self.gram_packed is None:
            raise ValueError("the server has received no upload")
        t0 = time.perf_counter()
        gram = self.gram
        out = ridge_solve(gram, self.rhs), gram
        self.seconds += time.perf_counter() - t0
        return out


def _absorb_packed_loop(gp, rt, p, wt, m0, m1, q0, q1):
    """``gp[q0:q1] += p[q0:q1]`` and rows ``m0:m1`` of ``rt += (S W)^T`` for the symmetric S whose upper
    triangle is ``p`` (row-major, :func:`pack_symmetric`), in one pass over ``p``: row i's segment
    ``S[i, i:]`` gives ``B[i] += S[i, i:] W[i:]`` and, off the diagonal, ``B[j] += S[i, j] W[i]`` (j > i).
    NumPy arrays: gp, p (d(d+1)/2,); wt, rt (C, d) (W and B transposed, so every inner loop runs
    over contiguous memory). Threads given disjoint ``m0:m1`` and ``q0:q1`` never write the same
    entry. Compiled by numba (:func:`_kernels`)."""
    dim = wt.shape[1]
    off = 0
    for i in range(dim):
        n = dim - i
        for q in range(max(off, q0), min(off + n, q1)):
            gp[q] += p[q]
        for m in range(m0, m1):
            w_m = wt[m]
            r_m = rt[m]
            w_i = w_m[i]
            acc = p[off] * w_i
            for jj in range(1, n):
                v = p[off + jj]
                acc += v * w_m[i + jj]
                r_m[i + jj] += v * w_i
            r_m[i] += acc
        off += n


def _absorb_full_loop(g, rt, c, wt, i0, i1):
    """Rows ``i0:i1`` of ``g += c`` and of ``rt += (c W)^T`` (columns i0:i1 of rt), one pass over
    those rows of ``c`` (d, d): each row is added and its C dot products with ``W`` are formed while it
    is in cache. NumPy arrays: g, c (d, d); wt, rt (C, d). Threads given disjoint row ranges never
    write the same entry. Compiled by numba (:func:`_kernels`)."""
    num_classes, dim = wt.shape
    for i in range(i0, i1):
        c_i = c[i]
        g_i = g[i]
        for j in range(dim):
            g_i[j] += c_i[j]
        for m in range(num_classes):
            w_m = wt[m]
            acc = 0.0
            for j in range(dim):
                acc += c_i[j] * w_m[j]
            rt[m, i] += acc


_KERNELS: dict = {}
_POOL: list = []


def _kernels() -> dict | None:
    """``{"packed": ..., "full": ...}``: :func:`_absorb_packed_loop` and :func:`_absorb_full_loop`
    compiled by numba (a dependency of umap-learn; cached on disk after the first compilation; they
    release the GIL), or None where numba is missing (then the torch fallback runs)."""
    if "packed" not in _KERNELS:
        try:
            import numba

            # reassociation lets the row sums vectorize; no finite-math assumption (NaN stays NaN)
            jit = numba.njit(cache=True, nogil=True, boundscheck=False, fastmath={"reassoc", "contract"})
            _KERNELS.update(packed=jit(_absorb_packed_loop), full=jit(_absorb_full_loop),
                            block=numba.njit(cache=True, nogil=True, boundscheck=False)(_pack_block_loop))
        except ImportError:  # pragma: no cover - numba comes with umap-learn
            _KERNELS.update(packed=None, full=None, block=None)
        else:   # load (or compile) the float64 versions now, on 1 x 1 inputs, not inside a measured run
            one, row, vec = np.ones((1, 1)), np.ones((1, 1)), np.ones(1)
            _KERNELS["packed"](vec.copy(), row.copy(), vec, row, 0, 1, 0, 1)
            _KERNELS["full"](one.copy(), row.copy(), one, row, 0, 1)
            _KERNELS["block"](one, 0, 1, 0.0, vec.copy())
    return _KERNELS if _KERNELS["packed"] is not None else None


def _in_threads(kernel, args: tuple, ranges: list[tuple]) -> None:
    """``kernel(*args, *r)`` for every ``r`` of ``ranges``, the first in this thread and the others in
    a pool (the compiled kernels release the GIL)."""
    if len(ranges) == 1:
        kernel(*args, *ranges[0])
        return
    import os

    if not _POOL or _POOL[0][0] < len(ranges) - 1 or _POOL[0][2] != os.getpid():   # new pool after a fork
        from concurrent.futures import ThreadPoolExecutor

        _POOL[:] = [(len(ranges) - 1, ThreadPoolExecutor(len(ranges) - 1, thread_name_prefix="afl-server"), os.getpid())]
    jobs = [_POOL[0][1].submit(kernel, *args, *r) for r in ranges[1:]]
    kernel(*args, *ranges[0])
    for job in jobs:
        job.result()


def _host_arrays(acc: torch.Tensor, c: torch.Tensor, w: torch.Tensor):
    """NumPy views of ``c`` (contiguous) and ``W^T`` (contiguous) in the accumulator's dtype."""
    return (c.detach().to(acc.dtype).contiguous().numpy(), w.detach().to(acc.dtype).T.contiguous().numpy())


def _kernel_sizes(rhs_t: torch.Tensor, w_k: torch.Tensor) -> tuple[int, int]:
    """(d, C) of the sums ``rhs_t`` (C, d), checked against the head ``w_k`` (d, C): the compiled loops
    index without bounds checks, so every size they read is checked here first."""
    _require(rhs_t.ndim == 2 and tuple(w_k.shape) == tuple(rhs_t.shape)[::-1], "head", rhs_t.T, w_k)
    return int(rhs_t.shape[1]), int(rhs_t.shape[0])


def _require(ok: bool, what: str, held: torch.Tensor, got: torch.Tensor) -> None:
    if not ok:
        raise ValueError(f"the one-solve server holds a {what} of shape {tuple(held.shape)}; "
                         f"cannot add one of shape {tuple(got.shape)}")


def _absorb_packed(gram_packed: torch.Tensor, rhs_t: torch.Tensor, p_k: torch.Tensor, w_k: torch.Tensor) -> None:
    """Add a packed upload to the one-solve server's sums: ``gram_packed += p_k`` and
    ``rhs_t += (C_k W_k)^T`` with ``C_k`` symmetric of upper triangle ``p_k``, in place.

    On the CPU: the compiled one-pass kernel, split over ``torch.get_num_threads()`` threads by
    classes (each thread also adds its share of the packed sum); deterministic (no two threads
    write one entry). Elsewhere, or without numba: unpack, add and multiply with torch.
    """
    dim, num_classes = _kernel_sizes(rhs_t, w_k)
    _require(gram_packed.shape == p_k.shape == (packed_length(dim),), "packed Gram", gram_packed, p_k)
    kernels = _kernels() if p_k.device.type == "cpu" else None
    if kernels is None:
        gram_packed += p_k
        rhs_t.T.addmm_(unpack_symmetric(p_k, w_k.shape[0]), w_k.to(rhs_t.dtype))
        return
    p, wt = _host_arrays(gram_packed, p_k, w_k)
    num_classes, total = wt.shape[0], p.shape[0]
    threads = max(1, min(torch.get_num_threads(), num_classes))
    ranges = [(num_classes * t // threads, num_classes * (t + 1) // threads, total * t // threads,
               total * (t + 1) // threads) for t in range(threads)]
    _in_threads(kernels["packed"], (gram_packed.numpy(), rhs_t.numpy(), p, wt), ranges)


def _absorb_full(gram: torch.Tensor, rhs_t: torch.Tensor, c_k: torch.Tensor, w_k: torch.Tensor) -> None:
    """Add a full upload to the one-solve server's sums: ``gram += c_k`` and ``rhs_t += (c_k W_k)^T``,
    in place; on the CPU the compiled one-pass kernel over ``torch.get_num_threads()`` row ranges,
    elsewhere (or without numba) torch's addition and matrix product."""
    dim, num_classes = _kernel_sizes(rhs_t, w_k)
    _require(gram.shape == c_k.shape == (dim, dim), "Gram", gram, c_k)
    kernels = _kernels() if c_k.device.type == "cpu" else None
    if kernels is None:
        gram += c_k
        rhs_t.T.addmm_(c_k, w_k.to(rhs_t.dtype))
        return
    c, wt = _host_arrays(gram, c_k, w_k)
    dim = c.shape[0]
    threads = max(1, min(torch.get_num_threads(), dim))
    ranges = [(dim * t // threads, dim * (t + 1) // threads) for t in range(threads)]
    _in_threads(kernels["full"], (gram.numpy(), rhs_t.numpy(), c, wt), ranges)


def make_server(server: str = "one_solve", sign: int = +1, inverse: str = "solve", dim: int | None = None,
                num_classes: int | None = None):
    """``"pairwise"`` -> :class:`PairwiseAAServer`; ``"one_solve"`` -> :class:`OneSolveServer`; uploads must
    have features ``dim`` and classes ``num_classes`` (None: as the first upload's)."""
    check_choice("server", server, SERVERS)
    return PairwiseAAServer(sign, inverse, dim, num_classes) if server == "pairwise" else \
        OneSolveServer(dim, num_classes)


def ri_restore(weights_r: torch.Tensor, gram_r: torch.Tensor, gamma_sum: float) -> torch.Tensor:
    """RI restoration, eq. (15): ``W = (C^r - K gamma I)^{-1} C^r W^r`` (K gamma = ``gamma_sum``).

    Needs the pooled ``X^T X = C^r - K gamma I`` to be non-singular.
    """
    if gamma_sum == 0:
        return weights_r
    return ridge_solve(gram_r, gram_r @ weights_r, -gamma_sum)


@dataclass
class AFLResult:
    """Outcome of one AFL run: the restored head and what it cost (measured)."""

    weights: torch.Tensor            # (d, C): RI-restored head (or W^r when restore=False)
    weights_regularized: torch.Tensor  # (d, C): W^r_agg,K before restoration
    gram_regularized: torch.Tensor   # (d, d): C^r_agg,K
    num_clients: int
    gamma_sum: float
    cost: Cost = field(default_factory=Cost)      # bytes up / down and seconds (clients + server)
    upload_bytes: list[int] = field(default_factory=list)   # measured size of each upload, in order
    server_seconds: float = 0.0      # the server's share of ``cost.seconds`` (aggregation + restoration)

    @property
    def total_upload_bytes(self) -> int:
        return self.cost.bytes_up


def _finish(srv, restore: bool, cost: Cost) -> AFLResult:
    """Server result (+ RI restoration, eq. 15) as an :class:`AFLResult`; restoration time counted."""
    t0 = time.perf_counter()
    w_r, c_r = srv.result()
    weights = ri_restore(w_r, c_r, srv.gamma_sum) if restore else w_r
    restore_seconds = time.perf_counter() - t0
    cost.seconds += restore_seconds
    return AFLResult(weights, w_r, c_r, srv.count, srv.gamma_sum, cost, list(srv.upload_bytes),
                     srv.seconds + restore_seconds)


def aggregate(uploads: Iterable[Message], server: str = "one_solve", restore: bool = True,
              sign: int = +1, inverse: str = "solve") -> AFLResult:
    """The server side only, on already computed uploads (a list, or a generator to stream them).

    ``cost.bytes_up`` is the sum of the uploads' sizes; ``cost.seconds`` the server's time.
    """
    srv = make_server(server, sign, inverse)
    for msg in uploads:
        srv.receive([msg])
    return _finish(srv, restore, Cost(bytes_up=sum(srv.upload_bytes), seconds=srv.seconds))


@dataclass
class AFLClient:
    """AFL's client program (Alg. 1, local stage) for :func:`fedlib.core.protocol.simulate`.

    ``step((x_k (N_k, d), labels_k (N_k,)), state, broadcast)`` returns :func:`client_update`'s
    upload ``{W_k^r, C_k^r, gamma}`` (eqs. 12, 14), ``C_k^r`` packed unless ``packed=False``, ``B_k``
    in place of ``W_k^r`` when ``statistics``; the broadcast is empty and the state holds only the
    client's name.
    """

    num_classes: int
    gamma: float = 1.0
    dtype: torch.dtype = torch.float64
    device: str | torch.device = "cpu"
    packed: bool = True
    statistics: bool = False

    def init_state(self, k: int) -> dict:
        return {"name": f"client{k}"}

    def step(self, data, state: dict, broadcast: Message) -> Message:
        x, labels = data
        return client_update(x, labels, self.num_classes, self.gamma, state["name"], self.dtype, self.device,
                             self.packed, self.statistics)


class ClientRows(Sequence):
    """``data[k]`` = client k's ``(x_k, labels_k)``, sliced on demand (no copy of all clients at once)."""

    def __init__(self, x: torch.Tensor, labels: np.ndarray, parts: Sequence[np.ndarray]):
        self.x, self.labels, self.parts = x, labels, parts

    def __len__(self) -> int:
        return len(self.parts)

    def __getitem__(self, k):
        idx = np.asarray(self.parts[k], dtype=np.int64)
        return self.x[torch.as_tensor(idx, device=self.x.device)], self.labels[idx]


def run_afl(x: Array, labels: Array, parts: Sequence[np.ndarray], num_classes: int, gamma: float = 1.0,
            server: str = "one_solve", restore: bool = True, order: Sequence[int] | None = None,
            sign: int = +1, inverse: str = "solve", dtype: torch.dtype = torch.float64,
            device: str | torch.device = "cpu", progress: bool = False, one_round: bool = False,
            packed: bool = True, statistics: bool = False) -> AFLResult:
    """Full AFL on :func:`fedlib.core.protocol.simulate`: every client of ``parts`` (index arrays into
    x (N, d) / labels (N,)) runs :class:`AFLClient`, the server aggregates in ``order`` (default
    0..K-1) and restores (eq. 15). Returns an :class:`AFLResult` whose ``cost`` is measured.

    AFL is one communication round (each client uploads once, the broadcast is empty). The simulator
    delivers that round's uploads one client at a time (K steps of one participant, in ``order``), so
    at most one client's d x d matrix is alive: K = 1000 clients at d = 1280 fit in memory.
    ``one_round=True`` delivers all K uploads in one round instead (as between processes, e.g. on
    Flower: one exchange, not K); the server absorbs them in the same order, so the result is identical.
    ``packed=False`` uploads the paper's full ``C_k^r`` (d, d) instead of its upper triangle: the same
    head (to round-off), about twice the upload bytes. ``statistics=True`` uploads ``B_k = X_k^T Y_k``
    in place of ``W_k^r`` (:func:`client_update`): the same head and bytes, less server work.
    """
    check_positive("gamma", gamma, strict=False)
    check_choice("server", server, SERVERS)
    order = list(range(len(parts))) if order is None else [int(k) for k in order]
    if sorted(order) != list(range(len(parts))):
        raise ValueError(f"order must be a permutation of range({len(parts)})")
    if server == "pairwise" and gamma == 0 and inverse == "solve":
        small = [k for k, p in enumerate(parts) if len(p) < int(x.shape[1])]
        if small:
            raise ValueError(_singular_message(f"C_k of {len(small)} client(s) with N_k < d = {int(x.shape[1])} "
                                               f"(e.g. client {small[0]}, N_k = {len(parts[small[0]])})"))
    srv = make_server(server, sign, inverse, int(x.shape[1]), num_classes)
    _kernels()   # the one-off import and load of the compiled loops stays out of the measured seconds
    data = ClientRows(as_tensor(x, dtype, device), np.asarray(labels), parts)
    client = AFLClient(num_classes, gamma, dtype, device, packed, statistics)
    if one_round:
        if order != sorted(order):
            raise ValueError("one_round delivers the uploads in client order: order must be 0..K-1")
        cost = simulate(srv, client, data, rounds=1)
    else:
        cost = simulate(srv, client, data, rounds=len(order), participants=lambda r: [order[r - 1]],
                        progress=progress, desc=f"AFL clients ({server})")
    return _finish(srv, restore, cost)


# ----------------------------------------------------------------------------------------------
# the benchmark's protocol (notebooks/afl_benchmark.py): fixed partitions, gradient baselines
# ----------------------------------------------------------------------------------------------
SETTING_KINDS = ("alpha", "shards", "iid")


def setting_label(setting: tuple) -> str:
    """``("alpha", 0.1)`` -> "α=0.1" (NIID-1), ``("shards", 2)`` -> "s=2" (NIID-2), ``("iid", None)`` -> "IID"."""
    kind, value = setting
    check_choice("setting kind", kind, SETTING_KINDS)
    return {"alpha": f"α={value}", "shards": f"s={value}", "iid": "IID"}[kind]


class SettingPartitions:
    """``partitions(setting, k, seed)``: client index arrays of ``labels`` (N,) for a setting
    ``("alpha", a)`` (Dirichlet label skew), ``("shards", s)`` (s shards per client) or ``("iid", None)``,
    drawn once per (setting, k, seed) and reused, so every method of a comparison shares them."""

    def __init__(self, labels):
        self.labels = np.asarray(labels)
        self._cache: dict[tuple, list[np.ndarray]] = {}

    def __call__(self, setting: tuple, k: int, seed: int) -> list[np.ndarray]:
        from fedlib.data.partition import make_partition

        key = (tuple(setting), int(k), int(seed))
        if key not in self._cache:
            kind, value = setting
            check_choice("setting kind", kind, SETTING_KINDS)
            if kind == "alpha":
                parts = make_partition(self.labels, k, "dirichlet", alpha=value, seed=seed)
            elif kind == "shards":
                parts = make_partition(self.labels, k, "shards", shards_per_client=value, seed=seed)
            else:
                parts = make_partition(self.labels, k, "iid", seed=seed)
            self._cache[key] = parts
        return self._cache[key]

    def draw_all(self, settings: Sequence[tuple], ks: Sequence[int], seeds: Sequence[int]) -> None:
        """Draw (and cache) the partition of every (setting, K, seed) combination now, so that a bad
        setting fails in seconds, before any feature extraction or training."""
        for setting in settings:
            for k in ks:
                for seed in seeds:
                    self(setting, k, seed)


class RunCache:
    """Runs shared between a chapter's cells: a run asked for again - the same partition, method,
    training seed, settings and data - is computed once and returned again (``hits`` counts the
    reuses). AFL results are keyed by (partition, gamma, device, features), gradient-baseline
    histories by (partition, method, seed, ``FedConfig`` settings, MOON width, data). A partition is
    the list object :class:`SettingPartitions` returns for a (setting, K, seed), and the data are
    tensors by storage; both are held here, so their identities stay valid while the cache lives.
    """

    def __init__(self):
        self._afl: dict = {}
        self._federated: dict = {}
        self._x64: dict = {}
        self.hits = 0

    def afl(self, feats, parts, gamma: float, device) -> "AFLResult":
        """:func:`run_afl` on ``feats`` (x_train, y_train, num_classes) split by ``parts``, at ``gamma``
        (the float64 copy of the features that :func:`run_afl` slices is made once per features)."""
        key = (id(parts), float(gamma), str(device), id(feats))
        if key in self._afl:
            self.hits += 1
        else:
            xkey = (id(feats), str(device))
            if xkey not in self._x64:
                self._x64[xkey] = (feats, as_tensor(feats.x_train, torch.float64, device))
            self._afl[key] = (parts, feats, run_afl(self._x64[xkey][1], feats.y_train, parts, feats.num_classes,
                                                    gamma=gamma, device=device))
        return self._afl[key][2]

    def federated(self, method: str, parts, seed: int, config: dict, moon_hidden, train, test, num_classes: int):
        """:func:`~fedlib.federated.gradient.run_federated` of ``method`` with ``FedConfig(seed=seed,
        **config)`` on ``train`` = (x (N, d), y (N,)) tensors split by ``parts``, evaluated on ``test``."""
        return self.federated_many([(method, parts, seed)], config, moon_hidden, train, test, num_classes)[0]

    def federated_many(self, runs, config: dict, moon_hidden, train, test, num_classes: int, workers: int = 1,
                       desc: str | None = None, progress: bool = False) -> list:
        """:meth:`federated` of every ``(method, parts, seed)`` of ``runs``; the histories in that order.
        The runs not held yet go to ``workers`` forked processes (:func:`fedlib.core.parallel.fork_map`):
        each is seeded by its own FedConfig, so the histories equal those run one by one (tested)."""
        from fedlib.core.parallel import fork_map
        from fedlib.federated.gradient import FedConfig, make_algorithm, run_federated

        x_tr, y_tr = train
        data = tuple((t.data_ptr(), tuple(t.shape), str(t.dtype)) for t in (*train, *test))
        items = tuple(sorted(config.items()))
        keys = [(id(parts), method, int(seed), items, moon_hidden if method == "moon" else None, data)
                for method, parts, seed in runs]
        missing: dict = {}
        for key, run in zip(keys, runs):
            if key in self._federated or key in missing:
                self.hits += 1
            else:
                missing[key] = run

        def one(run):
            method, parts, seed = run
            return run_federated(baseline_model_fn(method, int(x_tr.shape[1]), num_classes, moon_hidden),
                                 [(x_tr[p], y_tr[p]) for p in parts], test, make_algorithm(method),
                                 FedConfig(seed=seed, **config), progress=False)

        for (key, (_, parts, _)), hist in zip(missing.items(), fork_map(one, list(missing.values()), workers,
                                                                        desc=desc, progress=progress)):
            self._federated[key] = (parts, train, test, hist)
        return [self._federated[key][3] for key in keys]


def baseline_model_fn(method: str, dim: int, num_classes: int, moon_hidden: int | None = None):
    """Model factory of a gradient baseline on frozen d-dim features: MOON's projection head
    (``MOONHead``, l1 width ``moon_hidden`` or d), every other method a linear head d -> C."""
    from fedlib.federated.gradient import LinearHead, MOONHead

    if method == "moon":
        return lambda: MOONHead(dim, num_classes, hidden=moon_hidden)
    return lambda: LinearHead(dim, num_classes)


def per_round_upload(hist, parts: Sequence[np.ndarray]) -> float:
    """Measured bytes one (non-empty) client uploads in one round: the increment of ``hist.bytes_up``
    between its last two records (from the start, less the setup round's uploads, when the run has
    one record: ``rounds=1``), over the participants that hold data in the rounds between them (more
    than one round when ``eval_every > 1``)."""
    if not hist.round:
        raise ValueError("the history has no record: nothing was uploaded")
    last = hist.round[-1]
    first, start = (hist.round[-2], hist.bytes_up[-2]) if len(hist.round) > 1 else (0, hist.setup_bytes_up)
    uploads = sum(len(parts[k]) > 0 for r in range(first, last) for k in hist.participants[r])
    return (hist.bytes_up[-1] - start) / uploads


def run_baselines(protocol: str, jobs, partitions: SettingPartitions, num_clients: int, train, test,
                  num_classes: int, config: dict, moon_hidden: int | None = None, progress: bool = True,
                  cache: RunCache | None = None, workers: int = 1):
    """Run the gradient baselines of ``jobs`` = [(setting, method, seed, partition seed)] on the
    frozen features ``train`` = (x (N, d), y (N,)) / ``test`` tensors, each with
    ``FedConfig(seed=seed, **config)`` on ``partitions(setting, num_clients, partition seed)``.
    ``cache``: a :class:`RunCache` that holds the runs (a job it already ran is not run again);
    ``workers`` forked processes run the new ones (:meth:`RunCache.federated_many`).

    Returns ``(runs, curves)``: one row per job (final / best accuracy, seconds, measured upload per
    client and round) and the concatenated per-round histories.
    """
    import pandas as pd

    cache = RunCache() if cache is None else cache
    out, frames = [], []
    hists = cache.federated_many([(method, partitions(setting, num_clients, pseed), seed)
                                  for setting, method, seed, pseed in jobs], config, moon_hidden, train, test,
                                 num_classes, workers=workers, desc=f"{protocol} runs", progress=progress)
    for (setting, method, seed, pseed), hist in zip(jobs, hists):
        parts = partitions(setting, num_clients, pseed)
        out.append({"protocol": protocol, "setting": setting_label(setting), "method": method, "seed": seed,
                    "partition seed": pseed, "accuracy": hist.final_acc, "best accuracy": hist.best_acc,
                    "seconds": hist.wall_s[-1], "seconds per round": hist.wall_s[-1] / config["rounds"],
                    "seconds to final accuracy": hist.time_to_final(),
                    "upload bytes/client/round": per_round_upload(hist, parts)})
        frame = hist.to_frame()
        frame[["setting", "method", "seed"]] = setting_label(setting), method, seed
        frames.append(frame)
    return pd.DataFrame(out), pd.concat(frames, ignore_index=True)


def seed_ordered_accuracies(frame, setting: str, method: str) -> np.ndarray:
    """Final accuracies of ``method`` in ``setting`` (a label), ordered by training seed (for pairing)."""
    rows = frame[(frame.setting == setting) & (frame.method == method)]
    return rows.sort_values("seed")["accuracy"].to_numpy()


def table1_deviations(x: Array, labels: Array, num_classes: int, clients: Sequence[int],
                      reference: torch.Tensor):
    """The paper's Table 1 recipe: for each K in ``clients``, an equal contiguous split of x (N, d),
    the pairwise AA law without RI (gamma = 0, local Moore-Penrose inverse, ``inverse="pinv"``) and
    with RI (gamma = 1, eq. 15); ``ΔW = sum |W - reference|`` (L1) for both. Returns a DataFrame
    indexed by K with N_k and the two deviations."""
    import pandas as pd

    rows = []
    for k in clients:
        parts = np.array_split(np.arange(len(labels)), k)
        no_ri = run_afl(x, labels, parts, num_classes, gamma=0.0, server="pairwise", inverse="pinv")
        with_ri = run_afl(x, labels, parts, num_classes, gamma=1.0, server="pairwise")
        rows.append({"K": k, "N_k": len(parts[0]),
                     "ΔW w/o RI (ours)": float((no_ri.weights - reference).abs().sum()),
                     "ΔW w/ RI (ours)": float((with_ri.weights - reference).abs().sum())})
    return pd.DataFrame(rows).set_index("K")


# ----------------------------------------------------------------------------------------------
# the derivation chapter's checks (notebooks/afl_derivation.py): each returns the table it shows
# ----------------------------------------------------------------------------------------------
def _frame(rows):
    import pandas as pd

    return pd.DataFrame(rows)


def two_client_check(x: Array, labels: Array, num_classes: int, reference: torch.Tensor):
    """Two equal halves of x (N, d) aggregated by the pairwise AA law (Thm. 1, eq. 8; gamma = 0, no
    restoration) with the corrected (+) and the printed (-) sign, against ``reference`` (d, C).

    Returns ``(table, identities)``: one row per sign (L1 and max relative error), and the corrected
    weights' identities ``max|W_u - S^{-1} C_u|`` and ``max|W_u + W_v - I|``.
    """
    halves = np.array_split(np.arange(len(labels)), 2)
    up = [client_update(x[p], labels[p], num_classes, gamma=0.0, packed=False) for p in halves]
    w_u, w_v = aa_weights(up[0]["C"], up[1]["C"], sign=+1)
    s_inv_cu = torch.linalg.solve(up[0]["C"] + up[1]["C"], up[0]["C"])
    rows = []
    for sign, label in [(+1, "corrected (+)"), (-1, "as printed (-)")]:
        res = aggregate(up, server="pairwise", sign=sign, restore=False)
        rows.append({"AA law": label, "L1 |W_agg - W_joint|": float((res.weights - reference).abs().sum()),
                     "max rel. error": relative_error(res.weights, reference)})
    eye = torch.eye(w_u.shape[0], dtype=torch.float64)
    return _frame(rows), {"max|W_u - S^-1 C_u|": float((w_u - s_inv_cu).abs().max()),
                          "max|W_u + W_v - I|": float((w_u + w_v - eye).abs().max())}


def partition_sweep(x: Array, labels: Array, num_classes: int, settings, num_clients: int, seed: int,
                    reference: torch.Tensor, gamma: float = 1.0):
    """Heterogeneity invariance (Thm. 1-2): for every ``(scheme, kwargs)`` of ``settings`` (a
    :func:`~fedlib.data.partition.make_partition` scheme), both servers on the same partition into
    ``num_clients`` clients, against ``reference`` (d, C).

    Returns ``(table, agreement, checks)``: one row per (partition, server) with client sizes and the
    max relative error; per partition ``max|W_pairwise - W_one_solve|``; and ``checks`` = the largest
    difference between any two partitions' one-solve heads (``"spread"``) and whether every one-solve
    head predicts the training set exactly like ``reference`` (``"same predictions"``).
    """
    import pandas as pd

    from fedlib.data.partition import make_partition

    rows, heads = [], {}
    for scheme, kw in settings:
        parts = make_partition(labels, num_clients, scheme, seed=seed, **kw)
        label = scheme + "".join(f" {k}={v}" for k, v in kw.items())
        for server in SERVERS:
            res = run_afl(x, labels, parts, num_classes, gamma=gamma, server=server)
            heads[(label, server)] = res.weights
            rows.append({"partition": label, "server": server, "empty clients": sum(len(p) == 0 for p in parts),
                         "smallest N_k": min(len(p) for p in parts), "largest N_k": max(len(p) for p in parts),
                         "max rel. error vs joint": relative_error(res.weights, reference)})
    labels_seen = dict.fromkeys(lbl for lbl, _ in heads)
    agreement = pd.Series({lbl: float((heads[(lbl, "pairwise")] - heads[(lbl, "one_solve")]).abs().max())
                           for lbl in labels_seen}, name="max |W_pairwise - W_one_solve|")
    one_solve = [w for (lbl, srv), w in heads.items() if srv == "one_solve"]
    pred = predict(reference, x)
    checks = {"spread": max(float((a - b).abs().max()) for a in one_solve for b in one_solve),
              "same predictions": all(bool((predict(w, x) == pred).all()) for w in one_solve)}
    return _frame(rows), agreement, checks


def client_count_sweep(x: Array, labels: Array, num_classes: int, client_counts: Sequence[int], seed: int,
                       reference: torch.Tensor, pairwise_max_clients: int, gamma: float = 1.0):
    """Client-number invariance: an IID split into K clients for every K of ``client_counts`` (K > N
    skipped), both servers (the pairwise one only up to ``pairwise_max_clients``). One row per (K,
    server): N_k, server seconds and the max relative error against ``reference`` (d, C)."""
    from fedlib.data.partition import make_partition

    rows = []
    for k in client_counts:
        if k > len(labels):
            continue
        parts = make_partition(labels, k, "iid", seed=seed)
        for server in SERVERS:
            if server == "pairwise" and k > pairwise_max_clients:
                continue
            res = run_afl(x, labels, parts, num_classes, gamma=gamma, server=server)
            rows.append({"K": k, "server": server, "N_k": len(parts[0]), "server seconds": res.server_seconds,
                         "max rel. error vs joint": relative_error(res.weights, reference)})
    return _frame(rows)


def order_sweep(x: Array, labels: Array, parts: Sequence[np.ndarray], num_classes: int, n_orders: int,
                rng: np.random.Generator, gamma: float = 1.0):
    """Order invariance: ``n_orders`` random client orders (``rng.permutation``, one per order) for
    both servers against the pairwise head in the order 0..K-1. Returns ``(table, max|W_ref|)``."""
    reference = run_afl(x, labels, parts, num_classes, gamma=gamma, server="pairwise").weights
    rows = []
    for i in range(n_orders):
        order = rng.permutation(len(parts))
        for server in SERVERS:
            w = run_afl(x, labels, parts, num_classes, gamma=gamma, server=server, order=order).weights
            rows.append({"order": i, "server": server, "max |W - W(order 0..K-1)|": float((w - reference).abs().max())})
    return _frame(rows), float(reference.abs().max())


def unrestored_is_ridge(x: Array, labels: Array, num_classes: int, cases, seed: int, reference: torch.Tensor):
    """Thm. 2 (eq. 13): without the restoration the one-solve head is joint ridge with lambda = K gamma.
    For each ``(K, gamma)`` of ``cases`` (K > N skipped): an IID split, the unrestored head against
    the lstsq ridge reference (augmented system) and against ``reference`` (d, C)."""
    from fedlib.core.linalg import lstsq_reference
    from fedlib.data.partition import make_partition

    rows = []
    for k, gamma in cases:
        if k > len(labels):
            continue
        parts = make_partition(labels, k, "iid", seed=seed)
        res = run_afl(x, labels, parts, num_classes, gamma=gamma, server="one_solve", restore=False)
        w_ridge = lstsq_reference(x, labels, num_classes, lam=k * gamma)
        rows.append({"K": k, "gamma": gamma, "K·gamma": k * gamma,
                     "max rel. |W^r_agg - ridge(λ=Kγ)|": relative_error(res.weights, w_ridge),
                     "max rel. |W^r_agg - W_joint|": relative_error(res.weights, reference)})
    return _frame(rows)


def conditioning_check(conditions: Sequence[float], f32_conditions: Sequence[float], n: int, dim: int,
                       num_classes: int, num_clients: int, seed: int, gamma: float = 1.0):
    """AFL against NumPy lstsq on ``ill_conditioned`` features (n, dim) with cond(X^T X) prescribed,
    in float64 (``conditions``) and float32 (``f32_conditions``), Dirichlet(0.1) over ``num_clients``.

    One row per (condition, dtype, server): the relative error, the tolerance ``2 kappa u``
    (:func:`~fedlib.core.linalg.normal_equations_tolerance`), the error of the unrestored head and
    error / tolerance.
    """
    from fedlib.core.linalg import lstsq_reference, normal_equations_tolerance, synthetic_features
    from fedlib.data.partition import make_partition

    rows = []
    cases = [(c, torch.float64) for c in conditions] + [(c, torch.float32) for c in f32_conditions]
    for cond, dt in cases:
        xi, yi = synthetic_features(n, dim, num_classes, "ill_conditioned", seed, condition=cond)
        if dt == torch.float32:
            xi = xi.astype(np.float32)
        ref = lstsq_reference(xi, yi, num_classes)
        kappa = float(np.linalg.cond(xi.astype(np.float64).T @ xi.astype(np.float64)))
        tol = normal_equations_tolerance(kappa, dt)
        parts = make_partition(yi, num_clients, "dirichlet", alpha=0.1, seed=seed)
        for server in ["one_solve", "pairwise"]:
            res = run_afl(xi, yi, parts, num_classes, gamma=gamma, server=server, dtype=dt)
            rows.append({"cond(XᵀX)": kappa, "dtype": str(dt).replace("torch.", ""), "server": server,
                         "rel. error vs lstsq": relative_error(res.weights.double(), ref), "tolerance 2·κ·u": tol,
                         "unrestored (wrong) head": relative_error(res.weights_regularized.double(), ref)})
    table = _frame(rows)
    table["error / tolerance"] = table["rel. error vs lstsq"] / table["tolerance 2·κ·u"]
    return table


def gamma_precision_sweep(x: Array, labels: Array, num_classes: int, parts: Sequence[np.ndarray],
                          gammas: Sequence[float], reference: torch.Tensor):
    """"Any gamma would suffice": both servers for every gamma in float64 and float32 statistics.

    One row per (dtype, gamma, server): max relative error against ``reference`` (d, C) (NaN when the
    head is not finite), training predictions that differ from ``reference``'s, and the number of
    ``ridge_solve`` calls that warned of a numerically singular matrix (counted, not printed).
    """
    import warnings

    pred_ref = predict(reference, x)
    rows = []
    for dtype in [torch.float64, torch.float32]:
        for gamma in gammas:
            for server in SERVERS:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always", RuntimeWarning)
                    res = run_afl(x, labels, parts, num_classes, gamma=gamma, server=server, dtype=dtype)
                w = res.weights.double()
                finite = bool(torch.isfinite(w).all())
                rows.append({"dtype": str(dtype).replace("torch.", ""), "gamma": gamma, "server": server,
                             "max rel. error": relative_error(w, reference) if finite else float("nan"),
                             "changed predictions": int((predict(w, x) != pred_ref).sum()) if finite else len(labels),
                             "rank-deficient solves": sum("singular" in str(c.message) for c in caught)})
    return _frame(rows)


def client_count_accuracy(x: Array, labels: Array, x_test: Array, y_test: np.ndarray, num_classes: int,
                          client_counts: Sequence[int], seed: int, reference: torch.Tensor, alpha: float = 0.1):
    """One-solve AFL (gamma = 1) on Dirichlet(``alpha``) splits into K clients (K > N skipped): one row
    per K with the max relative error against ``reference`` (d, C) and the test accuracy."""
    from fedlib.data.partition import make_partition

    rows = []
    for k in client_counts:
        if k > len(labels):
            continue
        parts = make_partition(labels, k, "dirichlet", alpha=alpha, seed=seed)
        res = run_afl(x, labels, parts, num_classes, gamma=1.0, server="one_solve")
        acc = float((predict(res.weights, x_test).numpy() == y_test).mean())
        rows.append({"K": k, "max rel. error vs joint": relative_error(res.weights, reference), "test accuracy": acc})
    return _frame(rows)


# ----------------------------------------------------------------------------------------------
# the benchmark chapter's tables (notebooks/afl_benchmark.py)
# ----------------------------------------------------------------------------------------------
def centralized_reference(feats, device: str | torch.device = "cpu") -> dict:
    """The head AFL must reproduce on cached features ``feats`` (x_train (N, d), y_train, x_test,
    y_test, num_classes): the normal-equations head ``(X^T X)^{-1} X^T Y`` and, independently, a
    Householder QR of X (:func:`~fedlib.core.linalg.qr_reference`).

    Returns ``{"w_joint" (d, C), "joint_acc", "report" (gram_report), "w_qr" (d, C), "qr_acc",
    "qr_error" (max relative difference), "qr_tol" (2 kappa eps), "qr_seconds"}``.
    """
    from fedlib.core.linalg import gram_report, head_accuracy, normal_equations_tolerance, qr_reference

    stats = SufficientStats.from_data(feats.x_train, feats.y_train, feats.num_classes, device=device)
    w_joint = ridge_solve(stats.gram, stats.xty)
    report = gram_report(stats.gram)
    t0 = time.perf_counter()
    w_qr = qr_reference(feats.x_train, feats.y_train, feats.num_classes)
    qr_seconds = time.perf_counter() - t0
    return {"w_joint": w_joint, "joint_acc": head_accuracy(w_joint, feats.x_test, feats.y_test), "report": report,
            "w_qr": w_qr, "qr_acc": head_accuracy(w_qr, feats.x_test, feats.y_test),
            "qr_error": relative_error(w_joint.cpu(), w_qr),
            "qr_tol": normal_equations_tolerance(report["condition number"]), "qr_seconds": qr_seconds}


def afl_setting_runs(feats, partitions: SettingPartitions, settings: Sequence[tuple], num_clients: int,
                     partition_seeds: Sequence[int], gamma: float, device, reference: torch.Tensor,
                     cache: RunCache | None = None):
    """AFL on the partition of every setting and partition seed (duplicates run once). One row per
    run: setting label, partition seed, test accuracy, measured seconds, upload bytes per client,
    uploads per client and the max relative difference to ``reference`` (d, C). ``cache``: a
    :class:`RunCache` that keeps the runs for later cells."""
    from fedlib.core.linalg import head_accuracy

    cache = RunCache() if cache is None else cache
    rows = []
    for setting in settings:
        for pseed in dict.fromkeys(partition_seeds):
            res = cache.afl(feats, partitions(setting, num_clients, pseed), gamma, device)
            rows.append({"setting": setting_label(setting), "partition seed": pseed,
                         "accuracy": head_accuracy(res.weights, feats.x_test, feats.y_test),
                         "seconds": res.cost.seconds, "upload bytes/client": res.cost.bytes_up / num_clients,
                         "uploads per client": len(res.upload_bytes) / num_clients,
                         "max rel. |W - W_QR|": relative_error(res.weights.cpu(), reference)})
    return _frame(rows)


def accuracy_table(runs, settings: Sequence[str], methods: Sequence[str], afl_acc):
    """Table 2's layout: one row per setting label, "mean ± sample std" (%) of each method's final
    accuracy over training seeds, and AFL's (deterministic) accuracy ``afl_acc[setting]`` ± 0."""
    import pandas as pd

    from fedlib.evaluation.stats import mean_std, pm

    table = pd.DataFrame({m: [mean_std(seed_ordered_accuracies(runs, s, m), 2, 100) for s in settings]
                          for m in methods}, index=list(settings))
    table["AFL"] = [pm(100 * afl_acc[s], 0.0) for s in table.index]
    return table


def paired_against_afl(runs, settings: Sequence[str], methods: Sequence[str], afl_acc):
    """Paired differences by training seed (95 % t-interval, percentage points): AFL minus each method
    (``"afl_low"`` holds the interval's lower end), and each method minus FedAvg when FedAvg ran."""
    from fedlib.evaluation.stats import paired_difference

    rows = []
    for s in settings:
        for m in methods:
            acc = seed_ordered_accuracies(runs, s, m)
            d_afl = paired_difference(np.full(len(acc), afl_acc[s]), acc)
            row = {"setting": s, "method": m, "AFL − method (pp)": d_afl.format(2, 100), "afl_low": d_afl.low}
            if "fedavg" in methods and m != "fedavg":
                base = seed_ordered_accuracies(runs, s, "fedavg")
                row["method − FedAvg (pp)"] = paired_difference(acc, base).format(2, 100)
            rows.append(row)
    return _frame(rows)


def final_gain(curves, rounds: int):
    """Accuracy gained over the last ``max(1, rounds // 10)`` rounds of every (setting, method, seed)
    curve of ``curves`` (columns test_acc, ...): returns ``(gains Series, window)``."""
    window = max(1, rounds // 10)
    gain = curves.groupby(["setting", "method", "seed"])["test_acc"].apply(
        lambda a: a.iloc[-1] - a.iloc[max(0, len(a) - 1 - window)])
    return gain, window


def protocol_spread(fixed, resampled):
    """Fixed partition vs a new partition per seed: "mean ± sample std" (%) of the accuracy per
    (setting, method) and protocol, and the ratio of the two sample stds (new / fixed)."""
    import pandas as pd

    from fedlib.evaluation.stats import mean_std

    both = pd.concat([fixed[fixed.method.isin(resampled.method.unique())], resampled])
    spread = both.groupby(["setting", "method", "protocol"], sort=False)["accuracy"].agg(
        lambda a: mean_std(a, 2, 100)).unstack("protocol")
    std = both.groupby(["setting", "method", "protocol"])["accuracy"].std(ddof=1).unstack("protocol")
    return spread, std["new partition per seed"] / std["fixed partition"]


def cost_table(runs, afl_runs, partition_seed: int, paper_rounds: int):
    """Per method (means over runs): seconds to final accuracy, seconds per round and measured upload
    per client and round, the time ratios against AFL's mean seconds on the fixed partitions of
    ``afl_runs`` (our budget; ``paper_rounds`` rounds) and the number of rounds after which its
    cumulative upload passes AFL's mean upload. Returns ``(cost, afl_seconds, afl_bytes)``."""
    afl_seconds = afl_runs[afl_runs["partition seed"] == partition_seed]["seconds"].mean()
    afl_bytes = afl_runs["upload bytes/client"].mean()
    cost = runs.groupby("method", sort=False)[["seconds to final accuracy", "seconds per round",
                                               "upload bytes/client/round"]].mean()
    cost["time ratio vs AFL (our budget)"] = cost["seconds to final accuracy"] / afl_seconds
    cost[f"time ratio vs AFL ({paper_rounds} rounds)"] = cost["seconds per round"] * paper_rounds / afl_seconds
    cost["rounds until its upload passes AFL's"] = np.ceil(afl_bytes / cost["upload bytes/client/round"]).astype(int)
    return cost, afl_seconds, afl_bytes


def upload_crossings(cost, methods: Sequence[str]):
    """From :func:`cost_table`: the linear-head methods (all but MOON), the fewest rounds after which
    one of them has uploaded more than AFL (None without one) and the same for MOON (None if absent)."""
    linear = [m for m in methods if m != "moon"]
    column = "rounds until its upload passes AFL's"
    return (linear, int(cost.loc[linear, column].min()) if linear else None,
            int(cost.loc["moon", column]) if "moon" in methods else None)


def advantage_summary(runs, afl_acc, paired) -> dict:
    """Table 2's claim from the runs: per setting whether AFL's accuracy is above every method's mean
    (``"afl_best"``, a bool Series), how many paired intervals AFL - method lie above 0
    (``"resolved"``) and the smallest mean advantage over the best method (``"smallest"``, fraction)."""
    import pandas as pd

    mean_acc = runs.groupby(["setting", "method"])["accuracy"].mean().unstack("method")
    return {"afl_best": pd.Series({s: bool(afl_acc[s] > mean_acc.loc[s].max()) for s in mean_acc.index}),
            "resolved": int((paired["afl_low"] > 0).sum()),
            "smallest": (afl_acc.reindex(mean_acc.index) - mean_acc.max(axis=1)).min()}


def afl_vs_fedavg(feats, parts_by_key, config: dict, seed: int, gamma: float, device, index: str,
                  progress: bool = True, desc: str = "runs", cache: RunCache | None = None, workers: int = 1):
    """AFL and one FedAvg run (training seed ``seed``, ``FedConfig(**config)``) on each partition of
    ``parts_by_key`` = [(key, client index arrays)]. Returns test accuracies (fractions), one row per
    key (index named ``index``), columns "AFL" and "FedAvg (1 seed)" (columns named "method").
    ``cache``: a :class:`RunCache`; a run it holds (e.g. from :func:`afl_setting_runs` or
    :func:`run_baselines` on the same partition object) is reused, and the new runs are kept; ``workers``
    forked processes run the new FedAvg runs (:meth:`RunCache.federated_many`)."""
    import pandas as pd
    from tqdm.auto import tqdm

    from fedlib.core.linalg import head_accuracy

    cache = RunCache() if cache is None else cache
    train = torch.from_numpy(feats.x_train), torch.from_numpy(feats.y_train)
    test = torch.from_numpy(feats.x_test), torch.from_numpy(feats.y_test)
    hists = cache.federated_many([("fedavg", parts, seed) for _, parts in parts_by_key], config, None, train, test,
                                 feats.num_classes, workers=workers, desc=f"{desc} (FedAvg)", progress=progress)
    rows = {}
    for (key, parts), hist in zip(tqdm(parts_by_key, desc=f"{desc} (AFL)", disable=not progress), hists):
        res = cache.afl(feats, parts, gamma, device)
        rows[key] = {"AFL": head_accuracy(res.weights, feats.x_test, feats.y_test), "FedAvg (1 seed)": hist.final_acc}
    return pd.DataFrame.from_dict(rows, orient="index").rename_axis(index=index, columns="method")


def ri_ablation(feats, parts_by_k, gammas: Sequence[float], device, rerun: bool = False,
                base_gamma: float | None = None, cache: RunCache | None = None):
    """Table 4's ablation: for each (K, parts) of ``parts_by_k`` and gamma, the test accuracy (%) of the
    head before (``"w/o RI"``, a joint ridge with lambda = K gamma) and after the restoration (eq. 15).
    Returns a table indexed by K with columns (γ, RI).

    One protocol run per K (at ``base_gamma``, default ``gammas[0]``) gives the server's aggregate
    ``C^r = X^T X + K gamma_0 I`` and ``B = C^r W^r = sum_k X_k^T Y_k``. Another gamma changes each
    client's ``C_k^r`` by ``(gamma - gamma_0) I`` and leaves ``B`` unchanged (``C_k^r W_k^r = X_k^T Y_k``
    for every gamma), so the server's state at gamma is ``C^r + K (gamma - gamma_0) I`` with the same
    ``B``: the server's solve and restoration at gamma, without the clients' d x d work again.
    ``cache``: a :class:`RunCache` whose run at ``base_gamma`` on the same partition object (e.g. the
    client-count sweep's, :func:`afl_vs_fedavg`) is reused. ``rerun=True`` runs the whole protocol at
    every gamma instead (a test checks both agree).
    """
    import pandas as pd

    from fedlib.core.linalg import head_accuracy

    cache = RunCache() if cache is None else cache
    rows = []
    for k, parts in parts_by_k:
        heads = {}
        if rerun:
            for g in gammas:
                res = run_afl(feats.x_train, feats.y_train, parts, feats.num_classes, gamma=g, device=device)
                heads[g] = res.weights_regularized, res.weights
        else:
            g0 = float(gammas[0] if base_gamma is None else base_gamma)
            check_positive("base_gamma", g0, strict=False)
            res = cache.afl(feats, parts, g0, device)
            rhs = res.gram_regularized @ res.weights_regularized
            eye = torch.eye(rhs.shape[0], dtype=rhs.dtype, device=rhs.device)
            for g in gammas:
                gram = res.gram_regularized + len(parts) * (float(g) - g0) * eye
                w_r = ridge_solve(gram, rhs)
                heads[g] = w_r, ri_restore(w_r, gram, len(parts) * float(g))
        for g in gammas:
            for ri_label, w in zip(("w/o RI", "w/ RI"), heads[g]):
                rows.append({"K": k, "γ": g, "RI": ri_label,
                             "accuracy (%)": 100 * head_accuracy(w, feats.x_test, feats.y_test)})
    ri = pd.DataFrame(rows).pivot_table(index="K", columns=["γ", "RI"], values="accuracy (%)")
    return ri.reindex(columns=pd.MultiIndex.from_product([list(gammas), ["w/o RI", "w/ RI"]], names=["γ", "RI"]))


def equal_kgamma_cells(ri):
    """Without RI the head depends on K gamma only: the "w/o RI" cells of :func:`ri_ablation`'s table
    as a long frame (K, γ, acc, K·γ) and, per K·γ shared by several cells, their min / max / count."""
    no_ri = ri.xs("w/o RI", axis=1, level="RI").stack().rename("acc").reset_index()
    no_ri["K·γ"] = no_ri["K"] * no_ri["γ"]
    return no_ri, no_ri.groupby("K·γ")["acc"].agg(["min", "max", "count"]).query("count > 1")
