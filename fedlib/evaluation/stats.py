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


def paired_power(effect: float, sd: float, n: int, confidence: float = 0.95) -> float:
    """Power of the two-sided paired t-test at level 1 - ``confidence`` to detect a true mean
    difference ``effect`` when the paired differences have standard deviation ``sd``, with ``n``
    pairs: P(|T| > t_{(1+c)/2, n-1}) for T noncentral t with n-1 degrees of freedom and
    noncentrality effect / (sd / sqrt(n)). The probability that the CI excludes 0."""
    if n < 2:
        raise ValueError(f"a paired test needs at least 2 pairs, got {n}")
    if not sd > 0 or not math.isfinite(sd):
        raise ValueError(f"sd must be positive and finite, got {sd!r}")
    df, nc = n - 1, effect / (sd / math.sqrt(n))
    crit = float(_st.t.ppf(0.5 + confidence / 2, df))
    # the far tail by symmetry, T(df, nc) = -T(df, -nc): scipy's nct.cdf far from the mean can return NaN
    # (n = 2, large nc), its survival function on the mirrored side does not
    return float(_st.nct.sf(crit, df, nc) + _st.nct.sf(crit, df, -nc))


def seeds_for_power(effect: float, sd: float, power: float = 0.8, confidence: float = 0.95,
                    limit: int = 100_000) -> int | None:
    """The smallest number of paired seeds n >= 2 whose paired t-test detects ``effect`` with
    probability >= ``power`` (:func:`paired_power`), or None when more than ``limit`` are needed."""
    if not 0 < power < 1:
        raise ValueError(f"power must be in (0, 1), got {power!r}")
    if effect == 0:
        return None
    lo, hi = 2, 2
    while paired_power(effect, sd, hi, confidence) < power:
        if hi >= limit:
            return None
        lo, hi = hi, min(2 * hi, limit)
    while lo < hi:  # power grows with n: bisect for the first n that reaches it
        mid = (lo + hi) // 2
        if paired_power(effect, sd, mid, confidence) >= power:
            hi = mid
        else:
            lo = mid + 1
    return hi


def power_statement(diff: PairedDifference, effect: float, what: str, digits: int = 2, scale: float = 1.0,
                    unit: str = "", power: float = 0.8) -> str:
    """What an unresolved paired comparison still says: the differences its CI rules out, and how many
    paired seeds would resolve ``effect`` (the paper's reported size, same units as ``diff``) with
    ``power``, at the spread measured here. ``what``: the difference's name ("Re-Fed - FedAvg+replay")."""
    f = lambda v: f"{scale * v:+.{digits}f}{unit}"  # noqa: E731
    n = seeds_for_power(effect, diff.std, power, diff.confidence) if diff.std > 0 else None
    need = (f"{n} paired seeds would detect the paper's {f(effect)} with {100 * power:.0f} % power "
            f"(sd of the differences {scale * diff.std:.{digits}f}{unit}, here n = {diff.n})" if n is not None
            else f"no affordable number of paired seeds detects the paper's {f(effect)} at this spread")
    return (f"{what}: the {100 * diff.confidence:.0f} % CI rules out a true difference below {f(diff.low)} "
            f"or above {f(diff.high)}; {need}")


@dataclass(frozen=True)
class Plateau:
    """The convergence rule's outcome for one curve (:func:`plateau`)."""

    converged: bool
    change: float       # mean of the last tail/2 of the points minus the mean of the tail/2 before them
    tol: float
    points: int         # the curve's length
    tail: float

    def describe(self, scale: float = 1.0, unit: str = "", digits: int = 2) -> str:
        if not math.isfinite(self.change):
            return f"not converged: {self.points} rounds are too few to show a plateau"
        return (f"{'converged' if self.converged else 'not converged'}: over the last {100 * self.tail:.0f} % of "
                f"{self.points} rounds it moved {scale * self.change:+.{digits}f}{unit} "
                f"({'within' if self.converged else 'beyond'} ±{scale * self.tol:.{digits}f}{unit})")


