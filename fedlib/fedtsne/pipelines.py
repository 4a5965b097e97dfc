"""Algorithms 2 and 3 end to end: Fed-tSNE / Fed-UMAP (:func:`fed_tsne`, :func:`fed_umap`) and
Fed-SpeClust (:func:`fed_spectral_clustering`), each with its centralized baseline on the exact
matrix, and the chapters' one embedding call (:func:`embed`, :func:`learn_landmarks`).

Two server paths. Dense (``sparse=False``): the n x n estimate, then sklearn t-SNE / umap-learn /
sklearn spectral clustering with ``precomputed`` input. Sparse (``sparse=True``, automatic above
:data:`DENSE_MAX_POINTS` points): the server keeps only each point's k nearest neighbours under the
same estimate (:func:`~fedlib.fedtsne.nystrom.nystrom_knn`, blockwise, O(n k) memory), then
openTSNE on the perplexity affinities of that kNN graph (k = 3 x perplexity, openTSNE's rule),
umap-learn with ``precomputed_knn`` (k = n_neighbors - 1 plus the point itself), spectral clustering
on the symmetrized kNN graph of the kernel estimate. The sparse centralized baselines: openTSNE and
umap-learn with their own neighbour search on X, spectral clustering on the exact kernel's kNN graph
(:func:`~fedlib.fedtsne.knn.exact_sq_knn`)."""
from __future__ import annotations

import inspect
import math
import time
import warnings
from dataclasses import dataclass, field
from importlib.metadata import version

import numpy as np

from fedlib.core.cache import memory as disk_cache
from fedlib.core.messages import Cost
from fedlib.core.protocol import simulate
from fedlib.core.validate import check_choice, check_int, check_positive
from fedlib.fedtsne.algorithm import NystromClient, NystromServer
from fedlib.fedtsne.dp import end_to_end_epsilon
from fedlib.fedtsne.feddl import FedDLResult, feddl, resolve_gamma_only
from fedlib.fedtsne.knn import check_k, exact_sq_knn, knn_graph
from fedlib.fedtsne.mmd import GAMMA_RULES, as_matrix, gaussian_kernel, resolve_parts, split_clients, sq_distances
from fedlib.fedtsne.nystrom import check_inverse


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


DENSE_MAX_POINTS = 10000    # sparse=None: the dense n x n path up to this many points, the kNN path above
SPECTRAL_NEIGHBORS = 30     # neighbours per point of the sparse Fed-SpeClust affinity graph


def _use_sparse(sparse, n: int) -> bool:
    if sparse is None:
        return n > DENSE_MAX_POINTS
    if not isinstance(sparse, (bool, np.bool_)):
        raise ValueError(f"sparse must be True, False or None (automatic), got {sparse!r}")
    return bool(sparse)


def _federated_matrix(X, parts, n_landmarks, kind: str, gamma_kernel, inverse_kw, feddl_result, seed, progress,
                      feddl_kwargs, neighbors: int | None = None):
    """Run FedDL (unless given), run the Nystrom step (:class:`NystromClient` uploads, :class:`NystromServer`
    assembly) and return the server's estimate in the row order of X with (FedDLResult, this step's Cost);
    with ``neighbors=k`` the estimate is its kNN lists (indices, values) (n, k) instead."""
    data, idx = split_clients(X, parts, seed)
    if feddl_result is None:
        feddl_result = feddl(data, n_landmarks, seed=seed, progress=progress, **feddl_kwargs)
    elif [len(x) for x in feddl_result.client_data] != [len(x) for x in data]:
        raise ValueError("feddl_result was run on other clients (client sizes differ from parts)")
    g = feddl_result.gamma if gamma_kernel is None else gamma_kernel
    server = NystromServer(feddl_result.landmarks, kind, g if kind == "kernel" else None, neighbors=neighbors,
                           **inverse_kw)
    # the data clients hold (perturbed under dp_data) upload their blocks; the server assembles
    cost = simulate(server, NystromClient(kind), feddl_result.client_data)
    est = server.result()
    order = np.concatenate(idx)
    if neighbors is not None:                      # stacked row s is row order[s] of X
        nbr, val = est
        out_nbr, out_val = np.empty_like(nbr), np.empty_like(val)
        out_nbr[order], out_val[order] = order[nbr], val
        return (out_nbr, out_val), feddl_result, cost
    out = np.empty_like(est)
    out[np.ix_(order, order)] = est
    return out, feddl_result, cost


