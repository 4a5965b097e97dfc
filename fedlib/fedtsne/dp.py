"""The "+" variants' differential privacy (Sec. 5): row clipping, Theorem 4's
data sensitivity, Theorem 6's gradient sensitivity and the data-free kernel bound, the noise sd
calibrated by :mod:`fedlib.core.privacy` (dp-accounting), the paper's own calibrations for comparison,
and the ledger of what a run spent."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from fedlib.core import privacy
from fedlib.core.validate import check_choice, check_int, check_positive
from fedlib.fedtsne.mmd import as_matrix

if TYPE_CHECKING:
    from fedlib.fedtsne.feddl import FedDLResult


DP_MECHANISMS = ("dp_data", "dp_gradient")


def check_epsilon_delta(epsilon, delta) -> tuple[float, float]:
    """epsilon > 0 and delta in (0, 1) (:mod:`fedlib.core.privacy`'s checks); both are required."""
    if epsilon is None or delta is None:
        raise ValueError("a differential-privacy noise needs epsilon (> 0) and delta (in (0, 1)); got "
                         f"epsilon={epsilon!r}, delta={delta!r}")
    return privacy.check_epsilon(epsilon), privacy.check_delta(delta)


def clip_rows(X, tau_x: float) -> np.ndarray:
    """Scale every row of X (n, m) with ||x|| > tau_x down to norm tau_x (a public bound): after it,
    replacing one row moves the data by at most 2 tau_x in l2 (Theorem 4's Delta)."""
    X = as_matrix("X", X)
    tau_x = check_positive("tau_x", tau_x)
    norms = np.sqrt(np.einsum("ij,ij->i", X, X))
    return X * np.minimum(1.0, tau_x / np.maximum(norms, 1e-300))[:, None]


def project_spectral(Y, tau_y: float) -> np.ndarray:
    """Euclidean (Frobenius) projection of Y (n_y, m) onto {||Y||_2 <= tau_y}: clip the singular
    values at tau_y. Post-processing of public landmarks; enforces Theorem 6's tau_Y."""
    U, s, Vt = np.linalg.svd(np.asarray(Y, dtype=np.float64), full_matrices=False)
    return (U * np.minimum(s, tau_y)) @ Vt


def data_sensitivity(tau_x: float) -> float:
    """l2-sensitivity of the identity map under replace-one adjacency, Delta_2 = 2 tau_X, valid once
    every row is clipped to ||x|| <= tau_X (:func:`clip_rows`; Theorem 4, App. C Eqs. 27-28)."""
    return 2.0 * check_positive("tau_x", tau_x)


def kernel_gradient_sensitivity(n_p: int, n_landmarks: int, gamma: float) -> float:
    """Data-free l2-sensitivity of grad f_p (Eq. 13) to replacing one of client p's n_p samples:

        Delta_K = 8 sqrt(gamma) / (sqrt(2 e) n_p sqrt(n_y)) = 4 sqrt(2 gamma / e) / (n_p sqrt(n_y)).

    Only the cross term depends on the data; its row j changes by (4 gamma/(n_p n_y)) [k(x, y_j)(x - y_j)
    - k(x', y_j)(x' - y_j)], and ||k(x, y)(x - y)|| = r exp(-gamma r^2) <= 1/sqrt(2 e gamma) for every
    r = ||x - y|| (maximum at r = 1/sqrt(2 gamma)). So each row moves by <= 8 gamma/(n_p n_y sqrt(2 e gamma))
    and the (n_y, m) matrix by sqrt(n_y) times that, for ANY data and landmarks: no clipping, no bound
    on Y (derivation chapter, Sec. 4). gamma and n_p must be public."""
    n_p = check_int("n_p", n_p, 1)
    ny = check_int("n_landmarks", n_landmarks, 2)
    gamma = check_positive("gamma", gamma)
    return 8.0 * math.sqrt(gamma) / (math.sqrt(2.0 * math.e) * n_p * math.sqrt(ny))


def gradient_sensitivity(n_p: int, n_landmarks: int, gamma: float, tau_x: float, tau_y: float,
                         upsilon: float) -> float:
    """Theorem 6's l2-sensitivity of grad f_p (Eq. 13) to replacing one sample of client p:

        Delta = 8 sqrt(n_y) gamma tau_X / (n_p n_y) * {1 + 2 gamma (tau_X + tau_Y)(tau_X + Upsilon)}

    tau_X >= max ||x||, tau_Y >= ||Y_p||_2 (spectral norm) at every iterate, Upsilon >= max ||y_i - x_j||.
    A guarantee needs these enforced a priori (``dp_sensitivity="theorem6"`` in :func:`feddl` clips the
    rows to tau_X and projects Y into ||Y||_2 <= tau_Y, so Upsilon = tau_X + tau_Y)."""
    n_p = check_int("n_p", n_p, 1)
    ny = check_int("n_landmarks", n_landmarks, 2)
    gamma = check_positive("gamma", gamma)
    tau_x = check_positive("tau_x", tau_x)
    tau_y = check_positive("tau_y", tau_y, strict=False)
    upsilon = check_positive("upsilon", upsilon, strict=False)
    return 8.0 * math.sqrt(ny) * gamma * tau_x / (n_p * ny) * (1.0 + 2.0 * gamma * (tau_x + tau_y) * (tau_x + upsilon))


def dp_noise_sd(epsilon: float, delta: float, sensitivity: float, mechanism: str = "dp_data",
                compositions: int = 1, accountant: str = "pld") -> float:
    """Gaussian-mechanism noise sd for (epsilon, delta)-DP, calibrated by :mod:`fedlib.core.privacy`
    (dp-accounting), never by a hand-written composition formula.

    * ``"dp_data"`` (Theorem 4): one release, the analytic Gaussian mechanism (Balle & Wang 2018),
      valid for every epsilon (the paper's Dwork & Roth formula holds for epsilon < 1 only).
    * ``"dp_gradient"`` (Theorem 6's setting): ``compositions`` = T Gaussian releases composed by the
      ``accountant`` ("pld" or "rdp"): sd = z(epsilon, delta, T) x ``sensitivity``.
    """
    epsilon, delta = check_epsilon_delta(epsilon, delta)
    sensitivity = check_positive("sensitivity", sensitivity)
    check_choice("mechanism", mechanism, DP_MECHANISMS)
    compositions = check_int("compositions", compositions, 1)
    if mechanism == "dp_data":
        if compositions != 1:
            raise ValueError("compositions applies to mechanism='dp_gradient' only (data are perturbed once)")
        return privacy.analytic_gaussian_sigma(epsilon, delta, sensitivity)
    return privacy.calibrate_noise_multiplier(epsilon, delta, compositions, accountant) * sensitivity


def paper_noise_sd(epsilon: float, delta: float, sensitivity: float, mechanism: str = "dp_data",
                   compositions: int = 1) -> float:
    """The paper's calibrations, for comparison only: Theorem 4 (Dwork & Roth Thm 3.22,
    sd = sqrt(2 ln(1.25/delta)) Delta / epsilon, proven for epsilon < 1) and Theorem 6 (Kairouz et al.
    2015 composition as the paper states it, sd = Delta sqrt(8 T log(e + epsilon/delta)) / epsilon)."""
    epsilon, delta = check_epsilon_delta(epsilon, delta)
    sensitivity = check_positive("sensitivity", sensitivity)
    check_choice("mechanism", mechanism, DP_MECHANISMS)
    compositions = check_int("compositions", compositions, 1)
    if mechanism == "dp_data":
        return math.sqrt(2.0 * math.log(1.25 / delta)) * sensitivity / epsilon
    return sensitivity * math.sqrt(8.0 * compositions * math.log(math.e + epsilon / delta)) / epsilon


DP_SENSITIVITIES = ("kernel", "theorem6")


def privacy_ledger(noise, z_mult, data_sd, sens, delta, T, tau_x, dp_sensitivity, dp_accountant):
    """(epsilon spent at delta by each client's releases, one ledger line per kind of release)."""
    if noise == "dp_data":
        spent = privacy.analytic_gaussian_epsilon(data_sd, delta, sens[0])
        return spent, [f"data: rows clipped to tau_x={tau_x:g}, one Gaussian release, sd={data_sd:.4g} "
                       f"(analytic Gaussian mechanism, Delta=2 tau_x): epsilon={spent:.4g} at delta={delta:g}",
                       "set-up (n_p, median/moments), gradients, distance uploads: post-processing of the "
                       "perturbed data (no further cost)"]
    if noise == "dp_gradient":
        spent = privacy.gaussian_epsilon(z_mult, delta, T, dp_accountant)
        return spent, ["set-up: n_p only (public under replace-one adjacency); gamma, init: public",
                       f"gradients: {T} Gaussian releases per client, noise multiplier z={z_mult:.4g} "
                       f"({dp_sensitivity} sensitivity), {dp_accountant.upper()} accountant: epsilon={spent:.4g} "
                       f"at delta={delta:g}",
                       "distance upload (Alg. 2/3): NOT covered, computed from the clean data"]
    if noise == "heuristic":
        return math.inf, ["heuristic noise (sd = beta x sd of the gradient): data-dependent, no guarantee"]
    return math.inf, ["no noise: no guarantee"]


def end_to_end_epsilon(feddl_result: FedDLResult | None) -> float:
    """epsilon of the WHOLE protocol (FedDL + the distance / kernel upload of Alg. 2/3) at
    ``feddl_result.delta``: FedDL's epsilon under "dp_data" (the upload is post-processing of the
    perturbed data), inf otherwise (the upload is computed from the clean data, and with n_y >= m + 2
    landmarks in general position it determines every sample: :func:`reconstruct_from_sq_distances`)."""
    if feddl_result is None or feddl_result.noise != "dp_data":
        return math.inf
    return feddl_result.epsilon
