"""Fed-tSNE, Fed-UMAP and Fed-SpeClust: federated distribution learning (FedDL) of landmarks, then a
Nystrom estimate of the global distance / kernel matrix (Qiao, Ma, Fan, AAAI 2025; seed 002;
notes: papers/fedtsne.md). Samples are ROWS here (the paper stores columns; notes Sec. 2.9).

Client p holds X_p (n_p, m), sum_p n_p = n. The server keeps n_y landmarks Y (n_y, m).

FedDL (Algorithm 1). Gaussian kernel k(x, y) = exp(-gamma ||x - y||^2). Local objective = the
unbiased (U-statistic) MMD^2 estimate (Eq. 10):

    f_p(Y) = (1^T K_XX 1 - n_p) / (n_p (n_p-1)) - 2 1^T K_XY 1 / (n_p n_y) + (1^T K_YY 1 - n_y) / (n_y (n_y-1))

and its gradient (Eq. 13, row-major):

    grad f_p(Y) = -4 gamma/(n_p n_y) [K_XY^T X_p - diag(1^T K_XY) Y] + 4 gamma/(n_y (n_y-1)) [K_YY Y - diag(1^T K_YY) Y]

Global objective F(Y) = sum_p w_p f_p(Y) (Eq. 8/11). ``mode="average"``: Q local steps
Y_p <- Y_p - eta grad f_p(Y_p) (Eq. 14), server Y = sum_p w_p Y_p (Eq. 15; the paper's w_p = 1/P).
``mode="gradient"``: Y <- Y - eta' sum_p w_p grad f_p(Y) (Eq. 16). With w_p = n_p/n (our default,
notes Sec. 8.2), sum_p w_p grad f_p = grad MMD_u(X_pooled, Y) exactly, whatever the split (notes
Sec. 2.2): gradient mode is then centralized gradient descent.

Step size (the paper: "the reverse of the Lipschitz constant of the gradient if possible"). Bounding
the Hessian of g(u) = exp(-gamma ||u||^2) (eigenvalues in [-2 gamma, 4 gamma e^{-3/2}]) gives, for
any data and any Y (DERIVED here; sum_p w_p = 1),

    L <= (4 gamma / n_y) (n_y/(n_y-1) + 2 e^{-3/2}),       ``lr="auto"`` uses eta = 1/L.

Fed-tSNE / Fed-UMAP (Algorithm 2). Client p uploads D_p = squared distances to Y (n_p, n_y); the
server stacks B = [D_1; ...; D_P] (Eq. 21), W = D_YY (squared), and forms the Nystrom estimate
(Eqs. 19, 22)

    D2_hat = B W_k^+ B^T     (or B (W + lambda I)^{-1} B^T),

symmetrizes, clips at 0, zeroes the diagonal and takes the square root before t-SNE / UMAP. The
paper does not say whether D is squared; squared Euclidean distances have rank <= m + 2, so with
>= m + 2 landmarks in general position the estimate is EXACT (notes Sec. 8.3 and Sec. 3, "Nystrom
exactness"); plain distances never are. W is indefinite (a distance matrix), so W_k is the best
rank-k approximation by |eigenvalue|.

Fed-SpeClust (Algorithm 3). Client p uploads K_{X_p,Y} (n_p, n_y); K_hat = C W^+ C^T with
C = [K_{X_1,Y}; ...], W = K_YY; spectral clustering on clip_0(K_hat).

"+" variants (Sec. 5; notes Sec. 2.6, 3, 8.7). (epsilon, delta)-DP per client, replace-one adjacency,
client sizes public; noise calibrated and epsilon reported by :mod:`fedlib.core.privacy` (dp-accounting):

* ``noise="dp_data"`` (Theorem 4): rows clipped to a PUBLIC tau_X, then X_p <- X_p + N(0, s^2) once,
  before anything is uploaded, with s from the analytic Gaussian mechanism for Delta_2 = 2 tau_X (valid
  for every epsilon; the paper's Dwork & Roth constant, :func:`paper_noise_sd`, needs epsilon < 1).
* ``noise="dp_gradient"`` (Theorem 6's setting): every gradient a client computes gets N(0, (z Delta_p)^2),
  z calibrated once for T = S*Q compositions. Delta_p is the data-free bound
  :func:`kernel_gradient_sensitivity` = 4 sqrt(2 gamma/e) / (n_p sqrt(n_y)) (from
  sup_r r exp(-gamma r^2) = 1/sqrt(2 e gamma)), or Theorem 6's bound with enforced clipping and
  projection. gamma must be public and Y^0 data-free.
* ``noise="heuristic"`` (what the experiments did, Sec. 6.1): N(0, beta^2 sd(grad f_p)^2) with
  sd over all entries of that gradient, beta = 1 in the tables. Data-dependent; no epsilon.

Only data perturbation also covers the final D_p / K_p upload: from squared distances to known
landmarks the server recovers each sample (exactly with >= m + 1 landmarks in general position,
its projection onto the landmarks' affine span otherwise; :func:`reconstruct_from_sq_distances`,
notes Sec. 1 and 8.10).
"""
from __future__ import annotations

import inspect
import math
import time
import warnings
from dataclasses import dataclass, field
from numbers import Integral, Real
from typing import Sequence

import numpy as np
from tqdm.auto import tqdm

from fedlib.core.messages import Message
from fedlib.data.partition import make_partition
from fedlib.core.validate import check_choice, check_positive

__all__ = ["sq_distances", "gaussian_kernel", "mmd2_u", "mmd2_u_grad", "lipschitz_bound", "client_median_sqdist",
           "dp_noise_sd", "paper_noise_sd", "data_sensitivity", "gradient_sensitivity",
           "kernel_gradient_sensitivity", "clip_rows", "project_spectral", "DP_SENSITIVITIES", "FedDLResult", "feddl",
           "split_clients", "end_to_end_epsilon",
           "client_sq_distances", "client_kernel", "landmark_pinv", "nystrom", "distances_from_squared",
           "nystrom_distances", "nystrom_kernel", "EmbeddingResult", "ClusteringResult", "fed_tsne", "fed_umap",
           "fed_spectral_clustering", "reconstruct_from_sq_distances",
           "MODES", "WEIGHTS", "INITS", "NOISES", "INVERSES", "GAMMA_RULES", "DP_MECHANISMS"]

MODES = ("gradient", "average")
WEIGHTS = ("size", "uniform")
INITS = ("moments", "gaussian", "uniform")
NOISES = ("none", "dp_data", "dp_gradient", "heuristic")
INVERSES = ("pinv", "ridge")
GAMMA_RULES = ("median", "moments")
DP_MECHANISMS = ("dp_data", "dp_gradient")


# ----------------------------------------------------------------------------------------------
# checks
# ----------------------------------------------------------------------------------------------
def _check_int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _check_real(name: str, value, *, strict: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or not np.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    check_positive(name, value, strict=strict)
    return float(value)


def _check_epsilon_delta(epsilon, delta) -> tuple[float, float]:
    if epsilon is None or delta is None:
        raise ValueError("a differential-privacy noise needs epsilon (> 0) and delta (in (0, 1)); got "
                         f"epsilon={epsilon!r}, delta={delta!r}")
    epsilon = _check_real("epsilon", epsilon)
    if isinstance(delta, bool) or not isinstance(delta, Real) or not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in the open interval (0, 1), got {delta!r}")
    return epsilon, float(delta)


def _as_matrix(name: str, x, dim: int | None = None) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"{name} must be a 2-D array (samples, features), got shape {x.shape}")
    if dim is not None and x.shape[1] != dim:
        raise ValueError(f"{name} must have {dim} features (columns), got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{name} contains NaN or inf")
    return x


def _check_clients(client_data) -> list[np.ndarray]:
    if isinstance(client_data, np.ndarray) or len(client_data) == 0:
        raise ValueError("client_data must be a non-empty list of (n_p, m) arrays, one per client")
    data = [_as_matrix(f"client_data[{p}]", x) for p, x in enumerate(client_data)]
    dim = data[0].shape[1]
    for p, x in enumerate(data):
        if x.shape[1] != dim:
            raise ValueError(f"client_data[{p}] has {x.shape[1]} features, client 0 has {dim}")
        if len(x) < 2:
            raise ValueError(f"client {p} holds {len(x)} sample(s); the unbiased MMD^2 (Eq. 10) needs >= 2 per "
                             "client (fewer clients, or more samples per client)")
    return data


