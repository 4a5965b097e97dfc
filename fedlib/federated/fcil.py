"""Gradient-based methods for federated class-incremental learning (FCIL), on the protocol.

Each is a :class:`fedlib.federated.gradient.FedAlgorithm` whose cross-entropy is restricted to the
classes seen so far; :class:`fedlib.federated.learner.GradientLearner` runs one of them stage by
stage. With ``s_t`` = classes seen after stage t and ``o_t = s_{t-1}`` the old ones (both
broadcast by the server, ``num_seen`` / ``num_old``), the local loss is computed on the first
``s_t`` logits only (future classes masked):

* ``"finetune"``  L = CE(z[:, :s_t], y)                       (STSA Sec. 4's "Finetune" lower bound)
* ``"fedewc"``    L = CE + (lam/2) sum_i F_i (theta_i - theta*_i)^2   (Kirkpatrick et al., PNAS 2017)
* ``"fedlwf"``    L = CE + lam T^2 KL(softmax(z^old[:, :o_t]/T) || softmax(z[:, :o_t]/T))  (Li & Hoiem, TPAMI 2017)
* ``"fedprox"``   L = CE + mu/2 ||w - w^t||^2                   (Li et al., MLSys 2020; Re-Fed's baseline)

Fed-EWC / Fed-LwF are the FedAvg + EWC / LwF baselines of the TARGET / LANDER benchmarks
(STSA Sec. 4). At stage 0 there is no old model, so all of them (FedProx aside) are exactly
FedAvg with the masked CE (bit-identical weights for the same config). Default hyperparameters
are our choices; the STSA paper does not give them.

Stage hooks (server side, on the server's ``memory``, kept across stages): ``begin_stage`` before
a stage's rounds, ``receive_stage`` with the uploads of the optional stage-end round, whose
client side is ``stage_upload`` (FedEWC: the client's Fisher of the final global model).
"""
from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedlib.core import uploads
from fedlib.core.messages import Message
from fedlib.core.persample import default_names, fisher_diagonal
from fedlib.core.validate import check_positive, check_real
from fedlib.federated.batched import EWCHooks, IncrementalHooks, IncrementalProxHooks, LwFHooks
from fedlib.federated.gradient import FedAlgorithm, FedProx, build_from_registry

__all__ = ["IncrementalAlgorithm", "Finetune", "FedEWC", "FedLwF", "IncrementalFedProx", "METHODS",
           "make_method"]


class IncrementalAlgorithm(FedAlgorithm):
    """FedAvg mechanics with the cross-entropy restricted to the broadcast ``num_seen`` classes."""

    name = "incremental"
    batched = IncrementalHooks
    has_stage_round = False  # True: a stage-end round (``stage_upload`` -> ``receive_stage``)

    # -- server side ----------------------------------------------------------------------------
    def begin_stage(self, memory: dict, t: int, num_old: int, num_seen: int,
                    previous: dict[str, Tensor] | None) -> None:
        """Stage t will learn classes [num_old, num_seen); ``previous`` = the global state at the end
        of stage t-1 (None at stage 0)."""
        memory.update(stage=t, num_old=num_old, num_seen=num_seen)

    def broadcast_extra(self, memory):
        return {"num_seen": memory["num_seen"], "num_old": memory["num_old"]}

    def receive_stage(self, memory: dict, uploads: list[Message], global_model: nn.Module) -> None:
        """The stage-end round's uploads, with the stage's final global model."""

    def stage_entries(self, global_model: nn.Module, names: Sequence[str]) -> dict[str, Any]:
        """What ``stage_upload`` holds (:mod:`fedlib.core.uploads` entries), as the server checks it."""
        return {}

    # -- client side ----------------------------------------------------------------------------
    def stage_upload(self, global_model: nn.Module, x: Tensor, y: Tensor, num_seen: int,
                     names: Sequence[str], batch_size: int) -> dict[str, Any]:
        """The client's stage-end upload computed on its stage data x (n, ...), y (n,)."""
        return {}

    def training_loss(self, local, x, y):
        num_seen = local.broadcast["num_seen"]
        logits = local.model(x)
        if logits.shape[1] < num_seen:
            raise ValueError(f"the model outputs {logits.shape[1]} logits but {num_seen} "
                             f"classes are seen; model_fn must build a model with all classes")
        logits = logits[:, :num_seen]  # mask out future classes
        loss = F.cross_entropy(logits, y)
        extra = self.local_loss(local, x, y, logits)
        return loss if extra is None else loss + extra

class Finetune(IncrementalAlgorithm):
    """FedAvg on the new task's data with CE over the seen classes; no protection against
    forgetting (the lower bound of STSA Sec. 4)."""

    name = "finetune"

    def __init__(self):
        pass


class IncrementalFedProx(IncrementalAlgorithm, FedProx):
    """FedProx (Li et al., MLSys 2020) with the masked CE: L = CE(z[:, :s_t], y) + mu/2 ||w - w^t||^2."""

    name = "fedprox"
    batched = IncrementalProxHooks


