"""The experiment loops of the Fed-tSNE chapters (privacy, visualization benchmark, Fed-SpeClust): each
function runs one study over its parameter grid and returns a tidy frame (one row per run), or builds
one table of the chapter from such frames."""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np
import pandas as pd
from scipy.stats import spearmanr
from tqdm import tqdm

from fedlib.core import privacy
from fedlib.core.parallel import RunGrid
from fedlib.evaluation import report
from fedlib.evaluation.embedding import clustering_ari, clustering_nmi, embedding_report, kmeans_nmi, knn_accuracy
from fedlib.evaluation.report import column_by
from fedlib.evaluation.stats import mean_std, paired_difference
from fedlib.evaluation.style import human
from fedlib.fedtsne.algorithm import mmd2_u, nystrom_kernel
from fedlib.fedtsne.chapters import check_fits, client_split, load_points
from fedlib.fedtsne.dp import kernel_gradient_sensitivity
from fedlib.fedtsne.feddl import (FedDLResult, feddl, feddl_until_plateau, plateau_share, public_landmarks,
                                  resolve_gamma_only)
from fedlib.fedtsne.mmd import client_weights, gaussian_kernel
from fedlib.fedtsne.pipelines import (FED_NAMES, METHOD_NAMES, central_embedding, embed, fed_spectral_clustering,
                                      learn_landmarks)


# ------------------------------------------------------------------------------------------------
# privacy chapter (Sec. 5, Theorems 4 and 6, Figure 7)
# ------------------------------------------------------------------------------------------------
def privacy_variants(betas: Sequence[float], epsilons: Sequence[float], delta: float, tau_x: float,
                     accountant: str = "pld") -> list[tuple]:
    """The privacy chapter's variants as (name, noise, level, feddl keywords): no noise, the paper's
    heuristic noise for each beta > 0, data perturbation (Theorem 4, rows clipped to ``tau_x``) and
    gradient perturbation (Theorem 6 setting) for each epsilon."""
    variants = [("Fed (no noise)", "none", None, {})]
    variants += [(f"heuristic beta={b:g}", "heuristic", b, {"beta": b}) for b in betas if b > 0]
    variants += [(f"data perturbation eps={e:g}", "dp_data", e, {"epsilon": e, "delta": delta, "tau_x": tau_x})
                 for e in epsilons]
    variants += [(f"gradient perturbation eps={e:g}", "dp_gradient", e,
                  {"epsilon": e, "delta": delta, "dp_accountant": accountant}) for e in epsilons]
    return variants


def public_feddl(X, parts, X_public, n_landmarks: int, rounds: int, gamma: float, seed: int,
                 **feddl_kwargs) -> FedDLResult:
    """FedDL on the clients ``[X[p] for p in parts]`` with only public set-up: the given (public) ``gamma``,
    landmarks kept in the pixel box [0, 1] and Y^0 = :func:`public_landmarks` of ``X_public`` and ``seed``."""
    return feddl([X[p] for p in parts], n_landmarks, rounds=rounds, gamma=gamma, landmark_bounds=(0.0, 1.0),
                 init=public_landmarks(X_public, n_landmarks, seed), seed=seed, **feddl_kwargs)


def privacy_runs(X, labels, parts, X_public, variants: Sequence[tuple], seeds: Sequence[int],
                 methods: Sequence[str], *, n_landmarks: int, rounds: int, gamma: float,
                 tsne_max_iter: int = 1000) -> pd.DataFrame:
    """One :func:`public_feddl` run per (seed, variant of :func:`privacy_variants`), embedded by each method
    (:func:`~fedlib.fedtsne.pipelines.embed`). Rows: variant, noise, level, method, seed, FedDL
    epsilon, end-to-end epsilon, CA 10-NN, NMI (k-means)."""
    rows = []
    for s in seeds:
        for name, noise, level, kw in variants:
            res = public_feddl(X, parts, X_public, n_landmarks, rounds, gamma, s, noise=noise, **kw)
            for method in methods:
                out = embed(method, X, parts, n_landmarks, seed=s, feddl_result=res, tsne_max_iter=tsne_max_iter)
                rows.append({"variant": name, "noise": noise, "level": level, "method": method, "seed": s,
                             "FedDL epsilon": res.epsilon, "end-to-end epsilon": out.epsilon,
                             "CA 10-NN": knn_accuracy(out.embedding, labels, 10, seed=s),
                             "NMI": kmeans_nmi(out.embedding, labels, seed=s)})
    return pd.DataFrame(rows)


def paired_vs_reference(runs: pd.DataFrame, metric: str, method: str, noise: str, level: float):
    """Paired difference (by seed) of ``metric`` between the runs of (method, noise, level) and the noise-free
    runs of ``method`` (:func:`privacy_runs` frame); None with fewer than 2 runs."""
    ref = runs[(runs.noise == "none") & (runs.method == method)].set_index("seed")[metric]
    g = runs[(runs.noise == noise) & (runs.method == method) & (runs.level == level)].set_index("seed")[metric]
    if len(g) < 2:
        return None
    return paired_difference(g.values, ref.loc[g.index].values)


def recovery_epsilon(runs: pd.DataFrame, method: str, noise: str, epsilons: Sequence[float],
                     metric: str = "CA 10-NN", threshold: float = -0.05) -> float | None:
    """Smallest epsilon of the grid at which the 95 % interval of the paired ``metric`` difference against
    the noise-free run lies above ``threshold`` (None when none does)."""
    for e in sorted(epsilons):
        d = paired_vs_reference(runs, metric, method, noise, e)
        if d is not None and d.low > threshold:
            return e
    return None


def nominal_epsilon(result: FedDLResult, parts, gamma: float, delta: float) -> float:
    """The heuristic noise's 'nominal' epsilon (orientation only, NOT a guarantee): each client's per-round
    sd taken as fixed and public, relative to the kernel sensitivity, composed by the RDP accountant;
    the largest over clients."""
    n_y = len(result.landmarks)
    return max(privacy.gaussian_epsilon(result.noise_sd[:, p] / kernel_gradient_sensitivity(len(ix), n_y, gamma),
                                        delta, accountant="rdp") for p, ix in enumerate(parts))


def beta_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """The noise-free and heuristic rows of a :func:`privacy_runs` frame with a column beta (0 = no noise)."""
    out = runs[runs.noise.isin(["none", "heuristic"])].copy()
    out["beta"] = out.level.fillna(0.0).astype(float)
    return out


def beta_table(betas_frame: pd.DataFrame, methods: Sequence[str], nominal: dict, metric: str = "NMI",
               digits: int = 3) -> pd.DataFrame:
    """Figure 7 as a table: per method and beta, ``metric`` mean ± sample std, the nominal epsilon and the
    paired difference against beta = 0 (frame from :func:`beta_runs`)."""
    rows = []
    for method in methods:
        ref = betas_frame[(betas_frame.beta == 0) & (betas_frame.method == method)].set_index("seed")[metric]
        for b in sorted(betas_frame.beta.unique()):
            g = betas_frame[(betas_frame.beta == b) & (betas_frame.method == method)].set_index("seed")[metric]
            rows.append({"method": method, "beta": b, metric: mean_std(g, digits),
                         "nominal epsilon (RDP, seed 0, not a guarantee)": "-" if b == 0 else f"{nominal[b]:.3g}",
                         "paired diff vs beta=0": "-" if b == 0 else paired_difference(
                             g.values, ref.loc[g.index].values).format(digits) if len(g) >= 2 else "n=1"})
    return pd.DataFrame(rows)


