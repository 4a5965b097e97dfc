"""Summaries over seeds, one convention for the whole book.

* the spread of a result is the SAMPLE standard deviation (ddof = 1) over its runs;
* a comparison of two methods whose runs pair by seed is the paired difference a - b with a
  Student-t confidence interval (the runs of one seed share data, partition and client sampling, so
  the seed-to-seed variation cancels in the difference).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd
from scipy import stats as _st


def _as_vector(name: str, values) -> np.ndarray:
    v = np.asarray(values, dtype=np.float64).ravel()
    if v.size == 0:
        raise ValueError(f"{name} is empty: need at least one run")
    if not np.isfinite(v).all():
        raise ValueError(f"{name} holds non-finite values: {v}")
    return v


def sample_std(values) -> float:
    """Sample standard deviation (ddof = 1); NaN for a single run."""
    v = _as_vector("values", values)
    return float(v.std(ddof=1)) if v.size > 1 else math.nan


def pm(mean: float, std: float, digits: int = 2) -> str:
    """``"mean ± std"`` with ``digits`` decimals: the one format of a ± in the book."""
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def mean_std(values, digits: int = 2, scale: float = 1.0) -> str:
    """``"m ± s"`` of ``scale * values`` with the sample std; one run gives ``"m (n=1)"``."""
    v = scale * _as_vector("values", values)
    if v.size == 1:
        return f"{v[0]:.{digits}f} (n=1)"
    return pm(v.mean(), v.std(ddof=1), digits)


def pm_frame(summary: pd.DataFrame, digits: int = 2, scale: float = 1.0) -> pd.Series:
    """``"m ± s"`` per row of a :func:`summarize` frame (columns ``mean``, ``std``, ``n``); rows of one
    run read ``"m (n=1)"``."""
    return pd.Series([f"{scale * m:.{digits}f} (n=1)" if n == 1 else pm(scale * m, scale * s, digits)
                      for m, s, n in zip(summary["mean"], summary["std"], summary["n"])], index=summary.index)


def summarize(df: pd.DataFrame, by, value: str) -> pd.DataFrame:
    """Per group of ``by``: ``mean``, ``std`` (sample, ddof = 1; NaN for one run) and ``n`` of ``value``."""
    if value not in df.columns:
        raise ValueError(f"value column {value!r} not in the frame; columns: {', '.join(map(str, df.columns))}")
    g = df.groupby(by, sort=False)[value]
    return pd.DataFrame({"mean": g.mean(), "std": g.std(ddof=1), "n": g.count()})


@dataclass(frozen=True)
class PairedDifference:
    """Mean of the paired differences a_i - b_i with its two-sided t confidence interval."""

    mean: float
    std: float
    n: int
    low: float
    high: float
    confidence: float

    @property
    def excludes_zero(self) -> bool:
        """True when the interval lies strictly on one side of 0 (a difference the runs resolve)."""
        return self.low > 0 or self.high < 0

    def format(self, digits: int = 2, scale: float = 1.0) -> str:
        m, lo, hi = (scale * x for x in (self.mean, self.low, self.high))
        return f"{m:+.{digits}f} [{lo:+.{digits}f}, {hi:+.{digits}f}] ({100 * self.confidence:.0f}% CI, n={self.n})"

    def __str__(self) -> str:
        return self.format()


def paired_difference(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> PairedDifference:
    """Paired difference a - b (runs paired by position, e.g. by seed): mean, sample std and the
    t-interval mean ± t_{(1+c)/2, n-1} std / sqrt(n). Needs n >= 2 pairs."""
    a, b = _as_vector("a", a), _as_vector("b", b)
    if a.shape != b.shape:
        raise ValueError(f"a and b must pair one to one, got {a.size} and {b.size} runs")
    if a.size < 2:
        raise ValueError(f"a paired difference needs at least 2 pairs, got {a.size}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    d = a - b
    n = d.size
    mean, sd = float(d.mean()), float(d.std(ddof=1))
    half = float(_st.t.ppf(0.5 + confidence / 2, n - 1)) * sd / math.sqrt(n)
    return PairedDifference(mean, sd, n, mean - half, mean + half, confidence)
