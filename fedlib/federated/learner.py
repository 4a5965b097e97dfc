"""THE gradient-based federated incremental learner, with pluggable replay.

:class:`GradientLearner` implements :class:`fedlib.federated.incremental.IncrementalLearner` for
every gradient method of :mod:`fedlib.federated.fcil` (Finetune, FedEWC, FedLwF, FedProx) with or
without a per-client replay cache (a :class:`Replay` policy: :class:`RandomReplay`, or Re-Fed's
:class:`fedlib.refed.algorithm.RefedReplay`). Stage t (0-based), all on the protocol
(:func:`fedlib.core.protocol.simulate`) with the clients' states kept across stages:

1. replay only: a *cache round*: the server broadcasts the global model (t > 0) and t; every
   client k rebuilds its local set from its own previous local set (the pool) and its new data:
   ``state["local"] = (x, y, task)`` = cache u new data, the cache chosen by the policy under the
   memory budget from the pool and the broadcast model (uploads nothing);
2. ``config.rounds`` rounds of :func:`fedlib.federated.gradient.run_federated` with the method
   (``stage_config(config, t)``: stage 0 keeps the run's seed, stage t >= 1 uses
   ``derive_seed(seed, t)``, so every stage samples its own clients), starting from the global
   model of stage t-1 (``model_fn()`` at stage 0); clients train on their local set;
3. methods with a stage-end round (FedEWC): each client uploads what the server keeps for the next
   stages (its Fisher).

Class-incremental (``scenario="class"``): one head over all classes, CE on the first ``num_seen``
logits. Domain-incremental (``"domain"``): all classes are always seen (no masking).
"""
from __future__ import annotations

import copy
import dataclasses
import random
import time
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import Tensor, nn

from fedlib.core import uploads
from fedlib.core.batches import eval_chunks
from fedlib.core.cache import fingerprint
from fedlib.core.devices import resolve_device, torch_threads
from fedlib.core.messages import Cost, Message
from fedlib.core.persample import grad_sq_norms, last_linear
from fedlib.core.protocol import Broadcaster, ClientStates, RoundCallback, simulate
from fedlib.core.seeds import derive_seed, torch_generator
from fedlib.core.validate import check_choice, check_int
from fedlib.evaluation.metrics import accuracy
from fedlib.federated.fcil import Finetune, IncrementalAlgorithm, make_method
from fedlib.federated.gradient import FedConfig, GradientClient, History, frozen_copy, initial_state, run_federated

__all__ = ["stage_config",
           "BALANCING", "MEMORY_MODES", "SCENARIOS", "select_top", "budget_groups", "Replay", "RandomReplay",
           "SCORE_RULES", "el2n_scores", "grand_scores", "ScoreReplay", "herding_order", "penultimate_features", "HerdingReplay",
           "reservoir_select", "ReservoirReplay", "GradientLearner", "FixedLearner", "StageCallback", "KeepWeights",
           "FirstStageShare", "CacheClient", "StageClient", "StateInit"]

BALANCING = ("none", "proportional", "equal", "task", "task_class")
MEMORY_MODES = ("total", "replay")
SCENARIOS = ("class", "domain")
AGGREGATIONS = ("size", "uniform")

StageCallback = Callable[[int, "GradientLearner"], None]


class KeepWeights:
    """An ``on_stage_end`` callback: ``weights[t]`` = a CPU copy of the global model's state dict
    after stage t (works for any learner with a ``.model``)."""

    def __init__(self):
        self.weights: list[dict[str, Tensor]] = []

    def __call__(self, t: int, learner) -> None:
        self.weights.append({k: v.detach().cpu().clone() for k, v in learner.model.state_dict().items()})


def stage_config(config: FedConfig, t: int) -> FedConfig:
    """``config`` with the seed of stage t: ``config.seed`` at t = 0, ``derive_seed(seed, t)`` after."""
    t = check_int("t", t, 0)
    return config if t == 0 else dataclasses.replace(config, seed=derive_seed(config.seed, t))


# ----------------------------------------------------------------------------------------------
# replay policies
# ----------------------------------------------------------------------------------------------
def balancing(class_balanced) -> str:
    """Normalise ``class_balanced``: False/None -> "none", True -> "proportional", or a name of BALANCING."""
    if class_balanced is False or class_balanced is None:
        return "none"
    if class_balanced is True:
        return "proportional"
    if isinstance(class_balanced, str) and class_balanced in BALANCING:
        return class_balanced
    raise ValueError(f"class_balanced must be False, True or one of {', '.join(BALANCING)}, got {class_balanced!r}")


def _quotas(counts: Tensor, budget: int, mode: str) -> Tensor:
    """Per-class quotas summing to ``budget`` (``counts``: samples per class)."""
    if mode == "proportional":
        share = counts.double() * budget / int(counts.sum())
        quota = share.floor().long()
        rest = budget - int(quota.sum())
        if rest:
            quota[torch.argsort(share - quota, descending=True, stable=True)[:rest]] += 1
        return quota
    quota, rest = torch.zeros_like(counts), budget
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
    return quota


