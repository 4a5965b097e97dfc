"""Beyond the STSA paper: what the aggregated statistics also allow.

1. **Ridge gamma by generalized cross-validation (GCV) from the statistics alone.** With
   G = Phi^T Phi = V diag(lambda) V^T (one symmetric eigendecomposition), C_hat = V^T C and
   a_i = ||C_hat[i, :]||^2, every quantity of the ridge path is a sum over the M eigenpairs:

       W_gamma   = V diag(1 / (lambda + gamma)) C_hat                               (path)
       tr H      = sum_i lambda_i / (lambda_i + gamma)                               (trace)
       RSS       = tr(Y^T Y) - sum_i a_i (lambda_i + 2 gamma) / (lambda_i + gamma)^2  (residual)
       GCV       = N RSS / (N - tr H)^2                       (Golub, Heath & Wahba 1979)

   so once G is decomposed (O(M^3), once per stage) each gamma costs O(M) (O(M c) for a_i, once).
   With one-hot targets tr(Y^T Y) = N = the number of samples: the clients add their class counts
   n (c_t numbers) to the STSA upload, the only extra bytes. :class:`RidgePath` implements it,
   :func:`gcv_bruteforce` is the reference from the raw rows (SVD of Phi and an augmented lstsq).
2. **A calibrated Gaussian mechanism for the uploads.** Each client clips its rows to ||phi|| <= B
   (:func:`clip_features`, enforced), so adding or removing one sample moves G by phi phi^T
   (Frobenius norm ||phi||^2 <= B^2), C by phi e_y^T (norm ||phi|| <= B) and the counts n by e_y
   (norm 1). Gaussian noise of sd z B^2, z B and z (noise multiplier z) on the three makes the
   upload one composition of three Gaussian mechanisms of multiplier z, i.e. one Gaussian mechanism
   of multiplier z / sqrt(3) (:func:`upload_epsilon`; accounted by :mod:`fedlib.core.privacy`,
   dp-accounting). The server projects the noisy G onto the PSD cone (eigenvalues clipped at 0,
   the nearest PSD matrix in Frobenius norm) before the ridge solve, which :class:`RidgePath` does
   with ``psd=True`` on the same eigendecomposition as GCV.

Both run on the library's one protocol: :class:`StatsClient` (an :class:`~fedlib.stsa.algorithm.STSAClient`
that also uploads n, and optionally clips and adds the calibrated noise) and :class:`PathServer`
(an :class:`~fedlib.stsa.algorithm.STSAServer` that also sums n and solves through :class:`RidgePath`,
gamma fixed or by GCV), driven by :func:`fedlib.core.protocol.simulate` stage by stage.
"""
from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd
import torch
from torch import Tensor
from tqdm.auto import tqdm

from fedlib.core import privacy, uploads
from fedlib.core.linalg import SufficientStats, as_tensor, lstsq_reference, ridge_solve
from fedlib.core.messages import Cost, Message
from fedlib.core.protocol import Broadcaster, ClientStates, simulate
from fedlib.core.seeds import torch_generator
from fedlib.core.validate import check_choice, check_int, check_positive
from fedlib.data.partition import make_partition
from fedlib.data.streams import make_stream
from fedlib.evaluation.stats import mean_std, paired_difference
from fedlib.federated.incremental import accuracy_matrix_metrics
from fedlib.stsa.algorithm import RandomFeatures, StagewiseLearner, STSAClient, STSAServer, predict
from fedlib.stsa.noise import add_upload_noise

__all__ = ["GAMMA_RULES", "AGGREGATIONS", "check_gamma_grid", "gamma_grid", "RidgePath", "gcv_bruteforce",
           "clip_features", "privatize_upload", "upload_sigmas", "upload_epsilon", "composed_gaussian_epsilon",
           "calibrate_upload", "StatsClient", "PathServer", "PathLearner", "grid_accuracy", "gcv_check",
           "noise_check", "vanishing_noise_check", "seed_statistics", "standard_noise", "beyond_study", "gcv_study", "gcv_paired", "dp_study", "dp_summary", "counts_bytes"]

GAMMA_RULES = ("fixed", "gcv")
AGGREGATIONS = ("local", "secure")   # noise on every upload, or split over the K clients under secure aggregation
RELEASES_PER_UPLOAD = 3              # G, C and n: three Gaussian mechanisms per client and stage


# ----------------------------------------------------------------------------------------------
# 1. the ridge path and GCV from one eigendecomposition
# ----------------------------------------------------------------------------------------------
def check_gamma_grid(gammas, name: str = "gamma_grid") -> np.ndarray:
    """``gammas`` as a float64 array: non-empty, every value finite and > 0, else ValueError naming ``name``."""
    g = np.atleast_1d(np.asarray(gammas, dtype=np.float64)).ravel()
    if g.size == 0:
        raise ValueError(f"{name} is empty: give at least one ridge coefficient gamma > 0")
    if not np.all(np.isfinite(g)) or np.any(g <= 0):
        raise ValueError(f"{name} must hold finite values > 0, got {np.asarray(gammas).tolist()}")
    return g


def gamma_grid(low: float, high: float, num: int) -> np.ndarray:
    """``num`` log-spaced gammas from ``low`` to ``high`` (both > 0, low <= high)."""
    low, high = check_positive("gamma_min", low), check_positive("gamma_max", high)
    num = check_int("gamma_points", num, 1)
    if high < low:
        raise ValueError(f"gamma_max = {high} must be >= gamma_min = {low}")
    return np.geomspace(low, high, num)


