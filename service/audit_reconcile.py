"""Reconciling the tables that hold the money with what the audit events say.

:class:`~service.audit_recorded._Recorded` reads the chain, event by event, into what the
tables must hold; :func:`_reconcile` then checks that every ledger row, dataset budget,
release (cost, status, result and basis hashes, refund, epochs), grant, API key, public prior
(its bytes' digest and shape) and dataset by reference's record (the objects, row groups and
chunk digests its budget is bound to) is exactly what the events say, that every event's row
exists, and that no dataset or grant spends more than its events gave it. Guarantees: a problem
names a table or an event and an id, never a stored value; an event whose details are not in
the form this version writes is a problem, never an exception. Called by
:func:`service.audit.verify` after the chain itself is checked.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable
from decimal import Decimal

from sqlalchemy import and_, literal, select
from sqlalchemy.orm import Session

from api_schemas.common import BUDGET_CONTEXT
from service import audit_hybrid
from service.audit_events import to_json_value
from service.audit_recorded import (
    BUDGET_SHARES,
    _Recorded,
    _Request,
)
from service.audit_references import check_reference
from service.db.models import (
    ApiKey,
    Dataset,
    DatasetReferenceObject,
    Grant,
    LedgerEntry,
    Prior,
    Release,
    ReleaseBasis,
    ReleaseEpoch,
)


def _reconcile(session: Session, recorded: _Recorded, problems: list[str]) -> None:
    _reconcile_datasets(session, recorded, problems)
    _reconcile_releases(session, recorded, problems)
    _reconcile_ledger(session, recorded, problems)
    _reconcile_keys(session, recorded, problems)
    _reconcile_grants(session, recorded, problems)
    _reconcile_epochs(session, recorded, problems)
    _reconcile_priors(session, recorded, problems)
    _check_spending(recorded, problems)
    _check_grant_spending(recorded, problems)
    _check_hybrid_spending(session, recorded, problems)


def _reconcile_priors(session: Session, recorded: _Recorded, problems: list[str]) -> None:
    """Every stored prior is the bytes its ``prior_stored`` event names (digest and shape), and
    every release that names a prior names one stored before it, with that digest. A prior's
    bytes are what a released basis's coordinates mean: rewritten (with its ``sha256`` column
    to match) or removed, a reader of the prior would take another basis for the one released.
    Rows are read one at a time (a prior may be 256 MB)."""
    seen: set[uuid.UUID] = set()
    for prior_id in session.execute(select(Prior.id)).scalars():
        seen.add(prior_id)
        where = f"priors {prior_id}"
        stored = recorded.priors.get(prior_id)
        if stored is None:
            problems.append(f"{where}: no prior_stored event")
            continue
        row = session.execute(
            select(Prior.sha256, Prior.n_rows, Prior.n_cols, Prior.basis).where(
                Prior.id == prior_id
            )
        ).one()
        seq, sha256, d, m = stored
        if (row.n_rows, row.n_cols) != (d, m):
            problems.append(f"{where}: shape differs from prior_stored event {seq}")
        if row.sha256 != sha256:
            problems.append(f"{where}: sha256 differs from prior_stored event {seq}")
        if len(row.basis) != 8 * d * m or hashlib.sha256(row.basis).hexdigest() != sha256:
            problems.append(f"{where}: basis does not hash to prior_stored event {seq}'s sha256")
    for prior_id, (seq, _, _, _) in recorded.priors.items():
        if prior_id not in seen:
            problems.append(f"priors {prior_id}: the row is missing (stored by event {seq})")
    for release_id, request in recorded.requests.items():
        params = request.params if isinstance(request.params, dict) else {}
        named = params.get("prior_id")
        if named is None:
            continue
        where = f"release_requested event {request.seq}"
        try:
            stored = recorded.priors.get(uuid.UUID(str(named)))
        except ValueError:
            stored = None
        if stored is None or stored[0] > request.seq:
            problems.append(f"{where}: names prior {named}, which no earlier event stored")
        elif params.get("prior_sha256") != stored[1]:
            problems.append(
                f"{where}: prior_sha256 differs from prior_stored event {stored[0]} "
                f"(release {release_id})"
            )


def _reconcile_epochs(session: Session, recorded: _Recorded, problems: list[str]) -> None:
    """Every stored epoch of a continual release has its ``release_epoch`` event with the same
    basis hash, every such event its row, and ``epochs_done`` counts them."""
    stored = {
        (row.release_id, row.epoch): row.basis_sha256
        for row in session.execute(
            select(ReleaseEpoch.release_id, ReleaseEpoch.epoch, ReleaseEpoch.basis_sha256)
        )
    }
    for (release_id, epoch), sha256 in stored.items():
        event = recorded.epochs.get((release_id, epoch))
        where = f"release_epochs {release_id} epoch {epoch}"
        if event is None:
            problems.append(f"{where}: no release_epoch event")
        elif event[1] != sha256:
            problems.append(f"{where}: basis_sha256 differs from release_epoch event {event[0]}")
    for (release_id, epoch), (seq, _) in recorded.epochs.items():
        if (release_id, epoch) not in stored:
            problems.append(f"release_epochs {release_id} epoch {epoch}: missing (event {seq})")
    counts: dict[uuid.UUID, int] = {}
    for release_id, _ in stored:
        counts[release_id] = counts.get(release_id, 0) + 1
    for release_id, done in session.execute(
        select(Release.id, Release.epochs_done).where(Release.epochs_done > 0)
    ):
        if counts.get(release_id, 0) != done:
            problems.append(f"releases {release_id}: epochs_done differs from its stored epochs")


def _reconcile_datasets(session: Session, recorded: _Recorded, problems: list[str]) -> None:
    seen: set[uuid.UUID] = set()
    rows = session.execute(
        select(
            Dataset.id,
            Dataset.epsilon_total,
            Dataset.delta_total,
            Dataset.deleted_at,
            Dataset.accounting,
            Dataset.rho_total,
            Dataset.reference,
            Dataset.n_rows,
            Dataset.privacy_unit_column,
            *(getattr(Dataset, name) for name in BUDGET_SHARES),
        )
    )
    covers: dict[uuid.UUID, set[tuple[str, str, str]]] = {}
    for owner, key, key_sha, content in session.execute(
        select(
            DatasetReferenceObject.dataset_id,
            DatasetReferenceObject.object_key,
            DatasetReferenceObject.key_sha256,
            DatasetReferenceObject.content_sha256,
        )
    ):
        covers.setdefault(owner, set()).add((key, key_sha, content))
    for row in rows:
        dataset_id, epsilon_total, delta_total, deleted_at, kind, rho_total, raw, n, column = row[
            :9
        ]
        seen.add(dataset_id)
        where = f"datasets {dataset_id}"
        if dataset_id not in recorded.created:
            problems.append(f"{where}: no dataset_created event")
        elif ("row" if column is None else "person") != recorded.units[dataset_id]:
            # Cleared, every later release would run per row (r rows: about r epsilon).
            problems.append(f"{where}: privacy_unit differs from its dataset_created event")
        budget = recorded.budgets.get(dataset_id)
        if budget is None:
            problems.append(f"{where}: no budget_set event")
        else:
            stored = {
                "epsilon_total": epsilon_total,
                "delta_total": delta_total,
                "accounting": kind,
                "rho_total": rho_total or Decimal(0),
            }
            recorded_budget = {
                "epsilon_total": budget.epsilon,
                "delta_total": budget.delta,
                "accounting": budget.accounting,
                "rho_total": budget.rho,
            }
            for name, value in stored.items():
                if value != recorded_budget[name]:
                    problems.append(f"{where}: {name} differs from budget_set event {budget.seq}")
            # The ledger admits by these too: a raised mu_total (or a moved share of delta)
            # is budget handed back as surely as a raised epsilon_total.
            columns = dict(zip(BUDGET_SHARES, row[9:], strict=True))
            for name, recorded_value in budget.shares:
                if columns[name] != recorded_value:
                    problems.append(f"{where}: {name} differs from budget_set event {budget.seq}")
        if (deleted_at is not None) != (dataset_id in recorded.deleted):
            problems.append(f"{where}: deleted_at disagrees with the dataset_deleted events")
        if raw is not None and deleted_at is None:
            covered = covers.pop(dataset_id, set())
            check_reference(where, raw, n, covered, recorded.references.get(dataset_id), problems)
    for dataset_id, seq in recorded.created.items():
        if dataset_id not in seen:
            problems.append(f"datasets {dataset_id}: the row is missing (created by event {seq})")
    for dataset_id in covers:
        problems.append(
            f"dataset_reference_objects of {dataset_id}: objects covered for no live dataset "
            "by reference (they refuse others' registrations)"
        )


def _reconcile_releases(session: Session, recorded: _Recorded, problems: list[str]) -> None:
    seen: set[uuid.UUID] = set()
    rows = session.execute(
        select(
            Release.id,
            Release.dataset_id,
            Release.mechanism,
            Release.k,
            Release.epsilon,
            Release.delta,
            Release.params,
            Release.status,
            Release.refunded,
            Release.result_sha256,
            Release.reason,
        )
    )
    for row in rows:
        seen.add(row.id)
        where = f"releases {row.id}"
        request = recorded.requests.get(row.id)
        if request is None:
            problems.append(f"{where}: no release_requested event")
        else:
            recorded_values = {
                "dataset_id": request.dataset_id,
                "mechanism": request.mechanism,
                "k": request.k,
                "params": request.params,
                "epsilon": request.epsilon,
                "delta": request.delta,
            }
            stored_values = {
                "dataset_id": row.dataset_id,
                "mechanism": row.mechanism,
                "k": row.k,
                "params": to_json_value({"params": row.params})["params"],
                "epsilon": row.epsilon,
                "delta": row.delta,
            }
            for name, value in recorded_values.items():
                if stored_values[name] != value:
                    problems.append(
                        f"{where}: {name} differs from release_requested event {request.seq}"
                    )
        outcome = recorded.outcomes.get(row.id)
        if outcome is None:
            if row.status not in ("queued", "running"):
                problems.append(f"{where}: status is final but no event records an outcome")
            if row.result_sha256 is not None:
                problems.append(f"{where}: result_sha256 is set but no event records an outcome")
            if row.refunded:
                problems.append(f"{where}: refunded is set but no event records a refund")
            continue
        event = f"release_{outcome.status} event {outcome.seq}"
        if row.status != outcome.status:
            problems.append(f"{where}: status differs from {event}")
        if row.result_sha256 != outcome.basis_sha256:
            problems.append(f"{where}: result_sha256 differs from {event}")
        if row.refunded != (outcome.refund is not None):
            problems.append(f"{where}: refunded differs from {event}")
        if row.reason != outcome.reason:
            problems.append(f"{where}: reason differs from {event}")
    for release_id, request in recorded.requests.items():
        if release_id not in seen:
            problems.append(
                f"releases {release_id}: the row is missing (requested by event {request.seq})"
            )
    for release_id, outcome in recorded.outcomes.items():
        if release_id not in recorded.requests:
            problems.append(
                f"releases {release_id}: event {outcome.seq} records an outcome, "
                "but no event requested it"
            )
    # The stored bases themselves, against the hashes that reconciled with the events.
    _check_bases(session, problems)


def _check_bases(session: Session, problems: list[str]) -> None:
    """Every stored basis (``release_bases``) matches the hash stored with its release (epoch
    0) or its epoch, and every such hash has its basis."""
    results = (
        select(Release.id, literal(0), Release.result_sha256, ReleaseBasis.basis)
        .outerjoin(
            ReleaseBasis, and_(ReleaseBasis.release_id == Release.id, ReleaseBasis.epoch == 0)
        )
        .where(Release.result_sha256.is_not(None))
    )
    epochs = (
        select(
            ReleaseEpoch.release_id,
            ReleaseEpoch.epoch,
            ReleaseEpoch.basis_sha256,
            ReleaseBasis.basis,
        )
        .outerjoin(
            ReleaseBasis,
            and_(
                ReleaseBasis.release_id == ReleaseEpoch.release_id,
                ReleaseBasis.epoch == ReleaseEpoch.epoch,
            ),
        )
        .where(ReleaseEpoch.basis_sha256.is_not(None))
    )
    for query in (results, epochs):
        for release_id, epoch, digest, basis in session.execute(
            query.execution_options(yield_per=64)
        ):
            where = (
                f"releases {release_id}"
                if epoch == 0
                else f"release_epochs {release_id} epoch {epoch}"
            )
            if basis is None:
                problems.append(f"{where}: the basis is missing")
            elif hashlib.sha256(basis).hexdigest() != digest:
                problems.append(f"{where}: the basis does not match its sha256")


def _reconcile_ledger(session: Session, recorded: _Recorded, problems: list[str]) -> None:
    charged: set[uuid.UUID] = set()
    refunded: set[uuid.UUID] = set()
    rows = session.execute(
        select(
            LedgerEntry.id,
            LedgerEntry.dataset_id,
            LedgerEntry.release_id,
            LedgerEntry.kind,
            LedgerEntry.epsilon,
            LedgerEntry.delta,
            LedgerEntry.rho,
            LedgerEntry.grant_id,
            LedgerEntry.gdp,
            LedgerEntry.zcdp_delta,
        ).order_by(LedgerEntry.id)
    )
    for entry_id, dataset_id, release_id, kind, epsilon, delta, rho, grant_id, gdp, zd in rows:
        where = f"ledger_entries {entry_id}"
        request = recorded.requests.get(release_id)
        if kind == "charge":
            if release_id in charged:
                problems.append(f"{where}: a second charge for release {release_id}")
            charged.add(release_id)
            if request is None:
                problems.append(f"{where}: a charge that no release_requested event records")
                continue
            expected = request.charge
            event = f"release_requested event {request.seq}"
        elif kind == "refund":
            if release_id in refunded:
                problems.append(f"{where}: a second refund for release {release_id}")
            refunded.add(release_id)
            outcome = recorded.outcomes.get(release_id)
            if outcome is None or outcome.refund is None:
                problems.append(f"{where}: a refund that no release outcome event records")
                continue
            expected = outcome.refund
            event = f"release_{outcome.status} event {outcome.seq}"
        else:
            problems.append(f"{where}: kind is neither charge nor refund")
            continue
        if request is not None and dataset_id != request.dataset_id:
            problems.append(f"{where}: dataset_id differs from {event}")
        if request is not None and grant_id != request.grant_id:
            problems.append(f"{where}: grant_id differs from release_requested event {request.seq}")
        if epsilon != expected[0]:
            problems.append(f"{where}: epsilon differs from {event}")
        if delta != expected[1]:
            problems.append(f"{where}: delta differs from {event}")
        if rho != expected[2]:
            problems.append(f"{where}: rho differs from {event}")
        if request is not None:
            # hybrid: the figures filters A' and B were charged, and a refund moves back
            # exactly its charge's (the ledger subtracts a refund's gdp and zcdp_delta: an
            # inflated one reopens filter A' or B); the other accountings move neither.
            cost = request.cost
            if gdp != (None if cost is None else cost.gdp):
                problems.append(f"{where}: gdp differs from release_requested event {request.seq}")
            if zd != (None if cost is None else cost.zcdp_delta):
                problems.append(
                    f"{where}: zcdp_delta differs from release_requested event {request.seq}"
                )
    for release_id, request in recorded.requests.items():
        if release_id not in charged:
            problems.append(
                f"ledger_entries: the charge for release {release_id} "
                f"(release_requested event {request.seq}) is missing"
            )
    for release_id, outcome in recorded.outcomes.items():
        if outcome.refund is not None and release_id not in refunded:
            problems.append(
                f"ledger_entries: the refund for release {release_id} "
                f"(release_{outcome.status} event {outcome.seq}) is missing"
            )


def _reconcile_keys(session: Session, recorded: _Recorded, problems: list[str]) -> None:
    seen: set[uuid.UUID] = set()
    for key_id, role, revoked_at in session.execute(
        select(ApiKey.id, ApiKey.role, ApiKey.revoked_at)
    ):
        seen.add(key_id)
        where = f"api_keys {key_id}"
        created = recorded.keys.get(key_id)
        if created is None:
            problems.append(f"{where}: no key_created event")
        elif role != created[1]:
            problems.append(f"{where}: role differs from key_created event {created[0]}")
        if (revoked_at is not None) != (key_id in recorded.revoked):
            problems.append(f"{where}: revoked_at disagrees with the key_revoked events")
    for key_id, (seq, _) in recorded.keys.items():
        if key_id not in seen:
            problems.append(f"api_keys {key_id}: the row is missing (created by event {seq})")


def _dataset_of(request: _Request) -> uuid.UUID | None:
    return request.dataset_id


def _grant_of(request: _Request) -> uuid.UUID | None:
    return request.grant_id


def _recorded_spend(
    recorded: _Recorded, budget_of: Callable[[_Request], uuid.UUID | None]
) -> dict[uuid.UUID, tuple[Decimal, Decimal, Decimal]]:
    """What the recorded releases spend (charges less refunds), ``(epsilon, delta, rho)``, per
    budget, keyed by ``budget_of(request)`` (a dataset or a grant; ``None``: not charged)."""
    zero = (Decimal(0), Decimal(0), Decimal(0))
    spent: dict[uuid.UUID, tuple[Decimal, Decimal, Decimal]] = {}
    for release_id, request in recorded.requests.items():
        key = budget_of(request)
        if key is None:
            continue
        total = spent.get(key, zero)
        outcome = recorded.outcomes.get(release_id)
        refund = zero if outcome is None or outcome.refund is None else outcome.refund
        spent[key] = (
            BUDGET_CONTEXT.subtract(BUDGET_CONTEXT.add(total[0], request.charge[0]), refund[0]),
            BUDGET_CONTEXT.subtract(BUDGET_CONTEXT.add(total[1], request.charge[1]), refund[1]),
            BUDGET_CONTEXT.subtract(BUDGET_CONTEXT.add(total[2], request.charge[2]), refund[2]),
        )
    return spent


def _check_spending(recorded: _Recorded, problems: list[str]) -> None:
    """No dataset's recorded releases may spend more than its recorded budget."""
    for dataset_id, spent in _recorded_spend(recorded, _dataset_of).items():
        budget = recorded.budgets.get(dataset_id)
        if budget is not None and budget.exceeded_by(spent):
            problems.append(
                f"datasets {dataset_id}: its recorded releases spend more than "
                f"budget_set event {budget.seq} allows"
            )


