"""Tamper evidence that covers the money: ``audit.verify`` reconciles the ledger, the dataset
budgets, the releases and the keys with the audit events, checks an anchored head kept outside
the database and, given the key, each event's MAC.

Every tampering here was invisible to the chain-only verify (it rehashed the events and compared
the head, nothing else); each test shows the new check names the table and id.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy import delete, insert, select, update
from sqlalchemy.orm import Session, sessionmaker

from service import audit, auth
from service.app import create_app
from service.db.models import (
    ApiKey,
    AuditEvent,
    AuditHead,
    Dataset,
    LedgerEntry,
    Release,
    ReleaseBasis,
)
from service.jobs import REFUSED_AT_RUN_REASON
from service.mechanisms.base import MechanismOutput
from service.oneshot import OneShot
from service.worker import Outcome
from tests.conftest import bearer, post_release

HMAC_KEY = "k" * 16 + "0123456789abcdef"


@dataclass
class Ledger:
    """A database with a release of every outcome (ids as strings)."""

    dataset: str
    emptied: str
    succeeded: str
    no_result: str
    refunded: str
    failed: str
    queued: str
    owner: str
    analyst: str


def _boom(*_: Any) -> Outcome:
    # A data-independent fault (e.g. a refusal missed at prepare): the only kind that ends failed.
    return Outcome.failed("a refusal was missed at prepare")


def _refused(*_: Any) -> Outcome:
    return Outcome.failed(REFUSED_AT_RUN_REASON, refund=True)


def _decline(*_: Any) -> Outcome:
    return Outcome.of(MechanismOutput.no_result("declined"))


def populate(
    client: TestClient,
    factory: sessionmaker[Session],
    upload: Callable[..., dict[str, Any]],
    run_worker: Callable[[], int],
    monkeypatch: pytest.MonkeyPatch,
) -> Ledger:
    with factory.begin() as session:
        _, owner = auth.create_key(session, "owner", "o", actor_key_id=None)
        _, analyst = auth.create_key(session, "analyst", "a", actor_key_id=None)
    rng = np.random.default_rng(7)
    small = {"row_norm_bound": 1.0}
    dataset = upload(client, owner, rng.normal(size=(30, 3)) * 0.1, **small)["id"]
    emptied = upload(client, owner, rng.normal(size=(30, 3)) * 0.1, **small)["id"]
    gauss = {"mechanism": "analyze_gauss", "k": 1, "epsilon": "0.25", "delta": "1e-6"}
    succeeded = post_release(client, analyst, dataset, **gauss)
    assert run_worker() == 1
    # The worker's no_result path, whichever mechanism declines (a real decline costs seconds).
    with monkeypatch.context() as patch:
        patch.setattr(OneShot, "run", _decline)
        no_result = post_release(client, analyst, dataset, **gauss)
        assert run_worker() == 1
    # A failure decided before any row is read, refunded; then the dataset is deleted (a
    # release ending after a deletion is never refunded: tests/api/test_deletion_race.py).
    with monkeypatch.context() as patch:
        patch.setattr(OneShot, "run", _refused)
        refunded = post_release(client, analyst, emptied, **gauss)
        assert run_worker() == 1
    assert client.delete(f"/v1/datasets/{emptied}", headers=bearer(owner)).status_code == 204
    with monkeypatch.context() as patch:
        patch.setattr(OneShot, "run", _boom)
        failed = post_release(client, analyst, dataset, **gauss)
        assert run_worker() == 1
    queued = post_release(client, analyst, dataset, **gauss)
    ledger = Ledger(
        dataset, emptied, succeeded, no_result, refunded, failed, queued, owner, analyst
    )
    with factory() as session:
        status = {
            name: session.get(Release, uuid.UUID(getattr(ledger, name))).status  # type: ignore[union-attr]
            for name in ("succeeded", "no_result", "refunded", "failed", "queued")
        }
    assert status == {
        "succeeded": "succeeded",
        "no_result": "no_result",
        "refunded": "failed",
        "failed": "failed",
        "queued": "queued",
    }
    return ledger


@pytest.fixture
def ledger(client, session_factory, upload_dataset, run_worker, monkeypatch) -> Ledger:
    return populate(client, session_factory, upload_dataset, run_worker, monkeypatch)


def verify(factory: sessionmaker[Session], **kwargs: Any) -> audit.VerifyReport:
    with factory() as session:
        return audit.verify(session, **kwargs)


def rid(value: str) -> uuid.UUID:
    return uuid.UUID(value)


def test_every_outcome_verifies_clean(ledger, session_factory):
    report = verify(session_factory)
    assert report.ok, report.problems
    with session_factory() as session:
        refunds = session.scalars(select(LedgerEntry).where(LedgerEntry.kind == "refund")).all()
        last = session.scalars(select(AuditEvent).order_by(AuditEvent.seq.desc())).first()
    assert [entry.release_id for entry in refunds] == [rid(ledger.refunded)]
    assert last is not None and report.head == audit.Head(last.seq, last.hash)


# Each: what the intruder does (session, ledger), and what verify must then say.
Tampering = Callable[[Session, Ledger], Any]


def _raise_budget(session: Session, ledger: Ledger) -> Any:
    return session.execute(
        update(Dataset).where(Dataset.id == rid(ledger.dataset)).values(epsilon_total=Decimal(1000))
    )


def _delete_charge(session: Session, ledger: Ledger) -> Any:
    return session.execute(
        delete(LedgerEntry).where(
            LedgerEntry.release_id == rid(ledger.succeeded), LedgerEntry.kind == "charge"
        )
    )


def _lower_charge(session: Session, ledger: Ledger) -> Any:
    return session.execute(
        update(LedgerEntry)
        .where(LedgerEntry.release_id == rid(ledger.queued), LedgerEntry.kind == "charge")
        .values(epsilon=Decimal("0.01"))
    )


def _delete_refund(session: Session, ledger: Ledger) -> Any:
    return session.execute(delete(LedgerEntry).where(LedgerEntry.kind == "refund"))


def _forge_refund(session: Session, ledger: Ledger) -> Any:
    return session.execute(
        insert(LedgerEntry).values(
            dataset_id=rid(ledger.dataset),
            release_id=rid(ledger.failed),
            kind="refund",
            epsilon=Decimal("0.25"),
            delta=Decimal("1e-6"),
            created_at=audit.utcnow(),
        )
    )


def _edit_release(**values: Any) -> Callable[[str], Tampering]:
    def on(name: str) -> Tampering:
        def tamper(session: Session, ledger: Ledger) -> Any:
            release_id = rid(getattr(ledger, name))
            return session.execute(update(Release).where(Release.id == release_id).values(**values))

        return tamper

    return on


def _edit_basis(basis: bytes | None) -> Tampering:
    def tamper(session: Session, ledger: Ledger) -> Any:
        stored = ReleaseBasis.release_id == rid(ledger.succeeded)
        if basis is None:
            return session.execute(delete(ReleaseBasis).where(stored))
        return session.execute(update(ReleaseBasis).where(stored).values(basis=basis))

    return tamper


def _remove_release(session: Session, ledger: Ledger) -> Any:
    session.execute(delete(LedgerEntry).where(LedgerEntry.release_id == rid(ledger.succeeded)))
    session.execute(delete(ReleaseBasis).where(ReleaseBasis.release_id == rid(ledger.succeeded)))
    return session.execute(delete(Release).where(Release.id == rid(ledger.succeeded)))


def _forge_admin(session: Session, ledger: Ledger) -> Any:
    return session.execute(
        insert(ApiKey).values(
            id=uuid.uuid4(), name="x", role="admin", key_hash="f" * 64, created_at=audit.utcnow()
        )
    )


def _promote_analyst(session: Session, ledger: Ledger) -> Any:
    key = auth.authenticate(session, ledger.analyst)
    return session.execute(update(ApiKey).where(ApiKey.id == key.key_id).values(role="admin"))


def _undelete_dataset(session: Session, ledger: Ledger) -> Any:
    return session.execute(
        update(Dataset).where(Dataset.id == rid(ledger.emptied)).values(deleted_at=None)
    )


TAMPERINGS: dict[str, tuple[Tampering, str]] = {
    "raise epsilon_total": (_raise_budget, "datasets {dataset}: epsilon_total differs"),
    "delete a charge": (_delete_charge, "ledger_entries: the charge for release {succeeded}"),
    "lower a charge": (_lower_charge, "epsilon differs from release_requested event"),
    "delete a refund": (_delete_refund, "ledger_entries: the refund for release {refunded}"),
    "forge a refund": (_forge_refund, "a refund that no release outcome event records"),
    "lower a release's epsilon": (
        _edit_release(epsilon=Decimal("0.01"))("queued"),
        "releases {queued}: epsilon differs from release_requested event",
    ),
    "edit a result hash": (
        _edit_release(result_sha256="0" * 64)("succeeded"),
        "releases {succeeded}: result_sha256 differs from release_succeeded event",
    ),
    "edit a result basis": (
        _edit_basis(b"\0" * 24),
        "releases {succeeded}: the basis does not match its sha256",
    ),
    "remove a result basis": (
        _edit_basis(None),
        "releases {succeeded}: the basis is missing",
    ),
    "re-queue a failed release": (
        _edit_release(status="queued")("failed"),
        "releases {failed}: status differs from release_failed event",
    ),
    "mark a release refunded": (
        _edit_release(refunded=True)("failed"),
        "releases {failed}: refunded differs from release_failed event",
    ),
    "reword a failure": (
        _edit_release(reason="ran out of budget")("refunded"),
        "releases {refunded}: reason differs from release_failed event",
    ),
    "give a queued release a result": (
        _edit_release(status="succeeded", result_sha256="0" * 64)("queued"),
        "releases {queued}: status is final but no event records an outcome",
    ),
    "remove a release and its ledger rows": (
        _remove_release,
        "releases {succeeded}: the row is missing",
    ),
    "forge an admin key": (_forge_admin, "no key_created event"),
    "promote an analyst key": (_promote_analyst, "role differs from key_created event"),
    "undelete a dataset": (
        _undelete_dataset,
        "datasets {emptied}: deleted_at disagrees with the dataset_deleted events",
    ),
}


@pytest.mark.parametrize("name", list(TAMPERINGS))
def test_tampering_with_the_money_is_reported(name, ledger, session_factory):
    tamper, expected = TAMPERINGS[name]
    assert verify(session_factory).ok
    with session_factory.begin() as session:
        tamper(session, ledger)
    report = verify(session_factory)
    wanted = expected.format(**vars(ledger))
    assert any(wanted in problem for problem in report.problems), report.problems
    # Problems name tables, events and ids: never a stored value such as the forged amounts.
    assert not any("1000" in problem or "0.01" in problem for problem in report.problems)


def _drop_last_release(session: Session, ledger: Ledger) -> None:
    """Remove the newest release with its charge and event, and point the head before it: a
    consistent database that has handed the release's cost back."""
    last = session.scalars(select(AuditEvent).order_by(AuditEvent.seq.desc())).first()
    assert last is not None and last.release_id == rid(ledger.queued)
    session.execute(delete(LedgerEntry).where(LedgerEntry.release_id == rid(ledger.queued)))
    session.execute(delete(Release).where(Release.id == rid(ledger.queued)))
    session.execute(delete(AuditEvent).where(AuditEvent.seq == last.seq))
    session.execute(
        update(AuditHead)
        .where(AuditHead.id == 1)
        .values(last_seq=last.seq - 1, last_hash=last.prev_hash)
    )


