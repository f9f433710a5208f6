"""The ``dpss`` command: run the service (serve, api, worker, migrate) and operate it.

Remote commands for owners and analysts (datasets, releases, budget, ...) are registered from
``dpss_client.remote_cli`` (the slim ``dpss-client`` distribution, whose ``dpss-remote`` command
is the same commands without the server); they talk HTTP and need no database access.
"""

from __future__ import annotations

import json
import logging
import logging.config
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from dpss_client.remote_cli import register_remote_commands
from service.cli_database import (
    DATABASE_HINT,
    bootstrap_admin_or_exit,
    engine_or_exit,
    migrate_or_exit,
    worker_engine_or_exit,
)
from service.cli_database import cannot_check as _cannot_check
from service.cli_database import database_failure as _database_failure
from service.cli_database import driver_reason as _driver_reason
from service.cli_database import shown_url as _shown_url

if TYPE_CHECKING:
    from fastapi import FastAPI
    from sqlalchemy import Engine
    from sqlalchemy.orm import Session, sessionmaker

    from service import audit as audit_module
    from service.config import Settings

app = typer.Typer(
    help="dp-subspace-service: differentially private subspaces of sensitive data.",
    no_args_is_help=True,
)
keys_app = typer.Typer(
    help="API keys (operator commands, direct database access).", no_args_is_help=True
)
audit_app = typer.Typer(help="The audit log.", no_args_is_help=True)
app.add_typer(keys_app, name="keys")
app.add_typer(audit_app, name="audit")

HostOption = Annotated[str, typer.Option(help="Interface to listen on.")]
PortOption = Annotated[int, typer.Option(help="Port to listen on.")]


def _check_port(host: str, port: int) -> None:
    """Refuse to start, in one line (exit 2), when ``host:port`` cannot be listened on: in use
    (another ``dpss serve`` or program), a privileged port, or an address not of this host.
    Checked before anything starts (migrations, the worker): uvicorn would otherwise print only
    its own log line. The probe binds as uvicorn does (``SO_REUSEADDR``), so a port left in
    TIME_WAIT by a stopped server is free here as there."""
    import errno
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        _cannot_start(f"cannot listen on {host}: not a known host name or address ({exc})", 2)
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
            probe.listen(1)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                _cannot_start(
                    f"port {port} on {host} is already in use (another dpss serve or another "
                    f"program): stop it, or choose another port with --port, e.g. --port "
                    f"{port + 1 if port < 65535 else 8000}"
                )
            if exc.errno == errno.EACCES:
                _cannot_start(
                    f"not allowed to listen on port {port} (ports below 1024 need privileges): "
                    "choose another port with --port, e.g. --port 8000"
                )
            if exc.errno == errno.EADDRNOTAVAIL:
                _cannot_start(
                    f"cannot listen on {host}: not an address of this machine; use --host "
                    "127.0.0.1 (this machine only) or --host 0.0.0.0 (every interface)"
                )
            _cannot_start(f"cannot listen on {host}:{port}: {exc.strerror or exc}")


def _cannot_start(message: str, code: int = 1) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _configure_logging(settings: Settings) -> None:
    from service.logs import log_config, log_what_python_prints

    logging.config.dictConfig(log_config(settings.log_level))
    log_what_python_prints()


