"""One federated training loop for every gradient-based method.

``run_federated`` drives rounds of *sample clients -> broadcast -> local SGD -> upload ->
aggregate -> evaluate*. A method is a :class:`FedAlgorithm` object whose hooks change only
what differs from FedAvg: an extra local loss term, per-client persistent state, or the server
aggregation. Every broadcast and upload is a :class:`fedlib.core.messages.Message`, so the byte
counts in :class:`History` are measured, not estimated.

Models are any ``torch.nn.Module`` mapping ``x`` (N, ...) to logits (N, C); clients are
in-memory tensors. The AFL baselines (Zhuang et al., 2024, Sec. 4.4-4.5) train a head on a
frozen backbone's cached features with :class:`LinearHead` (or :class:`MOONHead` for MOON).

Implemented: FedAvg, FedProx, FedDyn, FedNTD, MOON, FedDisco (see ``ALGORITHMS``).
"""
from __future__ import annotations

import copy
import inspect
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedlib.core.messages import Message
from fedlib.evaluation.metrics import model_accuracy
from fedlib.core.validate import check_choice, check_positive
from fedlib.core.devices import resolve_device
from fedlib.core.seeds import seed_everything

__all__ = [
    "FedConfig", "FedContext", "History", "FedAlgorithm", "FedAvg", "FedProx", "FedDyn",
    "FedNTD", "MOON", "FedDisco", "ALGORITHMS", "make_algorithm", "run_federated",
    "LinearHead", "MLPHead", "MOONHead", "accuracy", "average_states", "sample_clients",
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

    def __post_init__(self) -> None:
        for name in ("rounds", "local_epochs", "batch_size", "eval_every"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an int, got {value!r}")
            check_positive(name, value)
        check_positive("lr", self.lr)
        if self.num_threads is not None:
            if isinstance(self.num_threads, bool) or not isinstance(self.num_threads, int):
                raise ValueError(f"num_threads must be an int or None, got {self.num_threads!r}")
            check_positive("num_threads", self.num_threads)
        if not 0.0 <= self.momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum!r}")
        check_positive("weight_decay", self.weight_decay, strict=False)
        if not 0.0 < self.participation <= 1.0:
            raise ValueError(f"participation must be in (0, 1], got {self.participation!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be a non-negative int, got {self.seed!r}")
        if not isinstance(self.device, (str, torch.device)):
            raise ValueError(f"device must be 'cpu', 'cuda[:i]' or 'auto', got {self.device!r}")
        if isinstance(self.device, str) and not (
            self.device in ("auto", "cpu") or self.device.startswith("cuda")
        ):
            raise ValueError(f"device must be 'cpu', 'cuda[:i]' or 'auto', got {self.device!r}")


class LinearHead(nn.Module):
    """Linear classifier with bias on (flattened) features; ``features`` is the identity."""

    def __init__(self, in_dim: int, num_classes: int):
        super().__init__()
        self.linear = nn.Linear(in_dim, num_classes)

    def features(self, x: Tensor) -> Tensor:
        return x.flatten(1)

    def head(self, z: Tensor) -> Tensor:
        return self.linear(z)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear(x.flatten(1))


class MLPHead(nn.Module):
    """Two-layer head: ``features`` = ReLU(Linear(in_dim, hidden)), ``head`` = Linear(hidden, C).

    A small trainable representation for methods that need one. (MOON's own head, with the
    authors' 2-layer projection, is :class:`MOONHead`.)
    """

    def __init__(self, in_dim: int, num_classes: int, hidden: int = 256):
        super().__init__()
        self.proj = nn.Linear(in_dim, hidden)
        self.classifier = nn.Linear(hidden, num_classes)

    def features(self, x: Tensor) -> Tensor:
        return F.relu(self.proj(x.flatten(1)))

    def head(self, z: Tensor) -> Tensor:
        return self.classifier(z)

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(F.relu(self.proj(x.flatten(1))))


class MOONHead(nn.Module):
    """MOON's projection head on (frozen) features, as in the authors' ``ModelFedCon``:
    ``z = l2(ReLU(l1(h)))`` (``features``, the contrasted representation, no ReLU on z) and
    logits ``l3(z)`` (``head``). ``l1``: in_dim -> hidden (the authors use hidden = in_dim, the
    default), ``l2``: hidden -> out_dim (256), ``l3``: out_dim -> C.
    """

    def __init__(self, in_dim: int, num_classes: int, hidden: int | None = None, out_dim: int = 256):
        super().__init__()
        hidden = in_dim if hidden is None else hidden
        check_positive("hidden", hidden)
        check_positive("out_dim", out_dim)
        self.l1 = nn.Linear(in_dim, hidden)
        self.l2 = nn.Linear(hidden, out_dim)
        self.l3 = nn.Linear(out_dim, num_classes)

    def features(self, x: Tensor) -> Tensor:
        return self.l2(F.relu(self.l1(x.flatten(1))))

    def head(self, z: Tensor) -> Tensor:
        return self.l3(z)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.features(x))