def test_a_removed_tail_with_a_rewritten_head_is_caught_by_the_anchor(ledger, session_factory):
    anchor = verify(session_factory).head
    with session_factory.begin() as session:
        _drop_last_release(session, ledger)
    # Without something kept outside the database this state is indistinguishable from one in
    # which the release never happened: the documented limit.
    assert verify(session_factory).ok
    report = verify(session_factory, anchor=anchor)
    assert any(
        f"the chain ends at event {anchor.seq - 1} but the anchor names event {anchor.seq}" in p
        for p in report.problems
    ), report.problems


@pytest.fixture
def chain_only_db(session_factory) -> Iterator[sessionmaker[Session]]:
    with session_factory.begin() as session:
        for index in range(3):
            auth.create_key(session, "analyst", f"k{index}", actor_key_id=None)
    yield session_factory


def test_a_removed_last_event_with_a_rewritten_head_is_caught_by_the_anchor(chain_only_db):
    factory = chain_only_db
    anchor = verify(factory).head
    with factory.begin() as session:
        last = session.get(AuditEvent, anchor.seq)
        assert last is not None
        session.execute(delete(ApiKey).where(ApiKey.id == uuid.UUID(last.details["key_id"])))
        session.delete(last)
        session.execute(
            update(AuditHead)
            .where(AuditHead.id == 1)
            .values(last_seq=last.seq - 1, last_hash=last.prev_hash)
        )
    assert verify(factory).ok
    report = verify(factory, anchor=anchor)
    assert report.problems == [
        f"the chain ends at event {anchor.seq - 1} but the anchor names event {anchor.seq}: "
        "newer events were removed, or the database was restored from a backup older than the "
        "anchor (which hands back all budget spent after that backup)"
    ]


