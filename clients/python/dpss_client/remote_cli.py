"""The remote commands of ``dpss``: talk to a running service through :mod:`dpss_client.client`.

On a server install, ``service.cli`` calls :func:`register_remote_commands` to add ``datasets``,
``budget``, ``grants``, ``releases``, ``mechanisms`` and ``audit list`` to ``dpss``; with the slim
``dpss-client`` package alone, the same commands are the ``dpss-remote`` command
(:func:`make_app`). Like the client, this module imports nothing from the server, so it runs on
an analyst's laptop.

Every command takes ``--url`` (``DPSS_URL``, default ``http://127.0.0.1:8000``) and
``--api-key`` (``DPSS_API_KEY``), prints tables by default and JSON with ``--json``, and exits
with one of the :class:`ExitCode` values (documented in docs/cli.md).
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from decimal import Decimal
from enum import IntEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, get_args

import typer

# The rich parts typer's own help draws with anyway; the rest (httpx, numpy, pydantic, the
# schemas, the client, rich.progress) is imported by the commands that use it, so that
# `dpss --help` and `dpss <command> --help` start without them (bench/bench_cli_startup.py).
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from dpss_client.defaults import DEFAULT_URL

if TYPE_CHECKING:
    import httpx
    from pydantic import BaseModel

    from api_schemas.datasets import Budget, Dataset
    from api_schemas.grants import Grant
    from api_schemas.releases import Release, ReleasePreview
    from dpss_client.client import Client, DpssError, ReleaseHandle, UploadProgress


class ExitCode(IntEnum):
    """What a remote ``dpss`` command's exit status means."""

    OK = 0
    ERROR = 1  # an unexpected error in the command itself
    USAGE = 2  # bad command line (typer/click's own code for usage errors)
    REFUSED = 3  # the service refused the request (4xx: auth, not found, invalid, budget)
    NO_RESULT = 4  # the release finished as no_result (charged, nothing released)
    FAILED = 5  # the release job (or a dataset's registration) failed
    UNREACHABLE = 6  # no answer: connection refused, DNS, too slow an answer, connection lost
    SERVER_ERROR = 7  # the service answered 5xx or something the client cannot read
    TIMEOUT = 8  # --timeout passed while waiting; the release keeps running


def _release_statuses() -> tuple[str, ...]:
    """The statuses a release can have (``api_schemas.releases.ReleaseStatus``)."""
    from api_schemas.releases import ReleaseStatus

    return get_args(ReleaseStatus)


def make_http_client(url: str, timeout: float) -> httpx.Client | None:
    """Seam for tests: return the ``httpx.Client`` commands should use, or None for a new one.

    Tests replace this (monkeypatch) with a function returning a FastAPI ``TestClient``.
    """
    return None


# --------------------------------------------------------------------------------------------
# Shared options

UrlOption = Annotated[
    str,
    typer.Option("--url", envvar="DPSS_URL", help="Service base URL.", show_envvar=True),
]
ApiKeyOption = Annotated[
    str | None,
    typer.Option(
        "--api-key",
        envvar="DPSS_API_KEY",
        help="API key (bearer secret).",
        show_envvar=True,
        show_default=False,
    ),
]
JsonOption = Annotated[
    bool, typer.Option("--json", help="Print JSON for scripts instead of tables.")
]


def _wait_seconds(value: float | None) -> float | None:
    """``--timeout``: 0 or more seconds, ``inf`` for no limit. (Click's range check let nan
    through its bounds and then said it "should be greater than or equal to 0".)"""
    if value is not None and not value >= 0:
        raise typer.BadParameter(f"{value:g} is not a number of seconds, 0 or more (inf: no limit)")
    return value


def _positive_seconds(value: float | None) -> float | None:
    """``--http-timeout``: a positive, finite number of seconds. (nan was told "greater than or
    equal to 0.001"; inf passed the option and was then refused as ``DPSS_HTTP_TIMEOUT``, a
    variable the user never set.)"""
    if value is not None and not 0 < value < float("inf"):
        raise typer.BadParameter(f"{value:g} is not a positive, finite number of seconds")
    return value


TimeoutOption = Annotated[
    float | None,
    typer.Option(
        "--timeout",
        callback=_wait_seconds,
        help="Give up waiting after this many seconds, 0 or more (exit 8).",
    ),
]


def _writable_out(out: Path | None) -> Path | None:
    """``--out`` checked before anything is requested: click's ``writable`` tests an existing
    file only, so a missing or read-only directory was found after the release was paid for."""
    if out is None:
        return None
    folder = out.parent
    if not folder.is_dir():
        raise typer.BadParameter(f"directory {folder} does not exist", param_hint="--out")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise typer.BadParameter(f"directory {folder} is not writable", param_hint="--out")
    return out


OutOption = Annotated[
    Path | None,
    typer.Option(
        "--out",
        dir_okay=False,
        writable=True,
        callback=_writable_out,
        help="Write the basis as a .npy file (implies --wait).",
    ),
]
AllowLargeDeltaOption = Annotated[
    bool,
    typer.Option(
        "--allow-large-delta",
        help="Accept a delta budget above 1/n (refused otherwise: it offers no protection).",
    ),
]


def _client(url: str, api_key: str | None) -> Client:
    from dpss_client.client import Client

    if not api_key:
        raise typer.BadParameter(
            "no API key: pass --api-key or set DPSS_API_KEY", param_hint="--api-key"
        )
    timeout = _http_timeout()
    return Client(url, api_key, http=make_http_client(url, timeout), timeout=timeout)


#: Seconds each network operation may take unless ``DPSS_HTTP_TIMEOUT`` (``--http-timeout``
#: before the command) says otherwise.
HTTP_TIMEOUT_SECONDS = 30.0
#: How the command line allows a slower answer, said when one did not come in time.
CLI_TIMEOUT_HINT = "--http-timeout SECONDS before the command (or DPSS_HTTP_TIMEOUT=SECONDS)"


def _http_timeout() -> float:
    """``DPSS_HTTP_TIMEOUT`` (seconds, positive) or :data:`HTTP_TIMEOUT_SECONDS`."""
    text = os.environ.get("DPSS_HTTP_TIMEOUT", "").strip()
    if not text:
        return HTTP_TIMEOUT_SECONDS
    try:
        seconds = float(text)
    except ValueError:
        seconds = float("nan")
    if not 0 < seconds < float("inf"):
        raise typer.BadParameter(
            f"{text!r} is not a positive number of seconds", param_hint="DPSS_HTTP_TIMEOUT"
        )
    return seconds


