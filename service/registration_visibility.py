"""When owners and analysts may see a registration by reference (or a batch by reference) end.

The workers share one queue (a registration in the releases' order, by its request:
:func:`service.claims.registration_ahead`; before, only when no release was waiting), so the
moment a registration ends follows the end of the jobs ahead of it, on *any* dataset, whose
run time may depend on one of their rows (a release run 0.15 s longer moved the moment
``registration_status`` changed by 0.17 s on average, before this). The registration is
padded as a release is (:mod:`service.padding`):

- at the request, ``visible_at = requested_at + padding`` from public facts only: the
  modelled time of the one-shot releases requested before it and not past their own
  ``visible_at`` (the release padding's queue term), then the release padding's floor
  (``DPSS_RELEASE_PADDING_FLOOR_SECONDS``; nothing about the objects is known before a read,
  and the owner's choice of URI and columns is all there is);
- at its end, the worker stores ``shown_at``, the first step of
  :func:`service.padding.late_schedule` at or after the real end: ``visible_at`` if it ended by
  then, else ``requested_at + padding * 2^j``. A late registration reveals ``j`` only.

Until ``shown_at`` (and while it is not stored) every caller but the roles trusted with run
times (:func:`service.auth.sees_real_state`: admins, auditors) is shown the registration as
it was requested: ``registering``, no reason, no rows (a batch: ``batch_status
registering``, the dataset's rows and batches without it). So are the decisions an owner or
analyst can observe: a release, dry run or grant is refused ``dataset_not_ready`` (and a
next batch ``batch_registering``) until then, analysts list the dataset from then, and a
one-shot release reads the rows shown (:func:`shown_rows`), not a batch still hidden.

Whether a registration ends ``ready`` or ``failed`` depends only on the owner's own objects,
which the owner holds: the reason is shown to them from ``shown_at``. The leak closed here is
the *moment*, which depended on other datasets' jobs.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, and_, case, or_

from service.auth import Principal, sees_real_state
from service.config import Settings
from service.db.models import Dataset
from service.padding import MAX_PADDING_SECONDS, late_schedule

REGISTERING = "registering"

#: SQL: the request of a dataset's pending registration by reference, else of its pending
#: batch (``datasets.batch_requested_at``): its public place in the workers' order, which is
#: the releases' (their request; :func:`service.claims.registration_ahead`).
REQUESTED = case(
    (Dataset.registration_status == REGISTERING, Dataset.created_at),
    else_=Dataset.batch_requested_at,
)


def padding(settings: Settings, queue_seconds: float = 0.0) -> timedelta:
    """The padding of a registration or a batch by reference: the release padding's floor, a
    public setting (no read precedes the request, so no shape is known), after the modelled
    time of the one-shot releases ahead (:func:`service.padding_queue.queue_seconds`: those
    requested before it and not past their own ``visible_at``). Without that term a
    registration (which costs no budget) requested behind a long release showed at its
    ``visible_at`` or a late step according to whether that release had really ended, long
    before the release's own ``visible_at``."""
    floor = max(settings.release_padding_floor_seconds, 0.0)
    if floor <= 0:
        return timedelta(0)  # padding off: shown as stored
    return timedelta(seconds=min(floor + max(queue_seconds, 0.0), MAX_PADDING_SECONDS))


def visible_at(
    requested_at: datetime, settings: Settings, queue_seconds: float = 0.0
) -> datetime | None:
    """``requested_at + padding``; ``None`` (shown as stored) when padding is off."""
    pad = padding(settings, queue_seconds)
    return requested_at + pad if pad > timedelta(0) else None


def shown_at(requested_at: datetime, visible: datetime | None, ended_at: datetime) -> datetime:
    """When a registration requested at ``requested_at`` and ending at ``ended_at`` shows."""
    if visible is None:
        return ended_at
    return late_schedule(requested_at, visible, ended_at)[0]


def registration_hidden(dataset: Dataset, now: datetime) -> bool:
    """Whether the dataset's own registration is shown as requested (``registering``)."""
    if dataset.registration_visible_at is None:
        return False
    return dataset.registration_shown_at is None or now < dataset.registration_shown_at


