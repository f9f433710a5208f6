"""A new release's row written as one prebuilt insert, its object then held as if read.

Why: :func:`service.releases.queue_release` wrote the new :class:`Release` through the ORM
(``session.add`` and a flush before its charge, whose entry names it). That flush, the unit of
work's bookkeeping around one ``INSERT``, was the largest single item of a release's creating
transaction (1.75 ms of the API's CPU at load 9-19, docs/benchmarks.md, "Release fixed cost,
fourth pass"). The same row is now written at once on the transaction's connection, as the
charge's ledger entry and the audit event are, and the object becomes persistent in the
session without a flush: the route reads it back from the session as before, and the
statements run are the same ``INSERT``, in the same place (before the charge).
"""

from __future__ import annotations

import typing
import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import Column, Table, bindparam, insert, inspect, select
from sqlalchemy.orm import Session, make_transient_to_detached
from sqlalchemy.orm.util import identity_key

from service.db.models import Dataset, Release
from service.db.prepared import Prepared

#: The release's insert, built once and compiled once per dialect (:mod:`service.db.prepared`).
_INSERT_RELEASE = Prepared(insert(typing.cast(Table, Release.__table__)))

#: ``(attribute, column)`` of every column loaded with a release's row (deferred ones are
#: loaded only when asked for, as for a release read from the database).
_LOADED: tuple[tuple[str, Column[Any]], ...] = tuple(
    (prop.key, typing.cast(Column[Any], prop.columns[0]))
    for prop in inspect(Release).column_attrs
    if not prop.deferred
)


def _default(column: Column[Any]) -> Any:
    """The value the ORM's flush would have written for a column left unset: its scalar
    default, else null (a column with a computed default, the id and ``created_at``, is set
    by every caller)."""
    default = column.default
    if default is None:
        return None
    if not default.is_scalar:
        raise ValueError(f"releases.{column.name} has a computed default: set it")
    return getattr(default, "arg", None)


def insert_release(session: Session, release: Release) -> None:
    """Write ``release`` (new, not in any session) as one ``INSERT`` on the transaction's
    connection, then make it persistent in ``session`` with what was written as its loaded
    state: no flush writes it again. Raises what the insert raises (an ``IntegrityError`` for
    a duplicate idempotency key), the object then left out of the session."""
    state = release.__dict__
    values: dict[str, Any] = {}
    for key, column in _LOADED:
        if key not in state:
            setattr(release, key, _default(column))
        values[column.name] = state[key]
    _INSERT_RELEASE.run(session.connection(), values)
    # As if read: the values set become its committed state (nothing to flush), the deferred
    # columns are loaded when first asked for.
    make_transient_to_detached(release)
    session.add(release)


#: Key in ``Session.info``: the deletion moments of datasets read with a release by
#: :func:`read_release`, by dataset id; :func:`service.visibility.dataset_deleted_at` answers
#: from it without a statement of its own.
HELD_DELETED_AT = "dpss_held_deleted_at"

#: A release with its dataset's deletion moment, built once (:func:`read_release`).
_RELEASE_WITH_DELETION = (
    select(Release, Dataset.deleted_at)
    .outerjoin(Dataset, Dataset.id == Release.dataset_id)
    .where(Release.id == bindparam("release_id"))
)


def read_release(session: Session, release_id: uuid.UUID) -> Release | None:
    """``session.get(Release, release_id)``, with the dataset's deletion moment read in the
    same statement when the release is not in the session yet (held in
    :data:`HELD_DELETED_AT`).

    Why: every read of a release that shows it (``GET /v1/releases/{id}``, each read of a long
    poll, the read after the worker's hint) asks :func:`service.visibility.view` for that
    moment, a second statement (``SELECT datasets.deleted_at``) of its own. Read here for
    every release, whatever its state and whoever asks: what is read still depends on nothing
    a worker stored (one statement where there were one or two)."""
    if identity_key(Release, release_id) in session.identity_map:
        return session.get(Release, release_id)
    row = session.execute(_RELEASE_WITH_DELETION, {"release_id": release_id}).one_or_none()
    if row is None:
        return None
    release: Release = row[0]
    deleted_at: datetime | None = row[1]
    session.info.setdefault(HELD_DELETED_AT, {})[release.dataset_id] = deleted_at
    return release
