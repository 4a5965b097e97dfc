"""STSA and STSA-E: federated class-incremental learning by spatial-temporal statistics aggregation
(Guan et al.; equations numbered as in the revised version, seed 001; notes: papers/stsa.md).

After stage 1 the backbone F is frozen; a random ReLU layer R (regenerated on every client from a
shared seed) maps its d-dim features to Phi(x) = ReLU(F(x) W_rand) in R^M (eq. 1). Per stage t:

* STSA: client k uploads G_{t,k} = X^T X (M, M) and C_{t,k} = X^T Y (M, c_t): the
  :class:`fedlib.core.linalg.SufficientStats` that AFL uses. The server sums them over clients
  (spatial, eq. 2), adds G over stages and concatenates C column-wise (temporal, eq. 4), and
  solves W_t = (G_{1:t} + gamma I)^{-1} C_{1:t} (eq. 8): exactly joint ridge on all data seen.
* STSA-E: client k uploads only class sums C and counts n, split over K_D dummy clients; the
  server estimates the Gram matrix from them (Prop. 3.1, eq. 9) and solves eq. 10.

Eq. 9 per class i with K (dummy) clients, class total n, class sums s_k, s = sum_k s_k:

    G_hat_i = (n-1)/(K-1) sum_k s_k s_k^T / n_k  -  (n-K)/(n(K-1)) s s^T
            = n m m^T + (n-1)/(K-1) B,   m = s/n,  B = sum_k n_k (m_k - m)(m_k - m)^T   (PSD form)

The paper's K is the total number of clients (``k_mode="global"``). Clients with n_k = 0 then
contribute nothing to B while still counting in K, so the covariance part is biased low under label
skew; ``k_mode="per_class"`` uses K_i = #{k : n_k > 0}, which is unbiased under label skew (notes
Sec. 8.1). Unbiasedness needs P_k(x | y) to be the same on every client (label skew only): under
feature skew (client-specific shifts, :class:`FeatureSkewLearner`) B also holds the spread of the
client means and G_hat overestimates the within-class scatter.
"""
from __future__ import annotations

import math
import time
from typing import Sequence

import numpy as np
import torch
from torch import Tensor

from fedlib.papers.afl import aggregate as afl_aggregate
from fedlib.papers.afl import client_update as afl_client_update
from fedlib.core.linalg import SufficientStats, as_tensor, one_hot, ridge_fit, ridge_solve
from fedlib.federated.incremental import task_offset
from fedlib.core.messages import Message
from fedlib.core.validate import check_choice, check_positive

__all__ = ["RandomFeatures", "stsa_client", "stsae_client", "dummy_split", "gram_estimate", "gram_estimate_eq9",
           "add_upload_noise", "STSAServer", "predict", "STSALearner", "AFLStagewiseLearner",
           "JointRidgeLearner", "FeatureSkewLearner", "client_shifts", "upload_floats", "communication_mib",
           "VARIANTS", "K_MODES", "HEADS", "SPLITS", "MIN_COUNT"]

VARIANTS = ("stsa", "stsa_e")
K_MODES = ("global", "per_class")
HEADS = ("argmax", "cosine")
SPLITS = ("random", "stratified")
MIN_COUNT = 0.5   # a (noisy) uploaded count below this is read as "the client does not hold the class"


def _check_int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


