"""Self-checks for the book's exercises: did the student observe what the exercise predicts?

Each exercise of a chapter is followed by one cell that calls a function of this module on what
the chapter measured (a table, a number). The function states the prediction, measures it on
the data it is given and returns a :class:`Verdict`, printed with the verdict on its own first
line and the prediction and measurement below it, wrapped at :data:`WIDTH` columns (a page shows
all of it without scrolling sideways), e.g.

    as predicted
      AFL benchmark, ex. invariance: AFL's accuracy is the same in every run and equals the
      centralized head's; measured max |acc - centralized| = 0.0e+00 <= 1e-12 over 12 runs

A student changes the chapter's parameter, re-runs it, and reads the first line: "as predicted" or
"NOT as predicted". The predictions are laws that hold for every parameter value (that is what
the exercise asks the student to discover), so the check is meaningful at the default values too.
Nothing here raises on a failed prediction; bad *input* (a table without the needed columns)
raises ``ValueError`` naming what is missing.

Derivation and "predict, then check" exercises give the student a variable to fill in
(``my_answer = None``). While it is None the check prints what to fill in and what it will be
compared with, never the answer (:func:`pending`); once filled, :func:`answer_number` or
:func:`answer_choice` compares it with the number or the choice the chapter computed.
"""
from __future__ import annotations

import textwrap
from dataclasses import dataclass

import pandas as pd

WIDTH = 100   # columns of a printed verdict (the book's output boxes show about this many)


@dataclass(frozen=True)
class Verdict:
    """Outcome of one self-check: what was predicted, what was measured, and whether they agree."""
    exercise: str
    prediction: str
    measured: str
    as_predicted: bool | None          # None: nothing to judge yet (the student has not answered)

    def headline(self) -> str:
        """The first printed line: the verdict alone (or, before the student answers, what to do)."""
        if self.as_predicted is None:
            return "not checked yet: see below"
        return "as predicted" if self.as_predicted else "NOT as predicted: re-read the exercise and its hint"

    def __str__(self) -> str:
        body = textwrap.fill(f"{self.exercise}: {self.prediction}; {self.measured}", width=WIDTH,
                             initial_indent="  ", subsequent_indent="  ", break_long_words=False,
                             break_on_hyphens=False)
        return f"{self.headline()}\n{body}"

    __repr__ = __str__

    def __bool__(self) -> bool:
        return bool(self.as_predicted)


def need(df: pd.DataFrame, columns: list[str], name: str) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(f"{name} must have the column(s) {missing}; it has {list(df.columns)}")


# ---------------------------------------------------------------------------------------------
# the student's answer against the chapter's number or choice (derivation / predict-then-check)
# ---------------------------------------------------------------------------------------------
def pending(name: str, asks: str, compared_with: str, exercise: str) -> Verdict:
    """The line printed while the student's variable ``name`` is still None: what to fill in and
    what it will be compared with (never the answer itself)."""
    return Verdict(exercise, f"fill in `{name}` ({asks}) and re-run this cell",
                   f"it will be compared with {compared_with}", None)


def answer_number(answer, truth: float, *, name: str, asks: str, compared_with: str, exercise: str,
                  rtol: float = 0.0, atol: float = 0.0, interval: tuple[float, float] | None = None) -> Verdict:
    """The student's number against the chapter's ``truth``: as predicted when |answer - truth| <=
    atol + rtol |truth| (or, with ``interval`` = (low, high), when low <= answer <= high: every answer
    in it is right). ``answer`` None gives :func:`pending`."""
    if answer is None:
        return pending(name, asks, compared_with, exercise)
    try:
        a = float(answer)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {answer!r}") from None
    if interval is not None:
        lo, hi = (float(v) for v in interval)
        ok = lo <= a <= hi
        said = f"{compared_with}: {lo:.6g}" if lo == hi else f"{compared_with}: any value from {lo:.6g} to {hi:.6g}"
    else:
        ok = abs(a - float(truth)) <= atol + rtol * abs(float(truth))
        tol = " ".join(t for t in (f"± {atol:g}" if atol else "", f"± {100 * rtol:g} %" if rtol else "") if t)
        said = f"{compared_with}: {float(truth):.6g}" + (f" ({tol})" if tol else "")
    return Verdict(exercise, said, f"your answer {a:.6g}", bool(ok))


def answer_choice(answer, truth: str, choices, *, name: str, asks: str, compared_with: str,
                  exercise: str) -> Verdict:
    """The student's choice (one of ``choices``, case-insensitive) against the chapter's ``truth``;
    ``answer`` None gives :func:`pending` (it lists the choices, not the answer)."""
    choices = [str(c) for c in choices]
    if answer is None:
        return pending(name, f"{asks}; one of {choices}", compared_with, exercise)
    norm = {c.lower(): c for c in choices}
    if str(answer).strip().lower() not in norm:
        raise ValueError(f"{name} must be one of {choices}, got {answer!r}")
    a = norm[str(answer).strip().lower()]
    return Verdict(exercise, f"{compared_with}: {truth}", f"your answer {a}", a == truth)


# ---------------------------------------------------------------------------------------------
# AFL
# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# STSA
# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# Fed-tSNE / Fed-SpeClust
# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# Re-Fed
# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# AFL (continued)
# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# Fed-tSNE / Fed-SpeClust (continued)
# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# Re-Fed (continued)
# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# STSA (continued)
# ---------------------------------------------------------------------------------------------


