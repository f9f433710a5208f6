"""The delta a grant's epsilon figures are stated at (``grants.stated_delta``), for the grants
made before that column (migration 0024): pure, so that the migration and the grants code
derive one thing (:func:`service.grants.stated_delta_of`)."""

from __future__ import annotations

from decimal import ROUND_CEILING, Decimal

from api_schemas.common import BUDGET_CONTEXT
from service import accounting

__all__ = ["STATED_DIGITS", "legacy_stated_delta"]

#: Significant digits of a derived delta, rounded up: the delta a grant was asked with is a
#: figure a person typed (1e-6), and the derivation lands within 1e-25 relative above it.
STATED_DIGITS = 15


def legacy_stated_delta(
    kind: str,
    epsilon: Decimal,
    delta: Decimal,
    rho: Decimal,
    delta_total: Decimal,
    delta_conversion: Decimal | None,
) -> Decimal:
    """The delta a grant made before ``stated_delta`` was kept is stated at.

    ``basic`` and ``hybrid``: its ``delta`` (asked and kept). A ``gaussian`` or ``zcdp`` grant
    given in ``rho`` or ``mu`` (``epsilon`` 0): the dataset's ``delta_total`` (its epsilon is its
    rho converted there). Given in epsilon, the asked delta was kept only as what mechanisms may
    spend (``delta``): ``zcdp`` with ``delta > 0`` held ``min(asked, delta_conversion)`` for the
    conversion and left ``delta > 0``, so it held ``delta_conversion`` and was asked
    ``delta + delta_conversion``; otherwise (``gaussian``, ``zcdp`` with no delta for mechanisms)
    the smallest delta at which its native budget is within its epsilon, rounded up to
    :data:`STATED_DIGITS` digits (the GDP curve at ``mu = sqrt(2 rho)``, rounded up, or the CKS
    conversion of ``rho``, an upper bound): at most the asked delta, and the grant's spend is
    ``(epsilon, that delta)``-DP. Never above the dataset's ``delta_total``."""
    if kind in ("basic", "hybrid"):
        return delta
    if epsilon <= 0 or rho <= 0:
        return delta_total
    if kind == "zcdp" and delta > 0 and delta_conversion is not None:
        return min(delta_total, BUDGET_CONTEXT.add(delta, delta_conversion))
    if kind == "gaussian":
        bound = accounting.gdp_delta(accounting.sqrt_up(BUDGET_CONTEXT.multiply(2, rho)), epsilon)
    else:
        bound = accounting.cks_delta(rho, epsilon)
    found = accounting.round_up(bound)
    if found <= 0:
        return delta_total
    rounded = accounting.significant_digits(found, STATED_DIGITS, ROUND_CEILING)
    return min(delta_total, BUDGET_CONTEXT.add(delta, rounded))
