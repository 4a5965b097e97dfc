"""The typed parameter specs of the four Fed-tSNE chapters: each type and rule rejects a bad value with a message naming the parameter."""
import pytest

from conftest import chapter_values
from fedlib.runner import specs


@pytest.mark.parametrize("chapter, name, bad, message", [
    ("fedtsne_derivation", "n_landmarks", 1, "n_landmarks must be an integer >= 2"),
    ("fedtsne_derivation", "delta", 1.0, "delta must be a finite number > 0.0 and < 1.0"),
    ("fedtsne_derivation", "epsilons", [1.0, 0.0], r"epsilons\[1\] must be a finite number > 0"),
    ("fedtsne_derivation", "landmark_grid", [5, 5], "landmark_grid must not repeat"),
    ("fedtsne_benchmark", "datasets", ["nope"], "unknown datasets\\[0\\] 'nope'"),
    ("fedtsne_benchmark", "seeds", [0], "seeds must hold at least 2"),
    ("fedtsne_benchmark", "rounds", "forever", "rounds"),
    ("fedtsne_benchmark", "rounds", 0, "rounds must be .*an integer >= 1"),
    ("fedtsne_benchmark", "n_points", {"mnist5k": 10}, r"n_points\['mnist5k'\] must be an integer >= 200"),
    ("fedtsne_benchmark", "umap_epochs", 0, "umap_epochs"),
    ("fedtsne_benchmark", "beta", -1.0, "beta must be a finite number >= 0"),
    ("fedtsne_benchmark", "methods", ["pca"], "unknown methods\\[0\\] 'pca'"),
    ("fedtsne_benchmark", "landmark_variants", ["Fed++"], "landmark_variants"),
    ("fedtsne_benchmark", "step_scales", [2, 0], r"step_scales\[1\] must be a finite number > 0"),
    ("fedtsne_benchmark", "step_scales", [2, 2], "step_scales must not repeat"),
    ("fedtsne_privacy", "accountant", "moments", "unknown accountant 'moments'"),
    ("fedtsne_privacy", "betas", [-0.5], r"betas\[0\] must be a finite number >= 0"),
    ("fedtsne_privacy", "tsne_max_iter", 100, "tsne_max_iter must be an integer >= 250"),
    ("fedspeclust", "gamma_rule", "mean", "unknown gamma_rule 'mean'"),
    ("fedspeclust", "landmark_grid", [10, 5], "landmark_grid must be strictly increasing"),
    ("fedspeclust", "threads", 0, "threads must be an integer >= 1.*null"),
    ("fedspeclust", "max_rounds", 10, "max_rounds must be an integer >= 11"),
    ("fedspeclust", "seeds", [1, 1], "seeds must not repeat"),
])
def test_types_reject_naming_the_parameter(chapter, name, bad, message):
    with pytest.raises(ValueError, match=message):
        specs.check(chapter, chapter_values(chapter, **{name: bad}))


@pytest.mark.parametrize("chapter, changes, message", [
    ("fedtsne_derivation", {"n_points": 50, "n_landmarks": 50}, "n_landmarks must be < n_points"),
    ("fedtsne_derivation", {"n_points": 30, "n_landmarks": 5, "num_clients": 16}, "num_clients = 16 needs n_points"),
    ("fedtsne_privacy", {"n_points": 20, "n_landmarks": 25}, "n_landmarks must be < n_points"),
    ("fedtsne_privacy", {"n_points": 20, "n_landmarks": 5, "num_clients": 11}, "num_clients = 11 needs n_points"),
    ("fedtsne_benchmark", {"datasets": ["optdigits"], "n_points": {"mnist5k": 300}, "sweep_dataset": "optdigits"},
     "n_points needs an entry for every dataset; missing: optdigits"),
    ("fedtsne_benchmark", {"sweep_dataset": "optdigits"}, "sweep_dataset must be one of datasets"),
    ("fedtsne_benchmark", {"max_rounds": 10}, "max_rounds must be >= plateau_check and > 10"),
    ("fedtsne_benchmark", {"step_scales": [1, 4]}, "step_scales must not hold 1"),
    ("fedspeclust", {"max_points": 10, "num_clients": 10}, "max_points must be null or >= 4 \\* num_clients"),
])
def test_rules_reject_naming_the_parameters(chapter, changes, message):
    with pytest.raises(ValueError, match=message):
        specs.check(chapter, chapter_values(chapter, **changes))
