"""Release history: pages of releases."""

from __future__ import annotations

from pydantic import Field

from api_schemas.common import Schema
from api_schemas.releases import Release

TOTAL_DESCRIPTION = "How many items match the filters in all pages (the cursor does not count)."
NEXT_DESCRIPTION = (
    "Opaque cursor of the next page: pass it unchanged as `cursor` with the same filters. "
    "Null on the last page. Items created after the first page was read never appear on a "
    "later page, so a walk neither skips nor repeats an item."
)


class ReleasePage(Schema):
    """A page of releases, newest first by `(created_at, id)`.

    Each release is shown as `GET /v1/releases/{id}` shows it to the caller (analysts see
    `queued` and no outcome before `visible_at`, and never timing fields), except that
    `result.basis` is left out unless `with_basis=true`: `basis_sha256` and `extras` stay.
    """

    items: list[Release] = Field(description="The releases on this page, newest first.")
    total: int = Field(description=TOTAL_DESCRIPTION)
    next: str | None = Field(description=NEXT_DESCRIPTION)