# ----------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------
def average_states(states: Sequence[dict[str, Tensor]], weights: Sequence[float]) -> dict[str, Tensor]:
    """sum_k w_k * state_k for floating entries; integer buffers (e.g. BN counters) from the first."""
    out: dict[str, Tensor] = {}
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


@dataclass
class FedContext:
    """What hooks may need about the run (set by ``run_federated``)."""

    config: FedConfig
    device: torch.device
    num_clients: int
    num_classes: int
    client_sizes: list[int]
    client_labels: list[Tensor]  # per-client label tensors (on device); read only
    generator: torch.Generator  # CPU generator for mini-batch shuffling (seeded with seed + 1)
    round: int = 0


# ----------------------------------------------------------------------------------------------
# algorithms
# ----------------------------------------------------------------------------------------------
class FedAlgorithm:
    """Base strategy = FedAvg's mechanics; subclasses override the hooks that differ.

    Hooks (all optional): ``setup`` (reset state, return one-off setup uploads),
    ``init_client_state``, ``begin_local``, ``local_loss`` (extra loss term added to the
    cross-entropy), ``training_loss`` (the whole mini-batch loss), ``end_local`` (extra upload
    entries, client-state updates), ``aggregation_weights`` and ``server_aggregate``.
    """

    name = "base"

    # -- lifecycle ---------------------------------------------------------------------------
    def setup(self, ctx: FedContext, global_model: nn.Module) -> list[Message]:
        """Reset all state for a new run; return setup uploads (their bytes count as upload)."""
        self.ctx = ctx
        self.client_states: dict[int, dict[str, Any]] = {}
        return []

    def hparams(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in inspect.signature(type(self).__init__).parameters if k != "self"}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.hparams().items())
        return f"{type(self).__name__}({args})"

    # -- client side -------------------------------------------------------------------------
    def init_client_state(self, k: int) -> dict[str, Any]:
        return {}

    def client_state(self, k: int) -> dict[str, Any]:
        if k not in self.client_states:
            self.client_states[k] = self.init_client_state(k)
        return self.client_states[k]

    def begin_local(self, model: nn.Module, global_model: nn.Module, k: int, client_state: dict) -> None:
        """Called after the local model received the global weights, before local SGD."""

    def local_loss(self, model: nn.Module, x: Tensor, y: Tensor, global_model: nn.Module,
                   client_state: dict, logits: Tensor | None = None) -> Tensor | None:
        """Extra loss term added to the cross-entropy (None = nothing)."""
        return None

    def training_loss(self, model: nn.Module, x: Tensor, y: Tensor, global_model: nn.Module,
                      client_state: dict) -> Tensor:
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        extra = self.local_loss(model, x, y, global_model, client_state, logits=logits)
        return loss if extra is None else loss + extra

    def end_local(self, model: nn.Module, global_model: nn.Module, k: int, client_state: dict) -> dict:
        """Called after local SGD; returns extra upload payload entries."""
        return {}

    def local_update(self, k: int, model: nn.Module, global_model: nn.Module, x: Tensor, y: Tensor) -> Message:
        """Local SGD on client k starting from the global weights; returns the upload Message."""
        cfg = self.ctx.config
        model.load_state_dict(global_model.state_dict())
        model.train()
        opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum,
                              weight_decay=cfg.weight_decay)
        cstate = self.client_state(k)
        self.begin_local(model, global_model, k, cstate)
        n, bs = int(x.shape[0]), cfg.batch_size
        for _ in range(cfg.local_epochs):
            perm = torch.randperm(n, generator=self.ctx.generator).to(x.device, non_blocking=True)
            xs, ys = x[perm], y[perm]
            for s in range(0, n, bs):
                loss = self.training_loss(model, xs[s:s + bs], ys[s:s + bs], global_model, cstate)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
        extra = self.end_local(model, global_model, k, cstate) or {}
        state = {key: t.detach().clone() for key, t in model.state_dict().items()}
        return Message(sender=f"client{k}", payload={"state": state, "n": n, **extra})

    # -- server side -------------------------------------------------------------------------
    def aggregation_weights(self, uploads: list[Message]) -> list[float]:
        """FedAvg weights n_k / sum n over this round's uploads."""
        total = sum(u["n"] for u in uploads)
        return [u["n"] / total for u in uploads]

    def server_aggregate(self, global_model: nn.Module, uploads: list[Message]) -> None:
        """Load the weighted average of the uploaded states into ``global_model``."""
        weights = self.aggregation_weights(uploads)
        global_model.load_state_dict(average_states([u["state"] for u in uploads], weights))


