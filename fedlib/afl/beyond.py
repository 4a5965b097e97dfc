"""Beyond the AFL paper: QR aggregation, what the uploads reveal, secure aggregation,
hyperparameter selection and unlearning from the uploaded statistics alone.

Everything here reuses :mod:`fedlib.afl.algorithm` (the paper's client and servers) and
:mod:`fedlib.core.linalg` (sufficient statistics, ridge solves, references); the chapter is
``notebooks/afl_beyond.py``. Three parts:

1. **TSQR aggregation** (:class:`TSQRClient`, :class:`TSQRServer`, :func:`run_tsqr`). Client k
   uploads the triangular factor ``R_k`` of ``A_k = [X_k | Y_k]`` (N_k, d + C) from a Householder QR,
   ``A_k = Q_k R_k``; its upper trapezoid only (``min(N_k, d+C)`` rows). The server factors the stacked
   ``R_k`` again, ``[R_1; ...; R_K] = Q R``, so ``R^T R = sum_k A_k^T A_k = A^T A``, and the head is
   ``W = R_11^{-1} R_12`` (a triangular solve). Its error follows ``cond(X)``, not ``cond(X)^2``.
2. **What the upload reveals, and secure aggregation** (:func:`recover_statistics`,
   :func:`recover_single_sample`, :class:`MaskedStatsClient`, :class:`SecureSumServer`). From the
   paper's upload ``{W_k^r, C_k^r, gamma}`` the server gets ``X_k^T X_k = C_k^r - gamma I`` and
   ``X_k^T Y_k = C_k^r W_k^r`` exactly; the one-solve form needs only their sums, so it runs under
   pairwise additive masks (Bonawitz et al., 2017) in a fixed-point ring of 2^64 integers.
3. **Ridge path, leave-one-client-out validation, unlearning** (:func:`ridge_path`,
   :func:`loco_errors`, :func:`unlearn`) from per-client statistics ``(G_k, B_k, N_k)``.
"""
from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import pandas as pd
import torch
from scipy.linalg import solve_triangular
from tqdm.auto import tqdm

from fedlib.afl import algorithm as afl
from fedlib.afl import speed as afl_speed
from fedlib.core import uploads
from fedlib.core.linalg import (Array, SufficientStats, gram_report, lstsq_reference, normal_equations_tolerance,
                                relative_error, ridge_solve, synthetic_features)
from fedlib.core.messages import Cost, Message
from fedlib.core.protocol import EMPTY, Server, simulate
from fedlib.core.seeds import derive_seed
from fedlib.core.validate import check_int, check_positive
from fedlib.data.partition import make_partition
from fedlib.evaluation.metrics import head_accuracy

DTYPES = {"float64": np.float64, "float32": np.float32}


# ----------------------------------------------------------------------------------------------
# input checks shared by the parts
# ----------------------------------------------------------------------------------------------
def _check_data(x: Array, labels: Array, num_classes: int, name: str = "x") -> tuple[np.ndarray, np.ndarray]:
    """``x`` (N, d) and integer ``labels`` (N,) in [0, num_classes) as NumPy arrays, or ValueError."""
    check_int("num_classes", num_classes, 1)
    xn = np.asarray(x.detach().cpu() if isinstance(x, torch.Tensor) else x)
    yn = np.asarray(labels.detach().cpu() if isinstance(labels, torch.Tensor) else labels)
    if xn.ndim != 2:
        raise ValueError(f"{name} must be a 2-D (N, d) feature matrix, got shape {xn.shape}")
    if yn.ndim != 1 or yn.shape[0] != xn.shape[0]:
        raise ValueError(f"labels must be 1-D with one label per row of {name} ({xn.shape[0]}), got shape {yn.shape}")
    if yn.size and (yn.min() < 0 or yn.max() >= num_classes):
        raise ValueError(f"labels must lie in [0, num_classes={num_classes}), got range [{yn.min()}, {yn.max()}]")
    return xn, yn.astype(np.int64)


def _check_parts(parts: Sequence[np.ndarray], n: int) -> list[np.ndarray]:
    """Client index arrays into N samples: at least one client, indices in [0, N)."""
    if len(parts) == 0:
        raise ValueError("parts must hold at least one client's index array, got none")
    out = []
    for k, p in enumerate(parts):
        p = np.asarray(p, dtype=np.int64)
        if p.ndim != 1 or (p.size and (p.min() < 0 or p.max() >= n)):
            raise ValueError(f"parts[{k}] must be a 1-D array of sample indices in [0, {n}), got shape {p.shape}")
        out.append(p)
    return out


# ==============================================================================================
# 1. TSQR: clients upload the triangular factor of [X_k | Y_k]
# ==============================================================================================
def augmented(x: np.ndarray, labels: np.ndarray, num_classes: int, dtype=np.float64) -> np.ndarray:
    """``A_k = [X_k | Y_k]`` (N_k, d + C) in ``dtype``: features beside their one-hot targets (AFL eq. 2)."""
    return np.hstack([x.astype(dtype, copy=False), np.eye(num_classes, dtype=dtype)[labels]])


def qr_r(a: np.ndarray) -> np.ndarray:
    """Upper-trapezoidal factor R (min(m, n), n) of a Householder QR ``a = Q R`` (NumPy / LAPACK
    ``geqrf``, in ``a``'s precision); ``R^T R = a^T a``. An empty ``a`` (0 rows) gives a (0, n) R."""
    if a.shape[0] == 0:
        return np.zeros((0, a.shape[1]), dtype=a.dtype)
    return np.linalg.qr(a, mode="r")


def trapezoid_length(rows: int, cols: int) -> int:
    """Entries of the upper trapezoid of a (rows, cols) matrix with rows <= cols:
    ``sum_{i<rows} (cols - i) = rows cols - rows (rows - 1) / 2`` (``cols (cols + 1) / 2`` when square)."""
    return rows * cols - rows * (rows - 1) // 2


def pack_trapezoid(r: np.ndarray) -> np.ndarray:
    """The upper trapezoid (diagonal included) of ``r`` (m, n), m <= n, row by row:
    ``r[0, 0:], r[1, 1:], ...`` (``np.triu_indices(m, 0, n)`` order), ``trapezoid_length(m, n)`` entries."""
    m, n = r.shape
    if m > n:
        raise ValueError(f"r must have at most as many rows as columns (an R factor), got shape {r.shape}")
    return r[np.triu_indices(m, 0, n)]


