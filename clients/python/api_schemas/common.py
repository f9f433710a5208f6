"""Shapes and strict input types shared by every resource.

Input is strict on purpose: a privacy budget is money, so a value is either written the one way
the service documents or refused with a 422 naming the field. ``"1_0"``, ``"١"`` (Arabic-Indic
one), ``"+1"``, ``" 1"``, ``"inf"`` and JSON ``true`` are refused everywhere a number is expected;
NUL and lone surrogates are refused in every string.
"""

from __future__ import annotations

import difflib
import math
import re
from decimal import (
    ROUND_HALF_EVEN,
    Context,
    Decimal,
    DivisionByZero,
    Inexact,
    InvalidOperation,
    Overflow,
    Rounded,
)
from typing import Annotated, Any, ClassVar, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    PlainSerializer,
    StrictBool,
    StrictInt,
    ValidationError,
    WithJsonSchema,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

#: Budgets and costs are stored as NUMERIC(38, 30) (service/db/types.py): at most 38 significant
#: digits, 30 of them after the point, so at most 8 before it.
BUDGET_DIGITS = 38
BUDGET_PLACES = 30

#: The one decimal context of every budget computation (ledger sums, differences, comparisons,
#: canonical text). A sum of m stored values needs at most 38 + log10(m) digits; 80 digits hold
#: sums of up to 10^42 entries exactly. Inexact and Rounded are trapped: an operation that would
#: round raises instead of silently moving budget.
BUDGET_CONTEXT = Context(
    prec=80,
    rounding=ROUND_HALF_EVEN,
    Emax=999_999,
    Emin=-999_999,
    traps=[InvalidOperation, DivisionByZero, Overflow, Inexact, Rounded],
)

#: The decimal text the API accepts: ASCII digits, an optional minus sign, an optional fraction
#: and an optional exponent of at most 4 digits ("0.5", "10", "1e-6", "2.5E3"). No "+", spaces,
#: "_", ".5", "1.", "inf" or "nan", and no non-ASCII digits: Python's Decimal() and float()
#: accept all of those.
DECIMAL_PATTERN = r"^-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]{1,4})?$"
DECIMAL_MAX_LENGTH = 64
_DECIMAL_RE = re.compile(DECIMAL_PATTERN, re.ASCII)


def canonical_decimal(value: Decimal) -> str:
    """Plain notation, no trailing zeros: the same text on every database ("0.000009", "1")."""
    text = format(BUDGET_CONTEXT.normalize(value), "f")
    return "0" if text in ("-0", "0") else text


def format_budget(value: Decimal | float | int) -> str:
    """How every text writes an epsilon or a delta (CLI tables, API messages and reasons): the
    plain notation of the JSON ("0.0000001", "0.5"), never "1E-7" (``str`` of a Decimal) or
    "1e-07" (``:g`` of a float). A float (a mechanism's share of a budget, rounded down to a
    float) is written to 6 significant digits, as ``:g`` would: 0.09999999999999999 is "0.1"."""
    if isinstance(value, float):
        if not math.isfinite(value):
            return repr(value)
        value = Decimal(f"{value:.6g}")
    return canonical_decimal(Decimal(value))


def budget_storable(value: Decimal) -> str | None:
    """Why the ledger cannot store ``value`` exactly, or None if it can."""
    if not value.is_finite():
        return "must be a finite number"
    if value.is_zero():
        return None
    exponent = int(value.as_tuple().exponent)
    digits = value.as_tuple().digits
    # Trailing zeros carry no value: 1.000...0 with 40 places is exactly 1.
    trailing = len(digits) - len("".join(map(str, digits)).rstrip("0"))
    places = -(exponent + trailing)
    if places > BUDGET_PLACES:
        return f"at most {BUDGET_PLACES} decimal places (the ledger stores no more)"
    if value.adjusted() >= BUDGET_DIGITS - BUDGET_PLACES:
        return f"at most {BUDGET_DIGITS - BUDGET_PLACES} digits before the decimal point"
    return None


def _decimal_text(value: str) -> str:
    if len(value) > DECIMAL_MAX_LENGTH:
        raise ValueError(f"at most {DECIMAL_MAX_LENGTH} characters")
    if not _DECIMAL_RE.fullmatch(value):
        raise ValueError("must be a plain decimal number in ASCII digits, such as 0.5, 10 or 1e-6")
    return value