def _resolve_parts(n: int, parts, seed: int) -> list[np.ndarray]:
    """``parts``: an int P (IID split by :func:`fedlib.data.partition.make_partition`) or P index arrays that
    partition range(n) (disjoint, covering every row)."""
    if isinstance(parts, (Integral, np.integer)) and not isinstance(parts, bool):
        p = int(parts)
        if p < 1:
            raise ValueError(f"number of clients must be >= 1, got {p}")
        if 2 * p > n:
            raise ValueError(f"{p} clients for {n} samples: more clients than samples allow (each client needs "
                             ">= 2 samples for Eq. 10)")
        return make_partition(np.zeros(n, dtype=np.int64), p, "iid", seed=seed)
    if parts is None or len(parts) == 0:
        raise ValueError("parts must be a number of clients or a non-empty list of index arrays")
    parts = [np.asarray(ix, dtype=np.int64).ravel() for ix in parts]
    if 2 * len(parts) > n:
        raise ValueError(f"{len(parts)} clients for {n} samples: more clients than samples allow")
    allidx = np.concatenate(parts)
    if len(allidx) != n or not np.array_equal(np.sort(allidx), np.arange(n)):
        raise ValueError("parts must partition the rows of X: disjoint index arrays covering 0..n-1")
    return parts


def split_clients(X, parts, seed: int = 0) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """X (n, m), parts (int P or P index arrays) -> (client arrays [X[ix] ...], index arrays)."""
    X = _as_matrix("X", X)
    idx = _resolve_parts(len(X), parts, seed)
    return [X[ix] for ix in idx], idx


# ----------------------------------------------------------------------------------------------
# primitives (Eqs. 9, 10, 13)
# ----------------------------------------------------------------------------------------------
def sq_distances(A, B=None) -> np.ndarray:
    """Squared Euclidean distances A (a, m), B (b, m) -> (a, b), clipped at 0.

    With B omitted: the (a, a) self-distances with an exact zero diagonal."""
    A = np.asarray(A, dtype=np.float64)
    same = B is None
    B = A if same else np.asarray(B, dtype=np.float64)
    a2 = np.einsum("ij,ij->i", A, A)
    b2 = a2 if same else np.einsum("ij,ij->i", B, B)
    d2 = a2[:, None] - 2.0 * (A @ B.T) + b2[None, :]
    np.maximum(d2, 0.0, out=d2)
    if same:
        np.fill_diagonal(d2, 0.0)
    return d2


def gaussian_kernel(A, B=None, gamma: float = 1.0) -> np.ndarray:
    """k(a, b) = exp(-gamma ||a - b||^2): A (a, m), B (b, m) -> (a, b) (self-kernel when B is None)."""
    check_positive("gamma", gamma)
    return np.exp(-gamma * sq_distances(A, B))


def _xx_term(X: np.ndarray, gamma: float, chunk: int = 2048) -> float:
    """(1^T K_XX 1 - n) / (n (n-1)): the Y-independent first term of Eq. 10, in row blocks."""
    n = len(X)
    total = 0.0
    for s in range(0, n, chunk):
        total += float(np.exp(-gamma * sq_distances(X[s:s + chunk], X)).sum())
    # the diagonal contributes exactly n (k(x, x) = 1 up to rounding of the clipped distances)
    return (total - n) / (n * (n - 1))


def _yy_terms(Y: np.ndarray, gamma: float) -> tuple[float, np.ndarray]:
    """Y-Y term of Eq. 10 and of Eq. 13 (the repulsion part of the gradient, (n_y, m))."""
    ny = len(Y)
    kyy = np.exp(-gamma * sq_distances(Y))
    value = (kyy.sum() - ny) / (ny * (ny - 1))
    grad = (4.0 * gamma / (ny * (ny - 1))) * (kyy @ Y - kyy.sum(0)[:, None] * Y)
    return float(value), grad


def _cross_terms(X: np.ndarray, Y: np.ndarray, gamma: float) -> tuple[float, np.ndarray]:
    """Cross term of Eq. 10 (-2 1^T K_XY 1/(n_p n_y)) and of Eq. 13 (the attraction part, (n_y, m))."""
    n, ny = len(X), len(Y)
    kxy = np.exp(-gamma * sq_distances(X, Y))
    value = -2.0 * kxy.sum() / (n * ny)
    grad = (-4.0 * gamma / (n * ny)) * (kxy.T @ X - kxy.sum(0)[:, None] * Y)
    return float(value), grad


def mmd2_u(X, Y, gamma: float) -> float:
    """Unbiased MMD^2 estimate f(Y) of Eq. 10 between X (n, m) and Y (n_y, m); n, n_y >= 2."""
    check_positive("gamma", gamma)
    X, Y = _as_matrix("X", X), _as_matrix("Y", Y)
    if len(X) < 2 or len(Y) < 2:
        raise ValueError(f"mmd2_u needs >= 2 rows in X and in Y, got {len(X)} and {len(Y)}")
    return _xx_term(X, gamma) + _cross_terms(X, Y, gamma)[0] + _yy_terms(Y, gamma)[0]


def mmd2_u_grad(X, Y, gamma: float) -> np.ndarray:
    """Gradient of Eq. 10 w.r.t. the landmarks Y (Eq. 13): X (n, m), Y (n_y, m) -> (n_y, m)."""
    check_positive("gamma", gamma)
    X, Y = _as_matrix("X", X), _as_matrix("Y", Y, X.shape[1])
    if len(Y) < 2:
        raise ValueError(f"n_landmarks must be >= 2, got {len(Y)}")
    return _cross_terms(X, Y, gamma)[1] + _yy_terms(Y, gamma)[1]


def lipschitz_bound(gamma: float, n_landmarks: int) -> float:
    """Data-free bound L = (4 gamma/n_y)(n_y/(n_y-1) + 2 e^{-3/2}) on the Lipschitz constant of
    grad F (module docstring); ``lr="auto"`` is 1/L."""
    check_positive("gamma", gamma)
    ny = _check_int("n_landmarks", n_landmarks, 2)
    return 4.0 * gamma / ny * (ny / (ny - 1) + 2.0 * math.exp(-1.5))


def client_median_sqdist(X, max_points: int = 1000, seed: int = 0) -> float:
    """What one client reveals for ``gamma="median"``: the median of its own pairwise squared distances
    (pairs i < j; on a random subset of ``max_points`` rows when n_p is larger). X (n_p, m) -> float."""
    X = _as_matrix("X", X)
    if len(X) > max_points:
        X = X[np.random.default_rng(seed).choice(len(X), max_points, replace=False)]
    d2 = sq_distances(X)
    return float(np.median(d2[np.triu_indices(len(X), 1)]))


# ----------------------------------------------------------------------------------------------
# differential privacy (Theorems 4 and 6, and the data-free kernel sensitivity)
# ----------------------------------------------------------------------------------------------
def clip_rows(X, tau_x: float) -> np.ndarray:
    """Scale every row of X (n, m) with ||x|| > tau_x down to norm tau_x (a public bound): after it,
    replacing one row moves the data by at most 2 tau_x in l2 (Theorem 4's Delta)."""
    X = _as_matrix("X", X)
    tau_x = _check_real("tau_x", tau_x)
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
    return 2.0 * _check_real("tau_x", tau_x)


def kernel_gradient_sensitivity(n_p: int, n_landmarks: int, gamma: float) -> float:
    """Data-free l2-sensitivity of grad f_p (Eq. 13) to replacing one of client p's n_p samples:

        Delta_K = 8 sqrt(gamma) / (sqrt(2 e) n_p sqrt(n_y)) = 4 sqrt(2 gamma / e) / (n_p sqrt(n_y)).

    Only the cross term depends on the data; its row j changes by (4 gamma/(n_p n_y)) [k(x, y_j)(x - y_j)
    - k(x', y_j)(x' - y_j)], and ||k(x, y)(x - y)|| = r exp(-gamma r^2) <= 1/sqrt(2 e gamma) for every
    r = ||x - y|| (maximum at r = 1/sqrt(2 gamma)). So each row moves by <= 8 gamma/(n_p n_y sqrt(2 e gamma))
    and the (n_y, m) matrix by sqrt(n_y) times that, for ANY data and landmarks: no clipping, no bound
    on Y (derivation chapter, Sec. 4). gamma and n_p must be public."""
    n_p = _check_int("n_p", n_p, 1)
    ny = _check_int("n_landmarks", n_landmarks, 2)
    gamma = _check_real("gamma", gamma)
    return 8.0 * math.sqrt(gamma) / (math.sqrt(2.0 * math.e) * n_p * math.sqrt(ny))


