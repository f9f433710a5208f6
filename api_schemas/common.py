"""Shapes shared by every resource."""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, PlainSerializer


def canonical_decimal(value: Decimal) -> str:
    """Plain notation, no trailing zeros: the same text on every database ("0.000009", "1")."""
    text = format(value.normalize(), "f")
    return "0" if text in ("-0", "0") else text


#: An exact decimal, serialised as a canonical string so that no precision is lost in JSON.
ExactDecimal = Annotated[
    Decimal, PlainSerializer(canonical_decimal, return_type=str, when_used="json")
]


class Schema(BaseModel):
    """Base of every API schema."""

    model_config = ConfigDict(from_attributes=True)


class ErrorBody(Schema):
    """Every 4xx (and 5xx) response has this body."""

    error: str = Field(
        description="Machine-readable error code, e.g. `budget_exceeded`, `not_found`."
    )
    detail: str = Field(description="Human-readable explanation: which field, and what was wrong.")


class Health(Schema):
    """Liveness and readiness answers."""

    status: str = Field(description="`ok` when healthy.")
