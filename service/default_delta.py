"""The ``delta`` a release is given when its request names ``epsilon`` alone: a function of
the public budgets it is charged to (the dataset's and its grant's), never of the rows."""

from __future__ import annotations

from decimal import ROUND_FLOOR, Decimal

from api_schemas.common import BUDGET_CONTEXT, format_budget
from api_schemas.releases import ReleaseRequest
from service import advice, charges, grants
from service.db.models import Dataset, Grant
from service.errors import InvalidInput

#: The largest ``delta`` a request in ``epsilon`` without one is given (see
#: :func:`default_delta`): far below ``1/n`` for every dataset the service is sized for.
DEFAULT_DELTA_CAP = Decimal("1e-6")
#: A defaulted ``delta`` is at most this share of the dataset's ``delta_total``, and of the
#: delta of the grant the release is charged to.
DEFAULT_DELTA_SHARE = Decimal("0.01")
_THIRTY_PLACES = Decimal(1).scaleb(-30)


def _hundredth(budget: Decimal) -> Decimal:
    share = BUDGET_CONTEXT.multiply(budget, DEFAULT_DELTA_SHARE)
    # Rounded down to the 30 places a stored cost has: never above the share.
    return share.quantize(_THIRTY_PLACES, rounding=ROUND_FLOOR)


def default_delta(dataset: Dataset, grant: Grant | None = None) -> Decimal:
    """The ``delta`` of a request that gives ``epsilon`` and no ``delta``:
    ``min(1e-6, delta_total / 100, grant_delta / 100)``, a function of public budgets only: the
    dataset's and, when the release is charged to an active ``grant``, the grant's
    (:func:`service.grants.default_delta_budget`: its ``delta`` on ``basic`` and ``hybrid``,
    its delta for approximate steps on ``zcdp`` when it has one; none on ``gaussian``).

    Why these figures: a per-release delta well below ``1/n`` is the usual guidance, and 1e-6
    is what the utility figures in docs/benchmarks.md are measured at; a hundredth of the
    budget the release is charged to leaves room for a hundred such releases where delta is
    charged per release against the whole budget (``basic``; on ``hybrid`` it is all of filter
    C's 1% share and half of B's 2% for approximate steps, so C admits one release at the
    default delta and the Gaussian ones are charged by A'), and on the Gaussian-DP filters it
    only fixes the single release's calibration (its noise grows as ``sqrt(ln(1.25/delta))``:
    15% from 1e-6 to 1e-8). On ``hybrid`` a release whose steps are all pure is prepared at
    delta 0 instead (:func:`service.releases._without_unused_delta`): it spends none. The
    dataset's default would not fit a grant of a smaller delta (1e-7 against a 1e-9 grant's
    whole delta): every release with a delta charge was refused with 409 until the analyst
    gave a smaller delta by hand. A budget without delta (the dataset's, or a ``basic``
    grant's) gives 0: pure-DP mechanisms run, the others answer that they need ``delta > 0``."""
    default = min(DEFAULT_DELTA_CAP, _hundredth(dataset.delta_total))
    bound = grants.default_delta_budget(dataset, grant)
    return default if bound is None else min(default, _hundredth(bound))


def with_default_delta(
    body: ReleaseRequest, dataset: Dataset, grant: Grant | None = None
) -> ReleaseRequest:
    """``body`` with :func:`default_delta` filled in when it gives ``epsilon`` without
    ``delta``; otherwise ``body`` itself. The release records (and its audit event carries)
    the delta it ran at; the request's fingerprint is of what was sent."""
    if body.epsilon is None or body.delta is not None:
        return body
    if "delta" in body.model_fields_set:
        # An explicit null is a mistake to name, not a request for the default.
        raise InvalidInput("delta", "must be a number, not null (omit it for the default)")
    return body.model_copy(update={"delta": default_delta(dataset, grant)})


#: What a request that needs delta > 0 can do instead: the mechanisms that run at delta 0.
PURE_CHOICES = charges.PURE_CHOICES


def refuse_zero_default(
    mechanism: str, delta: Decimal, dataset: Dataset, grant: Grant | None = None
) -> None:
    """Refuse, naming the real cause, a request without ``delta`` whose default
    (:func:`default_delta`) is 0 for ``mechanism``, which needs delta > 0: the dataset's
    ``delta_budget`` is 0, the grant's delta is 0, or a hundredth of one of them is below the
    30 decimal places the ledger keeps (a ``delta_budget`` of 1e-30 gives 1e-32, stored as 0).
    Before, such a request read "needs delta > 0", as if the analyst had asked for 0."""
    if delta != 0:
        return
    head = f"{mechanism} needs delta > 0 and the request gives none"
    bound = grants.default_delta_budget(dataset, grant)
    if dataset.delta_total == 0:
        cause = "this dataset's delta_budget is 0 (pure DP), so no release may spend delta"
        remedy = f"choose {PURE_CHOICES}"
    elif bound is not None and bound == 0:
        cause = "the grant it is charged to has delta 0, so its releases may spend none"
        remedy = f"choose {PURE_CHOICES}, or ask the dataset's owner for a grant with delta"
    else:
        budget, whose = (
            (dataset.delta_total, "this dataset's delta_budget")
            if bound is None or _hundredth(dataset.delta_total) == 0
            else (bound, "the delta of the grant it is charged to")
        )
        cause = (
            f"its default, a hundredth of {whose} ({format_budget(budget)}), is below the "
            "ledger's 30 decimal places and rounds to 0"
        )
        remedy = f"give delta yourself (at most {format_budget(budget)}), or choose {PURE_CHOICES}"
        if advice.hybrid_holds_no_delta(
            dataset.accounting, dataset.mu_total, dataset.rho_total, dataset.delta_basic
        ):
            remedy = (
                "no delta > 0 can be spent on this dataset either: every share of its hybrid "
                "budget's delta rounds to 0 there, so choose "
                f"{PURE_CHOICES} (or the owner uploads with a larger delta_budget)"
            )
    raise InvalidInput("delta", f"{head}: {cause}; {remedy}")
