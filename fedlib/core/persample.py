"""Per-sample gradients of the masked cross-entropy, and what is built from them.

For a model f_theta, samples x (n, ...), labels y (n,) < ``num_seen`` and the loss
l_i(theta) = CE(f_theta(x_i)[:num_seen], y_i) (classes >= num_seen masked):

* :func:`per_sample_grads`     g_i = grad_theta l_i, chunk by chunk (``torch.func.vmap(grad)``)
* :func:`grad_sq_norms`        ||g_i||^2                          (Re-Fed Eq. 4)
* :func:`fisher_diagonal`      F = (1/n) sum_i g_i * g_i           (FedEWC's empirical Fisher,
                                                                    Kirkpatrick et al. 2017 eq. 3)
* :func:`last_layer_grad_sq_norms`  ||pi - e_y||^2 (||h||^2 + 1), the closed form for the output layer
* :func:`reference_grad_sq_norms`   the same norms by one autograd backward per sample: THE reference
  loop of the tests, the scoring benchmark and the Re-Fed theory chapter.

theta = the parameters ``names`` (default: those with ``requires_grad``, or all if none does).
Every function runs the model in eval mode (a per-sample gradient of a batch statistic is
ill-defined) and restores its mode afterwards.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedlib.core.validate import check_int

__all__ = ["default_names", "per_sample_grads", "grad_sq_norms", "fisher_diagonal",
           "last_layer_grad_sq_norms", "reference_grad_sq_norms"]

CHUNK_FLOATS = 2**25  # per-sample gradients take chunk * numel floats: at most 128 MiB in float32


def default_names(model: nn.Module) -> list[str]:
    """Names of the parameters with ``requires_grad`` (all parameters if none has it)."""
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    return names or [n for n, _ in model.named_parameters()]


def _names(model: nn.Module, names: Sequence[str] | None) -> list[str]:
    named = dict(model.named_parameters())
    names = default_names(model) if names is None else list(names)
    unknown = [n for n in names if n not in named]
    if unknown or not names:
        raise ValueError(f"names must be parameter names of the model, got unknown {unknown or names}")
    return names


@contextmanager
def _eval_mode(model: nn.Module):
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def per_sample_grads(model: nn.Module, x: Tensor, y: Tensor, num_seen: int, names: Sequence[str] | None = None,
                     batch_size: int = 64) -> Iterator[dict[str, Tensor]]:
    """Yield {name: (b, *param.shape)} per-sample gradients of consecutive chunks of x (n, ...),
    y (n,) (b <= ``batch_size``, fewer when the parameters are large), eval mode."""
    from torch.func import functional_call, grad, vmap

    num_seen = check_int("num_seen", num_seen, 1)
    named = dict(model.named_parameters())
    params = {n: named[n].detach() for n in _names(model, names)}
    frozen = {n: p.detach() for n, p in named.items() if n not in params}
    buffers = dict(model.named_buffers())

    def loss(p, xi, yi):
        out = functional_call(model, ({**p, **frozen}, buffers), (xi.unsqueeze(0),))
        return F.cross_entropy(out[:, :num_seen], yi.unsqueeze(0))

    per_sample = vmap(grad(loss), in_dims=(None, 0, 0))
    numel = sum(p.numel() for p in params.values())
    chunk = max(1, min(batch_size, CHUNK_FLOATS // max(1, numel)))
    with _eval_mode(model):
        for s in range(0, int(x.shape[0]), chunk):
            yield per_sample(params, x[s:s + chunk], y[s:s + chunk].long())


def grad_sq_norms(model: nn.Module, x: Tensor, y: Tensor, num_seen: int, names: Sequence[str] | None = None,
                  batch_size: int = 64) -> Tensor:
    """||grad_theta CE(f(x_i)[:num_seen], y_i)||^2 for every sample (Re-Fed Eq. 4): (n,), x's device."""
    out = [sum(t.pow(2).flatten(1).sum(1) for t in g.values())
           for g in per_sample_grads(model, x, y, num_seen, names, batch_size)]
    return torch.cat(out) if out else torch.zeros(0, device=x.device)


