"""The numerical checks of the Fed-tSNE derivation chapter (Eqs. 10, 13, 16, 19-22, Theorems 1, 2, 4, 6 and
the reconstruction attack), each as one function returning its table or numbers. Randomness comes from
the generator ``rng`` the caller passes, consumed in a fixed order (the chapter's one stream)."""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from fedlib.core import privacy
from fedlib.core.linalg import relative_error
from fedlib.evaluation import embedding as em
from fedlib.fedtsne.algorithm import client_sq_distances, mmd2_u, mmd2_u_grad, nystrom_distances
from fedlib.fedtsne.dp import data_sensitivity, dp_noise_sd, paper_noise_sd
from fedlib.fedtsne.feddl import feddl
from fedlib.fedtsne.mmd import as_matrix, expected_gaussian_kernel, gaussian_kernel, sq_distances
from fedlib.fedtsne.nystrom import nystrom


def mmd_unbiasedness(rng: np.random.Generator, reps: int, dim: int = 3, gamma: float = 0.5, shift: float = 0.7,
                     n_x: int = 30, n_y: int = 20) -> dict:
    """Monte Carlo check of Eq. 10 for N(0, I_dim) against N(shift e_1, I_dim): the exact MMD^2 (closed
    form, :func:`expected_gaussian_kernel`), the mean and standard error of the U-statistic
    :func:`mmd2_u` and the mean of the V-statistic (diagonal kept, biased) over ``reps`` draws of
    (n_x, dim) and (n_y, dim) samples. Returns dict exact, u_mean, u_se, v_mean."""
    mu = np.zeros(dim)
    mu[0] = shift
    ek = expected_gaussian_kernel
    exact = ek(2.0, 0.0, gamma, dim) - 2 * ek(2.0, shift ** 2, gamma, dim) + ek(2.0, 0.0, gamma, dim)
    u_vals, v_vals = [], []
    for _ in range(reps):
        xa, ya = rng.standard_normal((n_x, dim)), rng.standard_normal((n_y, dim)) + mu
        u_vals.append(mmd2_u(xa, ya, gamma))
        kxx, kyy, kxy = gaussian_kernel(xa, xa, gamma), gaussian_kernel(ya, ya, gamma), gaussian_kernel(xa, ya, gamma)
        v_vals.append(kxx.mean() + kyy.mean() - 2 * kxy.mean())
    return {"exact": exact, "u_mean": float(np.mean(u_vals)), "u_se": float(np.std(u_vals) / np.sqrt(reps)),
            "v_mean": float(np.mean(v_vals))}


def gradient_fd_error(X, Y, gamma: float, h: float = 1e-6) -> float:
    """Relative max-abs error of Eq. 13 (:func:`mmd2_u_grad`, (n_y, m)) against central finite
    differences of :func:`mmd2_u` with step ``h``."""
    Y = np.asarray(Y, dtype=np.float64)
    fd = np.zeros_like(Y)
    for idx in np.ndindex(*Y.shape):
        e = np.zeros_like(Y)
        e[idx] = h
        fd[idx] = (mmd2_u(X, Y + e, gamma) - mmd2_u(X, Y - e, gamma)) / (2 * h)
    return float(np.abs(mmd2_u_grad(X, Y, gamma) - fd).max() / np.abs(fd).max())


def gradient_identity_table(X, parts: Mapping[str, Sequence], Y, gamma: float) -> pd.DataFrame:
    """The federated = pooled identity (the derivation chapter's section 2): for every split
    (name -> index arrays) and the weights n_p/n and 1/P, the max relative error of sum_p w_p grad f_p(Y)
    against the pooled gradient grad MMD_u(X, Y). One row per (split, weights)."""
    pooled = mmd2_u_grad(X, Y, gamma)
    rows = []
    for name, pp in parts.items():
        sizes = np.array([len(p) for p in pp])
        grads = [mmd2_u_grad(X[p], Y, gamma) for p in pp]
        for wname, w in [("n_p/n", sizes / sizes.sum()), ("1/P", np.full(len(pp), 1 / len(pp)))]:
            agg = sum(wi * gi for wi, gi in zip(w, grads))
            rows.append({"split": name, "weights": wname, "client sizes": f"{sizes.min()}-{sizes.max()}",
                         "rel. error vs pooled gradient": np.abs(agg - pooled).max() / np.abs(pooled).max()})
    return pd.DataFrame(rows)


