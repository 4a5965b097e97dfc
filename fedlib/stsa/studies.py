"""The STSA chapters' studies: the baselines compared with STSA (AFL stage-wise, the centralized Joint
ridge, feature skew), the benchmark's learner factory and runs, the derivation chapter's checks, Monte
Carlo studies and tables, the benchmark's grids and tables. Built on :mod:`fedlib.stsa.algorithm`.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from functools import partial
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from fedlib.afl.algorithm import UPLOAD_FORMS as AFL_UPLOAD_FORMS
from fedlib.afl.algorithm import OneSolveServer as AFLOneSolveServer
from fedlib.core import paths, uploads
from fedlib.core.cache import save_npz
from fedlib.core.linalg import (SufficientStats, as_tensor, lstsq_reference, relative_error, ridge_fit, ridge_solve,
                                synthetic_features)
from fedlib.core.messages import Cost
from fedlib.core.parallel import RunGrid
from fedlib.core.protocol import Broadcaster
from fedlib.core.validate import check_choice, check_int, check_positive
from fedlib.data.datasets import load_dataset
from fedlib.data.features import extract_features, feature_fingerprint
from fedlib.data.partition import make_partition
from fedlib.data.streams import make_stream
from fedlib.evaluation.stats import mean_std, paired_difference, plateau
from fedlib.federated.gradient import FedConfig, LinearHead
from fedlib.federated.incremental import IncrementalResult, run_class_incremental, scratch_backbone_features
from fedlib.federated.learner import GradientLearner
from fedlib.federated.models import SmallResNet, images_to_tensor
from fedlib.stsa import tables
from fedlib.stsa.algorithm import (K_MODES, VARIANTS, RandomFeatures, StageCallback, StagewiseLearner, STSAClient,
                                   STSALearner, STSAServer, class_coefficients, dummy_split, gram_estimate, predict,
                                   stsa_client, stsae_client)
from fedlib.stsa.speed import expanded_features


def gram_estimate_eq9(class_sums: Tensor, counts: Tensor, k_mode: str = "global") -> Tensor:
    """Eq. 9 exactly as printed: a Python loop over classes and (dummy) clients of outer products
    (terms with n_k = 0 skipped). The reference for :func:`gram_estimate` and the baseline of
    the speed benchmark. Shapes as in :func:`gram_estimate`."""
    class_sums = class_sums.to(torch.float64)
    counts = counts.to(class_sums)
    n_all, _, _ = class_coefficients(counts, k_mode, False)
    m = class_sums.shape[1]
    out = torch.zeros(m, m, dtype=torch.float64, device=class_sums.device)
    for i in range(counts.shape[1]):
        n = float(n_all[i])
        if n == 0:
            continue
        k = counts.shape[0] if k_mode == "global" else int((counts[:, i] > 0).sum())
        if k < 2:
            s = class_sums[:, :, i].sum(0)
            out += torch.outer(s, s) / n
            continue
        acc = torch.zeros(m, m, dtype=torch.float64, device=class_sums.device)
        for j in range(counts.shape[0]):
            if counts[j, i] > 0:
                acc += torch.outer(class_sums[j, :, i], class_sums[j, :, i]) / counts[j, i]
        s = class_sums[:, :, i].sum(0)
        out += (n - 1) / (k - 1) * acc - (n - k) / (n * (k - 1)) * torch.outer(s, s)
    return out


class AFLStageServer(AFLOneSolveServer):
    """AFL's one-solve server (AFL eqs. 56-57) with the stage broadcast of the STSA protocol: uploads
    of the stage's c_t classes on the M random features, with the broadcast gamma."""

    payload: dict = {}
    begin_stage, broadcast = Broadcaster.begin_stage, Broadcaster.broadcast

    def expects(self) -> uploads.Expected:
        gamma = float(self.payload["gamma"])
        forms = tuple({**form, "gamma": uploads.Number(low=gamma, high=gamma)} for form in AFL_UPLOAD_FORMS)
        return uploads.Expected(forms, {"d": self.payload["M"], "C": self.payload["num_classes"]}, what="AFL upload")


class AFLStagewiseLearner(StagewiseLearner):
    """AFL (Zhuang et al. 2024) run afresh at every stage on that stage's clients only: the AA law
    gives the joint ridge head of the *current* task's classes; the columns of earlier classes are
    kept as they were. Exemplar-free and exact per stage, but each task's head is fitted without
    the other tasks' data (no temporal aggregation), which is what STSA adds.

    Like for like with STSA: each of the K clients regularizes with gamma / K (broadcast), so the
    aggregated head W^r = (G_t + gamma I)^{-1} C_t carries the same total gamma as STSA's (AFL's own
    clients each add gamma, i.e. K gamma in total, eq. 14); no RI restoration."""

    def __init__(self, in_dim: int, num_classes: int, M: int, gamma: float, rf_seed: int = 0,
                 device: str | torch.device = "cpu", name: str = "afl_stagewise",
                 on_stage_end: Sequence[StageCallback] = ()):
        self.features = RandomFeatures(in_dim, M, rf_seed, device)
        self.gamma, self.name = float(gamma), name
        self.weights = torch.zeros(M, num_classes, dtype=torch.float64, device=device)
        self._init_protocol(STSAClient("afl", device=device), rf_seed, M, on_stage_end)

    def learn_task(self, t: int, clients, num_seen: int) -> Cost:
        server = AFLStageServer()
        cost = self._run_stage(server, t, clients, num_seen, gamma=self.gamma / len(clients))
        w_r, _ = server.result()   # W^r: ridge with K * gamma/K = gamma, no RI
        self.weights[:, num_seen - w_r.shape[1]:num_seen] = w_r
        self._stage_end(t)
        return cost

    def predict(self, x, num_seen: int) -> Tensor:
        return predict(self.weights[:, :num_seen], self.features(x))


class JointRidgeLearner:
    """The "Joint" upper bound: one centralized learner that holds all training data seen so far
    and fits ridge on it after every stage, W_t = argmin ||Phi W - Y||^2 + gamma ||W||^2 over the
    data of stages 1..t (same random features and gamma as STSA). No federation, no upload.

    ``solver="ridge"``: the pooled statistics and Cholesky solve of :mod:`fedlib.core.linalg`: the
    centralized Gram and cross-correlation of all data seen (each stage's pooled rows added once to the
    running sums, which equals recomputing them from all data seen; no client split) and
    ``ridge_solve``; ``solver="lstsq"``: numpy ``lstsq`` on the augmented system
    [Phi; sqrt(gamma) I] W = [Y; 0] over all data seen, which never forms a Gram matrix (independent
    of the statistics STSA aggregates; slower)."""

    SOLVERS = ("ridge", "lstsq")

    def __init__(self, in_dim: int, num_classes: int, M: int, gamma: float, rf_seed: int = 0, solver: str = "ridge",
                 device: str | torch.device = "cpu", name: str = "Joint (centralized ridge)"):
        check_positive("gamma", gamma, strict=False)
        check_choice("solver", solver, self.SOLVERS)
        self.features = RandomFeatures(in_dim, M, rf_seed, device)
        self.gamma, self.name, self.num_classes, self.solver = float(gamma), name, num_classes, solver
        self._x: list[np.ndarray] = []
        self._y: list[np.ndarray] = []
        self._stats = SufficientStats.zeros(M, num_classes)
        self.weights: Tensor | None = None
        self.cost = Cost()   # no upload (centralized); seconds of the fits

    def learn_task(self, t: int, clients, num_seen: int) -> Cost:
        start = time.perf_counter()
        phi = torch.cat([self.features(x).cpu() for x, _ in clients])      # the stage's pooled rows
        labels = np.concatenate([np.asarray(y) for _, y in clients])
        m = phi.shape[1]
        self._x.append(phi.numpy())   # all data seen (the lstsq solver's input; kept for inspection)
        self._y.append(labels)
        if self.solver == "ridge":
            self._stats += SufficientStats.from_data(phi, labels, self.num_classes)
            w = ridge_solve(self._stats.gram, self._stats.xty[:, :num_seen], self.gamma).cpu()
        else:
            w = lstsq_reference(np.concatenate(self._x), np.concatenate(self._y), num_seen, lam=self.gamma)
        self.weights = torch.zeros(m, self.num_classes, dtype=torch.float64)
        self.weights[:, :num_seen] = w
        stage = Cost(seconds=time.perf_counter() - start)
        self.cost += stage
        return stage

    def predict(self, x, num_seen: int) -> Tensor:
        return predict(self.weights[:, :num_seen], self.features(x).cpu())


def client_shifts(num_clients: int, dim: int, scale: float, feature_std, seed: int = 0) -> np.ndarray:
    """Feature skew: one shift per client, delta_k = scale * feature_std * z_k, z_k ~ N(0, I_d).

    feature_std (d,) is the per-dimension std of the backbone features, so ``scale`` is in units
    of the features' own spread. Returns (K, d) float64."""
    check_int("num_clients", num_clients, 1)
    check_positive("scale", scale, strict=False)
    std = np.broadcast_to(np.asarray(feature_std, dtype=np.float64), (dim,))
    return scale * std * np.random.default_rng(seed).standard_normal((num_clients, dim))