class RidgePath:
    """The whole ridge path of one set of statistics from ONE symmetric eigendecomposition.

    gram G (M, M), xty C (M, c), ``n`` = N the number of samples, ``yty`` = tr(Y^T Y) (default N:
    one-hot targets). ``psd=True`` projects G onto the PSD cone first (eigenvalues clipped at 0: the
    nearest PSD matrix in Frobenius norm, Higham 1988), the PSD-safe solve of noisy statistics;
    ``negative`` counts the eigenvalues clipped. Every method takes one gamma or an array of them.
    """

    def __init__(self, gram: Tensor, xty: Tensor, n: float, yty: float | None = None, psd: bool = False):
        gram = as_tensor(gram)
        xty = as_tensor(xty)
        if gram.ndim != 2 or gram.shape[0] != gram.shape[1] or xty.shape[0] != gram.shape[0]:
            raise ValueError(f"gram must be (M, M) and xty (M, c), got {tuple(gram.shape)} and {tuple(xty.shape)}")
        lam, vec = torch.linalg.eigh((gram + gram.T) / 2)
        self.negative = int((lam < 0).sum()) if psd else 0
        self.lam = lam.clamp_min(0.0) if psd else lam            # (M,)
        self.vec = vec                                           # (M, M), columns = eigenvectors
        self.chat = vec.T @ xty                                  # (M, c) = V^T C
        self.a = (self.chat ** 2).sum(1)                         # (M,)  a_i = ||C_hat[i, :]||^2
        self.n = float(n)
        self.yty = float(n if yty is None else yty)
        self.psd = psd

    def _g(self, gammas) -> Tensor:
        return torch.as_tensor(np.atleast_1d(np.asarray(gammas, dtype=np.float64)), dtype=self.lam.dtype,
                               device=self.lam.device)[:, None]

    def weights(self, gamma: float) -> Tensor:
        """W_gamma = V diag(1/(lambda + gamma)) V^T C (M, c): the ridge head (the path equation)."""
        return self.vec @ (self.chat / (self.lam + float(gamma))[:, None])

    def trace_hat(self, gammas) -> np.ndarray:
        """tr H_gamma = tr(G (G + gamma I)^{-1}) = sum_i lambda_i / (lambda_i + gamma), per gamma."""
        g = self._g(gammas)
        return (self.lam / (self.lam + g)).sum(1).cpu().numpy()

    def rss(self, gammas) -> np.ndarray:
        """||Y - Phi W_gamma||_F^2 = tr(Y^T Y) - sum_i a_i (lambda_i + 2 gamma)/(lambda_i + gamma)^2, per gamma."""
        g = self._g(gammas)
        return (self.yty - (self.a * (self.lam + 2 * g) / (self.lam + g) ** 2).sum(1)).cpu().numpy()

    def gcv(self, gammas) -> np.ndarray:
        """GCV(gamma) = N RSS / (N - tr H)^2 per gamma. Where the (noisy) statistics give RSS <= 0 or
        tr H >= N the criterion is undefined and returned as +inf (never selected)."""
        rss, tr = self.rss(gammas), self.trace_hat(gammas)
        ok = (rss > 0) & (tr < self.n)
        out = np.full(rss.shape, np.inf)
        out[ok] = self.n * rss[ok] / (self.n - tr[ok]) ** 2
        return out

    def select(self, gammas, fallback: bool = False) -> tuple[float, np.ndarray]:
        """The gamma of ``gammas`` (the grid, non-empty, > 0) that minimizes GCV, and GCV on the grid.
        Where GCV is undefined at every gamma (noisy statistics: RSS <= 0 or tr H >= N everywhere),
        ``fallback=True`` returns the largest gamma of the grid with a RuntimeWarning; otherwise ValueError."""
        grid = check_gamma_grid(gammas)
        values = self.gcv(grid)
        if not np.isfinite(values).any():
            if not fallback:
                raise ValueError("GCV is undefined at every gamma of the grid (RSS <= 0 or tr H >= N): widen gamma_grid")
            warnings.warn("GCV is undefined at every gamma of the grid (the noise dominates the statistics); "
                          "using the largest gamma of the grid", RuntimeWarning, stacklevel=2)
            return float(grid.max()), values
        return float(grid[int(np.argmin(values))]), values


def gcv_bruteforce(phi, labels, num_classes: int, gammas) -> dict:
    """The reference GCV from the raw pooled rows phi (N, M) and labels (N,), never from G = Phi^T Phi:
    W_gamma by NumPy ``lstsq`` on [Phi; sqrt(gamma) I] W = [Y; 0] (:func:`~fedlib.core.linalg.lstsq_reference`),
    RSS = ||Y - Phi W||_F^2, tr H = sum_j s_j^2 / (s_j^2 + gamma) with s the singular values of Phi.
    Returns {"gcv", "rss", "trace"} arrays over ``gammas``."""
    grid = check_gamma_grid(gammas, "gammas")
    x = np.asarray(phi.cpu() if isinstance(phi, Tensor) else phi, dtype=np.float64)
    lab = np.asarray(labels)
    y = np.eye(num_classes)[lab]
    s2 = np.linalg.svd(x, compute_uv=False) ** 2
    n = x.shape[0]
    rss = np.array([((y - x @ lstsq_reference(x, lab, num_classes, lam=g).numpy()) ** 2).sum() for g in grid])
    trace = np.array([(s2 / (s2 + g)).sum() for g in grid])
    return {"gcv": n * rss / (n - trace) ** 2, "rss": rss, "trace": trace}


# ----------------------------------------------------------------------------------------------
# 2. the calibrated Gaussian mechanism
# ----------------------------------------------------------------------------------------------
def clip_features(phi: Tensor, clip_norm: float) -> Tensor:
    """phi (N, M) with every row of norm > B scaled down to norm B (B = ``clip_norm`` > 0, public):
    phi_i min(1, B / ||phi_i||). Enforces ||phi_i|| <= B, on which the sensitivities rest."""
    clip_norm = check_positive("clip_norm (B)", clip_norm)
    phi = as_tensor(phi, torch.float64, phi.device if isinstance(phi, Tensor) else "cpu")
    norms = torch.linalg.vector_norm(phi, dim=1)
    return phi * torch.clamp(clip_norm / norms.clamp_min(1e-300), max=1.0)[:, None]


def upload_sigmas(noise_multiplier: float, clip_norm: float) -> dict[str, float]:
    """Noise sd per statistic for noise multiplier z: {"G": z B^2, "C": z B, "n": z}: z times the
    add/remove-one l2 sensitivities ||phi phi^T||_F = ||phi||^2 <= B^2, ||phi e_y^T||_F <= B, ||e_y|| = 1."""
    z = check_positive("noise_multiplier", noise_multiplier, strict=False)
    b = check_positive("clip_norm (B)", clip_norm)
    return {"G": z * b * b, "C": z * b, "n": z}


