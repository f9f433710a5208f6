"""ORM rows to response schemas."""

from __future__ import annotations

from sqlalchemy.orm import Session

from api_schemas.datasets import Budget, Dataset
from api_schemas.releases import Release, ReleaseResult
from service import ledger
from service.db import models
from service.releases import decode_basis


def budget_out(session: Session, dataset: models.Dataset) -> Budget:
    state = ledger.budget_of(session, dataset)
    return Budget(
        epsilon_total=state.epsilon_total,
        delta_total=state.delta_total,
        epsilon_spent=state.epsilon_spent,
        delta_spent=state.delta_spent,
        epsilon_remaining=state.epsilon_remaining,
        delta_remaining=state.delta_remaining,
    )


def dataset_out(session: Session, dataset: models.Dataset) -> Dataset:
    return Dataset(
        id=dataset.id,
        name=dataset.name,
        n_rows=dataset.n_rows,
        n_cols=dataset.n_cols,
        row_norm_bound=dataset.row_norm_bound,
        budget=budget_out(session, dataset),
        created_at=dataset.created_at,
    )


def release_out(release: models.Release) -> Release:
    result = None
    if release.status in ("succeeded", "no_result"):
        basis = decode_basis(release)
        result = ReleaseResult(
            basis=basis.tolist() if basis is not None else None,
            basis_sha256=release.result_sha256,
            extras=release.result_extras or {},
        )
    return Release(
        id=release.id,
        dataset_id=release.dataset_id,
        mechanism=release.mechanism,
        k=release.k,
        epsilon=release.epsilon,
        delta=release.delta,
        params=release.params,
        status=release.status,
        reason=release.reason,
        refunded=release.refunded,
        result=result,
        created_at=release.created_at,
        started_at=release.started_at,
        finished_at=release.finished_at,
        attempts=release.attempts,
    )
