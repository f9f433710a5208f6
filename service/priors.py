"""Public priors: bases an analyst supplies so that a release is estimated inside their span.

A prior is a ``d x m`` matrix with orthonormal columns, public by the analyst's declaration:
computed from public data (another sample, a published model) or a fixed transform (a DCT), and
never from the private rows (then it is not public and the privacy argument of
:mod:`service.prior_projection` does not hold; the docs say so). A request gives one of

- ``params.prior_basis``: the matrix inline, a list of ``d`` rows of ``m`` numbers (within the
  JSON body limit, ``DPSS_MAX_JSON_BYTES``); stored as a prior of source ``inline`` when the
  release is requested (an identical stored prior is reused), so a worker reads it like any;
- ``params.prior_id``: a prior uploaded once as a ``.npy`` file with ``POST /v1/priors``.

Who: any analyst or owner key may upload priors and list and read every prior (they are public
data, so nothing in them is secret; admins manage keys, not releases). A release names a prior
by id. The prior costs nothing; the release's stored params (shown on the release and in its
``release_requested`` audit event) carry ``prior_id`` and ``prior_sha256``, the SHA-256 of its
bytes (little-endian float64, row-major ``d x m``: ``hashlib.sha256(P.astype("<f8").tobytes())``).

Checks (422 naming the field: ``params.prior_basis``, ``params.prior_id`` or the upload's
``file``): 2-D, finite, ``1 <= m <= d``, orthonormal columns (``max |P^T P - I| <=``
:data:`ORTHONORMAL_TOLERANCE`, refused otherwise, never orthonormalised: a non-orthonormal map
could lengthen rows past their declared bound); with the dataset, ``d`` equal to its number of
columns and ``m >= k``; not with a continual mechanism or a dataset by reference.
"""

from __future__ import annotations

import hashlib
import math
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import and_, func, or_, select
from sqlalchemy.orm import Session, undefer

from service import audit
from service.auth import Principal, Role, require_role
from service.db.models import Prior, utcnow
from service.errors import InvalidInput, NotFound, size_text
from service.mechanisms.base import Mechanism
from service.mechanisms.linalg import FloatArray
from service.pagination import Page, list_scope, parse_time_id_cursor, time_id_cursor
from service.prior_projection import is_orthonormal
from service.upload_formats import npy_header

#: The params keys this layer takes out of a request before its mechanism parses the rest.
BASIS_FIELD = "prior_basis"
ID_FIELD = "prior_id"
#: Keys recorded in a release's stored params (the worker reads them back).
SHA256_FIELD = "prior_sha256"
STORED_FIELDS = (ID_FIELD, SHA256_FIELD)

#: ``max |P^T P - I|`` accepted: float32 rounding of an orthonormal matrix (about 1e-7) passes,
#: a basis that is not orthonormal does not. What rounding leaves above 1 in ``P``'s largest
#: singular value is divided out before use (:func:`service.prior_projection.contraction`).
ORTHONORMAL_TOLERANCE = 1e-6
#: Largest prior stored (bytes of float64): a 100,000 x 1,000 basis would be 800 MB.
MAX_PRIOR_BYTES = 256 * 1024 * 1024
PRIOR_CURSOR = "prior"
PRIOR_SCOPE = list_scope("priors")
ROLES: tuple[Role, ...] = ("analyst", "owner")


@dataclass(frozen=True)
class PublicPrior:
    """A checked prior: its matrix, digest and (once stored) id."""

    matrix: FloatArray
    sha256: str
    id: uuid.UUID | None = None
    #: ``params.prior_basis`` or ``params.prior_id``: the field refusals name.
    field: str = f"params.{ID_FIELD}"

    @property
    def dimension(self) -> int:
        return int(self.matrix.shape[1])

    def recorded(self) -> dict[str, Any]:
        """What the release's stored params carry (the preview of an inline prior: no id)."""
        return {ID_FIELD: None if self.id is None else str(self.id), SHA256_FIELD: self.sha256}


def canonical_bytes(matrix: FloatArray) -> bytes:
    """The stored bytes: little-endian float64, row-major."""
    return np.ascontiguousarray(matrix, dtype="<f8").tobytes()


def digest(matrix: FloatArray) -> str:
    return hashlib.sha256(canonical_bytes(matrix)).hexdigest()