def select_top(scores: Tensor, budget: int, labels: Tensor | None = None, class_balanced: bool | str = False,
               tasks: Tensor | None = None) -> Tensor:
    """Indices (sorted ascending) of the ``budget`` highest ``scores`` (n,); ties keep the lower index.

    ``class_balanced`` splits the budget over the classes of ``labels`` (n,) (required then) and
    takes each class's own top-k: ``True`` / ``"proportional"``: class c gets the
    floor/largest-remainder share budget * n_c / n (the pool's class mix); ``"equal"``: every class
    the same quota, capped at n_c, with what a small class cannot use shared among the others
    (water-filling; a remainder goes to the classes with the most samples left, ties to the lower
    label). ``"task"``: the same water-filling over the task ids ``tasks`` (n,) (required then),
    top-k inside each task's share; ``"task_class"``: equal task shares first, then each task's
    share split equally over its classes, top-k inside each (task, class) share.
    """
    mode = balancing(class_balanced)
    scores = torch.as_tensor(scores)
    n = int(scores.shape[0])
    budget = check_int("budget", budget, 0)
    if budget > n:
        raise ValueError(f"budget must be <= the {n} candidates, got {budget}")
    if mode == "none":
        order = torch.argsort(scores, descending=True, stable=True)
        return torch.sort(order[:budget]).values
    if labels is None or int(labels.shape[0]) != n:
        raise ValueError("class_balanced selection needs labels with one entry per score")
    picked = []
    for idx, k in budget_groups(labels, budget, mode, tasks):
        order = torch.argsort(scores[idx], descending=True, stable=True)
        picked.append(idx[order[:k]])
    return torch.sort(torch.cat(picked)).values


def budget_groups(labels: Tensor, budget: int, mode: str, tasks: Tensor | None = None) -> list[tuple[Tensor, int]]:
    """How :func:`select_top` shares ``budget`` over a pool with ``labels`` (n,) (and task ids ``tasks``
    (n,) for the task modes): [(indices of a group, its quota)], quotas summing to ``budget`` (each
    <= its group's size). ``"none"``: one group; ``"proportional"`` / ``"equal"``: one per class;
    ``"task"``: equal water-filled shares over the tasks; ``"task_class"``: each task's share split
    equally over the task's classes."""
    mode = balancing(mode)
    labels = torch.as_tensor(labels).cpu()
    n = int(labels.shape[0])
    if mode == "none":
        return [(torch.arange(n), budget)]
    if mode in ("proportional", "equal"):
        classes, counts = torch.unique(labels, return_counts=True)
        return [(torch.nonzero(labels == c).flatten(), k)
                for c, k in zip(classes.tolist(), _quotas(counts, budget, mode).tolist())]
    if tasks is None or int(tasks.shape[0]) != n:
        raise ValueError(f"class_balanced={mode!r} needs tasks (task ids) with one entry per score")
    tasks = torch.as_tensor(tasks).cpu()
    out = []
    task_ids, counts = torch.unique(tasks, return_counts=True)
    for t, q in zip(task_ids.tolist(), _quotas(counts, budget, "equal").tolist()):
        idx = torch.nonzero(tasks == t).flatten()
        if mode == "task":
            out.append((idx, q))
            continue
        classes, c_counts = torch.unique(labels[idx], return_counts=True)
        for c, k in zip(classes.tolist(), _quotas(c_counts, q, "equal").tolist()):
            out.append((idx[labels[idx] == c], k))
    return out


@dataclasses.dataclass
class SelectionContext:
    """What a replay policy may use on client k at stage t: the broadcast global model (frozen),
    the old classes ``num_old`` (logits the policy may score), the client's own generator for this
    selection, the trainable parameter names and the run's config."""

    global_model: nn.Module
    num_old: int
    generator: torch.Generator
    names: list[str]
    config: FedConfig
    tasks: Tensor | None = None   # (n,) task id of every pool sample (CPU)


class Replay:
    """A replay policy: memory M (samples per client) and its meaning ``memory_mode`` (Re-Fed's two readings):
    ``"total"`` M counts cache + new data (cache budget M - N_k), ``"replay"`` M is the cache alone.
    ``select(x, y, budget, ctx)`` -> (kept indices into the pool, sorted; a log dict or None)."""

    name = "replay"

    def __init__(self, memory: int, memory_mode: str = "total"):
        self.memory = check_int("memory", memory, 1)
        check_choice("memory_mode", memory_mode, MEMORY_MODES)
        self.memory_mode = memory_mode

    def budget(self, n_new: int, n_pool: int) -> int:
        """Cache size for a client with ``n_new`` new samples and a pool of ``n_pool``."""
        rule = self.memory - n_new if self.memory_mode == "total" else self.memory
        return min(max(rule, 0), n_pool)

    def check(self, new_sizes: Sequence[int], pools: Sequence[int]) -> None:
        """ValueError before any work when ``"total"`` leaves a client with a pool no room."""
        if self.memory_mode != "total":
            return
        bad = [k for k, (nk, pk) in enumerate(zip(new_sizes, pools)) if pk > 0 and nk >= self.memory]
        if bad:
            k, m = bad[0], self.memory
            raise ValueError(f"memory={m} leaves no room for a cache under memory_mode='total' (M counts "
                             f"cache + new data): client {k} holds N_k={new_sizes[k]} new samples "
                             f"(max over clients {max(new_sizes)}); need memory > every N_k, or use "
                             f"memory_mode='replay'")

    def select(self, x: Tensor, y: Tensor, budget: int, ctx: SelectionContext) -> tuple[Tensor, dict | None]:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(memory={self.memory}, memory_mode={self.memory_mode!r})"


