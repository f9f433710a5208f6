"""The ``dpss`` command: run the service (serve, api, worker, migrate) and operate it.

Remote commands for owners and analysts (datasets, releases, budget, ...) are registered from
``service.remote_cli``; they talk HTTP and need no database access.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import threading
import time
from typing import Annotated

import typer

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
    settings.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    upgrade_to_head(settings.resolved_database_url)
    typer.echo("database is at the newest schema")


@app.command()
def api(host: HostOption = "127.0.0.1", port: PortOption = 8000) -> None:
    """Run the HTTP API only (production: migrations and workers run separately)."""
    import uvicorn

    from service.app import create_app

    settings = Settings()
    _configure_logging(settings)
    uvicorn.run(create_app(settings), host=host, port=port, log_level=settings.log_level.lower())


@app.command()
def worker() -> None:
    """Run a worker: claim queued releases from the database and compute them."""
    from service.db.engine import make_engine, make_session_factory
    from service.store import DatasetStore
    from service.worker import Worker

    settings = Settings()
    _configure_logging(settings)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    session_factory = make_session_factory(make_engine(settings.resolved_database_url))
    store = DatasetStore(settings.datasets_dir)
    store.ensure()
    Worker(session_factory, store, settings).run_forever(stop)


def _supervise_worker(stop: threading.Event) -> None:
    """Keep one worker process running next to the API; restart it if it dies."""
    while not stop.is_set():
        process = subprocess.Popen([sys.executable, "-m", "service", "worker"])
        while process.poll() is None:
            if stop.wait(0.5):
                process.terminate()
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
                return
        logging.getLogger("dpss").warning("worker exited with %s; restarting", process.returncode)
        time.sleep(1)


@app.command()
def serve(host: HostOption = "127.0.0.1", port: PortOption = 8000) -> None:
    """Embedded default: migrate, then run the API and a worker in a separate process.

    With no configuration this uses SQLite and ./dpss-data: nothing else to install.
    """
    import uvicorn

    from service.app import create_app
    from service.migrate import upgrade_to_head

    settings = Settings()
    _configure_logging(settings)
    settings.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    upgrade_to_head(settings.resolved_database_url)
    stop = threading.Event()
    supervisor = threading.Thread(target=_supervise_worker, args=(stop,), daemon=True)
    supervisor.start()
    try:
        uvicorn.run(
            create_app(settings), host=host, port=port, log_level=settings.log_level.lower()
        )
    finally:
        stop.set()
        supervisor.join(timeout=15)


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
