"""Re-Fed: replay-buffer selection for federated incremental learning (Li et al., CVPR 2024,
"Towards Efficient Replay in Federated Incremental Learning"; seed 003, notes: papers/refed.md).

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
method of the chapter. Decisions the paper leaves open (notes Sec. 8), all options of
:func:`make_learner`:

* [D1] ``memory_mode="total"`` (default, Sec. 3.1): M counts the whole local set, so the cache
  keeps ``M - N_k^t`` old samples and cache u new data has at most M samples; every client's new
  task must then satisfy N_k^t < M (else ValueError: use ``"replay"``). At the first task nothing
  is dropped even if N_k^1 > M. ``"replay"`` (Sec. 4.1): M is the replay-buffer size, the cache
  keeps min(M, |pool|) old samples on top of the new data.
* [D3] caches are rebuilt once per task, at the boundary, by **all** K clients, from the final
  global model of the previous task (not per round as Alg. 1 prints), each client from its own
  data and the broadcast model. Each task runs FedAvg with its own seed
  (:func:`fedlib.federated.learner.stage_config`), so each task samples its own clients.
* [D4] the PIM starts at w^{t-1}. [D5] mini-batch SGD on mean CE + (q/2)||v - w||^2
  (``prox_scaling="mean"``); ``"sum"`` divides q by |pool| (Eq. 3's summed gradient, literally).
  [D7] PIM: plain SGD (momentum ``pim_momentum=0``), lr ``pim_lr`` (default ``config.lr``).
* [D6] plain top-k over the whole pool: no per-task or per-class split of the budget
  (ours: ``class_balanced=True`` / ``"proportional"``: per-class top-k with a budget proportional
  to the class's pool share, the class mix random replay keeps in expectation; ``"equal"``, method
  ``"refed_balanced"`` of :func:`make_learner`: the same quota for every class of the pool).
* [D11] ``aggregation="uniform"`` (Alg. 2) for every method; ``"size"``: n_k-weighted FedAvg.
* [D12] iteration p = PIM epoch; every sample gets one G^p per epoch, taken at the parameters
  current when its mini-batch is processed (before the step).
* [D13] ``grad_norm="exact"``: the exact per-sample squared norms over all trainable parameters,
  model in eval mode (:func:`fedlib.core.persample.grad_sq_norms`: ghost norms, one forward and one
  backward per mini-batch, no per-sample gradient formed; ``torch.func.vmap`` for layers it does
  not cover); ``"last_layer"``: the closed form of
  :func:`fedlib.core.persample.last_layer_grad_sq_norms`, a cheaper proxy (the output layer only).
* [D16] FedAvg/FedProx replay baselines cache a uniformly random subset of the pool under the same
  budget rule; FedProx mu = 0.01.

Class-incremental (``scenario="class"``): a single head over all classes, CE on the first
``num_seen`` logits (future classes masked). Domain-incremental (``"domain"``): all classes are
always seen (no masking). Fed-EWC / Fed-LwF are :mod:`fedlib.federated.fcil`'s methods run by the same
learner without memory (for ``"domain"``, LwF distils all classes).
"""
from __future__ import annotations

import copy
import inspect
import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedlib.core.persample import (_ghost_layers, default_names, ghost_total, grad_sq_norms, hooked_forward,
                                   last_layer_grad_sq_norms)
from fedlib.core.validate import check_choice, check_int, check_real
from fedlib.evaluation.compare import refed_label
from fedlib.federated.fcil import METHODS
from fedlib.federated.gradient import FedConfig, History
from fedlib.federated.incremental import run_class_incremental
from fedlib.federated.learner import (MEMORY_MODES, FirstStageShare, FixedLearner, GradientLearner, HerdingReplay,
                                      KeepWeights, RandomReplay, Replay, ReservoirReplay, ScoreReplay, balancing,
                                      select_top)

__all__ = ["WEIGHTINGS", "GRAD_NORMS", "PROX_SCALINGS", "MEMORY_MODES", "LEARNERS", "q_lambda", "importance_scores",
           "PIMResult", "train_pim", "RefedReplay", "PIMShare", "make_learner", "rounds_to_best", "PIM_METHODS",
           "REPLAY_METHODS", "run_scenario", "ScenarioRuns", "run_methods", "make_scenario", "first_task_accuracies",
           "paired_differences", "replay_verdict", "cache_diagnostics", "final_task_accuracy", "last_task_hypothesis",
           "first_task_table", "stage_curves", "round_curves", "last_task_share", "largest_pools", "compare_grad_norms",
           "cost_lines", "summary_lines"]

WEIGHTINGS = ("early", "average", "late")
#: train_pim computes the exact norms of a full mini-batch (2^k samples) from its training step's own
#: forward and backward (:func:`_fused_pim_step`, bit-identical); False: a separate ghost-norm pass
FUSED_PIM = True
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

    Step (Eq. 3 with [D5]): SGD on mean CE(v(x_b)[:, :num_seen], y_b) + (q_eff/2)||v - w||^2,
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
    layers = _ghost_layers(v, names) if FUSED_PIM and grad_norm == "exact" and _mode_free(v) else None
    for p in range(epochs):
        perm = torch.randperm(n, generator=gen)
        for s in range(0, n, batch_size):
            idx = perm[s:s + batch_size]
            xb, yb = x[idx.to(x.device)], y[idx.to(y.device)]
            b = int(idx.shape[0])
            if layers is not None and b & (b - 1) == 0:   # one pass for the norms and the step (exact: b = 2^k)
                g2 = _fused_pim_step(v, layers, xb, yb, num_seen, trained, anchor, q, opt)
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