def beta_trend(betas_frame: pd.DataFrame, methods: Sequence[str], metric: str = "NMI") -> dict:
    """Spearman correlation of beta and ``metric`` over all runs of each method (NaN with one beta)."""
    out = {}
    for method in methods:
        sub = betas_frame[betas_frame.method == method]
        out[method] = spearmanr(sub.beta, sub[metric]).statistic if sub.beta.nunique() > 1 else float("nan")
    return out


# ------------------------------------------------------------------------------------------------
# Fed-SpeClust chapter (Algorithm 3, Table 5)
# ------------------------------------------------------------------------------------------------
SPLIT_LABELS = {"iid": "IID", "non_iid": "non-IID"}


def speclust_data(names: Sequence[str], max_points, num_clients: int, seeds: Sequence[int], **fits):
    """The Fed-SpeClust chapter's data: per dataset :func:`load_points` (stratified, seed 0), the size
    checks ``fits`` (name=value, :func:`check_fits` with strict=False) and the IID / non-IID client splits
    of every seed. Returns (data: name -> (X, y, n_classes), splits: name -> seed -> {"IID", "non-IID"} ->
    index arrays, info frame)."""
    data, splits, info = {}, {}, []
    for name in names:
        X, y, classes = load_points(name, max_points, seed=0)
        check_fits(name, len(X), strict=False, **fits)
        data[name] = (X, y, len(classes))
        splits[name] = {seed: {label: client_split(y, num_clients, split, seed) for split, label in SPLIT_LABELS.items()}
                        for seed in seeds}
        non_iid = splits[name][seeds[0]]["non-IID"]
        sizes = [len(p) for p in non_iid]
        info.append({"dataset (ours)": name, "points": len(X), "features": X.shape[1], "classes": len(classes),
                     "non-IID: classes per client": max(len(np.unique(y[p])) for p in non_iid),
                     "non-IID client sizes": f"{min(sizes)}-{max(sizes)}"})
    return data, splits, pd.DataFrame(info).set_index("dataset (ours)")


def speclust_runs(data: dict, splits: dict, seeds: Sequence[int], variants: Sequence[tuple], *, n_landmarks: int,
                  gamma_rule: str, rounds: dict, beta: float = 1.0, feddl_results: dict | None = None,
                  split_check_seeds: Sequence[int] | None = None, dtype: str = "float64", progress: bool = True):
    """Centralized spectral clustering and Fed-SpeClust (:func:`fed_spectral_clustering`) for every dataset,
    seed and (variant, split, noise) of ``variants``; ``dtype``: FedDL's arithmetic (:func:`feddl`).
    ``feddl_results``: FedDL runs already made, keyed (dataset, seed, variant, split), reused instead of
    running FedDL again (they must be the runs this function would make: same clients, rounds, gamma rule,
    noise, seed and dtype; e.g. the noise-free trace of
    :func:`~fedlib.fedtsne.feddl.feddl_until_plateau`; their FedDL seconds are added to the run's).

    ``split_check_seeds`` (None: every seed): the seeds on which every noise-free variant runs its own
    FedDL. On the other seeds a noise-free variant after the first one takes the first one's landmarks:
    noise-free FedDL in gradient mode with size weights descends the pooled gradient whatever the split,
    so its landmarks are the same up to round-off (:func:`split_invariance` measures it on the check
    seeds). Its clients still upload their kernel blocks and the server assembles and clusters them;
    its "final F(Y)" is F at those landmarks on its own clients, its FedDL seconds are NaN (not run) and
    it has no objective curve. Column "FedDL": "own run" or "landmarks of <variant> <split>".

    Returns (runs frame: dataset, seed, variant, split, FedDL, gamma, NMI, ARI, kernel rel. error, final
    F(Y), mean noise sd, uploads (MB), seconds; landmarks and objectives keyed (dataset, seed, variant,
    split), of the runs made)."""
    check = set(seeds if split_check_seeds is None else split_check_seeds)
    if not check <= set(seeds):
        raise ValueError(f"split_check_seeds must be a subset of seeds {list(seeds)}, got {split_check_seeds!r}")
    noise_free = [(v, s) for v, s, nz in variants if nz == "none"]

    feddl_results = feddl_results or {}
    for key, res in feddl_results.items():
        name, seed, variant, split = key
        noise = {(v, s): nz for v, s, nz in variants}.get((variant, split))
        if name not in data or seed not in seeds or noise is None:
            raise ValueError(f"feddl_results key {key!r} is not a (dataset, seed, variant, split) of this study")
        if res.noise != noise or res.rounds != rounds[name] or len(res.landmarks) != n_landmarks:
            raise ValueError(f"feddl_results[{key!r}] is not this study's run (noise {res.noise!r}, {res.rounds} "
                             f"rounds, {len(res.landmarks)} landmarks; expected {noise!r}, {rounds[name]}, "
                             f"{n_landmarks})")
    records, landmarks, objectives = [], {}, {}
    bar = tqdm(total=len(data) * len(seeds) * (1 + len(variants)), desc="Fed-SpeClust runs", leave=False,
               disable=not progress)
    for name, (X, y, n_classes) in data.items():
        K = None
        for seed in seeds:
            cen = fed_spectral_clustering(X, None, n_classes, centralized=True, gamma=gamma_rule, seed=seed)
            bar.update()
            if K is None:
                K = gaussian_kernel(X, None, cen.gamma)
                K_norm = np.linalg.norm(K)
            records.append({"dataset": name, "seed": seed, "variant": "central", "split": "pooled", "FedDL": "-",
                            "gamma": cen.gamma,
                            "NMI": clustering_nmi(y, cen.labels), "ARI": clustering_ari(y, cen.labels),
                            "kernel rel. error": 0.0, "final F(Y)": np.nan, "mean noise sd": 0.0,
                            "FedDL upload (MB)": 0.0, "kernel upload (MB)": 0.0, "seconds": cen.seconds})
            made = {}
            for variant, split, noise in variants:
                given, source = feddl_results.get((name, seed, variant, split)), "own run"
                parts = splits[name][seed][split]
                if noise == "none" and seed not in check and (variant, split) != noise_free[0] and given is None:
                    ref = made[noise_free[0]]
                    clients = [X[p] for p in parts]
                    w = client_weights(np.array([len(c) for c in clients], dtype=np.float64), "size")
                    F = float(np.dot(w, [mmd2_u(c, ref.landmarks, ref.gamma) for c in clients]))
                    given = replace(ref, client_data=clients, weights=w, objective=np.array([F]), seconds=np.nan)
                    source = "landmarks of " + " ".join(noise_free[0])
                res = fed_spectral_clustering(X, parts, n_classes, n_landmarks, gamma=gamma_rule,
                                              rounds=rounds[name], noise=noise, beta=beta, seed=seed,
                                              keep_affinity=True, feddl_result=given, dtype=dtype)
                made[variant, split] = res.feddl
                bar.update()
                records.append({"dataset": name, "seed": seed, "variant": variant, "split": split, "FedDL": source,
                                "gamma": res.gamma,
                                "NMI": clustering_nmi(y, res.labels), "ARI": clustering_ari(y, res.labels),
                                "kernel rel. error": np.linalg.norm(res.affinity - K) / K_norm,
                                "final F(Y)": res.feddl.objective[-1],
                                "mean noise sd": float(np.mean(res.feddl.noise_sd)) if res.feddl.noise_sd.size else 0.0,
                                "FedDL upload (MB)": res.feddl.upload_bytes / 2**20,
                                "kernel upload (MB)": res.kernel_upload_bytes / 2**20,
                                "seconds": res.seconds + (0.0 if given is None else given.seconds)})
                if source == "own run":
                    landmarks[name, seed, variant, split] = res.feddl.landmarks
                    objectives[name, seed, variant, split] = res.feddl.objective
    bar.close()
    return pd.DataFrame(records), landmarks, objectives