# ----------------------------------------------------------------------------------------------
# random feature layer R (eq. 1)
# ----------------------------------------------------------------------------------------------
class RandomFeatures:
    """Phi(x) = ReLU(x W_rand), W_rand (d, M) with i.i.d. N(0, 1) entries from ``seed`` (no bias, no
    scaling: the authors' code). ``out_dim == in_dim`` means no projection (raw features), the
    "M = 512/768" point of the paper's M ablation. Every client regenerates the same W_rand."""

    def __init__(self, in_dim: int, out_dim: int, seed: int = 0, device: str | torch.device = "cpu"):
        self.in_dim = _check_int("in_dim", in_dim, 1)
        self.out_dim = _check_int("M", out_dim, 1)
        self.seed = int(seed)
        self.weight = None
        if self.out_dim != self.in_dim:
            gen = torch.Generator().manual_seed(self.seed)
            self.weight = torch.randn(self.in_dim, self.out_dim, generator=gen, dtype=torch.float64).to(device)

    def __call__(self, x) -> Tensor:
        """x (N, d) -> Phi (N, M) float64."""
        device = "cpu" if self.weight is None else self.weight.device
        x = as_tensor(x, torch.float64, device)
        if x.ndim != 2 or x.shape[1] != self.in_dim:
            raise ValueError(f"features must have shape (N, {self.in_dim}), got {tuple(x.shape)}")
        return x if self.weight is None else torch.relu(x @ self.weight)


def _local_stats(x, labels: np.ndarray, num_classes: int, features: RandomFeatures, chunk: int = 4096) -> SufficientStats:
    """G = Phi^T Phi (M, M), C = Phi^T Y (M, c) accumulated over row chunks (float64)."""
    stats = SufficientStats.zeros(features.out_dim, num_classes, device=features.weight.device
                                  if features.weight is not None else "cpu")
    for s in range(0, len(labels), chunk):
        stats += SufficientStats.from_data(features(x[s:s + chunk]), labels[s:s + chunk], num_classes,
                                           device=stats.gram.device)
    return stats


# ----------------------------------------------------------------------------------------------
# clients
# ----------------------------------------------------------------------------------------------
def stsa_client(x, labels, num_classes: int, features: RandomFeatures, sender: str = "client",
                upload_dtype: torch.dtype = torch.float64) -> Message:
    """STSA upload {G (M, M), C (M, c_t)} for features x (n_k, d), labels (n_k,) in [0, c_t)."""
    stats = _local_stats(x, np.asarray(labels), num_classes, features)
    return Message(sender, {"G": stats.gram.to(upload_dtype), "C": stats.xty.to(upload_dtype)})


def dummy_split(labels, num_dummy: int, split: str = "random", seed: int = 0) -> list[np.ndarray]:
    """Cut one client's n_k samples into K_D dummy clients (index arrays).

    ``random`` (authors' code): permute the whole local set, K_D contiguous chunks of
    floor(n_k/K_D), the last takes the remainder; per-class counts per chunk are random, often 0.
    ``stratified``: each class's samples dealt round-robin, so every dummy client with room holds
    every class the client has (fewer empty terms in eq. 9).
    """
    labels = np.asarray(labels)
    num_dummy = _check_int("num_dummy (K_D)", num_dummy, 1)
    check_choice("split", split, SPLITS)
    if num_dummy > len(labels):
        raise ValueError(f"num_dummy (K_D) = {num_dummy} exceeds the {len(labels)} samples of this client; "
                         f"K_D must be <= samples per client")
    rng = np.random.default_rng(seed)
    if split == "random":
        perm = rng.permutation(len(labels))
        size = len(labels) // num_dummy
        return [perm[j * size:(j + 1) * size] if j < num_dummy - 1 else perm[j * size:] for j in range(num_dummy)]
    chunks: list[list[int]] = [[] for _ in range(num_dummy)]
    start = 0
    for c in np.unique(labels):
        for r, i in enumerate(rng.permutation(np.flatnonzero(labels == c))):
            chunks[(start + r) % num_dummy].append(i)
        start += int((labels == c).sum())
    return [np.sort(np.asarray(ch, dtype=np.int64)) for ch in chunks]