def _strict_decimal(value: Any) -> Any:
    """A JSON number, or a string in the documented decimal notation; never a boolean."""
    if isinstance(value, bool):
        raise ValueError("must be a number, not a boolean")
    if isinstance(value, Decimal):
        return value
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, float):
        # A JSON number is taken as its shortest decimal text: 0.1 means 0.1, not the double.
        # NaN and infinities pass through to be refused as not finite.
        return Decimal(repr(value)) if math.isfinite(value) else value
    if isinstance(value, str):
        try:
            return Decimal(_decimal_text(value))
        except ArithmeticError:  # an exponent beyond Decimal's own range
            raise ValueError("out of range") from None
    raise ValueError("must be a number or a decimal string")


def _strict_float(value: Any) -> Any:
    """A JSON number, or a string in the documented decimal notation; never a boolean."""
    if isinstance(value, bool):
        raise ValueError("must be a number, not a boolean")
    if isinstance(value, str):
        return float(_decimal_text(value))
    return value


def _storable(value: Decimal) -> Decimal:
    problem = budget_storable(value)
    if problem is not None:
        raise ValueError(problem)
    return value


#: An exact decimal, serialised as a canonical string so that no precision is lost in JSON.
ExactDecimal = Annotated[
    Decimal, PlainSerializer(canonical_decimal, return_type=str, when_used="json")
]

#: A budget or cost in a request: strictly parsed and exactly storable by the ledger. Give its
#: bounds with ``Field`` and the same bounds to :func:`number_schema`, which documents them.
StrictDecimal = Annotated[Decimal, BeforeValidator(_strict_decimal), AfterValidator(_storable)]

#: A finite float given as a JSON number or as a decimal string (form fields).
StrictFloat = Annotated[float, BeforeValidator(_strict_float), Field(allow_inf_nan=False)]

_JSON_BOUNDS = {
    "gt": "exclusiveMinimum",
    "ge": "minimum",
    "lt": "exclusiveMaximum",
    "le": "maximum",
}


def number_schema(**bounds: float) -> WithJsonSchema:
    """The JSON schema of a strict number with these bounds (``gt``, ``ge``, ``lt``, ``le``): a
    JSON number within them, or a string in the decimal notation (whose value must lie within
    them too; JSON Schema cannot say so of a string)."""
    number: dict[str, Any] = {"type": "number"}
    number.update({_JSON_BOUNDS[name]: value for name, value in bounds.items()})
    text = {"type": "string", "pattern": DECIMAL_PATTERN, "maxLength": DECIMAL_MAX_LENGTH}
    return WithJsonSchema({"anyOf": [number, text]})


_SURROGATE = re.compile(r"[\ud800-\udfff]")
#: One line of text: no C0/C1 control character except tab.
LINE_PATTERN = r"^[^\x00-\x08\x0a-\x1f\x7f-\x9f]*$"
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")


def _safe_text(value: str) -> str:
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    if _SURROGATE.search(value):
        raise ValueError("must be valid Unicode (no lone surrogates)")
    return value


def _one_line(value: str) -> str:
    if _CONTROL.search(value):
        raise ValueError("must be one line of text without control characters")
    return value


#: Text that can be stored and logged anywhere: no NUL, no lone surrogate (PostgreSQL refuses
#: both, and a surrogate cannot be encoded as UTF-8). Every string field of a request uses it.
SafeStr = Annotated[str, AfterValidator(_safe_text)]

#: A column's name (of Parquet objects registered by reference): safe text, 1 to 200
#: characters, its length checked as a string's before the text check (after it, pydantic's
#: generic length check refused 201 characters as "at most 200 items").
ColumnName = Annotated[str, Field(min_length=1, max_length=200), AfterValidator(_safe_text)]

#: A short label (names, mechanism names, keys): safe text on one line, 1 to 200 characters.
Name = Annotated[
    str,
    Field(min_length=1, max_length=200, json_schema_extra={"pattern": LINE_PATTERN}),
    AfterValidator(_safe_text),
    AfterValidator(_one_line),
]

#: An ``Idempotency-Key`` header: 1 to 200 visible ASCII characters (a UUID, "order-17").
TOKEN_PATTERN = r"^[!-~]+$"
_TOKEN = re.compile(TOKEN_PATTERN, re.ASCII)


def _token(value: str) -> str:
    if not _TOKEN.fullmatch(value):
        raise ValueError("must be visible ASCII characters only (no spaces or control characters)")
    return value


