"""Workers: claim a queued release, run its mechanism, store the result exactly once.

The releases table is the queue. A claim sets ``status = running`` and a lease (owner, expiry)
in one short transaction (``FOR UPDATE SKIP LOCKED`` on PostgreSQL; SQLite serialises writers).
While the mechanism runs, a heartbeat thread extends the lease. A worker that dies stops
heartbeating; once its lease expires the job is claimable again and runs afresh with fresh
randomness, which is safe because an output that was never stored was never seen by anyone.
Finishing checks that this worker still holds the lease, so a produced output is stored once.
The budget was charged when the release was requested; it is refunded only when the job
provably never read the data (its dataset was deleted before any worker opened it).
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np
from sqlalchemy import and_, or_, select, update
from sqlalchemy.orm import Session, sessionmaker

from service import audit, ledger
from service.config import Settings
from service.db.models import Dataset, Release, utcnow
from service.errors import safe_traceback
from service.mechanisms.base import MechanismOutput, ReleaseSpec
from service.mechanisms.noise import secure_generator
from service.mechanisms.registry import get_mechanism
from service.releases import encode_basis, float_not_above
from service.store import DatasetStore

log = logging.getLogger("dpss.worker")


@dataclass(frozen=True)
class ClaimedJob:
    release_id: uuid.UUID
    dataset_id: uuid.UUID
    mechanism: str
    k: int
    epsilon: float
    delta: float
    params: dict[str, Any]
    file_name: str | None
    attempt: int


def _json_safe(value: Any) -> Any:
    """Extras as JSON values: numpy to Python, non-finite floats to null."""
    if isinstance(value, dict):
        return {str(key): _json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(item) for item in value]
    if isinstance(value, np.ndarray):
        return _json_safe(value.tolist())
    if isinstance(value, np.generic):
        return _json_safe(value.item())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class Worker:
    """One worker; run several processes (or machines) against one database to scale out."""

    def __init__(
        self,
        session_factory: sessionmaker[Session],
        store: DatasetStore,
        settings: Settings,
        worker_id: str | None = None,
    ) -> None:
        self.session_factory = session_factory
        self.store = store
        self.settings = settings
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"

    # -- claiming -------------------------------------------------------------------------------

    def claim(self) -> ClaimedJob | None:
        """Take the oldest queued job, or one whose lease expired; ``None`` if there is none."""
        lease = timedelta(seconds=self.settings.worker_lease_seconds)
        while True:
            with self.session_factory.begin() as session:
                now = utcnow()
                release = session.execute(
                    select(Release)
                    .where(
                        or_(
                            Release.status == "queued",
                            and_(Release.status == "running", Release.lease_expires_at < now),
                        )
                    )
                    .order_by(Release.created_at)
                    .limit(1)
                    .with_for_update(skip_locked=True)
                ).scalar_one_or_none()
                if release is None:
                    return None
                if release.attempts >= self.settings.worker_max_attempts:
                    # The job keeps killing its workers; it may have read the data: no refund.
                    self._finish(
                        session,
                        release,
                        status="failed",
                        reason="the release stopped its worker repeatedly and was abandoned",
                    )
                    continue
                dataset = session.get(Dataset, release.dataset_id)
                release.status = "running"
                release.attempts += 1
                release.lease_owner = self.worker_id
                release.lease_expires_at = now + lease
                release.started_at = now
                return ClaimedJob(
                    release_id=release.id,
                    dataset_id=release.dataset_id,
                    mechanism=release.mechanism,
                    k=release.k,
                    epsilon=float_not_above(release.epsilon),
                    delta=float_not_above(release.delta),
                    params=dict(release.params),
                    file_name=dataset.file_name if dataset is not None else None,
                    attempt=release.attempts,
                )

    def heartbeat(self, job: ClaimedJob) -> bool:
        """Extend this worker's lease on ``job``; false if the lease was lost."""
        with self.session_factory.begin() as session:
            result = session.execute(
                update(Release)
                .where(
                    Release.id == job.release_id,
                    Release.lease_owner == self.worker_id,
                    Release.status == "running",
                )
                .values(
                    lease_expires_at=utcnow()
                    + timedelta(seconds=self.settings.worker_lease_seconds)
                )
            )
            return bool(getattr(result, "rowcount", 0) == 1)

    # -- running --------------------------------------------------------------------------------

    def execute(self, job: ClaimedJob) -> MechanismOutput | str:
        """Run the mechanism; returns its output, or a failure reason safe to show."""
        mechanism = get_mechanism(job.mechanism)
        if mechanism is None:
            return "this service no longer has the mechanism"
        params = mechanism.parse_params(job.params)
        spec = ReleaseSpec(k=job.k, epsilon=job.epsilon, delta=job.delta, params=params)
        data = self.store.open(job.file_name)  # type: ignore[arg-type]
        return mechanism.run(data, spec, secure_generator())

    def process(self, job: ClaimedJob) -> str:
        """Run a claimed job to the end and record the outcome; returns the final status."""
        if job.file_name is None or not self.store.exists(job.file_name):
            return self.finish(
                job, None, "the dataset was deleted before the release ran", refund=True
            )
        stop = threading.Event()
        beat = threading.Thread(target=self._beat, args=(job, stop), daemon=True)
        beat.start()
        try:
            outcome = self.execute(job)
        except Exception as exc:
            log.error("release %s failed: %s", job.release_id, safe_traceback(exc))
            outcome = "internal error while running the mechanism"
        finally:
            stop.set()
            beat.join()
        if isinstance(outcome, str):
            return self.finish(job, None, outcome, refund=False)
        return self.finish(job, outcome, None, refund=False)

    def _beat(self, job: ClaimedJob, stop: threading.Event) -> None:
        while not stop.wait(self.settings.worker_heartbeat_seconds):
            try:
                if not self.heartbeat(job):
                    log.warning("release %s: lease lost", job.release_id)
                    return
            except Exception as exc:
                log.warning("release %s: heartbeat failed: %s", job.release_id, safe_traceback(exc))

    # -- finishing ------------------------------------------------------------------------------

    def finish(
        self, job: ClaimedJob, output: MechanismOutput | None, failure: str | None, *, refund: bool
    ) -> str:
        """Store the outcome if this worker still holds the lease; returns the status stored
        (or ``"lost"`` when another worker now owns the job and this outcome is discarded)."""
        with self.session_factory.begin() as session:
            release = session.execute(
                select(Release).where(Release.id == job.release_id).with_for_update()
            ).scalar_one()
            if release.status != "running" or release.lease_owner != self.worker_id:
                log.warning("release %s: lease lost, outcome discarded", job.release_id)
                return "lost"
            if output is None:
                self._finish(session, release, status="failed", reason=failure, refund=refund)
            elif output.no_result_reason is not None:
                self._finish(
                    session,
                    release,
                    status="no_result",
                    reason=output.no_result_reason,
                    extras=_json_safe(output.extras),
                )
            else:
                self._finish(
                    session,
                    release,
                    status="succeeded",
                    basis=output.basis,
                    extras=_json_safe(output.extras),
                )
            return release.status

    def _finish(
        self,
        session: Session,
        release: Release,
        *,
        status: str,
        reason: str | None = None,
        refund: bool = False,
        basis: np.ndarray[Any, Any] | None = None,
        extras: dict[str, Any] | None = None,
    ) -> None:
        release.status = status
        release.reason = reason
        release.finished_at = utcnow()
        release.lease_expires_at = None
        release.result_extras = extras
        if basis is not None:
            release.result_basis, release.result_shape, release.result_sha256 = encode_basis(basis)
        if refund:
            ledger.refund(session, release.dataset_id, release.id, release.epsilon, release.delta)
            release.refunded = True
        details: dict[str, Any] = {
            "mechanism": release.mechanism,
            "k": release.k,
            "cost": {"epsilon": release.epsilon, "delta": release.delta},
            "attempts": release.attempts,
            "basis_sha256": release.result_sha256,
        }
        if reason is not None:
            details["reason"] = reason
        if refund:
            details["refunded"] = {"epsilon": release.epsilon, "delta": release.delta}
        audit.record(
            session,
            f"release_{status}",
            actor_key_id=None,
            dataset_id=release.dataset_id,
            release_id=release.id,
            details=details,
        )

    # -- loops ----------------------------------------------------------------------------------

    def run_pending(self) -> int:
        """Process every claimable job now (tests, one-shot runs); returns how many ran."""
        count = 0
        while (job := self.claim()) is not None:
            self.process(job)
            count += 1
        return count

    def run_forever(self, stop: threading.Event | None = None) -> None:
        """Poll for jobs until ``stop`` is set."""
        stop = stop or threading.Event()
        log.info("worker %s started", self.worker_id)
        while not stop.is_set():
            try:
                job = self.claim()
            except Exception as exc:
                log.error("claim failed: %s", safe_traceback(exc))
                job = None
            if job is None:
                stop.wait(self.settings.worker_poll_seconds)
                continue
            log.info(
                "release %s: running %s (attempt %d)", job.release_id, job.mechanism, job.attempt
            )
            status = self.process(job)
            log.info("release %s: %s", job.release_id, status)
        log.info("worker %s stopped", self.worker_id)