def stsae_client(x, labels, num_classes: int, features: RandomFeatures, num_dummy: int = 1, split: str = "random",
                 seed: int = 0, sender: str = "client", upload_dtype: torch.dtype = torch.float64) -> Message:
    """STSA-E upload {C (K_D, M, c_t), n (K_D, c_t)}: class sums and counts of K_D dummy clients."""
    labels = np.asarray(labels)
    chunks = dummy_split(labels, num_dummy, split, seed)
    phi = features(x)
    sums = torch.stack([phi[torch.from_numpy(ch).to(phi.device)].T
                        @ one_hot(labels[ch], num_classes, device=phi.device) for ch in chunks])
    counts = np.stack([np.bincount(labels[ch], minlength=num_classes) for ch in chunks])
    return Message(sender, {"C": sums.to(upload_dtype), "n": torch.from_numpy(counts).to(upload_dtype)})


def add_upload_noise(msg: Message, q: float, s: float, generator: torch.Generator,
                     entries: Sequence[str] = ("G", "C", "n")) -> Message:
    """The privacy experiment of version 000 (App. E.2, Table 7): add q * N(0, s^2) to the named
    upload entries. G's noise is symmetrized ((E + E^T)/sqrt(2), same variance) so G stays
    symmetric. Noisy counts stay real numbers: :class:`STSAServer` uses them as they are (no
    rounding, which would undo noise of sd < 0.5 exactly), except that a count below
    :data:`MIN_COUNT` is read as an empty (dummy) client, since a term C C^T / n with n ~ 0 would
    dominate eq. 9 (our choice; the paper is silent)."""
    check_positive("q", q, strict=False)
    check_positive("s", s, strict=False)
    out = dict(msg.payload)
    for key in entries:
        if key not in out:
            continue
        value = out[key]
        noise = torch.randn(value.shape, generator=generator, dtype=torch.float64).to(value) * (q * s)
        if key == "G":
            noise = (noise + noise.T) / math.sqrt(2.0)
        out[key] = value + noise
    return Message(msg.sender, out)


# ----------------------------------------------------------------------------------------------
# server: Gram estimate (Prop. 3.1, eq. 9)
# ----------------------------------------------------------------------------------------------
def _class_coefficients(counts: Tensor, k_mode: str, clip: bool):
    """Per class i: n_i, the scatter coefficient a_i = (n_i-1)/(K-1) and the mean coefficient e_i
    (= n_i; with ``clip`` the authors' code's max(0, .) on (n_i-K) gives a_i n_i when n_i < K)."""
    check_choice("k_mode", k_mode, K_MODES)
    n = counts.sum(0)
    k = torch.full_like(n, counts.shape[0]) if k_mode == "global" else (counts > 0).sum(0).to(n)
    if k_mode == "global" and counts.shape[0] < 2:
        raise ValueError("the Gram estimate needs K * K_D >= 2 (dummy) clients; raise num_dummy (K_D)")
    a = torch.where(k > 1, (n - 1) / (k - 1).clamp_min(1), torch.zeros_like(n))
    e = n.clone()
    if clip:
        b = (n - k) / (n.clamp_min(1e-300) * (k - 1).clamp_min(1))
        e = torch.where(b < 0, a * n, n)
    return n, a, e


def gram_estimate(class_sums: Tensor, counts: Tensor, k_mode: str = "global", clip: bool = False) -> Tensor:
    """STSA-E's Gram estimate (eq. 9), vectorized: sum_i [e_i m_i m_i^T + a_i B_i] as ONE product.

    class_sums (J, M, c): the C of all J (dummy) clients; counts (J, c): their n. With D the (M, P)
    matrix of columns sqrt(a_i n_ki) (m_ki - m_i) over the P non-empty (k, i) and E the (M, c) matrix of
    columns sqrt(e_i) m_i, G_hat = D D^T + E E^T: positive semidefinite, and equal to the printed
    eq. 9 with empty terms skipped (see :func:`gram_estimate_eq9`). Returns (M, M) float64.
    """
    class_sums = class_sums.to(torch.float64)
    counts = counts.to(class_sums)
    n, a, e = _class_coefficients(counts, k_mode, clip)
    present = n > 0
    means = class_sums[:, :, present].sum(0) / n[present]                     # (M, c')
    j, i = torch.nonzero(counts > 0, as_tuple=True)                             # non-empty (client, class)
    cnt = counts[j, i]                                                          # (P,)
    rows = class_sums[j, :, i] / cnt[:, None]                                   # client class means (P, M)
    rows -= (class_sums.sum(0) / n.clamp_min(1e-300)).T[i]                      # minus the class means
    rows *= torch.sqrt(a[i] * cnt)[:, None]
    mean_part = means * torch.sqrt(e[present])
    return rows.T @ rows + mean_part @ mean_part.T


