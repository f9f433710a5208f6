"""service.accounting against an independent accountant (dp-accounting) and its own claims."""

from __future__ import annotations

from decimal import Context, Decimal, localcontext

import numpy as np
import pytest
from dp_accounting.pld import accountant as pld_accountant
from dp_accounting.pld import common as pld_common
from dp_accounting.rdp import rdp_privacy_accountant as rdp
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from api_schemas.common import budget_storable
from service import accounting
from service.mechanisms.base import ApproximateStep, GaussianStep, PureStep
from service.mechanisms.noise import analytic_gaussian_sigma, gaussian_delta

#: dp-accounting's CKS conversion on a fine grid of orders (its own grid is coarse).
ORDERS = list(1.0 + np.logspace(-4, 5, 8_000))


def dp_accounting_delta(rho: float, epsilon: float) -> float:
    """``rho``-zCDP is ``(a, a rho)``-RDP at every order ``a``: dp-accounting's conversion."""
    delta, _ = rdp.compute_delta(ORDERS, [a * rho for a in ORDERS], epsilon)
    return float(delta)


EPSILONS = [Decimal("0.1"), Decimal("1"), Decimal("8")]
DELTAS = [Decimal("1e-10"), Decimal("1e-6"), Decimal("1e-3")]


@pytest.mark.parametrize("epsilon", EPSILONS)
@pytest.mark.parametrize("delta", DELTAS)
def test_rho_budget_is_conservative_and_tight_against_dp_accounting(
    epsilon: Decimal, delta: Decimal
) -> None:
    rho = accounting.rho_budget(epsilon, delta)
    assert budget_storable(rho) is None
    # Never above the target by dp-accounting's own computation (its grid can only be looser,
    # so allow its grid's excess, 1e-4 relative), and not looser than needed: 1% more rho
    # already breaks the target.
    assert dp_accounting_delta(float(rho), float(epsilon)) <= float(delta) * (1 + 1e-4)
    assert dp_accounting_delta(float(rho) * 1.01, float(epsilon)) > float(delta)
    assert float(accounting.cks_delta(rho, epsilon)) <= float(delta) * (1 + 1e-12)


@settings(max_examples=20, deadline=None, derandomize=True)
@given(rho=st.floats(1e-4, 5.0), epsilon=st.floats(0.01, 30.0))
def test_cks_delta_never_below_dp_accounting(rho: float, epsilon: float) -> None:
    ours = float(accounting.cks_delta(Decimal(repr(rho)), Decimal(repr(epsilon))))
    theirs = dp_accounting_delta(rho, epsilon)
    # Near delta = 1 dp-accounting also uses the KL bound sqrt(1 - e^-rho), which CKS does
    # not; the budgets live far below.
    assume(theirs < 0.1)
    # Ours minimises over all orders; theirs over a fine grid: ours is at most theirs, and
    # both bound the same infimum, so they agree closely where delta is not negligible.
    assert ours <= theirs * (1 + 1e-9) + 1e-300
    if theirs > 1e-200:
        assert ours >= theirs * (1 - 1e-3)


@pytest.mark.parametrize("epsilon", EPSILONS)
@pytest.mark.parametrize("delta", DELTAS)
def test_mu_budget_matches_the_analytic_gaussian(epsilon: Decimal, delta: Decimal) -> None:
    mu = accounting.mu_budget(epsilon, delta)
    # dp-accounting's smallest Gaussian noise for (epsilon, delta), sensitivity 1, one query.
    sigma = pld_accountant.get_smallest_gaussian_noise(
        pld_common.DifferentialPrivacyParameters(float(epsilon), float(delta)), 1
    )
    assert 1 / float(mu) >= sigma * (1 - 1e-6)
    assert 1 / float(mu) <= sigma * (1 + 1e-3)
    # Exactly the service's analytic-Gaussian sigma: one release with the whole budget.
    ours = analytic_gaussian_sigma(1.0, float(epsilon), float(delta))
    assert 1 / float(mu) == pytest.approx(ours, rel=1e-9)
    # Against the stated decimal itself, at the working precision (not its double).
    assert accounting.gdp_delta(mu, epsilon) <= accounting._mp(delta)
    assert gaussian_delta(1.0, float(mu) * 1.0001, float(epsilon)) > float(delta)


