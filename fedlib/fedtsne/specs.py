"""Typed parameters of the five Fed-tSNE chapters (``notebooks/fedtsne_derivation.py``,
``fedtsne_benchmark.py``, ``fedtsne_privacy.py``, ``fedspeclust.py``, ``fedtsne_beyond.py``): one :class:`Spec` per chapter
covering every name of its ``parameters`` cell, and the cross-parameter rules."""
from __future__ import annotations

from fedlib.core.privacy import ACCOUNTANTS
from fedlib.core.specs import NULL, Choice, Dict, Int, List, Real, Seeds, Spec, Str
from fedlib.data.datasets import DATASETS

METHODS = ("tsne", "umap")
SPLITS = ("iid", "non_iid")          # fedlib.fedtsne.chapters.SPLITS
VARIANTS = ("Fed", "Fed+")
GAMMA_RULES = ("median", "moments")  # fedlib.fedtsne.mmd.GAMMA_RULES
PLATEAU_MIN_WINDOW = 10              # fedlib.fedtsne.feddl.plateau_share's default min_window
ROUNDS = Choice(("plateau",)) | Int(1)


def _landmarks_below_points(points: str):
    def rule(v):
        if v["n_landmarks"] >= v[points]:
            raise ValueError(f"n_landmarks must be < {points} = {v[points]}, got {v['n_landmarks']}")
    return rule


def _clients_fit(points: str):
    def rule(v):
        if 2 * v["num_clients"] > v[points]:
            raise ValueError(f"num_clients = {v['num_clients']} needs {points} >= 2 * num_clients "
                             f"(each client holds >= 2 points, Eq. 10), got {v[points]}")
    return rule


def _every_dataset_has_n_points(v):
    missing = [name for name in v["datasets"] if name not in v["n_points"]]
    if missing:
        raise ValueError(f"n_points needs an entry for every dataset; missing: {', '.join(missing)}")


def _sweep_dataset_in_datasets(v):
    if v["sweep_dataset"] not in v["datasets"]:
        raise ValueError(f"sweep_dataset must be one of datasets {v['datasets']}, got {v['sweep_dataset']!r}")


def _max_rounds_covers_the_rule(v):
    least = max(v["plateau_check"], PLATEAU_MIN_WINDOW + 1)
    if v["max_rounds"] < least:
        raise ValueError(f"max_rounds must be >= plateau_check and > {PLATEAU_MIN_WINDOW}, got {v['max_rounds']}")


def _step_scales_besides_one(v):
    if 1 in v["step_scales"]:
        raise ValueError(f"step_scales must not hold 1 (the convergence study's own step 1/L), got {v['step_scales']}")


def _max_points_fits_clients(v):
    if v["max_points"] is not None and v["max_points"] < 4 * v["num_clients"]:
        raise ValueError(f"max_points must be null or >= 4 * num_clients = {4 * v['num_clients']}, "
                         f"got {v['max_points']}")


LANDMARK_KINDS = ("feddl", "kmeans")                                       # fedlib.fedtsne.beyond
ESTIMATORS = ("nystrom", "projection", "residual_sum", "residual_gap")     # fedlib.fedtsne.beyond
COMBOS = tuple(f"{kind}/{est}" for kind in LANDMARK_KINDS for est in ESTIMATORS)


def _grid_within(values: str, grid: str):
    def rule(v):
        missing = sorted(set(v[values]) - set(v[grid]))
        if missing:
            raise ValueError(f"{values} must be values of {grid} {v[grid]}; not there: {missing}")
    return rule


def _placement_in_grid(v):
    if v["placement_kinds"] and v["placement_landmarks"] not in v["landmark_grid"]:
        raise ValueError(f"placement_landmarks must be one of landmark_grid {v['landmark_grid']}, "
                         f"got {v['placement_landmarks']}")


def _grid_below_points(v):
    if v["n_points"] is not None and max(v["landmark_grid"]) > v["n_points"]:
        raise ValueError(f"landmark_grid values must be <= n_points = {v['n_points']}, got {max(v['landmark_grid'])}")


