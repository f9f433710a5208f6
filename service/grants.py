"""Grants: an owner's share ``(epsilon, delta)`` of a dataset's budget for one analyst key, or for
every analyst (a grant without a key).

Policy (documented in docs/service.md, section "Grants"):

- A release is charged to the dataset AND to the grant that applies, by one ledger entry that
  names the grant, in the transaction that holds the dataset's lock: both budgets move together
  or not at all, and neither may go negative.
- Which grant applies: the analyst's own active grant on the dataset if there is one, else the
  dataset's active all-analysts grant, else none. There is no fallback from an exhausted
  personal grant to the all-analysts grant: a personal grant is the owner's limit for that key.
- Revocation means no further charges for the keys the grant covered, and nothing falls back:
  a key whose personal grant on the dataset was revoked (and that has no newer one) is refused
  with 403 ``grant_revoked``, as is every analyst without a personal grant once the
  all-analysts grant was revoked (and none newer is active). A revoked share is the owner
  taking the right to spend away, not the owner returning the key to the dataset's budget or
  to the all-analysts grant; a new grant restores it.
- Without an applicable grant (and none revoked) the analyst spends the dataset's budget
  directly, unless ``DPSS_GRANTS_REQUIRED`` is true, in which case the request is refused (403).
- Grants may together exceed the dataset's budget (oversubscription, as with quotas): since every
  release is also charged to the dataset, the dataset can never be overspent, and an owner can
  hand out shares that are not all used without reserving them. One grant may not exceed the
  dataset's whole budget (it could never be used up; surely a mistake).
- One active grant per key (and one all-analysts grant) per dataset: a second is a 409; revoke
  the first. Revocation stops further charges; what was spent stays spent.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal

from sqlalchemy import Select, bindparam, case, or_, select
from sqlalchemy.orm import Session

from api_schemas.common import format_budget
from service import (
    accounting,
    audit,
    charges,
    datasets,
    grant_terms,
    ledger,
    privacy_unit,
    row_locks,
    spend,
)
from service.auth import Principal, require_role
from service.db.models import ApiKey, Dataset, Grant, LedgerEntry, utcnow
from service.errors import (
    Conflict,
    DatasetGone,
    GrantRequired,
    GrantRevoked,
    InvalidInput,
    NotFound,
)

__all__ = [
    "GrantView",
    "applicable_grant",
    "create_grant",
    "current_grant",
    "default_delta_budget",
    "grant_budget",
    "list_grants",
    "require_usable",
    "revoke_grant",
    "view_of",
]


@dataclass(frozen=True)
class GrantView:
    """A grant with what it has spent and what remains."""

    grant: Grant
    budget: ledger.BudgetState
    #: The analyst key's name (None for an all-analysts grant), for people reading a list.
    key_name: str | None = None
    #: What the share protects: the dataset's unit (:func:`service.privacy_unit.unit_of`).
    privacy_unit: Literal["row", "person"] = "row"


def view_of(session: Session, grant: Grant) -> GrantView:
    """A grant with its budget from the ledger and its key's name."""
    key = session.get(ApiKey, grant.analyst_key_id) if grant.analyst_key_id is not None else None
    unit = privacy_unit.unit_of(session.get(Dataset, grant.dataset_id))
    return GrantView(grant, grant_budget(session, grant), None if key is None else key.name, unit)


def grant_budget(session: Session, grant: Grant) -> ledger.BudgetState:
    """A grant's budget from the ledger entries that name it (exact, summed in Python), in its
    dataset's currency."""
    dataset = session.get(Dataset, grant.dataset_id)
    assert dataset is not None  # a grant's dataset row is never removed
    # A refund after the dataset's deletion never takes effect (ledger.in_effect).
    counted = [LedgerEntry.grant_id == grant.id, ledger.in_effect(deleted_at=dataset.deleted_at)]
    rows = session.execute(
        select(
            LedgerEntry.kind,
            LedgerEntry.epsilon,
            LedgerEntry.delta,
            LedgerEntry.rho,
            LedgerEntry.gdp,
            LedgerEntry.zcdp_delta,
        ).where(*counted)
    ).all()
    return _grant_state(dataset, grant, *ledger.spent_of(rows))


