"""Per-sample gradients of the masked cross-entropy, and what is built from them.

For a model f_theta, samples x (n, ...), labels y (n,) < ``num_seen`` and the loss
l_i(theta) = CE(f_theta(x_i)[:num_seen], y_i) (classes >= num_seen masked):

* :func:`per_sample_grads`     g_i = grad_theta l_i, chunk by chunk (``torch.func.vmap(grad)``)
* :func:`grad_sq_norms`        ||g_i||^2 (Re-Fed Eq. 4) without forming g_i: "ghost norms" from each
                               layer's inputs and output gradients, one forward and one backward
                               per chunk (Goodfellow 2015; Li et al. 2022); vmap for other layers
* :func:`vmap_grad_sq_norms`   the same from :func:`per_sample_grads` (any layer; memory-bound)
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

from collections import Counter
from contextlib import contextmanager
from typing import Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from fedlib.core.validate import check_int

__all__ = ["default_names", "per_sample_grads", "grad_sq_norms", "vmap_grad_sq_norms", "fisher_diagonal",
           "last_layer_grad_sq_norms", "reference_grad_sq_norms"]

CHUNK_FLOATS = 2**25  # per-sample gradients (vmap), unfolded inputs and Gram matrices (ghost norms) of one
                      # call take at most this many floats: 128 MiB in float32


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
    """||grad_theta CE(f(x_i)[:num_seen], y_i)||^2 for x (n, ...), y (n,) < num_seen (Re-Fed Eq. 4):
    (n,) in the model's output dtype, x's device. Eval mode; the model's mode and ``requires_grad``
    flags are restored, no ``.grad`` is written.

    Ghost norms (Goodfellow 2015, "Efficient per-example gradient computations"; Li et al. 2022,
    "ghost clipping"): per chunk of ``batch_size`` samples, one forward pass records every layer's
    input a and output z, one backward pass of L = sum_i l_i gives dL/dz, whose rows are the
    per-sample output gradients g_i = dl_i/dz_i (in eval mode sample i reaches only l_i). Each
    parameter's per-sample gradient is a function of (a_i, g_i) whose squared norm needs no
    per-sample gradient (:func:`_layer_sq_norms`): Linear and Conv2d (groups=1, zero padding) as
    ||g_i^T a_i||_F^2, BatchNorm (running statistics), GroupNorm and LayerNorm as sums of g * x_hat
    and g over positions. Cost: about one training step (forward + backward) of the chunk plus
    the layer terms, whatever the number of parameters; memory: the chunk's activations, as in a
    training step, plus layer temporaries of at most ``CHUNK_FLOATS`` floats.

    If any parameter of ``names`` belongs to another kind of module, is shared by two modules, is
    used other than by one call of its module, or an input/output of such a call is modified in
    place, the norms come from :func:`per_sample_grads` instead (``torch.func.vmap``; the same
    quantity, slower): never a skipped parameter. The ghost path assumes, as any per-sample
    gradient does, that the eval-mode forward treats the samples of a batch independently.
    """
    num_seen = check_int("num_seen", num_seen, 1)
    batch_size = check_int("batch_size", batch_size, 1)
    names = _names(model, names)
    n = int(x.shape[0])
    layers = ghost_layers(model, names)
    if layers is not None and n > 0:
        with _eval_mode(model), _trainable(model, names), torch.enable_grad():
            out = []
            for s in range(0, n, batch_size):
                g2 = _ghost_chunk(model, layers, x[s:s + batch_size], y[s:s + batch_size].long(), num_seen)
                if g2 is None:
                    break
                out.append(g2)
            else:
                return torch.cat(out)
    return vmap_grad_sq_norms(model, x, y, num_seen, names, batch_size)


def vmap_grad_sq_norms(model: nn.Module, x: Tensor, y: Tensor, num_seen: int, names: Sequence[str] | None = None,
                       batch_size: int = 64) -> Tensor:
    """The same (n,) norms as :func:`grad_sq_norms` from the materialised per-sample gradients of
    :func:`per_sample_grads` (``torch.func.vmap``, any layer): :func:`grad_sq_norms`' fallback, and the
    route the scoring benchmark compares it with. Memory-bound: chunks of at most
    ``CHUNK_FLOATS / numel`` samples (3 for ResNet-18)."""
    out = [sum(t.pow(2).flatten(1).sum(1) for t in g.values())
           for g in per_sample_grads(model, x, y, num_seen, names, batch_size)]
    return torch.cat(out) if out else torch.zeros(0, device=x.device)


_BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
_GHOST_TYPES = (nn.Linear, nn.Conv2d, nn.GroupNorm, nn.LayerNorm) + _BATCH_NORMS


def _ghost_supported(m: nn.Module) -> bool:
    """Exact types only: a subclass may compute something else with the same parameters."""
    if type(m) not in _GHOST_TYPES:
        return False
    if type(m) is nn.Conv2d:
        return m.groups == 1 and m.padding_mode == "zeros" and not isinstance(m.padding, str)
    if type(m) in _BATCH_NORMS:
        return m.running_mean is not None and m.running_var is not None  # else eval mode uses batch statistics
    return True


def ghost_layers(model: nn.Module, names: Sequence[str]) -> dict[nn.Module, tuple[bool, bool]] | None:
    """{module: (its weight is in ``names``, its bias is in ``names``)} for the modules holding the
    parameters ``names``, or None when one of them is not the weight or bias of a supported layer
    (:func:`_ghost_supported`) or is registered twice (shared)."""
    wanted = set(names)
    owners = Counter(id(p) for _, p in model.named_parameters(remove_duplicate=False))
    named = dict(model.named_parameters())
    if any(owners[id(named[n])] > 1 for n in wanted):
        return None
    layers: dict[nn.Module, tuple[bool, bool]] = {}
    found = set()
    for prefix, m in model.named_modules():
        mine = {f"{prefix}.{p}" if prefix else p: p for p, _ in m.named_parameters(recurse=False)}
        hit = {full: p for full, p in mine.items() if full in wanted}
        if not hit:
            continue
        if not _ghost_supported(m) or not set(hit.values()) <= {"weight", "bias"}:
            return None
        layers[m] = ("weight" in hit.values(), "bias" in hit.values())
        found |= set(hit)
    return layers if found == wanted else None


@contextmanager
def _trainable(model: nn.Module, names: Sequence[str]):
    """``requires_grad`` exactly on ``names`` inside the block; the flags are restored afterwards."""
    named = dict(model.named_parameters())
    flags = {n: p.requires_grad for n, p in named.items()}
    keep = set(names)
    try:
        for n, p in named.items():
            p.requires_grad_(n in keep)
        yield
    finally:
        for n, p in named.items():
            p.requires_grad_(flags[n])


def hooked_forward(model: nn.Module, layers, x: Tensor) -> tuple[Tensor, dict[nn.Module, tuple[Tensor, Tensor]]] | None:
    """``model(x)`` with the input a (b, ...) and output z (b, ...) of every module of ``layers``
    recorded: ``(logits, {layer: (a, z)})``, or None when a layer did not run exactly once on a
    (b, ...) input, its input or output was modified in place, or z does not require grad (then the
    ghost norms do not apply)."""
    calls: dict[nn.Module, list] = {m: [] for m in layers}

    def record(m, inputs, output):
        a = inputs[0] if inputs else None
        calls[m].append((a, output, getattr(a, "_version", None), getattr(output, "_version", None)))

    handles = [m.register_forward_hook(record) for m in layers]
    try:
        logits = model(x)
    finally:
        for h in handles:
            h.remove()
    b = int(x.shape[0])
    for m, rec in calls.items():
        if len(rec) != 1 or (isinstance(m, nn.Conv2d) and getattr(rec[0][0], "ndim", 0) != 4):
            return None
        a, z, va, vz = rec[0]
        if not (isinstance(a, Tensor) and isinstance(z, Tensor)) or a._version != va or z._version != vz:
            return None
        if a.ndim < 2 or z.ndim < 2 or a.shape[0] != b or z.shape[0] != b or not z.requires_grad:
            return None
    return logits, {m: rec[0][:2] for m, rec in calls.items()}


def ghost_total(layers: dict[nn.Module, tuple[bool, bool]], acts: dict[nn.Module, tuple[Tensor, Tensor]],
                grads: dict[nn.Module, Tensor | None], like: Tensor) -> Tensor:
    """(b,) sum over ``layers`` of the per-sample squared gradient norms from each layer's recorded
    input (``acts``, :func:`hooked_forward`) and per-sample output gradient ``grads[layer]`` (b, ...);
    a layer whose gradient is missing or None does not reach the loss (its norms are 0). ``like``:
    a tensor with the dtype and device of the result."""
    total = torch.zeros(int(like.shape[0]), dtype=like.dtype, device=like.device)
    with torch.no_grad():
        for m, flags in layers.items():
            g = grads.get(m)
            if g is not None:
                total += _layer_sq_norms(m, acts[m][0].detach(), g, *flags).to(total.dtype)
    return total


def _ghost_chunk(model: nn.Module, layers: dict[nn.Module, tuple[bool, bool]], x: Tensor, y: Tensor,
                 num_seen: int) -> Tensor | None:
    """Ghost norms of one chunk x (b, ...), y (b,): (b,), or None when :func:`hooked_forward` refuses
    (then vmap)."""
    hooked = hooked_forward(model, layers, x)
    if hooked is None:
        return None
    logits, acts = hooked
    loss = F.cross_entropy(logits[:, :num_seen], y, reduction="sum")  # rows of dL/dz: per-sample g_i
    mods = list(layers)
    grads = torch.autograd.grad(loss, [acts[m][1] for m in mods], allow_unused=True)
    return ghost_total(layers, acts, dict(zip(mods, grads)), logits[:, 0])


def _layer_sq_norms(m: nn.Module, a: Tensor, g: Tensor, weight: bool, bias: bool) -> Tensor:
    """(b,) squared norms of the per-sample gradients of layer ``m``'s weight (if ``weight``) and bias
    (if ``bias``) from its input a (b, ...) and output gradient g (b, ...), no per-sample gradient formed:

    * Linear, a (b, [T,] d_in), g (b, [T,] d_out): grad W_i = sum_t g_it a_it^T, grad b_i = sum_t g_it
      (:func:`_matmul_sq_norms`; T = 1 for 2-D inputs: ||a_i||^2 ||g_i||^2 + ||g_i||^2);
    * Conv2d (groups=1): the same with a_it = column t of unfold(a_i) (C_in k_h k_w entries), g_it
      the C_out output channels at output position t, T = H_out W_out positions;
    * BatchNorm (eval), GroupNorm, LayerNorm: y = x_hat * w + b elementwise, so grad w_i =
      sum_positions g_i * x_hat_i and grad b_i = sum_positions g_i, with x_hat the layer's own
      normalisation of a_i (running statistics for BatchNorm).
    """
    bsz = int(a.shape[0])
    if isinstance(m, nn.Linear):
        return _matmul_sq_norms(a.reshape(bsz, -1, a.shape[-1]).transpose(1, 2),
                                g.reshape(bsz, -1, g.shape[-1]).transpose(1, 2), weight, bias)
    if isinstance(m, nn.Conv2d):
        return _matmul_sq_norms(a, g, weight, bias, m)
    if isinstance(m, nn.LayerNorm):
        keep = len(m.normalized_shape)
        xhat = F.layer_norm(a, m.normalized_shape, None, None, m.eps) if weight else None
    else:
        keep = 1  # channel dimension (b, C, ...)
        if not weight:
            xhat = None
        elif isinstance(m, nn.GroupNorm):
            xhat = F.group_norm(a, m.num_groups, None, None, m.eps)
        else:
            xhat = F.batch_norm(a, m.running_mean, m.running_var, None, None, False, 0.0, m.eps)
    total = torch.zeros(bsz, dtype=g.dtype, device=g.device)

    def per_sample(t: Tensor) -> Tensor:  # sum over the positions the parameter is broadcast over
        if isinstance(m, nn.LayerNorm):
            t = t.reshape(bsz, -1, *t.shape[t.ndim - keep:]).sum(1)
        elif t.ndim > 2:
            t = t.flatten(2).sum(2)
        return t.pow(2).flatten(1).sum(1)

    if weight:
        total += per_sample(g * xhat)
    if bias:
        total += per_sample(g)
    return total


def _matmul_sq_norms(a: Tensor, g: Tensor, weight: bool, bias: bool, conv: nn.Conv2d | None = None) -> Tensor:
    """(b,) ||G_i A_i^T||_F^2 (if ``weight``) + ||G_i 1||^2 (if ``bias``) for A_i (d_in, T) the columns
    a_it, G_i (d_out, T) the columns g_it: the per-sample weight gradient sum_t g_it a_it^T of a
    layer applied at T positions, and its bias gradient.

    Linear (``conv`` None): a (b, d_in, T), g (b, d_out, T). Conv2d ``conv``: a its input
    (b, C_in, H, W), g its output gradient (b, C_out, H_out, W_out); A_i = unfold(a_i)
    (d_in = C_in k_h k_w, T = H_out W_out). Per sample, the one with fewer multiplications of

    * materialised: ||G_i A_i^T||_F^2 from the (d_out, d_in) matrix G_i A_i^T: T d_in d_out (for a
      convolution computed by its own weight-gradient kernel, ``torch.nn.grad.conv2d_weight``,
      one group per sample, rather than from the unfolded input), and
    * Gram: <A_i^T A_i, G_i^T G_i>_F = sum_{s,t} (a_is . a_it)(g_is . g_it), two (T, T) matrices:
      T^2 (d_in + d_out), i.e. Gram when T (d_in + d_out) < d_in d_out (few positions, wide layers),

    samples in chunks whose unfolded inputs and matrices take at most ``CHUNK_FLOATS`` floats.
    """
    bsz, d_out = int(g.shape[0]), int(g.shape[1])
    g3 = g.flatten(2)
    t = int(g3.shape[2])
    total = g3.sum(2).pow(2).sum(1) if bias else torch.zeros(bsz, dtype=g.dtype, device=g.device)
    if not weight:
        return total
    if conv is None:
        d_in = int(a.shape[1])
    else:
        d_in = conv.in_channels * conv.kernel_size[0] * conv.kernel_size[1]

    def unfold(x: Tensor) -> Tensor:  # Linear: as given; Conv2d: (c, C_in, H, W) -> (c, d_in, T)
        return x if conv is None else F.unfold(x, conv.kernel_size, conv.dilation, conv.padding, conv.stride)

    gram = t == 1 or t * (d_in + d_out) < d_in * d_out
    per = (2 * t * t if gram else d_in * d_out) + (d_in * t if conv is not None else 0)  # + unfold / im2col
    step = max(1, CHUNK_FLOATS // per)
    for s in range(0, bsz, step):
        c = min(step, bsz - s)
        if t == 1:
            ac = unfold(a[s:s + c])
            sq = ac.pow(2).sum((1, 2)) * g3[s:s + c].to(ac.dtype).pow(2).sum((1, 2))
        elif gram:
            ac, gc = unfold(a[s:s + c]), g3[s:s + c]
            sq = (torch.bmm(ac.transpose(1, 2), ac) * torch.bmm(gc.transpose(1, 2), gc.to(ac.dtype))).sum((1, 2))
        elif conv is None:
            sq = torch.bmm(g3[s:s + c], a[s:s + c].transpose(1, 2).to(g.dtype)).pow(2).sum((1, 2))
        else:  # per-sample weight gradients (c * C_out, C_in, k_h, k_w): a grouped convolution's weight gradient
            x, gc = a[s:s + c], g[s:s + c].to(a.dtype)
            gw = torch.nn.grad.conv2d_weight(x.reshape(1, -1, *x.shape[2:]), (c * d_out, *conv.weight.shape[1:]),
                                             gc.reshape(1, -1, *gc.shape[2:]), conv.stride, conv.padding,
                                             conv.dilation, groups=c)
            sq = gw.reshape(c, -1).pow(2).sum(1)
        total[s:s + c] += sq.to(total.dtype)
    return total


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


def last_linear(model: nn.Module) -> nn.Linear:
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
    layer = last_linear(model) if layer is None else layer
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
    params = [named[n] for n in names]
    out = torch.empty(int(x.shape[0]), dtype=params[0].dtype)
    with _eval_mode(model), _trainable(model, names):
        for i in range(int(x.shape[0])):
            loss = F.cross_entropy(model(x[i:i + 1])[:, :num_seen], y[i:i + 1].long())
            grads = torch.autograd.grad(loss, params)
            out[i] = sum(g.pow(2).sum() for g in grads).detach()
    return out