def gram_estimate_eq9(class_sums: Tensor, counts: Tensor, k_mode: str = "global") -> Tensor:
    """Eq. 9 exactly as printed: a Python loop over classes and (dummy) clients of outer products
    (terms with n_k = 0 skipped). The reference for :func:`gram_estimate` and the baseline of
    the speed benchmark. Shapes as in :func:`gram_estimate`."""
    class_sums = class_sums.to(torch.float64)
    counts = counts.to(class_sums)
    n_all, _, _ = _class_coefficients(counts, k_mode, False)
    m = class_sums.shape[1]
    out = torch.zeros(m, m, dtype=torch.float64, device=class_sums.device)
    for i in range(counts.shape[1]):
        n = float(n_all[i])
        if n == 0:
            continue
        k = counts.shape[0] if k_mode == "global" else int((counts[:, i] > 0).sum())
        if k < 2:
            s = class_sums[:, :, i].sum(0)
            out += torch.outer(s, s) / n
            continue
        acc = torch.zeros(m, m, dtype=torch.float64, device=class_sums.device)
        for j in range(counts.shape[0]):
            if counts[j, i] > 0:
                acc += torch.outer(class_sums[j, :, i], class_sums[j, :, i]) / counts[j, i]
        s = class_sums[:, :, i].sum(0)
        out += (n - 1) / (k - 1) * acc - (n - k) / (n * (k - 1)) * torch.outer(s, s)
    return out


class STSAServer:
    """Spatial (eq. 2) and temporal (eq. 4) aggregation and the ridge solve (eqs. 8 / 10).

    Holds G_{1:t} (M, M) and C_{1:t} (M, num_classes) in float64; the columns of task t are the
    block [offset, offset + c_t). ``variant="stsa_e"`` replaces each stage's G_t by
    :func:`gram_estimate` of that stage's uploads.

    Uploaded counts (STSA-E) are used as real numbers, so noise on them (Table 7) reaches the
    estimate; counts below :data:`MIN_COUNT` become 0 (an empty client). ``round_counts=True``
    rounds them to the nearest integer instead, which removes count noise of sd << 0.5 entirely.
    """

    def __init__(self, dim: int, num_classes: int, gamma: float, variant: str = "stsa", k_mode: str = "global",
                 clip: bool = False, round_counts: bool = False, device: str | torch.device = "cpu"):
        check_choice("variant", variant, VARIANTS)
        check_choice("k_mode", k_mode, K_MODES)
        check_positive("gamma", gamma, strict=False)
        self.variant, self.k_mode, self.clip, self.gamma = variant, k_mode, clip, float(gamma)
        self.round_counts = bool(round_counts)
        self.gram = torch.zeros(dim, dim, dtype=torch.float64, device=device)
        self.xty = torch.zeros(dim, num_classes, dtype=torch.float64, device=device)
        self.seconds = 0.0

    def receive_stage(self, uploads: Sequence[Message], offset: int) -> None:
        """Aggregate one stage's uploads into the running statistics."""
        start = time.perf_counter()
        dev = self.gram.device
        if self.variant == "stsa":
            c_t = sum(u["C"].to(dev, torch.float64) for u in uploads)
            self.gram += sum(u["G"].to(dev, torch.float64) for u in uploads)
        else:
            sums = torch.cat([u["C"].to(dev, torch.float64) for u in uploads])   # (J, M, c_t)
            counts = torch.cat([u["n"].to(dev, torch.float64) for u in uploads])                 # (J, c_t)
            if self.round_counts:
                counts = counts.round().clamp_min(0)
            else:  # noisy counts (Table 7) stay real; a count below MIN_COUNT is an empty client
                counts = torch.where(counts < MIN_COUNT, torch.zeros_like(counts), counts)
            c_t = sums.sum(0)
            self.gram += gram_estimate(sums, counts, self.k_mode, self.clip)
        self.xty[:, offset:offset + c_t.shape[1]] += c_t
        self.seconds += time.perf_counter() - start

    def solve(self, num_seen: int) -> Tensor:
        """W_t = (G_{1:t} + gamma I)^{-1} C_{1:t} (M, num_seen)."""
        start = time.perf_counter()
        w = ridge_solve(self.gram, self.xty[:, :num_seen], self.gamma)
        self.seconds += time.perf_counter() - start
        return w