def split_invariance(runs: pd.DataFrame, landmarks: dict) -> tuple[pd.Series, float, float]:
    """From :func:`speclust_runs`: (relative spread max/min - 1 of gamma per dataset, largest |landmark
    difference| of noise-free IID vs non-IID FedDL over the seeds where both ran their own FedDL, largest
    |NMI IID - NMI non-IID| of noise-free runs)."""
    spread = runs.groupby("dataset")["gamma"].agg(lambda g: g.max() / g.min() - 1)
    gaps = [np.abs(landmarks[name, seed, "Fed", "IID"] - landmarks[name, seed, "Fed", "non-IID"]).max()
            for (name, seed, variant, split) in landmarks
            if variant == "Fed" and split == "IID" and (name, seed, "Fed", "non-IID") in landmarks]
    if not gaps:
        raise ValueError("no seed with its own noise-free IID and non-IID FedDL runs to compare")
    same = runs[runs["variant"] == "Fed"].pivot_table(index=["dataset", "seed"], columns="split", values="NMI")
    return spread, float(max(gaps)), float((same["IID"] - same["non-IID"]).abs().max())


def setting_cells(runs: pd.DataFrame, datasets: Sequence[str], settings: Sequence[tuple],
                  metrics: Sequence[str]) -> dict:
    """(dataset, (variant, split), metric) -> that setting's per-seed values in seed order
    (:func:`fedlib.evaluation.report.column_by`): what the tables and paired differences use."""
    return {(name, col, metric): column_by(runs, metric, dataset=name, variant=col[0], split=col[1])
            for name in datasets for col in settings for metric in metrics}


def cells_table(cells: dict, datasets: Sequence[str], settings: Sequence[tuple], names: Sequence[str],
                metrics: Sequence[str], labels: dict | None = None, digits: int = 4) -> pd.DataFrame:
    """"mean ± sample std" per (dataset label, metric) row and setting column (named ``names``) of
    :func:`setting_cells`."""
    return pd.DataFrame({((labels or {}).get(name, name), metric): {cn: mean_std(cells[name, col, metric], digits=digits)
                                                 for col, cn in zip(settings, names)}
                         for name in datasets for metric in metrics}).T


def paired_cells(cells: dict, paper: pd.DataFrame, datasets: Sequence[str], pairs: Sequence[tuple],
                 metrics: Sequence[str], labels: dict | None = None, digits: int = 4) -> tuple[dict, pd.DataFrame]:
    """Paired differences (by seed) for each (label, setting a, setting b) of ``pairs`` on the cells of
    :func:`setting_cells`, followed by the same differences of the paper's means (``paper``: a
    transcribed table with (variant, split, "mean") columns). Returns ({(dataset, metric, label):
    PairedDifference}, table)."""
    col = "mean [95% CI] (ours) or difference of means (paper)"
    pdiff, rows = {}, []
    for name in datasets:
        for metric in metrics:
            for lab, a, b in pairs:
                d = pdiff[name, metric, lab] = paired_difference(cells[name, a, metric], cells[name, b, metric])
                rows.append({"dataset": (labels or {}).get(name, name), "metric": metric, "comparison": lab, col: d.format(digits)})
    for idx in paper.index:
        for lab, a, b in pairs:
            rows.append({"dataset": f"paper: {idx[0]}", "metric": idx[1], "comparison": lab,
                         col: f"{paper.loc[idx, (*a, 'mean')] - paper.loc[idx, (*b, 'mean')]:+.{digits}f}"})
    return pdiff, pd.DataFrame(rows).set_index(["dataset", "metric", "comparison"])


def change_table(cells: dict, paper: pd.DataFrame, datasets: Sequence[str], settings: Sequence[tuple],
                 names: Sequence[str], metrics: Sequence[str], labels: dict | None = None) -> pd.DataFrame:
    """Each setting minus the first (the centralized baseline), mean over runs, for the paper's table and
    ours; index (source, dataset, metric), one column per setting after the first."""
    rows = []
    for idx in paper.index:
        base = paper.loc[idx, (*settings[0], "mean")]
        rows.append({"source": "paper", "dataset": idx[0], "metric": idx[1],
                     **{cn: paper.loc[idx, (*col, "mean")] - base for col, cn in zip(settings[1:], names[1:])}})
    for name in datasets:
        for metric in metrics:
            base = cells[name, settings[0], metric].mean()
            rows.append({"source": "ours", "dataset": (labels or {}).get(name, name), "metric": metric,
                         **{cn: cells[name, col, metric].mean() - base for col, cn in zip(settings[1:], names[1:])}})
    return pd.DataFrame(rows).set_index(["source", "dataset", "metric"])


def kernel_landmark_sweep(X, y, parts, grid: Sequence[int], n_classes: int, *, gamma_rule: str, rounds: int,
                          seed: int = 0, feddl_results: dict | None = None, central_nmi: float | None = None,
                          dtype: str = "float64", progress: bool = True):
    """Fed-SpeClust's kernel error and NMI against n_y (the chapter's Sec. 5): for each n_y of ``grid``,
    FedDL landmarks (:func:`fed_spectral_clustering` on ``parts``), a nested uniform sample of X (oracle)
    and the untrained Y^0; relative error of clip_0(C W^+ C^T), NMI of spectral clustering on it, share of
    ||C||_F^2 in C's top singular direction. ``feddl_results``: {n_y: FedDLResult} of noise-free runs
    already made on ``parts`` with ``rounds``, ``gamma_rule`` and ``seed`` (reused, not re-run);
    ``central_nmi``: the NMI of the centralized spectral clustering of X with this gamma and ``seed`` when
    already computed (:func:`speclust_runs`' central run of ``seed``; else computed here). ``dtype``: FedDL's
    arithmetic (:func:`feddl`; the kernels stay float64). Returns (frame,
    dict gamma, K, central NMI, last run, assembly gap = max |server's matrix - C W^+ C^T| of the FedDL
    rows)."""
    from sklearn.cluster import SpectralClustering

    feddl_results = feddl_results or {}
    for ny, given in feddl_results.items():
        if ny not in grid or len(given.landmarks) != ny or given.rounds != rounds or given.noise != "none":
            raise ValueError(f"feddl_results[{ny!r}] is not a noise-free run of {rounds} rounds with n_y in grid")
    # the centralized baseline's gamma: the rule on the pooled data as one client (fed_spectral_clustering)
    gamma = resolve_gamma_only([np.asarray(X, dtype=np.float64)], gamma_rule, "size", 1000, seed)
    K = gaussian_kernel(X, None, gamma)
    K_norm = np.linalg.norm(K)
    cen_nmi = central_nmi
    if cen_nmi is None:
        cen_nmi = clustering_nmi(y, SpectralClustering(n_classes, affinity="precomputed",
                                                       random_state=seed).fit_predict(K))
    order = np.random.default_rng(seed).permutation(len(X))
    rows, gap, res = [], 0.0, None
    for ny in tqdm(grid, desc="landmark counts", leave=False, disable=not progress):
        res = fed_spectral_clustering(X, parts, n_classes, ny, gamma=gamma_rule, rounds=rounds, seed=seed,
                                      keep_affinity=True, feddl_result=feddl_results.get(ny), dtype=dtype)
        sets = {"FedDL": res.feddl.landmarks, "uniform sample (oracle, not federated)": X[order[:ny]],
                "untrained (FedDL init)": res.feddl.init_landmarks}
        for lname, L in sets.items():
            C = gaussian_kernel(X, L, gamma)
            Kh = nystrom_kernel(C, gaussian_kernel(L, None, gamma))
            if lname == "FedDL":
                gap = max(gap, float(np.abs(Kh - res.affinity).max()))
                labels = res.labels
            else:
                labels = SpectralClustering(n_classes, affinity="precomputed", random_state=seed).fit_predict(Kh)
            sv = np.linalg.svd(C, compute_uv=False)
            rows.append({"n_y": ny, "landmarks": lname, "kernel rel. error": np.linalg.norm(Kh - K) / K_norm,
                         "NMI": clustering_nmi(y, labels), "top share of C": sv[0] ** 2 / (sv ** 2).sum()})
    return pd.DataFrame(rows), {"gamma": gamma, "K": K, "central NMI": cen_nmi, "last": res, "assembly gap": gap}


