"""Every gradient-based federated method on the one client/server protocol (:mod:`fedlib.core.protocol`).

A method (:class:`FedAlgorithm` subclass: FedAvg, FedProx, FedDyn, FedNTD, MOON, FedDisco) holds
only its hyperparameters. Its *client hooks* (``init_state``, ``begin_local``, ``local_loss`` /
``training_loss``, ``end_local``, ``setup_upload``) see one :class:`Local` - the client's model,
the global model rebuilt from the broadcast, the client's own ``state`` dict and the broadcast
``Message`` - and nothing else. Its *server hooks* (``server_init``, ``broadcast_extra``,
``receive_setup``, ``aggregation_weights``, ``aggregate``) see the server's ``memory`` dict and
the uploads. :class:`GradientClient` (local SGD) and :class:`GradientServer` (aggregation) run
them; :func:`run_federated` drives both with :func:`fedlib.core.protocol.simulate`, so every
byte in :class:`History` is a measured ``Message`` size.

Models are any ``torch.nn.Module`` mapping ``x`` (N, ...) to logits (N, C); clients are
in-memory tensors. The AFL baselines (Zhuang et al., 2024, Sec. 4.4-4.5) train a head on a
frozen backbone's cached features with :class:`LinearHead` (or :class:`MOONHead` for MOON).
"""
from __future__ import annotations

import copy
import inspect
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

import pandas as pd
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm import tqdm

from fedlib.core import uploads
from fedlib.core.devices import resolve_device, torch_threads
from fedlib.core.messages import Cost, Message
from fedlib.core.protocol import EMPTY, ClientStates, RoundCallback, Server, simulate
from fedlib.core.seeds import seed_everything, torch_generator
from fedlib.core.validate import check_choice, check_int, check_positive, check_real
from fedlib.evaluation.metrics import model_accuracy
from fedlib.federated.batched import (
    BatchedHooks, BatchedTrainer, DynHooks, MOONHooks, NTDHooks, ProxHooks, batchable,
)
from fedlib.federated.heads import LinearHead, MLPHead, MOONHead

__all__ = [
    "FedConfig", "History", "Local", "FedAlgorithm", "FedAvg", "FedProx", "FedDyn", "FedNTD", "MOON",
    "FedDisco", "ALGORITHMS", "make_algorithm", "build_from_registry", "GradientClient", "GradientServer",
    "run_federated", "LinearHead", "MLPHead", "MOONHead", "average_states", "sample_clients", "client_id",
]

ClientData = Sequence[tuple[Tensor, Tensor]]


# ----------------------------------------------------------------------------------------------
# configuration, models
# ----------------------------------------------------------------------------------------------
@dataclass
class FedConfig:
    """Training settings shared by every method.

    Defaults follow the documented proposal for the AFL baselines (afl.md Sec. 4.5: SGD lr 0.01,
    momentum 0.9, weight decay 1e-5, batch 64, 5 local epochs, full participation, 200 rounds);
    they are our choices, not the paper's.
    """

    rounds: int = 200
    local_epochs: int = 5
    batch_size: int = 64
    lr: float = 0.01
    momentum: float = 0.9
    weight_decay: float = 1e-5
    participation: float = 1.0  # fraction of the K clients sampled each round, in (0, 1]
    seed: int = 0
    device: str = "auto"  # "cpu", "cuda[:i]" or "auto"
    eval_every: int = 1
    # torch intra-op CPU threads during the run (restored afterwards); None = torch's setting.
    # Default 1: small heads gain nothing from more, and on a busy 2-core machine 2 threads were
    # measured ~13x slower (OpenMP contention). Raise it for CPU-bound CNNs on an idle machine.
    num_threads: int | None = 1
    # True: train all clients of a round at once (stacked parameters, one batched forward per
    # mini-batch step; fedlib.federated.batched), equal to the per-client loop up to float
    # round-off. For linear / MLP heads on cached features, where per-client, per-batch Python
    # overhead dominates. Raises ValueError for a method or model it does not support (see
    # ``batchable``). False (default): one client after the other, bit-identical to earlier
    # versions and to the Flower transport's nodes.
    batched_clients: bool = False

    def __post_init__(self) -> None:
        for name in ("rounds", "local_epochs", "batch_size", "eval_every"):
            check_int(name, getattr(self, name), 1)
        check_positive("lr", self.lr)
        if self.num_threads is not None:
            check_int("num_threads", self.num_threads, 1)
        check_real("momentum", self.momentum, low=0.0, high=1.0, strict=False)
        if self.momentum == 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum!r}")
        check_positive("weight_decay", self.weight_decay, strict=False)
        check_real("participation", self.participation, low=0.0, high=1.0, strict=False)
        if self.participation == 0.0:
            raise ValueError(f"participation must be in (0, 1], got {self.participation!r}")
        check_int("seed", self.seed, 0)
        if not isinstance(self.batched_clients, bool):
            raise ValueError(f"batched_clients must be True or False, got {self.batched_clients!r}")
        if not isinstance(self.device, (str, torch.device)) or (isinstance(self.device, str) and not (
                self.device in ("auto", "cpu") or self.device.startswith("cuda"))):
            raise ValueError(f"device must be 'cpu', 'cuda[:i]' or 'auto', got {self.device!r}")


