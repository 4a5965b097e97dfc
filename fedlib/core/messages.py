"""Explicit messages between clients and server, with their size in bytes measured.

Every federated method in fedlib wraps what a client uploads (or the server broadcasts) in a
:class:`Message`. Communication tables are sums of ``Message.nbytes``, i.e. the bytes of the
arrays actually sent, never an estimate from a formula.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import numpy as np
import torch


def payload_nbytes(value: Any) -> int:
    """Bytes needed to send ``value``: arrays/tensors by their buffer, numbers as 8 bytes.

    Nested mappings and sequences are summed. ``None`` costs nothing.
    """
    if value is None:
        return 0
    kind = type(value)   # exact-type fast paths first: the ABC checks below are slow on large payloads
    if kind is dict:
        return sum(payload_nbytes(v) for v in value.values())
    if kind is list or kind is tuple:
        return sum(payload_nbytes(v) for v in value)
    if kind is float or kind is int:
        return 8
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    if isinstance(value, (bool, int, float, np.integer, np.floating)):
        return 8
    if isinstance(value, Mapping):
        return sum(payload_nbytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(payload_nbytes(v) for v in value)
    raise TypeError(f"cannot size a payload entry of type {type(value).__name__}")


@dataclass
class Message:
    """One upload or broadcast: named payload entries and the measured byte size."""

    sender: str
    payload: dict[str, Any] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return payload_nbytes(self.payload)

    def __getitem__(self, key: str) -> Any:
        return self.payload[key]


def total_nbytes(messages: Iterable[Message]) -> int:
    """Sum of the measured sizes of ``messages``."""
    return sum(m.nbytes for m in messages)


@dataclass
class Cost:
    """What a run cost, all measured: bytes uploaded and broadcast (sums of ``Message.nbytes``,
    a broadcast counted once per receiving client) and seconds of federated work."""

    bytes_up: int = 0
    bytes_down: int = 0
    seconds: float = 0.0

    def __add__(self, other: "Cost") -> "Cost":
        return Cost(self.bytes_up + other.bytes_up, self.bytes_down + other.bytes_down,
                    self.seconds + other.seconds)

    @property
    def mib_up(self) -> float:
        return self.bytes_up / 2**20

    @property
    def mib_down(self) -> float:
        return self.bytes_down / 2**20
