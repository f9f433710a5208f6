"""A continual epoch's public moments (:func:`epoch_padding`: what the worker computes when
it claims the epoch) and the padding's term for the pending epochs (:func:`epoch_seconds`): a
release or a registration requested after a batch was appended waits behind the batch's epoch,
so its padding counts that epoch until the epoch's next public moment.

Apart from :mod:`service.continual` (which imports :mod:`service.jobs`, which imports
:mod:`service.releases`, which pads with :func:`epoch_seconds`) and from
:mod:`service.padding_queue` (an epoch's own queue term, :func:`act_queue_seconds`, is
:func:`service.padding_queue.queue_seconds`).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Select, and_, bindparam, exists, func, or_, select
from sqlalchemy.orm import Session

from service.config import Settings
from service.db.models import Dataset, DatasetBatch, Release, ReleaseEpoch, utcnow
from service.mechanisms.registry import MECHANISMS
from service.padding import PaddingModel, next_late_step
from service.padding_queue import padding_model, queue_seconds


def continual_names() -> list[str]:
    """The registered continual mechanisms."""
    return [name for name, mechanism in MECHANISMS.items() if mechanism.continual]


def epoch_visible_at(
    release_visible_at: datetime | None,
    batch_created_at: datetime,
    padding: timedelta,
    previous_visible_at: datetime | None = None,
) -> datetime:
    """When analysts may see an epoch: its batch's commit time plus the padding of one epoch's
    work on that batch (:mod:`service.padding`, public facts only), never before the release's
    own ``visible_at`` nor before the previous epoch (so epochs appear in order). The worker
    runs the epoch after the batch commits, so as for one-shot releases, polling says nothing
    about how long it ran within the padding."""
    candidates = [batch_created_at + padding, release_visible_at, previous_visible_at]
    return max(moment for moment in candidates if moment is not None)


def epoch_padding(
    session: Session, settings: Settings, release: Release, dataset: Dataset, epoch: int
) -> tuple[datetime, timedelta]:
    """:func:`service.continual.pending_padding` of epoch ``epoch`` (its batch ``epoch - 1``,
    after epoch ``epoch - 1``): what the worker computes when it claims that epoch, from public
    facts only, so that a release requested while it is pending computes the same before any
    worker does (:func:`epoch_seconds`)."""
    batch = session.get(DatasetBatch, (dataset.id, epoch - 1))
    n_rows = batch.n_rows if batch is not None else dataset.n_rows
    started = batch.created_at if batch is not None else None
    moments = [moment for moment in (started, dataset.deleted_at) if moment is not None]
    act = max(moments) if moments else utcnow()
    padding = PaddingModel.from_settings(settings).padding(
        release.mechanism,
        n_rows,
        dataset.n_cols,
        release.k,
        release.params,
        act_queue_seconds(session, settings, act),
    )
    # The epoch before it (the latest stored when the worker claims this one: epochs are
    # stored in order).
    previous = session.get(ReleaseEpoch, (release.id, epoch - 1)) if epoch > 1 else None
    moment = epoch_visible_at(
        release.visible_at, act, padding, previous.visible_at if previous is not None else None
    )
    return moment, padding


def act_queue_seconds(session: Session, settings: Settings, act: datetime) -> float:
    """The padding's queue term at ``act`` (an owner's append or deletion, which gives a
    waiting continual release work): the modelled time of the one-shot releases requested by
    then and not yet past their own ``visible_at`` (:func:`service.padding_queue.
    queue_seconds`; every input fixed when they were requested, so the worker computes the same
    later). The epoch runs behind them on the workers' one queue: padded as if they were not
    there, it showed late exactly when one of them (any dataset's, its run time possibly
    depending on one row) had not yet ended, long before that one's own ``visible_at``
    (``tests/continual/test_epoch_behind_a_long_job.py``)."""
    # Not the registrations by reference pending at the act (:func:`service.padding_queue.
    # registration_seconds`): a batch's moments are overwritten by the dataset's next batch,
    # so a worker computing this after that request would not see what was pending at the act
    # and the epoch's visible_at would follow when the worker got to it. Nor the epochs
    # pending at the act (:func:`epoch_seconds`): an epoch's moment would then follow another
    # release's epochs, each computed from the one before; the gap is in docs/security.md.
    return queue_seconds(session, padding_model(session, settings, act), act, registrations=False)


def epoch_seconds(session: Session, settings: Settings, now: datetime) -> float:
    """Until the next public moment of the latest pending epoch at ``now``: for each
    continual release requested by ``now`` whose end is not shown, its first epoch not shown
    at ``now`` if that epoch's batch was appended by ``now`` (stored or not: a worker may
    still be on it). Its moment is its ``visible_at``, or past it the next step of its late
    schedule, both from :func:`service.continual.epoch_padding`, which the worker computes
    when it claims the epoch: public facts fixed at the batch's commit (the one-shot jobs
    requested by then, never a release requested after the batch, so no cycle with this
    term), the same whether the epoch is queued, running or stored.

    Why: a worker takes a pending epoch before any one-shot job requested after its batch
    (:func:`service.claims.waiting_first`), so a release requested meanwhile waits behind the
    epoch. Padded as if it were not there (an epoch on a large batch is padded far more than a
    cheap probe), a probe showed at its ``visible_at`` if the epoch had ended (or had not
    begun: a job ahead of it still ran) and a step later if the worker was still on it:
    anyone read the epoch's real end, and through it whether the jobs ahead of it had ended
    (``tests/continual/test_probe_behind_an_epoch.py``).

    Not counted: an epoch after the first one not shown (its ``visible_at`` follows the one
    before's shown moment, not known until that one shows; docs/security.md, "Left"), and
    the release's end after its dataset's deletion (the worker reads nothing for it)."""
    continual = continual_names()
    if not continual:
        return 0.0
    longest = 0.0
    for release, dataset, shown in session.execute(_pending(tuple(continual)), {"now": now}):
        epoch = int(shown) + 1
        if epoch > int(release.params.get("horizon", 0)):
            continue
        visible, padding = epoch_padding(session, settings, release, dataset, epoch)
        wait = (next_late_step(visible - padding, visible, now) - now).total_seconds()
        longest = max(longest, wait)
    return longest


def _pending(continual: tuple[str, ...]) -> Select[Any]:
    """The continual releases requested by ``now``, their end not shown at ``now``, their
    dataset not deleted by ``now``, and whose first epoch not shown at ``now`` has its batch
    appended by ``now``; with the number of epochs shown (visible by ``now``)."""
    now: Any = bindparam("now")
    shown = (
        select(func.count())
        .select_from(ReleaseEpoch)
        .where(ReleaseEpoch.release_id == Release.id, ReleaseEpoch.visible_at <= now)
        .correlate(Release)
        .scalar_subquery()
    )
    appended = (
        exists()
        .where(
            DatasetBatch.dataset_id == Release.dataset_id,
            DatasetBatch.seq == shown,
            DatasetBatch.created_at <= now,
        )
        .correlate(Release)
    )
    return (
        select(Release, Dataset, shown)
        .join(Dataset, Dataset.id == Release.dataset_id)
        .where(
            Release.mechanism.in_(continual),
            Release.created_at <= now,
            or_(
                and_(
                    Release.outcome_visible_at.is_(None),
                    Release.status.in_(("queued", "running")),
                ),
                Release.outcome_visible_at > now,
            ),
            or_(Dataset.deleted_at.is_(None), Dataset.deleted_at > now),
            appended,
        )
    )
