"""The AFL chapters' studies: the benchmark's protocol (fixed partitions, the gradient baselines, runs
shared between sections), the derivation chapter's checks and sweeps, and the benchmark's tables. Built
on :mod:`fedlib.afl.algorithm`; nothing here is part of the paper's algorithm.
"""
from __future__ import annotations

import time
import warnings
from typing import Sequence

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from fedlib.afl.algorithm import SERVERS, AFLResult, aa_weights, aggregate, client_update, ri_restore, run_afl
from fedlib.core.linalg import (Array, SufficientStats, as_tensor, gram_report, lstsq_reference,
                                normal_equations_tolerance, predict, qr_reference, relative_error, ridge_solve,
                                synthetic_features)
from fedlib.core.parallel import RunGrid
from fedlib.core.validate import check_choice, check_positive
from fedlib.data.partition import make_partition
from fedlib.evaluation.metrics import head_accuracy
from fedlib.evaluation.stats import mean_std, paired_difference, pm
from fedlib.federated.gradient import FedConfig, LinearHead, MOONHead, make_algorithm, run_federated

# ----------------------------------------------------------------------------------------------
# the benchmark's protocol (notebooks/afl_benchmark.py): fixed partitions, gradient baselines
# ----------------------------------------------------------------------------------------------
SETTING_KINDS = ("alpha", "shards", "iid")


def setting_label(setting: tuple) -> str:
    """``("alpha", 0.1)`` -> "α=0.1" (NIID-1), ``("shards", 2)`` -> "s=2" (NIID-2), ``("iid", None)`` -> "IID"."""
    kind, value = setting
    check_choice("setting kind", kind, SETTING_KINDS)
    return {"alpha": f"α={value}", "shards": f"s={value}", "iid": "IID"}[kind]


class SettingPartitions:
    """``partitions(setting, k, seed)``: client index arrays of ``labels`` (N,) for a setting
    ``("alpha", a)`` (Dirichlet label skew), ``("shards", s)`` (s shards per client) or ``("iid", None)``,
    drawn once per (setting, k, seed) and reused, so every method of a comparison shares them."""

    def __init__(self, labels):
        self.labels = np.asarray(labels)
        self._cache: dict[tuple, list[np.ndarray]] = {}

    def __call__(self, setting: tuple, k: int, seed: int) -> list[np.ndarray]:
        key = (tuple(setting), int(k), int(seed))
        if key not in self._cache:
            kind, value = setting
            check_choice("setting kind", kind, SETTING_KINDS)
            if kind == "alpha":
                parts = make_partition(self.labels, k, "dirichlet", alpha=value, seed=seed)
            elif kind == "shards":
                parts = make_partition(self.labels, k, "shards", shards_per_client=value, seed=seed)
            else:
                parts = make_partition(self.labels, k, "iid", seed=seed)
            self._cache[key] = parts
        return self._cache[key]

    def draw_all(self, settings: Sequence[tuple], ks: Sequence[int], seeds: Sequence[int]) -> None:
        """Draw (and cache) the partition of every (setting, K, seed) combination now, so that a bad
        setting fails in seconds, before any feature extraction or training."""
        for setting in settings:
            for k in ks:
                for seed in seeds:
                    self(setting, k, seed)