def _budget_left(client: TestClient, ledger: Ledger) -> Decimal:
    response = client.get(
        f"/v1/datasets/{ledger.dataset}/budget", headers=bearer(ledger.analyst)
    ).json()
    return Decimal(response["epsilon_remaining"])


def test_restoring_an_older_backup_is_caught_by_a_newer_anchor(
    ledger, client, session_factory, run_worker
):
    connection = session_factory.kw["bind"]
    before = _budget_left(client, ledger)
    backup = connection.begin_nested()  # everything after this is what the backup lacks
    post_release(
        client,
        ledger.analyst,
        ledger.dataset,
        mechanism="analyze_gauss",
        k=1,
        epsilon="2",
        delta="1e-6",
    )
    run_worker()
    assert _budget_left(client, ledger) == before - 2
    anchor = verify(session_factory).head
    backup.rollback()  # the restore
    report = verify(session_factory, anchor=anchor)
    assert not report.ok
    assert any("restored from a backup older than the anchor" in p for p in report.problems)
    # What the restore did, and why it must be detectable: the spent budget is back.
    assert _budget_left(client, ledger) == before
    # Once the restored service records anything, the anchored event is a different one.
    with session_factory.begin() as session:
        for index in range(4):
            auth.create_key(session, "analyst", f"after-restore-{index}", actor_key_id=None)
    report = verify(session_factory, anchor=anchor)
    assert any(f"event {anchor.seq} differs from the anchor" in p for p in report.problems)