class FedAvg(FedAlgorithm):
    """FedAvg (McMahan et al., AISTATS 2017, Algorithm 1): local SGD, w <- sum_k (n_k/n) w_k."""

    name = "fedavg"

    def __init__(self):
        pass


def _param_pairs(model: nn.Module, global_model: nn.Module) -> list[tuple[Tensor, Tensor]]:
    return list(zip(model.parameters(), global_model.parameters()))


class FedProx(FedAlgorithm):
    """FedProx (Li et al., MLSys 2020, Algorithm 2, eq. (2)): local objective
    F_k(w) + mu/2 ||w - w^t||^2 around the broadcast global weights w^t; FedAvg aggregation."""

    name = "fedprox"

    def __init__(self, mu: float = 0.01):
        check_positive("mu", mu, strict=False)
        self.mu = float(mu)

    def begin_local(self, model, global_model, k, client_state):
        self._pairs = _param_pairs(model, global_model)

    def local_loss(self, model, x, y, global_model, client_state, logits=None):
        prox = sum(((p - g) ** 2).sum() for p, g in self._pairs)
        return 0.5 * self.mu * prox


class FedDyn(FedAlgorithm):
    """FedDyn (Acar et al., ICLR 2021, Algorithm 1), unweighted as printed.

    Client k:  theta_k = argmin L_k(theta) - <g_k, theta> + alpha/2 ||theta - theta^{t-1}||^2,
               then g_k <- g_k - alpha (theta_k - theta^{t-1})   (g_k = grad L_k(theta_k), init 0).
    Server:    h <- h - alpha/m sum_{k in P_t} (theta_k - theta^{t-1})   (m = number of clients),
               theta^t = mean_{k in P_t} theta_k - h / alpha.
    Applied to parameters; buffers (e.g. BN statistics) are plainly averaged. m counts the
    non-empty clients (empty ones can never participate).
    """

    name = "feddyn"

    def __init__(self, alpha: float = 0.01):
        check_positive("alpha", alpha)
        self.alpha = float(alpha)

    def setup(self, ctx, global_model):
        out = super().setup(ctx, global_model)
        self.param_names = [n for n, _ in global_model.named_parameters()]
        self.h = {n: torch.zeros_like(p) for n, p in global_model.named_parameters()}
        self.m = sum(1 for n in ctx.client_sizes if n > 0)
        return out

    def init_client_state(self, k):
        return {"grad": [torch.zeros_like(h) for h in self.h.values()]}

    def begin_local(self, model, global_model, k, client_state):
        self._pairs = _param_pairs(model, global_model)

    def local_loss(self, model, x, y, global_model, client_state, logits=None):
        lin = sum((p * g).sum() for (p, _), g in zip(self._pairs, client_state["grad"]))
        quad = sum(((p - g) ** 2).sum() for p, g in self._pairs)
        return 0.5 * self.alpha * quad - lin

    @torch.no_grad()
    def end_local(self, model, global_model, k, client_state):
        for (p, g), grad in zip(self._pairs, client_state["grad"]):
            grad.sub_(p - g, alpha=self.alpha)
        return {}

    @torch.no_grad()
    def server_aggregate(self, global_model, uploads):
        prev = {n: p.detach().clone() for n, p in global_model.named_parameters()}
        mean = average_states([u["state"] for u in uploads], [1.0 / len(uploads)] * len(uploads))
        for n in self.param_names:
            # sum_k (theta_k - theta_prev) = |P_t| (mean - theta_prev)
            self.h[n].sub_(mean[n] - prev[n], alpha=self.alpha * len(uploads) / self.m)
            mean[n] = mean[n] - self.h[n] / self.alpha
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

    def __init__(self, beta: float = 1.0, tau: float = 1.0):
        check_positive("beta", beta, strict=False)
        check_positive("tau", tau)
        self.beta, self.tau = float(beta), float(tau)

    def begin_local(self, model, global_model, k, client_state):
        global_model.eval()

    def local_loss(self, model, x, y, global_model, client_state, logits=None):
        if logits is None:
            logits = model(x)
        with torch.no_grad():
            g_logits = global_model(x)
        b, c = logits.shape
        idx = torch.arange(c - 1, device=logits.device).expand(b, c - 1)
        idx = idx + (idx >= y[:, None]).long()  # the C-1 not-true class indices per row
        log_p = F.log_softmax(logits.gather(1, idx) / self.tau, dim=1)
        q = F.softmax(g_logits.gather(1, idx) / self.tau, dim=1)
        return self.beta * self.tau ** 2 * F.kl_div(log_p, q, reduction="batchmean")