class RandomReplay(Replay):
    """Uniformly random cache (Re-Fed's FedAvg/FedProx replay baselines); with
    ``class_balanced`` (see :func:`select_top`) a random cache with per-class quotas."""

    name = "random"

    def __init__(self, memory: int, memory_mode: str = "total", class_balanced: bool | str = False):
        super().__init__(memory, memory_mode)
        self.class_balanced = balancing(class_balanced)

    def select(self, x, y, budget, ctx):
        if self.class_balanced == "none":
            return torch.sort(torch.randperm(len(y), generator=ctx.generator)[:budget]).values, None
        scores = torch.rand(len(y), generator=ctx.generator)
        return select_top(scores, budget, y.cpu(), self.class_balanced, ctx.tasks), None


SCORE_RULES = ("el2n", "grand")


@torch.no_grad()
def el2n_scores(model: nn.Module, x: Tensor, y: Tensor, num_seen: int, batch_size: int = 1024) -> Tensor:
    """EL2N (Paul et al. 2021, "Deep learning on a data diet"), at one model: the error L2 norm
    ||softmax(f(x_i)[:num_seen]) - e_{y_i}||_2 for x (n, ...), y (n,) < num_seen -> (n,) float32
    (eval mode, the model's mode restored). It is also the norm of the cross-entropy gradient with
    respect to the seen logits."""
    num_seen = check_int("num_seen", num_seen, 1)
    was = model.training
    model.eval()
    try:
        out = []
        for s in range(0, int(x.shape[0]), batch_size):
            p = torch.softmax(model(x[s:s + batch_size])[:, :num_seen].double(), dim=1)
            p[torch.arange(p.shape[0], device=p.device), y[s:s + batch_size].long()] -= 1.0
            out.append(p.norm(dim=1).float().cpu())
    finally:
        model.train(was)
    return torch.cat(out) if out else torch.zeros(0)


def grand_scores(model: nn.Module, x: Tensor, y: Tensor, num_seen: int, names: Sequence[str] | None = None,
                 batch_size: int = 64) -> Tensor:
    """GraNd (Paul et al. 2021) at one model: the per-sample gradient norm ||grad_theta CE(f(x_i)[:num_seen],
    y_i)||_2 over the parameters ``names`` (default: those with requires_grad), exact
    (:func:`fedlib.core.persample.grad_sq_norms`, eval mode) -> (n,) float32 on the CPU. At the global
    model it is Re-Fed's score without PIM training (every G^p taken at w, the lam -> 0 limit)."""
    return grad_sq_norms(model, x, y, num_seen, names, batch_size).detach().float().cpu().clamp_min(0).sqrt()


class ScoreReplay(Replay):
    """Top-k of a per-sample score at the broadcast global model (no PIM): ``rule`` in
    :data:`SCORE_RULES`: ``"el2n"`` (:func:`el2n_scores`) or ``"grand"`` (:func:`grand_scores`, exact
    norms over the trained parameters); the budget shared as :func:`select_top`'s ``class_balanced``."""

    name = "score"

    def __init__(self, memory: int, memory_mode: str = "total", rule: str = "el2n",
                 class_balanced: bool | str = False):
        super().__init__(memory, memory_mode)
        check_choice("rule", rule, SCORE_RULES)
        self.rule, self.name = rule, rule
        self.class_balanced = balancing(class_balanced)

    def scores(self, x: Tensor, y: Tensor, ctx: SelectionContext) -> Tensor:
        if self.rule == "el2n":
            return el2n_scores(ctx.global_model, x, y, ctx.num_old)
        return grand_scores(ctx.global_model, x, y, ctx.num_old, ctx.names or None, ctx.config.batch_size)

    def select(self, x, y, budget, ctx):
        scores = self.scores(x, y, ctx)
        return select_top(scores, budget, y.cpu(), self.class_balanced, ctx.tasks), {"scores": scores}


def herding_order(features: Tensor, k: int, normalize: bool = True) -> Tensor:
    """iCaRL's herding (Rebuffi et al. 2017, Alg. 4; Welling 2009) on features (n, d): the sequence
    p_1..p_k (k distinct row indices, in the order chosen) with

        p_j = argmin_{i not chosen} || mu - (phi_i + sum_{l<j} phi_{p_l}) / j ||_2,   mu = mean_i phi_i,

    phi_i = features_i / ||features_i|| when ``normalize`` (as iCaRL), float64; ties to the lower index."""
    phi = torch.as_tensor(features).double()
    if phi.ndim != 2:
        raise ValueError(f"features must be an (n, d) matrix, got shape {tuple(phi.shape)}")
    n = int(phi.shape[0])
    k = check_int("k", k, 0, n)
    if normalize:
        phi = phi / phi.norm(dim=1, keepdim=True).clamp_min(1e-12)
    mu = phi.mean(0)
    chosen = torch.zeros(n, dtype=torch.bool)
    total = torch.zeros_like(mu)
    order = []
    for j in range(1, k + 1):
        dist = (mu - (total + phi) / j).norm(dim=1)
        dist[chosen] = float("inf")
        i = int(torch.argmin(dist))
        order.append(i)
        chosen[i] = True
        total += phi[i]
    return torch.tensor(order, dtype=torch.long)