def privatize_upload(msg: Message, noise_multiplier: float, clip_norm: float, generator: torch.Generator) -> Message:
    """The Gaussian mechanism on one {G, C, n} upload (rows already clipped to B): N(0, sigma^2) with
    the sigmas of :func:`upload_sigmas`, drawn by the paper's noise routine
    :func:`fedlib.stsa.noise.add_upload_noise` (q = sigma, s = 1). G's noise is symmetric:
    (E + E^T)/sqrt(2), sd sigma off the diagonal and sqrt(2) sigma on it, i.e. the release of G's
    upper triangle with at least sd sigma per entry (whose sensitivity is <= ||phi phi^T||_F <= B^2)."""
    out = msg
    for key, sigma in upload_sigmas(noise_multiplier, clip_norm).items():
        out = add_upload_noise(out, sigma, 1.0, generator, entries=(key,))
    return out


def composed_gaussian_epsilon(noise_multipliers: Sequence[float], delta: float) -> float:
    """Exact epsilon at ``delta`` of the composition of Gaussian mechanisms of multipliers z_i: it is ONE
    Gaussian mechanism of multiplier (sum_i z_i^-2)^(-1/2) (Gaussian DP, Dong, Roth & Su 2022), whose
    epsilon is the analytic one (Balle & Wang 2018; :func:`fedlib.core.privacy.analytic_gaussian_epsilon`).
    Valid for every z > 0, including the tiny multipliers where the PLD accountant's grid is useless."""
    z = np.asarray(noise_multipliers, dtype=np.float64).ravel()
    if z.size == 0 or np.any(~np.isfinite(z)) or np.any(z < 0):
        raise ValueError(f"noise_multipliers must be finite and >= 0, got {noise_multipliers!r}")
    if np.any(z == 0):
        return math.inf
    return privacy.analytic_gaussian_epsilon(float(np.sum(z ** -2.0) ** -0.5), delta)


def upload_epsilon(noise_multiplier: float, delta: float, stages: int = 1, accountant: str = "pld") -> float:
    """epsilon at ``delta`` of one client's uploads with noise multiplier z on G, C and n: 3 Gaussian
    releases per stage, composed over ``stages`` (1: a record belongs to one stage's data, as in
    class-incremental learning; T: a record that takes part in every stage), by ``accountant``."""
    stages = check_int("stages", stages, 1)
    return privacy.gaussian_epsilon(noise_multiplier, delta, RELEASES_PER_UPLOAD * stages, accountant)


def calibrate_upload(epsilon: float, delta: float, stages: int = 1) -> float:
    """The noise multiplier z whose ``3 stages`` releases (G, C, n per stage) are (epsilon, delta)-DP,
    exactly: the composition is one Gaussian mechanism of multiplier z / sqrt(3 stages)
    (:func:`composed_gaussian_epsilon`), so z = sqrt(3 stages) sigma_1(epsilon, delta) with sigma_1 the
    analytic Gaussian calibration of one release (Balle & Wang 2018, dp-accounting's
    ``get_sigma_gaussian`` through :func:`fedlib.core.privacy.analytic_gaussian_sigma`). The accountant's
    epsilon of the result (:func:`upload_epsilon`) is checked against it in the tests and the chapter."""
    stages = check_int("stages", stages, 1)
    return math.sqrt(RELEASES_PER_UPLOAD * stages) * privacy.analytic_gaussian_sigma(epsilon, delta)


# ----------------------------------------------------------------------------------------------
# the protocol: client, server, learner
# ----------------------------------------------------------------------------------------------
@dataclass
class StatsClient(STSAClient):
    """STSA's client plus the class counts n (c_t,) in the upload ({G, C, n}, all float64), optionally
    with its rows clipped to ``clip_norm`` = B (then also at prediction: the clip is part of the feature
    map) and the calibrated Gaussian mechanism of noise multiplier ``noise_multiplier`` z
    (:func:`privatize_upload`, noise drawn from ``torch_generator(seed, "dp_noise", t, k)``).
    ``noise_share`` scales every sd: 1 (each upload is private) or 1/sqrt(K) (secure aggregation:
    the K noises add up to multiplier z in the sum the server sees). ``noise=(q, s)`` adds the
    paper's uncalibrated q N(0, s^2) to ``noise_entries`` instead (the paper's earlier version, Table 7)."""

    clip_norm: float | None = None
    noise_multiplier: float = 0.0
    noise_share: float = 1.0

    def __post_init__(self):
        if self.clip_norm is not None:
            check_positive("clip_norm (B)", self.clip_norm)
        check_positive("noise_multiplier", self.noise_multiplier, strict=False)
        check_positive("noise_share", self.noise_share)
        if self.noise_multiplier > 0 and self.clip_norm is None:
            raise ValueError("a calibrated noise_multiplier > 0 needs clip_norm (B) > 0: without clipping the "
                             "sensitivity is unbounded")

    def step(self, data, state: dict, broadcast: Message) -> Message:
        x, y = data
        features = self._features(state, int(x.shape[1]), broadcast)
        t, k, name = int(broadcast["stage"]), state["k"], state["name"]
        labels, c_t = np.asarray(y) - int(broadcast["offset"]), int(broadcast["num_classes"])
        phi = features(x)
        if self.clip_norm is not None:
            phi = clip_features(phi, self.clip_norm)
        stats = SufficientStats.from_data(phi, labels, c_t, device=phi.device)
        counts = torch.from_numpy(np.bincount(labels, minlength=c_t).astype(np.float64)).to(phi.device)
        msg = Message(name, {"G": stats.gram, "C": stats.xty, "n": counts})
        if self.noise_multiplier > 0:
            msg = privatize_upload(msg, self.noise_multiplier * self.noise_share, self.clip_norm,
                                   torch_generator(self.seed, "dp_noise", t, k))
        if self.noise is not None:
            msg = add_upload_noise(msg, *self.noise, generator=torch_generator(self.seed, "upload_noise", t, k),
                                   entries=self.noise_entries)
        return msg


