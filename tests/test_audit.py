"""The audit chain: verify passes, then fails after any stored event is edited or removed."""

from __future__ import annotations

import pytest
from sqlalchemy import delete, select, update
from typer.testing import CliRunner

from service import audit, auth
from service.cli import app as cli_app
from service.db.models import ApiKey, AuditEvent
from tests.conftest import bearer


@pytest.fixture
def chain(session_factory):
    with session_factory.begin() as session:
        for index in range(5):
            auth.create_key(session, "analyst", f"k{index}", actor_key_id=None)
    return session_factory


def verify(session_factory):
    with session_factory() as session:
        return audit.verify(session)


def test_an_untouched_chain_verifies(chain):
    report = verify(chain)
    assert report.ok and report.checked == 5


def test_an_edited_event_breaks_the_chain(chain):
    with chain.begin() as session:
        session.execute(
            update(AuditEvent).where(AuditEvent.seq == 3).values(details={"name": "forged"})
        )
    report = verify(chain)
    assert not report.ok
    assert any("event 3: content" in problem for problem in report.problems)


def test_a_removed_event_breaks_the_chain(chain):
    with chain.begin() as session:
        session.execute(delete(AuditEvent).where(AuditEvent.seq == 2))
    assert any("event 2 is missing" in p for p in verify(chain).problems)


def test_a_removed_last_event_breaks_the_chain(chain):
    with chain.begin() as session:
        session.execute(delete(AuditEvent).where(AuditEvent.seq == 5))
    assert any("removed" in p for p in verify(chain).problems)


def test_a_rehashed_forgery_is_still_caught_by_the_links(chain):
    with chain.begin() as session:
        event = session.get(AuditEvent, 2)
        event.details = {"name": "forged"}
        event.hash = audit.stored_event_digest(event)
    assert any("event 3: prev_hash" in p for p in verify(chain).problems)


def test_every_release_outcome_is_audited_with_cost_and_basis_hash(
    client, keys, upload_dataset, run_worker, rng, session_factory
):
    dataset = upload_dataset(client, keys.owner, rng.normal(size=(30, 3)) * 0.1, row_norm_bound=1.0)
    release = client.post(
        f"/v1/datasets/{dataset['id']}/releases",
        headers=bearer(keys.analyst),
        json={"mechanism": "analyze_gauss", "k": 1, "epsilon": "0.25", "delta": "1e-6"},
    ).json()
    run_worker()
    events = client.get("/v1/audit", headers=bearer(keys.auditor)).json()["items"]
    kinds = [event["event_type"] for event in events]
    assert kinds[-4:] == ["dataset_created", "budget_set", "release_requested", "release_succeeded"]
    requested, succeeded = events[-2], events[-1]
    assert requested["details"]["cost"] == {"epsilon": "0.25", "delta": "0.000001"}
    assert requested["actor_key_id"] is not None
    result = client.get(f"/v1/releases/{release['id']}", headers=bearer(keys.analyst)).json()[
        "result"
    ]
    assert succeeded["details"]["basis_sha256"] == result["basis_sha256"]
    assert verify(session_factory).ok


def test_audit_pagination(client, keys, chain):
    first = client.get("/v1/audit?limit=3", headers=bearer(keys.auditor)).json()
    assert [e["seq"] for e in first["items"]] == [1, 2, 3] and first["next_after"] == 3
    rest = client.get(
        f"/v1/audit?after={first['next_after']}&limit=100", headers=bearer(keys.auditor)
    ).json()
    assert rest["items"][0]["seq"] == 4 and rest["next_after"] is None


def test_dpss_audit_verify_exit_codes(committed_db, monkeypatch, tmp_path):
    url, factory = committed_db
    monkeypatch.setenv("DPSS_DATA_DIR", str(tmp_path))  # its anchors and files, not ./dpss-data
    with factory.begin() as session:
        auth.create_key(session, "owner", "o", None)
        auth.create_key(session, "owner", "p", None)
    monkeypatch.setenv("DPSS_DATABASE_URL", url)
    runner = CliRunner()
    ok = runner.invoke(cli_app, ["audit", "verify"])
    assert ok.exit_code == 0 and "OK (2 events)" in ok.output
    with factory.begin() as session:
        session.execute(
            update(AuditEvent).where(AuditEvent.seq == 1).values(event_type="key_revoked")
        )
    broken = runner.invoke(cli_app, ["audit", "verify"])
    assert broken.exit_code == 1 and "BROKEN" in broken.output


def test_keys_create_cli_makes_a_working_key(committed_db, monkeypatch):
    url, factory = committed_db
    monkeypatch.setenv("DPSS_DATABASE_URL", url)
    result = CliRunner().invoke(cli_app, ["keys", "create", "--role", "auditor", "--name", "ops"])
    assert result.exit_code == 0
    secret = result.output.split("key:")[1].strip()
    with factory() as session:
        assert auth.authenticate(session, secret).role == "auditor"
    refused = CliRunner().invoke(cli_app, ["keys", "create", "--role", "root"])
    assert refused.exit_code == 2
    with factory() as session:
        assert session.scalar(select(AuditEvent.event_type)) == "key_created"


def test_an_append_writes_at_once_after_the_callers_pending_changes(chain):
    """An append flushes the caller's pending changes first (the chain's lock order: the
    change, then the head), then writes its event and the head's move at once: nothing is left
    for the commit to flush, and two appends in one transaction chain one after the other.
    (Before, the event and the head were ORM objects the commit flushed: ``session.new`` held
    the event after the append.)"""
    with chain.begin() as session:
        before = session.execute(select(AuditEvent.seq).order_by(AuditEvent.seq.desc())).first()
        assert before is not None
        key, _secret = auth.create_key(session, "analyst", "pending", actor_key_id=None)
        key.name = "renamed"  # a pending change of the caller's
        audit.record(session, "test_event", actor_key_id=None, details={"n": 1})
        assert not session.new and not session.dirty
        stored = session.connection().execute(
            select(ApiKey.__table__.c.name).where(ApiKey.__table__.c.id == key.id)
        )
        assert stored.scalar_one() == "renamed"
        # Ordered: PostgreSQL returns rows in no set order without ORDER BY (seen: [7, 6]).
        seqs = session.execute(
            select(AuditEvent.seq).where(AuditEvent.seq > before.seq).order_by(AuditEvent.seq)
        ).all()
        assert [row.seq for row in seqs] == [before.seq + 1, before.seq + 2]
    report = verify(chain)
    assert report.ok and report.checked == before.seq + 2