# ----------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------
def average_states(states: Sequence[dict[str, Tensor]], weights: Sequence[float]) -> dict[str, Tensor]:
    """sum_k w_k * state_k for floating entries; integer buffers (e.g. BN counters) from the first. The
    states must hold the same entries with the same shapes (nothing is broadcast)."""
    out: dict[str, Tensor] = {}
    for k, s in enumerate(states[1:], 1):
        if s.keys() != states[0].keys() or any(s[n].shape != v.shape for n, v in states[0].items()):
            raise ValueError(f"state {k} does not match state 0 (entries or shapes differ): nothing is averaged")
    for key, ref in states[0].items():
        if ref.is_floating_point():
            acc = ref * weights[0]
            for s, w in zip(states[1:], weights[1:]):
                acc.add_(s[key], alpha=w)
            out[key] = acc
        else:
            out[key] = ref.clone()
    return out


def sample_clients(num_clients: int, participation: float, generator: torch.Generator) -> list[int]:
    """ceil(participation * K) distinct client ids, sorted, drawn with ``generator``."""
    m = max(1, math.ceil(participation * num_clients - 1e-9))
    m = min(m, num_clients)
    return sorted(torch.randperm(num_clients, generator=generator)[:m].tolist())


def client_id(message: Message) -> int:
    """k of a client's upload (sender ``"client{k}"``)."""
    return int(message.sender.removeprefix("client"))


def detached(model: nn.Module) -> dict[str, Tensor]:
    """A detached copy of ``model.state_dict()`` (same device)."""
    return {key: t.detach().clone() for key, t in model.state_dict().items()}


@dataclass
class Local:
    """What a client hook may use during one local update of client ``state["id"]``: the model
    being trained, the broadcast global model (frozen, eval mode), a spare frozen model (MOON's
    previous model, LwF's teacher), the client's own ``state`` and the ``broadcast``. ``scratch``
    holds what ``begin_local`` precomputes for the losses of this update."""

    model: nn.Module
    global_model: nn.Module
    spare: nn.Module
    state: dict[str, Any]
    broadcast: Message
    scratch: dict[str, Any] = field(default_factory=dict)


# ----------------------------------------------------------------------------------------------
# algorithms
# ----------------------------------------------------------------------------------------------
class FedAlgorithm:
    """A method's hyperparameters and hooks; FedAvg's mechanics by default (no state of its own).

    Client hooks (run by :class:`GradientClient`, see :class:`Local`): ``init_state(k)`` (extra
    entries of client k's state), ``setup_upload`` (the one-off setup round, when ``needs_setup``),
    ``begin_local``, ``local_loss`` (added to the cross-entropy), ``training_loss`` (the whole
    mini-batch loss), ``end_local`` (extra upload entries, state updates). ``batched``: the same
    client hooks for all clients of a round at once (:mod:`fedlib.federated.batched`, the speed
    path of ``FedConfig(batched_clients=True)``); a method that overrides a client hook names its own.
    Server hooks (run by :class:`GradientServer` on its ``memory`` dict): ``server_init``,
    ``receive_setup``, ``broadcast_extra`` (extra broadcast entries), ``aggregation_weights``
    (``aggregation = "size"``: n_k / sum n, ``"uniform"``: 1 / |P_t|) and ``aggregate``.
    """

    name = "base"
    needs_setup = False  # True: clients upload ``setup_upload`` once, before round 1
    aggregation = "size"
    batched: type[BatchedHooks] = BatchedHooks

    def hparams(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in inspect.signature(type(self).__init__).parameters if k != "self"}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.hparams().items())
        return f"{type(self).__name__}({args})"

    # -- client side -------------------------------------------------------------------------
    def init_state(self, k: int) -> dict[str, Any]:
        return {}

    def setup_upload(self, y: Tensor, state: dict, num_classes: int) -> dict[str, Any]:
        return {}

    def setup_entries(self, num_classes: int | None) -> dict[str, Any]:
        """What ``setup_upload`` holds (:mod:`fedlib.core.uploads` entries), as the server checks it."""
        return {}

    def begin_local(self, local: Local) -> None:
        """After the local model received the global weights, before local SGD."""

    def local_loss(self, local: Local, x: Tensor, y: Tensor, logits: Tensor) -> Tensor | None:
        """Extra loss term added to the cross-entropy of ``logits`` (None = nothing)."""
        return None

    def training_loss(self, local: Local, x: Tensor, y: Tensor) -> Tensor:
        logits = local.model(x)
        loss = F.cross_entropy(logits, y)
        extra = self.local_loss(local, x, y, logits)
        return loss if extra is None else loss + extra

    def end_local(self, local: Local) -> dict[str, Any]:
        """After local SGD: extra upload payload entries."""
        return {}

    # -- server side -------------------------------------------------------------------------
    def server_init(self, memory: dict, global_model: nn.Module, num_clients: int) -> None:
        """Before round 1 (``num_clients``: the clients that can take part)."""

    def receive_setup(self, memory: dict, uploads: list[Message]) -> None:
        """The setup round's uploads."""

    def broadcast_extra(self, memory: dict) -> dict[str, Any]:
        """Broadcast entries besides the global ``state``."""
        return {}

    def upload_entries(self, memory: dict, global_model: nn.Module) -> dict[str, Any]:
        """Upload entries besides ``state`` and ``n`` (what ``end_local`` adds), as the server checks them."""
        return {}

    def aggregation_weights(self, memory: dict, uploads: list[Message]) -> list[float]:
        """FedAvg weights n_k / sum n over this round's uploads (``aggregation="uniform"``: equal)."""
        if self.aggregation == "uniform":
            return [1.0 / len(uploads)] * len(uploads)
        total = sum(u["n"] for u in uploads)
        return [u["n"] / total for u in uploads]

    def aggregate(self, memory: dict, global_model: nn.Module, uploads: list[Message]) -> None:
        """Load the weighted average of the uploaded states into ``global_model``."""
        weights = self.aggregation_weights(memory, uploads)
        global_model.load_state_dict(average_states([u["state"] for u in uploads], weights))


