"""Differential-privacy accounting for the Gaussian mechanism: a thin wrapper over Google's
``dp-accounting`` (0.6.0), so that no composition formula is written by hand.

Convention. A release g(D) has l2-sensitivity ``Delta = sup ||g(D) - g(D')||_2`` over the neighbouring
datasets D, D' of the caller's adjacency (replace-one in Fed-tSNE+). Adding N(0, sigma^2 I) gives the
privacy profile of N(0, 1) against N(Delta/sigma, 1); the accountants see a ``GaussianDpEvent`` with
noise multiplier z = sigma / Delta under dp-accounting's ADD_OR_REMOVE_ONE relation, which is exactly
that pair of Gaussians (dp-accounting's REPLACE_ONE would double a per-record norm bound; our Delta
already is the replace-one distance, so it must not be doubled again).

* :func:`gaussian_epsilon`: epsilon at ``delta`` of ``steps`` compositions (or of a list of noise
  multipliers, one per release), with the PLD accountant (tight up to discretization, pessimistic)
  or the RDP accountant (an upper bound, looser).
* :func:`calibrate_noise_multiplier`: the smallest z whose ``steps``-fold composition is
  (epsilon, delta)-DP by that accountant (``dp_accounting.calibrate_dp_mechanism``).
* :func:`analytic_gaussian_sigma` / :func:`analytic_gaussian_epsilon`: one release, the analytic
  Gaussian mechanism (Balle & Wang 2018, ``dp_accounting.get_sigma_gaussian``), exact and valid for
  every epsilon > 0, unlike Dwork & Roth's sigma = sqrt(2 ln(1.25/delta)) Delta / epsilon
  (:func:`dwork_roth_sigma`, proven for epsilon < 1 only; kept for comparison).
"""
from __future__ import annotations

import functools
import math
from typing import Sequence

import numpy as np

from fedlib.core.validate import check_choice, check_int, check_positive, check_real

__all__ = ["ACCOUNTANTS", "gaussian_epsilon", "calibrate_noise_multiplier", "analytic_gaussian_sigma",
           "analytic_gaussian_epsilon", "dwork_roth_sigma",
           "check_epsilon", "check_delta", "check_accountant"]

ACCOUNTANTS = ("pld", "rdp")
_PLD_DISCRETIZATION = 1e-4


def check_epsilon(epsilon) -> float:
    """``epsilon`` as a float, finite and > 0, else ValueError naming it."""
    return check_positive("epsilon", epsilon)


def check_delta(delta) -> float:
    """``delta`` as a float in the open interval (0, 1), else ValueError naming it."""
    return check_real("delta", delta, low=0.0, high=1.0)


def check_accountant(accountant) -> str:
    """``accountant`` one of :data:`ACCOUNTANTS`, else ValueError naming the allowed ones."""
    check_choice("accountant", accountant, ACCOUNTANTS)
    return accountant


def _make_accountant(accountant: str, epsilon_scale: float = 1.0):
    from dp_accounting import NeighboringRelation
    from dp_accounting.pld import PLDAccountant
    from dp_accounting.rdp import RdpAccountant

    check_accountant(accountant)
    rel = NeighboringRelation.ADD_OR_REMOVE_ONE  # see the module docstring: z = sigma / Delta
    if accountant == "pld":
        # the grid of privacy-loss values scales with the epsilon expected (speed; the PLD stays pessimistic)
        interval = _PLD_DISCRETIZATION * max(1.0, float(epsilon_scale))
        return PLDAccountant(neighboring_relation=rel, value_discretization_interval=interval)
    return RdpAccountant(neighboring_relation=rel)


def _event(noise_multipliers: Sequence[float]):
    from dp_accounting import ComposedDpEvent, GaussianDpEvent, SelfComposedDpEvent

    z = np.asarray(noise_multipliers, dtype=np.float64)
    if np.all(z == z[0]):
        return SelfComposedDpEvent(GaussianDpEvent(float(z[0])), len(z))
    return ComposedDpEvent([GaussianDpEvent(float(v)) for v in z])


def gaussian_epsilon(noise_multiplier, delta: float, steps: int = 1, accountant: str = "pld") -> float:
    """epsilon at ``delta`` of Gaussian releases with noise multiplier(s) z = sigma / Delta.

    ``noise_multiplier``: a number (composed ``steps`` times) or a sequence, one z per release
    (``steps`` is then ignored). ``accountant``: "pld" or "rdp". A z of 0 (no noise) gives inf."""
    delta = check_delta(delta)
    check_accountant(accountant)
    if np.ndim(noise_multiplier) == 0:
        z = np.full(check_int("steps", steps, 1), float(noise_multiplier))
    else:
        z = np.asarray(noise_multiplier, dtype=np.float64).ravel()
        if z.size == 0:
            raise ValueError("noise_multiplier must not be an empty sequence")
    if not np.all(np.isfinite(z)) or np.any(z < 0):
        raise ValueError(f"noise multipliers must be finite and >= 0, got {noise_multiplier!r}")
    if np.any(z == 0):
        return math.inf
    return float(_make_accountant(accountant, _epsilon_scale(z, delta)).compose(_event(z)).get_epsilon(delta))


