"""The typed parameter specs of the two AFL chapters: each type and rule rejects a bad value with a message naming the parameter."""
import pytest

from conftest import chapter_values
from fedlib.runner import profiles, specs


@pytest.mark.parametrize("chapter, name, bad, message", [
    ("afl_derivation", "n_samples", 1, "n_samples must be an integer >= 2"),
    ("afl_derivation", "dirichlet_alphas", [1.0, 0.0], r"dirichlet_alphas\[1\] must be a finite number > 0"),
    ("afl_derivation", "client_counts", [2, 2], "client_counts must not repeat"),
    ("afl_derivation", "gammas", [-1.0], r"gammas\[0\] must be a finite number > 0"),
    ("afl_derivation", "conditions", [0.5], r"conditions\[0\] must be a finite number >= 1"),
    ("afl_derivation", "sweep_clients", 10**6, "sweep_clients must be <= n_samples"),
    ("afl_derivation", "reference_dim", 10**5, "reference_dim must be <= reference_samples"),
    ("afl_derivation", "table1_clients", [2, 10**6], "table1_clients must be <= n_samples"),
    ("afl_derivation", "seed", -1, "seed must be an integer >= 0"),
    ("afl_benchmark", "backbone", "vgg", "unknown backbone 'vgg'"),
    ("afl_benchmark", "dataset", "imagenet21k", "unknown dataset 'imagenet21k'"),
    ("afl_benchmark", "methods", ["fedsgd"], r"unknown methods\[0\] 'fedsgd'"),
    ("afl_benchmark", "seeds", [0], "seeds must hold at least 2"),
    ("afl_benchmark", "seeds", [1, 1], "seeds must not repeat"),
    ("afl_benchmark", "gamma", -1.0, "gamma must be a finite number >= 0"),
    ("afl_benchmark", "gammas", [1.0, -0.1], r"gammas\[1\] must be a finite number >= 0"),
    ("afl_benchmark", "moon_hidden", 0, "moon_hidden must be an integer >= 1 or null"),
    ("afl_benchmark", "paper_rounds", 0, "paper_rounds must be an integer >= 1"),
    ("afl_benchmark", "participation", 0.0, r"participation must lie in \(0, 1\]"),
    ("afl_benchmark", "participation", 1.5, "participation must be a finite number"),
    ("afl_benchmark", "device", "tpu", "unknown device 'tpu'"),
    ("afl_benchmark", "n_train", 0, "n_train must be an integer >= 1 or null"),
    ("afl_benchmark", "alphas", [0.0], r"alphas\[0\] must be a finite number > 0"),
    ("afl_benchmark", "shards", [0], r"shards\[0\] must be an integer >= 1"),
])
def test_types_reject_naming_the_parameter(chapter, name, bad, message):
    with pytest.raises(ValueError, match=message):
        specs.check(chapter, chapter_values(chapter, **{name: bad}))


def test_resample_methods_must_be_among_methods():
    with pytest.raises(ValueError, match="resample_methods must be a subset of methods"):
        specs.check("afl_benchmark", chapter_values("afl_benchmark", methods=["fedavg"], resample_methods=["moon"]))


def test_afl_benchmark_needs_a_setting():
    with pytest.raises(ValueError, match="alphas and shards are both empty"):
        specs.check("afl_benchmark", chapter_values("afl_benchmark", alphas=[], shards=[]))


def test_shards_must_divide_the_training_samples():
    """The README's own example (300 clients x 2 shards of 10,000 samples) used to fail inside a cell."""
    values = {**chapter_values("afl_benchmark"), **profiles.resolve_parameters("afl_benchmark", "quick")}
    with pytest.raises(ValueError, match=r"shards: num_clients \* s = 300 \* 2 = 600 shards do not divide the 10000 "
                                         r"training samples \(n_train\); with s = 2, num_clients may be e.g. 125, 200, 250"):
        specs.check("afl_benchmark", {**values, "num_clients": 300})
    specs.check("afl_benchmark", {**values, "num_clients": 200})
    with pytest.raises(ValueError, match="num_clients must be <= the 10000 training samples"):
        specs.check("afl_benchmark", {**values, "num_clients": 20000, "shards": []})
    with pytest.raises(ValueError, match=r"the 60000 training samples"):
        specs.check("afl_benchmark", {**values, "n_train": None, "num_clients": 7, "shards": [1]})
    with pytest.raises(ValueError, match="shards do not divide"):
        profiles.resolve_parameters("afl_benchmark", "quick", {"num_clients": 300})


def test_missing_parameter_is_named():
    values = chapter_values("afl_derivation")
    del values["table1_dim"]
    with pytest.raises(ValueError, match="table1_dim"):
        specs.check("afl_derivation", values)