class PathServer(STSAServer):
    """STSA's server (spatial and temporal sums, eqs. 2 and 4) that also sums the counts n and solves
    through one :class:`RidgePath` per stage: gamma fixed (``gamma_rule="fixed"``) or the GCV minimizer
    over ``grid`` (``"gcv"``); ``psd=True``: PSD-projected G (noisy uploads). ``chosen``: gamma per
    stage; ``path``: the last stage's :class:`RidgePath`."""

    def __init__(self, dim: int, num_classes: int, gamma: float | None = None, gamma_rule: str = "gcv", grid=None,
                 psd: bool = False, device: str | torch.device = "cpu"):
        """``psd``: noisy uploads (G projected to PSD; the counts n are then any real numbers)."""
        check_choice("gamma_rule", gamma_rule, GAMMA_RULES)
        if gamma_rule == "fixed":
            gamma = check_positive("gamma", gamma)
        else:
            grid = check_gamma_grid(grid)
        super().__init__(dim, num_classes, gamma if gamma is not None else 0.0, "stsa", device=device, noisy_counts=psd)
        self.gamma_rule, self.grid, self.psd = gamma_rule, grid, bool(psd)
        self.counts = torch.zeros(num_classes, dtype=torch.float64, device=device)
        self.chosen: list[float] = []
        self.path: RidgePath | None = None
        self.gcv_values: np.ndarray | None = None

    def upload_form(self) -> dict:
        return {**super().upload_form(), "n": self.counts_entry(("c",))}

    def absorb(self, messages: Sequence[Message]) -> None:
        super().absorb(messages)
        n_t = sum(u["n"].to(self.counts) for u in messages)
        offset = self.payload["offset"]
        self.counts[offset:offset + n_t.shape[0]] += n_t

    def solve(self, num_seen: int) -> Tensor:
        """Decompose G_{1:t} once (:class:`RidgePath`), pick gamma, return W (M, num_seen)."""
        n = float(self.counts[:num_seen].sum())
        self.path = RidgePath(self.gram, self.xty[:, :num_seen], n, psd=self.psd)
        if self.gamma_rule == "gcv":   # noisy statistics (psd): fall back to the largest gamma where GCV is undefined
            gamma, self.gcv_values = self.path.select(self.grid, fallback=self.psd)
        else:
            gamma = self.gamma
        self.chosen.append(gamma)
        return self.path.weights(gamma)


class PathLearner(StagewiseLearner):
    """STSA on :class:`StatsClient` / :class:`PathServer` as an
    :class:`~fedlib.federated.incremental.IncrementalLearner`: gamma fixed or by GCV per stage,
    optional clipping to ``clip_norm`` and calibrated noise of multiplier ``noise_multiplier``
    (``aggregation="secure"``: each client's sd divided by sqrt(K)), or the paper's ``noise=(q, s)``.
    ``cost``: measured bytes and seconds of all stages."""

    def __init__(self, in_dim: int, num_classes: int, M: int, gamma: float | None = None, gamma_rule: str = "gcv",
                 grid=None, clip_norm: float | None = None, noise_multiplier: float = 0.0,
                 aggregation: str = "local", noise: tuple[float, float] | None = None, rf_seed: int = 0,
                 seed: int = 0, device: str | torch.device = "cpu", name: str | None = None, on_stage_end=()):
        check_choice("aggregation", aggregation, AGGREGATIONS)
        self.features = RandomFeatures(in_dim, M, rf_seed, device)
        noisy = noise_multiplier > 0 or noise is not None
        self.server = PathServer(M, num_classes, gamma, gamma_rule, grid, psd=noisy, device=device)
        self.clip_norm, self.aggregation = clip_norm, aggregation
        self.name = name or f"STSA ({gamma_rule} gamma)"
        self.weights: Tensor | None = None
        client = StatsClient(seed=seed, noise=noise, clip_norm=clip_norm, noise_multiplier=noise_multiplier,
                             device=device)
        self._init_protocol(client, rf_seed, M, on_stage_end)

    def learn_task(self, t: int, clients, num_seen: int) -> Cost:
        if self.aggregation == "secure":
            self.client.noise_share = 1.0 / math.sqrt(len(clients))
        cost = self._run_stage(self.server, t, clients, num_seen)
        self.weights = self.server.result()
        self._stage_end(t)
        return cost

    def phi(self, x) -> Tensor:
        """The feature map the clients use: R, then the clip when ``clip_norm`` is set."""
        phi = self.features(x)
        return clip_features(phi, self.clip_norm) if self.clip_norm is not None else phi

    def predict(self, x, num_seen: int) -> Tensor:
        return predict(self.weights[:, :num_seen], self.phi(x))


def counts_bytes(num_clients: int, classes_per_task: Sequence[int], bytes_per_float: int = 8) -> int:
    """Bytes GCV adds to STSA's uploads: each client's counts n (c_t floats) at every stage."""
    return int(num_clients) * int(sum(classes_per_task)) * bytes_per_float


# ----------------------------------------------------------------------------------------------
# the chapter's studies (notebooks/stsa_beyond.py)
# ----------------------------------------------------------------------------------------------
def grid_accuracy(path: RidgePath, phi_test: Tensor, positions: np.ndarray, groups: Sequence[np.ndarray],
                  gammas) -> np.ndarray:
    """Accuracy of the head W_gamma of ``path`` (eq. path) for every gamma of ``gammas`` on each index group
    of ``groups`` (e.g. the test samples of each task seen): all heads in one (M, len(gammas) c) matrix,
    all scores in one product with phi_test (N', M). Returns (len(gammas), len(groups))."""
    g = torch.as_tensor(np.asarray(gammas, dtype=np.float64), dtype=path.lam.dtype, device=path.lam.device)
    c = path.chat.shape[1]
    scaled = path.chat[None, :, :] / (path.lam[None, :, None] + g[:, None, None])        # (G, M, c)
    heads = path.vec @ scaled.permute(1, 0, 2).reshape(path.vec.shape[0], -1)              # (M, G c)
    scores = (phi_test.to(path.vec) @ heads).reshape(phi_test.shape[0], len(g), c)        # (N', G, c)
    hits = (scores.argmax(2).cpu().numpy() == np.asarray(positions)[:, None])              # (N', G)
    return np.stack([hits[idx].mean(0) for idx in groups], axis=1)