def _mode_free(model: nn.Module) -> bool:
    """True when the model computes the same in train and eval mode: built only from modules known
    to ignore the mode (no dropout, no batch norm)."""
    from fedlib.federated.gradient import LinearHead, MLPHead
    from fedlib.federated.models import SmallCNN

    free = (nn.Linear, nn.Conv2d, nn.ReLU, nn.Flatten, nn.Identity, nn.Sequential, nn.MaxPool2d, SmallCNN,
            LinearHead, MLPHead)
    return all(type(m) in free for m in model.modules())


def _fused_pim_step(v: nn.Module, layers: dict, xb: Tensor, yb: Tensor, num_seen: int, trained, anchor, q: float,
                    opt) -> Tensor | None:
    """One PIM step (Eq. 3) and the exact G^p of its b samples from the same forward and backward:
    the ghost norms of :func:`fedlib.core.persample.grad_sq_norms` need every layer's input a and the
    per-sample output gradients dl_i/dz_i, and the step's backward of the batch-mean loss computes
    dL/dz = (1/b) dl_i/dz_i (the proximal term does not reach z). For b a power of two the scaling by
    1/b is exact in floating point, so b dL/dz equals the separate sum-loss backward bit for bit, and
    the norms and the step equal those of the two-pass route (tested). Needs a model that computes the
    same in train and eval mode (:func:`_mode_free`); returns None (nothing done) when a hooked layer did
    not run exactly once on a (b, ...) input, as :func:`fedlib.core.persample.grad_sq_norms` checks."""
    b = int(xb.shape[0])
    v.train()
    hooked = hooked_forward(v, layers, xb)
    if hooked is None:
        return None
    logits, acts = hooked
    grads: dict[nn.Module, Tensor] = {}
    for m in layers:
        acts[m][1].register_hook(lambda g, m=m: grads.__setitem__(m, g * b))
    loss = F.cross_entropy(logits[:, :num_seen], yb)
    prox = sum(((a - w) ** 2).sum() for a, w in zip(trained, anchor))
    opt.zero_grad(set_to_none=True)
    (loss + 0.5 * q * prox).backward()
    total = ghost_total(layers, acts, grads, logits[:, 0])
    opt.step()
    return total


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

    pim_share: "PIMShare | None" = None   # set by run_scenario: PIMs reused between runs (see PIMShare)

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


class PIMShare(dict):
    """PIM results reused between runs: a PIM depends only on the broadcast global model, the pool, the
    client's generator for the selection and the PIM's settings, not on the budget, the weighting or
    the class balancing. At the first boundary the runs of one seed share the global model (task 1
    is the same for all, :class:`fedlib.federated.learner.FirstStageShare`), so Re-Fed, class-balanced
    Re-Fed, the Early/Late weightings and the memory sizes of a sweep train the same PIMs there. The
    key holds SHA-1s of the pool (x, y), of the global model's state and of the generator's state,
    with ``num_old``, lam, epochs, lr, batch size, momentum, prox scaling, norm and parameter names;
    a hit returns the stored G^p, distance and loss (the PIM's weights are not kept: the selection
    does not use them), bit-identical to training it again (tested)."""

    def __init__(self):
        super().__init__()
        self.hits = 0
        self.misses = 0

    @staticmethod
    def key(policy: "RefedReplay", x: Tensor, y: Tensor, ctx, lr: float) -> tuple:
        from fedlib.federated.learner import _fingerprint

        model = _fingerprint(list(ctx.global_model.state_dict().values()))
        return (_fingerprint([x, y]), model, _fingerprint([ctx.generator.get_state()]), int(ctx.num_old),
                policy.lam, policy.pim_epochs, float(lr), int(ctx.config.batch_size), policy.pim_momentum,
                policy.prox_scaling, policy.grad_norm, tuple(ctx.names))


def rounds_to_best(history: History) -> int:
    """First evaluated round reaching the stage's best test accuracy (Table 3's CoR per task);
    0 for a stage without training (Fixed) or without evaluation."""
    if history is None or not history.test_acc or all(math.isnan(a) for a in history.test_acc):
        return 0
    acc = np.asarray(history.test_acc, dtype=float)
    return int(history.round[int(np.nanargmax(acc))])


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
    one loop can pass it to all. ``aggregation`` defaults to Re-Fed's uniform mean ([D11]).
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


# ----------------------------------------------------------------------------------------------
# the benchmark chapter's runs
# ----------------------------------------------------------------------------------------------
#: the benchmark's methods that train a PIM; "refed_proxy" is "refed" with ``grad_norm="last_layer"``
PIM_METHODS = ("refed", "refed_balanced", "refed_proxy", "refed_task", "refed_task_class")
#: the methods that keep a replay cache under the budget M
REPLAY_METHODS = PIM_METHODS + ("fedavg_replay", "fedprox_replay", "grand", "el2n", "herding", "reservoir")


