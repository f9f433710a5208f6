"""An outside-style audit of ``audit verify`` as someone who can write the database: columns the
ledger admits by that verify did not compare with their events, and an acceptance cut-off
that a clock moved backwards reopened. Each case failed before its fix (on both databases)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import numpy as np
import pytest
from pydantic import SecretStr
from sqlalchemy import delete, select, text, update
from sqlalchemy.exc import DataError

from service import anchors, audit
from service.anchors import Anchor, AnchorWriter
from service.db.models import AuditEvent, AuditHead, Dataset, LedgerEntry, Release
from tests import test_audit_cli
from tests.conftest import post_release
from tests.test_audit_cli import dpss
from tests.test_audit_money import HMAC_KEY

# The CLI tests' committed service (``dpss audit verify`` reads it) and its release of each
# outcome, for the anchor cases.
service = test_audit_cli.service
ledger = test_audit_cli.ledger

GAUSS = {"mechanism": "analyze_gauss", "k": 1, "epsilon": "0.4", "delta": "1e-6"}


def _dataset(client, keys, upload_dataset, accounting: str) -> str:
    rng = np.random.default_rng(11)
    return upload_dataset(
        client,
        keys.owner,
        rng.normal(size=(200, 3)) * 0.1,
        accounting=accounting,
        epsilon_budget="1",
        delta_budget="1e-5",
        row_norm_bound=1.0,
    )["id"]


def _problems(session_factory) -> list[str]:
    with session_factory() as session:
        return audit.verify(session).problems


@pytest.mark.parametrize(
    ("accounting", "column"),
    [
        ("gaussian", "mu_total"),
        ("zcdp", "delta_conversion"),
        ("hybrid", "mu_total"),
        ("hybrid", "delta_gaussian"),
        ("hybrid", "delta_mechanisms"),
        ("hybrid", "delta_basic"),
        ("hybrid", "delta_conversion"),
    ],
)
def test_a_moved_budget_figure_is_named(
    accounting, column, client, keys, upload_dataset, session_factory
):
    """The ledger admits by these columns as much as by ``epsilon_total``: a raised ``mu_total``
    (or a share of delta moved between filters) hands budget back, and verify said nothing
    until the releases had overspent the recorded budget."""
    dataset_id = _dataset(client, keys, upload_dataset, accounting)
    assert _problems(session_factory) == []
    with session_factory.begin() as session:
        dataset = session.get(Dataset, uuid.UUID(dataset_id))
        assert dataset is not None and getattr(dataset, column) is not None
        setattr(dataset, column, getattr(dataset, column) * 2)
    found = _problems(session_factory)
    assert any(f"datasets {dataset_id}: {column} differs from budget_set event" in p for p in found)
    assert not any(str(Decimal(2)) in p.split(":")[-1] for p in found)  # names, never values


def test_an_inflated_refund_figure_is_named(
    client, keys, upload_dataset, run_worker, session_factory, refused_before_reading
):
    """A hybrid refund subtracts its own ``gdp`` and ``zcdp_delta`` in the ledger's sums; verify
    compared only a charge's with its event, so a refund of gdp 100 for a charge of 0.2 gave
    filter A' back far more than the release spent."""
    dataset_id = _dataset(client, keys, upload_dataset, "hybrid")
    release_id = post_release(client, keys.analyst, dataset_id, **GAUSS)
    assert run_worker() == 1
    with session_factory() as session:
        refund = session.scalars(
            select(LedgerEntry).where(
                LedgerEntry.release_id == uuid.UUID(release_id), LedgerEntry.kind == "refund"
            )
        ).one()
        assert refund.gdp is not None and refund.zcdp_delta is not None
    assert _problems(session_factory) == []
    for values in ({"gdp": Decimal(100)}, {"zcdp_delta": Decimal("0.5"), "gdp": refund.gdp}):
        with session_factory.begin() as session:
            session.execute(update(LedgerEntry).where(LedgerEntry.id == refund.id).values(**values))
        name = "gdp" if values["gdp"] == Decimal(100) else "zcdp_delta"
        assert f"ledger_entries {refund.id}: {name} differs from release_requested event" in (
            " ".join(_problems(session_factory))
        )


