"""Algorithms 2 and 3 end to end: Fed-tSNE / Fed-UMAP (:func:`fed_tsne`, :func:`fed_umap`) and
Fed-SpeClust (:func:`fed_spectral_clustering`), each with its centralized baseline on the exact
matrix, and the chapters' one embedding call (:func:`embed`, :func:`learn_landmarks`)."""
from __future__ import annotations

import inspect
import math
import time
import warnings
from dataclasses import dataclass, field

import numpy as np

from fedlib.core.messages import Cost
from fedlib.core.protocol import simulate
from fedlib.core.validate import check_choice, check_int, check_positive
from fedlib.papers.fedtsne.dp import end_to_end_epsilon
from fedlib.papers.fedtsne.feddl import FedDLResult, _resolve_gamma_only, feddl
from fedlib.papers.fedtsne.mmd import (
    GAMMA_RULES, _as_matrix, _resolve_parts, gaussian_kernel, split_clients, sq_distances)
from fedlib.papers.fedtsne.nystrom import NystromClient, NystromServer, _check_inverse


@dataclass(kw_only=True)
class PipelineResult:
    """What Algorithms 2 and 3 (or their centralized baselines) report besides their output:
    ``federated``; ``feddl`` (the FedDL run, None for the baseline); ``upload_bytes`` = FedDL's uploads +
    the final step's; ``seconds`` = the whole call; ``epsilon`` = :func:`end_to_end_epsilon` (``feddl.epsilon``
    is FedDL's part alone); ``cost`` = FedDL's Cost + the final step's (the federated work; zero for
    the baseline)."""

    federated: bool
    feddl: FedDLResult | None
    upload_bytes: int
    seconds: float
    epsilon: float = math.inf
    cost: Cost = field(default_factory=Cost)


@dataclass(kw_only=True)
class EmbeddingResult(PipelineResult):
    """Fed-tSNE / Fed-UMAP (or centralized) output: ``embedding`` (n, d) in the row order of X, the
    ``distance_upload_bytes`` of Algorithm 2's final upload, the server's ``distances`` when kept."""

    embedding: np.ndarray
    method: str
    distance_upload_bytes: int
    distances: np.ndarray | None = field(default=None, repr=False)


@dataclass(kw_only=True)
class ClusteringResult(PipelineResult):
    """Fed-SpeClust (or centralized spectral clustering) output: ``labels`` (n,) in the row order of X,
    the kernel width ``gamma``, the ``kernel_upload_bytes`` of Algorithm 3's final upload, the
    ``affinity`` when kept."""

    labels: np.ndarray
    gamma: float
    kernel_upload_bytes: int
    affinity: np.ndarray | None = field(default=None, repr=False)


def _federated_matrix(X, parts, n_landmarks, kind: str, gamma_kernel, inverse_kw, feddl_result, seed, progress,
                      feddl_kwargs):
    """Run FedDL (unless given), run the Nystrom step (:class:`NystromClient` uploads, :class:`NystromServer`
    assembly) and return the server's estimate in the row order of X with (FedDLResult, this step's Cost)."""
    data, idx = split_clients(X, parts, seed)
    if feddl_result is None:
        feddl_result = feddl(data, n_landmarks, seed=seed, progress=progress, **feddl_kwargs)
    elif [len(x) for x in feddl_result.client_data] != [len(x) for x in data]:
        raise ValueError("feddl_result was run on other clients (client sizes differ from parts)")
    g = feddl_result.gamma if gamma_kernel is None else gamma_kernel
    server = NystromServer(feddl_result.landmarks, kind, g if kind == "kernel" else None, **inverse_kw)
    # the data clients hold (perturbed under dp_data) upload their blocks; the server assembles
    cost = simulate(server, NystromClient(kind), feddl_result.client_data)
    est = server.result()
    order = np.concatenate(idx)
    out = np.empty_like(est)
    out[np.ix_(order, order)] = est
    return out, feddl_result, cost


def _check_pipeline(X, parts, centralized: bool, inverse: str, rank, ridge, n_landmarks, feddl_kwargs):
    X = _as_matrix("X", X)
    _check_inverse(inverse, rank, ridge)
    if not centralized:
        check_int("n_landmarks", n_landmarks, 2)
        if rank is not None and rank > n_landmarks:
            raise ValueError(f"rank must be <= n_landmarks = {n_landmarks}, got {rank}")
        if parts is None:
            raise ValueError("the federated run needs parts (a number of clients or index arrays)")
    if parts is not None:
        _resolve_parts(len(X), parts, 0)
    unknown = set(feddl_kwargs) - (set(inspect.signature(feddl).parameters) - {"client_data", "n_landmarks"})
    if unknown:
        raise TypeError(f"unknown FedDL keyword(s): {sorted(unknown)}")
    return X


