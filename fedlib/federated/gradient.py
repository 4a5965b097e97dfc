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

__all__ = [
    "FedConfig", "History", "Local", "FedAlgorithm", "FedAvg", "FedProx", "FedDyn", "FedNTD", "MOON",
    "FedDisco", "ALGORITHMS", "make_algorithm", "build_from_registry", "GradientClient", "GradientServer",
    "run_federated", "LinearHead", "MLPHead", "MOONHead", "average_states", "sample_clients", "client_id",
    "LocalBatch", "batchable", "BATCHABLE_MODULES",
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
    # mini-batch step; GradientClient.step_many), equal to the per-client loop up to float
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


@dataclass
class LocalBatch:
    """What a method's *batched* client hooks see (``FedConfig(batched_clients=True)``): the m
    clients of one round trained at once. Slot j is client ``states[j]["id"]``; slots are ordered
    by decreasing number of local steps, so the clients still training at step t are the first
    m_t slots and every per-client tensor of a step is a prefix ``[:m_t]`` of the stacked one.

    ``params``: the trained parameters stacked over clients, name -> (m, ...), updated in place by
    the SGD steps (after training: the clients' final weights); ``frozen``: the parameters that are
    not trained (shared); ``global_params``: the broadcast weights, name -> (...);
    ``model`` / ``global_model``: the architecture (its own weights unused; ``call`` runs it for
    all clients) and the frozen global model; ``scratch``: what ``begin_batch`` precomputes.
    """

    model: nn.Module
    global_model: nn.Module
    states: list[dict[str, Any]]
    broadcast: Message
    params: dict[str, Tensor]
    frozen: dict[str, Tensor]
    global_params: dict[str, Tensor]
    scratch: dict[str, Any] = field(default_factory=dict)

    def call(self, params: dict[str, Tensor], x: Tensor, method: str = "forward",
             frozen: dict[str, Tensor] | None = None) -> Tensor:
        """``model.<method>`` (forward, features, head) of every client at once: ``params`` name ->
        (m_t, ...), ``x`` (m_t, B, ...) -> (m_t, B, ...); ``frozen`` (default ``self.frozen``): the
        untrained parameters, shared by all clients."""
        m = x.shape[0]
        shared = self.frozen if frozen is None else frozen
        return _batched_call(self.model, {**{n: t.expand(m, *t.shape) for n, t in shared.items()}, **params}, x,
                             method)


class _BatchedLinear(torch.autograd.Function):
    """x (m, B, i), weight (m, o, i), bias (m, o) or None -> (m, B, o): client j's rows through its
    own Linear layer. The products are laid out as W x^T and g^T x, measured 2-4x faster on CPU
    than what vmap(F.linear) and its backward use (x W^T and x^T g)."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        out = torch.bmm(weight, x.transpose(1, 2))
        if bias is not None:
            out = out + bias.unsqueeze(-1)
        return out.transpose(1, 2)

    @staticmethod
    def backward(ctx, g):
        x, weight = ctx.saved_tensors
        gx = torch.bmm(g, weight) if ctx.needs_input_grad[0] else None
        gw = torch.bmm(g.transpose(1, 2), x) if ctx.needs_input_grad[1] else None
        gb = g.sum(1) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return gx, gw, gb


def _batched_call(module: nn.Module, params: dict[str, Tensor], x: Tensor, method: str = "forward",
                  prefix: str = "") -> Tensor:
    """``module.<method>(x)`` of m clients at once, x (m, B, ...), parameters ``params[prefix + name]``
    stacked (m, ...); for the modules of ``BATCHABLE_MODULES`` (the heads' methods spelled out as in
    their classes; the equality tests check them against the per-client path)."""
    t = type(module)
    if t in (LinearHead, MLPHead, MOONHead) and method == "forward":
        return _batched_call(module, params, _batched_call(module, params, x, "features", prefix), "head", prefix)
    if method not in ("forward", "features", "head") or (method != "forward" and t not in (LinearHead, MLPHead, MOONHead)):
        raise ValueError(f"no batched {t.__name__}.{method}")
    if t is nn.Linear:
        return _BatchedLinear.apply(x, params[prefix + "weight"], params.get(prefix + "bias"))
    if t is nn.Sequential:
        for name, child in module.named_children():
            x = _batched_call(child, params, x, "forward", f"{prefix}{name}.")
        return x
    if t is nn.Identity:
        return x
    if t is nn.Flatten:  # its dims counted without the client dim
        return x.flatten(module.start_dim + (module.start_dim >= 0), module.end_dim + (module.end_dim >= 0))
    if t is LinearHead:
        return x.flatten(2) if method == "features" else _batched_call(module.linear, params, x, prefix=f"{prefix}linear.")
    if t is MLPHead:
        if method == "features":
            return F.relu(_batched_call(module.proj, params, x.flatten(2), prefix=f"{prefix}proj."))
        return _batched_call(module.classifier, params, x, prefix=f"{prefix}classifier.")
    if t is MOONHead:
        if method == "features":
            h = F.relu(_batched_call(module.l1, params, x.flatten(2), prefix=f"{prefix}l1."))
            return _batched_call(module.l2, params, h, prefix=f"{prefix}l2.")
        return _batched_call(module.l3, params, x, prefix=f"{prefix}l3.")
    if t in BATCHABLE_MODULES:  # element-wise activations
        return module(x)
    raise ValueError(f"the batched client path does not support {t.__name__}")


def weighted_cross_entropy(logits: Tensor, y: Tensor, w: Tensor) -> Tensor:
    """sum over clients and rows of ``w * CE(logits, y)``: logits (m, B, C), y / w (m, B); with
    ``w`` = 1/b_k on the b_k real rows of client k's mini-batch (0 on padding) this is the sum of
    the clients' mean cross-entropies."""
    ce = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none")
    return (ce * w.flatten()).sum()


# ----------------------------------------------------------------------------------------------
# algorithms
# ----------------------------------------------------------------------------------------------
class FedAlgorithm:
    """A method's hyperparameters and hooks; FedAvg's mechanics by default (no state of its own).

    Client hooks (run by :class:`GradientClient`, see :class:`Local`): ``init_state(k)`` (extra
    entries of client k's state), ``setup_upload`` (the one-off setup round, when ``needs_setup``),
    ``begin_local``, ``local_loss`` (added to the cross-entropy), ``training_loss`` (the whole
    mini-batch loss), ``end_local`` (extra upload entries, state updates).
    Server hooks (run by :class:`GradientServer` on its ``memory`` dict): ``server_init``,
    ``receive_setup``, ``broadcast_extra`` (extra broadcast entries), ``aggregation_weights``
    (``aggregation = "size"``: n_k / sum n, ``"uniform"``: 1 / |P_t|) and ``aggregate``.
    """

    name = "base"
    needs_setup = False  # True: clients upload ``setup_upload`` once, before round 1
    aggregation = "size"

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

    # -- batched client side (FedConfig.batched_clients; see LocalBatch) -----------------------
    # Each mirrors the per-client hook named in brackets, for all clients of a round at once; a
    # method whose per-client hook is overridden without its batched twin is not batchable
    # (``batchable``), so a subclass can never silently train differently in the batched path.
    # ``params``: the trained parameters of the m_t clients still training, name -> (m_t, ...);
    # x (m_t, B, ...), y (m_t, B); w (m_t, B): 1/b_k on the b_k real rows of client k's mini-batch,
    # 0 on padding rows (whose content is an arbitrary real sample of the round).
    def begin_batch(self, batch: LocalBatch) -> None:
        """[begin_local] After ``batch.params`` received the global weights, before local SGD."""

    def batch_local_loss(self, batch: LocalBatch, params: dict[str, Tensor], x: Tensor, y: Tensor, w: Tensor,
                         logits: Tensor) -> Tensor | None:
        """[local_loss] Sum over the m_t clients of each client's extra loss term (None = nothing)."""
        return None

    def batch_loss(self, batch: LocalBatch, params: dict[str, Tensor], x: Tensor, y: Tensor, w: Tensor) -> Tensor:
        """[training_loss] Sum over the m_t clients of each client's mini-batch loss (its gradient
        with respect to ``params[n][j]`` is client j's own)."""
        logits = batch.call(params, x)
        loss = weighted_cross_entropy(logits, y, w)
        extra = self.batch_local_loss(batch, params, x, y, w, logits)
        return loss if extra is None else loss + extra

    def end_batch(self, batch: LocalBatch) -> list[dict[str, Any]]:
        """[end_local] After local SGD: each slot's extra upload entries."""
        return [{} for _ in batch.states]

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

    def __init__(self, mu: float = 0.01):
        check_positive("mu", mu, strict=False)
        self.mu = float(mu)

    def begin_local(self, local):
        local.scratch["pairs"] = _param_pairs(local)

    def local_loss(self, local, x, y, logits):
        prox = sum(((p - g) ** 2).sum() for p, g in local.scratch["pairs"])
        return 0.5 * self.mu * prox

    def begin_batch(self, batch):
        """Nothing to precompute: the global weights are ``batch.global_params``."""

    def batch_local_loss(self, batch, params, x, y, w, logits):
        prox = sum(((p - batch.global_params[n]) ** 2).sum() for n, p in params.items())
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

    def begin_batch(self, batch):
        names = [n for n, _ in batch.global_model.named_parameters()]
        for state in batch.states:
            if state["grad"] is None:
                state["grad"] = [torch.zeros_like(p) for p in batch.global_model.parameters()]
        # g_k of the trained parameters, stacked over the slots (the clients' own lists are updated in end_batch)
        batch.scratch["grad"] = {n: torch.stack([s["grad"][names.index(n)] for s in batch.states])
                                 for n in batch.params}

    def batch_local_loss(self, batch, params, x, y, w, logits):
        grad = batch.scratch["grad"]
        lin = sum((p * grad[n][:p.shape[0]]).sum() for n, p in params.items())
        quad = sum(((p - batch.global_params[n]) ** 2).sum() for n, p in params.items())
        return 0.5 * self.alpha * quad - lin

    @torch.no_grad()
    def end_batch(self, batch):
        names = [n for n, _ in batch.global_model.named_parameters()]
        for j, state in enumerate(batch.states):
            for n, p in batch.params.items():  # untrained parameters: p - g = 0, g_k unchanged
                state["grad"][names.index(n)].sub_(p[j] - batch.global_params[n], alpha=self.alpha)
        return [{} for _ in batch.states]

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

    def __init__(self, beta: float = 1.0, tau: float = 1.0):
        check_positive("beta", beta, strict=False)
        check_positive("tau", tau)
        self.beta, self.tau = float(beta), float(tau)

    def local_loss(self, local, x, y, logits):
        with torch.no_grad():
            g_logits = local.global_model(x)
        return self.ntd_loss(logits, g_logits, y)

    def batch_local_loss(self, batch, params, x, y, w, logits):
        with torch.no_grad():
            g_logits = batch.global_model(x.flatten(0, 1))
        return self.ntd_loss(logits.flatten(0, 1), g_logits, y.flatten(), w.flatten())

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

    def begin_batch(self, batch):
        has = [s["prev"] is not None for s in batch.states]
        batch.scratch["has_prev"] = has
        if any(has):  # every parameter of the previous local models, stacked (the global weights as filler)
            batch.scratch["prev"] = {n: torch.stack([(s["prev"] if h else batch.global_params)[n]
                                                     for s, h in zip(batch.states, has)])
                                     for n in batch.global_params}
            batch.scratch["w_con"] = torch.tensor(has, dtype=next(iter(batch.global_params.values())).dtype,
                                                  device=next(iter(batch.global_params.values())).device)

    def batch_loss(self, batch, params, x, y, w):
        m = x.shape[0]
        z = batch.call(params, x, "features")
        loss = weighted_cross_entropy(batch.call(params, z, "head"), y, w)
        if not any(batch.scratch["has_prev"][:m]):  # nobody has a negative yet: l_con = 0
            return loss
        with torch.no_grad():
            z_glob = batch.global_model.features(x.flatten(0, 1)).view(z.shape)
            z_prev = batch.call({n: t[:m] for n, t in batch.scratch["prev"].items()}, x, "features", frozen={})
        pos = F.cosine_similarity(z, z_glob, dim=-1)
        neg = F.cosine_similarity(z, z_prev, dim=-1)
        sims = torch.stack([pos, neg], dim=-1) / self.tau
        con = -F.log_softmax(sims, dim=-1)[..., 0]  # CE with target 0, per row
        # rows of a client without a previous model weigh 0 (its l_con = 0, as in training_loss)
        return loss + self.mu * (con * w * batch.scratch["w_con"][:m, None]).sum()

    def end_batch(self, batch):
        for j, state in enumerate(batch.states):
            state["prev"] = {n: (batch.params[n][j] if n in batch.params else t).detach().clone()
                             for n, t in batch.global_params.items()}
        return [{} for _ in batch.states]


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


# element-wise or row-wise modules (and the heads built from them): the batched path pads a
# client's last mini-batch with weight-0 rows, which is exact only if rows do not interact
BATCHABLE_MODULES: tuple[type, ...] = (
    nn.Linear, nn.Sequential, nn.Identity, nn.Flatten, nn.ReLU, nn.LeakyReLU, nn.GELU, nn.SiLU, nn.ELU, nn.Tanh,
    nn.Sigmoid, LinearHead, MLPHead, MOONHead)

# per-client hook -> its batched twin (see FedAlgorithm)
_BATCHED_TWINS = {"begin_local": "begin_batch", "local_loss": "batch_local_loss",
                  "training_loss": "batch_loss", "end_local": "end_batch"}


def _owner(cls: type, name: str) -> type:
    return next(c for c in cls.__mro__ if name in vars(c))


def batchable(method: FedAlgorithm, model: nn.Module) -> str | None:
    """Why ``FedConfig(batched_clients=True)`` cannot train ``method`` on ``model`` (None: it can).

    The method: every per-client hook must be defined no later (in its class hierarchy) than its
    batched twin (FedAvg, FedProx, FedDyn, FedNTD, MOON, FedDisco are; a subclass that overrides
    ``local_loss`` without ``batch_local_loss`` is not). The model: built only from
    ``BATCHABLE_MODULES`` (rows of a mini-batch independent, no randomness), without buffers.
    """
    cls = type(method)
    for hook, twin in _BATCHED_TWINS.items():
        if not issubclass(_owner(cls, twin), _owner(cls, hook)):
            return (f"{cls.__name__} overrides {hook} in {_owner(cls, hook).__name__} without {twin}, "
                    f"so it has no batched client path")
    odd = sorted({type(m).__name__ for m in model.modules() if type(m) not in BATCHABLE_MODULES})
    if odd:
        return (f"the batched client path supports models built from {', '.join(c.__name__ for c in BATCHABLE_MODULES)}; "
                f"{type(model).__name__} contains {', '.join(odd)}")
    if any(True for _ in model.buffers()):
        return f"the batched client path supports models without buffers; {type(model).__name__} has some"
    return None


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
    trains them all at once (:meth:`step_many`), equal to that up to float round-off.
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
        self._stacked: tuple | None = None  # the batched path's concatenated client data (see _round_data)
        self._xbuf: Tensor | None = None  # the batched path's gathered mini-batch inputs (reused)
        self._bufs: dict[str, Tensor] = {}  # the batched path's momentum buffers (reused)

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

    def _step(self, data, state: dict[str, Any], broadcast: Message) -> Message:
        sender = f"client{state['id']}"
        x, y = self.training_data(data, state)
        if "state" not in broadcast.payload:
            return Message(sender, self.method.setup_upload(y, state, self.num_classes))
        cfg, model = self.config, self.model
        if broadcast is not self._received:  # in one process every client of a round gets the same message
            self.global_model.load_state_dict(broadcast["state"])
            self._received = broadcast
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
        True: the same local SGD for all of them at once. Every client draws its mini-batch order
        with the same ``torch.randperm`` calls on its own generator as :meth:`step`; the clients'
        trained parameters are stacked (m, ...) and each SGD step runs one batched forward and one
        backward over the clients that still have a mini-batch left (a client with fewer samples
        has fewer steps and stops; its last partial batch is padded with weight-0 rows, the mean
        over its true size). The SGD update is torch.optim.SGD's, written out for the stacked
        tensors (d = grad + wd p; buf = d at the first step, else momentum buf + d; p -= lr buf).
        Results equal :meth:`step`'s up to float round-off (batched matmuls, weighted sums).
        """
        if not self.config.batched_clients or "state" not in broadcast.payload or not states:
            return [self.step(d, s, broadcast) for d, s in zip(datas, states)]
        return self._step_batched(datas, list(states), broadcast)

    def _round_data(self, pairs: list[tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor, list[int]]:
        """The clients' x and y concatenated, and each client's row offset; kept while the same
        tensors come back (full participation: one concatenation per run)."""
        xs, ys = [x for x, _ in pairs], [y for _, y in pairs]
        c = self._stacked
        if c is not None and len(c[0]) == len(xs) and all(a is b for a, b in zip(c[0], xs)) \
                and all(a is b for a, b in zip(c[1], ys)):
            return c[2], c[3], c[4]
        offsets = [0]
        for x in xs[:-1]:
            offsets.append(offsets[-1] + int(x.shape[0]))
        x_all, y_all = torch.cat(xs), torch.cat(ys)
        self._stacked = (xs, ys, x_all, y_all, offsets)
        return x_all, y_all, offsets

    def _buffer(self, name: str, like: Tensor) -> Tensor:
        """A reused momentum buffer shaped like ``like`` (m, ...) (fresh 33 MB tensors per round or
        step cost page faults on CPU); its content is overwritten at each round's first step."""
        buf = self._bufs.get(name)
        if buf is None or buf.shape[0] < like.shape[0] or buf.shape[1:] != like.shape[1:] or buf.dtype != like.dtype \
                or buf.device != like.device:
            buf = self._bufs[name] = torch.empty_like(like)
        return buf

    def _step_batched(self, datas, states: list[dict[str, Any]], broadcast: Message) -> list[Message]:
        cfg, method = self.config, self.method
        if broadcast is not self._received:
            self.global_model.load_state_dict(broadcast["state"])
            self._received = broadcast
        pairs = [self.training_data(d, s) for d, s in zip(datas, states)]
        x_all, y_all, offsets = self._round_data(pairs)
        device = x_all.device
        sizes = [int(x.shape[0]) for x, _ in pairs]
        bs, epochs = cfg.batch_size, cfg.local_epochs
        batches = [math.ceil(n / bs) for n in sizes]  # per epoch
        # slots: clients by decreasing number of steps, so those still training form a prefix
        order = sorted(range(len(states)), key=lambda i: -batches[i])
        steps = epochs * batches[order[0]]
        index = torch.zeros(steps, len(order), bs, dtype=torch.long)
        weight = torch.zeros(steps, len(order), bs)
        for j, i in enumerate(order):
            n, nb = sizes[i], batches[i]
            # the same randperm calls, in the same order, on the client's own generator as step()
            perms = [torch.randperm(n, generator=states[i]["batches"]) for _ in range(epochs)]
            if n == 0:
                continue
            rows = torch.stack([F.pad(p, (0, nb * bs - n)) for p in perms]).view(epochs * nb, bs)
            index[:epochs * nb, j] = rows + offsets[i]
            w = torch.zeros(nb * bs)
            w[(nb - 1) * bs:n] = 1.0 / (n - (nb - 1) * bs)  # the last (maybe partial) batch
            w[:(nb - 1) * bs] = 1.0 / bs
            weight[:epochs * nb, j] = w.view(1, nb, bs).expand(epochs, nb, bs).reshape(epochs * nb, bs)
        active = [sum(1 for i in order if epochs * batches[i] > t) for t in range(steps)]
        g_state = broadcast["state"]
        trained = [n for n, p in self.model.named_parameters() if p.requires_grad]
        params = {n: g_state[n].detach().unsqueeze(0).repeat(len(order), *([1] * g_state[n].dim())) for n in trained}
        frozen = {n: g_state[n] for n, _ in self.model.named_parameters() if n not in params}
        dtype = next(iter(params.values())).dtype if params else torch.float32
        index, weight = index.to(device), weight.to(device=device, dtype=dtype)
        batch = LocalBatch(self.model, self.global_model, [states[i] for i in order], broadcast, params, frozen,
                           dict(g_state))
        method.begin_batch(batch)
        lr, mom, wd = cfg.lr, cfg.momentum, cfg.weight_decay
        bufs: dict[str, Tensor] = {}
        # one reused buffer for the steps' gathered inputs: a fresh (m, B, d) tensor every step
        # (33 MB at m = 100, B = 64, d = 1280) was measured ~7x slower on CPU (page faults)
        shape = (len(order) * bs, *x_all.shape[1:])
        xbuf = self._xbuf
        if xbuf is None or xbuf.shape[0] < shape[0] or xbuf.shape[1:] != shape[1:] or xbuf.dtype != x_all.dtype \
                or xbuf.device != x_all.device:
            xbuf = self._xbuf = torch.empty(shape, dtype=x_all.dtype, device=x_all.device)
        for t in range(steps):
            m = active[t]
            leaves = {n: p[:m].detach().requires_grad_() for n, p in params.items()}
            idx = index[t, :m].flatten()
            x = torch.index_select(x_all, 0, idx, out=xbuf[:m * bs]).view(m, bs, *x_all.shape[1:])
            loss = method.batch_loss(batch, leaves, x, y_all.index_select(0, idx).view(m, bs), weight[t, :m])
            grads = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
            with torch.no_grad():
                for (n, p), g in zip(leaves.items(), grads):
                    if g is None:  # as torch.optim.SGD: a parameter without gradient is left alone
                        continue
                    if mom != 0:
                        if n not in bufs:  # first step: buf = grad + wd p
                            bufs[n] = self._buffer(n, params[n])[:m]
                            g = torch.add(g, p, alpha=wd, out=bufs[n]) if wd != 0 else bufs[n].copy_(g)
                        else:
                            if wd != 0:  # d = grad + wd p, then buf = momentum buf + d (torch's order)
                                g = torch.add(g, p, alpha=wd, out=self._buffer(f"{n}/d", params[n])[:m])
                            g = bufs[n][:m].mul_(mom).add_(g)
                    elif wd != 0:
                        g = g.add(p, alpha=wd)
                    p.add_(g, alpha=-lr)
        extras = method.end_batch(batch)
        keys = list(self.model.state_dict())
        uploads: list[Message | None] = [None] * len(states)
        for j, i in enumerate(order):
            state = {k: (params[k][j] if k in params else g_state[k]).detach().clone() for k in keys}
            uploads[i] = Message(f"client{states[i]['id']}", {"state": state, "n": sizes[i], **(extras[j] or {})})
        return uploads


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
