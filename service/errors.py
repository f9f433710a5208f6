"""Domain errors. Each maps to one HTTP status in ``service.api.errors``; nothing here knows HTTP.

Messages are written for clients: they name the field and the problem and never carry data
values or internal details.
"""

from __future__ import annotations

import traceback
import uuid
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

from pydantic import ValidationError

from api_schemas.common import format_budget
from service.keyformat import looks_like_key
from service.refusal_figures import stated_deltas


class DomainError(Exception):
    """Base of every error a client may see."""

    code: str = "error"

    def __init__(self, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.extra = extra


class InvalidInput(DomainError):
    """The request is malformed or a parameter is out of range (422)."""

    code = "invalid_input"

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field

    @classmethod
    def from_validation(
        cls, exc: ValidationError, prefix: str = "", fallback: str = "body"
    ) -> InvalidInput:
        """The first pydantic error, located under ``prefix`` (its input is never echoed);
        ``fallback`` names the field when the error has no location and no prefix."""
        errors = exc.errors()
        first = errors[0]
        if first["type"] == "missing":
            # A misspelt required field is both missing and unknown; the unknown one names
            # what was sent and the nearest valid name, which "required" alone does not.
            first = next(
                (
                    error
                    for error in errors
                    if error["type"] == "extra_forbidden" and len(error["loc"]) == len(first["loc"])
                ),
                first,
            )
        base = field_path(first["loc"])
        field = ".".join(part for part in (prefix, printable(".".join(base))) if part) or fallback
        return cls(field, union_message(errors, base))


def field_path(loc: tuple[int | str, ...]) -> list[str]:
    """A pydantic error location as field names and indexes, without the tags pydantic puts
    after a field whose type is a union (``center.literal['none','private']`` is the field
    ``center``; every such tag has brackets, which no field name has)."""
    return [str(part) for part in loc if not (isinstance(part, str) and "[" in part)]


def union_message(errors: Sequence[Mapping[str, Any]], base: list[str]) -> str:
    """The message for the field at ``base``: with a union type, one per alternative that was
    tried (``Input should be 'none' or 'private'; or: item 1: Input should be a valid
    number``), so the client learns every accepted form, not only the first."""
    messages: list[str] = []
    for error in errors:
        path = field_path(error["loc"])
        if path[: len(base)] != base:
            continue
        rest = printable(".".join(path[len(base) :]))
        message = f"item {rest}: {error['msg']}" if rest else str(error["msg"])
        if message not in messages:
            messages.append(message)
    return "; or: ".join(messages)


#: What an error shows instead of a client-chosen name that could be an API key.
WITHHELD = "(a name that looks like an API key, not shown)"


def printable(text: str, limit: int = 100) -> str:
    """Client-chosen text (a field name) made safe to show: control characters and lone
    surrogates escaped (a surrogate cannot even be encoded in a UTF-8 response), length capped,
    and withheld whole when it could be an API key or a piece of one
    (:func:`service.keyformat.looks_like_key`): a key pasted where a name goes must not come
    back in an error, which a client, a proxy or an error log keeps."""
    if looks_like_key(text):
        return WITHHELD
    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return shown if len(shown) <= limit else shown[:limit] + "..."


def size_text(n_bytes: float) -> str:
    """A size for a message, true to 3 significant digits: MiB from 0.1 MiB up (whole MiB from
    100), bytes below (``f"{limit // 2**20} MiB"`` said "0 MiB" of a 0.01 MiB limit)."""
    mib = n_bytes / (1024 * 1024)
    if mib >= 100:
        return f"{mib:,.0f} MiB"
    if mib >= 0.1:
        return f"{mib:.3g} MiB"
    return f"{n_bytes:,.0f} bytes"


class PayloadTooLarge(DomainError):
    """An upload exceeds ``DPSS_MAX_UPLOAD_MB`` (413)."""

    code = "payload_too_large"


class RequestTimeout(DomainError):
    """The client did not send its request body within ``DPSS_BODY_TIMEOUT_SECONDS`` (408)."""

    code = "request_timeout"


class ServiceUnavailable(DomainError):
    """The database is busy or unreachable; nothing was done and a retry may succeed (503).

    ``retry_after`` (whole seconds) is sent as the ``Retry-After`` header and in the body.
    """

    code = "service_unavailable"

    def __init__(self, detail: str, retry_after: int) -> None:
        super().__init__(detail, retry_after=retry_after)
        self.retry_after = retry_after


class RestoreUnaccepted(ServiceUnavailable):
    """The database was restored from an older backup (the audit anchors show it) and no admin
    has accepted that yet: charges and key use are refused (503) until
    ``dpss audit accept-restore``; nothing was done."""

    code = "restore_unaccepted"
    RETRY_AFTER = 60

    def __init__(self) -> None:
        super().__init__(
            "the service's database was restored from an older backup (revoked keys and spent "
            "budget may have come back); it refuses this until an administrator runs "
            "`dpss audit accept-restore`",
            self.RETRY_AFTER,
        )


class InsufficientStorage(DomainError):
    """The disk (or quota) holding the dataset store is full (507); nothing was kept."""

    code = "insufficient_storage"


class Unauthenticated(DomainError):
    """No key, or a key that does not exist or was revoked (401)."""

    code = "unauthenticated"


class Forbidden(DomainError):
    """The key's role may not do this (403)."""

    code = "forbidden"


class GrantRequired(Forbidden):
    """Grants are required (``DPSS_GRANTS_REQUIRED``) and the analyst has none (403)."""

    code = "grant_required"


class GrantRevoked(Forbidden):
    """The grant that would apply to this key was revoked, and no newer one exists (403);
    ``grant_id`` names it. Revocation stops charges: nothing falls back to another budget."""

    code = "grant_revoked"


class NotFound(DomainError):
    """No such resource, or not visible to this key (404)."""

    code = "not_found"


class Conflict(DomainError):
    """The request conflicts with the current state (409)."""

    code = "conflict"


class IdempotencyConflict(Conflict):
    """An ``Idempotency-Key`` was reused with a different request body (409)."""

    code = "idempotency_conflict"


class DatasetGone(Conflict):
    """The dataset's rows were deleted (409)."""

    code = "dataset_deleted"


class DatasetNotReady(Conflict):
    """A dataset by reference still ``registering`` (or whose registration ``failed``): it has
    no checked rows, so it takes no release, grant or batch (409)."""

    code = "dataset_not_ready"


class ObjectRegistered(Conflict):
    """An object (or a copy of its content) is already covered by another live dataset by
    reference (409): its rows have one budget; or by this dataset (a batch repeating an
    earlier batch's object or rows): they would count twice in it."""

    code = "object_registered"


class BatchRegistering(Conflict):
    """A batch appended by reference is still registering on this dataset (409): one at a
    time, so that batches take their sequence numbers in the order they were requested."""

    code = "batch_registering"


class BudgetExceeded(Conflict):
    """The release would overspend the dataset's budget or its grant's (409).

    ``budget`` says which (``"dataset"`` or ``"grant"``); the remaining amounts are that
    budget's; ``grant_id`` names the grant (null for the dataset).
    """

    code = "budget_exceeded"

    def __init__(
        self,
        remaining: Mapping[str, Decimal],
        *,
        budget: str = "dataset",
        grant_id: uuid.UUID | None = None,
        shortfalls: Sequence[str] = (),
        epsilon_admissible: Decimal | None = None,
        delta_admissible: Decimal | None = None,
        delta_admissible_epsilon: Decimal | None = None,
        privacy_unit: str = "row",
        accounting: str = "basic",
        asked_delta: Decimal | None = None,
    ) -> None:
        """``remaining``: the budget's remaining figures as :mod:`service.spend` states them
        (``epsilon_remaining``, ``delta_remaining``, and the native ``rho_remaining`` /
        ``mu_remaining`` / ``delta_reserved_for_conversion`` where the accounting has them): the
        same figures ``GET .../budget`` (or the grant) shows. ``shortfalls``: what the charge
        lacks, in public figures (:meth:`service.ledger.BudgetState.shortfalls`), appended to
        the message (on ``hybrid`` a large ``epsilon_remaining`` does not say that delta or a
        filter's share is what ran out). ``epsilon_admissible``: the largest epsilon this same
        request is admitted at now (:mod:`service.repricing`), said in the message and given
        as a field: under ``hybrid`` ``epsilon_remaining`` is not what every kind of release
        may ask for. ``delta_admissible``, ``delta_admissible_epsilon``: when no epsilon is
        admitted at the request's delta (e.g. ``hybrid``'s delta filter is spent), another delta
        (``0`` for a mechanism that allows pure DP, else a smaller one) and the largest epsilon
        the same request is admitted at with it, said and given the same way.
        ``privacy_unit``: what those figures protect (``row`` or ``person``), stated with them
        as everywhere a budget is (DESIGN.md, "Privacy unit"). ``accounting``: the budget's, for
        saying at which delta each figure holds (:func:`service.refusal_figures.stated_deltas`);
        ``asked_delta``: the request's delta, the one ``epsilon_admissible`` is searched at."""
        self._terms = (
            dict(remaining),
            budget,
            grant_id,
            tuple(shortfalls),
            privacy_unit,
            accounting,
        )
        which = "the dataset's" if budget == "dataset" else f"grant {grant_id}'s"
        why = f": {'; '.join(shortfalls)}" if shortfalls else ""
        # What the analyst can do next: a dry run prices a smaller request without a charge.
        # A grant's owner can grant more; a dataset's budget can never be raised (the service
        # has no way to: the total is the guarantee), so that is said, not suggested.
        more = (
            "; a dataset's budget cannot be raised: it bounds what all its releases reveal together"
            if budget == "dataset"
            else ", or ask the dataset's owner to grant more"
        )
        todo = (
            ". Ask for less (a smaller cost; a dry run, `dry_run=true`, prices a request without "
            f"charging it){more}"
        )
        # Each figure with the delta it holds at: epsilon_admissible at the request's,
        # epsilon_remaining at the budget's (0.43 admitted beside 0.57 remaining, deltas unsaid,
        # read as a contradiction).
        own = "" if asked_delta is None else f" {format_budget(asked_delta)}"
        stated = (
            "" if "epsilon_remaining" not in remaining else stated_deltas(remaining, accounting)
        )
        at = (
            ""
            if epsilon_admissible is None
            else f". This request (same mechanism and params, at its delta{own}) is admitted now "
            f"at epsilon {format_budget(epsilon_admissible)}; {stated}"
        )
        if epsilon_admissible is None and delta_admissible is not None:
            at = (
                f". No epsilon is admitted at this request's delta{own}; the same request (same "
                f"mechanism and params) is admitted now at delta {format_budget(delta_admissible)}"
                f" with epsilon {format_budget(delta_admissible_epsilon or Decimal(0))}; {stated}"
            )
        super().__init__(
            f"this release costs more than {which} remaining budget{why}{at}{todo}",
            **remaining,
            privacy_unit=privacy_unit,
            budget=budget,
            grant_id=grant_id,
            epsilon_admissible=epsilon_admissible,
            delta_admissible=delta_admissible,
            delta_admissible_epsilon=delta_admissible_epsilon,
        )

    def admitting(
        self,
        epsilon_admissible: Decimal | None,
        delta_admissible: Decimal | None = None,
        delta_admissible_epsilon: Decimal | None = None,
        asked_delta: Decimal | None = None,
    ) -> BudgetExceeded:
        """The same refusal, saying the epsilon the request is admitted at (searched after the
        refusing transaction at the request's delta ``asked_delta``,
        :func:`service.releases.admissible_search`)."""
        remaining, budget, grant_id, shortfalls, unit, accounting = self._terms
        return BudgetExceeded(
            remaining,
            budget=budget,
            grant_id=grant_id,
            shortfalls=shortfalls,
            privacy_unit=unit,
            epsilon_admissible=epsilon_admissible,
            delta_admissible=delta_admissible,
            delta_admissible_epsilon=delta_admissible_epsilon,
            accounting=accounting,
            asked_delta=asked_delta,
        )


def safe_traceback(exc: BaseException) -> str:
    """Where an exception came from (files, lines, functions) without its message, which may
    quote data values: what the service logs for an internal fault."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = " <- ".join(
        f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno}:{f.name}" for f in reversed(frames)
    )
    return f"{type(exc).__name__} at {where}"