def _reconcile_grants(session: Session, recorded: _Recorded, problems: list[str]) -> None:
    seen: set[uuid.UUID] = set()
    rows = session.execute(
        select(
            Grant.id,
            Grant.dataset_id,
            Grant.analyst_key_id,
            Grant.epsilon,
            Grant.delta,
            Grant.rho,
            Grant.revoked_at,
        )
    )
    for grant_id, dataset_id, analyst_key_id, epsilon, delta, rho, revoked_at in rows:
        seen.add(grant_id)
        where = f"grants {grant_id}"
        created = recorded.grants.get(grant_id)
        if created is None:
            problems.append(f"{where}: no grant_created event")
        else:
            event = f"grant_created event {created.seq}"
            stored = (dataset_id, analyst_key_id, epsilon, delta, rho)
            expected = (
                created.dataset_id,
                created.analyst_key_id,
                created.epsilon,
                created.delta,
                created.rho,
            )
            names = ("dataset_id", "analyst_key_id", "epsilon", "delta", "rho")
            for name, value, recorded_value in zip(names, stored, expected, strict=True):
                if value != recorded_value:
                    problems.append(f"{where}: {name} differs from {event}")
        if (revoked_at is not None) != (grant_id in recorded.grants_revoked):
            problems.append(f"{where}: revoked_at disagrees with the grant_revoked events")
    for grant_id, created in recorded.grants.items():
        if grant_id not in seen:
            problems.append(
                f"grants {grant_id}: the row is missing (created by event {created.seq})"
            )
    for release_id, request in recorded.requests.items():
        if request.grant_id is None:
            continue
        granted = recorded.grants.get(request.grant_id)
        if granted is None or granted.seq > request.seq:
            problems.append(
                f"releases {release_id}: release_requested event {request.seq} charges grant "
                f"{request.grant_id}, which no earlier grant_created event created"
            )
            continue
        revoked = recorded.grants_revoked.get(request.grant_id)
        if revoked is not None and revoked < request.seq:
            problems.append(
                f"releases {release_id}: release_requested event {request.seq} charges grant "
                f"{request.grant_id}, revoked by event {revoked} before it"
            )
        if granted.dataset_id != request.dataset_id:
            problems.append(
                f"releases {release_id}: release_requested event {request.seq} charges grant "
                f"{request.grant_id} of another dataset"
            )


