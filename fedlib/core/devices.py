"""Devices and thread limits."""
from __future__ import annotations

from contextlib import contextmanager

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


def synchronize(device: torch.device) -> None:
    """Wait for queued CUDA work (so a wall-clock reading covers it); no-op on CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextmanager
def torch_threads(num_threads: int | None):
    """Run the block with ``torch.set_num_threads(num_threads)`` (None: leave as is), then restore."""
    before = torch.get_num_threads()
    if num_threads is not None:
        torch.set_num_threads(int(num_threads))
    try:
        yield
    finally:
        torch.set_num_threads(before)