class FeatureSkewLearner:
    """Wraps a learner so that client k's backbone features arrive shifted by delta_k (feature
    skew: P_k(x | y) differs across clients, which the STSA-E unbiasedness argument excludes).

    ``shifts`` (K, d) from :func:`client_shifts`; every stage uses the same client shifts. The test
    set is shifted by the caller (e.g. each test sample by a random client's shift,
    :meth:`shift_test`); ``predict`` passes x through unchanged."""

    def __init__(self, learner, shifts: np.ndarray):
        self.learner, self.shifts = learner, np.asarray(shifts, dtype=np.float64)
        self.name = learner.name
        self.min_client_size = getattr(learner, "min_client_size", 1)

    @property
    def cost(self) -> Cost:
        return self.learner.cost

    def learn_task(self, t: int, clients, num_seen: int) -> Cost:
        if len(clients) != len(self.shifts):
            raise ValueError(f"FeatureSkewLearner has {len(self.shifts)} client shifts but the stage has "
                             f"{len(clients)} clients; make num_clients match")
        shifted = [(as_tensor(x) + torch.from_numpy(self.shifts[k]), y) for k, (x, y) in enumerate(clients)]
        return self.learner.learn_task(t, shifted, num_seen)

    def predict(self, x, num_seen: int) -> Tensor:
        return self.learner.predict(x, num_seen)

    def shift_test(self, x, seed: int = 0) -> np.ndarray:
        """x (N, d) with each row shifted by a uniformly drawn client's delta (the clients' mixture)."""
        who = np.random.default_rng(seed).integers(0, len(self.shifts), len(x))
        return np.asarray(x, dtype=np.float64) + self.shifts[who]


# ----------------------------------------------------------------------------------------------
# communication (Sec. 4.4 / Table 5)
# ----------------------------------------------------------------------------------------------
def upload_floats(variant: str, M: int, c_t: int, num_dummy: int = 1) -> int:
    """Numbers one client uploads per stage: STSA (M + c_t) M; STSA-E (M + 1) c_t K_D (n as one row)."""
    check_choice("variant", variant, VARIANTS)
    return (M + c_t) * M if variant == "stsa" else (M + 1) * c_t * num_dummy


def communication_mib(variant: str, M: int, c_t: int, num_tasks: int = 10, num_dummy: int = 1,
                      bytes_per_float: int = 4) -> float:
    """Per-client upload over all T stages in MiB (the paper's "MB": float32, 2^20 bytes, stage 1
    included, full M x M Gram): reproduces Table 5's 955.6 / 95.4 / 60.1 / 4.77."""
    return num_tasks * upload_floats(variant, M, c_t, num_dummy) * bytes_per_float / 2**20


# ----------------------------------------------------------------------------------------------
# the benchmark's learner factory and one FCIL run (notebooks/stsa_benchmark.py)
# ----------------------------------------------------------------------------------------------
ANALYTIC = ("STSA", "STSA-E", "STSA-E (per-class K)", "AFL (stage-wise)")
JOINT = "Joint (centralized ridge)"


def make_fcil_learner(method: str, dim: int | None, num_classes: int, M: int | None, gamma: float, seed: int, *,
                      num_dummy: int = 1, head: str = "argmax", fed_kwargs: dict | None = None,
                      baseline_hparams: dict | None = None, model_fn=None, eval_data=None, **kw):
    """The learner named ``method``: one of :data:`ANALYTIC`, :data:`JOINT` (random features of width
    M on d-dim features, R and the dummy splits seeded by ``seed``), or a gradient baseline of
    :data:`fedlib.federated.fcil.METHODS` (a :class:`fedlib.federated.learner.GradientLearner`) trained with
    ``FedConfig(seed=seed, **fed_kwargs)`` on
    ``model_fn()`` (default: a linear head d -> num_classes) with ``baseline_hparams[method]``
    (``eval_data``: the learner's per-round test data of a stage, ``t -> (x, y) | None``)."""
    if method == "STSA":
        return STSALearner(dim, num_classes, M, gamma, head=head, rf_seed=seed, seed=seed, name=method, **kw)
    if method in ("STSA-E", "STSA-E (per-class K)"):
        k_mode = "global" if method == "STSA-E" else "per_class"
        return STSALearner(dim, num_classes, M, gamma, variant="stsa_e", num_dummy=num_dummy, k_mode=k_mode,
                           head=head, rf_seed=seed, seed=seed, name=method, **kw)
    if method == "AFL (stage-wise)":
        return AFLStagewiseLearner(dim, num_classes, M, gamma, rf_seed=seed, name=method)
    if method == JOINT:
        return JointRidgeLearner(dim, num_classes, M, gamma, rf_seed=seed, name=method)

    model_fn = model_fn or partial(LinearHead, dim, num_classes)
    return GradientLearner(model_fn, FedConfig(seed=seed, **(fed_kwargs or {})), method, num_classes=num_classes,
                           progress=False, eval_data=eval_data, **(baseline_hparams or {}).get(method, {}))


def run_fcil(method: str, features, beta: float | None, seed: int, setting: str, M: int | None, *, num_tasks: int,
             num_clients: int, gamma: float, num_dummy: int = 1, stream=None, skew: float = 0.0,
             return_learner: bool = False, share_expansion: bool = True, final_only: bool = False,
             last_task_curve: bool = False, **kw):
    """One class-incremental run of ``method`` on cached ``features`` (a :class:`fedlib.data.features.Features`):
    class order and partitions from ``seed`` (``stream`` overrides the order), every client holding
    >= ``num_dummy`` samples per task. ``skew`` > 0 shifts client k's features by its own delta_k
    (feature skew, :func:`client_shifts`) and the test features by a random client's shift.
    Other keywords go to :func:`make_fcil_learner`. Returns the
    :class:`fedlib.federated.incremental.IncrementalResult` (and the learner if ``return_learner``).

    ``share_expansion`` (analytic methods and Joint, no skew, M != d): the random-feature rows come from
    :func:`expanded_features` (computed once per features, seed and M) and the learner runs on them
    with R the identity; each stage's ``wall_s`` then adds the measured expansion seconds per row
    times the stage's training rows, the clients' share of that work. Equal to the per-client
    expansion (``share_expansion=False``) up to float round-off. ``final_only``: evaluate after the last
    stage only (A_T; A_avg and F_T are NaN), and STSA / STSA-E solve for the head once, at the end.

    ``last_task_curve`` (gradient baselines, no skew): the learner also measures its test accuracy (%) on
    the test samples of every class seen after each round of the last task, and the call returns
    ``(result, curve)`` (``(result, learner, curve)`` with ``return_learner``): the curve the
    convergence rule reads. Its last point is the run's final accuracy on all seen test samples,
    ``100 * result.top1[-1]`` (A_T when the tasks' test sets are equally large). Evaluation does not
    touch training: the result is that of the run without the curve."""
    if last_task_curve and (method in ANALYTIC + (JOINT,) or skew > 0):
        raise ValueError(f"last_task_curve: only a gradient baseline without feature skew has per-round "
                         f"curves (got {method!r}, skew={skew})")
    default_stream = stream is None
    stream = stream or make_stream(features.y_train, features.y_test, num_tasks, seed=seed)
    if last_task_curve:   # evaluated every round of the last stage only, on all seen classes (all of them then)
        seen = np.concatenate([task.test_idx for task in stream.tasks])
        last_test = (torch.from_numpy(np.ascontiguousarray(features.x_test[seen])),
                     torch.from_numpy(stream.relabel(features.y_test)[seen]))
        kw = {**kw, "fed_kwargs": {**(kw.get("fed_kwargs") or {}), "eval_every": 1},
              "eval_data": lambda t: last_test if t == stream.num_tasks - 1 else None}
    dim = features.x_train.shape[1]
    per_row = None
    shared = share_expansion and M is not None and M != dim and method in ANALYTIC + (JOINT,)
    if shared and skew == 0:
        features, per_row = expanded_features(features, seed, M)
        dim = M
    elif shared and default_stream and beta is not None:
        # feature skew: every training row moved by its client's delta_k (the partition of this seed and
        # beta), the test rows by a random client's, exactly as FeatureSkewLearner and shift_test move them
        shifts = client_shifts(num_clients, dim, skew, features.x_train.std(0), seed=seed)
        owner = np.full(len(features.y_train), -1, dtype=np.int64)
        for t in range(stream.num_tasks):
            for k, part in enumerate(stream.client_partitions(t, features.y_train, num_clients, beta, seed,
                                                              num_dummy)):
                owner[part] = k
        assert (owner >= 0).all(), "every training row belongs to one client of one task"
        who = np.random.default_rng(seed).integers(0, num_clients, len(features.x_test))
        key = ("skew", float(skew), float(beta), int(num_clients), int(num_dummy), int(num_tasks))
        features, per_row = expanded_features(features, seed, M, (key, shifts[owner], shifts[who]))
        dim, skew = M, 0.0
    if final_only and method in ("STSA", "STSA-E", "STSA-E (per-class K)"):
        kw = {"solve_every_stage": False, **kw}
    learner = make_fcil_learner(method, dim, len(features.classes), M, gamma, seed, num_dummy=num_dummy, **kw)
    x_test = features.x_test
    if skew > 0:
        learner = FeatureSkewLearner(learner, client_shifts(num_clients, dim, skew, features.x_train.std(0), seed=seed))
        x_test = learner.shift_test(features.x_test, seed=seed)
    res = run_class_incremental(learner, stream, features.x_train, features.y_train, x_test, features.y_test,
                                num_clients, beta, seed, config={"setting": setting, "beta": beta, "seed": seed},
                                progress=False, min_size=num_dummy,
                                evaluate="last_stage" if final_only else "every_stage")
    if per_row is not None:
        res.wall_s = res.wall_s + per_row * np.array([len(task.train_idx) for task in stream.tasks])
    if last_task_curve:
        curve = [100 * a for a in learner.histories[-1].test_acc]
        learner.eval_data = None   # a closure over the test data, done with: the learner pickles (forked runs)
        return (res, learner, curve) if return_learner else (res, curve)
    return (res, learner) if return_learner else res


