"""Refunds under hybrid (follow-up 4 of issue 31 item 5): a refunded release counts as a
zero-cost step in every filter (GDP 0, rho 0, approximate delta 0, epsilon and delta 0, its
flags restored). The argument is service.ledger.refund's docstring; here its combinatorial
claim: after any sequence of requests (admitted by the ledger's own sums, refunds included)
and refunds, the admitted sequence with refunded steps zeroed satisfies some filter's
condition on every prefix, and the ledger's sums are exactly that zeroed sequence's."""

from __future__ import annotations

from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from service import accounting, ledger
from service.accounting import HybridState, ReleaseCost
from tests.test_accounting_hybrid import KINDS, _cost

ZERO = ReleaseCost(Decimal(0), Decimal(0), Decimal(0), Decimal(0), Decimal(0))


def totals(budget: accounting.HybridBudget) -> ledger.Totals:
    return ledger.Totals(
        "hybrid",
        budget.epsilon,
        budget.delta,
        budget.rho_total,
        budget.mu_total,
        budget.delta_conversion,
        budget.delta_gaussian,
        budget.delta_mechanisms,
        budget.delta_basic,
    )


def row(kind: str, cost: ReleaseCost) -> tuple[object, ...]:
    """The ledger row of a charge or refund of ``cost`` (as charges.hybrid_charge stores it)."""
    rho = cost.rho if cost.rho is not None else Decimal(0)
    return (kind, cost.epsilon, cost.delta, rho, cost.gdp, cost.zcdp_delta)


def conditions(state: HybridState) -> tuple[bool, bool, bool]:
    return state.a_holds(ZERO), state.b_holds(ZERO), state.c_holds(ZERO)


def fold(costs: list[ReleaseCost], budget: accounting.HybridBudget) -> list[HybridState]:
    """The states after each prefix of ``costs``."""
    states = [HybridState(budget)]
    for cost in costs:
        states.append(states[-1].after(cost))
    return states


REQUEST = st.tuples(
    st.just("request"),
    st.sampled_from(KINDS),
    st.decimals(min_value="0.001", max_value="0.8", places=4),
    st.decimals(min_value="0.0001", max_value="0.05", places=5),
)
REFUND = st.tuples(st.just("refund"), st.integers(0, 1000))


@settings(max_examples=80, deadline=None)
@given(st.lists(st.one_of(REQUEST, REQUEST, REFUND), max_size=40))
def test_the_zeroed_sequence_satisfies_some_filter_on_every_prefix(operations):
    budget = accounting.hybrid_budget(Decimal(1), Decimal("1e-5"))
    shown = totals(budget)
    rows: list[tuple[object, ...]] = []
    admitted: list[list[object]] = []  # [cost, refunded]
    refunds = 0
    for operation in operations:
        if operation[0] == "request":
            _, kind, epsilon, rho = operation
            cost = _cost(kind, epsilon, rho)
            state = ledger.state_of(shown, *ledger.spent_of(rows)).hybrid()
            if state.admits(cost):
                rows.append(row("charge", cost))
                admitted.append([cost, False])
        else:
            open_ = [entry for entry in admitted if not entry[1]]
            if not open_:
                continue
            entry = open_[operation[1] % len(open_)]
            entry[1] = True
            rows.append(row("refund", entry[0]))  # type: ignore[arg-type]
            refunds += 1
        zeroed = [ZERO if refunded else cost for cost, refunded in admitted]
        states = fold(zeroed, budget)  # type: ignore[arg-type]
        # some filter's condition holds on every prefix of the zeroed sequence
        holding = [all(conditions(state)[j] for state in states) for j in range(3)]
        assert any(holding), (zeroed, holding)
        # and the ledger's sums (refunds subtracted, flags' counts moved back) are exactly
        # the zeroed sequence's: what the ledger admits next is what that sequence allows
        ledgers = ledger.state_of(shown, *ledger.spent_of(rows)).hybrid()
        assert ledgers == states[-1]


def test_a_refund_revives_the_flag_its_release_broke():
    budget = accounting.hybrid_budget(Decimal(1), Decimal("1e-5"))
    shown = totals(budget)
    unprofiled = _cost("unprofiled", Decimal("0.05"), Decimal(0))
    rows = [row("charge", unprofiled)]
    state = ledger.state_of(shown, *ledger.spent_of(rows)).hybrid()
    assert not state.all_gdp and not state.all_profiled
    rows.append(row("refund", unprofiled))
    state = ledger.state_of(shown, *ledger.spent_of(rows)).hybrid()
    assert state.all_gdp and state.all_profiled and state == HybridState(budget)
