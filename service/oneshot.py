"""One-shot releases as a job kind (:class:`service.jobs.JobKind`): one run, one outcome.

The work is the claimed job itself: its mechanism runs once on the rows present at the request
(``n_rows``), in the worker's isolated process, and the outcome ends the job. Which faults are
``failed`` (refunded or not) and why any other exception is a ``no_result`` with a fixed reason
is the worker's module docstring, "Outcomes".
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from pydantic import ValidationError
from sqlalchemy import ColumnElement
from sqlalchemy.orm import Session

from service import (
    priors,
    privacy_unit,
    privacy_unit_auto,
    privacy_unit_centre,
    reference,
    visibility,
)
from service.config import Settings
from service.db.models import Release
from service.errors import InvalidInput, safe_traceback
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
from service.mechanisms.base import InvalidParameter, Mechanism, MechanismOutput, ReleaseSpec
from service.mechanisms.noise import secure_generator
from service.mechanisms.registry import get_mechanism
from service.prior_projection import on_prior, run_inside
from service.store import DatasetFileFault

log = logging.getLogger("dpss.worker")


@dataclass(frozen=True)
class OneShotWork:
    """A one-shot job's one work: the claimed job and, when its params name one, the public
    prior read back (digest checked) in the worker's transaction (:meth:`OneShot.load`): the
    run process never reaches the database."""

    job: ClaimedJob
    prior: priors.PublicPrior | None = None


def with_prior(session: Session, job: ClaimedJob) -> OneShotWork | End:
    """The job's work with the public prior its params name, read back and its digest checked
    before any row is read; a prior gone or changed is a refusal missed at prepare
    (data-independent), refunded: no row was read."""
    try:
        prior = priors.stored_prior(session, priors.split_params(job.params)[1])
    except LookupError:
        return End(Outcome.failed(REFUSED_AT_RUN_REASON, refund=True))
    return OneShotWork(job, prior)


def execute(
    job: ClaimedJob, context: RunContext, prior: priors.PublicPrior | None = None
) -> Outcome:
    """Run the mechanism and turn whatever happens into an :class:`Outcome` (never raises an
    ``Exception``). ``prior``: the public prior the job's params name (:mod:`service.priors`),
    already read and checked; the mechanism then runs inside its span
    (:func:`service.prior_projection.on_prior`).

    A failure decided before any row is read (the mechanism retired, its stored params no
    longer parsing, a prior not read, the dataset deleted or its file gone) is refunded: the
    job provably never read the data, and the decision rests on public facts only (DESIGN's
    refund rule); but not after the dataset's deletion, when the worker keeps the charge
    (:meth:`service.worker.Worker._record`). A refusal raised by the run itself may follow a
    read: charged."""
    mechanism = get_mechanism(job.mechanism)
    if mechanism is None:
        return Outcome.failed(NO_MECHANISM_REASON, refund=True)
    mechanism_params, recorded = priors.split_params(job.params)
    try:
        params = mechanism.parse_params(mechanism_params)
    except (ValidationError, InvalidParameter):
        return Outcome.failed(REFUSED_AT_RUN_REASON, refund=True)
    if recorded and prior is None:
        # The params name a prior that was not read: a refusal missed at prepare.
        return Outcome.failed(REFUSED_AT_RUN_REASON, refund=True)
    if prior is not None:
        mechanism = on_prior(mechanism, prior.matrix, prior.sha256)
    spec = ReleaseSpec(k=job.k, epsilon=job.epsilon, delta=job.delta, params=params)
    if job.file_name is None:
        return Outcome.failed(DATASET_DELETED_REASON, refund=True)
    if job.reference is not None:
        return _execute_reference(job, mechanism, spec, context)
    try:
        data = context.store.open(job.file_name, job.n_rows)
    except DatasetFileFault as fault:
        # Missing, not a store file, or shorter than the rows the release reads (deleted or
        # lost since the claim included): checked before anything is mapped, nothing was read.
        # Not a fault of the data (public facts): ended at once (no retries), refunded.
        log.error("release %s: its dataset file %s", job.release_id, fault)
        return Outcome.failed(DATASET_FILE_FAULT_REASON, refund=True)
    if job.person_level:
        return _execute_person_level(job, mechanism, params, spec, data, context)
    return _run(job, mechanism, data, spec)


def _execute_person_level(
    job: ClaimedJob,
    mechanism: Mechanism[Any],
    params: Any,
    spec: ReleaseSpec[Any],
    data: Any,
    context: RunContext,
) -> Outcome:
    """A person-level dataset (:mod:`service.privacy_unit`): the people partitioned inside a
    sample-and-aggregate mechanism, or each person's contribution bounded before the run."""
    assert job.file_name is not None
    try:
        units = context.store.open_units(job.file_name, data.shape[0])
    except (FileNotFoundError, ValueError):
        # The unit index is lost or short (a fault of the data directory, public like the
        # file's size): never run per row on a person-level dataset.
        return Outcome.failed(DATASET_FILE_FAULT_REASON, refund=True)
    if mechanism.name in privacy_unit.PERSON_PARTITIONED:
        # Sample-and-aggregate: the rows as they are, the partition of people drawn inside
        # the mechanism from the unit index (privacy_unit, random_partition).
        try:
            privacy_unit.check_mechanism(mechanism.name, params, mechanism.continual)
            privacy_unit.check_partition(mechanism.name, params, int(units.max(initial=-1)) + 1)
        except InvalidInput:
            return Outcome.failed(REFUSED_AT_RUN_REASON, refund=True)
        return _run(job, mechanism, data, spec, units=units)
    if mechanism.name == privacy_unit.AUTO:
        # Its estimate on each person's bounded rows, its candidates per person
        # (service.privacy_unit_auto); the rows as they are.
        try:
            privacy_unit.check_mechanism(mechanism.name, params, mechanism.continual)
        except InvalidInput:
            return Outcome.failed(REFUSED_AT_RUN_REASON, refund=True)
        return _run(job, mechanism, data, spec, units=units, kind="auto")
    rule = privacy_unit.PERSON_LEVEL_RULES.get(mechanism.name)
    clip_norm = getattr(params, "clip_norm", None)
    if rule is None or clip_norm is None:
        # The request gate refuses these; a release queued before a change of that gate
        # must not run per row on a person-level dataset.
        return Outcome.failed(REFUSED_AT_RUN_REASON, refund=True)
    try:
        privacy_unit.check_mechanism(mechanism.name, params, mechanism.continual)
    except InvalidInput:
        return Outcome.failed(REFUSED_AT_RUN_REASON, refund=True)
    if privacy_unit.needs_internals(params):
        # A private centre or a clip quantile: one vector and one value per person, inside
        # the mechanism's steps (service.privacy_unit_centre); the rows as they are.
        return _run(job, mechanism, data, spec, units=units, kind="centred")
    # A per-person map fixed by public facts (C, the rule, a public centre): total on finite
    # rows. A public centre is applied here, before the bound, and the mechanism then runs
    # uncentred on the centred rows (the same Gram; privacy_unit).
    center = getattr(params, "center", None)
    public_center = np.asarray(center, dtype=np.float64) if isinstance(center, list) else None
    if public_center is not None:
        spec = ReleaseSpec(
            k=spec.k,
            epsilon=spec.epsilon,
            delta=spec.delta,
            params=params.model_copy(update={"center": "none"}),
        )
    bounded_spec = spec

    def bounded_run(inner: Mechanism[Any], rows: Any) -> MechanismOutput:
        # Inside a public prior's span when there is one (rows projected first: a public
        # per-row map; a public centre has the prior's m entries then), as the wrapper runs.
        bounded = privacy_unit.bound_contributions(
            rows, units, clip_norm, rule, center=public_center
        )
        return inner.run(bounded, bounded_spec, secure_generator())

    try:
        return Outcome.of(run_inside(mechanism, data, bounded_run))
    except InvalidParameter:
        return Outcome.failed(REFUSED_AT_RUN_REASON)
    except Exception as exc:
        log.error(
            "BUG: release %s: the per-person bound or %s raised %s; recorded as no_result",
            job.release_id,
            job.mechanism,
            safe_traceback(exc),
        )
        return Outcome(status="no_result", reason=NO_RELEASE_REASON, extras={})