def run_scenario(scenario: dict, kind: str, method: str, seed: int, *, model_fn: Callable[[], nn.Module],
                 num_clients: int, batch_size: int, momentum: float, participation: float, device: str,
                 num_threads: int, memory_mode: str, pim_epochs: int, grad_norm: str,
                 method_hparams: dict | None = None, num_classes: int = 10, alpha: float | None = None,
                 memory: int | None = None, lam: float | None = None, weighting: str = "early",
                 track: bool = False, share_first_stage: FirstStageShare | None = None,
                 pim_share: PIMShare | None = None) -> dict:
    """One run of the benchmark chapter: ``method`` (a :data:`LEARNERS` name or ``"refed_proxy"``) through
    ``scenario``'s stream with ``seed`` (model initialisation, class order, partitions, client draws).

    ``scenario``: ``name`` (the table label), ``x_train`` (N, C, H, W), ``y_train`` (N,), ``x_test``,
    ``y_test``, ``stream`` (a stream, or seed -> stream), ``alpha`` (Dirichlet), ``lr``, ``memory`` (M), ``lam``,
    ``rounds``, ``first_rounds`` (or None), ``epochs``; ``kind`` is ``"class"`` or ``"domain"``
    (:func:`make_learner`'s ``scenario``). ``alpha``, ``memory``, ``lam`` override the scenario's;
    ``method_hparams`` {method: keyword arguments of its loss}; ``num_classes`` of the model's head.
    Plain SGD (Eqs. 3 and 6, [D7]); ``track`` evaluates after every round (Table 3's rounds to best).
    ``share_first_stage``: a :class:`fedlib.federated.learner.FirstStageShare`; the task-1 training, the same
    for every method with the plain loss (no cache exists yet), is then done once and restored by
    the other runs (bit-identical); its measured seconds still count in every run's ``wall_s``.
    ``pim_share``: a :class:`PIMShare` through which the Re-Fed runs reuse identical PIMs.
    After the run the storage rule of ``memory_mode`` is checked on what the clients hold
    (RuntimeError on a violation) and the weights must be finite (FloatingPointError).

    Returns {"result": IncrementalResult, "learner", "tracked", "cor" (rounds to best per task, [] if
    not tracked), "method", "row" (the metrics row: ``result.summary()``, ``key``, ``top1_T``,
    ``CoR_sum``), "client_stages" (client caches checked)}.
    """
    pim = method in PIM_METHODS
    alpha = scenario["alpha"] if alpha is None else alpha
    memory = scenario["memory"] if memory is None else memory
    lam = scenario["lam"] if lam is None else lam
    stream = scenario["stream"](seed) if callable(scenario["stream"]) else scenario["stream"]
    config = FedConfig(rounds=scenario["rounds"], local_epochs=scenario["epochs"], batch_size=batch_size,
                       lr=scenario["lr"], momentum=momentum, weight_decay=0.0, participation=participation, seed=seed,
                       device=device, num_threads=num_threads, eval_every=1 if track else 10**6)
    pos_test = stream.relabel(scenario["y_test"])

    def eval_data(t):
        idx = np.concatenate([stream.tasks[tau].test_idx for tau in range(t + 1)])
        return scenario["x_test"][idx], torch.from_numpy(pos_test[idx])

    kw = dict((method_hparams or {}).get(method, {}))
    if method in REPLAY_METHODS:
        kw["memory_mode"] = memory_mode
    if pim:
        kw.update(lam=lam, weighting=weighting, pim_epochs=pim_epochs,
                  grad_norm="last_layer" if method == "refed_proxy" else grad_norm)
    if scenario["first_rounds"] is not None:
        kw["first_rounds"] = scenario["first_rounds"]
    learner = make_learner("refed" if method == "refed_proxy" else method, model_fn, config, num_classes=num_classes,
                           memory=memory, scenario=kind, progress=False, eval_data=eval_data if track else None,
                           share_first_stage=share_first_stage, **kw)
    if isinstance(learner.replay, RefedReplay):
        learner.replay.pim_share = pim_share
    label = refed_label(method, grad_norm=grad_norm) + ("" if weighting == "early" or not pim else f" ({weighting})")
    res = run_class_incremental(learner, stream, scenario["x_train"], scenario["y_train"], scenario["x_test"],
                                scenario["y_test"], num_clients, alpha, seed,
                                config={"scenario": scenario["name"], "seed": seed, "alpha": alpha,
                                        "M": memory if method in REPLAY_METHODS else 0,
                                        "lambda": lam if pim else np.nan, "weighting": weighting},
                                progress=False)
    res.method = label
    for t, seconds in learner.reused_seconds.items():   # a restored task-1 training costs what it cost when run
        res.wall_s[t] += seconds
    cor = [rounds_to_best(h) for h in learner.histories] if track else []
    learner.eval_data = None   # a closure over the test data, done with; the run's dict must pickle (forked runs)
    learner.share_first_stage = None   # the shares, done with: a run's dict pickles without them
    if isinstance(learner.replay, RefedReplay):
        learner.replay.pim_share = None
    for h in learner.histories:
        if h is not None:
            h.final_state = None   # every stage's weights: not needed after the run
    violations = learner.check_memory()
    if violations:
        raise RuntimeError(f"{label} ({kind}, seed {seed}) broke the storage rule of memory_mode "
                           f"{memory_mode!r}: {violations[:3]}")
    if not all(bool(torch.isfinite(p).all()) for p in learner.model.parameters()):
        raise FloatingPointError(f"{label} ({kind}, seed {seed}) diverged: non-finite weights; lower lr or the "
                                 "method's regularisation weight")
    client_stages = sum(len(log["new"]) for log in learner.memory_log[1:] if len(log)) if method in REPLAY_METHODS else 0
    return {"result": res, "learner": learner, "tracked": track, "cor": cor, "method": method,
            "row": {**res.summary(), "key": method, "top1_T": 100 * res.top1[-1],
                    "CoR_sum": sum(cor) if track else np.nan},
            "client_stages": client_stages}