class RunCache:
    """Runs shared between a chapter's cells: a run asked for again - the same partition, method,
    training seed, settings and data - is computed once and returned again (``hits`` counts the
    reuses). AFL results are keyed by (partition, gamma, device, features), gradient-baseline
    histories by (partition, method, seed, ``FedConfig`` settings, MOON width, data). A partition is
    the list object :class:`SettingPartitions` returns for a (setting, K, seed), and the data are
    tensors by storage; both are held here, so their identities stay valid while the cache lives.
    """

    def __init__(self):
        self._afl: dict = {}
        self._x64: dict = {}
        self._federated = RunGrid(self._run_federated, key=self._federated_key)
        self._held: list = []   # the partitions and data whose ids are in the keys
        self._settings: tuple = ()
        self.afl_hits = 0

    @property
    def hits(self) -> int:
        """Runs asked for again and returned from the cache (AFL and gradient baselines)."""
        return self.afl_hits + self._federated.hits

    def afl(self, feats, parts, gamma: float, device) -> "AFLResult":
        """:func:`run_afl` on ``feats`` (x_train, y_train, num_classes) split by ``parts``, at ``gamma``
        (the float64 copy of the features that :func:`run_afl` slices is made once per features)."""
        key = (id(parts), float(gamma), str(device), id(feats))
        if key in self._afl:
            self.afl_hits += 1
        else:
            xkey = (id(feats), str(device))
            if xkey not in self._x64:
                self._x64[xkey] = (feats, as_tensor(feats.x_train, torch.float64, device))
            self._afl[key] = (parts, feats, run_afl(self._x64[xkey][1], feats.y_train, parts, feats.num_classes,
                                                    gamma=gamma, device=device))
        return self._afl[key][2]

    def federated(self, method: str, parts, seed: int, config: dict, moon_hidden, train, test, num_classes: int):
        """:func:`~fedlib.federated.gradient.run_federated` of ``method`` with ``FedConfig(seed=seed,
        **config)`` on ``train`` = (x (N, d), y (N,)) tensors split by ``parts``, evaluated on ``test``."""
        return self.federated_many([(method, parts, seed)], config, moon_hidden, train, test, num_classes)[0]

    def federated_many(self, runs, config: dict, moon_hidden, train, test, num_classes: int, workers: int = 1,
                       desc: str | None = None, progress: bool = False) -> list:
        """:meth:`federated` of every ``(method, parts, seed)`` of ``runs``; the histories in that order.
        The runs not held yet go to ``workers`` forked processes (:class:`fedlib.core.parallel.RunGrid`):
        each is seeded by its own FedConfig, so the histories equal those run one by one (tested)."""
        self._settings = (config, moon_hidden, train, test, num_classes)
        self._held += [parts for _, parts, _ in runs] + [train, test]
        return self._federated.fill([(method, parts, int(seed)) for method, parts, seed in runs], workers,
                                    desc=desc, progress=progress)

    def _federated_key(self, run) -> tuple:
        method, parts, seed = run
        config, moon_hidden, train, test, _ = self._settings
        data = tuple((t.data_ptr(), tuple(t.shape), str(t.dtype)) for t in (*train, *test))
        return (id(parts), method, seed, tuple(sorted(config.items())), moon_hidden if method == "moon" else None,
                data)

    def _run_federated(self, run):
        method, parts, seed = run
        config, moon_hidden, (x_tr, y_tr), test, num_classes = self._settings
        return run_federated(baseline_model_fn(method, int(x_tr.shape[1]), num_classes, moon_hidden),
                             [(x_tr[p], y_tr[p]) for p in parts], test, make_algorithm(method),
                             FedConfig(seed=seed, **config), progress=False)


def baseline_model_fn(method: str, dim: int, num_classes: int, moon_hidden: int | None = None):
    """Model factory of a gradient baseline on frozen d-dim features: MOON's projection head
    (``MOONHead``, l1 width ``moon_hidden`` or d), every other method a linear head d -> C."""
    if method == "moon":
        return lambda: MOONHead(dim, num_classes, hidden=moon_hidden)
    return lambda: LinearHead(dim, num_classes)


def per_round_upload(hist, parts: Sequence[np.ndarray]) -> float:
    """Measured bytes one (non-empty) client uploads in one round: the increment of ``hist.bytes_up``
    between its last two records (from the start, less the setup round's uploads, when the run has
    one record: ``rounds=1``), over the participants that hold data in the rounds between them (more
    than one round when ``eval_every > 1``)."""
    if not hist.round:
        raise ValueError("the history has no record: nothing was uploaded")
    last = hist.round[-1]
    first, start = (hist.round[-2], hist.bytes_up[-2]) if len(hist.round) > 1 else (0, hist.setup_bytes_up)
    uploads = sum(len(parts[k]) > 0 for r in range(first, last) for k in hist.participants[r])
    return (hist.bytes_up[-1] - start) / uploads


def run_baselines(protocol: str, jobs, partitions: SettingPartitions, num_clients: int, train, test,
                  num_classes: int, config: dict, moon_hidden: int | None = None, progress: bool = True,
                  cache: RunCache | None = None, workers: int = 1):
    """Run the gradient baselines of ``jobs`` = [(setting, method, seed, partition seed)] on the
    frozen features ``train`` = (x (N, d), y (N,)) / ``test`` tensors, each with
    ``FedConfig(seed=seed, **config)`` on ``partitions(setting, num_clients, partition seed)``.
    ``cache``: a :class:`RunCache` that holds the runs (a job it already ran is not run again);
    ``workers`` forked processes run the new ones (:meth:`RunCache.federated_many`).

    Returns ``(runs, curves)``: one row per job (final / best accuracy, seconds, measured upload per
    client and round) and the concatenated per-round histories.
    """
    cache = RunCache() if cache is None else cache
    out, frames = [], []
    hists = cache.federated_many([(method, partitions(setting, num_clients, pseed), seed)
                                  for setting, method, seed, pseed in jobs], config, moon_hidden, train, test,
                                 num_classes, workers=workers, desc=f"{protocol} runs", progress=progress)
    for (setting, method, seed, pseed), hist in zip(jobs, hists):
        parts = partitions(setting, num_clients, pseed)
        out.append({"protocol": protocol, "setting": setting_label(setting), "method": method, "seed": seed,
                    "partition seed": pseed, "accuracy": hist.final_acc, "best accuracy": hist.best_acc,
                    "seconds": hist.wall_s[-1], "seconds per round": hist.wall_s[-1] / config["rounds"],
                    "seconds to final accuracy": hist.time_to_final(),
                    "upload bytes/client/round": per_round_upload(hist, parts)})
        frame = hist.to_frame()
        frame[["setting", "method", "seed"]] = setting_label(setting), method, seed
        frames.append(frame)
    return pd.DataFrame(out), pd.concat(frames, ignore_index=True)


