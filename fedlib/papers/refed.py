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

Decisions the paper leaves open (notes Sec. 8), all constructor options of :class:`ReplayLearner`:

* [D1] ``memory_mode="total"`` (default, Sec. 3.1): M counts the whole local set, so the cache
  keeps ``M - N_k^t`` old samples and cache u new data has at most M samples; every client's new
  task must then satisfy N_k^t < M (else ValueError: use ``"replay"``). At the first task nothing
  is dropped even if N_k^1 > M. ``"replay"`` (Sec. 4.1): M is the replay-buffer size, the cache
  keeps min(M, |pool|) old samples on top of the new data.
* [D3] caches are rebuilt once per task, at the boundary, by **all** K clients, from the final
  global model of the previous task (not per round as Alg. 1 prints). Each task runs FedAvg with
  its own seed (:func:`fedlib.federated.fcil.stage_seed`), so each task samples its own clients.
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
* [D13] ``grad_norm="exact"``: vectorised per-sample gradients (``torch.func.vmap(grad)``, model
  in eval mode) over all trainable parameters; ``"last_layer"``: the closed form of
  :func:`last_layer_grad_sq_norms` (forward pass only).
* [D16] FedAvg/FedProx replay baselines cache a uniformly random subset of the pool under the same
  budget rule; FedProx mu = 0.01.

Class-incremental (``scenario="class"``): a single head over all classes, CE on the first
``num_seen`` logits (future classes masked). Domain-incremental (``"domain"``): all classes are
always seen (no masking). Fed-EWC / Fed-LwF are :mod:`fedlib.federated.fcil`'s methods run by the same
learner without memory (for ``"domain"``, LwF distils all classes).
"""
from __future__ import annotations

import copy
import dataclasses
import inspect
import math
import numbers
import types
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedlib.federated.fcil import IncrementalAlgorithm, _threads, make_method, stage_config
from fedlib.federated.gradient import FedConfig, FedProx, History, run_federated
from fedlib.core.validate import check_choice
from fedlib.core.devices import resolve_device

__all__ = ["SELECTIONS", "WEIGHTINGS", "MEMORY_MODES", "SCENARIOS", "GRAD_NORMS", "LOSSES", "LEARNERS",
           "q_lambda", "importance_scores", "select_top", "per_sample_grad_sq_norms",
           "last_layer_grad_sq_norms", "PIMResult", "train_pim", "IncrementalFedProx",
           "ReplayLearner", "FixedLearner", "make_learner", "rounds_to_best"]

SELECTIONS = ("none", "random", "refed")
WEIGHTINGS = ("early", "average", "late")
MEMORY_MODES = ("total", "replay")
SCENARIOS = ("class", "domain")
GRAD_NORMS = ("exact", "last_layer")
PROX_SCALINGS = ("mean", "sum")
AGGREGATIONS = ("uniform", "size")
LOSSES = ("finetune", "fedprox", "fedewc", "fedlwf")


def _check_int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _check_real(name: str, value, *, low: float = 0.0, strict: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) \
            or (value <= low if strict else value < low):
        raise ValueError(f"{name} must be a finite number {'>' if strict else '>='} {low}, got {value!r}")
    return float(value)


def _check_lam(lam) -> float:
    if isinstance(lam, bool) or not isinstance(lam, numbers.Real) or not 0.0 < lam < 1.0:
        raise ValueError(f"lam must lie in the open interval (0, 1) (q(lam) = (1-lam)/(2 lam)), got {lam!r}")
    return float(lam)


def q_lambda(lam: float) -> float:
    """q(lam) = (1 - lam) / (2 lam), the PIM's proximal weight (Eq. 3); lam in (0, 1)."""
    lam = _check_lam(lam)
    return (1.0 - lam) / (2.0 * lam)


# ----------------------------------------------------------------------------------------------
# scores and selection (Eqs. 4-5, Table 10)
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


BALANCING = ("none", "proportional", "equal")


def _balancing(class_balanced) -> str:
    """Normalise ``class_balanced``: False -> "none", True -> "proportional", or a name of BALANCING."""
    if class_balanced is False or class_balanced is None:
        return "none"
    if class_balanced is True:
        return "proportional"
    if isinstance(class_balanced, str) and class_balanced in BALANCING:
        return class_balanced
    raise ValueError(f"class_balanced must be False, True or one of {', '.join(BALANCING)}, got {class_balanced!r}")


