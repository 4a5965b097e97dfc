"""Re-Fed: replay-buffer selection for federated incremental learning (Li et al., CVPR 2024,
"Towards Efficient Replay in Federated Incremental Learning").

Every client k keeps its own cache of old samples under a storage budget M. When task t arrives
(before training on it), every client rebuilds its cache from its previous local set
T_{k,local}^{t-1} = cache^{t-2} u T_k^{t-1} (the candidate pool), then the federation trains on
cache u new data with FedAvg. Re-Fed scores the pool with a throw-away personalised informative
model (PIM) v, started at the received global model w^{t-1} and trained with a proximal pull:

    v_{p} = v_{p-1} - eta ( grad l(v_{p-1}) + q(lam) (v_{p-1} - w^{t-1}) ),
    q(lam) = (1 - lam) / (2 lam),  lam in (0, 1)                                   (Eq. 3)
    G^p(x_i) = || grad_v l(f_v(x_i), y_i) ||^2     (at PIM iteration p, all trainable params)  (Eq. 4)
    I(x_i)   = sum_{p=1}^{s} G^p(x_i) / p          ("early emphasis")                        (Eq. 5)

and keeps the top-scoring samples within the budget. Table 10's ablations: ``"average"``
(I = sum_p G^p) and ``"late"`` (the early-emphasis ranking reversed, i.e. keep the lowest scores;
the paper's "Late-Emphasis" is *not* an increasing weighting). Local training is plain (masked)
cross-entropy on cache u new data (Eq. 6); the server takes the unweighted mean of the sampled
clients' models (Alg. 2, line 18). lam -> 0 pins v to w ("global importance"), lam -> 1 is pure
local training ("local importance"); Lemma 1: ||v_hat(lam) - w||^2 grows and the local loss
f(v_hat(lam)) falls as lam grows.

The client-side cache selection is the replay policy :class:`RefedReplay` of the one incremental
learner :class:`fedlib.federated.learner.GradientLearner`; :func:`make_learner` builds every
method of the chapter. Decisions the paper leaves open, all options of :func:`make_learner`:

* Meaning of M: ``memory_mode="total"`` (default, Sec. 3.1): M counts the whole local set, so the cache
  keeps ``M - N_k^t`` old samples and cache u new data has at most M samples; every client's new
  task must then satisfy N_k^t < M (else ValueError: use ``"replay"``). At the first task nothing
  is dropped even if N_k^1 > M. ``"replay"`` (Sec. 4.1): M is the replay-buffer size, the cache
  keeps min(M, |pool|) old samples on top of the new data.
* When and who: caches are rebuilt once per task, at the boundary, by **all** K clients, from the final
  global model of the previous task (not per round as Alg. 1 prints), each client from its own
  data and the broadcast model. Each task runs FedAvg with its own seed
  (:func:`fedlib.federated.learner.stage_config`), so each task samples its own clients.
* PIM: it starts at w^{t-1}; mini-batch SGD on mean CE + (q/2)||v - w||^2
  (``prox_scaling="mean"``); ``"sum"`` divides q by |pool| (Eq. 3's summed gradient, literally).
  plain SGD (momentum ``pim_momentum=0``), lr ``pim_lr`` (default ``config.lr``).
* Class balance: plain top-k over the whole pool: no per-task or per-class split of the budget
  (ours: ``class_balanced=True`` / ``"proportional"``: per-class top-k with a budget proportional
  to the class's pool share, the class mix random replay keeps in expectation; ``"equal"``, method
  ``"refed_balanced"`` of :func:`make_learner`: the same quota for every class of the pool).
* Aggregation: ``aggregation="uniform"`` (Alg. 2) for every method; ``"size"``: n_k-weighted FedAvg.
* Iteration p of Eqs. 4-5 = PIM epoch; every sample gets one G^p per epoch, taken at the parameters
  current when its mini-batch is processed (before the step).
* Per-sample norms: ``grad_norm="exact"``: the exact per-sample squared norms over all trainable parameters,
  model in eval mode (:func:`fedlib.core.persample.grad_sq_norms`: ghost norms, one forward and one
  backward per mini-batch, no per-sample gradient formed; ``torch.func.vmap`` for layers it does
  not cover); ``"last_layer"``: the closed form of
  :func:`fedlib.core.persample.last_layer_grad_sq_norms`, a cheaper proxy (the output layer only).
* Baselines: FedAvg/FedProx replay cache a uniformly random subset of the pool under the same
  budget rule; FedProx mu = 0.01.

Class-incremental (``scenario="class"``): a single head over all classes, CE on the first
``num_seen`` logits (future classes masked). Domain-incremental (``"domain"``): all classes are
always seen (no masking). Fed-EWC / Fed-LwF are :mod:`fedlib.federated.fcil`'s methods run by the same
learner without memory (for ``"domain"``, LwF distils all classes).
"""
from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedlib.core.persample import default_names, ghost_layers, grad_sq_norms, last_layer_grad_sq_norms
from fedlib.core.validate import check_choice, check_int, check_real
from fedlib.federated.fcil import METHODS
from fedlib.federated.gradient import FedConfig
from fedlib.federated.learner import (MEMORY_MODES, FixedLearner, GradientLearner, HerdingReplay, RandomReplay, Replay,
                                      ReservoirReplay, ScoreReplay, balancing, select_top)
