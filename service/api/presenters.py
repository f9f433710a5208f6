"""ORM rows to response schemas."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import numpy as np
from sqlalchemy.orm import Session

from api_schemas.datasets import Budget, Dataset
from api_schemas.releases import Epoch, EpochSummary, Release, ReleaseResult
from service import continual, ledger, releases
from service.auth import Principal
from service.continual import is_continual
from service.db import models
from service.db.models import utcnow
from service.releases import decode_basis


def budget_out(session: Session, dataset: models.Dataset) -> Budget:
    return _budget(ledger.budget_of(session, dataset))


def _budget(state: ledger.BudgetState) -> Budget:
    return Budget(
        epsilon_total=state.epsilon_total,
        delta_total=state.delta_total,
        epsilon_spent=state.epsilon_spent,
        delta_spent=state.delta_spent,
        epsilon_remaining=state.epsilon_remaining,
        delta_remaining=state.delta_remaining,
    )


def dataset_out(session: Session, dataset: models.Dataset) -> Dataset:
    return datasets_out(session, [dataset])[0]


def datasets_out(session: Session, datasets: Sequence[models.Dataset]) -> list[Dataset]:
    """The datasets with their budgets, read in one statement for the whole page."""
    states = ledger.budgets_of(session, datasets)
    return [
        Dataset(
            id=dataset.id,
            name=dataset.name,
            n_rows=dataset.n_rows,
            n_cols=dataset.n_cols,
            n_batches=dataset.n_batches,
            row_norm_bound=dataset.row_norm_bound,
            budget=_budget(states[dataset.id]),
            created_at=dataset.created_at,
            reference=None if dataset.reference is None else str(dataset.reference["uri"]),
        )
        for dataset in datasets
    ]


def epoch_out(epoch: models.ReleaseEpoch, principal: Principal) -> Epoch:
    """An epoch as ``principal`` may see it (its time for owners and auditors only)."""
    basis = None
    if epoch.basis is not None and epoch.basis_shape is not None:
        rows, cols = epoch.basis_shape
        basis = np.frombuffer(epoch.basis, dtype="<f8").reshape(rows, cols).tolist()
    return Epoch(
        epoch=epoch.epoch,
        batch_seq=epoch.batch_seq,
        n_rows_read=epoch.n_rows_read,
        basis_sha256=epoch.basis_sha256,
        basis=basis,
        extras=epoch.extras or {},
        created_at=epoch.created_at if releases.shows_timing(principal) else None,
    )


def release_out(
    release: models.Release,
    principal: Principal,
    now: datetime | None = None,
    session: Session | None = None,
) -> Release:
    """The release as ``principal`` may see it at ``now``.

    Before ``visible_at`` an analyst sees it ``queued`` with no outcome, whatever its real state:
    even the moment a worker claims it would tell when the job before it finished. Timing fields
    are for owners and auditors only.
    """
    now = now if now is not None else utcnow()
    timing = releases.shows_timing(principal)
    if not releases.outcome_visible(release, principal, now):
        status, reason, refunded, result = "queued", None, False, None
    else:
        status, reason, refunded = release.status, release.reason, release.refunded
        result = None
        if release.status in ("succeeded", "no_result"):
            basis = decode_basis(release)
            result = ReleaseResult(
                basis=basis.tolist() if basis is not None else None,
                basis_sha256=release.result_sha256,
                extras=release.result_extras or {},
            )
    following: dict[str, object] = {}
    if session is not None and is_continual(release.mechanism):
        # Epochs are outcomes: an analyst sees each from its own visible_at on (and none before
        # the release's), and the release's end only once its last epoch is visible.
        analyst = principal.role == "analyst"
        hidden = analyst and not releases.outcome_visible(release, principal, now)
        visible_by = now if analyst else None
        summaries = [] if hidden else continual.epoch_summaries(session, release.id, visible_by)
        latest = None if hidden else continual.latest_epoch(session, release.id, visible_by)
        finished = ("succeeded", "no_result", "failed")
        if analyst and len(summaries) < release.epochs_done and status in finished:
            status, reason, refunded, result = "running", None, False, None
        following = {
            "epochs_done": len(summaries),
            "latest_epoch": epoch_out(latest, principal) if latest is not None else None,
            "epochs": [
                EpochSummary(epoch=e, batch_seq=s, n_rows_read=n, basis_sha256=h)
                for e, s, n, h in summaries
            ],
        }
    return Release(
        id=release.id,
        dataset_id=release.dataset_id,
        mechanism=release.mechanism,
        k=release.k,
        epsilon=release.epsilon,
        delta=release.delta,
        params=release.params,
        status=status,
        reason=reason,
        refunded=refunded,
        result=result,
        n_rows_read=release.n_rows_read,
        batches_read=release.batches_read,
        created_at=release.created_at,
        visible_at=release.visible_at,
        started_at=release.started_at if timing else None,
        finished_at=release.finished_at if timing else None,
        attempts=release.attempts if timing else None,
        **following,
    )