def fed_tsne(X, parts, n_landmarks: int = 500, *, centralized: bool = False, perplexity: float = 30.0,
             tsne_kwargs: dict | None = None, inverse: str = "pinv", rank: int | None = None,
             ridge: float | None = None, feddl_result: FedDLResult | None = None, keep_distances: bool = False,
             seed: int = 0, progress: bool = False, **feddl_kwargs) -> EmbeddingResult:
    """Fed-tSNE (Algorithm 2) on X (n, m) split by ``parts`` (int P = IID split, or index arrays);
    ``centralized=True`` runs the same t-SNE on the exact pooled distances (the baseline; ``parts``
    is then ignored). t-SNE: sklearn ``TSNE(metric="precomputed", init="random", perplexity,
    random_state=seed, **tsne_kwargs)`` (sklearn squares the distances itself and forbids init="pca"
    with precomputed input). Extra keywords go to :func:`feddl`; ``feddl_result`` reuses a FedDL run
    on the same parts. Returns an :class:`EmbeddingResult`."""
    from sklearn.manifold import TSNE

    X = _check_pipeline(X, None if centralized else parts, centralized, inverse, rank, ridge, n_landmarks,
                        feddl_kwargs)
    perplexity = check_positive("perplexity", perplexity)
    if perplexity >= len(X):
        raise ValueError(f"perplexity must be < the number of points ({len(X)}), got {perplexity}")
    kw = {"n_components": 2, "perplexity": perplexity, "init": "random", "random_state": seed}
    kw.update(tsne_kwargs or {})
    kw["metric"] = "precomputed"
    return _embed(X, parts, n_landmarks, centralized, lambda D: TSNE(**kw).fit_transform(D), "tsne",
                  dict(inverse=inverse, rank=rank, ridge=ridge), feddl_result, keep_distances, seed, progress,
                  feddl_kwargs)


def fed_umap(X, parts, n_landmarks: int = 500, *, centralized: bool = False, n_neighbors: int = 15,
             min_dist: float = 0.1, umap_kwargs: dict | None = None, inverse: str = "pinv", rank: int | None = None,
             ridge: float | None = None, feddl_result: FedDLResult | None = None, keep_distances: bool = False,
             seed: int = 0, progress: bool = False, **feddl_kwargs) -> EmbeddingResult:
    """Fed-UMAP (Algorithm 2) with umap-learn's ``UMAP(metric="precomputed", n_neighbors, min_dist,
    random_state=seed, **umap_kwargs)``; ``centralized=True`` = UMAP on the exact pooled distances.
    Otherwise as :func:`fed_tsne`."""
    try:
        import umap
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError("Fed-UMAP needs umap-learn: pip install umap-learn") from err

    X = _check_pipeline(X, None if centralized else parts, centralized, inverse, rank, ridge, n_landmarks,
                        feddl_kwargs)
    n_neighbors = check_int("n_neighbors", n_neighbors, 2)
    if n_neighbors >= len(X):
        raise ValueError(f"n_neighbors must be < the number of points ({len(X)}), got {n_neighbors}")
    min_dist = check_positive("min_dist", min_dist, strict=False)
    kw = {"n_components": 2, "n_neighbors": n_neighbors, "min_dist": min_dist, "random_state": seed}
    kw.update(umap_kwargs or {})
    kw["metric"] = "precomputed"

    def run(D):
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*n_jobs value.*overridden.*")
            warnings.filterwarnings("ignore", message=".*using precomputed metric.*")
            return umap.UMAP(**kw).fit_transform(D)

    return _embed(X, parts, n_landmarks, centralized, run, "umap", dict(inverse=inverse, rank=rank, ridge=ridge),
                  feddl_result, keep_distances, seed, progress, feddl_kwargs)


def _embed(X, parts, n_landmarks, centralized, embedder, method, inverse_kw, feddl_result, keep, seed, progress,
           feddl_kwargs) -> EmbeddingResult:
    start = time.perf_counter()
    if centralized:
        D, res, step = np.sqrt(sq_distances(X)), None, Cost()
    else:
        D, res, step = _federated_matrix(X, parts, n_landmarks, "distances", None, inverse_kw, feddl_result,
                                         seed, progress, feddl_kwargs)
    Z = np.asarray(embedder(D), dtype=np.float64)
    cost = step if res is None else res.cost + step
    return EmbeddingResult(embedding=Z, method=method, federated=not centralized, feddl=res,
                           upload_bytes=int(cost.bytes_up), distance_upload_bytes=int(step.bytes_up),
                           seconds=time.perf_counter() - start, distances=D if keep else None,
                           epsilon=end_to_end_epsilon(res), cost=cost)


