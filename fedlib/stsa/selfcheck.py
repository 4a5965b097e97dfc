"""The self-checks of the STSA chapters' exercises: each takes the student's answer and the
chapter's own numbers and returns a :class:`~fedlib.evaluation.selfcheck.Verdict`."""
from __future__ import annotations

import numpy as np
import pandas as pd

from fedlib.evaluation.selfcheck import Verdict, answer_number, need, pending
from fedlib.stsa.studies import upload_floats


def stsa_partition_invariance(spatial: pd.DataFrame, tol: float, *,
                              exercise: str = "STSA derivation, ex. exactness") -> Verdict:
    """With a fixed backbone, STSA's head and predictions do not depend on the partition (beta, K).

    ``spatial``: `stsa.spatial_check` table (columns "rel. err. W", "same predictions"); ``tol``: its tolerance.
    """
    need(spatial, ["rel. err. W", "same predictions"], "spatial")
    worst = float(spatial["rel. err. W"].max())
    same = bool(spatial["same predictions"].all())
    return Verdict(exercise, "the head equals the centralized ridge head for every partition, same predictions",
                   f"measured max rel. error {worst:.1e} (tolerance {tol:.1e}) over {len(spatial)} partitions, "
                   f"identical predictions: {same}", bool(worst <= tol and same))