def _check_pipeline(X, parts, centralized: bool, inverse: str, rank, ridge, n_landmarks, feddl_kwargs):
    X = as_matrix("X", X)
    check_inverse(inverse, rank, ridge)
    if not centralized:
        check_int("n_landmarks", n_landmarks, 2)
        if rank is not None and rank > n_landmarks:
            raise ValueError(f"rank must be <= n_landmarks = {n_landmarks}, got {rank}")
        if parts is None:
            raise ValueError("the federated run needs parts (a number of clients or index arrays)")
    if parts is not None:
        resolve_parts(len(X), parts, 0)
    unknown = set(feddl_kwargs) - (set(inspect.signature(feddl).parameters) - {"client_data", "n_landmarks"})
    if unknown:
        raise TypeError(f"unknown FedDL keyword(s): {sorted(unknown)}")
    return X


def fed_tsne(X, parts, n_landmarks: int = 500, *, centralized: bool = False, perplexity: float = 30.0,
             tsne_kwargs: dict | None = None, inverse: str = "pinv", rank: int | None = None,
             ridge: float | None = None, feddl_result: FedDLResult | None = None, keep_distances: bool = False,
             sparse: bool | None = None, seed: int = 0, progress: bool = False, **feddl_kwargs) -> EmbeddingResult:
    """Fed-tSNE (Algorithm 2) on X (n, m) split by ``parts`` (int P = IID split, or index arrays);
    ``centralized=True`` runs the same t-SNE on the exact pooled distances (the baseline; ``parts``
    is then ignored). Dense path (``sparse=False``; ``None`` = dense up to :data:`DENSE_MAX_POINTS`
    points): sklearn ``TSNE(metric="precomputed", init="random", perplexity, random_state=seed,
    **tsne_kwargs)`` (sklearn squares the distances itself and forbids init="pca" with precomputed
    input). Sparse path: openTSNE ``TSNE(perplexity, initialization="random", random_state=seed,
    early_exaggeration_iter=250, n_iter=max_iter - 250, **rest)`` (``tsne_kwargs`` key ``max_iter`` as
    sklearn's, default 1000, the rest go to openTSNE) on the perplexity affinities of the k = 3 x
    perplexity nearest neighbours under the Nystrom estimate (the centralized run: openTSNE's own
    neighbour search on X). Extra keywords go to :func:`feddl`; ``feddl_result`` reuses a FedDL run
    on the same parts. Returns an :class:`EmbeddingResult` (``distances``: the dense estimate, or the
    sparse (n, n) kNN distances)."""
    X = _check_pipeline(X, None if centralized else parts, centralized, inverse, rank, ridge, n_landmarks,
                        feddl_kwargs)
    perplexity = check_positive("perplexity", perplexity)
    if perplexity >= len(X):
        raise ValueError(f"perplexity must be < the number of points ({len(X)}), got {perplexity}")
    inverse_kw = dict(inverse=inverse, rank=rank, ridge=ridge)
    if _use_sparse(sparse, len(X)):
        run, k = opentsne_runner(perplexity, tsne_kwargs, seed, len(X))
        return _embed(X, parts, n_landmarks, centralized, run, "tsne", inverse_kw, feddl_result, keep_distances,
                      seed, progress, feddl_kwargs, neighbors=k)
    from sklearn.manifold import TSNE

    kw = {"n_components": 2, "perplexity": perplexity, "init": "random", "random_state": seed}
    kw.update(tsne_kwargs or {})
    kw["metric"] = "precomputed"
    return _embed(X, parts, n_landmarks, centralized, lambda D: TSNE(**kw).fit_transform(D), "tsne",
                  inverse_kw, feddl_result, keep_distances, seed, progress, feddl_kwargs)


