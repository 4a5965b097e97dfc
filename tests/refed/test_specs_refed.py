"""The typed parameter specs of the two Re-Fed chapters: defaults and every profile pass, each type
and rule rejects a bad value with a message naming the parameter; the data-dependent memory check."""
import numpy as np
import pytest

from fedlib.data.streams import make_stream
from conftest import chapter_values
from fedlib.runner import specs
from fedlib.refed.specs import check_total_memory


@pytest.mark.parametrize("chapter, name, bad, message", [
    ("refed_theory", "dim", 0, "dim must be an integer >= 1"),
    ("refed_theory", "mu", 0.0, "mu must be a finite number > 0"),
    ("refed_theory", "logreg_lambdas", [0.5, 1.0], r"logreg_lambdas\[1\] must be a finite number > 0.0 and < 1.0"),
    ("refed_theory", "thm_lambdas", [0.2, 0.2], "thm_lambdas must not repeat"),
    ("refed_theory", "pim_steps", [], "pim_steps must hold at least 1"),
    ("refed_theory", "sigma", -1.0, "sigma must be a finite number >= 0"),
    ("refed_theory", "seed", -1, "seed must be an integer >= 0"),
    ("refed_benchmark", "dataset", "imagenet", "unknown dataset 'imagenet'"),
    ("refed_benchmark", "n_train", 0, "n_train must be an integer >= 1 or null"),
    ("refed_benchmark", "domain", "yes", "domain must be true or false"),
    ("refed_benchmark", "domains", ["svhn"], r"unknown domains\[0\] 'svhn'"),
    ("refed_benchmark", "model", "vit", "unknown model 'vit'"),
    ("refed_benchmark", "device", "tpu", "unknown device 'tpu'"),
    ("refed_benchmark", "participation", 1.5, "participation must be a finite number >= 0.0 and <= 1.0"),
    ("refed_benchmark", "alpha", 0.0, "alpha must be a finite number > 0"),
    ("refed_benchmark", "lam", 1.0, "lam must be a finite number > 0.0 and < 1.0"),
    ("refed_benchmark", "memory", 0, "memory must be an integer >= 1"),
    ("refed_benchmark", "memory_mode", "all", "unknown memory_mode 'all'"),
    ("refed_benchmark", "grad_norm", "approx", "unknown grad_norm 'approx'"),
    ("refed_benchmark", "methods", ["refed", "lander"], r"unknown methods\[1\] 'lander'"),
    ("refed_benchmark", "methods_domain", ["refed", "refed"], "methods_domain must not repeat"),
    ("refed_benchmark", "method_hparams", {"fedprox_replay": {"mu": "big"}}, r"method_hparams\['fedprox_replay'\]"),
    ("refed_benchmark", "method_hparams", {"nope": {}}, "unknown method_hparams key 'nope'"),
    ("refed_benchmark", "seeds", [0, 0], "seeds must not repeat"),
    ("refed_benchmark", "sweep_seeds", [], "sweep_seeds must hold at least 1"),
    ("refed_benchmark", "memories", [30, 0], r"memories\[1\] must be an integer >= 1"),
    ("refed_benchmark", "weightings", ["middle"], r"unknown weightings\[0\] 'middle'"),
    ("refed_benchmark", "num_threads", 0, "num_threads must be an integer >= 1"),
    ("refed_benchmark", "exact_check", 1, "exact_check must be true or false"),
])
def test_types_reject_naming_the_parameter(chapter, name, bad, message):
    with pytest.raises(ValueError, match=message):
        specs.check(chapter, chapter_values(chapter, **{name: bad}))


@pytest.mark.parametrize("chapter, changes, message", [
    ("refed_theory", {"mu": 3.0}, "mu must be <= L_smooth and every thm_L"),
    ("refed_theory", {"thm_L": [0.1]}, "mu must be <= L_smooth and every thm_L"),
    ("refed_theory", {"num_tasks": 7}, "num_tasks must be <= num_classes = 6"),
    ("refed_theory", {"num_classes": 2, "num_tasks": 2}, "num_classes must be >= 3"),
    ("refed_theory", {"grad_samples": 10_000}, "grad_samples must be <= num_classes \\* n_per_class"),
    ("refed_theory", {"num_clients": 121}, "num_clients must be <= the 120 training samples of a task"),
    ("refed_theory", {"num_tasks": 4}, "num_tasks must divide num_classes = 6"),
    ("refed_benchmark", {"methods": ["fedavg"]}, "methods must contain 'refed'"),
    ("refed_benchmark", {"weightings": ["late"]}, "weightings must contain 'early'"),
    ("refed_benchmark", {"participation": 0.0}, r"participation must lie in \(0, 1\]"),
    ("refed_benchmark", {"lr": 2.0, "lam": 0.2}, r"lr \* q\(lam\) = 4 >= 2 for lam = 0.2"),
    ("refed_benchmark", {"lams": [0.01]}, r"lr \* q\(lam\) = 2.48 >= 2 for lam = 0.01"),
    ("refed_benchmark", {"lr_domain": 1.0, "lam_domain": 0.1}, r"lr_domain \* q\(lam_domain\)"),
    ("refed_benchmark", {"first_task_min_acc": 1.0}, "first_task_min_acc must be < 1.0"),
    ("refed_benchmark", {"momentum": 1.0}, "momentum must be < 1.0"),
    ("refed_benchmark", {"dataset": "cifar10"}, "dataset 'cifar10' has RGB images but the digit domains are grayscale"),
])
def test_rules_reject_naming_the_parameters(chapter, changes, message):
    with pytest.raises(ValueError, match=message):
        specs.check(chapter, chapter_values(chapter, **changes))


def test_missing_and_unknown_parameters_are_named():
    values = chapter_values("refed_benchmark")
    del values["memory"]
    with pytest.raises(ValueError, match="refed_benchmark: parameter.*memory not given"):
        specs.check("refed_benchmark", values)
    with pytest.raises(ValueError, match="unknown parameter.*memmory"):
        specs.spec("refed_benchmark").check({**chapter_values("refed_benchmark"), "memmory": 3})


def test_check_total_memory():
    y_tr, y_te = np.repeat(np.arange(4), 30), np.repeat(np.arange(4), 5)
    streams = [("class", lambda seed: make_stream(y_tr, y_te, 2, seed=seed), y_tr, [1000], [1.0])]
    check_total_memory("total", streams, [0, 1], num_clients=3)          # M above every new task
    check_total_memory("replay", [("class", None, None, [1], [1.0])], [0], num_clients=3)   # nothing to check
    small = [("class", lambda seed: make_stream(y_tr, y_te, 2, seed=seed), y_tr, [1000, 5], [1.0])]
    with pytest.raises(ValueError, match="class: memory_mode 'total' needs M > .*got M 5"):
        check_total_memory("total", small, [0], num_clients=3)