@torch.no_grad()
def penultimate_features(model: nn.Module, x: Tensor, batch_size: int = 1024) -> Tensor:
    """The input h (n, d) of the model's last nn.Linear (its output layer) for x (n, ...): the
    feature map phi of iCaRL, float32 on the CPU (eval mode, the model's mode restored)."""
    layer, seen = last_linear(model), []
    handle = layer.register_forward_hook(lambda m, inp, out: seen.append(inp[0].detach().flatten(1).float().cpu()))
    was = model.training
    model.eval()
    try:
        for s in range(0, int(x.shape[0]), batch_size):
            model(x[s:s + batch_size])
    finally:
        handle.remove()
        model.train(was)
    return torch.cat(seen) if seen else torch.zeros(0, layer.in_features)


class HerdingReplay(Replay):
    """iCaRL-style herding (:func:`herding_order`) on the broadcast global model's features
    (:func:`penultimate_features`: the input of its output layer, eval mode), inside each share of the budget (:func:`budget_groups`;
    default ``"equal"``: the same quota per class, as iCaRL's m = M / classes)."""

    name = "herding"

    def __init__(self, memory: int, memory_mode: str = "total", class_balanced: bool | str = "equal"):
        super().__init__(memory, memory_mode)
        self.class_balanced = balancing(class_balanced)

    def select(self, x, y, budget, ctx):
        feats = penultimate_features(ctx.global_model, x)
        picked = [idx[herding_order(feats[idx], k)] for idx, k in budget_groups(y.cpu(), budget, self.class_balanced,
                                                                                 ctx.tasks)]
        return torch.sort(torch.cat(picked)).values, None


def reservoir_select(labels: Tensor, budget: int, generator: torch.Generator | None = None) -> Tensor:
    """Class-balancing reservoir sampling (CBRS, Chrysakis & Moens 2020, Alg. 1) of ``budget`` samples
    from a pool with ``labels`` (n,), streamed in a random order (``generator``): a sample enters
    while the memory has room; then a sample of a class that is not *full* (not a largest class in
    memory at any step since the memory filled) replaces a random stored sample of a largest class
    (ties: a random one of them), and a sample of a full class c replaces a random stored sample of
    c with probability m_c / n_c (stored / seen of c). Returns the kept indices (sorted). On a pool
    the class counts end within one of the equal water-filled shares (tested)."""
    labels = torch.as_tensor(labels).cpu()
    n = int(labels.shape[0])
    budget = check_int("budget", budget, 0, n)
    gen = generator if generator is not None else torch.Generator().manual_seed(0)
    order = torch.randperm(n, generator=gen).tolist()
    lab = labels.tolist()
    memory: dict[int, list[int]] = {}
    seen: dict[int, int] = {}
    full: set[int] = set()
    size = 0
    for i in order:
        c = lab[i]
        seen[c] = seen.get(c, 0) + 1
        if size < budget:
            memory.setdefault(c, []).append(i)
            size += 1
        elif budget > 0:
            largest = max(len(v) for v in memory.values())
            full |= {d for d, v in memory.items() if len(v) == largest}
            if c not in full:
                big = [d for d in sorted(memory) if len(memory[d]) == largest]
                d = big[int(torch.randint(len(big), (1,), generator=gen))]
                memory[d].pop(int(torch.randint(len(memory[d]), (1,), generator=gen)))
                memory.setdefault(c, []).append(i)
            elif float(torch.rand(1, generator=gen)) <= len(memory.get(c, [])) / seen[c]:
                stored = memory[c]
                stored[int(torch.randint(len(stored), (1,), generator=gen))] = i
        if budget > 0 and size == budget:
            largest = max(len(v) for v in memory.values())
            full |= {d for d, v in memory.items() if len(v) == largest}
    kept = [i for v in memory.values() for i in v]
    return torch.sort(torch.tensor(kept, dtype=torch.long)).values if kept else torch.zeros(0, dtype=torch.long)


class ReservoirReplay(Replay):
    """A class-balanced reservoir: :func:`reservoir_select` over the client's pool, streamed in the
    order of the client's generator for this selection."""

    name = "reservoir"

    def select(self, x, y, budget, ctx):
        return reservoir_select(y.cpu(), budget, ctx.generator), None


class CacheClient:
    """Client program of the cache round: ``step((x_new, y_new), state, broadcast)`` replaces
    ``state["local"]`` by cache u new data (the cache chosen by ``replay`` from the previous
    ``state["local"]`` with the broadcast model, generator ``torch_generator(seed, "cache", t, k)``)
    and records sizes and compositions in ``state["log"]``; uploads nothing."""

    def __init__(self, replay: Replay, template: nn.Module, config: FedConfig, num_classes: int, names: list[str]):
        self.replay, self.config, self.num_classes, self.names = replay, config, num_classes, names
        self.global_model = frozen_copy(template)

    def step(self, data, state: dict, broadcast: Message) -> Message:
        x_new, y_new = data
        t, k = int(broadcast["stage"]), state["id"]
        log: dict[str, Any] = {"new": len(y_new), "pool": 0, "budget": 0, "cached": 0, "pim": None}
        x, y, task = x_new, y_new, torch.full((len(y_new),), t, dtype=torch.long, device=y_new.device)
        if t > 0:
            px, py, ptask = state["local"]
            budget = self.replay.budget(len(y_new), len(py))
            log.update(pool=len(py), budget=budget, **self._composition(ptask, py, t, "pool"))
            if budget == 0 or len(py) == 0:
                keep = torch.zeros(0, dtype=torch.long, device=py.device)
                if self.replay.name == "refed":
                    log["pim"] = {"dist_sq": float("nan"), "loss": float("nan"), "scores": torch.zeros(len(py))}
            else:
                self.global_model.load_state_dict(broadcast["state"])
                ctx = SelectionContext(self.global_model, int(broadcast["num_old"]),
                                       torch_generator(self.config.seed, "cache", t, k), self.names, self.config,
                                       ptask.cpu())
                with torch_threads(self.config.num_threads):
                    keep, log["pim"] = self.replay.select(px, py, budget, ctx)
                keep = keep.to(py.device)
            log.update(cached=len(keep), **self._composition(ptask[keep], py[keep], t, "old"))
            x, y, task = torch.cat([px[keep], x]), torch.cat([py[keep], y]), torch.cat([ptask[keep], task])
        state["local"] = (x, y, task)
        log.update(local=len(y), old=int((task < t).sum()))
        state["log"] = log
        return Message(f"client{k}")

    def _composition(self, task: Tensor, y: Tensor, t: int, prefix: str) -> dict[str, np.ndarray]:
        return {f"{prefix}_tasks": np.bincount(task.cpu().numpy(), minlength=t)[:t],
                f"{prefix}_classes": np.bincount(y.cpu().numpy(), minlength=self.num_classes)}