class FedAvg(FedAlgorithm):
    """FedAvg (McMahan et al., AISTATS 2017, Algorithm 1): local SGD, w <- sum_k (n_k/n) w_k."""

    name = "fedavg"

    def __init__(self):
        pass


def _param_pairs(local: Local) -> list[tuple[Tensor, Tensor]]:
    return list(zip(local.model.parameters(), local.global_model.parameters()))


class FedProx(FedAlgorithm):
    """FedProx (Li et al., MLSys 2020, Algorithm 2, eq. (2)): local objective
    F_k(w) + mu/2 ||w - w^t||^2 around the broadcast global weights w^t; FedAvg aggregation."""

    name = "fedprox"
    batched = ProxHooks

    def __init__(self, mu: float = 0.01):
        check_positive("mu", mu, strict=False)
        self.mu = float(mu)

    def begin_local(self, local):
        local.scratch["pairs"] = _param_pairs(local)

    def local_loss(self, local, x, y, logits):
        prox = sum(((p - g) ** 2).sum() for p, g in local.scratch["pairs"])
        return 0.5 * self.mu * prox

class FedDyn(FedAlgorithm):
    """FedDyn (Acar et al., ICLR 2021, Algorithm 1), unweighted as printed.

    Client k:  theta_k = argmin L_k(theta) - <g_k, theta> + alpha/2 ||theta - theta^{t-1}||^2,
               then g_k <- g_k - alpha (theta_k - theta^{t-1})   (g_k = grad L_k(theta_k), init 0;
               ``state["grad"]``, the client's own).
    Server:    h <- h - alpha/m sum_{k in P_t} (theta_k - theta^{t-1})   (m = number of clients),
               theta^t = mean_{k in P_t} theta_k - h / alpha   (``memory["h"]``).
    Applied to parameters; buffers (e.g. BN statistics) are plainly averaged. m counts the
    non-empty clients (empty ones can never participate).
    """

    name = "feddyn"
    batched = DynHooks

    def __init__(self, alpha: float = 0.01):
        check_positive("alpha", alpha)
        self.alpha = float(alpha)

    def init_state(self, k):
        return {"grad": None}

    def begin_local(self, local):
        local.scratch["pairs"] = _param_pairs(local)
        if local.state["grad"] is None:
            local.state["grad"] = [torch.zeros_like(p) for p in local.global_model.parameters()]

    def local_loss(self, local, x, y, logits):
        pairs = local.scratch["pairs"]
        lin = sum((p * g).sum() for (p, _), g in zip(pairs, local.state["grad"]))
        quad = sum(((p - g) ** 2).sum() for p, g in pairs)
        return 0.5 * self.alpha * quad - lin

    @torch.no_grad()
    def end_local(self, local):
        for (p, g), grad in zip(local.scratch["pairs"], local.state["grad"]):
            grad.sub_(p - g, alpha=self.alpha)
        return {}

    def server_init(self, memory, global_model, num_clients):
        memory["h"] = {n: torch.zeros_like(p) for n, p in global_model.named_parameters()}
        memory["m"] = num_clients

    @torch.no_grad()
    def aggregate(self, memory, global_model, uploads):
        prev = {n: p.detach().clone() for n, p in global_model.named_parameters()}
        mean = average_states([u["state"] for u in uploads], [1.0 / len(uploads)] * len(uploads))
        for n, h in memory["h"].items():
            # sum_k (theta_k - theta_prev) = |P_t| (mean - theta_prev)
            h.sub_(mean[n] - prev[n], alpha=self.alpha * len(uploads) / memory["m"])
            mean[n] = mean[n] - h / self.alpha
        global_model.load_state_dict(mean)


