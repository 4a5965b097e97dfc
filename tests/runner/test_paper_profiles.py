"""The `paper` profiles, ready for the first GPU: every chapter's `paper` code path run on CPU at a
tiny size, and every `paper` profile at its real size through the spec check and the memory estimate.

``TINY`` (below, the one place) names, for every chapter with a `paper` block in
notebooks/profiles.yml, the overrides that make its `paper` profile tiny (sample counts, rounds,
epochs, seeds, landmarks, M, ...; ``device="cpu"``) and the `paper` parameters kept as they are
because they choose a code path (backbone ResNet-18 at 224 px, datasets, ``grad_norm="exact"``,
method lists, ...). A `paper` parameter in neither list fails the coverage test, so a chapter that
gains one must say here how it is made tiny. Chapters listed in ``order`` whose notebook does not
exist yet, or that have no `paper` block, are skipped; they are picked up when they appear.

The tiny runs read data the machine cannot download from a temporary data root (``FEDLIB_DATA``):
CIFAR-10/100 written in torchvision's on-disk format with random pixels, and a randomly initialised
ResNet-18 saved under the ImageNet weights' file name; the feature cache goes to a temporary folder
(``FEDLIB_CACHE``), so random-weight features never reach the real cache. torchvision checks the
CIFAR files' md5 against the official release: an IPython startup file in a temporary ``IPYTHONDIR``
(read by the notebook's kernel) replaces that check by an existence check, in the test's kernels
only. For the Fed-tSNE chapters the same file lowers ``DENSE_MAX_POINTS`` so that each dataset
takes the server path (dense n x n or sparse kNN) it takes at the `paper` size, and logs every
decision, which the test compares with the `paper` run's. Notebooks execute into a temporary
folder, never into book/executed.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from conftest import write_cifar, write_resnet18_weights
from fedlib.runner import memory, cli, profiles

# --------------------------------------------------------------------------------------------
# the one place: how each chapter's `paper` profile is made tiny
# --------------------------------------------------------------------------------------------
#: images per class of the generated CIFAR files (train, test); the `paper` profiles that read
#: CIFAR keep "all images" (n_train / subsets null), so these are the tiny sizes of those runs
CIFAR_PER_CLASS = {"cifar10": (4, 2), "cifar100": (2, 1)}

#: chapter -> {"tiny": overrides of the `paper` profile, "keep": `paper` parameters kept as they
#: are (each chooses a code path or is a value, not a size)}
TINY: dict[str, dict] = {
    "afl_derivation": {
        "tiny": {"n_samples": 600, "dim": 16, "client_counts": [1, 2, 10], "dirichlet_alphas": [1.0, 0.01],
                 "sweep_clients": 10, "pairwise_max_clients": 10, "table1_dim": 16, "table1_clients": [2, 10],
                 "fp_clients": 50, "conditions": [1.0e+5, 1.0e+10], "f32_conditions": [1.0e+5],
                 "reference_samples": 300, "reference_dim": 8, "n_orders": 2},
        "keep": ["gammas"],
    },
    "afl_benchmark": {
        "tiny": {"n_train": 40, "n_test": 20, "device": "cpu", "num_clients": 4, "shards": [2], "alphas": [0.1],
                 "seeds": [0, 1], "rounds": 2, "local_epochs": 1, "client_counts": [2, 4],
                 "table3_alphas": [0.1], "gammas": [0.0, 1.0], "ri_clients": [2, 4]},
        "keep": ["backbone", "input_size"],
    },
    "afl_beyond": {
        "tiny": {"n_train": 40, "n_test": 20, "num_clients": 4, "check_samples": 300, "check_dim": 8,
                 "cond_samples": 400, "cond_dim": 16, "cond_clients": 4, "seeds": [0, 1], "mask_clients": 3,
                 "loco_clients": 2, "ridge_grid": [0.01, 1.0, 100.0, 10000.0]},
        "keep": ["backbone", "input_size", "feature_bound", "conditions"],
    },
    "stsa_derivation": {
        "tiny": {"n_samples": 1500, "dim": 16, "M": 64, "client_counts": [1, 5], "betas": [0.1], "mc_reps": 300,
                 "mse_reps": 200, "mse_clients": [2, 5, 30, 120], "bias_dummy": [1, 5], "rate_ns": [500, 2000],
                 "rate_clients": [2, 10], "rate_n_fixed": 1000, "rate_reps": 20, "skew_scales": [0.0, 0.2],
                 "skew_reps": 100, "skew_seeds": [0, 1], "skew_dummy": 2},
        "keep": [],
    },
    "stsa_benchmark": {
        "tiny": {"device": "cpu", "betas": [0.5, 0.1], "seeds": [0, 1], "baseline_seeds": [0, 1], "M": 64,
                 "M_scratch": 32, "num_dummy": 2, "rounds_per_task": 1, "local_epochs": 1, "scratch_seeds": [0],
                 "scratch_rounds": 1, "scratch_widths": [4, 4, 8, 8], "scratch_baseline_rounds": 1,
                 "ablation_M": [32, 64], "ablation_M_scratch": [16, 32], "ablation_K": [2, 5],
                 "ablation_clients_total": 10, "ablation_dummy": [1, 2], "noise_grid": [[0.1, 0.1]],
                 "noise_seeds": [0, 1], "num_threads": 1},
        # all images of the (generated, tiny) CIFAR-100: CIFAR_PER_CLASS
        "keep": ["datasets", "subsets", "n_train", "n_test", "backbone", "input_size", "num_tasks", "gamma",
                 "scratch_dataset", "scratch_baselines", "first_task_classes", "later_task_classes"],
    },
    "stsa_beyond": {
        "tiny": {"device": "cpu", "seeds": [0, 1], "M": 100, "check_samples": 60, "epsilons": [1.0, 16.0],
                 "num_threads": 1},
        # all images of the (generated, tiny) CIFAR-100: CIFAR_PER_CLASS
        "keep": ["dataset", "subsets", "n_train", "n_test", "backbone", "input_size", "num_tasks", "gamma_max",
                 "gamma_points"],
    },
    "fedtsne_benchmark": {
        "tiny": {"n_points": {"mnist5k": 200, "fashion_mnist": 260, "optdigits": 210}, "n_landmarks": 30,
                 "seeds": [0, 1, 2], "plateau_tol": 0.05, "plateau_check": 10, "max_rounds": 200, "tsne_max_iter": 250,
                 "umap_epochs": 50, "sweep_seeds": [0], "iid_client_counts": [5], "noniid_client_counts": [5],
                 "landmark_counts": [10, 20], "scatter_points": 100, "num_threads": 1},
        "keep": ["datasets", "methods", "landmark_methods", "landmark_splits", "landmark_variants", "feddl_dtype"],
    },
    "fedtsne_privacy": {
        "tiny": {"n_points": 200, "public_points": 60, "num_clients": 2, "n_landmarks": 20, "rounds": 5,
                 "epsilons": [0.5, 100000.0], "betas": [0.0, 4.0], "seeds": [0, 1], "tsne_max_iter": 250},
        "keep": [],
    },
    "fedspeclust": {
        "tiny": {"max_points": 120, "n_landmarks": 20, "rounds": 5, "seeds": [0, 1], "landmark_grid": [10, 20],
                 "derivation_points": 120},
        "keep": ["feddl_dtype"],
    },
    "fedtsne_beyond": {
        "tiny": {"n_points": 300, "num_clients": 5, "seeds": [0, 1], "rounds": 5, "landmark_grid": [20, 40],
                 "metric_grid": [40], "placement_landmarks": 40, "tsne_max_iter": 250, "umap_epochs": 50,
                 "num_threads": 1},
        "keep": ["metric_combos", "methods"],
    },
    "refed_benchmark": {
        "tiny": {"device": "cpu", "n_train": 20, "n_test": 10, "n_per_domain": 10, "num_tasks": 2, "num_clients": 2,
                 "rounds": 1, "local_epochs": 1, "rounds_domain": 1, "first_rounds_domain": 1,
                 "local_epochs_domain": 1, "first_task_min_acc": 0.0, "batch_size": 8, "memory": 4,
                 "memory_domain": 4, "memories": [6], "pim_epochs": 1, "seeds": [0], "sweep_seeds": [0],
                 "alphas": [0.5], "lams": [0.5], "lam_alphas": [0.5]},
        "keep": ["model", "lr", "lr_domain", "grad_norm", "methods", "methods_domain", "weightings"],
    },
    "refed_beyond": {
        "tiny": {"device": "cpu", "n_train": 20, "n_test": 10, "num_tasks": 2, "num_clients": 2, "rounds": 1,
                 "local_epochs": 1, "batch_size": 8, "memory": 4, "pim_epochs": 1, "seeds": [0, 1]},
        "keep": ["model", "lr", "workers", "split_rules", "noise_rules"],
    },
}

#: Fed-tSNE chapters that embed through fedlib.fedtsne.pipelines (dense n x n up to
#: DENSE_MAX_POINTS points, sparse kNN above): the points each dataset sends there, from the chapter's
#: values; their paper sizes decide the path the tiny run must take (fedtsne_beyond always works on
#: neighbour lists, fedlib.fedtsne.beyond: nothing to mirror)
SERVER_POINTS = {
    "fedtsne_benchmark": lambda v: {ds: memory._points(ds, v["n_points"].get(ds))
                                    for ds in dict.fromkeys([*v["datasets"], v["sweep_dataset"]])},
    "fedspeclust": lambda v: {ds: memory._points(ds, v["max_points"])
                              for ds in dict.fromkeys([*v["datasets"], v["sweep_dataset"]])},
    "fedtsne_privacy": lambda v: {"optdigits": v["n_points"]},
}


# --------------------------------------------------------------------------------------------
# which chapters
# --------------------------------------------------------------------------------------------
def _paper_block(name: str) -> dict:
    return profiles.load_profiles()["paper"].get(name) or {}


def paper_chapters() -> list[str]:
    """Chapters of ``order`` whose notebook exists and that have a `paper` block."""
    return [n for n in profiles.notebook_names()
            if (profiles.NOTEBOOK_DIR / f"{n}.py").exists() and _paper_block(n)]


CHAPTERS = paper_chapters()


def values(name: str, overrides: dict | None = None) -> dict:
    """Every parameter of ``name`` at the `paper` profile with ``overrides`` (checked by its spec)."""
    return {**profiles.notebook_parameters(name), **profiles.resolve_parameters(name, "paper", overrides),
            "profile": "paper"}


def dense_threshold(name: str) -> tuple[int | None, dict]:
    """For a Fed-tSNE chapter: the ``DENSE_MAX_POINTS`` that makes every dataset take, at its tiny
    size, the server path it takes at its `paper` size, and {tiny points: sparse?}; (None, {}) else."""
    if name not in SERVER_POINTS:
        return None, {}
    from fedlib.fedtsne.pipelines import DENSE_MAX_POINTS

    paper, tiny = SERVER_POINTS[name](values(name)), SERVER_POINTS[name](values(name, TINY[name]["tiny"]))
    expected = {}
    for ds in paper:
        sparse = paper[ds] > DENSE_MAX_POINTS
        assert expected.get(tiny[ds], sparse) == sparse, \
            f"{name}: give datasets with different server paths different tiny sizes ({ds}: {tiny[ds]})"
        expected[tiny[ds]] = sparse
    dense = [n for n, s in expected.items() if not s]
    threshold = max(dense) if dense else min(expected) - 1
    assert all(n > threshold for n, s in expected.items() if s), \
        f"{name}: tiny sizes of sparse datasets must exceed those of dense ones, got {expected}"
    return threshold, expected


# --------------------------------------------------------------------------------------------
# cheap checks: coverage, spec, memory estimate
# --------------------------------------------------------------------------------------------
def test_some_chapters_have_a_paper_profile():
    assert {"afl_benchmark", "stsa_benchmark", "fedtsne_benchmark", "refed_benchmark"} <= set(CHAPTERS)


def test_tiny_names_each_chapter_once():
    """A chapter written twice in the TINY literal would silently keep only its last entry."""
    import ast

    tree = ast.parse(Path(__file__).read_text())
    node = next(n for n in tree.body if isinstance(n, ast.AnnAssign) and getattr(n.target, "id", "") == "TINY")
    keys = [k.value for k in node.value.keys]
    assert len(keys) == len(set(keys)), sorted(k for k in keys if keys.count(k) > 1)


@pytest.mark.parametrize("name", CHAPTERS)
def test_every_paper_parameter_is_made_tiny_or_kept(name):
    assert name in TINY, (f"{name} has a paper profile but no entry in TINY (tests/runner/test_paper_profiles.py): "
                          "say how its paper code path is run at a tiny size")
    tiny, keep = TINY[name]["tiny"], set(TINY[name]["keep"])
    paper = set(_paper_block(name))
    uncovered = sorted(paper - set(tiny) - keep)
    assert not uncovered, (f"{name}: paper parameter(s) {uncovered} are neither made tiny nor kept in TINY "
                           "(tests/runner/test_paper_profiles.py)")
    assert not set(tiny) & keep, f"{name}: {sorted(set(tiny) & keep)} both made tiny and kept"
    assert keep <= paper, f"{name}: kept parameter(s) {sorted(keep - paper)} are not in its paper profile"
    defaults = profiles.notebook_parameters(name)
    assert set(tiny) <= set(defaults), f"{name}: unknown parameter(s) {sorted(set(tiny) - set(defaults))}"
    assert tiny.get("device", "cpu") == "cpu"
    if "device" in defaults:
        assert "device" in tiny, f"{name}: the tiny run must set device='cpu'"


@pytest.mark.parametrize("name", CHAPTERS)
def test_paper_profile_passes_its_spec_and_reports_its_memory(name, capsys):
    v = values(name)                                          # the spec check of the real size
    est = memory.estimate(name, v)
    assert est.host_bytes >= 0 and est.device_bytes >= 0
    if name in memory.ESTIMATORS:
        assert est.host_bytes > 0, f"{name}: an estimator that counts nothing"
    assert cli.main([name, "--profile", "paper", "--estimate"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out == [line for line in out if line.startswith(f"[paper] {name}: ")] and len(out) == 1, out
    assert f"host {memory.gib(est.host_bytes)}, GPU {memory.gib(est.device_bytes)}" in out[0]
    for term, b in {**est.host, **est.device}.items():
        assert f"{term}: {memory.gib(b)}" in out[0]


@pytest.mark.parametrize("name", CHAPTERS)
def test_tiny_overrides_keep_the_paper_code_path(name):
    """The tiny values pass the spec and the memory check of this machine, and keep every code-path choice."""
    tiny = values(name, TINY[name]["tiny"])
    paper = values(name)
    for key in TINY[name]["keep"]:
        assert tiny[key] == paper[key], key
    memory.check_fits(name, tiny)
    assert memory.estimate(name, tiny).host_bytes < 2**30
    dense_threshold(name)          # the Fed-tSNE sizes can mirror the paper's dense / sparse choice


def test_generated_cifar_reads_through_fedlib(tmp_path, ignore_cifar_md5):
    from fedlib.data.datasets import load_dataset

    for name, (tr, te) in CIFAR_PER_CLASS.items():
        write_cifar(tmp_path, name, tr, te)
        ds = load_dataset(name, root=tmp_path)
        k = len(ds.classes)
        assert ds.x_train.shape == (k * tr, 32, 32, 3) and ds.x_test.shape == (k * te, 32, 32, 3)
        assert sorted(set(ds.y_train.tolist())) == list(range(k)) and len(ds.y_test) == k * te


# --------------------------------------------------------------------------------------------
# bugs the tiny paper runs found, as unit tests
# --------------------------------------------------------------------------------------------
def test_qr_reference_with_fewer_samples_than_features_is_the_minimum_norm_solution():
    """afl_benchmark with ResNet-18 features (d = 512) and fewer training images crashed in the QR
    reference (R not square); it is the minimum-norm least-squares head then."""
    import numpy as np
    import scipy.linalg

    from fedlib.core.linalg import qr_reference

    rng = np.random.default_rng(0)
    n, d, classes = 12, 30, 3
    x = rng.standard_normal((n, d))
    x[:, 5] = 0.0                                  # a dead column keeps weight 0
    y = rng.integers(0, classes, n)
    w = qr_reference(x, y, classes).numpy()
    targets = np.eye(classes)[y]
    np.testing.assert_allclose(w, scipy.linalg.pinv(x) @ targets, rtol=1e-9, atol=1e-11)   # independent: pinv
    np.testing.assert_allclose(x @ w, targets, atol=1e-9)   # n < d: the head interpolates
    assert np.all(w[5] == 0.0)


def test_scratch_baselines_on_rgb_images_with_four_stages():
    """stsa_benchmark's paper profile (CIFAR-100, scratch_widths of four stages) crashed in the
    end-to-end scratch baselines: their SmallResNet took 1 input channel and 3 stages whatever the data."""
    import numpy as np

    from fedlib.data.datasets import Dataset
    from fedlib.stsa import studies as stsa_studies

    rng = np.random.default_rng(0)
    y_tr, y_te = np.repeat(np.arange(4), 6), np.repeat(np.arange(4), 2)
    ds = Dataset("toy-rgb", rng.integers(0, 256, (len(y_tr), 8, 8, 3), dtype=np.uint8), y_tr,
                 rng.integers(0, 256, (len(y_te), 8, 8, 3), dtype=np.uint8), y_te, ("a", "b", "c", "d"))
    fed = dict(local_epochs=1, batch_size=8, lr=0.05, device="cpu", eval_every=10**6)
    base = stsa_studies.scratch_baseline_runs(["finetune"], ds, "scratch / toy", 2, 2, 1.0, fed, 1, {}, (2, 2, 4, 4),
                                      min_size=1, progress=False)
    assert len(base) == 1 and base[0].acc.shape == (2, 2)


# --------------------------------------------------------------------------------------------
# the tiny runs
# --------------------------------------------------------------------------------------------
STARTUP = '''\
# written by tests/runner/test_paper_profiles.py: test-only patches of this kernel
import os as _os
import torchvision.datasets.cifar as _tv_cifar

# generated CIFAR files cannot match the official md5 sums: check that they exist, as with md5=None
_tv_cifar.check_integrity = lambda fpath, md5=None: _os.path.isfile(fpath)
del _tv_cifar
'''

DENSE_PATCH = '''
import fedlib.fedtsne.pipelines as _pipes

_pipes.DENSE_MAX_POINTS = {threshold}


def _logged(sparse, n, _decide=_pipes._use_sparse):
    out = _decide(sparse, n)
    with open({log!r}, "a") as f:
        f.write(f"{{n}} {{int(out)}}\\n")
    return out


_pipes._use_sparse = _logged
del _pipes, _logged
'''


def _children_cpu() -> float:
    """CPU seconds (user + system) of this process's finished children (the notebook kernels)."""
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