def split_runs(X, parts: Mapping[str, Sequence], n_landmarks: int, rounds: int, *, init, gamma: float,
               seed: int = 0) -> tuple[dict, dict]:
    """FedDL (gradient mode, n_p/n weights, one ``init`` and ``gamma``) on one pooled client and on each
    split of ``parts``. Returns (runs: name -> FedDLResult, "one client (pooled)" first; gaps: split name
    -> max relative difference of its landmarks to the pooled run's)."""
    runs = {name: feddl([X[p] for p in pp], n_landmarks, rounds=rounds, init=init, gamma=gamma, seed=seed)
            for name, pp in {"one client (pooled)": [np.arange(len(X))], **parts}.items()}
    ref = runs["one client (pooled)"].landmarks
    gaps = {name: float(np.abs(runs[name].landmarks - ref).max() / np.abs(ref).max()) for name in parts}
    return runs, gaps


def objective_curves(X, parts: Mapping[str, Sequence], n_landmarks: int, rounds: int, *, init, gamma: float,
                     seed: int = 0, settings=(("gradient", 1), ("average", 5))) -> pd.DataFrame:
    """FedDL's objective F (Eq. 11) against the local gradient steps, for each split and each (mode, Q)
    of ``settings`` (rounds // Q rounds each). Long frame: gradient steps, objective, split, mode."""
    curves = []
    for name, pp in parts.items():
        for mode, q in settings:
            res = feddl([X[p] for p in pp], n_landmarks, rounds=rounds // q, mode=mode, local_steps=q, init=init,
                        gamma=gamma, seed=seed)
            curves.append(pd.DataFrame({"gradient steps": np.arange(len(res.objective)) * q,
                                        "objective F (MMD^2)": res.objective, "split": name,
                                        "mode": f"{mode}, Q={q}"}))
    return pd.concat(curves)


def theorem1_denominator(q: int, rho_l: float = 1, max_ratio: float = 1) -> float:
    """Theorem 1's denominator 1 - 3 (Q-1)^2 (rho_L + max_p L_p^2/L^2); both terms are >= 1."""
    return 1 - 3 * (q - 1) ** 2 * (rho_l + max_ratio)


def theorem1_first_term(result) -> dict:
    """Theorem 1's bound without its drift term, on one FedDL run (:class:`FedDLResult`): the average
    squared step (1/S) sum_s ||Y^s - Y^{s-1}||_F^2 against 4 (F(Y^0) - F(Y^S)) / (S Q L), with L = 1/lr the
    Lipschitz constant the run's step assumes (lr = 1/L of :func:`lipschitz_bound` by default). At Q = 1
    the drift term vanishes and this is the whole bound; it fails when the step overshoots the curvature
    (F then falls by less than the steps' length predicts). Returns {"S", "Q", "L", "average squared step",
    "bound", "ratio"}."""
    steps = np.asarray(result.step_sq_norms, dtype=np.float64)
    F = np.asarray(result.objective, dtype=np.float64)
    S, Q, L = len(steps), int(result.local_steps), 1.0 / float(result.lr)
    if S < 1:
        raise ValueError("theorem1_first_term needs a run of at least one round")
    lhs = float(steps.mean())
    rhs = 4.0 * float(F[0] - F[-1]) / (S * Q * L)
    return {"S": S, "Q": Q, "L": L, "average squared step": lhs, "bound": rhs,
            "ratio": lhs / rhs if rhs > 0 else math.inf}