# ----------------------------------------------------------------------------------------------
# Monte Carlo studies of the derivation chapter (notebooks/stsa_derivation.py)
# ----------------------------------------------------------------------------------------------
def design_monte_carlo(x: Tensor, counts, k_mode: str, reps: int, rng: np.random.Generator):
    """Design-based Monte Carlo of eq. 9: ``reps`` random assignments of x's rows (n, M) to clients
    of sizes ``counts`` (K,). Returns ``(errors, mean)``: a DataFrame of the relative Frobenius error
    of the running mean of G_hat against G = x^T x at ~12 checkpoints, and the mean G_hat (M, M)."""
    cuts = np.cumsum(counts)[:-1]
    n_t = torch.tensor(counts, dtype=torch.float64)[:, None]
    total = torch.zeros(x.shape[1], x.shape[1], dtype=torch.float64)
    errors, g = [], x.T @ x
    checkpoints = set(np.unique(np.geomspace(10, reps, 12).astype(int)).tolist())
    for r in range(1, reps + 1):
        groups = np.split(rng.permutation(len(x)), cuts)
        total += gram_estimate(torch.stack([x[gr].sum(0) for gr in groups])[:, :, None], n_t, k_mode)
        if r in checkpoints:
            errors.append({"repetitions": r, "rel. error of the mean": float((total / r - g).norm() / g.norm())})
    return pd.DataFrame(errors), total / reps


def plugin_errors(n: int, clients: int, rep: int, dim: int = 20, num_classes: int = 5, gamma: float = 1.0) -> dict:
    """One draw of the Thm. 3.3 study: n Gaussian samples (dim features, class-shifted means) over
    ``clients`` STSA-E clients; the per-sample RMS and (1/n) plug-in errors of the STSA-E head
    ||X(W_E - W*)|| (eq. 10 vs eq. 7) and the oracle error (1/n)||X W* - Y||."""
    xr, yr = synthetic_features(n, dim, num_classes, kind="gaussian", seed=100 * rep + n + 7 * clients)
    xr = xr + np.eye(num_classes)[yr] @ np.random.default_rng(rep).standard_normal((num_classes, dim))
    parts = np.array_split(np.random.default_rng(rep).permutation(n), clients)
    rf = RandomFeatures(dim, dim)
    msgs = [stsae_client(xr[p], yr[p], num_classes, rf) for p in parts]
    g_hat = gram_estimate(torch.cat([m["C"] for m in msgs]), torch.cat([m["n"] for m in msgs]), "per_class")
    st = SufficientStats.from_data(xr, yr, num_classes)
    w_e, w_o = ridge_solve(g_hat, st.xty, gamma), ridge_solve(st.gram, st.xty, gamma)
    xt = torch.from_numpy(xr)
    plug = float((xt @ (w_e - w_o)).norm())
    return {"n": n, "K K_D": clients, "plug-in, per sample ||X(W_E - W*)||/sqrt(n)": plug / np.sqrt(n),
            "plug-in (1/n)||X(W_E - W*)||": plug / n,
            "oracle (1/n)||XW* - Y||": float((xt @ w_o - torch.eye(num_classes, dtype=torch.float64)[yr]).norm()) / n}


def pairwise_masked(tensors: Sequence[Tensor], rng: np.random.Generator, scale: float = 1e3) -> list[Tensor]:
    """Secure aggregation by pairwise additive masks: client i adds sum_{j>i} R_ij - sum_{j<i} R_ji
    (R ~ scale * N(0, 1), same shape as the tensors); the masks cancel in the sum over clients."""
    k = len(tensors)
    shape = tuple(tensors[0].shape)
    masks = [[torch.from_numpy(rng.standard_normal(shape)) * scale for _ in range(k)] for _ in range(k)]
    return [t + sum(masks[i][j] for j in range(i + 1, k)) - sum(masks[j][i] for j in range(i))
            for i, t in enumerate(tensors)]


def feature_skew_scatter_ratio(x: np.ndarray, features: RandomFeatures, sizes, shifts: np.ndarray, reps: int,
                               rng: np.random.Generator) -> tuple[float, float]:
    """Eq. 9 under feature skew, design-based Monte Carlo: ``reps`` random assignments of one class's
    rows x (n, d) to K clients of ``sizes`` (K,), client k's rows shifted by ``shifts[k]`` (d,) and
    mapped by ``features``; G_hat with the per-class K. Returns ``(ratio, standard error)``:
    ratio = E[tr(G_hat - n m m^T)] / E[tr S] (1 = unbiased scatter), its delta-method std. error."""
    sizes = np.asarray(sizes)
    counts = torch.tensor(sizes, dtype=torch.float64)[:, None]
    est, true = [], []
    for _ in range(reps):
        phi = features(x[rng.permutation(len(x))] + np.repeat(shifts, sizes, axis=0))
        sums = torch.stack([g.sum(0) for g in torch.split(phi, sizes.tolist())])[:, :, None]
        mean = phi.mean(0)
        est.append(float(torch.trace(gram_estimate(sums, counts, "per_class"))) - len(phi) * float(mean @ mean))
        true.append(float(((phi - mean) ** 2).sum()))
    est, true = np.array(est), np.array(true)
    ratio = est.mean() / true.mean()
    return ratio, np.std(est - ratio * true, ddof=1) / np.sqrt(reps) / true.mean()


def gram_error_law(n: int, k: int, sigma: np.ndarray) -> float:
    """Exact E||G_hat - G||_F^2 of eq. 9 for one class of n Gaussian samples (covariance sigma (d, d))
    over k >= 2 non-empty clients (the exact law that Prop. 3.2 bounds; our derivation):
    (n-k)/(k-1) [(n-k) tr S^2 + (n-1)(tr S)^2] + (n-k) tr S^2."""
    check_int("k", k, 2)
    tr1, tr2 = float(np.trace(sigma)), float(np.trace(sigma @ sigma))
    return (n - k) / (k - 1) * ((n - k) * tr2 + (n - 1) * tr1 ** 2) + (n - k) * tr2


def gram_error_monte_carlo(mu: np.ndarray, sigma: np.ndarray, n: int, k: int, reps: int,
                           rng: np.random.Generator) -> tuple[float, float]:
    """E||G_hat - G||_F^2 by Monte Carlo: ``reps`` draws of n samples N(mu, sigma) split evenly
    (contiguously) over k clients. Returns ``(mean, standard error)`` (population std / sqrt(reps))."""
    sizes = np.array_split(np.arange(n), k)
    counts = torch.tensor([len(s) for s in sizes], dtype=torch.float64)[:, None]
    errs = []
    for _ in range(reps):
        x = torch.from_numpy(rng.multivariate_normal(mu, sigma, n))
        sums = torch.stack([x[s].sum(0) for s in sizes])[:, :, None]
        errs.append(float(((gram_estimate(sums, counts) - x.T @ x) ** 2).sum()))
    return float(np.mean(errs)), float(np.std(errs) / np.sqrt(reps))


def centred_scatter_sq_norm_monte_carlo(sigma: np.ndarray, n: int, reps: int, rng: np.random.Generator) -> float:
    """E||M||_F^2 of the centred scatter M = X^T X - s s^T / n of n samples N(0, sigma) (sigma (d, d)),
    by ``reps`` Monte Carlo draws: the quantity of the paper's Lemma 3.5 (Wishart: (n-1)[n tr S^2 + (tr S)^2])."""
    values = []
    for _ in range(reps):
        x = rng.multivariate_normal(np.zeros(len(sigma)), sigma, n)
        s = x.sum(0)
        values.append(((x.T @ x - np.outer(s, s) / n) ** 2).sum())
    return float(np.mean(values))


