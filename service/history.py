"""Release history: who may list which releases, filters, and keyset pagination.

Visibility is the same as for one release (:func:`service.releases.get_release`): an analyst
lists the releases they requested, an owner the releases of the datasets they uploaded (deleted
ones included: the ledger and the audit log keep them too). Lists obey the side-channel rules
of single reads: an analyst's or owner's ``status`` filter matches the status they are shown
(:mod:`service.visibility`), so a release before its ``visible_at`` is ``queued`` to them in the
filter, the count and the row, one past it whose outcome does not show yet (late:
:func:`service.padding.late_schedule`) is ``running``, one whose dataset was deleted before
its outcome was due is ``failed``, and a one-shot release on a dataset by reference is
``running`` until its re-check's verdict shows and ``failed`` if that found an object changed
(:mod:`service.reference_recheck`); a continual one is ``running`` while one of its epochs
waits for its verdict, and ``failed`` once the first not shown is one found changed.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import ColumnElement, and_, case, func, not_, or_, select
from sqlalchemy.orm import Session, aliased

from service import continual
from service.auth import Principal, require_role, sees_real_state
from service.db.models import Dataset, Release, ReleaseEpoch, utcnow
from service.errors import NotFound
from service.pagination import Page, list_scope, parse_time_id_cursor, time_id_cursor

CURSOR_KIND = "release"


@dataclass(frozen=True)
class ReleaseFilters:
    """Optional filters, all of which a listed release must match."""

    dataset_id: uuid.UUID | None = None
    status: str | None = None
    mechanism: str | None = None
    #: Strict bounds on ``created_at`` (UTC-aware).
    created_after: datetime | None = None
    created_before: datetime | None = None


def _owned_datasets(principal: Principal) -> ColumnElement[bool]:
    return Release.dataset_id.in_(
        select(Dataset.id).where(Dataset.owner_key_id == principal.key_id)
    )


def _visible(principal: Principal) -> ColumnElement[bool]:
    require_role(principal, "analyst", "owner")
    if principal.role == "analyst":
        return Release.requester_key_id == principal.key_id
    return _owned_datasets(principal)


def _status_as_shown(principal: Principal, status: str, now: datetime) -> ColumnElement[bool]:
    """Releases ``principal`` is shown with ``status`` at ``now`` (the rules of
    :func:`service.visibility.view`, in SQL)."""
    if sees_real_state(principal):
        return Release.status == status
    # service.visibility.padded: a zero padding (switched off) hides nothing.
    padded = and_(Release.visible_at.is_not(None), Release.visible_at > Release.created_at)
    visible = or_(Release.visible_at.is_(None), Release.visible_at <= now)
    if status == "queued":
        # Before visible_at every release; after it none (an unfinished release is shown
        # running then, whatever its real state), except those made before visible_at existed.
        return or_(not_(visible), and_(not_(padded), Release.status == "queued"))
    # A dataset deleted before the outcome was due (a one-shot release re-checked, or a
    # continual one that released no epoch: before its verdict's moment) shows every end as
    # failed, and the epochs after the deletion never (service.visibility.deleted_before_shown).
    deleted = and_(
        padded,
        select(Dataset.id)
        .where(
            Dataset.id == Release.dataset_id,
            Dataset.deleted_at.is_not(None),
            Dataset.deleted_at
            < case(
                (
                    and_(
                        Release.reference_shown_at.is_not(None),
                        or_(
                            Release.mechanism.not_in(continual.continual_names()),
                            Release.epochs_done == 0,
                        ),
                    ),
                    Release.reference_shown_at,
                ),
                else_=func.coalesce(Release.outcome_visible_at, Release.visible_at),
            ),
        )
        .exists(),
    )
    # A release that ended is shown running before its outcome_visible_at (a one-shot release's
    # step of the late schedule, or a continual release's end) or while one of its epochs is
    # not yet visible (service.visibility.end_visible).
    # A one-shot release on a dataset by reference is shown running until its re-check's
    # verdict shows, and failed if the re-check found an object changed
    # (service.visibility.reference_waiting; null columns: every other release, never matched).
    checked = Release.reference_check.is_not(None)
    reference_waiting = and_(
        checked,
        or_(
            Release.reference_check == "pending",
            Release.reference_shown_at.is_(None),
            Release.reference_shown_at > now,
        ),
    )
    reference_changed = and_(checked, Release.reference_check == "changed")
    # A continual release on a dataset by reference: an epoch hidden for its re-check hides
    # the end as a late epoch does, and the first one hidden, if its re-check found its
    # objects changed and that shows, shows the release failed (service.visibility.view,
    # epoch_change_shown; service.continual._shown).
    cut, earlier = aliased(ReleaseEpoch), aliased(ReleaseEpoch)
    epoch_changed = and_(
        not_(deleted),
        select(cut.epoch)
        .where(
            cut.release_id == Release.id,
            cut.reference_check == "changed",
            cut.reference_shown_at <= now,
            ~select(earlier.epoch)
            .where(
                earlier.release_id == Release.id,
                earlier.epoch < cut.epoch,
                continual.unverified(earlier, now),
            )
            .exists(),
        )
        .exists(),
    )
    epoch_hidden = or_(
        and_(
            not_(deleted),
            select(ReleaseEpoch.epoch)
            .where(
                ReleaseEpoch.release_id == Release.id,
                or_(ReleaseEpoch.visible_at > now, continual.unverified(ReleaseEpoch, now)),
            )
            .exists(),
        ),
        and_(Release.outcome_visible_at.is_not(None), Release.outcome_visible_at > now),
        reference_waiting,
    )
    if status == "running":
        unfinished = or_(Release.status == "running", and_(padded, Release.status == "queued"))
        return and_(visible, not_(epoch_changed), or_(unfinished, epoch_hidden))
    if status == "failed":
        ended = Release.status.in_(("succeeded", "no_result", "failed"))
        shown = or_(Release.status == "failed", and_(ended, or_(deleted, reference_changed)))
        return and_(visible, or_(epoch_changed, and_(shown, not_(epoch_hidden))))
    return and_(
        visible,
        Release.status == status,
        not_(deleted),
        not_(reference_changed),
        not_(epoch_changed),
        not_(epoch_hidden),
    )


def _conditions(
    principal: Principal, filters: ReleaseFilters, now: datetime
) -> list[ColumnElement[bool]]:
    conditions = [_visible(principal)]
    if filters.dataset_id is not None:
        conditions.append(Release.dataset_id == filters.dataset_id)
    if filters.status is not None:
        conditions.append(_status_as_shown(principal, filters.status, now))
    if filters.mechanism is not None:
        conditions.append(Release.mechanism == filters.mechanism)
    if filters.created_after is not None:
        conditions.append(Release.created_at > filters.created_after)
    if filters.created_before is not None:
        conditions.append(Release.created_at < filters.created_before)
    return conditions


def list_releases(
    session: Session,
    principal: Principal,
    filters: ReleaseFilters,
    limit: int,
    cursor: str | None = None,
    now: datetime | None = None,
    route: str = "releases",
) -> Page[Release]:
    """Newest first by ``(created_at, id)``; ``total`` counts every match, ignoring the cursor.
    A cursor is valid only in the list of the same ``route`` and filters.

    A new release has a later ``created_at`` than every listed one, so it enters before the
    first page and never shifts a page a cursor points at.
    """
    now = now if now is not None else utcnow()
    conditions = _conditions(principal, filters, now)
    scope = list_scope(
        route,
        dataset_id=filters.dataset_id,
        status=filters.status,
        mechanism=filters.mechanism,
        created_after=filters.created_after,
        created_before=filters.created_before,
    )
    total = session.execute(
        select(func.count()).select_from(Release).where(*conditions)
    ).scalar_one()
    query = select(Release).where(*conditions)
    if cursor is not None:
        created_at, release_id = parse_time_id_cursor(cursor, CURSOR_KIND, scope)
        query = query.where(
            or_(
                Release.created_at < created_at,
                and_(Release.created_at == created_at, Release.id < release_id),
            )
        )
    rows = list(
        session.execute(
            query.order_by(Release.created_at.desc(), Release.id.desc()).limit(limit + 1)
        ).scalars()
    )
    more = len(rows) > limit
    rows = rows[:limit]
    following = (
        time_id_cursor(CURSOR_KIND, scope, rows[-1].created_at, rows[-1].id) if more else None
    )
    return Page(items=rows, total=total, next=following)


def list_dataset_releases(
    session: Session,
    principal: Principal,
    dataset_id: uuid.UUID,
    filters: ReleaseFilters,
    limit: int,
    cursor: str | None = None,
    now: datetime | None = None,
) -> Page[Release]:
    """The releases of one dataset, for its owner only: 404 for any other owner or analyst (an
    analyst lists their own with ``GET /v1/releases?dataset_id=``)."""
    require_role(principal, "analyst", "owner")
    owner = session.execute(
        select(Dataset.owner_key_id).where(Dataset.id == dataset_id)
    ).scalar_one_or_none()
    if principal.role != "owner" or owner is None or owner != principal.key_id:
        raise NotFound(f"no dataset {dataset_id}")
    scoped = ReleaseFilters(
        dataset_id=dataset_id,
        status=filters.status,
        mechanism=filters.mechanism,
        created_after=filters.created_after,
        created_before=filters.created_before,
    )
    return list_releases(session, principal, scoped, limit, cursor, now, route="dataset_releases")
