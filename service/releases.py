"""Release requests: validate, check and charge the budget, queue the job; read results.

One transaction decides a release: the dataset lock, the budget check, the ledger charge, the
queued release and its audit event commit together or not at all.
"""

from __future__ import annotations

import hashlib
import json
import math
import uuid
from dataclasses import dataclass, replace
from datetime import datetime
from decimal import Decimal
from typing import Any

import numpy as np
from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from api_schemas.common import canonical_decimal
from api_schemas.releases import ReleaseRequest
from service import audit, grants, ledger, reference, wake
from service.auth import Principal, require_role
from service.config import Settings
from service.db.models import Dataset, Release, utcnow
from service.errors import (
    BudgetExceeded,
    DatasetGone,
    IdempotencyConflict,
    InvalidInput,
    NotFound,
)
from service.mechanisms.base import InvalidParameter, Mechanism, PublicContext, ReleaseSpec
from service.mechanisms.linalg import DEFAULT_CHUNK_ROWS
from service.mechanisms.registry import MECHANISMS, get_mechanism
from service.padding import PaddingModel

IDEMPOTENCY_KEY_REUSED = "this Idempotency-Key was already used with a different request"

MIB = 1024 * 1024


def _check_places(field: str, value: Decimal) -> None:
    """A cost the ledger would round (too many places or digits) is refused, not rounded."""
    ledger.check_storable(field, value)


def float_not_above(value: Decimal) -> float:
    """The largest double that is ``<= value``: a mechanism never runs with more epsilon or
    delta than the ledger charged (``float()`` alone may round up by half an ulp)."""
    result = float(value)
    return math.nextafter(result, -math.inf) if Decimal(result) > value else result