def select_top(scores: Tensor, budget: int, labels: Tensor | None = None, class_balanced: bool | str = False) -> Tensor:
    """Indices (sorted ascending) of the ``budget`` highest ``scores`` (n,); ties keep the lower index.

    ``class_balanced`` splits the budget over the classes of ``labels`` (n,) (required then) and
    takes each class's own top-k: ``True`` / ``"proportional"``: class c gets the
    floor/largest-remainder share budget * n_c / n (the pool's class mix); ``"equal"``: every class
    the same quota, capped at n_c, with what a small class cannot use shared among the others
    (water-filling; a remainder goes to the classes with the most samples left, ties to the lower
    label).
    """
    mode = _balancing(class_balanced)
    scores = torch.as_tensor(scores)
    n = int(scores.shape[0])
    budget = _check_int("budget", budget, 0)
    if budget > n:
        raise ValueError(f"budget must be <= the {n} candidates, got {budget}")
    if mode == "none":
        order = torch.argsort(scores, descending=True, stable=True)
        return torch.sort(order[:budget]).values
    if labels is None or int(labels.shape[0]) != n:
        raise ValueError("class_balanced selection needs labels with one entry per score")
    classes, counts = torch.unique(labels, return_counts=True)
    if mode == "proportional":
        share = counts.double() * budget / n
        quota = share.floor().long()
        rest = budget - int(quota.sum())
        if rest:
            quota[torch.argsort(share - quota, descending=True, stable=True)[:rest]] += 1
    else:
        quota = torch.zeros_like(counts)
        rest = budget
        while rest > 0:
            room = counts - quota
            open_ = room > 0
            each = rest // int(open_.sum())
            if each == 0:
                quota[torch.argsort(room, descending=True, stable=True)[:rest]] += 1
                break
            add = torch.minimum(room, torch.full_like(room, each)) * open_
            quota += add
            rest -= int(add.sum())
    picked = []
    for c, k in zip(classes.tolist(), quota.tolist()):
        idx = torch.nonzero(labels == c).flatten()
        order = torch.argsort(scores[idx], descending=True, stable=True)
        picked.append(idx[order[:k]])
    return torch.sort(torch.cat(picked)).values


# ----------------------------------------------------------------------------------------------
# per-sample squared gradient norms (Eq. 4)
# ----------------------------------------------------------------------------------------------
def _default_names(model: nn.Module) -> list[str]:
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    return names or [n for n, _ in model.named_parameters()]