def fed_spectral_clustering(X, parts, n_clusters: int, n_landmarks: int = 500, *, centralized: bool = False,
                            affinity_gamma: float | None = None, inverse: str = "pinv", rank: int | None = None,
                            ridge: float | None = None, feddl_result: FedDLResult | None = None,
                            keep_affinity: bool = False, seed: int = 0, progress: bool = False,
                            **feddl_kwargs) -> ClusteringResult:
    """Fed-SpeClust (Algorithm 3): sklearn ``SpectralClustering(n_clusters, affinity="precomputed",
    random_state=seed)`` on K_hat = clip_0(C W^+ C^T). The kernel width is ``affinity_gamma`` or
    else FedDL's gamma. ``centralized=True`` clusters the exact Gaussian kernel of the pooled X with
    the SAME gamma: ``affinity_gamma`` or the rule ``gamma`` (default "median") applied to ``parts``
    exactly as FedDL would (the pooled data as one client when parts is None)."""
    from sklearn.cluster import SpectralClustering

    X = _check_pipeline(X, parts, centralized, inverse, rank, ridge, n_landmarks, feddl_kwargs)
    n_clusters = check_int("n_clusters", n_clusters, 2)
    if n_clusters > len(X):
        raise ValueError(f"n_clusters must be <= the number of points ({len(X)}), got {n_clusters}")
    if affinity_gamma is not None:
        affinity_gamma = check_positive("affinity_gamma", affinity_gamma)
    start = time.perf_counter()
    if centralized:
        g = affinity_gamma
        if g is None:
            rule = feddl_kwargs.get("gamma", "median")
            if isinstance(rule, str):
                check_choice("gamma", rule, GAMMA_RULES)
                data = [X] if parts is None else split_clients(X, parts, seed)[0]
                g = _resolve_gamma_only(data, rule, feddl_kwargs.get("weights", "size"),
                                        feddl_kwargs.get("median_points", 1000), seed)
            else:
                g = check_positive("gamma", rule)
        K, res, step = gaussian_kernel(X, None, g), None, Cost()
    else:
        K, res, step = _federated_matrix(X, parts, n_landmarks, "kernel", affinity_gamma,
                                         dict(inverse=inverse, rank=rank, ridge=ridge), feddl_result, seed,
                                         progress, feddl_kwargs)
        g = res.gamma if affinity_gamma is None else affinity_gamma
    labels = SpectralClustering(n_clusters=n_clusters, affinity="precomputed", random_state=seed).fit_predict(K)
    cost = step if res is None else res.cost + step
    return ClusteringResult(labels=labels, federated=not centralized, gamma=float(g), feddl=res,
                            upload_bytes=int(cost.bytes_up), kernel_upload_bytes=int(step.bytes_up),
                            seconds=time.perf_counter() - start, affinity=K if keep_affinity else None,
                            epsilon=end_to_end_epsilon(res), cost=cost)


METHOD_NAMES = {"tsne": "t-SNE", "umap": "UMAP"}
FED_NAMES = {"tsne": "Fed-tSNE", "umap": "Fed-UMAP"}
VARIANTS = ("Fed", "Fed+")           # noise-free FedDL, and with the paper's heuristic noise


def embed(method: str, X, parts, n_landmarks: int = 500, *, seed: int = 0, feddl_result: FedDLResult | None = None,
          keep_distances: bool = False, perplexity: float = 30.0, tsne_max_iter: int = 1000,
          umap_neighbors: int = 15, umap_min_dist: float = 0.1, umap_epochs: int | None = None) -> EmbeddingResult:
    """One embedding of the chapters: ``method`` "tsne" (:func:`fed_tsne`) or "umap" (:func:`fed_umap`),
    centralized when ``feddl_result`` is None, else Fed-tSNE / Fed-UMAP from that FedDL run on ``parts``."""
    check_choice("method", method, METHOD_NAMES)
    central = feddl_result is None
    if method == "tsne":
        return fed_tsne(X, parts, n_landmarks, centralized=central, feddl_result=feddl_result, perplexity=perplexity,
                        tsne_kwargs={"max_iter": tsne_max_iter}, seed=seed, keep_distances=keep_distances)
    return fed_umap(X, parts, n_landmarks, centralized=central, feddl_result=feddl_result, n_neighbors=umap_neighbors,
                    min_dist=umap_min_dist, umap_kwargs={"n_epochs": umap_epochs}, seed=seed,
                    keep_distances=keep_distances)


def learn_landmarks(X, parts, variant: str, n_landmarks: int, rounds: int, *, beta: float = 1.0,
                    seed: int = 0) -> FedDLResult:
    """FedDL on the clients ``[X[p] for p in parts]``: variant "Fed" (noise-free) or "Fed+" (the paper's
    heuristic noise of level ``beta``)."""
    check_choice("variant", variant, VARIANTS)
    return feddl([X[p] for p in parts], n_landmarks, rounds=rounds, noise="heuristic" if variant == "Fed+" else "none",
                 beta=beta, seed=seed)
