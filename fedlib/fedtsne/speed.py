"""FedDL's opt-in speed paths (``FedDLClient(fast=True)``, ``FedDLServer(fast=True)``, the defaults).

They compute what :mod:`fedlib.fedtsne.algorithm` writes out (Eqs. 10, 13, 15-16), to round-off
(``tests/fedtsne/``): the client keeps its squared row norms and the constant term of f_p, the Y-Y terms
are computed once per broadcast, the kernel and gradient are formed in place, a ``dtype="float32"`` run
keeps float32 copies, noise is added by one BLAS axpy pass, and a round of several clients in one
process computes their distances to the landmarks as one product over their stacked rows
(:func:`stacked_round`). The server sums the uploads by axpy passes (:func:`weighted_sum`).
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch
from scipy.linalg.blas import get_blas_funcs

from fedlib.core import seeds
from fedlib.fedtsne.mmd import cross_terms, sq_distances_from_norms, xx_term, yy_terms


class RoundCache:
    """What one process computes once per broadcast for all its clients: the landmarks' squared row
    norms, the Y-Y terms, and the stacked rows of the last round's clients."""

    def __init__(self):
        self.ysq = self.yy = self.stacked = None

    def y_sq(self, Y: np.ndarray) -> np.ndarray:
        if self.ysq is None or self.ysq[0] is not Y:
            self.ysq = (Y, np.einsum("ij,ij->i", Y, Y))    # in Y's dtype
        return self.ysq[1]

    def yy_terms(self, Y: np.ndarray, gamma: float):
        if self.yy is None or self.yy[0] is not Y or self.yy[1] != gamma:
            self.yy = (Y, gamma, yy_terms(Y, gamma))
        return self.yy[2]


def prepare(state: dict, gamma: float, float32: bool) -> None:
    """At a client's first round: its constant f_p term, squared row norms and (float32) the copy it
    computes its gradients from, kept in its state."""
    if "xx" in state:
        return
    x = state["data"]
    state["xx"] = xx_term(x, gamma)                  # the constant part of f_p (Eq. 10)
    state["x_sq"] = np.einsum("ij,ij->i", x, x)
    if float32:
        state["x32"] = x.astype(np.float32)
        state["x_sq"] = state["x_sq"].astype(np.float32)


def client_terms(cache: RoundCache, state: dict, Y: np.ndarray, gamma: float, float32: bool,
                 sq_dist: np.ndarray | None = None) -> tuple[float, np.ndarray]:
    """(f_p(Y) (Eq. 10), grad f_p(Y) (Eq. 13)) of one client, the gradient a fresh array it owns;
    ``sq_dist``: its rows of the squared distances to Y when already computed (:func:`stacked_round`)."""
    prepare(state, gamma, float32)
    x = state.get("x32", state["data"])
    yy_val, yy_grad = cache.yy_terms(Y, gamma)
    cross_val, cross_grad = cross_terms(x, Y, gamma, state["x_sq"], cache.y_sq(Y), sq_dist)
    cross_grad += yy_grad        # the client's own fresh array: Eq. 13 summed in place
    return state["xx"] + cross_val + yy_val, cross_grad


def objective(state: dict, Y: np.ndarray, gamma: float) -> float:
    """f_p(Y) (Eq. 10) of a client that has run a round (its constant term kept), in float64."""
    return state["xx"] + cross_terms(state["data"], Y, gamma)[0] + yy_terms(Y, gamma)[0]


def stacked_round(client, states: Sequence[dict], broadcast) -> list | None:
    """A "gradient" round of several clients in one process: the squared distances of every client's rows
    to the landmarks as ONE product over their stacked rows (kept while the same clients come back), then
    each client's round from its own block. None where it does not apply (the per-client loop runs)."""
    Y = broadcast.payload.get("landmarks")
    if Y is None or client.mode != "gradient" or len(states) < 2 or any(s["data"] is None for s in states):
        return None
    for state in states:
        prepare(state, broadcast["gamma"], client.dtype == "float32")
    xs = [state.get("x32", state["data"]) for state in states]
    if any(x.dtype != Y.dtype for x in xs):    # mixed dtypes: each client's terms in float64
        return None
    cache = client.cache
    if cache.stacked is None or len(cache.stacked[0]) != len(xs) or any(a is not b for a, b in zip(cache.stacked[0], xs)):
        bounds = np.cumsum([0] + [len(x) for x in xs])
        x_sq = np.concatenate([state["x_sq"] for state in states])
        cache.stacked = (xs, np.concatenate(xs), x_sq, bounds)
    _, x_all, x_sq, bounds = cache.stacked
    d2 = sq_distances_from_norms(x_all, Y, x_sq, cache.y_sq(Y))
    return [client.round(state, broadcast, d2[a:b]) for state, a, b in zip(states, bounds[:-1], bounds[1:])]


def add_scaled(target: np.ndarray, x: np.ndarray, a: float) -> np.ndarray:
    """target + a x, written into ``target`` (an array the caller owns) by one BLAS axpy pass; x is read
    in target's dtype. Returns the sum (target itself when it is C-contiguous)."""
    if np.shape(x) != np.shape(target):   # BLAS would update a prefix of the flat arrays
        raise ValueError(f"cannot add an array of shape {np.shape(x)} to one of shape {np.shape(target)}")
    target = np.ascontiguousarray(target)
    flat = target.reshape(-1)
    x = np.ascontiguousarray(x, dtype=target.dtype).reshape(-1)
    return get_blas_funcs("axpy", (flat,))(x, flat, a=a).reshape(target.shape)


def weighted_sum(arrays: Sequence[np.ndarray], weights: Sequence[float]) -> np.ndarray:
    """sum_p weights[p] arrays[p] (arrays of one shape and dtype) into one new array, one axpy pass over each
    upload and no temporaries (:func:`add_scaled`; the server's aggregation of Eqs. 15-16)."""
    total = np.multiply(arrays[0], weights[0])
    for a, wp in zip(arrays[1:], weights[1:]):
        total = add_scaled(total, a, wp)
    return total


def entry_sd(g: np.ndarray) -> float:
    """The standard deviation of g's entries (as ``g.std()``) from two BLAS passes, sqrt(g.g/n - mean^2);
    ``g.std()`` itself when the variance is below 1e-6 mean^2, where that difference would cancel."""
    flat = g.reshape(-1)
    mean = float(flat.sum()) / flat.size
    var = float(np.dot(flat, flat)) / flat.size - mean * mean
    return math.sqrt(var) if var > 1e-6 * mean * mean else float(g.std())


def float32_normals(state: dict, seed: int, shape) -> np.ndarray:
    """float32 N(0, 1) draws of client ``state["k"]`` for ``dtype="float32"``: from its own CPU torch
    generator, stream ("feddl", p) of ``seed`` (torch draws float32 normals ~2.5x faster than numpy),
    made on the first draw and kept in ``state``."""
    gen = state.get("torch_rng")
    if gen is None:
        gen = state["torch_rng"] = seeds.torch_generator(seed, "feddl", state["k"])
    return torch.randn(tuple(shape), generator=gen, dtype=torch.float32).numpy()
