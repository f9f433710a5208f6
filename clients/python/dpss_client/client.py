"""Python client for the dp-subspace-service HTTP API.

Runs on an analyst's laptop: it needs httpx, numpy, pydantic, rich and ``api_schemas``, and never
imports the server (no FastAPI, SQLAlchemy or database code).

>>> from dpss_client import Client
>>> with Client("http://127.0.0.1:8000", api_key) as dpss:            # doctest: +SKIP
...     ds = dpss.upload("patients.npy", epsilon_budget="1", delta_budget="1e-5",
...                      row_norm_bound=1.0)
...     basis = dpss.release(ds.id, "analyze_gauss", k=3, epsilon="0.5",
...                          delta="1e-6").wait(progress=True)
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import sys
import time
import uuid
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from decimal import Decimal, InvalidOperation
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Self, TypeVar
from uuid import UUID

import httpx
from pydantic import BaseModel, ValidationError

from api_schemas.audit import AuditEvent, AuditPage
from api_schemas.datasets import Budget, Dataset, DatasetBatch, DatasetCreated, DatasetList
from api_schemas.grants import Grant, GrantList
from api_schemas.history import ReleasePage
from api_schemas.keys import KeyCreated, KeyInfo, KeyPage, Role
from api_schemas.mechanisms import MechanismInfo, MechanismList
from api_schemas.priors import Prior, PriorList, PriorWithBasis
from api_schemas.releases import Epoch, EpochList, Release, ReleasePreview, ReleaseStatus
from dpss_client.defaults import DEFAULT_URL as DEFAULT_URL

if TYPE_CHECKING:
    # numpy is imported where a basis or an array is handled: the commands that only list,
    # show or grant (and `dpss --help`) start without it (bench/bench_cli_startup.py).
    import numpy as np
    from numpy.typing import ArrayLike, NDArray

__all__ = [
    "AuthError",
    "BudgetExceededError",
    "Client",
    "ConflictError",
    "DpssError",
    "InvalidRequestError",
    "NoBasisError",
    "NoWorkerWarning",
    "NotFoundError",
    "ReleaseFailed",
    "ReleaseHandle",
    "ReleaseNoResult",
    "ReleaseOutcomeError",
    "ServerError",
    "ServiceTimeoutError",
    "ServiceUnreachableError",
    "WaitTimeoutError",
]

FINISHED: Final[frozenset[str]] = frozenset({"succeeded", "no_result", "failed"})

_M = TypeVar("_M", bound=BaseModel)
_Page = TypeVar("_Page", DatasetList, ReleasePage, KeyPage, PriorList)

#: How ``ReleaseHandle.wait`` pauses between polls; tests swap in one that runs the worker.
_sleep: Callable[[float], None] = time.sleep
#: The longest long poll ``ReleaseHandle.wait`` asks for, seconds (the service allows 30).
LONG_POLL_SECONDS: float = 25.0
#: How long ``ReleaseHandle.wait`` keeps asking a service that does not answer (restarting,
#: say) before it gives up, seconds: the release goes on in the service's database.
RECONNECT_SECONDS: float = 60.0
#: How long a release may stay unfinished before the wait asks the service (``/readyz``)
#: whether any worker is alive, and how often it asks again while none is.
NO_WORKER_CHECK_SECONDS: float = 30.0


class NoWorkerWarning(UserWarning):
    """A release is waiting and the service reports no live worker: nothing will compute it
    until one starts (the API was started alone, or its worker died)."""


Number = Decimal | str | int | float


# --------------------------------------------------------------------------------------------
# Exceptions


class DpssError(Exception):
    """An error reported by (or about reaching) the service.

    ``code`` is the service's machine-readable error code (``budget_exceeded``, ``not_found``,
    ``invalid_parameter``, ...), ``detail`` its human-readable explanation and ``status`` the
    HTTP status (``None`` when no HTTP answer was received).
    """

    def __init__(self, code: str, detail: str, status: int | None = None) -> None:
        super().__init__(f"{code}: {detail}" if detail else code)
        self.code = code
        self.detail = detail
        self.status = status


class AuthError(DpssError):
    """401 (missing or unknown key) or 403 (the key's role may not do this)."""


class NotFoundError(DpssError):
    """404: no such dataset, release or key (or not visible to this key)."""


class InvalidRequestError(DpssError):
    """400, 413 or 422: the request was refused before anything was charged."""


class ConflictError(DpssError):
    """409 other than ``budget_exceeded`` (e.g. an idempotency key reused with another body)."""


class BudgetExceededError(ConflictError):
    """409 ``budget_exceeded``: the release would overspend; nothing was charged."""

    def __init__(
        self,
        code: str,
        detail: str,
        status: int | None,
        epsilon_remaining: Decimal | None,
        delta_remaining: Decimal | None,
        budget: str = "dataset",
        grant_id: UUID | None = None,
        rho_remaining: Decimal | None = None,
        mu_remaining: Decimal | None = None,
        delta_reserved_for_conversion: Decimal | None = None,
        epsilon_admissible: Decimal | None = None,
        delta_admissible: Decimal | None = None,
        delta_admissible_epsilon: Decimal | None = None,
    ) -> None:
        super().__init__(code, detail, status)
        #: The remaining amounts of the budget that is short: ``budget`` is ``"grant"`` (then
        #: ``grant_id`` names it) or ``"dataset"``; ``rho_remaining`` on gaussian and zcdp
        #: datasets (their currency; gaussian: mu_remaining^2/2), ``mu_remaining`` on
        #: gaussian ones; the same figures as the budget's (``GET .../budget`` or the grant).
        self.epsilon_remaining = epsilon_remaining
        self.delta_remaining = delta_remaining
        self.budget = budget
        self.grant_id = grant_id
        self.rho_remaining = rho_remaining
        self.mu_remaining = mu_remaining
        self.delta_reserved_for_conversion = delta_reserved_for_conversion
        #: The largest epsilon the same request (mechanism, params, delta) is admitted at now,
        #: checked by the service; ``None`` when none is or it was asked in mu or rho. On
        #: hybrid ``epsilon_remaining`` is the spend's statement, not what every kind of
        #: release may ask for.
        self.epsilon_admissible = epsilon_admissible
        #: When no epsilon is admitted at the request's delta: a delta (0 for a mechanism that
        #: allows pure DP, else a smaller one) and the largest epsilon the same request is
        #: admitted at with it now; ``None`` when none is.
        self.delta_admissible = delta_admissible
        self.delta_admissible_epsilon = delta_admissible_epsilon


class ServerError(DpssError):
    """5xx, or an answer the client cannot make sense of."""


class ServiceUnreachableError(DpssError):
    """No HTTP answer: connection refused, DNS failure, timeout (:class:`ServiceTimeoutError`),
    or a connection lost before the answer (code ``connection_lost``)."""

    #: What the caller adds (e.g. that a release goes on), after the detail.
    note: str = ""
    #: False when no connection was made (refused, DNS, connect timeout): the service never
    #: saw the request, so nothing was charged. True when it may have (a connection was made).
    sent: bool = True

    def noted(self, note: str) -> Self:
        """This error with ``note`` after its detail."""
        self.note = note
        self.detail = f"{self.detail}; {note}"
        self.args = (f"{self.code}: {self.detail}",)
        return self


#: How a Python caller allows a slower answer (the command line says its own way).
PYTHON_TIMEOUT_HINT: Final[str] = "Client(url, api_key, timeout=SECONDS)"


class ServiceTimeoutError(ServiceUnreachableError):
    """The service accepted the connection but its answer did not come within the client's
    timeout (code ``read_timeout``; ``write_timeout`` when sending the request took too long):
    it is slow or busy, not down. ``seconds`` is the timeout that passed."""

    def __init__(self, code: str, url: str, seconds: float | None, hint: str) -> None:
        self.url = url
        self.seconds = seconds
        super().__init__(code, self.explain(code, url, seconds, hint), None)

    @staticmethod
    def explain(code: str, url: str, seconds: float | None, hint: str) -> str:
        within = f" within {seconds:g} s" if seconds is not None else " in time"
        what = (
            f"the request to {url} could not be sent{within}"
            if code == "write_timeout"
            else f"connected to {url}, but it sent no answer{within}"
        )
        return (
            f"{what}: the service is slow or busy, not down. Try again in a moment, or allow "
            f"longer with {hint}"
        )

    def with_hint(self, hint: str) -> ServiceTimeoutError:
        """The same error, saying how to allow longer in the caller's terms."""
        again = ServiceTimeoutError(self.code, self.url, self.seconds, hint)
        return again.noted(self.note) if self.note else again


def _read_seconds(timeout: Any, code: str) -> float | None:
    """The seconds of ``timeout`` (an ``httpx.Timeout`` or a number) that just passed."""
    if isinstance(timeout, httpx.Timeout):
        return timeout.write if code == "write_timeout" else timeout.read
    if isinstance(timeout, int | float):
        return float(timeout)
    return None


def transport_error(url: str, exc: httpx.TransportError, timeout: Any) -> ServiceUnreachableError:
    """The typed error for a request that got no HTTP answer: the connection could not be made
    (``unreachable``), was made but the answer was too slow (:class:`ServiceTimeoutError`), or
    was lost before the answer came (``connection_lost``: the service restarted or dropped it)."""
    if isinstance(exc, httpx.ReadTimeout | httpx.WriteTimeout):
        code = "write_timeout" if isinstance(exc, httpx.WriteTimeout) else "read_timeout"
        return ServiceTimeoutError(code, url, _read_seconds(timeout, code), PYTHON_TIMEOUT_HINT)
    if isinstance(exc, httpx.ReadError | httpx.WriteError | httpx.RemoteProtocolError):
        return ServiceUnreachableError(
            "connection_lost",
            f"connected to {url}, but the connection was lost before the answer came (the "
            f"service restarted or closed it): {exc or type(exc).__name__}. Try again; a "
            "release request is safe to repeat with the same Idempotency-Key",
        )
    # httpx raises ConnectError/ConnectTimeout before it writes a byte of the request: the
    # service never saw it, so nothing can have been charged; say so, and what to check.
    connected = not isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout)
    hint = (
        ""
        if connected
        else ". Nothing was sent: is the service running there (`dpss serve` starts one on "
        f"{DEFAULT_URL}) and is the URL right?"
    )
    error = ServiceUnreachableError(
        "unreachable", f"cannot reach {url}: {exc or type(exc).__name__}{hint}"
    )
    error.sent = connected
    return error