def nystrom_exactness_table(Z, rng: np.random.Generator, grid: Sequence[int]) -> pd.DataFrame:
    """Eq. 19 on squared vs plain distances: for each n_y of ``grid``, n_y standard-normal landmarks and the
    relative Frobenius error of B W^+ B^T against the exact matrix of the points Z (n, m)."""
    Z = np.asarray(Z, dtype=np.float64)
    true_d2 = sq_distances(Z)
    rows = []
    for ny in grid:
        yl = rng.standard_normal((ny, Z.shape[1]))
        est_sq = nystrom(sq_distances(Z, yl), sq_distances(yl))
        est_plain = nystrom(np.sqrt(sq_distances(Z, yl)), np.sqrt(sq_distances(yl)))
        rows.append({"landmarks n_y": ny, "m + 2": Z.shape[1] + 2,
                     "rel. error, squared distances": relative_error(est_sq, true_d2),
                     "rel. error, plain distances": relative_error(est_plain, np.sqrt(true_d2))})
    return pd.DataFrame(rows)


def landmark_quality_sweep(X, parts: Mapping[str, Sequence], grid: Sequence[int], rounds: int, *, gamma: float,
                           rng: np.random.Generator, seed: int = 0, k: int = 11) -> pd.DataFrame:
    """For each n_y of ``grid``: the Nystrom distance estimate (:func:`nystrom_estimate`) from a uniform
    sample of X (oracle), the untrained Y^0 (pooled moments + Gaussian noise) and FedDL's landmarks on
    each split; relative error of D_hat and the overlap of the k-NN lists (``k`` includes the point
    itself, so 11 = 10 neighbours). Rows: n_y, landmarks, rel. error of D_hat, 10-NN overlap."""
    n, m = X.shape
    true_d = np.sqrt(sq_distances(X))
    nn_true = em.neighbour_lists(true_d, k, "precomputed")
    rows = []
    for ny in grid:
        y_init = X.mean(0) + rng.standard_normal((ny, m)) * X.std(0)
        choices = {"uniform sample (oracle)": X[rng.choice(n, ny, replace=False)], "untrained Y^0": y_init}
        for name, pp in parts.items():
            choices[f"FedDL, {name}"] = feddl([X[p] for p in pp], ny, rounds=rounds, init=y_init, gamma=gamma,
                                              seed=seed).landmarks
        for name, yl in choices.items():
            err, ov = em.distance_estimate_quality(nystrom_estimate(X, yl), true_d, k, nn_true)
            rows.append({"n_y": ny, "landmarks": name, "rel. error of D_hat": err, f"{k - 1}-NN overlap": ov})
    return pd.DataFrame(rows)


def theorem2_table(rng: np.random.Generator, n: int = 1000, dim: int = 10,
                   columns: Sequence[int] = (20, 50, 100, 200)) -> pd.DataFrame:
    """Theorem 2's Frobenius bound ||H - H_k||_F + rho (64 k / c)^{1/4} (rho = 1, k = c) against the
    Nystrom error from c uniformly sampled columns of the Gaussian kernel H (gamma = 1 / median D^2)
    of n standard-normal points in R^dim."""
    d2 = sq_distances(rng.standard_normal((n, dim)))
    H = np.exp(-d2 / np.median(d2))
    eig = np.sort(np.linalg.eigvalsh(H))[::-1]
    rows = []
    for c in columns:
        cols = rng.choice(n, c, replace=False)
        h_hat = nystrom(H[:, cols], H[np.ix_(cols, cols)])
        rows.append({"c = k": c, "||H - H_hat||_F": np.linalg.norm(H - h_hat),
                     "stated bound": np.sqrt(np.sum(eig[c:] ** 2)) + 1.0 * (64 * c / c) ** 0.25})
    return pd.DataFrame(rows)


def kernel_nystrom_error(X, landmarks, gamma: float, K=None) -> float:
    """||K_hat - K||_2 of the Gaussian-kernel Nystrom estimate (Theorems 3, 5) for X (n, m)."""
    K = gaussian_kernel(X, X, gamma) if K is None else K
    k_hat = nystrom(gaussian_kernel(X, landmarks, gamma), gaussian_kernel(landmarks, landmarks, gamma))
    return float(np.linalg.norm(k_hat - K, 2))