class StageClient:
    """Client program of the stage-end round: ``method.stage_upload`` on the client's stage data
    (its local set when it keeps one) with the broadcast final global model."""

    def __init__(self, method: IncrementalAlgorithm, template: nn.Module, config: FedConfig, names: list[str]):
        self.method, self.config, self.names = method, config, names
        self.global_model = frozen_copy(template)

    def step(self, data, state: dict, broadcast: Message) -> Message:
        self.global_model.load_state_dict(broadcast["state"])
        x, y = GradientClient.training_data(data, state)
        with torch_threads(self.config.num_threads):  # as GradientClient.step: a Flower node's count differs
            payload = self.method.stage_upload(self.global_model, x, y, int(broadcast["num_seen"]), self.names,
                                               self.config.batch_size)
        return Message(f"client{state['id']}", payload)


class FirstStageShare(dict):
    """Stage 0's federated training, done once and reused by every learner that would repeat it.

    At stage 0 no cache exists, so the replay methods, FedAvg without memory and Fixed (and any other
    learner with the same loss) train the same model on the same data: Re-Fed's Tables 5-9 show one
    task-1 accuracy for all of them. A learner given a share (``GradientLearner(share_first_stage=)``)
    looks up a key made of everything its stage-0 training depends on: the loss (``repr`` of the
    algorithm; only methods whose stage 0 is plain masked-CE FedAvg, :class:`~fedlib.federated.fcil.Finetune`),
    aggregation, scenario, number of classes, first_rounds, the whole ``FedConfig``, the ``model_fn``
    object, a SHA-1 of every client's stage-0 data and of the stage-0 evaluation data, and ``num_seen``.
    The first learner with a key trains and stores a deep copy of what the training produced (the
    History, the clients' states other than their local sets and logs, i.e. their mini-batch
    generators, the server memory, the global RNG states of python, numpy and torch after the run,
    and its measured seconds); every later one restores it instead of training: bit-identical to
    training itself (tested: ``tests/refed/test_refed.py``). ``hits`` / ``misses`` count the lookups."""

    def __init__(self):
        super().__init__()
        self.hits = 0
        self.misses = 0


