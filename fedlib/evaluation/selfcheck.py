"""Self-checks for the book's exercises: did the student observe what the exercise predicts?

Each exercise of a chapter is followed by one cell that calls a function of this module on what
the chapter measured (a table, a number). The function states the prediction, measures it on
the data it is given and returns a :class:`Verdict`, printed as one line, e.g.

    AFL benchmark, ex. invariance: AFL's accuracy is the same in every run and equals the centralized
    head's; measured max |acc - centralized| = 0.0e+00 <= 1e-12 over 12 runs: as predicted

A student changes the chapter's parameter, re-runs it, and reads the line: "as predicted" or
"NOT as predicted". The predictions are laws that hold for every parameter value (that is what
the exercise asks the student to discover), so the check is meaningful at the default values too.
Nothing here raises on a failed prediction; bad *input* (a table without the needed columns)
raises ``ValueError`` naming what is missing.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class Verdict:
    """Outcome of one self-check: what was predicted, what was measured, and whether they agree."""
    exercise: str
    prediction: str
    measured: str
    as_predicted: bool

    def __str__(self) -> str:
        end = "as predicted" if self.as_predicted else "NOT as predicted: re-read the exercise and its hint"
        return f"{self.exercise}: {self.prediction}; {self.measured}: {end}"

    __repr__ = __str__

    def __bool__(self) -> bool:
        return self.as_predicted


def _need(df: pd.DataFrame, columns: list[str], name: str) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(f"{name} must have the column(s) {missing}; it has {list(df.columns)}")


# ---------------------------------------------------------------------------------------------
# AFL
# ---------------------------------------------------------------------------------------------
def afl_printed_sign(two_clients: pd.DataFrame, *, exact_tol: float = 1e-8, wrong_min: float = 0.1,
                     exercise: str = "AFL derivation, ex. sign") -> Verdict:
    """The AA law with the corrected sign is exact, the printed sign gives an O(1) error, for any d and N.

    ``two_clients``: `afl.two_client_check` table, row 0 the corrected (+) law, row 1 the printed (-) law,
    column ``"max rel. error"`` (relative to the lstsq head).
    """
    _need(two_clients, ["max rel. error"], "two_clients")
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
    _need(table1, ["N_k", "ΔW w/o RI (ours)"], "table1")
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
    _need(fp, ["dtype", "gamma", "server", "max rel. error"], "fp")
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


# ---------------------------------------------------------------------------------------------
# STSA
# ---------------------------------------------------------------------------------------------
def stsa_partition_invariance(spatial: pd.DataFrame, tol: float, *,
                              exercise: str = "STSA derivation, ex. exactness") -> Verdict:
    """With a fixed backbone, STSA's head and predictions do not depend on the partition (beta, K).

    ``spatial``: `stsa.spatial_check` table (columns "rel. err. W", "same predictions"); ``tol``: its tolerance.
    """
    _need(spatial, ["rel. err. W", "same predictions"], "spatial")
    worst = float(spatial["rel. err. W"].max())
    same = bool(spatial["same predictions"].all())
    return Verdict(exercise, "the head equals the centralized ridge head for every partition, same predictions",
                   f"measured max rel. error {worst:.1e} (tolerance {tol:.1e}) over {len(spatial)} partitions, "
                   f"identical predictions: {same}", bool(worst <= tol and same))


def stsa_break_even(answer_kd: int, M: int, c_t: int, *, exercise: str = "STSA derivation, ex. break-even") -> Verdict:
    """The largest K_D at which STSA-E uploads fewer numbers than STSA: (M+1) c_t K_D < (M + c_t) M.

    ``answer_kd``: the student's answer; the reference comes from `stsa.upload_floats`.
    """
    from fedlib.papers.stsa import upload_floats
    if int(M) < 1 or int(c_t) < 1:
        raise ValueError(f"M and c_t must be positive integers, got M={M}, c_t={c_t}")
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


# ---------------------------------------------------------------------------------------------
# Fed-tSNE / Fed-SpeClust
# ---------------------------------------------------------------------------------------------
def fedtsne_exact_landmarks(sweep: pd.DataFrame, x, *, exact_tol: float = 1e-5,
                            exercise: str = "Fed-tSNE derivation, ex. landmarks") -> Verdict:
    """The Nyström distance estimate is exact once n_y >= r + 2, r = affine rank of the data (not m).

    ``sweep``: `fedtsne.landmark_quality_sweep` table (columns landmarks, n_y, "rel. error of D_hat");
    ``x``: the data (n, m). Only the FedDL rows are judged.
    """
    _need(sweep, ["landmarks", "n_y", "rel. error of D_hat"], "sweep")
    x = np.asarray(x, dtype=np.float64)
    r = int(np.linalg.matrix_rank(x - x.mean(0)))
    fed = sweep[sweep["landmarks"].astype(str).str.startswith("FedDL")]
    if fed.empty:
        raise ValueError("sweep has no FedDL rows (landmarks starting with 'FedDL')")
    big = fed[fed["n_y"] >= r + 2]
    small = fed[fed["n_y"] <= r]
    ok = bool((big["rel. error of D_hat"] < exact_tol).all() and (small["rel. error of D_hat"] > exact_tol).all())
    return Verdict(exercise, f"exact (< {exact_tol:.0e}) for n_y >= r + 2 = {r + 2} (r = affine rank = {r} of "
                             f"m = {x.shape[1]} features), not for n_y <= r",
                   f"measured largest error at n_y >= {r + 2}: "
                   f"{big['rel. error of D_hat'].max() if len(big) else float('nan'):.1e}; smallest at n_y <= {r}: "
                   f"{small['rel. error of D_hat'].min() if len(small) else float('nan'):.1e}", ok)


def fedtsne_accountants(sigma_rdp: float, sigma_pld: float, *,
                        exercise: str = "Fed-tSNE privacy, ex. accountant") -> Verdict:
    """RDP is a looser bound than PLD: for the same (epsilon, delta, rounds) it asks for at least as much noise."""
    if not (sigma_rdp > 0 and sigma_pld > 0):
        raise ValueError(f"sigma_rdp and sigma_pld must be positive noise multipliers, got {sigma_rdp}, {sigma_pld}")
    return Verdict(exercise, "the RDP noise multiplier is >= the PLD one",
                   f"measured RDP {sigma_rdp:.3f}, PLD {sigma_pld:.3f} (ratio {sigma_rdp / sigma_pld:.2f})",
                   bool(sigma_rdp >= sigma_pld * (1 - 1e-6)))


def fedtsne_plain_vs_squared(quality: pd.DataFrame, m: int, *, exact_tol: float = 1e-6,
                             exercise: str = "Fed-tSNE benchmark, ex. plain distances") -> Verdict:
    """Nyström on squared distances is exact once n_y >= m + 2; on plain distances it never is.

    ``quality``: the landmark sweep's table (columns estimate, n_y, "D-hat rel. error"), the plain-distance
    rows labelled "FedDL landmarks, plain"; ``m``: the data's dimension.
    """
    _need(quality, ["estimate", "n_y", "D-hat rel. error"], "quality")
    plain = quality["estimate"].astype(str).str.endswith("plain")
    if not plain.any():
        raise ValueError("quality has no plain-distance rows (estimate ending in 'plain')")
    squared_big = quality[~plain & (quality["n_y"] >= m + 2)]["D-hat rel. error"]
    plain_min = float(quality[plain]["D-hat rel. error"].min())
    ok = bool((squared_big < exact_tol).all() and plain_min > exact_tol)
    sq = f"{squared_big.max():.1e}" if len(squared_big) else f"no run with n_y >= {m + 2}"
    return Verdict(exercise, f"squared: exact (< {exact_tol:.0e}) for n_y >= m + 2 = {m + 2}; plain: never exact",
                   f"measured squared at n_y >= {m + 2}: {sq}; plain, smallest error {plain_min:.1e}", ok)


def fedtsne_reconstruction(x_rec, x_proj, x, span_dim: int, *, tol: float = 1e-6,
                           exercise: str = "Fed-SpeClust, ex. reconstruction") -> Verdict:
    """From the kernel upload the server recovers a client's points up to their projection on the landmarks'
    affine span: all of them when that span is the whole space (span_dim = m, i.e. n_y >= m + 1 landmarks
    in general position).

    ``x_rec``: the server's reconstruction (n, m), ``x_proj``: the projection of ``x`` (the client's data) on
    the landmarks' affine span of dimension ``span_dim``.
    """
    x_rec, x_proj, x = (np.asarray(a, dtype=np.float64) for a in (x_rec, x_proj, x))
    if not (x_rec.shape == x_proj.shape == x.shape) or x.ndim != 2:
        raise ValueError(f"x_rec, x_proj and x must be (n, m) arrays of one shape, got {x_rec.shape}, {x_proj.shape}, "
                         f"{x.shape}")
    m = x.shape[1]
    gap = float(np.linalg.norm(x_rec - x_proj) / np.linalg.norm(x))
    err = float(np.linalg.norm(x_rec - x) / np.linalg.norm(x))
    ok = gap <= tol and (int(span_dim) < m or err <= tol)
    return Verdict(exercise, f"reconstruction = projection on the landmarks' affine span (dimension {span_dim}); "
                             f"exact when that is all of R^{m} (n_y >= {m + 1})",
                   f"measured |X_rec - X_proj| / |X| = {gap:.1e}, |X_rec - X| / |X| = {err:.2e}", bool(ok))


# ---------------------------------------------------------------------------------------------
# Re-Fed
# ---------------------------------------------------------------------------------------------
def refed_mean_lambda(answer: float, lam_sum: float, n: int, *, rtol: float = 1e-4,
                      exercise: str = "Re-Fed theory, ex. sum versus mean") -> Verdict:
    """lambda' under mean scaling with q(lambda') = q(lambda_sum) / n, i.e. lambda' = 1 / (1 + 2 q / n)."""
    from fedlib.papers.refed import q_lambda
    if int(n) < 1:
        raise ValueError(f"n must be a positive integer, got {n}")
    lam = 1.0 / (1.0 + 2.0 * q_lambda(lam_sum) / int(n))
    ok = abs(float(answer) - lam) <= rtol * lam
    return Verdict(exercise, f"lambda' = 1/(1 + 2 q({lam_sum:g})/{n}) = {lam:.6f}", f"your answer {float(answer):.6f}",
                   bool(ok))


