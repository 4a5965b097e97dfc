"""STSA chapters' typed parameters (fedlib.stsa.specs): every bad value is refused with a message
naming the parameter; the notebook defaults and every profile's values pass."""
import pytest

from conftest import chapter_values
from fedlib.runner import specs


@pytest.mark.parametrize("chapter, name, bad, message", [
    ("stsa_derivation", "num_tasks", 3, "num_tasks = 3 must divide num_classes = 10"),
    ("stsa_derivation", "M", 0, "M must be an integer >= 1"),
    ("stsa_derivation", "mc_reps", 5, "mc_reps must be an integer >= 10"),
    ("stsa_derivation", "mse_clients", [2, 500], "mse_clients must be <= mse_n"),
    ("stsa_derivation", "mse_clients", [1, 5], r"mse_clients\[0\] must be an integer >= 2"),
    ("stsa_derivation", "rate_clients", [2, 10**6], "rate_clients must be <= rate_n_fixed"),
    ("stsa_derivation", "rate_ns", [500], "rate_ns must hold at least 2"),
    ("stsa_derivation", "client_counts", [1, 10**6], "client_counts must be <= n_samples"),
    ("stsa_derivation", "betas", [0.0], r"betas\[0\] must be a finite number > 0"),
    ("stsa_derivation", "skew_scales", [-0.1], r"skew_scales\[0\] must be a finite number >= 0"),
    ("stsa_derivation", "skew_seeds", [3], "skew_seeds must hold at least 2"),
    ("stsa_derivation", "skew_accuracy_scale", 0.0, "skew_accuracy_scale must be a finite number > 0"),
    ("stsa_derivation", "gamma", -1.0, "gamma must be a finite number >= 0"),
    ("stsa_benchmark", "datasets", ["nope"], r"unknown datasets\[0\] 'nope'"),
    ("stsa_benchmark", "baselines", ["fedavg"], r"unknown baselines\[0\] 'fedavg'"),
    ("stsa_benchmark", "scratch_baselines", ["moon"], r"unknown scratch_baselines\[0\] 'moon'"),
    ("stsa_benchmark", "head", "softmax", "unknown head 'softmax'"),
    ("stsa_benchmark", "num_dummy", 0, "num_dummy must be an integer >= 1"),
    ("stsa_benchmark", "M_scratch", 0, "M_scratch must be an integer >= 1"),
    ("stsa_benchmark", "baseline_seeds", [0, 9], "baseline_seeds must be a subset of seeds"),
    ("stsa_benchmark", "skew_scale", -0.2, "skew_scale must be a finite number >= 0"),
    ("stsa_benchmark", "noise_grid", [[0.1, 1.0, 2.0]], r"noise_grid must hold \[q, s\] pairs"),
    ("stsa_benchmark", "noise_grid", [[0.1, -1.0]], r"noise_grid\[0\]\[1\] must be a finite number >= 0"),
    ("stsa_benchmark", "baseline_hparams", {"fedewc": {"lam": "ten"}}, r"baseline_hparams\['fedewc'\]\['lam'\]"),
    ("stsa_benchmark", "baseline_hparams", {"moon": {}}, "unknown baseline_hparams key 'moon'"),
    ("stsa_benchmark", "subsets", {"mnist5k": [0, 10]}, r"subsets\['mnist5k'\]\[0\] must be an integer >= 1"),
    ("stsa_benchmark", "subsets", {"optdigits": [100, 10]}, "subsets has entries for datasets not used"),
    ("stsa_benchmark", "scratch", "yes", "scratch must be true or false"),
    ("stsa_benchmark", "seeds", [0, 0], "seeds must not repeat"),
    ("stsa_benchmark", "betas", [-1.0], r"betas\[0\] must be a finite number > 0"),
    ("stsa_benchmark", "device", "tpu", "unknown device 'tpu'"),
])
def test_types_reject_naming_the_parameter(chapter, name, bad, message):
    with pytest.raises(ValueError, match=message):
        specs.check(chapter, chapter_values(chapter, **{name: bad}))