def stated_delta_of(dataset: Dataset, grant: Grant) -> Decimal:
    """The delta ``grant``'s epsilon figures are stated at: the one it was given with
    (``grants.stated_delta``; a row no migration filled: derived as migration 0024 derives it)."""
    if grant.stated_delta is not None:
        return grant.stated_delta
    return grant_terms.legacy_stated_delta(
        dataset.accounting,
        grant.epsilon,
        grant.delta,
        grant.rho if grant.rho is not None else Decimal(0),
        dataset.delta_total,
        dataset.delta_conversion,
    )


def hybrid_grant_budget(
    dataset: Dataset, epsilon: Decimal, delta: Decimal
) -> accounting.HybridBudget:
    """A ``hybrid`` grant's filters: a hybrid sub-budget of ``(epsilon, delta)`` with its
    dataset's shares of delta (each share rounded down, so their sum stays within ``delta``),
    each filter's budget derived as the dataset's (rounded down) and capped at the dataset's
    (:func:`service.accounting.hybrid_sub_budget`)."""
    return accounting.hybrid_sub_budget(charges.filters_of(dataset), epsilon, delta)


def _grant_state(
    dataset: Dataset,
    grant: Grant,
    epsilon_spent: Decimal,
    delta_spent: Decimal,
    rho_spent: Decimal,
    *hybrid_sums: Decimal,
) -> ledger.BudgetState:
    """A grant's share as a budget of its dataset's accounting: ``(epsilon, delta)``
    (``basic``), ``rho`` (``gaussian``, ``mu^2/2``), ``(rho, delta)`` (``zcdp``) or a hybrid
    sub-budget of ``(epsilon, delta)`` (``hybrid``, :func:`hybrid_grant_budget`). A ``hybrid``
    grant is stated at its own ``delta`` (:mod:`service.spend`): its filters enforce
    ``(epsilon, delta)``, so its spent and remaining are read at that delta too."""
    if dataset.accounting == "hybrid":
        budget = hybrid_grant_budget(dataset, grant.epsilon, grant.delta)
        sums = (*hybrid_sums, Decimal(0), Decimal(0), Decimal(0), Decimal(0))[:4]
        return ledger.BudgetState(
            grant.epsilon,
            grant.delta,
            epsilon_spent,
            delta_spent,
            accounting="hybrid",
            rho_total=budget.rho_total,
            rho_spent=rho_spent,
            delta_limit=budget.delta_basic,
            # Stated in the grant's own terms: total, spent and remaining all at the grant's
            # delta, the delta its filters are a sub-budget of (the dataset's delta_total made
            # its spent and remaining a figure at another delta than its total).
            stated_delta=grant.delta,
            epsilon_stated=grant.epsilon,
            epsilon_ceiling=dataset.epsilon_total,
            delta_conversion=budget.delta_conversion,
            mu_total=budget.mu_total,
            delta_gaussian=budget.delta_gaussian,
            delta_mechanisms=budget.delta_mechanisms,
            delta_basic=budget.delta_basic,
            gdp_spent=sums[0],
            zcdp_delta_spent=sums[1],
            not_gdp=sums[2],
            not_profiled=sums[3],
        )
    stated = stated_delta_of(dataset, grant)
    conversion = dataset.delta_conversion
    if dataset.accounting == "zcdp" and grant.epsilon > 0:
        # What the grant holds for its conversion: its asked delta less what its mechanisms
        # may spend (min(asked, the dataset's conversion share), :func:`_epsilon_share`).
        conversion = max(Decimal(0), ledger.BUDGET_CONTEXT.subtract(stated, grant.delta))
    return ledger.BudgetState(
        grant.epsilon,
        grant.delta,
        epsilon_spent,
        delta_spent,
        accounting=dataset.accounting,
        rho_total=grant.rho if dataset.accounting != "basic" else None,
        rho_spent=rho_spent,
        # Stated (service.spend) in the grant's own terms: given in epsilon, total, spent and
        # remaining all at the delta it was given with (its rho is within (epsilon, that
        # delta)); its spend read at the dataset's delta_total made a row of two deltas, 0.14
        # left of a (1, 1e-6) gaussian grant that refused everything. Given in rho or mu: its
        # rho converted at the dataset's delta_total.
        stated_delta=stated,
        epsilon_stated=grant.epsilon
        if dataset.accounting != "basic" and grant.epsilon > 0
        else None,
        epsilon_ceiling=dataset.epsilon_total,
        delta_conversion=conversion,
    )