def opentsne_runner(perplexity: float, tsne_kwargs, seed: int, n: int):
    """openTSNE for the sparse path: (run, k) with run(knn) -> embedding, knn = (indices, distances)
    (n, k) or the data X (n, m) for openTSNE's own neighbour search; k = min(n - 1, 3 x perplexity)."""
    import openTSNE
    from openTSNE.affinity import PrecomputedAffinities, joint_probabilities_nn

    kw = dict(tsne_kwargs or {})
    max_iter = check_int("max_iter", kw.pop("max_iter", 1000), 0)
    opts = {"n_components": 2, "perplexity": perplexity, "initialization": "random", "random_state": seed,
            "early_exaggeration_iter": 250}
    opts.update(kw)
    opts["early_exaggeration_iter"] = min(check_int("early_exaggeration_iter", opts["early_exaggeration_iter"], 0),
                                          max_iter)
    opts["n_iter"] = max_iter - opts["early_exaggeration_iter"]
    k = min(n - 1, int(3 * perplexity))
    effective = min(perplexity, k / 3)          # openTSNE's rule when the neighbours are too few

    def run(knn):
        tsne = openTSNE.TSNE(**opts)
        if isinstance(knn, np.ndarray):                       # centralized: openTSNE's own kNN on X
            return np.asarray(tsne.fit(knn))
        P = joint_probabilities_nn(knn[0], knn[1], [effective], symmetrize=True, n_jobs=opts.get("n_jobs", 1))
        return np.asarray(tsne.fit(affinities=PrecomputedAffinities(P)))

    return run, k


def fed_umap(X, parts, n_landmarks: int = 500, *, centralized: bool = False, n_neighbors: int = 15,
             min_dist: float = 0.1, umap_kwargs: dict | None = None, inverse: str = "pinv", rank: int | None = None,
             ridge: float | None = None, feddl_result: FedDLResult | None = None, keep_distances: bool = False,
             sparse: bool | None = None, seed: int = 0, progress: bool = False, **feddl_kwargs) -> EmbeddingResult:
    """Fed-UMAP (Algorithm 2) with umap-learn's ``UMAP(n_neighbors, min_dist, random_state=seed,
    **umap_kwargs)``: dense path ``metric="precomputed"`` on the n x n estimate (``centralized=True``:
    the exact pooled distances); sparse path ``precomputed_knn`` = each point itself plus its
    n_neighbors - 1 nearest neighbours under the Nystrom estimate (centralized: umap-learn's own
    neighbour search on X). Otherwise as :func:`fed_tsne`."""
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
    use_sparse = _use_sparse(sparse, len(X))
    if not use_sparse:
        kw["metric"] = "precomputed"

    def run(D):
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*n_jobs value.*overridden.*")
            warnings.filterwarnings("ignore", message=".*using precomputed metric.*")
            warnings.filterwarnings("ignore", message=".*knn_search_index.*")
            if not use_sparse or isinstance(D, np.ndarray):       # dense estimate, or centralized X
                return umap.UMAP(**kw).fit_transform(D)
            n = len(D[0])
            self_col = np.arange(n)[:, None]
            knn = (np.hstack([self_col, D[0]]), np.hstack([np.zeros((n, 1)), D[1]]))
            # the graph comes from knn alone; X is a placeholder (the server has no features)
            return umap.UMAP(precomputed_knn=knn, force_approximation_algorithm=True, **kw).fit_transform(
                np.zeros((n, 1)))

    return _embed(X, parts, n_landmarks, centralized, run, "umap", dict(inverse=inverse, rank=rank, ridge=ridge),
                  feddl_result, keep_distances, seed, progress, feddl_kwargs,
                  neighbors=n_neighbors - 1 if use_sparse else None)