def test_an_older_anchor_still_verifies_as_the_chain_grows(ledger, session_factory):
    anchor = verify(session_factory).head
    with session_factory.begin() as session:
        auth.create_key(session, "auditor", "later", actor_key_id=None)
    report = verify(session_factory, anchor=anchor)
    assert report.ok and report.head.seq == anchor.seq + 1
    assert verify(session_factory, anchor=audit.Head(0, audit.GENESIS_HASH)).ok


def _rechain(session: Session, *, strip_macs: bool) -> None:
    """What someone who can write the database does after editing an event: recompute every
    hash from the first event on and move the head (no key needed without an HMAC)."""
    prev = audit.GENESIS_HASH
    for event in session.scalars(select(AuditEvent).order_by(AuditEvent.seq)).all():
        event.prev_hash = prev
        event.hash = audit.stored_event_digest(event, prev)
        if strip_macs:
            event.mac = None
        session.flush()
        prev = event.hash
    session.execute(update(AuditHead).where(AuditHead.id == 1).values(last_hash=prev))


def _raise_budget_everywhere(session: Session, ledger: Ledger) -> None:
    event = session.scalars(
        select(AuditEvent).where(
            AuditEvent.event_type == "budget_set", AuditEvent.dataset_id == rid(ledger.dataset)
        )
    ).one()
    event.details = {**event.details, "epsilon_total": "1000"}
    _raise_budget(session, ledger)


def test_a_recomputed_chain_is_caught_by_an_anchor_but_not_without(ledger, session_factory):
    anchor = verify(session_factory).head
    with session_factory.begin() as session:
        _raise_budget_everywhere(session, ledger)
        _rechain(session, strip_macs=True)
    assert verify(session_factory).ok  # the documented limit without an anchor or a key
    report = verify(session_factory, anchor=anchor)
    assert any(f"event {anchor.seq} differs from the anchor" in p for p in report.problems)


@pytest.fixture
def keyed(settings, session_factory) -> Iterator[TestClient]:
    """A client whose app (and, through the shared session factory, worker) MACs events."""
    keyed_settings = settings.model_copy(update={"audit_hmac_key": SecretStr(HMAC_KEY)})
    with TestClient(create_app(keyed_settings, session_factory=session_factory)) as client:
        yield client


@pytest.fixture
def keyed_ledger(keyed, session_factory, upload_dataset, run_worker, monkeypatch) -> Ledger:
    return populate(keyed, session_factory, upload_dataset, run_worker, monkeypatch)