def test_a_figure_on_a_basic_charge_is_named(ledger_basic, session_factory):
    """Charges of the other accountings move no gdp or zcdp_delta: one that appears is named
    (were the dataset ever read as hybrid, it would count)."""
    _, release_id = ledger_basic
    with session_factory.begin() as session:
        session.execute(
            update(LedgerEntry)
            .where(LedgerEntry.release_id == uuid.UUID(release_id))
            .values(gdp=Decimal(-5))
        )
    assert any("gdp differs from release_requested event" in p for p in _problems(session_factory))


@pytest.fixture
def ledger_basic(client, keys, upload_dataset) -> tuple[str, str]:
    dataset_id = _dataset(client, keys, upload_dataset, "basic")
    return dataset_id, post_release(client, keys.analyst, dataset_id, **GAUSS)


def _cut_newest_release(factory, release_id: str) -> None:
    """Someone who can write the database removes the newest release (its rows, its event) and
    points the head before it: a consistent database in which it never happened."""
    with factory.begin() as session:
        last = session.scalars(select(AuditEvent).order_by(AuditEvent.seq.desc())).first()
        assert last is not None and last.release_id == uuid.UUID(release_id)
        session.execute(delete(LedgerEntry).where(LedgerEntry.release_id == last.release_id))
        session.execute(delete(Release).where(Release.id == last.release_id))
        session.delete(last)
        session.execute(
            update(AuditHead)
            .where(AuditHead.id == 1)
            .values(last_seq=last.seq - 1, last_hash=last.prev_hash)
        )


def test_a_clock_set_back_after_an_acceptance_does_not_silence_later_anchors(
    service, settings, ledger
) -> None:
    """An honest acceptance written while the host's clock ran a day ahead; the clock is then
    put right. Before: anchors were skipped by their *time* (at or before the acceptance's), so
    every anchor of the next day counted as history given up, and a cut of the newest release
    went unseen (exit 0, no hold). Anchors are now placed by their line in the file, the order
    they were written."""
    url, factory, (client, _) = service
    writer = AnchorWriter(factory, settings)
    assert writer.write_once() is not None
    with factory.begin() as session:
        anchors.accept_restore(session)
    writer.write_acceptance(now=datetime.now(UTC) + timedelta(days=1))
    release_id = post_release(
        client, ledger.analyst, ledger.dataset, **{**GAUSS, "epsilon": "0.05"}
    )
    assert writer.write_once() is not None  # at the right time again: before the acceptance's
    assert dpss("audit", "verify", url=url).exit_code == 0
    _cut_newest_release(factory, release_id)
    verified = dpss("audit", "verify", url=url)
    assert verified.exit_code == 1, verified.output
    assert "restore detected: the chain ends at event" in verified.stderr
    assert anchors.detect_restore(factory, settings, None) is not None


def test_with_the_key_an_acceptance_line_without_a_mac_accepts_nothing(
    service, settings, ledger
) -> None:
    """With DPSS_AUDIT_HMAC_KEY an anchor line without a MAC was still read, with a note: that
    only adds checks for a plain anchor, but an acceptance removes them. Someone who can append
    to the anchor file (not read the key) cut the newest release and appended an acceptance
    naming the shortened head: every earlier anchor went unchecked, exit 0."""
    url, factory, _ = service
    keyed = settings.model_copy(update={"audit_hmac_key": SecretStr(HMAC_KEY)})
    assert AnchorWriter(factory, keyed).write_once() is not None
    _cut_newest_release(factory, ledger.queued)
    with factory.begin() as session:
        anchors.accept_restore(session)  # the forger's event
    forged = AnchorWriter(factory, settings).write_acceptance()  # no key: no MAC
    assert forged.mac is None and forged.accepts
    # (This service wrote its events without the key, so verify also names the missing MACs;
    # the hold at start reads only the anchors, and the forged line silenced it.)
    verified = dpss("audit", "verify", url=url, DPSS_AUDIT_HMAC_KEY=HMAC_KEY)
    assert verified.exit_code == 1, verified.output
    assert "an acceptance without a MAC" in verified.stderr
    assert "restore detected" in verified.stderr
    assert HMAC_KEY not in verified.output
    assert anchors.detect_restore(factory, keyed, HMAC_KEY.encode()) is not None