def _own_dataset(session: Session, principal: Principal, dataset_id: uuid.UUID) -> Dataset:
    """The owner's dataset, locked as a release locks it (grants change under the same lock)."""
    require_role(principal, "owner")
    # First: a unit of work that waits for the row may be run again (service.row_locks).
    dataset: Dataset | None = row_locks.lock_one(
        session, select(Dataset).where(Dataset.id == dataset_id).with_for_update()
    )
    if dataset is None or dataset.owner_key_id != principal.key_id:
        raise NotFound(f"no dataset {dataset_id}")
    return dataset


def _active(session: Session, dataset_id: uuid.UUID, key_id: uuid.UUID | None) -> Grant | None:
    key_match = Grant.analyst_key_id.is_(None) if key_id is None else Grant.analyst_key_id == key_id
    return session.execute(
        select(Grant)
        .where(Grant.dataset_id == dataset_id, key_match, Grant.revoked_at.is_(None))
        .order_by(Grant.created_at)
        .limit(1)
    ).scalar_one_or_none()


def _applicable_select() -> Select[Any]:
    """The statement of :func:`_current`, built once (bound ``dataset_id`` and ``key_id``):
    building its ordering anew cost as much as running it."""
    mine = Grant.analyst_key_id == bindparam("key_id")
    active = Grant.revoked_at.is_(None)
    return (
        select(Grant)
        .where(
            Grant.dataset_id == bindparam("dataset_id"),
            or_(mine, Grant.analyst_key_id.is_(None)),
        )
        .order_by(
            case((mine, 0), else_=1),
            case((active, 0), else_=1),
            case((active, Grant.created_at), else_=None),
            Grant.revoked_at.desc(),
            Grant.id,
        )
        .limit(1)
    )


_APPLICABLE = _applicable_select()


def _current(session: Session, dataset_id: uuid.UUID, key_id: uuid.UUID) -> Grant | None:
    """The grant whose terms apply to ``key_id``'s releases on the dataset: among the key's own
    grants, else among the all-analysts ones, the active grant, else the most recently revoked;
    None if neither has any. (A new grant needs the old one revoked, so an active grant is
    always the newest.) One statement: it runs on every release request, where the four
    lookups it replaces (active and revoked, the key's and everyone's) each cost a statement
    though most datasets have no grant at all."""
    return session.execute(
        _APPLICABLE, {"dataset_id": dataset_id, "key_id": key_id}
    ).scalar_one_or_none()


def create_grant(
    session: Session,
    principal: Principal,
    dataset_id: uuid.UUID,
    analyst_key_id: uuid.UUID | None,
    epsilon: Decimal | None,
    delta: Decimal | None,
    *,
    rho: Decimal | None = None,
    mu: Decimal | None = None,
) -> GrantView:
    """Give ``analyst_key_id`` (every analyst if None) a share of the dataset's budget, in the
    dataset's currency: ``(epsilon, delta)`` (``basic``), ``mu`` or ``rho`` (``gaussian``),
    ``rho`` and ``delta`` (``zcdp``)."""
    for name, value in (("epsilon", epsilon), ("delta", delta), ("rho", rho), ("mu", mu)):
        if value is not None:
            ledger.check_storable(name, value)
    dataset = _own_dataset(session, principal, dataset_id)
    epsilon, delta, rho, stated_delta = _share(dataset, epsilon, delta, rho, mu)
    if dataset.deleted_at is not None:
        raise DatasetGone(f"dataset {dataset_id} was deleted; it can grant nothing")
    datasets.require_ready(dataset)
    if analyst_key_id is not None:
        key = session.get(ApiKey, analyst_key_id)
        if key is None or key.role != "analyst" or key.revoked_at is not None:
            raise InvalidInput("analyst_key_id", "must be the id of an active analyst key")
    existing = _active(session, dataset.id, analyst_key_id)
    if existing is not None:
        who = "this analyst key" if analyst_key_id is not None else "every analyst"
        raise Conflict(
            f"grant {existing.id} for {who} on this dataset is still active; revoke it first"
        )
    grant = Grant(
        id=uuid.uuid4(),
        dataset_id=dataset.id,
        analyst_key_id=analyst_key_id,
        epsilon=epsilon,
        delta=delta,
        rho=rho,
        stated_delta=stated_delta,
        created_by_key_id=principal.key_id,
        created_at=utcnow(),
    )
    session.add(grant)
    zero = Decimal(0)
    state = _grant_state(dataset, grant, zero, zero, zero)
    stated = spend.statement(state)
    audit.record(
        session,
        "grant_created",
        actor_key_id=principal.key_id,
        dataset_id=dataset.id,
        details={
            "grant_id": grant.id,
            "analyst_key_id": analyst_key_id,
            "epsilon": epsilon,
            "delta": delta,
            # Only on gaussian and zcdp datasets: basic grants' events read as before.
            **(
                {}
                if dataset.accounting == "basic"
                else {
                    "accounting": dataset.accounting,
                    "rho": rho,
                    # The user's currency beside the native one (service.spend).
                    "epsilon_stated": stated.epsilon_total,
                    "stated_at_delta": stated.stated_at_delta,
                }
            ),
            **privacy_unit.event_details(dataset),
        },
    )
    session.flush()
    named = session.get(ApiKey, analyst_key_id) if analyst_key_id is not None else None
    unit = privacy_unit.unit_of(dataset)
    return GrantView(grant, state, None if named is None else named.name, unit)