def test_with_a_key_every_event_carries_a_mac_that_verifies(keyed_ledger, session_factory):
    with session_factory() as session:
        macs = session.scalars(select(AuditEvent.mac)).all()
    assert macs and all(mac is not None for mac in macs)
    assert HMAC_KEY not in repr(session_factory)  # tracebacks and debuggers never show it
    assert verify(session_factory, hmac_key=HMAC_KEY.encode()).ok
    wrong = verify(session_factory, hmac_key=b"x" * 32)
    assert len(wrong.problems) == len(macs)
    unchecked = verify(session_factory)
    assert unchecked.ok and any("MACs not checked" in note for note in unchecked.notes)


@pytest.mark.parametrize("strip_macs", [False, True])
def test_with_a_key_a_recomputed_chain_is_caught_without_an_anchor(
    strip_macs, keyed_ledger, session_factory
):
    with session_factory.begin() as session:
        _raise_budget_everywhere(session, keyed_ledger)
        _rechain(session, strip_macs=strip_macs)
    assert verify(session_factory).ok  # a verifier without the key sees nothing wrong
    report = verify(session_factory, hmac_key=HMAC_KEY.encode())
    expected = "no event has a MAC" if strip_macs else "the MAC does not match"
    assert any(expected in problem for problem in report.problems), report.problems


def test_events_written_before_the_key_are_vouched_for_by_the_first_mac(
    session_factory, keyed_ledger
):
    with session_factory() as session:
        macs = session.scalars(select(AuditEvent.mac).order_by(AuditEvent.seq)).all()
    # The keys fixture-free scenario MACs everything; drop the MACs of a prefix to model a
    # deployment that turned the key on later: still sound, since later MACs cover its hashes.
    with session_factory.begin() as session:
        session.execute(update(AuditEvent).where(AuditEvent.seq <= 3).values(mac=None))
    assert len(macs) > 3
    assert verify(session_factory, hmac_key=HMAC_KEY.encode()).ok
    with session_factory.begin() as session:
        session.execute(update(AuditEvent).where(AuditEvent.seq == len(macs) - 1).values(mac=None))
    report = verify(session_factory, hmac_key=HMAC_KEY.encode())
    assert report.problems == [f"event {len(macs) - 1}: no MAC, but an earlier event has one"]


def test_head_tokens_round_trip_and_refuse_garbage():
    head = audit.Head(12, "ab" * 32)
    assert audit.Head.parse(head.token() + "\n") == head
    for token in ("12", "x:" + "ab" * 32, "12:" + "AB" * 32, "12:" + "ab" * 31, "-1:" + "0" * 64):
        with pytest.raises(ValueError, match="SEQ:HASH"):
            audit.Head.parse(token)


def test_an_appended_forged_event_is_caught_only_with_the_key(keyed_ledger, session_factory):
    # The intruder's own session: it writes through the same code, but without the key.
    intruder = sessionmaker(
        bind=session_factory.kw["bind"], join_transaction_mode="create_savepoint"
    )
    with intruder.begin() as session:
        audit.record(
            session,
            "budget_set",
            actor_key_id=None,
            dataset_id=rid(keyed_ledger.dataset),
            details={"epsilon_total": Decimal(1000), "delta_total": Decimal("0.001")},
        )
        _raise_budget(session, keyed_ledger)
    assert verify(session_factory).ok  # well-formed and consistent: the documented limit
    report = verify(session_factory, hmac_key=HMAC_KEY.encode())
    assert report.problems == [f"event {report.head.seq}: no MAC, but an earlier event has one"]


def test_a_consistently_lowered_budget_below_what_was_spent_is_reported(ledger, session_factory):
    # Event and row agree (so no reconciliation problem), but the releases the log records
    # already spend more than the new total: verify sums the recorded costs less refunds.
    with session_factory.begin() as session:
        audit.record(
            session,
            "budget_set",
            actor_key_id=None,
            dataset_id=rid(ledger.dataset),
            details={"epsilon_total": Decimal("0.5"), "delta_total": Decimal("0.001")},
        )
        session.execute(
            update(Dataset)
            .where(Dataset.id == rid(ledger.dataset))
            .values(epsilon_total=Decimal("0.5"))
        )
    problems = verify(session_factory).problems
    assert problems == [
        f"datasets {ledger.dataset}: its recorded releases spend more than budget_set event "
        f"{verify(session_factory).head.seq} allows"
    ]