class ReleaseOutcomeError(DpssError):
    """Base of the errors raised when a release finished without a basis to return."""

    def __init__(self, code: str, detail: str, release: Release) -> None:
        super().__init__(code, detail, None)
        self.release = release


class ReleaseNoResult(ReleaseOutcomeError):
    """The mechanism declined to release (e.g. no private eigengap); the cost stays charged."""


class ReleaseFailed(ReleaseOutcomeError):
    """The release job failed (see ``release.refunded`` for whether the charge was refunded)."""


class NoBasisError(ReleaseOutcomeError):
    """The release succeeded but its mechanism (e.g. ``spectrum``) releases no basis."""


class RegistrationFailed(DpssError):
    """A dataset by reference whose registration ended ``failed`` (``detail`` says why)."""


class WaitTimeoutError(DpssError):
    """``ReleaseHandle.wait(timeout=...)`` ran out of time; the release keeps running."""


def _decimal_or_none(value: Any) -> Decimal | None:
    try:
        return Decimal(str(value)) if value is not None else None
    except InvalidOperation:
        return None


def _uuid_or_none(value: Any) -> UUID | None:
    try:
        return UUID(str(value)) if value is not None else None
    except ValueError:
        return None


def feature_names(data: Any) -> list[str] | None:
    """The string column names of a table-like input (anything with a ``columns`` attribute,
    e.g. a pandas or polars DataFrame; duck-typed, so neither is needed), as scikit-learn reads
    them: ``None`` when it has none or none is a string; ``TypeError`` when only some are."""
    columns = getattr(data, "columns", None)
    if columns is None or isinstance(columns, str):
        return None
    try:
        names = list(columns)
    except TypeError:
        return None
    strings = [isinstance(name, str) for name in names]
    if not names or not any(strings):
        return None
    if not all(strings):
        kinds = sorted({type(name).__name__ for name in names})
        raise TypeError(
            "column names are supported only when all are strings; these are of types "
            f"{kinds}: convert them, e.g. columns = [str(c) for c in columns]"
        )
    return names


def is_sparse(data: Any) -> bool:
    """Whether ``data`` is a SciPy sparse matrix or array (duck-typed: SciPy is not needed)."""
    return all(hasattr(data, name) for name in ("tocsr", "nnz", "shape"))


def as_rows(data: Any) -> NDArray[Any]:
    """``data`` (any array-like: a NumPy array, nested lists, a DataFrame) as a 2-D array."""
    import numpy as np

    if is_sparse(data):
        # numpy.asarray makes a 0-d object array of it: "must be 2-D, got shape ()" misled.
        raise TypeError(
            f"a sparse matrix {data.shape} is not uploaded as it is: the service stores dense "
            "rows; convert it with .toarray() (mind the memory) or write it to .npy or CSV"
        )
    array = np.asarray(data)
    if array.ndim != 2:
        raise ValueError(f"the array must be 2-D (rows x columns), got shape {array.shape}")
    return array


def _is_path(data: Any) -> bool:
    return isinstance(data, str | os.PathLike)


def error_from_response(response: httpx.Response) -> DpssError:
    """Turn a 4xx/5xx response into the matching typed exception."""
    status = response.status_code
    body: Any
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        code = body["error"]
        detail = body.get("detail")
        detail = detail if isinstance(detail, str) else json.dumps(detail)
    else:
        # Not the service's error shape (a proxy, a framework default): keep what we can.
        code = f"http_{status}"
        if isinstance(body, dict) and "detail" in body:
            detail = (
                json.dumps(body["detail"])
                if not isinstance(body["detail"], str)
                else body["detail"]
            )
        else:
            detail = response.text[:500] or response.reason_phrase
    if status in (401, 403):
        return AuthError(code, detail, status)
    if status == 404:
        return NotFoundError(code, detail, status)
    if status == 409 and code == "budget_exceeded" and isinstance(body, dict):
        return BudgetExceededError(
            code,
            detail,
            status,
            _decimal_or_none(body.get("epsilon_remaining")),
            _decimal_or_none(body.get("delta_remaining")),
            budget=str(body.get("budget", "dataset")),
            grant_id=_uuid_or_none(body.get("grant_id")),
            rho_remaining=_decimal_or_none(body.get("rho_remaining")),
            mu_remaining=_decimal_or_none(body.get("mu_remaining")),
            delta_reserved_for_conversion=_decimal_or_none(
                body.get("delta_reserved_for_conversion")
            ),
            epsilon_admissible=_decimal_or_none(body.get("epsilon_admissible")),
            delta_admissible=_decimal_or_none(body.get("delta_admissible")),
            delta_admissible_epsilon=_decimal_or_none(body.get("delta_admissible_epsilon")),
        )
    if status == 409:
        return ConflictError(code, detail, status)
    if 400 <= status < 500:
        return InvalidRequestError(code, detail, status)
    return ServerError(code, detail, status)


