"""Budget figures for people: significant digits, rounded the safe way.

Tables (the ``dpss`` CLI, the slim client's ``dpss-remote``) print budgets to
:data:`SIGNIFICANT` significant digits; the API and ``--json`` keep the exact values. A spent
figure or a cost is rounded **up** and a total or remaining figure **down**, so a shown figure
never overstates what is left.
"""

from __future__ import annotations

from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal, InvalidOperation

__all__ = ["SIGNIFICANT", "shown"]

#: Significant digits of a budget figure in a table.
SIGNIFICANT = 4


def shown(value: Decimal | str | None, *, up: bool = False, digits: int = SIGNIFICANT) -> str:
    """``value`` to ``digits`` significant digits in plain notation, rounded up (``up``: a
    spent figure, a cost) or down (a total, a remaining figure); ``-`` for ``None``."""
    if value is None:
        return "-"
    try:
        number = value if isinstance(value, Decimal) else Decimal(value)
    except InvalidOperation:
        return str(value)
    if not number.is_finite():
        return str(number)
    if number == 0:
        return "0"
    quantum = Decimal(1).scaleb(number.adjusted() - digits + 1)
    rounded = number.quantize(quantum, rounding=ROUND_CEILING if up else ROUND_FLOOR)
    # Plain notation always, as the JSON writes budgets ("0.0000001", never "1E-7").
    return format(rounded.normalize(), "f")