def _set_details_text(factory, seq: int, body: str) -> None:
    with factory.begin() as session:
        pg = session.bind.dialect.name == "postgresql"
        value = "CAST(:body AS json)" if pg else ":body"
        session.execute(
            text(f"UPDATE audit_events SET details = {value} WHERE seq = :seq"),
            {"body": body, "seq": seq},
        )


@pytest.mark.parametrize(
    "forge",
    [
        # a second "cost" before the real one: Python (and the hash) read the last, SQLite's
        # json_extract the first, so SQL showed a cost of 0.0001 under a valid hash
        lambda raw: '{"cost": {"epsilon": "0.0001", "delta": "0"}, ' + raw.strip()[1:],
        lambda raw: raw.replace('"k": 1', '"k": 1, "k": 1', 1),
        lambda raw: raw.strip()[:-1] + ', "note": NaN}',
    ],
    ids=["repeated key, forged first", "repeated key, same value", "NaN"],
)
def test_stored_details_that_readers_read_differently_are_named(service, ledger, forge) -> None:
    url, factory, _ = service
    with factory() as session:
        event = session.scalars(
            select(AuditEvent).where(
                AuditEvent.release_id == uuid.UUID(ledger.succeeded),
                AuditEvent.event_type == "release_requested",
            )
        ).one()
        raw = session.execute(
            text("SELECT CAST(details AS TEXT) FROM audit_events WHERE seq = :seq"),
            {"seq": event.seq},
        ).scalar_one()
    forged = forge(raw)
    assert forged != raw
    if "NaN" in forged and not url.startswith("sqlite"):
        with pytest.raises(DataError):  # PostgreSQL's json type refuses it: SQLite's only
            _set_details_text(factory, event.seq, forged)
        return
    _set_details_text(factory, event.seq, forged)
    verified = dpss("audit", "verify", url=url)
    assert verified.exit_code == 1, verified.output
    assert f"FAIL event {event.seq}: its stored details repeat a key or hold a non-number" in (
        verified.stderr
    )
    assert "0.0001" not in verified.output  # names the event, never what it holds
    _set_details_text(factory, event.seq, raw)
    assert dpss("audit", "verify", url=url).exit_code == 0


def test_an_emptied_anchor_file_and_an_unanchored_tail_are_said(service, settings, ledger) -> None:
    """Whoever can write the anchor file can empty it (outside the threat model: keep it where
    database users cannot write). Before, verify said nothing at all about an empty file (a
    missing one got a note), nor which newest events no anchor covers yet."""
    url, factory, (client, _) = service
    assert AnchorWriter(factory, settings).write_once() is not None
    release_id = post_release(
        client, ledger.analyst, ledger.dataset, **{**GAUSS, "epsilon": "0.05"}
    )
    verified = dpss("audit", "verify", url=url)
    assert verified.exit_code == 0, verified.output
    with factory() as session:
        head = session.get(AuditHead, 1)
        assert head is not None
        assert (
            f"events {head.last_seq}-{head.last_seq} are newer than any anchor" in verified.stdout
        )
    assert release_id
    settings.resolved_audit_anchor_path.write_text("")
    verified = dpss("audit", "verify", url=url)
    assert verified.exit_code == 0, verified.output
    assert "holds no anchor: a restore from an older backup goes unseen" in verified.stdout


def test_an_anchor_time_that_would_drive_the_terminal_is_not_printed(
    service, settings, ledger
) -> None:
    """verify prints an anchor's time in its messages; a line whose time holds a control
    character (an ANSI escape, written as a JSON escape) reached the operator's terminal
    (click strips escapes only when the output is not a terminal, as here: before, the line
    was read as an anchor and its time printed in the restore message)."""
    url, factory, _ = service
    anchor = AnchorWriter(factory, settings).write_once()
    assert anchor is not None
    _cut_newest_release(factory, ledger.queued)
    # the newest anchor named: the one whose time the message shows
    escape = "\x1b[2J\x1b[32maudit chain OK"
    forged = Anchor(time=escape, seq=anchor.seq + 1, hash=anchor.hash).to_json()
    path = settings.resolved_audit_anchor_path
    path.write_text(path.read_text() + forged + "\n")
    verified = dpss("audit", "verify", url=url)
    assert verified.exit_code == 1, verified.output
    assert "\x1b" not in verified.output
    assert "line 2 is not an anchor" in verified.stderr
    assert "restore detected" in verified.stderr  # the honest first line still holds