def seed_ordered_accuracies(frame, setting: str, method: str) -> np.ndarray:
    """Final accuracies of ``method`` in ``setting`` (a label), ordered by training seed (for pairing)."""
    rows = frame[(frame.setting == setting) & (frame.method == method)]
    return rows.sort_values("seed")["accuracy"].to_numpy()


def comparison_inputs(runs, curves, setting: str, methods: Sequence[str]):
    """``(finals, curves)`` of one setting (a label) for :func:`fedlib.evaluation.stats.compare_methods`:
    each method's final accuracy per training seed and its per-round test accuracy per seed."""
    finals = {m: seed_ordered_accuracies(runs, setting, m) for m in methods}
    c = curves[curves.setting == setting]
    per_seed = {m: [g.sort_values("round")["test_acc"].to_numpy() for _, g in c[c.method == m].groupby("seed")]
                for m in methods}
    return finals, per_seed


def comparison_table(comparisons: dict) -> pd.DataFrame:
    """One row per (setting, method) of ``{setting: Comparison}``: final accuracy mean ± sample std (%),
    AFL − method paired by seed (95 % CI, pp) and the mean curve's move over the last 20 % of the rounds."""
    rows = []
    for s, cmp in comparisons.items():
        for m, r in cmp.rows.iterrows():
            rows.append({"setting": s, "method": m, "accuracy (%)": pm(100 * r["mean"], 100 * r["std"]),
                         "AFL − method (pp)": r["difference"].format(2, 100).split(" (")[0],
                         "moved, last 20 % (pp)": f"{100 * r['plateau'].change:+.2f}"})
    return pd.DataFrame(rows).set_index(["setting", "method"])


def table1_deviations(x: Array, labels: Array, num_classes: int, clients: Sequence[int],
                      reference: torch.Tensor):
    """The paper's Table 1 recipe: for each K in ``clients``, an equal contiguous split of x (N, d),
    the pairwise AA law without RI (gamma = 0, local Moore-Penrose inverse, ``inverse="pinv"``) and
    with RI (gamma = 1, eq. 15); ``ΔW = sum |W - reference|`` (L1) for both. Returns a DataFrame
    indexed by K with N_k and the two deviations."""
    rows = []
    for k in clients:
        parts = np.array_split(np.arange(len(labels)), k)
        no_ri = run_afl(x, labels, parts, num_classes, gamma=0.0, server="pairwise", inverse="pinv")
        with_ri = run_afl(x, labels, parts, num_classes, gamma=1.0, server="pairwise")
        rows.append({"K": k, "N_k": len(parts[0]),
                     "ΔW w/o RI (ours)": float((no_ri.weights - reference).abs().sum()),
                     "ΔW w/ RI (ours)": float((with_ri.weights - reference).abs().sum())})
    return pd.DataFrame(rows).set_index("K")


