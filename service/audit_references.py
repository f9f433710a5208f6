"""A dataset by reference's record against its audit events, for :mod:`service.audit_reconcile`.

A dataset by reference is charged for the objects, row groups and chunk digests its record
names; the ``dataset_referenced`` and ``dataset_batch_referenced`` events fix that record (its
digest and row count), so an edit to the record (a row group counted twice, other objects,
other accepted bytes) or to ``dataset_reference_objects`` (which refuses a second dataset on
the same object) is a problem :func:`check_reference` names, never a stored value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from service.audit_events import record_digest, to_json_value

__all__ = ["REFERENCED", "Referenced", "check_reference"]


@dataclass(frozen=True)
class Referenced:
    """What a dataset by reference's ``dataset_referenced`` and ``dataset_batch_referenced``
    events say its ``datasets.reference`` holds: the newest event's digest of the whole record
    (None for events written before they carried one), and every event's objects in order."""

    seq: int
    sha256: str | None
    objects: tuple[Any, ...]
    #: The dataset's rows after the event (a release reads that prefix of the row groups).
    n_rows: Any = None


#: The events that fix a dataset by reference's record (registration, then each batch).
REFERENCED = ("dataset_referenced", "dataset_batch_referenced")


def _covered(raw: Any) -> list[tuple[str, str, str]] | None:
    """``(object_key, key_sha256, content_sha256)`` of each object the record covers, as
    registration wrote them (:meth:`~service.reference.integrity.Reference.covered`); None for
    a record from before content digests (it covers nothing, and its releases are refused)."""
    from service.reference.integrity import Reference  # pyarrow: only when a reference is seen

    found = Reference.from_json(raw, None)
    return found.covered() if found.digested else None


def check_reference(
    where: str,
    raw: Any,
    n_rows: int,
    covered: set[tuple[str, str, str]],
    referenced: Referenced | None,
    problems: list[str],
) -> None:
    """A live dataset by reference's record (every object, row group and chunk digest its
    releases read, and its row count) as its events recorded it: an edit could count a row
    group twice, point the budget at other objects, or accept other bytes, all outside every
    charge's check."""
    if referenced is None:
        problems.append(f"{where}: a reference without its dataset_referenced event")
        return
    try:
        expected = _covered(raw)
    except (KeyError, TypeError, ValueError, IndexError):
        problems.append(f"{where}: its reference is not in the form this version writes")
        return
    if expected is not None and covered != set(expected):
        # A cover row removed lets another dataset register the same object (a second budget
        # on its rows); one added or changed refuses others' objects.
        problems.append(
            f"{where}: dataset_reference_objects differs from the objects its reference covers"
        )
    if referenced.n_rows is not None and n_rows != referenced.n_rows:
        problems.append(f"{where}: n_rows of its reference differs from event {referenced.seq}")
    if referenced.sha256 is not None:
        if record_digest(raw) != referenced.sha256:
            problems.append(
                f"{where}: its reference (objects, row groups or digests) differs from the "
                f"one event {referenced.seq} recorded"
            )
    elif not isinstance(raw, dict) or to_json_value({"o": raw.get("objects")})["o"] != list(
        referenced.objects
    ):
        # Events written before they carried the digest: the objects' identities and footer
        # digests, which fix every row group's place and row count, must be theirs.
        problems.append(
            f"{where}: its reference's objects differ from those its dataset_referenced and "
            "dataset_batch_referenced events recorded"
        )