def gradient_sensitivity(n_p: int, n_landmarks: int, gamma: float, tau_x: float, tau_y: float,
                         upsilon: float) -> float:
    """Theorem 6's l2-sensitivity of grad f_p (Eq. 13) to replacing one sample of client p:

        Delta = 8 sqrt(n_y) gamma tau_X / (n_p n_y) * {1 + 2 gamma (tau_X + tau_Y)(tau_X + Upsilon)}

    tau_X >= max ||x||, tau_Y >= ||Y_p||_2 (spectral norm) at every iterate, Upsilon >= max ||y_i - x_j||.
    A guarantee needs these enforced a priori (``dp_sensitivity="theorem6"`` in :func:`feddl` clips the
    rows to tau_X and projects Y into ||Y||_2 <= tau_Y, so Upsilon = tau_X + tau_Y)."""
    n_p = _check_int("n_p", n_p, 1)
    ny = _check_int("n_landmarks", n_landmarks, 2)
    gamma = _check_real("gamma", gamma)
    tau_x = _check_real("tau_x", tau_x)
    tau_y = _check_real("tau_y", tau_y, strict=False)
    upsilon = _check_real("upsilon", upsilon, strict=False)
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
    from fedlib.core import privacy

    epsilon, delta = _check_epsilon_delta(epsilon, delta)
    sensitivity = _check_real("sensitivity", sensitivity)
    check_choice("mechanism", mechanism, DP_MECHANISMS)
    compositions = _check_int("compositions", compositions, 1)
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
    epsilon, delta = _check_epsilon_delta(epsilon, delta)
    sensitivity = _check_real("sensitivity", sensitivity)
    check_choice("mechanism", mechanism, DP_MECHANISMS)
    compositions = _check_int("compositions", compositions, 1)
    if mechanism == "dp_data":
        return math.sqrt(2.0 * math.log(1.25 / delta)) * sensitivity / epsilon
    return sensitivity * math.sqrt(8.0 * compositions * math.log(math.e + epsilon / delta)) / epsilon


# ----------------------------------------------------------------------------------------------
# FedDL (Algorithm 1)
# ----------------------------------------------------------------------------------------------
@dataclass
class FedDLResult:
    """Output of :func:`feddl`. ``objective[s]`` = F(Y^s) = sum_p w_p f_p(Y^s), s = 0..S (Eq. 11, a
    diagnostic computed on the data the clients hold, not uploaded); ``step_sq_norms[s-1]`` =
    ||Y^s - Y^{s-1}||_F^2; ``noise_sd``: (P,) data-noise sd (dp_data) or (S, P) mean gradient-noise sd
    per round and client; bytes are sums of ``Message.nbytes``. ``client_data`` is client-side state
    (the clipped, perturbed copies under dp_data; the clipped rows under dp_sensitivity="theorem6") that
    Algorithms 2-3 upload from; it is never sent.

    Privacy: ``epsilon`` is the epsilon SPENT at ``delta`` by every client's releases during FedDL, from
    the accountant (:mod:`fedlib.core.privacy`); ``math.inf`` for noise "none" and "heuristic" (no
    guarantee). ``noise_multiplier`` = sd / sensitivity, ``sensitivity`` (P,) the l2-sensitivity each
    client's noise is calibrated to, ``privacy_ledger`` one line per kind of release and how it is
    covered."""

    landmarks: np.ndarray
    init_landmarks: np.ndarray
    objective: np.ndarray
    step_sq_norms: np.ndarray
    gamma: float
    weights: np.ndarray
    lr: float
    server_lr: float
    mode: str
    local_steps: int
    noise: str
    noise_sd: np.ndarray
    upload_bytes: int
    setup_upload_bytes: int
    broadcast_bytes: int
    seconds: float
    client_data: list = field(repr=False, default_factory=list)
    epsilon: float = math.inf
    delta: float | None = None
    noise_multiplier: float = 0.0
    sensitivity: np.ndarray = field(default_factory=lambda: np.zeros(0))
    accountant: str | None = None
    privacy_ledger: list = field(default_factory=list)

    @property
    def rounds(self) -> int:
        return len(self.step_sq_norms)


def _setup_uploads(data: list[np.ndarray], need_moments: bool, need_median: bool, need_norm: bool,
                   median_points: int, seed: int) -> list[Message]:
    """One setup message per client: n_p, and only what the chosen options need (sums for the
    moments, a local median of squared distances, the max row norm)."""
    msgs = []
    for p, x in enumerate(data):
        payload: dict = {"n": len(x)}
        if need_moments:
            payload["sum"] = x.sum(0)
            payload["sumsq"] = np.einsum("ij,ij->j", x, x)
        if need_median:
            payload["median_sqdist"] = client_median_sqdist(x, median_points, seed + p)
        if need_norm:
            payload["max_norm"] = float(np.sqrt(np.einsum("ij,ij->i", x, x).max()))
        msgs.append(Message(f"client{p}", payload))
    return msgs


DP_SENSITIVITIES = ("kernel", "theorem6")


def _check_dp_options(noise, init, gamma, tau_x, tau_y, dp_sensitivity, dp_accountant, landmark_bounds):
    """The DP-specific checks of :func:`feddl` (all before any work)."""
    from fedlib.core.privacy import ACCOUNTANTS

    check_choice("dp_sensitivity", dp_sensitivity, DP_SENSITIVITIES)
    check_choice("dp_accountant", dp_accountant, ACCOUNTANTS)
    if tau_x is not None:
        tau_x = _check_real("tau_x", tau_x)
    if tau_y is not None:
        tau_y = _check_real("tau_y", tau_y)
    if landmark_bounds is not None:
        try:
            lo, hi = (float(v) for v in landmark_bounds)
        except (TypeError, ValueError):
            raise ValueError(f"landmark_bounds must be None or (low, high), got {landmark_bounds!r}") from None
        if not (np.isfinite(lo) and np.isfinite(hi) and lo < hi):
            raise ValueError(f"landmark_bounds must be finite with low < high, got {landmark_bounds!r}")
        landmark_bounds = (lo, hi)
    if noise == "dp_data" and tau_x is None:
        raise ValueError("noise='dp_data' needs tau_x, a PUBLIC bound on the row norm (rows are clipped to it); "
                         "the data's observed max norm would be a release of its own")
    if noise == "dp_gradient":
        if isinstance(gamma, str):
            raise ValueError(f"noise='dp_gradient' needs gamma as a public number; the rule gamma={gamma!r} is "
                             "computed from the clients' data and would be released without noise")
        if isinstance(init, str) and init == "moments":
            raise ValueError("noise='dp_gradient' needs a data-free init ('gaussian', 'uniform' or a public array); "
                             "init='moments' releases the clients' first and second moments")
        if dp_sensitivity == "theorem6" and (tau_x is None or tau_y is None):
            raise ValueError("dp_sensitivity='theorem6' needs public tau_x (rows are clipped to it) and tau_y "
                             "(landmarks are projected into ||Y||_2 <= tau_y)")
    return tau_x, tau_y, landmark_bounds