# ----------------------------------------------------------------------------------------------
# the derivation chapter's checks (notebooks/afl_derivation.py): each returns the table it shows
# ----------------------------------------------------------------------------------------------
def two_client_check(x: Array, labels: Array, num_classes: int, reference: torch.Tensor):
    """Two equal halves of x (N, d) aggregated by the pairwise AA law (Thm. 1, eq. 8; gamma = 0, no
    restoration) with the corrected (+) and the printed (-) sign, against ``reference`` (d, C).

    Returns ``(table, identities)``: one row per sign (L1 and max relative error), and the corrected
    weights' identities ``max|W_u - S^{-1} C_u|`` and ``max|W_u + W_v - I|``.
    """
    halves = np.array_split(np.arange(len(labels)), 2)
    up = [client_update(x[p], labels[p], num_classes, gamma=0.0, packed=False) for p in halves]
    w_u, w_v = aa_weights(up[0]["C"], up[1]["C"], sign=+1)
    s_inv_cu = torch.linalg.solve(up[0]["C"] + up[1]["C"], up[0]["C"])
    rows = []
    for sign, label in [(+1, "corrected (+)"), (-1, "as printed (-)")]:
        res = aggregate(up, server="pairwise", sign=sign, restore=False)
        rows.append({"AA law": label, "L1 |W_agg - W_joint|": float((res.weights - reference).abs().sum()),
                     "max rel. error": relative_error(res.weights, reference)})
    eye = torch.eye(w_u.shape[0], dtype=torch.float64)
    return pd.DataFrame(rows), {"max|W_u - S^-1 C_u|": float((w_u - s_inv_cu).abs().max()),
                          "max|W_u + W_v - I|": float((w_u + w_v - eye).abs().max())}


def partition_sweep(x: Array, labels: Array, num_classes: int, settings, num_clients: int, seed: int,
                    reference: torch.Tensor, gamma: float = 1.0):
    """Heterogeneity invariance (Thm. 1-2): for every ``(scheme, kwargs)`` of ``settings`` (a
    :func:`~fedlib.data.partition.make_partition` scheme), both servers on the same partition into
    ``num_clients`` clients, against ``reference`` (d, C).

    Returns ``(table, agreement, checks)``: one row per (partition, server) with client sizes and the
    max relative error; per partition ``max|W_pairwise - W_one_solve|``; and ``checks`` = the largest
    difference between any two partitions' one-solve heads (``"spread"``) and whether every one-solve
    head predicts the training set exactly like ``reference`` (``"same predictions"``).
    """
    rows, heads = [], {}
    for scheme, kw in settings:
        parts = make_partition(labels, num_clients, scheme, seed=seed, **kw)
        label = scheme + "".join(f" {k}={v}" for k, v in kw.items())
        for server in SERVERS:
            res = run_afl(x, labels, parts, num_classes, gamma=gamma, server=server)
            heads[(label, server)] = res.weights
            rows.append({"partition": label, "server": server, "empty clients": sum(len(p) == 0 for p in parts),
                         "smallest N_k": min(len(p) for p in parts), "largest N_k": max(len(p) for p in parts),
                         "max rel. error vs joint": relative_error(res.weights, reference)})
    labels_seen = dict.fromkeys(lbl for lbl, _ in heads)
    agreement = pd.Series({lbl: float((heads[(lbl, "pairwise")] - heads[(lbl, "one_solve")]).abs().max())
                           for lbl in labels_seen}, name="max |W_pairwise - W_one_solve|")
    one_solve = [w for (lbl, srv), w in heads.items() if srv == "one_solve"]
    pred = predict(reference, x)
    checks = {"spread": max(float((a - b).abs().max()) for a in one_solve for b in one_solve),
              "same predictions": all(bool((predict(w, x) == pred).all()) for w in one_solve)}
    return pd.DataFrame(rows), agreement, checks


def client_count_sweep(x: Array, labels: Array, num_classes: int, client_counts: Sequence[int], seed: int,
                       reference: torch.Tensor, pairwise_max_clients: int, gamma: float = 1.0):
    """Client-number invariance: an IID split into K clients for every K of ``client_counts`` (K > N
    skipped), both servers (the pairwise one only up to ``pairwise_max_clients``). One row per (K,
    server): N_k, server seconds and the max relative error against ``reference`` (d, C)."""
    rows = []
    for k in client_counts:
        if k > len(labels):
            continue
        parts = make_partition(labels, k, "iid", seed=seed)
        for server in SERVERS:
            if server == "pairwise" and k > pairwise_max_clients:
                continue
            res = run_afl(x, labels, parts, num_classes, gamma=gamma, server=server)
            rows.append({"K": k, "server": server, "N_k": len(parts[0]), "server seconds": res.server_seconds,
                         "max rel. error vs joint": relative_error(res.weights, reference)})
    return pd.DataFrame(rows)


def order_sweep(x: Array, labels: Array, parts: Sequence[np.ndarray], num_classes: int, n_orders: int,
                rng: np.random.Generator, gamma: float = 1.0):
    """Order invariance: ``n_orders`` random client orders (``rng.permutation``, one per order) for
    both servers against the pairwise head in the order 0..K-1. Returns ``(table, max|W_ref|)``."""
    reference = run_afl(x, labels, parts, num_classes, gamma=gamma, server="pairwise").weights
    rows = []
    for i in range(n_orders):
        order = rng.permutation(len(parts))
        for server in SERVERS:
            w = run_afl(x, labels, parts, num_classes, gamma=gamma, server=server, order=order).weights
            rows.append({"order": i, "server": server, "max |W - W(order 0..K-1)|": float((w - reference).abs().max())})
    return pd.DataFrame(rows), float(reference.abs().max())


