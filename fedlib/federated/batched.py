"""The batched client path of the gradient methods (``FedConfig(batched_clients=True)``): all
clients of a round trained at once, equal to the per-client loop of
:class:`fedlib.federated.gradient.GradientClient` up to float round-off.

A speed path, kept out of the methods' readable code. Each method names its batched hooks in its
class attribute ``batched``: a :class:`BatchedHooks` subclass that mirrors its per-client hooks
(``begin_local`` -> :meth:`~BatchedHooks.begin`, ``local_loss`` -> :meth:`~BatchedHooks.local_loss`,
``training_loss`` -> :meth:`~BatchedHooks.loss`, ``end_local`` -> :meth:`~BatchedHooks.end`) for the
m clients of a round at once (:class:`LocalBatch`). :class:`BatchedTrainer` runs them: the clients'
trained parameters stacked (m, ...), one batched forward and backward per mini-batch step
(:func:`batched_call`), torch.optim.SGD's update written out for the stacked tensors. For linear
and MLP heads on cached features, where per-client, per-batch Python overhead dominates
(``fedlib.bench.federated_batched`` measures it); the models it supports: :func:`batchable`.
Equality with the per-client loop, method by method: ``tests/federated/test_federated_batched.py``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedlib.core.messages import Message
from fedlib.federated.heads import LinearHead, MLPHead, MOONHead

__all__ = ["LocalBatch", "batched_call", "weighted_cross_entropy", "BatchedHooks", "ProxHooks", "DynHooks",
           "NTDHooks", "MOONHooks", "IncrementalHooks", "IncrementalProxHooks", "EWCHooks", "LwFHooks",
           "BATCHABLE_MODULES", "batchable", "BatchedTrainer"]


@dataclass
class LocalBatch:
    """What a method's batched hooks (:class:`BatchedHooks`) see: the m
    clients of one round trained at once. Slot j is client ``states[j]["id"]``; slots are ordered
    by decreasing number of local steps, so the clients still training at step t are the first
    m_t slots and every per-client tensor of a step is a prefix ``[:m_t]`` of the stacked one.

    ``params``: the trained parameters stacked over clients, name -> (m, ...), updated in place by
    the SGD steps (after training: the clients' final weights); ``frozen``: the parameters that are
    not trained (shared); ``global_params``: the broadcast weights, name -> (...);
    ``model`` / ``global_model``: the architecture (its own weights unused; ``call`` runs it for
    all clients) and the frozen global model; ``scratch``: what :meth:`BatchedHooks.begin` precomputes.
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
        return batched_call(self.model, {**{n: t.expand(m, *t.shape) for n, t in shared.items()}, **params}, x,
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


def batched_call(module: nn.Module, params: dict[str, Tensor], x: Tensor, method: str = "forward",
                  prefix: str = "") -> Tensor:
    """``module.<method>(x)`` of m clients at once, x (m, B, ...), parameters ``params[prefix + name]``
    stacked (m, ...); for the modules of ``BATCHABLE_MODULES`` (the heads' methods spelled out as in
    their classes; the equality tests check them against the per-client path)."""
    t = type(module)
    if t in (LinearHead, MLPHead, MOONHead) and method == "forward":
        return batched_call(module, params, batched_call(module, params, x, "features", prefix), "head", prefix)
    if method not in ("forward", "features", "head") or (method != "forward" and t not in (LinearHead, MLPHead, MOONHead)):
        raise ValueError(f"no batched {t.__name__}.{method}")
    if t is nn.Linear:
        return _BatchedLinear.apply(x, params[prefix + "weight"], params.get(prefix + "bias"))
    if t is nn.Sequential:
        for name, child in module.named_children():
            x = batched_call(child, params, x, "forward", f"{prefix}{name}.")
        return x
    if t is nn.Identity:
        return x
    if t is nn.Flatten:  # its dims counted without the client dim
        return x.flatten(module.start_dim + (module.start_dim >= 0), module.end_dim + (module.end_dim >= 0))
    if t is LinearHead:
        return x.flatten(2) if method == "features" else batched_call(module.linear, params, x, prefix=f"{prefix}linear.")
    if t is MLPHead:
        if method == "features":
            return F.relu(batched_call(module.proj, params, x.flatten(2), prefix=f"{prefix}proj."))
        return batched_call(module.classifier, params, x, prefix=f"{prefix}classifier.")
    if t is MOONHead:
        if method == "features":
            h = F.relu(batched_call(module.l1, params, x.flatten(2), prefix=f"{prefix}l1."))
            return batched_call(module.l2, params, h, prefix=f"{prefix}l2.")
        return batched_call(module.l3, params, x, prefix=f"{prefix}l3.")
    if t in BATCHABLE_MODULES:  # element-wise activations
        return module(x)
    raise ValueError(f"the batched client path does not support {t.__name__}")


def weighted_cross_entropy(logits: Tensor, y: Tensor, w: Tensor) -> Tensor:
    """sum over clients and rows of ``w * CE(logits, y)``: logits (m, B, C), y / w (m, B); with
    ``w`` = 1/b_k on the b_k real rows of client k's mini-batch (0 on padding) this is the sum of
    the clients' mean cross-entropies."""
    ce = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none")
    return (ce * w.flatten()).sum()


class BatchedHooks:
    """FedAvg's client hooks for the m clients of a batched round (the twins of
    :class:`fedlib.federated.gradient.FedAlgorithm`'s): ``method`` holds the hyperparameters.

    ``params``: the trained parameters of the m_t clients still training, name -> (m_t, ...);
    x (m_t, B, ...), y (m_t, B); w (m_t, B): 1/b_k on the b_k real rows of client k's mini-batch,
    0 on padding rows (whose content is an arbitrary real sample of the round).
    """

    def __init__(self, method: Any):
        self.method = method

    def begin(self, batch: LocalBatch) -> None:
        """[begin_local] After ``batch.params`` received the global weights, before local SGD."""

    def local_loss(self, batch: LocalBatch, params: dict[str, Tensor], x: Tensor, y: Tensor, w: Tensor,
                   logits: Tensor) -> Tensor | None:
        """[local_loss] Sum over the m_t clients of each client's extra loss term (None = nothing)."""
        return None

    def logits(self, batch: LocalBatch, params: dict[str, Tensor], x: Tensor) -> Tensor:
        """The m_t clients' logits (m_t, B, C)."""
        return batch.call(params, x)

    def loss(self, batch: LocalBatch, params: dict[str, Tensor], x: Tensor, y: Tensor, w: Tensor) -> Tensor:
        """[training_loss] Sum over the m_t clients of each client's mini-batch loss (its gradient
        with respect to ``params[n][j]`` is client j's own)."""
        logits = self.logits(batch, params, x)
        loss = weighted_cross_entropy(logits, y, w)
        extra = self.local_loss(batch, params, x, y, w, logits)
        return loss if extra is None else loss + extra

    def end(self, batch: LocalBatch) -> list[dict[str, Any]]:
        """[end_local] After local SGD: each slot's extra upload entries."""
        return [{} for _ in batch.states]


class ProxHooks(BatchedHooks):
    """FedProx: mu/2 ||w_k - w^t||^2 per client (the global weights are ``batch.global_params``)."""

    def local_loss(self, batch, params, x, y, w, logits):
        prox = sum(((p - batch.global_params[n]) ** 2).sum() for n, p in params.items())
        return 0.5 * self.method.mu * prox


class DynHooks(BatchedHooks):
    """FedDyn: alpha/2 ||theta_k - theta^{t-1}||^2 - <g_k, theta_k>, then g_k's update."""

    def begin(self, batch):
        names = [n for n, _ in batch.global_model.named_parameters()]
        for state in batch.states:
            if state["grad"] is None:
                state["grad"] = [torch.zeros_like(p) for p in batch.global_model.parameters()]
        # g_k of the trained parameters, stacked over the slots (the clients' own lists are updated in end)
        batch.scratch["grad"] = {n: torch.stack([s["grad"][names.index(n)] for s in batch.states])
                                 for n in batch.params}

    def local_loss(self, batch, params, x, y, w, logits):
        grad = batch.scratch["grad"]
        lin = sum((p * grad[n][:p.shape[0]]).sum() for n, p in params.items())
        quad = sum(((p - batch.global_params[n]) ** 2).sum() for n, p in params.items())
        return 0.5 * self.method.alpha * quad - lin

    @torch.no_grad()
    def end(self, batch):
        names = [n for n, _ in batch.global_model.named_parameters()]
        for j, state in enumerate(batch.states):
            for n, p in batch.params.items():  # untrained parameters: p - g = 0, g_k unchanged
                state["grad"][names.index(n)].sub_(p[j] - batch.global_params[n], alpha=self.method.alpha)
        return [{} for _ in batch.states]


class NTDHooks(BatchedHooks):
    """FedNTD: the not-true distillation of every client's rows (row weights ``w``)."""

    def local_loss(self, batch, params, x, y, w, logits):
        with torch.no_grad():
            g_logits = batch.global_model(x.flatten(0, 1))
        return self.method.ntd_loss(logits.flatten(0, 1), g_logits, y.flatten(), w.flatten())


class MOONHooks(BatchedHooks):
    """MOON: the model-contrastive term against each client's own previous model."""

    def begin(self, batch):
        has = [s["prev"] is not None for s in batch.states]
        batch.scratch["has_prev"] = has
        if any(has):  # every parameter of the previous local models, stacked (the global weights as filler)
            batch.scratch["prev"] = {n: torch.stack([(s["prev"] if h else batch.global_params)[n]
                                                     for s, h in zip(batch.states, has)])
                                     for n in batch.global_params}
            batch.scratch["w_con"] = torch.tensor(has, dtype=next(iter(batch.global_params.values())).dtype,
                                                  device=next(iter(batch.global_params.values())).device)

    def loss(self, batch, params, x, y, w):
        m, mu, tau = x.shape[0], self.method.mu, self.method.tau
        z = batch.call(params, x, "features")
        loss = weighted_cross_entropy(batch.call(params, z, "head"), y, w)
        if not any(batch.scratch["has_prev"][:m]):  # nobody has a negative yet: l_con = 0
            return loss
        with torch.no_grad():
            z_glob = batch.global_model.features(x.flatten(0, 1)).view(z.shape)
            z_prev = batch.call({n: t[:m] for n, t in batch.scratch["prev"].items()}, x, "features", frozen={})
        pos = F.cosine_similarity(z, z_glob, dim=-1)
        neg = F.cosine_similarity(z, z_prev, dim=-1)
        sims = torch.stack([pos, neg], dim=-1) / tau
        con = -F.log_softmax(sims, dim=-1)[..., 0]  # CE with target 0, per row
        # rows of a client without a previous model weigh 0 (its l_con = 0, as in training_loss)
        return loss + mu * (con * w * batch.scratch["w_con"][:m, None]).sum()

    def end(self, batch):
        for j, state in enumerate(batch.states):
            state["prev"] = {n: (batch.params[n][j] if n in batch.params else t).detach().clone()
                             for n, t in batch.global_params.items()}
        return [{} for _ in batch.states]


class IncrementalHooks(BatchedHooks):
    """Class-incremental methods: the cross-entropy over the broadcast ``num_seen`` classes."""

    def logits(self, batch, params, x):
        num_seen = batch.broadcast["num_seen"]
        logits = batch.call(params, x)
        if logits.shape[-1] < num_seen:
            raise ValueError(f"the model outputs {logits.shape[-1]} logits but {num_seen} "
                             f"classes are seen; model_fn must build a model with all classes")
        return logits[..., :num_seen]  # mask out future classes


class IncrementalProxHooks(IncrementalHooks, ProxHooks):
    """FedProx with the masked cross-entropy."""


class EWCHooks(IncrementalHooks):
    """Fed-EWC: the clients' EWC penalties against the shared Fisher F_n and anchor theta*_n."""

    def begin(self, batch):
        fisher = batch.broadcast.payload.get("fisher")
        batch.scratch["terms"] = None if fisher is None or self.method.lam == 0 else \
            [(n, f, batch.broadcast["anchor"][n]) for n, f in fisher.items()]

    def local_loss(self, batch, params, x, y, w, logits):
        """params[n] (m_t, ...) against F_n and theta*_n (a parameter the batch does not train,
        ``batch.frozen``, adds no gradient and is skipped)."""
        terms = batch.scratch["terms"]
        if terms is None:
            return None
        return 0.5 * self.method.lam * sum((f * (params[n] - a) ** 2).sum() for n, f, a in terms if n in params)


class LwFHooks(IncrementalHooks):
    """Fed-LwF: the teacher (one model, shared) runs on all clients' rows at once; each client's KL
    is its row mean (weights ``w``)."""

    def begin(self, batch):
        teacher = batch.broadcast.payload.get("teacher")
        batch.scratch["teacher"] = teacher if teacher is not None and self.method.lam != 0 else None

    def local_loss(self, batch, params, x, y, w, logits):
        teacher = batch.scratch["teacher"]
        if teacher is None:
            return None
        o, T = batch.broadcast["num_old"], self.method.T
        with torch.no_grad():
            z_old = torch.func.functional_call(batch.model, teacher, (x.flatten(0, 1),))
            q = F.softmax(z_old[:, :o] / T, dim=1)
        log_p = F.log_softmax(logits.flatten(0, 1)[:, :o] / T, dim=1)
        kl = F.kl_div(log_p, q, reduction="none").sum(1)
        return self.method.lam * T ** 2 * (kl * w.flatten()).sum()


# element-wise or row-wise modules (and the heads built from them): the batched path pads a
# client's last mini-batch with weight-0 rows, which is exact only if rows do not interact
BATCHABLE_MODULES: tuple[type, ...] = (
    nn.Linear, nn.Sequential, nn.Identity, nn.Flatten, nn.ReLU, nn.LeakyReLU, nn.GELU, nn.SiLU, nn.ELU, nn.Tanh,
    nn.Sigmoid, LinearHead, MLPHead, MOONHead)

# the per-client hooks that BatchedHooks mirrors
CLIENT_HOOKS = ("begin_local", "local_loss", "training_loss", "end_local")


def _owner(cls: type, name: str) -> type:
    return next(c for c in cls.__mro__ if name in vars(c))


def batchable(method: Any, model: nn.Module) -> str | None:
    """Why ``FedConfig(batched_clients=True)`` cannot train ``method`` on ``model`` (None: it can).

    The method: its class attribute ``batched`` (a :class:`BatchedHooks` subclass) must be set no
    higher in its class hierarchy than any of its per-client hooks (every method of
    ``ALGORITHMS`` and ``fcil.METHODS`` is; a subclass that overrides ``local_loss`` without
    setting ``batched`` is not). The model: built only from
    ``BATCHABLE_MODULES`` (rows of a mini-batch independent, no randomness), without buffers.
    """
    cls = type(method)
    for hook in CLIENT_HOOKS:
        if not issubclass(_owner(cls, "batched"), _owner(cls, hook)):
            return (f"{cls.__name__} overrides {hook} in {_owner(cls, hook).__name__} without its batched "
                    f"hooks (class attribute ``batched``), so it has no batched client path")
    odd = sorted({type(m).__name__ for m in model.modules() if type(m) not in BATCHABLE_MODULES})
    if odd:
        return (f"the batched client path supports models built from {', '.join(c.__name__ for c in BATCHABLE_MODULES)}; "
                f"{type(model).__name__} contains {', '.join(odd)}")
    if any(True for _ in model.buffers()):
        return f"the batched client path supports models without buffers; {type(model).__name__} has some"
    return None


class BatchedTrainer:
    """Local SGD of several clients at once, for ``GradientClient.step_many``.

    Every client draws its mini-batch order with the same ``torch.randperm`` calls on its own
    generator as ``GradientClient.step``; the clients' trained parameters are stacked (m, ...)
    and each SGD step runs one batched forward and one backward over the clients that still have a
    mini-batch left (a client with fewer samples has fewer steps and stops; its last partial batch
    is padded with weight-0 rows, the mean over its true size). The SGD update is
    torch.optim.SGD's, written out for the stacked tensors (d = grad + wd p; buf = d at the first
    step, else momentum buf + d; p -= lr buf). ``model``: the architecture (its ``requires_grad``
    flags say what is trained), ``global_model``: the frozen global model.
    """

    def __init__(self, method: Any, model: nn.Module, global_model: nn.Module):
        self.hooks: BatchedHooks = method.batched(method)
        self.model, self.global_model = model, global_model
        self._stacked: tuple | None = None  # the clients' concatenated data (see _round_data)
        self._xbuf: Tensor | None = None  # the gathered mini-batch inputs (reused)
        self._bufs: dict[str, Tensor] = {}  # the momentum buffers (reused)

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

    def uploads(self, pairs: list[tuple[Tensor, Tensor]], states: list[dict[str, Any]], broadcast: Message,
                config: Any) -> list[Message]:
        """The uploads of the clients ``states`` (training data ``pairs``), in that order, after
        ``config.local_epochs`` epochs of SGD from ``broadcast["state"]`` (``self.global_model``
        already holds it)."""
        cfg, hooks = config, self.hooks
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
        hooks.begin(batch)
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
            loss = hooks.loss(batch, leaves, x, y_all.index_select(0, idx).view(m, bs), weight[t, :m])
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
        extras = hooks.end(batch)
        keys = list(self.model.state_dict())
        uploads: list[Message | None] = [None] * len(states)
        for j, i in enumerate(order):
            state = {k: (params[k][j] if k in params else g_state[k]).detach().clone() for k in keys}
            uploads[i] = Message(f"client{states[i]['id']}", {"state": state, "n": sizes[i], **(extras[j] or {})})
        return uploads
