"""Datasets and their budgets."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from uuid import UUID

from pydantic import Field

from api_schemas.common import Schema


class Budget(Schema):
    """A dataset's privacy budget. Values are exact decimals serialised as strings."""

    epsilon_total: Decimal = Field(description="Total epsilon the owner granted.")
    delta_total: Decimal = Field(description="Total delta the owner granted.")
    epsilon_spent: Decimal = Field(description="Epsilon charged by releases (net of refunds).")
    delta_spent: Decimal = Field(description="Delta charged by releases (net of refunds).")
    epsilon_remaining: Decimal = Field(description="epsilon_total - epsilon_spent.")
    delta_remaining: Decimal = Field(description="delta_total - delta_spent.")


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