# ------------------------------------------------------------------------------------------------
# visualization benchmark (Sec. 6.1, Tables 1-4, Figs. 2, 3, 5, 6)
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SweepPlan:
    """A study's runs not yet made (``plan=True`` of :func:`convergence_study`, :func:`step_study`,
    :func:`benchmark_runs`, :func:`trace_embeddings`, :func:`client_sweep`, :func:`landmark_sweep`):
    ``jobs``, ``run(job)`` (one job, seeded by its own seed), ``priority(job)`` (the job's estimated work,
    comparable across studies: :func:`_feddl_work`; larger is handed out earlier) and ``assemble(results)``
    (the job results in job order -> what the study returns)."""

    jobs: list
    run: Callable
    priority: Callable
    assemble: Callable
    desc: str


def _feddl_work(n_points: int, n_landmarks: int, runs: int = 1) -> int:
    """Estimated work of ``runs`` FedDL runs on ``n_points`` points with ``n_landmarks`` landmarks, the
    priority of a :class:`SweepPlan` job: a round's products cost about n n_y m (client kernels and
    gradients) plus n_y^2 m (the landmarks' own kernel); the rounds until the plateau are unknown
    beforehand and taken as equal."""
    return runs * (n_points * n_landmarks + n_landmarks ** 2)


def run_sweeps(plans: Sequence[SweepPlan], workers: int | None = 1, progress: bool = True) -> list:
    """The jobs of every plan in ONE :class:`fedlib.core.parallel.RunGrid` (``workers`` processes; None:
    :func:`fedlib.core.parallel.default_workers`), the most work first, so short runs fill the wait for
    the long ones; each plan's assembled result, in the order of ``plans``."""
    jobs = [(i, job) for i, plan in enumerate(plans) for job in plan.jobs]
    grid = RunGrid(lambda n: plans[jobs[n][0]].run(jobs[n][1]))
    done = grid.fill(range(len(jobs)), workers, cost=lambda g: plans[jobs[g[0]][0]].priority(jobs[g[0]][1]),
                     desc=" + ".join(p.desc for p in plans), progress=progress)
    return [plan.assemble([r for (i, _), r in zip(jobs, done) if i == k]) for k, plan in enumerate(plans)]


def _plateau_job(points, scorer, split: str, seed: int, num_clients: int, n_landmarks: int, checkpoints, *,
                 tol: float, window: float, min_window: int, check_every: int, max_rounds: int,
                 stop_at_plateau: bool = True, dtype: str = "float64", lr_scale: float = 1.0) -> tuple:
    """One noise-free FedDL run of :func:`convergence_study` / :func:`step_study` (:func:`feddl_until_plateau`
    on the ``split`` clients of ``points`` = (X, y, _), step ``lr_scale``/L) and, unless ``checkpoints`` is
    None, one row per kept round: split, round, the D-hat 10-NN overlap (``scorer.landmark_quality``) and
    the share of the landmarks' path ||Y^s - Y^0|| / ||Y^S - Y^0||. Returns (trace, rows)."""
    X, y, _ = points
    parts = client_split(y, num_clients, split, seed)
    tr = feddl_until_plateau([X[p] for p in parts], n_landmarks, tol=tol, window=window, min_window=min_window,
                             check_every=min(check_every, max_rounds), max_rounds=max_rounds,
                             stop_at_plateau=stop_at_plateau, checkpoints=checkpoints or (), seed=seed, dtype=dtype,
                             lr_scale=lr_scale)
    rows = []
    if checkpoints is not None:
        path = np.linalg.norm(tr.landmarks[tr.rounds] - tr.landmarks[0])
        rows = [{"split": SPLIT_LABELS[split], "round": s, "D-hat 10-NN": scorer.landmark_quality(Y)["D-hat 10-NN"],
                 "moved": np.linalg.norm(Y - tr.landmarks[0]) / path} for s, Y in tr.landmarks.items()]
    return tr, rows


def convergence_study(data: dict, scorers: dict, seeds: Sequence[int], num_clients: int, n_landmarks: int, *,
                      tol: float, window: float, min_window: int, check_every: int, max_rounds: int,
                      stop_at_plateau: bool, checkpoints: Sequence[int], dtype: str = "float64",
                      workers: int | None = 1, progress: bool = True, plan: bool = False):
    """Noise-free FedDL until its plateau (:func:`feddl_until_plateau`, arithmetic ``dtype``) for every dataset (name -> (X, y, _)),
    seed and split; for the first seed, the D-hat 10-NN overlap (``scorers[name].landmark_quality``) and
    the share of the landmarks' path ||Y^s - Y^0|| / ||Y^S - Y^0|| at every kept round. Returns (traces
    keyed (dataset, split, seed), frame dataset, split, round, D-hat 10-NN, moved).

    Every (dataset, seed, split) is one job, run in ``workers`` forked processes (None:
    :func:`fedlib.core.parallel.default_workers`; 1: in this process); each run is seeded by its own seed,
    so the results equal those of one process. ``plan=True``: nothing is run; returns the
    :class:`SweepPlan` for :func:`run_sweeps` (with the sweeps')."""
    jobs = [(name, seed, split) for name in data for seed in seeds for split in SPLIT_LABELS]
    rule = dict(tol=tol, window=window, min_window=min_window, check_every=check_every, max_rounds=max_rounds,
                stop_at_plateau=stop_at_plateau, dtype=dtype)

    def one(job):
        name, seed, split = job
        return _plateau_job(data[name], scorers[name], split, seed, num_clients, n_landmarks,
                            checkpoints if seed == seeds[0] else None, **rule)

    def assemble(done):
        traces, rows = {}, []
        for (name, seed, split), (tr, r) in zip(jobs, done):
            traces[name, split, seed] = tr
            rows += [{"dataset": name, **row} for row in r]
        for name in data:
            scorers[name].release()
        return traces, pd.DataFrame(rows)

    # the first seed's jobs also score their checkpoints: handed out first among equal work
    out = SweepPlan(jobs, one, lambda job: (_feddl_work(len(data[job[0]][1]), n_landmarks), job[1] == seeds[0]),
                    assemble, "FedDL until plateau")
    return out if plan else run_sweeps([out], workers, progress)[0]


def trace_embeddings(X, parts, trace, rounds: Sequence[int], seed: int, n_landmarks: int, *,
                     embed_kwargs: dict | None = None, workers: int | None = 1, progress: bool = True,
                     plan: bool = False) -> dict | SweepPlan:
    """Fed-tSNE as FedDL trains (paper Figs. 3, 5): {s: embedding (n, 2)} of X's clients ``parts`` by
    :func:`embed` with the landmarks ``trace`` (a :class:`FedDLTrace`) kept at every round s of ``rounds``,
    t-SNE seeded by ``seed``. One job per round (``workers`` forked processes; ``plan=True``: the
    :class:`SweepPlan` for :func:`run_sweeps`)."""
    missing = sorted(set(rounds) - set(trace.landmarks))
    if missing:
        raise ValueError(f"rounds {missing} were not kept by the trace (kept: {sorted(trace.landmarks)})")
    jobs = list(rounds)

    def one(s):
        fd = dataclasses.replace(trace.result, landmarks=trace.landmarks[s])
        return embed("tsne", X, parts, n_landmarks, seed=seed, feddl_result=fd, **(embed_kwargs or {})).embedding

    out = SweepPlan(jobs, one, lambda s: (0, 0), lambda done: dict(zip(jobs, done)), "embeddings as FedDL trains")
    return out if plan else run_sweeps([out], workers, progress)[0]


