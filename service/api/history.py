"""Release history: list releases (analysts their own, owners their datasets')."""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from pydantic import AfterValidator, BeforeValidator
from sqlalchemy.orm import Session

from api_schemas.common import ErrorBody, Name
from api_schemas.history import ReleasePage
from api_schemas.releases import ReleaseStatus
from service import history, visibility
from service.api.deps import CanonicalUUID, Cursor, DatasetId, UnitOfWorkDep
from service.api.presenters import release_out
from service.api.routing import GuardedRoute
from service.auth import Principal
from service.db import models
from service.db.models import utcnow
from service.pagination import Page

router = APIRouter(prefix="/v1", tags=["releases"], route_class=GuardedRoute)


_ISO_DATE = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}[T ]", re.ASCII)


def _iso_text(value: object) -> object:
    """Only ISO 8601 text: pydantic would also take ``0.5`` as a Unix time."""
    if not isinstance(value, str) or not _ISO_DATE.match(value):
        raise ValueError("must be an ISO 8601 date and time, such as 2026-01-31T12:00:00Z")
    return value


def _aware(value: datetime) -> datetime:
    if value.tzinfo is None:
        raise ValueError("must include a time zone, such as 2026-01-31T12:00:00Z")
    try:
        # The comparison with the stored UTC times converts this one to UTC: at the ends of
        # the calendar (9999-12-31T23:59-23:59, 0001-01-01T00:00+23:59) that overflows, and
        # the OverflowError was a 500.
        value.astimezone(UTC)
    except OverflowError:
        raise ValueError(
            "is outside the calendar in UTC: give a time between 0001-01-01 and 9999-12-31 UTC"
        ) from None
    return value


Moment = Annotated[datetime, BeforeValidator(_iso_text), AfterValidator(_aware)]


ReleaseLimit = Annotated[
    int, Query(ge=1, le=200, description="Page size (at most 200; releases can be large).")
]
StatusFilter = Annotated[
    ReleaseStatus | None,
    Query(
        description=(
            "Only releases with this status as the caller sees it (for analysts, a release "
            "before its `visible_at` is `queued`)."
        )
    ),
]
#: One line of safe text (a NUL reached PostgreSQL, which refuses it: a 500), at most 64
#: characters.
MechanismFilter = Annotated[
    Name | None,
    Query(min_length=1, max_length=64, description="Only releases of this mechanism."),
]
After = Annotated[
    Moment | None,
    Query(description="Only releases created strictly after this time (ISO 8601 with zone)."),
]
Before = Annotated[
    Moment | None,
    Query(description="Only releases created strictly before this time (ISO 8601 with zone)."),
]
WithBasis = Annotated[
    bool,
    Query(
        description=(
            "Include each release's `result.basis` (d x k floats). Off by default: the page "
            "then carries `basis_sha256` and `extras` only; fetch one basis with "
            "`GET /v1/releases/{id}`."
        )
    ),
]


async def release_filters(
    status: StatusFilter = None,
    mechanism: MechanismFilter = None,
    created_after: After = None,
    created_before: Before = None,
) -> history.ReleaseFilters:
    """The filters both history routes take, as query parameters (``async``: no thread hop)."""
    return history.ReleaseFilters(
        status=status,
        mechanism=mechanism,
        created_after=created_after,
        created_before=created_before,
    )


FiltersDep = Annotated[history.ReleaseFilters, Depends(release_filters)]

ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "Missing or invalid API key."},
    403: {"model": ErrorBody, "description": "Only analysts and owners have releases."},
    422: {"model": ErrorBody, "description": "A query parameter is invalid; `detail` names it."},
}


def _page(
    session: Session,
    page: Page[models.Release],
    principal: Principal,
    now: datetime,
    with_basis: bool,
) -> ReleasePage:
    visibility.load_outcomes(session, page.items, principal, now)
    items = [release_out(row, principal, session, now, with_basis) for row in page.items]
    return ReleasePage(items=items, total=page.total, next=page.next)


@router.get(
    "/releases",
    response_model=ReleasePage,
    summary="Release history: an analyst's own releases, or an owner's across their datasets.",
    description=(
        "Newest first, with cursor pagination (`next` -> `cursor`) and a `total`. Releases "
        "appear as `GET /v1/releases/{id}` shows them to the caller."
    ),
    responses=ERRORS,
)
async def list_releases(
    uow: UnitOfWorkDep,
    filters: FiltersDep,
    dataset_id: Annotated[
        CanonicalUUID | None, Query(description="Only releases of this dataset.")
    ] = None,
    limit: ReleaseLimit = 50,
    cursor: Cursor = None,
    with_basis: WithBasis = False,
) -> ReleasePage:
    filters = replace(filters, dataset_id=dataset_id)

    def work(session: Session, principal: Principal) -> ReleasePage:
        now = utcnow()
        page = history.list_releases(session, principal, filters, limit, cursor, now)
        return _page(session, page, principal, now, with_basis)

    return await uow(work)


@router.get(
    "/datasets/{dataset_id}/releases",
    response_model=ReleasePage,
    summary="The releases of one dataset (its owner only).",
    description=(
        "Every analyst's releases of the dataset, newest first, with the filters and "
        "pagination of `GET /v1/releases`. 404 for anyone but the dataset's owner."
    ),
    responses={
        **ERRORS,
        403: {"model": ErrorBody, "description": "The key's role may not do this."},
        404: {"model": ErrorBody, "description": "No such dataset (or not yours)."},
    },
)
async def list_dataset_releases(
    dataset_id: DatasetId,
    uow: UnitOfWorkDep,
    filters: FiltersDep,
    limit: ReleaseLimit = 50,
    cursor: Cursor = None,
    with_basis: WithBasis = False,
) -> ReleasePage:

    def work(session: Session, principal: Principal) -> ReleasePage:
        now = utcnow()
        page = history.list_dataset_releases(
            session, principal, dataset_id, filters, limit, cursor, now
        )
        return _page(session, page, principal, now, with_basis)

    return await uow(work)
