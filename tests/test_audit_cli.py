"""``dpss audit verify`` and ``dpss audit head`` against real commits: exit 0 intact, 1 tampered,
2 cannot check (with the URL it tried, no password, no traceback); the exported head catches a
removed tail and a restore from an older backup (a real SQLite backup or pg_dump/pg_restore)."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.script import ScriptDirectory
from click.testing import Result
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy import make_url, select
from sqlalchemy.orm import Session, sessionmaker
from typer.testing import CliRunner

from service import audit
from service.app import create_app
from service.cli import DATABASE_HINT
from service.cli import app as cli_app
from service.db.models import AuditEvent
from service.migrate import alembic_config
from service.worker import Worker
from tests.conftest import POSTGRES_URL, _admin_execute, post_release
from tests.test_audit_money import HMAC_KEY, Ledger, _drop_last_release, _raise_budget, populate


def dpss(*args: str, url: str, **env: str) -> Result:
    # Empty means unset (as compose passes `${VAR:-}`); it also hides the caller's environment.
    environment = {"DPSS_DATABASE_URL": url, "DPSS_AUDIT_ANCHOR": "", "DPSS_AUDIT_HMAC_KEY": ""}
    environment.update(env)
    result = CliRunner().invoke(cli_app, list(args), env=environment)
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


@pytest.fixture
def service(
    committed_db, settings, store, monkeypatch
) -> Iterator[tuple[str, sessionmaker[Session], Any]]:
    url, factory = committed_db
    # `dpss audit verify` checks this data directory's files (and anchors) too.
    monkeypatch.setenv("DPSS_DATA_DIR", str(settings.data_dir))

    def run_worker() -> int:
        return Worker(factory, store, settings, worker_id="cli-test").run_pending()

    with TestClient(create_app(settings, session_factory=factory)) as client:
        yield url, factory, (client, run_worker)


@pytest.fixture
def ledger(service, upload_dataset, monkeypatch) -> Ledger:
    _, factory, (client, run_worker) = service
    return populate(client, factory, upload_dataset, run_worker, monkeypatch)


def test_an_intact_database_verifies_and_prints_its_head(service, ledger):
    url, factory, _ = service
    verified = dpss("audit", "verify", url=url)
    assert verified.exit_code == 0, verified.output
    with factory() as session:
        last = session.scalars(select(AuditEvent).order_by(AuditEvent.seq.desc())).first()
    assert last is not None
    token = f"{last.seq}:{last.hash}"
    assert f"audit chain OK ({last.seq} events)" in verified.stdout
    head = dpss("audit", "head", url=url)
    assert head.exit_code == 0 and head.stdout == token + "\n"
    assert dpss("audit", "verify", "--head", token, url=url).exit_code == 0
    assert dpss("audit", "verify", url=url, DPSS_AUDIT_ANCHOR=token).exit_code == 0


def test_a_removed_tail_fails_against_the_exported_head(service, ledger):
    url, factory, _ = service
    token = dpss("audit", "head", url=url).stdout.strip()
    with factory.begin() as session:
        _drop_last_release(session, ledger)
    assert dpss("audit", "verify", url=url).exit_code == 0  # consistent without the anchor
    for result in (
        dpss("audit", "verify", "--head", token, url=url),
        dpss("audit", "verify", url=url, DPSS_AUDIT_ANCHOR=token),
    ):
        assert result.exit_code == 1
        assert "but the anchor names event" in result.stderr and "BROKEN" in result.stderr
    refused = dpss("audit", "head", url=url, DPSS_AUDIT_ANCHOR=token)
    assert refused.exit_code == 1 and refused.stdout == ""


def test_edited_money_exits_1_naming_the_table(service, ledger):
    url, factory, _ = service
    with factory.begin() as session:
        _raise_budget(session, ledger)
    result = dpss("audit", "verify", url=url)
    assert result.exit_code == 1
    assert f"FAIL datasets {ledger.dataset}: epsilon_total differs" in result.stderr


def test_the_hmac_key_is_used_by_the_service_and_checked_by_verify(
    committed_db, settings, store, upload_dataset, monkeypatch
):
    url, factory = committed_db
    monkeypatch.setenv("DPSS_DATA_DIR", str(settings.data_dir))
    keyed = settings.model_copy(update={"audit_hmac_key": SecretStr(HMAC_KEY)})
    with TestClient(create_app(keyed, session_factory=factory)) as client:
        populate(
            client,
            factory,
            upload_dataset,
            lambda: Worker(factory, store, keyed, worker_id="w").run_pending(),
            monkeypatch,
        )
    cli_key = dpss("keys", "create", "--role", "auditor", url=url, DPSS_AUDIT_HMAC_KEY=HMAC_KEY)
    assert cli_key.exit_code == 0
    with factory() as session:
        assert None not in session.scalars(select(AuditEvent.mac)).all()
    assert dpss("audit", "verify", url=url, DPSS_AUDIT_HMAC_KEY=HMAC_KEY).exit_code == 0
    wrong = dpss("audit", "verify", url=url, DPSS_AUDIT_HMAC_KEY="w" * 32)
    assert wrong.exit_code == 1 and "the MAC does not match" in wrong.stderr
    unkeyed = dpss("audit", "verify", url=url)
    assert unkeyed.exit_code == 0 and "MACs not checked" in unkeyed.stdout


def _backup(url: str, target: Path) -> str:
    """A real backup of the database at ``url``; returns a URL at which it is restored."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        copy = target / "backup.sqlite3"
        with sqlite3.connect(parsed.database or "") as source, sqlite3.connect(copy) as dest:
            source.backup(dest)
        return f"sqlite:///{copy}"
    dump = target / "backup.dump"
    libpq = parsed.set(drivername="postgresql").render_as_string(hide_password=False)
    subprocess.run(["pg_dump", "-Fc", "-f", str(dump), libpq], check=True, timeout=120)
    name = f"{parsed.database}_restored"
    _admin_execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    _admin_execute(f'CREATE DATABASE "{name}"')
    restored = parsed.set(database=name)
    subprocess.run(
        [
            "pg_restore",
            "--no-owner",
            "-d",
            restored.set(drivername="postgresql").render_as_string(hide_password=False),
            str(dump),
        ],
        check=True,
        timeout=120,
    )
    return restored.render_as_string(hide_password=False)


