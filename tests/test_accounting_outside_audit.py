"""An outside audit's independent checks of the default accounting (``hybrid``): its filters'
budgets against an exact solve (mpmath, 50 digits) and Google's ``dp_accounting``, and
friendly_aggregate's Gaussian-test split (F3), whose single-release ``(epsilon, delta)`` is what
filter C charges, against ``dp_accounting``'s PLD composition. Each passed when written (the
audit found these right); they pin the figures against a re-implementation that shares no code
with :mod:`service.accounting`.

Figures at writing: over epsilon in {0.1, 0.5, 1, 2, 8} x delta in {1e-9, 1e-8, 1e-6, 1e-5,
1e-3}, ``mu_total`` is
below the exact root by 2e-32 to 1e-30 and ``rho_total`` below the CKS supremum by 2e-32 to
1e-30 (both rounded down, as ALGORITHMS.md asks); ``dp_accounting`` puts the Gaussian of
``mu_total`` at ``delta_A`` (ratio 1.0000) and F3's composition at 1.000000-1.000004 of the
request at a 2e-5 discretisation (pessimistic, so at or above the truth)."""

from __future__ import annotations

import math
from decimal import Decimal

import mpmath
import pytest
from dp_accounting.pld import common as pld_common
from dp_accounting.pld import privacy_loss_distribution as pld

from service import accounting
from service.mechanisms.friendly_ptr import gdp_split

GRID = [("0.1", "1e-9"), ("1", "1e-5"), ("8", "1e-3")]


def _delta_g(mu: mpmath.mpf, eps: mpmath.mpf) -> mpmath.mpf:
    return mpmath.ncdf(-eps / mu + mu / 2) - mpmath.exp(eps) * mpmath.ncdf(-eps / mu - mu / 2)


def _exact_mu(eps: str, delta: Decimal) -> mpmath.mpf:
    """The largest mu with delta_G(mu, eps) <= delta, by 300 bisection steps."""
    e, target = mpmath.mpf(eps), mpmath.mpf(str(delta))
    low, high = mpmath.mpf("1e-9"), mpmath.mpf(60)
    for _ in range(220):
        middle = (low + high) / 2
        low, high = (middle, high) if _delta_g(middle, e) <= target else (low, middle)
    return low


def _rho_at(a: mpmath.mpf, eps: mpmath.mpf, log_delta: mpmath.mpf) -> mpmath.mpf:
    """CKS solved for rho at order a: (eps + (log delta - log[(1-1/a)^(a-1)/a])/(a-1))/a."""
    factor = (a - 1) * mpmath.log(1 - 1 / a) - mpmath.log(a)
    return (eps + (log_delta - factor) / (a - 1)) / a


def _sup_rho(eps: str, delta: Decimal) -> mpmath.mpf:
    """sup over a > 1 of :func:`_rho_at`: a coarse grid in log(a - 1), then ternary search
    (the function is unimodal there)."""
    e, log_delta = mpmath.mpf(eps), mpmath.log(mpmath.mpf(str(delta)))

    def f(x: mpmath.mpf) -> mpmath.mpf:
        return _rho_at(1 + mpmath.exp(x), e, log_delta)

    best = max((mpmath.mpf(i) / 10 for i in range(-150, 150)), key=f)
    low, high = best - mpmath.mpf("0.1"), best + mpmath.mpf("0.1")
    for _ in range(200):
        a, b = low + (high - low) / 3, high - (high - low) / 3
        low, high = (a, high) if f(a) < f(b) else (low, b)
    return f((low + high) / 2)


@pytest.mark.parametrize(("epsilon", "delta"), GRID)
def test_hybrid_filters_budgets_are_the_exact_ones_rounded_down(epsilon, delta):
    with mpmath.workdps(50):
        budget = accounting.hybrid_budget(Decimal(epsilon), Decimal(delta))
        mu_gap = _exact_mu(epsilon, budget.delta_gaussian) - mpmath.mpf(str(budget.mu_total))
        rho_gap = _sup_rho(epsilon, budget.delta_conversion) - mpmath.mpf(str(budget.rho_total))
    # Below (never above) the exact figure, by less than two units of the 30th place.
    assert 0 <= mu_gap < 2e-30
    assert 0 <= rho_gap < 2e-30
    # dp_accounting: a Gaussian of sensitivity 1 and sigma 1/mu_total is within delta_A at eps.
    gaussian = pld.from_gaussian_mechanism(
        standard_deviation=1 / float(budget.mu_total), value_discretization_interval=1e-4
    )
    ratio = gaussian.get_delta_for_epsilon(float(epsilon)) / float(budget.delta_gaussian)
    assert 0.999 < ratio < 1.001


@pytest.mark.parametrize(("epsilon", "delta"), [(0.05, 1e-9), (1.0, 1e-5), (5.0, 1e-3)])
@pytest.mark.parametrize("radius_given", [False, True])
def test_friendly_gaussian_test_split_is_its_single_release_by_dp_accounting(
    epsilon, delta, radius_given
):
    """F3: AboveThreshold (eps0, pure) with the Gaussian test and mean (mu jointly), plus the
    PTR failure delta1, within the request; the PLD of eps0-DP (its worst case) composed with
    the Gaussian, pessimistic and so at or above the truth, stays within 1e-4 of it (its
    discretisation error)."""
    split = gdp_split(epsilon, delta, radius_given, 0.5)
    mu = math.hypot(split.ptr_mu, split.mean_mu)
    loss = pld.from_gaussian_mechanism(
        standard_deviation=1 / mu, value_discretization_interval=1e-4
    )
    if split.eps0 > 0:
        pure = pld_common.DifferentialPrivacyParameters(split.eps0, 0)
        loss = loss.compose(pld.from_privacy_parameters(pure, value_discretization_interval=1e-4))
    assert (loss.get_delta_for_epsilon(epsilon) + split.delta1) / delta < 1 + 1e-4