def fisher_diagonal(model: nn.Module, x: Tensor, y: Tensor, num_seen: int, names: Sequence[str] | None = None,
                    batch_size: int = 64) -> dict[str, Tensor]:
    """Diagonal empirical Fisher F_i = (1/n) sum_j (d l_j / d theta_i)^2 (true labels), per sample:
    {name: tensor shaped like the parameter}. x (n >= 1, ...)."""
    n = int(x.shape[0])
    if n == 0:
        raise ValueError("fisher_diagonal needs at least one sample in x")
    named = dict(model.named_parameters())
    fisher = {name: torch.zeros_like(named[name]) for name in _names(model, names)}
    for g in per_sample_grads(model, x, y, num_seen, list(fisher), batch_size):
        for name in fisher:
            fisher[name].add_(g[name].pow(2).sum(0))
    return {name: f / n for name, f in fisher.items()}


def _last_linear(model: nn.Module) -> nn.Linear:
    layers = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if not layers:
        raise ValueError(f"{type(model).__name__} has no nn.Linear output layer; use grad_norm='exact'")
    return layers[-1]


@torch.no_grad()
def last_layer_grad_sq_norms(model: nn.Module, x: Tensor, y: Tensor, num_seen: int,
                             layer: nn.Linear | None = None, dtype: torch.dtype | None = torch.float32) -> Tensor:
    """Closed-form squared gradient norm w.r.t. the output layer only: (n,) in ``dtype`` (default
    float32 whatever the model's precision; None: the model's output dtype).

    For logits z = W h + b (``layer``, default the model's last nn.Linear, which must produce the
    model's output), pi = softmax(z[:num_seen]) and l = -log pi_y: grad_W l = (pi - e_y) h^T,
    grad_b l = pi - e_y, so ||grad_W l||^2 + ||grad_b l||^2 = ||pi - e_y||^2 (||h||^2 + 1)
    (without a bias: ||pi - e_y||^2 ||h||^2). Forward pass only, eval mode.
    """
    num_seen = check_int("num_seen", num_seen, 1)
    layer = _last_linear(model) if layer is None else layer
    if not isinstance(layer, nn.Linear):
        raise ValueError(f"layer must be an nn.Linear, got {type(layer).__name__}")
    seen: dict[str, Tensor] = {}
    handle = layer.register_forward_hook(lambda m, inp, out: seen.update(h=inp[0], z=out))
    try:
        with _eval_mode(model):
            logits = model(x)
    finally:
        handle.remove()
    if "z" not in seen or seen["z"].shape != logits.shape or not torch.equal(seen["z"], logits):
        raise ValueError("the model's output is not the output of its last nn.Linear; pass layer= or "
                         "use the exact per-sample gradients")
    h = seen["h"].flatten(1)
    dtype = logits.dtype if dtype is None else dtype
    pi = torch.softmax(logits[:, :num_seen].to(dtype), dim=1)
    pi[torch.arange(len(y), device=pi.device), y.long()] -= 1.0
    scale = h.to(dtype).pow(2).sum(1) + (1.0 if layer.bias is not None else 0.0)
    return pi.pow(2).sum(1) * scale


def reference_grad_sq_norms(model: nn.Module, x: Tensor, y: Tensor, num_seen: int,
                            names: Sequence[str] | None = None) -> Tensor:
    """The reference loop: ||grad CE(f(x_i)[:num_seen], y_i)||^2 by one autograd backward per sample.

    Over the parameters ``names`` (default: **all**). Eval mode; the model's mode and
    ``requires_grad`` flags are restored. Returns (n,) in the model's dtype.
    """
    named = dict(model.named_parameters())
    names = list(named) if names is None else _names(model, names)
    flags = {n: p.requires_grad for n, p in named.items()}
    for n, p in named.items():
        p.requires_grad_(n in names)
    params = [named[n] for n in names]
    out = torch.empty(int(x.shape[0]), dtype=params[0].dtype)
    try:
        with _eval_mode(model):
            for i in range(int(x.shape[0])):
                loss = F.cross_entropy(model(x[i:i + 1])[:, :num_seen], y[i:i + 1].long())
                grads = torch.autograd.grad(loss, params)
                out[i] = sum(g.pow(2).sum() for g in grads).detach()
    finally:
        for n, p in named.items():
            p.requires_grad_(flags[n])
    return out
