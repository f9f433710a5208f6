"""The remote commands of ``dpss``: talk to a running service through :mod:`dpss_client.client`.

On a server install, ``service.cli`` calls :func:`register_remote_commands` to add ``datasets``,
``budget``, ``grants``, ``releases``, ``mechanisms`` and ``audit list`` to ``dpss``; with the slim
``dpss-client`` package alone, the same commands are the ``dpss-remote`` command
(:func:`make_app`). Like the client, this module imports nothing from the server, so it runs on
an analyst's laptop. The commands are in ``cli_datasets``, ``cli_grants``, ``cli_releases`` and
``cli_priors_audit``; this module assembles them.

Every command takes ``--url`` (``DPSS_URL``, default ``http://127.0.0.1:8000``) and
``--api-key`` (``DPSS_API_KEY``), prints tables by default and JSON with ``--json``, and exits
with one of the :class:`ExitCode` values (documented in docs/cli.md).
"""

from __future__ import annotations

import os
from typing import Annotated

import typer

# Each resource's commands are in their own module (cli_datasets, cli_grants, cli_releases,
# cli_priors_audit), sharing cli_common (options, client, errors) and cli_format (tables); this
# module assembles them. Like them it imports only typer and rich at start, so that `dpss --help`
# and `dpss <command> --help` start without the rest (bench/bench_cli_startup.py).
from dpss_client.cli_common import ExitCode as ExitCode
from dpss_client.cli_common import _positive_seconds
from dpss_client.cli_common import _service_errors as _service_errors
from dpss_client.cli_common import make_http_client as make_http_client
from dpss_client.cli_datasets import budget, datasets_app
from dpss_client.cli_format import _budget_table as _budget_table
from dpss_client.cli_format import _figure as _figure
from dpss_client.cli_grants import grants_app
from dpss_client.cli_priors_audit import audit_list, mechanisms, priors_app
from dpss_client.cli_releases import parse_params as parse_params
from dpss_client.cli_releases import releases_app

# --------------------------------------------------------------------------------------------
# Registration


def _global_options(
    ctx: typer.Context,
    url: Annotated[
        str | None,
        typer.Option(
            "--url",
            help="Service base URL for the remote command that follows (as its own --url).",
            show_default=False,
        ),
    ] = None,
    api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key",
            help="API key for the remote command that follows (as its own --api-key).",
            show_default=False,
        ),
    ] = None,
    http_timeout: Annotated[
        float | None,
        typer.Option(
            "--http-timeout",
            callback=_positive_seconds,
            help="Seconds to wait for each answer from the service before giving up (exit 6); "
            "default 30 (DPSS_HTTP_TIMEOUT). Not the wait for a release: that is --timeout.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """``--url``, ``--api-key`` and ``--http-timeout`` before the command (``dpss-remote --url U
    datasets list``), as docs/cli.md writes them: they stand in for ``DPSS_URL``,
    ``DPSS_API_KEY`` and ``DPSS_HTTP_TIMEOUT`` for this one command (its own options still
    win), and the environment is put back when it ends."""
    given = {
        "DPSS_URL": url,
        "DPSS_API_KEY": api_key,
        "DPSS_HTTP_TIMEOUT": None if http_timeout is None else f"{http_timeout:g}",
    }
    saved = {name: os.environ.get(name) for name, value in given.items() if value is not None}

    def restore() -> None:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

    for name in saved:
        os.environ[name] = str(given[name])
    ctx.call_on_close(restore)


def register_remote_commands(app: typer.Typer, audit_app: typer.Typer) -> None:
    """Add the remote commands to the ``dpss`` app and ``list`` to its ``audit`` group, and the
    global ``--url`` and ``--api-key`` options (before the command) to the app."""
    app.callback()(_global_options)
    app.add_typer(datasets_app, name="datasets")
    app.command("budget")(budget)
    app.add_typer(grants_app, name="grants")
    app.add_typer(releases_app, name="releases")
    app.add_typer(priors_app, name="priors")
    app.command("mechanisms")(mechanisms)
    audit_app.command("list")(audit_list)


def make_app() -> typer.Typer:
    """The remote commands alone: the ``dpss-remote`` command of the slim client package.

    The same commands (same options, output and exit codes) as ``dpss datasets|budget|grants|
    releases|mechanisms|audit list`` on a server install; the operator commands (serve, api,
    worker, migrate, keys, audit verify|head) need the server and are not here.
    """
    app = typer.Typer(
        help="Client for dp-subspace-service: datasets, budgets, grants and private releases.",
        no_args_is_help=True,
    )
    audit_app = typer.Typer(help="The audit log.", no_args_is_help=True)
    app.add_typer(audit_app, name="audit")
    register_remote_commands(app, audit_app)
    return app


def main() -> None:
    """Entry point of ``dpss-remote``."""
    make_app()()
