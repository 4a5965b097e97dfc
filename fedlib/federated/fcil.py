"""Gradient-based baselines for federated class-incremental learning (FCIL).

:class:`FederatedIncrementalLearner` implements :class:`fedlib.federated.incremental.IncrementalLearner`
on top of :func:`fedlib.federated.gradient.run_federated` (no second training loop): stage t runs
``config.rounds`` FedAvg rounds on that stage's clients, starting from the global model at the
end of stage t-1 (``model_fn()`` at stage 0). The model has ``num_classes`` outputs (every class
of the stream); with ``s_t`` = classes seen after stage t and ``o_t = s_{t-1}`` the old ones,
the local loss is computed on the first ``s_t`` logits only (future classes masked):

* ``"finetune"``  L = CE(z[:, :s_t], y)                       (STSA Sec. 4's "Finetune" lower bound)
* ``"fedewc"``    L = CE + (lam/2) sum_i F_i (theta_i - theta*_i)^2   (Kirkpatrick et al., PNAS 2017)
* ``"fedlwf"``    L = CE + lam T^2 KL(softmax(z^old[:, :o_t]/T) || softmax(z[:, :o_t]/T))  (Li & Hoiem, TPAMI 2017)

Fed-EWC / Fed-LwF are the FedAvg + EWC / LwF baselines of the TARGET / LANDER benchmarks
(STSA Sec. 4). At stage 0 there is no old model, so all three are exactly FedAvg with the
masked CE (bit-identical weights for the same config). Default hyperparameters are our choices;
the STSA paper does not give them.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import numbers
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedlib.federated.gradient import FedAlgorithm, FedConfig, History, build_from_registry, run_federated
from fedlib.core.messages import Message
from fedlib.core.validate import check_choice, check_positive

__all__ = ["IncrementalAlgorithm", "Finetune", "FedEWC", "FedLwF", "METHODS", "make_method",
           "empirical_fisher", "stage_seed", "stage_config", "FederatedIncrementalLearner"]

ClientData = Sequence[tuple[Tensor, Tensor]]


@contextlib.contextmanager
def _threads(num_threads: int | None):
    """Use ``num_threads`` torch CPU threads inside the block (as run_federated does)."""
    old = torch.get_num_threads()
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def stage_seed(seed: int, t: int) -> int:
    """Seed of incremental stage t for a run seeded with ``seed``.

    Stage 0 keeps ``seed`` (so stage 0 is exactly ``run_federated`` with the run's config);
    stage t >= 1 gets ``SeedSequence([seed, t])``'s first 32-bit word, so every stage draws its
    own client samples and mini-batch orders instead of repeating stage 0's.
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t < 0:
        raise ValueError(f"t (stage index) must be a non-negative int, got {t!r}")
    if t == 0:
        return int(seed)
    return int(np.random.SeedSequence([int(seed), int(t)]).generate_state(1, dtype=np.uint32)[0])


def stage_config(config: FedConfig, t: int) -> FedConfig:
    """``config`` with the seed of stage t (:func:`stage_seed`); the other fields unchanged."""
    return dataclasses.replace(config, seed=stage_seed(config.seed, t))


# ----------------------------------------------------------------------------------------------
# methods: FedAlgorithm subclasses with a masked CE and two stage hooks
# ----------------------------------------------------------------------------------------------
class IncrementalAlgorithm(FedAlgorithm):
    """FedAvg mechanics with the cross-entropy restricted to the ``num_seen`` seen classes.

    The learner calls ``begin_stage`` before and ``end_stage`` after each stage's
    ``run_federated``; the object keeps its cross-stage state (Fisher, teacher) between them.
    """

    name = "incremental"
    num_seen: int = 0  # s_t: classes seen after the current stage
    num_old: int = 0  # o_t = s_{t-1}: classes of the earlier stages

    def begin_stage(self, t: int, num_old: int, num_seen: int, previous: nn.Module | None) -> None:
        """Stage t will learn classes [num_old, num_seen); ``previous`` = global model at the end
        of stage t-1 (None at stage 0)."""
        self.stage, self.num_old, self.num_seen = t, num_old, num_seen

    def end_stage(self, global_model: nn.Module, clients: ClientData, config: FedConfig,
                  device: torch.device, trainable: Sequence[str]) -> list[Message]:
        """After the stage's rounds, with the final (frozen) global model and the names of the
        trainable parameters; returns extra client uploads (their bytes are counted)."""
        return []

    def training_loss(self, model, x, y, global_model, client_state):
        logits = model(x)
        if logits.shape[1] < self.num_seen:
            raise ValueError(f"the model outputs {logits.shape[1]} logits but {self.num_seen} "
                             f"classes are seen; model_fn must build a model with all classes")
        logits = logits[:, :self.num_seen]  # mask out future classes
        loss = F.cross_entropy(logits, y)
        extra = self.local_loss(model, x, y, global_model, client_state, logits=logits)
        return loss if extra is None else loss + extra


class Finetune(IncrementalAlgorithm):
    """FedAvg on the new task's data with CE over the seen classes; no protection against
    forgetting (the lower bound of STSA Sec. 4)."""

    name = "finetune"

    def __init__(self):
        pass


def _chunk_size(num_params: int, batch_size: int) -> int:
    # per-sample gradients take chunk * num_params floats; cap them at 2**25 (128 MiB in float32)
    return max(1, min(batch_size, 2**25 // max(1, num_params)))


def empirical_fisher(model: nn.Module, x: Tensor, y: Tensor, num_seen: int,
                     names: Sequence[str] | None = None, batch_size: int = 64) -> dict[str, Tensor]:
    """Diagonal empirical Fisher of ``model`` on (x, y), **per sample**:

        F_i = (1/n) sum_j ( d/d theta_i  log softmax(f(x_j)[:num_seen])_{y_j} )^2,

    x (n, ...), y (n,) labels < num_seen. Per-sample gradients via ``torch.func`` (vmap of grad),
    model in eval mode (BN running statistics, no dropout). ``names``: the parameters to cover
    (default: all). Returns {name: tensor shaped like the parameter}.
    """
    from torch.func import functional_call, grad, vmap

    named = dict(model.named_parameters())
    if names is None:
        names = list(named)
    params = {n: named[n].detach() for n in names}
    frozen = {n: p.detach() for n, p in named.items() if n not in params}
    buffers = dict(model.named_buffers())
    was_training = model.training
    model.eval()

    def nll(p, xj, yj):
        out = functional_call(model, ({**p, **frozen}, buffers), (xj.unsqueeze(0),))
        return F.cross_entropy(out[:, :num_seen], yj.unsqueeze(0))

    per_sample = vmap(grad(nll), in_dims=(None, 0, 0))
    fisher = {n: torch.zeros_like(p) for n, p in params.items()}
    n = int(x.shape[0])
    chunk = _chunk_size(sum(p.numel() for p in params.values()), batch_size)
    try:
        for s in range(0, n, chunk):
            g = per_sample(params, x[s:s + chunk], y[s:s + chunk])
            for name in fisher:
                fisher[name].add_(g[name].pow(2).sum(0))
    finally:
        model.train(was_training)
    return {name: f / n for name, f in fisher.items()}


class FedEWC(IncrementalAlgorithm):
    """Fed-EWC: FedAvg whose local loss adds the EWC penalty (Kirkpatrick et al., PNAS 2017, eq. 3)

        L_k(theta) = CE(z[:, :s_t], y) + (lam/2) sum_i F_i (theta_i - theta*_i)^2,

    theta* = global model at the end of the previous stage. At the end of every stage each
    non-empty client computes the per-sample diagonal empirical Fisher (:func:`empirical_fisher`,
    true labels, logits of the seen classes) of the final global model on its stage data and
    uploads it (one Message, bytes counted); the server averages them with weights n_k / sum n and
    **sums** the stage Fishers over stages, F = sum_t F^(t) (online EWC with gamma = 1, Schwarz et
    al. 2018: one anchor, the latest theta*). lam = 100 is our choice (STSA gives none). Plain
    SGD becomes unstable once lr * lam * max F_i exceeds ~2; lower lam (or lr) if the loss explodes.
    """

    name = "fedewc"

    def __init__(self, lam: float = 100.0):
        _check_nonneg("lam", lam)
        self.lam = float(lam)
        self.fisher: dict[str, Tensor] | None = None  # accumulated F (server side, broadcast)
        self.anchor: dict[str, Tensor] | None = None  # theta*

    def begin_local(self, model, global_model, k, client_state):
        if self.fisher is None or self.lam == 0:
            self._terms = None
            return
        named = dict(model.named_parameters())
        self._terms = [(named[n], f, self.anchor[n]) for n, f in self.fisher.items()]

    def local_loss(self, model, x, y, global_model, client_state, logits=None):
        if self._terms is None:
            return None
        penalty = sum((f * (p - a) ** 2).sum() for p, f, a in self._terms)
        return 0.5 * self.lam * penalty

    def end_stage(self, global_model, clients, config, device, trainable):
        names = list(trainable)
        uploads = []
        for k, (x, y) in enumerate(clients):
            if x.shape[0] == 0:
                continue
            fk = empirical_fisher(global_model, x.to(device), y.to(device, dtype=torch.long),
                                  self.num_seen, names, config.batch_size)
            uploads.append(Message(sender=f"client{k}", payload={"fisher": fk, "n": int(x.shape[0])}))
        total = sum(u["n"] for u in uploads)
        stage_fisher = {n: sum(u["fisher"][n] * (u["n"] / total) for u in uploads) for n in names}
        if self.fisher is None:
            self.fisher = stage_fisher
        else:
            self.fisher = {n: self.fisher[n] + stage_fisher[n] for n in names}
        self.anchor = {n: p.detach().clone() for n, p in global_model.named_parameters() if n in self.fisher}
        return uploads


class FedLwF(IncrementalAlgorithm):
    """Fed-LwF: FedAvg whose local loss adds LwF distillation (Li & Hoiem, TPAMI 2017, Sec. 3)

        L_k = CE(z[:, :s_t], y) + lam T^2 KL( softmax(z^old[:, :o_t]/T) || softmax(z[:, :o_t]/T) ),

    batch mean, on the o_t old classes only; teacher z^old = the frozen global model at the end of
    the previous stage (eval mode). No distillation at stage 0. T = 2 (as Li & Hoiem) and lam = 1
    are our choices (STSA gives none); the T^2 factor keeps gradient scales comparable (Hinton et
    al. 2015).
    """

    name = "fedlwf"

    def __init__(self, lam: float = 1.0, T: float = 2.0):
        _check_nonneg("lam", lam)
        _check_finite("T", T)
        check_positive("T", T)
        self.lam, self.T = float(lam), float(T)
        self.teacher: nn.Module | None = None

    def begin_stage(self, t, num_old, num_seen, previous):
        super().begin_stage(t, num_old, num_seen, previous)
        self.teacher = None
        if previous is not None and num_old > 0:
            self.teacher = copy.deepcopy(previous).requires_grad_(False).eval()

    def begin_local(self, model, global_model, k, client_state):
        if self.teacher is not None:
            self.teacher.eval()

    def local_loss(self, model, x, y, global_model, client_state, logits=None):
        if self.teacher is None or self.lam == 0:
            return None
        if logits is None:
            logits = model(x)
        o = self.num_old
        with torch.no_grad():
            q = F.softmax(self.teacher(x)[:, :o] / self.T, dim=1)
        log_p = F.log_softmax(logits[:, :o] / self.T, dim=1)
        return self.lam * self.T ** 2 * F.kl_div(log_p, q, reduction="batchmean")


def _check_finite(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")


def _check_nonneg(name: str, value) -> None:
    _check_finite(name, value)
    check_positive(name, value, strict=False)


METHODS: dict[str, type[IncrementalAlgorithm]] = {
    "finetune": Finetune,
    "fedewc": FedEWC,
    "fedlwf": FedLwF,
}


def make_method(name: str, **hparams) -> IncrementalAlgorithm:
    """``METHODS[name](**hparams)``; unknown name -> ValueError, unknown hyperparameter -> TypeError."""
    return build_from_registry(METHODS, name, "method", hparams)


# ----------------------------------------------------------------------------------------------
# the learner
# ----------------------------------------------------------------------------------------------
class FederatedIncrementalLearner:
    """A gradient-based FCIL baseline as an :class:`fedlib.federated.incremental.IncrementalLearner`.

    ``model_fn()`` builds a model mapping x (N, ...) to logits (N, num_classes) over *all* classes
    of the stream (e.g. ``lambda: LinearHead(d, C)``). Stage 0 starts from ``model_fn()``, stage
    t > 0 from a copy of the global model at the end of stage t-1 (requires_grad flags of
    ``model_fn()``'s parameters kept); each stage is one ``run_federated`` call with
    ``stage_config(config, t)`` (a seed per stage: stage 0 uses ``config.seed``, later stages
    draw other clients and batch orders) and ``test=None``. ``method`` in :data:`METHODS`, ``**hparams`` its
    hyperparameters. After a stage: ``histories[t]`` (its :class:`History`), ``stage_bytes[t]``,
    ``model`` (the global model).
    """

    def __init__(self, model_fn: Callable[[], nn.Module], config: FedConfig, method: str = "finetune",
                 *, num_classes: int, progress: bool = True, **hparams: Any):
        if not callable(model_fn):
            raise TypeError(f"model_fn must be callable, got {type(model_fn).__name__}")
        if not isinstance(config, FedConfig):
            raise TypeError(f"config must be a FedConfig, got {type(config).__name__}")
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
            raise ValueError(f"num_classes must be an int >= 1, got {num_classes!r}")
        self.algorithm = make_method(method, **hparams)
        self.name = self.algorithm.name
        self.model_fn, self.config, self.num_classes, self.progress = model_fn, config, num_classes, progress
        self.model: nn.Module | None = None
        self.histories: list[History] = []
        self.stage_bytes: list[int] = []
        self._trainable: dict[str, bool] | None = None
        self._num_seen = 0

    def _first_model(self) -> nn.Module:
        model = self.model_fn()
        self._trainable = {n: p.requires_grad for n, p in model.named_parameters()}
        self._template = model  # run_federated moves it to the device and trains it as the global model
        return model

    def _next_model(self) -> nn.Module:
        model = copy.deepcopy(self.model)
        for n, p in model.named_parameters():
            p.requires_grad_(self._trainable[n])
        return model.train()

    def learn_task(self, t: int, clients: list[tuple[Tensor, Tensor]], num_seen: int) -> int:
        """Run stage t on ``clients`` (K pairs x_k (n_k, ...), y_k (n_k,) with labels < num_seen);
        return the measured upload bytes of the stage (model uploads + extra uploads)."""
        if t != len(self.histories):
            raise ValueError(f"stages must be learned in order: expected t={len(self.histories)}, got {t}")
        if isinstance(num_seen, bool) or not isinstance(num_seen, int) or not self._num_seen < num_seen <= self.num_classes:
            raise ValueError(f"num_seen must be an int in ({self._num_seen}, {self.num_classes}], got {num_seen!r}")
        for k, (_, y) in enumerate(clients):
            if y.numel() and (int(y.min()) < 0 or int(y.max()) >= num_seen):
                raise ValueError(f"client {k}: labels must lie in [0, {num_seen}), got [{int(y.min())}, {int(y.max())}]")
        alg = self.algorithm
        alg.begin_stage(t, self._num_seen, num_seen, self.model)
        model_fn = self._first_model if self.model is None else self._next_model
        hist = run_federated(model_fn, clients, None, alg, stage_config(self.config, t),
                             progress=self.progress, num_classes=self.num_classes)
        if self.model is None:
            self.model = self._template
        self.model.load_state_dict(hist.final_state)
        self.model.requires_grad_(False).eval()
        device = next(self.model.parameters()).device
        with _threads(self.config.num_threads):
            trainable = [n for n, flag in self._trainable.items() if flag]
            extra = alg.end_stage(self.model, clients, self.config, device, trainable)
        nbytes = hist.bytes_up[-1] + sum(m.nbytes for m in extra)
        self.histories.append(hist)
        self.stage_bytes.append(nbytes)
        self._num_seen = num_seen
        return nbytes

    @torch.no_grad()
    def predict(self, x: Tensor, num_seen: int, batch_size: int = 8192) -> Tensor:
        """(N,) int64 labels (CPU): argmax over the first ``num_seen`` logits, eval mode, batched."""
        if self.model is None:
            raise RuntimeError("predict called before any learn_task")
        if isinstance(num_seen, bool) or not isinstance(num_seen, int) or not 1 <= num_seen <= self.num_classes:
            raise ValueError(f"num_seen must be an int in [1, {self.num_classes}], got {num_seen!r}")
        device = next(self.model.parameters()).device
        self.model.eval()
        out = []
        with _threads(self.config.num_threads):
            for s in range(0, int(x.shape[0]), batch_size):
                logits = self.model(x[s:s + batch_size].to(device))
                out.append(logits[:, :num_seen].argmax(1).cpu())
        return torch.cat(out) if out else torch.zeros(0, dtype=torch.long)

    def __repr__(self) -> str:
        return f"FederatedIncrementalLearner({self.algorithm!r}, num_classes={self.num_classes})"