class FedNTD(FedAlgorithm):
    """FedNTD (Lee et al., NeurIPS 2022, Sec. 4, L = CE + beta * L_NTD): not-true distillation.

    L_NTD = tau^2 * KL( softmax(z_g[not y]/tau) || softmax(z_l[not y]/tau) ), batch mean, where
    z_l / z_g are the local / frozen global logits with the true class removed.

    Checked against the authors' code (github.com/Lee-Gihun/FedNTD, commit be00ee5,
    ``algorithms/fedntd/criterion.py::NTD_Loss``): the same not-true gather, ``log_softmax`` of the
    local and ``softmax`` of the global logits at temperature tau, ``KLDivLoss(reduction="batchmean")``
    and the same **tau^2 factor** (Hinton's gradient-scale convention); defaults beta = 1, tau = 1 as
    in their ``config/fedntd.json`` (``NTD_Loss``'s own default is tau = 3). Not reproduced (training
    set-up, not the method): their per-round learning-rate decay (x0.99) and 10 % client sampling.
    """

    name = "fedntd"
    batched = NTDHooks

    def __init__(self, beta: float = 1.0, tau: float = 1.0):
        check_positive("beta", beta, strict=False)
        check_positive("tau", tau)
        self.beta, self.tau = float(beta), float(tau)

    def local_loss(self, local, x, y, logits):
        with torch.no_grad():
            g_logits = local.global_model(x)
        return self.ntd_loss(logits, g_logits, y)

    def ntd_loss(self, logits: Tensor, g_logits: Tensor, y: Tensor, w: Tensor | None = None) -> Tensor:
        """beta tau^2 KL(softmax(g_logits[not y]/tau) || softmax(logits[not y]/tau)), (B, C) logits."""
        b, c = logits.shape
        idx = torch.arange(c - 1, device=logits.device).expand(b, c - 1)
        idx = idx + (idx >= y[:, None]).long()  # the C-1 not-true class indices per row
        log_p = F.log_softmax(logits.gather(1, idx) / self.tau, dim=1)
        q = F.softmax(g_logits.gather(1, idx) / self.tau, dim=1)
        if w is None:
            return self.beta * self.tau ** 2 * F.kl_div(log_p, q, reduction="batchmean")
        # row weights w (batched path: 1/b_k per real row, 0 on padding) instead of the batch mean
        return self.beta * self.tau ** 2 * (F.kl_div(log_p, q, reduction="none").sum(1) * w).sum()


class MOON(FedAlgorithm):
    """MOON (Li, He & Song, CVPR 2021, Algorithm 1, eqs. 2-3): model-contrastive local loss

    l = CE + mu * l_con,  l_con = -log( e^{sim(z,z_glob)/tau} / (e^{sim(z,z_glob)/tau} + e^{sim(z,z_prev)/tau}) ),
    sim = cosine, z = ``model.features(x)``; z_glob from the frozen global model, z_prev from the
    client's own model after its previous participation (``state["prev"]``, the client's own).
    The model must provide ``features(x)`` and ``head(z)``: use :class:`MOONHead`.

    Checked against the authors' code (github.com/QinbinLi/MOON, commit 8fcba3c, ``main.py::
    train_net_fedcon`` and ``model.py::ModelFedCon``):

    * **Projection head**: z is the output of their 2-layer projection ``l2(relu(l1(h)))`` (no ReLU on
      z) and the classifier ``l3`` acts on z; :class:`MOONHead` has the same structure.
    * **First participation (round 1)**: their pool of previous models is empty in round 1, so the
      contrastive logits hold only the positive pair and l_con = CE of one logit = 0. Ours: no
      previous model -> l_con = 0 as well (so round 1 equals FedAvg on the same model).
    * Difference, labelled: with partial participation their pool keeps *every* client's network, so
      a client first sampled in round r > 1 uses its own never-trained initial network as the
      negative; ours uses no negative until the client has trained once. With full participation
      (our benchmark) the two coincide. Their ``model_buffer_size = 1`` (one previous model) is ours.
    * Defaults mu = 1, tau = 0.5, out_dim = 256 are their command-line defaults.
    """

    name = "moon"
    batched = MOONHooks

    def __init__(self, mu: float = 1.0, tau: float = 0.5):
        check_positive("mu", mu, strict=False)
        check_positive("tau", tau)
        self.mu, self.tau = float(mu), float(tau)

    def server_init(self, memory, global_model, num_clients):
        for attr in ("features", "head"):
            if not callable(getattr(global_model, attr, None)):
                raise TypeError(f"MOON needs a model with .features(x) and .head(z); "
                                f"{type(global_model).__name__} has no .{attr}")

    def init_state(self, k):
        return {"prev": None}

    def begin_local(self, local):
        if local.state["prev"] is not None:
            local.spare.load_state_dict(local.state["prev"])

    def training_loss(self, local, x, y):
        z = local.model.features(x)
        loss = F.cross_entropy(local.model.head(z), y)
        if local.state["prev"] is None:  # no negative yet: l_con = -log(1) = 0 (authors' round 1)
            return loss
        with torch.no_grad():
            z_glob = local.global_model.features(x)
            z_prev = local.spare.features(x)
        pos = F.cosine_similarity(z, z_glob, dim=1)
        neg = F.cosine_similarity(z, z_prev, dim=1)
        sims = torch.stack([pos, neg], dim=1) / self.tau
        target = torch.zeros(z.shape[0], dtype=torch.long, device=z.device)
        return loss + self.mu * F.cross_entropy(sims, target)

    def end_local(self, local):
        local.state["prev"] = detached(local.model)
        return {}

