"""The STSA-E Gram benchmark runs at a tiny size, writes its report, and its three forms agree."""
import re

import torch

from fedlib.stsa import bench as stsa_gram
from fedlib.stsa.algorithm import gram_estimate

TINY = ["--M", "30", "--classes", "6", "--clients", "4", "--dummy", "3", "--per-class", "20"]


def _diffs(text: str) -> list[float]:
    return [float(v) for v in re.findall(r"max rel\. difference \([bc]\) vs \(a\)\s+(\S+)", text)]


def test_bench_tiny_full_eq9(tmp_path):
    out = tmp_path / "stsa_gram.txt"
    assert stsa_gram.main(TINY + ["--out", str(out)]) == 0
    text = out.read_text()
    assert "torch threads" in text
    assert re.search(r"time ratio \(b\) / \(a\)\s+[\d.]+x", text)
    assert re.search(r"time ratio \(c\) / \(a\)\s+[\d.]+x", text)
    assert "measured, all classes" in text and "EXTRAPOLATION" not in text
    diffs = _diffs(text)
    assert len(diffs) == 2 and all(d < 1e-10 for d in diffs)
    assert text.count("check < 1e-10: passed") == 2


def test_bench_tiny_eq9_subset_is_labelled(tmp_path):
    out = tmp_path / "stsa_gram.txt"
    assert stsa_gram.main(TINY + ["--eq9-seconds", "1e-9", "--out", str(out)]) == 0
    text = out.read_text()
    assert "MEASURED ON 1 OF 6 CLASSES" in text
    assert "LINEAR EXTRAPOLATION" in text and "EXTRAPOLATED (c) / measured (a)" in text
    assert all(d < 1e-10 for d in _diffs(text))


def test_per_class_loop_matches_vectorized_both_k_modes():
    sums, counts = stsa_gram.make_uploads(M=12, classes=5, clients=3, dummy=4, per_class=15, seed=2)
    assert sums.shape == (12, 12, 5) and counts.shape == (12, 5)
    assert bool((sums >= 0).all()) and bool((sums[(counts == 0).nonzero(as_tuple=True)[0], :,
                                                  (counts == 0).nonzero(as_tuple=True)[1]] == 0).all())
    assert counts.sum() == 5 * 15 and bool((counts == 0).any())
    for k_mode in ("global", "per_class"):
        ref = gram_estimate(sums, counts, k_mode)
        got = stsa_gram.gram_per_class(sums, counts, k_mode)
        assert stsa_gram.relative_error(got, ref) < 1e-12
        torch.testing.assert_close(got, got.T)