def _embed(X, parts, n_landmarks, centralized, embedder, method, inverse_kw, feddl_result, keep, seed, progress,
           feddl_kwargs, neighbors: int | None = None) -> EmbeddingResult:
    """Dense (``neighbors`` None): embedder(D), D the (n, n) distances. Sparse: embedder((indices,
    distances)) with the kNN lists under the Nystrom estimate, or embedder(X) for the centralized run."""
    start = time.perf_counter()
    if centralized:
        D = X if neighbors is not None else np.sqrt(sq_distances(X))
        res, step = None, Cost()
    else:
        D, res, step = _federated_matrix(X, parts, n_landmarks, "distances", None, inverse_kw, feddl_result,
                                         seed, progress, feddl_kwargs, neighbors=neighbors)
    Z = np.asarray(embedder(D), dtype=np.float64)
    cost = step if res is None else res.cost + step
    kept = None
    if keep and not (centralized and neighbors is not None):
        kept = D if neighbors is None else knn_graph(*D, symmetrize="none")
    return EmbeddingResult(embedding=Z, method=method, federated=not centralized, feddl=res,
                           upload_bytes=int(cost.bytes_up), distance_upload_bytes=int(step.bytes_up),
                           seconds=time.perf_counter() - start, distances=kept,
                           epsilon=end_to_end_epsilon(res), cost=cost)


def fed_spectral_clustering(X, parts, n_clusters: int, n_landmarks: int = 500, *, centralized: bool = False,
                            affinity_gamma: float | None = None, inverse: str = "pinv", rank: int | None = None,
                            ridge: float | None = None, feddl_result: FedDLResult | None = None,
                            keep_affinity: bool = False, sparse: bool | None = None,
                            n_neighbors: int | None = None, seed: int = 0, progress: bool = False,
                            **feddl_kwargs) -> ClusteringResult:
    """Fed-SpeClust (Algorithm 3): sklearn ``SpectralClustering(n_clusters, affinity="precomputed",
    random_state=seed)`` on K_hat = clip_0(C W^+ C^T). The kernel width is ``affinity_gamma`` or
    else FedDL's gamma. ``centralized=True`` clusters the exact Gaussian kernel of the pooled X with
    the SAME gamma: ``affinity_gamma`` or the rule ``gamma`` (default "median") applied to ``parts``
    exactly as FedDL would (the pooled data as one client when parts is None). Sparse path
    (``sparse=True``; ``None`` = above :data:`DENSE_MAX_POINTS` points): the affinity is the sparse
    graph of each point's ``n_neighbors`` (default :data:`SPECTRAL_NEIGHBORS`, at most n - 1) largest
    kernel values, (A + A^T)/2, from :func:`~fedlib.fedtsne.nystrom.nystrom_knn` (centralized:
    the exact kernel at the exact nearest neighbours)."""
    from sklearn.cluster import SpectralClustering

    X = _check_pipeline(X, parts, centralized, inverse, rank, ridge, n_landmarks, feddl_kwargs)
    n_clusters = check_int("n_clusters", n_clusters, 2)
    if n_clusters > len(X):
        raise ValueError(f"n_clusters must be <= the number of points ({len(X)}), got {n_clusters}")
    if affinity_gamma is not None:
        affinity_gamma = check_positive("affinity_gamma", affinity_gamma)
    use_sparse = _use_sparse(sparse, len(X))
    k = None
    if use_sparse:
        k = check_k(min(SPECTRAL_NEIGHBORS, len(X) - 1) if n_neighbors is None else n_neighbors, len(X),
                    "n_neighbors")
    elif n_neighbors is not None:
        raise ValueError("n_neighbors applies to the sparse path only (sparse=True)")
    start = time.perf_counter()
    if centralized:
        g = affinity_gamma
        if g is None:
            rule = feddl_kwargs.get("gamma", "median")
            if isinstance(rule, str):
                check_choice("gamma", rule, GAMMA_RULES)
                data = [X] if parts is None else split_clients(X, parts, seed)[0]
                g = resolve_gamma_only(data, rule, feddl_kwargs.get("weights", "size"),
                                        feddl_kwargs.get("median_points", 1000), seed)
            else:
                g = check_positive("gamma", rule)
        if use_sparse:
            nbr, d2 = exact_sq_knn(X, k)
            K = knn_graph(nbr, np.exp(-g * d2))
        else:
            K = gaussian_kernel(X, None, g)
        res, step = None, Cost()
    else:
        K, res, step = _federated_matrix(X, parts, n_landmarks, "kernel", affinity_gamma,
                                         dict(inverse=inverse, rank=rank, ridge=ridge), feddl_result, seed,
                                         progress, feddl_kwargs, neighbors=k)
        if use_sparse:
            K = knn_graph(*K)
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
          umap_neighbors: int = 15, umap_min_dist: float = 0.1, umap_epochs: int | None = None,
          sparse: bool | None = None) -> EmbeddingResult:
    """One embedding of the chapters: ``method`` "tsne" (:func:`fed_tsne`) or "umap" (:func:`fed_umap`),
    centralized when ``feddl_result`` is None, else Fed-tSNE / Fed-UMAP from that FedDL run on ``parts``;
    ``sparse`` picks the server's path (None: dense up to :data:`DENSE_MAX_POINTS` points, kNN above)."""
    check_choice("method", method, METHOD_NAMES)
    central = feddl_result is None
    if method == "tsne":
        return fed_tsne(X, parts, n_landmarks, centralized=central, feddl_result=feddl_result, perplexity=perplexity,
                        tsne_kwargs={"max_iter": tsne_max_iter}, seed=seed, keep_distances=keep_distances,
                        sparse=sparse)
    return fed_umap(X, parts, n_landmarks, centralized=central, feddl_result=feddl_result, n_neighbors=umap_neighbors,
                    min_dist=umap_min_dist, umap_kwargs={"n_epochs": umap_epochs}, seed=seed,
                    keep_distances=keep_distances, sparse=sparse)


