"""Comparisons the chapters print and assert: bit-identity and differences of model weights,
relative errors against a reference, a ledger of asserted numerical checks, and row labels.
"""
from __future__ import annotations

import operator
from typing import Mapping

import pandas as pd
import torch

__all__ = ["states_equal", "max_state_difference", "CheckLog", "refed_label"]

_OPS = {"<=": operator.le, ">=": operator.ge, "<": operator.lt, ">": operator.gt, "==": operator.eq}


def states_equal(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> bool:
    """True when two state dicts have the same keys and bit-identical tensors (``torch.equal``)."""
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def max_state_difference(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> float:
    """max over keys of max |a[k] - b[k]| (float64) of two state dicts with the same keys."""
    if a.keys() != b.keys():
        raise ValueError(f"the state dicts differ in their keys: {sorted(set(a) ^ set(b))}")
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


class CheckLog:
    """A ledger of asserted checks: ``log.check(claim, value, bound, op)`` asserts ``value op bound``
    (op in ``<=, >=, <, >, ==``), prints it with its tolerance and records it; :meth:`frame` is the
    summary table (check, measured, required, passed)."""

    def __init__(self):
        self.rows: list[dict] = []

    def check(self, claim: str, value, bound, op: str = "<=") -> None:
        if op not in _OPS:
            raise ValueError(f"op must be one of {', '.join(_OPS)}, got {op!r}")
        ok = bool(_OPS[op](value, bound))
        self.rows.append({"check": claim, "measured": value, "required": f"{op} {bound}", "passed": ok})
        flag = "OK  " if ok else "FAIL"
        print(f"{flag} {claim}: {value:.4g} (required {op} {bound:.3g})" if isinstance(value, float)
              else f"{flag} {claim}: {value} (required {op} {bound})")
        assert ok, claim

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows)


def refed_label(method: str, grad_norm: str = "exact") -> str:
    """Table label of a Re-Fed benchmark method: the Re-Fed rows say which gradient norm (Eq. 4) they
    use. ``refed_proxy`` (and every PIM method under ``grad_norm="last_layer"``) reads
    "... [last-layer proxy]", the other PIM methods "... [exact Eq. 4]", the rest their name."""
    pim = method in ("refed", "refed_balanced", "refed_proxy")
    if method == "refed_proxy" or (pim and grad_norm == "last_layer"):
        return ("refed" if method == "refed_proxy" else method) + " [last-layer proxy]"
    return method + (" [exact Eq. 4]" if pim else "")
