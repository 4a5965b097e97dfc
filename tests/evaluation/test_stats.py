"""fedlib.evaluation.stats: one std convention (sample), paired differences with t intervals."""
import numpy as np
import pandas as pd
import pytest
from scipy import stats as st

from fedlib.evaluation import stats


def test_mean_std_uses_the_sample_std():
    v = [1.0, 2.0, 4.0]
    assert stats.mean_std(v, digits=3) == f"{np.mean(v):.3f} ± {np.std(v, ddof=1):.3f}"
    assert stats.mean_std([0.5], digits=1, scale=100) == "50.0 (n=1)"
    assert np.isnan(stats.sample_std([3.0]))


def test_summarize_groups_with_sample_std():
    df = pd.DataFrame({"m": ["a", "a", "a", "b"], "acc": [1.0, 2.0, 3.0, 5.0]})
    s = stats.summarize(df, "m", "acc")
    assert s.loc["a", "mean"] == 2.0 and s.loc["a", "std"] == pytest.approx(1.0) and s.loc["a", "n"] == 3
    assert np.isnan(s.loc["b", "std"]) and s.loc["b", "n"] == 1
    with pytest.raises(ValueError, match="value column 'loss'"):
        stats.summarize(df, "m", "loss")


def test_paired_difference_matches_scipy_ttest_and_interval():
    rng = np.random.default_rng(0)
    b = rng.normal(size=7)
    a = b + 0.3 + 0.1 * rng.normal(size=7)
    d = stats.paired_difference(a, b)
    ref = st.ttest_rel(a, b).confidence_interval(0.95)
    assert d.low == pytest.approx(ref.low, rel=1e-12) and d.high == pytest.approx(ref.high, rel=1e-12)
    assert d.mean == pytest.approx(np.mean(a - b)) and d.n == 7 and d.excludes_zero
    assert "95% CI, n=7" in str(d)


def test_paired_difference_noise_does_not_exclude_zero_and_bad_input():
    d = stats.paired_difference([1.0, 2.0, 3.0], [1.1, 1.9, 3.05])
    assert not d.excludes_zero
    with pytest.raises(ValueError, match="pair one to one"):
        stats.paired_difference([1, 2, 3], [1, 2])
    with pytest.raises(ValueError, match="at least 2 pairs"):
        stats.paired_difference([1], [2])
    with pytest.raises(ValueError, match="non-finite"):
        stats.paired_difference([1, np.nan], [1, 2])