def feddl(client_data: Sequence, n_landmarks: int = 500, *, rounds: int = 100, local_steps: int = 1,
          mode: str = "gradient", lr: float | str = "auto", server_lr: float | None = None,
          weights: str = "size", init: str | np.ndarray = "moments", gamma: float | str = "median",
          noise: str = "none", beta: float = 1.0, epsilon: float | None = None, delta: float | None = None,
          tau_x: float | None = None, tau_y: float | None = None, dp_sensitivity: str = "kernel",
          dp_accountant: str = "pld", landmark_bounds: tuple | None = None, median_points: int = 1000,
          seed: int = 0, progress: bool = False) -> FedDLResult:
    """Federated distribution learning (Algorithm 1): fit n_y landmarks to the union of the clients'
    data by minimizing F(Y) = sum_p w_p MMD_u^2(X_p, Y) (Eqs. 8-16).

    client_data: P arrays (n_p, m), n_p >= 2. Options (defaults = notes Sec. 2.8 DECIDE):

    * ``mode``: "gradient" (Eq. 16, one gradient per client per round; ``local_steps`` must be 1) or
      "average" (Eqs. 14-15, ``local_steps`` = Q local steps, then weighted landmark averaging).
    * ``weights``: "size" (w_p = n_p/n, Thm 1) or "uniform" (w_p = 1/P, Alg. 1).
    * ``lr``: client step (and server step ``server_lr`` in gradient mode, default = lr); "auto" = 1/L
      from :func:`lipschitz_bound`.
    * ``init``: "moments" (Y^0 ~ N(mu, diag v) with the exact pooled mean/variance from client sums
      and sums of squares: leaks first and second moments), "gaussian" (N(0, I), data-free),
      "uniform" (U[0, 1]^m, data-free, for pixel data) or an (n_y, m) array.
    * ``gamma``: a float, "median" (1 / sum_p w_p med_p with med_p the median squared distance
      within client p, on <= ``median_points`` rows; each client reveals one scalar; under label skew
      within-client medians are smaller than the pooled one) or "moments" (1 / E||x - x'||^2 =
      1 / (2 sum_f var_f) from the pooled moments; no extra upload).
    * ``noise`` (Sec. 5; the guarantee is (epsilon, delta)-DP per client under replace-one adjacency,
      client sizes n_p public):

      - "none";
      - "dp_data" (Thm 4): rows clipped to the public ``tau_x``, then N(0, s^2) once with s from the
        analytic Gaussian mechanism for Delta = 2 tau_x; every later upload (median/moments set-up,
        gradients, distances) is post-processing of the perturbed data;
      - "dp_gradient" (Thm 6's setting): every gradient a client computes (T = S*Q) gets N(0, s_p^2),
        s_p = z Delta_p with z calibrated by ``dp_accountant`` ("pld" or "rdp") for T compositions.
        ``dp_sensitivity="kernel"``: Delta_p = :func:`kernel_gradient_sensitivity`, data-free, needs no
        bound. ``"theorem6"``: Delta_p = :func:`gradient_sensitivity` with rows clipped to ``tau_x`` and
        Y projected into ||Y||_2 <= ``tau_y`` at every iterate (Upsilon = tau_x + tau_y). gamma must be a
        public number and init data-free (else ValueError). Only n_p is uploaded at set-up. The later
        distance upload (Alg. 2) is NOT covered: see :func:`reconstruct_from_sq_distances`;
      - "heuristic" (the paper's experiments, Sec. 6.1): sd = ``beta`` x sd(grad f_p); data-dependent,
        no guarantee (``epsilon`` = inf).

    * ``landmark_bounds``: (low, high) or None; the server clips every landmark coordinate into this
      public box after each update (post-processing: no privacy cost).

    ``progress`` shows a tqdm bar over the rounds. Returns a :class:`FedDLResult` (landmarks (n_y, m),
    per-round objective, bytes, seconds, epsilon spent).
    """
    from fedlib.core import privacy

    # ---- checks, all before any work
    data = _check_clients(client_data)
    P, m = len(data), data[0].shape[1]
    ny = _check_int("n_landmarks", n_landmarks, 2)
    S = _check_int("rounds", rounds, 1)
    Q = _check_int("local_steps", local_steps, 1)
    check_choice("mode", mode, MODES)
    if mode == "gradient" and Q != 1:
        raise ValueError(f"local_steps={Q}: gradient mode (Eq. 16) uploads one gradient per round; use "
                         "mode='average' for Q > 1 local steps")
    check_choice("weights", weights, WEIGHTS)
    check_choice("noise", noise, NOISES)
    if isinstance(init, str):
        check_choice("init", init, INITS)
    else:
        init = _as_matrix("init", init, m)
        if init.shape != (ny, m):
            raise ValueError(f"init array must have shape (n_landmarks, m) = {(ny, m)}, got {init.shape}")
    if isinstance(gamma, str):
        check_choice("gamma", gamma, GAMMA_RULES)
    else:
        gamma = _check_real("gamma", gamma)
    if not (isinstance(lr, str) and lr == "auto"):
        if isinstance(lr, str):
            raise ValueError(f"lr must be a float > 0 or 'auto', got {lr!r}")
        lr = _check_real("lr", lr)
    if server_lr is not None:
        server_lr = _check_real("server_lr", server_lr)
    beta = _check_real("beta", beta, strict=False)
    if noise in DP_MECHANISMS:
        epsilon, delta = _check_epsilon_delta(epsilon, delta)
    tau_x, tau_y, landmark_bounds = _check_dp_options(noise, init, gamma, tau_x, tau_y, dp_sensitivity,
                                                      dp_accountant, landmark_bounds)
    theorem6 = noise == "dp_gradient" and dp_sensitivity == "theorem6"
    median_points = _check_int("median_points", median_points, 2)

    start = time.perf_counter()
    rng = np.random.default_rng(seed)
    client_rngs = rng.spawn(P)
    n_p = np.array([len(x) for x in data], dtype=np.float64)
    w = n_p / n_p.sum() if weights == "size" else np.full(P, 1.0 / P)
    setup_bytes = 0
    noise_sd = np.zeros((S, P))
    spent, z_mult, sens, ledger = math.inf, 0.0, np.zeros(P), []

    # ---- data perturbation (Thm 4): clip to the public tau_x, perturb, before anything leaves the clients
    if noise == "dp_data":
        data = [clip_rows(x, tau_x) for x in data]
        sens = np.full(P, data_sensitivity(tau_x))
        sd = privacy.analytic_gaussian_sigma(epsilon, delta, sens[0])
        data = [x + sd * r.standard_normal(x.shape) for x, r in zip(data, client_rngs)]
        noise_sd = np.full(P, sd)
        z_mult = sd / sens[0]
        spent = privacy.analytic_gaussian_epsilon(sd, delta, sens[0])
        ledger.append(f"data: rows clipped to tau_x={tau_x:g}, one Gaussian release, sd={sd:.4g} "
                      f"(analytic Gaussian mechanism, Delta=2 tau_x): epsilon={spent:.4g} at delta={delta:g}")
        ledger.append("set-up (n_p, median/moments), gradients, distance uploads: post-processing of the "
                      "perturbed data (no further cost)")
    elif theorem6:
        data = [clip_rows(x, tau_x) for x in data]

    # ---- setup uploads: sizes, moments, local medians (only sizes under dp_gradient: checked above)
    need_moments = (isinstance(init, str) and init == "moments") or gamma == "moments"
    setup = _setup_uploads(data, need_moments, gamma == "median", False, median_points, seed)
    setup_bytes += sum(msg.nbytes for msg in setup)
    if need_moments:
        n = n_p.sum()
        mean = sum(msg["sum"] for msg in setup) / n
        var = np.maximum(sum(msg["sumsq"] for msg in setup) / n - mean ** 2, 0.0) * n / max(n - 1.0, 1.0)
    if gamma == "median":
        med = float(np.dot(w, [msg["median_sqdist"] for msg in setup]))
        if med <= 0:
            raise ValueError("the median heuristic gave 0 (duplicated points); pass gamma explicitly")
        gamma = 1.0 / med
    elif gamma == "moments":
        gamma = 1.0 / (2.0 * float(var.sum()))

    # ---- Y^0, and the server's public post-processing of landmarks
    def post(Yv: np.ndarray) -> np.ndarray:
        if landmark_bounds is not None:
            Yv = np.clip(Yv, *landmark_bounds)
        if theorem6:
            Yv = project_spectral(Yv, tau_y)
        return Yv

    if isinstance(init, np.ndarray):
        Y = init.copy()
    elif init == "moments":
        Y = mean + np.sqrt(var) * rng.standard_normal((ny, m))
    elif init == "gaussian":
        Y = rng.standard_normal((ny, m))
    else:
        Y = rng.uniform(0.0, 1.0, (ny, m))
    Y = post(Y)
    Y0 = Y.copy()
    eta = 1.0 / lipschitz_bound(gamma, ny) if lr == "auto" else lr
    eta_srv = eta if server_lr is None else server_lr
    xx = np.array([_xx_term(x, gamma) for x in data])  # constant part of each f_p (diagnostic only)

    # ---- gradient perturbation: a FIXED sd per client, calibrated once (no feedback from noisy iterates)
    if noise == "dp_gradient":
        T = S * Q
        if theorem6:
            sens = np.array([gradient_sensitivity(len(x), ny, gamma, tau_x, tau_y, tau_x + tau_y) for x in data])
        else:
            sens = np.array([kernel_gradient_sensitivity(len(x), ny, gamma) for x in data])
        z_mult = privacy.calibrate_noise_multiplier(epsilon, delta, T, dp_accountant)
        spent = privacy.gaussian_epsilon(z_mult, delta, T, dp_accountant)
        ledger.append("set-up: n_p only (public under replace-one adjacency); gamma, init: public")
        ledger.append(f"gradients: {T} Gaussian releases per client, noise multiplier z={z_mult:.4g} "
                      f"({dp_sensitivity} sensitivity), {dp_accountant.upper()} accountant: epsilon={spent:.4g} "
                      f"at delta={delta:g}")
        ledger.append("distance upload (Alg. 2/3): NOT covered, computed from the clean data")

    def noisy(p: int, g: np.ndarray) -> tuple[np.ndarray, float]:
        if noise == "heuristic":
            sd = beta * float(g.std())
        elif noise == "dp_gradient":
            sd = z_mult * sens[p]
        else:
            return g, 0.0
        return g + sd * client_rngs[p].standard_normal(g.shape), sd

    objective = np.zeros(S + 1)
    steps = np.zeros(S)
    upload_bytes = 0
    sd_rounds = np.zeros((S, P))
    for s in tqdm(range(S), desc="FedDL rounds", disable=not progress):
        yy_val, yy_grad = _yy_terms(Y, gamma)
        f_now = np.zeros(P)
        uploads = []
        for p, x in enumerate(data):
            cross_val, cross_grad = _cross_terms(x, Y, gamma)
            f_now[p] = xx[p] + cross_val + yy_val
            g, sd_sum = noisy(p, cross_grad + yy_grad)
            if mode == "gradient":
                uploads.append(Message(f"client{p}", {"gradient": g}))
                sd_rounds[s, p] = sd_sum
                continue
            Yp = post(Y - eta * g)
            for _ in range(Q - 1):
                g, sd = noisy(p, _cross_terms(x, Yp, gamma)[1] + _yy_terms(Yp, gamma)[1])
                sd_sum += sd
                Yp = post(Yp - eta * g)
            sd_rounds[s, p] = sd_sum / Q
            uploads.append(Message(f"client{p}", {"landmarks": Yp}))
        objective[s] = float(np.dot(w, f_now))
        upload_bytes += sum(msg.nbytes for msg in uploads)
        if mode == "gradient":
            Y_new = Y - eta_srv * sum(wp * msg["gradient"] for wp, msg in zip(w, uploads))
        else:
            Y_new = sum(wp * msg["landmarks"] for wp, msg in zip(w, uploads))
        Y_new = post(Y_new)
        steps[s] = float(((Y_new - Y) ** 2).sum())
        Y = Y_new
    yy_val = _yy_terms(Y, gamma)[0]
    objective[S] = float(np.dot(w, [xx[p] + _cross_terms(x, Y, gamma)[0] + yy_val for p, x in enumerate(data)]))
    if noise in ("heuristic", "dp_gradient"):
        noise_sd = sd_rounds
    elif noise == "none":
        noise_sd = np.zeros(0)
    if noise == "heuristic":
        ledger.append("heuristic noise (sd = beta x sd of the gradient): data-dependent, no guarantee")
    elif noise == "none":
        ledger.append("no noise: no guarantee")
    return FedDLResult(landmarks=Y, init_landmarks=Y0, objective=objective, step_sq_norms=steps, gamma=float(gamma),
                       weights=w, lr=float(eta), server_lr=float(eta_srv), mode=mode, local_steps=Q, noise=noise,
                       noise_sd=noise_sd, upload_bytes=int(upload_bytes + setup_bytes),
                       setup_upload_bytes=int(setup_bytes), broadcast_bytes=int((S + 1) * P * Y.nbytes),
                       seconds=time.perf_counter() - start, client_data=data, epsilon=float(spent),
                       delta=None if noise not in DP_MECHANISMS else float(delta), noise_multiplier=float(z_mult),
                       sensitivity=sens, accountant=dp_accountant if noise == "dp_gradient" else
                       ("analytic" if noise == "dp_data" else None), privacy_ledger=ledger)


