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

Derivation and "predict, then check" exercises give the student a variable to fill in
(``my_answer = None``). While it is None the check prints what to fill in and what it will be
compared with, never the answer (:func:`pending`); once filled, :func:`answer_number` or
:func:`answer_choice` compares it with the number or the choice the chapter computed.
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
    as_predicted: bool | None          # None: nothing to judge yet (the student has not answered)

    def __str__(self) -> str:
        if self.as_predicted is None:
            return f"{self.exercise}: {self.prediction}; {self.measured}"
        end = "as predicted" if self.as_predicted else "NOT as predicted: re-read the exercise and its hint"
        return f"{self.exercise}: {self.prediction}; {self.measured}: {end}"

    __repr__ = __str__

    def __bool__(self) -> bool:
        return bool(self.as_predicted)


def _need(df: pd.DataFrame, columns: list[str], name: str) -> None:
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
    from fedlib.stsa.studies import upload_floats
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
    if sigma_rdp is None or sigma_pld is None:
        return pending("sigma_rdp and sigma_pld", "the two noise multipliers of privacy.calibrate_noise_multiplier",
                       "each other: which accountant asks for more noise", exercise)
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
    from fedlib.refed.algorithm import q_lambda
    if int(n) < 1:
        raise ValueError(f"n must be a positive integer, got {n}")
    lam = 1.0 / (1.0 + 2.0 * q_lambda(lam_sum) / int(n))
    return answer_number(answer, lam, name="my_lambda", asks=f"lambda under 'mean' equivalent to {lam_sum:g} under "
                         f"'sum' for n = {n}", compared_with="lambda' = 1/(1 + 2 q(lambda_sum)/n) from refed.q_lambda",
                         exercise=exercise, rtol=rtol)


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


# ---------------------------------------------------------------------------------------------
# AFL (continued)
# ---------------------------------------------------------------------------------------------
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


# ---------------------------------------------------------------------------------------------
# Fed-tSNE / Fed-SpeClust (continued)
# ---------------------------------------------------------------------------------------------
def fedtsne_nystrom_exact(errors, n_landmarks: int, x, *, tol: float = 1e-6,
                          exercise: str = "Fed-tSNE, ex. landmarks") -> Verdict:
    """Noisy or not, the Nyström distance estimate is exact once n_y >= r + 2 (r = affine rank of the data,
    at most m), and not before: noise in FedDL then cannot change the server's distance matrix.

    ``errors``: relative errors of the server's distance matrix (one per run) with ``n_landmarks``
    landmarks; ``x``: the clients' data (n, m).
    """
    err = np.asarray(errors, dtype=float).ravel()
    if err.size == 0:
        raise ValueError("errors must hold at least one run's distance error")
    x = np.asarray(x, dtype=np.float64)
    r = int(np.linalg.matrix_rank(x - x.mean(0)))
    exact = int(n_landmarks) >= r + 2
    ok = bool((err < tol).all()) if exact else bool((err > tol).all())
    return Verdict(exercise, f"n_y = {n_landmarks} {'>=' if exact else '<'} r + 2 = {r + 2} (affine rank r = {r}, "
                             f"m = {x.shape[1]}): the distance estimate is {'exact' if exact else 'not exact'} "
                             f"(error {'<' if exact else '>'} {tol:.0e}) in every run, noise or not",
                   f"measured error {err.min():.1e} to {err.max():.1e} over {err.size} run(s)", ok)


def fedtsne_early_rounds(overlap: pd.DataFrame, *, at: int = 10, share_max: float = 0.5,
                         exercise: str = "Fed-tSNE benchmark, ex. too few rounds") -> Verdict:
    """After ``at`` FedDL rounds the 10-NN overlap of D-hat has made less than ``share_max`` of its gain from
    the untrained landmarks (round 0) to the last round: a run stopped there measures the initialization.

    ``overlap``: one row per run (dataset, split), columns the rounds (0 and ``at`` among them), values the
    overlap (NaN after a run's last round); runs that end at or before ``at`` are not judged.
    """
    cols = {int(c): c for c in overlap.columns}
    pred = f"after {at} rounds the D-hat 10-NN overlap has made less than {share_max:.0%} of its gain up to the last round"
    if 0 not in cols:
        raise ValueError(f"overlap must have round 0 (the untrained landmarks) as a column; it has {list(cols)}")
    if at not in cols:
        return Verdict(exercise, pred, f"this run has no checkpoint at round {at}: nothing to judge", None)
    shares = {}
    for idx, row in overlap.iterrows():
        done = row.dropna()
        last = max(int(c) for c in done.index)
        if last <= at:
            continue
        gain = float(done[cols[last]] - row[cols[0]])
        shares[idx] = float(row[cols[at]] - row[cols[0]]) / gain if gain > 0 else np.inf
    if not shares:
        return Verdict(exercise, pred, f"no run went past round {at}: nothing to judge", None)
    worst = max(shares.values())
    return Verdict(exercise, pred, f"measured share at round {at}: {min(shares.values()):.2f} to {worst:.2f} over "
                                   f"{len(shares)} run(s)", bool(worst < share_max))