def unpack_trapezoid(packed: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """Inverse of :func:`pack_trapezoid`: the (rows, cols) upper-trapezoidal matrix (zeros below)."""
    if packed.ndim != 1 or packed.shape[0] != trapezoid_length(rows, cols):
        raise ValueError(f"a packed {rows} x {cols} factor has {trapezoid_length(rows, cols)} entries, "
                         f"got shape {packed.shape}")
    r = np.zeros((rows, cols), dtype=packed.dtype)
    r[np.triu_indices(rows, 0, cols)] = packed
    return r


def tsqr_client_update(x: Array, labels: Array, num_classes: int, client: str = "client",
                       dtype: str = "float64") -> Message:
    """TSQR upload of one client, eq. (tsqr-client): ``R_k`` of ``[X_k | Y_k] = Q_k R_k``, computed in
    ``dtype`` ("float64" or "float32") and sent as its packed upper trapezoid.

    Returns ``{"R_packed": (trapezoid_length(m, d + C),), "shape": (m, d + C)}`` with
    ``m = min(N_k, d + C)``: when ``N_k < d + C`` the factor has only N_k rows, so the upload is
    smaller than AFL's ``d (d + 1) / 2 + d C`` numbers. An empty client uploads a (0, d + C) factor.
    """
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; allowed: {', '.join(DTYPES)}")
    xn, yn = _check_data(x, labels, num_classes)
    r = qr_r(augmented(xn, yn, num_classes, DTYPES[dtype]))
    return Message(client, {"R_packed": pack_trapezoid(r), "shape": (int(r.shape[0]), int(r.shape[1]))})


def upload_factor(msg: Message) -> np.ndarray:
    """The (m, d + C) factor of a TSQR upload, checked against its declared shape."""
    if "R_packed" not in msg.payload or "shape" not in msg.payload:
        raise ValueError(f"malformed TSQR upload from {msg.sender}: it needs 'R_packed' and 'shape', "
                         f"got entries {sorted(msg.payload)}")
    rows, cols = (int(v) for v in msg["shape"])
    if rows > cols:
        raise ValueError(f"malformed TSQR upload from {msg.sender}: shape {(rows, cols)} has more rows than columns")
    return unpack_trapezoid(np.asarray(msg["R_packed"]), rows, cols)


def tsqr_weights(r: np.ndarray, num_classes: int, gamma: float = 0.0, rcond: float | None = None) -> torch.Tensor:
    """The head (d, C) from a pooled factor ``R`` (m, d + C) with ``R^T R = A^T A``, eq. (tsqr-weights).

    ``gamma > 0``: the ridge head, from the QR of ``[R; sqrt(gamma) I, 0]`` (appended rows add
    ``gamma I`` to ``X^T X`` and nothing to ``X^T Y``, eq. tsqr-ridge). Then ``R = [[R11, R12], [0, R22]]``
    and ``W = R11^{-1} R12`` by a triangular solve (``||R22||_F^2`` is the residual sum of squares).
    A feature that is 0 in every sample has an all-zero column in R and gets weight 0; if the rest
    of R11 is numerically singular (``min|diag| <= rcond max|diag|``, ``rcond = d eps`` by default), a
    ``RuntimeWarning`` and the minimum-norm solution of ``R11 W = R12`` (``lstsq``).
    """
    check_positive("gamma", gamma, strict=False)
    r = np.asarray(r, dtype=np.float64)
    if r.ndim != 2 or r.shape[1] <= num_classes:
        raise ValueError(f"r must be an (m, d + C) factor with d >= 1 and C = num_classes = {num_classes}, "
                         f"got shape {r.shape}")
    dim = r.shape[1] - num_classes
    if gamma > 0:
        r = qr_r(np.vstack([r, np.hstack([np.sqrt(gamma) * np.eye(dim), np.zeros((dim, num_classes))])]))
    live = np.flatnonzero(np.abs(r[:, :dim]).max(axis=0) > 0) if r.shape[0] else np.zeros(0, np.int64)
    weights = np.zeros((dim, num_classes))
    if live.size == 0:
        return torch.from_numpy(weights)
    if live.size < dim:   # drop the dead columns and re-triangularize (same Gram on the live block)
        r = qr_r(r[:, np.concatenate([live, dim + np.arange(num_classes)])])
    p = live.size
    r11, r12 = r[:p, :p], r[:p, p:]
    diag = np.abs(np.diagonal(r11)) if r11.shape[0] == p else np.zeros(1)
    tol = p * np.finfo(np.float64).eps if rcond is None else rcond
    if r11.shape[0] == p and diag.min() > tol * diag.max():
        weights[live] = solve_triangular(r11, r12, lower=False)
    else:
        warnings.warn(f"tsqr_weights: R11 is numerically singular (fewer rows than features, or min|diag|/max|diag| "
                      f"<= {tol:.1e}): returning the minimum-norm least-squares head", RuntimeWarning, stacklevel=2)
        weights[live] = np.linalg.lstsq(r11, r12, rcond=None)[0]
    return torch.from_numpy(weights)


@dataclass
class TSQRClient:
    """TSQR client program for :func:`fedlib.core.protocol.simulate`: ``step((x_k, labels_k), state, _)``
    returns :func:`tsqr_client_update`'s upload (``R_k`` in ``dtype``, packed)."""

    num_classes: int
    dtype: str = "float64"

    def init_state(self, k: int) -> dict:
        return {"name": f"client{k}"}

    def step(self, data, state: dict, broadcast: Message) -> Message:
        x, labels = data
        return tsqr_client_update(x, labels, self.num_classes, state["name"], self.dtype)


class TSQRServer(Server):
    """Stacks the uploaded factors and re-factors them, eq. (tsqr-stack), in float64.

    Streaming with bounded memory: uploads are buffered and, once the buffer holds ``flush`` x
    (d + C) rows (default 4), ``[R; R_k; ...]`` is reduced to one (d + C)-row factor by a QR (a
    tree of QRs, as in TSQR; any grouping gives the same ``R^T R``). ``result()`` returns the head
    of :func:`tsqr_weights` with the server's ``gamma`` (0: plain least squares).
    """

    def __init__(self, num_classes: int, gamma: float = 0.0, flush: int = 4, dim: int | None = None):
        check_int("num_classes", num_classes, 1)
        check_positive("gamma", gamma, strict=False)
        check_int("flush", flush, 1)
        self.num_classes, self.gamma, self.flush = num_classes, float(gamma), flush
        self.dim = None if dim is None else check_int("dim", dim, 1)
        self.factor: np.ndarray | None = None
        self.buffer: list[np.ndarray] = []
        self.buffered_rows = 0
        self.count = 0
        self.upload_bytes: list[int] = []
        self.seconds = 0.0

    def broadcast(self) -> Message:
        """TSQR needs nothing from the server: :data:`~fedlib.core.protocol.EMPTY`."""
        return EMPTY

    def expects(self) -> uploads.Expected:
        """A packed factor of ``shape`` (m, d + C), m <= d + C, finite; d + C as the earlier uploads'."""
        cols = self.factor.shape[1] if self.factor is not None else \
            None if self.dim is None else self.dim + self.num_classes
        form = {"shape": (uploads.Number(low=0, high="k", integer=True, bind="m"),
                          uploads.Number(low=self.num_classes + 1, integer=True, bind="k")),
                "R_packed": uploads.Tensor((lambda dims: trapezoid_length(dims["m"], dims["k"]),), array="numpy")}
        return uploads.Expected((form,), {"k": cols}, local=("m",), what="TSQR upload")

    def absorb(self, messages: Sequence[Message]) -> None:
        t0 = time.perf_counter()
        for msg in messages:
            r_k = upload_factor(msg).astype(np.float64)
            if self.factor is None:
                self.factor = np.zeros((0, r_k.shape[1]))
            self.buffer.append(r_k)
            self.buffered_rows += r_k.shape[0]
            self.count += 1
            self.upload_bytes.append(msg.nbytes)
            if self.buffered_rows >= self.flush * r_k.shape[1]:
                self._reduce()
        self.seconds += time.perf_counter() - t0

    def _reduce(self) -> None:
        if self.buffer:
            self.factor = qr_r(np.vstack([self.factor, *self.buffer]))
            self.buffer, self.buffered_rows = [], 0

    def result(self) -> torch.Tensor:
        """The head ``W`` (d, C), eq. (tsqr-weights)."""
        if self.factor is None:
            raise ValueError("the server has received no upload")
        t0 = time.perf_counter()
        self._reduce()
        w = tsqr_weights(self.factor, self.num_classes, self.gamma)
        self.seconds += time.perf_counter() - t0
        return w


@dataclass
class TSQRResult:
    """Outcome of one TSQR run: the head, the pooled factor and the measured cost."""

    weights: torch.Tensor          # (d, C)
    factor: np.ndarray             # (d + C, d + C) pooled R (before the ridge rows)
    cost: Cost = field(default_factory=Cost)
    upload_bytes: list[int] = field(default_factory=list)
    server_seconds: float = 0.0


def run_tsqr(x: Array, labels: Array, parts: Sequence[np.ndarray], num_classes: int, gamma: float = 0.0,
             dtype: str = "float64", flush: int = 4) -> TSQRResult:
    """TSQR on :func:`~fedlib.core.protocol.simulate`: every client of ``parts`` (index arrays into
    x (N, d) / labels (N,)) runs :class:`TSQRClient` in ``dtype``; the server (float64) factors
    the stacked ``R_k`` and solves, with ridge ``gamma`` (>= 0). Bytes and seconds are measured."""
    check_positive("gamma", gamma, strict=False)
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; allowed: {', '.join(DTYPES)}")
    xn, yn = _check_data(x, labels, num_classes)
    parts = _check_parts(parts, len(yn))
    server = TSQRServer(num_classes, gamma, flush, dim=xn.shape[1])
    cost = simulate(server, TSQRClient(num_classes, dtype), [(xn[p], yn[p]) for p in parts])
    t0 = time.perf_counter()
    w = server.result()
    cost.seconds += time.perf_counter() - t0
    return TSQRResult(w, server.factor, cost, list(server.upload_bytes), server.seconds)


def _cast_upload(msg: Message, dtype: torch.dtype) -> Message:
    """An AFL upload with its arrays cast to ``dtype`` (a float32 client's upload read by a float64 server)."""
    return Message(msg.sender, {k: v.to(dtype) if isinstance(v, torch.Tensor) else v for k, v in msg.payload.items()})


def normal_equation_head(x: np.ndarray, labels: np.ndarray, parts: Sequence[np.ndarray], num_classes: int,
                         server: str, gamma: float, client_dtype: str = "float64") -> torch.Tensor:
    """AFL's head from the normal equations: each client's paper upload ``{W_k^r, C_k^r, gamma}``
    (:func:`fedlib.afl.algorithm.client_update`) computed in ``client_dtype``, aggregated in float64 by
    ``server`` ("pairwise": the paper's AA law; "one_solve": fedlib's) and RI-restored (eq. 15)."""
    if client_dtype not in DTYPES:
        raise ValueError(f"unknown client_dtype {client_dtype!r}; allowed: {', '.join(DTYPES)}")
    tdt = torch.float64 if client_dtype == "float64" else torch.float32
    uploads = (_cast_upload(afl.client_update(x[p], labels[p], num_classes, gamma, f"client{k}", tdt), torch.float64)
               for k, p in enumerate(parts))
    with warnings.catch_warnings():   # a singular Gram at cond(X)^2 ~ 1/eps is the measured outcome here
        warnings.simplefilter("ignore", RuntimeWarning)
        try:
            return afl.aggregate(uploads, server=server).weights
        except (ValueError, RuntimeError, torch.linalg.LinAlgError):
            dim = x.shape[1]
            return torch.full((dim, num_classes), float("nan"), dtype=torch.float64)


def conditioning_study(conditions: Sequence[float], n: int, dim: int, num_classes: int, num_clients: int,
                       seeds: Sequence[int], gamma: float = 1.0, progress: bool = True):
    """TSQR against the normal-equation servers on features of prescribed ``cond(X)`` (each entry of
    ``conditions``; :func:`~fedlib.core.linalg.synthetic_features` with ``cond(X^T X) = cond(X)^2``),
    for float64 and float32 client factors / statistics (the server works in float64).

    One row per (cond(X), client precision, method, seed): relative error ``max|W - W*| / max|W*|``
    against NumPy ``lstsq`` on X (float64; an SVD, never X^T X), NaN where a server failed. IID split
    into ``num_clients`` clients. The normal-equation servers use the paper's ``gamma`` and RI.
    """
    for c in conditions:
        check_positive("conditions", c)
    check_positive("gamma", gamma, strict=False)
    rows = []
    jobs = [(c, s) for c in conditions for s in seeds]
    for cond, seed in tqdm(jobs, desc="conditioning", disable=not progress):
        x, y = synthetic_features(n, dim, num_classes, "ill_conditioned", seed, condition=float(cond) ** 2)
        ref = lstsq_reference(x, y, num_classes)
        parts = make_partition(y, num_clients, "iid", seed=seed)
        for prec in DTYPES:
            xp = x.astype(DTYPES[prec])   # float32 clients hold float32 features
            heads = {"TSQR": run_tsqr(xp, y, parts, num_classes, dtype=prec).weights}
            for server, label in (("one_solve", "one-solve (normal eq.)"), ("pairwise", "pairwise AA law (paper)")):
                heads[label] = normal_equation_head(xp, y, parts, num_classes, server, gamma, prec)
            for method, w in heads.items():
                err = relative_error(w.double(), ref) if bool(torch.isfinite(w).all()) else float("nan")
                rows.append({"cond(X)": float(cond), "clients": prec, "method": method, "seed": seed,
                             "rel. error vs lstsq": err})
    return pd.DataFrame(rows)


def conditioning_summary(study):
    """Per (cond(X), clients, method): median and max of the relative error over seeds, the number of
    seeds, and the reference scales ``cond eps`` and ``cond^2 eps`` of the client precision."""
    out = study.groupby(["clients", "method", "cond(X)"])["rel. error vs lstsq"].agg(
        median="median", max="max", seeds="count").reset_index()
    eps = out["clients"].map({k: float(np.finfo(v).eps) for k, v in DTYPES.items()})
    out["cond·eps"] = out["cond(X)"] * eps
    out["cond²·eps"] = out["cond(X)"] ** 2 * eps
    return out


def error_slopes(study):
    """Least-squares slope of log10(median error) against log10(cond(X)) per (clients, method), over the
    conditions where the median error is finite and below 0.1 (before it saturates): ~1 means the
    error follows cond(X), ~2 cond(X)^2. Returns a Series (NaN with fewer than 2 such points)."""
    med = study.groupby(["clients", "method", "cond(X)"])["rel. error vs lstsq"].median().reset_index()
    out = {}
    for key, g in med.groupby(["clients", "method"]):
        g = g[np.isfinite(g["rel. error vs lstsq"]) & (g["rel. error vs lstsq"] < 0.1) & (g["rel. error vs lstsq"] > 0)]
        out[key] = (np.polyfit(np.log10(g["cond(X)"]), np.log10(g["rel. error vs lstsq"]), 1)[0]
                    if len(g) >= 2 else float("nan"))
    return pd.Series(out, name="slope").rename_axis(["clients", "method"])


def upload_comparison(feats, parts: Sequence[np.ndarray], gamma: float, reference: torch.Tensor):
    """On cached features ``feats`` (x_train, y_train, x_test, y_test, num_classes): TSQR (float64 and
    float32 clients) and AFL's one-solve server with the paper's packed upload, on the clients
    ``parts``. Returns ``(table, per_client, kappa)``: one row per method with the measured upload bytes
    per client (mean), in total (MiB), the clients whose upload is smaller than AFL's, the relative
    error against ``reference`` (d, C), the test accuracy and the measured seconds; one row per
    (method, client) with N_k and the measured upload bytes; and ``cond(X)`` of the live feature
    columns (singular values of the pooled TSQR factor's R11)."""
    rows, per_client = [], []
    sizes = np.array([len(p) for p in parts])
    res_afl = afl.run_afl(feats.x_train, feats.y_train, parts, feats.num_classes, gamma=gamma)
    afl_bytes = np.asarray(res_afl.upload_bytes)
    runs = [("AFL (one-solve server, the paper's upload)", res_afl.weights, res_afl.upload_bytes, res_afl.cost)]
    kappa = float("nan")
    for prec in DTYPES:
        res = run_tsqr(feats.x_train.astype(DTYPES[prec]), feats.y_train, parts, feats.num_classes, dtype=prec)
        runs.append((f"TSQR ({prec} clients)", res.weights, res.upload_bytes, res.cost))
        if prec == "float64":   # cond(X) of the live columns from the pooled factor: its R11 has X's singular values
            dim = res.factor.shape[1] - feats.num_classes
            live = np.abs(res.factor[:, :dim]).max(axis=0) > 0
            sv = np.linalg.svd(res.factor[:, :dim][:, live], compute_uv=False)
            kappa = float(sv[0] / sv[-1]) if sv[-1] > 0 else float("inf")
    for label, w, ub, cost in runs:
        ub = np.asarray(ub)
        per_client += [{"method": label, "N_k": int(n), "upload bytes": int(b)} for n, b in zip(sizes, ub)]
        rows.append({"method": label, "upload bytes/client (mean)": ub.mean(), "total upload (MiB)": ub.sum() / 2**20,
                     "clients uploading less than AFL": int((ub < afl_bytes).sum()),
                     "rel. error vs QR reference": relative_error(w.double().cpu(), reference),
                     "test accuracy": head_accuracy(w.double(), feats.x_test, feats.y_test),
                     "seconds": cost.seconds})
    return pd.DataFrame(rows).set_index("method"), pd.DataFrame(per_client), kappa


# ==============================================================================================
# 2. What the paper's upload reveals; secure aggregation of the one-solve statistics
# ==============================================================================================
def recover_statistics(msg: Message) -> tuple[torch.Tensor, torch.Tensor]:
    """From the paper's upload ``{W_k^r, C_k^r, gamma}``: ``(X_k^T X_k (d, d), X_k^T Y_k (d, C))``,
    eq. (reveal): ``X_k^T X_k = C_k^r - gamma I`` and ``X_k^T Y_k = C_k^r W_k^r`` (eq. 12 inverted).
    Column c of ``X_k^T Y_k`` is the sum of client k's feature vectors of class c."""
    c_r = afl.upload_gram(msg)
    gamma = msg["gamma"]
    check_positive("gamma", gamma, strict=False)
    eye = torch.eye(c_r.shape[0], dtype=c_r.dtype, device=c_r.device)
    return c_r - gamma * eye, c_r @ msg["W"]


def recover_single_sample(msg: Message) -> tuple[torch.Tensor, int]:
    """A one-sample client's feature vector x (d,) and label from its paper upload, eq. (reveal-one):
    ``X_k^T Y_k = x^T e_y`` has one non-zero column, the label y, and that column is x.
    ValueError when ``X_k^T Y_k`` does not have exactly one non-zero column (not one sample,
    or an empty client)."""
    _, xty = recover_statistics(msg)
    norms = torch.linalg.vector_norm(xty, dim=0)
    scale = float(norms.max()) if norms.numel() else 0.0
    nonzero = norms > 1e-8 * scale
    if scale == 0.0 or int(nonzero.sum()) != 1:
        raise ValueError(f"msg must be the upload of a one-sample client: its X^T Y has {int(nonzero.sum())} "
                         "non-zero class columns (one sample has exactly 1; an empty client has none)")
    label = int(torch.argmax(norms))
    return xty[:, label].clone(), label


def stats_vector(x: Array, labels: Array, num_classes: int) -> np.ndarray:
    """One client's one-solve statistics as one float64 vector: ``[packed G_k (d(d+1)/2), B_k (d C), N_k]``
    with ``G_k = X_k^T X_k``, ``B_k = X_k^T Y_k`` (row-major)."""
    xn, yn = _check_data(x, labels, num_classes)
    st = SufficientStats.from_data(xn, yn, num_classes) if len(yn) else \
        SufficientStats.zeros(xn.shape[1], num_classes)
    return np.concatenate([afl_speed.pack_symmetric(st.gram).numpy(), st.xty.numpy().ravel(), [float(st.n)]])


def stats_length(dim: int, num_classes: int) -> int:
    """Length of :func:`stats_vector`: ``d (d + 1) / 2 + d C + 1``."""
    return afl_speed.packed_length(dim) + dim * num_classes + 1


def vector_stats(v: np.ndarray, dim: int, num_classes: int) -> SufficientStats:
    """Inverse of :func:`stats_vector` (for a single client or a sum): ``SufficientStats(G, B, n)``."""
    if v.ndim != 1 or v.shape[0] != stats_length(dim, num_classes):
        raise ValueError(f"a statistics vector for d={dim}, C={num_classes} has {stats_length(dim, num_classes)} "
                         f"entries, got shape {v.shape}")
    p = afl_speed.packed_length(dim)
    gram = afl_speed.unpack_symmetric(torch.from_numpy(np.ascontiguousarray(v[:p])), dim)
    xty = torch.from_numpy(np.ascontiguousarray(v[p:p + dim * num_classes]).reshape(dim, num_classes))
    return SufficientStats(gram, xty, int(round(v[-1])))


def fixed_point_bits(max_abs: float, num_clients: int) -> tuple[int, int]:
    """Fractional bits ``(f_hi, f_lo)`` of the two-word fixed-point encoding, eq. (fixed).

    ``max_abs`` is a public bound on every entry of every client's statistics and of their sum.
    The high word holds ``round(v 2^f_hi)`` with ``f_hi = 62 - ceil(log2(max_abs))`` (below 2^62, so
    the sum stays in the ring's signed range); the low word holds the rest ``v - hi`` (at most
    2^-(f_hi+1)) on the much finer grid ``2^-f_lo``, ``f_lo = f_hi + 62 - ceil(log2 K)``, so that K
    of them also sum inside the signed range. The only rounding is each client's ``2^-(f_lo+1)``.
    """
    check_positive("max_abs", max_abs)
    check_int("num_clients", num_clients, 1)
    f_hi = 62 - int(np.ceil(np.log2(max_abs)))
    if f_hi < 0:
        raise ValueError(f"max_abs={max_abs:.3g} does not fit a 64-bit fixed-point ring (needs < 2^62)")
    return f_hi, f_hi + 62 - int(np.ceil(np.log2(max(num_clients, 2))))


def encode_fixed(v: np.ndarray, bits: tuple[int, int]) -> np.ndarray:
    """Float64 values (n,) -> ring elements (2, n) uint64 (two's complement mod 2^64), eq. (fixed):
    row 0 ``hi = round(v 2^f_hi)``, row 1 ``round((v - hi 2^-f_hi) 2^f_lo)``. ValueError if a value
    exceeds the bound the bits were chosen for (|v 2^f_hi| >= 2^62)."""
    f_hi, f_lo = bits
    v = np.asarray(v, dtype=np.float64)
    hi = np.rint(v * 2.0 ** f_hi)
    if not np.all(np.isfinite(hi)) or (hi.size and np.abs(hi).max() >= 2.0 ** 62):
        raise ValueError(f"a statistic exceeds the fixed-point range 2^62 / 2^{f_hi}: raise max_abs "
                         "(feature_bound / max_samples)")
    lo = np.rint((v - hi / 2.0 ** f_hi) * 2.0 ** f_lo)   # v - hi 2^-f_hi is exact (the low bits of v)
    return np.stack([hi, lo]).astype(np.int64).view(np.uint64)


def decode_fixed(u: np.ndarray, bits: tuple[int, int]) -> np.ndarray:
    """Ring elements (2, n) uint64 -> float64 (n,): ``hi 2^-f_hi + lo 2^-f_lo`` of the signed words."""
    f_hi, f_lo = bits
    s = np.asarray(u, dtype=np.uint64).view(np.int64).astype(np.float64)
    return s[0] / 2.0 ** f_hi + s[1] / 2.0 ** f_lo


def pair_mask(secret: int, i: int, j: int, length: int) -> np.ndarray:
    """The mask (length,) uint64 shared by clients i < j: uniform on the ring 2^64, from a PRG
    (PCG64) seeded by their pairwise seed ``derive_seed(secret, "pair-mask", i, j)``. In Bonawitz
    et al.'s protocol that seed is a Diffie-Hellman agreement of i and j, unknown to the server;
    here it stands for it (key agreement and dropout recovery are not simulated)."""
    if i == j:
        raise ValueError(f"a pairwise mask needs two different clients, got i = j = {i}")
    lo, hi = min(i, j), max(i, j)
    return np.random.PCG64(derive_seed(secret, "pair-mask", lo, hi)).random_raw(length).astype(np.uint64)


def client_mask(secret: int, k: int, num_clients: int, length: int) -> np.ndarray:
    """Client k's total mask (length,), eq. (mask): ``sum_{j > k} m_kj - sum_{j < k} m_jk`` (mod 2^64),
    so the masks of all clients sum to 0 in the ring."""
    check_int("num_clients", num_clients, 2)
    if not 0 <= k < num_clients:
        raise ValueError(f"k must be in [0, num_clients={num_clients}), got {k}")
    total = np.zeros(length, dtype=np.uint64)
    for j in range(num_clients):
        if j != k:
            m = pair_mask(secret, k, j, length)
            total = total + m if k < j else total - m   # uint64 arithmetic wraps mod 2^64
    return total


@dataclass
class MaskedStatsClient:
    """Client program of secure aggregation: ``step((x_k, labels_k), state, broadcast)`` encodes its
    one-solve statistics (:func:`stats_vector`) with the broadcast's ``frac_bits`` and adds its
    pairwise masks (:func:`client_mask`; ``masked=False``: no masks, the plain fixed-point upload).
    Refuses features above ``feature_bound`` in magnitude (the public bound the encoding assumes)."""

    num_classes: int
    num_clients: int
    secret: int
    feature_bound: float
    masked: bool = True

    def init_state(self, k: int) -> dict:
        return {"index": k}

    def step(self, data, state: dict, broadcast: Message) -> Message:
        x, labels = data
        xn, yn = _check_data(x, labels, self.num_classes)
        if xn.size and np.abs(xn).max() > self.feature_bound:
            raise ValueError(f"a feature of client {state['index']} has magnitude {np.abs(xn).max():.3g} > "
                             f"feature_bound={self.feature_bound}: raise feature_bound or clip the features")
        enc = encode_fixed(stats_vector(xn, yn, self.num_classes), tuple(broadcast["frac_bits"]))
        if self.masked:
            enc = enc + client_mask(self.secret, state["index"], self.num_clients, enc.size).reshape(enc.shape)
        return Message(f"client{state['index']}", {"masked": enc})


class SecureSumServer(Server):
    """Server of secure aggregation: broadcasts ``frac_bits``, adds the uploads in the ring (mod 2^64,
    so the masks cancel exactly), decodes the sum once and solves ``(sum G_k) W = sum B_k``
    (:func:`~fedlib.core.linalg.ridge_solve`), eq. (secure-solve). Keeps the first ``keep``
    uploads as the server saw them (for the chapter's look at them)."""

    def __init__(self, dim: int, num_classes: int, frac_bits: tuple[int, int], keep: int = 0):
        self.dim, self.num_classes, self.frac_bits = dim, num_classes, tuple(int(b) for b in frac_bits)
        self.total = np.zeros((2, stats_length(dim, num_classes)), dtype=np.uint64)
        self.seen: list[np.ndarray] = []
        self.keep = keep
        self.count = 0

    def broadcast(self) -> Message:
        return Message("server", {"frac_bits": list(self.frac_bits)})

    def expects(self) -> uploads.Expected:
        """One (2, d(d+1)/2 + d C + 1) uint64 ring vector per client."""
        return uploads.Expected(({"masked": uploads.Tensor(self.total.shape, ("uint64",), array="numpy")},),
                                what="masked upload")

    def absorb(self, messages: Sequence[Message]) -> None:
        for msg in messages:
            u = msg["masked"]
            self.total = self.total + u
            if len(self.seen) < self.keep:
                self.seen.append(u.copy())
            self.count += 1

    def sums(self) -> SufficientStats:
        """The decoded sums ``(sum G_k, sum B_k, sum N_k)``."""
        return vector_stats(decode_fixed(self.total, self.frac_bits), self.dim, self.num_classes)

    def result(self) -> torch.Tensor:
        s = self.sums()
        return ridge_solve(s.gram, s.xty)


@dataclass
class SecureAggResult:
    weights: torch.Tensor        # (d, C)
    sums: SufficientStats        # decoded sums
    raw_sum: np.ndarray          # (2, n) the ring sum (uint64), before decoding
    seen: list[np.ndarray]       # uploads (2, n) as the server received them
    frac_bits: tuple[int, int]
    cost: Cost


def run_secure_aggregation(x: Array, labels: Array, parts: Sequence[np.ndarray], num_classes: int, secret: int,
                           feature_bound: float, max_samples: int | None = None, masked: bool = True,
                           keep: int = 2) -> SecureAggResult:
    """One-solve AFL under pairwise additive masks, on :func:`~fedlib.core.protocol.simulate`.

    The fixed-point bits come from public bounds: every statistic of a client and of the sum is at
    most ``max_samples * max(feature_bound^2, feature_bound, 1)`` in magnitude (``max_samples``
    defaults to N). ``masked=False`` runs the same encoding without masks (the reference whose sum the
    masked run must equal bit for bit)."""
    check_positive("feature_bound", feature_bound)
    xn, yn = _check_data(x, labels, num_classes)
    parts = _check_parts(parts, len(yn))
    if len(parts) < 2:
        raise ValueError(f"parts must hold at least 2 clients for pairwise masks, got {len(parts)}")
    max_samples = len(yn) if max_samples is None else check_int("max_samples", max_samples, 1)
    bits = fixed_point_bits(max_samples * max(feature_bound ** 2, feature_bound, 1.0), len(parts))
    server = SecureSumServer(xn.shape[1], num_classes, bits, keep)
    client = MaskedStatsClient(num_classes, len(parts), secret, feature_bound, masked)
    cost = simulate(server, client, [(xn[p], yn[p]) for p in parts])
    t0 = time.perf_counter()
    w = server.result()
    cost.seconds += time.perf_counter() - t0
    return SecureAggResult(w, server.sums(), server.total.copy(), server.seen, bits, cost)


def masked_view(upload: np.ndarray, plain: np.ndarray, frac_bits: tuple[int, int]) -> dict:
    """How a masked upload compares with the client's true statistics (both uint64 ring vectors):
    Pearson correlation of their decoded values, and the relative error of the decoded masked
    upload as an estimate of the true statistics (both decoded as signed fixed point)."""
    a, b = decode_fixed(upload, frac_bits), decode_fixed(plain, frac_bits)
    return {"correlation": float(np.corrcoef(a, b)[0, 1]),
            "relative error": float(np.abs(a - b).max() / np.abs(b).max())}


# ==============================================================================================
# 3. Ridge path, leave-one-client-out validation and unlearning from per-client statistics
# ==============================================================================================
@dataclass
class StatsClient:
    """Client program uploading its one-solve statistics in the clear (float64):
    ``{"G_packed": upper triangle of G_k = X_k^T X_k (d(d+1)/2,), "B": X_k^T Y_k (d, C), "n": N_k}``,
    the same ``G_k, B_k`` the server recovers from the paper's upload (:func:`recover_statistics`)
    plus the count ``N_k`` (8 bytes)."""

    num_classes: int

    def init_state(self, k: int) -> dict:
        return {"name": f"client{k}"}

    def step(self, data, state: dict, broadcast: Message) -> Message:
        x, labels = data
        xn, yn = _check_data(x, labels, self.num_classes)
        st = SufficientStats.from_data(xn, yn, self.num_classes) if len(yn) else \
            SufficientStats.zeros(xn.shape[1], self.num_classes)
        return Message(state["name"], {"G_packed": afl_speed.pack_symmetric(st.gram), "B": st.xty, "n": int(st.n)})


class StatsServer(Server):
    """Keeps every client's statistics ``(G_k, B_k, N_k)`` (:class:`StatsClient` uploads): what
    leave-one-client-out validation and unlearning need (unlike the ridge path, which needs the sums only)."""

    def __init__(self):
        self.clients: list[SufficientStats] = []

    def broadcast(self) -> Message:
        return EMPTY

    def expects(self) -> uploads.Expected:
        """{B (d, C), G_packed (d(d+1)/2,), n >= 0}, float64, finite; d and C as the first client's."""
        form = {"B": uploads.Tensor(("d", "C"), ("float64",)),
                "G_packed": uploads.Tensor((lambda dims: afl_speed.packed_length(dims["d"]),), ("float64",)),
                "n": uploads.Number(low=0, integer=True)}
        known = self.clients[0].xty.shape if self.clients else (None, None)
        return uploads.Expected((form,), {"d": known[0], "C": known[1]}, what="statistics upload")

    def absorb(self, messages: Sequence[Message]) -> None:
        for msg in messages:
            xty = msg["B"]
            self.clients.append(SufficientStats(afl_speed.unpack_symmetric(msg["G_packed"], xty.shape[0]), xty, int(msg["n"])))

    def result(self) -> list[SufficientStats]:
        return self.clients


def client_statistics(x: Array, labels: Array, parts: Sequence[np.ndarray], num_classes: int) -> list[SufficientStats]:
    """Per-client statistics ``(G_k, B_k, N_k)`` (float64) as the server collects them through the
    protocol (:class:`StatsClient`, :class:`StatsServer`)."""
    xn, yn = _check_data(x, labels, num_classes)
    parts = _check_parts(parts, len(yn))
    server = StatsServer()
    simulate(server, StatsClient(num_classes), [(xn[p], yn[p]) for p in parts])
    return server.result()


def _check_lams(lams: Sequence[float]) -> np.ndarray:
    lams = np.asarray(lams, dtype=np.float64)
    if lams.ndim != 1 or lams.size == 0:
        raise ValueError(f"lams must be a non-empty list of ridge parameters >= 0, got {lams!r}")
    for i, lam in enumerate(lams):
        check_positive(f"lams[{i}]", float(lam), strict=False)
    return lams


def _path_coefficients(mu: torch.Tensor, lams: np.ndarray, rcond: float | None) -> torch.Tensor:
    """(L, d): ``1 / (mu_i + lam)`` where ``mu_i + lam`` is above ``rcond max mu`` (``d eps`` default), else 0
    (the minimum-norm choice on a numerically null direction)."""
    top = float(mu.abs().max()) if mu.numel() else 0.0
    tol = (mu.shape[0] * torch.finfo(mu.dtype).eps if rcond is None else rcond) * top
    den = mu[None, :] + torch.as_tensor(lams, dtype=mu.dtype)[:, None]
    return torch.where(den > tol, 1.0 / den.clamp_min(tol if tol > 0 else 1e-300), torch.zeros_like(den))


def ridge_path(gram: torch.Tensor, xty: torch.Tensor, lams: Sequence[float], rcond: float | None = None) -> torch.Tensor:
    """Every ridge head ``W(lam) = (G + lam I)^{-1} B`` (L, d, C) from one eigendecomposition
    ``G = V diag(mu) V^T``, eq. (ridge-path): ``W(lam) = V diag(1 / (mu + lam)) V^T B``, O(d^2 C) per
    lam after the O(d^3) decomposition. A direction with ``mu + lam <= rcond max mu`` gets 0."""
    lams = _check_lams(lams)
    if gram.ndim != 2 or gram.shape[0] != gram.shape[1] or xty.ndim != 2 or xty.shape[0] != gram.shape[0]:
        raise ValueError(f"gram must be (d, d) and xty (d, C), got shapes {tuple(gram.shape)} and {tuple(xty.shape)}")
    sym = (gram + gram.T) / 2
    if sym.device.type == "cpu":   # LAPACK syevd through NumPy: faster than torch's on CPU at d ~ 1000
        mu, vec = (torch.from_numpy(a).to(sym.dtype) for a in np.linalg.eigh(sym.numpy()))
    else:
        mu, vec = torch.linalg.eigh(sym)
    z = vec.T @ xty                                   # (d, C)
    coef = _path_coefficients(mu, lams, rcond)        # (L, d)
    return torch.einsum("ij,ljc->lic", vec, coef[:, :, None] * z[None])


def validation_error(stats: SufficientStats, weights: torch.Tensor) -> float:
    """Squared error ``||Y_k - X_k W||_F^2`` of a head W (d, C) on a client's own data from its statistics
    alone, eq. (loco-error): ``N_k - 2 tr(W^T B_k) + tr(W^T G_k W)`` (one-hot targets: ``tr(Y_k^T Y_k) = N_k``)."""
    if weights.shape != stats.xty.shape:
        raise ValueError(f"weights must be (d, C) = {tuple(stats.xty.shape)}, got {tuple(weights.shape)}")
    return float(stats.n - 2 * (weights * stats.xty).sum() + (weights * (stats.gram @ weights)).sum())


def loco_errors(clients: Sequence[SufficientStats], lams: Sequence[float], progress: bool = False) -> np.ndarray:
    """Leave-one-client-out validation errors (K, L), eq. (loco): row k holds client k's squared error
    (:func:`validation_error`) of the ridge head trained on all other clients,
    ``W_{-k}(lam) = (G - G_k + lam I)^{-1} (B - B_k)``, along the whole ``lams`` path (one
    eigendecomposition of ``G - G_k`` per client). Every client must hold at least one sample."""
    lams = _check_lams(lams)
    if len(clients) < 2:
        raise ValueError(f"clients must hold at least 2 clients' statistics for leave-one-client-out, got {len(clients)}")
    empty = [k for k, s in enumerate(clients) if s.n == 0]
    if empty:
        raise ValueError(f"clients {empty} hold no sample: leave-one-client-out validation needs N_k >= 1 "
                         "(leave empty clients out)")
    total = clients[0]
    for s in clients[1:]:
        total = total + s
    out = np.zeros((len(clients), lams.size))
    for k, s in enumerate(tqdm(clients, desc="leave-one-client-out", disable=not progress)):
        path = ridge_path(total.gram - s.gram, total.xty - s.xty, lams)
        gw = torch.einsum("ij,ljc->lic", s.gram, path)
        out[k] = (s.n - 2 * (path * s.xty[None]).sum(dim=(1, 2)) + (path * gw).sum(dim=(1, 2))).numpy()
    return out


def unlearn(total: SufficientStats, removed: SufficientStats) -> torch.Tensor:
    """Exact removal of a client by subtraction, eq. (unlearn): ``W_{-k} = (G - G_k)^{-1} (B - B_k)``,
    the least-squares head of the remaining data (minimum-norm if ``G - G_k`` is singular)."""
    if total.gram.shape != removed.gram.shape or total.xty.shape != removed.xty.shape:
        raise ValueError(f"removed must have the shapes of total: gram {tuple(total.gram.shape)}, "
                         f"xty {tuple(total.xty.shape)}; got {tuple(removed.gram.shape)}, {tuple(removed.xty.shape)}")
    if removed.n > total.n:
        raise ValueError(f"removed holds {removed.n} samples, more than total ({total.n})")
    return ridge_solve(total.gram - removed.gram, total.xty - removed.xty)


def sum_stats(clients: Sequence[SufficientStats]) -> SufficientStats:
    """Sum of client statistics (what the server aggregates)."""
    if len(clients) == 0:
        raise ValueError("clients must hold at least one client's statistics")
    total = SufficientStats(clients[0].gram.clone(), clients[0].xty.clone(), clients[0].n)
    for s in clients[1:]:
        total += s
    return total


def hyperparameter_study(feats, num_clients: int, alpha: float, seeds: Sequence[int], lams: Sequence[float],
                         progress: bool = True):
    """The ridge parameter from the uploads alone, per partition seed: Dirichlet(``alpha``) split of the
    training features into ``num_clients`` clients; the LOCO error summed over clients along ``lams``
    (plus lam = 0, AFL's restored head) picks lam*. Returns ``(runs, path)``: ``runs`` has one row per
    seed (lam*, test accuracy at lam*, at lam = 0, the best test accuracy on the grid in hindsight
    and its lam); ``path`` the test accuracy and the LOCO error (per seed) for every lam."""
    grid = np.concatenate([[0.0], _check_lams(lams)])
    total = SufficientStats.from_data(feats.x_train, feats.y_train, feats.num_classes)
    heads = ridge_path(total.gram, total.xty, grid)
    test_acc = np.array([head_accuracy(w, feats.x_test, feats.y_test) for w in heads])
    best = int(np.argmax(test_acc))
    rows, curves = [], []
    for seed in tqdm(list(seeds), desc="partitions", disable=not progress):
        parts = make_partition(feats.y_train, num_clients, "dirichlet", alpha=alpha, seed=seed)
        parts = [p for p in parts if len(p)]       # an empty client has nothing to validate on
        err = loco_errors(client_statistics(feats.x_train, feats.y_train, parts, feats.num_classes), grid).sum(0)
        pick = int(np.argmin(err))
        rows.append({"seed": seed, "clients": len(parts), "LOCO λ*": grid[pick], "acc at LOCO λ*": test_acc[pick],
                     "acc at λ=0 (AFL)": test_acc[0], "best λ (hindsight)": grid[best],
                     "best acc (hindsight)": test_acc[best]})
        curves += [{"seed": seed, "λ": lam, "LOCO error / N": e / len(feats.y_train), "test accuracy": a}
                   for lam, e, a in zip(grid, err, test_acc)]
    return pd.DataFrame(rows), pd.DataFrame(curves)


def loco_errors_explicit(x: Array, labels: Array, parts: Sequence[np.ndarray], num_classes: int,
                         lams: Sequence[float]) -> np.ndarray:
    """Reference for :func:`loco_errors` (K, L) by explicit retraining: for each client k and lam, NumPy
    ``lstsq`` on the other clients' samples (``[X; sqrt(lam) I]``, an SVD of the data, no statistics)
    and the squared error ``||Y_k - X_k W||_F^2`` evaluated on client k's samples."""
    xn, yn = _check_data(x, labels, num_classes)
    parts = _check_parts(parts, len(yn))
    lams = _check_lams(lams)
    out = np.zeros((len(parts), lams.size))
    for k, p in enumerate(parts):
        rest = np.concatenate([q for j, q in enumerate(parts) if j != k])
        for i, lam in enumerate(lams):
            w = lstsq_reference(xn[rest], yn[rest], num_classes, lam=float(lam)).numpy()
            out[k, i] = float(((np.eye(num_classes)[yn[p]] - xn[p] @ w) ** 2).sum())
    return out


def unlearning_check(x: Array, labels: Array, parts: Sequence[np.ndarray], num_classes: int, removed: int,
                     x_test: Array | None = None, y_test: Array | None = None, afl_retrain: bool = True) -> dict:
    """Remove client ``removed`` of ``parts`` by subtraction (:func:`unlearn`, from the clients'
    statistics collected through the protocol) and compare with retraining: NumPy ``lstsq`` on the
    remaining samples and (``afl_retrain``) AFL (one-solve, gamma = 1, RI) run on the remaining
    clients. Returns the relative errors, the tolerance ``2 cond(G - G_k) eps``, the seconds of the
    subtraction and solve, and, with a test set, the test accuracies before and after."""
    xn, yn = _check_data(x, labels, num_classes)
    parts = _check_parts(parts, len(yn))
    if not 0 <= removed < len(parts):
        raise ValueError(f"removed must index a client of parts (0..{len(parts) - 1}), got {removed}")
    clients = client_statistics(xn, yn, parts, num_classes)
    total = sum_stats(clients)
    t0 = time.perf_counter()
    w_unlearn = unlearn(total, clients[removed])
    seconds = time.perf_counter() - t0
    keep = np.sort(np.concatenate([p for k, p in enumerate(parts) if k != removed]))
    w_lstsq = lstsq_reference(xn[keep], yn[keep], num_classes)
    cond = gram_report(total.gram - clients[removed].gram)["condition number"]
    out = {"removed samples": int(clients[removed].n), "remaining samples": int(len(keep)),
           "rel. error vs lstsq (remaining data)": relative_error(w_unlearn, w_lstsq),
           "tolerance 2·cond(G - G_k)·eps": normal_equations_tolerance(cond), "cond(G - G_k)": cond,
           "seconds (subtraction + solve)": seconds}
    if afl_retrain:
        rest = [p for k, p in enumerate(parts) if k != removed]
        w_afl = afl.run_afl(xn, yn, rest, num_classes, gamma=1.0).weights
        out["rel. error vs AFL retrained"] = relative_error(w_unlearn, w_afl)
        out["AFL retrained vs lstsq"] = relative_error(w_afl, w_lstsq)
    if x_test is not None and y_test is not None:
        out["test acc. before"] = head_accuracy(ridge_solve(total.gram, total.xty), x_test, y_test)
        out["test acc. after"] = head_accuracy(w_unlearn, x_test, y_test)
    return out
