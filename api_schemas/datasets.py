"""Datasets and their budgets."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from uuid import UUID

from pydantic import Field

from api_schemas.common import ExactDecimal, Schema


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
    n_rows: int = Field(description="Number of rows (individuals); public.")
    n_cols: int = Field(description="Number of columns (dimension d); public.")
    row_norm_bound: float | None = Field(
        description="Public bound C on row norms declared by the owner, used as default clip norm."
    )
    budget: Budget = Field(description="Current budget.")
    created_at: datetime = Field(description="Upload time (UTC).")


class DatasetList(Schema):
    """A page of datasets, newest first."""

    items: list[Dataset] = Field(description="The datasets on this page.")


class DatasetCreate(Schema):
    """Form fields of `POST /v1/datasets` (sent as multipart form fields next to `file`)."""

    name: str = Field(min_length=1, max_length=200, description="A name for the dataset.")
    epsilon_budget: Decimal = Field(
        gt=0, le=1_000_000, allow_inf_nan=False, description="Total epsilon all releases may spend."
    )
    delta_budget: Decimal = Field(
        ge=0, lt=1, allow_inf_nan=False, description="Total delta all releases may spend."
    )
    row_norm_bound: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description=(
            "Public bound C on row norms, the default clip norm of releases. Declare it from "
            "domain knowledge; it must not be computed from the data."
        ),
    )
