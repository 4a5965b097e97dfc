"""STSA and STSA-E: federated class-incremental learning by spatial-temporal statistics aggregation
(Guan et al.; equations numbered as in the paper's revised version).

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
skew; ``k_mode="per_class"`` uses K_i = #{k : n_k > 0}, which is unbiased under label skew (our
derivation; the derivation chapter checks it). On the library's one protocol
(:mod:`fedlib.core.protocol`): :class:`STSAClient` is the client program (its state keeps the
regenerated R; the dummy split and the upload noise come from ``derive_seed(seed, purpose, t, k)``),
:class:`STSAServer` the server (its broadcast is the public R as ``rf_seed`` / ``M``, the stage and
its class block); the learners run one round of :func:`~fedlib.core.protocol.simulate` per stage and
add its measured cost to ``learner.cost``.

Unbiasedness needs P_k(x | y) to be the same on every client (label skew only): under
feature skew (client-specific shifts, :class:`FeatureSkewLearner`) B also holds the spread of the
client means and G_hat overestimates the within-class scatter.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import Tensor

from fedlib.afl.algorithm import client_update as afl_client_update
from fedlib.core import uploads
from fedlib.core.linalg import SufficientStats, as_tensor, one_hot, ridge_solve
from fedlib.core.messages import Cost, Message
from fedlib.core.protocol import Broadcaster, ClientStates, simulate
from fedlib.core.seeds import derive_seed
from fedlib.core.validate import check_choice, check_int, check_positive
from fedlib.federated.incremental import task_offset
from fedlib.stsa.noise import add_upload_noise, unit_noise

VARIANTS = ("stsa", "stsa_e")
K_MODES = ("global", "per_class")
HEADS = ("argmax", "cosine")
SPLITS = ("random", "stratified")
MIN_COUNT = 0.5   # a (noisy) uploaded count below this is read as "the client does not hold the class"


# ----------------------------------------------------------------------------------------------
# random feature layer R (eq. 1)
# ----------------------------------------------------------------------------------------------
class RandomFeatures:
    """Phi(x) = ReLU(x W_rand), W_rand (d, M) with i.i.d. N(0, 1) entries from ``seed`` (no bias, no
    scaling: the authors' code). ``out_dim == in_dim`` means no projection (raw features), the
    "M = 512/768" point of the paper's M ablation. Every client regenerates the same W_rand."""

    def __init__(self, in_dim: int, out_dim: int, seed: int = 0, device: str | torch.device = "cpu"):
        self.in_dim = check_int("in_dim", in_dim, 1)
        self.out_dim = check_int("M", out_dim, 1)
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
    num_dummy = check_int("num_dummy (K_D)", num_dummy, 1)
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


# ----------------------------------------------------------------------------------------------
# server: Gram estimate (Prop. 3.1, eq. 9)
# ----------------------------------------------------------------------------------------------
def class_coefficients(counts: Tensor, k_mode: str, clip: bool):
    """Per class i: n_i, the scatter coefficient a_i = max(n_i-1, 0)/(K-1) and the mean coefficient e_i
    (= n_i; with ``clip`` the authors' code's max(0, .) on (n_i-K) gives a_i n_i when n_i < K).

    a_i multiplies the between-client scatter B_i, the stand-in for the within-class scatter S_i,
    whose n_i - 1 degrees of freedom it carries. With n_i <= 1 the class holds at
    most one sample, so S_i = 0 and its estimate is 0: a_i = 0. That case only arises with real-valued
    (noisy, Table 7) counts, n_i in [MIN_COUNT, 1); the printed (n_i-1)/(K-1) is negative there, which
    makes G_hat indefinite (and sqrt(a_i) in :func:`gram_estimate` NaN)."""
    check_choice("k_mode", k_mode, K_MODES)
    if bool((counts < 0).any()):
        raise ValueError("counts must be >= 0 (a noisy count below MIN_COUNT means an empty client: set it to 0)")
    n = counts.sum(0)
    k = torch.full_like(n, counts.shape[0]) if k_mode == "global" else (counts > 0).sum(0).to(n)
    if k_mode == "global" and counts.shape[0] < 2:
        raise ValueError("the Gram estimate needs K * K_D >= 2 (dummy) clients; raise num_dummy (K_D)")
    a = torch.where(k > 1, (n - 1).clamp_min(0) / (k - 1).clamp_min(1), torch.zeros_like(n))
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
    eq. 9 with empty terms skipped (see :func:`gram_estimate_eq9`) whenever every class total n_i is
    0 or >= 1 (always, for integer counts); a class with a noisy total n_i < 1 gets a_i = 0
    (:func:`class_coefficients`). counts must be >= 0. Returns (M, M) float64.
    """
    class_sums = class_sums.to(torch.float64)
    counts = counts.to(class_sums)
    n, a, e = class_coefficients(counts, k_mode, clip)
    present = n > 0
    means = class_sums[:, :, present].sum(0) / n[present]                     # (M, c')
    j, i = torch.nonzero(counts > 0, as_tuple=True)                             # non-empty (client, class)
    cnt = counts[j, i]                                                          # (P,)
    rows = class_sums[j, :, i] / cnt[:, None]                                   # client class means (P, M)
    rows -= (class_sums.sum(0) / n.clamp_min(1e-300)).T[i]                      # minus the class means
    rows *= torch.sqrt(a[i] * cnt)[:, None]
    mean_part = means * torch.sqrt(e[present])
    return rows.T @ rows + mean_part @ mean_part.T


class STSAServer(Broadcaster):
    """Spatial (eq. 2) and temporal (eq. 4) aggregation and the ridge solve (eqs. 8 / 10), as a
    :class:`fedlib.core.protocol.Server`.

    Holds G_{1:t} (M, M) and C_{1:t} (M, num_classes) in float64; the columns of task t are the
    block [offset, offset + c_t). ``variant="stsa_e"`` replaces each stage's G_t by
    :func:`gram_estimate` of that stage's uploads. Per stage: ``begin_stage(...)`` (the broadcast: the
    public random-feature layer as its seed and width ``rf_seed``, ``M``, the stage ``t``, its class block
    ``[offset, offset + num_classes)``), ``receive(uploads)``, ``result()`` = W_t (eq. 8 / 10).

    Uploaded counts (STSA-E) are used as real numbers, so noise on them (Table 7) reaches the
    estimate; counts below :data:`MIN_COUNT` become 0 (an empty client). ``round_counts=True``
    rounds them to the nearest integer instead, which removes count noise of sd << 0.5 entirely.
    Every upload is checked first (:meth:`expects`): G (M, M) and C (M, c_t) (STSA), or C (K_D, M, c_t)
    and n (K_D, c_t) (STSA-E), finite; counts are whole numbers >= 0 unless ``noisy_counts`` (the
    clients add noise to n: any real value, read as above).
    """

    def __init__(self, dim: int, num_classes: int, gamma: float, variant: str = "stsa", k_mode: str = "global",
                 clip: bool = False, round_counts: bool = False, device: str | torch.device = "cpu",
                 noisy_counts: bool = False):
        check_choice("variant", variant, VARIANTS)
        check_choice("k_mode", k_mode, K_MODES)
        check_positive("gamma", gamma, strict=False)
        self.variant, self.k_mode, self.clip, self.gamma = variant, k_mode, clip, float(gamma)
        self.round_counts, self.noisy_counts = bool(round_counts), bool(noisy_counts)
        self.gram = torch.zeros(dim, dim, dtype=torch.float64, device=device)
        self.xty = torch.zeros(dim, num_classes, dtype=torch.float64, device=device)
        self.seconds = 0.0
        self.payload = {"offset": 0, "num_classes": num_classes}

    def expects(self) -> uploads.Expected:
        """This stage's uploads: sizes M (the random features) and c_t (``info["num_classes"]``); K_D per upload."""
        return uploads.Expected((self.upload_form(),), {"M": self.gram.shape[0], "c": int(self.payload["num_classes"])},
                        local=("J",), what=f"{self.variant} upload")

    def upload_form(self) -> dict:
        if self.variant == "stsa":
            return {"G": uploads.Tensor(("M", "M")), "C": uploads.Tensor(("M", "c"))}
        return {"C": uploads.Tensor(("J", "M", "c")), "n": self.counts_entry(("J", "c"))}

    def counts_entry(self, shape: tuple) -> uploads.Tensor:
        """Uploaded class counts: whole numbers >= 0, or any real numbers when the clients add noise to them."""
        return uploads.Tensor(shape) if self.noisy_counts else uploads.Tensor(shape, low=0.0, integral=True)

    def absorb(self, messages: Sequence[Message]) -> None:
        """Aggregate one stage's uploads into the running statistics (block ``info["offset"]``)."""
        start = time.perf_counter()
        dev = self.gram.device
        if self.variant == "stsa":
            c_t = sum(u["C"].to(dev, torch.float64) for u in messages)
            self.gram += sum(u["G"].to(dev, torch.float64) for u in messages)
        else:
            sums = torch.cat([u["C"].to(dev, torch.float64) for u in messages])   # (J, M, c_t)
            counts = torch.cat([u["n"].to(dev, torch.float64) for u in messages])                 # (J, c_t)
            if self.round_counts:
                counts = counts.round().clamp_min(0)
            else:  # noisy counts (Table 7) stay real; a count below MIN_COUNT is an empty client
                counts = torch.where(counts < MIN_COUNT, torch.zeros_like(counts), counts)
            c_t = sums.sum(0)
            self.gram += gram_estimate(sums, counts, self.k_mode, self.clip)
        offset = self.payload["offset"]
        self.xty[:, offset:offset + c_t.shape[1]] += c_t
        self.seconds += time.perf_counter() - start

    def receive_stage(self, messages: Sequence[Message], offset: int, num_classes: int) -> None:
        """``receive`` for a stage whose class block is ``[offset, offset + num_classes)`` (no broadcast needed)."""
        self.payload = {**self.payload, "offset": int(offset), "num_classes": int(num_classes)}
        self.receive(messages)

    def solve(self, num_seen: int) -> Tensor:
        """W_t = (G_{1:t} + gamma I)^{-1} C_{1:t} (M, num_seen)."""
        start = time.perf_counter()
        w = ridge_solve(self.gram, self.xty[:, :num_seen], self.gamma)
        self.seconds += time.perf_counter() - start
        return w

    def result(self) -> Tensor:
        """The head after the current stage, :meth:`solve` over the classes seen so far."""
        return self.solve(self.payload["offset"] + self.payload["num_classes"])


