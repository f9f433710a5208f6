"""Idempotent uploads and appends (``Idempotency-Key`` on ``POST /v1/datasets`` and ``POST
/v1/datasets/{id}/rows``).

Without a key, a client whose upload's answer was lost (a timeout, a dropped connection) and
who sends the file again makes a second dataset: a second budget on the same people, so a
person in it can be exposed at twice the epsilon the owner set. With a key, the retry gets
what the first request made (200, same id) and nothing new is stored or charged; the same
key with another body is refused (409 ``idempotency_conflict``), so a key reused by mistake
never silently returns another file's dataset.

A request's fingerprint is the SHA-256 of its form fields (as validated), the file's suffix
and the SHA-256 of the file's bytes, computed while they stream in (:mod:`service.api.multipart`).
Keys are per owner key for uploads and per dataset for appends, as releases' are per
requester key. The lookup runs before the file is parsed (a retry costs a hash, not a
decode) and again in the registering transaction, where a unique index decides between
concurrent retries (:mod:`service.migrations` 0020).
"""

from __future__ import annotations

import hashlib
import json
import uuid
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service.auth import Principal
from service.db.models import Dataset, DatasetBatch
from service.errors import IdempotencyConflict, InvalidInput
from service.keyformat import KEY_PREFIX

HEADER = "Idempotency-Key"
KEY_REUSED = "this Idempotency-Key was already used with a different request"
#: The header's description in the OpenAPI document of both upload routes.
UPLOAD_DESCRIPTION = (
    "Retries with the same key and the same body (form fields and file bytes) return what the "
    "first request made (200, the same id): never a second dataset or batch, so never a second "
    "budget on the same rows. The same key with another body: 409 `idempotency_conflict`."
)


def check_key(key: str | None) -> None:
    """422 naming the header for a key that could not be stored: too long, or holding an API
    key (it is kept with the row and in every backup)."""
    if key is None:
        return
    if not 1 <= len(key) <= 200:
        raise InvalidInput(HEADER, "must be 1 to 200 characters")
    if KEY_PREFIX in key.lower():
        raise InvalidInput(HEADER, f"must not contain an API key ('{KEY_PREFIX}...'); send a UUID")


def fingerprint(fields: dict[str, Any], suffix: str, file_sha256: str) -> str:
    """The SHA-256 of a request's fields, its file's suffix and its file's digest."""
    canonical = json.dumps(
        {"fields": fields, "suffix": suffix.lower(), "file_sha256": file_sha256},
        sort_keys=True,
        separators=(",", ":"),
        default=str,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def find_dataset(
    session: Session, principal: Principal, key: str | None, request_hash: str
) -> Dataset | None:
    """The dataset an earlier upload with this key made (409 if its body differed)."""
    if key is None:
        return None
    found = session.execute(
        select(Dataset).where(
            Dataset.owner_key_id == principal.key_id, Dataset.idempotency_key == key
        )
    ).scalar_one_or_none()
    if found is not None and found.request_hash != request_hash:
        raise IdempotencyConflict(KEY_REUSED)
    return found


def find_batch(
    session: Session, dataset_id: uuid.UUID, key: str | None, request_hash: str
) -> DatasetBatch | None:
    """The batch an earlier append with this key made to this dataset (409 if it differed)."""
    if key is None:
        return None
    found = session.execute(
        select(DatasetBatch).where(
            DatasetBatch.dataset_id == dataset_id, DatasetBatch.idempotency_key == key
        )
    ).scalar_one_or_none()
    if found is not None and found.request_hash != request_hash:
        raise IdempotencyConflict(KEY_REUSED)
    return found


def is_key_race(exc: IntegrityError) -> bool:
    """Whether an insert failed on one of the idempotency indexes (a concurrent retry with
    the same key committed first), as both databases name the index or its columns."""
    text = str(exc.orig).lower()
    return "idempotency" in text