class ScenarioRuns:
    """The benchmark chapter's runs, cached by their settings so that the sweeps reuse the main runs.

    ``scenarios`` {kind: scenario dict of :func:`run_scenario`}; ``settings`` the keyword arguments of
    :func:`run_scenario` shared by every run (``model_fn``, ``num_clients``, ``batch_size``, ...).
    ``runs(kind, method, seed, alpha=, memory=, lam=, weighting=, track=)`` returns the run's dict; a
    tracked run also serves an untracked request. ``runs.runs`` {key: run}, ``runs.memory_checks``
    counts the runs and (client, task) caches whose storage rule was checked. ``share_first_stage``
    (default True): the runs share one :class:`fedlib.federated.learner.FirstStageShare` (``runs.first_stage``),
    so the task-1 training common to the methods with the plain loss is done once per setting, and
    one :class:`PIMShare` (``runs.pims``) for the PIMs that are the same in several runs.
    :meth:`prefetch` runs a cell's requests in forked worker processes first, so that its calls are
    then served from the cache.
    """

    def __init__(self, scenarios: dict[str, dict], share_first_stage: bool = True, **settings: Any):
        self.scenarios = scenarios
        self.settings = settings
        self.share = bool(share_first_stage)
        self.runs: dict[tuple, dict] = {}
        self.memory_checks = {"runs": 0, "client-stages": 0}
        self.first_stage = FirstStageShare() if share_first_stage else None
        self.pims = PIMShare() if share_first_stage else None

    def key(self, kind: str, method: str, seed: int, *, alpha: float | None = None, memory: int | None = None,
            lam: float | None = None, weighting: str = "early") -> tuple:
        """The cache key of a run: (kind, method, seed, alpha, memory (replay methods), lam and weighting
        (PIM methods)), the scenario's values filled in."""
        if kind not in self.scenarios:
            raise ValueError(f"kind must be one of {sorted(self.scenarios)}, got {kind!r}")
        s = self.scenarios[kind]
        alpha = s["alpha"] if alpha is None else alpha
        memory = s["memory"] if memory is None else memory
        lam = s["lam"] if lam is None else lam
        pim = method in PIM_METHODS
        return (kind, method, seed, alpha, memory if method in REPLAY_METHODS else None, lam if pim else None,
                weighting if pim else None)

    def _served(self, key: tuple, track: bool) -> bool:
        """The run of ``key`` (:meth:`key`) is held, and tracked when ``track`` asks for it: a call is served
        from the cache."""
        return key in self.runs and (self.runs[key]["tracked"] or not track)

    def __call__(self, kind: str, method: str, seed: int, *, alpha: float | None = None, memory: int | None = None,
                 lam: float | None = None, weighting: str = "early", track: bool = False) -> dict:
        key = self.key(kind, method, seed, alpha=alpha, memory=memory, lam=lam, weighting=weighting)
        if self._served(key, track):
            return self.runs[key]
        # run_scenario fills a None alpha, memory or lam from the scenario, as key() does
        out = run_scenario(self.scenarios[kind], kind, method, seed, alpha=alpha, memory=memory, lam=lam,
                           weighting=weighting, track=track, share_first_stage=self.first_stage, pim_share=self.pims,
                           **self.settings)
        self.memory_checks["runs"] += 1
        self.memory_checks["client-stages"] += out["client_stages"]
        self.runs[key] = out
        return out

    def sharing_group(self, request: dict) -> tuple:
        """The default group of a request in :meth:`prefetch`: (kind, seed, alpha). Runs that may share
        work in the sequential order are in one group: the task-1 training
        (:class:`fedlib.federated.learner.FirstStageShare`: one scenario, seed and alpha; the same for every
        memory, lambda and weighting) and the PIMs (:class:`PIMShare`: at the first boundary the same global
        model and pools)."""
        key = self.key(**{k: v for k, v in request.items() if k != "track"})
        return key[0], key[2], key[3]

    def prefetch(self, requests: Sequence[dict], workers: int | None = None, *, group: Callable[[dict], Any] | None = None,
                 progress: bool = True, desc: str = "runs") -> dict:
        """Run the requests not yet held in forked worker processes (:func:`fedlib.core.parallel.fork_map`),
        so that the calls ``self(**request)`` that follow are served from the cache with the results of
        the sequential calls, bit for bit (seconds aside).

        ``requests``: keyword arguments of :meth:`__call__` (``kind``, ``method``, ``seed``, optional
        ``alpha``, ``memory``, ``lam``, ``weighting``, ``track``), in the order the cell calls them.
        They are split into groups by ``group(request)`` (default :meth:`sharing_group`: the runs that
        share a task-1 training or PIMs stay in one group, so they still share them); each group runs
        in request order in a fresh ScenarioRuns of the same scenarios and settings (in a worker, or
        in this process when ``workers`` is 1 or there is one group), which starts from this one's
        task-1 trainings and PIMs. Groups go out largest first (the most runs, then the scenario with
        the most training samples), so the workers finish close together. The runs come back into
        ``runs`` in request order; ``memory_checks``, the new PIMs and the PIM hit counts are added.
        ``workers`` None: :func:`fedlib.core.parallel.default_workers`. Returns {"runs": runs made,
        "groups": groups, "processes": worker processes used (1: this process), "seconds" (wall),
        "cpu_seconds" (CPU time of each group, in job order)}.
        """
        import time

        from fedlib.core.parallel import fork_map, resolve_workers

        workers = resolve_workers(workers)
        if isinstance(requests, dict) or not all(isinstance(r, dict) for r in requests):
            raise ValueError("requests must be a sequence of dicts of ScenarioRuns' call arguments "
                             "(kind, method, seed, ...)")
        params = set(inspect.signature(self.__call__).parameters)
        pending, groups, planned, of_key = [], {}, {}, {}
        for r in requests:
            if not {"kind", "method", "seed"} <= set(r) or set(r) - params:
                raise ValueError(f"a request needs kind, method and seed and takes only {sorted(params)}, got {r}")
            key = self.key(**{k: v for k, v in r.items() if k != "track"})
            if self._served(key, r.get("track", False)):
                continue
            if planned.get(key) or (key in planned and not r.get("track", False)):
                continue   # already planned, tracked or as asked
            planned[key] = bool(r.get("track", False))
            pending.append(key)
            gid = of_key.setdefault(key, (group or self.sharing_group)(r))   # a run stays in one group
            groups.setdefault(gid, []).append(r)
        size = {k: len(s["y_train"]) for k, s in self.scenarios.items()}
        jobs = list(groups.values())
        start = time.perf_counter()
        if jobs and workers > 1:
            import torch._dynamo  # noqa: F401  (torch's optimizers import it on first use, 1 s of CPU: the workers inherit it)

        def run_group(reqs):
            cpu = time.process_time()
            sub = ScenarioRuns(self.scenarios, share_first_stage=self.share, **self.settings)
            if self.share:   # start from what this one holds (entries are restored by copy, never changed)
                sub.first_stage.update(self.first_stage)
                sub.pims.update(self.pims)
            for r in reqs:
                sub(**r)
            pims = {} if not self.share else {k: v for k, v in sub.pims.items() if k not in self.pims}
            return (sub.runs, sub.memory_checks, pims, (0, 0) if not self.share else (sub.pims.hits, sub.pims.misses),
                    time.process_time() - cpu)

        done = fork_map(run_group, jobs, min(workers, max(1, len(jobs))), cost=lambda g: (len(g), size[g[0]["kind"]]),
                        desc=desc, progress=progress and bool(jobs))
        fetched = {}
        for runs, checks, pims, (hits, misses), _ in done:
            fetched.update(runs)
            for k in self.memory_checks:
                self.memory_checks[k] += checks[k]
            if self.share:
                self.pims.update(pims)
                self.pims.hits += hits
                self.pims.misses += misses
        for key in pending:   # request order: the order in which the sequential calls would have added them
            self.runs[key] = fetched[key]
        return {"runs": len(pending), "groups": len(jobs),
                "processes": min(workers, len(jobs)) if len(jobs) > 1 else len(jobs),
                "seconds": time.perf_counter() - start, "cpu_seconds": [c for *_, c in done]}