class MOON(FedAlgorithm):
    """MOON (Li, He & Song, CVPR 2021, Algorithm 1, eqs. 2-3): model-contrastive local loss

    l = CE + mu * l_con,  l_con = -log( e^{sim(z,z_glob)/tau} / (e^{sim(z,z_glob)/tau} + e^{sim(z,z_prev)/tau}) ),
    sim = cosine, z = ``model.features(x)``; z_glob from the frozen global model, z_prev from the
    client's own model after its previous participation. The model must provide ``features(x)`` and
    ``head(z)``: use :class:`MOONHead` (the authors' projection head). Stores one model per client.

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

    def __init__(self, mu: float = 1.0, tau: float = 0.5):
        check_positive("mu", mu, strict=False)
        check_positive("tau", tau)
        self.mu, self.tau = float(mu), float(tau)

    def setup(self, ctx, global_model):
        for attr in ("features", "head"):
            if not callable(getattr(global_model, attr, None)):
                raise TypeError(f"MOON needs a model with .features(x) and .head(z); "
                                f"{type(global_model).__name__} has no .{attr}")
        self.prev_model = copy.deepcopy(global_model).requires_grad_(False).eval()
        return super().setup(ctx, global_model)

    def init_client_state(self, k):
        return {"prev": None}

    def begin_local(self, model, global_model, k, client_state):
        global_model.eval()
        if client_state["prev"] is not None:
            self.prev_model.load_state_dict(client_state["prev"])

    def training_loss(self, model, x, y, global_model, client_state):
        z = model.features(x)
        loss = F.cross_entropy(model.head(z), y)
        if client_state["prev"] is None:  # no negative yet: l_con = -log(1) = 0 (authors' round 1)
            return loss
        with torch.no_grad():
            z_glob = global_model.features(x)
            z_prev = self.prev_model.features(x)
        pos = F.cosine_similarity(z, z_glob, dim=1)
        neg = F.cosine_similarity(z, z_prev, dim=1)
        sims = torch.stack([pos, neg], dim=1) / self.tau
        target = torch.zeros(z.shape[0], dtype=torch.long, device=z.device)
        return loss + self.mu * F.cross_entropy(sims, target)

    def end_local(self, model, global_model, k, client_state):
        client_state["prev"] = {key: t.detach().clone() for key, t in model.state_dict().items()}
        return {}


class FedDisco(FedAlgorithm):
    """FedDisco (Ye et al., ICML 2023, Sec. 4, discrepancy-aware aggregation) on FedAvg training.

    p_k ∝ ReLU(n_k / N - a d_k + b) over this round's clients (N = sum of their n_k). The
    discrepancy d_k compares client k's label distribution D_k with the global one D (uniform over
    the classes present in the federation): ``metric="kl"`` (the authors' default) uses KL(D_k||D)
    normalised to sum 1 over the round's clients, as in their code; ``metric="l2"`` uses the raw
    ||D_k - D||_2. Each client uploads its label counts once, before round 1 (counted in
    ``bytes_up``). If every p_k would be 0, falls back to n_k/N (as the authors' code).
    """

    name = "feddisco"

    def __init__(self, a: float = 0.5, b: float = 0.1, metric: str = "kl"):
        check_positive("a", a, strict=False)
        check_choice("metric", metric, ("kl", "l2"))
        self.a, self.b, self.metric = float(a), float(b), metric

    def setup(self, ctx, global_model):
        out = super().setup(ctx, global_model)
        msgs = []
        for k, y in enumerate(ctx.client_labels):
            if y.numel():
                counts = torch.bincount(y.cpu(), minlength=ctx.num_classes)
                msgs.append(Message(sender=f"client{k}", payload={"label_counts": counts}))
        # server side: discrepancy per client from the uploaded counts
        total = torch.stack([m["label_counts"] for m in msgs]).sum(0)
        present = (total > 0).double()
        global_dist = present / present.sum()
        self.discrepancy = {}
        for m in msgs:
            k = int(m.sender.removeprefix("client"))
            c = m["label_counts"].double()
            local = c / c.sum()
            if self.metric == "kl":
                nz = local > 0
                self.discrepancy[k] = float((local[nz] * (local[nz] / global_dist[nz]).log()).sum())
            else:
                self.discrepancy[k] = float(torch.linalg.vector_norm(local - global_dist))
        return out + msgs

    def aggregation_weights(self, uploads):
        base = super().aggregation_weights(uploads)
        d = [self.discrepancy[int(u.sender.removeprefix("client"))] for u in uploads]
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
# history and loop
# ----------------------------------------------------------------------------------------------
@dataclass
class History:
    """Per-evaluation records (rounds with ``r % eval_every == 0`` and the last round).

    ``wall_s``: cumulative seconds of federated work (setup, sampling, broadcast, local training,
    upload, aggregation) since the start, *excluding* test evaluation. ``bytes_up`` /
    ``bytes_down``: cumulative measured Message bytes (setup uploads included in ``bytes_up``).
    ``participants``: the sampled client ids of every round (all rounds). ``final_state``: the
    final global model's state dict, on CPU.
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
        import pandas as pd

        return pd.DataFrame({"round": self.round, "test_acc": self.test_acc, "wall_s": self.wall_s,
                             "bytes_up": self.bytes_up, "bytes_down": self.bytes_down})


def _warmup_optimizer() -> None:
    p = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([p], lr=0.1, momentum=0.9, weight_decay=1e-5)
    (p * 2).sum().backward()
    opt.step()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_federated(model_fn: Callable[[], nn.Module], clients: ClientData, test: tuple[Tensor, Tensor] | None,
                  algorithm: FedAlgorithm | str, config: FedConfig, progress: bool = True,
                  num_classes: int | None = None) -> History:
    """Train ``model_fn()`` federatedly with ``algorithm``; return the :class:`History`.

    Per round r: sample ceil(participation*K) distinct clients (CPU torch.Generator seeded with
    ``seed``); sampled *empty* clients are skipped (no broadcast, no upload); broadcast the global
    state to the others (bytes down); local SGD (mini-batch order from one CPU torch.Generator
    seeded with ``seed + 1``, consumed in client order; a fresh SGD optimizer per client);
    uploads (bytes up); ``algorithm.server_aggregate``; test accuracy every ``eval_every`` rounds
    and at the last round (``test=None``: no evaluation, ``test_acc`` is NaN at those rounds).
    ``seed_everything(seed)`` is called before ``model_fn()``, so the same config gives
    bit-identical results on CPU.
    """
    threads = torch.get_num_threads()
    if config.num_threads is not None:
        torch.set_num_threads(config.num_threads)
    try:
        return _run(model_fn, clients, test, algorithm, config, progress, num_classes)
    finally:
        torch.set_num_threads(threads)


def _run(model_fn, clients, test, algorithm, config, progress, num_classes) -> History:
    if isinstance(algorithm, str):
        algorithm = make_algorithm(algorithm)
    if not isinstance(algorithm, FedAlgorithm):
        raise TypeError(f"algorithm must be a FedAlgorithm or a name, got {type(algorithm).__name__}")
    if len(clients) == 0:
        raise ValueError("clients must hold at least one client")
    device = resolve_device(config.device)
    _warmup_optimizer()  # one-off lazy imports inside torch.optim stay out of wall_s
    t0 = time.perf_counter()

    data = []
    for k, (x, y) in enumerate(clients):
        if x.shape[0] != y.shape[0]:
            raise ValueError(f"client {k}: x has {x.shape[0]} rows but y has {y.shape[0]}")
        data.append((x.to(device), y.to(device, dtype=torch.long)))
    if all(x.shape[0] == 0 for x, _ in data):
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
    local_model = copy.deepcopy(global_model)
    global_model.requires_grad_(False).eval()  # frozen reference/teacher during local training
    sample_gen = torch.Generator().manual_seed(config.seed)
    ctx = FedContext(config=config, device=device, num_clients=len(data), num_classes=num_classes,
                     client_sizes=[int(x.shape[0]) for x, _ in data],
                     client_labels=[y for _, y in data],
                     generator=torch.Generator().manual_seed(config.seed + 1))
    setup_msgs = algorithm.setup(ctx, global_model)

    hist = History(algorithm=repr(algorithm), config=asdict(config))
    bytes_up = sum(m.nbytes for m in setup_msgs)
    bytes_down = 0
    eval_s = 0.0
    bar = _tqdm(range(1, config.rounds + 1), disable=not progress, desc=algorithm.name)
    for r in bar:
        ctx.round = r
        ids = sample_clients(len(data), config.participation, sample_gen)
        hist.participants.append(ids)
        active = [k for k in ids if ctx.client_sizes[k] > 0]
        if active:
            broadcast = Message(sender="server", payload={"state": global_model.state_dict()})
            bytes_down += broadcast.nbytes * len(active)
            uploads = [algorithm.local_update(k, local_model, global_model, *data[k]) for k in active]
            bytes_up += sum(u.nbytes for u in uploads)
            algorithm.server_aggregate(global_model, uploads)
            del uploads
        if r % config.eval_every == 0 or r == config.rounds:
            _sync(device)
            t_eval = time.perf_counter()
            acc = float("nan") if x_test is None else model_accuracy(global_model, x_test, y_test)
            hist.round.append(r)
            hist.test_acc.append(acc)
            hist.wall_s.append(t_eval - t0 - eval_s)
            hist.bytes_up.append(bytes_up)
            hist.bytes_down.append(bytes_down)
            eval_s += time.perf_counter() - t_eval
            bar.set_postfix(acc=f"{acc:.4f}")
    hist.final_state = {k: v.detach().cpu().clone() for k, v in global_model.state_dict().items()}
    return hist


def _tqdm(iterable, **kw):
    from tqdm import tqdm

    return tqdm(iterable, **kw)
