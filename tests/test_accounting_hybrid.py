"""Issue 31, item 5: the "either of three filters" rule (``accounting.HybridState``, the
``hybrid`` accounting): its budgets are exact and rounded the safe way, each filter's condition
is monotone and the ledger's admissions are always some filter's on the whole sequence (the
soundness argument's premises), a pure step's GDP figure (``pure_mu``) is a valid one, and its
noise per Gaussian release is within 1% of basic's at N = 1 and within 5% of the PLD
accountant's (dp-accounting) at N = 10 and 100."""

from __future__ import annotations

import functools
import math
import random
from decimal import Context, Decimal

import mpmath
import pytest
from dp_accounting.pld import privacy_loss_distribution as pld
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import norm

from service import accounting
from service.accounting import HybridShares, HybridState, ReleaseCost
from service.mechanisms.noise import analytic_gaussian_sigma

BUDGETS = [
    (Decimal(1), Decimal("1e-6")),
    (Decimal(8), Decimal("1e-6")),
    (Decimal("0.5"), Decimal("1e-3")),
]


@pytest.mark.parametrize(("epsilon", "delta"), BUDGETS)
def test_hybrid_budget_is_each_filters_own_rounded_down(epsilon, delta):
    budget = accounting.hybrid_budget(epsilon, delta)
    shares = accounting.DEFAULT_HYBRID_SHARES
    parts = (budget.delta_conversion, budget.delta_mechanisms, budget.delta_basic)
    delta_a = accounting.round_down(delta * shares.gaussian)
    assert budget.delta_gaussian == delta_a
    assert delta_a + sum(parts) <= delta
    assert budget.mu_total == accounting.mu_budget(epsilon, delta_a)
    assert accounting.gdp_delta(budget.mu_total, epsilon) <= accounting._mp(delta_a)
    assert budget.gdp_total == Context(prec=100).multiply(budget.mu_total, budget.mu_total)
    assert budget.rho_total == accounting.rho_budget(epsilon, budget.delta_conversion)
    assert accounting.cks_delta(budget.rho_total, epsilon) <= accounting._mp(
        budget.delta_conversion
    )


def test_shares_must_be_a_split_of_delta():
    with pytest.raises(ValueError):
        HybridShares(Decimal("0.9"), Decimal("0.1"), Decimal("0.1"), Decimal(0))
    with pytest.raises(ValueError):
        HybridShares(Decimal("1.1"), Decimal("-0.1"), Decimal(0), Decimal(0))


def _gaussian(epsilon: Decimal, delta: Decimal, rho: Decimal) -> ReleaseCost:
    """A purely Gaussian release: A' charges ``mu^2 = 2 rho``."""
    return ReleaseCost(epsilon, delta, rho, Decimal(0), 2 * rho)


def _pure(epsilon: Decimal) -> ReleaseCost:
    mu = accounting.pure_mu(epsilon)
    return ReleaseCost(epsilon, Decimal(0), accounting.pure_rho(epsilon), Decimal(0), mu * mu)


def _cost(kind: str, epsilon: Decimal, rho: Decimal) -> ReleaseCost:
    if kind == "gaussian":
        return _gaussian(epsilon, Decimal("1e-8"), rho)
    if kind == "pure":
        return _pure(epsilon)
    if kind == "approximate":
        return ReleaseCost(
            epsilon, Decimal("1e-9"), accounting.pure_rho(epsilon), Decimal("1e-9"), None
        )
    return ReleaseCost(epsilon, Decimal("1e-9"), None, None, None)


KINDS = ["gaussian", "pure", "approximate", "unprofiled"]


def _random_cost(rng: random.Random) -> ReleaseCost:
    kind = rng.choice(KINDS)
    epsilon = Decimal(repr(round(rng.uniform(0.01, 0.6), 6)))
    return _cost(kind, epsilon, Decimal(repr(round(rng.uniform(1e-4, 0.01), 8))))


def _conditions(state: HybridState) -> tuple[bool, bool, bool]:
    """Each filter's condition on the admitted sequence (a zero-cost probe appended)."""
    zero = ReleaseCost(Decimal(0), Decimal(0), Decimal(0), Decimal(0), Decimal(0))
    return state._a(zero), state._b(zero), state._c(zero)