SPECS = {
    "fedtsne_beyond": Spec({
        "dataset": Choice(DATASETS), "n_points": Int(200) | NULL, "num_clients": Int(2), "seeds": Seeds(2),
        "rounds": Int(1), "landmark_grid": List(Int(2), distinct=True, increasing=True),
        "metric_grid": List(Int(2), least=0, distinct=True, increasing=True),
        "metric_combos": List(Choice(COMBOS), least=0, distinct=True), "placement_landmarks": Int(4),
        "placement_kinds": List(Choice(LANDMARK_KINDS), least=0, distinct=True),
        "methods": List(Choice(METHODS), distinct=True), "perplexity": Real(0.0), "tsne_max_iter": Int(250),
        "umap_neighbors": Int(2), "umap_min_dist": Real(0.0, strict=False), "umap_epochs": Int(1) | NULL,
        "knn_k": Int(1), "num_threads": Int(1) | NULL,
    }, rules=[_grid_within("metric_grid", "landmark_grid"), _placement_in_grid, _grid_below_points]),
    "fedtsne_derivation": Spec({
        "n_points": Int(10), "n_landmarks": Int(2), "feddl_rounds": Int(1), "num_clients": Int(2),
        "mc_reps": Int(4), "landmark_grid": List(Int(2), distinct=True), "epsilons": List(Real(0.0)),
        "delta": Real(0.0, 1.0), "seed": Int(0),
    }, rules=[_landmarks_below_points("n_points"), _clients_fit("n_points")]),
    "fedtsne_benchmark": Spec({
        "datasets": List(Choice(DATASETS), distinct=True), "n_points": Dict(Str(), Int(200) | NULL),
        "seeds": Seeds(2), "num_clients": Int(2), "n_landmarks": Int(2), "rounds": ROUNDS,
        "plateau_tol": Real(0.0), "plateau_check": Int(1), "max_rounds": Int(1),
        "step_scales": List(Real(0.0), least=0, distinct=True),
        "beta": Real(0.0, strict=False), "methods": List(Choice(METHODS), distinct=True), "perplexity": Real(0.0),
        "tsne_max_iter": Int(250), "umap_neighbors": Int(2), "umap_min_dist": Real(0.0, strict=False),
        "umap_epochs": Int(1) | NULL, "sweep_dataset": Choice(DATASETS), "sweep_seeds": Seeds(1),
        "iid_client_counts": List(Int(2), least=0), "noniid_client_counts": List(Int(2), least=0),
        "landmark_counts": List(Int(2), least=0), "landmark_splits": List(Choice(SPLITS), least=0),
        "landmark_methods": List(Choice(METHODS), least=0), "landmark_variants": List(Choice(VARIANTS), least=0),
        "scatter_points": Int(10), "num_threads": Int(1) | NULL, "feddl_dtype": Choice(("float32", "float64")),
        "workers": Int(1) | NULL,
    }, rules=[_every_dataset_has_n_points, _sweep_dataset_in_datasets, _max_rounds_covers_the_rule,
              _step_scales_besides_one]),
    "fedtsne_privacy": Spec({
        "n_points": Int(10), "public_points": Int(2), "num_clients": Int(1), "n_landmarks": Int(2),
        "rounds": Int(1), "epsilons": List(Real(0.0)), "delta": Real(0.0, 1.0), "accountant": Choice(ACCOUNTANTS),
        "betas": List(Real(0.0, strict=False)), "methods": List(Choice(METHODS), distinct=True),
        "seeds": Seeds(1), "tsne_max_iter": Int(250), "seed": Int(0), "num_threads": Int(1) | NULL,
    }, rules=[_landmarks_below_points("n_points"), _clients_fit("n_points")]),
    "fedspeclust": Spec({
        "datasets": List(Choice(DATASETS), distinct=True), "max_points": Int(1) | NULL, "num_clients": Int(2),
        "n_landmarks": Int(2), "rounds": ROUNDS, "max_rounds": Int(PLATEAU_MIN_WINDOW + 1),
        "gamma_rule": Choice(GAMMA_RULES), "beta": Real(0.0, strict=False), "seeds": Seeds(2),
        "sweep_dataset": Choice(DATASETS), "landmark_grid": List(Int(2), distinct=True, increasing=True),
        "derivation_dim": Int(1), "derivation_points": Int(3), "threads": Int(1) | NULL,
        "feddl_dtype": Choice(("float32", "float64")),
    }, rules=[_max_points_fits_clients]),
}
