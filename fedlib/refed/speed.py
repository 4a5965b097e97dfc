"""Re-Fed's opt-in speed paths: the PIM's fused step (the exact per-sample norms of a mini-batch from the
training step's own forward and backward, bit-identical to the separate ghost-norm pass; ``FUSED_PIM``)
and :class:`PIMShare` (PIMs reused between runs that would train the same one)."""
from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from fedlib.core.cache import fingerprint
from fedlib.core.persample import ghost_total, hooked_forward
from fedlib.federated.gradient import LinearHead, MLPHead
from fedlib.federated.models import SmallCNN

#: train_pim computes the exact norms of a full mini-batch (2^k samples) from its training step's own
#: forward and backward (:func:`fused_pim_step`, bit-identical); False: a separate ghost-norm pass
FUSED_PIM = True


def mode_free(model: nn.Module) -> bool:
    """True when the model computes the same in train and eval mode: built only from modules known
    to ignore the mode (no dropout, no batch norm)."""
    free = (nn.Linear, nn.Conv2d, nn.ReLU, nn.Flatten, nn.Identity, nn.Sequential, nn.MaxPool2d, SmallCNN,
            LinearHead, MLPHead)
    return all(type(m) in free for m in model.modules())


def fused_pim_step(v: nn.Module, layers: dict, xb: Tensor, yb: Tensor, num_seen: int, trained, anchor, q: float,
                    opt) -> Tensor | None:
    """One PIM step (Eq. 3) and the exact G^p of its b samples from the same forward and backward:
    the ghost norms of :func:`fedlib.core.persample.grad_sq_norms` need every layer's input a and the
    per-sample output gradients dl_i/dz_i, and the step's backward of the batch-mean loss computes
    dL/dz = (1/b) dl_i/dz_i (the proximal term does not reach z). For b a power of two the scaling by
    1/b is exact in floating point, so b dL/dz equals the separate sum-loss backward bit for bit, and
    the norms and the step equal those of the two-pass route (tested). Needs a model that computes the
    same in train and eval mode (:func:`mode_free`); returns None (nothing done) when a hooked layer did
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
    def key(policy, x: Tensor, y: Tensor, ctx, lr: float) -> tuple:
        model = fingerprint(list(ctx.global_model.state_dict().values()))
        return (fingerprint([x, y]), model, fingerprint([ctx.generator.get_state()]), int(ctx.num_old),
                policy.lam, policy.pim_epochs, float(lr), int(ctx.config.batch_size), policy.pim_momentum,
                policy.prox_scaling, policy.grad_norm, tuple(ctx.names))