def _share(
    dataset: Dataset,
    epsilon: Decimal | None,
    delta: Decimal | None,
    rho: Decimal | None,
    mu: Decimal | None,
) -> tuple[Decimal, Decimal, Decimal, Decimal]:
    """The grant's ``(epsilon, delta, rho)`` in the dataset's currency, each at most the
    dataset's total, and the delta its epsilon figures are stated at (``stated_delta``: the
    delta it is given with; given in rho or mu, the dataset's ``delta_total``);
    :class:`InvalidInput` names the field that does not fit."""
    compare = ledger.BUDGET_CONTEXT.compare
    zero = Decimal(0)
    if dataset.accounting in ("basic", "hybrid"):
        for name, value in (("rho", rho), ("mu", mu)):
            if value is not None:
                raise InvalidInput(
                    name, f"this dataset's accounting is {dataset.accounting}: give epsilon, delta"
                )
    if dataset.accounting == "hybrid":
        share = _hybrid_share(dataset, epsilon, delta)
        return (*share, share[1])
    if dataset.accounting == "basic":
        if epsilon is None:
            raise InvalidInput(
                "epsilon", "required (with delta, default the dataset's delta_total)"
            )
        # delta defaults as on every other accounting (and as `dpss grants create --help` says):
        # a newcomer's `--epsilon 0.2` was refused "delta: required" on basic alone.
        delta = dataset.delta_total if delta is None else delta
        if compare(epsilon, dataset.epsilon_total) > 0:
            raise InvalidInput("epsilon", "must not exceed the dataset's total epsilon budget")
        if compare(delta, dataset.delta_total) > 0:
            raise InvalidInput("delta", "must not exceed the dataset's total delta budget")
        return epsilon, delta, zero, delta
    if epsilon is not None:
        asked = dataset.delta_total if delta is None else delta
        return (*_epsilon_share(dataset, epsilon, delta, rho, mu), asked)
    if mu is not None and rho is not None:
        raise InvalidInput("mu", "give mu or rho, not both")
    if mu is not None:
        if dataset.accounting != "gaussian":
            raise InvalidInput("mu", "only gaussian accounting grants mu; give rho and delta")
        rho = accounting.budget_rho_of_mu(mu)
    if rho is None:
        raise InvalidInput("rho", f"required (or mu, or epsilon) on a {dataset.accounting} dataset")
    assert dataset.rho_total is not None  # set for every non-basic dataset
    if compare(rho, dataset.rho_total) > 0:
        total = dataset.rho_total if mu is None else dataset.mu_total
        raise InvalidInput(
            "rho" if mu is None else "mu", f"must not exceed the dataset's budget ({total})"
        )
    delta = zero if delta is None else delta
    if dataset.accounting == "gaussian" and delta > 0:
        raise InvalidInput("delta", "gaussian accounting spends no delta; grant mu only")
    limit = ledger.state_of(dataset, zero, zero, zero).delta_remaining
    if compare(delta, limit) > 0:
        raise InvalidInput("delta", _mechanism_delta_limit(dataset, limit))
    return zero, delta, rho, dataset.delta_total


