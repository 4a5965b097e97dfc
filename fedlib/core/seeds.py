"""One seed derivation for the whole library: :class:`numpy.random.SeedSequence`.

Every random stream a run needs (a client's mini-batch order, a stage's partition, a dummy split)
is derived from the run's seed and the stream's *keys* (small non-negative integers naming the
purpose, the task, the client...) by ``SeedSequence([seed, *keys])``, so streams never collide and
adding a stream never shifts another one.
"""
from __future__ import annotations

import random
import zlib

import numpy as np
import torch


def _key(k) -> int:
    """A stream key: a non-negative int as is, a string by its CRC32 (stable across runs)."""
    if isinstance(k, str):
        return zlib.crc32(k.encode())
    k = int(k)
    if k < 0:
        raise ValueError(f"seed keys must be non-negative integers or strings, got {k}")
    return k


def derive_seed(seed: int, *keys) -> int:
    """The 32-bit seed of stream ``keys`` of run ``seed``: ``SeedSequence([seed, *keys])``'s first word.

    ``derive_seed(seed)`` with no keys is ``seed`` itself (a run's main stream keeps its seed).
    """
    if not keys:
        return int(seed)
    entropy = [_key(seed)] + [_key(k) for k in keys]
    return int(np.random.SeedSequence(entropy).generate_state(1, dtype=np.uint32)[0])


def rng(seed: int, *keys) -> np.random.Generator:
    """numpy Generator of stream ``keys`` of run ``seed``."""
    return np.random.default_rng(derive_seed(seed, *keys))


def torch_generator(seed: int, *keys) -> torch.Generator:
    """CPU torch Generator of stream ``keys`` of run ``seed``."""
    return torch.Generator().manual_seed(derive_seed(seed, *keys))


def seed_everything(seed: int) -> np.random.Generator:
    """Seed python, numpy and torch; return a numpy Generator seeded with ``seed``."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    return np.random.default_rng(seed)
