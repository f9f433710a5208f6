"""Issue 31, item 5: the "either of three filters" rule (``accounting.HybridState``): its
budgets are exact and rounded the safe way, each filter's condition is monotone and the ledger's
admissions are always some filter's on the whole sequence (the soundness argument's premises),
and its noise per Gaussian release is within 1% of basic's at N = 1 and within 5% of the PLD
accountant's (dp-accounting) at N = 10 and 100."""

from __future__ import annotations

import math
import random
from decimal import Decimal

import pytest
from dp_accounting.pld import privacy_loss_distribution as pld

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
    assert delta_a + sum(parts) <= delta
    assert budget.mu_total == accounting.mu_budget(epsilon, delta_a)
    assert accounting.gdp_delta(budget.mu_total, epsilon) <= accounting._mp(delta_a)
    assert budget.rho_gaussian <= accounting.rho_of_mu_exact(budget.mu_total)
    assert budget.rho_total == accounting.rho_budget(epsilon, budget.delta_conversion)
    assert accounting.cks_delta(budget.rho_total, epsilon) <= accounting._mp(
        budget.delta_conversion
    )


def test_shares_must_be_a_split_of_delta():
    with pytest.raises(ValueError):
        HybridShares(Decimal("0.9"), Decimal("0.1"), Decimal("0.1"), Decimal(0))
    with pytest.raises(ValueError):
        HybridShares(Decimal("1.1"), Decimal("-0.1"), Decimal(0), Decimal(0))


def _random_cost(rng: random.Random) -> ReleaseCost:
    kind = rng.choice(["gaussian", "pure", "approximate", "unprofiled"])
    epsilon = Decimal(repr(round(rng.uniform(0.01, 0.6), 6)))
    if kind == "gaussian":
        rho = Decimal(repr(round(rng.uniform(1e-4, 0.01), 8)))
        return ReleaseCost(epsilon, Decimal("1e-8"), rho, Decimal(0), True)
    if kind == "pure":
        return ReleaseCost(epsilon, Decimal(0), accounting.pure_rho(epsilon), Decimal(0), False)
    if kind == "approximate":
        return ReleaseCost(
            epsilon, Decimal("1e-9"), accounting.pure_rho(epsilon), Decimal("1e-9"), False
        )
    return ReleaseCost(epsilon, Decimal("1e-9"), None, None, False)


def _conditions(state: HybridState) -> tuple[bool, bool, bool]:
    """Each filter's condition on the admitted sequence (a zero-cost probe appended)."""
    zero = ReleaseCost(Decimal(0), Decimal(0), Decimal(0), Decimal(0), True)
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


def test_a_gaussian_sequence_is_admitted_exactly_as_filter_a_alone_would():
    budget = accounting.hybrid_budget(Decimal(1), Decimal("1e-6"))
    n = 10
    # a hair below mu_B/sqrt(n): each charge is rounded up, the budget down
    shaded = budget.mu_total / Decimal(n).sqrt() * (1 - Decimal("1e-20"))
    per_release = accounting.rho_of_mu(accounting.round_down(shaded))
    state = HybridState(budget)
    cost = ReleaseCost(Decimal("0.0001"), Decimal("1e-10"), per_release, Decimal(0), True)
    for _ in range(n):
        assert state.admits(cost)
        state = state.after(cost)
    # B and C are far short of this sequence: only A admitted it
    assert state.rho_spent > budget.rho_total
    # one release more breaks A's sum; B is over its rho; C still has room (basic sums)
    assert not state._a(cost) and not state._b(cost) and state._c(cost)


def test_one_non_gaussian_release_breaks_a_for_good():
    budget = accounting.hybrid_budget(Decimal(1), Decimal("1e-6"))
    state = HybridState(budget)
    pure = ReleaseCost(
        Decimal("0.01"), Decimal(0), accounting.pure_rho(Decimal("0.01")), Decimal(0), False
    )
    state = state.after(pure)
    tiny = ReleaseCost(Decimal(0), Decimal(0), Decimal("1e-9"), Decimal(0), True)
    assert not state._a(tiny) and state._b(tiny)


def _pld_sigma(n: int, epsilon: float, delta: float) -> float:
    """dp-accounting's PLD: the smallest sigma whose n-fold Gaussian composition is within
    ``(epsilon, delta)`` (bisection, 1e-6 relative)."""
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
    cost = ReleaseCost(epsilon / n, delta / n, accounting.rho_of_mu(mu), Decimal(0), True)
    for _ in range(n):
        assert state.admits(cost)
        state = state.after(cost)