def unrestored_is_ridge(x: Array, labels: Array, num_classes: int, cases, seed: int, reference: torch.Tensor):
    """Thm. 2 (eq. 13): without the restoration the one-solve head is joint ridge with lambda = K gamma.
    For each ``(K, gamma)`` of ``cases`` (K > N skipped): an IID split, the unrestored head against
    the lstsq ridge reference (augmented system) and against ``reference`` (d, C)."""
    rows = []
    for k, gamma in cases:
        if k > len(labels):
            continue
        parts = make_partition(labels, k, "iid", seed=seed)
        res = run_afl(x, labels, parts, num_classes, gamma=gamma, server="one_solve", restore=False)
        w_ridge = lstsq_reference(x, labels, num_classes, lam=k * gamma)
        rows.append({"K": k, "gamma": gamma, "K·gamma": k * gamma,
                     "max rel. |W^r_agg - ridge(λ=Kγ)|": relative_error(res.weights, w_ridge),
                     "max rel. |W^r_agg - W_joint|": relative_error(res.weights, reference)})
    return pd.DataFrame(rows)


def conditioning_check(conditions: Sequence[float], f32_conditions: Sequence[float], n: int, dim: int,
                       num_classes: int, num_clients: int, seed: int, gamma: float = 1.0):
    """AFL against NumPy lstsq on ``ill_conditioned`` features (n, dim) with cond(X^T X) prescribed,
    in float64 (``conditions``) and float32 (``f32_conditions``), Dirichlet(0.1) over ``num_clients``.

    One row per (condition, dtype, server): the relative error, the tolerance ``2 kappa u``
    (:func:`~fedlib.core.linalg.normal_equations_tolerance`), the error of the unrestored head and
    error / tolerance.
    """
    rows = []
    cases = [(c, torch.float64) for c in conditions] + [(c, torch.float32) for c in f32_conditions]
    for cond, dt in cases:
        xi, yi = synthetic_features(n, dim, num_classes, "ill_conditioned", seed, condition=cond)
        if dt == torch.float32:
            xi = xi.astype(np.float32)
        ref = lstsq_reference(xi, yi, num_classes)
        kappa = float(np.linalg.cond(xi.astype(np.float64).T @ xi.astype(np.float64)))
        tol = normal_equations_tolerance(kappa, dt)
        parts = make_partition(yi, num_clients, "dirichlet", alpha=0.1, seed=seed)
        for server in ["one_solve", "pairwise"]:
            res = run_afl(xi, yi, parts, num_classes, gamma=gamma, server=server, dtype=dt)
            rows.append({"cond(XᵀX)": kappa, "dtype": str(dt).replace("torch.", ""), "server": server,
                         "rel. error vs lstsq": relative_error(res.weights.double(), ref), "tolerance 2·κ·u": tol,
                         "unrestored (wrong) head": relative_error(res.weights_regularized.double(), ref)})
    table = pd.DataFrame(rows)
    table["error / tolerance"] = table["rel. error vs lstsq"] / table["tolerance 2·κ·u"]
    return table


def gamma_precision_sweep(x: Array, labels: Array, num_classes: int, parts: Sequence[np.ndarray],
                          gammas: Sequence[float], reference: torch.Tensor):
    """"Any gamma would suffice": both servers for every gamma in float64 and float32 statistics.

    One row per (dtype, gamma, server): max relative error against ``reference`` (d, C) (NaN when the
    head is not finite), training predictions that differ from ``reference``'s, and the number of
    ``ridge_solve`` calls that warned of a numerically singular matrix (counted, not printed).
    """
    pred_ref = predict(reference, x)
    rows = []
    for dtype in [torch.float64, torch.float32]:
        for gamma in gammas:
            for server in SERVERS:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always", RuntimeWarning)
                    res = run_afl(x, labels, parts, num_classes, gamma=gamma, server=server, dtype=dtype)
                w = res.weights.double()
                finite = bool(torch.isfinite(w).all())
                rows.append({"dtype": str(dtype).replace("torch.", ""), "gamma": gamma, "server": server,
                             "max rel. error": relative_error(w, reference) if finite else float("nan"),
                             "changed predictions": int((predict(w, x) != pred_ref).sum()) if finite else len(labels),
                             "rank-deficient solves": sum("singular" in str(c.message) for c in caught)})
    return pd.DataFrame(rows)


