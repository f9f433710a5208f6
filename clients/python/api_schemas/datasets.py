"""Datasets and their budgets."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated
from uuid import UUID

from pydantic import Field

from api_schemas.common import (
    ExactDecimal,
    Name,
    RequestSchema,
    Schema,
    StrictDecimal,
    StrictFloat,
    number_schema,
)


class Budget(Schema):
    """A dataset's privacy budget. Values are exact decimals serialised as strings."""

    epsilon_total: ExactDecimal = Field(description="Total epsilon the owner granted.")
    delta_total: ExactDecimal = Field(description="Total delta the owner granted.")
    epsilon_spent: ExactDecimal = Field(description="Epsilon charged by releases (net of refunds).")
    delta_spent: ExactDecimal = Field(description="Delta charged by releases (net of refunds).")
    epsilon_remaining: ExactDecimal = Field(description="epsilon_total - epsilon_spent.")
    delta_remaining: ExactDecimal = Field(description="delta_total - delta_spent.")


class Dataset(Schema):
    """Dataset metadata. Never includes data values."""

    id: UUID = Field(description="Dataset id.")
    name: str = Field(description="The owner's name for the dataset.")
    n_rows: int = Field(description="Number of rows (individuals) in all batches so far; public.")
    n_batches: int = Field(
        description=(
            "Number of batches: the upload is batch 0, each `POST /v1/datasets/{id}/rows` adds "
            "one; public."
        )
    )
    n_cols: int = Field(description="Number of columns (dimension d); public.")
    row_norm_bound: float | None = Field(
        description="Public bound C on row norms declared by the owner, used as default clip norm."
    )
    budget: Budget = Field(description="Current budget.")
    created_at: datetime = Field(description="Upload time (UTC).")
    reference: str | None = Field(
        default=None,
        description=(
            "For a dataset registered by reference (`POST /v1/dataset-references`): the "
            "URI of its Parquet objects, which the service reads but does not own. Null for "
            "an uploaded dataset."
        ),
    )


class DatasetBatch(Schema):
    """A batch of rows appended to a dataset (`POST /v1/datasets/{id}/rows`)."""

    dataset_id: UUID = Field(description="The dataset the batch belongs to.")
    seq: int = Field(
        description="The batch's sequence number: 0 is the upload, appends count 1, 2, ..."
    )
    n_rows: int = Field(description="Rows in this batch; public.")
    n_rows_total: int = Field(description="Rows in the dataset with this batch; public.")
    n_batches: int = Field(description="Batches in the dataset with this batch.")
    created_at: datetime = Field(description="When the batch was committed (UTC).")


class DatasetList(Schema):
    """A page of datasets, newest first."""

    items: list[Dataset] = Field(description="The datasets on this page.")
    total: int = Field(description="How many datasets the caller sees in all pages.")
    next: str | None = Field(
        description=(
            "Opaque cursor of the next page: pass it unchanged as `cursor`. Null on the last "
            "page. With `offset` instead of `cursor`, also the cursor after this page."
        )
    )


class DatasetCreate(RequestSchema):
    """Form fields of `POST /v1/datasets` (sent as multipart form fields next to `file`).

    Budgets are decimal strings in ASCII digits ("1", "0.5", "1e-6"), with at most 30 decimal
    places: the ledger stores them exactly, never rounded.
    """

    name: Name = Field(description="A name for the dataset (1 to 200 characters, one line).")
    epsilon_budget: Annotated[
        StrictDecimal, Field(gt=0, le=1_000_000), number_schema(gt=0, le=1_000_000)
    ] = Field(description="Total epsilon all releases may spend (at most 30 decimal places).")
    delta_budget: Annotated[StrictDecimal, Field(ge=0, lt=1), number_schema(ge=0, lt=1)] = Field(
        description="Total delta all releases may spend (at most 30 decimal places)."
    )
    row_norm_bound: Annotated[StrictFloat, Field(gt=0), number_schema(gt=0)] | None = Field(
        default=None,
        description=(
            "Public bound C on row norms, the default clip norm of releases. Declare it from "
            "domain knowledge; it must not be computed from the data."
        ),
    )


class DatasetReferenceCreate(DatasetCreate):
    """JSON body of `POST /v1/dataset-references`: a Parquet dataset that stays where it
    is (object storage or a shared filesystem), with the budget fields of an upload.

    The service reads the objects with the deployment's credentials (never sent here), checks
    every value, and records each object's ETag (or version, or size and modification time);
    a release finding an object changed ends `failed` and is refunded.
    """

    uri: str = Field(
        min_length=1,
        max_length=1000,
        description=(
            "`s3://bucket/prefix/` (every `*.parquet` object under it, in key order; the "
            "endpoint is the deployment's) or an absolute path of a directory or file on a "
            "filesystem the service shares; it must lie under one of the service's "
            "DPSS_REFERENCE_ROOTS."
        ),
    )
    columns: list[Annotated[str, Field(min_length=1, max_length=200)]] = Field(
        min_length=1,
        description="The numeric columns to use, in this order: the dataset's d columns.",
    )