from fedlib.refed import speed

WEIGHTINGS = ("early", "average", "late")
GRAD_NORMS = ("exact", "last_layer")
PROX_SCALINGS = ("mean", "sum")


def _check_lam(lam) -> float:
    try:
        return check_real("lam", lam, low=0.0, high=1.0)
    except ValueError:
        raise ValueError(f"lam must lie in the open interval (0, 1) (q(lam) = (1-lam)/(2 lam)), got {lam!r}") from None


def q_lambda(lam: float) -> float:
    """q(lam) = (1 - lam) / (2 lam), the PIM's proximal weight (Eq. 3); lam in (0, 1)."""
    lam = _check_lam(lam)
    return (1.0 - lam) / (2.0 * lam)


# ----------------------------------------------------------------------------------------------
# scores (Eqs. 4-5, Table 10)
# ----------------------------------------------------------------------------------------------
def importance_scores(grad_sq: Tensor, weighting: str = "early") -> Tensor:
    """Accumulated importance from per-iteration squared gradient norms ``grad_sq`` (s, n),
    row p-1 = G^p of the n samples. Returns (n,) float64 scores, higher = cached first:

    * ``"early"``   I = sum_p G^p / p                      (Eq. 5, Alg. 2 line 11)
    * ``"average"`` I = sum_p G^p                          (Table 10, Average-Weighting)
    * ``"late"``    -sum_p G^p / p: the early ranking reversed (Table 10, Late-Emphasis)
    """
    check_choice("weighting", weighting, WEIGHTINGS)
    g = torch.as_tensor(grad_sq, dtype=torch.float64)
    if g.ndim != 2:
        raise ValueError(f"grad_sq must be a (iterations, samples) matrix, got shape {tuple(g.shape)}")
    p = torch.arange(1, g.shape[0] + 1, dtype=torch.float64)
    w = torch.ones_like(p) if weighting == "average" else 1.0 / p
    scores = (w[:, None] * g).sum(0)
    return -scores if weighting == "late" else scores


# ----------------------------------------------------------------------------------------------
# the personalised informative model (Eq. 3)
# ----------------------------------------------------------------------------------------------
@dataclass
class PIMResult:
    """Outcome of :func:`train_pim`: ``grad_sq`` (epochs, n) the G^p (row p-1), ``state`` the final
    PIM state dict (CPU), ``dist_sq`` = ||v - w||^2 over the trained parameters, ``loss`` = mean
    masked CE of the final v on the pool (eval mode)."""

    grad_sq: Tensor
    state: dict
    dist_sq: float
    loss: float

    def scores(self, weighting: str = "early") -> Tensor:
        """Eq. 5 (or a Table 10 variant) on ``grad_sq``: (n,) float64."""
        return importance_scores(self.grad_sq, weighting)