def plateau_study(traces: dict, window: float = 0.1, min_window: int = 10) -> pd.DataFrame:
    """One row per trace of :func:`convergence_study`: dataset, split, seed, gamma, plateau round, rounds run,
    F(Y^0), F(Y^S), share of the decrease in the last window (:func:`plateau_share`), FedDL seconds."""
    return pd.DataFrame([{"dataset": n, "split": SPLIT_LABELS[s], "seed": seed, "gamma": tr.gamma,
                          "plateau round": tr.plateau, "rounds run": tr.rounds, "F(Y^0)": tr.objective[0],
                          "F(Y^S)": tr.objective[-1],
                          "share of decrease in last 10 %": plateau_share(tr.objective, window=window,
                                                                          min_window=min_window),
                          "FedDL seconds": tr.seconds} for (n, s, seed), tr in traces.items()])


def plateau_summary(study: pd.DataFrame) -> pd.DataFrame:
    """Per (dataset, split) of :func:`plateau_study`: rounds run and gamma as mean ± sample std, the largest
    share of the decrease in the last 10 %, mean F(Y^0), F(Y^S) and FedDL seconds."""
    return study.groupby(["dataset", "split"]).agg(
        **{"rounds run": ("rounds run", lambda v: mean_std(v, digits=0)),
           "largest share in last 10 %": ("share of decrease in last 10 %", "max"),
           "gamma": ("gamma", lambda v: mean_std(v, digits=4)),
           "F(Y^0)": ("F(Y^0)", "mean"), "F(Y^S)": ("F(Y^S)", "mean"),
           "FedDL seconds": ("FedDL seconds", "mean")})


def gain_after(traces: dict, overlap: pd.DataFrame, seed: int, at: int = 50) -> tuple[float, list]:
    """How much the D-hat 10-NN overlap (``overlap``: index (dataset, split), columns rounds) still gains after
    round ``at``, for the traces of ``seed`` that ran longer. Returns (largest gain or NaN, rows (dataset,
    split, gain, overlap at 0, at ``at``, at the end, rounds))."""
    late = []
    for (n, split, s), tr in traces.items():
        if s != seed:
            continue
        row = overlap.loc[(n, SPLIT_LABELS[split])]
        if tr.rounds > at and np.isfinite(row.get(at, np.nan)):
            late.append((n, SPLIT_LABELS[split], row[tr.rounds] - row[at], row[0], row[at], row[tr.rounds], tr.rounds))
    return (max(item[2] for item in late) if late else np.nan), late


def step_study(data: dict, scorers: dict, seed: int, num_clients: int, n_landmarks: int, scales: Sequence[float], *,
               tol: float, window: float, min_window: int, check_every: int, max_rounds: int,
               checkpoints: Sequence[int], stop_at_plateau: bool = True, dtype: str = "float64",
               workers: int | None = 1, progress: bool = True, plan: bool = False):
    """FedDL's step against the data-free bound: the noise-free runs of :func:`convergence_study` for ``seed``
    on every dataset and split, at the steps c/L for c in ``scales`` (``lr_scale``; L of
    :func:`lipschitz_bound` is an upper bound on the gradient's Lipschitz constant, the paper's step is
    "the reverse of the Lipschitz constant"), each run as the study's (plateau rule, ``max_rounds``), with the D-hat
    10-NN overlap at round 0, every checkpoint and the last round. Returns (traces keyed (dataset, split, c),
    frame dataset, split, step, round, D-hat 10-NN, moved); one job per run (``plan=True``: the
    :class:`SweepPlan` for :func:`run_sweeps`)."""
    jobs = [(name, split, float(c)) for name in data for split in SPLIT_LABELS for c in scales]
    rule = dict(tol=tol, window=window, min_window=min_window, check_every=check_every, max_rounds=max_rounds,
                stop_at_plateau=stop_at_plateau, dtype=dtype)

    def one(job):
        name, split, c = job
        return _plateau_job(data[name], scorers[name], split, seed, num_clients, n_landmarks, checkpoints,
                            lr_scale=c, **rule)

    def assemble(done):
        traces, rows = {}, []
        for (name, split, c), (tr, r) in zip(jobs, done):
            traces[name, split, c] = tr
            rows += [{"dataset": name, "step": c, **row} for row in r]
        return traces, pd.DataFrame(rows, columns=["dataset", "step", "split", "round", "D-hat 10-NN", "moved"])

    # larger steps plateau in fewer rounds: their work is taken as 1/c of a run at 1/L
    out = SweepPlan(jobs, one, lambda job: (_feddl_work(len(data[job[0]][1]), n_landmarks) / job[2], 1),
                    assemble, "FedDL step study")
    return out if plan else run_sweeps([out], workers, progress)[0]


def step_table(traces: dict, conv: pd.DataFrame, step_traces: dict, step_conv: pd.DataFrame, seed: int,
               at: int = 50, rise_tol: float = 1e-3) -> pd.DataFrame:
    """One row per dataset, split and step c/L: c = 1 from :func:`convergence_study` (``traces``, ``conv``,
    run ``seed``), the others from :func:`step_study`. Columns: rounds run, plateau round, F(Y^S), the
    largest rise of F from one round to the next as a share of its total decrease F(Y^0) - min F, whether F
    descends (that rise <= ``rise_tol``), the D-hat 10-NN overlap at round 0, ``at`` and the last round and
    the gain after ``at`` (NaN when the run stopped by round ``at``: nothing to gain after it)."""
    runs = [(n, SPLIT_LABELS[split], 1.0, tr, conv[(conv.dataset == n) & (conv.split == SPLIT_LABELS[split])])
            for (n, split, s), tr in traces.items() if s == seed]
    runs += [(n, SPLIT_LABELS[split], c, tr, step_conv[(step_conv.dataset == n)
                                                       & (step_conv.split == SPLIT_LABELS[split])
                                                       & (step_conv.step == c)])
             for (n, split, c), tr in step_traces.items()]
    rows = []
    for n, label, c, tr, q in runs:
        F = np.asarray(tr.objective)
        top, total = float(np.max(np.diff(F), initial=0.0)), float(F[0] - F.min())
        rise = top / total if total > 0 else (math.inf if top > 0 else 0.0)     # inf: F never fell below F(Y^0)
        overlap = q.set_index("round")["D-hat 10-NN"]
        end = overlap.get(tr.rounds, np.nan)
        mid = overlap.get(at, np.nan) if tr.rounds > at else np.nan
        rows.append({"dataset": n, "split": label, "step (x 1/L)": c, "rounds run": tr.rounds,
                     "plateau round": tr.plateau, "F(Y^S)": F[-1], "largest rise of F": rise,
                     "F descends": rise <= rise_tol, "D-hat 10-NN at 0": overlap.get(0, np.nan),
                     f"at {at}": mid, "at the end": end, f"gain after {at}": end - mid})
    return pd.DataFrame(rows).sort_values(["dataset", "split", "step (x 1/L)"], ignore_index=True)