IdempotencyKey = Annotated[
    str,
    Field(min_length=1, max_length=200, json_schema_extra={"pattern": TOKEN_PATTERN}),
    AfterValidator(_token),
]

__all__ = [
    "BUDGET_CONTEXT",
    "ColumnName",
    "ErrorBody",
    "ExactDecimal",
    "IdempotencyKey",
    "Name",
    "NamesValidFields",
    "RequestSchema",
    "SafeStr",
    "Schema",
    "StrictBool",
    "StrictDecimal",
    "StrictFloat",
    "StrictInt",
    "budget_storable",
    "canonical_decimal",
    "format_budget",
    "number_schema",
    "unknown_name",
]


class Schema(BaseModel):
    """Base of every API schema."""

    model_config = ConfigDict(from_attributes=True)


def unknown_name(name: str, valid: list[str], what: str = "field") -> str:
    """The message for an unknown ``name``: the nearest valid one (difflib's ratio of at least
    0.6), then every valid one, so a misspelling can be fixed from the answer alone."""
    nearest = difflib.get_close_matches(name, valid, n=1)
    hint = f" (did you mean '{nearest[0]}'?)" if nearest else ""
    return f"unknown {what}{hint}; valid {what}s: {', '.join(sorted(valid)) or 'none'}"


class NamesValidFields(BaseModel):
    """A model with ``extra="forbid"`` whose refusal of an unknown field names the valid fields
    and the nearest one, instead of pydantic's bare "Extra inputs are not permitted"; wherever
    it is validated (a JSON body, a form, nested in another model). The unknown name itself
    stays in the error's location, as with any field. A missing required field is refused
    with what the field is (its description), not pydantic's bare "Field required"."""

    #: Added to the refusal of an unknown field (e.g. where a field of a nested object goes).
    unknown_field_hint: ClassVar[str] = ""

    @model_validator(mode="wrap")
    @classmethod
    def _name_valid_fields(cls, data: Any, handler: ModelWrapValidatorHandler[Self]) -> Self:
        try:
            return handler(data)
        except ValidationError as exc:
            errors = exc.errors()
            # Only this model's own unknown or missing keys (location of length 1); nested
            # models named theirs already.
            own = ("extra_forbidden", "missing")
            if not any(e["type"] in own and len(e["loc"]) == 1 for e in errors):
                raise
            valid = [info.alias or name for name, info in cls.model_fields.items()]
            by_name = {info.alias or name: info for name, info in cls.model_fields.items()}
            rebuilt: list[InitErrorDetails] = []
            for error in errors:
                message = error["msg"]
                if error["type"] == "extra_forbidden" and len(error["loc"]) == 1:
                    message = unknown_name(str(error["loc"][0]), valid) + cls.unknown_field_hint
                elif error["type"] == "missing" and len(error["loc"]) == 1:
                    info = by_name.get(str(error["loc"][0]))
                    if info is not None and info.description:
                        message = f"required: {info.description}"
                # Messages are kept as they were made (a rebuilt error would restate the default).
                rebuilt.append(
                    InitErrorDetails(
                        type=PydanticCustomError(error["type"], message),
                        loc=error["loc"],
                        input=error["input"],
                    )
                )
            raise ValidationError.from_exception_data(exc.title, rebuilt) from None


class RequestSchema(Schema, NamesValidFields):
    """Base of request bodies and forms: an unknown field (a misspelt ``epsilonn``) is refused,
    not silently ignored, with the valid fields and the nearest one named."""

    model_config = ConfigDict(from_attributes=True, extra="forbid")


class ErrorBody(Schema):
    """Every 4xx (and 5xx) response has this body."""

    error: str = Field(
        description="Machine-readable error code, e.g. `budget_exceeded`, `not_found`."
    )
    detail: str = Field(description="Human-readable explanation: which field, and what was wrong.")


class Health(Schema):
    """Liveness and readiness answers."""

    status: str = Field(description="`ok` when healthy.")


class Readiness(Health):
    """Readiness: the database answers, and how many workers are alive to compute releases."""

    workers_alive: int = Field(
        description="Worker processes whose heartbeat was renewed within "
        "`DPSS_WORKER_LEASE_SECONDS`. 0: no release is being computed; queued releases wait "
        "until a worker starts (`dpss worker`, or `dpss serve`, which runs one).",
        ge=0,
    )