# --------------------------------------------------------------------------------------------
# Streaming a NumPy array as a .npy file


class NpyStream(io.RawIOBase):
    """A read-only, seekable file object whose bytes are ``np.save(array)``'s, made on the fly.

    Only the small ``.npy`` header is built in memory; the array's buffer is read in place
    through a memoryview, so an upload needs neither a temporary file nor a copy of the data
    (unless the array is neither C- nor Fortran-contiguous, when one contiguous copy is made).
    Being seekable with a known length lets httpx send a ``Content-Length``.
    """

    def __init__(self, array: NDArray[Any]) -> None:
        import numpy as np

        super().__init__()
        if array.dtype.hasobject:
            raise ValueError("object arrays cannot be uploaded; use a numeric dtype")
        if array.flags.c_contiguous:
            contiguous, fortran = array, False
        elif array.flags.f_contiguous:
            # The transpose of a Fortran-ordered array is C-ordered over the same memory,
            # and .npy stores exactly that buffer when the header says fortran_order.
            contiguous, fortran = array.T, True
        else:
            contiguous, fortran = np.ascontiguousarray(array), False
        header = np.lib.format.header_data_from_array_1_0(array)
        header["fortran_order"] = fortran
        buf = io.BytesIO()
        try:
            np.lib.format.write_array_header_1_0(buf, header)
        except ValueError:
            buf = io.BytesIO()
            np.lib.format.write_array_header_2_0(buf, header)
        self._header = memoryview(buf.getvalue())
        self._data: memoryview = contiguous.reshape(-1).view(np.uint8).data
        self._size = len(self._header) + len(self._data)
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        out = memoryview(buffer).cast("B")
        written = 0
        while written < len(out) and self._pos < self._size:
            h = len(self._header)
            src = self._header[self._pos :] if self._pos < h else self._data[self._pos - h :]
            n = min(len(src), len(out) - written)
            out[written : written + n] = src[:n]
            written += n
            self._pos += n
        return written


#: ``progress(sent, total)`` after each chunk of an upload's file is read for sending.
UploadProgress = Callable[[int, int], None]


class _Reporting(io.RawIOBase):
    """A file object that tells ``report(sent, total)`` how many of its ``total`` bytes were
    read for sending. Seeking back to the start (httpx measures, then rewinds) restarts the count.
    """

    def __init__(self, inner: Any, total: int, report: UploadProgress) -> None:
        super().__init__()
        self._inner = inner
        self._total = total
        self._report = report
        self._sent = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return int(self._inner.tell())

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        position = int(self._inner.seek(offset, whence))
        self._sent = position
        return position

    def readinto(self, buffer: Any) -> int:
        out = memoryview(buffer).cast("B")
        data = self._inner.read(len(out))
        out[: len(data)] = data
        if data:
            self._sent += len(data)
            self._report(min(self._sent, self._total), self._total)
        return len(data)


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


_CONTENT_TYPES: Final = {
    ".csv": "text/csv",
    ".npy": "application/octet-stream",
    ".parquet": "application/vnd.apache.parquet",
}


def basis_sha256(basis: NDArray[np.float64]) -> str:
    """SHA-256 of a basis as the service stores it: little-endian float64, row-major."""
    import numpy as np

    return hashlib.sha256(np.ascontiguousarray(basis, dtype="<f8").tobytes()).hexdigest()


# --------------------------------------------------------------------------------------------
# The client