def _execute_reference(
    job: ClaimedJob, mechanism: Mechanism[Any], spec: ReleaseSpec[Any], context: RunContext
) -> Outcome:
    """A dataset by reference: the rows of the batches registered at the request (``n_rows``,
    whole batches: as for an upload, a batch added later is not read), every object of every
    batch checked unchanged before and after the run, the heavy passes on Dask or in process;
    a :class:`~service.reference.ReferenceFault` (a changed object, a failed cluster: nothing
    released) is ``failed``, refunded only when the fault says so (never for a changed object:
    :func:`~service.reference.integrity.object_fault`; what analysts and owners see is decided
    by the re-check, :mod:`service.reference_recheck`)."""
    assert job.reference is not None
    prefix = None if job.n_rows is None else (0, job.n_rows)
    try:
        with reference.open_rows(job.reference, context.settings, prefix, job.queued_at) as rows:
            outcome = _run(job, mechanism, rows, spec, reraise=reference.ReferenceFault)
            rows.check_unchanged()
            return outcome
    except reference.ReferenceFault as fault:
        log.warning("release %s: %s (%s)", job.release_id, fault.reason, fault.path)
        return Outcome.failed(fault.reason, refund=fault.refund)


def _run(
    job: ClaimedJob,
    mechanism: Mechanism[Any],
    data: Any,
    spec: ReleaseSpec[Any],
    reraise: type[Exception] | None = None,
    units: npt.NDArray[np.int64] | None = None,
    kind: Literal["partitioned", "centred", "auto"] = "partitioned",
) -> Outcome:
    """Run the mechanism; with ``units`` (a person-level dataset) per person: on a partition
    of people, with the per-person centre and quantile, or as ``auto`` per person."""
    try:
        if units is None:
            return Outcome.of(mechanism.run(data, spec, secure_generator()))
        person_units = units
        per_person = {
            "auto": privacy_unit_auto.run_auto,
            "centred": privacy_unit_centre.run_person_centred,
            "partitioned": privacy_unit.run_partitioned,
        }[kind]

        def run(inner: Mechanism[Any], rows: Any) -> MechanismOutput:
            return per_person(inner, rows, person_units, spec, secure_generator())

        # These runs dispatch on the mechanism itself: a public prior's wrapper is unwrapped
        # (the rows projected onto the prior, the output lifted), as its own run does.
        return Outcome.of(run_inside(mechanism, data, run))
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

    def first(self, job: ClaimedJob, context: RunContext) -> OneShotWork | End | None:
        if job.file_name is None:
            return End(Outcome.failed(DATASET_DELETED_REASON, refund=True))
        # The dataset file's fault check is the run's own opening of it (:func:`execute`,
        # :meth:`DatasetStore.open`): the same checks before any row is read, in the run
        # process on the file it maps, not a second open and header parse here.
        if priors.split_params(job.params)[1]:
            return None  # a prior to read first, in the worker's transaction (load)
        return OneShotWork(job)

    def load(
        self, session: Session, release: Release, job: ClaimedJob, settings: Settings
    ) -> OneShotWork | End | str:
        return with_prior(session, job)

    def run(self, work: OneShotWork, context: RunContext) -> Outcome:
        return execute(work.job, context, work.prior)

    def save(
        self,
        session: Session,
        release: Release,
        job: ClaimedJob,
        work: OneShotWork,
        result: Outcome,
        settings: Settings,
    ) -> End:
        return End(result)

    def saved(self, job: ClaimedJob, work: OneShotWork) -> None:
        return None

    def shown_at(self, release: Release, ended_at: datetime) -> datetime | None:
        """Late or not, analysts see the outcome (and the refund) only at a step of the
        release's public schedule (:mod:`service.visibility`)."""
        return visibility.shown_at(release, ended_at)

    def late(self, release: Release, ended_at: datetime) -> bool:
        return visibility.is_late(release, ended_at)

    def abandoned(self, session: Session, release: Release, settings: Settings) -> End:
        return End(Outcome.failed(ABANDONED_REASON))

    def waiting_claimable(self) -> list[ColumnElement[bool]] | None:
        return None


ONE_SHOT = OneShot()
