"""The ``dpss`` command: run the service (serve, api, worker, migrate) and operate it.

Remote commands for owners and analysts (datasets, releases, budget, ...) are registered from
``service.remote_cli``; they talk HTTP and need no database access.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
from typing import TYPE_CHECKING, Annotated

import typer

from service.config import Settings

if TYPE_CHECKING:
    from fastapi import FastAPI

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


def _configure_logging(settings: Settings) -> None:
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )


@app.command()
def migrate() -> None:
    """Bring the database (DPSS_DATABASE_URL) to the newest schema."""
    from service.migrate import upgrade_to_head

    settings = Settings()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    upgrade_to_head(settings.resolved_database_url)
    typer.echo("database is at the newest schema")


def api_app() -> FastAPI:
    """The API for ``uvicorn --factory``: each API process builds its own app (and its own
    engine and pool) from the environment."""
    from service.app import create_app

    settings = Settings()
    _configure_logging(settings)
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

    settings = Settings()
    _configure_logging(settings)
    if settings.admin_api_key is not None:
        # Once here, before the API processes start: N processes bootstrapping the same key at
        # once would race on its unique hash (each then finds it and does nothing).
        from service import auth
        from service.db.engine import make_engine, make_session_factory

        engine = make_engine(settings.resolved_database_url)
        with make_session_factory(engine).begin() as session:
            auth.ensure_admin_key(session, settings.admin_api_key.get_secret_value())
        engine.dispose()
    uvicorn.run(
        f"{__name__}:api_app",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        log_level=settings.log_level.lower(),
    )


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
    from service.db.engine import make_engine, make_session_factory
    from service.store import DatasetStore
    from service.worker import Worker

    settings = Settings()
    _configure_logging(settings)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    if parent_pid is not None:
        threading.Thread(target=_watch_parent, args=(parent_pid, stop), daemon=True).start()
    session_factory = make_session_factory(make_engine(settings.resolved_database_url))
    store = DatasetStore(settings.datasets_dir)
    store.ensure()
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
    or SIGINT stops the API, then the worker (it finishes the job in hand, up to
    ``WORKER_STOP_SECONDS``), then this process.
    """
    import uvicorn

    from service.app import create_app
    from service.migrate import upgrade_to_head

    settings = Settings()
    _configure_logging(settings)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    upgrade_to_head(settings.resolved_database_url)
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
            uvicorn.run(
                create_app(settings), host=host, port=port, log_level=settings.log_level.lower()
            )
    finally:
        stop.set()
        supervisor.join(timeout=WORKER_STOP_SECONDS + 5)
    if received:
        # End as the signal would have ended the process, now that nothing is left behind.
        signal.signal(received[0], signal.SIG_DFL)
        signal.raise_signal(received[0])


@keys_app.command("create")
def keys_create(
    role: Annotated[str, typer.Option(help="admin, owner, analyst or auditor.")],
    name: Annotated[str, typer.Option(help="A label for the key's holder.")] = "cli",
) -> None:
    """Create an API key directly in the database and print its secret (shown once)."""
    from service import auth
    from service.db.engine import make_engine, make_session_factory

    if role not in auth.ROLES:
        typer.echo(f"error: role must be one of {', '.join(auth.ROLES)}", err=True)
        raise typer.Exit(2)
    settings = Settings()
    factory = make_session_factory(make_engine(settings.resolved_database_url))
    with factory.begin() as session:
        key, secret = auth.create_key(session, role, name, actor_key_id=None)
    typer.echo(f"id:   {key.id}\nrole: {role}\nkey:  {secret}")


@audit_app.command("verify")
def audit_verify() -> None:
    """Recompute the audit log's hash chain; exit 1 if any event was altered or removed."""
    from service import audit
    from service.db.engine import make_engine, make_session_factory

    settings = Settings()
    factory = make_session_factory(make_engine(settings.resolved_database_url))
    with factory() as session:
        report = audit.verify(session)
    for problem in report.problems:
        typer.echo(f"FAIL {problem}", err=True)
    if not report.ok:
        typer.echo(f"audit chain BROKEN ({report.checked} events read)", err=True)
        raise typer.Exit(1)
    typer.echo(f"audit chain OK ({report.checked} events)")


def _register_remote_commands() -> None:
    try:
        from service.remote_cli import register_remote_commands
    except ImportError:
        return
    register_remote_commands(app, audit_app)


_register_remote_commands()


def main() -> None:
    app()
