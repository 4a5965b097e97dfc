"""The verdict rules of the Fed-tSNE chapters' claims, fixed before the runs.

A claim that something is "close", "small" or "nearly the same" is decided on the 95 % confidence
intervals of paired differences against an **equivalence margin** taken from the paper's own tables
(never from our runs):

* ``sided="lower"`` (non-inferiority: "the drop is small"): a difference d = new - reference is
  *within* the margin m when its whole interval lies above -m, *beyond* it when its whole interval
  lies below -m, *unresolved* otherwise;
* ``sided="two"`` (equivalence, TOST-style: "nearly the same"): *within* when the interval lies
  inside (-m, +m), *beyond* when it lies wholly outside it, *unresolved* otherwise.

The claim is verified when every difference is within the margin, refuted when one lies beyond it
(its interval excludes every value the claim allows), and inconclusive otherwise; an inconclusive
verdict says what the intervals rule out and how many paired seeds would resolve a difference of
the margin's size (:func:`fedlib.evaluation.stats.power_statement`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import pandas as pd

from fedlib.evaluation.stats import PairedDifference, power_statement

SIDES = ("lower", "two")


def _label(key) -> str:
    return " ".join(map(str, key)) if isinstance(key, tuple) else str(key)


@dataclass(frozen=True)
class MarginCheck:
    """The outcome of :func:`margin_check`: the keys of the differences within the margin, beyond it
    and unresolved (in the order given)."""

    margin: float
    sided: str
    within: tuple
    beyond: tuple
    unresolved: tuple

    @property
    def holds(self) -> bool | None:
        """False when a difference lies beyond the margin, True when every one lies within, else None."""
        if self.beyond:
            return False
        return None if self.unresolved else True

    @property
    def inconclusive(self) -> bool:
        return self.holds is None

    def criterion(self, what: str = "difference", digits: int = 4) -> str:
        """The rule in one sentence (for the evidence)."""
        m = f"{self.margin:.{digits}f}"
        if self.sided == "lower":
            return (f"rule fixed in advance: a {what} holds when its 95 % CI lies above -{m}, fails when the CI "
                    f"lies wholly below -{m}; otherwise unresolved")
        return (f"rule fixed in advance: a {what} holds when its 95 % CI lies inside (-{m}, +{m}), fails when "
                f"the CI lies wholly outside it; otherwise unresolved")

    def rules_out(self, diffs: Mapping, digits: int = 4, label: Callable = _label) -> str | None:
        """For an inconclusive check: per unresolved difference what its CI rules out and how many paired
        seeds would detect a difference of the margin's size (None when the check is resolved)."""
        if not self.inconclusive:
            return None
        effect = -self.margin
        return "; ".join(power_statement(diffs[k], effect, label(k), digits=digits) for k in self.unresolved)


def _classify(d: PairedDifference, margin: float, sided: str) -> str:
    if sided == "lower":
        return "within" if d.low > -margin else "beyond" if d.high < -margin else "unresolved"
    if -margin < d.low and d.high < margin:
        return "within"
    return "beyond" if d.low > margin or d.high < -margin else "unresolved"


def margin_check(diffs: Mapping, margin: float, sided: str = "lower") -> MarginCheck:
    """Classify every paired difference of ``diffs`` ({key: PairedDifference}) against ``margin`` (> 0) by
    the rule of the module docstring (``sided``: "lower" or "two")."""
    if not diffs:
        raise ValueError("margin_check needs at least one difference")
    if not (isinstance(margin, (int, float)) and math.isfinite(margin) and margin > 0):
        raise ValueError(f"margin must be a positive number, got {margin!r}")
    if sided not in SIDES:
        raise ValueError(f"sided must be one of {SIDES}, got {sided!r}")
    out = {"within": [], "beyond": [], "unresolved": []}
    for key, d in diffs.items():
        if not isinstance(d, PairedDifference):
            raise ValueError(f"diffs[{key!r}] must be a PairedDifference, got {type(d).__name__}")
        out[_classify(d, float(margin), sided)].append(key)
    return MarginCheck(float(margin), sided, tuple(out["within"]), tuple(out["beyond"]), tuple(out["unresolved"]))


@dataclass(frozen=True)
class LevelCheck:
    """:func:`level_check`: ``holds_from``: the smallest level from which on (it and every larger level of
    the grid) every difference lies within the margin (None: no such level); ``fails_at``: the levels with
    a difference beyond the margin; ``unresolved_at``: the others that are not within."""

    levels: tuple
    holds_from: float | None
    fails_at: tuple
    unresolved_at: tuple
    checks: dict


def level_check(diffs_by_level: Mapping[float, Mapping], margin: float, sided: str = "lower") -> LevelCheck:
    """:func:`margin_check` at each level of a grid (e.g. a privacy budget epsilon; ``diffs_by_level``:
    {level: {key: PairedDifference}}) and the range of levels over which the claim holds."""
    if not diffs_by_level:
        raise ValueError("level_check needs at least one level")
    levels = tuple(sorted(diffs_by_level))
    checks = {lv: margin_check(diffs_by_level[lv], margin, sided) for lv in levels}
    holds_from = None
    for lv in reversed(levels):
        if checks[lv].holds is not True:
            break
        holds_from = lv
    return LevelCheck(levels, holds_from, tuple(lv for lv in levels if checks[lv].holds is False),
                      tuple(lv for lv in levels if checks[lv].holds is None), checks)


def bounds_text(diffs: Mapping, digits: int = 4, label: Callable = _label) -> str:
    """"key: the 95 % CI rules out below lo or above hi; ..." for every difference."""
    return "; ".join(f"{label(k)}: the {100 * d.confidence:.0f} % CI rules out a true difference below "
                     f"{d.low:+.{digits}f} or above {d.high:+.{digits}f}" for k, d in diffs.items())


def verdict_fields(check: MarginCheck, diffs: Mapping, *, converged: bool = True, missing: Sequence[str] = (),
                   digits: int = 4, label: Callable = _label) -> dict:
    """The keywords ``holds``, ``inconclusive``, ``condition`` and ``rules_out`` of
    :func:`fedlib.evaluation.claims.register` for a claim decided by ``check`` on ``diffs``:
    inconclusive when the check is unresolved or the comparison did not converge (``converged``);
    a claim that holds while methods it names did not run (``missing``) holds only for those that ran."""
    inconclusive = check.inconclusive or not converged
    rules_out = None
    if inconclusive:
        what = check.rules_out(diffs, digits, label) if check.inconclusive else bounds_text(diffs, digits, label)
        rules_out = ("the comparison did not converge at its budget; " if not converged else "") + what
    condition = None
    if check.holds is True and missing and not inconclusive:
        condition = f"the methods are those that ran ({', '.join(missing)} did not run in this profile)"
    return {"holds": check.holds, "inconclusive": inconclusive, "condition": condition, "rules_out": rules_out}


def steps_converged(summary: pd.DataFrame, gain: float) -> list[float]:
    """The steps c of :func:`fedlib.fedtsne.studies.step_summary` (index "step (x 1/L)") at which no run's
    D-hat 10-NN overlap gains more than ``gain`` after the summary's round, smallest first."""
    if not gain > 0:
        raise ValueError(f"gain must be positive, got {gain!r}")
    return sorted(float(c) for c, row in summary.iterrows() if row["largest_gain"] <= gain)