def plateau(curve: Sequence[float], tol: float, tail: float = 0.2) -> Plateau:
    """The convergence rule of every comparison in the book: over the last ``tail`` of the rounds the
    curve moves by less than ``tol``. Measured as the mean of the last tail/2 of the points minus the
    mean of the tail/2 before them (a trend, not the round-to-round noise of one evaluation); a
    curve of fewer than 4 points cannot show a plateau (not converged)."""
    y = _as_vector("curve", curve)
    if not tol > 0:
        raise ValueError(f"tol must be positive, got {tol!r}")
    if not 0 < tail < 1:
        raise ValueError(f"tail must be in (0, 1), got {tail!r}")
    half = max(1, int(round(len(y) * tail / 2)))
    if len(y) < 4 or 2 * half > len(y):
        return Plateau(False, float("nan"), float(tol), len(y), tail)
    change = float(y[-half:].mean() - y[-2 * half:-half].mean())
    return Plateau(bool(abs(change) < tol), change, float(tol), len(y), tail)


@dataclass(frozen=True)
class Comparison:
    """A reference method against others, paired by seed, each on its convergence rule
    (:func:`compare_methods`). ``rows``: one per method (mean, sample std, the paired difference
    reference - method, its plateau); ``leads``: every interval above 0; ``trails``: the methods whose
    interval lies below 0 (better than the reference); ``unresolved``: the others; ``converged``:
    every curve on its plateau; ``slowest``: the method whose curve moved most at the end."""

    rows: pd.DataFrame
    leads: bool
    trails: list[str]
    unresolved: list[str]
    converged: bool
    slowest: str

    def convergence(self, scale: float = 100.0, unit: str = " pp") -> str:
        """The convergence evidence in one sentence."""
        p = self.rows.loc[self.slowest, "plateau"]
        if not math.isfinite(p.change):
            return f"not converged: {p.points} rounds are too few to show a plateau"
        return (f"rule: a method's mean curve moves by less than {scale * p.tol:.2f}{unit} over the last "
                f"{100 * p.tail:.0f} % of its {p.points} rounds; {'every method converged' if self.converged else 'not all converged'}"
                f" (largest move: {self.slowest}, {scale * p.change:+.2f}{unit})")


def compare_methods(reference, finals: dict[str, Sequence[float]], curves: dict[str, Sequence[Sequence[float]]],
                    tol: float, confidence: float = 0.95) -> Comparison:
    """``reference``: the reference method's final metric per seed (or one number, a deterministic
    method); ``finals``: each other method's final metric per seed (same seed order); ``curves``: each
    method's per-round metric per seed (the reference's too when it trains). Paired differences
    reference - method with their t-intervals, and :func:`plateau` with ``tol`` on each method's
    mean curve over seeds."""
    rows = {}
    for m, acc in finals.items():
        acc = _as_vector(f"finals[{m!r}]", acc)
        ref = np.full(acc.size, float(reference)) if np.ndim(reference) == 0 else _as_vector("reference", reference)
        rows[m] = {"mean": float(acc.mean()), "std": sample_std(acc),
                   "difference": paired_difference(ref, acc, confidence)}
    plateaus = {m: plateau(np.mean(np.asarray(c, dtype=float), axis=0), tol) for m, c in curves.items()}
    for m, p in plateaus.items():
        rows.setdefault(m, {"mean": np.nan, "std": np.nan, "difference": None})["plateau"] = p
    frame = pd.DataFrame.from_dict(rows, orient="index")
    trails = [m for m, r in rows.items() if r["difference"] is not None and r["difference"].high < 0]
    unresolved = [m for m, r in rows.items() if r["difference"] is not None and not r["difference"].excludes_zero]
    slowest = max(plateaus, key=lambda m: abs(plateaus[m].change) if np.isfinite(plateaus[m].change) else np.inf)
    return Comparison(frame, leads=not trails and not unresolved, trails=trails, unresolved=unresolved,
                      converged=all(p.converged for p in plateaus.values()), slowest=slowest)