def prefetch_summary(info: dict, what: str) -> str:
    """One line on a :meth:`ScenarioRuns.prefetch` (its returned ``info``): runs, groups, processes,
    wall seconds, CPU seconds in all and per group."""
    return (f"{what}: {info['runs']} runs in {info['groups']} group(s) on {info['processes']} process(es), "
            f"{info['seconds']:.0f} s ({sum(info['cpu_seconds']):.0f} s CPU; per group, in the order sent: "
            f"{', '.join(f'{c:.0f}' for c in info['cpu_seconds'])} s)")


def run_methods(runs: dict[str, dict], model_fn: Callable[[], nn.Module], config: FedConfig, stream, x_train, y_train,
                x_test, y_test, *, num_classes: int, num_clients: int, beta: float | None,
                seed: int) -> tuple[dict, dict]:
    """Run several learners through one class-incremental stream with the same data, partitions and
    seed. ``runs`` {name: keyword arguments of :func:`make_learner`}; the method is the name's first
    word (``"refed (memory holds all)"`` runs ``"refed"``). Returns ({name: IncrementalResult},
    {name: :class:`fedlib.federated.learner.KeepWeights`}: the global weights after every stage)."""
    results, kept = {}, {name: KeepWeights() for name in runs}
    for name, kw in runs.items():
        learner = make_learner(name.split(" ")[0], model_fn, config, num_classes=num_classes, progress=False,
                               on_stage_end=[kept[name]], **kw)
        results[name] = run_class_incremental(learner, stream, x_train, y_train, x_test, y_test, num_clients=num_clients,
                                              beta=beta, seed=seed, progress=False)
    return results, kept


