"""The Fed-tSNE speed benchmark runs at a tiny size, writes its report, and its loop gradient agrees."""
import re

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from fedlib.fedtsne import algorithm as ft
from fedlib.fedtsne import bench_speed as fedtsne_speed

TINY = ["--dataset", "optdigits", "--points", "300", "--clients", "3", "--landmarks", "12", "--rounds", "2",
        "--tsne-max-iter", "250", "--loop-points", "60", "--loop-clients", "2", "--repeats", "1",
        "--dtype-points", "120", "--dtype-clients", "3", "--dtype-landmarks", "10", "--dtype-rounds", "5"]


def test_bench_tiny_report(tmp_path):
    out = tmp_path / "fedtsne_speed.txt"
    with threadpool_limits(1):  # one OpenMP thread: no spin-waiting on a loaded machine, whatever the import order
        assert fedtsne_speed.main(TINY + ["--out", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("machine: ") and "OpenMP threads" in text
    assert "optdigits: 300 points x 64 features" in text
    for label in ["centralized t-SNE", "Fed-tSNE total", "FedDL, all clients and rounds", "uploads + Nystrom + t-SNE"]:
        assert re.search(rf"{re.escape(label)}.*\s[\d.]+ s", text), label
    assert re.search(r"time ratio Fed-tSNE / centralized\s+[\d.]+x", text)
    cas = [float(v) for v in re.findall(r"CA 10-NN (?:centralized|Fed-tSNE)\s+([\d.]+)", text)]
    assert len(cas) == 2 and all(0.0 <= c <= 1.0 for c in cas)
    assert "60 points x 64 features over 2 IID clients (30-30 rows each), n_y=12" in text
    assert re.search(r"time ratio \(b\) / \(a\)\s+\d+x", text)
    diff = float(re.search(r"max rel\. difference \(b\) vs \(a\)\s+(\S+)", text).group(1))
    assert diff < 1e-10 and "check < 1e-10: passed" in text
    # part 3: FedDL float32 vs float64
    assert "3. FedDL float32 vs float64: 120 points x 64 features, 3 IID clients, n_y=10, 5 rounds" in text
    assert len(re.findall(r"float64 / float32\s+[\d.]+ / [\d.]+ ms per round", text)) == 2
    rel = float(re.search(r"noise-free landmarks, rel\. difference\s+(\S+)", text).group(1))
    assert rel < 1e-4 and "check < 0.0001: passed" in text


@pytest.mark.parametrize("n, ny", [(1, 2), (7, 5), (30, 9)])
def test_loop_gradient_matches_vectorized(n, ny):
    rng = np.random.default_rng(n)
    X, Y = rng.normal(size=(n, 4)), rng.normal(size=(ny, 4))
    got = fedtsne_speed.mmd2_u_grad_loop(X, Y, 0.3)
    assert got.shape == Y.shape
    assert fedtsne_speed.relative_error(got, ft.mmd2_u_grad(X, Y, 0.3)) < 1e-12


def test_loop_gradient_rejects_bad_shapes():
    with pytest.raises(ValueError, match="need X"):
        fedtsne_speed.mmd2_u_grad_loop(np.zeros((3, 2)), np.zeros((1, 2)), 1.0)
