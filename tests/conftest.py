"""Shared test helpers: thread limit, state comparison, configs and the small Gaussian data set.

Test modules import the helpers (``from conftest import states_equal, make_cfg, make_data``);
the thread limit applies to every test.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    """One torch CPU thread per test: tiny models only gain OpenMP contention on a shared machine."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def states_equal(a: dict, b: dict) -> bool:
    """Two state dicts with the same keys and bit-identical tensors."""
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def make_cfg(defaults: dict, **kw):
    """A CPU, one-thread, seed-0 :class:`FedConfig` with a test module's ``defaults`` and ``kw`` on top."""
    from fedlib.federated.gradient import FedConfig

    return FedConfig(**{"seed": 0, "device": "cpu", "num_threads": 1, **defaults, **kw})


def make_data(seed: int = 0, n_train: int = 100, n_test: int = 30, shift=None, dim: int = 8, classes: int = 6,
              scale: float = 3.0):
    """Gaussian classes with means ``scale * e_c`` (+ ``shift``) and unit noise: float32 x (N, dim),
    int labels; ``n_train`` / ``n_test`` samples per class. Returns x_tr, y_tr, x_te, y_te."""
    g = np.random.RandomState(seed)
    means = np.eye(classes, dim) * scale + (0.0 if shift is None else shift)
    y_tr, y_te = np.repeat(np.arange(classes), n_train), np.repeat(np.arange(classes), n_test)
    x_tr = (means[y_tr] + g.randn(len(y_tr), dim)).astype(np.float32)
    x_te = (means[y_te] + g.randn(len(y_te), dim)).astype(np.float32)
    return x_tr, y_tr, x_te, y_te


def chapter_values(chapter: str, **changes) -> dict:
    """A chapter's default parameters (its notebook's parameters cell) with ``changes``."""
    from fedlib.runner import profiles

    return {**profiles.notebook_parameters(chapter), **changes}


def afl_ridge_reference(task, clients) -> np.ndarray:
    """Centralized reference for AFL's regularized head on ``clients``' data of a fedlib.flower Task:
    ``W = argmin ||X W - Y||^2 + K gamma ||W||^2`` (K = len(clients)) by numpy ``lstsq`` on the
    augmented system [X; sqrt(K gamma) I] W = [Y; 0] (not the normal equations AFL aggregates)."""
    f, gamma = task.features, task.config["gamma"]
    idx = np.concatenate([task.parts[k] for k in clients])
    x = np.asarray(f.x_train, dtype=np.float64)[idx]
    y = np.eye(len(f.classes))[np.asarray(f.y_train)[idx]]
    d = x.shape[1]
    a = np.vstack([x, np.sqrt(len(clients) * gamma) * np.eye(d)])
    b = np.vstack([y, np.zeros((d, y.shape[1]))])
    return np.linalg.lstsq(a, b, rcond=None)[0]