def theorem6_inputs(X, Y) -> tuple[float, float, float]:
    """(tau_X, tau_Y, Upsilon) of Theorem 6 measured on data X (n, m) and landmarks Y (n_y, m): largest
    row norm, spectral norm of Y, largest landmark-to-point distance."""
    return (float(np.linalg.norm(X, axis=1).max()), float(np.linalg.norm(Y, 2)),
            float(np.sqrt(sq_distances(Y, X).max())))


def sensitivity_audit(client, pool, Y, gamma: float, rng: np.random.Generator, reps: int,
                      bounds: Mapping[str, float]) -> pd.DataFrame:
    """The largest change ||grad f_p(X_p) - grad f_p(X_p')|| (Eq. 13) over ``reps`` random replacements of
    one row of ``client`` (n_p, m) by a row of ``pool``, and over adversarial pairs y_j +- r* d at
    r* = 1/sqrt(2 gamma) (``min(reps, n_y)`` landmarks j); one column "/ NAME" per bound of ``bounds``."""
    client = np.asarray(client, dtype=np.float64)
    n0, m = client.shape
    g_ref = mmd2_u_grad(client, Y, gamma)
    random_changes = []
    for _ in range(reps):
        neighbour = client.copy()
        neighbour[rng.integers(n0)] = pool[rng.integers(len(pool))]
        random_changes.append(np.linalg.norm(g_ref - mmd2_u_grad(neighbour, Y, gamma)))
    adversarial = []
    r_star = 1.0 / np.sqrt(2 * gamma)
    for j in rng.choice(len(Y), min(reps, len(Y)), replace=False):
        d = rng.standard_normal(m)
        d /= np.linalg.norm(d)
        a, b = client.copy(), client.copy()
        a[0], b[0] = Y[j] + r_star * d, Y[j] - r_star * d
        adversarial.append(np.linalg.norm(mmd2_u_grad(a, Y, gamma) - mmd2_u_grad(b, Y, gamma)))
    audit = pd.DataFrame([
        {"replacement": "random data point", "largest change": max(random_changes)},
        {"replacement": "adversarial pair at r = 1/sqrt(2 gamma)", "largest change": max(adversarial)}])
    for name, value in bounds.items():
        audit[f"/ {name}"] = audit["largest change"] / value
    return audit


def calibration_table(epsilons: Sequence[float], delta: float, tau_x: float, delta_thm6: float,
                      delta_kern: float, rounds: int) -> pd.DataFrame:
    """Noise sd per epsilon: Theorem 4's Dwork-Roth sd and the epsilon it truly buys (analytic Gaussian),
    the analytic Gaussian sd for Delta_2 = 2 tau_X, Theorem 6's sd with the paper's composition and
    the PLD-calibrated sd for ``rounds`` compositions with Theorem 6's and the kernel sensitivity."""
    rows = []
    sens = data_sensitivity(tau_x)
    for eps in epsilons:
        s_paper4 = paper_noise_sd(eps, delta, sens, "dp_data")
        rows.append({
            "epsilon": eps,
            "Thm 4 sd (Dwork-Roth)": s_paper4,
            "its true epsilon": privacy.analytic_gaussian_epsilon(s_paper4, delta, sens),
            "analytic Gaussian sd": privacy.analytic_gaussian_sigma(eps, delta, sens),
            "Thm 6 sd (paper's composition)": paper_noise_sd(eps, delta, delta_thm6, "dp_gradient",
                                                             compositions=rounds),
            "PLD sd, Thm 6 Delta": dp_noise_sd(eps, delta, delta_thm6, "dp_gradient", compositions=rounds),
            "PLD sd, kernel Delta": dp_noise_sd(eps, delta, delta_kern, "dp_gradient", compositions=rounds),
        })
    return pd.DataFrame(rows)


