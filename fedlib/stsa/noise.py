"""The paper's upload-noise experiment (App. E.2, Table 7): ``q N(0, s^2)`` added to named upload entries,
drawn from each client's own stream. Used by :class:`fedlib.stsa.algorithm.STSAClient` with ``noise=(q, s)``."""
from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import Tensor

from fedlib.core.messages import Message
from fedlib.core.seeds import torch_generator
from fedlib.core.validate import check_positive


def add_upload_noise(msg: Message, q: float, s: float, generator: torch.Generator | None,
                     entries: Sequence[str] = ("G", "C", "n"), draws: dict[str, Tensor] | None = None) -> Message:
    """The privacy experiment of the paper's earlier version (App. E.2, Table 7): add q * N(0, s^2) to the named
    upload entries. G's noise is symmetrized ((E + E^T)/sqrt(2), same variance) so G stays
    symmetric. Noisy counts stay real numbers: :class:`STSAServer` uses them as they are (no
    rounding, which would undo noise of sd < 0.5 exactly), except that a count below
    :data:`MIN_COUNT` is read as an empty (dummy) client, since a term C C^T / n with n ~ 0 would
    dominate eq. 9 (our choice; the paper is silent). ``draws``: the N(0, 1) tensors of the entries,
    as :func:`unit_noise` draws them from ``generator`` (then unused); the result is the same, bit for bit."""
    check_positive("q", q, strict=False)
    check_positive("s", s, strict=False)
    out = dict(msg.payload)
    for key in entries:
        if key not in out:
            continue
        value = out[key]
        unit = draws[key] if draws is not None else torch.randn(value.shape, generator=generator, dtype=torch.float64)
        noise = unit.to(value) * (q * s)
        if key == "G":
            noise = (noise + noise.T) / math.sqrt(2.0)
        out[key] = value + noise
    return Message(msg.sender, out)


_UNIT_NOISE: dict[tuple, dict[str, Tensor]] = {}   # (seed, t, k, entries, shapes) -> draws; one seed at a time


def unit_noise(msg: Message, seed: int, t: int, k: int, entries: Sequence[str]) -> dict[str, Tensor]:
    """The N(0, 1) draws :func:`add_upload_noise` makes for client k's upload ``msg`` at stage t from its
    stream ``torch_generator(seed, "upload_noise", t, k)``: one tensor per entry of ``entries`` present in
    ``msg``, in that order. They depend on (seed, t, k) and the shapes only, not on q, s or the data, so
    they are kept (for one seed at a time) and every noise level of a study reuses them."""
    keys = tuple(e for e in entries if e in msg.payload)
    key = (int(seed), int(t), int(k), keys, tuple(tuple(msg[e].shape) for e in keys))
    hit = _UNIT_NOISE.get(key)
    if hit is None:
        if any(old[0] != key[0] for old in _UNIT_NOISE):
            _UNIT_NOISE.clear()
        gen = torch_generator(seed, "upload_noise", t, k)
        hit = _UNIT_NOISE[key] = {e: torch.randn(msg[e].shape, generator=gen, dtype=torch.float64) for e in keys}
    return hit