class FedDisco(FedAlgorithm):
    """FedDisco (Ye et al., ICML 2023, Sec. 4, discrepancy-aware aggregation) on FedAvg training.

    p_k ∝ ReLU(n_k / N - a d_k + b) over this round's clients (N = sum of their n_k). The
    discrepancy d_k compares client k's label distribution D_k with the global one D (uniform over
    the classes present in the federation): ``metric="kl"`` (the authors' default) uses KL(D_k||D)
    normalised to sum 1 over the round's clients, as in their code; ``metric="l2"`` uses the raw
    ||D_k - D||_2. Each client uploads its label counts once, in a setup round before round 1
    (counted in ``bytes_up``); the server keeps ``memory["discrepancy"][k]``. If every p_k would
    be 0, falls back to n_k/N (as the authors' code).
    """

    name = "feddisco"
    needs_setup = True

    def __init__(self, a: float = 0.5, b: float = 0.1, metric: str = "kl"):
        check_positive("a", a, strict=False)
        check_choice("metric", metric, ("kl", "l2"))
        self.a, self.b, self.metric = float(a), float(b), metric

    def setup_upload(self, y, state, num_classes):
        return {"label_counts": torch.bincount(y.cpu(), minlength=num_classes)}

    def setup_entries(self, num_classes):
        """Label counts (C,): whole numbers >= 0, not all 0 (an empty client does not take part)."""
        return {"label_counts": uploads.Tensor((num_classes if num_classes is not None else "C",),
                                               uploads.INTEGERS, low=0, nonzero=True)}

    def receive_setup(self, memory, uploads):
        total = torch.stack([m["label_counts"] for m in uploads]).sum(0)
        present = (total > 0).double()
        global_dist = present / present.sum()
        memory["discrepancy"] = {}
        for m in uploads:
            c = m["label_counts"].double()
            local = c / c.sum()
            if self.metric == "kl":
                nz = local > 0
                d = float((local[nz] * (local[nz] / global_dist[nz]).log()).sum())
            else:
                d = float(torch.linalg.vector_norm(local - global_dist))
            memory["discrepancy"][client_id(m)] = d

    def aggregation_weights(self, memory, uploads):
        base = super().aggregation_weights(memory, uploads)
        d = [memory["discrepancy"][client_id(u)] for u in uploads]
        if self.metric == "kl" and sum(d) > 0:
            d = [v / sum(d) for v in d]
        raw = [max(0.0, p - self.a * dk + self.b) for p, dk in zip(base, d)]
        total = sum(raw)
        return base if total <= 0 else [r / total for r in raw]


ALGORITHMS: dict[str, type[FedAlgorithm]] = {
    "fedavg": FedAvg,
    "fedprox": FedProx,
    "feddyn": FedDyn,
    "fedntd": FedNTD,
    "moon": MOON,
    "feddisco": FedDisco,
}


def build_from_registry(registry: dict, name: str, param: str, hparams: dict):
    """``registry[name](**hparams)``: unknown name -> ValueError naming ``param``, unknown
    hyperparameter -> TypeError listing the allowed ones. Shared by every method registry."""
    key = name.lower() if isinstance(name, str) else name
    check_choice(param, key, registry)
    cls = registry[key]
    allowed = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
    unknown = sorted(set(hparams) - set(allowed))
    if unknown:
        raise TypeError(f"unknown hyperparameter(s) {', '.join(unknown)} for {key}; "
                        f"allowed: {', '.join(allowed) or '(none)'}")
    return cls(**hparams)


def make_algorithm(name: str, **hparams) -> FedAlgorithm:
    """``ALGORITHMS[name](**hparams)``; unknown name -> ValueError, unknown hyperparameter -> TypeError."""
    return build_from_registry(ALGORITHMS, name, "algorithm", hparams)


# ----------------------------------------------------------------------------------------------
# client and server programs
# ----------------------------------------------------------------------------------------------
def frozen_copy(model: nn.Module) -> nn.Module:
    """A deep copy with ``requires_grad`` off, in eval mode (a receiver of broadcast weights)."""
    return copy.deepcopy(model).requires_grad_(False).eval()