def client_count_accuracy(x: Array, labels: Array, x_test: Array, y_test: np.ndarray, num_classes: int,
                          client_counts: Sequence[int], seed: int, reference: torch.Tensor, alpha: float = 0.1):
    """One-solve AFL (gamma = 1) on Dirichlet(``alpha``) splits into K clients (K > N skipped): one row
    per K with the max relative error against ``reference`` (d, C) and the test accuracy."""
    rows = []
    for k in client_counts:
        if k > len(labels):
            continue
        parts = make_partition(labels, k, "dirichlet", alpha=alpha, seed=seed)
        res = run_afl(x, labels, parts, num_classes, gamma=1.0, server="one_solve")
        acc = float((predict(res.weights, x_test).numpy() == y_test).mean())
        rows.append({"K": k, "max rel. error vs joint": relative_error(res.weights, reference), "test accuracy": acc})
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------------------------
# the benchmark chapter's tables (notebooks/afl_benchmark.py)
# ----------------------------------------------------------------------------------------------
def centralized_reference(feats, device: str | torch.device = "cpu") -> dict:
    """The head AFL must reproduce on cached features ``feats`` (x_train (N, d), y_train, x_test,
    y_test, num_classes): the normal-equations head ``(X^T X)^{-1} X^T Y`` and, independently, a
    Householder QR of X (:func:`~fedlib.core.linalg.qr_reference`).

    Returns ``{"w_joint" (d, C), "joint_acc", "report" (gram_report), "w_qr" (d, C), "qr_acc",
    "qr_error" (max relative difference), "qr_tol" (2 kappa eps), "qr_seconds"}``.
    """
    stats = SufficientStats.from_data(feats.x_train, feats.y_train, feats.num_classes, device=device)
    w_joint = ridge_solve(stats.gram, stats.xty)
    report = gram_report(stats.gram)
    t0 = time.perf_counter()
    w_qr = qr_reference(feats.x_train, feats.y_train, feats.num_classes)
    qr_seconds = time.perf_counter() - t0
    return {"w_joint": w_joint, "joint_acc": head_accuracy(w_joint, feats.x_test, feats.y_test), "report": report,
            "w_qr": w_qr, "qr_acc": head_accuracy(w_qr, feats.x_test, feats.y_test),
            "qr_error": relative_error(w_joint.cpu(), w_qr),
            "qr_tol": normal_equations_tolerance(report["condition number"]), "qr_seconds": qr_seconds}


def afl_setting_runs(feats, partitions: SettingPartitions, settings: Sequence[tuple], num_clients: int,
                     partition_seeds: Sequence[int], gamma: float, device, reference: torch.Tensor,
                     cache: RunCache | None = None):
    """AFL on the partition of every setting and partition seed (duplicates run once). One row per
    run: setting label, partition seed, test accuracy, measured seconds, upload bytes per client,
    uploads per client and the max relative difference to ``reference`` (d, C). ``cache``: a
    :class:`RunCache` that keeps the runs for later cells."""
    cache = RunCache() if cache is None else cache
    rows = []
    for setting in settings:
        for pseed in dict.fromkeys(partition_seeds):
            res = cache.afl(feats, partitions(setting, num_clients, pseed), gamma, device)
            rows.append({"setting": setting_label(setting), "partition seed": pseed,
                         "accuracy": head_accuracy(res.weights, feats.x_test, feats.y_test),
                         "seconds": res.cost.seconds, "upload bytes/client": res.cost.bytes_up / num_clients,
                         "uploads per client": len(res.upload_bytes) / num_clients,
                         "max rel. |W - W_QR|": relative_error(res.weights.cpu(), reference)})
    return pd.DataFrame(rows)


def accuracy_table(runs, settings: Sequence[str], methods: Sequence[str], afl_acc):
    """Table 2's layout: one row per setting label, "mean ± sample std" (%) of each method's final
    accuracy over training seeds, and AFL's (deterministic) accuracy ``afl_acc[setting]`` ± 0."""
    table = pd.DataFrame({m: [mean_std(seed_ordered_accuracies(runs, s, m), 2, 100) for s in settings]
                          for m in methods}, index=list(settings))
    table["AFL"] = [pm(100 * afl_acc[s], 0.0) for s in table.index]
    return table