def request_hash(dataset_id: uuid.UUID, body: ReleaseRequest) -> str:
    """Fingerprint of a request, to tell an idempotent retry from a different request."""
    canonical = json.dumps(
        {
            "dataset_id": str(dataset_id),
            "mechanism": body.mechanism,
            "k": body.k,
            "epsilon": canonical_decimal(body.epsilon),
            "delta": canonical_decimal(body.delta),
            "params": body.params,
        },
        sort_keys=True,
        separators=(",", ":"),
        default=str,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def _lock_dataset(session: Session, dataset_id: uuid.UUID) -> Dataset:
    # FOR UPDATE on PostgreSQL; on SQLite the transaction already holds the write lock.
    dataset = session.execute(
        select(Dataset).where(Dataset.id == dataset_id).with_for_update()
    ).scalar_one_or_none()
    if dataset is None:
        raise NotFound(f"no dataset {dataset_id}")
    if dataset.deleted_at is not None or dataset.file_name is None:
        raise DatasetGone(f"dataset {dataset_id} was deleted; its rows are gone")
    return dataset


def lock_dataset(session: Session, dataset_id: uuid.UUID) -> Dataset:
    """The live dataset, locked as a real request locks it; 404 or 409 ``dataset_deleted``."""
    return _lock_dataset(session, dataset_id)


@dataclass(frozen=True)
class Prepared:
    """A request validated by its mechanism from public facts; nothing charged yet."""

    mechanism: Mechanism[Any]
    context: PublicContext
    spec: ReleaseSpec[Any]
    #: The resolved params as stored and shown (JSON values).
    params: dict[str, Any]


def _prepare(
    body: ReleaseRequest, dataset: Dataset, memory_limit_bytes: int | None = None
) -> Prepared:
    """Validate the request against the mechanism using public facts only (the worker memory
    limit is public configuration: a mechanism may size a default parameter to it)."""
    mechanism = get_mechanism(body.mechanism)
    if mechanism is None:
        raise InvalidInput(
            "mechanism", f"unknown mechanism '{body.mechanism}'; one of {', '.join(MECHANISMS)}"
        )
    try:
        params = mechanism.parse_params(body.params)
    except ValidationError as exc:
        raise InvalidInput.from_validation(exc, prefix="params") from None
    context = PublicContext(
        n_rows=dataset.n_rows,
        n_cols=dataset.n_cols,
        row_norm_bound=dataset.row_norm_bound,
        memory_limit_bytes=memory_limit_bytes,
    )
    epsilon, delta = float_not_above(body.epsilon), float_not_above(body.delta)
    try:
        resolved = mechanism.prepare(context, body.k, epsilon, delta, params)
    except InvalidParameter as exc:
        field = exc.field if exc.field in {"k", "epsilon", "delta"} else f"params.{exc.field}"
        raise InvalidInput(field, exc.message) from None
    spec = ReleaseSpec(k=body.k, epsilon=epsilon, delta=delta, params=resolved)
    dumped: dict[str, Any] = resolved.model_dump(mode="json")
    return Prepared(mechanism=mechanism, context=context, spec=spec, params=dumped)


def check_memory(prepared: Prepared, limit_mb: float, extra_bytes: int = 0) -> None:
    """Refuse a release whose working memory, a function of public facts, exceeds the limit.

    Checked before charging: a worker that ran out of memory would turn a public refusal into a
    charged ``failed`` release, and memory that depends on the data would be a side channel.
    """
    context = prepared.context
    if prepared.mechanism.continual:
        # Later batches are not known yet: the chunked Gram pass's worst case, a full chunk.
        context = replace(context, n_rows=max(context.n_rows, DEFAULT_CHUNK_ROWS))
    estimate = prepared.mechanism.memory_bytes(context, prepared.spec) + extra_bytes
    limit = limit_mb * MIB
    if estimate > limit:
        ctx = prepared.context
        raise InvalidInput(
            "params",
            f"{prepared.mechanism.name} would need about {estimate / MIB:,.0f} MiB of working "
            f"memory for n={ctx.n_rows}, d={ctx.n_cols}, k={prepared.spec.k} and these params, "
            f"above the worker limit of {limit_mb:,.0f} MiB (DPSS_WORKER_MEMORY_MB); "
            "ask for a smaller k or cheaper params, or ask the operator to raise the limit",
        )


def check_request_fields(principal: Principal, body: ReleaseRequest) -> None:
    """The checks of a request that need no dataset: role and storable costs."""
    require_role(principal, "analyst")
    _check_places("epsilon", body.epsilon)
    _check_places("delta", body.delta)


def check_request(body: ReleaseRequest, dataset: Dataset, settings: Settings) -> Prepared:
    """Every refusal a request gets from its dataset's public facts before the budget check:
    mechanism, params (via ``prepare``: clip norm, k, ...) and the memory gate."""
    extra = 0
    if dataset.reference is not None:
        reference.mechanism_allowed(body.mechanism)
        extra = reference.worker_bytes(dataset.reference)
    prepared = _prepare(body, dataset, int(settings.worker_memory_mb * MIB))
    check_memory(prepared, settings.worker_memory_mb, extra)
    return prepared


def _idempotent_match(
    session: Session, principal: Principal, idempotency_key: str | None, fingerprint: str
) -> Release | None:
    """The release an earlier request with this key made, if the request is the same one."""
    if idempotency_key is None:
        return None
    existing = session.execute(
        select(Release).where(
            Release.requester_key_id == principal.key_id,
            Release.idempotency_key == idempotency_key,
        )
    ).scalar_one_or_none()
    if existing is not None and existing.request_hash != fingerprint:
        raise IdempotencyConflict(IDEMPOTENCY_KEY_REUSED)
    return existing


def request_release(
    session: Session,
    principal: Principal,
    dataset_id: uuid.UUID,
    body: ReleaseRequest,
    idempotency_key: str | None,
    settings: Settings,
) -> Release:
    """Queue a release and charge its cost, or refuse without charging anything.

    ``visible_at`` is fixed here, from public facts only, so that when an analyst may see the
    outcome says nothing about how long the job ran (see :mod:`service.padding`).
    """
    check_request_fields(principal, body)
    if idempotency_key is not None and not 1 <= len(idempotency_key) <= 200:
        raise InvalidInput("Idempotency-Key", "must be 1 to 200 characters")
    fingerprint = request_hash(dataset_id, body)
    existing = _idempotent_match(session, principal, idempotency_key, fingerprint)
    if existing is not None:
        return existing
    dataset = _lock_dataset(session, dataset_id)
    # Again under the lock: a concurrent retry of the same request may have committed meanwhile.
    existing = _idempotent_match(session, principal, idempotency_key, fingerprint)
    if existing is not None:
        return existing
    prepared = check_request(body, dataset, settings)
    params = prepared.params
    # The grant is checked first: it is the analyst's own limit, and naming it is more useful
    # than the dataset's remainder when both are short. Both under the dataset's lock.
    grant = grants.applicable_grant(
        session, dataset.id, principal.key_id, required=settings.grants_required
    )
    if grant is not None:
        share = grants.grant_budget(session, grant)
        if not share.affords(body.epsilon, body.delta):
            raise BudgetExceeded(
                share.epsilon_remaining, share.delta_remaining, budget="grant", grant_id=grant.id
            )
    budget = ledger.budget_of(session, dataset)
    if not budget.affords(body.epsilon, body.delta):
        raise BudgetExceeded(budget.epsilon_remaining, budget.delta_remaining)
    created_at = utcnow()
    padding = PaddingModel.from_settings(settings).padding(
        body.mechanism, dataset.n_rows, dataset.n_cols, body.k, params
    )
    release = Release(
        id=uuid.uuid4(),
        dataset_id=dataset.id,
        requester_key_id=principal.key_id,
        mechanism=body.mechanism,
        k=body.k,
        epsilon=body.epsilon,
        delta=body.delta,
        params=params,
        idempotency_key=idempotency_key,
        request_hash=fingerprint,
        status="queued",
        attempts=0,
        refunded=False,
        created_at=created_at,
        visible_at=created_at + padding,
    )
    if not prepared.mechanism.continual:
        # The rows a one-shot release reads: the batches present now, whose public n its
        # parameters were prepared with (later appends are not read).
        release.n_rows_read = dataset.n_rows
        release.batches_read = dataset.n_batches
    try:
        with session.begin_nested():
            session.add(release)
    except IntegrityError:
        # The same key raced in for another dataset (a different request): refuse, charge nothing.
        raise IdempotencyConflict(IDEMPOTENCY_KEY_REUSED) from None
    grant_id = grant.id if grant is not None else None
    ledger.charge(session, dataset.id, release.id, body.epsilon, body.delta, grant_id)
    audit.record(
        session,
        "release_requested",
        actor_key_id=principal.key_id,
        dataset_id=dataset.id,
        release_id=release.id,
        details={
            "mechanism": body.mechanism,
            "k": body.k,
            "params": params,
            "cost": {"epsilon": body.epsilon, "delta": body.delta},
            "grant_id": grant_id,
        },
    )
    # Idle workers learn of the job when this transaction commits (a hint: they also poll).
    wake.announce(session, settings)
    return release


def get_release(session: Session, principal: Principal, release_id: uuid.UUID) -> Release:
    """Analysts read the releases they requested; owners those of their datasets."""
    require_role(principal, "analyst", "owner")
    release = session.get(Release, release_id)
    if release is not None:
        if principal.role == "analyst":
            visible = release.requester_key_id == principal.key_id
        else:
            dataset = session.get(Dataset, release.dataset_id)
            visible = dataset is not None and dataset.owner_key_id == principal.key_id
        if visible:
            return release
    raise NotFound(f"no release {release_id}")


def outcome_visible(release: Release, principal: Principal, now: datetime) -> bool:
    """Whether ``principal`` may see the release's real status and result at ``now``.

    Analysts see it from ``visible_at`` on; owners (who hold the data anyway) and auditors
    always. Releases made before ``visible_at`` existed have none and are visible.
    """
    if principal.role != "analyst":
        return True
    return release.visible_at is None or now >= release.visible_at


def shows_timing(principal: Principal) -> bool:
    """Whether ``principal`` sees start and finish times and attempt counts: run time and
    retries can depend on the data, so analysts do not."""
    return principal.role != "analyst"


def decode_basis(release: Release) -> np.ndarray[Any, np.dtype[np.float64]] | None:
    """The stored basis as a ``d x k`` array."""
    if release.result_basis is None or release.result_shape is None:
        return None
    rows, cols = release.result_shape
    return np.frombuffer(release.result_basis, dtype="<f8").reshape(rows, cols)


def encode_basis(basis: np.ndarray[Any, Any]) -> tuple[bytes, list[int], str]:
    """Bytes (little-endian float64, row-major), shape and SHA-256 of a basis."""
    data = np.ascontiguousarray(basis, dtype="<f8").tobytes()
    return data, [int(basis.shape[0]), int(basis.shape[1])], hashlib.sha256(data).hexdigest()