def check_matrix(matrix: Any, field: str) -> FloatArray:
    """The dataset-independent checks; returns the float64 matrix or raises 422 on ``field``."""
    array = np.asarray(matrix)
    if array.ndim != 2:
        raise InvalidInput(field, f"must be a 2-D matrix (d x m); got {array.ndim} dimensions")
    if array.dtype.kind not in "iuf":
        raise InvalidInput(field, f"must hold real numbers; got dtype {array.dtype}")
    d, m = (int(size) for size in array.shape)
    if d < 1 or m < 1:
        raise InvalidInput(field, f"must have at least one row and one column; got {d} x {m}")
    if m > d:
        raise InvalidInput(field, f"has m={m} columns, more than its d={d} rows: m <= d")
    if 8 * d * m > MAX_PRIOR_BYTES:
        raise InvalidInput(
            field, f"{d} x {m} is above the limit of {size_text(MAX_PRIOR_BYTES)} of float64"
        )
    values = array.astype(np.float64)
    if not np.all(np.isfinite(values)):
        raise InvalidInput(field, "must be finite (no NaN or infinity)")
    ok, deviation = is_orthonormal(values, ORTHONORMAL_TOLERANCE)
    if not ok:
        raise InvalidInput(
            field,
            f"columns are not orthonormal: max |P^T P - I| = {deviation:.3g} > "
            f"{ORTHONORMAL_TOLERANCE:g} (orthonormalise it yourself, e.g. numpy.linalg.qr; the "
            "service never changes a prior, as a non-orthonormal map could lengthen rows past "
            "their declared bound)",
        )
    return values


def _inline_matrix(raw: Any) -> FloatArray:
    field = f"params.{BASIS_FIELD}"
    rows_ok = isinstance(raw, list) and all(isinstance(row, list) for row in raw)
    numbers_ok = rows_ok and all(
        isinstance(value, int | float) and not isinstance(value, bool)
        for row in raw
        for value in row
    )
    if not numbers_ok:
        raise InvalidInput(field, "must be a list of d rows, each a list of m numbers")
    if len({len(row) for row in raw}) > 1:
        raise InvalidInput(field, "every row must have the same number (m) of columns")
    try:
        array = np.array(raw, dtype=np.float64)
    except OverflowError:
        raise InvalidInput(field, "must be finite (no NaN or infinity)") from None
    return check_matrix(array, field)


