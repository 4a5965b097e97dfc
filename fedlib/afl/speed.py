"""AFL's opt-in speed paths: the packed symmetric upload and the one-pass server sums (compiled loops).

Neither changes what AFL computes; each is chosen by an option of :mod:`fedlib.afl.algorithm` and held
equal to the readable path by the tests (``tests/afl/test_afl.py``):

* **packed upload** (``packed=True``, the default): the symmetric ``C_k^r`` travels as its upper
  triangle, ``d(d+1)/2`` numbers in the row-major order of ``torch.triu_indices`` (entry
  ``"C_packed"``), about half of the paper's ``d^2`` (:func:`pack_symmetric`, :func:`packed_gram`,
  :func:`unpack_symmetric`);
* **one-pass sums** (``OneSolveServer(fast=True)``, the default; :class:`OnePassSums`): per upload the
  one-solve server must read ``C_k^r`` once and form ``C_k^r W_k^r`` (``d^2 C`` multiply-adds). Both
  are done in one pass over the upload by compiled loops (numba, :func:`absorb_packed` /
  :func:`absorb_full`), not as an addition followed by a separate matrix product; a packed upload is
  added to a packed sum (each off-diagonal entry serving ``B[i]`` and ``B[j]``), unpacked once at the end.

The loops index without bounds checks, so their entry points check every size first.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

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
    loops = kernels() if c.device.type == "cpu" and c.ndim == 2 and c.shape[1] == dim and dim else None
    if loops is not None:
        out = torch.empty(packed_length(dim), dtype=c.dtype)
        loops["block"](c.detach().contiguous().numpy(), 0, dim, float(shift), out.numpy())
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
    loops = kernels() if x.device.type == "cpu" else None
    if loops is None:
        return pack_symmetric(x.T @ x, shift=shift)
    dim = int(x.shape[1])
    out = torch.empty(packed_length(dim), dtype=x.dtype)
    target = out.numpy()
    for i0 in range(0, dim, _GRAM_BLOCK):
        block = x[:, i0:i0 + _GRAM_BLOCK].T @ x[:, i0:]
        loops["block"](block.numpy(), i0, dim, float(shift), target)
    return out


def _pack_block_loop(block, i0, dim, shift, out):
    """Copy rows ``i0, i0 + 1, ...`` of the triangle from ``block`` (b, d - i0) = rows i0:i0+b of the
    symmetric matrix from column i0 on, into their packed segments of ``out``; ``shift`` added to the
    diagonal entries. NumPy arrays; compiled by numba (:func:`kernels`)."""
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


def _absorb_packed_loop(gp, rt, p, wt, m0, m1, q0, q1):
    """``gp[q0:q1] += p[q0:q1]`` and rows ``m0:m1`` of ``rt += (S W)^T`` for the symmetric S whose upper
    triangle is ``p`` (row-major, :func:`pack_symmetric`), in one pass over ``p``: row i's segment
    ``S[i, i:]`` gives ``B[i] += S[i, i:] W[i:]`` and, off the diagonal, ``B[j] += S[i, j] W[i]`` (j > i).
    NumPy arrays: gp, p (d(d+1)/2,); wt, rt (C, d) (W and B transposed, so every inner loop runs
    over contiguous memory). Threads given disjoint ``m0:m1`` and ``q0:q1`` never write the same
    entry. Compiled by numba (:func:`kernels`)."""
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
    write the same entry. Compiled by numba (:func:`kernels`)."""
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


def kernels() -> dict | None:
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
    if not _POOL or _POOL[0][0] < len(ranges) - 1 or _POOL[0][2] != os.getpid():   # new pool after a fork
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