def fedtsne_weights(identity: pd.DataFrame, *, tol: float = 1e-10,
                    exercise: str = "Fed-tSNE derivation, ex. weights") -> Verdict:
    """n_p/n weights give the pooled gradient for every split; 1/P weights only when the clients are of one size.

    ``identity``: `fedtsne.gradient_identity_table` (columns weights, "client sizes" as "min-max",
    "rel. error vs pooled gradient").
    """
    _need(identity, ["weights", "client sizes", "rel. error vs pooled gradient"], "identity")
    sizes = identity["client sizes"].astype(str).str.split("-", expand=True).astype(int)
    equal = sizes[0] == sizes[1]
    err = identity["rel. error vs pooled gradient"].astype(float)
    size_w = identity["weights"] == "n_p/n"
    expect_exact = size_w | equal
    ok = bool((err[expect_exact] < tol).all() and (err[~expect_exact] > tol).all())
    unequal = err[~expect_exact]
    return Verdict(exercise, f"error < {tol:.0e} with n_p/n weights or equal client sizes; above it with 1/P and "
                             "unequal sizes",
                   f"measured largest exact-case error {err[expect_exact].max():.1e}; 1/P with unequal sizes "
                   + (f"{unequal.min():.1e} to {unequal.max():.1e}" if len(unequal) else "not in this run"), ok)


def fedtsne_budget(my_epsilon, target_sd: float, *, delta: float, sensitivity: float, rounds: int,
                   rtol: float = 0.05, exercise: str = "Fed-tSNE derivation, ex. privacy budget") -> Verdict:
    """The epsilon at which the PLD-calibrated gradient noise sd z(eps, delta, rounds) * sensitivity equals
    the gradient's own sd ``target_sd``: the student's epsilon is judged by the sd it buys."""
    from fedlib.fedtsne.dp import dp_noise_sd
    if not (target_sd > 0 and sensitivity > 0):
        raise ValueError(f"target_sd and sensitivity must be positive, got {target_sd}, {sensitivity}")
    if my_epsilon is None:
        return pending("my_epsilon", f"the epsilon at delta = {delta:g} whose noise sd equals the gradient's sd",
                       f"the gradient's sd {target_sd:.3g}, through the sd fedtsne.dp_noise_sd gives at your epsilon "
                       f"({rounds} compositions)", exercise)
    eps = float(my_epsilon)
    if not eps > 0:
        raise ValueError(f"my_epsilon must be positive, got {my_epsilon}")
    sd = dp_noise_sd(eps, delta, sensitivity, "dp_gradient", compositions=int(rounds))
    return Verdict(exercise, f"the noise sd at your epsilon equals the gradient's sd {target_sd:.3g} (± {100 * rtol:g} %)",
                   f"your epsilon {eps:.4g} gives sd {sd:.3g}", bool(abs(sd / target_sd - 1) <= rtol))


