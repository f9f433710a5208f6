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
