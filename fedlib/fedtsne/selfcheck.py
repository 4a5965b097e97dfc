"""The self-checks of the Fed-tSNE and Fed-SpeClust chapters' exercises: each takes the student's answer and the
chapter's own numbers and returns a :class:`~fedlib.evaluation.selfcheck.Verdict`."""
from __future__ import annotations

import numpy as np
import pandas as pd

from fedlib.evaluation.selfcheck import Verdict, answer_choice, answer_number, need, pending
from fedlib.fedtsne.dp import dp_noise_sd
from fedlib.fedtsne.feddl import feddl


def fedtsne_exact_landmarks(sweep: pd.DataFrame, x, *, exact_tol: float = 1e-5,
                            exercise: str = "Fed-tSNE derivation, ex. landmarks") -> Verdict:
    """The Nyström distance estimate is exact once n_y >= r + 2, r = affine rank of the data (not m).

    ``sweep``: `fedtsne.landmark_quality_sweep` table (columns landmarks, n_y, "rel. error of D_hat");
    ``x``: the data (n, m). Only the FedDL rows are judged.
    """
    need(sweep, ["landmarks", "n_y", "rel. error of D_hat"], "sweep")
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
    need(quality, ["estimate", "n_y", "D-hat rel. error"], "quality")
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
    need(identity, ["weights", "client sizes", "rel. error vs pooled gradient"], "identity")
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
    need(runs, ["dataset", "gamma"], "runs")
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
    need(diag, ["kernel rel. error"], "diag")
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
