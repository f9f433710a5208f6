"""API keys."""

from __future__ import annotations

from datetime import datetime
from typing import Literal
from uuid import UUID

from pydantic import Field

from api_schemas.common import Name, RequestSchema, Schema

Role = Literal["admin", "owner", "analyst", "auditor"]


class KeyCreate(RequestSchema):
    """Create an API key."""

    role: Role = Field(
        description=(
            "`admin` (keys), `owner` (datasets), `analyst` (releases), `auditor` (audit log)."
        )
    )
    name: Name = Field(description="A label for the key's holder (1 to 200 characters, one line).")


class KeyCreated(Schema):
    """A new key. `key` is shown only here and never again."""

    id: UUID = Field(description="Key id (used in the audit log and to revoke).")
    role: Role = Field(description="The key's role.")
    name: str = Field(description="The label.")
    key: str = Field(description="The secret; send as `Authorization: Bearer <key>`.")


class KeyInfo(Schema):
    """A key without its secret."""

    id: UUID = Field(description="Key id.")
    role: Role = Field(description="The key's role.")
    name: str = Field(description="The label.")
    created_at: datetime = Field(description="Creation time (UTC).")
    revoked_at: datetime | None = Field(description="Revocation time, if revoked.")


class KeyPage(Schema):
    """A page of keys (never their secrets), oldest first by `(created_at, id)`."""

    items: list[KeyInfo] = Field(description="The keys on this page, revoked ones included.")
    total: int = Field(description="How many keys exist in all pages.")
    next: str | None = Field(
        description=(
            "Opaque cursor of the next page: pass it unchanged as `cursor`. Null at the end."
        )
    )