def _epsilon_scale(z: np.ndarray, delta: float) -> float:
    """Rough size of epsilon (Gaussian releases compose like one of multiplier 1/sqrt(sum z^-2)); only
    sets the PLD grid, never the answer."""
    from dp_accounting import get_epsilon_gaussian

    return float(get_epsilon_gaussian(1.0 / math.sqrt(float(np.sum(1.0 / z ** 2))), delta))


def calibrate_noise_multiplier(epsilon: float, delta: float, steps: int = 1, accountant: str = "pld") -> float:
    """Smallest noise multiplier z = sigma / Delta such that ``steps`` Gaussian releases are
    (epsilon, delta)-DP according to ``accountant`` (Brent search of dp-accounting's
    ``calibrate_dp_mechanism``; the result is checked and nudged up so that
    ``gaussian_epsilon(z, delta, steps, accountant) <= epsilon`` holds). Cached per arguments."""
    epsilon, delta, steps = check_epsilon(epsilon), check_delta(delta), check_int("steps", steps, 1)
    check_accountant(accountant)
    return _calibrate(epsilon, delta, steps, accountant)


@functools.lru_cache(maxsize=256)
def _calibrate(epsilon: float, delta: float, steps: int, accountant: str) -> float:
    from dp_accounting import (
        ExplicitBracketInterval,
        GaussianDpEvent,
        SelfComposedDpEvent,
        calibrate_dp_mechanism,
        get_sigma_gaussian,
    )

    # bracket: the exact answer for Gaussians is near sqrt(steps) * sigma_1(epsilon, delta); PLD and RDP
    # are upper bounds on epsilon, so they need at least that much noise
    guess = math.sqrt(steps) * get_sigma_gaussian(epsilon, delta)
    lo, hi = 0.5 * guess, 2.0 * guess
    while gaussian_epsilon(hi, delta, steps, accountant) > epsilon:
        lo, hi = hi, 2.0 * hi
    z = calibrate_dp_mechanism(lambda: _make_accountant(accountant, epsilon),
                               lambda v: SelfComposedDpEvent(GaussianDpEvent(v), steps), epsilon, delta,
                               ExplicitBracketInterval(lo, hi), tol=1e-4 * guess)
    z = float(z)
    for _ in range(60):
        if gaussian_epsilon(z, delta, steps, accountant) <= epsilon:
            return z
        z *= 1.0 + 1e-4
    raise RuntimeError("calibration did not reach the target epsilon")  # pragma: no cover


def analytic_gaussian_sigma(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """Noise sd of the analytic Gaussian mechanism (Balle & Wang 2018, Thm 8) for ONE release of
    l2-sensitivity ``sensitivity``: the smallest sigma with delta(epsilon) <= ``delta``, valid for every
    epsilon > 0 (``dp_accounting.get_sigma_gaussian``; nudged up by 1e-9 relative so that the exact
    epsilon of the returned sigma is <= epsilon)."""
    from dp_accounting import get_sigma_gaussian

    epsilon, delta = check_epsilon(epsilon), check_delta(delta)
    sensitivity = check_positive("sensitivity", sensitivity)
    return float(get_sigma_gaussian(epsilon, delta)) * (1.0 + 1e-9) * sensitivity


def analytic_gaussian_epsilon(sigma: float, delta: float, sensitivity: float = 1.0) -> float:
    """Exact epsilon at ``delta`` of one Gaussian release with noise sd ``sigma`` and l2-sensitivity
    ``sensitivity`` (``dp_accounting.get_epsilon_gaussian``)."""
    from dp_accounting import get_epsilon_gaussian

    sigma = check_positive("sigma", sigma)
    sensitivity = check_positive("sensitivity", sensitivity)
    return float(get_epsilon_gaussian(sigma / sensitivity, check_delta(delta)))


def dwork_roth_sigma(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """Dwork & Roth (2014) Thm 3.22: sigma = sqrt(2 ln(1.25/delta)) Delta / epsilon, the calibration the
    paper's Theorem 4 uses. Proven for epsilon < 1 only: for comparison, never for calibration."""
    epsilon, delta = check_epsilon(epsilon), check_delta(delta)
    return math.sqrt(2.0 * math.log(1.25 / delta)) * check_positive("sensitivity", sensitivity) / epsilon