def initial_state(method: FedAlgorithm, seed: int, k: int) -> dict[str, Any]:
    """Client k's state before its first step: ``id``, its own mini-batch generator ``batches``
    (``torch_generator(seed, "batches", k)``) and the method's entries."""
    return {"id": k, "batches": torch_generator(seed, "batches", k), **method.init_state(k)}


class GradientClient:
    """Client program of every gradient method: local SGD from the broadcast global weights.

    ``template``: a model of the run's architecture (copied; its ``requires_grad`` flags say what
    is trained). State of client k (``init_state``): ``id`` = k, ``batches`` = its own mini-batch
    generator ``torch_generator(seed, "batches", k)``, plus the method's entries. ``step(data,
    state, broadcast)``: ``data`` = (x (n, ...), y (n,)) on ``device`` (or the client's local set
    ``state["local"]`` = (x, y, task) when it keeps one); ``config.local_epochs`` epochs of SGD
    (lr, momentum, weight decay of ``config``, a fresh optimizer, batches of ``batch_size`` in the
    client's own random order) on ``method.training_loss``; uploads ``{"state", "n", **extra}``.
    A broadcast without ``"state"`` is the setup round: the upload is ``method.setup_upload``.

    ``step_many(datas, states, broadcast)``: the uploads of several clients, called by
    :func:`fedlib.core.protocol.simulate` with a round's participants. With
    ``config.batched_clients`` False (default) it is ``[step(d, s, broadcast) ...]``; with True it
    trains them all at once, equal to that up to float round-off.
    """

    def __init__(self, method: FedAlgorithm, template: nn.Module, config: FedConfig, num_classes: int):
        self.method, self.config, self.num_classes = method, config, num_classes
        if config.batched_clients:
            why = batchable(method, template)
            if why is not None:
                raise ValueError(f"batched_clients=True: {why}; use batched_clients=False")
        self.model = copy.deepcopy(template)
        self.global_model = frozen_copy(template)
        self.spare = frozen_copy(template)
        self._received: Message | None = None
        self._batched = BatchedTrainer(method, self.model, self.global_model) if config.batched_clients else None

    def init_state(self, k: int) -> dict[str, Any]:
        return initial_state(self.method, self.config.seed, k)

    @staticmethod
    def training_data(data, state) -> tuple[Tensor, Tensor]:
        if "local" in state:
            return state["local"][0], state["local"][1]
        return data[0], data[1]

    def step(self, data, state: dict[str, Any], broadcast: Message) -> Message:
        # config.num_threads here too: a Flower node runs step() outside run()'s thread setting, and
        # another thread count changes float round-off (a deployment must equal the in-process run)
        with torch_threads(self.config.num_threads):
            return self._step(data, state, broadcast)

    def _receive(self, broadcast: Message) -> None:
        """Load the broadcast global weights into ``global_model`` (once per message: in one
        process every client of a round gets the same one)."""
        if broadcast is not self._received:
            self.global_model.load_state_dict(broadcast["state"])
            self._received = broadcast

    def _step(self, data, state: dict[str, Any], broadcast: Message) -> Message:
        sender = f"client{state['id']}"
        x, y = self.training_data(data, state)
        if "state" not in broadcast.payload:
            return Message(sender, self.method.setup_upload(y, state, self.num_classes))
        cfg, model = self.config, self.model
        self._receive(broadcast)
        model.load_state_dict(broadcast["state"])
        model.train()
        opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
        local = Local(model, self.global_model, self.spare, state, broadcast)
        self.method.begin_local(local)
        n, bs = int(x.shape[0]), cfg.batch_size
        for _ in range(cfg.local_epochs):
            perm = torch.randperm(n, generator=state["batches"]).to(x.device, non_blocking=True)
            xs, ys = x[perm], y[perm]
            for s in range(0, n, bs):
                loss = self.method.training_loss(local, xs[s:s + bs], ys[s:s + bs])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
        extra = self.method.end_local(local) or {}
        return Message(sender, {"state": detached(model), "n": n, **extra})

    def step_many(self, datas: Sequence[Any], states: Sequence[dict[str, Any]], broadcast: Message) -> list[Message]:
        """The uploads of the clients ``states`` (data ``datas``), in that order.

        ``config.batched_clients`` False, or the setup round: ``[step(d, s, broadcast) ...]``.
        True: the same local SGD for all of them at once
        (:class:`fedlib.federated.batched.BatchedTrainer`), equal to :meth:`step`'s up to float
        round-off (batched matmuls, weighted sums).
        """
        if self._batched is None or "state" not in broadcast.payload or not states:
            return [self.step(d, s, broadcast) for d, s in zip(datas, states)]
        self._receive(broadcast)
        pairs = [self.training_data(d, s) for d, s in zip(datas, states)]
        return self._batched.uploads(pairs, list(states), broadcast, self.config)


