"""How spend is stated: one statement of a budget (a dataset's or a grant's) for every surface.

The user's currency is ``(epsilon, delta)``. Every response, 409, grant, table, chart, metric and
audit line states a budget's total, spent and remaining as ``epsilon`` at the dataset's
``delta_total`` (the delta its owner reserved at upload), with the accounting's native figure
(``rho``, ``mu``) beside it, never instead of it. :func:`statement` is that statement; nothing
else converts a native figure to epsilon for display (docs/mechanisms.md, "Reading a budget").

What ``epsilon_spent`` means, per accounting (each the smallest epsilon, rounded **up**, at
which everything spent is ``(epsilon, delta_total)``-DP; ``remaining`` is ``total - spent``,
so rounded **down**):

* ``basic``: the sum of the charges' epsilons (their delta adds up to ``delta_spent``);
* ``gaussian``: the Gaussian-DP curve at ``mu_spent`` (:func:`service.accounting.gdp_epsilon`);
* ``zcdp``: the CKS conversion of ``rho_spent`` at ``delta_total - delta_spent`` (the
  mechanisms' approximate steps spent ``delta_spent`` of it; the conversion gets the rest).

A new accounting kind adds one function to :data:`_NATIVE` (its native figures and its
epsilon at a delta); every surface then states it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal

from service import accounting
from service.ledger import BUDGET_CONTEXT, BudgetState

__all__ = ["Native", "Running", "Statement", "epsilon_of", "running_epsilon", "statement"]


@dataclass(frozen=True)
class Native:
    """An accounting's own figures for a budget: ``rho`` (``gaussian``, ``zcdp``) and ``mu``
    (``gaussian``); ``None`` where the accounting has no such currency."""

    rho_total: Decimal | None = None
    rho_spent: Decimal | None = None
    rho_remaining: Decimal | None = None
    mu_total: Decimal | None = None
    mu_spent: Decimal | None = None
    mu_remaining: Decimal | None = None


@dataclass(frozen=True)
class Statement:
    """A budget stated in ``(epsilon, delta)`` at the dataset's ``delta_total``, with its
    native figures beside it (exact decimals; rounded the safe way: spent up, remaining down).

    ``delta_total`` is the budget's delta (a grant's: what its mechanisms may spend);
    ``delta_remaining`` what releases' mechanisms may still spend; ``delta_reserved_for_conversion``
    the dataset's delta held back to convert ``rho`` to ``(epsilon, delta)`` (``zcdp``; all of
    ``delta_total`` under ``gaussian``; ``None`` under ``basic``) and never spent by a mechanism.
    """

    accounting: str
    epsilon_total: Decimal
    epsilon_spent: Decimal
    epsilon_remaining: Decimal
    delta_total: Decimal
    delta_spent: Decimal
    delta_remaining: Decimal
    delta_reserved_for_conversion: Decimal | None
    #: The delta the epsilon figures are stated at: the dataset's ``delta_total``.
    stated_at_delta: Decimal
    native: Native

    def remaining_fields(self) -> dict[str, Decimal]:
        """What a 409 and a dry run say remains: the same figures as ``GET .../budget``."""
        fields = {
            "epsilon_remaining": self.epsilon_remaining,
            "delta_remaining": self.delta_remaining,
        }
        for name in ("rho_remaining", "mu_remaining"):
            value = getattr(self.native, name)
            if value is not None:
                fields[name] = value
        if self.delta_reserved_for_conversion is not None:
            fields["delta_reserved_for_conversion"] = self.delta_reserved_for_conversion
        return fields


# -- per accounting: the native figures and the epsilon a spend amounts to ---------------------


@dataclass(frozen=True)
class _Kind:
    """One accounting's part of the statement."""

    #: ``(rho, mechanisms' delta, delta_total) -> epsilon`` (rounded up), for rho > 0.
    epsilon_at: Callable[[Decimal, Decimal, Decimal], Decimal | None]
    native: Callable[[BudgetState], Native]
    #: The delta held for the conversion, from the dataset's ``delta_total`` and its share.
    reserved: Callable[[Decimal, Decimal | None], Decimal | None]


def _gaussian_epsilon(rho: Decimal, _delta_spent: Decimal, delta_total: Decimal) -> Decimal:
    return accounting.gdp_epsilon(accounting.sqrt_up(2 * rho), delta_total)


def _zcdp_epsilon(rho: Decimal, delta_spent: Decimal, delta_total: Decimal) -> Decimal | None:
    return accounting.zcdp_epsilon(rho, BUDGET_CONTEXT.subtract(delta_total, delta_spent))


def _rho_native(state: BudgetState) -> Native:
    total = Decimal(0) if state.rho_total is None else state.rho_total
    return Native(rho_total=total, rho_spent=state.rho_spent, rho_remaining=state.rho_remaining)


def _gaussian_native(state: BudgetState) -> Native:
    total = Decimal(0) if state.rho_total is None else state.rho_total
    mu_total = state.mu_total if state.mu_total is not None else accounting.sqrt_down(2 * total)
    return Native(
        rho_total=total,
        rho_spent=state.rho_spent,
        rho_remaining=state.rho_remaining,
        mu_total=mu_total,
        mu_spent=accounting.sqrt_up(2 * state.rho_spent),
        mu_remaining=accounting.sqrt_down(2 * state.rho_remaining),
    )


