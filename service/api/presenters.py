"""ORM rows to response schemas."""

from __future__ import annotations

import base64
import uuid
from collections.abc import Sequence
from datetime import datetime
from decimal import Decimal
from typing import Literal

from sqlalchemy.orm import Session

from api_schemas.datasets import Budget, Dataset
from api_schemas.releases import Epoch, EpochSummary, Release, ReleaseResult
from service import (
    continual,
    ledger,
    privacy_unit,
    registration_visibility,
    releases,
    spend,
    visibility,
)
from service.audit_events import record_digest
from service.auth import Principal
from service.db import models
from service.db.models import utcnow
from service.mechanisms.explained_variance import shown_variance_extras
from service.releases import decode_basis

#: How a release's basis is written: ``json``, ``d`` lists of ``k`` numbers; ``base64``, the
#: stored bytes (``ReleaseResult.basis_base64``).
BasisFormat = Literal["json", "base64"]


def budget_out(totals: ledger.BudgetTotals, state: ledger.BudgetState) -> Budget:
    """A budget read's answer, from :func:`service.datasets.get_budget` (see :func:`_budget`)."""
    return _budget(totals, state)


def _budget(dataset: ledger.BudgetTotals, state: ledger.BudgetState) -> Budget:
    """The budget as :func:`service.spend.statement` states it: ``(epsilon, delta)`` at the
    dataset's ``delta_total``, with the native figures beside them."""
    return budget_schema(
        spend.statement(state), dataset.delta_conversion, privacy_unit.unit_of(dataset)
    )


def budget_schema(
    stated: spend.Statement,
    delta_conversion: Decimal | None = None,
    unit: Literal["row", "person"] = "row",
) -> Budget:
    """A :class:`~service.spend.Statement` as the API's :class:`Budget`; ``unit``: what its
    figures protect (:func:`service.privacy_unit.shown`)."""
    native = stated.native
    if stated.accounting == "basic":
        return Budget(
            privacy_unit=unit,
            accounting="basic",
            epsilon_total=stated.epsilon_total,
            delta_total=stated.delta_total,
            epsilon_spent=stated.epsilon_spent,
            delta_spent=stated.delta_spent,
            epsilon_remaining=stated.epsilon_remaining,
            epsilon_remaining_pure=stated.epsilon_remaining_pure,
            delta_remaining=stated.delta_remaining,
        )
    return Budget(
        privacy_unit=unit,
        accounting=stated.accounting,
        epsilon_total=stated.epsilon_total,
        delta_total=stated.delta_total,
        epsilon_spent=stated.epsilon_spent,
        delta_spent=stated.delta_spent,
        epsilon_remaining=stated.epsilon_remaining,
        epsilon_remaining_pure=stated.epsilon_remaining_pure,
        delta_remaining=stated.delta_remaining,
        rho_total=native.rho_total,
        rho_spent=native.rho_spent,
        rho_remaining=native.rho_remaining,
        mu_total=native.mu_total,
        mu_spent=native.mu_spent,
        mu_remaining=native.mu_remaining,
        delta_conversion=delta_conversion,
        delta_reserved_for_conversion=stated.delta_reserved_for_conversion,
    )


def dataset_out(session: Session, dataset: models.Dataset, viewer: uuid.UUID | None) -> Dataset:
    return datasets_out(session, [dataset], viewer)[0]


def datasets_out(
    session: Session, datasets: Sequence[models.Dataset], viewer: uuid.UUID | None
) -> list[Dataset]:
    """The datasets with their budgets, read in one statement for the whole page. For its owner
    only (``viewer``, the caller's key): a dataset by reference's URI, a failed registration's
    reason and a pending batch's status and reason. The URI is where the raw rows are, and a
    refusal's reason may name an object or a row number; an analyst sees that the dataset is
    by reference and its record's digest (docs/security.md, "Datasets by reference"). A
    registration or batch by reference as shown at a public moment
    (:mod:`service.registration_visibility`; owners and analysts are the only callers)."""
    states = ledger.budgets_of(session, datasets)
    now = utcnow()
    return [
        _dataset_out(
            dataset, states[dataset.id], viewer, registration_visibility.shown(dataset, None, now)
        )
        for dataset in datasets
    ]