@pytest.mark.skipif(shutil.which("pg_dump") is None, reason="pg_dump is not installed")
def test_restoring_an_older_backup_fails_against_a_newer_head(service, ledger, tmp_path):
    url, _, (client, run_worker) = service
    at_backup = dpss("audit", "head", url=url).stdout.strip()
    restored = _backup(url, tmp_path)
    try:
        post_release(
            client,
            ledger.analyst,
            ledger.dataset,
            mechanism="analyze_gauss",
            k=1,
            epsilon="1",
            delta="1e-6",
        )
        run_worker()
        newer = dpss("audit", "head", url=url).stdout.strip()
        assert newer != at_backup
        # The restored database is self-consistent and matches the head taken at backup time...
        assert dpss("audit", "verify", "--head", at_backup, url=restored).exit_code == 0
        # ...but not the newer one: restoring it would hand back the budget spent since.
        result = dpss("audit", "verify", "--head", newer, url=restored)
        assert result.exit_code == 1
        assert "restored from a backup older than the anchor" in result.stderr
    finally:
        if not restored.startswith("sqlite"):
            _admin_execute(f'DROP DATABASE IF EXISTS "{make_url(restored).database}" WITH (FORCE)')


def test_a_missing_sqlite_file_exits_2_and_is_not_created(tmp_path):
    path = tmp_path / "nowhere.sqlite3"
    result = dpss("audit", "verify", url=f"sqlite:///{path}")
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        f"error: cannot read the database at sqlite:///{path}: "
        f"the SQLite database file does not exist; {DATABASE_HINT}"
    )
    assert not path.exists()