def paired_against_afl(runs, settings: Sequence[str], methods: Sequence[str], afl_acc):
    """Paired differences by training seed (95 % t-interval, percentage points): AFL minus each method
    (``"afl_low"`` holds the interval's lower end), and each method minus FedAvg when FedAvg ran."""
    rows = []
    for s in settings:
        for m in methods:
            acc = seed_ordered_accuracies(runs, s, m)
            d_afl = paired_difference(np.full(len(acc), afl_acc[s]), acc)
            row = {"setting": s, "method": m, "AFL − method (pp)": d_afl.format(2, 100), "afl_low": d_afl.low}
            if "fedavg" in methods and m != "fedavg":
                base = seed_ordered_accuracies(runs, s, "fedavg")
                row["method − FedAvg (pp)"] = paired_difference(acc, base).format(2, 100)
            rows.append(row)
    return pd.DataFrame(rows)


def final_gain(curves, rounds: int):
    """Accuracy gained over the last ``max(1, rounds // 10)`` rounds of every (setting, method, seed)
    curve of ``curves`` (columns test_acc, ...): returns ``(gains Series, window)``."""
    window = max(1, rounds // 10)
    gain = curves.groupby(["setting", "method", "seed"])["test_acc"].apply(
        lambda a: a.iloc[-1] - a.iloc[max(0, len(a) - 1 - window)])
    return gain, window


def protocol_spread(fixed, resampled):
    """Fixed partition vs a new partition per seed: "mean ± sample std" (%) of the accuracy per
    (setting, method) and protocol, and the ratio of the two sample stds (new / fixed)."""
    both = pd.concat([fixed[fixed.method.isin(resampled.method.unique())], resampled])
    spread = both.groupby(["setting", "method", "protocol"], sort=False)["accuracy"].agg(
        lambda a: mean_std(a, 2, 100)).unstack("protocol")
    std = both.groupby(["setting", "method", "protocol"])["accuracy"].std(ddof=1).unstack("protocol")
    return spread, std["new partition per seed"] / std["fixed partition"]


def cost_table(runs, afl_runs, partition_seed: int, paper_rounds: int):
    """Per method (means over runs): seconds to final accuracy, seconds per round and measured upload
    per client and round, the time ratios against AFL's mean seconds on the fixed partitions of
    ``afl_runs`` (our budget; ``paper_rounds`` rounds) and the number of rounds after which its
    cumulative upload passes AFL's mean upload. Returns ``(cost, afl_seconds, afl_bytes)``."""
    afl_seconds = afl_runs[afl_runs["partition seed"] == partition_seed]["seconds"].mean()
    afl_bytes = afl_runs["upload bytes/client"].mean()
    cost = runs.groupby("method", sort=False)[["seconds to final accuracy", "seconds per round",
                                               "upload bytes/client/round"]].mean()
    cost["time ratio vs AFL (our budget)"] = cost["seconds to final accuracy"] / afl_seconds
    cost[f"time ratio vs AFL ({paper_rounds} rounds)"] = cost["seconds per round"] * paper_rounds / afl_seconds
    cost["rounds until its upload passes AFL's"] = np.ceil(afl_bytes / cost["upload bytes/client/round"]).astype(int)
    return cost, afl_seconds, afl_bytes


def upload_crossings(cost, methods: Sequence[str]):
    """From :func:`cost_table`: the linear-head methods (all but MOON), the fewest rounds after which
    one of them has uploaded more than AFL (None without one) and the same for MOON (None if absent)."""
    linear = [m for m in methods if m != "moon"]
    column = "rounds until its upload passes AFL's"
    return (linear, int(cost.loc[linear, column].min()) if linear else None,
            int(cost.loc["moon", column]) if "moon" in methods else None)


def advantage_summary(runs, afl_acc, paired) -> dict:
    """Table 2's claim from the runs: per setting whether AFL's accuracy is above every method's mean
    (``"afl_best"``, a bool Series), how many paired intervals AFL - method lie above 0
    (``"resolved"``) and the smallest mean advantage over the best method (``"smallest"``, fraction)."""
    mean_acc = runs.groupby(["setting", "method"])["accuracy"].mean().unstack("method")
    return {"afl_best": pd.Series({s: bool(afl_acc[s] > mean_acc.loc[s].max()) for s in mean_acc.index}),
            "resolved": int((paired["afl_low"] > 0).sum()),
            "smallest": (afl_acc.reindex(mean_acc.index) - mean_acc.max(axis=1)).min()}


def afl_vs_fedavg(feats, parts_by_key, config: dict, seed: int, gamma: float, device, index: str,
                  progress: bool = True, desc: str = "runs", cache: RunCache | None = None, workers: int = 1):
    """AFL and one FedAvg run (training seed ``seed``, ``FedConfig(**config)``) on each partition of
    ``parts_by_key`` = [(key, client index arrays)]. Returns test accuracies (fractions), one row per
    key (index named ``index``), columns "AFL" and "FedAvg (1 seed)" (columns named "method").
    ``cache``: a :class:`RunCache`; a run it holds (e.g. from :func:`afl_setting_runs` or
    :func:`run_baselines` on the same partition object) is reused, and the new runs are kept; ``workers``
    forked processes run the new FedAvg runs (:meth:`RunCache.federated_many`)."""
    cache = RunCache() if cache is None else cache
    train = torch.from_numpy(feats.x_train), torch.from_numpy(feats.y_train)
    test = torch.from_numpy(feats.x_test), torch.from_numpy(feats.y_test)
    hists = cache.federated_many([("fedavg", parts, seed) for _, parts in parts_by_key], config, None, train, test,
                                 feats.num_classes, workers=workers, desc=f"{desc} (FedAvg)", progress=progress)
    rows = {}
    for (key, parts), hist in zip(tqdm(parts_by_key, desc=f"{desc} (AFL)", disable=not progress), hists):
        res = cache.afl(feats, parts, gamma, device)
        rows[key] = {"AFL": head_accuracy(res.weights, feats.x_test, feats.y_test), "FedAvg (1 seed)": hist.final_acc}
    return pd.DataFrame.from_dict(rows, orient="index").rename_axis(index=index, columns="method")


def ri_ablation(feats, parts_by_k, gammas: Sequence[float], device, rerun: bool = False,
                base_gamma: float | None = None, cache: RunCache | None = None):
    """Table 4's ablation: for each (K, parts) of ``parts_by_k`` and gamma, the test accuracy (%) of the
    head before (``"w/o RI"``, a joint ridge with lambda = K gamma) and after the restoration (eq. 15).
    Returns a table indexed by K with columns (γ, RI).

    One protocol run per K (at ``base_gamma``, default ``gammas[0]``) gives the server's aggregate
    ``C^r = X^T X + K gamma_0 I`` and ``B = C^r W^r = sum_k X_k^T Y_k``. Another gamma changes each
    client's ``C_k^r`` by ``(gamma - gamma_0) I`` and leaves ``B`` unchanged (``C_k^r W_k^r = X_k^T Y_k``
    for every gamma), so the server's state at gamma is ``C^r + K (gamma - gamma_0) I`` with the same
    ``B``: the server's solve and restoration at gamma, without the clients' d x d work again.
    ``cache``: a :class:`RunCache` whose run at ``base_gamma`` on the same partition object (e.g. the
    client-count sweep's, :func:`afl_vs_fedavg`) is reused. ``rerun=True`` runs the whole protocol at
    every gamma instead (a test checks both agree).
    """
    cache = RunCache() if cache is None else cache
    rows = []
    for k, parts in parts_by_k:
        heads = {}
        if rerun:
            for g in gammas:
                res = run_afl(feats.x_train, feats.y_train, parts, feats.num_classes, gamma=g, device=device)
                heads[g] = res.weights_regularized, res.weights
        else:
            g0 = float(gammas[0] if base_gamma is None else base_gamma)
            check_positive("base_gamma", g0, strict=False)
            res = cache.afl(feats, parts, g0, device)
            rhs = res.gram_regularized @ res.weights_regularized
            eye = torch.eye(rhs.shape[0], dtype=rhs.dtype, device=rhs.device)
            for g in gammas:
                gram = res.gram_regularized + len(parts) * (float(g) - g0) * eye
                w_r = ridge_solve(gram, rhs)
                heads[g] = w_r, ri_restore(w_r, gram, len(parts) * float(g))
        for g in gammas:
            for ri_label, w in zip(("w/o RI", "w/ RI"), heads[g]):
                rows.append({"K": k, "γ": g, "RI": ri_label,
                             "accuracy (%)": 100 * head_accuracy(w, feats.x_test, feats.y_test)})
    ri = pd.DataFrame(rows).pivot_table(index="K", columns=["γ", "RI"], values="accuracy (%)")
    return ri.reindex(columns=pd.MultiIndex.from_product([list(gammas), ["w/o RI", "w/ RI"]], names=["γ", "RI"]))


def equal_kgamma_cells(ri):
    """Without RI the head depends on K gamma only: the "w/o RI" cells of :func:`ri_ablation`'s table
    as a long frame (K, γ, acc, K·γ) and, per K·γ shared by several cells, their min / max / count."""
    no_ri = ri.xs("w/o RI", axis=1, level="RI").stack().rename("acc").reset_index()
    no_ri["K·γ"] = no_ri["K"] * no_ri["γ"]
    return no_ri, no_ri.groupby("K·γ")["acc"].agg(["min", "max", "count"]).query("count > 1")
