"""What a release is charged in its dataset's currency, as the ledger, the release row and the
audit events record it (one charge per release; see :mod:`service.ledger`)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from service import accounting
from service.ledger import Charge

__all__ = ["cost_delta", "cost_rho", "details", "hybrid_charge"]


def hybrid_charge(epsilon: Decimal, delta: Decimal, costs: accounting.StepCosts) -> Charge:
    """A release's charge on a ``hybrid`` dataset: every filter's figure at once (filter C its
    single-release ``(epsilon, delta)``, B its ``rho`` and approximate ``delta`` or none
    without a profile, A' its GDP ``mu^2`` or none with an approximate step)."""
    profiled = costs.rho is not None and costs.delta is not None
    return Charge(
        epsilon,
        delta,
        costs.rho if costs.rho is not None else Decimal(0),
        gdp=costs.gdp,
        zcdp_delta=costs.delta if profiled else None,
    )


def cost_rho(kind: str, charge: Charge) -> Decimal | None:
    """The release's stored ``cost_rho``: null on ``basic`` and for a ``hybrid`` release with no
    zCDP profile."""
    if kind == "basic" or (kind == "hybrid" and charge.zcdp_delta is None):
        return None
    return charge.rho


def cost_delta(kind: str, charge: Charge) -> Decimal | None:
    """The release's stored ``cost_delta`` (its approximate steps' delta under zCDP)."""
    if kind == "basic":
        return None
    return charge.zcdp_delta if kind == "hybrid" else charge.delta


def details(kind: str, epsilon: Decimal, delta: Decimal, charge: Charge) -> dict[str, Any]:
    """A release's cost as its audit events record it: ``(epsilon, delta)`` on ``basic`` (as
    before), plus the accounting and the ``(rho, delta)`` charged on the others."""
    shown: dict[str, Any] = {"epsilon": epsilon, "delta": delta}
    if kind != "basic":
        shown["accounting"] = kind
        shown["rho"] = cost_rho(kind, charge)
        shown["zcdp_delta"] = cost_delta(kind, charge)
    if kind == "hybrid":
        shown["gdp"] = charge.gdp
    return shown