def predict(weights: Tensor, phi: Tensor, head: str = "argmax") -> Tensor:
    """argmax_c Phi W[:, c] (the paper), or ``cosine``: argmax_c <Phi, w_c / ||w_c||> (the authors'
    CosineLinear; normalizing Phi does not change the argmax, normalizing the columns does)."""
    check_choice("head", head, HEADS)
    if head == "cosine":
        weights = weights / weights.norm(dim=0, keepdim=True).clamp_min(1e-300)
    return (phi.to(weights) @ weights).argmax(1)


# ----------------------------------------------------------------------------------------------
# learners for the class-incremental protocol (fedlib.federated.incremental)
# ----------------------------------------------------------------------------------------------
class STSALearner:
    """STSA / STSA-E as an :class:`fedlib.federated.incremental.IncrementalLearner` on frozen features.

    Clients receive backbone features (n_k, d) (the frozen stage-1 backbone applied beforehand;
    the backbone's own cost is reported separately) and labels in the stage's class block.
    ``noise=(q, s)`` adds the Table-7 upload noise to ``noise_entries``.
    """

    def __init__(self, in_dim: int, num_classes: int, M: int, gamma: float, variant: str = "stsa",
                 num_dummy: int = 1, k_mode: str = "global", split: str = "random", head: str = "argmax",
                 clip: bool = False, rf_seed: int = 0, seed: int = 0, noise: tuple[float, float] | None = None,
                 noise_entries: Sequence[str] = ("G", "C", "n"), round_counts: bool = False,
                 device: str | torch.device = "cpu", name: str | None = None):
        check_choice("head", head, HEADS)
        check_choice("split", split, SPLITS)
        _check_int("num_dummy (K_D)", num_dummy, 1)
        self.features = RandomFeatures(in_dim, M, rf_seed, device)
        self.server = STSAServer(M, num_classes, gamma, variant, k_mode, clip, round_counts, device)
        self.variant, self.num_dummy, self.split, self.head = variant, int(num_dummy), split, head
        self.seed, self.noise, self.noise_entries = seed, noise, tuple(noise_entries)
        self.name = name or variant
        self.min_client_size = self.num_dummy if variant == "stsa_e" else 1
        self.weights: Tensor | None = None

    def upload(self, t: int, k: int, x, labels: np.ndarray, c_t: int) -> Message:
        """Client k's stage-t message; labels (n_k,) in [0, c_t)."""
        if self.variant == "stsa":
            return stsa_client(x, labels, c_t, self.features, f"client{k}")
        return stsae_client(x, labels, c_t, self.features, self.num_dummy, self.split,
                            seed=self.seed * 100003 + t * 1009 + k, sender=f"client{k}")

    def learn_task(self, t: int, clients, num_seen: int) -> int:
        offset = task_offset(clients)
        gen = torch.Generator().manual_seed(self.seed * 7919 + t)
        uploads = []
        for k, (x, y) in enumerate(clients):
            msg = self.upload(t, k, x, y.numpy() - offset, num_seen - offset)
            if self.noise is not None:
                msg = add_upload_noise(msg, *self.noise, generator=gen, entries=self.noise_entries)
            uploads.append(msg)
        self.server.receive_stage(uploads, offset)
        self.weights = self.server.solve(num_seen)
        return sum(u.nbytes for u in uploads)

    def predict(self, x, num_seen: int) -> Tensor:
        return predict(self.weights[:, :num_seen], self.features(x), self.head)