def absorb_packed(gram_packed: torch.Tensor, rhs_t: torch.Tensor, p_k: torch.Tensor, w_k: torch.Tensor) -> None:
    """Add a packed upload to the one-solve server's sums: ``gram_packed += p_k`` and
    ``rhs_t += (C_k W_k)^T`` with ``C_k`` symmetric of upper triangle ``p_k``, in place.

    On the CPU: the compiled one-pass kernel, split over ``torch.get_num_threads()`` threads by
    classes (each thread also adds its share of the packed sum); deterministic (no two threads
    write one entry). Elsewhere, or without numba: unpack, add and multiply with torch.
    """
    dim, num_classes = _kernel_sizes(rhs_t, w_k)
    _require(gram_packed.shape == p_k.shape == (packed_length(dim),), "packed Gram", gram_packed, p_k)
    loops = kernels() if p_k.device.type == "cpu" else None
    if loops is None:
        gram_packed += p_k
        rhs_t.T.addmm_(unpack_symmetric(p_k, w_k.shape[0]), w_k.to(rhs_t.dtype))
        return
    p, wt = _host_arrays(gram_packed, p_k, w_k)
    num_classes, total = wt.shape[0], p.shape[0]
    threads = max(1, min(torch.get_num_threads(), num_classes))
    ranges = [(num_classes * t // threads, num_classes * (t + 1) // threads, total * t // threads,
               total * (t + 1) // threads) for t in range(threads)]
    _in_threads(loops["packed"], (gram_packed.numpy(), rhs_t.numpy(), p, wt), ranges)


def absorb_full(gram: torch.Tensor, rhs_t: torch.Tensor, c_k: torch.Tensor, w_k: torch.Tensor) -> None:
    """Add a full upload to the one-solve server's sums: ``gram += c_k`` and ``rhs_t += (c_k W_k)^T``,
    in place; on the CPU the compiled one-pass kernel over ``torch.get_num_threads()`` row ranges,
    elsewhere (or without numba) torch's addition and matrix product."""
    dim, num_classes = _kernel_sizes(rhs_t, w_k)
    _require(gram.shape == c_k.shape == (dim, dim), "Gram", gram, c_k)
    loops = kernels() if c_k.device.type == "cpu" else None
    if loops is None:
        gram += c_k
        rhs_t.T.addmm_(c_k, w_k.to(rhs_t.dtype))
        return
    c, wt = _host_arrays(gram, c_k, w_k)
    dim = c.shape[0]
    threads = max(1, min(torch.get_num_threads(), dim))
    ranges = [(dim * t // threads, dim * (t + 1) // threads) for t in range(threads)]
    _in_threads(loops["full"], (gram.numpy(), rhs_t.numpy(), c, wt), ranges)


class OnePassSums:
    """The one-solve server's sums ``C^r = sum_k C_k^r`` and ``B = sum_k C_k^r W_k^r`` in one pass per
    upload: a full upload (``"C"``) is added row by row, each row's dot products with W formed while it
    is in cache (:func:`absorb_full`); a packed one (``"C_packed"``) is added to a packed sum, read once
    and never unpacked (:func:`absorb_packed`); a statistics upload (``"B"`` = C_k^r W_k^r already) is only
    added. All forms may be mixed; :attr:`gram` unpacks the packed sum once."""

    def __init__(self):
        self.gram_full: torch.Tensor | None = None     # (d, d): sum of the full uploads' C_k^r
        self.rhs_full_t: torch.Tensor | None = None    # (C, d): their sum of (C_k^r W_k^r)^T
        self.gram_packed: torch.Tensor | None = None   # (d(d+1)/2,): sum of the packed uploads' triangles
        self.rhs_packed_t: torch.Tensor | None = None  # (C, d): their sum of (C_k^r W_k^r)^T

    def add(self, c_k: torch.Tensor, head: torch.Tensor, packed: bool, statistics: bool) -> None:
        """Add one upload: its Gram entry ``c_k`` (full or packed) and its head (W, or B if ``statistics``)."""
        if (self.gram_packed if packed else self.gram_full) is None:
            sums = torch.zeros_like(c_k), torch.zeros(head.shape[1], head.shape[0], dtype=c_k.dtype, device=c_k.device)
            if packed:
                self.gram_packed, self.rhs_packed_t = sums
            else:
                self.gram_full, self.rhs_full_t = sums
        gram, rhs_t = (self.gram_packed, self.rhs_packed_t) if packed else (self.gram_full, self.rhs_full_t)
        if statistics:   # C_k^r W_k^r already formed: only sums
            gram += c_k
            rhs_t += head.T
        else:
            (absorb_packed if packed else absorb_full)(gram, rhs_t, c_k, head)

    @property
    def empty(self) -> bool:
        return self.gram_full is None and self.gram_packed is None

    @property
    def gram(self) -> torch.Tensor | None:
        """``C^r`` (d, d) (the packed sum unpacked), or None."""
        if self.gram_packed is None:
            return self.gram_full
        gram = unpack_symmetric(self.gram_packed, self.rhs_packed_t.shape[1])
        return gram if self.gram_full is None else gram + self.gram_full

    @property
    def rhs(self) -> torch.Tensor | None:
        """``B`` (d, C), or None."""
        parts = [r.T for r in (self.rhs_full_t, self.rhs_packed_t) if r is not None]
        if not parts:
            return None
        return parts[0].contiguous() if len(parts) == 1 else parts[0] + parts[1]
