"""What a refused request IS admitted at: the same request re-priced to a smaller epsilon.

A budget's ``epsilon_remaining`` is one figure (:mod:`service.spend`; under ``hybrid`` what the
next Gaussian release at the budget's delta is admitted at); it is not what one more release of
every kind may ask for. Under ``basic`` the two agree (a release at the remaining epsilon, its
delta within ``delta_remaining``, is admitted), but under ``hybrid`` a release is charged by
three filters in their own currencies: after one Gaussian release of epsilon 0.5 on a ``(1,
1e-5)`` dataset the statement said 0.6177 remains (``total - spent``; a Gaussian release is now
stated, and admitted, at more), yet a pure release (smooth_sensitivity, spatial_sign's Laplace)
of 0.6177 is refused (A' charges it ``pure_mu(0.6177)^2 = 0.59`` against 0.059 left, C counts
the 0.5 at face value) and so are the approximate aggregators (no filter but B takes them). The
refusal and the dry run then said only that the request costs more than "the remaining budget",
naming a figure the request could not have.

So a request in ``epsilon`` that its budget refuses gets the largest epsilon (to
:data:`DIGITS` significant digits, rounded down) at which the same request (mechanism, ``k``,
params, delta, prior) is admitted now by the budget it is charged to (and the dataset's):
found by halving, then by bisection on the request prepared again at each trial
(:func:`service.releases.check_request`, public facts only, nothing charged), and **checked**
at the figure it returns, so the figure given is itself admitted. A release's charge grows
with its epsilon in every filter (a Gaussian's ``mu``, a pure step's ``pure_mu`` and
``eps^2/2``, the face value C counts), so the bisection finds the largest; a mechanism whose
charge is not monotone (``auto`` may switch to another mechanism) still gets a figure that is
admitted, perhaps not the largest. ``None`` when none is found (e.g. the delta it asks no
longer fits any filter: no smaller epsilon helps) or the request was given in ``mu``/``rho``.

When none is found at the request's delta, :func:`admissible_delta` looks for the same request
at another delta only: ``0`` if the mechanism allows pure DP (a pure release spends no delta),
else (or if ``0`` is refused too) the largest delta on the decade grid below the one asked
(:data:`DECADES` of them) at which the request is admitted at all, and then the largest epsilon
there, by the same checked search. After releases that close ``hybrid``'s filter C (its delta
share spent), an approximate request at the default delta has no admitted epsilon, yet the same
request at delta ``1e-9`` (or a pure one at ``0``) may be: the refusal now says so.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import ROUND_FLOOR, Context, Decimal

from api_schemas.releases import ReleaseRequest
from service import accounting
from service.errors import DomainError
from service.ledger import BudgetState, Charge

__all__ = ["DIGITS", "Admissible", "admissible_delta", "admissible_epsilon"]

#: Significant digits of the figure offered (rounded down).
DIGITS = 3
#: Halvings tried to find an admitted epsilon below the refused one (2^-20 of it).
HALVINGS = 20
#: Bisection steps between the admitted and the refused epsilon (at most twice it): 2^-10 of
#: the gap, below the last of :data:`DIGITS` digits. Each step prepares the request again
#: (an ``auto`` request about 0.13 s on a loaded 2-core machine, so a refusal about 1.5 s more;
#: ``analyze_gauss`` about 0.3 s), outside any transaction (the budgets read before it,
#: :func:`service.releases.admissible_search`).
STEPS = 10
#: Decades of delta below the one asked that :func:`admissible_delta` tries (``1e-7`` asked:
#: ``1e-8`` to ``1e-13``).
DECADES = 6
#: Trial preparations :func:`admissible_delta` makes in all (then it gives up): about 6 s for
#: ``auto`` on a loaded 2-core machine, only when no epsilon at the request's delta is found.
DELTA_TRIALS = 60
#: In the delta search, a delta the mechanism refuses at the first this many halvings is
#: passed over (it refuses the delta itself, e.g. a Gaussian variant at ``0``).
REFUSED_OUTRIGHT = 3

_CONTEXT = Context(prec=60)

#: The charge of the same request at another epsilon (``None`` where it is refused before any
#: budget check: a mechanism's own bound on epsilon, a delta no filter could ever take).
ChargeAtEpsilon = Callable[[Decimal], Charge | None]


@dataclass(frozen=True)
class Admissible:
    """What a refused request is admitted at: ``epsilon`` at its own delta, else (``epsilon``
    ``None``) ``delta_epsilon`` at another ``delta``; all ``None`` when nothing is found."""

    epsilon: Decimal | None = None
    delta: Decimal | None = None
    delta_epsilon: Decimal | None = None
    #: The request's delta: the one ``epsilon`` was searched at (said in the 409's message).
    asked_delta: Decimal | None = None


def delta_grid(asked: Decimal, pure: bool) -> list[Decimal]:
    """The deltas :func:`admissible_delta` tries, best first: ``0`` if the mechanism allows
    pure DP, then the :data:`DECADES` powers of ten below ``asked``."""
    grid = [Decimal(0)] if pure and asked > 0 else []
    if asked > 0:
        exponent = asked.adjusted()  # 10^exponent <= asked < 10^(exponent + 1)
        if Decimal(1).scaleb(exponent) >= asked:
            exponent -= 1
        grid += [Decimal(1).scaleb(exponent - step) for step in range(DECADES)]
    return grid


def admissible_delta(
    asked: Decimal,
    charge_at: Callable[[Decimal], ChargeAtEpsilon],
    grid: Sequence[Decimal],
    budgets: Sequence[BudgetState],
) -> tuple[Decimal, Decimal] | None:
    """The first delta of ``grid`` at which the request (``charge_at(delta)`` its charge at an
    epsilon) is admitted at some epsilon below ``asked``, with the largest such epsilon
    (:func:`admissible_epsilon`, checked); ``None`` if none is within :data:`DELTA_TRIALS`
    trial preparations in all. Per delta the halving stops where the mechanism itself starts
    refusing (its own lower bound on epsilon, e.g. propose-test-release's: a smaller epsilon is
    refused too) instead of halving on to ``2^-20``."""
    left = DELTA_TRIALS

    def counted(at: ChargeAtEpsilon) -> ChargeAtEpsilon:
        def trial(epsilon: Decimal) -> Charge | None:
            nonlocal left
            if left <= 0:
                return None  # refused: a figure is only ever offered where it was checked
            left -= 1
            return at(epsilon)

        return trial

    for delta in grid:
        if left <= 0:
            break
        epsilon = admissible_epsilon(asked, counted(charge_at(delta)), budgets, stop=True)
        if epsilon is not None:
            return delta, epsilon
    return None


def charge_at_epsilon(
    prepare: Callable[[ReleaseRequest], Charge], body: ReleaseRequest
) -> ChargeAtEpsilon:
    """``prepare`` (the request's own checks and calibration) applied to ``body`` at another
    epsilon, its delta as prepared (so a defaulted delta is the same at every trial)."""

    def at(epsilon: Decimal) -> Charge | None:
        try:
            return prepare(body.model_copy(update={"epsilon": epsilon}))
        except DomainError:
            return None

    return at


def admissible_epsilon(
    asked: Decimal,
    charge_at: ChargeAtEpsilon,
    budgets: Sequence[BudgetState],
    stop: bool = False,
) -> Decimal | None:
    """The largest epsilon below ``asked`` (see the module docstring) at which ``charge_at``'s
    charge is afforded by every one of ``budgets``, checked at the returned figure. ``stop``:
    try ``asked`` itself first (at another delta it may be admitted as asked), and halve no
    further once the request is refused before any budget check (``charge_at`` gives ``None``)
    below an epsilon where it was not, or at the first :data:`REFUSED_OUTRIGHT` trials."""
    priced: list[bool] = []  # per trial: it had a charge (refused, if so, by a budget)

    def admitted(epsilon: Decimal) -> bool:
        if epsilon <= 0:
            return False
        charge = charge_at(epsilon)
        priced.append(charge is not None)
        return charge is not None and all(budget.affords(charge) for budget in budgets)

    if stop and admitted(asked):
        return asked
    high = asked
    low: Decimal | None = None
    for _ in range(HALVINGS):
        trial = _CONTEXT.divide(high, 2)
        if admitted(trial):
            low = trial
            break
        high = trial
        # The mechanism refuses below where it priced the request (a lower bound on epsilon:
        # smaller is refused too), or refuses from the start (it refuses this delta).
        if stop and not priced[-1] and (any(priced) or len(priced) >= REFUSED_OUTRIGHT):
            return None
    if low is None:
        return None
    for _ in range(STEPS):
        middle = _CONTEXT.divide(_CONTEXT.add(low, high), 2)
        if admitted(middle):
            low = middle
        else:
            high = middle
    # The refused end rounded down can still be admitted (the largest is often a round
    # figure, e.g. C's epsilon left exactly, which the admitted end only approaches).
    for end in (high, low):
        figure = accounting.significant_digits(end, DIGITS, ROUND_FLOOR)
        if admitted(figure):
            return figure
    # Not monotone here (auto): the bisection's own admitted point, at the ledger's places.
    exact = low.quantize(Decimal(1).scaleb(-30), rounding=ROUND_FLOOR).normalize()
    return exact if admitted(exact) else None
