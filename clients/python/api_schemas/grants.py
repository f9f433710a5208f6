"""Grants: an owner's share of a dataset's budget for one analyst key or for every analyst."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal
from uuid import UUID

from pydantic import Field

from api_schemas.common import ExactDecimal, RequestSchema, Schema, StrictDecimal, number_schema


class GrantCreate(RequestSchema):
    """Give an analyst key (or every analyst) a share of the dataset's budget."""

    analyst_key_id: UUID | None = Field(
        default=None,
        description=(
            "The analyst key the grant is for; null or absent: every analyst without a grant "
            "of their own on this dataset."
        ),
    )
    epsilon: Annotated[StrictDecimal, Field(gt=0, le=1000), number_schema(gt=0, le=1000)] | None = (
        Field(
            default=None,
            description=(
                "basic datasets: epsilon the grant may spend, at most the dataset's total: a JSON "
                "number or a decimal string in ASCII digits, at most 30 decimal places."
            ),
        )
    )
    delta: Annotated[StrictDecimal, Field(ge=0, lt=1), number_schema(ge=0, lt=1)] | None = Field(
        default=None,
        description=(
            "Delta the grant may spend (basic: at most the dataset's total; zcdp: with rho, "
            "at most the dataset's delta for mechanisms); at most 30 places."
        ),
    )
    mu: Annotated[StrictDecimal, Field(gt=0), number_schema(gt=0)] | None = Field(
        default=None,
        description="gaussian datasets: the grant's mu (charged as mu^2/2 of the dataset's rho).",
    )
    rho: Annotated[StrictDecimal, Field(gt=0), number_schema(gt=0)] | None = Field(
        default=None, description="gaussian and zcdp datasets: the grant's rho."
    )


class Grant(Schema):
    """A grant, with what its releases have spent (charges less refunds) and what remains."""

    id: UUID = Field(description="Grant id.")
    dataset_id: UUID = Field(description="The dataset whose budget is shared.")
    analyst_key_id: UUID | None = Field(
        description="The analyst key it is for; null: every analyst without a grant of their own."
    )
    epsilon_total: ExactDecimal = Field(description="Epsilon granted.")
    delta_total: ExactDecimal = Field(description="Delta granted.")
    epsilon_spent: ExactDecimal = Field(description="Epsilon charged to the grant, less refunds.")
    delta_spent: ExactDecimal = Field(description="Delta charged to the grant, less refunds.")
    epsilon_remaining: ExactDecimal = Field(
        description="Epsilon the grant could still spend (none once revoked)."
    )
    delta_remaining: ExactDecimal = Field(
        description="Delta the grant could still spend (none once revoked)."
    )
    accounting: Literal["basic", "gaussian", "zcdp"] = Field(
        default="basic", description="The dataset's accounting: the grant's currency."
    )
    rho_total: ExactDecimal | None = Field(
        default=None, description="gaussian and zcdp: rho granted (gaussian: mu^2/2)."
    )
    rho_spent: ExactDecimal | None = Field(
        default=None, description="gaussian and zcdp: rho charged to the grant, less refunds."
    )
    rho_remaining: ExactDecimal | None = Field(
        default=None, description="gaussian and zcdp: rho the grant could still spend."
    )
    created_at: datetime = Field(description="Creation time (UTC).")
    revoked_at: datetime | None = Field(
        description=(
            "Revocation time (UTC), if revoked: no further charges (the keys it covered are "
            "refused with 403 `grant_revoked` until a new grant); spent stays spent."
        )
    )


class GrantList(Schema):
    """A dataset's grants, oldest first, revoked ones included."""

    items: list[Grant] = Field(description="The grants.")
    total: int = Field(description="How many grants the dataset has.")
    next: str | None = Field(
        default=None,
        description=(
            "Cursor of the next page, as on every list; always null: a dataset's grants (one "
            "active per key) come in one page."
        ),
    )