def train_pim(global_model: nn.Module, x: Tensor, y: Tensor, num_seen: int, *, lam: float, epochs: int,
              lr: float, batch_size: int = 64, momentum: float = 0.0, prox_scaling: str = "mean",
              grad_norm: str = "exact", names: Sequence[str] | None = None,
              generator: torch.Generator | None = None) -> PIMResult:
    """Train a PIM v from a copy of ``global_model`` (= w, left untouched) on the pool x (n, ...),
    y (n,) < num_seen, recording every sample's G^p once per epoch (before its mini-batch step).

    Step (Eq. 3, loss averaged over the mini-batch): SGD on mean CE(v(x_b)[:, :num_seen], y_b) + (q_eff/2)||v - w||^2,
    q_eff = q(lam) (``prox_scaling="mean"``) or q(lam)/n (``"sum"``). Only ``names`` (default:
    parameters with requires_grad, or all) are trained and enter the norms. The explicit step
    diverges on the proximal term alone when lr * q_eff >= 2: ValueError (raise lam or lower lr).
    """
    lam = _check_lam(lam)
    epochs = check_int("epochs", epochs, 1)
    lr = check_real("lr", lr, low=0.0)
    batch_size = check_int("batch_size", batch_size, 1)
    _check_momentum("momentum", momentum)
    check_choice("prox_scaling", prox_scaling, PROX_SCALINGS)
    check_choice("grad_norm", grad_norm, GRAD_NORMS)
    n = int(x.shape[0])
    if n == 0 or int(y.shape[0]) != n:
        raise ValueError(f"x and y must hold the same number (>= 1) of samples, got {n} and {int(y.shape[0])}")
    q = q_lambda(lam) / (n if prox_scaling == "sum" else 1)
    if lr * q >= 2.0:
        raise ValueError(f"lr * q(lam) = {lr * q:.3g} >= 2: the explicit PIM step (Eq. 3) diverges; "
                         f"raise lam (got {lam}) or lower lr (got {lr})")
    v = copy.deepcopy(global_model)
    names = default_names(v) if names is None else list(names)
    named = dict(v.named_parameters())
    for name, p in named.items():
        p.requires_grad_(name in names)
    trained = [named[n_] for n_ in names]
    anchor = [p.detach().clone() for p in trained]
    opt = torch.optim.SGD(trained, lr=lr, momentum=momentum)
    gen = generator if generator is not None else torch.Generator().manual_seed(0)
    grad_sq = torch.zeros(epochs, n, dtype=torch.float32)
    y = y.long()
    layers = ghost_layers(v, names) if speed.FUSED_PIM and grad_norm == "exact" and speed.mode_free(v) else None
    for p in range(epochs):
        perm = torch.randperm(n, generator=gen)
        for s in range(0, n, batch_size):
            idx = perm[s:s + batch_size]
            xb, yb = x[idx.to(x.device)], y[idx.to(y.device)]
            b = int(idx.shape[0])
            if layers is not None and b & (b - 1) == 0:   # one pass for the norms and the step (exact: b = 2^k)
                g2 = speed.fused_pim_step(v, layers, xb, yb, num_seen, trained, anchor, q, opt)
                if g2 is not None:
                    grad_sq[p, idx] = g2.detach().float().cpu()
                    continue
            if grad_norm == "exact":
                g2 = grad_sq_norms(v, xb, yb, num_seen, names, batch_size)
            else:
                g2 = last_layer_grad_sq_norms(v, xb, yb, num_seen)
            grad_sq[p, idx] = g2.detach().float().cpu()
            v.train()
            loss = F.cross_entropy(v(xb)[:, :num_seen], yb)
            prox = sum(((a - b) ** 2).sum() for a, b in zip(trained, anchor))
            opt.zero_grad(set_to_none=True)
            (loss + 0.5 * q * prox).backward()
            opt.step()
    v.eval()
    with torch.no_grad():
        dist = float(sum(((a - b) ** 2).sum() for a, b in zip(trained, anchor)))
        final = float(F.cross_entropy(v(x)[:, :num_seen], y))
    state = {k: t.detach().cpu().clone() for k, t in v.state_dict().items()}
    return PIMResult(grad_sq, state, dist, final)


