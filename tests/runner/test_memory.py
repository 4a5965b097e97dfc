"""Peak-memory estimates of the chapters (fedlib.runner.memory), checked before any work."""
import pytest

from fedlib.runner import cli, memory, profiles


def params(chapter, profile, **overrides):
    return {**profiles.notebook_parameters(chapter), **profiles.resolve_parameters(chapter, profile, overrides)}


def test_estimates_follow_the_dominant_arrays():
    small = memory.estimate("fedtsne_benchmark", params("fedtsne_benchmark", "quick", workers=1))
    big = memory.estimate("fedtsne_benchmark", params("fedtsne_benchmark", "quick", workers=1, n_points={
        "mnist5k": 2000, "fashion_mnist": 4000, "optdigits": 1000}))
    assert big.host_bytes == pytest.approx(4 * 8 * 4000**2)          # four dense n x n float64 matrices
    assert small.host_bytes < big.host_bytes
    stsa = memory.estimate("stsa_benchmark", params("stsa_benchmark", "quick", M=2000))
    assert stsa.host["Gram G, its solve and the server's sums (4 M x M float64)"] == 4 * 8 * 2000**2
    theory = memory.estimate("refed_theory", params("refed_theory", "quick"))
    big = memory.estimate("refed_theory", params("refed_theory", "quick", mc_reps=10_000_000))
    assert 0 < theory.host_bytes < 2**30 and big.host["Monte Carlo errors and states (float64)"] == 301 * 10**7 * 21 * 8
    with pytest.raises(MemoryError, match="refed_theory needs at least .* GiB of host RAM"):
        memory.check_fits("refed_theory", params("refed_theory", "quick", mc_reps=10_000_000), host_limit=2**30)


def test_every_quick_chapter_fits_this_machine_and_smoke_fits_one_gib():
    for name in profiles.notebook_names():
        memory.check_fits(name, params(name, "quick"))
        assert memory.estimate(name, params(name, "smoke")).host_bytes < 2**30, name


def test_a_run_that_cannot_fit_is_refused_with_the_numbers():
    v = params("fedspeclust", "quick", max_points=20000)
    with pytest.raises(MemoryError, match=r"fedspeclust needs at least .* GiB of host RAM .* has 2.00 GiB \(kernel"):
        memory.check_fits("fedspeclust", v, host_limit=2 * 2**30)
    v = params("refed_benchmark", "quick", model="resnet18", device="cuda", batch_size=4096)
    with pytest.raises(MemoryError, match="GPU memory"):
        memory.check_fits("refed_benchmark", v, device_limit=4 * 2**30)


def test_runner_refuses_before_executing(monkeypatch):
    monkeypatch.setattr(memory, "available", lambda: (2**30, None))
    with pytest.raises(MemoryError, match="host RAM"):
        cli.main(["fedspeclust", "--profile", "quick", "max_points=20000"])


def test_runner_prints_estimates_without_running(capsys):
    assert cli.main(["all", "--profile", "paper", "--estimate"]) == 0
    out = capsys.readouterr().out
    assert out.count("[paper]") == len(profiles.notebook_names()) and "fedtsne_benchmark: host" in out


def test_command_line_ends_a_refused_run_in_one_error_line(monkeypatch):
    monkeypatch.setattr(memory, "available", lambda: (2**30, None))
    with pytest.raises(SystemExit, match=r"^error: fedspeclust needs at least .* GiB of host RAM"):
        cli.cli(["fedspeclust", "--profile", "quick", "max_points=20000"])


def test_fedtsne_above_the_dense_limit_is_estimated_on_the_knn_path():
    """fashion_mnist at 40,000 points (the paper profile) takes the kNN path: no n x n term, a few GiB."""
    from fedlib.fedtsne.pipelines import DENSE_MAX_POINTS

    est = memory.estimate("fedtsne_benchmark", params("fedtsne_benchmark", "paper", workers=1))
    assert not any("n x n" in k for k in est.host) and est.host_bytes < 2 * 2**30
    at_limit = memory.estimate("fedtsne_benchmark", params("fedtsne_benchmark", "quick", workers=1, n_points={
        "mnist5k": 1000, "fashion_mnist": DENSE_MAX_POINTS, "optdigits": 1000}))
    assert at_limit.host_bytes == pytest.approx(4 * 8 * DENSE_MAX_POINTS**2)


