"""Datasets: upload, metadata, budget, delete."""

from __future__ import annotations

import uuid
from typing import Any

from fastapi import APIRouter, Query, Request, Response
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from api_schemas.common import ErrorBody
from api_schemas.datasets import Budget, Dataset, DatasetCreate, DatasetList
from service import datasets
from service.api.deps import PrincipalDep, SessionDep, SettingsDep, StoreDep
from service.api.multipart import receive_upload
from service.api.presenters import budget_out, dataset_out
from service.auth import require_role
from service.errors import InvalidInput

router = APIRouter(prefix="/v1/datasets", tags=["datasets"])

ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "Missing or invalid API key."},
    403: {"model": ErrorBody, "description": "The key's role may not do this."},
    404: {"model": ErrorBody, "description": "No such dataset (or not yours)."},
}

UPLOAD_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file", "name", "epsilon_budget", "delta_budget"],
                    "properties": {
                        "file": {
                            "type": "string",
                            "format": "binary",
                            "description": (
                                "The matrix, one row per individual: .csv (numeric, header "
                                "optional), .npy (2-D numeric, no pickles) or .parquet (numeric "
                                "columns). The file name's suffix selects the format."
                            ),
                        },
                        **{
                            name: {"type": "string", "description": info.description}
                            for name, info in DatasetCreate.model_fields.items()
                        },
                    },
                }
            }
        },
    }
}


@router.post(
    "",
    status_code=201,
    response_model=Dataset,
    summary="Upload a dataset with its privacy budget (owner).",
    openapi_extra=UPLOAD_BODY,
    responses={
        **ERRORS,
        413: {"model": ErrorBody, "description": "Larger than DPSS_MAX_UPLOAD_MB."},
        422: {"model": ErrorBody, "description": "Invalid file or form field; nothing is kept."},
    },
)
async def create_dataset(
    request: Request,
    session: SessionDep,
    store: StoreDep,
    settings: SettingsDep,
    principal: PrincipalDep,
) -> Dataset:
    require_role(principal, "owner")
    form = await receive_upload(request, store, settings.max_upload_bytes)
    try:
        try:
            fields = DatasetCreate.model_validate(form.fields)
        except ValidationError as exc:
            raise InvalidInput.from_validation(exc, fallback="form") from None
        assert form.file_path is not None
        dataset = await run_in_threadpool(
            datasets.create_dataset,
            session,
            store,
            principal,
            fields,
            form.file_path,
            form.file_suffix,
        )
        return await run_in_threadpool(dataset_out, session, dataset)
    finally:
        form.discard()


@router.get(
    "",
    response_model=DatasetList,
    summary="List datasets (owner: own; analyst: all).",
    responses=ERRORS,
)
def list_datasets(
    session: SessionDep,
    principal: PrincipalDep,
    limit: int = Query(100, ge=1, le=1000, description="Page size."),
    offset: int = Query(0, ge=0, description="Items to skip."),
) -> DatasetList:
    rows = datasets.list_datasets(session, principal, limit, offset)
    return DatasetList(items=[dataset_out(session, row) for row in rows])


@router.get(
    "/{dataset_id}",
    response_model=Dataset,
    summary="Dataset metadata (never data values).",
    responses=ERRORS,
)
def get_dataset(dataset_id: uuid.UUID, session: SessionDep, principal: PrincipalDep) -> Dataset:
    return dataset_out(session, datasets.get_dataset(session, principal, dataset_id))


@router.get(
    "/{dataset_id}/budget",
    response_model=Budget,
    summary="The dataset's privacy budget.",
    responses=ERRORS,
)
def get_budget(dataset_id: uuid.UUID, session: SessionDep, principal: PrincipalDep) -> Budget:
    return budget_out(session, datasets.get_dataset(session, principal, dataset_id))


@router.delete(
    "/{dataset_id}",
    status_code=204,
    summary="Delete a dataset's rows (owner); the ledger and audit log stay.",
    responses=ERRORS,
)
def delete_dataset(
    dataset_id: uuid.UUID, session: SessionDep, store: StoreDep, principal: PrincipalDep
) -> Response:
    datasets.delete_dataset(session, store, principal, dataset_id)
    return Response(status_code=204)