def _uvicorn_options(settings: Settings) -> dict[str, Any]:
    """JSON logs in every API process; no uvicorn access log (the service writes its own,
    with path templates) and no uvicorn ``server`` header (the service sets a version-free one).

    Idle connections stay open ``DPSS_API_KEEP_ALIVE_SECONDS``. Forwarding headers only from
    ``DPSS_TRUSTED_PROXIES``: uvicorn's default believes
    ``X-Forwarded-For`` from 127.0.0.1 (or ``$FORWARDED_ALLOW_IPS``), so any local client could
    name its own address and so its own rate-limit bucket."""
    from service.api.connections import (
        MAX_HEAD_BYTES,
        answer_with_retry_after,
        connection_limit,
        http_protocol,
    )
    from service.logs import log_config

    proxies = settings.trusted_proxy_list
    # In this process (one API process, `dpss serve`); api_app does it in each of several.
    answer_with_retry_after(settings)
    return {
        "log_config": log_config(settings.log_level),
        "log_level": settings.log_level.lower(),
        "access_log": False,
        "server_header": False,
        "proxy_headers": bool(proxies),
        "forwarded_allow_ips": proxies,
        # See Settings.api_keep_alive_seconds: the server must never be the side that closes
        # an idle connection just as a client reuses it.
        "timeout_keep_alive": settings.api_keep_alive_seconds,
        # Past its open files a process cannot even accept, and answers nobody: admit only
        # what the descriptors allow, answering the rest 503 (service.api.connections).
        "limit_concurrency": connection_limit(settings),
        # A request head (line and headers) over MAX_HEAD_BYTES is answered 431, not read; a
        # malformed one 400 in the service's JSON error format.
        "http": http_protocol(),
        "h11_max_incomplete_event_size": MAX_HEAD_BYTES,
    }


@app.command()
def migrate() -> None:
    """Bring the database (DPSS_DATABASE_URL) to the newest schema."""
    from service.config import Settings

    settings = Settings()
    _secure_data_dir(settings)
    migrate_or_exit(settings.resolved_database_url)
    typer.echo("database is at the newest schema")


def api_app() -> FastAPI:
    """The API for ``uvicorn --factory``: each API process builds its own app (and its own
    engine and pool) from the environment."""
    from service import tracing
    from service.api.connections import answer_with_retry_after
    from service.app import create_app
    from service.config import Settings

    settings = Settings()
    _configure_logging(settings)
    tracing.configure("dpss-api")
    answer_with_retry_after(settings)
    return create_app(settings)


@app.command()
def api(
    host: HostOption = "127.0.0.1",
    port: PortOption = 8000,
    workers: Annotated[
        int,
        typer.Option(
            min=1,
            help="API processes sharing the port; each has its own database pool.",
        ),
    ] = 1,
) -> None:
    """Run the HTTP API only (production: migrations and workers run separately)."""
    import uvicorn

    from service.config import Settings

    _check_port(host, port)
    settings = Settings()
    _configure_logging(settings)
    if workers > 1:
        _share_metrics_between(workers, settings)
    if settings.admin_api_key is not None:
        # Once here, before the API processes start: N processes bootstrapping the same key at
        # once would race on its unique hash (each then finds it and does nothing).
        bootstrap_admin_or_exit(settings)
    else:
        engine_or_exit(settings.resolved_database_url).dispose()
    uvicorn.run(
        f"{__name__}:api_app",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        **_uvicorn_options(settings),
    )


def _share_metrics_between(workers: int, settings: Settings) -> None:
    """Several API processes: each writes its request metrics to one directory and a scrape
    adds them up (prometheus-client's multiprocess mode), unless the operator chose the
    directory (``PROMETHEUS_MULTIPROC_DIR``). Emptied at start: old processes' files would
    count twice. Must be set before the processes import prometheus-client."""
    import shutil

    from service.metrics import MULTIPROCESS_VARIABLE

    if os.environ.get(MULTIPROCESS_VARIABLE):
        return
    directory = settings.data_dir / "metrics"
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(mode=0o700, parents=True)
    os.environ[MULTIPROCESS_VARIABLE] = str(directory)
    logging.getLogger("dpss").info("%d API processes share metrics in %s", workers, directory)


def _watch_parent(parent_pid: int, stop: threading.Event) -> None:
    """Stop when the process that started this one is gone (even if it was SIGKILLed and could
    not stop its children)."""
    while not stop.wait(1.0):
        if os.getppid() != parent_pid:
            logging.getLogger("dpss").warning("parent process gone; stopping")
            stop.set()