def theorem4_threshold(delta: float, low: float = 0.01, high: float = 64.0, points: int = 61,
                       rtol: float = 1e-4) -> dict:
    """Where Theorem 4's calibration (Dwork-Roth sd = sqrt(2 ln(1.25/delta)) Delta / epsilon) stops buying
    the epsilon it is asked for: the ratio (exact epsilon of that sd, analytic Gaussian) / epsilon on a
    log grid of ``points`` values from ``low`` to ``high`` (it does not depend on Delta), and the
    crossing of 1 by bisection between the last grid point where the ratio is <= 1 and the next. Returns
    {"grid": (low, high, points), "valid up to": the crossing (inf: valid on the whole grid; NaN: invalid
    at ``low``), "one crossing": the ratio is <= 1 below the crossing and > 1 above it on the whole grid,
    "ratio": {epsilon: ratio}}."""
    if not 0 < low < high:
        raise ValueError(f"need 0 < low < high, got {low!r}, {high!r}")

    def ratio(eps: float) -> float:
        return privacy.analytic_gaussian_epsilon(paper_noise_sd(eps, delta, 1.0, "dp_data"), delta, 1.0) / eps

    grid = np.geomspace(low, high, points)
    r = np.array([ratio(e) for e in grid])
    ok = r <= 1.0
    out = {"grid": (low, high, points), "ratio": dict(zip(grid.tolist(), r.tolist()))}
    if ok.all():
        return {**out, "valid up to": math.inf, "one crossing": True}
    if not ok[0]:
        return {**out, "valid up to": math.nan, "one crossing": bool(not ok.any())}
    k = int(np.argmin(ok))            # the first grid point where the calibration fails
    a, b = float(grid[k - 1]), float(grid[k])
    while b - a > rtol * a:
        mid = math.sqrt(a * b)
        a, b = (mid, b) if ratio(mid) <= 1.0 else (a, mid)
    return {**out, "valid up to": a, "one crossing": bool(ok[:k].all() and not ok[k:].any())}


def reconstruction_table(client, X, rng: np.random.Generator, grid: Sequence[int] = (10, 40, 65, 100),
                         noise_sd: float = 0.5) -> pd.DataFrame:
    """The multilateration attack (:func:`reconstruct_from_sq_distances`) on ``client`` (n_p, m) for
    untrained landmarks (moments of X + Gaussian noise), one row per n_y of ``grid`` and upload source:
    clean data, and data perturbed with N(0, noise_sd^2)."""
    client = np.asarray(client, dtype=np.float64)
    rows = []
    for ny in grid:
        yl = X.mean(0) + rng.standard_normal((ny, X.shape[1])) * X.std(0)
        x_hat = reconstruct_from_sq_distances(sq_distances(client, yl), yl)
        rows.append({"n_y": ny, "upload from": "clean data (Fed-tSNE, Fed-tSNE+ gradient noise)",
                     "rel. reconstruction error": relative_error(x_hat, client)})
        noisy = client + rng.standard_normal(client.shape) * noise_sd
        x_hat_n = reconstruct_from_sq_distances(sq_distances(noisy, yl), yl)
        rows.append({"n_y": ny, "upload from": f"perturbed data, sd {noise_sd:g} (Fed-tSNE+ data noise)",
                     "rel. reconstruction error": relative_error(x_hat_n, client)})
    return pd.DataFrame(rows)


def upload_leak(X, parts, landmarks) -> tuple[float, float]:
    """What Algorithm 2's distance upload gives the server: (max |D_hat - D| / max D of its Nystrom estimate
    (Eqs. 21-22), relative error of its reconstruction of every client point), for the clients
    ``[X[p] for p in parts]`` and the landmarks (n_y, m)."""
    B = np.vstack([client_sq_distances(X[p], landmarks)["sq_distances"] for p in parts])
    order = np.concatenate(parts)
    D_hat = nystrom_distances(B, sq_distances(landmarks))
    D_true = np.sqrt(sq_distances(X[order]))
    rebuilt = reconstruct_from_sq_distances(B, landmarks)
    return (float(np.abs(D_hat - D_true).max() / D_true.max()),
            float(np.linalg.norm(rebuilt - X[order]) / np.linalg.norm(X)))