class Client:
    """A synchronous client for one service and one API key.

    Parameters
    ----------
    url:
        The service's base URL, e.g. ``http://127.0.0.1:8000``.
    api_key:
        The bearer secret (``dpss keys create`` prints it).
    http:
        An ``httpx.Client`` to send requests with (tests pass a FastAPI ``TestClient``); it is
        not closed by :meth:`close`. By default the client makes and owns one.
    timeout:
        Seconds to wait for each network operation (connect, read, write).
    """

    def __init__(
        self,
        url: str = DEFAULT_URL,
        api_key: str | None = None,
        *,
        http: httpx.Client | None = None,
        timeout: float = 30.0,
    ) -> None:
        self.url = url.rstrip("/")
        self._auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._owns_http = http is None
        self._http = http if http is not None else httpx.Client(timeout=timeout)
        #: Set when the service refused a long poll (a version without them): poll instead.
        self._no_long_poll = False
        #: Set when the service refused ``basis_format`` (a version without it): JSON lists.
        self._no_basis_format = False
        #: Set when the service refused ``wait`` on a release request (a version without it).
        self._no_release_wait = False

    def __deepcopy__(self, memo: dict[int, Any]) -> Client:
        """The same client: a connection (its socket pool, locks and key) is shared, not
        copied. ``copy.deepcopy`` of an object holding it, e.g. scikit-learn's ``clone`` of a
        :class:`~dpss_client.pca.PrivatePCA`, keeps talking to the service through it."""
        return self

    def __copy__(self) -> Client:
        """The same client, as for :meth:`__deepcopy__`."""
        return self

    def __reduce__(self) -> Any:
        """Not picklable, by design and with a reason: a client holds its API key in clear and
        live connections (whose locks ``pickle`` cannot copy anyway). A pickled
        :class:`~dpss_client.pca.PrivatePCA` leaves its client out."""
        raise TypeError(
            "a dpss_client.Client is not pickled: it holds an API key and open connections; "
            "make a new Client(url, api_key) where it is needed"
        )

    def _timeout_plus(self, seconds: float) -> httpx.Timeout:
        """This client's timeouts with ``seconds`` more to read the answer (a long poll)."""
        base = getattr(self._http, "timeout", None)
        if not isinstance(base, httpx.Timeout):
            base = httpx.Timeout(30.0)
        read = None if base.read is None else base.read + seconds
        return httpx.Timeout(base.connect, read=read, write=base.write, pool=base.pool)

    def _long_get(
        self, path: str, model: type[_M], wait: float, params: dict[str, str] | None = None
    ) -> _M | None:
        """``GET path`` as a long poll of ``wait`` seconds; ``None`` when the service refuses
        the ``wait`` parameter (422: a version without long polls), after which this client
        polls instead and never asks it again."""
        try:
            return self._get(
                path,
                model,
                params={**(params or {}), "wait": f"{wait:g}"},
                timeout=self._timeout_plus(wait),
            )
        except InvalidRequestError as exc:
            if exc.status != 422:
                raise
            if params and "basis_format" in params and _unknown_query(exc, "basis_format"):
                self._no_basis_format = True
                rest = {name: value for name, value in params.items() if name != "basis_format"}
                return self._long_get(path, model, wait, rest)
            self._no_long_poll = True
            return None

    def _release_read(self) -> dict[str, str]:
        """The query parameters of a read of a release: :data:`RELEASE_READ` unless the service
        refused it."""
        return {} if self._no_basis_format else dict(RELEASE_READ)

    def _get_release(self, path: str, **kwargs: Any) -> Release:
        """``GET`` a release (``params``, ``timeout`` as for :meth:`_get`) with
        :meth:`_release_read`; asked again without it when the service refuses it (422: a
        version without ``basis_format``)."""
        params = kwargs.pop("params", None) or {}
        try:
            return self._get(path, Release, params={**params, **self._release_read()}, **kwargs)
        except InvalidRequestError as exc:
            if self._no_basis_format or not _unknown_query(exc, "basis_format"):
                raise
            self._no_basis_format = True
            return self._get(path, Release, params=params, **kwargs)

    # Lifecycle ------------------------------------------------------------------------------

    def close(self) -> None:
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # Transport ------------------------------------------------------------------------------

    def _request(
        self,
        method: str,
        path: str,
        *,
        headers: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> httpx.Response:
        try:
            response = self._http.request(
                method, self.url + path, headers={**self._auth, **(headers or {})}, **kwargs
            )
        except httpx.TransportError as exc:
            timeout = kwargs.get("timeout", getattr(self._http, "timeout", None))
            raise transport_error(self.url, exc, timeout) from exc
        if response.status_code >= 400:
            raise error_from_response(response)
        return response

    def _get(self, path: str, model: type[_M], **kwargs: Any) -> _M:
        return _parse(self._request("GET", path, **kwargs), model)

    # Datasets -------------------------------------------------------------------------------

    def upload(
        self,
        data: str | os.PathLike[str] | ArrayLike,
        *,
        name: str | None = None,
        epsilon_budget: Number,
        delta_budget: Number,
        row_norm_bound: float | None = None,
        progress: UploadProgress | None = None,
        accounting: str | None = None,
        mu_budget: Number | None = None,
        rho_budget: Number | None = None,
        delta_conversion: Number | None = None,
        allow_large_delta: bool = False,
        privacy_unit_column: str | int | None = None,
        planned_mechanisms: Sequence[str] | None = None,
        idempotency_key: str | None = None,
    ) -> Dataset:
        """Upload a dataset (owner key) and return its metadata (with ``rows_above_bound``:
        how many of the rows exceed the declared ``row_norm_bound``, shown only here).
        ``allow_large_delta``: accept a ``delta_budget`` above ``1/n`` (refused otherwise: such
        a delta offers no protection). ``privacy_unit_column``: the column naming the person
        each row belongs to (a name, or a 0-based index); it is removed from the features and
        the budget then protects people, not rows (the answer adds ``rows_per_unit``).

        ``data`` is a path to a ``.csv``, ``.npy`` or ``.parquet`` file (streamed from disk; the
        suffix tells the service the format) or any 2-D array-like: a NumPy array (streamed as
        ``.npy`` without a temporary file), nested lists or a DataFrame (``numpy.asarray`` of
        it; a ``privacy_unit_column`` name is then looked up in its string column names).
        ``name`` defaults to the file's stem and is required for arrays.
        ``progress(sent, total)``, if given, is called as the file's bytes are sent.
        ``accounting`` (``hybrid``, ``basic``, ``gaussian`` or ``zcdp``; default: the
        service's) says how releases compose; ``mu_budget``/``rho_budget`` state the derived
        budget directly and ``delta_conversion`` the zcdp split (see the service's
        ``DatasetCreate``).
        ``planned_mechanisms``: the mechanisms the owner plans to use; the answer's
        ``recommended_accounting`` says which accounting fits them (advice only).

        The request carries an ``Idempotency-Key`` (random unless given). When its answer is
        lost on the way (the connection dropped or timed out after the file was sent), the
        file is sent once more with the same key: the service answers with the dataset the
        first request made, never a second dataset with a second budget on the same rows.
        """

        form: dict[str, str] = cost_fields(
            epsilon_budget=epsilon_budget,
            delta_budget=delta_budget,
            mu_budget=mu_budget,
            rho_budget=rho_budget,
            delta_conversion=delta_conversion,
        )
        if accounting is not None:
            form["accounting"] = accounting
        if allow_large_delta:
            form["allow_large_delta"] = "true"
        if planned_mechanisms is not None:
            form["planned_mechanisms"] = ",".join(planned_mechanisms)
        if row_norm_bound is not None:
            form["row_norm_bound"] = repr(float(row_norm_bound))
        if privacy_unit_column is not None:
            form["privacy_unit_column"] = str(privacy_unit_column)
        if not _is_path(data):
            names = feature_names(data)
            array = as_rows(data)
            if name is None:
                raise TypeError("name= is required when uploading an array")
            if isinstance(privacy_unit_column, str) and not privacy_unit_column.isdigit():
                # A .npy file has no column names: send the named column's index.
                if names is None or privacy_unit_column not in names:
                    raise ValueError(
                        f"privacy_unit_column {privacy_unit_column!r} is not one of the "
                        "array's column names; give its 0-based index instead"
                    )
                form["privacy_unit_column"] = str(names.index(privacy_unit_column))
            form["name"] = name
            file_name = f"{name}.npy"
            data = array
        else:
            form["name"] = name if name is not None else Path(data).stem  # type: ignore[arg-type]
            file_name = Path(data).name  # type: ignore[arg-type]
        response = self._post_file("/v1/datasets", data, file_name, form, progress, idempotency_key)
        return _parse(response, DatasetCreated)

    def _post_file(
        self,
        path: str,
        data: Any,
        file_name: str,
        form: dict[str, str] | None,
        progress: UploadProgress | None,
        idempotency_key: str | None,
    ) -> httpx.Response:
        """POST ``data`` (a path, streamed from disk, or a 2-D array, streamed as ``.npy``) as
        the ``file`` part with ``form``, under an ``Idempotency-Key`` (random unless given);
        sent once more with the same key when the answer is lost after the body went out."""
        headers = {"Idempotency-Key": idempotency_key or str(uuid.uuid4())}
        for attempt in (1, 2):
            try:
                if not _is_path(data):
                    with NpyStream(as_rows(data)) as stream:
                        total = stream.seek(0, os.SEEK_END)
                        stream.seek(0)
                        body: Any = (
                            stream if progress is None else _Reporting(stream, total, progress)
                        )
                        files = {"file": (file_name, body, "application/octet-stream")}
                        return self._request("POST", path, data=form, files=files, headers=headers)
                file_path = Path(data)
                content_type = _CONTENT_TYPES.get(
                    file_path.suffix.lower(), "application/octet-stream"
                )
                with file_path.open("rb") as fh:
                    sent: Any = fh
                    if progress is not None:
                        sent = _Reporting(fh, os.fstat(fh.fileno()).st_size, progress)
                    files = {"file": (file_name, sent, content_type)}
                    return self._request("POST", path, data=form, files=files, headers=headers)
            except ServiceUnreachableError as exc:
                # Refused connections never reached the service; anything later may have.
                if attempt == 2 or exc.code == "unreachable":
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def register_reference(
        self,
        uri: str,
        columns: list[str],
        *,
        name: str,
        epsilon_budget: Number,
        delta_budget: Number,
        row_norm_bound: float | None = None,
        allow_large_delta: bool = False,
        wait: bool = True,
        timeout: float | None = None,
    ) -> Dataset:
        """Register a Parquet dataset where it lives (owner key): ``s3://bucket/prefix/`` or a
        shared path under the service's ``DPSS_REFERENCE_ROOTS``, and its numeric ``columns``.
        The service reads it with its own credentials; nothing is uploaded.
        ``allow_large_delta``: accept a ``delta_budget`` above ``1/n`` (refused otherwise).

        The service answers at once with the dataset ``registering`` and a worker reads and
        checks the objects. With ``wait`` (default) this returns once it is ``ready`` (see
        :meth:`wait_registered`, which raises :class:`RegistrationFailed` with the reason if
        it failed); with ``wait=False``, the ``registering`` dataset at once."""
        body: dict[str, Any] = {
            "name": name,
            "uri": uri,
            "columns": list(columns),
            "epsilon_budget": _decimal_str(epsilon_budget, "epsilon_budget"),
            "delta_budget": _decimal_str(delta_budget, "delta_budget"),
        }
        if row_norm_bound is not None:
            body["row_norm_bound"] = float(row_norm_bound)
        if allow_large_delta:
            body["allow_large_delta"] = True
        dataset = _parse(self._request("POST", "/v1/dataset-references", json=body), Dataset)
        if not wait:
            return dataset
        return self.wait_registered(dataset.id, timeout=timeout)

    def wait_registered(
        self,
        dataset_id: UUID | str,
        *,
        timeout: float | None = None,
        poll_interval: float = 0.5,
        max_poll_interval: float = 5.0,
    ) -> Dataset:
        """Poll ``GET /v1/datasets/{id}`` until the dataset's registration has ended; return it
        when ``ready``. Raises :class:`RegistrationFailed` (with the service's reason) when it
        failed, :class:`WaitTimeoutError` after ``timeout`` seconds (it keeps registering).
        Pauses ``poll_interval`` seconds growing x1.5 up to ``max_poll_interval``."""
        start = time.monotonic()
        interval = poll_interval
        while True:
            dataset = self.dataset(dataset_id)
            if dataset.registration_status == "ready":
                return dataset
            if dataset.registration_status == "failed":
                raise RegistrationFailed(
                    "registration_failed",
                    f"dataset {dataset.id}: {dataset.registration_reason or 'no reason given'}",
                )
            elapsed = time.monotonic() - start
            if timeout is not None and elapsed >= timeout:
                raise WaitTimeoutError(
                    "timeout", f"dataset {dataset.id} still registering after {elapsed:.1f} s"
                )
            pause = interval if timeout is None else min(interval, timeout - elapsed)
            _sleep(max(pause, 0.0))
            interval = min(interval * 1.5, max_poll_interval)

    def append_reference_batch(
        self,
        dataset_id: UUID | str,
        uri: str,
        *,
        wait: bool = True,
        timeout: float | None = None,
        poll_interval: float = 0.5,
        max_poll_interval: float = 5.0,
    ) -> Dataset:
        """Append a batch of Parquet objects to a dataset registered by reference (owner key):
        ``uri`` names them as at registration (an object or a prefix under the service's
        ``DPSS_REFERENCE_ROOTS``), with the dataset's columns. A worker reads and checks them
        first; with ``wait`` (default) this returns the dataset once the batch is added (its
        ``n_batches`` one more), raising :class:`RegistrationFailed` with the reason if it was
        refused and :class:`WaitTimeoutError` after ``timeout`` seconds (it keeps
        registering); with ``wait=False``, the dataset with ``batch_status`` registering."""
        path = f"/v1/dataset-references/{dataset_id}/batches"
        dataset = _parse(self._request("POST", path, json={"uri": uri}), Dataset)
        start = time.monotonic()
        interval = poll_interval
        while wait and dataset.batch_status == "registering":
            elapsed = time.monotonic() - start
            if timeout is not None and elapsed >= timeout:
                raise WaitTimeoutError(
                    "timeout",
                    f"dataset {dataset.id}: batch still registering after {elapsed:.1f} s",
                )
            pause = interval if timeout is None else min(interval, timeout - elapsed)
            _sleep(max(pause, 0.0))
            interval = min(interval * 1.5, max_poll_interval)
            dataset = self.dataset(dataset_id)
        if wait and dataset.batch_status == "failed":
            raise RegistrationFailed(
                "registration_failed",
                f"dataset {dataset.id}: batch: {dataset.batch_reason or 'no reason given'}",
            )
        return dataset

    def append_rows(
        self,
        dataset_id: UUID | str,
        data: str | os.PathLike[str] | ArrayLike,
        *,
        progress: UploadProgress | None = None,
        idempotency_key: str | None = None,
    ) -> DatasetBatch:
        """Append a batch of rows to a dataset (owner key); returns the batch with its sequence
        number. ``data`` is a ``.csv``/``.npy``/``.parquet`` path or a 2-D array, as for
        :meth:`upload`, with the dataset's number of columns. All of it is appended or none.
        As :meth:`upload`, under an ``Idempotency-Key`` (random unless given), resent once
        with it when the answer is lost: the batch is appended once."""
        file_name = "rows.npy" if not _is_path(data) else Path(data).name  # type: ignore[arg-type]
        response = self._post_file(
            f"/v1/datasets/{dataset_id}/rows", data, file_name, None, progress, idempotency_key
        )
        return _parse(response, DatasetBatch)

    def datasets(self) -> list[Dataset]:
        """Every dataset this key can see (metadata only), newest first, over all pages."""
        return list(self._pages("/v1/datasets", DatasetList, {}, None))

    def dataset(self, dataset_id: UUID | str) -> Dataset:
        return self._get(f"/v1/datasets/{dataset_id}", Dataset)

    def delete_dataset(self, dataset_id: UUID | str) -> None:
        """Purge a dataset's rows (owner key); its ledger and audit events stay."""
        self._request("DELETE", f"/v1/datasets/{dataset_id}")

    def budget(self, dataset_id: UUID | str) -> Budget:
        return self._get(f"/v1/datasets/{dataset_id}/budget", Budget)

    # Public priors ----------------------------------------------------------------------------

    def upload_prior(self, basis: ArrayLike, *, name: str | None = None) -> Prior:
        """Upload a public prior (analyst or owner key): a ``d x m`` basis with orthonormal
        columns, from public data or a fixed transform, never from the private rows. Name it in
        a release with ``prior_id=str(prior.id)``."""
        import numpy as np

        array = np.asarray(basis, dtype=np.float64)
        if array.ndim != 2:
            raise ValueError(f"the prior must be 2-D (d x m), got shape {array.shape}")
        buffer = io.BytesIO()
        np.save(buffer, np.ascontiguousarray(array), allow_pickle=False)
        form = {"name": name} if name is not None else {}
        response = self._request(
            "POST",
            "/v1/priors",
            data=form,
            files={"file": ("prior.npy", buffer.getvalue(), "application/octet-stream")},
        )
        return _parse(response, Prior)

    def priors(self) -> list[Prior]:
        """Every stored public prior (metadata), newest first, over all pages."""
        return list(self._pages("/v1/priors", PriorList, {}, None))

    def prior(self, prior_id: UUID | str) -> PriorWithBasis:
        """A prior's metadata and basis."""
        return self._get(f"/v1/priors/{prior_id}", PriorWithBasis)

    # Grants ---------------------------------------------------------------------------------

    def create_grant(
        self,
        dataset_id: UUID | str,
        epsilon: Number | None = None,
        delta: Number | None = None,
        *,
        mu: Number | None = None,
        rho: Number | None = None,
        analyst_key_id: UUID | str | None = None,
    ) -> Grant:
        """Give an analyst key (every analyst if ``analyst_key_id`` is None) a share of a
        dataset's budget (owner key), in its currency: ``epsilon, delta`` (basic), ``mu=`` or
        ``rho=`` (gaussian), ``rho=`` with ``delta`` (zcdp). Releases are then charged to the
        grant and the dataset."""
        body: dict[str, Any] = {
            **cost_fields(epsilon=epsilon, delta=delta, mu=mu, rho=rho),
            "analyst_key_id": None if analyst_key_id is None else str(analyst_key_id),
        }
        response = self._request("POST", f"/v1/datasets/{dataset_id}/grants", json=body)
        return _parse(response, Grant)

    def list_grants(self, dataset_id: UUID | str) -> list[Grant]:
        """A dataset's grants, oldest first, each with what it spent and has left (owner key)."""
        return self._get(f"/v1/datasets/{dataset_id}/grants", GrantList).items

    def revoke_grant(self, dataset_id: UUID | str, grant_id: UUID | str) -> Grant:
        """Revoke a grant (owner key): no further charges; what it spent stays spent."""
        response = self._request("DELETE", f"/v1/datasets/{dataset_id}/grants/{grant_id}")
        return _parse(response, Grant)

    # Releases -------------------------------------------------------------------------------

    def release(
        self,
        dataset_id: UUID | str,
        mechanism: str,
        k: int,
        epsilon: Number | None = None,
        delta: Number | None = None,
        *,
        mu: Number | None = None,
        rho: Number | None = None,
        idempotency_key: str | None = None,
        wait: float | None = None,
        **params: Any,
    ) -> ReleaseHandle:
        """Request a release (analyst key); it is queued, and the cost charged, at once.

        ``wait`` seconds (at most :data:`LONG_POLL_SECONDS`): the request itself waits for the
        release (``POST ...?wait=``) and the handle comes back finished when it finished within
        that time (one request instead of the request and a long poll; as ever, an analyst sees
        the outcome only from its ``visible_at`` on), else unfinished (then
        :meth:`ReleaseHandle.wait_finished`). The release's id is known only once the request
        answers; a request whose answer is lost on the way is sent once more with the same
        ``Idempotency-Key`` (the same release, charged once). A service without this long
        poll answers at once, as without ``wait``.

        The cost: ``epsilon, delta`` (on a ``basic`` dataset the charge; elsewhere the single
        release the mechanism is calibrated to, charged its own cost), or ``mu=`` on a
        ``gaussian`` dataset, or ``rho=`` (with ``delta`` for approximate steps) on a ``zcdp``
        one.

        Keyword arguments other than ``idempotency_key`` are the mechanism's parameters (see
        :meth:`mechanisms`). The request carries an ``Idempotency-Key`` (random unless given),
        so sending the same request again with the same key never charges twice.
        """
        body = {
            "mechanism": mechanism,
            "k": k,
            **cost_fields(epsilon=epsilon, delta=delta, mu=mu, rho=rho),
            "params": params,
        }
        key = idempotency_key if idempotency_key is not None else str(uuid.uuid4())
        path, headers = f"/v1/datasets/{dataset_id}/releases", {"Idempotency-Key": key}
        if wait is not None and wait > 0 and not self._no_release_wait:
            seconds = min(wait, LONG_POLL_SECONDS)
            try:
                response = self._request(
                    "POST",
                    path,
                    json=body,
                    headers=headers,
                    params={"wait": f"{seconds:g}", **self._release_read()},
                    timeout=self._timeout_plus(seconds),
                )
                return ReleaseHandle(self, _parse(response, Release))
            except ServiceUnreachableError:
                pass  # charged or not: the same key below gives the same release, or makes it
            except InvalidRequestError as exc:
                # A service from before these parameters refuses them, before any charge.
                if _unknown_query(exc, "wait"):
                    self._no_release_wait = True
                elif _unknown_query(exc, "basis_format"):
                    self._no_basis_format = True
                    return self.release(
                        dataset_id, mechanism, k, epsilon, delta, mu=mu, rho=rho,
                        idempotency_key=key, wait=wait, **params,
                    )  # fmt: skip
                else:
                    raise
        response = self._request("POST", path, json=body, headers=headers)
        return ReleaseHandle(self, _parse(response, Release))

    def preview_release(
        self,
        dataset_id: UUID | str,
        mechanism: str,
        k: int,
        epsilon: Number | None = None,
        delta: Number | None = None,
        *,
        mu: Number | None = None,
        rho: Number | None = None,
        **params: Any,
    ) -> ReleasePreview:
        """What :meth:`release` would cost and use, charging nothing (analyst key).

        The service validates the request exactly as a real one (same errors), and answers
        with the cost, whether the budget covers it (``affordable``), and the noise scales the
        mechanism would use (``scales``) with what they mean (``meaning``). Keyword arguments
        are the mechanism's parameters.
        """
        body = {
            "mechanism": mechanism,
            "k": k,
            **cost_fields(epsilon=epsilon, delta=delta, mu=mu, rho=rho),
            "params": params,
        }
        response = self._request(
            "POST",
            f"/v1/datasets/{dataset_id}/releases",
            params={"dry_run": "true"},
            json=body,
        )
        return _parse(response, ReleasePreview)

    def releases_page(
        self,
        *,
        dataset_id: UUID | str | None = None,
        status: ReleaseStatus | None = None,
        mechanism: str | None = None,
        created_after: datetime | None = None,
        created_before: datetime | None = None,
        limit: int | None = None,
        cursor: str | None = None,
        with_basis: bool = False,
    ) -> ReleasePage:
        """One page of release history, newest first, with the ``total`` of all pages.

        An analyst key lists its own releases, an owner key the releases of its datasets. Times
        must be timezone-aware. Pass the page's ``next`` as ``cursor`` for the following page.
        """
        query = _release_filters(
            dataset_id, status, mechanism, created_after, created_before, with_basis
        )
        if limit is not None:
            query["limit"] = str(limit)
        if cursor is not None:
            query["cursor"] = cursor
        return self._get("/v1/releases", ReleasePage, params=query)

    def list_releases(
        self,
        *,
        dataset_id: UUID | str | None = None,
        status: ReleaseStatus | None = None,
        mechanism: str | None = None,
        created_after: datetime | None = None,
        created_before: datetime | None = None,
        page_size: int | None = None,
        with_basis: bool = False,
    ) -> Iterator[Release]:
        """Every matching release, newest first, fetching pages as the iteration needs them.

        Releases made while iterating do not appear (they are newer than the first page) and
        never cause one to be skipped or repeated.
        """
        query = _release_filters(
            dataset_id, status, mechanism, created_after, created_before, with_basis
        )
        return self._pages("/v1/releases", ReleasePage, query, page_size)

    def get_release(self, release_id: UUID | str) -> ReleaseHandle:
        """A handle on an existing release (e.g. one requested earlier from the CLI)."""
        return ReleaseHandle(self, self._get_release(f"/v1/releases/{release_id}"))

    # Catalogue and audit --------------------------------------------------------------------

    def mechanisms(self) -> list[MechanismInfo]:
        return self._get("/v1/mechanisms", MechanismList).items

    def workers_alive(self) -> int | None:
        """How many workers the service reports alive (``GET /readyz``); ``None`` when it does
        not say (a service from before the figure) or cannot answer now."""
        try:
            body = self._request("GET", "/readyz").json()
        except (DpssError, ValueError):
            return None
        count = body.get("workers_alive") if isinstance(body, dict) else None
        return count if isinstance(count, int) and not isinstance(count, bool) else None

    def audit(self, *, after: int | None = None, limit: int | None = None) -> AuditPage:
        """One page of audit events (auditor or admin key), in chain order after ``after``."""
        query: dict[str, int] = {}
        if after is not None:
            query["after"] = after
        if limit is not None:
            query["limit"] = limit
        return self._get("/v1/audit", AuditPage, params=query)

    # Keys (admin) -------------------------------------------------------------------------

    def keys(self) -> list[KeyInfo]:
        """Every API key, oldest first, revoked ones included (never their secrets)."""
        return list(self._pages("/v1/keys", KeyPage, {}, None))

    def create_key(self, role: Role, name: str) -> KeyCreated:
        """A new key; its secret is in the answer and never shown again."""
        response = self._request("POST", "/v1/keys", json={"role": role, "name": name})
        return _parse(response, KeyCreated)

    def revoke_key(self, key_id: UUID | str) -> None:
        self._request("DELETE", f"/v1/keys/{key_id}")

    # Paging -----------------------------------------------------------------------------------

    def _pages(
        self,
        path: str,
        model: type[_Page],
        query: dict[str, str],
        page_size: int | None,
    ) -> Iterator[Any]:
        """Every item of a cursor-paged list (``{"items", "total", "next"}``)."""
        params = dict(query)
        if page_size is not None:
            params["limit"] = str(page_size)
        while True:
            page = self._get(path, model, params=params)
            yield from page.items
            if page.next is None or not page.items:
                return
            params["cursor"] = page.next

    def audit_events(
        self, *, after: int | None = None, page_size: int | None = None
    ) -> Iterator[AuditEvent]:
        """Every audit event after ``after``, following the pages."""
        cursor = after
        while True:
            page = self.audit(after=cursor, limit=page_size)
            yield from page.items
            if page.next_after is None or not page.items:
                return
            cursor = page.next_after


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


# --------------------------------------------------------------------------------------------
# Release handle


class ReleaseHandle:
    """A release requested from the service; ``info`` is its latest known state."""

    def __init__(self, client: Client, info: Release) -> None:
        self._client = client
        self.info = info
        #: Set when the service reported no live worker during a wait (said once per handle).
        self.no_worker: str | None = None
        self._worker_checked: float | None = None

    def __repr__(self) -> str:
        return f"<ReleaseHandle {self.id} {self.info.mechanism} k={self.info.k} {self.status}>"

    @property
    def id(self) -> UUID:
        return self.info.id

    @property
    def status(self) -> ReleaseStatus:
        return self.info.status

    @property
    def done(self) -> bool:
        return self.info.status in FINISHED

    @property
    def extras(self) -> dict[str, Any]:
        """The mechanism's further outputs (e.g. noisy eigenvalues), once finished."""
        return self.info.result.extras if self.info.result is not None else {}

    def refresh(self, wait: float | None = None) -> Release:
        """Fetch the release's state; with ``wait`` seconds, a long poll (see
        :meth:`wait_finished`): the answer comes when it has finished or after ``wait``."""
        if not wait:
            self.info = self._client._get_release(f"/v1/releases/{self.id}")
            return self.info
        self.info = self._client._get_release(
            f"/v1/releases/{self.id}",
            params={"wait": f"{wait:g}"},
            timeout=self._client._timeout_plus(wait),
        )
        return self.info

    def wait_finished(
        self,
        *,
        progress: bool = False,
        timeout: float | None = None,
        poll_interval: float = 0.2,
        max_poll_interval: float = 2.0,
        long_poll: float | None = None,
        reconnect: float = RECONNECT_SECONDS,
    ) -> Release:
        """Wait until the release has finished and return it, whatever its outcome.

        The release lives in the service's database, so a service restarted (or a connection
        lost) while waiting does not end the wait: it asks again, pausing as between polls,
        for up to ``reconnect`` seconds without an answer, and then raises the
        :class:`ServiceUnreachableError`, saying that the release goes on and how to wait
        for it again.

        Long polls (``GET /v1/releases/{id}?wait=...``, ``long_poll`` seconds each, default
        :data:`LONG_POLL_SECONDS`): the service answers as soon as the release has finished, so
        the result is seen as soon as it is visible. Against a server without long polls, with
        ``long_poll=0``, or when the service answered a long poll at once (too many waiting),
        it polls instead, pausing ``poll_interval`` seconds growing x1.5 up to
        ``max_poll_interval``.
        """
        start = time.monotonic()
        interval = poll_interval
        lost_since: float | None = None
        with _Progress(self, start, enabled=progress) as shown:
            while not self.done:
                try:
                    interval = self._wait_step(
                        shown, start, interval, timeout, max_poll_interval, long_poll
                    )
                    lost_since = None
                    if not self.done:
                        self._check_workers(start)
                except ServiceUnreachableError as error:
                    now = time.monotonic()
                    lost_since = now if lost_since is None else lost_since
                    if now - lost_since >= reconnect or (
                        timeout is not None and now - start >= timeout
                    ):
                        raise error.noted(
                            f"release {self.id} goes on in the service (asked again for "
                            f"{now - lost_since:.0f} s): wait for it again with `dpss releases "
                            f"show {self.id} --wait` or Client.get_release(id).wait()"
                        ) from error
                    _sleep(interval)
                    interval = min(interval * 1.5, max_poll_interval)
        return self.info

    def _check_workers(self, start: float) -> None:
        """After :data:`NO_WORKER_CHECK_SECONDS` unfinished, ask the service whether any
        worker is alive (again every as long while none is); with none, warn once, saying why
        the wait goes on and what starts one: without it, a service started without a worker
        left ``fit()`` waiting in silence."""
        now = time.monotonic()
        last = start if self._worker_checked is None else self._worker_checked
        if now - last < NO_WORKER_CHECK_SECONDS:
            return
        self._worker_checked = now
        if self._client.workers_alive() != 0:
            self.no_worker = None
            return
        if self.no_worker is None:
            self.no_worker = (
                f"the service at {self._client.url} reports no live worker: release {self.id} "
                "waits until one starts (`dpss worker` against the same database; `dpss serve` "
                "runs one beside the API)"
            )
            warnings.warn(self.no_worker, NoWorkerWarning, stacklevel=4)

    def _wait_step(
        self,
        shown: _Progress,
        start: float,
        interval: float,
        timeout: float | None,
        max_poll_interval: float,
        long_poll: float | None,
    ) -> float:
        """One long poll (or poll) of :meth:`wait_finished`; returns the next poll interval."""
        bound = LONG_POLL_SECONDS if long_poll is None else min(long_poll, LONG_POLL_SECONDS)
        elapsed = time.monotonic() - start
        if timeout is not None and elapsed >= timeout:
            why = f" ({self.no_worker})" if self.no_worker else ""
            raise WaitTimeoutError(
                "timeout",
                f"release {self.id} still {self.status} after {elapsed:.1f} s{why}",
            )
        left = None if timeout is None else timeout - elapsed
        if bound > 0 and not self._client._no_long_poll:
            # With a progress display, wake up every second to redraw the time.
            wait = min(bound, 1.0) if shown.enabled else bound
            wait = wait if left is None else min(wait, left)
            asked = time.monotonic()
            info = self._client._long_get(
                f"/v1/releases/{self.id}",
                Release,
                max(wait, 0.001),
                self._client._release_read(),
            )
            if info is None:  # a service from before long polls: poll instead
                return interval
            self.info = info
            answered_early = time.monotonic() - asked < wait * 0.9
            if self.done or not answered_early:
                shown.update()
                return interval
            # Answered at once, unfinished: the service is too busy to hold the wait.
        pause = interval if left is None else min(interval, left)
        _sleep(max(pause, 0.0))
        interval = min(interval * 1.5, max_poll_interval)
        self.refresh()
        shown.update()
        return interval

    def raise_for_outcome(self) -> Release:
        """Return the release if it succeeded; raise ReleaseNoResult / ReleaseFailed otherwise."""
        info = self.info
        if info.status == "no_result":
            raise ReleaseNoResult(
                "no_result",
                f"release {info.id} ({info.mechanism}) declined to release: "
                f"{info.reason or 'no reason given'}; the cost stays charged",
                info,
            )
        if info.status == "failed":
            refund = "the charge was refunded" if info.refunded else "the charge was not refunded"
            raise ReleaseFailed(
                "failed",
                f"release {info.id} ({info.mechanism}) failed: {info.reason or 'no reason given'}"
                f"; {refund}",
                info,
            )
        return info

    def basis(self) -> NDArray[np.float64]:
        """The released ``d x k`` orthonormal basis of a succeeded release."""
        import numpy as np

        info = self.raise_for_outcome()
        if info.status != "succeeded":
            raise DpssError("not_finished", f"release {info.id} is still {info.status}")
        if info.result is None or info.result.basis is None:
            raise NoBasisError(
                "no_basis",
                f"mechanism {info.mechanism} releases no basis; see .extras "
                f"({', '.join(sorted(self.extras)) or 'empty'})",
                info,
            )
        basis = np.asarray(info.result.basis, dtype=np.float64)
        if basis.ndim != 2:
            # d lists of k floats with k = 0 or d = 0 cannot be told apart from JSON alone.
            basis = basis.reshape(-1, info.k)
        expected = info.result.basis_sha256
        if expected is not None and basis_sha256(basis) != expected:
            raise ServerError(
                "integrity",
                f"release {info.id}: the basis received does not match basis_sha256 {expected}",
            )
        return basis

    def epoch_records(
        self,
        *,
        timeout: float | None = 600.0,
        poll_interval: float = 0.5,
        max_poll_interval: float = 10.0,
        after: int = 0,
        long_poll: float | None = None,
    ) -> Iterator[Epoch]:
        """Each epoch of a continual release after epoch ``after``, as it is released, oldest
        first; ends when the release has finished and every epoch was yielded.

        Long polls (``GET /v1/releases/{id}/epochs?after=...&wait=...``, ``long_poll`` seconds
        each, default :data:`LONG_POLL_SECONDS`): the service answers as soon as a new epoch is
        visible. Against a server without them or with ``long_poll=0`` it polls politely: the
        pause grows from ``poll_interval`` to ``max_poll_interval`` while nothing new arrives
        and starts over at each new epoch. :class:`WaitTimeoutError` when ``timeout`` seconds
        (``None``: forever) pass without a new epoch; raises like :meth:`raise_for_outcome`
        when the release ends ``no_result`` or ``failed``.
        """
        seen = after
        interval = poll_interval
        quiet_since = time.monotonic()
        bound = LONG_POLL_SECONDS if long_poll is None else min(long_poll, LONG_POLL_SECONDS)
        while True:
            wait = 0.0
            if bound > 0 and not self._client._no_long_poll:
                waited = time.monotonic() - quiet_since
                wait = bound if timeout is None else max(min(bound, timeout - waited), 0.0)
            path, params = f"/v1/releases/{self.id}/epochs", {"after": str(seen)}
            asked = time.monotonic()
            if wait > 0:
                long_page = self._client._long_get(path, EpochList, wait, params)
                if long_page is None:  # a service from before epoch long polls: poll instead
                    continue
                page = long_page
            else:
                page = self._client._get(path, EpochList, params=params)
            fresh = [epoch for epoch in page.items if epoch.epoch > seen]
            for epoch in fresh:
                yield epoch
                seen = epoch.epoch
            if fresh:
                interval, quiet_since = poll_interval, time.monotonic()
                if page.next is not None:
                    continue  # more on the next page: ask again after the last one seen
            self.refresh()
            if self.done:
                if page.total > seen:
                    continue  # epochs stored just before the end
                self.raise_for_outcome()
                return
            waited = time.monotonic() - quiet_since
            if timeout is not None and waited >= timeout:
                raise WaitTimeoutError(
                    "timeout", f"release {self.id}: no new epoch after {waited:.1f} s"
                )
            if wait > 0 and time.monotonic() - asked >= wait * 0.9:
                continue  # the service held the poll for its whole bound: ask again at once
            pause = interval if timeout is None else min(interval, timeout - waited)
            _sleep(max(pause, 0.0))
            interval = min(interval * 1.5, max_poll_interval)

    def epochs(self, **wait: Any) -> Iterator[NDArray[np.float64]]:
        """``for basis in handle.epochs(): ...``: each epoch's ``d x k`` basis of a continual
        release as it is released (checked against its SHA-256); options as
        :meth:`epoch_records`."""
        import numpy as np

        for epoch in self.epoch_records(**wait):
            if epoch.basis is None:
                continue
            basis = np.asarray(epoch.basis, dtype=np.float64).reshape(-1, self.info.k)
            if epoch.basis_sha256 is not None and basis_sha256(basis) != epoch.basis_sha256:
                raise ServerError(
                    "integrity",
                    f"release {self.id} epoch {epoch.epoch}: the basis received does not match "
                    f"basis_sha256 {epoch.basis_sha256}",
                )
            yield basis

    def wait(
        self,
        progress: bool = False,
        *,
        timeout: float | None = None,
        poll_interval: float = 0.2,
        max_poll_interval: float = 2.0,
        long_poll: float | None = None,
    ) -> NDArray[np.float64]:
        """Wait until the release finishes and return its basis as a ``d x k`` array (long
        polls, or polls against an older service: see :meth:`wait_finished`).

        Raises :class:`ReleaseNoResult` or :class:`ReleaseFailed` for those outcomes,
        :class:`NoBasisError` for mechanisms that release no basis (use :meth:`wait_finished`
        and :attr:`extras` for those), and :class:`WaitTimeoutError` when ``timeout`` seconds pass.
        ``progress=True`` shows a spinner with the status and elapsed time on a terminal.
        """
        self.wait_finished(
            progress=progress,
            timeout=timeout,
            poll_interval=poll_interval,
            max_poll_interval=max_poll_interval,
            long_poll=long_poll,
        )
        return self.basis()


class _Progress:
    """A rich spinner on stderr showing a release's status and elapsed time (terminals only)."""

    def __init__(self, handle: ReleaseHandle, start: float, *, enabled: bool) -> None:
        self._handle = handle
        self._start = start
        self._status: Any = None
        self.enabled = enabled and sys.stderr.isatty()
        if self.enabled:
            from rich.console import Console

            self._status = Console(stderr=True).status(self._text())

    def _text(self) -> str:
        info = self._handle.info
        elapsed = time.monotonic() - self._start
        # Short: the full id was printed already, and a wrapped status line redraws badly.
        return (
            f"release {str(info.id)[:8]} {info.mechanism} k={info.k}: "
            f"[bold]{info.status}[/bold] {elapsed:.1f} s"
        )

    def update(self) -> None:
        if self._status is not None:
            self._status.update(self._text())

    def __enter__(self) -> _Progress:
        if self._status is not None:
            self._status.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._status is not None:
            self._status.stop()
