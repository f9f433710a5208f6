"""Pure helpers of the release service."""

from __future__ import annotations

import math
from decimal import Decimal

from hypothesis import given
from hypothesis import strategies as st

from service.release_calibration import float_not_above


@given(st.decimals(min_value=Decimal("1e-30"), max_value=Decimal(1000), places=30))
def test_float_not_above_never_exceeds_the_charged_decimal(value: Decimal) -> None:
    result = float_not_above(value)
    assert Decimal(result) <= value
    # ...and is the closest such double: the next one up is already above.
    assert Decimal(math.nextafter(result, math.inf)) > value