# ----------------------------------------------------------------------------------------------
# the benchmark chapter's tables and evidence (from the runs of a ScenarioRuns)
# ----------------------------------------------------------------------------------------------
def make_scenario(name: str, x_train, y_train, x_test, y_test, stream, **settings: Any) -> dict:
    """A scenario dict of :func:`run_scenario`: uint8 images (N, H, W) or (N, H, W, 3) as float tensors
    (N, C, H, W) (:func:`fedlib.federated.models.images_to_tensor`), labels (N,), ``stream`` (a stream or seed ->
    stream) and ``settings`` (``alpha``, ``lr``, ``memory``, ``lam``, ``rounds``, ``first_rounds``, ``epochs``)."""
    from fedlib.federated.models import images_to_tensor

    missing = sorted({"alpha", "lr", "memory", "lam", "rounds", "first_rounds", "epochs"} - set(settings))
    if missing:
        raise ValueError(f"scenario {name!r} lacks the settings {', '.join(missing)}")
    return {"name": name, "x_train": images_to_tensor(x_train), "y_train": y_train, "x_test": images_to_tensor(x_test),
            "y_test": y_test, "stream": stream, **settings}


def first_task_accuracies(runs: ScenarioRuns, kind_methods: dict[str, Sequence[str]], seeds: Sequence[int],
                          methods: Sequence[str]) -> dict[tuple, dict]:
    """Accuracy on task 1 after task 1 (``acc[0, 0]``) of the tracked runs: {(kind, seed): {method:
    accuracy}} for the ``methods`` run in each kind (``kind_methods`` {kind: methods}). No cache exists
    on task 1, so the memory-based methods and FedAvg must agree exactly (the paper's Tables 5-9)."""
    return {(kind, seed): {m: runs(kind, m, seed, track=True)["result"].acc[0, 0] for m in methods if m in kind_m}
            for kind, kind_m in kind_methods.items() for seed in seeds}


def paired_differences(main, scenarios: dict[str, dict], kind_methods: dict[str, Sequence[str]], pairs, seeds,
                       grad_norm: str, metrics: Sequence[str] = ("A_T", "A_avg")):
    """Paired differences a - b over ``seeds`` (:func:`fedlib.evaluation.stats.paired_difference`) of the
    main runs' rows ``main`` (one row per run: ``scenario`` name, ``key`` method, ``seed``, metrics) for
    every pair (a, b) in ``pairs`` run in a kind (``kind_methods``) and every metric; none with fewer
    than 2 seeds. Returns ({(kind, a, b, metric): PairedDifference}, a table: scenario, comparison,
    metric, mean difference [95% CI], resolved (CI excludes 0), seeds a > b)."""
    from fedlib.evaluation.stats import paired_difference

    diffs, rows = {}, []
    for kind in scenarios:
        df = main[main.scenario == scenarios[kind]["name"]]
        for a, b in pairs:
            if a not in kind_methods[kind] or b not in kind_methods[kind] or len(seeds) < 2:
                continue
            for metric in metrics:
                va = df[df.key == a].set_index("seed").loc[seeds, metric].to_numpy()
                vb = df[df.key == b].set_index("seed").loc[seeds, metric].to_numpy()
                d = paired_difference(va, vb)
                diffs[(kind, a, b, metric)] = d
                rows.append({"scenario": scenarios[kind]["name"],
                             "comparison": f"{refed_label(a, grad_norm)} - {refed_label(b, grad_norm)}",
                             "metric": metric, "mean difference [95% CI] (points)": str(d),
                             "resolved (CI excludes 0)": d.excludes_zero,
                             "seeds a > b": f"{int((va > vb).sum())} of {len(seeds)}"})
    return diffs, pd.DataFrame(rows)


def replay_verdict(diffs: dict, kind: str, baselines: Sequence[str] = ("fedavg_replay", "fedprox_replay")) -> dict | None:
    """The paper's headline (Table 1) from :func:`paired_differences`' A_T differences "refed" - b for the
    ``baselines`` b compared in ``kind``: {"baselines", "diffs", "holds" (every CI above 0), "worse"
    (baselines whose CI lies above Re-Fed's), "verdict" (a sentence)}; None when none was compared."""
    baselines = [b for b in baselines if (kind, "refed", b, "A_T") in diffs]
    if not baselines:
        return None
    ds_ = [diffs[(kind, "refed", b, "A_T")] for b in baselines]
    worse = [b for b, d in zip(baselines, ds_) if d.high < 0]
    holds = all(d.low > 0 for d in ds_)
    verdict = ("resolved in Re-Fed's favour" if holds else
               "Re-Fed resolved below " + ", ".join(worse) if worse else
               "not supported at this scale: a paired CI contains 0, so these runs show neither an advantage "
               "nor a disadvantage")
    return {"baselines": baselines, "diffs": ds_, "holds": holds, "worse": worse, "verdict": verdict}