# ----------------------------------------------------------------------------------------------
# uploads and the Nystrom estimate (Eqs. 18-22, Algorithm 3 step 4)
# ----------------------------------------------------------------------------------------------
def client_sq_distances(X_p, Y, sender: str = "client") -> Message:
    """Fed-tSNE/UMAP upload (Alg. 2 step 3): {"sq_distances": ||x_i - y_j||^2 (n_p, n_y)}."""
    return Message(sender, {"sq_distances": sq_distances(_as_matrix("X_p", X_p), _as_matrix("Y", Y))})


def client_kernel(X_p, Y, gamma: float, sender: str = "client") -> Message:
    """Fed-SpeClust upload (Alg. 3 step 3): {"kernel": K_{X_p,Y} (n_p, n_y)}."""
    return Message(sender, {"kernel": gaussian_kernel(_as_matrix("X_p", X_p), _as_matrix("Y", Y), gamma)})


def _check_inverse(inverse: str, rank, ridge, ny: int | None = None) -> None:
    check_choice("inverse", inverse, INVERSES)
    if rank is not None:
        if inverse != "pinv":
            raise ValueError("rank applies to inverse='pinv' only")
        _check_int("rank", rank, 1)
        if ny is not None and rank > ny:
            raise ValueError(f"rank must be <= n_landmarks = {ny}, got {rank}")
    if ridge is not None:
        if inverse != "ridge":
            raise ValueError("ridge applies to inverse='ridge' only")
        _check_real("ridge", ridge)


def landmark_pinv(W, *, inverse: str = "pinv", rank: int | None = None, ridge: float | None = None,
                  rcond: float = 1e-10) -> np.ndarray:
    """The middle factor of the Nystrom estimate, W symmetric (n_y, n_y) -> (n_y, n_y).

    ``"pinv"``: W_k^+ (Eq. 19), the pseudo-inverse of the best rank-k approximation; W may be
    indefinite (a distance matrix), so the k eigenvalues of largest |lambda| are kept (k = ``rank``,
    default all), and those with |lambda| <= rcond max|lambda| dropped. ``"ridge"``: (W + lambda I)^{-1}
    ("add an identity matrix", Sec. 4.1), lambda = ``ridge``, default 1e-8 ||W||_2 (the notes' trace
    rule is 0 for a distance matrix)."""
    W = np.asarray(W, dtype=np.float64)
    if W.ndim != 2 or W.shape[0] != W.shape[1]:
        raise ValueError(f"W must be square, got shape {W.shape}")
    _check_inverse(inverse, rank, ridge, len(W))
    W = 0.5 * (W + W.T)
    lam, V = np.linalg.eigh(W)
    if inverse == "ridge":
        r = 1e-8 * np.abs(lam).max() if ridge is None else ridge
        return (V / (lam + r)) @ V.T
    order = np.argsort(-np.abs(lam))
    keep = order[: rank if rank is not None else len(lam)]
    keep = keep[np.abs(lam[keep]) > rcond * np.abs(lam).max()]
    return (V[:, keep] / lam[keep]) @ V[:, keep].T


def nystrom(B, W, **inverse_kw) -> np.ndarray:
    """Nystrom estimate B W^+ B^T (Eq. 19/22; C W^{-1} C^T of Alg. 3), symmetrized: B (n, n_y) -> (n, n).
    Keywords go to :func:`landmark_pinv`."""
    B = np.asarray(B, dtype=np.float64)
    W = np.asarray(W, dtype=np.float64)
    if B.ndim != 2 or W.shape != (B.shape[1], B.shape[1]):
        raise ValueError(f"B must be (n, n_y) and W (n_y, n_y); got {B.shape} and {W.shape}")
    H = B @ landmark_pinv(W, **inverse_kw) @ B.T
    return 0.5 * (H + H.T)


def distances_from_squared(D2) -> np.ndarray:
    """Estimated squared distances (n, n) -> Euclidean distances: symmetrize, clip at 0, zero the
    diagonal, square root (what sklearn's TSNE and umap-learn expect with metric="precomputed")."""
    D2 = np.asarray(D2, dtype=np.float64)
    if D2.ndim != 2 or D2.shape[0] != D2.shape[1]:
        raise ValueError(f"D2 must be square, got shape {D2.shape}")
    D = np.maximum(0.5 * (D2 + D2.T), 0.0)
    np.fill_diagonal(D, 0.0)
    return np.sqrt(D)


def nystrom_distances(B_sq, W_sq, **inverse_kw) -> np.ndarray:
    """Alg. 2 step 4 on SQUARED distances: sqrt(clip_0(B W^+ B^T)) with zero diagonal, (n, n)."""
    return distances_from_squared(nystrom(B_sq, W_sq, **inverse_kw))


def nystrom_kernel(C, W, **inverse_kw) -> np.ndarray:
    """Alg. 3 step 4: K_hat = clip_0(sym(C W^+ C^T)), (n, n)."""
    return np.maximum(nystrom(C, W, **inverse_kw), 0.0)


# ----------------------------------------------------------------------------------------------
# pipelines (Algorithms 2 and 3) and their centralized counterparts
# ----------------------------------------------------------------------------------------------
def end_to_end_epsilon(feddl_result: FedDLResult | None) -> float:
    """epsilon of the WHOLE protocol (FedDL + the distance / kernel upload of Alg. 2/3) at
    ``feddl_result.delta``: FedDL's epsilon under "dp_data" (the upload is post-processing of the
    perturbed data), inf otherwise (the upload is computed from the clean data, and with n_y >= m + 2
    landmarks in general position it determines every sample: :func:`reconstruct_from_sq_distances`)."""
    if feddl_result is None or feddl_result.noise != "dp_data":
        return math.inf
    return feddl_result.epsilon