def _dataset_out(
    dataset: models.Dataset,
    state: ledger.BudgetState,
    viewer: uuid.UUID | None,
    shown: registration_visibility.Shown,
) -> Dataset:
    return Dataset(
        id=dataset.id,
        name=dataset.name,
        n_rows=shown.n_rows,
        n_cols=shown.n_cols,
        n_batches=shown.n_batches,
        row_norm_bound=dataset.row_norm_bound,
        budget=_budget(dataset, state),
        created_at=dataset.created_at,
        by_reference=by_reference(dataset),
        reference_sha256=None if shown.reference is None else record_digest(shown.reference),
        registration_status=shown.registration_status,
        **(
            {
                "reference": _reference_uri(dataset, shown),
                "registration_reason": shown.registration_reason,
                "batch_status": shown.batch_status,
                "batch_reason": shown.batch_reason,
            }
            if viewer is not None and viewer == dataset.owner_key_id
            else {}
        ),
        **privacy_unit.shown(dataset),
    )


def by_reference(dataset: models.Dataset) -> bool:
    """Registered by reference, or being registered (a failed one included)."""
    return dataset.reference is not None or dataset.registration_request is not None


def _reference_uri(dataset: models.Dataset, shown: registration_visibility.Shown) -> str | None:
    """The URI of a dataset by reference, registered or still being registered (as shown)."""
    if shown.reference is not None:
        return str(shown.reference["uri"])
    if dataset.registration_request is not None:
        return str(dataset.registration_request["uri"])
    return None


def epoch_out(
    epoch: models.ReleaseEpoch, principal: Principal, stored: bytes | None = None
) -> Epoch:
    """An epoch as ``principal`` may see it (its time for no analyst or owner), with its
    basis when given (``stored``, from :func:`service.continual.epoch_bases`)."""
    basis = decode_basis(stored, epoch.basis_shape)
    return Epoch(
        epoch=epoch.epoch,
        batch_seq=epoch.batch_seq,
        n_rows_read=epoch.n_rows_read,
        basis_sha256=epoch.basis_sha256,
        basis=basis.tolist() if basis is not None else None,
        extras=shown_variance_extras(epoch.extras or {}),
        created_at=epoch.created_at if releases.shows_timing(principal) else None,
    )


def release_out(
    release: models.Release,
    principal: Principal,
    session: Session,
    now: datetime | None = None,
    with_basis: bool = True,
    shown: visibility.View | None = None,
    basis_format: BasisFormat = "json",
) -> Release:
    """The release as ``principal`` may see it at ``now`` (:func:`service.visibility.view`).

    Timing fields are for no analyst or owner (:func:`service.auth.sees_real_state`). The basis
    is read (a deferred column) only when shown and asked for. ``shown``: the view, if the
    caller has it already.
    """
    now = now if now is not None else utcnow()
    timing = releases.shows_timing(principal)
    if shown is None:
        shown = visibility.view(session, release, principal, now, with_basis=with_basis)
    result = None
    if shown.shows_result:
        held = session.info.get(visibility.HELD_BASES, {})
        stored = None
        if with_basis:
            # Read with the end by the view when it could (one statement), else here.
            found = release.id in held
            stored = held[release.id] if found else releases.stored_basis(session, release)
        if basis_format == "base64" and stored is not None:
            result = ReleaseResult(
                basis_base64=base64.b64encode(stored).decode("ascii"),
                basis_shape=release.result_shape,
                basis_sha256=release.result_sha256,
                extras=shown_variance_extras(release.result_extras or {}),
            )
        else:
            basis = decode_basis(stored, release.result_shape)
            result = ReleaseResult(
                basis=basis.tolist() if basis is not None else None,
                basis_sha256=release.result_sha256,
                extras=shown_variance_extras(release.result_extras or {}),
            )
    following: dict[str, object] = {}
    if shown.epochs is not None:
        latest, latest_out = shown.latest_epoch, None
        if latest is not None:
            stored = None
            if with_basis:
                stored = continual.epoch_bases(session, release.id, [latest.epoch]).get(
                    latest.epoch
                )
            latest_out = epoch_out(latest, principal, stored)
        following = {
            "epochs_done": len(shown.epochs),
            "latest_epoch": latest_out,
            "epochs": [
                EpochSummary(epoch=e, batch_seq=s, n_rows_read=n, basis_sha256=h)
                for e, s, n, h in shown.epochs
            ],
        }
    return Release(
        id=release.id,
        dataset_id=release.dataset_id,
        mechanism=release.mechanism,
        k=release.k,
        epsilon=release.epsilon,
        delta=release.delta,
        rho=release.cost_rho,
        cost_delta=release.cost_delta,
        params=release.params,
        status=shown.status,
        reason=shown.reason,
        refunded=shown.refunded,
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