def per_sample_grad_sq_norms(model: nn.Module, x: Tensor, y: Tensor, num_seen: int,
                             names: Sequence[str] | None = None, batch_size: int = 64) -> Tensor:
    """||grad_theta CE(f(x_i)[:num_seen], y_i)||^2 for every sample: (n,) float32, same device as x.

    x (n, ...), y (n,) labels < num_seen. theta = the parameters ``names`` (default: those with
    requires_grad, or all if none does). Vectorised with ``torch.func.vmap(grad)`` over chunks
    of at most ``batch_size`` samples; the model runs in eval mode (BN running statistics: a
    per-sample gradient of a batch statistic is ill-defined), its mode is restored afterwards.
    """
    from torch.func import functional_call, grad, vmap

    num_seen = _check_int("num_seen", num_seen, 1)
    named = dict(model.named_parameters())
    names = _default_names(model) if names is None else list(names)
    unknown = [n for n in names if n not in named]
    if unknown or not names:
        raise ValueError(f"names must be parameter names of the model, got unknown {unknown or names}")
    params = {n: named[n].detach() for n in names}
    frozen = {n: p.detach() for n, p in named.items() if n not in params}
    buffers = dict(model.named_buffers())

    def loss(p, xi, yi):
        out = functional_call(model, ({**p, **frozen}, buffers), (xi.unsqueeze(0),))
        return F.cross_entropy(out[:, :num_seen], yi.unsqueeze(0))

    per_sample = vmap(grad(loss), in_dims=(None, 0, 0))
    numel = sum(p.numel() for p in params.values())
    chunk = max(1, min(batch_size, 2**25 // max(1, numel)))  # <= 128 MiB of float32 per-sample grads
    was_training = model.training
    model.eval()
    out = []
    try:
        for s in range(0, int(x.shape[0]), chunk):
            g = per_sample(params, x[s:s + chunk], y[s:s + chunk].long())
            out.append(sum(t.pow(2).flatten(1).sum(1) for t in g.values()))
    finally:
        model.train(was_training)
    return torch.cat(out) if out else torch.zeros(0, device=x.device)


def _last_linear(model: nn.Module) -> nn.Linear:
    layers = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if not layers:
        raise ValueError(f"{type(model).__name__} has no nn.Linear output layer; use grad_norm='exact'")
    return layers[-1]


@torch.no_grad()
def last_layer_grad_sq_norms(model: nn.Module, x: Tensor, y: Tensor, num_seen: int,
                             layer: nn.Linear | None = None) -> Tensor:
    """Closed-form squared gradient norm w.r.t. the output layer only: (n,) float32.

    For logits z = W h + b (``layer``, default the model's last nn.Linear, which must produce the
    model's output), pi = softmax(z[:num_seen]) and CE loss l = -log pi_y:
    grad_W l = (pi - e_y) h^T and grad_b l = pi - e_y, hence

        ||grad_W l||^2 + ||grad_b l||^2 = ||pi - e_y||^2 (||h||^2 + 1)

    (without a bias: ||pi - e_y||^2 ||h||^2). Rows of W for masked classes get zero gradient.
    Forward pass only, eval mode (as :func:`per_sample_grad_sq_norms`).
    """
    num_seen = _check_int("num_seen", num_seen, 1)
    layer = _last_linear(model) if layer is None else layer
    if not isinstance(layer, nn.Linear):
        raise ValueError(f"layer must be an nn.Linear, got {type(layer).__name__}")
    seen: dict[str, Tensor] = {}
    handle = layer.register_forward_hook(lambda m, inp, out: seen.update(h=inp[0], z=out))
    was_training = model.training
    model.eval()
    try:
        logits = model(x)
    finally:
        handle.remove()
        model.train(was_training)
    if "z" not in seen or seen["z"].shape != logits.shape or not torch.equal(seen["z"], logits):
        raise ValueError("the model's output is not the output of its last nn.Linear; pass layer= or "
                         "use the exact per-sample gradients")
    h = seen["h"].flatten(1)
    pi = torch.softmax(logits[:, :num_seen].float(), dim=1)
    pi[torch.arange(len(y), device=pi.device), y.long()] -= 1.0
    scale = h.float().pow(2).sum(1) + (1.0 if layer.bias is not None else 0.0)
    return pi.pow(2).sum(1) * scale


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
    epochs = _check_int("epochs", epochs, 1)
    lr = _check_real("lr", lr)
    batch_size = _check_int("batch_size", batch_size, 1)
    if not 0.0 <= momentum < 1.0:
        raise ValueError(f"momentum must be in [0, 1), got {momentum!r}")
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
    names = _default_names(v) if names is None else list(names)
    named = dict(v.named_parameters())
    for name, p in named.items():
        p.requires_grad_(name in names)
    trained = [named[n_] for n_ in names]
    anchor = [p.detach().clone() for p in trained]
    opt = torch.optim.SGD(trained, lr=lr, momentum=momentum)
    gen = generator if generator is not None else torch.Generator().manual_seed(0)
    grad_sq = torch.zeros(epochs, n, dtype=torch.float32)
    y = y.long()
    for p in range(epochs):
        perm = torch.randperm(n, generator=gen)
        for s in range(0, n, batch_size):
            idx = perm[s:s + batch_size]
            xb, yb = x[idx.to(x.device)], y[idx.to(y.device)]
            if grad_norm == "exact":
                g2 = per_sample_grad_sq_norms(v, xb, yb, num_seen, names, batch_size)
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


# ----------------------------------------------------------------------------------------------
# local losses
# ----------------------------------------------------------------------------------------------
class IncrementalFedProx(IncrementalAlgorithm, FedProx):
    """FedProx (Li et al., MLSys 2020) with the masked CE: L = CE(z[:, :s_t], y) + mu/2 ||w - w^t||^2."""

    name = "fedprox"


def _make_loss(loss: str, hparams: dict) -> IncrementalAlgorithm:
    check_choice("loss", loss, LOSSES)
    if loss != "fedprox":
        return make_method(loss, **hparams)
    unknown = sorted(set(hparams) - {"mu"})
    if unknown:
        raise TypeError(f"unknown hyperparameter(s) {', '.join(unknown)} for fedprox; allowed: mu")
    return IncrementalFedProx(**hparams)


def _uniform_weights(self, uploads):
    return [1.0 / len(uploads)] * len(uploads)


class _SeenMask:
    """Forward hook: in eval mode, logits of classes >= num_seen become -inf (run_federated's
    per-round test accuracy then matches ``predict``); training is unaffected."""

    def __init__(self, num_seen: int):
        self.num_seen = num_seen

    def __call__(self, module, inputs, out):
        if module.training or out.shape[1] <= self.num_seen:
            return out
        out = out.clone()
        out[:, self.num_seen:] = float("-inf")
        return out


def rounds_to_best(history: History) -> int:
    """First evaluated round reaching the stage's best test accuracy (Table 3's CoR per task);
    0 for a stage without training (Fixed) or without evaluation."""
    if history is None or not history.test_acc or all(math.isnan(a) for a in history.test_acc):
        return 0
    acc = np.asarray(history.test_acc, dtype=float)
    return int(history.round[int(np.nanargmax(acc))])


# ----------------------------------------------------------------------------------------------
# the learner
# ----------------------------------------------------------------------------------------------
class ReplayLearner:
    """Federated incremental learning with a per-client replay cache (an
    :class:`fedlib.federated.incremental.IncrementalLearner`).

    ``model_fn()`` maps x (N, ...) to logits (N, num_classes) over all classes of the stream. Stage
    t (0-based): (1) t > 0 and ``selection != "none"``: every client selects its cache from its
    previous local set with ``selection`` ("random": uniform; "refed": PIM scores, Eqs. 3-5);
    (2) one :func:`run_federated` call (``fcil.stage_config(config, t)``: a seed per stage, so
    every stage samples its own clients and batch orders; participation = fraction of clients
    per round) on cache u new data of each client, from the previous global
    model, with ``loss`` (masked CE "finetune", "fedprox", or fcil's "fedewc"/"fedlwf",
    hyperparameters ``loss_hparams``). ``memory`` = M, ``memory_mode`` its meaning (module
    docstring, [D1]). Client k of every task is the same client (the protocol's fixed order).

    ``first_rounds``: rounds of stage 0 (default ``config.rounds``), e.g. to learn the first task
    (domain) before anything can be forgotten; later stages run ``config.rounds``.
    ``eval_data(t) -> (x, y) | None``: test data that ``run_federated`` evaluates every
    ``config.eval_every`` rounds of stage t (class-incremental: argmax over the seen classes);
    ``histories[t].test_acc`` then gives per-round curves and :func:`rounds_to_best` the CoR.
    After stage t: ``histories[t]``, ``stage_bytes[t]`` (model uploads + loss-specific extra
    uploads; cache selection sends nothing), ``memory_log[t]`` (per-client arrays ``new``,
    ``pool``, ``budget``, ``cached``, ``local``, ``old`` = earlier-task samples in the local set;
    :meth:`check_memory` checks the mode's constraint; for methods with a cache also
    ``pool_tasks`` / ``old_tasks`` (K, t) counts of the pool and of the cache by task and
    ``pool_classes`` / ``old_classes`` (K, num_classes) by label), ``pim_log[t]`` (Re-Fed: per client the
    :class:`PIMResult`'s ``dist_sq``/``loss`` and the scores), ``model`` (the global model).
    """

    def __init__(self, model_fn: Callable[[], nn.Module], config: FedConfig, *, num_classes: int,
                 selection: str = "refed", memory: int | None = None, memory_mode: str = "total",
                 scenario: str = "class", loss: str = "finetune", loss_hparams: dict | None = None,
                 lam: float = 0.8, weighting: str = "early", pim_epochs: int = 40, pim_lr: float | None = None,
                 pim_momentum: float = 0.0, prox_scaling: str = "mean", grad_norm: str = "exact",
                 class_balanced: bool | str = False, aggregation: str = "uniform",
                 eval_data: Callable[[int], tuple[Tensor, Tensor] | None] | None = None,
                 first_rounds: int | None = None, progress: bool = True, name: str | None = None):
        if not callable(model_fn):
            raise TypeError(f"model_fn must be callable, got {type(model_fn).__name__}")
        if not isinstance(config, FedConfig):
            raise TypeError(f"config must be a FedConfig, got {type(config).__name__}")
        self.num_classes = _check_int("num_classes", num_classes, 1)
        check_choice("selection", selection, SELECTIONS)
        check_choice("memory_mode", memory_mode, MEMORY_MODES)
        check_choice("scenario", scenario, SCENARIOS)
        check_choice("weighting", weighting, WEIGHTINGS)
        check_choice("prox_scaling", prox_scaling, PROX_SCALINGS)
        check_choice("grad_norm", grad_norm, GRAD_NORMS)
        check_choice("aggregation", aggregation, AGGREGATIONS)
        if selection != "none":
            if memory is None:
                raise ValueError(f"memory (M, samples per client) is required for selection={selection!r}")
            memory = _check_int("memory", memory, 1)
        elif memory is not None:
            memory = _check_int("memory", memory, 1)
        self.first_rounds = None if first_rounds is None else _check_int("first_rounds", first_rounds, 1)
        self.lam = _check_lam(lam)
        self.pim_epochs = _check_int("pim_epochs", pim_epochs, 1)
        self.pim_lr = config.lr if pim_lr is None else _check_real("pim_lr", pim_lr)
        if isinstance(pim_momentum, bool) or not isinstance(pim_momentum, numbers.Real) or not 0.0 <= pim_momentum < 1.0:
            raise ValueError(f"pim_momentum must be in [0, 1), got {pim_momentum!r}")
        if selection == "refed" and prox_scaling == "mean" and self.pim_lr * q_lambda(lam) >= 2.0:
            raise ValueError(f"pim_lr * q(lam) = {self.pim_lr * q_lambda(lam):.3g} >= 2: the explicit PIM "
                             f"step (Eq. 3) diverges; raise lam (got {lam}) or lower pim_lr")
        if eval_data is not None and not callable(eval_data):
            raise TypeError(f"eval_data must be a callable t -> (x, y) or None, got {type(eval_data).__name__}")
        self.algorithm = _make_loss(loss, dict(loss_hparams or {}))
        if aggregation == "uniform":
            self.algorithm.aggregation_weights = types.MethodType(_uniform_weights, self.algorithm)
        self.model_fn, self.config, self.progress, self.eval_data = model_fn, config, progress, eval_data
        self.selection, self.memory, self.memory_mode, self.scenario = selection, memory, memory_mode, scenario
        self.loss, self.weighting, self.pim_momentum = loss, weighting, float(pim_momentum)
        self.prox_scaling, self.grad_norm = prox_scaling, grad_norm
        self.class_balanced = _balancing(class_balanced)
        self.aggregation = aggregation
        self.name = name or (f"{loss}" if selection == "none" else f"{loss}+{selection}")
        self.model: nn.Module | None = None
        self.histories: list[History | None] = []
        self.stage_bytes: list[int] = []
        self.memory_log: list[dict[str, np.ndarray]] = []
        self.pim_log: list[list[dict] | None] = []
        self.num_clients: int | None = None
        self.local_sets: list[tuple[Tensor, Tensor, Tensor]] = []  # per client (x, y, task id), CPU
        self._trainable: dict[str, bool] | None = None
        self._num_seen = 0

    # -- validation ----------------------------------------------------------------------------
    def _validate(self, t: int, clients, num_seen: int) -> int:
        if isinstance(num_seen, np.integer):
            num_seen = int(num_seen)
        if t != len(self.histories):
            raise ValueError(f"tasks must be learned in order: expected t={len(self.histories)}, got {t}")
        if self.num_clients is not None and len(clients) != self.num_clients:
            raise ValueError(f"clients must keep the same {self.num_clients} clients every task, got {len(clients)}")
        if len(clients) == 0:
            raise ValueError("clients must hold at least one client")
        if self.scenario == "class":
            if isinstance(num_seen, bool) or not isinstance(num_seen, int) or not self._num_seen < num_seen <= self.num_classes:
                raise ValueError(f"num_seen must be an int in ({self._num_seen}, {self.num_classes}], got {num_seen!r}")
            limit = num_seen
        else:
            if isinstance(num_seen, bool) or not isinstance(num_seen, int) or not 1 <= num_seen <= self.num_classes:
                raise ValueError(f"num_seen must be an int in [1, {self.num_classes}], got {num_seen!r}")
            limit = self.num_classes
        for k, (x, y) in enumerate(clients):
            if x.shape[0] != y.shape[0]:
                raise ValueError(f"client {k}: x has {x.shape[0]} rows but y has {y.shape[0]}")
            if y.numel() and (int(y.min()) < 0 or int(y.max()) >= limit):
                raise ValueError(f"client {k}: labels must lie in [0, {limit}), got [{int(y.min())}, {int(y.max())}]")
        return limit

    def _budgets(self, t: int, new_sizes: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """(pool sizes, cache budgets) per client for stage t; ValueError when M is too small."""
        pools = np.array([len(s[1]) for s in self.local_sets] if t > 0 else [0] * len(new_sizes), dtype=np.int64)
        if t == 0 or self.selection == "none":
            return pools, np.zeros(len(new_sizes), dtype=np.int64)
        m = self.memory
        if self.memory_mode == "total":
            bad = [k for k, (nk, pk) in enumerate(zip(new_sizes, pools)) if pk > 0 and nk >= m]
            if bad:
                k = bad[0]
                raise ValueError(f"memory={m} leaves no room for a cache under memory_mode='total' (M counts "
                                 f"cache + new data): client {k} holds N_k={new_sizes[k]} new samples "
                                 f"(max over clients {max(new_sizes)}); need memory > every N_k, or use "
                                 f"memory_mode='replay'")
            budgets = np.array([m - n for n in new_sizes], dtype=np.int64)
        else:
            budgets = np.full(len(new_sizes), m, dtype=np.int64)
        return pools, np.minimum(np.maximum(budgets, 0), pools)

    # -- cache selection -----------------------------------------------------------------------
    def _client_gen(self, t: int, k: int) -> torch.Generator:
        return torch.Generator().manual_seed(self.config.seed * 1_000_003 + 1009 * t + k + 17)

    def _select(self, t: int, budgets: np.ndarray) -> list[dict] | None:
        """Replace every client's local set by its cache (selection from the previous local set)."""
        logs: list[dict] | None = [] if self.selection == "refed" else None
        num_old = self._num_seen if self.scenario == "class" else self.num_classes
        device = resolve_device(self.config.device)
        trainable = [n for n, flag in self._trainable.items() if flag]
        bar = range(len(self.local_sets))
        if self.progress and self.selection == "refed":
            from tqdm.auto import tqdm

            bar = tqdm(bar, desc=f"{self.name} PIM t={t}")
        for k in bar:
            x, y, task = self.local_sets[k]
            budget, gen = int(budgets[k]), self._client_gen(t, k)
            if budget == 0 or len(y) == 0:
                keep = torch.zeros(0, dtype=torch.long)
                if logs is not None:
                    logs.append({"dist_sq": float("nan"), "loss": float("nan"), "scores": torch.zeros(len(y))})
            elif self.selection == "random":
                keep = torch.sort(torch.randperm(len(y), generator=gen)[:budget]).values
            else:
                with _threads(self.config.num_threads):
                    res = train_pim(self.model, x.to(device), y.to(device), num_old, lam=self.lam,
                                    epochs=self.pim_epochs, lr=self.pim_lr, batch_size=self.config.batch_size,
                                    momentum=self.pim_momentum, prox_scaling=self.prox_scaling,
                                    grad_norm=self.grad_norm, names=trainable, generator=gen)
                scores = res.scores(self.weighting)
                keep = select_top(scores, budget, y, self.class_balanced)
                logs.append({"dist_sq": res.dist_sq, "loss": res.loss, "scores": scores})
            self.local_sets[k] = (x[keep], y[keep], task[keep])
        return logs

    def _composition(self, t: int) -> tuple[np.ndarray, np.ndarray]:
        """Per client, counts of the current local sets by task (K, t) and by label (K, num_classes)."""
        by_task = np.stack([np.bincount(task.numpy(), minlength=t)[:t] for _, _, task in self.local_sets])
        by_class = np.stack([np.bincount(y.numpy(), minlength=self.num_classes) for _, y, _ in self.local_sets])
        return by_task, by_class

    # -- models --------------------------------------------------------------------------------
    def _first_model(self) -> nn.Module:
        model = self.model_fn()
        self._trainable = {n: p.requires_grad for n, p in model.named_parameters()}
        self._template = model
        return self._hook(model)

    def _next_model(self) -> nn.Module:
        model = copy.deepcopy(self.model)
        for n, p in model.named_parameters():
            p.requires_grad_(self._trainable[n])
        return self._hook(model.train())

    def _hook(self, model: nn.Module) -> nn.Module:
        if self._mask is not None:
            self._handle = model.register_forward_hook(self._mask)
        return model

    # -- protocol ------------------------------------------------------------------------------
    def learn_task(self, t: int, clients: list[tuple[Tensor, Tensor]], num_seen: int) -> int:
        """Stage t on ``clients`` (K pairs x_k (n_k, ...), y_k (n_k,)); returns the measured upload
        bytes of the stage. All input and memory checks run before any training."""
        limit = self._validate(t, clients, num_seen)
        num_seen = int(num_seen)
        new_sizes = [int(y.shape[0]) for _, y in clients]
        pools, budgets = self._budgets(t, new_sizes)
        test = None
        if self.eval_data is not None:
            test = self.eval_data(t)
        if self.num_clients is None:
            self.num_clients = len(clients)
        pim = None
        counts = {}
        if t > 0 and self.selection != "none":
            counts["pool_tasks"], counts["pool_classes"] = self._composition(t)
            pim = self._select(t, budgets)
            counts["old_tasks"], counts["old_classes"] = self._composition(t)
        cached = np.array([len(s[1]) for s in self.local_sets] if t > 0 and self.selection != "none"
                          else [0] * len(clients), dtype=np.int64)
        new_sets = []
        for k, (x, y) in enumerate(clients):
            x, y = x.detach().cpu(), y.detach().cpu().long()
            tid = torch.full((len(y),), t, dtype=torch.long)
            if cached[k]:
                cx, cy, ct = self.local_sets[k]
                x, y, tid = torch.cat([cx, x]), torch.cat([cy, y]), torch.cat([ct, tid])
            new_sets.append((x, y, tid))
        self.local_sets = new_sets
        # "old": samples of earlier tasks in the local set, counted from the task ids themselves
        # (not from the selection's bookkeeping), for check_memory
        self.memory_log.append({"new": np.array(new_sizes), "pool": pools, "budget": budgets,
                                "cached": cached, "local": np.array([len(s[1]) for s in new_sets]),
                                "old": np.array([int((s[2] < t).sum()) for s in new_sets]), **counts})
        self.pim_log.append(pim)

        alg = self.algorithm
        num_old = self._num_seen if self.scenario == "class" else (self.num_classes if t > 0 else 0)
        alg.begin_stage(t, num_old, limit, self.model)
        self._mask = _SeenMask(limit) if (test is not None and self.scenario == "class") else None
        self._handle = None
        model_fn = self._first_model if self.model is None else self._next_model
        data = [(x, y) for x, y, _ in new_sets]
        try:
            config = stage_config(self.config, t)
            if t == 0 and self.first_rounds is not None:
                config = dataclasses.replace(config, rounds=self.first_rounds)
            hist = run_federated(model_fn, data, test, alg, config, progress=self.progress,
                                 num_classes=self.num_classes)
        finally:
            if self._handle is not None:
                self._handle.remove()
        if self.model is None:
            self.model = self._template
        self.model.load_state_dict(hist.final_state)
        self.model.requires_grad_(False).eval()
        device = next(self.model.parameters()).device
        with _threads(self.config.num_threads):
            trainable = [n for n, flag in self._trainable.items() if flag]
            extra = alg.end_stage(self.model, data, self.config, device, trainable)
        nbytes = int(hist.bytes_up[-1] + sum(m.nbytes for m in extra))
        self.histories.append(hist)
        self.stage_bytes.append(nbytes)
        self._num_seen = num_seen
        return nbytes

    _mask: _SeenMask | None = None

    @torch.no_grad()
    def predict(self, x: Tensor, num_seen: int, batch_size: int = 8192) -> Tensor:
        """(N,) int64 labels (CPU): argmax over the first ``num_seen`` logits, eval mode, batched."""
        if self.model is None:
            raise RuntimeError("predict called before any learn_task")
        if isinstance(num_seen, np.integer):
            num_seen = int(num_seen)
        if isinstance(num_seen, bool) or not isinstance(num_seen, int) or not 1 <= num_seen <= self.num_classes:
            raise ValueError(f"num_seen must be an int in [1, {self.num_classes}], got {num_seen!r}")
        device = next(self.model.parameters()).device
        self.model.eval()
        out = []
        with _threads(self.config.num_threads):
            for s in range(0, int(x.shape[0]), batch_size):
                out.append(self.model(x[s:s + batch_size].to(device))[:, :num_seen].argmax(1).cpu())
        return torch.cat(out) if out else torch.zeros(0, dtype=torch.long)

    def check_memory(self) -> list[str]:
        """The storage constraint of ``memory_mode`` at every stage t >= 1, checked on what the
        clients hold (samples of earlier tasks counted from their task ids): ``"total"`` (Sec.
        3.1) cache + new data <= M; ``"replay"`` (Sec. 4.1) old samples <= M. Both: the cache is
        as full as the rule allows (old = min(budget, pool), budget = M - N_k or M), so no storage
        is left unused. Returns the violations found (empty list: all hold); memory-free methods
        have nothing to check."""
        bad: list[str] = []
        if self.selection == "none":
            return bad
        for t, log in enumerate(self.memory_log):
            if t == 0 or not len(log):
                continue
            m = self.memory
            rule = m - log["new"] if self.memory_mode == "total" else np.full_like(log["new"], m)
            expect = np.minimum(np.maximum(rule, 0), log["pool"])
            for k in range(len(log["new"])):
                old, local = int(log["old"][k]), int(log["local"][k])
                if self.memory_mode == "total" and local > m:
                    bad.append(f"task {t}, client {k}: local set {local} > M={m} (memory_mode 'total')")
                if self.memory_mode == "replay" and old > m:
                    bad.append(f"task {t}, client {k}: {old} old samples > M={m} (memory_mode 'replay')")
                if old != int(expect[k]):
                    bad.append(f"task {t}, client {k}: {old} old samples, the rule gives min(budget, pool) = "
                               f"{int(expect[k])}")
                if local != old + int(log["new"][k]):
                    bad.append(f"task {t}, client {k}: local set {local} != old {old} + new {int(log['new'][k])}")
        return bad

    def cache_labels(self, k: int) -> Tensor:
        """Labels (CPU) of client k's current local set (cache u latest task)."""
        return self.local_sets[k][1]

    def __repr__(self) -> str:
        return (f"ReplayLearner({self.name!r}, selection={self.selection!r}, memory={self.memory}, "
                f"memory_mode={self.memory_mode!r}, scenario={self.scenario!r}, {self.algorithm!r})")


class FixedLearner(ReplayLearner):
    """"Fixed" baseline: FedAvg (masked CE, no memory) on the first task only; later tasks neither
    train nor upload (0 bytes, ``histories[t] = None``). Class-incremental predictions use only the
    first task's classes (the frozen model never learned the others). Other keyword arguments as
    :class:`ReplayLearner` (memory and Re-Fed options are unused)."""

    def __init__(self, model_fn, config, *, num_classes, **kwargs):
        super().__init__(model_fn, config, num_classes=num_classes, selection="none", loss="finetune",
                         name="fixed", **kwargs)

    def learn_task(self, t, clients, num_seen):
        if t == 0:
            out = super().learn_task(t, clients, num_seen)
            self._first_seen = num_seen
            return out
        self._validate(t, clients, num_seen)
        self.histories.append(None)
        self.stage_bytes.append(0)
        self.memory_log.append({})
        self.pim_log.append(None)
        self._num_seen = num_seen
        return 0

    def predict(self, x, num_seen, batch_size=8192):
        if self.scenario == "class" and self.model is not None and isinstance(num_seen, (int, np.integer)) \
                and not isinstance(num_seen, bool):
            num_seen = min(num_seen, self._first_seen)
        return super().predict(x, num_seen, batch_size)


# ----------------------------------------------------------------------------------------------
# factory
# ----------------------------------------------------------------------------------------------
LEARNERS: dict[str, dict[str, Any]] = {
    "refed": {"selection": "refed", "loss": "finetune"},
    "refed_balanced": {"selection": "refed", "loss": "finetune", "class_balanced": "equal"},
    "fedavg": {"selection": "none", "loss": "finetune"},
    "fedavg_replay": {"selection": "random", "loss": "finetune"},
    "fedprox_replay": {"selection": "random", "loss": "fedprox"},
    "fixed": {},
    "fedewc": {"selection": "none", "loss": "fedewc"},
    "fedlwf": {"selection": "none", "loss": "fedlwf"},
}


def make_learner(method: str, model_fn: Callable[[], nn.Module], config: FedConfig, *, num_classes: int,
                 memory: int | None = None, scenario: str = "class", progress: bool = True,
                 **kwargs: Any) -> ReplayLearner:
    """One learner of :data:`LEARNERS` on the common protocol.

    ``memory`` (M) is used by "refed", "refed_balanced" (Re-Fed with ``class_balanced="equal"``),
    "fedavg_replay", "fedprox_replay" (required there) and
    ignored by the memory-free methods, so one loop can pass it to all. ``kwargs``: names taken
    by the method's loss (FedProx ``mu`` (default 0.01); EWC ``lam``; LwF ``lam``, ``T``) go to
    the loss, the rest to :class:`ReplayLearner` (e.g. Re-Fed's ``lam``, ``weighting``,
    ``pim_epochs``, ``memory_mode``, ``grad_norm``, ``aggregation``, ``eval_data``).
    """
    key = method.lower() if isinstance(method, str) else method
    check_choice("method", key, LEARNERS)
    if key == "fixed":
        return FixedLearner(model_fn, config, num_classes=num_classes, scenario=scenario, progress=progress, **kwargs)
    spec = LEARNERS[key]
    loss_cls = IncrementalFedProx if spec["loss"] == "fedprox" else type(make_method(spec["loss"]))
    loss_names = set(inspect.signature(loss_cls.__init__).parameters) - {"self"}
    loss_hparams = {k: kwargs.pop(k) for k in list(kwargs) if k in loss_names}
    if spec["selection"] == "none":
        memory = None
    fixed = {k: v for k, v in spec.items() if k not in ("selection", "loss")}
    clash = sorted(k for k in fixed if k in kwargs and kwargs[k] != fixed[k])
    if clash:
        raise ValueError(f"method {key!r} fixes {', '.join(f'{k}={fixed[k]!r}' for k in clash)}; "
                         f"use another method to change it")
    kwargs.update(fixed)
    return ReplayLearner(model_fn, config, num_classes=num_classes, selection=spec["selection"], memory=memory,
                         scenario=scenario, loss=spec["loss"], loss_hparams=loss_hparams, progress=progress,
                         name=key, **kwargs)