def _check_momentum(name: str, value) -> float:
    value = check_real(name, value, low=0.0, high=1.0, strict=False)
    if value == 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {value!r}")
    return value


# ----------------------------------------------------------------------------------------------
# the replay policy
# ----------------------------------------------------------------------------------------------
class RefedReplay(Replay):
    """Re-Fed's cache selection (Alg. 2 lines 5-12), run by every client on its own pool: train a
    PIM from the broadcast global model (:func:`train_pim`, Eq. 3, over the old classes), score the
    pool (Eqs. 4-5 or a Table 10 ``weighting``) and keep the top ``budget`` (per class with
    ``class_balanced``). ``pim_lr`` defaults to the run's ``config.lr``. The per-client log holds
    the PIM's ``dist_sq``, ``loss`` and the ``scores``."""

    name = "refed"

    def __init__(self, memory: int, memory_mode: str = "total", *, lam: float = 0.8, weighting: str = "early",
                 pim_epochs: int = 40, pim_lr: float | None = None, pim_momentum: float = 0.0,
                 prox_scaling: str = "mean", grad_norm: str = "exact", class_balanced: bool | str = False):
        super().__init__(memory, memory_mode)
        self.lam = _check_lam(lam)
        check_choice("weighting", weighting, WEIGHTINGS)
        check_choice("prox_scaling", prox_scaling, PROX_SCALINGS)
        check_choice("grad_norm", grad_norm, GRAD_NORMS)
        self.pim_epochs = check_int("pim_epochs", pim_epochs, 1)
        self.pim_lr = None if pim_lr is None else check_real("pim_lr", pim_lr, low=0.0)
        self.pim_momentum = _check_momentum("pim_momentum", pim_momentum)
        self.weighting, self.prox_scaling, self.grad_norm = weighting, prox_scaling, grad_norm
        self.class_balanced = balancing(class_balanced)

    def check_lr(self, lr: float) -> None:
        """ValueError when the PIM step with learning rate ``lr`` diverges (lr * q(lam) >= 2)."""
        if self.prox_scaling == "mean" and lr * q_lambda(self.lam) >= 2.0:
            raise ValueError(f"pim_lr * q(lam) = {lr * q_lambda(self.lam):.3g} >= 2: the explicit PIM "
                             f"step (Eq. 3) diverges; raise lam (got {self.lam}) or lower pim_lr")

    pim_share: "speed.PIMShare | None" = None   # set by run_scenario: PIMs reused between runs (see PIMShare)

    def select(self, x, y, budget, ctx):
        lr = ctx.config.lr if self.pim_lr is None else self.pim_lr
        key = None if self.pim_share is None else self.pim_share.key(self, x, y, ctx, lr)
        res = None if key is None else self.pim_share.get(key)
        if res is None:
            res = train_pim(ctx.global_model, x, y, ctx.num_old, lam=self.lam, epochs=self.pim_epochs, lr=lr,
                            batch_size=ctx.config.batch_size, momentum=self.pim_momentum,
                            prox_scaling=self.prox_scaling, grad_norm=self.grad_norm, names=ctx.names,
                            generator=ctx.generator)
            if key is not None:
                self.pim_share.misses += 1
                self.pim_share[key] = PIMResult(res.grad_sq.clone(), None, res.dist_sq, res.loss)
        else:
            self.pim_share.hits += 1
        scores = res.scores(self.weighting)
        keep = select_top(scores, budget, y.cpu(), self.class_balanced, ctx.tasks)
        return keep, {"dist_sq": res.dist_sq, "loss": res.loss, "scores": scores}