def stsa_break_even(answer_kd: int, M: int, c_t: int, *, exercise: str = "STSA derivation, ex. break-even") -> Verdict:
    """The largest K_D at which STSA-E uploads fewer numbers than STSA: (M+1) c_t K_D < (M + c_t) M.

    ``answer_kd``: the student's answer; the reference comes from `stsa.upload_floats`.
    """
    if int(M) < 1 or int(c_t) < 1:
        raise ValueError(f"M and c_t must be positive integers, got M={M}, c_t={c_t}")
    if answer_kd is None:
        return pending("my_K_D", f"the largest K_D at which STSA-E uploads less than STSA, M = {M}, c_t = {c_t}",
                       "the largest K_D for which upload_floats('stsa_e', ...) < upload_floats('stsa', ...)", exercise)
    stsa_up = upload_floats("stsa", M, c_t)
    kd = int(stsa_up // ((M + 1) * c_t))
    while upload_floats("stsa_e", M, c_t, kd + 1) < stsa_up:
        kd += 1
    while kd > 0 and upload_floats("stsa_e", M, c_t, kd) >= stsa_up:
        kd -= 1
    return Verdict(exercise, f"STSA-E uploads less than STSA up to K_D = {kd} (M = {M}, c_t = {c_t})",
                   f"your answer K_D = {answer_kd}", int(answer_kd) == kd)


def stsa_rank(rk: dict, M: int, *, exercise: str = "STSA derivation, ex. rank") -> Verdict:
    """rank(G_hat) <= sum_i K_i < M: the estimate is singular, so gamma is what makes eq. 10 solvable.

    ``rk``: `stsa.gram_estimate_rank` result (keys rank, bound); ``M``: the random-feature width.
    """
    missing = [k for k in ("rank", "bound") if k not in rk]
    if missing:
        raise ValueError(f"rk must have the keys {missing}")
    ok = rk["rank"] <= rk["bound"] < M
    return Verdict(exercise, f"rank(G_hat) <= sum_i K_i < M = {M} (singular without gamma)",
                   f"measured rank {rk['rank']}, sum_i K_i = {rk['bound']}", bool(ok))


def stsa_beta_invariance(spread, gap_joint: float, *, spread_tol: float = 1e-9, joint_tol: float = 0.05,
                         exercise: str = "STSA benchmark, ex. heterogeneity") -> Verdict:
    """With the frozen pretrained backbone STSA's final accuracy does not move with beta: it is the joint
    ridge head's (which never sees the partition).

    ``spread``: per (setting, seed) spread of STSA's A_T across beta (points); ``gap_joint``: largest
    |A_T(STSA) - A_T(Joint)| (points), both from `stsa.exactness_check`.
    """
    spread = np.asarray(spread, dtype=float).ravel()
    if spread.size == 0:
        raise ValueError("spread must hold at least one (setting, seed) of the pretrained setting")
    worst = float(spread.max())
    return Verdict(exercise, "STSA's A_T is the same for every beta and equals the centralized ridge head's",
                   f"measured spread across beta {worst:.1e} <= {spread_tol:.0e} points, |STSA - Joint| "
                   f"{float(gap_joint):.1e} <= {joint_tol:g} points", bool(worst <= spread_tol and gap_joint <= joint_tol))


def stsa_random_features(ablation: pd.DataFrame, dims: dict, *, method: str = "STSA",
                         exercise: str = "STSA benchmark, ex. random features") -> Verdict:
    """The random-feature expansion (the best M != d against the raw features, M = d) gains more accuracy on
    the low-dimensional scratch features than on the pretrained ones.

    ``ablation``: `stsa.ablation_runs` table (columns ablation, value, method, A_T); ``dims``: {ablation
    name: the raw feature dimension d}, the scratch one first, e.g. {"M (scratch)": 32, "M (pretrained)": 1280}.
    """
    need(ablation, ["ablation", "value", "method", "A_T"], "ablation")
    if len(dims) != 2:
        raise ValueError(f"dims must name two ablations (scratch, pretrained), got {dims}")
    gains = {}
    for name, d in dims.items():
        rows = ablation[(ablation.ablation == name) & (ablation.method == method)].set_index("value")["A_T"]
        if d not in rows.index or len(rows) < 2:
            return Verdict(exercise, "the expansion gains more on the scratch features than on the pretrained ones",
                           f"ablation {name!r} has no raw point M = {d} and another M ({list(rows.index)}): "
                           "nothing to judge", None)
        gains[name] = float(rows.drop(index=d).max() - rows[d])
    (s_name, s_gain), (p_name, p_gain) = gains.items()
    return Verdict(exercise, f"the expansion gains more on the {dims[s_name]}-d features than on the {dims[p_name]}-d ones",
                   f"measured gain of A_T (best M - raw): {s_name} {s_gain:+.2f}, {p_name} {p_gain:+.2f} points",
                   bool(s_gain > p_gain))


def stsa_upload_crossing(my_M, baseline_mib: float, stsa_mib: float, M: int, c_t: int, *,
                         exercise: str = "STSA benchmark, ex. communication") -> Verdict:
    """The smallest M at which STSA's measured upload, scaled by (M + c_t) M, exceeds the baseline's measured
    upload ``baseline_mib`` (STSA uploaded ``stsa_mib`` at the run's ``M``); answers within 1 are right."""
    if not (baseline_mib > 0 and stsa_mib > 0):
        raise ValueError(f"baseline_mib and stsa_mib must be positive, got {baseline_mib}, {stsa_mib}")
    per_float = stsa_mib / upload_floats("stsa", int(M), int(c_t))
    m = 1
    while upload_floats("stsa", m, int(c_t)) * per_float <= baseline_mib:
        m += 1
    return answer_number(my_M, m, name="my_M", asks="the smallest M at which STSA uploads more than the baseline",
                         compared_with="the smallest M with (M + c_t) M floats above the baseline's measured bytes",
                         atol=1, exercise=exercise)


def stsa_dummy_ratio(my_ratio, bias: pd.DataFrame, num_dummy: int, *, atol: float = 0.1,
                     exercise: str = "STSA derivation, ex. dummy clients") -> Verdict:
    """The covariance ratio of eq. 9 with the global K under dummy clients, (K_i - 1)/(K - 1) in expectation,
    against the Monte Carlo ratio of `stsa.dummy_client_bias` (columns K_D, k_mode, "covariance ratio")."""
    need(bias, ["K_D", "k_mode", "covariance ratio"], "bias")
    row = bias[(bias.K_D == num_dummy) & (bias.k_mode == "global")]
    if row.empty:
        raise ValueError(f"bias has no global-K row for K_D = {num_dummy}: add it to bias_dummy")
    return answer_number(my_ratio, float(row["covariance ratio"].iloc[0]), name="my_ratio",
                         asks=f"the covariance ratio with the global K at K_D = {num_dummy}",
                         compared_with=f"the Monte Carlo ratio of section 4 at K_D = {num_dummy}", atol=atol,
                         exercise=exercise)
