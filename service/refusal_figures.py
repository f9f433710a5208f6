"""The figures a refusal's message states: a budget figure to four significant digits, rounded
the safe way, and why a ``hybrid`` filter cannot charge a release (public figures only: costs
and budgets), for :meth:`service.accounting.HybridState.refusals`."""

from __future__ import annotations

from collections.abc import Mapping
from decimal import ROUND_CEILING, ROUND_FLOOR, Context, Decimal

from api_schemas.common import format_budget

__all__ = [
    "both_lacks",
    "filter_lacks",
    "lacks",
    "short_figure",
    "significant_digits",
    "stated_deltas",
]

#: As :mod:`service.accounting`'s: exact for budget figures (30 places).
_CONTEXT = Context(prec=120)


def significant_digits(value: Decimal, digits: int, rounding: str) -> Decimal:
    """``value > 0`` rounded (``ROUND_FLOOR`` or ``ROUND_CEILING``) to ``digits`` significant
    digits, without trailing zeros."""
    quantum = Decimal(1).scaleb(value.adjusted() - digits + 1)
    return value.quantize(quantum, rounding=rounding, context=Context(prec=80)).normalize()


def short_figure(value: Decimal, up: bool) -> str:
    """A budget figure for a refusal's message: four significant digits, rounded ``up`` (what
    a release needs) or down (what is left; nothing left below 0: the other filters admitted
    what this one could not have)."""
    if value <= 0:
        return "0"
    return format_budget(significant_digits(value, 4, ROUND_CEILING if up else ROUND_FLOOR))


def lacks(what: str, left: Decimal, needs: Decimal) -> str:
    """``"<what> <left> left, it needs <needs>"``, figures by :func:`short_figure`."""
    return f"{what} {short_figure(left, up=False)} left, it needs {short_figure(needs, up=True)}"


def filter_lacks(name: str, share: str, total: Decimal, spent: Decimal, needs: Decimal) -> str:
    """Why filter ``name`` cannot charge ``needs`` of its ``share`` (``total``, of which
    ``spent``): short of it (:func:`lacks`), or closed when the releases other filters admitted
    already spent more than it holds (its sums count every admitted release). "0 left, it
    needs 0" would then read as an admission; what was spent of what says why it refuses."""
    if spent > total:
        return (
            f"{name} is closed: the releases admitted so far (by the other filters) spent "
            f"{short_figure(spent, up=True)} of its {share} {short_figure(total, up=False)}"
        )
    left = _CONTEXT.subtract(total, spent)
    has = f"has, of its {share}," if share.startswith("delta") else f"has {share}"
    return lacks(f"{name} {has}", left, needs)


def both_lacks(
    name: str, epsilon: tuple[Decimal, Decimal, Decimal], delta: tuple[Decimal, Decimal, Decimal]
) -> str:
    """Filter C short of both its epsilon and its delta share, in one clause that names it
    once: what is closed first ("is closed: ... spent 1.5 of its epsilon 1 and 0.000003 of its
    delta share 0.0000001"), then what is short ("..., and has epsilon 0.1 left, it needs 5",
    or "has epsilon 0 left, it needs 0.9, and of its delta share 0 left, it needs 1e-7").
    ``epsilon`` and ``delta`` are each ``(total, spent, needs)``."""
    parts = (("epsilon", *epsilon), ("delta share", *delta))
    closed = [
        f"{short_figure(spent, up=True)} of its {what} {short_figure(total, up=False)}"
        for what, total, spent, _ in parts
        if spent > total
    ]
    short = [
        lacks(
            f"{'has' if what == 'epsilon' else 'of its'} {what}",
            _CONTEXT.subtract(total, spent),
            needs,
        )
        for what, total, spent, needs in parts
        if spent <= total
    ]
    said = (
        [
            f"is closed: the releases admitted so far (by the other filters) spent "
            f"{' and '.join(closed)}"
        ]
        if closed
        else []
    )
    return f"{name} " + ", and ".join(said + short)


def stated_deltas(remaining: Mapping[str, Decimal], accounting: str) -> str:
    """At which delta a 409's stated figures hold, for its message: ``epsilon_admissible`` is
    searched at the request's own delta, ``epsilon_remaining`` at the budget's
    (``stated_at_delta``) for a Gaussian release, ``epsilon_remaining_pure`` for a pure one
    (``delta = 0``); read side by side without their deltas, 0.43 admitted against 0.57
    remaining looked like a contradiction. ``basic``: its ``epsilon_remaining`` holds at any
    delta within ``delta_remaining``."""
    left = short_figure(remaining["epsilon_remaining"], up=False)
    if accounting == "basic":
        within = format_budget(remaining["delta_remaining"])
        return f"epsilon_remaining ({left}) holds at any delta up to delta_remaining ({within})"
    at = format_budget(remaining["stated_at_delta"])
    said = (
        f"epsilon_remaining ({left}) is what a Gaussian release asked at the budget's delta "
        f"{at} is admitted at"
    )
    pure = remaining.get("epsilon_remaining_pure")
    if pure is not None:
        pure_left = short_figure(pure, up=False)
        said += f", epsilon_remaining_pure ({pure_left}) what a pure release (delta 0) is"
    return said