def _within_dataset(dataset: Dataset, epsilon: Decimal, delta: Decimal | None) -> Decimal:
    """A grant's ``delta`` (default: the dataset's ``delta_total``), after checking that the
    grant's ``(epsilon, delta)`` is each at most the dataset's (422 naming the field)."""
    compare = ledger.BUDGET_CONTEXT.compare
    if compare(epsilon, dataset.epsilon_total) > 0:
        # The declared budget, not the budget's stated epsilon_total: under hybrid that is
        # stated at delta_total (0.9979 for a declared 1), and naming it so read as a figure
        # the budget contradicts.
        raise InvalidInput(
            "epsilon",
            "must not exceed the epsilon_budget the dataset was uploaded with "
            f"({format_budget(dataset.epsilon_total)})",
        )
    delta = dataset.delta_total if delta is None else delta
    if compare(delta, dataset.delta_total) > 0:
        raise InvalidInput(
            "delta",
            f"must not exceed the dataset's delta_total ({format_budget(dataset.delta_total)})",
        )
    return delta


def _hybrid_share(
    dataset: Dataset, epsilon: Decimal | None, delta: Decimal | None
) -> tuple[Decimal, Decimal, Decimal]:
    """A grant on a ``hybrid`` dataset: ``(epsilon, delta)`` (``delta`` defaults to the
    dataset's ``delta_total``), each at most the dataset's; the grant is a hybrid sub-budget
    with the dataset's shares (:func:`hybrid_grant_budget`), its B ``rho`` kept in the grant's
    ``rho`` column for the record."""
    if epsilon is None:
        raise InvalidInput("epsilon", "required (with delta, default the dataset's delta_total)")
    delta = _within_dataset(dataset, epsilon, delta)
    if delta <= 0:
        raise InvalidInput("delta", f"must be > 0 on a {dataset.accounting} dataset")
    return epsilon, delta, hybrid_grant_budget(dataset, epsilon, delta).rho_total


def _mechanism_delta_limit(dataset: Dataset, limit: Decimal) -> str:
    """Why a native grant's delta is too large, with the figures."""
    return (
        f"must not exceed the dataset's delta for mechanisms, {limit} (its delta_total "
        f"{dataset.delta_total} less the {dataset.delta_conversion} held for the conversion); "
        "or grant epsilon with delta up to delta_total"
    )


def _epsilon_share(
    dataset: Dataset,
    epsilon: Decimal,
    delta: Decimal | None,
    rho: Decimal | None,
    mu: Decimal | None,
) -> tuple[Decimal, Decimal, Decimal]:
    """A grant given in ``(epsilon, delta)`` on a ``gaussian`` or ``zcdp`` dataset, as the
    ``(0, mechanisms' delta, rho)`` the ledger charges, rounded the safe way (the rho down).

    ``delta`` (default: the dataset's ``delta_total``) is the grant's whole delta. ``gaussian``:
    ``rho = mu^2/2`` for the largest ``mu`` whose GDP curve is within ``(epsilon, delta)``.
    ``zcdp``: like the dataset, the grant holds ``c = min(delta, delta_conversion)`` for the
    conversion and lets its mechanisms spend ``delta - c``; its ``rho`` is the largest whose CKS
    conversion is within ``(epsilon, c)``. Either way what the grant spends is
    ``(epsilon, delta)``-DP; both are capped at the dataset's own budget (a grant of the whole
    ``(epsilon_total, delta_total)`` is the whole budget). The epsilon is kept as the grant's
    stated total (:mod:`service.spend`)."""
    for name, value in (("rho", rho), ("mu", mu)):
        if value is not None:
            raise InvalidInput(name, "give epsilon (with delta) or the native budget, not both")
    delta = _within_dataset(dataset, epsilon, delta)
    if delta <= 0:
        raise InvalidInput("delta", f"must be > 0 on a {dataset.accounting} dataset")
    assert dataset.rho_total is not None  # set for every non-basic dataset
    zero = Decimal(0)
    if dataset.accounting == "gaussian":
        rho = accounting.budget_rho_of_mu(accounting.mu_budget(epsilon, delta))
        mechanisms = zero
    else:
        assert dataset.delta_conversion is not None  # set for every zcdp dataset
        conversion = min(delta, dataset.delta_conversion)
        mechanisms = ledger.BUDGET_CONTEXT.subtract(delta, conversion)
        rho = accounting.rho_budget(epsilon, conversion)
        if rho == 0:
            raise InvalidInput(
                "epsilon",
                f"{epsilon} is too small at the grant's delta for the conversion, {conversion}: "
                "its zCDP budget (the largest rho whose conversion the service certifies within "
                "it) is 0, so the grant could run nothing; grant a larger epsilon or delta, or "
                "a rho",
            )
    # The epsilon asked is kept (the grant's epsilon column; the filter charges rho only): its
    # spend is (epsilon, delta)-DP with delta <= delta_total, which is how it is stated.
    return epsilon, mechanisms, min(rho, dataset.rho_total)