_NATIVE: dict[str, _Kind] = {
    "gaussian": _Kind(_gaussian_epsilon, _gaussian_native, lambda total, _share: total),
    "zcdp": _Kind(_zcdp_epsilon, _rho_native, lambda _total, share: share),
}


def epsilon_of(
    kind: str, epsilon: Decimal, rho: Decimal, delta_spent: Decimal, delta_total: Decimal
) -> Decimal:
    """The epsilon (rounded up) at which a spend of ``(epsilon, rho, delta_spent)`` in the
    ledger's columns is ``(epsilon, delta_total)``-DP under accounting ``kind``. ``basic``
    spends its ``epsilon`` column; the others convert ``rho``."""
    found = _NATIVE.get(kind)
    if found is None:
        return epsilon
    if rho <= 0:
        return Decimal(0)
    converted = found.epsilon_at(rho, delta_spent, delta_total)
    # No finite epsilon (no delta left for the conversion): the spend is stated as infinite
    # by callers; here it is the figure no budget can exceed.
    return converted if converted is not None else Decimal("Infinity")


def statement(state: BudgetState) -> Statement:
    """The one statement of ``state`` in ``(epsilon, delta)`` with its native figures.

    A dataset's ``epsilon_total`` is the one its owner stated (its whole interaction is
    ``(epsilon_total, delta_total)``-DP by construction of ``rho_total`` / ``mu_total``); a
    grant's is what its native total amounts to (:attr:`BudgetState.epsilon_stated` unset).
    """
    delta_at = state.delta_total if state.stated_delta is None else state.stated_delta
    kind = _NATIVE.get(state.accounting)
    if kind is None:
        return Statement(
            accounting=state.accounting,
            epsilon_total=state.epsilon_total,
            epsilon_spent=state.epsilon_spent,
            epsilon_remaining=max(Decimal(0), state.epsilon_remaining),
            delta_total=state.delta_total,
            delta_spent=state.delta_spent,
            delta_remaining=max(Decimal(0), state.delta_remaining),
            delta_reserved_for_conversion=None,
            stated_at_delta=delta_at,
            native=Native(),
        )
    native = kind.native(state)
    delta_limit = state.delta_total if state.delta_limit is None else state.delta_limit
    if state.epsilon_stated is not None:
        epsilon_total = state.epsilon_stated
    else:
        rho_total = Decimal(0) if state.rho_total is None else state.rho_total
        epsilon_total = epsilon_of(state.accounting, Decimal(0), rho_total, delta_limit, delta_at)
        if state.epsilon_ceiling is not None:
            # A grant's rho is at most the dataset's, whose conversion is within the dataset's
            # epsilon: above it is only the round trip's rounding (down, then up).
            epsilon_total = min(epsilon_total, state.epsilon_ceiling)
    spent = epsilon_of(state.accounting, Decimal(0), state.rho_spent, state.delta_spent, delta_at)
    spent = min(spent, epsilon_total) if spent.is_infinite() else spent
    return Statement(
        accounting=state.accounting,
        epsilon_total=epsilon_total,
        epsilon_spent=spent,
        epsilon_remaining=max(Decimal(0), BUDGET_CONTEXT.subtract(epsilon_total, spent)),
        delta_total=state.delta_total,
        delta_spent=state.delta_spent,
        delta_remaining=max(Decimal(0), state.delta_remaining),
        delta_reserved_for_conversion=kind.reserved(delta_at, state.delta_conversion),
        stated_at_delta=delta_at,
        native=native,
    )


@dataclass(frozen=True)
class Running:
    """One ledger entry stated in epsilon: the dataset's net spend after it, as
    :func:`statement` would state it (``epsilon_after``, at the dataset's ``delta_total``), the
    change it made (``epsilon_increment``: negative for a refund), and its native ``mu``
    (``gaussian``: ``sqrt(2 rho)`` of the entry, rounded up)."""

    epsilon_after: Decimal
    epsilon_increment: Decimal
    mu: Decimal | None


def running_epsilon(
    kind: str,
    delta_total: Decimal,
    before: tuple[Decimal, Decimal, Decimal],
    entries: Sequence[tuple[str, Decimal, Decimal, Decimal]],
) -> list[Running]:
    """Each of ``entries`` (``(kind, epsilon, delta, rho)``, in ledger order, after a net spend
    of ``before``) stated in epsilon. Under ``basic`` the increments are the entries' epsilons;
    under the others epsilons do not add up (the conversion is concave in ``rho``), so the
    increment is the difference of the running figures: what the chart's step is."""
    epsilon, delta, rho = before
    previous = epsilon_of(kind, epsilon, rho, delta, delta_total)
    shown: list[Running] = []
    for entry_kind, entry_epsilon, entry_delta, entry_rho in entries:
        step = BUDGET_CONTEXT.add if entry_kind == "charge" else BUDGET_CONTEXT.subtract
        epsilon = step(epsilon, entry_epsilon)
        delta = step(delta, entry_delta)
        rho = step(rho, entry_rho)
        after = epsilon_of(kind, epsilon, max(rho, Decimal(0)), delta, delta_total)
        increment = BUDGET_CONTEXT.subtract(after, previous) if after.is_finite() else after
        mu = accounting.sqrt_up(2 * entry_rho) if kind == "gaussian" else None
        shown.append(Running(after, increment, mu))
        previous = after
    return shown