class AFLStagewiseLearner:
    """AFL (Zhuang et al. 2024) run afresh at every stage on that stage's clients only: the AA law
    gives the joint ridge head of the *current* task's classes; the columns of earlier classes are
    kept as they were. Exemplar-free and exact per stage, but each task's head is fitted without
    the other tasks' data (no temporal aggregation), which is what STSA adds.

    Like for like with STSA: each of the K clients regularizes with gamma / K, so the aggregated
    head W^r = (G_t + gamma I)^{-1} C_t carries the same total gamma as STSA's (AFL's own clients
    each add gamma, i.e. K gamma in total, eq. 14)."""

    def __init__(self, in_dim: int, num_classes: int, M: int, gamma: float, rf_seed: int = 0,
                 device: str | torch.device = "cpu", name: str = "afl_stagewise"):
        self.features = RandomFeatures(in_dim, M, rf_seed, device)
        self.gamma, self.name = float(gamma), name
        self.weights = torch.zeros(M, num_classes, dtype=torch.float64, device=device)

    def learn_task(self, t: int, clients, num_seen: int) -> int:
        offset = task_offset(clients)
        c_t = num_seen - offset
        per_client = self.gamma / len(clients)
        uploads = [afl_client_update(self.features(x), y.numpy() - offset, c_t, per_client, f"client{k}",
                                     device=self.weights.device) for k, (x, y) in enumerate(clients)]
        result = afl_aggregate(uploads, restore=False)  # W^r: ridge with K * gamma/K = gamma, no RI
        self.weights[:, offset:num_seen] = result.weights
        return sum(u.nbytes for u in uploads)

    def predict(self, x, num_seen: int) -> Tensor:
        return predict(self.weights[:, :num_seen], self.features(x))


class JointRidgeLearner:
    """The "Joint" upper bound: one centralized learner that holds all training data seen so far
    and fits ridge on it after every stage, W_t = argmin ||Phi W - Y||^2 + gamma ||W||^2 over the
    data of stages 1..t (same random features and gamma as STSA). No federation, no upload.

    ``solver="ridge"``: the pooled statistics and Cholesky solve of :mod:`fedlib.core.linalg`
    (``ridge_fit``, recomputed from all data seen at every stage); ``solver="lstsq"``: numpy
    ``lstsq`` on the augmented system [Phi; sqrt(gamma) I] W = [Y; 0], which never forms a Gram
    matrix (independent of the statistics STSA aggregates; slower)."""

    SOLVERS = ("ridge", "lstsq")

    def __init__(self, in_dim: int, num_classes: int, M: int, gamma: float, rf_seed: int = 0, solver: str = "ridge",
                 device: str | torch.device = "cpu", name: str = "Joint (centralized ridge)"):
        check_positive("gamma", gamma, strict=False)
        check_choice("solver", solver, self.SOLVERS)
        self.features = RandomFeatures(in_dim, M, rf_seed, device)
        self.gamma, self.name, self.num_classes, self.solver = float(gamma), name, num_classes, solver
        self._x: list[np.ndarray] = []
        self._y: list[np.ndarray] = []
        self.weights: Tensor | None = None

    def learn_task(self, t: int, clients, num_seen: int) -> int:
        for x, y in clients:
            self._x.append(self.features(x).cpu().numpy())
            self._y.append(np.asarray(y))
        phi, labels = np.concatenate(self._x), np.concatenate(self._y)
        m = phi.shape[1]
        if self.solver == "ridge":
            w = ridge_fit(phi, labels, num_seen, lam=self.gamma).cpu()
        else:
            a = np.vstack([phi, math.sqrt(self.gamma) * np.eye(m)])
            b = np.vstack([np.eye(num_seen)[labels], np.zeros((m, num_seen))])
            w = torch.from_numpy(np.linalg.lstsq(a, b, rcond=None)[0])
        self.weights = torch.zeros(m, self.num_classes, dtype=torch.float64)
        self.weights[:, :num_seen] = w
        return 0

    def predict(self, x, num_seen: int) -> Tensor:
        return predict(self.weights[:, :num_seen], self.features(x).cpu())