def predict(weights: Tensor, phi: Tensor, head: str = "argmax") -> Tensor:
    """argmax_c Phi W[:, c] (the paper), or ``cosine``: argmax_c <Phi, w_c / ||w_c||> (the authors'
    CosineLinear; normalizing Phi does not change the argmax, normalizing the columns does)."""
    check_choice("head", head, HEADS)
    if head == "cosine":
        weights = weights / weights.norm(dim=0, keepdim=True).clamp_min(1e-300)
    return (phi.to(weights) @ weights).argmax(1)


@dataclass
class STSAClient:
    """The client program of STSA / STSA-E (and of AFL on the same random features), for
    :func:`fedlib.core.protocol.simulate`.

    ``step((x_k (n_k, d), y_k (n_k,)), state, broadcast)``: regenerates the public R from the
    broadcast ``rf_seed`` / ``M`` (kept in the client's state), shifts its labels into the stage's
    block (``offset``, ``num_classes`` = c_t) and uploads
    ``"stsa"``: {G, C} (eqs. 2-3); ``"stsa_e"``: {C, n} of K_D dummy clients (eq. 9 inputs), the dummy
    split drawn from ``derive_seed(seed, "dummy_split", t, k)``; ``"afl"``: AFL's local ridge
    {W, C, gamma} (AFL eqs. 12, 14) with the broadcast ``gamma``. With ``noise=(q, s)`` the client
    adds the Table-7 noise to ``noise_entries`` from ``torch_generator(seed, "upload_noise", t, k)``.
    """

    variant: str = "stsa"
    num_dummy: int = 1
    split: str = "random"
    seed: int = 0
    noise: tuple[float, float] | None = None
    noise_entries: Sequence[str] = ("G", "C", "n")
    device: str | torch.device = "cpu"

    def init_state(self, k: int) -> dict:
        return {"k": k, "name": f"client{k}", "features": None}

    def _features(self, state: dict, in_dim: int, b: Message) -> RandomFeatures:
        rf = state["features"]
        if rf is None or (rf.seed, rf.in_dim, rf.out_dim) != (int(b["rf_seed"]), in_dim, int(b["M"])):
            rf = state["features"] = RandomFeatures(in_dim, int(b["M"]), int(b["rf_seed"]), self.device)
        return rf

    def step(self, data, state: dict, broadcast: Message) -> Message:
        x, y = data
        features = self._features(state, int(x.shape[1]), broadcast)
        t, k, name = int(broadcast["stage"]), state["k"], state["name"]
        labels, c_t = np.asarray(y) - int(broadcast["offset"]), int(broadcast["num_classes"])
        if self.variant == "stsa":
            msg = stsa_client(x, labels, c_t, features, name)
        elif self.variant == "stsa_e":
            msg = stsae_client(x, labels, c_t, features, self.num_dummy, self.split,
                               seed=derive_seed(self.seed, "dummy_split", t, k), sender=name)
        else:
            # the paper's full C (d x d), like STSA's own G: the chapter compares the two uploads as published
            msg = afl_client_update(features(x), labels, c_t, broadcast["gamma"], name, device=self.device,
                                    packed=False)
        if self.noise is not None:
            msg = add_upload_noise(msg, *self.noise, generator=None, entries=self.noise_entries,
                                   draws=unit_noise(msg, self.seed, t, k, self.noise_entries))
        return msg