def step_summary(table: pd.DataFrame, at: int = 50) -> pd.DataFrame:
    """Per step c of :func:`step_table` (index "step (x 1/L)"): descends (F descends in every run),
    largest_gain (the largest D-hat 10-NN gain after round ``at``; a run that stopped by then gains 0),
    end (mean overlap at the last round) and rounds (mean rounds run)."""
    return table.assign(late=table[f"gain after {at}"].fillna(0.0)).groupby("step (x 1/L)").agg(
        descends=("F descends", "all"), largest_gain=("late", "max"), end=("at the end", "mean"),
        rounds=("rounds run", "mean"))


def benchmark_runs(data: dict, scorers: dict, traces: dict, seeds: Sequence[int], methods: Sequence[str], *,
                   num_clients: int, n_landmarks: int, beta: float, window: float = 0.1, min_window: int = 10,
                   embed_kwargs: dict | None = None, dtype: str = "float64",
                   workers: int | None = 1, progress: bool = True, plan: bool = False):
    """The benchmark's runs (Algorithm 2): per dataset and seed, centralized t-SNE / UMAP; FedDL noise-free
    (the trace of :func:`convergence_study`) and with the paper's heuristic noise (as many rounds) on each
    split, and the untrained Y^0; each embedded by every method (:func:`embed`, ``embed_kwargs``) and
    scored (``scorers``). Returns (results: one row per embedding, dist_q: D-hat quality per FedDL run,
    costs: rounds, plateau share, seconds, gamma, uploads per FedDL run, embeddings keyed (dataset, method,
    variant, split, seed), checks: max |scorer - embedding_report| on the first embedding of each dataset and
    max |Y^0 IID - Y^0 non-IID|). ``dtype``: the Fed+ runs' FedDL arithmetic (:func:`feddl`; the traces carry
    their own). The client sweep takes its rows of these runs from the frames (:func:`main_run_rows`).

    Jobs, run in ``workers`` forked processes (None: :func:`fedlib.core.parallel.default_workers`; 1: in
    this process): per (dataset, seed) the centralized and untrained embeddings, and per (dataset, seed,
    split) the Fed+ FedDL run and the Fed / Fed+ embeddings. Every run is seeded by its seed alone (t-SNE
    random_state, FedDL seed), so the results equal those of one process. ``plan=True``: nothing is run;
    returns the :class:`SweepPlan` for :func:`run_sweeps`."""
    kw = embed_kwargs or {}

    def embedded(name, seed, variant, label, fd, parts):
        """Every method's embedding of one FedDL run: (rows, its D-hat quality row, distance upload bytes,
        {method: embedding})."""
        X, _, _ = data[name]
        sc = scorers[name]
        rows, Z, dist_row, upload = [], {}, None, None
        for i, method in enumerate(methods):
            res = embed(method, X, parts, n_landmarks, seed=seed, feddl_result=fd, **kw)
            if i == 0:   # the server's estimate: these clients hold X's rows unperturbed (no dp_data)
                dist_row = {"dataset": name, "seed": seed, "variant": variant, "split": label,
                            **sc.landmark_quality(fd.landmarks)}
                upload = res.distance_upload_bytes
            rows.append({"dataset": name, "seed": seed, "embedding": METHOD_NAMES[method], "variant": variant,
                         "split": label, "seconds": res.seconds, **sc(res.embedding, seed)})
            Z[method] = res.embedding
        return rows, dist_row, upload, Z

    def one(job):
        name, seed, split = job
        X, y, _ = data[name]
        if split is None:    # centralized runs and the untrained landmarks Y^0 (of the IID trace)
            sc, rows, Z, check = scorers[name], [], {}, None
            for method in methods:
                res = central_embedding(method, X, seed=seed, **kw)     # cached on disk: no federated parameter
                scores = sc(res.embedding, seed)
                if seed == seeds[0] and method == methods[0]:
                    ref = embedding_report(X, res.embedding, y, seed=seed)
                    check = max(abs(scores[k] - ref[k]) for k in scores)
                rows.append({"dataset": name, "seed": seed, "embedding": METHOD_NAMES[method], "variant": "central",
                             "split": "pooled", "seconds": res.seconds, **scores})
                Z[method] = res.embedding
            fd_iid = traces[name, "iid", seed].result
            untrained = embedded(name, seed, "untrained", "any", dataclasses.replace(fd_iid, landmarks=fd_iid.init_landmarks),
                                 client_split(y, num_clients, "iid", seed))
            return rows, Z, check, untrained
        # Fed: the noise-free trace; Fed+: as many rounds, with noise
        parts = client_split(y, num_clients, split, seed)
        tr = traces[name, split, seed]
        plus = learn_landmarks(X, parts, "Fed+", n_landmarks, tr.rounds, beta=beta, seed=seed, dtype=dtype)
        return plus, {variant: embedded(name, seed, variant, SPLIT_LABELS[split], fd, parts)
                      for variant, fd in (("Fed", tr.result), ("Fed+", plus))}

    jobs = [(name, seed, split) for name in data for seed in seeds for split in (None, *SPLIT_LABELS)]

    def assemble(results):
        done = dict(zip(jobs, results))
        rows, keep_Z, dist_rows, cost_rows = [], {}, [], []
        checks = {"scorer vs embedding_report": 0.0, "Y^0 split gap": 0.0}
        for name in data:
            for seed in seeds:
                central, Zc, check, untrained = done[name, seed, None]
                rows += central
                keep_Z.update({(name, method, "central", "pooled", seed): Z for method, Z in Zc.items()})
                if check is not None:
                    checks["scorer vs embedding_report"] = max(checks["scorer vs embedding_report"], check)
                runs = [("untrained", "any", untrained)]
                for split, label in SPLIT_LABELS.items():
                    plus, emb = done[name, seed, split]
                    for variant, fd in (("Fed", traces[name, split, seed].result), ("Fed+", plus)):
                        runs.append((variant, label, emb[variant]))
                        share = plateau_share(fd.objective, window=window, min_window=min_window)
                        cost_rows.append({"dataset": name, "seed": seed, "variant": variant, "split": label,
                                          "rounds": fd.rounds, "plateau share": share, "FedDL s": fd.seconds,
                                          "gamma": fd.gamma, "FedDL upload MiB": fd.upload_bytes / 2**20,
                                          "distance upload MiB": emb[variant][2] / 2**20})
                y0 = {label: traces[name, split, seed].result.init_landmarks for split, label in SPLIT_LABELS.items()}
                gap = float(np.abs(y0["IID"] - y0["non-IID"]).max())
                checks["Y^0 split gap"] = max(checks["Y^0 split gap"], gap)
                for variant, label, (emb_rows, dist_row, _, Z) in runs:
                    dist_rows.append(dist_row)
                    rows += emb_rows
                    keep_Z.update({(name, method, variant, label, seed): z for method, z in Z.items()})
            scorers[name].release()
        return pd.DataFrame(rows), pd.DataFrame(dist_rows), pd.DataFrame(cost_rows), keep_Z, checks

    # the FedDL jobs are the long ones: handed out first; the others are embeddings only
    out = SweepPlan(jobs, one, lambda job: (0 if job[2] is None else _feddl_work(len(data[job[0]][1]), n_landmarks), 0),
                    assemble, "benchmark runs")
    return out if plan else run_sweeps([out], workers, progress)[0]


def paired_differences(frame: pd.DataFrame, comparisons: Sequence[tuple], metric: str, **where) -> dict:
    """label -> paired difference (by seed) of ``metric`` between settings a and b ((variant, split) pairs) of
    ``comparisons`` = [(label, a, b), ...], over the rows of ``frame`` matching ``where`` (column=value)."""
    return {label: paired_difference(column_by(frame, metric, **where, variant=a[0], split=a[1]),
                                     column_by(frame, metric, **where, variant=b[0], split=b[1]))
            for label, a, b in comparisons}


