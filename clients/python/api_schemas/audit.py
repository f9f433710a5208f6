"""The hash-chained audit log."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from pydantic import Field

from api_schemas.common import Schema


class AuditEvent(Schema):
    """One audit event."""

    seq: int = Field(description="Position in the chain, from 1.")
    event_type: str = Field(
        description=(
            "e.g. `dataset_created`, `release_requested`, `release_succeeded`, `key_revoked`."
        )
    )
    actor_key_id: UUID | None = Field(
        description="The API key that caused it (null for the service itself)."
    )
    dataset_id: UUID | None = Field(description="Dataset concerned, if any.")
    release_id: UUID | None = Field(description="Release concerned, if any.")
    created_at: datetime = Field(description="When it happened (UTC).")
    details: dict[str, Any] = Field(
        description="Parameters, cost, basis SHA-256 and so on; never data values."
    )
    prev_hash: str = Field(description="Hash of the previous event (64 zeros for the first).")
    hash: str = Field(description="SHA-256 over prev_hash and this event's canonical JSON.")


class AuditPage(Schema):
    """A page of audit events in chain order."""

    items: list[AuditEvent] = Field(description="Events with seq > after, ascending.")
    next_after: int | None = Field(
        description="Pass as `after` for the next page; null at the end (kept for old clients)."
    )
    total: int = Field(description="How many events the chain holds in all (from seq 1).")
    next: str | None = Field(
        description=(
            "Opaque cursor of the next page: pass it unchanged as `cursor` (the same page as "
            "`after=next_after`). Null at the end."
        )
    )