def client_shifts(num_clients: int, dim: int, scale: float, feature_std, seed: int = 0) -> np.ndarray:
    """Feature skew: one shift per client, delta_k = scale * feature_std * z_k, z_k ~ N(0, I_d).

    feature_std (d,) is the per-dimension std of the backbone features, so ``scale`` is in units
    of the features' own spread. Returns (K, d) float64."""
    _check_int("num_clients", num_clients, 1)
    check_positive("scale", scale, strict=False)
    std = np.broadcast_to(np.asarray(feature_std, dtype=np.float64), (dim,))
    return scale * std * np.random.default_rng(seed).standard_normal((num_clients, dim))


class FeatureSkewLearner:
    """Wraps a learner so that client k's backbone features arrive shifted by delta_k (feature
    skew: P_k(x | y) differs across clients, which the STSA-E unbiasedness argument excludes).

    ``shifts`` (K, d) from :func:`client_shifts`; every stage uses the same client shifts. The test
    set is shifted by the caller (e.g. each test sample by a random client's shift,
    :meth:`shift_test`); ``predict`` passes x through unchanged."""

    def __init__(self, learner, shifts: np.ndarray):
        self.learner, self.shifts = learner, np.asarray(shifts, dtype=np.float64)
        self.name = learner.name
        self.min_client_size = getattr(learner, "min_client_size", 1)

    def learn_task(self, t: int, clients, num_seen: int) -> int:
        if len(clients) != len(self.shifts):
            raise ValueError(f"FeatureSkewLearner has {len(self.shifts)} client shifts but the stage has "
                             f"{len(clients)} clients; make num_clients match")
        shifted = [(as_tensor(x) + torch.from_numpy(self.shifts[k]), y) for k, (x, y) in enumerate(clients)]
        return self.learner.learn_task(t, shifted, num_seen)

    def predict(self, x, num_seen: int) -> Tensor:
        return self.learner.predict(x, num_seen)

    def shift_test(self, x, seed: int = 0) -> np.ndarray:
        """x (N, d) with each row shifted by a uniformly drawn client's delta (the clients' mixture)."""
        who = np.random.default_rng(seed).integers(0, len(self.shifts), len(x))
        return np.asarray(x, dtype=np.float64) + self.shifts[who]


# ----------------------------------------------------------------------------------------------
# communication (Sec. 4.4 / Table 5)
# ----------------------------------------------------------------------------------------------
def upload_floats(variant: str, M: int, c_t: int, num_dummy: int = 1) -> int:
    """Numbers one client uploads per stage: STSA (M + c_t) M; STSA-E (M + 1) c_t K_D (n as one row)."""
    check_choice("variant", variant, VARIANTS)
    return (M + c_t) * M if variant == "stsa" else (M + 1) * c_t * num_dummy


def communication_mib(variant: str, M: int, c_t: int, num_tasks: int = 10, num_dummy: int = 1,
                      bytes_per_float: int = 4) -> float:
    """Per-client upload over all T stages in MiB (the paper's "MB": float32, 2^20 bytes, stage 1
    included, full M x M Gram): reproduces Table 5's 955.6 / 95.4 / 60.1 / 4.77."""
    return num_tasks * upload_floats(variant, M, c_t, num_dummy) * bytes_per_float / 2**20
