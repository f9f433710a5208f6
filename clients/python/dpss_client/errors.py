"""The client's exceptions: the :class:`DpssError` hierarchy, and how an HTTP answer or a
transport failure becomes one (:func:`error_from_response`, :func:`transport_error`).
"""

from __future__ import annotations

import json
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any, Final, Self
from uuid import UUID

import httpx

from api_schemas.releases import Release
from dpss_client.defaults import DEFAULT_URL

if TYPE_CHECKING:
    from dpss_client.spelling import Spelling

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

    def respelled(self, spelling: Spelling) -> Self:
        """This error (a copy, of the same type and figures) with its detail in a client
        surface's spelling (dpss_client.spelling): ``n_components``, not ``k``."""
        # Not copy.copy: it re-calls __init__ with args, which the subclasses' do not take.
        again = type(self).__new__(type(self))
        again.__dict__.update(self.__dict__)
        again.detail = spelling.respell(self.detail)
        again.args = (f"{self.code}: {again.detail}" if again.detail else self.code,)
        return again


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
        epsilon_remaining_pure: Decimal | None = None,
        stated_at_delta: Decimal | None = None,
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
        #: hybrid ``epsilon_remaining`` is what a Gaussian release at the budget's delta is
        #: admitted at, not what every kind of release (or another delta) may ask for.
        self.epsilon_admissible = epsilon_admissible
        #: When no epsilon is admitted at the request's delta: a delta (0 for a mechanism that
        #: allows pure DP, else a smaller one) and the largest epsilon the same request is
        #: admitted at with it now; ``None`` when none is.
        self.delta_admissible = delta_admissible
        self.delta_admissible_epsilon = delta_admissible_epsilon
        #: What a pure release (delta 0) is admitted at in that budget (``None`` on gaussian),
        #: and the delta ``epsilon_remaining`` is stated at (``epsilon_admissible`` is at the
        #: request's own delta): the message says which figure holds at which delta.
        self.epsilon_remaining_pure = epsilon_remaining_pure
        self.stated_at_delta = stated_at_delta


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
            epsilon_remaining_pure=_decimal_or_none(body.get("epsilon_remaining_pure")),
            stated_at_delta=_decimal_or_none(body.get("stated_at_delta")),
        )
    if status == 409:
        return ConflictError(code, detail, status)
    if 400 <= status < 500:
        return InvalidRequestError(code, detail, status)
    return ServerError(code, detail, status)