def test_every_chapter_has_an_estimator_that_grows_with_its_sizes():
    assert set(profiles.notebook_names()) == set(memory.ESTIMATORS)
    afl = memory.estimate("afl_beyond", params("afl_beyond", "quick"))
    assert afl.host["stacked client factors R_k for TSQR (at most n x (d+C) float64)"] == 12000 * (1280 + 10) * 8
    assert memory.estimate("afl_beyond", params("afl_beyond", "quick", loco_clients=50)).host_bytes > afl.host_bytes
    stsa = memory.estimate("stsa_beyond", params("stsa_beyond", "quick", M=3000))
    assert stsa.host["Gram G, its solve and the server's sums (6 M x M float64)"] == 6 * 8 * 3000**2
    assert memory.estimate("stsa_beyond", params("stsa_beyond", "paper")).device_bytes > 0   # cuda at paper
    tsne = memory.estimate("fedtsne_beyond", params("fedtsne_beyond", "quick", n_points=3000))
    assert tsne.host_bytes == 4 * 8 * 3000**2
    one = memory.estimate("refed_beyond", params("refed_beyond", "quick", model="resnet18", workers=1))
    two = memory.estimate("refed_beyond", params("refed_beyond", "quick", model="resnet18", workers=2))
    images = one.host["images as float32 tensors"]
    assert two.host_bytes - images == pytest.approx(2 * (one.host_bytes - images))   # each forked run trains its own model


def test_afl_benchmark_on_cuda_estimates_the_device_memory():
    """device="cuda" (the paper profile) needs GPU memory: the backbone and an extraction batch, or the
    features and the clients' heads in training, whichever is larger; device="cpu" needs none."""
    cpu = memory.estimate("afl_benchmark", params("afl_benchmark", "quick", device="cpu"))
    assert cpu.device_bytes == 0
    cuda = memory.estimate("afl_benchmark", params("afl_benchmark", "quick", device="cuda"))
    assert cuda.device_bytes > 0 and cuda.host == cpu.host
    assert cuda.device["features on the device and their stacked copy (2 x float32)"] == 2 * 12000 * 1280 * 4
    paper = memory.estimate("afl_benchmark", params("afl_benchmark", "paper"))   # resnet18 @ 224 px on cuda
    extraction = memory.RESNET18_PARAMS * 4 + 2 * 256 * 32 * 224**2 * 4   # weights, activations of a 224-px batch
    assert paper.device_bytes >= extraction and paper.device_bytes > cuda.device_bytes
    small = memory.estimate("afl_benchmark", params("afl_benchmark", "paper", n_train=1000, n_test=100,
                                                    client_counts=[10], num_clients=10))
    assert small.device["resnet18 weights (float32)"] == memory.RESNET18_PARAMS * 4   # extraction dominates
    more = memory.estimate("afl_benchmark", params("afl_benchmark", "quick", device="cuda", client_counts=[100, 5000]))
    assert more.device_bytes > cuda.device_bytes
    with pytest.raises(MemoryError, match="GPU memory"):
        memory.check_fits("afl_benchmark", params("afl_benchmark", "paper"), device_limit=2**28)


def test_forked_workers_multiply_the_per_run_memory(monkeypatch):
    """Each forked worker holds its own run's arrays: workers=None takes the cores (FEDLIB_WORKERS),
    and runs on an accelerator stay in the kernel (one at a time)."""
    monkeypatch.setenv("FEDLIB_WORKERS", "2")
    one = memory.estimate("fedtsne_benchmark", params("fedtsne_benchmark", "quick", workers=1))
    cores = memory.estimate("fedtsne_benchmark", params("fedtsne_benchmark", "quick", workers=None))
    assert cores.host_bytes == pytest.approx(2 * one.host_bytes)
    kw = dict(model="resnet18", n_train=2000, n_test=500)
    one = memory.estimate("refed_benchmark", params("refed_benchmark", "quick", workers=1, **kw))
    three = memory.estimate("refed_benchmark", params("refed_benchmark", "quick", workers=3, **kw))
    images = one.host["images as float32 tensors"]
    assert three.host_bytes - images == pytest.approx(3 * (one.host_bytes - images))
    gpu = memory.estimate("refed_benchmark", params("refed_benchmark", "quick", workers=None, device="cuda", **kw))
    assert gpu.device_bytes == pytest.approx(one.host_bytes - images)