def paired_metric_table(results: pd.DataFrame, comparisons: Sequence[tuple], datasets: Sequence[str],
                        embeddings: Sequence[str], metrics: Sequence[str], paper_tables: dict,
                        digits: int = 4) -> tuple[dict, pd.DataFrame]:
    """:func:`paired_differences` for every dataset, embedding and metric, beside the difference of the
    paper's means (``paper_tables``: dataset -> transcribed table; none for the untrained column).
    Returns ({(dataset, embedding, metric, label): PairedDifference}, table)."""
    pdiff, rows = {}, []
    for name in datasets:
        paper = paper_tables[name]() if name in paper_tables else None
        for emb in embeddings:
            for metric in metrics:
                diffs = paired_differences(results, comparisons, metric, dataset=name, embedding=emb)
                for label, a, b in comparisons:
                    d = pdiff[name, emb, metric, label] = diffs[label]
                    p = np.nan
                    if paper is not None and "untrained" not in label:
                        p = paper.loc[(emb, metric), (*a, "mean")] - paper.loc[(emb, metric), (*b, "mean")]
                    rows.append({"dataset": name, "embedding": emb, "metric": metric, "comparison": label,
                                 "ours: mean [95% CI]": d.format(digits), "paper: difference of means": p})
    return pdiff, pd.DataFrame(rows).set_index(["dataset", "embedding", "metric", "comparison"])


def sweep_feddl(X, parts, n_landmarks: int, variants: Sequence[str], seed: int, *, rounds, beta: float,
                plateau: dict | None = None, dtype: str = "float64") -> dict:
    """{variant: FedDLResult} of one sweep cell (clients ``parts``, ``n_landmarks``, ``seed``; variants "Fed",
    "Fed+"). ``rounds`` an integer: every variant runs that many rounds. ``rounds="plateau"``: the rule of the
    benchmark's main runs: noise-free FedDL until its objective plateaus (:func:`feddl_until_plateau` with
    the keywords ``plateau``: tol, window, min_window, check_every, max_rounds; RuntimeError naming
    max_rounds when it does not) and Fed+ for as many rounds (the noise-free run is made for that even
    when ``variants`` has only "Fed+"). ``dtype``: FedDL's arithmetic (:func:`feddl`)."""
    out = {}
    if isinstance(rounds, str):
        if rounds != "plateau":
            raise ValueError(f"rounds must be a positive integer or 'plateau', got {rounds!r}")
        opts = dict(plateau or {})
        trace = feddl_until_plateau([X[p] for p in parts], n_landmarks, seed=seed, stop_at_plateau=True, dtype=dtype,
                                    **opts)
        if trace.plateau is None:
            raise RuntimeError(f"FedDL did not plateau within max_rounds={opts.get('max_rounds', 1000)}: "
                               "raise max_rounds")
        rounds = trace.rounds
        if "Fed" in variants:
            out["Fed"] = trace.result
    for variant in variants:
        if variant not in out:
            out[variant] = learn_landmarks(X, parts, variant, n_landmarks, rounds, beta=beta, seed=seed, dtype=dtype)
    return out


def client_sweep(X, y, client_runs: Sequence[tuple], seeds: Sequence[int], scorer, *, n_landmarks: int,
                 rounds, beta: float, embed_kwargs: dict | None = None, plateau: dict | None = None,
                 skip: Collection[tuple] = (), dtype: str = "float64", workers: int | None = 1,
                 progress: bool = True, plan: bool = False) -> pd.DataFrame | SweepPlan:
    """Fed-tSNE and Fed-tSNE+ for every (split, number of clients) of ``client_runs`` and seed (paper
    Tables 3-4), FedDL by :func:`sweep_feddl` (``rounds``: an integer or "plateau" with the rule's
    keywords ``plateau``): rows seed, split, clients, method, rounds, gamma, reused (False) and the scorer's
    metrics. ``skip`` {(split, clients, seed)}: runs made elsewhere and left out (the benchmark's main runs:
    their rows come from :func:`main_run_rows`). ``dtype``: FedDL's arithmetic (:func:`feddl`). Every
    (seed, split, clients) is one job, run in ``workers`` forked processes (None:
    :func:`fedlib.core.parallel.default_workers`; 1: in this process), seeded by its seed alone: the rows
    equal those of one process. ``plan=True``: nothing is run; returns the :class:`SweepPlan` for
    :func:`run_sweeps` (with other studies')."""
    skip = set(skip)
    jobs = [(seed, split, k) for seed in seeds for split, k in client_runs if (split, k, seed) not in skip]

    def one(job):
        seed, split, k = job
        parts = client_split(y, k, split, seed)
        fds = sweep_feddl(X, parts, n_landmarks, ["Fed", "Fed+"], seed, rounds=rounds, beta=beta, plateau=plateau,
                          dtype=dtype)
        return [{"seed": seed, "split": SPLIT_LABELS[split], "clients": k,
                 "method": "Fed-tSNE" + ("+" if variant == "Fed+" else ""), "rounds": fd.rounds, "gamma": fd.gamma,
                 "reused": False,
                 **scorer(embed("tsne", X, parts, n_landmarks, seed=seed, feddl_result=fd,
                                **(embed_kwargs or {})).embedding, seed)}
                for variant, fd in fds.items()]

    out = SweepPlan(jobs, one, lambda job: (_feddl_work(len(y), n_landmarks, runs=2), job[2]),
                    lambda done: pd.DataFrame([row for rows in done for row in rows]), "client sweep")
    return out if plan else run_sweeps([out], workers, progress)[0]


def main_run_rows(results: pd.DataFrame, costs: pd.DataFrame, dataset: str, keys: Collection[tuple]) -> pd.DataFrame:
    """The :func:`client_sweep` rows of runs the benchmark's main runs made (:func:`benchmark_runs`: the same
    data, clients, rounds rule, beta and t-SNE settings, so the same runs): Fed-tSNE and Fed-tSNE+ of
    ``dataset`` for every (split, clients, seed) of ``keys`` (``clients`` = the main runs' number of
    clients), with reused = True."""
    rows = []
    for split, k, seed in sorted(keys):
        for variant in ("Fed", "Fed+"):
            def run(frame):
                return frame[(frame["dataset"] == dataset) & (frame["seed"] == seed) & (frame["variant"] == variant)
                             & (frame["split"] == SPLIT_LABELS[split])]
            res, cost = run(results), run(costs)
            res = res[res["embedding"] == METHOD_NAMES["tsne"]]
            if len(res) != 1 or len(cost) != 1:
                raise ValueError(f"no main run for {dataset}, {split}, seed {seed}, {variant} with t-SNE")
            metrics = res.drop(columns=["dataset", "seed", "embedding", "variant", "split", "seconds"]).iloc[0]
            rows.append({"seed": seed, "split": SPLIT_LABELS[split], "clients": k,
                         "method": "Fed-tSNE" + ("+" if variant == "Fed+" else ""),
                         "rounds": int(cost["rounds"].iloc[0]), "gamma": float(cost["gamma"].iloc[0]),
                         "reused": True, **metrics.to_dict()})
    return pd.DataFrame(rows)