class FedEWC(IncrementalAlgorithm):
    """Fed-EWC: FedAvg whose local loss adds the EWC penalty (Kirkpatrick et al., PNAS 2017, eq. 3)

        L_k(theta) = CE(z[:, :s_t], y) + (lam/2) sum_i F_i (theta_i - theta*_i)^2,

    theta* = global model at the end of the previous stage. At the end of every stage each
    non-empty client computes the per-sample diagonal empirical Fisher
    (:func:`fedlib.core.persample.fisher_diagonal`, true labels, logits of the seen classes) of the
    final global model on its stage data and uploads it (bytes counted); the server averages them
    with weights n_k / sum n and **sums** the stage Fishers over stages, F = sum_t F^(t) (online EWC
    with gamma = 1, Schwarz et al. 2018: one anchor, the latest theta*) and broadcasts F and theta*
    with every later round. lam = 100 is our choice (STSA gives none). Plain SGD becomes unstable
    once lr * lam * max F_i exceeds ~2; lower lam (or lr) if the loss explodes.
    """

    name = "fedewc"
    batched = EWCHooks
    has_stage_round = True

    def __init__(self, lam: float = 100.0):
        check_positive("lam", lam, strict=False)
        self.lam = float(lam)

    def broadcast_extra(self, memory):
        extra = super().broadcast_extra(memory)
        if "fisher" in memory:
            extra.update(fisher=memory["fisher"], anchor=memory["anchor"])
        return extra

    def begin_local(self, local):
        fisher = local.broadcast.payload.get("fisher")
        if fisher is None or self.lam == 0:
            local.scratch["terms"] = None
            return
        named, anchor = dict(local.model.named_parameters()), local.broadcast["anchor"]
        local.scratch["terms"] = [(named[n], f, anchor[n]) for n, f in fisher.items()]

    def local_loss(self, local, x, y, logits):
        terms = local.scratch["terms"]
        if terms is None:
            return None
        return 0.5 * self.lam * sum((f * (p - a) ** 2).sum() for p, f, a in terms)

    def stage_upload(self, global_model, x, y, num_seen, names, batch_size):
        return {"fisher": fisher_diagonal(global_model, x, y, num_seen, names, batch_size), "n": int(x.shape[0])}

    def stage_entries(self, global_model, names):
        """The Fisher of every trained parameter (its shape and dtype, values >= 0) and n >= 1."""
        params = dict(global_model.named_parameters())
        fisher = {n: uploads.Tensor(tuple(params[n].shape), (str(params[n].dtype).removeprefix("torch."),), low=0.0)
                  for n in (default_names(global_model) if names is None else names)}
        return {"fisher": fisher, "n": uploads.Number(low=1, integer=True)}

    def receive_stage(self, memory, uploads, global_model):
        names = list(uploads[0]["fisher"])
        total = sum(u["n"] for u in uploads)
        stage_fisher = {n: sum(u["fisher"][n] * (u["n"] / total) for u in uploads) for n in names}
        if "fisher" in memory:
            stage_fisher = {n: memory["fisher"][n] + stage_fisher[n] for n in names}
        memory["fisher"] = stage_fisher
        memory["anchor"] = {n: p.detach().clone() for n, p in global_model.named_parameters() if n in stage_fisher}


class FedLwF(IncrementalAlgorithm):
    """Fed-LwF: FedAvg whose local loss adds LwF distillation (Li & Hoiem, TPAMI 2017, Sec. 3)

        L_k = CE(z[:, :s_t], y) + lam T^2 KL( softmax(z^old[:, :o_t]/T) || softmax(z[:, :o_t]/T) ),

    batch mean, on the o_t old classes only; teacher z^old = the global model at the end of the
    previous stage (broadcast as ``teacher`` with every round, eval mode). No distillation at
    stage 0. T = 2 (as Li & Hoiem) and lam = 1 are our choices (STSA gives none); the T^2 factor
    keeps gradient scales comparable (Hinton et al. 2015).
    """

    name = "fedlwf"
    batched = LwFHooks

    def __init__(self, lam: float = 1.0, T: float = 2.0):
        check_positive("lam", lam, strict=False)
        check_real("T", T, low=0.0)
        self.lam, self.T = float(lam), float(T)

    def begin_stage(self, memory, t, num_old, num_seen, previous):
        super().begin_stage(memory, t, num_old, num_seen, previous)
        memory.pop("teacher", None)
        if previous is not None and num_old > 0:
            memory["teacher"] = {k: v.detach().clone() for k, v in previous.items()}

    def broadcast_extra(self, memory):
        extra = super().broadcast_extra(memory)
        if "teacher" in memory:
            extra["teacher"] = memory["teacher"]
        return extra

    def begin_local(self, local):
        teacher = local.broadcast.payload.get("teacher")
        local.scratch["teacher"] = teacher is not None and self.lam != 0
        if local.scratch["teacher"]:
            local.spare.load_state_dict(teacher)

    def local_loss(self, local, x, y, logits):
        if not local.scratch["teacher"]:
            return None
        o = local.broadcast["num_old"]
        with torch.no_grad():
            q = F.softmax(local.spare(x)[:, :o] / self.T, dim=1)
        log_p = F.log_softmax(logits[:, :o] / self.T, dim=1)
        return self.lam * self.T ** 2 * F.kl_div(log_p, q, reduction="batchmean")

METHODS: dict[str, type[IncrementalAlgorithm]] = {
    "finetune": Finetune,
    "fedewc": FedEWC,
    "fedlwf": FedLwF,
    "fedprox": IncrementalFedProx,
}


def make_method(name: str, **hparams) -> IncrementalAlgorithm:
    """``METHODS[name](**hparams)``; unknown name -> ValueError, unknown hyperparameter -> TypeError."""
    return build_from_registry(METHODS, name, "method", hparams)