StageCallback = Callable[[int, Any], None]


class StagewiseLearner:
    """What the analytic learners share: per stage, the server's broadcast is set, one round of
    :func:`~fedlib.core.protocol.simulate` runs with the clients' states kept across stages
    (:class:`~fedlib.core.protocol.ClientStates`), the measured :class:`Cost` is added to ``cost``
    and each ``on_stage_end(t, learner)`` callback is called (to observe a run, e.g. keep the head)."""

    def _init_protocol(self, client: STSAClient, rf_seed: int, M: int, on_stage_end: Sequence[StageCallback]):
        self.client, self.rf_seed, self.M = client, int(rf_seed), int(M)
        self.states = ClientStates(client)
        self.cost = Cost()
        self.on_stage_end = list(on_stage_end)

    def _run_stage(self, server, t: int, clients, num_seen: int, **extra) -> Cost:
        offset = task_offset(clients)
        server.begin_stage(rf_seed=self.rf_seed, M=self.M, stage=int(t), offset=offset,
                           num_classes=num_seen - offset, **extra)
        cost = simulate(server, self.client, clients, rounds=1, states=self.states)
        self.cost += cost
        return cost

    def _stage_end(self, t: int) -> None:
        for callback in self.on_stage_end:
            callback(t, self)


class STSALearner(StagewiseLearner):
    """STSA / STSA-E as an :class:`fedlib.federated.incremental.IncrementalLearner` on frozen features.

    Clients receive backbone features (n_k, d) (the frozen stage-1 backbone applied beforehand;
    the backbone's own cost is reported separately) and labels in the stage's class block; they run
    :class:`STSAClient`, the server is :class:`STSAServer`. ``noise=(q, s)`` adds the Table-7 upload
    noise to ``noise_entries``. ``cost``: measured bytes up / down and seconds over all stages.
    ``solve_every_stage=False`` defers the ridge solve to the first ``predict`` after a stage (for
    runs evaluated after the last stage only: one solve instead of T; the same head).
    """

    def __init__(self, in_dim: int, num_classes: int, M: int, gamma: float, variant: str = "stsa",
                 num_dummy: int = 1, k_mode: str = "global", split: str = "random", head: str = "argmax",
                 clip: bool = False, rf_seed: int = 0, seed: int = 0, noise: tuple[float, float] | None = None,
                 noise_entries: Sequence[str] = ("G", "C", "n"), round_counts: bool = False,
                 device: str | torch.device = "cpu", name: str | None = None,
                 on_stage_end: Sequence[StageCallback] = (), solve_every_stage: bool = True):
        check_choice("head", head, HEADS)
        check_choice("split", split, SPLITS)
        check_int("num_dummy (K_D)", num_dummy, 1)
        self.solve_every_stage = bool(solve_every_stage)
        self._stale = False
        self.features = RandomFeatures(in_dim, M, rf_seed, device)
        self.server = STSAServer(M, num_classes, gamma, variant, k_mode, clip, round_counts, device,
                                 noisy_counts=noise is not None and "n" in tuple(noise_entries))
        self.variant, self.num_dummy, self.split, self.head = variant, int(num_dummy), split, head
        self.seed, self.noise, self.noise_entries = seed, noise, tuple(noise_entries)
        self.name = name or variant
        self.min_client_size = self.num_dummy if variant == "stsa_e" else 1
        self.weights: Tensor | None = None
        self._init_protocol(STSAClient(variant, self.num_dummy, split, seed, noise, self.noise_entries, device),
                            rf_seed, M, on_stage_end)

    def learn_task(self, t: int, clients, num_seen: int) -> Cost:
        cost = self._run_stage(self.server, t, clients, num_seen)
        self._stale = True
        if self.solve_every_stage or self.on_stage_end:
            self._solve()
        self._stage_end(t)
        return cost

    def _solve(self) -> None:
        self.weights = self.server.result()
        self._stale = False

    def predict(self, x, num_seen: int) -> Tensor:
        if self._stale:
            self._solve()
        return predict(self.weights[:, :num_seen], self.features(x), self.head)