def list_grants(session: Session, principal: Principal, dataset_id: uuid.UUID) -> list[GrantView]:
    """The dataset's grants, oldest first, revoked ones included, each with spent and remaining."""
    require_role(principal, "owner")
    dataset = session.get(Dataset, dataset_id)
    if dataset is None or dataset.owner_key_id != principal.key_id:
        raise NotFound(f"no dataset {dataset_id}")
    grants = session.execute(
        select(Grant).where(Grant.dataset_id == dataset_id).order_by(Grant.created_at, Grant.id)
    ).scalars()
    return [view_of(session, grant) for grant in grants]


def revoke_grant(
    session: Session, principal: Principal, dataset_id: uuid.UUID, grant_id: uuid.UUID
) -> GrantView:
    """Stop further charges to a grant (idempotent); what it spent stays spent."""
    dataset = _own_dataset(session, principal, dataset_id)
    grant = session.get(Grant, grant_id)
    if grant is None or grant.dataset_id != dataset.id:
        raise NotFound(f"no grant {grant_id} on dataset {dataset_id}")
    if grant.revoked_at is None:
        grant.revoked_at = utcnow()
        audit.record(
            session,
            "grant_revoked",
            actor_key_id=principal.key_id,
            dataset_id=dataset.id,
            details={"grant_id": grant.id},
        )
    return view_of(session, grant)


def current_grant(session: Session, dataset_id: uuid.UUID, key_id: uuid.UUID) -> Grant | None:
    """The grant whose terms apply to ``key_id``'s releases on the dataset (active or the most
    recently revoked; None if none), without refusing: a release reads its default delta off it
    (:func:`service.default_delta.default_delta`) before :func:`require_usable` decides. One
    statement."""
    return _current(session, dataset_id, key_id)


def require_usable(grant: Grant | None, *, required: bool) -> Grant | None:
    """``grant`` (from :func:`current_grant`) if a release may be charged to it, or None when
    there is none and none is required; a revoked grant is a :class:`GrantRevoked` refusal
    (nothing falls back after a revocation: module docstring), no grant with ``required`` a
    :class:`GrantRequired` one."""
    if grant is not None and grant.revoked_at is not None:
        whose = "this key's grant" if grant.analyst_key_id is not None else "the all-analysts grant"
        raise GrantRevoked(
            f"{whose} {grant.id} on this dataset was revoked: no further charges until the "
            "dataset's owner gives a new grant",
            grant_id=grant.id,
        )
    if grant is None and required:
        raise GrantRequired(
            "this service requires a grant (DPSS_GRANTS_REQUIRED) and this key has none on "
            "this dataset; ask the dataset's owner for one"
        )
    return grant


def applicable_grant(
    session: Session, dataset_id: uuid.UUID, key_id: uuid.UUID, *, required: bool
) -> Grant | None:
    """The grant a release by ``key_id`` is charged to: personal first, then all-analysts
    (:func:`current_grant`, then :func:`require_usable`).

    Called under the dataset's lock, so no grant is created or revoked meanwhile.
    """
    return require_usable(current_grant(session, dataset_id, key_id), required=required)


def default_delta_budget(dataset: Dataset, grant: Grant | None) -> Decimal | None:
    """The public delta budget that a release's default delta must fit under ``grant`` (active,
    else None), or None where the grant puts no tighter bound than the dataset's.

    ``basic``: the grant's ``delta``, charged per release. ``hybrid``: the grant's ``delta``,
    split among its filters in the dataset's shares (:func:`hybrid_grant_budget`), so a
    hundredth of it sits in the grant's B and C shares as a hundredth of ``delta_total`` does
    in the dataset's. ``zcdp``: the grant's ``delta`` for approximate steps, when it has one;
    a grant without (rho alone, or a delta within the conversion's share) can never be charged
    an approximate step, while a purely Gaussian release charges it rho only: that release's
    delta only fixes its calibration, as on ``gaussian``, where a grant holds no delta at all
    (its ``mu`` is stated at the dataset's ``delta_total``, :mod:`service.spend`)."""
    if grant is None or grant.revoked_at is not None:
        return None
    if dataset.accounting in ("basic", "hybrid"):
        return grant.delta
    if dataset.accounting == "zcdp" and grant.delta > 0:
        return grant.delta
    return None
