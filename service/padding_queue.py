"""The padding's queue term, shared by releases and registrations by reference: the modelled
time of the one-shot jobs requested before a job and not yet past their own ``visible_at``
(public facts fixed at the request: :mod:`service.padding`)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, CompoundSelect, and_, bindparam, or_, select, union_all
from sqlalchemy.orm import InstrumentedAttribute, Session

from service import calibration
from service.config import Settings
from service.db.models import BatchMoments, Dataset, Release
from service.db.prepared import Prepared
from service.mechanisms.registry import MECHANISMS
from service.padding import PaddingModel, late_schedule, next_late_step


def padding_model(session: Session, settings: Settings, now: datetime) -> PaddingModel:
    """The padding model at ``now``: the settings and the calibrated rates (if on)."""
    calibrated = (
        calibration.current_rates(session, now) if settings.release_padding_calibrated else None
    )
    return PaddingModel.from_settings(settings, calibrated)


def queue_seconds(
    session: Session,
    model: PaddingModel,
    now: datetime,
    *,
    registrations: bool = True,
    epochs: float = 0.0,
    queued: bool = True,
) -> float:
    """The modelled time of the one-shot jobs ahead of a job requested at ``now``: those
    requested by ``now`` and not yet past their own ``visible_at`` (:meth:`PaddingModel.
    queue_seconds`), calibrated or not. Without it a job requested behind a long one was
    padded as if the queue were empty, and whether it showed at its ``visible_at`` or at a
    late step told its requester whether the job ahead (anyone's, on any dataset) had really
    ended, long before that job's own ``visible_at``. Plus the wait for the late jobs whose
    outcome is not shown (:func:`late_seconds`), and, with ``registrations``, for the
    registrations by reference not shown yet (:func:`registration_seconds`), and ``epochs``:
    the wait for the pending continual epochs (:func:`service.padding_epochs.epoch_seconds`,
    computed by the caller, which holds the settings an epoch's moment needs).

    ``queued=False``: the caller has seen that :data:`_QUEUE` has no row at ``now``
    (:func:`service.padding_epochs.request_queue_seconds`), so it is not read again."""
    total, wait = queue_parts(session, model, now, registrations=registrations, queued=queued)
    return total + max(wait, epochs)


def queue_parts(
    session: Session,
    model: PaddingModel,
    now: datetime,
    *,
    registrations: bool = True,
    queued: bool = True,
    only_one_shot: bool = False,
) -> tuple[float, float]:
    """:func:`queue_seconds` without the epochs' term, as ``(jobs ahead, wait)``: the term is
    ``jobs ahead + max(wait, epochs)``. Apart so that a caller with several epochs' terms at
    one moment (:func:`service.padding_epochs.epoch_padding`'s chain) reads the queue once.

    ``queued=False``: the caller has seen no one-shot row in the queue at ``now`` (the
    request's guard, the chain's idle point), so it is not read; every other term still counts.

    ``only_one_shot``: the statement itself keeps the one-shot mechanisms' rows only
    (:data:`_ONE_SHOT_QUEUE`), the very rows kept below, so the same figure. Why: the chain
    reads the queue at each pending epoch's point, and every pending continual release is a
    row there that was fetched (its params decoded) and dropped, N rows at N points: the
    chain's cost grew with the square of the epochs pending (docs/benchmarks.md)."""
    # One statement: the jobs ahead and the late ones (:func:`late_seconds`).
    if not queued:
        rows: list[Any] = []
    else:
        if session.autoflush:
            session.flush()  # as the session's execute would
        # Compiled once, run on the driver's cursor (service.db.prepared).
        connection = session.connection()
        if only_one_shot:
            names = [name for name, mechanism in MECHANISMS.items() if not mechanism.continual]
            rows = _ONE_SHOT_QUEUE_PREPARED.all(connection, {"now": now, "names": names})
        else:
            rows = _QUEUE_PREPARED.all(connection, {"now": now})
    pending = registration_seconds(session, now) if registrations else 0.0
    one_shot = [row for row in rows if row[0] in MECHANISMS and not MECHANISMS[row[0]].continual]
    ahead = [row for row in one_shot if row.visible_at > now]
    late = [(row.created_at, row.visible_at) for row in one_shot if row.visible_at <= now]
    total = model.queue_seconds(
        [
            # n_rows_read is fixed at the request for one-shot releases (the rows present
            # then); Dataset.n_rows only for rows stored before that column existed.
            (name, n_read if n_read is not None else n, d, k_, job_params or {})
            for name, n_read, n, d, k_, job_params, _, _ in ahead
        ]
    )
    return total, max(late_seconds(late, now), pending)


def _shown_unfinished(now: datetime | ColumnElement[Any]) -> ColumnElement[bool]:
    """A release past its ``visible_at`` whose outcome is not shown at ``now``: really
    unfinished (the worker stores ``outcome_visible_at`` with the end), or ended and waiting
    for its late step; shown ``running`` either way."""
    return or_(
        and_(Release.outcome_visible_at.is_(None), Release.status.in_(("queued", "running"))),
        Release.outcome_visible_at > now,
    )


#: The jobs ahead of a request at ``now`` and the late ones (:func:`queue_seconds`), built
#: once: built per request it cost 0.4 ms of CPU on each (``bench/bench_release_cpu.py``).
_QUEUE = (
    select(
        Release.mechanism,
        Release.n_rows_read,
        Dataset.n_rows,
        Dataset.n_cols,
        Release.k,
        Release.params,
        Release.created_at,
        Release.visible_at,
    )
    .join(Dataset, Dataset.id == Release.dataset_id)
    .where(
        Release.created_at <= bindparam("now"),
        Release.visible_at.is_not(None),
        or_(Release.visible_at > bindparam("now"), _shown_unfinished(bindparam("now"))),
    )
)


#: :data:`_QUEUE` for the mechanisms named ``names`` only (:func:`queue_parts`' ``only_one_shot``).
_ONE_SHOT_QUEUE = _QUEUE.where(Release.mechanism.in_(bindparam("names", expanding=True)))
#: The two, compiled once per dialect (:mod:`service.db.prepared`).
_QUEUE_PREPARED = Prepared(_QUEUE)
_ONE_SHOT_QUEUE_PREPARED = Prepared(_ONE_SHOT_QUEUE)


def late_seconds(late: list[tuple[datetime, datetime]], now: datetime) -> float:
    """Until the next step of the late schedule of the latest of the ``late`` one-shot jobs
    (``(created_at, visible_at)``: past their ``visible_at``, their outcome not shown at
    ``now``). A job requested now waits behind them; padded as if they were not there it
    showed late exactly when one of them had not ended within its floor (anyone's, on any
    dataset: a probe after a late job's ``visible_at`` read its real end to within the
    probe's floor, finer than the step of its late schedule its own analysts see;
    ``tests/api/test_probe_behind_a_late_job.py``). A function of what is shown: it changes at
    those steps only (a job counts from its ``visible_at`` until its outcome shows), whatever
    the job really does in between."""
    return max(
        (
            (next_late_step(created, visible, now) - now).total_seconds()
            for created, visible in late
        ),
        default=0.0,
    )


#: The registrations and batches by reference requested by ``now`` whose end is not shown at
#: ``now`` (:func:`registration_seconds`), one row each: ``(requested, visible, shown,
#: deleted_at)``. Built once, as :data:`_QUEUE`. Six branches, each a range of one partial
#: index (migration 0025: ``registration_shown_at`` or ``batch_shown_at`` null, or after
#: ``now``, among the rows with the matching ``visible_at``; 0027: the same on
#: ``batch_moments``), so a request reads the pending rows only: one ``WHERE`` of ``OR``
#: scanned every dataset whose registration or batch was long shown (10 ms at 10,000 datasets
#: on SQLite, each release request). ``batch_moments`` holds the batches a dataset's next
#: batch replaced on its row: at a moment one of them was pending it still counts, however
#: late the term is computed (a worker claiming an epoch late: its chain's term at the point).
_SOURCES: tuple[tuple[InstrumentedAttribute[Any], ...], ...] = (
    (Dataset.created_at, Dataset.registration_visible_at, Dataset.registration_shown_at),
    (Dataset.batch_requested_at, Dataset.batch_visible_at, Dataset.batch_shown_at),
    (BatchMoments.requested_at, BatchMoments.visible_at, BatchMoments.shown_at),
)


def _registrations(wide: bool) -> CompoundSelect[Any]:
    """:data:`_REGISTRATIONS`'s six branches: ``wide``, its columns; else one narrow column
    (the dataset's id) each, for the request's guard."""
    branches = []
    for requested, visible, shown in _SOURCES:
        kept = requested.class_ is BatchMoments
        for open_ in (shown.is_(None), shown > bindparam("now")):
            if not wide:
                columns: tuple[Any, ...] = (BatchMoments.dataset_id if kept else Dataset.id,)
            else:
                columns = (
                    requested.label("requested"),
                    visible.label("visible"),
                    shown.label("shown"),
                    Dataset.deleted_at,
                )
            branch = select(*columns).where(
                visible.is_not(None), requested <= bindparam("now"), open_
            )
            if wide and kept:
                branch = branch.join(Dataset, Dataset.id == BatchMoments.dataset_id)
            branches.append(branch)
    return union_all(*branches)


_REGISTRATIONS = _registrations(wide=True)

#: The two looks above, for the request's guard (:func:`service.padding_epochs.
#: request_queue_seconds`), which asks whether each has a row: the same rows, one narrow
#: column each (the guard's text then stays under psycopg's 4,096 characters, above which it
#: parses a statement's placeholders again on every execution: 0.3 ms of the API's CPU).
QUEUE = _QUEUE.with_only_columns(Release.id, maintain_column_froms=True)
REGISTRATIONS = _registrations(wide=False)
#: A release's end not shown at ``now`` (for the guard's look at the continual releases).
shown_unfinished = _shown_unfinished


def registration_seconds(session: Session, now: datetime) -> float:
    """Until the next public moment of the latest registration (or batch) by reference
    requested by ``now`` and not shown at ``now``: its ``visible_at``, or past it the next
    step of its late schedule (:func:`service.registration_visibility.shown_at`).

    Why: a worker takes a registration in the releases' order (by its request:
    :func:`service.claims.registration_ahead`), then reads its objects for
    as long as they take, and a job requested meanwhile waits behind the read. Padded as if
    it were not there (a probe's floor is often shorter than a registration's, and a late
    registration's read has no bound), a cheap probe showed at its ``visible_at`` if the read
    had ended, or had not begun because a release ahead still ran, and a step later if the
    worker was still reading: anyone read the registration's real end, and through it whether
    the release ahead of it had ended, long before either showed
    (``tests/reference/test_probe_behind_a_registration.py``). What is counted is what is
    shown (a registration counts until its end shows, whatever the worker really does), so
    the term changes at those public moments only. A deleted dataset's registration is never
    shown (no worker takes it again): it counts until the first step at or after the
    deletion, a public moment too.

    A batch replaced on its dataset's row by the next one counts from ``batch_moments``
    (:data:`_REGISTRATIONS`): read from the row alone, a term computed after that next
    request (a worker claiming an epoch late: the chain's term at the epoch's point) lost it,
    and the epoch's ``visible_at`` followed whether a worker had reached the claim before that
    request (``tests/continual/test_epoch_behind_an_earlier_batch.py``)."""
    longest = 0.0
    for requested, visible, shown, deleted_at in session.execute(_REGISTRATIONS, {"now": now}):
        if requested is None or visible is None or requested > now:
            continue
        if shown is not None and shown <= now:
            continue
        deleted = deleted_at is not None and deleted_at <= now
        if deleted and late_schedule(requested, visible, deleted_at)[0] <= now:
            continue
        wait = (next_late_step(requested, visible, now) - now).total_seconds()
        longest = max(longest, wait)
    return longest