def fedsc_splits_differ(my_options, iid_parts, noniid_parts, *, n_landmarks: int = 10, rounds: int = 3,
                        seed: int = 0, tol: float = 1e-8, exercise: str = "Fed-SpeClust, ex. splits") -> Verdict:
    """Code question: which `fedtsne.feddl` options make IID and non-IID FedDL give different landmarks?
    The student's options (a dict of feddl keywords) are run on both splits (a short run) and judged by
    whether the landmarks differ; the chapter's own options (gradient mode, size weights) give the same.

    ``iid_parts``, ``noniid_parts``: the clients' arrays of the two splits of one data set.
    """
    from fedlib.fedtsne.feddl import feddl
    if my_options is None:
        return pending("my_options", "a dict of keyword arguments of fedtsne.feddl that make the splits differ",
                       "a short FedDL run with your options on the chapter's IID and non-IID splits: do the "
                       "landmarks differ?", exercise)
    if not isinstance(my_options, dict):
        raise ValueError(f"my_options must be a dict of feddl keyword arguments, got {my_options!r}")
    opts = {"gamma": "moments", **my_options, "rounds": rounds, "seed": seed}
    a, b = (feddl([np.asarray(p) for p in parts], n_landmarks, **opts).landmarks for parts in (iid_parts, noniid_parts))
    gap = float(np.abs(a - b).max() / max(np.abs(a).max(), 1e-300))
    return Verdict(exercise, f"the options {my_options} make IID and non-IID landmarks differ (> {tol:.0e})",
                   f"measured max relative difference after {rounds} rounds {gap:.1e}", bool(gap > tol))


def fedsc_linear_kernel_landmarks(my_n_y, x, *, exercise: str = "Fed-SpeClust, ex. rank") -> Verdict:
    """The linear kernel's Nyström estimate is exact from n_y = rank of the kernel matrix (<= m) landmarks in
    general position: any answer from rank(X) to m is right for this chapter's data ``x`` (n, m)."""
    x = np.asarray(x, dtype=np.float64)
    r, m = int(np.linalg.matrix_rank(x)), x.shape[1]
    return answer_number(my_n_y, r, name="my_n_y", asks=f"from how many landmarks the linear kernel's Nyström "
                         f"estimate is exact for data in R^m, here m = {m}",
                         compared_with="the rank of this chapter's linear kernel matrix X X^T (at most m)",
                         interval=(r, m), exercise=exercise)


def fedsc_kernel_width(runs: pd.DataFrame, gamma_rule: str, *, tol: float = 1e-10,
                       exercise: str = "Fed-SpeClust, ex. kernel width") -> Verdict:
    """The moments rule gives every run of a data set (centralized, IID, non-IID) one gamma; the median rule
    does not (under label skew the within-client medians are smaller).

    ``runs``: `fedtsne.speclust_runs` table (columns dataset, gamma).
    """
    _need(runs, ["dataset", "gamma"], "runs")
    if gamma_rule not in ("moments", "median"):
        raise ValueError(f"gamma_rule must be 'moments' or 'median', got {gamma_rule!r}")
    spread = float(runs.groupby("dataset")["gamma"].agg(lambda g: g.max() / g.min() - 1).max())
    same = spread < tol
    return Verdict(exercise, f"gamma_rule = {gamma_rule!r}: " + ("one gamma for every run of a data set"
                                                                 if gamma_rule == "moments" else "the runs' gammas differ"),
                   f"measured largest relative spread of gamma {spread:.1e}", bool(same == (gamma_rule == "moments")))


def fedsc_noise_column(my_column, diag: pd.DataFrame, *, exercise: str = "Fed-SpeClust, ex. noise") -> Verdict:
    """Predict-then-check: which federated column of the table moves most with the "+" noise? Judged by the
    kernel error, the column whose mean (over data sets) is largest.

    ``diag``: mean kernel error indexed by (dataset, variant, split), column "kernel rel. error".
    """
    _need(diag, ["kernel rel. error"], "diag")
    err = diag["kernel rel. error"].groupby(level=["variant", "split"]).mean()
    names = [f"{v} {s}" for v, s in err.index]
    truth = names[int(np.argmax(err.to_numpy()))]
    return answer_choice(my_column, truth, names, name="my_column", asks="the column that moves most with the noise",
                         compared_with="the column with the largest mean kernel error in this run", exercise=exercise)