@pytest.fixture(scope="module")
def tiny_env(tmp_path_factory):
    """A temporary data root (generated CIFAR, random ResNet-18 weights), feature cache, torch hub
    and IPYTHONDIR, in the environment the notebook kernels inherit."""
    root = tmp_path_factory.mktemp("paper_tiny")
    data = root / "data"
    for name, (tr, te) in CIFAR_PER_CLASS.items():
        write_cifar(data, name, tr, te)
    write_resnet18_weights(data / "weights")
    with pytest.MonkeyPatch.context() as mp:
        for var, path in {"FEDLIB_DATA": data, "FEDLIB_CACHE": root / "cache", "TORCH_HOME": root / "torch",
                          "IPYTHONDIR": root / "ipython"}.items():
            mp.setenv(var, str(path))
        # OpenMP threads that wait passively, as fedtsne_benchmark sets for itself: without it sklearn's
        # t-SNE after a UMAP run in the same kernel (fedtsne_privacy) is about 20x slower on a busy machine
        mp.setenv("OMP_WAIT_POLICY", "PASSIVE")
        yield root


@pytest.mark.slow
@pytest.mark.parametrize("name", CHAPTERS)
def test_paper_code_path_runs_at_tiny_size(name, tiny_env):
    assert name in TINY, f"{name} has a paper profile but no entry in TINY"
    startup = tiny_env / "ipython" / "profile_default" / "startup" / "00-paper-tiny.py"
    startup.parent.mkdir(parents=True, exist_ok=True)
    threshold, expected = dense_threshold(name)
    log = tiny_env / f"{name}.server-paths"
    startup.write_text(STARTUP + ("" if threshold is None else DENSE_PATCH.format(threshold=threshold, log=str(log))))
    out = tiny_env / "executed" / f"{name}.ipynb"
    t0, cpu0 = time.perf_counter(), _children_cpu()
    profiles.run_notebook(name, "paper", TINY[name]["tiny"], output=out, progress=False)
    seconds, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
    nb = json.loads(out.read_text())
    errors = [o for c in nb["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])
              if o["output_type"] == "error"]
    assert not errors
    injected = "".join(next(c["source"] for c in nb["cells"] if "injected-parameters" in c["metadata"].get("tags", [])))
    assert 'profile = "paper"' in injected and ('device = "cpu"' in injected or "device" not in values(name))
    if threshold is not None:
        seen = {}
        for line in log.read_text().split("\n"):
            if line:
                n, sparse = map(int, line.split())
                seen.setdefault(n, set()).add(bool(sparse))
        for n, sparse in expected.items():
            assert seen.get(n) == {sparse}, (f"{name}: {n} points took the {'sparse' if sparse else 'dense'} server "
                                             f"path at paper size; at tiny size: {seen}")
    print(f"{name}: paper code path at tiny size in {seconds:.0f} s ({cpu:.0f} s CPU in the kernel)")
