"""Small shared helpers: devices, seeds, argument checks."""
from __future__ import annotations

import random

import numpy as np
import torch


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``"auto"`` -> cuda when available else cpu; ``"cpu"``/``"cuda"``/``"cuda:1"`` as given.

    Raises ValueError for an unknown name and RuntimeError when cuda is asked for but absent.
    """
    if isinstance(device, torch.device):
        return device
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not (device == "cpu" or device.startswith("cuda")):
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda[:i]', got {device!r}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"device={device!r} was asked for but torch sees no CUDA device; use 'cpu' or 'auto'")
    return torch.device(device)


def seed_everything(seed: int) -> np.random.Generator:
    """Seed python, numpy and torch; return a numpy Generator seeded with ``seed``."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    return np.random.default_rng(seed)


def check_positive(name: str, value: float, *, strict: bool = True) -> None:
    """Raise ValueError naming ``name`` unless ``value`` > 0 (or >= 0 when ``strict`` is False)."""
    ok = value > 0 if strict else value >= 0
    if not ok:
        bound = "> 0" if strict else ">= 0"
        raise ValueError(f"{name} must be {bound}, got {value!r}")


def check_choice(name: str, value: str, allowed) -> None:
    """Raise ValueError naming ``name`` and the allowed values unless ``value`` is one of them."""
    allowed = list(allowed)
    if value not in allowed:
        raise ValueError(f"unknown {name} {value!r}; allowed: {', '.join(map(str, allowed))}")