def state_entries(model: nn.Module) -> dict[str, uploads.Tensor]:
    """The upload entries of ``model``'s state dict: every tensor with its exact shape and dtype."""
    return {k: uploads.Tensor(tuple(v.shape), (str(v.dtype).removeprefix("torch."),))
            for k, v in model.state_dict().items()}


class GradientServer(Server):
    """Server program of every gradient method: broadcasts ``{"state": global weights,
    **method.broadcast_extra(memory)}`` (or nothing, in the setup round of a method that has one),
    aggregates the uploads with ``method.aggregate``; ``result()`` = the global model.
    ``memory``: the server's own persistent dict (kept across stages by an incremental learner).
    Uploads are checked against the global model (:meth:`expects`): ``state`` with its exact keys,
    shapes and dtypes, finite values, ``n`` an integer >= 1, and the method's own entries; after a
    setup round only the clients that took part in it may upload."""

    def __init__(self, method: FedAlgorithm, global_model: nn.Module, num_clients: int,
                 memory: dict | None = None, num_classes: int | None = None):
        self.method, self.model, self.num_classes = method, global_model, num_classes
        self.memory = {} if memory is None else memory
        self.in_setup = method.needs_setup
        self.enrolled: set[str] | None = None   # the setup round's clients
        method.server_init(self.memory, global_model, num_clients)

    def broadcast(self) -> Message:
        if self.in_setup:
            return EMPTY
        extra = self.method.broadcast_extra(self.memory)
        return Message("server", {"state": self.model.state_dict(), **extra})

    def expects(self) -> uploads.Expected:
        name = self.method.name
        if self.in_setup:
            return uploads.Expected((self.method.setup_entries(self.num_classes),), what=f"{name} setup upload")
        form = {"state": state_entries(self.model), "n": uploads.Number(low=1, integer=True),
                **self.method.upload_entries(self.memory, self.model)}
        return uploads.Expected((form,), senders=self.enrolled, what=f"{name} upload")

    def absorb(self, messages: list[Message]) -> None:
        if self.in_setup:
            self.method.receive_setup(self.memory, messages)
            self.enrolled = {m.sender for m in messages}
            self.in_setup = False
        else:
            self.method.aggregate(self.memory, self.model, messages)

    def result(self) -> nn.Module:
        return self.model


# ----------------------------------------------------------------------------------------------
# history and driver
# ----------------------------------------------------------------------------------------------
@dataclass
class History:
    """Per-evaluation records (rounds with ``r % eval_every == 0`` and the last round).

    ``wall_s``: cumulative measured seconds of federated work (setup round, broadcast, local
    training, upload, aggregation: :class:`fedlib.core.messages.Cost` ``seconds``) since the start,
    *excluding* test evaluation and callbacks. ``bytes_up`` / ``bytes_down``: cumulative measured
    Message bytes (setup uploads included in ``bytes_up``). ``participants``: the sampled client ids
    of every round (all rounds). ``final_state``: the final global model's state dict, on CPU.
    ``cost``: the whole run's measured :class:`Cost`.
    """

    algorithm: str = ""
    config: dict = field(default_factory=dict)
    round: list[int] = field(default_factory=list)
    test_acc: list[float] = field(default_factory=list)
    wall_s: list[float] = field(default_factory=list)
    bytes_up: list[int] = field(default_factory=list)
    bytes_down: list[int] = field(default_factory=list)
    participants: list[list[int]] = field(default_factory=list)
    final_state: dict[str, Tensor] | None = field(default=None, repr=False)  # global weights (CPU)
    cost: Cost = field(default_factory=Cost)
    setup_bytes_up: int = 0  # the setup round's share of ``bytes_up`` (FedDisco's label counts; else 0)

    @property
    def final_acc(self) -> float:
        return self.test_acc[-1]

    @property
    def best_acc(self) -> float:
        return max(self.test_acc)

    def time_to_final(self, frac: float = 1.0) -> float:
        """First ``wall_s`` at which test_acc >= frac * final_acc (frac in (0, 1])."""
        if not 0.0 < frac <= 1.0:
            raise ValueError(f"frac must be in (0, 1], got {frac!r}")
        target = frac * self.final_acc
        for acc, t in zip(self.test_acc, self.wall_s):
            if acc >= target:
                return t
        return self.wall_s[-1]

    def to_frame(self):
        return pd.DataFrame({"round": self.round, "test_acc": self.test_acc, "wall_s": self.wall_s,
                             "bytes_up": self.bytes_up, "bytes_down": self.bytes_down})


def _warmup_optimizer() -> None:
    p = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([p], lr=0.1, momentum=0.9, weight_decay=1e-5)
    (p * 2).sum().backward()
    opt.step()