def batch_hidden(dataset: Dataset, now: datetime) -> bool:
    """Whether the dataset's pending batch by reference is shown as still ``registering``."""
    if dataset.batch_visible_at is None:
        return False
    return dataset.batch_shown_at is None or now < dataset.batch_shown_at


@dataclass(frozen=True)
class Shown:
    """What a caller may see of a dataset's registration and its batch by reference."""

    registration_status: str
    registration_reason: str | None
    n_rows: int
    n_cols: int
    n_batches: int
    batch_status: str | None
    batch_reason: str | None
    #: The dataset's ``reference`` record, or ``None`` while its registration is hidden.
    reference: dict[str, Any] | None


def shown(dataset: Dataset, principal: Principal | None, now: datetime) -> Shown:
    """The dataset as ``principal`` may see it at ``now`` (module docstring). ``None``: a
    caller with no role (the service's own checks), shown the padded state."""
    real = Shown(
        registration_status=dataset.registration_status,
        registration_reason=dataset.registration_reason,
        n_rows=dataset.n_rows,
        n_cols=dataset.n_cols,
        n_batches=dataset.n_batches,
        batch_status=dataset.batch_status,
        batch_reason=dataset.batch_reason,
        reference=dataset.reference,
    )
    if principal is not None and sees_real_state(principal):
        return real
    if registration_hidden(dataset, now):
        columns = (dataset.registration_request or {}).get("columns") or []
        return Shown(
            registration_status=REGISTERING,
            registration_reason=None,
            n_rows=0,
            n_cols=len(columns) if columns else dataset.n_cols,
            n_batches=dataset.n_batches,
            batch_status=None,
            batch_reason=None,
            reference=None,
        )
    if batch_hidden(dataset, now):
        prior = dataset.batch_prior_rows
        counted = prior is not None and dataset.batch_status is None
        return Shown(
            registration_status=dataset.registration_status,
            registration_reason=dataset.registration_reason,
            n_rows=prior if prior is not None and counted else dataset.n_rows,
            n_cols=dataset.n_cols,
            n_batches=dataset.n_batches - 1 if counted else dataset.n_batches,
            batch_status=REGISTERING,
            batch_reason=None,
            reference=dataset.reference,
        )
    return real


def shown_rows(dataset: Dataset, now: datetime) -> int:
    """The rows a release requested at ``now`` may read: not a batch still hidden."""
    return shown(dataset, None, now).n_rows


def listed_when_ready(now: datetime | ColumnElement[Any]) -> ColumnElement[bool]:
    """SQL: the dataset's registration is ``ready`` and shown at ``now`` (analysts' list)."""
    columns = Dataset.__table__.c
    return and_(
        columns.registration_status == "ready",
        or_(
            columns.registration_visible_at.is_(None),
            and_(
                columns.registration_shown_at.is_not(None),
                columns.registration_shown_at <= now,
            ),
        ),
    )


def registering_as_shown(now: datetime) -> tuple[ColumnElement[bool], ColumnElement[bool]]:
    """SQL: the dataset's own registration, and its batch, still ``registering`` as shown at
    ``now`` (really, or ended and not yet shown: :func:`registration_hidden`,
    :func:`batch_hidden`). A decision any owner can observe (such as refusing a URI that
    overlaps a registration in progress) must use these, not the real status, which changes
    when a worker ends the job: the moment the queue ahead of it drained."""
    columns = Dataset.__table__.c
    registration = or_(
        columns.registration_status == REGISTERING,
        and_(
            columns.registration_visible_at.is_not(None),
            or_(columns.registration_shown_at.is_(None), columns.registration_shown_at > now),
        ),
    )
    batch = or_(
        columns.batch_status == REGISTERING,
        and_(
            columns.batch_visible_at.is_not(None),
            or_(columns.batch_shown_at.is_(None), columns.batch_shown_at > now),
        ),
    )
    return registration, batch
