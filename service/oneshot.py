"""One-shot releases as a job kind (:class:`service.jobs.JobKind`): one run, one outcome.

The work is the claimed job itself: its mechanism runs once on the rows present at the request
(``n_rows``), in the worker's isolated process, and the outcome ends the job. Which faults are
``failed`` (refunded or not) and why any other exception is a ``no_result`` with a fixed reason
is the worker's module docstring, "Outcomes".
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from pydantic import ValidationError
from sqlalchemy import ColumnElement
from sqlalchemy.orm import Session

from service import reference, visibility
from service.config import Settings
from service.db.models import Release
from service.errors import safe_traceback
from service.jobs import (
    ABANDONED_REASON,
    DATASET_DELETED_REASON,
    DATASET_FILE_FAULT_REASON,
    NO_MECHANISM_REASON,
    NO_RELEASE_REASON,
    REFUSED_AT_RUN_REASON,
    ClaimedJob,
    End,
    Outcome,
    RunContext,
)
from service.mechanisms.base import InvalidParameter, Mechanism, ReleaseSpec
from service.mechanisms.noise import secure_generator
from service.mechanisms.registry import get_mechanism

log = logging.getLogger("dpss.worker")


def execute(job: ClaimedJob, context: RunContext) -> Outcome:
    """Run the mechanism and turn whatever happens into an :class:`Outcome` (never raises an
    ``Exception``)."""
    mechanism = get_mechanism(job.mechanism)
    if mechanism is None:
        return Outcome.failed(NO_MECHANISM_REASON)
    try:
        params = mechanism.parse_params(job.params)
    except (ValidationError, InvalidParameter):
        return Outcome.failed(REFUSED_AT_RUN_REASON)
    spec = ReleaseSpec(k=job.k, epsilon=job.epsilon, delta=job.delta, params=params)
    if job.file_name is None:
        return Outcome.failed(DATASET_DELETED_REASON, refund=True)
    if job.reference is not None:
        return _execute_reference(job, mechanism, spec, context)
    try:
        data = context.store.open(job.file_name, job.n_rows)
    except FileNotFoundError:
        # Deleted (or lost) between the claim and the open: nothing was read.
        return Outcome.failed(DATASET_FILE_FAULT_REASON, refund=True)
    return _run(job, mechanism, data, spec)


def _execute_reference(
    job: ClaimedJob, mechanism: Mechanism[Any], spec: ReleaseSpec[Any], context: RunContext
) -> Outcome:
    """A dataset by reference: its objects checked unchanged before and after the run, the
    heavy passes on Dask or in process; a :class:`~service.reference.ReferenceFault` (a
    changed object, a failed cluster: nothing released) is ``failed`` and refunded."""
    assert job.reference is not None
    try:
        with reference.open_rows(job.reference, context.settings) as rows:
            outcome = _run(job, mechanism, rows, spec, reraise=reference.ReferenceFault)
            rows.check_unchanged()
            return outcome
    except reference.ReferenceFault as fault:
        log.warning("release %s: %s", job.release_id, fault.reason)
        return Outcome.failed(fault.reason, refund=fault.refund)


def _run(
    job: ClaimedJob,
    mechanism: Mechanism[Any],
    data: Any,
    spec: ReleaseSpec[Any],
    reraise: type[Exception] | None = None,
) -> Outcome:
    try:
        return Outcome.of(mechanism.run(data, spec, secure_generator()))
    except InvalidParameter:
        return Outcome.failed(REFUSED_AT_RUN_REASON)
    except Exception as exc:
        if reraise is not None and isinstance(exc, reraise):
            raise
        log.error(
            "BUG: release %s: mechanism %s raised %s; recorded as no_result",
            job.release_id,
            job.mechanism,
            safe_traceback(exc),
        )
        return Outcome(status="no_result", reason=NO_RELEASE_REASON, extras={})


class OneShot:
    """The job kind of every release whose mechanism is not continual."""

    resumable = False

    def first(self, job: ClaimedJob, context: RunContext) -> ClaimedJob | End:
        if job.file_name is None:
            return End(Outcome.failed(DATASET_DELETED_REASON, refund=True))
        if job.reference is None:
            fault = context.store.fault(job.file_name, job.n_rows)
            if fault is not None:
                # Not a fault of the data: ended at once (no retries), refunded, nothing read.
                log.error("release %s: its dataset file %s", job.release_id, fault)
                return End(Outcome.failed(DATASET_FILE_FAULT_REASON, refund=True))
        return job

    def load(
        self, session: Session, release: Release, job: ClaimedJob, settings: Settings
    ) -> ClaimedJob | End | str:
        # The one work is known from the claim (first); a one-shot job never loads.
        raise AssertionError("a one-shot release has one work, given at its claim")

    def run(self, work: ClaimedJob, context: RunContext) -> Outcome:
        return execute(work, context)

    def save(
        self,
        session: Session,
        release: Release,
        job: ClaimedJob,
        work: ClaimedJob,
        result: Outcome,
        settings: Settings,
    ) -> End:
        return End(result)

    def saved(self, job: ClaimedJob, work: ClaimedJob) -> None:
        return None

    def shown_at(self, release: Release, ended_at: datetime) -> datetime | None:
        """Late or not, analysts see the outcome (and the refund) only at a step of the
        release's public schedule (:mod:`service.visibility`)."""
        if visibility.is_late(release, ended_at):
            log.warning(
                "release %s: %s ended after its visible_at (late; shown at the next step "
                "of its schedule)",
                release.id,
                release.mechanism,
            )
        return visibility.shown_at(release, ended_at)

    def abandoned(self, session: Session, release: Release, settings: Settings) -> End:
        return End(Outcome.failed(ABANDONED_REASON))

    def waiting_claimable(self) -> list[ColumnElement[bool]] | None:
        return None


ONE_SHOT = OneShot()
