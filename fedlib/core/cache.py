"""The one disk cache of fedlib: results kept under :func:`fedlib.core.paths.cache_dir`, each keyed by a
fingerprint of everything that determines it.

* :func:`fingerprint`: SHA-1 of values (strings, numbers, NumPy arrays, torch tensors, nested lists),
  their shapes and dtypes included; also the key of the in-memory shares of results between runs.
* :func:`save_npz` / :func:`load_npz`: arrays written atomically (a reader in another process, e.g. a
  chapter running side by side, sees the whole file or none) and read back, or None when a file is
  missing or unreadable (then the result is computed again).
* :func:`memory`: a ``joblib.Memory`` for a function whose calls are kept (its arguments are the key).
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedlib.core.paths import cache_dir


def fingerprint(*parts: Any, length: int | None = None) -> str:
    """SHA-1 hex digest of ``parts`` (``length``: its first characters)."""
    h = hashlib.sha1()

    def add(value):
        if isinstance(value, torch.Tensor):
            t = value.detach().cpu().contiguous()
            value = t.float().numpy() if t.dtype == torch.bfloat16 else t.numpy()
            h.update(b"tensor")
        if isinstance(value, np.ndarray):
            a = np.ascontiguousarray(value)
            h.update(f"|{a.shape}|{a.dtype.str}|".encode())
            h.update(memoryview(a).cast("B") if a.size else b"")
        elif isinstance(value, (list, tuple)):
            h.update(f"[{len(value)}".encode())
            for v in value:
                add(v)
        else:
            h.update(f"|{value!r}".encode())
    for part in parts:
        add(part)
    digest = h.hexdigest()
    return digest if length is None else digest[:length]


def save_npz(path: Path, **arrays) -> None:
    """``np.savez`` of ``arrays`` to ``path`` through a temporary file in the same folder and ``os.replace``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.stem + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_npz(path: Path) -> dict[str, np.ndarray] | None:
    """The arrays of ``path`` (no pickles), or None when it is missing or unreadable."""
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except Exception:   # missing, partial or foreign file: the caller computes again
        return None


def memory(name: str):
    """A ``joblib.Memory`` in ``cache_dir() / name``."""
    from joblib import Memory  # imported on use: a dependency of scikit-learn, needed by one chapter

    return Memory(cache_dir() / name, verbose=0)