@pytest.mark.parametrize("seed", range(20))
def test_every_admission_is_some_filters_and_conditions_are_monotone(seed):
    rng = random.Random(seed)
    budget = accounting.hybrid_budget(Decimal(1), Decimal("1e-6"))
    state = HybridState(budget)
    held = _conditions(state)
    admitted = 0
    for _ in range(60):
        cost = _random_cost(rng)
        if state.admits(cost):
            state = state.after(cost)
            admitted += 1
            # the admitted sequence satisfies at least one filter's condition...
            assert any(_conditions(state))
        now = _conditions(state)
        # ...and a condition once false stays false (monotone), admitted or refused
        assert all(was or not still for was, still in zip(held, now, strict=True))
        held = now
    assert admitted > 0


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(KINDS),
            st.decimals(min_value="0.001", max_value="0.8", places=4),
            st.decimals(min_value="0.0001", max_value="0.05", places=5),
        ),
        max_size=40,
    )
)
def test_admissions_are_sound_and_conditions_monotone_property(requests):
    """Any request sequence: each admission leaves some filter holding on the whole admitted
    sequence, each filter's condition never comes back once false, and what A' charged is the
    sum of the admitted releases' GDP figures (every filter sums every admitted release)."""
    budget = accounting.hybrid_budget(Decimal(1), Decimal("1e-5"))
    state = HybridState(budget)
    held = _conditions(state)
    charged_gdp = Decimal(0)
    for kind, epsilon, rho in requests:
        cost = _cost(kind, epsilon, rho)
        if state.admits(cost):
            assert state.filters_admitting(cost)
            state = state.after(cost)
            charged_gdp = Context(prec=100).add(charged_gdp, cost.gdp or 0)
            assert any(_conditions(state))
        now = _conditions(state)
        assert all(was or not still for was, still in zip(held, now, strict=True))
        held = now
    assert state.gdp_spent == charged_gdp
    if state.all_gdp:
        assert state.gdp_spent <= budget.gdp_total or not held[0]


@pytest.mark.parametrize("epsilon", ["0.01", "0.1", "0.5", "1", "2", "5", "10"])
def test_pure_mu_is_a_valid_gdp_figure_for_an_eps_dp_step(epsilon):
    """The tradeoff curve of eps-DP, ``f(a) = max(0, 1 - e^eps a, e^-eps (1 - a))``, lies above
    ``G_mu(a) = Phi(Phi^-1(1 - a) - mu)`` at every type-I error ``a`` (so eps-DP is mu-GDP, Dong,
    Roth & Su 2022), and touches it at the symmetric point: ``mu`` is the smallest that works."""
    mu = float(accounting.pure_mu(Decimal(epsilon)))
    eps = float(epsilon)
    grid = [i / 4000 for i in range(1, 4000)]
    for a in grid:
        curve = max(0.0, 1 - math.exp(eps) * a, math.exp(-eps) * (1 - a))
        gaussian = float(norm.cdf(norm.ppf(1 - a) - mu))
        assert gaussian <= curve + 1e-12, (a, gaussian, curve)
    # tight: a slightly smaller mu puts G_mu above eps-DP's curve at the symmetric point
    star = 1 / (1 + math.exp(eps))
    assert float(norm.cdf(norm.ppf(1 - star) - mu * 0.999)) > star
    # rounded up at 30 places from -2 Phi^-1(1/(1+e^eps)) computed at 400 bits
    assert mu == pytest.approx(-2 * norm.ppf(star), rel=1e-12)
    with mpmath.workprec(400):
        exact = -2 * mpmath.sqrt(2) * mpmath.erfinv(2 / (1 + mpmath.exp(mpmath.mpf(epsilon))) - 1)
        shown = mpmath.mpf(str(accounting.pure_mu(Decimal(epsilon))))
        assert exact <= shown <= exact + mpmath.mpf("1e-29")


@pytest.mark.parametrize("epsilon", ["30", "80", "100", "139", "200", "709.5", "1000"])
def test_pure_mu_is_rounded_up_from_the_exact_value_up_to_the_largest_epsilon(epsilon):
    """A request's epsilon goes up to 1000. ``2a - 1`` with ``a = 1/(1 + e^eps)`` keeps only
    ``200 - 1.44 eps`` of the working precision's bits of ``a``: pure_mu was 5.7e-20 below the
    exact value at eps = 100 (a cost rounded down), 0.039 off at 139, and from eps ~ 139 the
    erfinv was -inf and every dry run or request of a pure step (auto, histogram_aggregate,
    friendly_aggregate, smooth_sensitivity's Cauchy variant on basic, zcdp or gaussian) a 500.
    The reference keeps every bit of ``a`` (precision raised by ``eps log2(e)``)."""
    cost = accounting.pure_mu(Decimal(epsilon))
    with mpmath.workprec(400 + math.ceil(float(epsilon) / math.log(2))):
        shown = mpmath.mpf(str(cost))
        a = 1 / (1 + mpmath.exp(mpmath.mpf(epsilon)))
        exact = -2 * mpmath.sqrt(2) * mpmath.erfinv(2 * a - 1)
        assert exact <= shown <= exact + mpmath.mpf("1e-29")


def test_a_prime_charges_a_pure_release_its_pure_mu_and_an_approximate_one_breaks_it():
    budget = accounting.hybrid_budget(Decimal(1), Decimal("1e-6"))
    state = HybridState(budget)
    pure = _pure(Decimal("0.05"))
    assert state.filters_admitting(pure)[0] == "gdp"
    state = state.after(pure)
    mu = accounting.pure_mu(Decimal("0.05"))
    assert state.gdp_spent == mu * mu and state.all_gdp
    approximate = _cost("approximate", Decimal("0.01"), Decimal(0))
    state = state.after(approximate)
    tiny = _gaussian(Decimal(0), Decimal(0), Decimal("1e-9"))
    assert not state._a(tiny) and state._b(tiny)


