"""The re-priced figure a refusal offers (service.repricing) is itself admitted, and the
largest to its 3 digits where the charge grows with epsilon."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

import pytest

from service import repricing
from service.ledger import Charge


@dataclass
class Threshold:
    """A budget that affords a charge iff its epsilon lies in ``[low, high]``."""

    high: Decimal
    low: Decimal = Decimal(0)

    def affords(self, charge: Charge) -> bool:
        return self.low <= charge.epsilon <= self.high


def face_value(epsilon: Decimal) -> Charge:
    return Charge(epsilon, Decimal(0))


@pytest.mark.parametrize(
    ("limit", "expected"),
    [("0.43219", "0.432"), ("1", "1"), ("0.0001234", "0.000123"), ("2.5", "2.5")],
)
def test_the_largest_admitted_epsilon_to_three_digits(limit, expected):
    budget = Threshold(Decimal(limit))
    found = repricing.admissible_epsilon(Decimal(3), face_value, [budget])  # type: ignore[list-item]
    assert found == Decimal(expected)
    assert budget.affords(face_value(found))


def test_every_budget_must_afford_it_and_none_is_offered_when_none_does():
    grant, dataset = Threshold(Decimal("0.3")), Threshold(Decimal("0.25"))
    both = repricing.admissible_epsilon(Decimal(1), face_value, [grant, dataset])  # type: ignore[list-item]
    assert both == Decimal("0.25")
    never = Threshold(Decimal(-1))
    assert repricing.admissible_epsilon(Decimal(1), face_value, [never]) is None  # type: ignore[list-item]


def test_a_request_its_mechanism_refuses_below_some_epsilon_gets_none_there():
    def refused_below(epsilon: Decimal) -> Charge | None:
        return None if epsilon < Decimal("0.5") else face_value(epsilon)

    budget = Threshold(Decimal("0.4"))
    assert repricing.admissible_epsilon(Decimal(1), refused_below, [budget]) is None  # type: ignore[list-item]


def test_a_non_monotone_charge_still_gets_an_admitted_figure():
    # admitted only on a band (auto may switch mechanism with epsilon)
    budget = Threshold(Decimal("0.26"), low=Decimal("0.2"))
    found = repricing.admissible_epsilon(Decimal(1), face_value, [budget])  # type: ignore[list-item]
    assert found is not None and budget.affords(face_value(found))


@dataclass
class DeltaShare:
    """A budget with a delta share: it affords a charge iff its delta fits and its epsilon is
    at most ``high``."""

    delta: Decimal
    high: Decimal

    def affords(self, charge: Charge) -> bool:
        return charge.delta <= self.delta and charge.epsilon <= self.high


def test_the_delta_grid_is_zero_for_a_pure_mechanism_then_decades_below():
    grid = repricing.delta_grid(Decimal("1e-7"), pure=True)
    assert grid[0] == 0 and grid[1:3] == [Decimal("1e-8"), Decimal("1e-9")]
    assert len(grid) == 1 + repricing.DECADES
    assert repricing.delta_grid(Decimal("3e-7"), pure=False)[0] == Decimal("1e-7")
    assert repricing.delta_grid(Decimal(0), pure=True) == []


def test_the_largest_delta_admitted_is_offered_with_its_epsilon():
    def at(delta: Decimal) -> repricing.ChargeAtEpsilon:
        return lambda epsilon: Charge(epsilon, delta)

    budget = DeltaShare(Decimal("5e-9"), Decimal("0.4321"))
    grid = repricing.delta_grid(Decimal("1e-7"), pure=False)
    found = repricing.admissible_delta(Decimal(1), at, grid, [budget])  # type: ignore[list-item]
    assert found == (Decimal("1e-9"), Decimal("0.432"))
    # A pure mechanism: delta 0 first.
    pure = repricing.delta_grid(Decimal("1e-7"), pure=True)
    assert repricing.admissible_delta(Decimal(1), at, pure, [budget]) == (0, Decimal("0.432"))  # type: ignore[list-item]
    # At another delta the epsilon asked may itself be admitted.
    wide = DeltaShare(Decimal("5e-9"), Decimal(2))
    assert repricing.admissible_delta(Decimal(1), at, grid, [wide]) == (Decimal("1e-9"), 1)  # type: ignore[list-item]


def test_the_delta_search_is_bounded_and_offers_only_what_it_checked():
    calls: list[Decimal] = []

    def at(delta: Decimal) -> repricing.ChargeAtEpsilon:
        def charge(epsilon: Decimal) -> Charge | None:
            calls.append(epsilon)
            # The mechanism's own lower bound on epsilon (as propose-test-release has one).
            return None if epsilon < Decimal("0.1") else Charge(epsilon, delta)

        return charge

    never = DeltaShare(Decimal(-1), Decimal(1))
    grid = repricing.delta_grid(Decimal("1e-7"), pure=True)
    assert repricing.admissible_delta(Decimal(1), at, grid, [never]) is None  # type: ignore[list-item]
    # Per delta: the epsilon asked, then halvings down to the mechanism's bound (0.0625).
    assert len(calls) == len(grid) * 5 <= repricing.DELTA_TRIALS
    calls.clear()

    def refused(delta: Decimal) -> repricing.ChargeAtEpsilon:
        def charge(epsilon: Decimal) -> Charge | None:
            calls.append(epsilon)
            return None

        return charge

    assert repricing.admissible_delta(Decimal(1), refused, grid, [never]) is None  # type: ignore[list-item]
    assert len(calls) == len(grid) * repricing.REFUSED_OUTRIGHT  # the epsilon asked, 2 halvings