# ----------------------------------------------------------------------------------------------
# factory
# ----------------------------------------------------------------------------------------------
LEARNERS: dict[str, dict[str, Any]] = {
    "refed": {"replay": RefedReplay, "method": "finetune"},
    "refed_balanced": {"replay": RefedReplay, "method": "finetune", "class_balanced": "equal"},
    "fedavg": {"replay": None, "method": "finetune"},
    "fedavg_replay": {"replay": RandomReplay, "method": "finetune"},
    "fedprox_replay": {"replay": RandomReplay, "method": "fedprox"},
    "fixed": {"replay": None, "method": "finetune"},
    "fedewc": {"replay": None, "method": "fedewc"},
    "fedlwf": {"replay": None, "method": "fedlwf"},
    # controls and budget splits of the "beyond the paper" chapter (notebooks/refed_beyond.py)
    "refed_task": {"replay": RefedReplay, "method": "finetune", "class_balanced": "task"},
    "refed_task_class": {"replay": RefedReplay, "method": "finetune", "class_balanced": "task_class"},
    "grand": {"replay": ScoreReplay, "method": "finetune", "rule": "grand"},
    "el2n": {"replay": ScoreReplay, "method": "finetune", "rule": "el2n"},
    "herding": {"replay": HerdingReplay, "method": "finetune"},
    "reservoir": {"replay": ReservoirReplay, "method": "finetune"},
}


def _take(kwargs: dict, cls) -> dict:
    names = set(inspect.signature(cls.__init__).parameters) - {"self", "memory"}
    return {k: kwargs.pop(k) for k in list(kwargs) if k in names}


def make_learner(method: str, model_fn: Callable[[], nn.Module], config: FedConfig, *, num_classes: int,
                 memory: int | None = None, scenario: str = "class", progress: bool = True,
                 aggregation: str = "uniform", **kwargs: Any) -> GradientLearner:
    """One learner of :data:`LEARNERS` (a :class:`GradientLearner`) on the common protocol.

    ``memory`` (M) is used by "refed", "refed_balanced" (Re-Fed with ``class_balanced="equal"``),
    "fedavg_replay", "fedprox_replay" (required there) and ignored by the memory-free methods, so
    one loop can pass it to all. ``aggregation`` defaults to Re-Fed's uniform mean (Alg. 2).
    ``kwargs``: names taken by the method's loss (FedProx ``mu`` (default 0.01); EWC ``lam``; LwF
    ``lam``, ``T``) go to the loss, then those of the replay policy (Re-Fed's ``lam``,
    ``weighting``, ``pim_epochs``, ``pim_lr``, ``pim_momentum``, ``prox_scaling``, ``grad_norm``,
    ``class_balanced``; ``memory_mode``) to the policy (ignored without one), the rest to
    :class:`GradientLearner` (``eval_data``, ``first_rounds``, ``callbacks``, ``on_stage_end``...).
    """
    key = method.lower() if isinstance(method, str) else method
    check_choice("method", key, LEARNERS)
    spec = dict(LEARNERS[key])
    replay_cls, loss = spec.pop("replay"), spec.pop("method")
    hparams = _take(kwargs, METHODS[loss])
    policy_kwargs = _take(kwargs, RefedReplay)
    clash = sorted(k for k in spec if k in policy_kwargs and policy_kwargs[k] != spec[k])
    if clash:
        raise ValueError(f"method {key!r} fixes {', '.join(f'{k}={spec[k]!r}' for k in clash)}; "
                         f"use another method to change it")
    policy_kwargs.update(spec)
    replay = None
    if replay_cls is not None:
        if memory is None:
            raise ValueError(f"memory (M, samples per client) is required for method {key!r}")
        replay = replay_cls(memory, **{k: v for k, v in policy_kwargs.items()
                                       if k in inspect.signature(replay_cls.__init__).parameters})
        if isinstance(replay, RefedReplay):
            replay.check_lr(config.lr if replay.pim_lr is None else replay.pim_lr)
    elif "memory_mode" in policy_kwargs:
        check_choice("memory_mode", policy_kwargs["memory_mode"], MEMORY_MODES)
    common = dict(num_classes=num_classes, scenario=scenario, progress=progress, aggregation=aggregation, **kwargs)
    if key == "fixed":
        return FixedLearner(model_fn, config, **common)
    return GradientLearner(model_fn, config, loss, replay=replay, name=key, **common, **hparams)