def fedsc_rounds_oracle(my_prediction, err: pd.DataFrame, *, exercise: str = "Fed-SpeClust, ex. rounds") -> Verdict:
    """Predict-then-check: after this run's FedDL rounds, are FedDL's landmarks at least as good as the
    uniform-sample oracle's at the largest n_y (kernel error)?

    ``err``: kernel error indexed by n_y, columns starting with "FedDL" and "uniform sample".
    """
    fed = [c for c in err.columns if str(c).startswith("FedDL")]
    ora = [c for c in err.columns if str(c).startswith("uniform sample")]
    if not fed or not ora:
        raise ValueError(f"err must have a FedDL and a 'uniform sample' column; it has {list(err.columns)}")
    n_y = err.index.max()
    truth = "yes" if float(err.loc[n_y, fed[0]]) <= float(err.loc[n_y, ora[0]]) else "no"
    return answer_choice(my_prediction, truth, ["yes", "no"], name="my_prediction",
                         asks=f"does FedDL match the uniform-sample oracle's kernel error at n_y = {n_y}",
                         compared_with=f"this run's kernel errors at n_y = {n_y}", exercise=exercise)


# ---------------------------------------------------------------------------------------------
# Re-Fed (continued)
# ---------------------------------------------------------------------------------------------
def refed_pim_distance(dist_by_lambda: dict, *, exercise: str = "Re-Fed benchmark, ex. importance") -> Verdict:
    """Lemma 1: the PIM's distance to the global model does not decrease as lambda grows.

    ``dist_by_lambda``: {lambda: mean ||v - w||^2 over clients}, from PIMs started at the same global
    model on the same pools (the first boundary of runs that differ only in lambda).
    """
    pred = "the PIM's distance to the global model does not decrease as lambda grows"
    if len(dist_by_lambda) < 2:
        return Verdict(exercise, pred, "this run has fewer than two lambdas (lams): nothing to judge", None)
    lams = sorted(dist_by_lambda)
    d = np.array([float(dist_by_lambda[lam]) for lam in lams])
    ok = bool((np.diff(d) >= -1e-12 * np.abs(d).max()).all())
    return Verdict(exercise, pred, "measured " + ", ".join(f"lambda {lam:g}: {v:.3g}" for lam, v in zip(lams, d)), ok)


def _class_gap(memory_log) -> float:
    """Mean total-variation distance between the class proportions of a client's cache and of its pool."""
    gaps = []
    for log in memory_log:
        if "pool_classes" not in log or "old_classes" not in log:
            continue
        for pool, cache in zip(np.asarray(log["pool_classes"], float), np.asarray(log["old_classes"], float)):
            if pool.sum() > 0 and cache.sum() > 0:
                gaps.append(0.5 * np.abs(cache / cache.sum() - pool / pool.sum()).sum())
    if not gaps:
        raise ValueError("memory_log holds no cache with class counts (pool_classes, old_classes)")
    return float(np.mean(gaps))


def refed_class_balance(my_prediction, refed_log, random_log, *,
                        exercise: str = "Re-Fed benchmark, ex. class balance") -> Verdict:
    """Predict-then-check: whose caches keep the pool's class proportions more closely, Re-Fed's top-k or
    random replay? Judged by the mean total-variation distance between cache and pool class proportions.

    ``refed_log``, ``random_log``: the two runs' ``learner.memory_log``.
    """
    try:
        g_refed, g_random = _class_gap(refed_log), _class_gap(random_log)
    except ValueError:
        return Verdict(exercise, "whose caches are closer to the pools' class proportions",
                       "these runs cached nothing with class counts (one task?): nothing to judge", None)
    truth = "refed" if g_refed < g_random else "random"
    v = answer_choice(my_prediction, truth, ["refed", "random"], name="my_prediction",
                      asks="whose caches are closer to the pools' class proportions",
                      compared_with="the mean distance between cache and pool class proportions in this run",
                      exercise=exercise)
    if v.as_predicted is None:
        return v
    return Verdict(exercise, v.prediction, f"{v.measured} (measured distance: Re-Fed {g_refed:.3f}, random "
                                           f"{g_random:.3f})", v.as_predicted)


def refed_rate_constant(my_A, rate_tab: pd.DataFrame, g0: float, *, power: float = 0.5, rtol: float = 0.01,
                        exercise: str = "Re-Fed theory, ex. rates") -> Verdict:
    """The largest admissible A (in units of g0) for g(t) = g0 (t+1)^-p, against the chapter's
    `rate_feasibility` table (columns "g(t)", "largest admissible A")."""
    _need(rate_tab, ["g(t)", "largest admissible A"], "rate_tab")
    row = rate_tab[rate_tab["g(t)"].astype(str).str.strip() == f"g0 (t+1)^-{power}"]
    if row.empty:
        raise ValueError(f"rate_tab has no row for g(t) = g0 (t+1)^-{power}")
    truth = float(row["largest admissible A"].iloc[0]) / float(g0)
    return answer_number(my_A, truth, name="my_A", asks=f"the largest admissible A / g0 for p = {power:g}",
                         compared_with="the largest admissible A / g0 of the chapter's rate table", rtol=rtol,
                         exercise=exercise)


