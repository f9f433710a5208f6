"""Audit anchors (service.anchors) and the data directory check (service.datadir), through
``dpss audit verify`` with its defaults: a restore of an older backup, a rewritten tail, a forged
or cut anchor line, a missing dataset file and an orphaned one are each found, on both
databases, without the operator exporting anything by hand."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
from pydantic import SecretStr
from sqlalchemy import make_url

from service import auth
from service.anchors import Anchor, AnchorWriter, read
from service.audit import Head
from service.datadir import ORPHAN_GRACE_SECONDS
from tests import test_audit_cli
from tests.conftest import _admin_execute
from tests.test_audit_cli import _backup, dpss
from tests.test_audit_money import HMAC_KEY, _drop_last_release

# The fixtures of the CLI tests: a service with a release of every outcome, committed.
service = test_audit_cli.service
ledger = test_audit_cli.ledger

pytestmark = pytest.mark.usefixtures("ledger")


def _writer(factory, settings, **update) -> AnchorWriter:
    return AnchorWriter(factory, settings.model_copy(update=update))


def _revoke_a_new_key(factory) -> None:
    with factory.begin() as session:
        key, _ = auth.create_key(session, "analyst", "leaver", actor_key_id=None)
        auth.revoke_key(session, key.id, actor_key_id=None)


def test_the_writer_anchors_each_new_head_once_with_a_mac(service, settings):
    _, factory, _ = service
    writer = _writer(factory, settings, audit_hmac_key=SecretStr(HMAC_KEY))
    first = writer.write_once()
    assert first is not None and first.mac is not None
    assert writer.write_once() is None  # unchanged head: nothing written
    _revoke_a_new_key(factory)
    second = writer.write_once()
    assert second is not None and second.seq == first.seq + 2
    path = settings.resolved_audit_anchor_path
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    read_back = read(path, HMAC_KEY.encode())
    assert [a.head for a in read_back.anchors] == [first.head, second.head]
    assert read_back.problems == [] and read_back.notes == []
    verified = dpss("audit", "verify", url=service[0])
    assert verified.exit_code == 0, verified.output
    assert f"the chain holds all 2 anchors (newest: event {second.seq}" in verified.stdout


def test_a_restored_older_backup_fails_verify_by_default(service, settings, tmp_path):
    """The anchors of the live service catch the restore, also after a worker restarted on
    the restored database has anchored its shorter chain (the newest line)."""
    if shutil.which("pg_dump") is None and not service[0].startswith("sqlite"):
        pytest.skip("pg_dump is not installed")
    url, factory, _ = service
    restored = _backup(url, tmp_path)
    try:
        _revoke_a_new_key(factory)  # after the backup: the restore brings the key back
        live = _writer(factory, settings)
        assert live.write_once() is not None
        assert dpss("audit", "verify", url=url).exit_code == 0
        result = dpss("audit", "verify", url=restored)
        assert result.exit_code == 1
        assert "restore detected: the chain ends at event" in result.stderr
        assert "restored from a backup older than that anchor" in result.stderr
        from service.db.engine import make_engine, make_session_factory

        engine = make_engine(restored)
        try:
            restarted = _writer(make_session_factory(engine), settings)
            assert restarted.check_at_start() != []  # logged at the worker's start
            assert restarted.write_once() is not None  # the shorter head, now the last line
        finally:
            engine.dispose()
        again = dpss("audit", "verify", url=restored)
        assert again.exit_code == 1 and "restore detected" in again.stderr
    finally:
        if not restored.startswith("sqlite"):
            _admin_execute(f'DROP DATABASE IF EXISTS "{make_url(restored).database}" WITH (FORCE)')


def test_a_chain_that_diverges_from_an_anchor_fails(service, settings, ledger):
    url, factory, _ = service
    assert _writer(factory, settings).write_once() is not None
    with factory.begin() as session:
        _drop_last_release(session, ledger)  # consistent, one event shorter...
    _revoke_a_new_key(factory)  # ...then longer again, with other events
    result = dpss("audit", "verify", url=url)
    assert result.exit_code == 1
    assert "restore detected: event" in result.stderr and "differs from the anchor" in result.stderr


def test_anchor_lines_that_were_edited_or_cut_short(service, settings):
    url, factory, _ = service
    path = settings.resolved_audit_anchor_path
    anchor = _writer(factory, settings, audit_hmac_key=SecretStr(HMAC_KEY)).write_once()
    assert anchor is not None
    forged = Anchor.of(Head(anchor.seq, anchor.hash), b"x" * 32)
    with open(path, "a") as handle:
        handle.write(forged.to_json() + "\n" + '{"seq": 1, "hash"')  # a forged, a torn line
    result = dpss("audit", "verify", url=url, DPSS_AUDIT_HMAC_KEY=HMAC_KEY)
    assert result.exit_code == 1
    assert "line 2: the MAC does not match" in result.stderr
    assert "the last line is incomplete" in result.stdout
    with open(path, "a") as handle:
        handle.write("\nnot json\n")
    damaged = dpss("audit", "verify", url=url)
    assert damaged.exit_code == 1 and "line 3 is not an anchor" in damaged.stderr


def test_no_anchor_file_is_a_note_saying_where_it_looked(service, settings):
    url, _, _ = service
    result = dpss("audit", "verify", url=url)
    assert result.exit_code == 0
    assert f"no anchor file at {settings.resolved_audit_anchor_path}" in result.stdout
    assert f"the data directory {settings.data_dir.resolve()}" in result.stdout
    assert dpss("audit", "verify", "--anchors", "/nonexistent/a.jsonl", url=url).exit_code == 2


def test_a_missing_or_short_dataset_file_fails_verify(service, ledger, store):
    url, _, _ = service
    (name,) = store.stored_files()
    path = store.path_of(name)
    with open(path, "r+b") as handle:
        handle.truncate(path.stat().st_size - 8)
    short = dpss("audit", "verify", url=url)
    assert short.exit_code == 1 and f"its file {name} holds fewer rows" in short.stderr
    path.unlink()
    missing = dpss("audit", "verify", url=url)
    assert missing.exit_code == 1
    assert f"dataset {ledger.dataset}: its file {name} is missing" in missing.stderr


def test_an_orphaned_raw_file_fails_verify_once_it_is_not_an_upload_in_flight(service, store):
    url, _, _ = service
    orphan = store.path_of("0123456789abcdef0123456789abcdef.npy")
    orphan.write_bytes(b"raw rows nobody can delete")
    fresh = dpss("audit", "verify", url=url)
    assert fresh.exit_code == 0 and "named by no dataset yet" in fresh.stdout
    old = time.time() - ORPHAN_GRACE_SECONDS - 1
    os.utime(orphan, (old, old))
    result = dpss("audit", "verify", url=url)
    assert result.exit_code == 1 and f"orphaned file {orphan.name}" in result.stderr


def test_the_wrong_data_directory_is_one_problem_naming_the_setting(service, tmp_path: Path):
    url, _, _ = service
    result = dpss("audit", "verify", url=url, DPSS_DATA_DIR=str(tmp_path / "elsewhere"))
    assert result.exit_code == 1
    assert "DPSS_DATA_DIR is not the service's data directory" in result.stderr
    assert result.stderr.count("FAIL") == 1


def test_revoking_a_key_from_the_cli_anchors_the_head_at_once(service, settings):
    url, factory, _ = service
    with factory.begin() as session:
        key, _ = auth.create_key(session, "analyst", "leaver", actor_key_id=None)
    revoked = dpss("keys", "revoke", str(key.id), url=url)
    assert revoked.exit_code == 0, revoked.output
    (anchor,) = read(settings.resolved_audit_anchor_path, None).anchors
    head = dpss("audit", "head", url=url).stdout.strip()
    assert anchor.head.token() == head  # the revocation's event is anchored


def test_a_plain_anchor_turned_into_an_acceptance_fails_its_mac(service, settings):
    """The acceptance flag is under the line's MAC (its own label): a worker's anchor edited to
    read as an acceptance is a forged line, and it accepts nothing."""
    _, factory, _ = service
    path = settings.resolved_audit_anchor_path
    anchor = _writer(factory, settings, audit_hmac_key=SecretStr(HMAC_KEY)).write_once()
    assert anchor is not None
    flipped = Anchor(anchor.time, anchor.seq, anchor.hash, anchor.mac, accepts=True)
    path.write_text(flipped.to_json() + "\n")
    read_back = read(path, HMAC_KEY.encode())
    assert read_back.anchors == []
    assert read_back.problems == [
        f"{path}: line 1: the MAC does not match (forged, or another key)"
    ]
    honest = Anchor.of(Head(anchor.seq, anchor.hash), HMAC_KEY.encode(), accepts=True)
    path.write_text(honest.to_json() + "\n")
    assert [a.accepts for a in read(path, HMAC_KEY.encode()).anchors] == [True]