def scatter_traces(n: int, k: int, reps: int, rng: np.random.Generator, dim: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """``reps`` draws of n standard Gaussian samples (dim features) split into k equal contiguous clients:
    the traces of the between-client scatter B = sum_k n_k (m_k - m)(m_k - m)^T and of the total scatter
    S = sum_x (x - m)(x - m)^T, each (reps,). B ~ Wishart(K-1) is independent of S - B, not of S."""
    check_int("k", k, 1)
    if n % k:
        raise ValueError(f"n = {n} must be a multiple of k = {k} (equal clients)")
    tb, ts = np.empty(reps), np.empty(reps)
    for r in range(reps):
        x = rng.standard_normal((n, dim))
        m = x.mean(0)
        tb[r] = n // k * ((x.reshape(k, n // k, dim).mean(1) - m) ** 2).sum()
        ts[r] = ((x - m) ** 2).sum()
    return tb, ts


# ----------------------------------------------------------------------------------------------
# the derivation chapter's checks (notebooks/stsa_derivation.py): each returns what the chapter shows
# ----------------------------------------------------------------------------------------------
def closed_form_checks(phi: Tensor, labels: np.ndarray, num_classes: int, gamma: float) -> dict:
    """Eq. 7 solves eq. 6: the ridge head from the pooled statistics of ``phi`` (N, M), checked by its
    gradient and against scikit-learn's ``Ridge``. Returns ``{"stats", "w_star" (M, C), "kappa" (the
    condition number of G + gamma I), "tol_w" (100 eps kappa, the "same head" tolerance), "checks"}``."""
    from sklearn.linear_model import Ridge

    stats = SufficientStats.from_data(phi, labels, num_classes)
    w_star = ridge_solve(stats.gram, stats.xty, gamma)
    eigs = torch.linalg.eigvalsh(stats.gram)
    kappa = float(eigs[-1] / (eigs[0].clamp_min(0) + gamma))
    grad = 2 * (stats.gram @ w_star - stats.xty + gamma * w_star)
    sk = Ridge(alpha=gamma, fit_intercept=False, solver="cholesky").fit(phi.numpy(), np.eye(num_classes)[labels])
    checks = {"max |gradient| / max |X^T Y|": float(grad.abs().max() / stats.xty.abs().max()),
              "max |W - W_sklearn| / max |W|": float(np.abs(w_star.numpy() - sk.coef_.T).max() / w_star.abs().max())}
    return {"stats": stats, "w_star": w_star, "kappa": kappa, "tol_w": 100 * torch.finfo(torch.float64).eps * kappa,
            "checks": checks}


def spatial_check(x: np.ndarray, labels: np.ndarray, num_classes: int, features: RandomFeatures, betas, client_counts,
                  seed: int, stats: SufficientStats, w_star: Tensor, phi_test: Tensor, gamma: float):
    """Spatial aggregation (eqs. 2-3): for every Dirichlet beta of ``betas`` (None: IID) and K of
    ``client_counts``, the summed uploads of :func:`stsa_client` against the centralized ``stats``, the
    head against ``w_star`` (M, C) and its test predictions on ``phi_test`` (N', M). One row per case."""
    pred_central = (phi_test @ w_star).argmax(1)
    rows = []
    for beta in betas:
        for k in client_counts:
            parts = make_partition(labels, k, "iid", seed=seed) if beta is None else \
                make_partition(labels, k, "dirichlet", alpha=beta, seed=seed)
            msgs = [stsa_client(x[p], labels[p], num_classes, features) for p in parts if len(p)]
            g = sum(m["G"] for m in msgs)
            c = sum(m["C"] for m in msgs)
            w = ridge_solve(g, c, gamma)
            rows.append({"beta": "IID" if beta is None else beta, "K": k,
                         "rel. err. sum G_k": float((g - stats.gram).abs().max() / stats.gram.abs().max()),
                         "rel. err. sum C_k": float((c - stats.xty).abs().max() / stats.xty.abs().max()),
                         "rel. err. W": relative_error(w, w_star),
                         "same predictions": bool(((phi_test @ w).argmax(1) == pred_central).all())})
    return pd.DataFrame(rows)


def temporal_check(heads: Sequence[Tensor], stream, phi: Tensor, pos: np.ndarray, gamma: float):
    """Temporal aggregation (eqs. 4-5, 8): the head after stage t (``heads[t]``) against joint ridge on
    every training sample of tasks 0..t (``phi`` (N, M), stream positions ``pos`` (N,)). One row per stage."""
    rows = []
    for t, w_t in enumerate(heads):
        idx = np.concatenate([stream.tasks[i].train_idx for i in range(t + 1)])
        w_joint = ridge_fit(phi[idx], pos[idx], stream.num_seen(t), lam=gamma)
        rows.append({"stage": t + 1, "classes seen": stream.num_seen(t), "samples seen": len(idx),
                     "rel. err. vs joint ridge": relative_error(w_t, w_joint)})
    return pd.DataFrame(rows)


def order_and_split_errors(stream, x: np.ndarray, pos: np.ndarray, features: RandomFeatures, M: int,
                           num_classes: int, gamma: float, reference: Tensor) -> tuple[float, float]:
    """The statistics commute and split: one client per stage, the stages received in reverse order,
    and every stage cut into two sub-stages. Returns both final heads' relative errors against
    ``reference`` (M, C)."""
    server_rev, server_split = STSAServer(M, num_classes, gamma), STSAServer(M, num_classes, gamma)
    for t in reversed(range(len(stream.tasks))):
        task = stream.tasks[t]
        server_rev.receive_stage([stsa_client(x[task.train_idx], pos[task.train_idx] - task.offset,
                                              task.num_classes, features)], task.offset, task.num_classes)
    for task in stream.tasks:
        for half in np.array_split(task.train_idx, 2):
            server_split.receive_stage([stsa_client(x[half], pos[half] - task.offset, task.num_classes, features)],
                                       task.offset, task.num_classes)
    return (relative_error(server_rev.solve(num_classes), reference),
            relative_error(server_split.solve(num_classes), reference))


def eq9_identity_checks(xc: Tensor, counts) -> tuple[float, float]:
    """Eq. 9 on one class's rows xc (n, M): the printed form against the PSD form for clients of sizes
    ``counts`` (contiguous rows), and the estimate with one sample per client (K = n) against
    G = xc^T xc. Returns both relative errors (0 up to round-off)."""
    ends = np.cumsum(counts)
    sums = torch.stack([xc[a:b].sum(0) for a, b in zip(np.r_[0, ends[:-1]], ends)])
    n_fixed = torch.tensor(counts, dtype=torch.float64)[:, None]
    identity = relative_error(gram_estimate(sums[:, :, None], n_fixed), gram_estimate_eq9(sums[:, :, None], n_fixed))
    exact = relative_error(gram_estimate(xc[:, :, None], torch.ones(len(xc), 1, dtype=torch.float64)), xc.T @ xc)
    return identity, exact


def dummy_client_bias(phi: Tensor, labels: np.ndarray, parts: Sequence[np.ndarray], dummy_counts, reps: int,
                      rng: np.random.Generator):
    """Eq. 9 with empty (dummy) clients, class 0: for each K_D of ``dummy_counts``, class-0 counts of
    the K x K_D dummy clients of one :func:`dummy_split` per client of ``parts``, then the design-based
    expectation (:func:`design_monte_carlo`, ``reps`` repetitions) for both k_modes. One row per
    (K_D, k_mode): K, K_i and the covariance ratio tr(E[G_hat] - n m m^T) / tr S (1 = unbiased)."""
    xs = phi[labels == 0]
    m0 = xs.mean(0)
    mean_term = len(xs) * torch.outer(m0, m0)
    scatter = xs.T @ xs - mean_term
    rows = []
    for kd in dummy_counts:
        counts0 = np.concatenate([[int((labels[p][ch] == 0).sum()) for ch in dummy_split(labels[p], kd, seed=k)]
                                  for k, p in enumerate(parts)])
        for mode in K_MODES:
            _, mean_ghat = design_monte_carlo(xs, counts0, mode, reps, rng)
            rows.append({"K_D": kd, f"K = {len(parts)} K_D": len(parts) * kd,
                         "K_i (holding class 0)": int((counts0 > 0).sum()), "k_mode": mode,
                         "covariance ratio": float(torch.trace(mean_ghat - mean_term) / torch.trace(scatter))})
    return pd.DataFrame(rows)


def feature_skew_study(x: np.ndarray, labels: np.ndarray, features: RandomFeatures, scales, num_clients: int,
                       seed: int, reps: int, rng: np.random.Generator):
    """Eq. 9 under feature skew, class 0 split evenly over ``num_clients`` clients whose rows carry
    :func:`client_shifts` of each scale (units of x's per-dimension std): one row per scale with the
    ratio E[tr(G_hat - n m m^T)] / E[tr S] and its Monte Carlo std. error
    (:func:`feature_skew_scatter_ratio`, ``reps`` repetitions)."""
    x0 = x[labels == 0]
    feat_std = x.std(0)
    sizes = np.diff(np.linspace(0, len(x0), num_clients + 1).astype(int))
    rows = []
    for scale in scales:
        shifts = client_shifts(num_clients, x.shape[1], scale, feat_std, seed=seed)
        ratio, se = feature_skew_scatter_ratio(x0, features, sizes, shifts, reps, rng)
        rows.append({"shift scale s": scale, "covariance ratio E[tr(G_hat - n m m^T)] / E[tr S]": ratio,
                     "MC std. error": se})
    return pd.DataFrame(rows)


def feature_skew_accuracy(x: np.ndarray, labels: np.ndarray, x_test: np.ndarray, y_test: np.ndarray, num_tasks: int,
                          num_classes: int, M: int, gamma: float, seeds, scale: float, num_dummy: int,
                          num_clients: int = 5, beta: float = 0.5):
    """A_T (%) of STSA and STSA-E (per-class K, ``num_dummy`` dummy clients) on the full protocol, with
    label skew only (scale 0) and with :func:`client_shifts` of ``scale`` (:class:`FeatureSkewLearner`;
    the test samples carry a random client's shift). Returns a table: one row per seed, columns
    (shift scale, method); runs of one seed pair (same data, class order, partition and shifts)."""
    feat_std = x.std(0)
    rows = []
    for sd in seeds:
        stream = make_stream(labels, y_test, num_tasks, seed=sd)
        for sc in [0.0, scale]:
            shifts = client_shifts(num_clients, x.shape[1], sc, feat_std, seed=sd)
            for label, kw in [("STSA", {}),
                              ("STSA-E", dict(variant="stsa_e", num_dummy=num_dummy, k_mode="per_class"))]:
                lrn = FeatureSkewLearner(STSALearner(x.shape[1], num_classes, M, gamma, rf_seed=sd, seed=sd, name=label,
                                                     **kw), shifts)
                res = run_class_incremental(lrn, stream, x, labels, lrn.shift_test(x_test, seed=sd), y_test,
                                            num_clients, beta, seed=sd, progress=False, min_size=num_dummy)
                rows.append({"seed": sd, "shift scale": sc, "method": label, "A_T": 100 * res.metrics["A_T"]})
    return pd.DataFrame(rows).pivot_table(index="seed", columns=["shift scale", "method"], values="A_T")


def gram_error_table(mu: np.ndarray, sigma: np.ndarray, n: int, client_counts, reps: int, rng: np.random.Generator):
    """Prop. 3.2 against the exact law: for each K of ``client_counts``, E||G_hat - G||_F^2 by Monte
    Carlo (:func:`gram_error_monte_carlo`), its std. error, :func:`gram_error_law` and the paper's
    bound shape ((K+1)/(K-1))^2, also scaled to the Monte Carlo value at the first K."""
    rows = []
    for k in client_counts:
        mc_mean, mc_se = gram_error_monte_carlo(mu, sigma, n, k, reps, rng)
        rows.append({"K": k, "Monte Carlo": mc_mean, "MC std. error": mc_se, "exact law": gram_error_law(n, k, sigma),
                     "paper shape ((K+1)/(K-1))^2": ((k + 1) / (k - 1)) ** 2})
    law = pd.DataFrame(rows)
    law["paper shape (scaled at K=2)"] = law["paper shape ((K+1)/(K-1))^2"] * law["Monte Carlo"].iloc[0] / law[
        "paper shape ((K+1)/(K-1))^2"].iloc[0]
    return law


def lemma_3_5_check(sigma: np.ndarray, n: int, reps: int, rng: np.random.Generator) -> dict:
    """Lemma 3.5: E||M||_F^2 of the centred scatter of n samples N(0, sigma) by Monte Carlo, the
    Wishart value (n-1)[n tr S^2 + (tr S)^2] and the paper's ((n-1)/n)(tr S)^2."""
    tr1, tr2 = np.trace(sigma), np.trace(sigma @ sigma)
    return {"Monte Carlo": centred_scatter_sq_norm_monte_carlo(sigma, n, reps, rng),
            "Wishart (n-1)[n tr S^2 + (tr S)^2]": (n - 1) * (n * tr2 + tr1 ** 2),
            "paper's Lemma 3.5 ((n-1)/n)(tr S)^2": (n - 1) / n * tr1 ** 2}


def scatter_correlations(n: int, k: int, reps: int, rng: np.random.Generator) -> dict:
    """Correlations of tr B with tr(S - B) (0: independent) and with tr S (Wishart:
    sqrt((K-1)/(n-1))) over ``reps`` draws of :func:`scatter_traces`, and that Wishart value."""
    tb, ts = scatter_traces(n, k, reps, rng)
    return {"corr(tr B, tr(S - B))": np.corrcoef(tb, ts - tb)[0, 1], "corr(tr B, tr S)": np.corrcoef(tb, ts)[0, 1],
            "sqrt((K-1)/(n-1)) (Wishart)": np.sqrt((k - 1) / (n - 1))}


def plugin_rate_study(sizes, clients, n_fixed: int, reps: int, num_clients: int = 5):
    """Thm. 3.3: means over ``reps`` draws of :func:`plugin_errors`, against n (``sizes``, K K_D =
    ``num_clients``) and against K K_D (``clients``, n = ``n_fixed``), with fitted log-log slopes.
    Returns ``(rate by n, rate by K K_D, {error: slope in n}, slope of the per-sample error in K K_D)``."""
    per_sample = "plug-in, per sample ||X(W_E - W*)||/sqrt(n)"
    rate = pd.DataFrame([plugin_errors(n, num_clients, r) for n in sizes for r in range(reps)]).groupby("n").mean()
    rate_k = pd.DataFrame([plugin_errors(n_fixed, k, r) for k in clients for r in range(reps)]).groupby("K K_D").mean()
    slopes = {c: np.polyfit(np.log(rate.index), np.log(rate[c]), 1)[0] for c in rate.columns if c != "K K_D"}
    return rate, rate_k, slopes, np.polyfit(np.log(rate_k.index), np.log(rate_k[per_sample]), 1)[0]


def gram_estimate_rank(x: np.ndarray, labels: np.ndarray, parts, num_classes: int, features: RandomFeatures,
                       num_dummy: int = 2) -> dict:
    """Rank of STSA-E's G_hat (M, M) from ``num_dummy`` dummy clients per client of ``parts``, against
    its bound sum_i K_i (the non-empty (client, class) cells), and its extreme eigenvalues."""
    msgs = [stsae_client(x[p], labels[p], num_classes, features, num_dummy=num_dummy, seed=k)
            for k, p in enumerate(parts)]
    cnts = torch.cat([m["n"] for m in msgs])
    g_hat = gram_estimate(torch.cat([m["C"] for m in msgs]), cnts)
    eig = torch.linalg.eigvalsh(g_hat)
    return {"rank": int((eig > eig.max() * g_hat.shape[0] * torch.finfo(torch.float64).eps).sum()),
            "bound": int((cnts > 0).sum()), "lambda_min": float(eig[0]), "lambda_max": float(eig[-1])}


def secure_aggregation_check(x: np.ndarray, labels: np.ndarray, parts, num_classes: int, features: RandomFeatures,
                             rng: np.random.Generator) -> tuple[float, float]:
    """Pairwise masks (:func:`pairwise_masked`) on the uploads of the clients of ``parts``: relative
    error of the sum of masked G_k against the sum of G_k (STSA: 0), and of STSA-E's G_hat from masked
    class sums against G_hat from the true ones (large: eq. 9 is not a sum of the uploads)."""
    msgs = [stsa_client(x[p], labels[p], num_classes, features) for p in parts]
    g_masked = pairwise_masked([m["G"] for m in msgs], rng)
    msgs_e = [stsae_client(x[p], labels[p], num_classes, features, num_dummy=1) for p in parts]
    sums, cnts = torch.cat([m["C"] for m in msgs_e]), torch.cat([m["n"] for m in msgs_e])
    sums_masked = torch.stack(pairwise_masked(list(sums), rng))
    return (relative_error(sum(g_masked), sum(m["G"] for m in msgs)),
            relative_error(gram_estimate(sums_masked, cnts), gram_estimate(sums, cnts)))


def communication_table(table5, rng: np.random.Generator):
    """Table 5: per-client upload over T = 10 stages for the paper's two settings, from the formula
    (:func:`communication_mib`) and from real float32 messages (one stage of 60 random samples, 10
    classes, times 10), beside the paper's numbers (``table5``). One row per (setting, method)."""
    rows = []
    for label, m_, kd in [("ResNet18, CIFAR-100", 5000, 50), ("ViT-B/16, CIFAR-100", 1250, 10)]:
        xs, ys = rng.standard_normal((60, 8)), np.repeat(np.arange(10), 6)
        rf_m = RandomFeatures(8, m_, seed=0)
        meas_stsa = stsa_client(xs, ys, 10, rf_m, upload_dtype=torch.float32).nbytes * 10 / 2**20
        meas_e = stsae_client(xs, ys, 10, rf_m, num_dummy=kd, upload_dtype=torch.float32).nbytes * 10 / 2**20
        for method, formula, measured in [("STSA", communication_mib("stsa", m_, 10), meas_stsa),
                                          ("STSA-E", communication_mib("stsa_e", m_, 10, num_dummy=kd), meas_e)]:
            paper = table5.xs(method, level="method")["communication (MB)"]
            paper = paper[[label.split(",")[0].replace("-", "") in s.replace("-", "") for s in paper.index]].iloc[0]
            rows.append({"setting": f"{label}, M={m_}, K_D={kd}", "method": method, "paper (MB)": paper,
                         "formula (MiB)": round(formula, 2), "measured messages (MiB)": round(measured, 2)})
    return pd.DataFrame(rows)


def communication_curve(M_values, num_dummy: int = 50, num_classes: int = 10):
    """Fig. 7: MiB per client over T = 10 stages of STSA and STSA-E (``num_dummy``) for each M."""
    return pd.DataFrame([{"M": m_, "method": meth, "MiB per client (T=10)": communication_mib(v, m_, num_classes,
                                                                                       num_dummy=num_dummy)}
                   for m_ in M_values for meth, v in [("STSA", "stsa"), (f"STSA-E (K_D={num_dummy})", "stsa_e")]])


def recomputed_margins():
    """The paper's quoted margins (``tables.stsa_claims``) beside the min / max recomputed from its
    own tables (``tables.stsa_claim_values``)."""
    rows = []
    for _, row in tables.stsa_claims().iterrows():
        values = tables.stsa_claim_values(row)
        rows.append({"claim": row["claim"], "quoted": row["quoted value"],
                     "recomputed (min)": round(float(np.min(values)), 2),
                     "recomputed (max)": round(float(np.max(values)), 2)})
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------------------------
# the benchmark chapter's grids and tables (notebooks/stsa_benchmark.py)
# ----------------------------------------------------------------------------------------------
def benchmark_images(name: str, subsets: dict, n_train: int | None, n_test: int | None):
    """Dataset ``name``: its ``subsets[name]`` = [n_train, n_test] stratified subset (when given), then
    at most ``n_train`` / ``n_test`` of those: the one draw of the benchmark's images and features."""
    ds = load_dataset(name)
    n_tr, n_te = subsets.get(name, [None, None])
    return (ds.subset(n_tr, n_te) if (n_tr or n_te) else ds).at_most(n_train, n_test)


def benchmark_data(names: Sequence[str], subsets: dict, n_train: int | None, n_test: int | None,
                   num_tasks: int) -> dict:
    """``{name: Dataset}`` of :func:`benchmark_images`; checks that ``num_tasks`` divides each one's
    classes (:func:`make_stream` raises otherwise)."""
    data = {}
    for name in names:
        data[name] = benchmark_images(name, subsets, n_train, n_test)
        make_stream(data[name].y_train, data[name].y_test, num_tasks)
    return data


def benchmark_features(name: str, subsets: dict, n_train: int | None, n_test: int | None, **extract):
    """Frozen-backbone features of :func:`benchmark_images` (``extract`` goes to
    :func:`fedlib.data.features.extract_features`, which caches them): only the images the experiments
    use pass through the backbone. Returns the Features."""
    return extract_features(benchmark_images(name, subsets, n_train, n_test), **extract)


def pretrained_grid(run, features, setting: str, betas, seeds, baselines, baseline_seeds, M: int,
                    workers: int | None = 1, curves: bool = False, progress: bool = False):
    """Every run of the pretrained table on one dataset's ``features``: Joint once per seed (it ignores
    the partition; listed under every beta), then per beta and seed the :data:`ANALYTIC` methods and,
    for ``baseline_seeds``, the gradient ``baselines``. ``run`` is :func:`run_fcil` with the chapter's
    fixed keywords. The seeds are independent jobs of a :class:`fedlib.core.parallel.RunGrid` (``workers``
    processes; None: the cores; every run is seeded by its seed, so the results equal those of one
    process). Returns the IncrementalResults; with ``curves``, ``(results, curves)``: every baseline
    run's last-task curve (:func:`run_fcil`'s ``last_task_curve``), ``curves[beta][method]`` one list
    per seed of ``baseline_seeds`` (the results are those of the runs without curves)."""
    requests = []
    for seed in seeds:   # a seed's runs share one random-feature expansion (cached in the process): one group
        requests.append((JOINT, None, seed))
        requests += [(method, beta, seed) for beta in betas
                     for method in list(ANALYTIC) + (list(baselines) if seed in baseline_seeds else [])]
    traced = lambda r: curves and r[0] in baselines  # noqa: E731
    grid = RunGrid(lambda r: run(r[0], features, r[1], r[2], setting, M, **({"last_task_curve": True} if traced(r) else {})))
    grid.fill(requests, workers, group=lambda r: r[2], cost=lambda g: g[0][2] in baseline_seeds, progress=progress,
              desc=setting)
    done = {r: grid.results[r][0] if traced(r) else grid.results[r] for r in grid.results}
    results = []
    for seed in seeds:
        joint = done[JOINT, None, seed]
        results += [dataclasses.replace(joint, config={**joint.config, "beta": beta}) for beta in betas]
    for beta in betas:
        for seed in seeds:
            results += [done[method, beta, seed] for method in ANALYTIC]
            results += [done[method, beta, seed] for method in (baselines if seed in baseline_seeds else [])]
    if not curves:
        return results
    return results, {beta: {m: [grid.results[m, beta, seed][1] for seed in seeds if seed in baseline_seeds]
                            for m in baselines} for beta in betas}


def scratch_features(dataset, num_tasks: int, num_clients: int, beta: float, seed: int, fed_kwargs: dict,
                     rounds: int, widths, cache_dir=None, progress: bool = True):
    """The scratch setting's stage 1 for one (beta, seed): the seed's class order and a SmallResNet
    (``widths``) trained by FedAvg for ``rounds`` rounds on task 1 then frozen
    (:func:`~fedlib.federated.incremental.scratch_backbone_features`). Returns ``(stream, features, cost)``."""
    stream = make_stream(dataset.y_train, dataset.y_test, num_tasks, seed=seed)
    f, cost = scratch_backbone_features(dataset, stream, num_clients, beta, seed,
                                        FedConfig(seed=seed, **{**fed_kwargs, "rounds": rounds}), widths=tuple(widths),
                                        cache_dir=cache_dir, progress=progress)
    return stream, f, cost


def scratch_grid(run, dataset, setting: str, betas, seeds, num_tasks: int, num_clients: int, fed_kwargs: dict,
                 rounds: int, widths, M: int, cache_dir=None, progress: bool = True):
    """The analytic methods and Joint on the scratch backbone of every (beta, seed)
    (:func:`scratch_features`). Returns ``(results, stage1 rows)``."""
    results, stage1 = [], []
    for beta in betas:
        for seed in seeds:
            stream, f, cost = scratch_features(dataset, num_tasks, num_clients, beta, seed, fed_kwargs, rounds, widths,
                                               cache_dir, progress)
            stage1.append({"beta": beta, "seed": seed, **cost})
            for method in list(ANALYTIC) + [JOINT]:
                results.append(run(method, f, beta, seed, setting, M, stream=stream))
    return results, stage1


# the modules whose code decides an end-to-end baseline run (part of its cache key: any edit recomputes)
_TRAINING_MODULES = ("fedlib/federated/fcil.py", "fedlib/federated/gradient.py", "fedlib/federated/learner.py",
                     "fedlib/federated/models.py", "fedlib/federated/incremental.py", "fedlib/data/partition.py",
                     "fedlib/core/protocol.py", "fedlib/core/seeds.py", "fedlib/core/persample.py",
                     "fedlib/core/messages.py")


def _training_code_digest() -> str:
    root = Path(__file__).resolve().parents[2]
    h = hashlib.sha1()
    for rel in _TRAINING_MODULES:
        h.update(rel.encode())
        h.update((root / rel).read_bytes())
    return h.hexdigest()


def _result_cache_path(directory, dataset, settings: dict):
    text = json.dumps(settings, sort_keys=True, default=str) + feature_fingerprint(dataset, "end-to-end", 0) \
        + _training_code_digest()
    key = hashlib.sha1(text.encode()).hexdigest()[:12]
    return directory / f"scratch_baseline__{dataset.name.replace('/', '_')}__{settings['method']}__{key}.npz"


def _load_result(path, method: str, config: dict):
    try:
        with np.load(path, allow_pickle=False) as z:
            costs = [Cost(int(u), int(d), float(sec)) for u, d, sec in zip(z["cost_up"], z["cost_down"], z["cost_s"])]
            return IncrementalResult(method, z["acc"], z["top1"], z["bytes_up"], z["wall_s"], dict(config), costs)
    except Exception:   # unreadable / partial file: recompute
        return None


def _save_result(path, res) -> None:
    save_npz(path, acc=res.acc, top1=res.top1, bytes_up=res.bytes_up, wall_s=res.wall_s,
                    cost_up=np.array([c.bytes_up for c in res.costs], dtype=np.int64),
                    cost_down=np.array([c.bytes_down for c in res.costs], dtype=np.int64),
                    cost_s=np.array([c.seconds for c in res.costs], dtype=np.float64))


def scratch_baseline_runs(methods, dataset, setting: str, num_tasks: int, num_clients: int, gamma: float,
                          fed_kwargs: dict, rounds: int, baseline_hparams: dict, widths, min_size: int,
                          beta: float = 0.5, seed: int = 0, progress: bool = True, cache_dir=None) -> list:
    """Gradient baselines trained end to end (a SmallResNet of ``widths`` on the images) through all
    stages, one run each at ``beta`` and ``seed``, ``rounds`` FedAvg rounds per stage.

    Like the scratch backbone (:func:`~fedlib.federated.incremental.scratch_backbone_features`), each
    run's result (accuracy matrix, bytes, seconds as measured when it ran) is cached on disk
    (``cache_dir``: default the feature cache; ``False``: no cache), keyed by the data, every setting
    and the source of the modules that train it (:data:`_TRAINING_MODULES`), so any change recomputes."""
    directory = None if cache_dir is False else (paths.cache_dir() if cache_dir is None else Path(cache_dir))
    img_train, img_test = None, None
    out = []
    for method in methods:
        config = {"setting": setting, "beta": beta, "seed": seed}
        settings = {"method": method, "num_tasks": num_tasks, "num_clients": num_clients, "beta": beta, "seed": seed,
                    "rounds": rounds, "fed_kwargs": {k: v for k, v in fed_kwargs.items() if k != "device"},
                    "hparams": (baseline_hparams or {}).get(method, {}), "widths": list(widths), "min_size": min_size}
        path = None if directory is None else _result_cache_path(directory, dataset, settings)
        if path is not None and path.is_file():
            cached = _load_result(path, method, config)
            if cached is not None:
                out.append(cached)
                continue
        if img_train is None:
            img_train, img_test = images_to_tensor(dataset.x_train), images_to_tensor(dataset.x_test)
        channels = int(img_train.shape[1])   # 1 (grayscale) or 3 (RGB, CIFAR); one block per stage as the backbone
        stream = make_stream(dataset.y_train, dataset.y_test, num_tasks, seed=seed)
        learner = make_fcil_learner(method, None, len(dataset.classes), None, gamma, seed,
                                    fed_kwargs={**fed_kwargs, "rounds": rounds}, baseline_hparams=baseline_hparams,
                                    model_fn=partial(SmallResNet, channels, len(dataset.classes), widths=tuple(widths),
                                                     blocks=(1,) * len(widths)))
        res = run_class_incremental(learner, stream, img_train, dataset.y_train, img_test, dataset.y_test,
                                    num_clients, beta, seed, config=config, progress=progress, min_size=min_size)
        if path is not None:
            _save_result(path, res)
        out.append(res)
    return out


def results_table(summary):
    """The main table: "mean ± sample std" of A_avg / A_T / F_T (eqs. 60-62) per (setting, method),
    columns (beta, metric), beta descending; and the number of seeds per method (its maximum)."""
    table = (summary.groupby(["setting", "method", "beta"])[["A_avg", "A_T", "F_T"]]
             .agg(lambda v: mean_std(v))
             .unstack("beta"))
    table = table.reorder_levels([1, 0], axis=1).sort_index(axis=1, level=0, ascending=False, sort_remaining=False)
    runs = summary.groupby(["setting", "method"]).seed.nunique()
    return table, runs.groupby("method").max()


def paired_against(summary, reference: str = "STSA", metric: str = "A_T"):
    """``metric`` of ``reference`` minus every other method, paired by seed within each (setting, beta)
    (seeds both ran; at least 2), 95 % t-interval: one row per comparison with the formatted
    difference and its mean, low, high and n."""
    rows = []
    for (setting, beta), grp in summary.groupby(["setting", "beta"]):
        ref = grp[grp.method == reference].set_index("seed")[metric]
        for method in grp.method.unique():
            if method == reference:
                continue
            other = grp[grp.method == method].set_index("seed")[metric]
            common = ref.index.intersection(other.index)
            if len(common) < 2:
                continue
            d = paired_difference(ref[common].to_numpy(), other[common].to_numpy())
            rows.append({"setting": setting, "beta": beta, f"{reference} minus": method,
                         f"{metric} difference (points)": str(d), "mean": d.mean, "low": d.low, "high": d.high,
                         "n": d.n})
    return pd.DataFrame(rows)


MARGIN_METHODS = ("STSA", "STSA-E")   # the methods of the paper's margin claim (Table 2)
MARGIN_METRICS = ("A_avg", "A_T")


def benchmark_runner(p: dict):
    """The benchmark chapter's gradient-baseline FedConfig keywords (``rounds_per_task`` rounds per stage,
    no evaluation during training) and its one-run function ``run(method, features, beta, seed, setting,
    M, **changes)``: :func:`run_fcil` with the chapter's fixed keywords from its parameters ``p``. The
    linear-head baselines train all clients of a round at once (``batched_clients``: the per-client
    loop's result up to float round-off). Returns ``(fed_kwargs, run)``."""
    fed_kwargs = dict(rounds=p["rounds_per_task"], local_epochs=p["local_epochs"], batch_size=64, lr=p["lr"],
                      weight_decay=0.0, device=p["device"], num_threads=p["num_threads"], eval_every=10**6)
    return fed_kwargs, partial(run_fcil, num_tasks=p["num_tasks"], num_clients=p["num_clients"], gamma=p["gamma"],
                               num_dummy=p["num_dummy"], head=p["head"], fed_kwargs={**fed_kwargs, "batched_clients": True},
                               baseline_hparams=p["baseline_hparams"])


def margin_values(summary, methods, seeds, metrics=MARGIN_METRICS) -> dict:
    """``{metric: {setting: {beta: {method: [value (%) per seed of seeds]}}}}`` of the pretrained rows of
    ``summary`` (beta as a string): the JSON-ready input of :func:`margin_comparison`."""
    pre = summary[summary.setting.str.startswith("pretrained") & summary.method.isin(list(methods))]
    out: dict = {metric: {} for metric in metrics}
    for (setting, beta), grp in pre.groupby(["setting", "beta"], sort=False):
        by = grp.set_index(["method", "seed"])
        for metric in metrics:
            out[metric].setdefault(setting, {})[str(beta)] = {m: [float(by.loc[(m, s), metric]) for s in seeds]
                                                              for m in methods}
    return out


def margin_comparison(values: dict, references, baselines, margin: float, confidence: float = 0.95) -> pd.DataFrame:
    """The paper's margin claim cell by cell: per metric, setting, beta and reference method (STSA,
    STSA-E) of :func:`margin_values`, the paired difference reference − baseline against every
    baseline (``confidence`` t-interval, points). The reference beats the best baseline by more than
    ``margin`` exactly when it beats every baseline by more, so a cell is **resolved above** when
    every baseline's lower bound exceeds ``margin`` and **resolved below** when some baseline's upper
    bound lies under it. One row per cell: ``best`` (the baseline of the highest mean), ``d`` (the
    difference to it), ``low`` (the smallest lower bound over the baselines), ``above``, ``below``."""
    rows = []
    for metric, settings in values.items():
        for setting, betas in settings.items():
            for beta, by in betas.items():
                for ref in references:
                    d = {b: paired_difference(by[ref], by[b], confidence) for b in baselines}
                    best = max(baselines, key=lambda b: np.mean(by[b]))
                    rows.append({"metric": metric, "setting": setting, "beta": float(beta), "method": ref, "best": best,
                                 "d": d[best], "low": min(x.low for x in d.values()),
                                 "above": all(x.low > margin for x in d.values()),
                                 "below": any(x.high < margin for x in d.values())})
    return pd.DataFrame(rows)


def margin_table(values: dict, cells: pd.DataFrame, references, baselines) -> pd.DataFrame:
    """Per setting and beta: every method's A_avg and A_T (mean ± sample std, %) and each reference's
    margin over the best baseline (paired, 95 % CI, points; which baseline is best is named) from
    :func:`margin_comparison`'s ``cells``. Columns (setting, beta as a string)."""
    rows = []
    for setting, betas in next(iter(values.values())).items():
        for beta in betas:
            row = {"setting": setting, "beta": beta}
            for metric in values:
                for m in [*references, *baselines]:
                    row[f"{metric}: {m}"] = mean_std(values[metric][setting][beta][m])
                for ref in references:
                    c = cells[(cells.metric == metric) & (cells.setting == setting) & (cells.beta == float(beta))
                              & (cells.method == ref)].iloc[0]
                    row[f"{metric}: {ref} − best baseline"] = f"{c.d.format(2)} vs {c.best}"
            rows.append(row)
    return pd.DataFrame(rows).set_index(["setting", "beta"]).T


def curve_plateaus(curves: dict, tol: float) -> pd.DataFrame:
    """:func:`fedlib.evaluation.stats.plateau` (tolerance ``tol``, points) on each baseline's mean
    last-task curve over seeds; ``curves[setting][beta][method]``: one curve (%) per seed. One row per
    (setting, beta, method) with its Plateau."""
    return pd.DataFrame([{"setting": setting, "beta": float(beta), "method": m,
                          "plateau": plateau(np.mean(np.asarray(c, dtype=float), axis=0), tol)}
                         for setting, betas in curves.items() for beta, by in betas.items() for m, c in by.items()])


def convergence_text(plateaus: pd.DataFrame) -> str:
    """The convergence evidence of :func:`curve_plateaus` in one sentence."""
    if plateaus.empty:
        return "no baseline ran: nothing to converge"
    moved = plateaus.plateau.map(lambda p: abs(p.change) if np.isfinite(p.change) else np.inf)
    worst = plateaus.loc[moved.idxmax()]
    p = worst.plateau
    what = (f"{p.points} rounds are too few to show a plateau" if not np.isfinite(p.change)
            else f"{p.change:+.2f} pp")
    ok = bool(plateaus.plateau.map(lambda q: q.converged).all())
    return (f"rule: a baseline's mean last-task test-accuracy curve moves by less than {p.tol:.2f} pp over the last "
            f"{100 * p.tail:.0f} % of its {p.points} rounds; {'every baseline converged' if ok else 'not all converged'}"
            f" (largest move: {worst.method}, {worst.setting}, beta={worst.beta}: {what})")


def exactness_check(summary):
    """STSA is joint ridge: in the pretrained setting, the spread of STSA's A_T across beta per
    (setting, seed), and the largest |A_T(STSA) - A_T(Joint)| over all runs. Returns
    ``(pretrained STSA rows, spread, gap)``."""
    pre = summary[summary.setting.str.startswith("pretrained") & (summary.method == "STSA")]
    spread = pre.groupby(["setting", "seed"])["A_T"].agg(lambda v: v.max() - v.min())
    pivot = summary.pivot_table(index=["setting", "beta", "seed"], columns="method", values="A_T")
    return pre, spread, (pivot["STSA"] - pivot[JOINT]).abs().max()


def ablation_runs(run, features, beta: float, seed: int, M: int, M_values, K_values, clients_total: int,
                  dummy_values, gammas, scratch=None):
    """One-seed ablations: M (pretrained ``features``; and on ``scratch`` = (stream, features, M values)
    when given), K with K K_D = ``clients_total``, K_D, gamma. One row per run: ablation, value, method
    and the run's summary (A_T only: each run is evaluated after its last stage, ``final_only``)."""
    rows = []

    def add(ablation, value, method, feats, m_, **kw):
        rows.append({"ablation": ablation, "value": value, "method": method,
                     **run(method, feats, beta, seed, "abl", m_, final_only=True, **kw).summary()})

    for m_ in M_values:
        for method in ["STSA", "STSA-E"]:
            add("M (pretrained)", m_, method, features, m_)
    if scratch is not None:
        stream, f_s, m_scratch = scratch
        for m_ in m_scratch:
            for method in ["STSA", "STSA-E"]:
                add("M (scratch)", m_, method, f_s, m_, stream=stream)
    for k in K_values:
        for method in ["STSA", "STSA-E", "STSA-E (per-class K)"]:
            add("K (K·K_D fixed)", k, method, features, M, num_clients=k, num_dummy=max(1, clients_total // k))
    for kd in dummy_values:
        for method in ["STSA-E", "STSA-E (per-class K)"]:
            add("K_D", kd, method, features, M, num_dummy=kd)
    for gm in gammas:
        for method in ["STSA", "STSA-E"]:
            add("gamma", gm, method, features, M, gamma=gm)
    return pd.DataFrame(rows)


NOISE_VARIANTS = {"STSA": ("STSA", ("G", "C"), False), "STSA-E1": ("STSA-E", ("C",), False),
                  "STSA-E2": ("STSA-E", ("n",), False), "STSA-E3": ("STSA-E", ("C", "n"), False),
                  "STSA-E2, counts rounded": ("STSA-E", ("n",), True)}


def noise_study(run, features, beta: float, seeds, M: int, grid):
    """Table 7 of the paper's earlier version: A_T with q * N(0, s^2) noise on the uploads
    (:data:`NOISE_VARIANTS`: which entries, counts rounded or not) for every (q, s) of ``grid`` and seed,
    plus the clean runs ("Original"; one clean STSA-E run serves every E variant). A run whose q * s was
    already run for that variant and seed is reused (the noise is q s N(0, 1) from each client's own stream).
    Returns ``(runs: setting, variant, seed, A_T; grams: {(setting, variant, seed): server Gram})``."""
    points = [(q, s, "Original" if q == 0 else f"q={q}, s={s}") for q, s in [[0.0, 0.0]] + list(grid)]
    # without noise E1, E2, E3 and the rounded variant are the same STSA-E run
    variants = lambda q: [lb for lb in NOISE_VARIANTS if q > 0 or lb in ("STSA", "STSA-E1")]  # noqa: E731
    done = {}
    for seed in seeds:   # seed by seed: its runs share one random-feature expansion
        for q, s, _ in points:
            for label in variants(q):
                method, entries, rounded = NOISE_VARIANTS[label]
                key = (label, seed, round(q * s, 12))
                if key not in done:
                    kw = {"round_counts": True} if rounded else {}
                    if q > 0:
                        kw.update(noise=(q, s), noise_entries=entries)
                    res, lrn = run(method, features, beta, seed, "noise", M, return_learner=True, final_only=True,
                                   **kw)
                    done[key] = (res.summary()["A_T"], lrn.server.gram.clone())
    rows, grams = [], {}
    for q, s, setting in points:
        for label in variants(q):
            for seed in seeds:
                key = (label, seed, round(q * s, 12))
                rows.append({"setting": setting, "variant": label, "seed": seed, "A_T": done[key][0]})
                grams[(setting, label, seed)] = done[key][1]
    runs = pd.DataFrame(rows)
    clean = runs[runs.setting == "Original"]
    for label in ["STSA-E2", "STSA-E3", "STSA-E2, counts rounded"]:
        runs = pd.concat([runs, clean[clean.variant == "STSA-E1"].assign(variant=label)], ignore_index=True)
    return runs, grams


def noise_tables(runs, grams, grid, seed: int):
    """From :func:`noise_study`: the A_T table ("mean ± sample std", rows Original + grid, columns
    variants), the relative change ||G_noisy - G|| / ||G|| of the server's Gram for ``seed`` (rows
    settings, columns variants) and, for the grid points with q * s <= 0.1, the paired change of A_T
    against the clean run per variant ("d": a PairedDifference or None; "max |change|")."""
    table = (runs.groupby(["setting", "variant"], sort=False)["A_T"].agg(mean_std).unstack("variant")
             .reindex(index=["Original"] + [f"q={q}, s={s}" for q, s in grid], columns=list(NOISE_VARIANTS)))
    gram = {(st, v): g for (st, v, sd), g in grams.items() if sd == seed}
    clean = {"STSA": gram[("Original", "STSA")], "E": gram[("Original", "STSA-E1")]}
    moved = pd.DataFrame([{"setting": st, "variant": v,
                           "||G_noisy - G|| / ||G||": float((g - clean["STSA" if v == "STSA" else "E"]).norm()
                                                           / clean["STSA" if v == "STSA" else "E"].norm())}
                          for (st, v), g in gram.items() if st != "Original"]).pivot(index="setting", columns="variant")
    changes = []
    for st in [f"q={q}, s={s}" for q, s in grid if q * s <= 0.1]:
        for label in NOISE_VARIANTS:
            a = runs[(runs.setting == st) & (runs.variant == label)].sort_values("seed")["A_T"].to_numpy()
            b = runs[(runs.setting == "Original") & (runs.variant == label)].sort_values("seed")["A_T"].to_numpy()
            changes.append({"setting": st, "variant": label, "d": paired_difference(a, b) if len(a) > 1 else None,
                            "max |change|": float(np.abs(a - b).max())})
    return table, moved, pd.DataFrame(changes)


def skew_grid(run, features, beta: float, seeds, M: int, scale: float, methods=("STSA", "STSA-E (per-class K)")):
    """A_T of ``methods`` with label skew only and with feature skew of ``scale`` (``run(..., skew=)``),
    per seed: a table with one row per seed and columns (skew, method)."""
    rows = [{"seed": seed, "skew": sk, "method": method,
             "A_T": run(method, features, beta, seed, "skew", M, skew=sk, final_only=True).summary()["A_T"]}
            for seed in seeds for sk in [0.0, scale] for method in methods]
    return pd.DataFrame(rows).pivot_table(index="seed", columns=["skew", "method"], values="A_T")


def large_first_task(run, features, beta: float, seeds, M: int, first: int, later: int, methods):
    """Table 4's protocol: a base task of ``first`` classes then tasks of ``later`` classes; "mean ±
    sample std" over ``seeds`` of A_avg / A_T / F_T per method."""
    n_classes = len(features.classes)
    rows = []
    for seed in seeds:
        stream = make_stream(features.y_train, features.y_test, 1 + (n_classes - first) // later, seed=seed,
                             first_task_classes=first)
        for method in methods:
            rows.append(run(method, features, beta, seed, "large first task", M, stream=stream).summary())
    return pd.DataFrame(rows).groupby("method")[["A_avg", "A_T", "F_T"]].agg(mean_std)


def benchmark_findings(summary, paired, baselines) -> dict:
    """The numbers the chapter's closing summary quotes: the largest |A_T| gap between the global and
    per-class K of STSA-E, the pretrained paired rows of STSA - STSA-E and STSA - AFL (stage-wise),
    the baselines' mean F_T per method and STSA's mean F_T."""
    pair = summary[summary.method.isin(["STSA-E", "STSA-E (per-class K)"])].pivot_table(
        index=["setting", "beta", "seed"], columns="method", values="A_T")
    pre = paired[paired.setting.str.startswith("pretrained")]
    return {"kmode_gap": (pair["STSA-E"] - pair["STSA-E (per-class K)"]).abs().max(),
            "e_vs": pre[pre["STSA minus"] == "STSA-E"], "afl_vs": pre[pre["STSA minus"] == "AFL (stage-wise)"],
            "ft_mean": summary[summary.method.isin(baselines)].groupby("method")["F_T"].mean(),
            "stsa_ft": summary[summary.method == "STSA"]["F_T"].mean()}