def cache_diagnostics(runs: ScenarioRuns, methods: Sequence[str], seeds: Sequence[int], memory_mode: str,
                      grad_norm: str, kind: str = "class"):
    """Where the replay goes (class-incremental caches), at every boundary t >= 2 of the tracked runs of
    ``methods`` x ``seeds``, summed over clients: the last old task's share of the pool and of the
    cache (%), the smallest per-class count in the union of the caches (over the classes the pools
    hold), the (client, class) pairs a cache loses, and the unused cache storage (budget - cache, the
    budget of ``memory_mode``). One row per (method, seed, boundary)."""
    rows = []
    for m in methods:
        for seed in seeds:
            lrn = runs(kind, m, seed, track=True)["learner"]
            for t, log in enumerate(lrn.memory_log):
                if t < 2 or "old_tasks" not in log:
                    continue
                old_cls = log["pool_classes"].sum(0) > 0
                union = log["old_classes"].sum(0)
                budget = lrn.replay.memory - log["new"] if memory_mode == "total" else lrn.replay.memory
                rows.append({"method": refed_label(m, grad_norm), "seed": seed, "boundary": t,
                             "last old task, share of the pool (%)": 100 * log["pool_tasks"][:, t - 1].sum() / log["pool"].sum(),
                             "last old task, share of the cache (%)": 100 * log["old_tasks"][:, t - 1].sum() / log["old"].sum(),
                             "smallest class count, union of caches": int(union[old_cls].min()),
                             "(client, class) pairs lost": int(((log["pool_classes"] > 0) & (log["old_classes"] == 0)).sum()),
                             "unused cache storage (samples, all clients)": int((budget - log["old"]).clip(min=0).sum())})
    return pd.DataFrame(rows)


def final_task_accuracy(runs: ScenarioRuns, methods: Sequence[str], seeds: Sequence[int], grad_norm: str,
                        kind: str = "class"):
    """Final accuracy per task (%, the last row of ``acc``) of the tracked runs: one row per (method,
    seed), columns method, seed, "task 1", ..., "task T"."""
    return pd.DataFrame([{"method": refed_label(m, grad_norm), "seed": seed,
                          **{f"task {tau + 1}": 100 * a for tau, a in enumerate(runs(kind, m, seed, track=True)["result"].acc[-1])}}
                         for m in methods for seed in seeds])


def last_task_hypothesis(per_seed, final_task, num_tasks: int, grad_norm: str) -> dict:
    """Re-Fed minus random replay, paired by seed: the last old task's share of the cache (``share``,
    from ``per_seed``, indexed by (method label, seed)), the final accuracy on task T-1 (``last``) and
    on task 1 (``first``) from :func:`final_task_accuracy`; ``confirmed`` when the share and the task
    T-1 accuracy both fall (CI below 0)."""
    from fedlib.evaluation.stats import paired_difference

    a, b = refed_label("refed", grad_norm), refed_label("fedavg_replay", grad_norm)
    col = "last old task, share of the cache (%)"
    share = paired_difference(per_seed.loc[a][col].to_numpy(), per_seed.loc[b][col].to_numpy())
    last = paired_difference(final_task[final_task.method == a][f"task {num_tasks - 1}"].to_numpy(),
                             final_task[final_task.method == b][f"task {num_tasks - 1}"].to_numpy())
    first = paired_difference(final_task[final_task.method == a]["task 1"].to_numpy(),
                              final_task[final_task.method == b]["task 1"].to_numpy())
    return {"share": share, "last": last, "first": first, "confirmed": share.high < 0 and last.high < 0}


def first_task_table(runs: ScenarioRuns, kind: str, methods: Sequence[str], seeds: Sequence[int], grad_norm: str):
    """Accuracy (%) on task (domain) 1 right after task 1 and after the last task, one row per (method, seed)."""
    rows = []
    for m in methods:
        for seed in seeds:
            acc = runs(kind, m, seed, track=True)["result"].acc
            rows.append({"method": refed_label(m, grad_norm), "seed": seed, "domain 1 after task 1 (%)": 100 * acc[0, 0],
                         "domain 1 after the last task (%)": 100 * acc[-1, 0]})
    return pd.DataFrame(rows)


def stage_curves(runs: ScenarioRuns):
    """A_t after every stage (``IncrementalResult.curve``) of every tracked run, one frame."""
    return pd.concat([runs.runs[k]["result"].curve().assign(method=runs.runs[k]["result"].method)
                      for k in runs.runs if runs.runs[k]["tracked"]], ignore_index=True)


def round_curves(runs: ScenarioRuns, seed: int):
    """Test accuracy (%) of the global model after every round of the tracked runs of ``seed``, rounds
    counted over all tasks: columns scenario, method, round, accuracy."""
    rows = []
    for k, v in runs.runs.items():
        if v["tracked"] and k[2] == seed:
            start = 0
            for h in v["learner"].histories:
                if h is not None:
                    rows += [{"scenario": v["row"]["scenario"], "method": v["result"].method, "round": start + r,
                              "accuracy": 100 * a} for r, a in zip(h.round, h.test_acc)]
                    start += h.round[-1]
    return pd.DataFrame(rows)


def last_task_share(runs: ScenarioRuns, memories: Sequence[int], seeds: Sequence[int], kind: str = "class") -> dict:
    """{M: the last old task's share (%) of Re-Fed's caches at every boundary t >= 2, all clients and
    ``seeds``} for every memory size M of ``memories``."""
    share = {}
    for M in memories:
        logs = [log for seed in seeds for t, log in enumerate(runs(kind, "refed", seed, memory=M)["learner"].memory_log)
                if t >= 2 and "old_tasks" in log]
        share[M] = 100 * sum(log["old_tasks"][:, -1].sum() for log in logs) / max(1, sum(log["old"].sum() for log in logs))
    return share