def _groups(stream, t: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """Test indices of the tasks seen after stage t, and each task's positions inside them."""
    idx = np.concatenate([stream.tasks[tau].test_idx for tau in range(t + 1)])
    sizes = np.cumsum([0] + [len(stream.tasks[tau].test_idx) for tau in range(t + 1)])
    return idx, [np.arange(a, b) for a, b in zip(sizes[:-1], sizes[1:])]


def gcv_check(features, beta: float, seed: int, *, num_clients: int, M: int, samples: int, gammas,
              device: str | torch.device = "cpu") -> dict:
    """The GCV identity on real features: ``samples`` training rows (a seeded draw), split over
    ``num_clients`` clients by Dirichlet(``beta``) label skew, one STSA round through the protocol
    (:class:`StatsClient` -> :class:`PathServer`: summed G, C, n), GCV from the server's statistics
    against :func:`gcv_bruteforce` on the pooled raw rows. Also times one eigendecomposition, GCV at
    1000 gammas from it, and one Cholesky ridge solve (:func:`~fedlib.core.linalg.ridge_solve`) for
    comparison. Returns {"table": per gamma GCV / RSS / tr H both ways and relative errors,
    "max_rel": largest relative error, "seconds": timings, "kappa": cond(G + gamma I) per gamma}."""
    gammas = check_gamma_grid(gammas, "check_gammas")
    rng = np.random.default_rng(seed)
    rows = rng.choice(len(features.y_train), size=min(int(samples), len(features.y_train)), replace=False)
    x, y = features.x_train[rows], np.asarray(features.y_train)[rows]
    c = len(features.classes)
    parts = make_partition(y, num_clients, "dirichlet", alpha=beta, seed=seed)
    server = PathServer(M, c, gamma_rule="gcv", grid=gammas, device=device)
    server.begin_stage(rf_seed=seed, M=M, stage=0, offset=0, num_classes=c)
    simulate(server, StatsClient(seed=seed, device=device), [(torch.from_numpy(x[p]), torch.from_numpy(y[p]))
                                                              for p in parts], rounds=1)
    t0 = time.perf_counter()
    server.solve(c)
    path = server.path
    t_eig = time.perf_counter() - t0
    many = np.geomspace(gammas.min(), gammas.max(), 1000)
    t0 = time.perf_counter()
    path.gcv(many)
    t_gcv = (time.perf_counter() - t0) / len(many)
    t0 = time.perf_counter()
    ridge_solve(server.gram, server.xty, float(gammas[0]))
    t_chol = time.perf_counter() - t0
    phi = RandomFeatures(x.shape[1], M, seed, device)(x)
    ref = gcv_bruteforce(phi, y, c, gammas)
    lam = path.lam
    table = pd.DataFrame({"gamma": gammas, "GCV (statistics)": path.gcv(gammas), "GCV (raw rows)": ref["gcv"],
                          "rel. err. GCV": np.abs(path.gcv(gammas) / ref["gcv"] - 1),
                          "rel. err. RSS": np.abs(path.rss(gammas) / ref["rss"] - 1),
                          "rel. err. tr H": np.abs(path.trace_hat(gammas) / ref["trace"] - 1),
                          "cond(G + gamma I)": [float((lam.max() + g) / (lam.min().clamp_min(0) + g)) for g in gammas]})
    return {"table": table, "max_rel": float(table[["rel. err. GCV", "rel. err. RSS", "rel. err. tr H"]].max().max()),
            "seconds": {"one eigendecomposition of G (s)": t_eig, "GCV per gamma from it (s)": t_gcv,
                        "one Cholesky ridge solve (s)": t_chol}, "n": len(y)}


def noise_check(noise_multiplier: float, clip_norm: float, M: int, entries: int, seed: int = 0):
    """Empirical sd of :func:`privatize_upload`'s noise on a zero upload (G (M, M), C (M, entries / M),
    n (entries,)) against z times each sensitivity. Returns a DataFrame: statistic, sd wanted, sd measured."""
    cols = max(1, int(entries) // int(M))
    zero = Message("check", {"G": torch.zeros(M, M, dtype=torch.float64), "C": torch.zeros(M, cols, dtype=torch.float64),
                             "n": torch.zeros(int(entries), dtype=torch.float64)})
    out = privatize_upload(zero, noise_multiplier, clip_norm, torch_generator(seed, "noise_check"))
    sig = upload_sigmas(noise_multiplier, clip_norm)
    upper = torch.triu(torch.ones(M, M, dtype=torch.bool), 1)
    rows = [("G, off the diagonal (sensitivity B^2)", sig["G"], float(out["G"][upper].std())),
            ("G, diagonal (sqrt(2) B^2: (E + E^T)/sqrt(2))", math.sqrt(2) * sig["G"], float(torch.diagonal(out["G"]).std())),
            ("C (sensitivity B)", sig["C"], float(out["C"].std())), ("n (sensitivity 1)", sig["n"], float(out["n"].std()))]
    table = pd.DataFrame(rows, columns=["statistic", "sd wanted", "sd measured"])
    table["rel. difference"] = (table["sd measured"] / table["sd wanted"] - 1).abs()
    table["samples"] = [int(upper.sum()), M, M * cols, int(entries)]
    return table


def vanishing_noise_check(features, seed: int, *, M: int, samples: int, gamma: float,
                          device: str | torch.device = "cpu") -> dict:
    """The private pipeline with noise multiplier 1e-20 and B above every row norm (no clipping), one
    stage through the protocol, against the non-private STSA head (Cholesky ridge on the pooled
    statistics): {"rel. difference of the heads", "same test predictions"}."""
    rng = np.random.default_rng(seed)
    rows = rng.choice(len(features.y_train), size=min(int(samples), len(features.y_train)), replace=False)
    x, y = features.x_train[rows], np.asarray(features.y_train)[rows]
    c = len(features.classes)
    rf = RandomFeatures(x.shape[1], M, seed, device)
    phi = rf(x)
    big = 2.0 * float(torch.linalg.vector_norm(phi, dim=1).max())
    server = PathServer(M, c, gamma, gamma_rule="fixed", psd=True, device=device)
    server.begin_stage(rf_seed=seed, M=M, stage=0, offset=0, num_classes=c)
    simulate(server, StatsClient(seed=seed, clip_norm=big, noise_multiplier=1e-20, device=device),
             [(torch.from_numpy(x[p]), torch.from_numpy(y[p])) for p in np.array_split(np.arange(len(y)), 5)], rounds=1)
    w = server.solve(c)
    st = SufficientStats.from_data(phi, y, c, device=phi.device)
    ref = ridge_solve(st.gram, st.xty, gamma)
    test = rf(features.x_test)
    return {"rel. difference of the heads": float((w - ref).abs().max() / ref.abs().max()),
            "same test predictions": bool(torch.equal(predict(w, test), predict(ref, test)))}


def gcv_paired(runs, reference: str = "GCV (per stage)", metric: str = "A_T"):
    """``metric`` of ``reference`` minus every other method of ``runs``, paired by seed, 95 % t-interval:
    one row per method (formatted difference, mean, low, high, n)."""
    ref = runs[runs.method == reference].set_index("seed")[metric]
    rows = []
    for method in runs.method.unique():
        if method == reference:
            continue
        other = runs[runs.method == method].set_index("seed")[metric].loc[ref.index]
        d = paired_difference(ref.to_numpy(), other.to_numpy())
        rows.append({f"{reference} minus": method, f"{metric} difference (points)": str(d), "mean": d.mean,
                     "low": d.low, "high": d.high, "n": d.n})
    return pd.DataFrame(rows)


def _collector(payload: dict) -> Broadcaster:
    """A broadcast-only server that keeps one round's clean {G, C, n} uploads (computed once per seed)."""
    form = {"G": uploads.Tensor(("M", "M")), "C": uploads.Tensor(("M", "c")),
            "n": uploads.Tensor(("c",), low=0.0, integral=True)}
    return Broadcaster(payload, uploads.Expected((form,), {"M": payload["M"], "c": payload["num_classes"]},
                                                 what="STSA upload"))


def _sum_messages(msgs: Sequence[Message]) -> Message:
    """{G, C, n} summed over messages (what the STSA server does first with a stage's uploads)."""
    return Message("sum", {key: sum(m[key] for m in msgs) for key in ("G", "C", "n")})


def seed_statistics(features, beta: float, seed: int, *, num_tasks: int, num_clients: int, M: int,
                    clip_norms=(None,), device: str | torch.device = "cpu") -> dict:
    """One seed's class order, partitions (Dirichlet ``beta`` redrawn per task, as in
    :func:`~fedlib.federated.incremental.run_class_incremental`) and, for every clip of ``clip_norms``
    (None: no clipping), the per-stage sums of the clients' clean {G, C, n} uploads: every client runs
    :class:`StatsClient` through :func:`~fedlib.core.protocol.simulate` (bytes measured).
    Returns {"stream", "sums": {clip: [Message per stage]}, "bytes_up": {clip: int}}."""
    stream = make_stream(features.y_train, features.y_test, num_tasks, seed=seed)
    pos_train = stream.relabel(features.y_train)
    data = []
    for t in range(num_tasks):
        parts = stream.client_partitions(t, features.y_train, num_clients, beta, seed)
        data.append([(torch.from_numpy(np.ascontiguousarray(features.x_train[p])), torch.from_numpy(pos_train[p]))
                     for p in parts])
    out = {"stream": stream, "sums": {}, "bytes_up": {}}
    for clip in clip_norms:
        client = StatsClient(seed=seed, clip_norm=clip, device=device)
        states, sums, nbytes = ClientStates(client), [], 0
        for t, task in enumerate(stream.tasks):
            col = _collector({"rf_seed": seed, "M": M, "stage": t, "offset": task.offset,
                              "num_classes": task.num_classes})
            nbytes += simulate(col, client, data[t], rounds=1, states=states).bytes_up
            sums.append(_sum_messages(col.uploads))
        out["sums"][clip], out["bytes_up"][clip] = sums, nbytes
    return out


def standard_noise(seed: int, stream, num_clients: int, M: int, kind: str = "dp",
                   device: str | torch.device = "cpu") -> list[Message]:
    """Per stage, the sum over the K clients of their noise draws at unit scale, from the streams the
    client program uses: ``kind="dp"``: :func:`privatize_upload` with z = B = 1 (stream "dp_noise");
    ``"paper"``: the paper's routine with q s = 1 (stream "upload_noise"). The noise of a client with
    multiplier z and clip B is then sigma_j times these draws (sigma of :func:`upload_sigmas`), so one
    set of draws serves every epsilon and both aggregations: exactly the protocol's noise, summed."""
    check_choice("kind", kind, ("dp", "paper"))
    out = []
    for t, task in enumerate(stream.tasks):
        msgs = []
        for k in range(num_clients):
            zero = Message("zero", {"G": torch.zeros(M, M, dtype=torch.float64, device=device),
                                    "C": torch.zeros(M, task.num_classes, dtype=torch.float64, device=device),
                                    "n": torch.zeros(task.num_classes, dtype=torch.float64, device=device)})
            if kind == "dp":
                msgs.append(privatize_upload(zero, 1.0, 1.0, torch_generator(seed, "dp_noise", t, k)))
            else:
                msgs.append(add_upload_noise(zero, 1.0, 1.0, torch_generator(seed, "upload_noise", t, k),
                                             entries=("G", "C", "n")))
        out.append(_sum_messages(msgs))
    return out


def _with_noise(sums: Sequence[Message], noise: Sequence[Message], scale: dict[str, float]) -> list[Message]:
    """sums + scale[key] * noise per stage and statistic."""
    return [Message("noisy", {key: s[key] + scale[key] * e[key] for key in ("G", "C", "n")})
            for s, e in zip(sums, noise)]


def _gcv_seed(stats: dict, features, seed: int, *, M: int, grid, gammas, device) -> dict:
    """GCV per stage and every fixed gamma of ``gammas`` on one seed's unclipped clean sums
    (:func:`seed_statistics`): the server (:class:`PathServer`) takes each stage's uploads, decomposes
    once, picks gamma by GCV; the accuracy matrix A[t, tau] of the chosen gamma and of every fixed gamma
    (exact: a fixed-gamma STSA head depends only on that stage's statistics) from the same decomposition.
    Returns {"acc": (T, T), "fixed": {gamma: (T, T)}, "chosen": per stage, "gcv": GCV on ``grid`` at the
    last stage}."""
    stream = stats["stream"]
    t_count = stream.num_tasks
    pos_test = stream.relabel(features.y_test)
    phi_test = RandomFeatures(features.x_train.shape[1], M, seed, device)(features.x_test)
    server = PathServer(M, len(features.classes), gamma_rule="gcv", grid=grid, device=device)
    acc_gcv = np.full((t_count, t_count), np.nan)
    fixed = {float(g): np.full((t_count, t_count), np.nan) for g in gammas}
    for t, task in enumerate(stream.tasks):
        server.receive_stage([stats["sums"][None][t]], task.offset, task.num_classes)
        server.solve(stream.num_seen(t))
        idx, groups = _groups(stream, t)
        chosen = server.chosen[-1]
        cand = np.unique(np.concatenate([gammas, [chosen]]))
        acc = grid_accuracy(server.path, phi_test[idx], pos_test[idx], groups, cand)
        for i, g in enumerate(cand):
            if float(g) in fixed:
                fixed[float(g)][t, :t + 1] = acc[i]
        acc_gcv[t, :t + 1] = acc[int(np.flatnonzero(cand == chosen)[0])]
    return {"acc": acc_gcv, "fixed": fixed, "chosen": list(server.chosen), "gcv": server.gcv_values}


def _gcv_rows(out: dict, seed: int, grid, fixed_gammas, sweep_gammas) -> tuple[list, list, list]:
    metric = {g: {k: 100 * v for k, v in accuracy_matrix_metrics(a).items()} for g, a in out["fixed"].items()}
    rows = [{"seed": seed, "method": "GCV (per stage)", "gamma": out["chosen"][-1],
             **{k: 100 * v for k, v in accuracy_matrix_metrics(out["acc"]).items()}}]
    rows += [{"seed": seed, "method": f"fixed gamma = {g:g}", "gamma": float(g), **metric[float(g)]}
             for g in fixed_gammas]
    for label, cands in (("best of sweep (test set)", sweep_gammas), ("best in hindsight (test set)", grid)):
        best = max(cands, key=lambda g: metric[float(g)]["A_T"])
        rows.append({"seed": seed, "method": label, "gamma": float(best), **metric[float(best)]})
    chosen = [{"seed": seed, "stage": t + 1, "gamma (GCV)": g} for t, g in enumerate(out["chosen"])]
    curves = [{"seed": seed, "gamma": float(g), "GCV": float(v), "A_T (%)": metric[float(g)]["A_T"]}
              for g, v in zip(grid, out["gcv"])]
    return rows, chosen, curves


def _dp_seed(stats: dict, features, seed: int, *, M: int, num_clients: int, clip_norm: float, z_of: dict,
             eps_acc: dict, accountant: str, grid, fixed_gamma: float, aggregations, paper_noise, device) -> list:
    """A_T of every privacy setting on one seed (last stage; :class:`PathServer` with the PSD projection)."""
    stream = stats["stream"]
    pos_test = stream.relabel(features.y_test)
    groups = [task.test_idx for task in stream.tasks]
    phi_plain = RandomFeatures(features.x_train.shape[1], M, seed, device)(features.x_test)
    phi_test = {None: phi_plain, clip_norm: clip_features(phi_plain, clip_norm)}
    settings = [(f"no noise, clipped (B = {clip_norm:g})", clip_norm, math.inf, 0.0, stats["sums"][clip_norm])]
    if z_of:
        e_dp = standard_noise(seed, stream, num_clients, M, "dp", device)
        for agg in aggregations:
            share = 1.0 if agg == "local" else 1.0 / math.sqrt(num_clients)
            for eps, z in z_of.items():
                settings.append((f"calibrated, {agg}", clip_norm, eps, z,
                                 _with_noise(stats["sums"][clip_norm], e_dp, upload_sigmas(z * share, clip_norm))))
    if paper_noise is not None:
        q, s = paper_noise
        e_paper = standard_noise(seed, stream, num_clients, M, "paper", device)
        settings.append((f"paper's noise q={q:g}, s={s:g}", None, math.inf, float("nan"),
                         _with_noise(stats["sums"][None], e_paper, {"G": q * s, "C": q * s, "n": q * s})))
    rows = []
    for label, clip, eps, z, sums in settings:
        server = PathServer(M, len(features.classes), gamma_rule="gcv", grid=grid, psd=True, device=device)
        for t, task in enumerate(stream.tasks):
            server.receive_stage([sums[t]], task.offset, task.num_classes)
        server.solve(stream.num_seen(stream.num_tasks - 1))
        path, gamma_gcv = server.path, server.chosen[-1]
        cand = np.unique(np.concatenate([grid, [fixed_gamma, gamma_gcv]]))
        acc = grid_accuracy(path, phi_test[clip], pos_test, groups, cand)
        a_t = {float(g): 100 * float(acc[i].mean()) for i, g in enumerate(cand)}
        best = max(a_t, key=a_t.get)
        base = {"seed": seed, "setting": label, "epsilon": eps, "noise multiplier z": z,
                f"epsilon ({accountant} accountant)": eps_acc.get(eps, math.inf) if "calibrated" in label else eps,
                "negative eigenvalues clipped": path.negative,
                "GCV undefined (largest gamma used)": bool(not np.isfinite(server.gcv_values).any())}
        rows += [{**base, "gamma rule": "GCV (noisy statistics)", "gamma": gamma_gcv, "A_T": a_t[gamma_gcv]},
                 {**base, "gamma rule": f"fixed gamma = {fixed_gamma:g}", "gamma": fixed_gamma,
                  "A_T": a_t[float(fixed_gamma)]},
                 {**base, "gamma rule": "best in hindsight (test set)", "gamma": best, "A_T": a_t[best]}]
    return rows


def beyond_study(features, beta: float, seeds, *, num_tasks: int, num_clients: int, M: int, grid, fixed_gammas,
                 sweep_gammas, clip_norm: float | None = None, epsilons=(), delta: float = 1e-5,
                 aggregations=("local",), paper_noise=(0.2, 0.05), stages_composed: int = 1, accountant: str = "pld",
                 gcv: bool = True, dp: bool = True, device: str | torch.device = "cpu", progress: bool = True) -> dict:
    """Both studies of the chapter over ``seeds``, sharing each seed's clean uploads (:func:`seed_statistics`).

    GCV (``gcv``): per seed, "GCV (per stage)", every fixed gamma of ``fixed_gammas``, "best of sweep"
    (the gamma of ``sweep_gammas`` with the best test A_T, per seed, in hindsight) and "best in
    hindsight" (the same over ``grid``): A_T / A_avg / F_T (%).
    DP (``dp``): per seed the final A_T of: no noise with rows clipped at ``clip_norm``; the calibrated
    mechanism at every epsilon of ``epsilons`` (multiplier from :func:`calibrate_upload`, its epsilon
    re-computed by ``accountant``), per ``aggregations`` ("local": every upload private; "secure": sd /
    sqrt(K), private in the sum); the paper's q N(0, s^2) (``paper_noise``) on the unclipped uploads.
    Each with gamma by GCV on the noisy statistics, gamma = ``fixed_gammas[0]`` and the best grid gamma
    on the test set (hindsight). The noise is the clients' own draws (:func:`standard_noise`; a test
    checks equal heads with :class:`PathLearner` through the protocol).
    Returns {"runs", "chosen", "curves", "bytes_up" (per seed, unclipped run), "dp"} (DataFrames)."""
    grid = check_gamma_grid(grid)
    fixed_gammas = check_gamma_grid(fixed_gammas, "fixed_gammas")
    sweep_gammas = check_gamma_grid(sweep_gammas, "sweep_gammas")
    everything = np.unique(np.concatenate([grid, fixed_gammas, sweep_gammas]))
    z_of, eps_acc = {}, {}
    if dp:
        for a in aggregations:
            check_choice("aggregations", a, AGGREGATIONS)
        epsilons = [privacy.check_epsilon(e) for e in epsilons]
        delta = privacy.check_delta(delta)
        clip_norm = check_positive("clip_norm (B)", clip_norm)
        z_of = {e: calibrate_upload(e, delta, stages_composed) for e in epsilons}
        eps_acc = {e: upload_epsilon(z_of[e], delta, stages_composed, accountant) for e in epsilons}
    rows, chosen, curves, dp_rows, nbytes = [], [], [], [], []
    for seed in tqdm(list(seeds), desc="seeds (statistics, GCV, DP)", disable=not progress):
        clips = ((None,) if gcv or paper_noise is not None else ()) + ((clip_norm,) if dp else ())
        stats = seed_statistics(features, beta, seed, num_tasks=num_tasks, num_clients=num_clients, M=M,
                                clip_norms=clips, device=device)
        if gcv:
            out = _gcv_seed(stats, features, seed, M=M, grid=grid, gammas=everything, device=device)
            r, c, v = _gcv_rows(out, seed, grid, fixed_gammas, sweep_gammas)
            rows, chosen, curves = rows + r, chosen + c, curves + v
            nbytes.append(stats["bytes_up"][None])
        if dp:
            dp_rows += _dp_seed(stats, features, seed, M=M, num_clients=num_clients, clip_norm=clip_norm, z_of=z_of,
                                eps_acc=eps_acc, accountant=accountant, grid=grid, fixed_gamma=float(fixed_gammas[0]),
                                aggregations=aggregations, paper_noise=paper_noise if dp else None, device=device)
    return {"runs": pd.DataFrame(rows), "chosen": pd.DataFrame(chosen), "curves": pd.DataFrame(curves),
            "bytes_up": nbytes, "dp": pd.DataFrame(dp_rows)}


def gcv_study(features, beta: float, seeds, *, num_tasks: int, num_clients: int, M: int, grid, fixed_gammas,
              sweep_gammas, device: str | torch.device = "cpu", progress: bool = True) -> dict:
    """The GCV part of :func:`beyond_study` alone."""
    return beyond_study(features, beta, seeds, num_tasks=num_tasks, num_clients=num_clients, M=M, grid=grid,
                        fixed_gammas=fixed_gammas, sweep_gammas=sweep_gammas, dp=False, device=device,
                        progress=progress)


def dp_study(features, beta: float, seeds, *, num_tasks: int, num_clients: int, M: int, clip_norm: float,
             epsilons, delta: float, grid, fixed_gamma: float, aggregations=("local",), paper_noise=(0.2, 0.05),
             stages_composed: int = 1, accountant: str = "pld", device: str | torch.device = "cpu",
             progress: bool = True):
    """The privacy part of :func:`beyond_study` alone (gamma = ``fixed_gamma`` as the fixed rule): its DataFrame."""
    return beyond_study(features, beta, seeds, num_tasks=num_tasks, num_clients=num_clients, M=M, grid=grid,
                        fixed_gammas=[fixed_gamma], sweep_gammas=[fixed_gamma], clip_norm=clip_norm,
                        epsilons=epsilons, delta=delta, aggregations=aggregations, paper_noise=paper_noise,
                        stages_composed=stages_composed, accountant=accountant, gcv=False, device=device,
                        progress=progress)["dp"]


def dp_summary(runs):
    """Mean and sample std of A_T over seeds per (setting, epsilon, gamma rule), with the median gamma."""
    g = runs.groupby(["setting", "epsilon", "gamma rule"], sort=False)
    return g.agg(A_T=("A_T", mean_std), mean=("A_T", "mean"), std=("A_T", lambda v: v.std(ddof=1)),
                 gamma=("gamma", "median"), seeds=("seed", "nunique")).reset_index()
