"""Descriptions of the available mechanisms."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from api_schemas.common import Schema


class MechanismInfo(Schema):
    """One mechanism: what it does, what it costs, what it accepts."""

    name: str = Field(description="Name to use in a release request.")
    title: str = Field(description="Short title.")
    paper: str = Field(description="The paper it implements.")
    summary: str = Field(description="What it assumes and when to use it (see docs/mechanisms.md).")
    cost_rule: str = Field(description="What a release is charged.")
    allows_pure_dp: bool = Field(description="Whether `delta = 0` is accepted.")
    releases_basis: bool = Field(description="Whether the result holds a basis.")
    accountings: list[str] = Field(
        description=(
            "The dataset accountings that can charge it: `basic` and `hybrid` (the default, "
            "whose basic filter charges any release) always; `zcdp` and `gaussian` where its "
            "steps have a proven profile (docs/mechanisms.md, 'Accounting across releases'); "
            "elsewhere a request is refused with 422 naming `accounting`. On a hybrid dataset "
            "a dry run's `admitted_by` says which of its filters would admit a request."
        ),
    )
    params_schema: dict[str, Any] = Field(description="JSON Schema of the `params` object.")


class MechanismList(Schema):
    """All mechanisms."""

    items: list[MechanismInfo] = Field(description="The mechanisms.")
    total: int | None = Field(default=None, description="How many mechanisms are listed.")
    next: str | None = Field(
        default=None,
        description="Cursor of the next page, as on every list; always null: one page.",
    )