def _check_grant_spending(recorded: _Recorded, problems: list[str]) -> None:
    """No grant's recorded releases may spend more than its grant_created event gave it. A
    grant on a ``hybrid`` dataset is not summed: whether its spend fits depends on the order and
    on every filter's figures (its Gaussian releases are admitted by its Gaussian-DP filter
    long after their epsilons sum past its epsilon), and :func:`_check_hybrid_spending` replays
    it through its filters (it flagged every such grant)."""
    for grant_id, (epsilon, delta, rho) in _recorded_spend(recorded, _grant_of).items():
        granted = recorded.grants.get(grant_id)
        if granted is None:
            continue
        budget = None if granted.dataset_id is None else recorded.budgets.get(granted.dataset_id)
        if budget is not None and budget.hybrid is not None:
            continue
        if epsilon > granted.epsilon or delta > granted.delta or rho > granted.rho:
            problems.append(
                f"grants {grant_id}: its recorded releases spend more than "
                f"grant_created event {granted.seq} allows"
            )


def _hybrid_steps(
    recorded: _Recorded, requests: list[tuple[uuid.UUID, _Request]]
) -> list[audit_hybrid.Step]:
    """The recorded charges (named by their events' seq) and refunds, in event order: a refund
    at its outcome event (no later than it took effect: lenient, never stricter than the
    ledger), moving back its release's recorded cost (a refund is exactly its charge)."""
    steps: list[tuple[int, audit_hybrid.Step]] = []
    for release_id, request in requests:
        assert request.cost is not None
        steps.append((request.seq, (f"{request.seq}", 1, request.cost)))
        outcome = recorded.outcomes.get(release_id)
        if outcome is not None and outcome.refund is not None:
            steps.append((outcome.seq, (f"{outcome.seq}", -1, request.cost)))
    return [step for _, step in sorted(steps, key=lambda item: item[0])]


