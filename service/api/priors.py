"""Public priors: upload a basis once, list and read them (analyst or owner keys)."""

from __future__ import annotations

from typing import Any

import anyio.to_thread
from fastapi import APIRouter, Request
from pydantic import ValidationError
from sqlalchemy.orm import Session

from api_schemas.common import ErrorBody
from api_schemas.priors import Prior, PriorCreate, PriorList, PriorWithBasis
from service import priors
from service.api.deps import Cursor, Limit, PriorId, SettingsDep, StoreDep, UnitOfWorkDep
from service.api.multipart import form_body, receive_upload
from service.api.routing import GuardedRoute
from service.auth import Principal, require_role
from service.db import models
from service.errors import InvalidInput

router = APIRouter(prefix="/v1/priors", tags=["priors"], route_class=GuardedRoute)

ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "Missing or invalid API key."},
    403: {"model": ErrorBody, "description": "Only analyst and owner keys use priors."},
}

UPLOAD_BODY = form_body(
    "The basis as a .npy file: a 2-D d x m float array with orthonormal columns "
    "(max |P^T P - I| <= 1e-6), 1 <= m <= d, no pickles. Public data only: never derived from "
    "a dataset's private rows.",
    {"name": "A label (optional)."},
)


def prior_out(row: models.Prior) -> Prior:
    return Prior(
        id=row.id,
        name=row.name,
        source=row.source,
        d=row.n_rows,
        m=row.n_cols,
        sha256=row.sha256,
        created_at=row.created_at,
    )


@router.post(
    "",
    status_code=201,
    response_model=Prior,
    summary="Upload a public prior basis (analyst or owner); name it with params.prior_id.",
    openapi_extra=UPLOAD_BODY,
    responses={
        **ERRORS,
        408: {"model": ErrorBody, "description": "Body not received within the body timeout."},
        413: {"model": ErrorBody, "description": "Larger than DPSS_MAX_UPLOAD_MB."},
        422: {
            "model": ErrorBody,
            "description": "Not a .npy 2-D finite matrix with orthonormal columns and m <= d "
            "(field `file`), or an invalid `name`; nothing is kept.",
        },
    },
)
async def create_prior(
    request: Request, uow: UnitOfWorkDep, store: StoreDep, settings: SettingsDep
) -> Prior:
    """The role before the body; the file streams to ``incoming/``, is read and checked in a
    thread with no session open, and one short transaction stores it."""
    require_role(await uow.principal_before_body(), *priors.ROLES)
    form = await receive_upload(request, store, settings.max_upload_bytes)
    try:
        try:
            fields = PriorCreate.model_validate(form.fields)
        except ValidationError as exc:
            raise InvalidInput.from_validation(exc, fallback="form") from None
        if form.file_path is None:
            raise InvalidInput("file", "required")
        matrix = await anyio.to_thread.run_sync(
            priors.read_upload, form.file_path, form.file_suffix
        )
    finally:
        form.discard()

    def store_it(session: Session, principal: Principal) -> Prior:
        return prior_out(priors.create(session, principal, matrix, fields.name))

    return await uow(store_it)


@router.get(
    "",
    response_model=PriorList,
    summary="List the public priors (analyst or owner), newest first.",
    responses=ERRORS,
)
async def list_priors(uow: UnitOfWorkDep, limit: Limit = 100, cursor: Cursor = None) -> PriorList:
    def work(session: Session, principal: Principal) -> PriorList:
        page = priors.page(session, principal, limit, cursor)
        return PriorList(
            items=[prior_out(row) for row in page.items], total=page.total, next=page.next
        )

    return await uow(work)


@router.get(
    "/{prior_id}",
    response_model=PriorWithBasis,
    summary="A public prior with its basis (analyst or owner).",
    responses={**ERRORS, 404: {"model": ErrorBody, "description": "No such prior."}},
)
async def get_prior(prior_id: PriorId, uow: UnitOfWorkDep) -> PriorWithBasis:
    def work(session: Session, principal: Principal) -> PriorWithBasis:
        row = priors.get(session, principal, prior_id, with_basis=True)
        return PriorWithBasis(**prior_out(row).model_dump(), basis=priors.matrix_of(row).tolist())

    return await uow(work)