def test_a_gaussian_sequence_is_admitted_exactly_as_filter_a_alone_would():
    budget = accounting.hybrid_budget(Decimal(1), Decimal("1e-6"))
    n = 10
    # a hair below mu_B/sqrt(n): each charge is rounded up, the budget down
    shaded = budget.mu_total / Decimal(n).sqrt() * (1 - Decimal("1e-20"))
    per_release = accounting.rho_of_mu(accounting.round_down(shaded))
    state = HybridState(budget)
    cost = _gaussian(Decimal("0.0001"), Decimal("1e-10"), per_release)
    for _ in range(n):
        assert state.admits(cost)
        state = state.after(cost)
    # B and C are far short of this sequence: only A admitted it
    assert state.rho_spent > budget.rho_total
    # one release more breaks A's sum; B is over its rho; C still has room (basic sums)
    assert not state._a(cost) and not state._b(cost) and state._c(cost)


def test_one_unprofiled_release_breaks_a_and_b_for_good():
    budget = accounting.hybrid_budget(Decimal(1), Decimal("1e-6"))
    state = HybridState(budget).after(_cost("unprofiled", Decimal("0.01"), Decimal(0)))
    tiny = _gaussian(Decimal(0), Decimal(0), Decimal("1e-9"))
    assert not state._a(tiny) and not state._b(tiny) and state._c(tiny)


@functools.cache
def _pld_sigma(n: int, epsilon: float, delta: float) -> float:
    """dp-accounting's PLD: the smallest sigma whose n-fold Gaussian composition is within
    ``(epsilon, delta)`` (bisection, 1e-6 relative). Cached: a deterministic function of its
    arguments, asked twice for n = 10 below (and by tests/test_hybrid_calibration.py)."""
    low, high = 0.05, 500.0
    while high / low > 1 + 1e-6:
        mid = math.sqrt(low * high)
        one = pld.from_gaussian_mechanism(mid, sensitivity=1.0, value_discretization_interval=1e-4)
        composed = one.self_compose(n) if n > 1 else one
        if composed.get_delta_for_epsilon(epsilon) <= delta:
            high = mid
        else:
            low = mid
    return high


def _hybrid_sigma(budget: accounting.HybridBudget, n: int) -> float:
    """The smallest sigma at which ``n`` equal Gaussian releases are all admitted: each filter
    asked independently (A: mu per release, B: rho per release, C: basic)."""
    candidates = [
        math.sqrt(n) / float(budget.mu_total),
        math.sqrt(n / (2 * float(budget.rho_total))),
        analytic_gaussian_sigma(1.0, float(budget.epsilon) / n, float(budget.delta_basic) / n),
    ]
    return min(candidates)


@pytest.mark.parametrize(("epsilon", "delta"), BUDGETS)
def test_gaussian_noise_within_one_percent_of_basic_and_five_of_pld(epsilon, delta):
    budget = accounting.hybrid_budget(epsilon, delta)
    eps, dlt = float(epsilon), float(delta)
    assert _hybrid_sigma(budget, 1) <= 1.01 * analytic_gaussian_sigma(1.0, eps, dlt)
    for n in (10, 100):
        assert _hybrid_sigma(budget, n) <= 1.05 * _pld_sigma(n, eps, dlt)
    # and the sigma claimed for A is admitted by the rule itself, exactly (10 releases)
    n = 10
    mu = accounting.round_down(budget.mu_total / Decimal(n).sqrt() * (1 - Decimal("1e-20")))
    sigma = 1.0 / float(mu)
    assert sigma <= 1.05 * _pld_sigma(n, eps, dlt)
    state = HybridState(budget)
    cost = ReleaseCost(epsilon / n, delta / n, accounting.rho_of_mu(mu), Decimal(0), mu * mu)
    for _ in range(n):
        assert state.admits(cost)
        state = state.after(cost)


def test_a_refusal_says_a_filter_is_closed_when_others_overspent_its_share():
    # Releases admitted by A' may overspend C's small delta share (and B's rho): C then refuses
    # even a release that costs it nothing there. "0 left, it needs 0" would say it admits;
    # the message must say the filter is closed, with what was spent of which share.
    budget = accounting.hybrid_budget(Decimal(1), Decimal("1e-5"))
    state = HybridState(budget)
    gaussian = _gaussian(Decimal("0.05"), Decimal("1e-6"), Decimal("0.0001"))
    for _ in range(3):
        assert state.admits(gaussian)
        state = state.after(gaussian)
    assert state.delta_spent > budget.delta_basic  # C's delta share is overspent
    pure = _pure(Decimal("5"))  # delta 0: costs C's delta nothing; too big for A' and B
    reasons = state.refusals(pure)
    assert not state.admits(pure)
    assert not any("left, it needs 0" in reason for reason in reasons), reasons
    closed = [reason for reason in reasons if reason.startswith("filter C (basic) is closed")]
    assert closed and "delta share" in closed[0], reasons
    # A shortfall that is one still reads as one.
    assert any(reason.startswith("filter A (Gaussian-DP) has mu^2") for reason in reasons)