# ----------------------------------------------------------------------------------------------
# the learner
# ----------------------------------------------------------------------------------------------
class GradientLearner:
    """Federated incremental learning with a gradient method and optional replay (module docstring).

    ``model_fn()`` maps x (N, ...) to logits (N, num_classes) over all classes of the stream
    (``requires_grad`` flags of its parameters say what is trained, at every stage). ``method`` in
    :data:`fedlib.federated.fcil.METHODS`, ``**hparams`` its hyperparameters. ``replay``: a
    :class:`Replay` policy or None (no cache). ``aggregation``: ``"size"`` (n_k-weighted FedAvg)
    or ``"uniform"`` (Re-Fed's Alg. 2). ``first_rounds``: rounds of stage 0 (default
    ``config.rounds``). ``eval_data(t) -> (x, y) | None``: test data evaluated every
    ``config.eval_every`` rounds of stage t (class-incremental: argmax over the seen classes), so
    ``histories[t].test_acc`` gives per-round curves. ``callbacks``: round callbacks passed to
    every stage's ``run_federated`` (``callback(r, server, cost)``); ``on_stage_end``: called as
    ``callback(t, learner)`` after each stage (e.g. to keep ``learner.model``'s weights).
    ``share_first_stage``: a :class:`FirstStageShare`; the stage-0 training is then restored from it
    when another learner already did the same one (``reused_seconds[0]``: its measured seconds).

    After stage t: ``histories[t]``, ``stage_bytes[t]`` (model uploads + stage-end uploads; the
    cache round uploads nothing), ``costs[t]`` (the stage's measured :class:`Cost`, cache and
    stage-end rounds included), ``memory_log[t]`` (per-client arrays ``new``, ``pool``, ``budget``,
    ``cached``, ``local``, ``old`` = earlier-task samples in the local set; with a cache at t > 0
    also ``pool_tasks`` / ``old_tasks`` (K, t) and ``pool_classes`` / ``old_classes`` (K, C)),
    ``pim_log[t]`` (the policy's per-client logs, e.g. Re-Fed's PIM, or None), ``model``.
    ``states`` (:class:`ClientStates`): every client's own state, kept across stages.
    """

    def __init__(self, model_fn: Callable[[], nn.Module], config: FedConfig, method: str = "finetune", *,
                 num_classes: int, replay: Replay | None = None, scenario: str = "class",
                 aggregation: str = "size", eval_data: Callable[[int], tuple[Tensor, Tensor] | None] | None = None,
                 first_rounds: int | None = None, progress: bool = True, name: str | None = None,
                 callbacks: Sequence[RoundCallback] = (), on_stage_end: Sequence[StageCallback] = (),
                 share_first_stage: FirstStageShare | None = None, **hparams: Any):
        if not callable(model_fn):
            raise TypeError(f"model_fn must be callable, got {type(model_fn).__name__}")
        if not isinstance(config, FedConfig):
            raise TypeError(f"config must be a FedConfig, got {type(config).__name__}")
        self.num_classes = check_int("num_classes", num_classes, 1)
        check_choice("scenario", scenario, SCENARIOS)
        check_choice("aggregation", aggregation, AGGREGATIONS)
        if replay is not None and not isinstance(replay, Replay):
            raise TypeError(f"replay must be a Replay policy or None, got {type(replay).__name__}")
        if eval_data is not None and not callable(eval_data):
            raise TypeError(f"eval_data must be a callable t -> (x, y) or None, got {type(eval_data).__name__}")
        if share_first_stage is not None and not isinstance(share_first_stage, FirstStageShare):
            raise TypeError("share_first_stage must be a FirstStageShare or None, "
                            f"got {type(share_first_stage).__name__}")
        self.first_rounds = None if first_rounds is None else check_int("first_rounds", first_rounds, 1)
        self.algorithm = make_method(method, **hparams)
        self.algorithm.aggregation = aggregation
        self.model_fn, self.config, self.progress, self.eval_data = model_fn, config, progress, eval_data
        self.replay, self.scenario, self.aggregation = replay, scenario, aggregation
        self.callbacks, self.on_stage_end = list(callbacks), list(on_stage_end)
        self.name = name or (self.algorithm.name if replay is None else f"{self.algorithm.name}+{replay.name}")
        self.model: nn.Module | None = None
        self.histories: list[History | None] = []
        self.stage_bytes: list[int] = []
        self.costs: list[Cost] = []
        self.memory_log: list[dict[str, np.ndarray]] = []
        self.pim_log: list[list[dict] | None] = []
        self.num_clients: int | None = None
        self.states: ClientStates | None = None
        self.server_memory: dict[str, Any] = {}
        self._trainable: dict[str, bool] | None = None
        self._num_seen = 0
        self.share_first_stage = share_first_stage
        self.reused_seconds: dict[int, float] = {}  # stage -> measured seconds of a training restored from the share

    # -- checks --------------------------------------------------------------------------------
    def _validate(self, t: int, clients, num_seen: int) -> int:
        """All input and memory checks, before any work; returns the number of unmasked classes."""
        if isinstance(num_seen, np.integer):
            num_seen = int(num_seen)
        if t != len(self.histories):
            raise ValueError(f"tasks must be learned in order: expected t={len(self.histories)}, got {t}")
        if self.num_clients is not None and len(clients) != self.num_clients:
            raise ValueError(f"clients must keep the same {self.num_clients} clients every task, got {len(clients)}")
        if len(clients) == 0:
            raise ValueError("clients must hold at least one client")
        low = self._num_seen + 1 if self.scenario == "class" else 1
        check_int("num_seen", num_seen, low, self.num_classes)
        limit = num_seen if self.scenario == "class" else self.num_classes
        for k, (x, y) in enumerate(clients):
            if x.shape[0] != y.shape[0]:
                raise ValueError(f"client {k}: x has {x.shape[0]} rows but y has {y.shape[0]}")
            if y.numel() and (int(y.min()) < 0 or int(y.max()) >= limit):
                raise ValueError(f"client {k}: labels must lie in [0, {limit}), got [{int(y.min())}, {int(y.max())}]")
        if self.replay is not None and t > 0:
            self.replay.check([int(y.shape[0]) for _, y in clients], self.memory_log[-1]["local"])
        return limit

    # -- models --------------------------------------------------------------------------------
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

    @property
    def trainable(self) -> list[str]:
        return [n for n, flag in self._trainable.items() if flag]

    def _evaluate(self, limit: int):
        """The per-round test accuracy: argmax over the first ``limit`` logits (all of them in the
        domain-incremental scenario, where it equals ``model_accuracy``), in :func:`eval_chunks`."""

        cut = limit if self.scenario == "class" else None

        @torch.no_grad()
        def masked(model, x, y):
            return accuracy(torch.cat([model(x[a:b])[:, :cut].argmax(1) for a, b in eval_chunks(int(x.shape[0]))]), y)
        return masked

    # -- protocol ------------------------------------------------------------------------------
    def learn_task(self, t: int, clients: list[tuple[Tensor, Tensor]], num_seen: int) -> Cost:
        """Stage t on ``clients`` (K pairs x_k (n_k, ...), y_k (n_k,)); returns the stage's measured
        :class:`Cost`. All input and memory checks run before any training."""
        limit = self._validate(t, clients, num_seen)
        device = resolve_device(self.config.device)
        test = None if self.eval_data is None else self.eval_data(t)
        if self.num_clients is None:
            self.num_clients = len(clients)
        data = [(x.to(device), y.to(device, dtype=torch.long)) for x, y in clients]
        num_old = self._num_seen if self.scenario == "class" else (self.num_classes if t > 0 else 0)
        alg, cost = self.algorithm, Cost()
        if self.states is None:
            self.states = ClientStates(StateInit(alg, self.config.seed))
        if self.replay is not None:
            cost += self._cache_round(t, data, num_old)
        config = stage_config(self.config, t)
        if t == 0 and self.first_rounds is not None:
            config = dataclasses.replace(config, rounds=self.first_rounds)
        previous = None if self.model is None else self.model.state_dict()
        alg.begin_stage(self.server_memory, t, num_old, limit, previous)
        key = self._share_key(t, data, test, config, num_seen)
        if key is not None and key in self.share_first_stage:
            self.share_first_stage.hits += 1
            hist = self._restore_stage(self.share_first_stage[key], device)
        else:
            start = time.perf_counter()
            hist = run_federated(self._first_model if self.model is None else self._next_model, data, test, alg,
                                 config, progress=self.progress, num_classes=self.num_classes,
                                 callbacks=self.callbacks, states=self.states, memory=self.server_memory,
                                 evaluate=self._evaluate(limit) if test is not None else None)
            if key is not None:
                self.share_first_stage.misses += 1
                self.share_first_stage[key] = self._snapshot_stage(hist, time.perf_counter() - start)
        cost += hist.cost
        if self.model is None:
            self.model = self._template
        self.model.load_state_dict(hist.final_state)
        self.model.requires_grad_(False).eval()
        extra_up = 0
        if alg.has_stage_round:
            extra = self._stage_round(data, limit)
            cost, extra_up = cost + extra, extra.bytes_up
        self._record(t, data, hist, hist.bytes_up[-1] + extra_up, cost)
        self._num_seen = int(num_seen)
        for callback in self.on_stage_end:
            callback(t, self)
        return self.costs[-1]

    # -- stage 0 shared between learners (FirstStageShare) --------------------------------------------
    def _share_key(self, t: int, data, test, config: FedConfig, num_seen: int) -> tuple | None:
        """The key of this stage-0 training in ``share_first_stage`` (None: not shared)."""
        if self.share_first_stage is None or t != 0 or self.model is not None or self.callbacks \
                or type(self.algorithm) is not Finetune:
            return None
        return (repr(self.algorithm), self.aggregation, self.scenario, self.num_classes, self.first_rounds,
                tuple(sorted((k, repr(v)) for k, v in dataclasses.asdict(config).items())), self.model_fn,
                fingerprint([v for pair in data for v in pair]),
                None if test is None else fingerprint(test), int(num_seen))

    def _snapshot_stage(self, hist: History, seconds: float) -> dict[str, Any]:
        return {"hist": copy.deepcopy(hist), "memory": copy.deepcopy(self.server_memory), "seconds": seconds,
                "states": {k: copy.deepcopy({key: v for key, v in state.items() if key not in ("local", "log")})
                           for k, state in self.states.items()},
                "rng": (random.getstate(), np.random.get_state(), torch.get_rng_state())}

    def _restore_stage(self, snap: dict[str, Any], device) -> History:
        """What run_federated would have produced at stage 0 (see :class:`FirstStageShare`)."""
        self._first_model().to(device)
        for k, entries in snap["states"].items():
            self.states[k].update(copy.deepcopy(entries))
        self.server_memory.clear()
        self.server_memory.update(copy.deepcopy(snap["memory"]))
        random.setstate(snap["rng"][0])
        np.random.set_state(snap["rng"][1])
        torch.set_rng_state(snap["rng"][2])
        self.reused_seconds[0] = snap["seconds"]
        return copy.deepcopy(snap["hist"])

    def _cache_round(self, t: int, data, num_old: int) -> Cost:
        """Every client rebuilds its local set (stage 0: its new data; later: cache u new data)."""
        payload: dict[str, Any] = {"stage": t, "num_old": num_old}
        template, names = nn.Identity(), []
        if t > 0:
            payload["state"], template, names = self.model.state_dict(), self.model, self.trainable
        client = CacheClient(self.replay, template, self.config, self.num_classes, names)
        for k in range(len(data)):   # each stage's log comes from that stage's cache round
            self.states[k].pop("log", None)
        return simulate(Broadcaster(payload), client, data, 1, states=self.states)

    def _stage_round(self, data, limit: int) -> Cost:
        entries = self.algorithm.stage_entries(self.model, self.trainable)
        server = Broadcaster({"state": self.model.state_dict(), "num_seen": limit},
                             uploads.Expected((entries,), what=f"{self.algorithm.name} stage upload"))
        client = StageClient(self.algorithm, self.model, self.config, self.trainable)
        active = [k for k, (x, _) in enumerate(data) if x.shape[0] > 0]
        with torch_threads(self.config.num_threads):
            cost = simulate(server, client, data, 1, participants=lambda r: active, states=self.states)
        self.algorithm.receive_stage(self.server_memory, server.result(), self.model)
        return cost

    def _record(self, t: int, data, hist: History | None, nbytes: int, cost: Cost) -> None:
        self.histories.append(hist)
        self.stage_bytes.append(int(nbytes))
        self.costs.append(cost)
        if self.replay is None:
            new = np.array([int(x.shape[0]) for x, _ in data])
            zeros = np.zeros(len(new), dtype=np.int64)
            self.memory_log.append({"new": new, "pool": zeros, "budget": zeros, "cached": zeros, "local": new,
                                    "old": zeros})
            self.pim_log.append(None)
            return
        # a client whose cache-round reply was left out (over Flower) has no log of this stage: zeros, no PIM
        logs = [self.states[k].get("log") for k in range(len(data))]
        first = next(log for log in logs if log is not None)
        keys = [k for k in first if k != "pim" and (t > 0 or not k.startswith(("pool_", "old_")))]
        blank = {key: np.zeros_like(np.asarray(first[key])) for key in keys}
        logs = [log if log is not None else {**blank, "pim": None} for log in logs]
        self.memory_log.append({key: np.array([log[key] for log in logs]) for key in keys})
        pims = [log["pim"] for log in logs]
        self.pim_log.append(pims if t > 0 and self.replay.name == "refed" else None)

    @torch.no_grad()
    def predict(self, x: Tensor, num_seen: int, batch_size: int | None = None) -> Tensor:
        """(N,) int64 labels (CPU): argmax over the first ``num_seen`` logits, eval mode, in chunks of
        ``batch_size`` (default: :func:`eval_chunks`)."""
        if self.model is None:
            raise RuntimeError("predict called before any learn_task")
        num_seen = check_int("num_seen", num_seen, 1, self.num_classes)
        device = next(self.model.parameters()).device
        self.model.eval()
        n = int(x.shape[0])
        chunks = eval_chunks(n) if batch_size is None else [(s, min(n, s + check_int("batch_size", batch_size, 1)))
                                                            for s in range(0, n, batch_size)]
        out = []
        with torch_threads(self.config.num_threads):
            for a, b in chunks:
                out.append(self.model(x[a:b].to(device))[:, :num_seen].argmax(1).cpu())
        return torch.cat(out) if out else torch.zeros(0, dtype=torch.long)

    # -- replay diagnostics (read from the clients' logs) -----------------------------------------
    @property
    def local_sets(self) -> list[tuple[Tensor, Tensor, Tensor]]:
        """Per client its local set (x, y, task id) on CPU (replay learners)."""
        return [tuple(v.cpu() for v in self.states[k]["local"]) for k in range(self.num_clients or 0)]

    def cache_labels(self, k: int) -> Tensor:
        """Labels (CPU) of client k's current local set (cache u latest task)."""
        return self.states[k]["local"][1].cpu()

    def check_memory(self) -> list[str]:
        """The storage constraint of the replay policy's ``memory_mode`` at every stage t >= 1,
        checked on what the clients hold (samples of earlier tasks counted from their task ids):
        ``"total"`` (Re-Fed Sec. 3.1) cache + new data <= M; ``"replay"`` (Sec. 4.1) old samples <= M.
        Both: the cache is as full as the rule allows (old = min(budget, pool)), so no storage is
        left unused. Returns the violations found (empty: all hold; no replay: nothing to check)."""
        bad: list[str] = []
        if self.replay is None:
            return bad
        m, mode = self.replay.memory, self.replay.memory_mode
        for t, log in enumerate(self.memory_log):
            if t == 0 or not len(log):
                continue
            for k in range(len(log["new"])):
                old, local, new = int(log["old"][k]), int(log["local"][k]), int(log["new"][k])
                expect = self.replay.budget(new, int(log["pool"][k]))
                if mode == "total" and local > m:
                    bad.append(f"task {t}, client {k}: local set {local} > M={m} (memory_mode 'total')")
                if mode == "replay" and old > m:
                    bad.append(f"task {t}, client {k}: {old} old samples > M={m} (memory_mode 'replay')")
                if old != expect:
                    bad.append(f"task {t}, client {k}: {old} old samples, the rule gives min(budget, pool) = {expect}")
                if local != old + new:
                    bad.append(f"task {t}, client {k}: local set {local} != old {old} + new {new}")
        return bad

    def __repr__(self) -> str:
        return (f"GradientLearner({self.name!r}, {self.algorithm!r}, replay={self.replay!r}, "
                f"scenario={self.scenario!r}, num_classes={self.num_classes})")


