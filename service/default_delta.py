"""The ``delta`` a release is given when its request names ``epsilon`` alone: a function of
the public budgets it is charged to (the dataset's and its grant's), never of the rows."""

from __future__ import annotations

from decimal import ROUND_FLOOR, Decimal

from api_schemas.common import BUDGET_CONTEXT
from api_schemas.releases import ReleaseRequest
from service import grants
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