def largest_pools(runs: ScenarioRuns, methods: Sequence[str], seeds: Sequence[int], memory: int,
                  kind: str = "class") -> list[int]:
    """The largest candidate pool of every boundary of the replay methods' runs with memory ``memory``:
    Re-Fed equals random replay once M holds every pool."""
    return [int(log["pool"].max()) for seed in seeds for m in methods if m in REPLAY_METHODS
            for log in runs(kind, m, seed, memory=memory)["learner"].memory_log if len(log)]


def compare_grad_norms(learner: GradientLearner, *, lam: float, epochs: int, lr: float, batch_size: int, memory: int,
                       num_seen: int = 10, device: str = "cpu") -> dict:
    """Exact (Eq. 4, all parameters) against last-layer gradient norms on the same PIM trajectory:
    :func:`train_pim` from ``learner``'s final model on its largest client pool (generator seed 0),
    once per norm. Returns {"client", "y" (n,), "results" {norm: PIMResult with ``seconds``}, "rho"
    (Spearman of the Early scores), "budget" = min(memory, n // 2), "overlap" of the two top-budget
    selections, "share" (median last-layer share of the exact norm)}."""
    import time

    from scipy.stats import spearmanr

    k = int(np.argmax([len(s[1]) for s in learner.local_sets]))
    x_pool, y_pool = learner.local_sets[k][0].to(device), learner.local_sets[k][1].to(device)
    res = {}
    for g_norm in ["exact", "last_layer"]:
        t0 = time.perf_counter()
        res[g_norm] = train_pim(learner.model, x_pool, y_pool, num_seen, lam=lam, epochs=epochs, lr=lr,
                                batch_size=batch_size, grad_norm=g_norm, generator=torch.Generator().manual_seed(0))
        res[g_norm].seconds = time.perf_counter() - t0
    if res["exact"].dist_sq != res["last_layer"].dist_sq:
        raise RuntimeError("the two PIM runs differ: the scoring changed the PIM's steps")
    s_ex, s_ll = res["exact"].scores("early"), res["last_layer"].scores("early")
    budget = min(memory, len(y_pool) // 2)
    overlap = len(set(select_top(s_ex, budget).tolist()) & set(select_top(s_ll, budget).tolist())) / budget
    return {"client": k, "y": y_pool, "results": res, "rho": float(spearmanr(s_ex.numpy(), s_ll.numpy())[0]),
            "budget": budget, "overlap": overlap,
            "share": float((res["last_layer"].grad_sq / res["exact"].grad_sq).median())}


def cost_lines(main, scenarios: dict[str, dict], *, pim_epochs: int, participation: float, grad_norm: str) -> list[str]:
    """The cost section's sentences from the main runs' rows ``main``: per scenario, the PIM epochs
    against the expected local epochs per later task (and the paper's 40 against 1200), the PIM +
    scoring seconds (Re-Fed - random replay), equal upload, and the exact / last-layer time ratio."""
    lines = []
    for kind, s in scenarios.items():
        c = main[main.scenario == s["name"]].groupby("key")[["wall_s", "MiB_up"]].mean()
        if {"refed", "fedavg_replay"} <= set(c.index):
            per_task = s["rounds"] * participation * s["epochs"]
            lines.append(f"{s['name']}: {pim_epochs} PIM epochs per client and task against about {per_task:.1f} "
                         f"expected local epochs of training per later task ({pim_epochs / per_task:.0%}; the paper: 40 "
                         f"against 150 x 0.4 x 20 = 1200, {40 / 1200:.1%})")
            lines.append(f"  PIM + scoring cost about {c.wall_s['refed'] - c.wall_s['fedavg_replay']:.1f} s per run "
                         f"({refed_label('refed', grad_norm)}); upload equal to random replay: "
                         f"{np.isclose(c.MiB_up['refed'], c.MiB_up['fedavg_replay'])}")
        if {"refed", "refed_proxy"} <= set(c.index):
            lines.append(f"  a Re-Fed run with exact norms takes {c.wall_s['refed'] / c.wall_s['refed_proxy']:.2f} x the "
                         "time of one with the last-layer proxy")
    return lines


def summary_lines(main, scenarios: dict[str, dict], diffs: dict, seeds: Sequence[int], grad_norm: str) -> list[str]:
    """The summary's sentences: per scenario the methods ranked by mean A_T, every A_T paired difference
    of ``diffs`` (:func:`paired_differences`) with its verdict, and the mean forgetting without memory,
    with random replay and with Re-Fed."""
    lines = []
    for kind, s in scenarios.items():
        df = main[main.scenario == s["name"]]
        ranking = df.groupby("method")["A_T"].mean().sort_values(ascending=False)
        lines.append(f"{s['name']}: mean final accuracy over {len(seeds)} seeds: "
                     + ", ".join(f"{m} {v:.1f}" for m, v in ranking.items()))
        for (sc, a, b, metric), d in diffs.items():
            if sc == kind and metric == "A_T":
                lines.append(f"  A_T {refed_label(a, grad_norm)} - {refed_label(b, grad_norm)}: {d} -> "
                             + ("resolved" if d.excludes_zero else "not resolved"))
        if {"fedavg", "fedavg_replay"} <= set(df.key):
            f_ = df.groupby("key")["F_T"].mean()
            lines.append(f"  forgetting F_T (mean): no memory {f_['fedavg']:.1f}, random replay {f_['fedavg_replay']:.1f}, "
                         f"Re-Fed {f_['refed']:.1f}")
    return lines
