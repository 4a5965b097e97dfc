"""fedlib.core.privacy: the dp-accounting wrapper, checked against independent closed forms (scipy's normal
cdf: Balle & Wang's exact delta(epsilon) of the Gaussian mechanism; T Gaussian releases of noise
multiplier z compose exactly like one release of multiplier z / sqrt(T))."""
import math

import numpy as np
import pytest
from scipy.stats import norm

from fedlib.core import privacy as pv


def _exact_delta(z: float, eps: float) -> float:
    """Balle & Wang (2018) Thm 8: delta(eps) of N(0,1) vs N(1/z, 1) (mu = 1/z)."""
    mu = 1.0 / z
    return norm.cdf(mu / 2 - eps / mu) - math.exp(eps) * norm.cdf(-mu / 2 - eps / mu)


@pytest.mark.parametrize("eps", [0.3, 1.0, 4.0, 20.0])
def test_analytic_gaussian_sigma_meets_delta_exactly(eps):
    delta = 1e-5
    sigma = pv.analytic_gaussian_sigma(eps, delta, sensitivity=2.0)
    assert _exact_delta(sigma / 2.0, eps) == pytest.approx(delta, rel=1e-5)
    assert _exact_delta(sigma / 2.0, eps) <= delta
    assert _exact_delta(0.99 * sigma / 2.0, eps) > delta          # smallest such sigma
    assert pv.analytic_gaussian_epsilon(sigma, delta, 2.0) <= eps
    assert pv.analytic_gaussian_epsilon(sigma, delta, 2.0) == pytest.approx(eps, rel=1e-6)


def test_dwork_roth_is_looser_below_one_and_the_analytic_one_stays_valid_above():
    # Dwork & Roth's sigma (eps < 1) is valid but not tight: its exact delta is below the target
    dr = pv.dwork_roth_sigma(0.5, 1e-5)
    assert _exact_delta(dr, 0.5) < 1e-5 and pv.analytic_gaussian_sigma(0.5, 1e-5) < dr
    # at eps = 20 the formula is outside its proof; the analytic sigma still meets delta
    assert _exact_delta(pv.analytic_gaussian_sigma(20.0, 1e-5), 20.0) <= 1e-5


@pytest.mark.parametrize("steps", [1, 20])
def test_pld_composition_matches_the_exact_gaussian_and_rdp_is_an_upper_bound(steps):
    delta = 1e-5
    for z in (2.0, 10.0):
        exact = pv.analytic_gaussian_epsilon(z / math.sqrt(steps), delta)
        pld = pv.gaussian_epsilon(z, delta, steps, "pld")
        rdp = pv.gaussian_epsilon(z, delta, steps, "rdp")
        assert exact * (1 - 1e-9) <= pld <= exact * 1.001 + 1e-6
        assert rdp >= pld
    # a list of multipliers: [z, z] == steps=2
    assert pv.gaussian_epsilon([3.0, 3.0], delta) == pytest.approx(pv.gaussian_epsilon(3.0, delta, 2), rel=1e-9)
    assert pv.gaussian_epsilon(0.0, delta) == math.inf


@pytest.mark.parametrize("accountant", ["pld", "rdp"])
def test_calibration_spends_at_most_the_target_and_is_tight(accountant):
    for eps, steps in [(1.0, 20), (8.0, 50)]:
        z = pv.calibrate_noise_multiplier(eps, 1e-5, steps, accountant)
        assert pv.gaussian_epsilon(z, 1e-5, steps, accountant) <= eps
        assert pv.gaussian_epsilon(0.99 * z, 1e-5, steps, accountant) > eps
        # never less noise than the exact answer for Gaussian composition
        assert z >= math.sqrt(steps) * pv.analytic_gaussian_sigma(eps, 1e-5) * (1 - 1e-6)


@pytest.mark.parametrize("call, match", [
    (lambda: pv.gaussian_epsilon(1.0, 0.0), r"delta must be a finite number > 0.0 and < 1.0, got 0.0"),
    (lambda: pv.gaussian_epsilon(1.0, 1e-5, 0), "steps"),
    (lambda: pv.gaussian_epsilon(-1.0, 1e-5), "noise multipliers"),
    (lambda: pv.gaussian_epsilon(1.0, 1e-5, 1, "moments"), "accountant"),
    (lambda: pv.calibrate_noise_multiplier(0.0, 1e-5), "epsilon"),
    (lambda: pv.calibrate_noise_multiplier(1.0, 1.0), r"delta must be a finite number > 0.0 and < 1.0, got 1.0"),
    (lambda: pv.calibrate_noise_multiplier(1.0, 1e-5, 1, "gdp"), "accountant"),
    (lambda: pv.analytic_gaussian_sigma(1.0, 1e-5, -1.0), "sensitivity"),
    (lambda: pv.analytic_gaussian_epsilon(0.0, 1e-5), "sigma"),
    (lambda: pv.dwork_roth_sigma(np.inf, 1e-5), "epsilon"),
])
def test_bad_input_raises_value_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_checks_come_from_fedlib_core_validate_with_their_ranges():
    assert pv.check_epsilon(2) == 2.0 and isinstance(pv.check_epsilon(2), float)
    assert pv.check_delta(1e-5) == 1e-5
    assert pv.check_accountant("rdp") == "rdp"
    for bad in (0.0, -1.0, math.inf, True, "1"):
        with pytest.raises(ValueError, match="epsilon must be a finite number > 0"):
            pv.check_epsilon(bad)
    for bad in (0.0, 1.0, 2.0, math.nan):
        with pytest.raises(ValueError, match=r"delta must be a finite number > 0.0 and < 1.0"):
            pv.check_delta(bad)
    with pytest.raises(ValueError, match="unknown accountant 'gdp'; allowed: pld, rdp"):
        pv.check_accountant("gdp")
    with pytest.raises(ValueError, match="steps must be an integer >= 1"):
        pv.calibrate_noise_multiplier(1.0, 1e-5, 1.5)
