"""Analytic Federated Learning (AFL; Zhuang et al., arXiv:2405.16240 v1): the paper's algorithm.

Client k (Alg. 1, local stage) fits a ridge head on its frozen features and uploads
``{W_k^r, C_k^r, gamma}`` with ``C_k^r = X_k^T X_k + gamma I`` (eq. 14) and
``W_k^r = (C_k^r)^{-1} X_k^T Y_k`` (eq. 12). The server combines the uploads in one round:

* :class:`PairwiseAAServer`: the paper's recursive absolute-aggregation (AA) law, eqs. (9)-(10) with
  C -> C^r (Appendix C), **with the sign of the third term corrected** (the paper prints "-",
  the derivation and the authors' code give "+"; see :func:`aa_weights`).
* :class:`OneSolveServer`: the equivalent one-solve form from summed statistics,
  ``W^r = (sum_k C_k^r)^{-1} sum_k C_k^r W_k^r`` (eqs. 56-57), O(K d^2 C + d^3) instead of O(K d^3).

Both end with the RI restoration (eq. 15, :func:`ri_restore`), which removes the accumulated
``K gamma I`` and returns the unregularized joint least-squares head ``(X^T X)^{-1} X^T Y``:
weight-invariance (Thm. 1-2). :func:`run_afl` drives :class:`AFLClient` and a server with
:func:`~fedlib.core.protocol.simulate` and returns an :class:`AFLResult` with the measured cost.

Two options change how, not what: ``packed=True`` (the default) sends the symmetric ``C_k^r`` as its
upper triangle (``"C_packed"``, d(d+1)/2 numbers) and ``OneSolveServer(fast=True)`` (the default) forms
its sums in one compiled pass per upload, both in :mod:`fedlib.afl.speed`. ``statistics=True`` uploads
``B_k = X_k^T Y_k`` (``"B"``) in place of ``W_k^r``: the same bytes and information (``B_k = C_k^r W_k^r``),
not the paper's upload, off by default.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np
import torch

from fedlib.afl.speed import OnePassSums, kernels, pack_symmetric, packed_gram, packed_length, unpack_symmetric
from fedlib.core.linalg import Array, SufficientStats, as_tensor, inverse_applier, numerical_rank, one_hot, ridge_solve
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
    inv_agg, inv_k, inv_s = (inverse_applier(a, inverse, _singular_message(what)) for a, what in
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
    inv_agg = inverse_applier(c_agg, inverse, _singular_message("the aggregated C")) if inv_agg is None else inv_agg
    inv_k = inverse_applier(c_k, inverse, _singular_message("the client's C_k"))
    s = c_agg + c_k
    inv_s = inverse_applier(s, inverse, _singular_message("C_agg + C_k"))
    u, v = c_k @ w_agg, c_agg @ w_k
    s_uv = inv_s(torch.cat([u, v], dim=1))
    n = u.shape[1]
    head = (w_agg - inv_agg(u - sign * (c_k @ s_uv[:, :n]))) + (w_k - inv_k(v - sign * (c_agg @ s_uv[:, n:])))
    return head, s, inv_s


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
    solve (eqs. 56-57). ``fast=True`` (default) forms the same sums in one compiled pass per upload,
    packed uploads never unpacked (:class:`fedlib.afl.speed.OnePassSums`); ``fast=False`` adds the
    matrices as written here."""

    def __init__(self, dim: int | None = None, num_classes: int | None = None, fast: bool = True):
        super().__init__(dim, num_classes)
        self.fast = OnePassSums() if fast else None
        self.gram_sum: torch.Tensor | None = None   # sum_k C_k^r (d, d), the readable path
        self.rhs_sum: torch.Tensor | None = None    # sum_k C_k^r W_k^r (d, C)

    def _absorb(self, msg: Message) -> None:
        statistics = "B" in msg.payload
        if self.fast is not None:
            packed = "C_packed" in msg.payload
            self.fast.add(msg["C_packed" if packed else "C"], _head(msg), packed, statistics)
            return
        c_k = upload_gram(msg)
        b_k = msg["B"] if statistics else c_k @ msg["W"]      # C_k^r W_k^r = X_k^T Y_k (eq. 56)
        self.gram_sum = c_k.clone() if self.gram_sum is None else self.gram_sum + c_k
        self.rhs_sum = b_k.clone() if self.rhs_sum is None else self.rhs_sum + b_k

    @property
    def gram(self) -> torch.Tensor | None:
        """``C^r = sum_k C_k^r`` (d, d) of the uploads so far, or None."""
        return self.gram_sum if self.fast is None else self.fast.gram

    @property
    def rhs(self) -> torch.Tensor | None:
        """``B = sum_k C_k^r W_k^r`` (d, C) of the uploads so far, or None."""
        return self.rhs_sum if self.fast is None else self.fast.rhs

    def result(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(W^r_agg,K = (C^r)^{-1} B (d, C), C^r_agg,K (d, d))`` (eq. 57), identical to the recursive law."""
        if self.count == 0:
            raise ValueError("the server has received no upload")
        t0 = time.perf_counter()
        gram = self.gram
        out = ridge_solve(gram, self.rhs), gram
        self.seconds += time.perf_counter() - t0
        return out


def make_server(server: str = "one_solve", sign: int = +1, inverse: str = "solve", dim: int | None = None,
                num_classes: int | None = None, fast: bool = True):
    """``"pairwise"`` -> :class:`PairwiseAAServer`; ``"one_solve"`` -> :class:`OneSolveServer` (``fast``: its
    one-pass sums); uploads must have features ``dim`` and classes ``num_classes`` (None: as the first upload's)."""
    check_choice("server", server, SERVERS)
    return PairwiseAAServer(sign, inverse, dim, num_classes) if server == "pairwise" else \
        OneSolveServer(dim, num_classes, fast)


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
    """Server result (+ RI restoration, eq. 15) as an :class:`AFLResult`. Both count in ``cost.seconds``;
    the solve is already in ``srv.seconds``, so only the restoration is added to the server's share."""
    t0 = time.perf_counter()
    w_r, c_r = srv.result()
    t1 = time.perf_counter()
    weights = ri_restore(w_r, c_r, srv.gamma_sum) if restore else w_r
    t2 = time.perf_counter()
    cost.seconds += t2 - t0
    return AFLResult(weights, w_r, c_r, srv.count, srv.gamma_sum, cost, list(srv.upload_bytes),
                     srv.seconds + (t2 - t1))


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
            packed: bool = True, statistics: bool = False, fast: bool = True) -> AFLResult:
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
    ``fast=False``: the one-solve server adds the matrices as written (no compiled pass).
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
    srv = make_server(server, sign, inverse, int(x.shape[1]), num_classes, fast)
    kernels()   # the one-off import and load of the compiled loops stays out of the measured seconds
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


