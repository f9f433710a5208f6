"""Requests and answers on the wire: the exact decimal cost fields and release filters a
request sends, and the models (with ``basis`` lists) an answer is parsed into.
"""

from __future__ import annotations

import base64
import hashlib
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Final, TypeVar
from uuid import UUID

import httpx
from pydantic import BaseModel, ValidationError

from api_schemas.releases import Release
from dpss_client.errors import DpssError, ServerError

if TYPE_CHECKING:
    # numpy is imported where a basis or an array is handled: the commands that only list,
    # show or grant (and `dpss --help`) start without it (bench/bench_cli_startup.py).
    import numpy as np
    from numpy.typing import NDArray


_M = TypeVar("_M", bound=BaseModel)


Number = Decimal | str | int | float


# --------------------------------------------------------------------------------------------
# Helpers


def cost_fields(**amounts: Number | None) -> dict[str, str]:
    """The cost fields of a request or grant, those given, as exact decimal text: ``epsilon``
    and ``delta`` (a ``basic`` dataset, or a single-release target elsewhere), ``mu``
    (``gaussian`` datasets) or ``rho`` with ``delta`` (``zcdp`` datasets)."""
    return {name: _decimal_str(value, name) for name, value in amounts.items() if value is not None}


def _decimal_str(value: Number, field: str) -> str:
    """Exact decimal text for epsilon/delta/budgets (floats go through their shortest repr)."""
    if isinstance(value, bool):
        raise TypeError(f"{field} must be a number, not a bool")
    try:
        # float(value): numpy's float64 is a float whose repr is "np.float64(0.1)".
        dec = (
            Decimal(repr(float(value))) if isinstance(value, float) else Decimal(str(value).strip())
        )
    except InvalidOperation:
        raise ValueError(f"{field} must be a decimal number, got {value!r}") from None
    if not dec.is_finite():
        raise ValueError(f"{field} must be finite, got {value!r}")
    return str(dec)


def basis_sha256(basis: NDArray[np.float64]) -> str:
    """SHA-256 of a basis as the service stores it: little-endian float64, row-major."""
    import numpy as np

    return hashlib.sha256(np.ascontiguousarray(basis, dtype="<f8").tobytes()).hexdigest()


def _release_filters(
    dataset_id: UUID | str | None,
    status: str | None,
    mechanism: str | None,
    created_after: datetime | None,
    created_before: datetime | None,
    with_basis: bool,
) -> dict[str, str]:
    query: dict[str, str] = {}
    if dataset_id is not None:
        query["dataset_id"] = str(dataset_id)
    if status is not None:
        query["status"] = status
    if mechanism is not None:
        query["mechanism"] = mechanism
    for name, moment in (("created_after", created_after), ("created_before", created_before)):
        if moment is not None:
            if moment.tzinfo is None:
                raise ValueError(f"{name} must be timezone-aware (e.g. datetime.now(UTC))")
            query[name] = moment.isoformat()
    if with_basis:
        query["with_basis"] = "true"
    return query


def _parse(response: httpx.Response, model: type[_M]) -> _M:
    try:
        parsed = model.model_validate_json(response.content)
    except ValidationError as exc:
        raise ServerError(
            "bad_response",
            f"{response.request.method} {response.request.url.path} answered "
            f"{response.status_code} with a body that is not a {model.__name__}: {exc}",
            response.status_code,
        ) from exc
    if isinstance(parsed, Release):
        return _with_basis_lists(parsed, response)  # type: ignore[return-value]
    return parsed


#: Asked of every read of a release: the basis as its stored bytes (``basis_base64``), which
#: :func:`_parse` turns into the ``basis`` lists a caller reads, as the service would have
#: written them; reading bytes costs a tenth of parsing their decimal text. A service without
#: ``basis_format`` ignores it and writes the lists.
RELEASE_READ: Final[dict[str, str]] = {"basis_format": "base64"}


def _unknown_query(error: DpssError, name: str) -> bool:
    """Whether ``error`` is the service refusing the query parameter ``name`` as unknown (a
    version without it; refused before anything is charged)."""
    return error.status == 422 and f"query.{name}: unknown parameter" in (error.detail or "")


def _with_basis_lists(info: Release, response: httpx.Response) -> Release:
    """``info`` with a ``basis_base64`` answer decoded into ``basis`` (the same numbers)."""
    import numpy as np

    result = info.result
    if result is None or result.basis_base64 is None:
        return info
    try:
        data = base64.b64decode(result.basis_base64, validate=True)
        rows, cols = result.basis_shape or (0, 0)
        basis = np.frombuffer(data, dtype="<f8").reshape(rows, cols)
    except (ValueError, TypeError) as exc:
        raise ServerError(
            "bad_response",
            f"{response.request.method} {response.request.url.path} answered a basis_base64 "
            f"that is not a {result.basis_shape} float64 array: {exc}",
            response.status_code,
        ) from exc
    shown = result.model_copy(
        update={"basis": basis.tolist(), "basis_base64": None, "basis_shape": None}
    )
    return info.model_copy(update={"result": shown})
