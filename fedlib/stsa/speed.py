"""STSA's opt-in speed path for the chapters: every method of a seed shares one pass of the rows through
the random layer R (:func:`expanded_features`), which every client would compute alike. It changes no
number (tested against the per-client expansion in ``tests/stsa/``)."""
from __future__ import annotations

import time
from collections import OrderedDict

import numpy as np

from fedlib.data.features import Features
from fedlib.stsa.algorithm import RandomFeatures

_EXPANDED: "OrderedDict[tuple, tuple]" = OrderedDict()   # (id(features), seed, M) -> (features, expanded, s/row)
EXPANDED_CACHE_SIZE = 4   # (features, seed, M) entries kept: 64 MB each at N = 8000, M = 1000 (float64)


def expanded_features(features, seed: int, M: int, shift=None):
    """``(Phi, seconds_per_row)``: ``features`` (a :class:`fedlib.data.features.Features`, d-dim) with every
    train and test row through the random layer R of ``seed`` (Phi = ReLU(x W_rand), (N, M) float64, eq. 1),
    computed once and kept for the next runs of the same (features, seed, M) (an LRU of
    :data:`EXPANDED_CACHE_SIZE` entries), and the measured seconds per training row of that expansion.

    R is a fixed function of the seed, so every client of every run with this seed computes exactly
    these rows (to float round-off: one product over all rows instead of one per client); every
    analytic method and Joint of a seed then shares one expansion, as every method shares one pass
    through the backbone.

    ``shift`` = ``(key, train_shift (N, d), test_shift (N_test, d))``: expand ``x + shift`` instead (feature
    skew: each row moved by its client's delta_k, as :class:`FeatureSkewLearner` moves it), cached
    under ``key`` (which must name everything that decides the shifts)."""
    key = (id(features), int(seed), int(M), None if shift is None else shift[0])
    hit = _EXPANDED.get(key)
    if hit is not None and hit[0] is features:
        _EXPANDED.move_to_end(key)
        return hit[1], hit[2]

    rf = RandomFeatures(features.x_train.shape[1], M, seed)
    x_train, x_test = features.x_train, features.x_test
    if shift is not None:
        x_train, x_test = x_train.astype(np.float64) + shift[1], x_test.astype(np.float64) + shift[2]
    start = time.perf_counter()
    phi_train = rf(x_train)
    per_row = (time.perf_counter() - start) / max(len(phi_train), 1)
    phi = Features(f"{features.name}/R(seed={seed}, M={M})", phi_train.numpy(), features.y_train,
                   rf(x_test).numpy(), features.y_test, tuple(features.classes))
    _EXPANDED[key] = (features, phi, per_row)
    while len(_EXPANDED) > EXPANDED_CACHE_SIZE:
        _EXPANDED.popitem(last=False)
    return phi, per_row