# ------------------------------------------------------------------------------------------------
# Fed-SpeClust chapter: when is C W^+ C^T exact (Algorithm 3, Eq. 19 on kernels)
# ------------------------------------------------------------------------------------------------
def exact_rank_kernels(m: int, gamma: float) -> dict:
    """Three symmetric functions on R^m as name -> (k(A, B=None), rank of their matrix or None): squared
    distances (rank <= m + 2), the polynomial kernel (1 + x.y)^2 (rank <= (m+1)(m+2)/2) and the Gaussian
    kernel of width ``gamma`` (full rank)."""
    rank_sq, rank_poly = m + 2, (m + 1) * (m + 2) // 2
    return {
        f"squared distances (rank <= m+2 = {rank_sq})": (lambda A, B=None: sq_distances(A, B), rank_sq),
        f"polynomial (1+x.y)^2 (rank <= {rank_poly})": (lambda A, B=None: (1.0 + A @ (A if B is None else B).T) ** 2,
                                                        rank_poly),
        "Gaussian exp(-gamma |x-y|^2) (full rank)": (lambda A, B=None: gaussian_kernel(A, B, gamma), None),
    }


def nystrom_rank_table(kernels: dict, X, landmark_pool) -> pd.DataFrame:
    """For each kernel of :func:`exact_rank_kernels` and nested landmark sets ``landmark_pool[:n_y]``,
    n_y = 2..len(pool): relative error ||Z - C W^+ C^T||_F / ||Z||_F (Z = k(X, X)), rank W and rank H
    (H = the matrix on [Y; X])."""
    rows = []
    for kname, (k, r) in kernels.items():
        Z = k(X)
        for ny in range(2, len(landmark_pool) + 1):
            Yl = landmark_pool[:ny]
            C, W = k(X, Yl), k(Yl)
            H = np.block([[W, C.T], [C, Z]])
            rows.append({"kernel": kname, "n_y": ny, "rel. error": relative_error(nystrom(C, W), Z),
                         "rank W": np.linalg.matrix_rank(W), "rank H": np.linalg.matrix_rank(H), "exact rank": r})
    return pd.DataFrame(rows)


def kernel_spectra(kernels: dict, points) -> dict:
    """|eigenvalues| of each kernel's matrix on ``points`` (n, m), sorted descending, over the largest."""
    out = {}
    for kname, (k, _) in kernels.items():
        lam = np.sort(np.abs(np.linalg.eigvalsh(k(points))))[::-1]
        out[kname] = lam / lam[0]
    return out