class StateInit:
    """Makes client k's initial state (the same as the training client's ``init_state``)."""

    def __init__(self, method: IncrementalAlgorithm, seed: int):
        self.method, self.seed = method, seed

    def init_state(self, k: int) -> dict[str, Any]:
        return initial_state(self.method, self.seed, k)


class FixedLearner(GradientLearner):
    """"Fixed" baseline: FedAvg (masked CE, no memory) on the first task only; later tasks neither
    train nor upload (0 bytes, ``histories[t] = None``). Class-incremental predictions use only the
    first task's classes (the frozen model never learned the others)."""

    def __init__(self, model_fn, config, *, num_classes, **kwargs):
        super().__init__(model_fn, config, "finetune", num_classes=num_classes, name="fixed", **kwargs)

    def learn_task(self, t, clients, num_seen):
        if t == 0:
            out = super().learn_task(t, clients, num_seen)
            self._first_seen = int(num_seen)
            return out
        self._validate(t, clients, num_seen)
        self.histories.append(None)
        self.stage_bytes.append(0)
        self.costs.append(Cost())
        self.memory_log.append({})
        self.pim_log.append(None)
        self._num_seen = int(num_seen)
        for callback in self.on_stage_end:
            callback(t, self)
        return self.costs[-1]

    def predict(self, x, num_seen, batch_size=None):
        if self.scenario == "class" and self.model is not None and isinstance(num_seen, (int, np.integer)) \
                and not isinstance(num_seen, bool):
            num_seen = min(num_seen, self._first_seen)
        return super().predict(x, num_seen, batch_size)
