"""Public priors: bases a release may be estimated inside (`/v1/priors`)."""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

from pydantic import Field

from api_schemas.common import Name, RequestSchema, Schema


class PriorCreate(RequestSchema):
    """Form fields of `POST /v1/priors` (multipart, next to the `.npy` `file`)."""

    name: Name | None = Field(default=None, description="A label for the prior (optional).")


class Prior(Schema):
    """A public prior's metadata (never derived from private data: see docs/mechanisms.md)."""

    id: UUID = Field(description="Name it in a release with `params.prior_id`.")
    name: str | None = Field(description="The uploader's label, if any.")
    source: str = Field(
        description="`upload` (POST /v1/priors) or `inline` (a request's `params.prior_basis`)."
    )
    d: int = Field(description="Rows: the number of columns of the datasets it fits.")
    m: int = Field(description="Columns: the dimension of the span releases are estimated in.")
    sha256: str = Field(
        description=(
            "SHA-256 of the basis as little-endian float64, row-major (d x m); recorded in the "
            "params of every release that uses it."
        )
    )
    created_at: datetime = Field(description="When it was stored.")


class PriorWithBasis(Prior):
    """`GET /v1/priors/{id}`: the metadata and the basis itself."""

    basis: list[list[float]] = Field(description="The d x m basis, row by row.")


class PriorList(Schema):
    """A page of priors, newest first."""

    items: list[Prior] = Field(description="The priors on this page.")
    total: int = Field(description="How many priors there are in all pages.")
    next: str | None = Field(
        description="Pass as `cursor` for the next page; null on the last page."
    )