def rank_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per kernel of :func:`nystrom_rank_table`: largest error where rank H = rank W, smallest where
    rank H > rank W, first n_y with error < 1e-9."""
    return table.groupby("kernel", sort=False).apply(
        lambda g: pd.Series({"largest error with rank H = rank W": g.loc[g["rank H"] == g["rank W"], "rel. error"].max(),
                             "smallest error with rank H > rank W": g.loc[g["rank H"] > g["rank W"], "rel. error"].min(),
                             "first exact n_y": g.loc[g["rel. error"] < 1e-9, "n_y"].min()}), include_groups=False)


def rank_study_holds(table: pd.DataFrame, spectra: dict, kernels: dict, top: int = 60) -> dict:
    """Per kernel, whether the derivation holds: low-rank kernels exact (< 1e-9) exactly from n_y = rank on
    (> 1e-4 before), rank W = rank H = rank, a spectral cliff (> 1e8) after eigenvalue ``rank``; the
    Gaussian never exact (> 1e-6), rank H > rank W, no cliff (< 1e3) among the first ``top``; and for
    every kernel an error that does not grow with nested landmarks."""
    out = {}
    for kname, (_, r) in kernels.items():
        g = table[table["kernel"] == kname]
        s = spectra[kname]
        if r is not None:
            ok = ((g.loc[g["n_y"] >= r, "rel. error"] < 1e-9).all() and (g.loc[g["n_y"] < r, "rel. error"] > 1e-4).all()
                  and (g.loc[g["n_y"] >= r, "rank W"] == r).all() and (g["rank H"] == r).all()
                  and s[r - 1] / max(s[r], 1e-300) > 1e8)
        else:
            ok = ((g["rel. error"] > 1e-6).all() and (g["rank H"] > g["rank W"]).all()
                  and (s[:top - 1] / s[1:top]).max() < 1e3)
        out[kname] = bool(ok and (np.diff(g["rel. error"].to_numpy()) <= 1e-12).all())
    return out


def affine_projection(X, landmarks, tol: float = 1e-10) -> tuple[np.ndarray, int]:
    """Orthogonal projection of the rows of X (n, m) onto the affine span of the landmarks (n_y, m)
    (singular values below ``tol`` times the largest dropped), and the dimension of that span."""
    ybar = landmarks.mean(0)
    _, sv, Vt = np.linalg.svd(landmarks - ybar, full_matrices=False)
    basis = Vt[sv > tol * sv[0]]
    return ybar + (X - ybar) @ basis.T @ basis, len(basis)


def reconstruct_from_sq_distances(sq_dists, landmarks, return_residual: bool = False):
    """Multilateration: recover samples from their squared distances (n, n_y) to known landmarks (n_y, m).

    With c_j = y_j - y_bar and u = x - y_bar, ||x - y_j||^2 = ||u||^2 - 2 u^T c_j + ||c_j||^2; subtracting
    the mean over j removes ||u||^2 and leaves the linear system

        C u = (||c_j||^2 - mean_j ||c_j||^2 - (d_j - mean_j d_j)) / 2,     C = [c_1; ...; c_{n_y}] (n_y, m).

    Its least-squares minimum-norm solution is the component of u in span{y_j - y_bar}, so
    x_hat = y_bar + P(x - y_bar): exact when n_y >= m + 1 landmarks are in general position, the
    orthogonal projection of x onto the landmarks' affine span otherwise. ``return_residual`` also
    gives the distance of each x from that span, sqrt(max(d_j - ||x_hat - y_j||^2, 0)) averaged over j,
    which the uploads reveal as well. Returns x_hat (n, m) [, residual (n,)]."""
    Y = as_matrix("landmarks", landmarks)
    D = np.asarray(sq_dists, dtype=np.float64)
    if D.ndim != 2 or D.shape[1] != len(Y):
        raise ValueError(f"sq_dists must have shape (n, n_landmarks={len(Y)}), got {D.shape}")
    if len(Y) < 2:
        raise ValueError(f"n_landmarks must be >= 2, got {len(Y)}")
    ybar = Y.mean(0)
    C = Y - ybar
    c2 = np.einsum("ij,ij->i", C, C)
    rhs = 0.5 * ((c2 - c2.mean())[None, :] - (D - D.mean(1, keepdims=True)))       # (n, n_y)
    U = np.linalg.lstsq(C, rhs.T, rcond=None)[0].T                                   # (n, m)
    Xhat = ybar + U
    if not return_residual:
        return Xhat
    resid = np.sqrt(np.maximum(D - sq_distances(Xhat, Y), 0.0).mean(1))
    return Xhat, resid


def nystrom_estimate(X, landmarks, squared: bool = True) -> np.ndarray:
    """The server's distance estimate (n, n) from landmarks Y (n_y, m), in the row order of X (n, m):
    ``squared=True`` is Eqs. 21-22 on squared distances (:func:`nystrom_distances`, the method);
    ``squared=False`` is Eq. 22 read literally on plain distances, symmetrized, clipped at 0, zero
    diagonal (an ablation: never exact)."""
    if squared:
        return nystrom_distances(sq_distances(X, landmarks), sq_distances(landmarks))
    H = np.maximum(nystrom(np.sqrt(sq_distances(X, landmarks)), np.sqrt(sq_distances(landmarks))), 0.0)
    np.fill_diagonal(H, 0.0)
    return H
