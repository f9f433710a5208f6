"""Shapes shared by every resource."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class Schema(BaseModel):
    """Base of every API schema."""

    model_config = ConfigDict(from_attributes=True)


class ErrorBody(Schema):
    """Every 4xx (and 5xx) response has this body."""

    error: str = Field(description="Machine-readable error code, e.g. `budget_exceeded`, `not_found`.")
    detail: str = Field(description="Human-readable explanation: which field, and what was wrong.")


class Health(Schema):
    """Liveness and readiness answers."""

    status: str = Field(description="`ok` when healthy.")
