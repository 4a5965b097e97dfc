"""The Re-Fed scoring benchmark runs at a tiny size, writes its report, and its forms agree."""
import re

import torch

from fedlib.refed import bench as refed_scoring
from fedlib.federated.models import SmallCNN
from fedlib.core.persample import grad_sq_norms, reference_grad_sq_norms

TINY = ["--n", "24", "--batch-size", "8", "--models", "2x4", "3x5", "--repeats", "1", "--check-n", "8",
        "--threads", "1", "--resnet-n", "2", "--resnet-batch", "2", "--resnet-check-n", "2", "--resnet-norms", "batch"]


def test_bench_tiny_writes_report_and_checks_pass(tmp_path):
    out = tmp_path / "refed_scoring.txt"
    assert refed_scoring.main(TINY + ["--out", str(out)]) == 0
    text = out.read_text()
    assert "torch threads" in text and "SmallCNN(width=2, hidden=4)" in text and "SmallCNN(width=3, hidden=5)" in text
    assert "resnet18_cifar(norm=batch)" in text
    for label in ["(a) ghost norms, all parameters", "(b) vmap(grad), all parameters",
                  "(c) autograd loop, all parameters", "(d) last-layer closed form"]:
        assert len(re.findall(re.escape(label) + r"\s+[\d.]+ samples/s", text)) == 3, label
    for pair in ["(a) over (b)", "(a) over (c)", "(d) over (a)"]:
        assert len(re.findall(r"speed-up " + re.escape(pair) + r"\s+[\d.]+x", text)) == 3, pair
    diffs = [float(v) for v in re.findall(r"\([ab]\) vs \(c\), float64\s+(\S+)", text)]
    assert len(diffs) == 6 and max(diffs) < 1e-8
    assert text.count("check < ") == text.count(": passed)") == 9 and "FAILED" not in text


def test_reference_loop_matches_vectorized_in_float64_and_restores_the_model():
    torch.manual_seed(0)
    model = SmallCNN(1, 5, 12, width=2, hidden=6).double().train()
    model.conv1.weight.requires_grad_(False)
    x = torch.randn(7, 1, 12, 12, dtype=torch.float64)
    y = torch.randint(0, 3, (7,))
    ref = reference_grad_sq_norms(model, x, y, num_seen=3)
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    assert model.training and not flags["conv1.weight"] and all(p.grad is None for p in model.parameters())
    names = [n for n, _ in model.named_parameters()]
    vec = grad_sq_norms(model, x, y, 3, names=names, batch_size=4)
    assert refed_scoring.relative_error(vec, ref) < 1e-12
    last = reference_grad_sq_norms(model, x, y, 3, names=["classifier.weight", "classifier.bias"])
    assert bool((last <= ref + 1e-12).all()) and bool((last > 0).all())


def test_bad_model_size_is_refused():
    import pytest

    with pytest.raises(SystemExit):
        refed_scoring.main(["--models", "8"])