@app.command()
def worker(
    parent_pid: Annotated[
        int | None,
        typer.Option(hidden=True, help="Stop when this process (dpss serve) is gone."),
    ] = None,
) -> None:
    """Run a worker: claim queued releases from the database and compute them."""
    from service import audit, tracing
    from service.anchors import AnchorWriter
    from service.config import Settings
    from service.db.engine import make_session_factory
    from service.store import DatasetStore
    from service.worker import Worker

    settings = Settings()
    _configure_logging(settings)
    tracing.configure("dpss-worker")
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    if parent_pid is not None:
        threading.Thread(target=_watch_parent, args=(parent_pid, stop), daemon=True).start()
    session_factory = make_session_factory(worker_engine_or_exit(settings))
    audit.use_hmac_key(session_factory, settings.audit_hmac_key)
    _secure_data_dir(settings)
    store = DatasetStore(settings.datasets_dir)
    store.ensure()
    # The audit head, kept outside the database: a restore from an older backup shows.
    anchor_writer = AnchorWriter(session_factory, settings)
    threading.Thread(target=anchor_writer.run, args=(stop,), daemon=True).start()
    Worker(session_factory, store, settings, stop=stop, isolate=True).run_forever()


#: How long ``dpss serve`` waits for its worker to finish the job in hand after SIGTERM.
WORKER_STOP_SECONDS = 10


def _supervise_worker(stop: threading.Event) -> None:
    """Keep one worker process running next to the API; restart it if it dies."""
    command = [sys.executable, "-m", "service", "worker", "--parent-pid", str(os.getpid())]
    while not stop.is_set():
        process = subprocess.Popen(command)
        while process.poll() is None:
            if stop.wait(0.5):
                process.terminate()
                try:
                    process.wait(timeout=WORKER_STOP_SECONDS)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
                return
        logging.getLogger("dpss").warning("worker exited with %s; restarting", process.returncode)
        stop.wait(1)


@app.command()
def serve(host: HostOption = "127.0.0.1", port: PortOption = 8000) -> None:
    """Embedded default: migrate, then run the API and a worker in a separate process.

    With no configuration this uses SQLite and ./dpss-data: nothing else to install. SIGTERM
    or SIGINT stops the API, then the worker (it finishes the job in hand, up to 10 seconds),
    then this process.
    """
    # The help says 10 seconds: WORKER_STOP_SECONDS (--help is for users, not Sphinx).
    import uvicorn

    from service import tracing
    from service.app import create_app
    from service.config import Settings

    _check_port(host, port)
    settings = Settings()
    _configure_logging(settings)
    _secure_data_dir(settings)
    tracing.configure("dpss-api")
    migrate_or_exit(settings.resolved_database_url)
    # uvicorn handles SIGTERM/SIGINT itself, then restores the handlers it found and raises the
    # signal again. Finding these, the raised signal lands here instead of killing the process
    # before the worker is stopped.
    received: list[int] = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda signum, _frame: received.append(signum))
    stop = threading.Event()
    supervisor = threading.Thread(target=_supervise_worker, args=(stop,), daemon=True)
    supervisor.start()
    try:
        if not received:
            uvicorn.run(create_app(settings), host=host, port=port, **_uvicorn_options(settings))
    finally:
        stop.set()
        supervisor.join(timeout=WORKER_STOP_SECONDS + 5)
    if received:
        # End as the signal would have ended the process, now that nothing is left behind.
        signal.signal(received[0], signal.SIG_DFL)
        signal.raise_signal(received[0])