CENTRAL_CACHE_VERSION = 1   # bump when the centralized t-SNE / UMAP path changes, so old cache entries are never read
# the settings of :func:`embed` that one method does not read: left out of the other's cache key
_OTHER_METHOD_SETTINGS = {"tsne": ("umap_neighbors", "umap_min_dist", "umap_epochs"),
                          "umap": ("perplexity", "tsne_max_iter")}


def _central_embedding(method: str, X: np.ndarray, seed: int, settings: dict, versions: dict) -> EmbeddingResult:
    """:func:`embed` centralized; ``versions`` (the libraries' and :data:`CENTRAL_CACHE_VERSION`) only key the cache."""
    return embed(method, X, None, seed=seed, **settings)


def central_embedding(method: str, X, *, seed: int = 0, cache: bool = True, **settings) -> EmbeddingResult:
    """The centralized reference of :func:`embed` (``feddl_result=None``; ``settings``: its keywords). It
    depends on no federated parameter, so, like the backbone features, it is kept on disk: a
    ``joblib.Memory`` of :func:`fedlib.core.cache.memory` keyed by X's bytes, ``method``, ``seed``,
    ``settings`` (those of this method: a UMAP setting does not key a t-SNE embedding), the versions of
    scikit-learn, umap-learn and openTSNE and :data:`CENTRAL_CACHE_VERSION`.
    A chapter re-run with other federated parameters reads it back: the same result the call returned
    (its ``seconds`` are those of the run that made it). ``cache=False`` computes it."""
    check_choice("method", method, METHOD_NAMES)
    X = as_matrix("X", X)
    settings = {k: v for k, v in settings.items() if k not in _OTHER_METHOD_SETTINGS[method]}
    if not cache:
        return _central_embedding(method, X, seed, settings, {})
    versions = {lib: version(lib) for lib in ("scikit-learn", "umap-learn", "openTSNE")}
    versions["fedlib central cache"] = CENTRAL_CACHE_VERSION
    return disk_cache("central_embeddings").cache(_central_embedding)(method, X, int(seed), dict(sorted(settings.items())), versions)


def learn_landmarks(X, parts, variant: str, n_landmarks: int, rounds: int, *, beta: float = 1.0,
                    seed: int = 0, dtype: str = "float64") -> FedDLResult:
    """FedDL on the clients ``[X[p] for p in parts]``: variant "Fed" (noise-free) or "Fed+" (the paper's
    heuristic noise of level ``beta``); ``dtype`` FedDL's arithmetic (:func:`feddl`)."""
    check_choice("variant", variant, VARIANTS)
    return feddl([X[p] for p in parts], n_landmarks, rounds=rounds, noise="heuristic" if variant == "Fed+" else "none",
                 beta=beta, seed=seed, dtype=dtype)