@dataclass
class EmbeddingResult:
    """Fed-tSNE / Fed-UMAP (or centralized) output. ``embedding`` (n, d) is in the row order of X;
    ``upload_bytes`` = FedDL uploads + the distance uploads (0 for the centralized baseline);
    ``epsilon`` = :func:`end_to_end_epsilon` (``feddl.epsilon`` is FedDL's part alone)."""

    embedding: np.ndarray
    method: str
    federated: bool
    feddl: FedDLResult | None
    upload_bytes: int
    distance_upload_bytes: int
    seconds: float
    distances: np.ndarray | None = field(default=None, repr=False)
    epsilon: float = math.inf


@dataclass
class ClusteringResult:
    """Fed-SpeClust (or centralized spectral clustering) output; ``labels`` (n,) in the row order of X."""

    labels: np.ndarray
    federated: bool
    gamma: float
    feddl: FedDLResult | None
    upload_bytes: int
    kernel_upload_bytes: int
    seconds: float
    affinity: np.ndarray | None = field(default=None, repr=False)
    epsilon: float = math.inf


def _federated_matrix(X, parts, n_landmarks, kind: str, gamma_kernel, inverse_kw, feddl_result, seed, progress,
                      feddl_kwargs):
    """Run FedDL (unless given), collect the client uploads, and return the server's estimate in the
    row order of X with (FedDLResult, upload bytes of this step)."""
    data, idx = split_clients(X, parts, seed)
    if feddl_result is None:
        feddl_result = feddl(data, n_landmarks, seed=seed, progress=progress, **feddl_kwargs)
    elif [len(x) for x in feddl_result.client_data] != [len(x) for x in data]:
        raise ValueError("feddl_result was run on other clients (client sizes differ from parts)")
    Y = feddl_result.landmarks
    held = feddl_result.client_data  # the data clients hold (perturbed under dp_data)
    if kind == "distances":
        msgs = [client_sq_distances(x, Y, f"client{p}") for p, x in enumerate(held)]
        B = np.vstack([msg["sq_distances"] for msg in msgs])                       # Eq. 21
        est = nystrom_distances(B, sq_distances(Y), **inverse_kw)                  # Eq. 22
    else:
        g = feddl_result.gamma if gamma_kernel is None else gamma_kernel
        msgs = [client_kernel(x, Y, g, f"client{p}") for p, x in enumerate(held)]
        C = np.vstack([msg["kernel"] for msg in msgs])
        est = nystrom_kernel(C, gaussian_kernel(Y, None, g), **inverse_kw)       # Alg. 3 step 4
    order = np.concatenate(idx)
    out = np.empty_like(est)
    out[np.ix_(order, order)] = est
    return out, feddl_result, sum(msg.nbytes for msg in msgs)


def _check_pipeline(X, parts, centralized: bool, inverse: str, rank, ridge, n_landmarks, feddl_kwargs):
    X = _as_matrix("X", X)
    _check_inverse(inverse, rank, ridge)
    if not centralized:
        _check_int("n_landmarks", n_landmarks, 2)
        if rank is not None and rank > n_landmarks:
            raise ValueError(f"rank must be <= n_landmarks = {n_landmarks}, got {rank}")
        if parts is None:
            raise ValueError("the federated run needs parts (a number of clients or index arrays)")
    if parts is not None:
        _resolve_parts(len(X), parts, 0)
    unknown = set(feddl_kwargs) - (set(inspect.signature(feddl).parameters) - {"client_data", "n_landmarks"})
    if unknown:
        raise TypeError(f"unknown FedDL keyword(s): {sorted(unknown)}")
    return X


def fed_tsne(X, parts, n_landmarks: int = 500, *, centralized: bool = False, perplexity: float = 30.0,
             tsne_kwargs: dict | None = None, inverse: str = "pinv", rank: int | None = None,
             ridge: float | None = None, feddl_result: FedDLResult | None = None, keep_distances: bool = False,
             seed: int = 0, progress: bool = False, **feddl_kwargs) -> EmbeddingResult:
    """Fed-tSNE (Algorithm 2) on X (n, m) split by ``parts`` (int P = IID split, or index arrays);
    ``centralized=True`` runs the same t-SNE on the exact pooled distances (the baseline; ``parts``
    is then ignored). t-SNE: sklearn ``TSNE(metric="precomputed", init="random", perplexity,
    random_state=seed, **tsne_kwargs)`` (sklearn squares the distances itself and forbids init="pca"
    with precomputed input). Extra keywords go to :func:`feddl`; ``feddl_result`` reuses a FedDL run
    on the same parts. Returns an :class:`EmbeddingResult`."""
    from sklearn.manifold import TSNE

    X = _check_pipeline(X, None if centralized else parts, centralized, inverse, rank, ridge, n_landmarks,
                        feddl_kwargs)
    perplexity = _check_real("perplexity", perplexity)
    if perplexity >= len(X):
        raise ValueError(f"perplexity must be < the number of points ({len(X)}), got {perplexity}")
    kw = {"n_components": 2, "perplexity": perplexity, "init": "random", "random_state": seed}
    kw.update(tsne_kwargs or {})
    kw["metric"] = "precomputed"
    return _embed(X, parts, n_landmarks, centralized, lambda D: TSNE(**kw).fit_transform(D), "tsne",
                  dict(inverse=inverse, rank=rank, ridge=ridge), feddl_result, keep_distances, seed, progress,
                  feddl_kwargs)


def fed_umap(X, parts, n_landmarks: int = 500, *, centralized: bool = False, n_neighbors: int = 15,
             min_dist: float = 0.1, umap_kwargs: dict | None = None, inverse: str = "pinv", rank: int | None = None,
             ridge: float | None = None, feddl_result: FedDLResult | None = None, keep_distances: bool = False,
             seed: int = 0, progress: bool = False, **feddl_kwargs) -> EmbeddingResult:
    """Fed-UMAP (Algorithm 2) with umap-learn's ``UMAP(metric="precomputed", n_neighbors, min_dist,
    random_state=seed, **umap_kwargs)``; ``centralized=True`` = UMAP on the exact pooled distances.
    Otherwise as :func:`fed_tsne`."""
    try:
        import umap
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError("Fed-UMAP needs umap-learn: pip install umap-learn") from err

    X = _check_pipeline(X, None if centralized else parts, centralized, inverse, rank, ridge, n_landmarks,
                        feddl_kwargs)
    n_neighbors = _check_int("n_neighbors", n_neighbors, 2)
    if n_neighbors >= len(X):
        raise ValueError(f"n_neighbors must be < the number of points ({len(X)}), got {n_neighbors}")
    min_dist = _check_real("min_dist", min_dist, strict=False)
    kw = {"n_components": 2, "n_neighbors": n_neighbors, "min_dist": min_dist, "random_state": seed}
    kw.update(umap_kwargs or {})
    kw["metric"] = "precomputed"

    def run(D):
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*n_jobs value.*overridden.*")
            warnings.filterwarnings("ignore", message=".*using precomputed metric.*")
            return umap.UMAP(**kw).fit_transform(D)

    return _embed(X, parts, n_landmarks, centralized, run, "umap", dict(inverse=inverse, rank=rank, ridge=ridge),
                  feddl_result, keep_distances, seed, progress, feddl_kwargs)


def _embed(X, parts, n_landmarks, centralized, embedder, method, inverse_kw, feddl_result, keep, seed, progress,
           feddl_kwargs) -> EmbeddingResult:
    start = time.perf_counter()
    if centralized:
        D, res, nbytes = np.sqrt(sq_distances(X)), None, 0
    else:
        D, res, nbytes = _federated_matrix(X, parts, n_landmarks, "distances", None, inverse_kw, feddl_result,
                                           seed, progress, feddl_kwargs)
    Z = np.asarray(embedder(D), dtype=np.float64)
    total = nbytes + (res.upload_bytes if res is not None else 0)
    return EmbeddingResult(embedding=Z, method=method, federated=not centralized, feddl=res, upload_bytes=int(total),
                           distance_upload_bytes=int(nbytes), seconds=time.perf_counter() - start,
                           distances=D if keep else None, epsilon=end_to_end_epsilon(res))