def refed_score_limits(my_scores, *, num_classes: int = 10, atol: float = 0.05,
                       exercise: str = "Re-Fed theory, ex. scores") -> Verdict:
    """||pi - e_y||^2 for a confidently correct and a confidently wrong prediction, against softmax(50 e_j)
    with j = y and j != y (``num_classes`` classes)."""
    if my_scores is None:
        return pending("my_scores", "(confidently correct, confidently wrong): the value of ||pi - e_y||^2",
                       "||softmax(z) - e_y||^2 at a large logit on the right class and on a wrong one", exercise)
    try:
        a_ok, a_bad = (float(v) for v in my_scores)
    except (TypeError, ValueError):
        raise ValueError(f"my_scores must be a pair of numbers, got {my_scores!r}") from None
    e = np.eye(num_classes)

    def err(j):
        z = 50.0 * e[j]
        pi = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
        return float(((pi - e[0]) ** 2).sum())

    t_ok, t_bad = err(0), err(1)
    ok = abs(a_ok - t_ok) <= atol and abs(a_bad - t_bad) <= atol
    return Verdict(exercise, f"||pi - e_y||^2: confidently correct {t_ok:.3f}, confidently wrong {t_bad:.3f} (± {atol:g})",
                   f"your answer ({a_ok:.3g}, {a_bad:.3g})", bool(ok))


def refed_memory_holds_all(same_as_replay, same_as_fedavg, *,
                           exercise: str = "Re-Fed theory, ex. memory") -> Verdict:
    """With a memory that holds every pool, Re-Fed is bit-identical to random replay at every stage, and to
    FedAvg (no memory) on the first stage only.

    ``same_as_replay``, ``same_as_fedavg``: per stage, whether the global weights are bit-identical.
    """
    rep, fed = np.asarray(same_as_replay, bool), np.asarray(same_as_fedavg, bool)
    if rep.size == 0 or rep.shape != fed.shape:
        raise ValueError(f"same_as_replay and same_as_fedavg must be per-stage flags of one length, got {rep.shape}, "
                         f"{fed.shape}")
    ok = bool(rep.all() and fed[0] and not fed[1:].any())
    return Verdict(exercise, "identical to random replay at every stage; to FedAvg at stage 1 only",
                   f"measured identical to random replay at {int(rep.sum())} of {rep.size} stages, to FedAvg at "
                   f"stages {[int(i) + 1 for i in np.flatnonzero(fed)]}", ok)


# ---------------------------------------------------------------------------------------------
# STSA (continued)
# ---------------------------------------------------------------------------------------------
def stsa_random_features(ablation: pd.DataFrame, dims: dict, *, method: str = "STSA",
                         exercise: str = "STSA benchmark, ex. random features") -> Verdict:
    """The random-feature expansion (the best M != d against the raw features, M = d) gains more accuracy on
    the low-dimensional scratch features than on the pretrained ones.

    ``ablation``: `stsa.ablation_runs` table (columns ablation, value, method, A_T); ``dims``: {ablation
    name: the raw feature dimension d}, the scratch one first, e.g. {"M (scratch)": 32, "M (pretrained)": 1280}.
    """
    _need(ablation, ["ablation", "value", "method", "A_T"], "ablation")
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
    from fedlib.stsa.studies import upload_floats
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
    _need(bias, ["K_D", "k_mode", "covariance ratio"], "bias")
    row = bias[(bias.K_D == num_dummy) & (bias.k_mode == "global")]
    if row.empty:
        raise ValueError(f"bias has no global-K row for K_D = {num_dummy}: add it to bias_dummy")
    return answer_number(my_ratio, float(row["covariance ratio"].iloc[0]), name="my_ratio",
                         asks=f"the covariance ratio with the global K at K_D = {num_dummy}",
                         compared_with=f"the Monte Carlo ratio of section 4 at K_D = {num_dummy}", atol=atol,
                         exercise=exercise)
