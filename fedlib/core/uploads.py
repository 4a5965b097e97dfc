"""What a server accepts from its clients: every upload checked against the server's own state.

A server says what it expects now (:meth:`fedlib.core.protocol.Server.expects`) as an
:class:`Expected`: the forms an upload may take (entry name -> :class:`Tensor`, :class:`Number`, or a
dict / tuple of them, as the protocol defines the payload), the sizes it already knows (``dims``), and
the senders it accepts. :class:`UploadCheck` checks uploads one after the other: exact keys, exact
shape and dtype of every array, finite values, bounds (counts >= 0, sizes >= 1, gamma >= 0, ...). A
refusal is a ``ValueError`` that names the sender, the entry, what was expected and what came.

The same check runs in every server's ``receive`` (before any state is touched, for the whole round)
and in the Flower transport (which leaves a refused upload out of its round and reports why), so the
two can never disagree.

Sizes a server does not know yet are symbols (``"d"``, ``"C"``): the first upload of a round that
names one binds it for the rest of the round, and the server keeps it once it absorbs that round.
Symbols listed in ``Expected.local`` are bound anew by each upload (a client's own row count).
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Iterable, Mapping, Union

import numpy as np
import torch

FLOATS = ("float32", "float64")
INTEGERS = ("int64", "int32")
#: the largest count or size an integer entry may declare (beyond it float64 sums lose whole numbers)
MAX_COUNT = 2 ** 53

Dim = Union[int, str, Callable[[Mapping[str, int]], int]]


@dataclass(frozen=True)
class Tensor:
    """An array entry: ``shape`` (ints, symbols, or functions of the bound symbols), allowed ``dtypes``
    (names: ``"float64"``...), the array type (``"torch"`` tensor or ``"numpy"`` ndarray), value bounds
    (``low`` <= every value <= ``high``), ``integral`` (whole numbers), ``nonzero`` (not all 0).
    Floating values must be finite."""

    shape: tuple[Dim, ...]
    dtypes: tuple[str, ...] = FLOATS
    array: str = "torch"
    low: float | None = None
    high: float | None = None
    integral: bool = False
    nonzero: bool = False


@dataclass(frozen=True)
class Number:
    """A scalar entry (Python or NumPy number, not bool): finite, within [low, high] (``high`` may name
    a bound symbol); ``integer``: an int (at most :data:`MAX_COUNT`); ``bind``: the value is a size
    and binds that symbol."""

    low: float | None = None
    high: float | str | None = None
    integer: bool = False
    bind: str | None = None


Entry = Union[Tensor, Number, Mapping[str, "Entry"], tuple]
Form = Mapping[str, Entry]


@dataclass(frozen=True)
class Expected:
    """What a server accepts now: an upload must match one of ``forms`` exactly (same keys);
    ``dims`` are the sizes the server knows; ``local`` the symbols each upload binds for itself;
    ``senders`` the accepted senders (None: any); ``what`` names the upload in messages."""

    forms: tuple[Form, ...]
    dims: Mapping[str, int] = field(default_factory=dict)
    local: tuple[str, ...] = ()
    senders: Collection[str] | None = None
    what: str = "upload"


NOTHING = Expected(({},))   # an exchange whose uploads carry no entry (e.g. a cache round)


def _show(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _dtype_name(value) -> str:
    return str(value.dtype).removeprefix("torch.")


class UploadCheck:
    """Checks the uploads of one round against ``expected``, one by one (``check(message)``): a
    refused upload raises ValueError and binds nothing; an accepted one binds the round's symbols
    (the sizes later uploads must match)."""

    def __init__(self, expected: Expected):
        self.expected = expected
        self.dims: dict[str, int] = {k: int(v) for k, v in expected.dims.items() if v is not None}

    def __call__(self, message) -> None:
        exp, sender = self.expected, message.sender
        who = f"{exp.what} from {_show(sender)}"
        if not isinstance(sender, str):
            raise ValueError(f"refused {exp.what}: its sender must be a client name, got {_show(sender)}")
        if exp.senders is not None and sender not in exp.senders:
            raise ValueError(f"refused {who}: this server expects uploads only from "
                             f"{_show(sorted(exp.senders), 120)}")
        payload = message.payload
        if not isinstance(payload, dict):
            raise ValueError(f"refused {who}: the payload must be a dict, got {type(payload).__name__}")
        form = _pick_form(payload, exp.forms, who)
        dims = {k: v for k, v in self.dims.items() if k not in exp.local}
        for name, spec in form.items():
            _check_entry(name, payload[name], spec, dims, who)
        self.dims.update({k: v for k, v in dims.items() if k not in exp.local})


def check_uploads(messages: Iterable, expected: Expected) -> dict[str, int]:
    """Check a whole round (all before any is used); returns the sizes it bound."""
    check = UploadCheck(expected)
    for message in messages:
        check(message)
    return check.dims


def _pick_form(payload: dict, forms: tuple[Form, ...], who: str) -> Form:
    keys = set(payload)
    for form in forms:
        if set(form) == keys:
            return form
    closest = min(forms, key=lambda f: len(set(f) ^ keys))
    missing = sorted(map(str, set(closest) - keys))
    extra = sorted(map(_show, keys - set(closest)))
    parts = ([f"missing {', '.join(map(repr, missing))}"] if missing else []) + \
            ([f"unexpected {', '.join(extra)}"] if extra else [])
    allowed = " or ".join("{" + ", ".join(map(repr, f)) + "}" for f in forms)
    raise ValueError(f"refused {who}: {'; '.join(parts)} (expected entries {allowed})")


def _check_entry(path: str, value: Any, spec: Entry, dims: dict[str, int], who: str) -> None:
    if isinstance(spec, Tensor):
        _check_tensor(path, value, spec, dims, who)
    elif isinstance(spec, Number):
        _check_number(path, value, spec, dims, who)
    elif isinstance(spec, tuple):
        if not isinstance(value, (list, tuple)) or len(value) != len(spec):
            raise ValueError(f"refused {who}: entry {path!r} must be a sequence of {len(spec)}, got {_show(value)}")
        for i, (v, s) in enumerate(zip(value, spec)):
            _check_entry(f"{path}[{i}]", v, s, dims, who)
    else:   # a nested dict (a model's state, a Fisher per parameter)
        if not isinstance(value, dict):
            raise ValueError(f"refused {who}: entry {path!r} must be a dict, got {type(value).__name__}")
        if set(value) != set(spec):
            missing, extra = sorted(map(str, set(spec) - set(value))), sorted(map(_show, set(value) - set(spec)))
            raise ValueError(f"refused {who}: entry {path!r} has the wrong keys"
                             + (f"; missing {', '.join(map(repr, missing))}" if missing else "")
                             + (f"; unexpected {', '.join(extra)}" if extra else ""))
        for key, sub in spec.items():
            _check_entry(f"{path}.{key}", value[key], sub, dims, who)


def _size(dim: Dim, dims: dict[str, int]) -> int | None:
    """The expected size of one axis (None: a symbol not bound yet)."""
    if isinstance(dim, str):
        return dims.get(dim)
    return int(dim(dims)) if callable(dim) else int(dim)


def _check_tensor(path: str, value: Any, spec: Tensor, dims: dict[str, int], who: str) -> None:
    kind = "a torch tensor" if spec.array == "torch" else "a NumPy array"
    ok = (isinstance(value, torch.Tensor) and value.layout == torch.strided) if spec.array == "torch" \
        else type(value) is np.ndarray
    if not ok:
        raise ValueError(f"refused {who}: entry {path!r} must be {kind}, got {type(value).__name__}")
    dtype = _dtype_name(value)
    if dtype not in spec.dtypes:
        raise ValueError(f"refused {who}: entry {path!r} has dtype {dtype}, expected {' or '.join(spec.dtypes)}")
    shape = tuple(value.shape)
    want = [_size(d, dims) for d in spec.shape]
    if len(shape) != len(want) or any(w is not None and g != w for g, w in zip(shape, want)):
        shown = ", ".join(str(w if w is not None else d) for w, d in zip(want, spec.shape))
        shown = f"({shown}{',' if len(want) == 1 else ''})"
        raise ValueError(f"refused {who}: entry {path!r} has shape {shape}, expected {shown}")
    for d, g in zip(spec.shape, shape):   # bind the symbols this entry fixes
        if isinstance(d, str):
            dims.setdefault(d, g)
    if value.numel() if spec.array == "torch" else value.size:
        _check_values(path, value, spec, who)
    elif spec.nonzero:
        raise ValueError(f"refused {who}: entry {path!r} must not be all 0")


def _check_values(path: str, value, spec: Tensor, who: str) -> None:
    t = value.detach() if isinstance(value, torch.Tensor) else torch.from_numpy(value)
    floating = t.is_floating_point()
    if floating:
        # one pass, no temporary: the float64 sum is finite exactly when every value is (barring overflow)
        if not math.isfinite(float(t.sum(dtype=torch.float64))):
            bad = int((~torch.isfinite(t)).sum())
            raise ValueError(f"refused {who}: entry {path!r} holds {bad} non-finite value(s)" if bad else
                             f"refused {who}: entry {path!r} holds values too large to sum in float64")
    if spec.low is not None or spec.high is not None:
        lo, hi = float(t.min()), float(t.max())
        if spec.low is not None and lo < spec.low:
            raise ValueError(f"refused {who}: entry {path!r} must be >= {spec.low:g}, holds {lo:g}")
        if spec.high is not None and hi > spec.high:
            raise ValueError(f"refused {who}: entry {path!r} must be <= {spec.high:g}, holds {hi:g}")
    if spec.integral and floating and not bool((t == t.round()).all()):
        raise ValueError(f"refused {who}: entry {path!r} must hold whole numbers (counts)")
    if spec.nonzero and not bool(t.any()):
        raise ValueError(f"refused {who}: entry {path!r} must not be all 0")


def _check_number(path: str, value: Any, spec: Number, dims: dict[str, int], who: str) -> None:
    integral = isinstance(value, (numbers.Integral, np.integer)) and not isinstance(value, (bool, np.bool_))
    real = integral or (isinstance(value, (numbers.Real, np.floating)) and not isinstance(value, (bool, np.bool_)))
    if spec.integer and not integral:
        raise ValueError(f"refused {who}: entry {path!r} must be an integer, got {_show(value)}")
    if not real or not math.isfinite(float(value)):
        raise ValueError(f"refused {who}: entry {path!r} must be a finite number, got {_show(value)}")
    high = dims.get(spec.high) if isinstance(spec.high, str) else spec.high
    high = high if high is not None else (MAX_COUNT if spec.integer else None)
    if (spec.low is not None and value < spec.low) or (high is not None and value > high):
        bounds = " and ".join(b for b in ((f">= {spec.low:g}" if spec.low is not None else ""),
                                          (f"<= {high:g}" if high is not None else "")) if b)
        raise ValueError(f"refused {who}: entry {path!r} must be {bounds}, got {_show(value)}")
    if spec.bind is not None:
        if spec.bind in dims and dims[spec.bind] != int(value):
            raise ValueError(f"refused {who}: entry {path!r} is {_show(value)}, expected {dims[spec.bind]}")
        dims[spec.bind] = int(value)