def fed_spectral_clustering(X, parts, n_clusters: int, n_landmarks: int = 500, *, centralized: bool = False,
                            affinity_gamma: float | None = None, inverse: str = "pinv", rank: int | None = None,
                            ridge: float | None = None, feddl_result: FedDLResult | None = None,
                            keep_affinity: bool = False, seed: int = 0, progress: bool = False,
                            **feddl_kwargs) -> ClusteringResult:
    """Fed-SpeClust (Algorithm 3): sklearn ``SpectralClustering(n_clusters, affinity="precomputed",
    random_state=seed)`` on K_hat = clip_0(C W^+ C^T). The kernel width is ``affinity_gamma`` or
    else FedDL's gamma. ``centralized=True`` clusters the exact Gaussian kernel of the pooled X with
    the SAME gamma: ``affinity_gamma`` or the rule ``gamma`` (default "median") applied to ``parts``
    exactly as FedDL would (the pooled data as one client when parts is None)."""
    from sklearn.cluster import SpectralClustering

    X = _check_pipeline(X, parts, centralized, inverse, rank, ridge, n_landmarks, feddl_kwargs)
    n_clusters = _check_int("n_clusters", n_clusters, 2)
    if n_clusters > len(X):
        raise ValueError(f"n_clusters must be <= the number of points ({len(X)}), got {n_clusters}")
    if affinity_gamma is not None:
        affinity_gamma = _check_real("affinity_gamma", affinity_gamma)
    start = time.perf_counter()
    if centralized:
        g = affinity_gamma
        if g is None:
            rule = feddl_kwargs.get("gamma", "median")
            if isinstance(rule, str):
                check_choice("gamma", rule, GAMMA_RULES)
                data = [X] if parts is None else split_clients(X, parts, seed)[0]
                g = _resolve_gamma_only(data, rule, feddl_kwargs.get("weights", "size"),
                                        feddl_kwargs.get("median_points", 1000), seed)
            else:
                g = _check_real("gamma", rule)
        K, res, nbytes = gaussian_kernel(X, None, g), None, 0
    else:
        K, res, nbytes = _federated_matrix(X, parts, n_landmarks, "kernel", affinity_gamma,
                                           dict(inverse=inverse, rank=rank, ridge=ridge), feddl_result, seed,
                                           progress, feddl_kwargs)
        g = res.gamma if affinity_gamma is None else affinity_gamma
    labels = SpectralClustering(n_clusters=n_clusters, affinity="precomputed", random_state=seed).fit_predict(K)
    total = nbytes + (res.upload_bytes if res is not None else 0)
    return ClusteringResult(labels=labels, federated=not centralized, gamma=float(g), feddl=res,
                            upload_bytes=int(total), kernel_upload_bytes=int(nbytes),
                            seconds=time.perf_counter() - start, affinity=K if keep_affinity else None,
                            epsilon=end_to_end_epsilon(res))


def _resolve_gamma_only(data: list[np.ndarray], rule: str, weights: str, median_points: int, seed: int) -> float:
    """gamma exactly as :func:`feddl` resolves it (same uploads), without running FedDL."""
    check_choice("weights", weights, WEIGHTS)
    n_p = np.array([len(x) for x in data], dtype=np.float64)
    w = n_p / n_p.sum() if weights == "size" else np.full(len(data), 1.0 / len(data))
    msgs = _setup_uploads(data, rule == "moments", rule == "median", False, median_points, seed)
    if rule == "median":
        return 1.0 / float(np.dot(w, [msg["median_sqdist"] for msg in msgs]))
    n = n_p.sum()
    mean = sum(msg["sum"] for msg in msgs) / n
    var = np.maximum(sum(msg["sumsq"] for msg in msgs) / n - mean ** 2, 0.0) * n / max(n - 1.0, 1.0)
    return 1.0 / (2.0 * float(var.sum()))


# ----------------------------------------------------------------------------------------------
# what the server learns from the final upload (notes Sec. 1, 8.10)
# ----------------------------------------------------------------------------------------------
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
    Y = _as_matrix("landmarks", landmarks)
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


# ---- data and scoring for the chapters
# One rule for "n points of a dataset", one for the non-IID split, the plateau rule for FedDL's
# rounds and the cached scorer, shared by the Fed-tSNE benchmark and the Fed-SpeClust chapter.
SPLITS = ("iid", "non_iid")


def load_points(name: str, n_points: int | None = None, seed: int = 0, root=None):
    """n points of a registered dataset (``fedlib.data.datasets.DATASETS``), the one rule of the Fed-tSNE chapters.

    Train and test are pooled (nothing here is trained on labels), images flattened and scaled to
    [0, 1] (pixels / 255). With ``n_points`` below the pooled size: a stratified draw of exactly
    ``n_points`` (``sklearn.model_selection.train_test_split(stratify=labels, random_state=seed)``),
    kept in the pooled order; ``None`` keeps everything. Returns (X (n, m) float64, labels (n,) int64,
    class names)."""
    from sklearn.model_selection import train_test_split

    from fedlib.data.datasets import load_dataset

    ds = load_dataset(name, root=root)
    total = len(ds.y_train) + len(ds.y_test)
    if n_points is not None:
        n_points = _check_int("n_points", n_points, len(ds.classes))
        if n_points > total:
            raise ValueError(f"n_points must be <= the {total} images of {name}, got {n_points}")
    X = np.concatenate([ds.x_train, ds.x_test]).reshape(total, -1).astype(np.float64) / 255.0
    y = np.concatenate([ds.y_train, ds.y_test]).astype(np.int64)
    if n_points is not None and n_points < total:
        keep, _ = train_test_split(np.arange(total), train_size=n_points, stratify=y, random_state=seed)
        keep = np.sort(keep)
        X, y = X[keep], y[keep]
    return X, y, tuple(ds.classes)


def label_skew_parts(labels, num_clients: int, seed: int = 0) -> list[np.ndarray]:
    """The one non-IID rule of the Fed-tSNE chapters (the paper's "one class per client", Tables 1-3).

    C classes, k clients: k a multiple of C -> one class per client, k/C clients share a class
    (``make_partition(..., "one_class")``); k a divisor of C -> C/k classes per client, the sorted
    classes in consecutive groups ({0, 1}, {2, 3}, ... for k = 5, C = 10: the paper's Table 3).
    Anything else raises ValueError. labels (n,) -> k index arrays."""
    y = np.asarray(labels).ravel()
    k = _check_int("num_clients", num_clients, 1)
    c = len(np.unique(y))
    if k % c == 0:
        parts = make_partition(y, k, "one_class", seed=seed)
    elif c % k == 0:
        base = make_partition(y, c, "one_class", seed=seed)
        g = c // k
        parts = [np.sort(np.concatenate(base[i * g:(i + 1) * g])) for i in range(k)]
    else:
        raise ValueError(f"non-IID split with num_clients={k} and {c} classes: num_clients must be a multiple "
                         f"or a divisor of {c}")
    if min(len(p) for p in parts) < 2:
        raise ValueError(f"non-IID split with num_clients={k}: a client holds < 2 points (Eq. 10 needs 2)")
    return parts


def client_split(labels, num_clients: int, split: str, seed: int = 0) -> list[np.ndarray]:
    """``split="iid"`` (a random split, ``make_partition(..., "iid")``) or ``"non_iid"``
    (:func:`label_skew_parts`): k index arrays covering range(n)."""
    check_choice("split", split, SPLITS)
    y = np.asarray(labels).ravel()
    k = _check_int("num_clients", num_clients, 1)
    if 2 * k > len(y):
        raise ValueError(f"num_clients={k} for {len(y)} points: each client needs >= 2 points")
    if split == "iid":
        return make_partition(y, k, "iid", seed=seed)
    return label_skew_parts(y, k, seed)


def plateau_share(objective, end: int | None = None, window: float = 0.1, min_window: int = 10) -> float:
    """Share of FedDL's total decrease of F made in the last rounds before round ``end``:

        (F[end - w] - F[end]) / (F[0] - F[end]),    w = max(ceil(window * end), min_window),

    for objective = (F(Y^0), ..., F(Y^S)) (``FedDLResult.objective``; F can be negative, so the
    change is measured against the total decrease, not against |F|). ``end`` defaults to S. NaN
    when fewer than w rounds ran; inf when F did not decrease."""
    F = np.asarray(objective, dtype=np.float64).ravel()
    end = len(F) - 1 if end is None else _check_int("end", end, 1)
    if end >= len(F):
        raise ValueError(f"end must be <= {len(F) - 1} (the rounds in objective), got {end}")
    if not 0 < window <= 1:
        raise ValueError(f"window must be a fraction in (0, 1], got {window!r}")
    min_window = _check_int("min_window", min_window, 1)
    w = max(math.ceil(window * end), min_window)
    if w > end:
        return math.nan
    total = F[0] - F[end]
    if not total > 0:
        return math.inf
    return float((F[end - w] - F[end]) / total)