def _stdout() -> Console:
    # Made per call so that output goes to whatever sys.stdout is now (CliRunner swaps it).
    console = Console(file=sys.stdout, soft_wrap=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        # Piped output has no width to fit; rich's default of 80 would cut ids short.
        console.width = 160
    return console


def _stderr() -> Console:
    return Console(file=sys.stderr, soft_wrap=True)


def _print_json(value: Any) -> None:
    typer.echo(json.dumps(value, indent=2, sort_keys=False))


def _dump(model: BaseModel) -> Any:
    return model.model_dump(mode="json")


def _exit_code_for(error: DpssError) -> ExitCode:
    from dpss_client.client import (
        RegistrationFailed,
        ReleaseFailed,
        ReleaseNoResult,
        ServerError,
        ServiceUnreachableError,
        WaitTimeoutError,
    )

    if isinstance(error, ReleaseNoResult):
        return ExitCode.NO_RESULT
    if isinstance(error, ReleaseFailed | RegistrationFailed):
        return ExitCode.FAILED
    if isinstance(error, WaitTimeoutError):
        return ExitCode.TIMEOUT
    if isinstance(error, ServiceUnreachableError):
        return ExitCode.UNREACHABLE
    if isinstance(error, ServerError):
        return ExitCode.SERVER_ERROR
    if error.status is not None and 400 <= error.status < 500:
        return ExitCode.REFUSED
    return ExitCode.ERROR


#: What a budget_exceeded error adds: which budget is short (grant or dataset) and its remainder.
_ERROR_EXTRAS = (
    "budget",
    "grant_id",
    "epsilon_remaining",
    "delta_remaining",
    "rho_remaining",
    "mu_remaining",
    "delta_reserved_for_conversion",
    "epsilon_admissible",
    "delta_admissible",
    "delta_admissible_epsilon",
)
#: Extras that are remaining budget figures: shown to 4 significant digits, rounded down, on
#: stderr (exact in --json). The admissible figures have at most 3 digits: shown exactly.
_REMAINING_EXTRAS = frozenset((*_ERROR_EXTRAS[2:6], *_ERROR_EXTRAS[7:]))


@contextmanager
def _service_errors(as_json: bool) -> Iterator[None]:
    """Report a DpssError (stderr; and stdout as JSON with --json) and exit with its code."""
    from api_schemas.common import canonical_decimal
    from dpss_client.client import DpssError, ServiceTimeoutError

    try:
        yield
    except DpssError as error:
        if isinstance(error, ServiceTimeoutError):
            error = error.with_hint(CLI_TIMEOUT_HINT)
        code = _exit_code_for(error)
        if as_json:
            body: dict[str, Any] = {"error": error.code, "detail": error.detail}
            for extra in _ERROR_EXTRAS:
                value = getattr(error, extra, None)
                if value is not None:
                    # The API's exact text ("0.0000002"), never str(Decimal)'s "2E-7".
                    exact = isinstance(value, Decimal)
                    body[extra] = canonical_decimal(value) if exact else str(value)
            _print_json(body)
        console = _stderr()
        console.print(
            f"[bold red]error[/bold red] {escape(f'[{error.code}]')} {escape(error.detail)}"
        )
        for extra in _ERROR_EXTRAS:
            value = getattr(error, extra, None)
            if value is not None:
                shown = _figure(value) if extra in _REMAINING_EXTRAS else str(value)
                console.print(f"  {extra}: {shown}", markup=False)
        raise typer.Exit(int(code)) from None


# --------------------------------------------------------------------------------------------
# Rendering


def _text(value: Any) -> str:
    """A table cell: budgets in the JSON's plain notation (never "1E-7"), the rest as ``str``."""
    from api_schemas.common import format_budget

    if value is None:
        return ""
    if isinstance(value, Decimal):
        return format_budget(value)
    # A released float (an eigenvalue, a noise scale) to 6 significant digits: its noise is far
    # larger; the exact double is in --json.
    if isinstance(value, float):
        return _six(value)
    if isinstance(value, list) and value and all(isinstance(v, float) for v in value):
        return "[" + ", ".join(_six(v) for v in value) + "]"
    return str(value)


def _six(value: float) -> str:
    """A float to 6 significant digits in plain notation (never "1e-05")."""
    if value != value or value in (float("inf"), float("-inf")):
        return str(value)
    return format(Decimal(f"{value:.6g}"), "f")


def _figure(value: Decimal | None, *, up: bool = False) -> str:
    """A budget figure for people: 4 significant digits, a spent figure or a cost rounded up,
    a total or remaining figure down (exact values: --json)."""
    from api_schemas.figures import shown

    return "" if value is None else shown(value, up=up)


#: Where rho, mu and the delta held for the conversion are explained (one place).
READING_A_BUDGET = "docs/mechanisms.md#reading-a-budget"


def _kv_table(title: str, rows: list[tuple[str, Any]]) -> Table:
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column("field", style="bold", overflow="fold")
    table.add_column("value", overflow="fold")
    for key, value in rows:
        table.add_row(key, _text(value))
    return table


def _budget_table(budget: Budget, title: str = "budget") -> Table:
    table = Table(title=title, title_justify="left")
    for column in ("", "total", "spent", "remaining"):
        table.add_column(column, justify="right" if column else "left", overflow="fold")
    for name, total, spent, left in (
        ("epsilon", budget.epsilon_total, budget.epsilon_spent, budget.epsilon_remaining),
        ("delta", budget.delta_total, budget.delta_spent, budget.delta_remaining),
        # The filter's own currency on gaussian and zcdp datasets, beside epsilon (which there
        # is what the spent amount amounts to at delta_total).
        ("mu", budget.mu_total, budget.mu_spent, budget.mu_remaining),
        ("rho", budget.rho_total, budget.rho_spent, budget.rho_remaining),
    ):
        if total is not None:
            table.add_row(name, _figure(total), _figure(spent, up=True), _figure(left))
    reserved = budget.delta_reserved_for_conversion
    if reserved is not None:
        table.add_row("delta held for the conversion", _figure(reserved), "-", "-")
    if budget.accounting != "basic":
        table.title = f"{title} ({budget.accounting} accounting)"
        table.caption = f"rho, mu: {READING_A_BUDGET}"
    return table


def _dataset_rows(ds: Dataset) -> list[tuple[str, Any]]:
    return [
        ("id", ds.id),
        ("name", ds.name),
        ("shape", f"{ds.n_rows} x {ds.n_cols}"),
        ("row_norm_bound", ds.row_norm_bound),
        ("privacy_unit", _privacy_unit(ds)),
        ("created_at", ds.created_at.isoformat(timespec="seconds")),
        *_registration_rows(ds),
    ]


def _privacy_unit(ds: Dataset) -> str:
    """What the budget protects: a row, or a person (with how many people)."""
    if ds.privacy_unit == "person":
        return f"person ({ds.n_units} people)"
    return "row (a person with r rows is protected at up to r epsilon)"


def _registration_rows(ds: Dataset) -> list[tuple[str, Any]]:
    """A dataset by reference's registration and record digest, with its URI for its owner
    (the service shows the URI to no one else; nothing for an upload)."""
    if not ds.by_reference and ds.reference is None:
        return []
    rows: list[tuple[str, Any]] = [
        ("reference", ds.reference if ds.reference is not None else "(by reference)"),
        ("registration", ds.registration_status),
    ]
    if ds.reference_sha256 is not None:
        rows.append(("reference_sha256", ds.reference_sha256))
    if ds.registration_reason is not None:
        rows.append(("reason", ds.registration_reason))
    return rows


def _preview_rows(info: ReleasePreview) -> list[tuple[str, Any]]:
    rows: list[tuple[str, Any]] = [
        ("dataset_id", info.dataset_id),
        ("mechanism", info.mechanism),
        ("k", info.k),
        ("epsilon", info.epsilon),
        ("delta", info.delta),
        ("params", json.dumps(info.params, sort_keys=True)),
        ("affordable", "yes" if info.affordable else "NO: the budget does not cover it"),
        ("epsilon_remaining", _figure(info.epsilon_remaining)),
    ]
    if info.epsilon_admissible is not None:
        # What this request IS admitted at (on hybrid epsilon_remaining states the spend).
        rows.append(("epsilon_admissible", _figure(info.epsilon_admissible)))
    if info.delta_admissible is not None and info.delta_admissible_epsilon is not None:
        # None at its delta (e.g. hybrid's delta filter spent): the same request at this delta.
        rows.append(("delta_admissible", _figure(info.delta_admissible)))
        rows.append(("delta_admissible_epsilon", _figure(info.delta_admissible_epsilon)))
    rows += [
        ("delta_remaining", _figure(info.delta_remaining)),
        ("memory", f"{info.memory_mb:,.1f} MiB"),
    ]
    if info.recommended_accounting not in (None, info.accounting):
        # Advice for the owner's next upload, shown only when another accounting fits better.
        rows.append(("recommended_accounting", info.recommended_accounting))
    if info.accounting != "basic":
        rows += [
            ("accounting", info.accounting),
            ("mu", _figure(info.mu, up=True)),
            ("rho", _figure(info.rho, up=True)),
            ("zcdp_delta", _figure(info.zcdp_delta, up=True)),
            ("rho_remaining", _figure(info.rho_remaining)),
            ("mu_remaining", _figure(info.mu_remaining)),
            ("delta_reserved_for_conversion", _figure(info.delta_reserved_for_conversion)),
            ("releases_remaining", info.releases_remaining),
        ]
    rows += [
        (name, f"{value:.6g}" if isinstance(value, float) else value)
        for name, value in info.scales.items()
    ]
    return rows


def _release_rows(info: Release) -> list[tuple[str, Any]]:
    rows: list[tuple[str, Any]] = [
        ("id", info.id),
        ("dataset_id", info.dataset_id),
        ("mechanism", info.mechanism),
        ("k", info.k),
        ("epsilon", info.epsilon),
        ("delta", info.delta),
        ("params", json.dumps(info.params, sort_keys=True)),
        ("status", info.status),
    ]
    if info.reason:
        rows.append(("reason", info.reason))
    if info.status in ("no_result", "failed"):
        rows.append(("refunded", info.refunded))
    rows.append(("created_at", info.created_at.isoformat(timespec="seconds")))
    if info.visible_at is not None:
        rows.append(("visible_at", info.visible_at.isoformat(timespec="seconds")))
    if info.finished_at is not None:
        rows.append(("finished_at", info.finished_at.isoformat(timespec="seconds")))
    if info.attempts is not None:
        # The service shows attempts and times to no analyst or owner (null); shown if given.
        rows.append(("attempts", info.attempts))
    if info.result is not None:
        if info.result.basis is not None:
            d = len(info.result.basis)
            k = len(info.result.basis[0]) if d else info.k
            rows.append(("basis", f"{d} x {k} (use --out FILE.npy or --json to get it)"))
        if info.result.basis_sha256:
            # Its start names it in a table of 100 columns without folding; whole: --json.
            rows.append(("basis_sha256", f"{info.result.basis_sha256[:16]} (whole: --json)"))
        for key, value in info.result.extras.items():
            numbers = isinstance(value, float) or (
                isinstance(value, list) and value and all(isinstance(v, float) for v in value)
            )
            rows.append((key, _text(value) if numbers else json.dumps(value)))
    return rows


# --------------------------------------------------------------------------------------------
# datasets

datasets_app = typer.Typer(
    help="Upload and inspect datasets (metadata only).", no_args_is_help=True
)


@contextmanager
def _upload_bar() -> Iterator[UploadProgress | None]:
    """A progress bar on stderr (bytes sent, rate, time left) when it is a terminal, else None:
    piped and scripted runs get no control characters."""
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    console = _stderr()
    if not console.is_terminal:
        yield None
        return
    columns = (
        TextColumn("uploading"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task("upload", total=None)

        def report(sent: int, total: int) -> None:
            bar.update(task, completed=sent, total=total)

        yield report


@datasets_app.command("upload")
def datasets_upload(
    file: Annotated[
        Path,
        typer.Argument(
            exists=True, dir_okay=False, readable=True, help="A .csv, .npy or .parquet file."
        ),
    ],
    epsilon_budget: Annotated[
        str, typer.Option("--epsilon-budget", help="Total epsilon for the dataset, e.g. 1.0.")
    ],
    delta_budget: Annotated[
        str, typer.Option("--delta-budget", help="Total delta for the dataset, e.g. 1e-5.")
    ],
    name: Annotated[
        str | None, typer.Option("--name", help="Dataset name (default: the file's stem).")
    ] = None,
    row_norm_bound: Annotated[
        float | None,
        typer.Option("--row-norm-bound", help="Public bound C on row norms (default clip norm)."),
    ] = None,
    accounting: Annotated[
        str | None,
        typer.Option(
            "--accounting",
            help=(
                "hybrid, basic, gaussian or zcdp (default: the service's, hybrid unless "
                "changed; basic for delta 0)."
            ),
        ),
    ] = None,
    mu_budget: Annotated[
        str | None, typer.Option("--mu-budget", help="gaussian: a mu budget stated directly.")
    ] = None,
    rho_budget: Annotated[
        str | None, typer.Option("--rho-budget", help="zcdp: a rho budget stated directly.")
    ] = None,
    delta_conversion: Annotated[
        str | None,
        typer.Option("--delta-conversion", help="zcdp: delta kept for the conversion."),
    ] = None,
    allow_large_delta: AllowLargeDeltaOption = False,
    privacy_unit_column: Annotated[
        str | None,
        typer.Option(
            "--privacy-unit-column",
            help=(
                "The column naming each row's person (a name or a 0-based index): removed "
                "from the features; the budget then protects people, not rows."
            ),
        ),
    ] = None,
    planned_mechanisms: Annotated[
        str | None,
        typer.Option(
            "--planned-mechanisms",
            help="Comma-separated mechanisms you plan to use: the output then says which "
            "accounting fits them (advice only; the dataset keeps --accounting).",
        ),
    ] = None,
    url: UrlOption = DEFAULT_URL,
    api_key: ApiKeyOption = None,
    as_json: JsonOption = False,
) -> None:
    """Upload FILE as a new dataset with a privacy budget (owner key). On a terminal, stderr
    shows the bytes sent and the rate. The output shows rows_above_bound (rows whose norm
    exceeds --row-norm-bound: every clipping mechanism scales them down to it), with a
    warning on stderr when they are ROWS_ABOVE_BOUND_WARNING of the rows or more."""
    with _service_errors(as_json), _client(url, api_key) as client, _upload_bar() as report:
        try:
            ds = client.upload(
                file,
                name=name,
                epsilon_budget=epsilon_budget,
                delta_budget=delta_budget,
                row_norm_bound=row_norm_bound,
                progress=report,
                accounting=accounting,
                mu_budget=mu_budget,
                rho_budget=rho_budget,
                delta_conversion=delta_conversion,
                allow_large_delta=allow_large_delta,
                privacy_unit_column=privacy_unit_column,
                planned_mechanisms=None
                if planned_mechanisms is None
                else [name.strip() for name in planned_mechanisms.split(",")],
            )
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from exc
        above: int | None = getattr(ds, "rows_above_bound", None)
        warning = _rows_above_bound_warning(above, ds.n_rows, ds.row_norm_bound)
        if warning is not None:
            # On stderr in both formats: --json keeps stdout machine-readable.
            _stderr().print(warning, markup=False)
        if as_json:
            _print_json(_dump(ds))
            return
        out = _stdout()
        rows = _dataset_rows(ds)
        if above is not None:
            share = above / ds.n_rows if ds.n_rows else 0.0
            rows.append(("rows_above_bound", f"{above} of {ds.n_rows} ({share:.0%})"))
        per_unit: dict[str, int] | None = getattr(ds, "rows_per_unit", None)
        if per_unit is not None:
            rows.append(
                (
                    "rows_per_unit",
                    ", ".join(f"{count} with {size}" for size, count in per_unit.items()),
                )
            )
        recommended = getattr(ds, "recommended_accounting", None)
        if planned_mechanisms is not None and recommended is not None:
            rows.append(("recommended_accounting", recommended))
        out.print(_kv_table("dataset uploaded", rows))
        out.print(_budget_table(ds.budget))
        if planned_mechanisms is not None and recommended is not None:
            out.print(f"- {getattr(ds, 'recommendation_reason', '')}", markup=False)


#: The share of uploaded rows above row_norm_bound from which the upload warns: the bound is
#: meant to hold for (nearly) every row; a tenth of them clipped usually means raw units or a
#: bound guessed too small.
ROWS_ABOVE_BOUND_WARNING = 0.1


def _rows_above_bound_warning(above: int | None, n_rows: int, bound: float | None) -> str | None:
    """The warning for an upload with many rows above its bound, or None."""
    if above is None or n_rows == 0 or above < ROWS_ABOVE_BOUND_WARNING * n_rows:
        return None
    return (
        f"warning: {above} of {n_rows} rows ({above / n_rows:.0%}) have a norm above "
        f"row_norm_bound {bound:g}; every clipping mechanism scales them down to it, so "
        "releases describe the clipped rows. If the data is in raw units, rescale it (e.g. to "
        "unit norm) or declare a bound from domain knowledge that holds for the rows."
    )


@datasets_app.command("register")
def datasets_register(
    uri: Annotated[
        str,
        typer.Argument(
            help="s3://bucket/prefix/ or an absolute path under the service's "
            "DPSS_REFERENCE_ROOTS: its *.parquet objects, in key order, are the dataset."
        ),
    ],
    columns: Annotated[
        str, typer.Option("--columns", help="The numeric columns to use, comma-separated.")
    ],
    epsilon_budget: Annotated[
        str, typer.Option("--epsilon-budget", help="Total epsilon for the dataset, e.g. 1.0.")
    ],
    delta_budget: Annotated[
        str, typer.Option("--delta-budget", help="Total delta for the dataset, e.g. 1e-5.")
    ],
    name: Annotated[str, typer.Option("--name", help="Dataset name.")],
    row_norm_bound: Annotated[
        float | None,
        typer.Option("--row-norm-bound", help="Public bound C on row norms (default clip norm)."),
    ] = None,
    wait: Annotated[
        bool,
        typer.Option(
            "--wait/--no-wait",
            help="Wait until the service has read and checked the objects (default), or "
            "return the registering dataset at once (poll it with `datasets show`).",
        ),
    ] = True,
    timeout: TimeoutOption = None,
    allow_large_delta: AllowLargeDeltaOption = False,
    url: UrlOption = DEFAULT_URL,
    api_key: ApiKeyOption = None,
    as_json: JsonOption = False,
) -> None:
    """Register Parquet objects where they are as a new dataset with a privacy budget (owner
    key). A failed registration exits 5 with the service's reason; --timeout exits 8 (it keeps
    registering)."""
    with _service_errors(as_json), _client(url, api_key) as client:
        try:
            ds = client.register_reference(
                uri,
                [c.strip() for c in columns.split(",") if c.strip()],
                name=name,
                epsilon_budget=epsilon_budget,
                delta_budget=delta_budget,
                row_norm_bound=row_norm_bound,
                allow_large_delta=allow_large_delta,
                wait=wait,
                timeout=timeout,
            )
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from exc
        if as_json:
            _print_json(_dump(ds))
            return
        out = _stdout()
        out.print(_kv_table(f"dataset {ds.registration_status}", _dataset_rows(ds)))
        out.print(_budget_table(ds.budget))


@datasets_app.command("append")
def datasets_append(
    dataset_id: Annotated[str, typer.Argument(help="Dataset id.")],
    file: Annotated[
        Path,
        typer.Argument(
            exists=True,
            dir_okay=False,
            readable=True,
            help="A .csv, .npy or .parquet file with the dataset's number of columns.",
        ),
    ],
    url: UrlOption = DEFAULT_URL,
    api_key: ApiKeyOption = None,
    as_json: JsonOption = False,
) -> None:
    """Append FILE's rows to a dataset as its next batch (owner key): all of them or none.
    Continual releases of the dataset release their next epoch from it."""
    with _service_errors(as_json), _client(url, api_key) as client, _upload_bar() as report:
        batch = client.append_rows(dataset_id, file, progress=report)
        if as_json:
            _print_json(_dump(batch))
            return
        rows = [
            ("dataset", str(batch.dataset_id)),
            ("batch", str(batch.seq)),
            ("rows in batch", str(batch.n_rows)),
            ("rows in dataset", str(batch.n_rows_total)),
            ("batches", str(batch.n_batches)),
        ]
        _stdout().print(_kv_table("batch appended", rows))


@datasets_app.command("list")
def datasets_list(
    url: UrlOption = DEFAULT_URL,
    api_key: ApiKeyOption = None,
    as_json: JsonOption = False,
) -> None:
    """List the datasets this key can see."""
    with _service_errors(as_json), _client(url, api_key) as client:
        items = client.datasets()
        if as_json:
            _print_json({"items": [_dump(ds) for ds in items], "total": len(items), "next": None})
            return
        table = Table(title=f"{len(items)} dataset(s)", title_justify="left", box=box.SIMPLE_HEAD)
        table.add_column("id", overflow="fold")
        table.add_column("name", overflow="fold")
        table.add_column("rows x cols", justify="right", overflow="fold")
        table.add_column("C", justify="right", overflow="fold")
        table.add_column("eps left", justify="right", overflow="fold")
        table.add_column("delta left", justify="right", overflow="fold")
        for ds in items:
            table.add_row(
                str(ds.id),
                ds.name,
                f"{ds.n_rows} x {ds.n_cols}",
                "" if ds.row_norm_bound is None else f"{ds.row_norm_bound:g}",
                _figure(ds.budget.epsilon_remaining),
                _figure(ds.budget.delta_remaining),
            )
        _stdout().print(table)


@datasets_app.command("show")
def datasets_show(
    dataset_id: Annotated[str, typer.Argument(help="Dataset id.")],
    url: UrlOption = DEFAULT_URL,
    api_key: ApiKeyOption = None,
    as_json: JsonOption = False,
) -> None:
    """Show one dataset's metadata and budget."""
    with _service_errors(as_json), _client(url, api_key) as client:
        ds = client.dataset(dataset_id)
        if as_json:
            _print_json(_dump(ds))
            return
        out = _stdout()
        out.print(_kv_table("dataset", _dataset_rows(ds)))
        out.print(_budget_table(ds.budget))


@datasets_app.command("delete")
def datasets_delete(
    dataset_id: Annotated[str, typer.Argument(help="Dataset id.")],
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask for confirmation.")] = False,
    url: UrlOption = DEFAULT_URL,
    api_key: ApiKeyOption = None,
    as_json: JsonOption = False,
) -> None:
    """Purge a dataset's rows (owner key). Its ledger and audit events stay."""
    if not yes:
        typer.confirm(f"Delete the rows of dataset {dataset_id}? This cannot be undone", abort=True)
    with _service_errors(as_json), _client(url, api_key) as client:
        client.delete_dataset(dataset_id)
        if as_json:
            _print_json({"id": dataset_id, "deleted": True})
        else:
            _stderr().print(f"dataset {dataset_id} deleted", markup=False)


# --------------------------------------------------------------------------------------------
# budget


def budget(
    dataset_id: Annotated[str, typer.Argument(help="Dataset id.")],
    url: UrlOption = DEFAULT_URL,
    api_key: ApiKeyOption = None,
    as_json: JsonOption = False,
) -> None:
    """Show a dataset's privacy budget: total, spent and remaining (exact decimals)."""
    with _service_errors(as_json), _client(url, api_key) as client:
        b = client.budget(dataset_id)
        if as_json:
            _print_json(_dump(b))
            return
        out = _stdout()
        out.print(f"dataset {dataset_id}", markup=False)
        out.print(_budget_table(b))


# --------------------------------------------------------------------------------------------
# grants

grants_app = typer.Typer(
    help="Share a dataset's budget with analyst keys (owner key).", no_args_is_help=True
)


def _native_left(grant: Grant) -> str:
    """The grant's native figure: mu on gaussian, rho on zcdp, both on hybrid (its Gaussian-DP
    filter's mu and its zCDP filter's rho, either of which may admit the next release: mu
    alone read 0 once an approximate step closed that filter while rho was left)."""
    mu, rho = grant.mu_remaining, grant.rho_remaining
    if grant.accounting == "hybrid" and mu is not None and rho is not None:
        return f"mu {_figure(mu)}, rho {_figure(rho)}"
    if mu is not None:
        return f"mu {_figure(mu)}"
    return "" if rho is None else f"rho {_figure(rho)}"


def _grants_table(items: list[Grant], title: str) -> Table:
    """Each grant in (epsilon, delta) with its native figure beside it; the analyst key by
    name and the start of its id (exact values and times: --json)."""
    table = Table(
        title=title,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        caption="exact values: --json",
    )
    table.add_column("id", overflow="fold")
    table.add_column("analyst key", overflow="fold")
    for column in ("eps total", "eps spent", "eps left", "delta left", "native left"):
        table.add_column(column, justify="right", overflow="fold")
    table.add_column("revoked", overflow="fold")
    for grant in items:
        if grant.analyst_key_id is None:
            who = "every analyst"
        else:
            who = f"{grant.analyst_key_name or ''} ({str(grant.analyst_key_id)[:8]})".lstrip()
        native = _native_left(grant)
        table.add_row(
            str(grant.id),
            who,
            _figure(grant.epsilon_total),
            _figure(grant.epsilon_spent, up=True),
            _figure(grant.epsilon_remaining),
            _figure(grant.delta_remaining),
            native,
            "" if grant.revoked_at is None else "yes",
        )
    return table


@grants_app.command("create")
def grants_create(
    dataset_id: Annotated[str, typer.Argument(help="Dataset id.")],
    epsilon: Annotated[
        str | None,
        typer.Option(
            "--epsilon",
            help="Epsilon granted, e.g. 0.5 (gaussian, zcdp: converted to rho, rounded down).",
        ),
    ] = None,
    delta: Annotated[
        str | None,
        typer.Option(
            "--delta",
            help="Delta granted, e.g. 1e-6 (with --epsilon: default the dataset's delta).",
        ),
    ] = None,
    mu: Annotated[str | None, typer.Option("--mu", help="gaussian: mu granted.")] = None,
    rho: Annotated[str | None, typer.Option("--rho", help="gaussian, zcdp: rho granted.")] = None,
    analyst_key_id: Annotated[
        str | None,
        typer.Option("--analyst-key-id", help="The analyst key's id; omit for every analyst."),
    ] = None,
    url: UrlOption = DEFAULT_URL,
    api_key: ApiKeyOption = None,
    as_json: JsonOption = False,
) -> None:
    """Grant an analyst key (or every analyst) a share of DATASET_ID's budget."""
    with _service_errors(as_json), _client(url, api_key) as client:
        try:
            grant = client.create_grant(
                dataset_id, epsilon, delta, mu=mu, rho=rho, analyst_key_id=analyst_key_id
            )
        except (ValueError, TypeError) as exc:
            raise typer.BadParameter(str(exc)) from exc
        if as_json:
            _print_json(_dump(grant))
            return
        _stdout().print(_grants_table([grant], "grant created"))


@grants_app.command("list")
def grants_list(
    dataset_id: Annotated[str, typer.Argument(help="Dataset id.")],
    url: UrlOption = DEFAULT_URL,
    api_key: ApiKeyOption = None,
    as_json: JsonOption = False,
) -> None:
    """List DATASET_ID's grants with what each spent and has left."""
    with _service_errors(as_json), _client(url, api_key) as client:
        items = client.list_grants(dataset_id)
        if as_json:
            _print_json({"items": [_dump(grant) for grant in items], "total": len(items)})
            return
        _stdout().print(_grants_table(items, f"{len(items)} grant(s)"))


@grants_app.command("revoke")
def grants_revoke(
    dataset_id: Annotated[str, typer.Argument(help="Dataset id.")],
    grant_id: Annotated[str, typer.Argument(help="Grant id.")],
    url: UrlOption = DEFAULT_URL,
    api_key: ApiKeyOption = None,
    as_json: JsonOption = False,
) -> None:
    """Revoke a grant: no further charges; what it spent stays spent."""
    with _service_errors(as_json), _client(url, api_key) as client:
        grant = client.revoke_grant(dataset_id, grant_id)
        if as_json:
            _print_json(_dump(grant))
            return
        _stdout().print(_grants_table([grant], "grant revoked"))


# --------------------------------------------------------------------------------------------
# releases

releases_app = typer.Typer(
    help="Request private subspace releases and fetch them.", no_args_is_help=True
)


def parse_params(pairs: list[str]) -> dict[str, Any]:
    """``key=value`` pairs to a params dict; values are JSON when they parse (numbers, bools,
    lists, null) and strings otherwise."""
    params: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise typer.BadParameter(f"expected key=value, got {pair!r}", param_hint="--param")
        try:
            params[key] = json.loads(raw)
        except ValueError:
            params[key] = raw
    return params


def _finish(
    handle: ReleaseHandle,
    *,
    wait: bool,
    out: Path | None,
    timeout: float | None,
    as_json: bool,
) -> None:
    """Shared tail of ``releases create`` and ``releases show``: wait, save, print, exit."""
    import numpy as np

    from dpss_client.client import (
        NoWorkerWarning,
        ReleaseFailed,
        ReleaseNoResult,
        WaitTimeoutError,
    )

    console = _stdout()
    if not as_json and not wait:
        console.print(_kv_table("release", _release_rows(handle.info)))
    if not wait:
        if as_json:
            _print_json(_dump(handle.info))
        return
    if not as_json and not handle.done:
        # Said before waiting so that the id survives a Ctrl-C, a timeout or a lost connection.
        _stderr().print(f"release {handle.id} {handle.status}; waiting for it", markup=False)
    try:
        try:
            # The spinner goes to stderr and only on a terminal; --json keeps stderr plain too.
            # A NoWorkerWarning is a line of the command's stderr ("warning: ..."), not Python's
            # warning format with a source path and line.
            with warnings.catch_warnings():
                shown = warnings.showwarning

                def show(message: Any, category: type[Warning], *args: Any, **kw: Any) -> None:
                    if issubclass(category, NoWorkerWarning):
                        _stderr().print(f"warning: {message}", markup=False)
                    else:
                        shown(message, category, *args, **kw)

                warnings.showwarning = show
                handle.wait_finished(progress=not as_json, timeout=timeout)
        except KeyboardInterrupt:
            _stderr().print(
                f"stopped waiting; release {handle.id} goes on "
                f"(dpss releases show {handle.id} --wait)",
                markup=False,
            )
            raise typer.Exit(130) from None
        outcome: DpssError | None = None
        try:
            handle.raise_for_outcome()
        except (ReleaseNoResult, ReleaseFailed) as exc:
            outcome = exc
        if as_json:
            _print_json(_dump(handle.info))
        else:
            console.print(_kv_table("release", _release_rows(handle.info)))
        if outcome is not None:
            raise typer.Exit(int(_exit_code_for(outcome)))
        if out is not None:
            basis = handle.basis()
            try:
                with out.open("wb") as fh:
                    np.save(fh, basis)
            except OSError as exc:
                # Checked before the request, but the disk can still fill or change meanwhile.
                _stderr().print(
                    f"error: cannot write the basis to {out} ({exc.strerror or exc}); release "
                    f"{handle.id} is paid for: dpss releases show {handle.id} --out OTHER.npy",
                    markup=False,
                )
                raise typer.Exit(int(ExitCode.ERROR)) from None
            if not as_json:
                _stderr().print(
                    f"basis ({basis.shape[0]} x {basis.shape[1]}) written to {out}", markup=False
                )
    except WaitTimeoutError as error:
        detail = f"{error.detail}; it keeps running: dpss releases show {handle.id} --wait"
        if as_json:
            # One document on stdout, as for every error, with the release a script needs.
            _print_json({"error": error.code, "detail": detail, "release": _dump(handle.info)})
            _stderr().print(f"error [{error.code}] {detail}", markup=False)
            raise typer.Exit(int(ExitCode.TIMEOUT)) from None
        raise WaitTimeoutError(error.code, detail) from None


@releases_app.command("create")
def releases_create(
    dataset_id: Annotated[str, typer.Argument(help="Dataset id.")],
    mechanism: Annotated[str, typer.Option("--mechanism", help="See `dpss mechanisms`.")],
    k: Annotated[int, typer.Option("--k", min=1, help="Dimension of the released subspace.")],
    epsilon: Annotated[
        str | None,
        typer.Option(
            "--epsilon",
            help="Epsilon, e.g. 0.5 (basic: charged; else the single release calibrated to).",
        ),
    ] = None,
    delta: Annotated[
        str | None,
        typer.Option(
            "--delta",
            help="Delta, e.g. 1e-6 (0: pure DP). Omitted with --epsilon: min(1e-6, "
            "delta_total/100), and under a grant at most its delta/100.",
        ),
    ] = None,
    mu: Annotated[
        str | None, typer.Option("--mu", help="gaussian and hybrid datasets: the release's mu.")
    ] = None,
    rho: Annotated[
        str | None,
        typer.Option(
            "--rho", help="zcdp and hybrid datasets: the release's rho (with --delta if needed)."
        ),
    ] = None,
    param: Annotated[
        list[str] | None,
        typer.Option("--param", help="Mechanism parameter key=value (repeatable)."),
    ] = None,
    wait: Annotated[
        bool, typer.Option("--wait", help="Wait for the release to finish (progress on stderr).")
    ] = False,
    out: OutOption = None,
    timeout: TimeoutOption = None,
    idempotency_key: Annotated[
        str | None,
        typer.Option("--idempotency-key", help="Reuse to retry a request without a second charge."),
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Preview only: show the cost, whether the budget covers it and the noise "
            "scales; charge nothing.",
        ),
    ] = False,
    url: UrlOption = DEFAULT_URL,
    api_key: ApiKeyOption = None,
    as_json: JsonOption = False,
) -> None:
    """Request a release of DATASET_ID (analyst key). The cost is charged when it is queued."""
    params = parse_params(param or [])
    if dry_run and (wait or out is not None or idempotency_key is not None):
        raise typer.BadParameter(
            "a dry run creates nothing to wait for, save or retry; drop --wait, --out and "
            "--idempotency-key",
            param_hint="--dry-run",
        )
    with _service_errors(as_json), _client(url, api_key) as client:
        if dry_run:
            try:
                shown = client.preview_release(
                    dataset_id, mechanism, k, epsilon, delta, mu=mu, rho=rho, **params
                )
            except (ValueError, TypeError) as exc:
                raise typer.BadParameter(str(exc)) from exc
            if as_json:
                _print_json(_dump(shown))
            else:
                console = _stdout()
                console.print(_kv_table("preview (nothing charged)", _preview_rows(shown)))
                for line in shown.meaning:
                    console.print(f"- {line}", markup=False)
                if shown.recommended_accounting not in (None, shown.accounting):
                    console.print(
                        f"- recommended accounting {shown.recommended_accounting}: "
                        f"{shown.recommendation_reason}",
                        markup=False,
                    )
                for warning in shown.warnings:
                    console.print(
                        f"warning: {warning.message} Use {warning.better_mechanism} "
                        f"(see {warning.docs}).",
                        markup=False,
                    )
            return
        if out is not None:
            # Refuse before anything is charged when the result could not be saved anyway.
            known = {m.name: m for m in client.mechanisms()}
            if mechanism in known and not known[mechanism].releases_basis:
                raise typer.BadParameter(
                    f"mechanism {mechanism} releases no basis to write", param_hint="--out"
                )
        try:
            handle = client.release(
                dataset_id,
                mechanism,
                k,
                epsilon,
                delta,
                mu=mu,
                rho=rho,
                idempotency_key=idempotency_key,
                **params,
            )
        except (ValueError, TypeError) as exc:
            raise typer.BadParameter(str(exc)) from exc
        _finish(handle, wait=wait or out is not None, out=out, timeout=timeout, as_json=as_json)


@releases_app.command("show")
def releases_show(
    release_id: Annotated[str, typer.Argument(help="Release id.")],
    wait: Annotated[bool, typer.Option("--wait", help="Wait for the release to finish.")] = False,
    out: OutOption = None,
    timeout: TimeoutOption = None,
    url: UrlOption = DEFAULT_URL,
    api_key: ApiKeyOption = None,
    as_json: JsonOption = False,
) -> None:
    """Show a release. With --wait (or --out) wait for it and exit as `releases create --wait`."""
    with _service_errors(as_json), _client(url, api_key) as client:
        handle = client.get_release(release_id)
        _finish(handle, wait=wait or out is not None, out=out, timeout=timeout, as_json=as_json)


def _when(text: str | None, option: str) -> datetime | None:
    """An ISO 8601 time; one without a zone is taken as UTC (the service's zone)."""
    if text is None:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise typer.BadParameter(
            "an ISO 8601 time such as 2026-01-31 or 2026-01-31T12:00:00Z", param_hint=option
        ) from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


@releases_app.command("list")
def releases_list(
    dataset: Annotated[
        str | None, typer.Option("--dataset", help="Only releases of this dataset id.")
    ] = None,
    status: Annotated[
        str | None,
        typer.Option(
            "--status", help="queued, running, succeeded, no_result or failed (as you see it)."
        ),
    ] = None,
    mechanism: Annotated[
        str | None, typer.Option("--mechanism", help="Only releases of this mechanism.")
    ] = None,
    since: Annotated[
        str | None,
        typer.Option("--since", help="Created after this ISO 8601 time (UTC unless zoned)."),
    ] = None,
    until: Annotated[
        str | None,
        typer.Option("--until", help="Created before this ISO 8601 time (UTC unless zoned)."),
    ] = None,
    limit: Annotated[
        int | None,
        typer.Option("--limit", min=1, max=200, help="One page of at most this many releases."),
    ] = None,
    cursor: Annotated[
        str | None, typer.Option("--cursor", help="Continue after a page (its `next`).")
    ] = None,
    url: UrlOption = DEFAULT_URL,
    api_key: ApiKeyOption = None,
    as_json: JsonOption = False,
) -> None:
    """List release history, newest first: an analyst key its own releases, an owner key those
    of its datasets. Without --limit, follows every page."""
    statuses = _release_statuses()
    if status is not None and status not in statuses:
        raise typer.BadParameter(f"one of {', '.join(statuses)}", param_hint="--status")
    filters: dict[str, Any] = {
        "dataset_id": dataset,
        "status": status,
        "mechanism": mechanism,
        "created_after": _when(since, "--since"),
        "created_before": _when(until, "--until"),
    }
    with _service_errors(as_json), _client(url, api_key) as client:
        if limit is not None or cursor is not None:
            page = client.releases_page(**filters, limit=limit, cursor=cursor)
            items, total, following = page.items, page.total, page.next
        else:
            items = list(client.list_releases(**filters))
            total, following = len(items), None
        if as_json:
            _print_json({"items": [_dump(r) for r in items], "total": total, "next": following})
            return
        table = Table(
            title=f"{len(items)} of {total} release(s)",
            title_justify="left",
            box=box.SIMPLE_HEAD,
            padding=(0, 1),
            pad_edge=False,
        )
        table.add_column("id", overflow="fold")
        table.add_column("dataset", overflow="fold")
        table.add_column("mechanism", overflow="fold")
        table.add_column("k", justify="right", overflow="fold")
        table.add_column("epsilon", justify="right", overflow="fold")
        table.add_column("delta", justify="right", overflow="fold")
        table.add_column("status", overflow="fold")
        table.add_column("created (UTC)", overflow="fold")
        for r in items:
            table.add_row(
                str(r.id),
                str(r.dataset_id)[:8],
                r.mechanism,
                str(r.k),
                _text(r.epsilon),
                _text(r.delta),
                r.status,
                r.created_at.strftime("%Y-%m-%d %H:%M"),
            )
        out = _stdout()
        out.print(table)
        if following is not None:
            out.print(f"more: --cursor {following}", markup=False, soft_wrap=True)


# --------------------------------------------------------------------------------------------
# mechanisms and audit


def mechanisms(
    url: UrlOption = DEFAULT_URL,
    api_key: ApiKeyOption = None,
    as_json: JsonOption = False,
) -> None:
    """List the mechanisms, their papers and cost rules."""
    with _service_errors(as_json), _client(url, api_key) as client:
        items = client.mechanisms()
        if as_json:
            _print_json({"items": [_dump(m) for m in items]})
            return
        table = Table(title=f"{len(items)} mechanism(s)", title_justify="left", box=box.SIMPLE_HEAD)
        table.add_column("name", overflow="fold", style="bold")
        table.add_column("title", overflow="fold")
        table.add_column("cost", overflow="fold")
        table.add_column("pure DP", justify="center", overflow="fold")
        table.add_column("basis", justify="center", overflow="fold")
        table.add_column("params", overflow="fold")
        for m in items:
            props = m.params_schema.get("properties", {})
            table.add_row(
                m.name,
                m.title,
                m.cost_rule,
                "yes" if m.allows_pure_dp else "no",
                "yes" if m.releases_basis else "no",
                ", ".join(props) if isinstance(props, dict) else "",
            )
        _stdout().print(table)


def audit_list(
    after: Annotated[
        int | None, typer.Option("--after", min=0, help="Only events with seq > AFTER.")
    ] = None,
    limit: Annotated[
        int | None, typer.Option("--limit", min=1, help="At most this many events.")
    ] = None,
    url: UrlOption = DEFAULT_URL,
    api_key: ApiKeyOption = None,
    as_json: JsonOption = False,
) -> None:
    """List audit events (auditor or admin key). Without --limit, follows every page."""
    with _service_errors(as_json), _client(url, api_key) as client:
        if limit is not None:
            page = client.audit(after=after, limit=limit)
            events, next_after, total, following = (
                page.items,
                page.next_after,
                page.total,
                page.next,
            )
        else:
            # The chain's length as the service counts it (every event, not only after --after).
            total = client.audit(limit=1).total
            events, next_after, following = list(client.audit_events(after=after)), None, None
        if as_json:
            body = {"items": [_dump(e) for e in events], "total": total, "next": following}
            _print_json({**body, "next_after": next_after})
            return
        table = Table(
            title=f"{len(events)} audit event(s)", title_justify="left", box=box.SIMPLE_HEAD
        )
        table.add_column("seq", justify="right", overflow="fold")
        table.add_column("time (UTC)", overflow="fold")
        table.add_column("event", overflow="fold")
        table.add_column("dataset", overflow="fold")
        table.add_column("release", overflow="fold")
        table.add_column("details", overflow="fold")
        for e in events:
            table.add_row(
                str(e.seq),
                e.created_at.strftime("%Y-%m-%d %H:%M:%S"),
                e.event_type,
                str(e.dataset_id)[:8] if e.dataset_id else "",
                str(e.release_id)[:8] if e.release_id else "",
                json.dumps(e.details, sort_keys=True),
            )
        out = _stdout()
        out.print(table)
        if next_after is not None:
            out.print(f"more: --after {next_after}", markup=False)


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


# --------------------------------------------------------------------------------------------
# public priors

priors_app = typer.Typer(
    help="Public priors: bases a release is estimated inside (--param prior_id=ID).",
    no_args_is_help=True,
)


@priors_app.command("upload")
def priors_upload(
    file: Annotated[
        Path,
        typer.Argument(
            exists=True,
            dir_okay=False,
            readable=True,
            help="A .npy d x m basis with orthonormal columns, from public data only.",
        ),
    ],
    name: Annotated[str | None, typer.Option("--name", help="A label for the prior.")] = None,
    url: UrlOption = DEFAULT_URL,
    api_key: ApiKeyOption = None,
    as_json: JsonOption = False,
) -> None:
    """Upload a public prior (analyst or owner key); name it in a release with
    --param prior_id=ID. It must not be derived from any dataset's private rows."""
    import numpy as np

    with _service_errors(as_json), _client(url, api_key) as client:
        try:
            basis = np.load(file, allow_pickle=False)
        except (ValueError, OSError) as exc:
            raise typer.BadParameter(f"not a readable .npy array: {exc}") from exc
        prior = client.upload_prior(basis, name=name)
        if as_json:
            _print_json(_dump(prior))
            return
        rows = [
            ("id", str(prior.id)),
            ("name", prior.name or ""),
            ("d x m", f"{prior.d} x {prior.m}"),
            ("sha256", prior.sha256),
        ]
        _stdout().print(_kv_table("prior stored", rows))


@priors_app.command("list")
def priors_list(
    url: UrlOption = DEFAULT_URL,
    api_key: ApiKeyOption = None,
    as_json: JsonOption = False,
) -> None:
    """List the stored public priors, newest first."""
    with _service_errors(as_json), _client(url, api_key) as client:
        items = client.priors()
        if as_json:
            _print_json({"items": [_dump(p) for p in items], "total": len(items), "next": None})
            return
        table = Table(title=f"{len(items)} prior(s)", title_justify="left", box=box.SIMPLE_HEAD)
        for column in ("id", "name", "source", "d x m", "sha256"):
            table.add_column(column, overflow="fold")
        for prior in items:
            table.add_row(
                str(prior.id),
                prior.name or "",
                prior.source,
                f"{prior.d} x {prior.m}",
                prior.sha256[:16],
            )
        _stdout().print(table)


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
