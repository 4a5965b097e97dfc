"""The argument checks of the whole library: each raises ValueError naming the parameter and
what is allowed, before any long work starts."""
from __future__ import annotations

import math
import numbers
from typing import Iterable, Sequence

import numpy as np


def check_int(name: str, value, minimum: int | None = None, maximum: int | None = None) -> int:
    """``value`` as an int; bools, floats and values outside [minimum, maximum] raise."""
    bounds = "" if minimum is None else f" >= {minimum}"
    bounds += "" if maximum is None else f"{' and' if bounds else ''} <= {maximum}"
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) \
            or (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise ValueError(f"{name} must be an integer{bounds}, got {value!r}")
    return int(value)


def check_real(name: str, value, *, low: float | None = None, high: float | None = None,
               strict: bool = True) -> float:
    """``value`` as a finite float in (low, high) (``strict``) or [low, high]; a bound of None is open."""
    ok = not isinstance(value, bool) and isinstance(value, numbers.Real) and math.isfinite(value)
    if ok and low is not None:
        ok = value > low if strict else value >= low
    if ok and high is not None:
        ok = value < high if strict else value <= high
    if not ok:
        lo = "" if low is None else f"{'>' if strict else '>='} {low}"
        hi = "" if high is None else f"{'<' if strict else '<='} {high}"
        bounds = " and ".join(b for b in (lo, hi) if b)
        raise ValueError(f"{name} must be a finite number{' ' + bounds if bounds else ''}, got {value!r}")
    return float(value)


def check_positive(name: str, value: float, *, strict: bool = True) -> float:
    """``value`` > 0 (or >= 0 when ``strict`` is False), else ValueError naming ``name``."""
    return check_real(name, value, low=0.0, strict=strict)


def check_fraction(name: str, value, *, allow_zero: bool = False) -> float:
    """``value`` in (0, 1] (or [0, 1] with ``allow_zero``)."""
    v = check_real(name, value, low=0.0, high=1.0, strict=False)
    if v == 0.0 and not allow_zero:
        raise ValueError(f"{name} must lie in (0, 1], got {value!r}")
    return v


def check_choice(name: str, value, allowed: Iterable) -> None:
    """ValueError naming ``name`` and the allowed values unless ``value`` is one of them."""
    allowed = list(allowed)
    if value not in allowed:
        raise ValueError(f"unknown {name} {value!r}; allowed: {', '.join(map(str, allowed))}")


def check_int_list(name: str, values, minimum: int | None = None, *, least: int = 1,
                   distinct: bool = False) -> list[int]:
    """A list of at least ``least`` integers, each checked by :func:`check_int`."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise ValueError(f"{name} must be a list of integers, got {values!r}")
    out = [check_int(f"{name}[{i}]", v, minimum) for i, v in enumerate(values)]
    if len(out) < least:
        raise ValueError(f"{name} must hold at least {least} integer(s), got {values!r}")
    if distinct and len(set(out)) != len(out):
        raise ValueError(f"{name} must not repeat a value, got {values!r}")
    return out


def check_seeds(name: str, values, *, least: int = 1) -> list[int]:
    """Distinct non-negative integer seeds, at least ``least`` of them."""
    return check_int_list(name, values, 0, least=least, distinct=True)