@contextmanager
def _local_database(*, must_exist: bool = True) -> Iterator[sessionmaker[Session]]:
    """A session factory on the configured database, or one line saying which URL was tried
    and how to set it (exit 2) instead of a traceback. ``must_exist``: an SQLite file that is
    not there is reported, not created empty."""
    from pydantic import ValidationError
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, SQLAlchemyError

    from service import audit
    from service.config import Settings
    from service.db.engine import make_engine, make_session_factory

    try:
        settings = Settings()
    except ValidationError as exc:
        names = sorted({f"DPSS_{str(error['loc'][0]).upper()}" for error in exc.errors()})
        _cannot_check(f"invalid setting {', '.join(names)}")
    url = settings.resolved_database_url
    try:
        parsed = make_url(url)
        if must_exist and parsed.get_backend_name() == "sqlite":
            database = parsed.database or ""
            if database not in ("", ":memory:") and not Path(database).is_file():
                _database_failure(url, "no such file (run `dpss migrate` to create it)")
        engine = make_engine(url)
    except (ArgumentError, ImportError, OSError) as exc:
        _database_failure(url, type(exc).__name__)
    try:
        factory = make_session_factory(engine)
        audit.use_hmac_key(factory, settings.audit_hmac_key)
        yield factory
    except SQLAlchemyError as exc:
        reason = _driver_reason(exc)
        if "no such table" in reason or "does not exist" in reason:
            reason += " (run `dpss migrate`)"
        _database_failure(url, reason)
    finally:
        engine.dispose()


@keys_app.command("create")
def keys_create(
    role: Annotated[str, typer.Option(help="admin, owner, analyst or auditor.")],
    name: Annotated[str, typer.Option(help="A label for the key's holder.")] = "cli",
) -> None:
    """Create an API key directly in the database and print its secret (shown once)."""
    from service import auth

    if role not in auth.ROLES:
        typer.echo(f"error: role must be one of {', '.join(auth.ROLES)}", err=True)
        raise typer.Exit(2)
    with _local_database() as factory, factory.begin() as session:
        key, secret = auth.create_key(session, role, name, actor_key_id=None)
        key_id = key.id
    typer.echo(f"id:   {key_id}\nrole: {role}\nkey:  {secret}")


