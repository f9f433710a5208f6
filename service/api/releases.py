"""Release requests and results."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Header
from sqlalchemy.orm import Session

from api_schemas.common import ErrorBody, IdempotencyKey
from api_schemas.releases import BudgetExceeded, Release, ReleaseRequest
from service import releases
from service.api.deps import SettingsDep, UnitOfWorkDep
from service.api.presenters import release_out
from service.api.routing import GuardedRoute
from service.auth import Principal

router = APIRouter(prefix="/v1", tags=["releases"], route_class=GuardedRoute)


@router.post(
    "/datasets/{dataset_id}/releases",
    status_code=202,
    response_model=Release,
    summary="Request a private release (analyst); charged now, computed by a worker.",
    responses={
        401: {"model": ErrorBody, "description": "Missing or invalid API key."},
        403: {
            "model": ErrorBody,
            "description": "Only analysts request releases; `grant_required` when "
            "DPSS_GRANTS_REQUIRED is set and the key has no grant on the dataset.",
        },
        404: {"model": ErrorBody, "description": "No such dataset."},
        409: {
            "model": BudgetExceeded,
            "description": "`budget_exceeded` (which budget, `grant` or `dataset`, and its "
            "remaining), "
            "`idempotency_conflict`, or `dataset_deleted`. Nothing is charged.",
        },
        422: {
            "model": ErrorBody,
            "description": "Invalid mechanism or parameters, or a release whose memory "
            "estimate exceeds the worker limit. Nothing is charged.",
        },
    },
)
async def create_release(
    dataset_id: uuid.UUID,
    body: ReleaseRequest,
    uow: UnitOfWorkDep,
    settings: SettingsDep,
    idempotency_key: IdempotencyKey | None = Header(
        default=None,
        description="Retries with the same key and body return the same release, charged once.",
    ),
) -> Release:
    def work(session: Session, principal: Principal) -> Release:
        release = releases.request_release(
            session, principal, dataset_id, body, idempotency_key, settings
        )
        return release_out(release, principal)

    return await uow(work)


@router.get(
    "/releases/{release_id}",
    response_model=Release,
    summary="A release's status and, when finished, its result.",
    responses={404: {"model": ErrorBody, "description": "No such release (or not yours)."}},
)
async def get_release(release_id: uuid.UUID, uow: UnitOfWorkDep) -> Release:
    def work(session: Session, principal: Principal) -> Release:
        return release_out(releases.get_release(session, principal, release_id), principal)

    return await uow(work)