def _check_hybrid_spending(session: Session, recorded: _Recorded, problems: list[str]) -> None:
    """Every charge of a ``hybrid`` dataset (and of a grant on one) was admitted by one of its
    filters: the recorded charges in event order, and the ledger's rows in the order they took
    effect, replayed through the ledger's own rule (:mod:`service.audit_hybrid`; a refund
    zeroes its release there)."""
    hybrid = {key: budget for key, budget in recorded.budgets.items() if budget.hybrid}
    if not hybrid:
        return
    by_dataset: dict[uuid.UUID, list[tuple[uuid.UUID, _Request]]] = {key: [] for key in hybrid}
    for release_id, request in recorded.requests.items():
        if request.dataset_id in by_dataset and request.cost is not None:
            by_dataset[request.dataset_id].append((release_id, request))
    rows = audit_hybrid.ledger_entries(session, hybrid)
    for dataset_id, budget in hybrid.items():
        assert budget.hybrid is not None
        event = f"budget_set event {budget.seq}"
        requests = by_dataset[dataset_id]
        for seq in audit_hybrid.refused(budget.hybrid, _hybrid_steps(recorded, requests)):
            problems.append(
                f"datasets {dataset_id}: release_requested event {seq} is a charge that no "
                f"filter of {event} admits"
            )
        entries = rows.get(dataset_id, [])
        for entry in audit_hybrid.refused(budget.hybrid, audit_hybrid.steps_of(entries)):
            problems.append(f"ledger_entries {entry}: a charge that no filter of {event} admits")
        # Each grant on the dataset: its own sub-budget, its own charges and refunds.
        for grant_id, granted in recorded.grants.items():
            if granted.dataset_id != dataset_id:
                continue
            share = audit_hybrid.grant_budget(budget.hybrid, granted.epsilon, granted.delta)
            where = f"grant_created event {granted.seq}"
            mine = [(key, r) for key, r in requests if r.grant_id == grant_id]
            for seq in audit_hybrid.refused(share, _hybrid_steps(recorded, mine)):
                problems.append(
                    f"grants {grant_id}: release_requested event {seq} is a charge that no "
                    f"filter of {where} admits"
                )
            charged = audit_hybrid.steps_of(e for e in entries if e.grant_id == grant_id)
            for entry in audit_hybrid.refused(share, charged):
                problems.append(
                    f"ledger_entries {entry}: a charge that no filter of {where} admits"
                )