def landmark_sweep(X, y, splits: Sequence[str], counts: Sequence[int], variants: Sequence[str],
                   methods: Sequence[str], seeds: Sequence[int], scorer, *, num_clients: int, rounds,
                   beta: float, window: float = 0.1, min_window: int = 10,
                   embed_kwargs: dict | None = None, plateau: dict | None = None,
                   dtype: str = "float64", workers: int | None = 1,
                   progress: bool = True, plan: bool = False) -> tuple[pd.DataFrame, pd.DataFrame] | SweepPlan:
    """Paper Fig. 6: for every seed, split, n_y of ``counts`` and variant, the embeddings' metrics (one row per
    method) and the D-hat quality of three Nystrom estimates (FedDL landmarks on squared distances,
    untrained Y^0, FedDL landmarks on plain distances); FedDL by :func:`sweep_feddl` (``rounds``: an
    integer or "plateau" with the rule's keywords ``plateau``; arithmetic ``dtype``). Every (seed, split,
    n_y) is one job, run in ``workers`` forked processes (None: :func:`fedlib.core.parallel.default_workers`;
    1: in this process), seeded by its seed alone: the rows equal those of one process. Returns (embedding
    rows, quality rows); with ``plan=True`` nothing is run: the :class:`SweepPlan` for :func:`run_sweeps`."""
    jobs = [(seed, split, ny) for seed in seeds for split in splits for ny in counts]

    def one(job):
        seed, split, ny = job
        parts = client_split(y, num_clients, split, seed)
        fds = sweep_feddl(X, parts, ny, variants, seed, rounds=rounds, beta=beta, plateau=plateau, dtype=dtype)
        lrow, qrow = [], []
        for variant in variants:
            fd = fds[variant]
            share = plateau_share(fd.objective, window=window, min_window=min_window)
            for estimate, Y, squared in [("FedDL landmarks, squared", fd.landmarks, True),
                                         ("untrained landmarks, squared", fd.init_landmarks, True),
                                         ("FedDL landmarks, plain", fd.landmarks, False)]:
                qrow.append({"seed": seed, "split": SPLIT_LABELS[split], "n_y": ny, "variant": variant,
                             "estimate": estimate, "rounds": fd.rounds, "plateau share": share,
                             **scorer.landmark_quality(Y, squared)})
            for method in methods:
                res = embed(method, X, parts, ny, seed=seed, feddl_result=fd, **(embed_kwargs or {}))
                lrow.append({"seed": seed, "split": SPLIT_LABELS[split], "n_y": ny,
                             "method": FED_NAMES[method] + ("+" if variant == "Fed+" else ""),
                             **scorer(res.embedding, seed)})
        return lrow, qrow

    out = SweepPlan(jobs, one, lambda job: (_feddl_work(len(y), job[2], runs=len(variants)), job[2]),
                    lambda done: (pd.DataFrame([row for lrow, _ in done for row in lrow]),
                                  pd.DataFrame([row for _, qrow in done for row in qrow])), "landmark sweep")
    return out if plan else run_sweeps([out], workers, progress)[0]


def paper_drop(tables: Sequence[pd.DataFrame], metric: str, pairs: Sequence[tuple],
               embeddings: Sequence[str] = ("t-SNE", "UMAP")) -> float:
    """Smallest (most negative) difference of the paper's means ``metric`` of setting a minus setting b over
    the transcribed ``tables``, embeddings and (a, b) ``pairs`` of (variant, split) settings."""
    return min(t.loc[(e, metric), (*a, "mean")] - t.loc[(e, metric), (*b, "mean")]
               for t in tables for e in embeddings for a, b in pairs)


def check_splits(labels, client_runs: Sequence[tuple], seed: int = 0) -> None:
    """Draw every (split, number of clients) of ``client_runs`` once (:func:`client_split`), so that a split
    the labels cannot support raises its ValueError before the long work."""
    for split, k in client_runs:
        client_split(labels, k, split, seed)


def distance_verdicts(dist_q: pd.DataFrame, data: dict, n_landmarks: int, train_gain: dict) -> list[tuple[str, bool]]:
    """Per dataset, (message, holds): with m + 2 <= n_y the squared-distance estimate of every FedDL run must
    be exact (largest relative error < 1e-6, the rank argument); otherwise FedDL's training must beat its
    initialisation (the 95 % interval of ``train_gain[name]``, the paired D-hat 10-NN gain, above 0)."""
    out = []
    for name, (X, _, _) in data.items():
        m2 = X.shape[1] + 2
        if m2 <= n_landmarks:
            fed = dist_q[(dist_q.dataset == name) & (dist_q.variant != "untrained")]
            worst = fed["D-hat rel. error"].max()
            out.append((f"{name}: m + 2 = {m2} <= n_y = {n_landmarks}: exact whatever the landmarks, largest "
                        f"relative error {worst:.1e}", bool(worst < 1e-6)))
        else:
            out.append((f"{name}: m + 2 = {m2} > n_y = {n_landmarks}: FedDL's training must improve on Y^0; "
                        f"D-hat 10-NN overlap trained - untrained {train_gain[name].format(4)}",
                        bool(train_gain[name].low > 0)))
    return out


def gamma_control(X, y, num_clients: int, n_landmarks: int, rounds: int, gamma: float, seed: int = 0) -> float:
    """Largest |landmark difference| between IID and non-IID noise-free FedDL given ONE kernel width
    ``gamma``: 0 up to rounding, since with size weights both are the pooled gradient descent."""
    ctl = {split: feddl([X[p] for p in client_split(y, num_clients, split, seed)], n_landmarks, rounds=rounds,
                        gamma=gamma, seed=seed) for split in SPLIT_LABELS}
    return float(np.abs(ctl["iid"].landmarks - ctl["non_iid"].landmarks).max())


def late_gain_evidence(late: list) -> str:
    """One line of evidence from the rows of :func:`gain_after`."""
    return "; ".join(f"{n} {s}: overlap {o0:.3f} untrained, {o50:.3f} at round 50, {oe:.3f} at round {re}"
                     for n, s, _, o0, o50, oe, re in late)


def metric_tables(results: pd.DataFrame, data: dict, seeds: Sequence[int], metrics: Sequence[str],
                  row_order: Sequence[tuple], settings: Sequence[tuple], paper_tables: dict) -> dict:
    """Per dataset: (title, table) of our metrics, mean ± sample std over seeds
    (:func:`fedlib.evaluation.report.mean_std_table`), interleaved with the paper's table
    (:func:`fedlib.evaluation.report.beside`) where ``paper_tables`` (dataset -> (table function, label))
    has one."""
    out = {}
    for name in data:
        shown = human(name)
        label = f"ours: {shown}, {len(data[name][1]):,} points, {len(seeds)} seeds"
        ours = report.mean_std_table(results[results.dataset == name], metrics, ["embedding"], ["variant", "split"],
                                     row_order=row_order, column_order=settings)
        title = f"{shown}: embedding quality of each variant and split, mean ± sample std over {len(seeds)} seeds"
        if name in paper_tables:
            fn, plabel = paper_tables[name]
            out[name] = (f"{title}, beside the paper's numbers", report.beside(
                report.pm_table(fn(), settings, names=["variant", "split"]), ours, (plabel, label)))
        else:
            out[name] = (f"{title} (the paper has no table for this dataset)", ours)
    return out


def data_sizes(data: dict, seeds: Sequence[int]) -> pd.DataFrame:
    """Per dataset (name -> (X, y, classes)): points, features m, classes and number of seeds."""
    return pd.DataFrame([{"dataset": name, "points": X.shape[0], "features m": X.shape[1], "classes": len(c),
                          "seeds": len(seeds)} for name, (X, y, c) in data.items()]).set_index("dataset")


def select_differences(pdiff: dict, datasets: Sequence[str], embeddings: Sequence[str], metric: str,
                       labels: Sequence[str]) -> dict:
    """{(dataset, embedding, label): PairedDifference} picked from :func:`paired_metric_table`'s dict."""
    return {(n, e, lab): pdiff[n, e, metric, lab] for n in datasets for e in embeddings for lab in labels}