def test_spent_epsilon_inverts_the_budgets() -> None:
    mu = accounting.mu_budget(Decimal(1), Decimal("1e-6"))
    assert accounting.gdp_epsilon(mu, Decimal("1e-6")) <= Decimal(1)
    assert accounting.gdp_epsilon(mu, Decimal("1e-6")) > Decimal("0.999999")
    rho = accounting.rho_budget(Decimal(1), Decimal("5e-7"))
    spent = accounting.zcdp_epsilon(rho, Decimal("5e-7"))
    assert spent is not None and Decimal("0.999999") < spent <= Decimal(1)
    assert accounting.zcdp_epsilon(Decimal(0), Decimal("1e-6")) == 0
    assert accounting.zcdp_epsilon(rho, Decimal(0)) is None


def test_rounding_directions() -> None:
    third = accounting.Context(prec=60).divide(Decimal(1), Decimal(3))
    assert accounting.round_up(third) > third > accounting.round_down(third)
    assert accounting.round_up(third) - accounting.round_down(third) == Decimal("1e-30")
    assert accounting.rho_of_mu(Decimal("0.5")) == Decimal("0.125")
    assert accounting.budget_rho_of_mu(Decimal("0.5")) == Decimal("0.125")
    mu = accounting.mu_of_rho(Decimal("0.125"))
    assert Decimal(0) <= mu - Decimal("0.5") <= Decimal("1e-30")


def test_step_costs() -> None:
    gauss = accounting.step_costs([GaussianStep(2.0, 4.0), GaussianStep(1.0, 1.0)])
    assert gauss.rho == Decimal("0.625") and gauss.delta == 0 and gauss.gaussian
    assert gauss.mu == accounting.mu_of_rho(Decimal("0.625"))
    mixed = accounting.step_costs(
        [PureStep(0.5), ApproximateStep(0.25, 2.0**-20), GaussianStep(1, 2)]
    )
    assert mixed.rho == Decimal("0.28125")
    assert mixed.delta == accounting.round_up(Decimal(2.0**-20)) and not mixed.gaussian
    # A cost that is not a finite 30-place decimal is rounded up.
    third = accounting.step_costs([GaussianStep(1.0, 3.0)]).rho
    exact = accounting.Context(prec=60).divide(Decimal(1), Decimal(18))
    assert third is not None and exact < third < exact + Decimal("1e-30")
    assert mixed.mu is None
    assert accounting.step_costs(None).rho is None


@pytest.mark.parametrize(("rho", "epsilon"), [(0.01, 1.0), (0.2, 3.0), (1.5, 8.0)])
def test_the_exact_conversion_agrees_with_friendlys_grid_version(
    rho: float, epsilon: float
) -> None:
    # composition.cks_delta (friendly_aggregate's F3 comparison) minimises on a grid of orders:
    # never below the infimum, so never below this one, and close to it.
    from service.mechanisms.composition import cks_delta as grid_cks_delta

    ours = float(accounting.cks_delta(Decimal(repr(rho)), Decimal(repr(epsilon))))
    grid = grid_cks_delta(rho, epsilon)
    assert ours <= grid * (1 + 1e-9)
    assert ours >= grid * (1 - 1e-2)


_PLACE = Decimal(1).scaleb(-30)


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=0, max_value=10**33), st.integers(min_value=-3, max_value=3))
def test_sqrt_down_and_up_are_the_tightest_30_place_roots(units: int, nudge: int):
    # A 30-place root r (and values a few units of r^2's last place off an exact square):
    # sqrt_down is the largest 30-place r with r^2 <= value, sqrt_up the smallest with
    # r^2 >= value. The margin moved an exact root one place off (an unspent hybrid budget's
    # mu_remaining read 1e-30 below its mu_total).
    with localcontext(Context(prec=120)):  # exact: at most 66 digits
        root = Decimal(units) * _PLACE
        value = max(Decimal(0), root * root + nudge * Decimal(1).scaleb(-60))
        down, up = accounting.sqrt_down(value), accounting.sqrt_up(value)
        assert down * down <= value < (down + _PLACE) ** 2
        assert up * up >= value and (up == 0 or (up - _PLACE) ** 2 < value)
        if nudge == 0:
            assert down == up == root