def split_params(params: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(the mechanism's params, the prior's keys)`` of a request's or a stored release's
    params: the mechanism never sees the prior's keys."""
    prior_keys = (BASIS_FIELD, *STORED_FIELDS)
    rest = {key: value for key, value in params.items() if key not in prior_keys}
    return rest, {key: params[key] for key in prior_keys if key in params}


def _load(session: Session, prior_id: uuid.UUID) -> Prior | None:
    return session.execute(
        select(Prior).where(Prior.id == prior_id).options(undefer(Prior.basis))
    ).scalar_one_or_none()


def matrix_of(row: Prior) -> FloatArray:
    return np.frombuffer(row.basis, dtype="<f8").reshape(row.n_rows, row.n_cols).copy()


def resolve(
    session: Session, principal: Principal, params: dict[str, Any], *, persist: bool
) -> PublicPrior | None:
    """The prior a request names, checked on its own (not yet against the dataset), or ``None``.

    An inline prior is stored (``persist``, a real request) so that the worker can read it;
    an identical stored prior (same digest and shape) is reused. A dry run stores nothing."""
    _, given = split_params(params)
    for recorded in STORED_FIELDS[1:]:
        if recorded in given:
            raise InvalidInput(f"params.{recorded}", "set by the service; give prior_id")
    if BASIS_FIELD in given and given.get(ID_FIELD) is not None:
        raise InvalidInput(f"params.{ID_FIELD}", "give prior_basis or prior_id, not both")
    if given.get(BASIS_FIELD) is not None:
        matrix = _inline_matrix(given[BASIS_FIELD])
        prior = PublicPrior(matrix, digest(matrix), field=f"params.{BASIS_FIELD}")
        if not persist:
            return prior
        return _store_inline(session, principal, prior)
    raw_id = given.get(ID_FIELD)
    if raw_id is None:
        return None
    field = f"params.{ID_FIELD}"
    if not isinstance(raw_id, str):
        raise InvalidInput(field, "must be a prior's id (a UUID string from POST /v1/priors)")
    try:
        prior_id = uuid.UUID(raw_id)
    except ValueError:
        raise InvalidInput(
            field, "must be a prior's id (a UUID string from POST /v1/priors)"
        ) from None
    row = _load(session, prior_id)
    if row is None:
        raise InvalidInput(field, f"no prior {prior_id} (upload one with POST /v1/priors)")
    return PublicPrior(matrix_of(row), row.sha256, row.id, field)


def _store_inline(session: Session, principal: Principal, prior: PublicPrior) -> PublicPrior:
    d, m = prior.matrix.shape
    existing = session.execute(
        select(Prior.id)
        .where(Prior.sha256 == prior.sha256, Prior.n_rows == d, Prior.n_cols == m)
        .limit(1)
    ).scalar_one_or_none()
    if existing is None:
        row = _new_row(principal, prior.matrix, prior.sha256, None, "inline")
        session.add(row)
        session.flush()
        _record(session, principal, row)
        existing = row.id
    return PublicPrior(prior.matrix, prior.sha256, existing, prior.field)


def _new_row(
    principal: Principal, matrix: FloatArray, sha256: str, name: str | None, source: str
) -> Prior:
    return Prior(
        id=uuid.uuid4(),
        name=name,
        creator_key_id=principal.key_id,
        source=source,
        n_rows=int(matrix.shape[0]),
        n_cols=int(matrix.shape[1]),
        sha256=sha256,
        created_at=utcnow(),
        basis=canonical_bytes(matrix),
    )


def check_for_release(
    prior: PublicPrior, mechanism: Mechanism[Any], n_cols: int, k: int, by_reference: bool
) -> None:
    """The checks against the dataset and the request (422 on the prior's field)."""
    d, m = prior.matrix.shape
    if mechanism.continual:
        raise InvalidInput(
            prior.field, f"{mechanism.name} follows a growing dataset and takes no prior"
        )
    if by_reference:
        raise InvalidInput(prior.field, "not available for a dataset registered by reference")
    if d != n_cols:
        raise InvalidInput(
            prior.field, f"has d={d} rows; it must have one per dataset column ({n_cols})"
        )
    if mechanism.releases_basis and m < k:
        raise InvalidInput(prior.field, f"has m={m} columns, fewer than k={k}: m >= k")


def read_upload(path: Path, suffix: str) -> FloatArray:
    """A ``.npy`` prior file, checked (422 on ``file``); no pickles."""
    if suffix != ".npy":
        raise InvalidInput("file", "a prior is a .npy file (a 2-D float array, no pickles)")
    if path.stat().st_size > MAX_PRIOR_BYTES + 4096:
        raise InvalidInput("file", f"above the limit of {size_text(MAX_PRIOR_BYTES)}")
    # The header first: a shape the body does not hold is refused before np.load allocates it.
    npy_header(path)
    try:
        with path.open("rb") as handle:
            array = np.load(handle, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise InvalidInput("file", f"not a readable .npy array ({type(exc).__name__})") from None
    if not isinstance(array, np.ndarray):
        raise InvalidInput("file", "not a .npy array")
    return check_matrix(array, "file")


def create(session: Session, principal: Principal, matrix: FloatArray, name: str | None) -> Prior:
    """Store an uploaded (already checked) prior."""
    require_role(principal, *ROLES)
    row = _new_row(principal, matrix, digest(matrix), name, "upload")
    session.add(row)
    session.flush()
    _record(session, principal, row)
    return row


def _record(session: Session, principal: Principal, row: Prior) -> None:
    """A ``prior_stored`` audit event: which key stored which bytes (their digest)."""
    audit.record(
        session,
        "prior_stored",
        actor_key_id=principal.key_id,
        details={
            "prior_id": row.id,
            "name": row.name,
            "source": row.source,
            "d": row.n_rows,
            "m": row.n_cols,
            "sha256": row.sha256,
        },
    )


def get(session: Session, principal: Principal, prior_id: uuid.UUID, *, with_basis: bool) -> Prior:
    require_role(principal, *ROLES)
    row = _load(session, prior_id) if with_basis else session.get(Prior, prior_id)
    if row is None:
        raise NotFound(f"no prior {prior_id}")
    return row


def page(session: Session, principal: Principal, limit: int, cursor: str | None) -> Page[Prior]:
    """Newest first by ``(created_at desc, id)``, after ``cursor``; every prior (public)."""
    require_role(principal, *ROLES)
    total = session.execute(select(func.count()).select_from(Prior)).scalar_one()
    query = select(Prior)
    if cursor is not None:
        created_at, prior_id = parse_time_id_cursor(cursor, PRIOR_CURSOR, PRIOR_SCOPE)
        query = query.where(
            or_(
                Prior.created_at < created_at,
                and_(Prior.created_at == created_at, Prior.id > prior_id),
            )
        )
    rows = list(
        session.execute(
            query.order_by(Prior.created_at.desc(), Prior.id).limit(limit + 1)
        ).scalars()
    )
    more = len(rows) > limit
    rows = rows[:limit]
    following = (
        time_id_cursor(PRIOR_CURSOR, PRIOR_SCOPE, rows[-1].created_at, rows[-1].id)
        if more
        else None
    )
    return Page(items=rows, total=total, next=following)


def stored_prior(session: Session, recorded: dict[str, Any]) -> PublicPrior | None:
    """The prior a stored release's params name, its digest checked; ``None`` when they name
    none. Raises ``LookupError`` if it is gone or its bytes no longer match the digest."""
    raw_id = recorded.get(ID_FIELD)
    if raw_id is None:
        return None
    row = _load(session, uuid.UUID(str(raw_id)))
    if row is None:
        raise LookupError(f"prior {raw_id} is gone")
    matrix = matrix_of(row)
    if digest(matrix) != recorded.get(SHA256_FIELD) or not math.isfinite(float(matrix.sum())):
        raise LookupError(f"prior {raw_id} no longer matches its recorded digest")
    return PublicPrior(matrix, row.sha256, row.id)