def refed_one_step_flat(fin: pd.DataFrame, *, tol: float = 1e-12,
                        exercise: str = "Re-Fed theory, ex. one step") -> Verdict:
    """After s = 1 step of eq. 3 from v = w the PIM does not depend on lambda (flat distance curve).

    ``fin``: the finite-step scan (columns s, lambda, dist).
    """
    _need(fin, ["s", "lambda", "dist"], "fin")
    one = fin[fin["s"] == 1]
    if one.empty:
        raise ValueError("fin has no s = 1 rows: keep 1 in pim_steps")
    spread = float(np.ptp(one["dist"].to_numpy()))
    return Verdict(exercise, "the s = 1 distance is the same for every lambda",
                   f"measured spread over {one['lambda'].nunique()} lambdas {spread:.1e} <= {tol:.0e}", bool(spread <= tol))


def refed_full_memory(acc_refed, acc_random, memory: int, largest_pool: int, *,
                      exercise: str = "Re-Fed benchmark, ex. full memory") -> Verdict:
    """Once M holds every client's pool, Re-Fed and random replay keep the same samples and train identically;
    below that they select differently (and in general end with different accuracies).

    ``acc_refed``, ``acc_random``: the two runs' accuracy matrices (tasks x tasks) at memory ``memory``;
    ``largest_pool``: the largest pool of any client at any boundary (`refed.largest_pools`).
    """
    a, b = np.asarray(acc_refed, dtype=float), np.asarray(acc_random, dtype=float)
    if a.shape != b.shape:
        raise ValueError(f"acc_refed and acc_random must have one shape, got {a.shape} and {b.shape}")
    same = bool(np.array_equal(a, b, equal_nan=True))
    holds_all = int(memory) >= int(largest_pool)
    pred = "identical accuracy matrices" if holds_all else "different accuracy matrices"
    return Verdict(exercise, f"M = {memory} {'>=' if holds_all else '<'} largest pool {largest_pool}: {pred}",
                   f"measured {'identical' if same else 'different'} matrices", same == holds_all)