def plateau_round(objective, tol: float = 0.01, window: float = 0.1, min_window: int = 10) -> int | None:
    """The first round S at which FedDL's objective has plateaued: :func:`plateau_share` <= ``tol``
    (the last max(10 %, ``min_window``) rounds made at most ``tol`` of the total decrease). None if
    no round of ``objective`` qualifies."""
    tol = _check_real("tol", tol)
    F = np.asarray(objective, dtype=np.float64).ravel()
    for end in range(1, len(F)):
        share = plateau_share(F, end, window, min_window)
        if np.isfinite(share) and share <= tol:
            return end
    return None


@dataclass
class FedDLTrace:
    """:func:`feddl_until_plateau`: ``result`` = the run as one :class:`FedDLResult` (landmarks,
    Y^0, per-round objective and step norms, bytes as one long run would count them), ``landmarks``
    {round: (n_y, m)} at round 0 and every chunk end, ``plateau`` (first round meeting the rule, or
    None), ``rounds`` = S run."""

    result: FedDLResult
    landmarks: dict
    plateau: int | None
    rounds: int

    @property
    def objective(self) -> np.ndarray:
        return self.result.objective

    @property
    def gamma(self) -> float:
        return self.result.gamma

    @property
    def seconds(self) -> float:
        return self.result.seconds


def feddl_until_plateau(client_data: Sequence, n_landmarks: int = 500, *, tol: float = 0.01, window: float = 0.1,
                        min_window: int = 10, check_every: int = 25, max_rounds: int = 1000,
                        checkpoints: Sequence[int] = (), stop_at_plateau: bool = True, seed: int = 0,
                        **feddl_kwargs) -> FedDLTrace:
    """Noise-free FedDL run in chunks until :func:`plateau_round` finds a plateau (checked at every
    multiple of ``check_every``) or ``max_rounds`` (always ``max_rounds`` with ``stop_at_plateau=False``;
    the plateau is then only reported). Each chunk restarts :func:`feddl` from the last landmarks
    with the first chunk's gamma and step: the same deterministic gradient descent as one long run
    (the chunks' objectives, step norms and bytes are joined as that run counts them). Landmarks are
    kept at round 0, every chunk end and every round in ``checkpoints`` (<= max_rounds). Returns a
    :class:`FedDLTrace`."""
    if feddl_kwargs.get("noise", "none") != "none":
        raise ValueError("feddl_until_plateau runs noise-free FedDL only (noise='none'); a noisy objective has "
                         "no plateau to detect")
    if "rounds" in feddl_kwargs:
        raise ValueError("rounds is set by feddl_until_plateau (max_rounds, check_every)")
    check_every = _check_int("check_every", check_every, 1)
    max_rounds = _check_int("max_rounds", max_rounds, 1)
    _check_real("tol", tol)
    stops = sorted({int(c) for c in checkpoints} | set(range(check_every, max_rounds + 1, check_every))
                   | {max_rounds})
    if stops[0] < 1 or stops[-1] > max_rounds:
        raise ValueError(f"checkpoints must lie in 1..max_rounds={max_rounds}, got {sorted(checkpoints)}")
    kw = dict(feddl_kwargs)
    done, chunks, kept, plateau = 0, [], {}, None
    for stop in stops:
        res = feddl(client_data, n_landmarks, rounds=stop - done, seed=seed, **kw)
        if not chunks:
            kept[0] = res.init_landmarks
            kw.update(gamma=res.gamma, lr=res.lr, server_lr=res.server_lr)
        kw["init"] = res.landmarks
        chunks.append(res)
        done = stop
        kept[done] = res.landmarks
        if done % check_every == 0 or done == max_rounds:
            objective = np.concatenate([chunks[0].objective] + [c.objective[1:] for c in chunks[1:]])
            plateau = plateau_round(objective, tol, window, min_window)
            if plateau is not None and stop_at_plateau:
                break
    first, last = chunks[0], chunks[-1]
    later = chunks[1:]
    from dataclasses import replace

    result = replace(
        last, init_landmarks=first.init_landmarks,
        objective=np.concatenate([first.objective] + [c.objective[1:] for c in later]),
        step_sq_norms=np.concatenate([c.step_sq_norms for c in chunks]),
        upload_bytes=int(first.upload_bytes + sum(c.upload_bytes - c.setup_upload_bytes for c in later)),
        setup_upload_bytes=first.setup_upload_bytes,
        broadcast_bytes=int(sum(c.broadcast_bytes for c in chunks) - len(later) * len(client_data) * last.landmarks.nbytes),
        seconds=float(sum(c.seconds for c in chunks)))
    return FedDLTrace(result=result, landmarks=kept, plateau=plateau, rounds=done)


def plateau_rounds(client_data: Sequence, n_landmarks: int, *, max_rounds: int = 1000, seed: int = 0,
                   **feddl_kwargs) -> int:
    """Rounds S after which noise-free FedDL's objective has plateaued (:func:`feddl_until_plateau`);
    raises RuntimeError naming ``max_rounds`` when it has not within them."""
    trace = feddl_until_plateau(client_data, n_landmarks, max_rounds=max_rounds, seed=seed, **feddl_kwargs)
    if trace.plateau is None:
        raise RuntimeError(f"FedDL did not plateau within max_rounds={max_rounds}: raise max_rounds")
    return trace.rounds


def _knn_lists(A, k: int, metric: str = "euclidean") -> np.ndarray:
    from sklearn.neighbors import NearestNeighbors

    return NearestNeighbors(n_neighbors=k, metric=metric).fit(A).kneighbors(return_distance=False)


def _list_overlap(a: np.ndarray, b: np.ndarray) -> float:
    """Mean over rows of |a_i ∩ b_i| / k for two (n, k) neighbour lists (rows without repeats)."""
    s = np.sort(np.concatenate([a, b], axis=1), axis=1)
    return float((s[:, 1:] == s[:, :-1]).sum(1).mean() / a.shape[1])


class EmbeddingScorer:
    """The paper's embedding metrics (``fedlib.evaluation.embedding``: CA k-NN, NPA k-NN, NMI, SC) for
    one dataset X (n, m), labels (n,), with the high-dimensional k-NN lists computed once and reused
    for every embedding (``embedding_report`` recomputes them each time; the values are equal).

    ``scorer(Z, seed)`` -> dict of metrics; ``scorer.distance_quality(D_hat)`` -> relative Frobenius
    error of an estimated distance matrix (n, n) and the 10-NN overlap of its neighbours with the exact
    ones; ``scorer.release()`` frees the cached exact distance matrix."""

    def __init__(self, X, labels, ks: Sequence[int] | None = None):
        from fedlib.evaluation import embedding as em

        self._em = em
        self.X = _as_matrix("X", X)
        self.y = np.asarray(labels).ravel()
        if len(self.y) != len(self.X):
            raise ValueError(f"labels has {len(self.y)} entries, X has {len(self.X)} rows")
        self.ks = tuple(em.PAPER_KS if ks is None else ks)
        if max(self.ks) >= len(self.X):
            raise ValueError(f"ks must be < the number of points ({len(self.X)}), got {self.ks}")
        self.n_classes = len(np.unique(self.y))
        self.nn = _knn_lists(self.X, max(max(self.ks), 10))
        self._D = None

    def exact_distances(self) -> np.ndarray:
        if self._D is None:
            self._D = np.sqrt(sq_distances(self.X))
        return self._D

    def release(self) -> None:
        self._D = None

    def __call__(self, Z, seed: int = 0) -> dict:
        from sklearn.metrics import silhouette_score

        em = self._em
        Z = _as_matrix("Z", Z)
        out = {f"CA {k}-NN": em.knn_accuracy(Z, self.y, k, seed=seed) for k in self.ks}
        nz = _knn_lists(Z, max(self.ks))
        out.update({f"NPA {k}-NN": _list_overlap(self.nn[:, :k], nz[:, :k]) for k in self.ks})
        pred = em.kmeans_labels(Z, self.n_classes, seed=seed)
        out["NMI"] = em.clustering_nmi(self.y, pred)
        out["SC"] = float(silhouette_score(Z, pred))
        return out

    def distance_quality(self, D_hat, k: int = 10) -> dict:
        D_hat = np.asarray(D_hat, dtype=np.float64)
        if D_hat.shape != (len(self.X), len(self.X)):
            raise ValueError(f"D_hat must be ({len(self.X)}, {len(self.X)}), got {D_hat.shape}")
        D = self.exact_distances()
        return {"D-hat rel. error": float(np.linalg.norm(D_hat - D) / np.linalg.norm(D)),
                f"D-hat {k}-NN": _list_overlap(self.nn[:, :k], _knn_lists(D_hat, k, "precomputed"))}
