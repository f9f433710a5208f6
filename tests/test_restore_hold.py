"""Restores from an older backup: the default anchor file is not in the data directory (so a
backup of it cannot roll the anchors back), and a detected restore holds the service (charges
and key use refused with 503 ``restore_unaccepted``, shown on the audit view) until an admin
runs ``dpss audit accept-restore``; detection and acceptance are in the audit log."""

from __future__ import annotations

import logging
import shutil
import uuid
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import make_url, select

from service import anchors, auth
from service.anchors import AnchorWriter
from service.app import create_app
from service.config import Settings
from service.db.engine import make_engine, make_session_factory
from service.db.models import AuditEvent
from service.migrate import upgrade_to_head
from tests import test_audit_cli
from tests.conftest import _admin_execute, bearer
from tests.test_audit_cli import _backup, dpss

service = test_audit_cli.service
ledger = test_audit_cli.ledger


def _key(factory, role: str) -> tuple[str, str]:
    with factory.begin() as session:
        key, secret = auth.create_key(session, role, role, actor_key_id=None)  # type: ignore[arg-type]
        return str(key.id), secret


def _events(factory) -> list[str]:
    with factory() as session:
        return list(session.scalars(select(AuditEvent.event_type).order_by(AuditEvent.seq)))


def test_the_default_anchor_file_is_not_carried_by_a_backup_of_the_data_directory(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The data directory holds the SQLite database and the datasets: copy it away, change
    things, copy it back. The anchors must still show the restore."""
    settings = Settings(data_dir=tmp_path / "data", admin_api_key=None)
    anchor_path = settings.resolved_audit_anchor_path
    assert not anchor_path.resolve().is_relative_to(settings.data_dir.resolve())
    settings.data_dir.mkdir()
    upgrade_to_head(settings.resolved_database_url)
    engine = make_engine(settings.resolved_database_url)
    try:
        factory = make_session_factory(engine)
        key_id, _ = _key(factory, "analyst")
        writer = AnchorWriter(factory, settings)
        assert writer.write_once() is not None
        engine.dispose()
        shutil.copytree(settings.data_dir, tmp_path / "backup")  # the operator's backup
        with factory.begin() as session:
            auth.revoke_key(session, uuid.UUID(key_id), actor_key_id=None)
        assert writer.write_once() is not None
        engine.dispose()
        shutil.rmtree(settings.data_dir)
        shutil.copytree(tmp_path / "backup", settings.data_dir)  # ...restored
        assert anchors.detect_restore(factory, settings, None) is not None
        assert "restore_detected" in _events(factory)
        # An API process says at start where the anchors are, and finds the hold.
        caplog.set_level(logging.INFO, logger="dpss")
        with TestClient(create_app(settings)) as client:
            assert client.get("/v1/datasets", headers=bearer("dpss_x")).status_code == 401
        assert any(str(anchor_path) in r.getMessage() for r in caplog.records)
    finally:
        engine.dispose()


def test_a_detected_restore_holds_the_service_until_an_admin_accepts_it(
    service, ledger, settings, tmp_path
) -> None:
    url, factory, _ = service
    if shutil.which("pg_dump") is None and not url.startswith("sqlite"):
        pytest.skip("pg_dump is not installed")
    leaver_id, leaver = _key(factory, "analyst")
    _, admin = _key(factory, "admin")
    _, auditor = _key(factory, "auditor")
    restored = _backup(url, tmp_path)
    try:
        with factory.begin() as session:  # after the backup: the restore brings the key back
            auth.revoke_key(session, uuid.UUID(leaver_id), actor_key_id=None)
        assert AnchorWriter(factory, settings).write_once() is not None
        restored_settings = settings.model_copy(update={"database_url": restored})
        app = create_app(restored_settings)
        with TestClient(app, raise_server_exceptions=False) as client:
            # The revoked key is live again in the restored database: refused all the same.
            for key, method, path, body in (
                (leaver, "GET", "/v1/datasets", None),
                (ledger.analyst, "GET", f"/v1/datasets/{ledger.dataset}/budget", None),
                (
                    ledger.analyst,
                    "POST",
                    f"/v1/datasets/{ledger.dataset}/releases",
                    {"mechanism": "analyze_gauss", "k": 1, "epsilon": "0.01", "delta": "1e-9"},
                ),
                (admin, "POST", "/v1/keys", {"role": "analyst", "name": "x"}),
                (auditor, "POST", "/v1/keys", {"role": "analyst", "name": "x"}),
            ):
                refused = client.request(method, path, headers=bearer(key), json=body)
                assert refused.status_code == 503, (path, refused.text)
                assert refused.json()["error"] == "restore_unaccepted"
                assert "dpss audit accept-restore" in refused.json()["detail"]
                assert int(refused.headers["Retry-After"]) > 0
            # Admins and auditors still read: the dashboard's audit view shows the restore.
            shown = client.get("/v1/audit/verification", headers=bearer(auditor)).json()
            assert shown["restore_unaccepted"] and not shown["ok"]
            assert "restore detected" in shown["problems"][0]
            assert client.get("/v1/audit?limit=5", headers=bearer(admin)).status_code == 200
            # Every page of the dashboard asks whoami first: admins see the restore there.
            me = client.get("/v1/whoami", headers=bearer(admin)).json()
            assert me["role"] == "admin" and me["restore_unaccepted"] == shown["restore_unaccepted"]
            restored_factory = make_session_factory(make_engine(restored))
            assert _events(restored_factory).count("restore_detected") == 1

            accepted = dpss("audit", "accept-restore", url=restored)
            assert accepted.exit_code == 0, accepted.output
            assert "restore accepted" in accepted.stdout
            events = _events(restored_factory)
            assert events.index("restore_accepted") > events.index("restore_detected")
            app.state.database.verified_keys.clear()  # as DPSS_AUTH_CACHE_SECONDS later
            assert client.get("/v1/datasets", headers=bearer(leaver)).status_code == 200
            shown = client.get("/v1/audit/verification", headers=bearer(auditor)).json()
            assert shown["restore_unaccepted"] is None
            me = client.get("/v1/whoami", headers=bearer(admin)).json()
            assert me["restore_unaccepted"] is None
        # Accepted: the anchors of the history given up no longer fail the verification, and a
        # restarted process does not hold the service again.
        verified = dpss("audit", "verify", url=restored)
        assert verified.exit_code == 0, verified.output
        assert "written before the restore accepted" in verified.stdout
        assert anchors.detect_restore(restored_factory, restored_settings, None) is None
        assert dpss("audit", "accept-restore", url=restored).stdout.startswith("no restore")
    finally:
        if not restored.startswith("sqlite"):
            _admin_execute(f'DROP DATABASE IF EXISTS "{make_url(restored).database}" WITH (FORCE)')


def test_a_restore_under_a_running_worker_holds_the_service_at_its_next_anchor(
    service, settings, ledger
) -> None:
    """The database rolled back (consistently, one release shorter) and then grew again while
    a worker ran: its next anchor round notices and holds the service, without a restart."""
    from tests.test_audit_money import _drop_last_release

    _, factory, (client, _) = service
    writer = AnchorWriter(factory, settings)
    assert writer.write_once() is not None
    with factory.begin() as session:
        _drop_last_release(session, ledger)
    _key(factory, "analyst")  # new events after the cut
    assert writer.write_once() is not None
    assert "restore_detected" in _events(factory)
    client.app.state.database.verified_keys.clear()
    refused = client.get("/v1/datasets", headers=bearer(ledger.analyst))
    assert refused.status_code == 503 and refused.json()["error"] == "restore_unaccepted"


def test_an_acceptance_forged_in_the_database_does_not_silence_the_anchors(
    service, settings, ledger
) -> None:
    """Someone who can write the database, but not the anchor file, cuts the newest release
    (consistently: rows, events, head) and appends a ``restore_accepted`` event of their own,
    as ``dpss audit accept-restore`` would write it (the code is public; with no MAC key the
    chain is theirs to extend). Before: the acceptance read from the chain alone made every
    anchor written before it unchecked, so ``verify`` exited 0 and no worker held the service:
    the cut release's budget was back, unseen. The acceptance counts only when the anchor file
    witnesses it (the line `accept-restore` appends there)."""
    from tests.test_audit_money import _drop_last_release

    url, factory, _ = service
    assert AnchorWriter(factory, settings).write_once() is not None
    with factory.begin() as session:
        _drop_last_release(session, ledger)
        anchors.accept_restore(session)  # the forger's event, not the CLI's
    verified = dpss("audit", "verify", url=url)
    assert verified.exit_code == 1, verified.output
    assert "restore detected" in verified.stderr
    assert anchors.detect_restore(factory, settings, None) is not None
    assert _events(factory)[-1] == "restore_detected"
