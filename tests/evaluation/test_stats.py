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


def test_paired_power_matches_a_monte_carlo_of_the_paired_t_test():
    """The noncentral-t power against simulation: the share of simulated paired experiments whose
    95 % CI excludes 0 (an independent reference: scipy's t-test on normal samples)."""
    from scipy import stats as st

    from fedlib.evaluation.stats import paired_power, seeds_for_power

    rng = np.random.default_rng(0)
    for effect, sd, n in [(1.0, 2.0, 5), (0.5, 1.0, 20), (3.0, 2.0, 4)]:
        d = rng.normal(effect, sd, size=(20000, n))
        hits = st.ttest_1samp(d, 0.0, axis=1).pvalue < 0.05
        assert abs(paired_power(effect, sd, n) - hits.mean()) < 0.015, (effect, sd, n)
    n = seeds_for_power(1.0, 2.0, power=0.8)
    assert paired_power(1.0, 2.0, n) >= 0.8 > paired_power(1.0, 2.0, n - 1)
    assert 30 <= n <= 36          # normal approximation: ((1.96 + 0.84) * 2 / 1)^2 = 31.4, plus the t penalty
    assert seeds_for_power(0.0, 1.0) is None
    p2 = paired_power(32.52, 4.93, 2)   # n = 2, a large effect: scipy's nct.cdf gave NaN in the far tail
    d = rng.normal(32.52, 4.93, size=(20000, 2))
    assert abs(p2 - (st.ttest_1samp(d, 0.0, axis=1).pvalue < 0.05).mean()) < 0.015
    assert seeds_for_power(1e-6, 1.0, limit=1000) is None


def test_power_statement_names_what_the_interval_rules_out_and_the_seeds_needed():
    from fedlib.evaluation.stats import paired_difference, power_statement, seeds_for_power

    diff = paired_difference([1.0, 3.0, -2.0, 4.0, 0.5], [0.0, 0.0, 0.0, 0.0, 0.0])
    text = power_statement(diff, effect=2.0, what="A - B", unit=" pp")
    assert f"below {diff.low:+.2f} pp" in text and f"above {diff.high:+.2f} pp" in text
    assert f"{seeds_for_power(2.0, diff.std)} paired seeds" in text and "here n = 5" in text


def test_plateau_rule_tells_a_converged_curve_from_a_rising_one():
    from fedlib.evaluation.stats import plateau

    rounds = np.arange(1, 201)
    flat = 0.8 - 0.5 * np.exp(-rounds / 10)            # at its plateau long before round 160
    rising = 0.3 + 0.5 * rounds / 200                  # still climbing: +0.05 over each 10 %
    assert plateau(flat, tol=0.005).converged
    p = plateau(rising, tol=0.005)
    assert not p.converged and abs(p.change - 0.05) < 1e-9
    assert "not converged" in p.describe(scale=100, unit=" pp")
    noisy = flat + 0.01 * np.where(rounds % 2, 1.0, -1.0)  # round-to-round noise, no trend: still converged
    assert plateau(noisy, tol=0.005).converged
    assert not plateau([0.1, 0.2, 0.3], tol=1.0).converged   # too short to show a plateau
    with pytest.raises(ValueError, match="tol must be positive"):
        plateau(flat, tol=0)


def test_compare_methods_pairs_by_seed_and_applies_the_plateau_rule():
    from fedlib.evaluation.stats import compare_methods, paired_difference

    rounds = np.arange(1, 101)
    flat = [list(0.7 - 0.4 * np.exp(-rounds / 5) + 0.001 * s) for s in range(5)]
    rising = [list(0.3 + 0.4 * rounds / 100 + 0.001 * s) for s in range(5)]
    finals = {"a": [0.70, 0.71, 0.69, 0.70, 0.72], "b": [0.80, 0.82, 0.79, 0.81, 0.80]}
    cmp = compare_methods(0.75, finals, {"a": flat, "b": rising}, tol=0.005)
    assert cmp.trails == ["b"] and cmp.unresolved == [] and not cmp.leads
    assert not cmp.converged and cmp.slowest == "b"
    d = cmp.rows.loc["a", "difference"]
    ref = paired_difference([0.75] * 5, finals["a"])
    assert (d.mean, d.low, d.high) == (ref.mean, ref.low, ref.high)
    assert "not all converged" in cmp.convergence() and "largest move: b" in cmp.convergence()
    same = compare_methods([0.7, 0.71, 0.69, 0.70, 0.72], {"a": [0.70, 0.72, 0.68, 0.71, 0.71]},
                           {"a": flat}, tol=0.005)
    assert same.unresolved == ["a"] and same.converged and not same.leads