def test_verify_from_the_wrong_directory_says_where_it_looked(tmp_path, monkeypatch):
    """No DPSS_DATABASE_URL, run outside the service's directory: the error names the data
    directory it looked in and how to point it elsewhere."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DPSS_DATA_DIR", raising=False)
    result = CliRunner().invoke(
        cli_app, ["audit", "verify"], env={"DPSS_DATABASE_URL": "", "DPSS_DATA_DIR": None}
    )
    assert result.exit_code == 2
    assert "DPSS_DATA_DIR" in result.stderr
    assert f"(now {tmp_path.resolve() / 'dpss-data'})" in result.stderr


def test_an_unmigrated_sqlite_file_exits_2(tmp_path):
    path = tmp_path / "empty.sqlite3"
    sqlite3.connect(path).execute("CREATE TABLE unrelated (x INTEGER)").connection.close()
    result = dpss("audit", "head", url=f"sqlite:///{path}")
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.startswith(
        f"error: cannot read the database at sqlite:///{path}: no table api_keys, audit_events, "
    )
    assert result.stderr.endswith(" (run `dpss migrate`)\n")


def test_an_unreachable_postgresql_exits_2_without_the_password():
    result = dpss("audit", "verify", url="postgresql+psycopg://dpss:sekret@127.0.0.1:1/dpss")
    assert result.exit_code == 2
    assert "cannot read the database at postgresql+psycopg://dpss:***@127.0.0.1:1/dpss" in (
        result.stderr
    )
    assert "sekret" not in result.output and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.skipif(os.environ.get("DPSS_TEST_SKIP_POSTGRES") == "1", reason="no PostgreSQL")
def test_an_unmigrated_postgresql_database_exits_2():
    name = f"dpss_test_{os.getpid()}_empty"
    _admin_execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    _admin_execute(f'CREATE DATABASE "{name}"')
    try:
        url = make_url(POSTGRES_URL).set(database=name).render_as_string(hide_password=False)
        result = dpss("audit", "verify", url=url)
        assert result.exit_code == 2
        assert "no table api_keys" in result.stderr and name in result.stderr
    finally:
        _admin_execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--head", "12:abc"], {}, "--head / DPSS_AUDIT_ANCHOR: an audit head is SEQ:HASH"),
        ([], {"DPSS_AUDIT_ANCHOR": "latest"}, "an audit head is SEQ:HASH"),
        ([], {"DPSS_AUDIT_HMAC_KEY": "short"}, "invalid setting DPSS_AUDIT_HMAC_KEY"),
        ([], {"DPSS_DATABASE_URL": "not a url"}, "DPSS_DATABASE_URL (not a valid SQLAlchemy URL)"),
    ],
)
def test_a_check_that_cannot_be_made_exits_2(args, env, message, tmp_path):
    url = env.pop("DPSS_DATABASE_URL", f"sqlite:///{tmp_path / 'x.sqlite3'}")
    result = dpss("audit", "verify", *args, url=url, **env)
    assert result.exit_code == 2 and message in result.stderr


def test_verify_reads_one_snapshot_while_the_service_writes(service, ledger, monkeypatch):
    """A release committed between reading the events and reading the tables is not seen (it
    would otherwise be a release without its event), and the writer is not blocked."""
    url, _, (client, _) = service
    reconcile = audit._reconcile
    written: list[str] = []

    def write_then_reconcile(*args: Any) -> None:
        gauss = {"mechanism": "analyze_gauss", "k": 1, "epsilon": "0.25", "delta": "1e-6"}
        written.append(post_release(client, ledger.analyst, ledger.dataset, **gauss))
        reconcile(*args)

    monkeypatch.setattr(audit, "_reconcile", write_then_reconcile)
    result = dpss("audit", "verify", url=url)
    assert written and result.exit_code == 0, result.output
    monkeypatch.setattr(audit, "_reconcile", reconcile)
    assert dpss("audit", "verify", url=url).exit_code == 0


def test_a_database_at_an_older_schema_exits_2(tmp_path):
    path = tmp_path / "old.sqlite3"
    url = f"sqlite:///{path}"
    command.upgrade(alembic_config(url), "0002")
    result = dpss("audit", "verify", url=url)
    assert result.exit_code == 2
    assert result.stderr == (
        f"error: cannot read the database at {url}: the schema is at revision 0002, this "
        f"version reads {ScriptDirectory.from_config(alembic_config()).get_current_head()} "
        "(run `dpss migrate`)\n"
    )