@keys_app.command("list")
def keys_list(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """List every API key (never a secret), oldest first, revoked ones included."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    from api_schemas.keys import KeyInfo
    from service import auth

    with _local_database() as factory, factory() as session:
        keys = [KeyInfo.model_validate(key) for key in auth.list_keys(session)]
    if as_json:
        typer.echo(json.dumps({"items": [key.model_dump(mode="json") for key in keys]}, indent=2))
        return
    table = Table(title=f"{len(keys)} key(s)", title_justify="left", box=box.SIMPLE_HEAD)
    table.add_column("id", overflow="fold")
    table.add_column("role", overflow="fold")
    table.add_column("name", overflow="fold")
    table.add_column("created (UTC)", overflow="fold")
    table.add_column("revoked (UTC)", overflow="fold")
    for key in keys:
        table.add_row(
            str(key.id),
            key.role,
            key.name,
            key.created_at.strftime("%Y-%m-%d %H:%M:%S"),
            key.revoked_at.strftime("%Y-%m-%d %H:%M:%S") if key.revoked_at else "",
        )
    console = Console(file=sys.stdout, soft_wrap=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = 160
    console.print(table)


@keys_app.command("revoke")
def keys_revoke(
    key_id: Annotated[str, typer.Argument(help="The key's id (dpss keys list).")],
) -> None:
    """Revoke a key at once (recorded in the audit log); revoking it again changes nothing."""
    import uuid

    from service import auth
    from service.errors import NotFound

    try:
        parsed = uuid.UUID(key_id)
    except ValueError:
        typer.echo("error: KEY_ID must be a key id (a UUID, see `dpss keys list`)", err=True)
        raise typer.Exit(2) from None
    with _local_database() as factory:
        try:
            with factory.begin() as session:
                auth.revoke_key(session, parsed, actor_key_id=None)
        except NotFound:
            typer.echo(f"error: no API key {parsed}", err=True)
            raise typer.Exit(3) from None
        _anchor_now(factory)
    typer.echo(f"revoked {parsed}")


def _secure_data_dir(settings: Settings) -> None:
    from service.store import secure_data_dir

    try:
        secure_data_dir(settings.data_dir)
    except OSError as exc:
        _cannot_check(exc.strerror or str(exc))


def _anchor_now(factory: sessionmaker[Session]) -> None:
    """Anchor the audit head at once after a key event (a restore must not bring the key back
    unnoticed in the minute before the workers' next anchor); a failure is only a warning."""
    from service.anchors import AnchorWriter
    from service.config import Settings

    settings = Settings()
    if settings.audit_anchor_interval_seconds <= 0:
        return
    try:
        AnchorWriter(factory, settings).write_once()
    except OSError as exc:
        typer.echo(f"warning: audit head not anchored ({type(exc).__name__})", err=True)


def _reader_engine(url: str) -> Engine:
    """A read-only engine whose transactions see one snapshot (rows and events agree).

    SQLite: the file opened read-only (a missing file is not created) with a deferred ``BEGIN``,
    which in WAL mode reads one snapshot and never blocks the service's writers. PostgreSQL:
    ``REPEATABLE READ, READ ONLY``.
    """
    import sqlite3
    from urllib.request import pathname2url

    from sqlalchemy import create_engine, event
    from sqlalchemy.engine import make_url
    from sqlalchemy.pool import NullPool

    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        connect_args = {"connect_timeout": 10} if parsed.get_backend_name() == "postgresql" else {}
        return create_engine(
            url,
            isolation_level="REPEATABLE READ",
            execution_options={"postgresql_readonly": True},
            connect_args=connect_args,
            poolclass=NullPool,
        )
    path = Path(parsed.database or "")
    if not path.is_file():
        raise FileNotFoundError("the SQLite database file does not exist")
    uri = f"file:{pathname2url(str(path.resolve()))}?mode=ro"
    engine = create_engine(
        "sqlite://",
        creator=lambda: sqlite3.connect(uri, uri=True, timeout=60, check_same_thread=False),
        poolclass=NullPool,
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN")

    return engine


def _audit_report(head: str | None, anchors: Path | None = None) -> audit_module.VerifyReport:
    """Verify the configured database, its anchors and its data directory; exits 2 when the
    check cannot be made. Says first which database, data directory and anchor file it reads."""
    from alembic.migration import MigrationContext
    from alembic.script import ScriptDirectory
    from pydantic import ValidationError
    from sqlalchemy import inspect
    from sqlalchemy.exc import ArgumentError, SQLAlchemyError
    from sqlalchemy.orm import Session

    from service import anchors as anchors_module
    from service import audit, datadir
    from service.config import Settings
    from service.db.models import Base
    from service.migrate import alembic_config
    from service.store import DatasetStore

    try:
        settings = Settings()
    except ValidationError as exc:
        names = sorted({f"DPSS_{str(error['loc'][0]).upper()}" for error in exc.errors()})
        _cannot_check(f"invalid setting {', '.join(names)}")
    token = head if head is not None else settings.audit_anchor
    anchor = None
    if token:
        try:
            anchor = audit.Head.parse(token)
        except ValueError as exc:
            _cannot_check(f"--head / DPSS_AUDIT_ANCHOR: {exc}")
    key = settings.audit_hmac_key
    key_bytes = key.get_secret_value().encode("utf-8") if key is not None else None
    url = settings.resolved_database_url
    anchor_path = anchors or settings.resolved_audit_anchor_path
    where = f"cannot read the database at {_shown_url(url)}"
    try:
        engine = _reader_engine(url)
    except (ArgumentError, ImportError) as exc:
        _cannot_check(f"{where}: {type(exc).__name__}")
    except FileNotFoundError as exc:
        looked = "" if settings.database_url else f" (now {settings.data_dir.resolve()})"
        _cannot_check(f"{where}: {exc}; {DATABASE_HINT}{looked}")
    anchor_file = None
    if anchor_path.is_file():
        try:
            anchor_file = anchors_module.read(anchor_path, key_bytes)
        except OSError as exc:
            _cannot_check(f"cannot read the anchor file {anchor_path}: {type(exc).__name__}")
    elif anchors is not None:
        _cannot_check(f"no anchor file at {anchors}")
    legacy = settings.legacy_audit_anchor_path
    if (
        anchors is None
        and settings.audit_anchor_path is None
        and legacy.is_file()
        and legacy.resolve() != anchor_path.resolve()
    ):
        # Anchors an earlier version wrote into the data directory: their history still counts.
        try:
            older = anchors_module.read(legacy, key_bytes)
        except OSError as exc:
            _cannot_check(f"cannot read the anchor file {legacy}: {type(exc).__name__}")
        if anchor_file is None:
            anchor_file = older
        else:
            anchor_file.anchors += older.anchors
            anchor_file.problems += older.problems
            anchor_file.notes += older.notes
    try:
        with Session(engine) as session, session.begin():
            inspector = inspect(session.connection())
            missing = sorted(n for n in Base.metadata.tables if not inspector.has_table(n))
            current = MigrationContext.configure(session.connection()).get_current_revision()
            newest = ScriptDirectory.from_config(alembic_config()).get_current_head()
            # An older revision says more than the tables a later migration adds.
            if missing and current in (None, newest):
                _cannot_check(f"{where}: no table {', '.join(missing)} (run `dpss migrate`)")
            if current != newest:
                _cannot_check(
                    f"{where}: the schema is at revision {current}, this version reads "
                    f"{newest} (run `dpss migrate`)"
                )
            report = audit.verify(session, anchor=anchor, hmac_key=key_bytes)
            if anchor_file is None:
                report.notes.append(
                    f"no anchor file at {anchor_path}: a restore from an older backup goes "
                    "unseen (the workers write it every DPSS_AUDIT_ANCHOR_INTERVAL_SECONDS; "
                    "point DPSS_AUDIT_ANCHOR_PATH or --anchors at it)"
                )
            else:
                report.problems.extend(anchor_file.problems)
                report.notes.extend(anchor_file.notes)
                problems, notes = anchors_module.check(session, anchor_file.anchors, report.head)
                report.problems.extend(problems)
                report.notes.extend(notes)
                if not anchor_file.anchors and report.checked:
                    # Emptied (or never written to): as unseen as a missing file.
                    report.notes.append(
                        f"the anchor file {anchor_path} holds no anchor: a restore from an "
                        "older backup goes unseen"
                    )
            problems, notes = datadir.check(session, DatasetStore(settings.datasets_dir))
            report.problems.extend(problems)
            report.notes.extend(notes)
            report.notes.insert(
                0,
                f"read the database {_shown_url(url)}, the data directory "
                f"{settings.data_dir.resolve()} and the anchor file {anchor_path.resolve()} "
                "(elsewhere: DPSS_DATABASE_URL, DPSS_DATA_DIR, DPSS_AUDIT_ANCHOR_PATH)",
            )
            return report
    except SQLAlchemyError as exc:
        _cannot_check(f"{where}: {_driver_reason(exc)}")
    finally:
        engine.dispose()


HeadOption = Annotated[
    str | None,
    typer.Option(
        "--head",
        help="A head printed earlier by `dpss audit head` (default: DPSS_AUDIT_ANCHOR).",
        show_default=False,
    ),
]


AnchorsOption = Annotated[
    Path | None,
    typer.Option(
        "--anchors",
        dir_okay=False,
        help="The anchor file the workers append to (default: DPSS_AUDIT_ANCHOR_PATH, else "
        "<data dir>-state/audit-anchors.jsonl).",
        show_default=False,
    ),
]


@audit_app.command("verify")
def audit_verify(head: HeadOption = None, anchors: AnchorsOption = None) -> None:
    """Check the audit chain against its anchors, reconcile the ledger, budgets, releases and
    keys with it, and check the data directory's files against the datasets.

    Exit 0: intact. Exit 1: altered, removed, restored from an older backup, or missing (each
    problem is printed, naming a table, event, anchor or file and an id). Exit 2: the check
    could not be made (database unreadable, wrong URL or data directory, missing tables,
    another schema version, malformed --head or setting). The first lines (stderr) say which
    database, data directory and anchor file were read.
    """
    report = _audit_report(head, anchors)
    for note in report.notes:
        typer.echo(f"note: {note}")
    for problem in report.problems:
        typer.echo(f"FAIL {problem}", err=True)
    if not report.ok:
        typer.echo(
            f"audit chain BROKEN ({report.checked} events read, {len(report.problems)} problems)",
            err=True,
        )
        raise typer.Exit(1)
    typer.echo(f"audit chain OK ({report.checked} events)")
    typer.echo(f"head {report.head.token()}")


@audit_app.command("head")
def audit_head(head: HeadOption = None, anchors: AnchorsOption = None) -> None:
    """Verify, then print the chain's head (SEQ:HASH) alone on stdout, to keep outside the database.

    Later, `dpss audit verify --head SEQ:HASH` fails if the chain no longer contains it. Nothing
    is printed when the verification fails (exit 1) or cannot be made (exit 2).
    """
    report = _audit_report(head, anchors)
    for problem in report.problems:
        typer.echo(f"FAIL {problem}", err=True)
    if not report.ok:
        typer.echo("audit chain BROKEN: no head printed", err=True)
        raise typer.Exit(1)
    typer.echo(report.head.token())


@audit_app.command("accept-restore")
def audit_accept_restore() -> None:
    """Accept that the database was restored from an older backup, and serve again.

    After a restore the audit anchors show the database is behind them: revoked keys may be
    live again and spent budget back. The API then refuses charges and key use (503
    restore_unaccepted) until an admin, having looked (`dpss audit verify`), runs this. It
    records the acceptance in the audit log (`restore_accepted`) and appends an acceptance line
    to the anchor file; anchors written until then describe the history given up and are not
    checked any more. Run it where the anchor file is (DPSS_AUDIT_ANCHOR_PATH): only that line
    makes the acceptance count. Exit 0 also when there was nothing to accept; exit 2 when the
    anchor file cannot be written.
    """
    from service import anchors
    from service.config import Settings
    from service.db.models import RestoreHold

    settings = Settings()
    secret = settings.audit_hmac_key
    key = secret.get_secret_value().encode("utf-8") if secret is not None else None
    with _local_database() as factory:
        try:
            found = anchors.restore_problem(factory, settings, key)
        except OSError as exc:
            _cannot_check(f"cannot read the anchor files: {type(exc).__name__}")
        with factory.begin() as session:
            if session.get(RestoreHold, 1) is None and found is None:
                typer.echo("no restore detected: nothing to accept")
                return
            accepted = anchors.accept_restore(session) or found
        # The anchor file's witness: without it the acceptance counts for nothing (a
        # restore_accepted event alone could be anyone's who can write the database).
        writer = anchors.AnchorWriter(factory, settings)
        try:
            writer.write_acceptance()
        except OSError as exc:
            _cannot_check(
                f"the acceptance is in the audit log but not in the anchor file {writer.path} "
                f"({type(exc).__name__}), so it does not count yet: make the file writable and "
                "run `dpss audit accept-restore` again"
            )
    typer.echo(f"restore accepted (recorded in the audit log and {writer.path}): {accepted}")


# The remote commands come from the slim client package (a dependency of the server), so that
# `dpss datasets ...` here and `dpss-remote datasets ...` on an analyst's laptop are one code.
register_remote_commands(app, audit_app)


def main() -> None:
    app()
