"""The self-checks of the AFL chapters' exercises: each takes the student's answer and the
chapter's own numbers and returns a :class:`~fedlib.evaluation.selfcheck.Verdict`."""
from __future__ import annotations

import numpy as np
import pandas as pd

from fedlib.evaluation.selfcheck import Verdict, answer_choice, need


def afl_printed_sign(two_clients: pd.DataFrame, *, exact_tol: float = 1e-8, wrong_min: float = 0.1,
                     exercise: str = "AFL derivation, ex. sign") -> Verdict:
    """The AA law with the corrected sign is exact, the printed sign gives an O(1) error, for any d and N.

    ``two_clients``: `afl.two_client_check` table, row 0 the corrected (+) law, row 1 the printed (-) law,
    column ``"max rel. error"`` (relative to the lstsq head).
    """
    need(two_clients, ["max rel. error"], "two_clients")
    if len(two_clients) < 2:
        raise ValueError("two_clients must have two rows: the corrected law (row 0) and the printed law (row 1)")
    ok_err, bad_err = (float(two_clients["max rel. error"].iloc[i]) for i in (0, 1))
    return Verdict(exercise, f"corrected sign exact (<= {exact_tol:.0e}), printed sign O(1) wrong (>= {wrong_min:g})",
                   f"measured corrected {ok_err:.1e}, printed {bad_err:.2f}",
                   bool(ok_err <= exact_tol and bad_err >= wrong_min))


def afl_table1_break(table1: pd.DataFrame, dim: int, *, exact_tol: float = 1e-6, broken_min: float = 1e-3,
                     exercise: str = "AFL derivation, ex. Table 1") -> Verdict:
    """Without RI the deviation is round-off while N_k >= d and large exactly from the first K with N_k < d.

    ``table1``: `afl.table1_deviations` table indexed by K with columns ``"N_k"`` and ``"ΔW w/o RI (ours)"``;
    ``dim``: the feature dimension d of that run.
    """
    need(table1, ["N_k", "ΔW w/o RI (ours)"], "table1")
    if int(dim) < 1:
        raise ValueError(f"dim must be a positive integer, got {dim}")
    predicted = table1["N_k"] < dim
    dw = table1["ΔW w/o RI (ours)"]
    agree = ((predicted & (dw > broken_min)) | (~predicted & (dw < exact_tol))).all()
    first_pred = table1.index[predicted].min() if predicted.any() else None
    first_seen = table1.index[dw > broken_min].min() if (dw > broken_min).any() else None
    return Verdict(exercise, f"ΔW w/o RI breaks (> {broken_min:g}) exactly when N_k < d = {dim}, first at K = {first_pred}",
                   f"measured first K with ΔW > {broken_min:g}: {first_seen}; all {len(table1)} client counts on the predicted side: "
                   f"{bool(agree)}", bool(agree))


def afl_gamma_conditioning(fp: pd.DataFrame, tol64: float, *,
                           exercise: str = "AFL derivation, ex. conditioning") -> Verdict:
    """As gamma shrinks the recursive (pairwise) server fails first; the one-solve server stays within tol.

    ``fp``: `afl.gamma_precision_sweep` table (columns dtype, gamma, server, "max rel. error");
    ``tol64``: the float64 tolerance 2·κ·u of the pooled Gram.
    """
    need(fp, ["dtype", "gamma", "server", "max rel. error"], "fp")
    f64 = fp[fp["dtype"] == "float64"].set_index(["gamma", "server"])["max rel. error"].fillna(np.inf)
    g_min = float(fp["gamma"].min())
    one_worst = float(f64.xs("one_solve", level="server").max())
    pair_small, one_small = float(f64[(g_min, "pairwise")]), float(f64[(g_min, "one_solve")])
    ok = one_worst <= tol64 and pair_small > max(tol64, one_small)
    return Verdict(exercise, f"one-solve within 2·κ·u = {tol64:.1e} for every gamma; the recursive form worse at "
                             f"gamma = {g_min:g}",
                   f"measured one-solve worst {one_worst:.1e}, recursive at gamma = {g_min:g}: {pair_small:.1e}", bool(ok))


def afl_accuracy_invariance(accuracies, centralized: float, *, tol: float = 1e-12,
                            exercise: str = "AFL benchmark, ex. invariance") -> Verdict:
    """AFL's test accuracy is the same for every partition / client count and equals the centralized head's.

    ``accuracies``: AFL's accuracies (one per run: setting, K or seed); ``centralized``: the joint head's accuracy.
    """
    acc = np.asarray(accuracies, dtype=float).ravel()
    if acc.size == 0:
        raise ValueError("accuracies must hold at least one AFL run")
    dev = float(np.abs(acc - float(centralized)).max())
    return Verdict(exercise, "AFL's accuracy is the same in every run and equals the centralized head's",
                   f"measured max |acc - centralized| = {dev:.1e} <= {tol:.0e} over {acc.size} runs", bool(dev <= tol))


def afl_partition_variance(my_prediction, std_ratio, *,
                           exercise: str = "AFL benchmark, ex. variance") -> Verdict:
    """Predict-then-check: does a method's ± grow when every seed also draws a new partition?

    ``my_prediction``: "grows" or "does not grow"; ``std_ratio``: `afl.protocol_spread`'s ratio of the
    sample stds (new partition / fixed partition), one per (setting, method); judged on its median.
    """
    ratio = pd.Series(std_ratio, dtype=float).replace([np.inf, -np.inf], np.nan).dropna()
    if ratio.empty:
        return Verdict(exercise, "a method's ± with a new partition per seed against a fixed partition",
                       "this run measured no finite ratio of the two stds (set resample_methods; 2 or more seeds)", None)
    truth = "grows" if float(ratio.median()) > 1 else "does not grow"
    return answer_choice(my_prediction, truth, ["grows", "does not grow"], name="my_prediction",
                         asks="the sample std of a method's accuracy when the partition is redrawn with every seed",
                         compared_with="section 5's median ratio of the two stds (new partition / fixed), "
                                       "'grows' when above 1", exercise=exercise)