def run_federated(model_fn: Callable[[], nn.Module], clients: ClientData, test: tuple[Tensor, Tensor] | None,
                  algorithm: FedAlgorithm | str, config: FedConfig, progress: bool = True,
                  num_classes: int | None = None, *, callbacks: Sequence[RoundCallback] = (),
                  states: ClientStates | None = None, memory: dict | None = None,
                  evaluate: Callable[[nn.Module, Tensor, Tensor], float] | None = None) -> History:
    """Train ``model_fn()`` federatedly with ``algorithm``; return the :class:`History`.

    One :class:`GradientServer` and one :class:`GradientClient` driven by
    :func:`fedlib.core.protocol.simulate`. Per round r: sample ceil(participation*K) distinct
    clients (CPU torch.Generator seeded with ``seed``, server side); sampled *empty* clients are
    skipped (no broadcast, no upload); broadcast (bytes down); local SGD of each participant in
    increasing k (mini-batch order from the client's own generator ``torch_generator(seed,
    "batches", k)``, a fresh SGD optimizer per update); uploads (bytes up); aggregation; test
    accuracy every ``eval_every`` rounds and at the last round (``test=None``: no evaluation,
    ``test_acc`` NaN; ``evaluate(model, x, y)`` replaces the plain top-1 accuracy). Methods with a
    setup round (FedDisco) run it first. ``callbacks``: ``callback(r, server, cost)`` after round
    r (``server.model`` = the global model), not counted in seconds. ``states``: the clients'
    states to use (and keep; default fresh ones), ``memory``: the server's (default a fresh dict).
    ``seed_everything(seed)`` is called before ``model_fn()``, so the same config gives
    bit-identical results on CPU.
    """
    with torch_threads(config.num_threads):
        return _run(model_fn, clients, test, algorithm, config, progress, num_classes, callbacks, states,
                    memory, evaluate)


def _run(model_fn, clients, test, algorithm, config, progress, num_classes, callbacks, states, memory,
         evaluate) -> History:
    if isinstance(algorithm, str):
        algorithm = make_algorithm(algorithm)
    if not isinstance(algorithm, FedAlgorithm):
        raise TypeError(f"algorithm must be a FedAlgorithm or a name, got {type(algorithm).__name__}")
    if len(clients) == 0:
        raise ValueError("clients must hold at least one client")
    device = resolve_device(config.device)
    _warmup_optimizer()  # one-off lazy imports inside torch.optim stay out of wall_s

    data = []
    for k, (x, y) in enumerate(clients):
        if x.shape[0] != y.shape[0]:
            raise ValueError(f"client {k}: x has {x.shape[0]} rows but y has {y.shape[0]}")
        data.append((x.to(device), y.to(device, dtype=torch.long)))
    active = [k for k, (x, _) in enumerate(data) if x.shape[0] > 0]
    if not active:
        raise ValueError("every client is empty")
    if test is None:
        x_test = y_test = None
    else:
        x_test, y_test = test[0].to(device), test[1].to(device, dtype=torch.long)
    if num_classes is None:
        test_max = [] if y_test is None else [int(y_test.max())]
        num_classes = 1 + max([int(y.max()) for _, y in data if y.numel()] + test_max)

    seed_everything(config.seed)
    global_model = model_fn().to(device)
    client = GradientClient(algorithm, global_model, config, num_classes)
    global_model.requires_grad_(False).eval()  # the server's model: only aggregation writes it
    server = GradientServer(algorithm, global_model, len(active), memory, num_classes)
    if states is None:
        states = ClientStates(client)
    sample_gen = torch.Generator().manual_seed(config.seed)
    hist = History(algorithm=repr(algorithm), config=asdict(config))
    score = evaluate or model_accuracy

    def participants(r: int) -> list[int]:
        ids = sample_clients(len(data), config.participation, sample_gen)
        hist.participants.append(ids)
        return [k for k in ids if data[k][0].shape[0] > 0]

    def record(r: int, server_: GradientServer, cost: Cost) -> None:
        if r % config.eval_every and r != config.rounds:
            return
        acc = float("nan") if x_test is None else score(global_model, x_test, y_test)
        total = setup + cost
        hist.round.append(r)
        hist.test_acc.append(acc)
        hist.wall_s.append(total.seconds)
        hist.bytes_up.append(total.bytes_up)
        hist.bytes_down.append(total.bytes_down)
        if progress:
            bar.set_postfix(acc=f"{acc:.4f}")

    setup = Cost()
    if algorithm.needs_setup:
        setup = simulate(server, client, data, 1, participants=lambda r: active, states=states, device=device)
    bar = _tqdm(config.rounds, progress, algorithm.name)
    cost = simulate(server, client, data, config.rounds, participants=participants, states=states,
                    callbacks=[record, *callbacks, lambda r, s, c: bar.update(1)], device=device)
    bar.close()
    hist.cost = setup + cost
    hist.setup_bytes_up = setup.bytes_up
    hist.final_state = {k: v.detach().cpu().clone() for k, v in global_model.state_dict().items()}
    return hist


def _tqdm(total: int, progress: bool, desc: str):
    return tqdm(total=total, disable=not progress, desc=desc)
