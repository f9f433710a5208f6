"""What every remote command of ``dpss`` shares: the exit codes, the common options, the client a
command talks through (:func:`make_http_client` is the tests' seam), the consoles, and how a
service error becomes a message and an exit code (:func:`_service_errors`).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from decimal import Decimal
from enum import IntEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar, get_args

import typer

# The rich parts typer's own help draws with anyway; the rest (httpx, numpy, pydantic, the
# schemas, the client, rich.progress) is imported by the commands that use it, so that
# `dpss --help` and `dpss <command> --help` start without them (bench/bench_cli_startup.py).
from rich.console import Console
from rich.markup import escape

from dpss_client.cli_format import _figure

if TYPE_CHECKING:
    import httpx
    from pydantic import BaseModel

    from dpss_client.client import Client, DpssError
    from dpss_client.spelling import Spelling


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


class _Positional(typer.BadParameter):
    """A usage error said as it is, without "Invalid value for --dataset:" (no value of it is
    invalid: the option is the slip)."""

    def format_message(self) -> str:
        return self.message


def _positional(what: str, argument: str) -> Callable[[typer.Context, str | None], None]:
    """The callback of a hidden option a user may reach for where an id is an argument
    (``dpss budget --dataset ID``): click's bare "No such option" gave no hint."""

    def refuse(ctx: typer.Context, value: str | None) -> None:
        if value is not None:
            raise _Positional(f"the {what} id is positional: {ctx.command_path} {argument}", ctx)

    return refuse


#: ``--dataset ID`` (or ``--dataset-id``) on a command whose dataset id is its argument: a
#: refusal that says so. Hidden; eager, so it answers before the missing argument does.
DatasetAsOption = Annotated[
    str | None,
    typer.Option(
        "--dataset",
        "--dataset-id",
        hidden=True,
        is_eager=True,
        callback=_positional("dataset", "DATASET_ID"),
    ),
]
#: ``--release ID`` (or ``--release-id``) on ``releases show``: as :data:`DatasetAsOption`.
ReleaseAsOption = Annotated[
    str | None,
    typer.Option(
        "--release",
        "--release-id",
        hidden=True,
        is_eager=True,
        callback=_positional("release", "RELEASE_ID"),
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


def _items_json(items: Sequence[BaseModel], **more: Any) -> dict[str, Any]:
    """A listing's --json body: its items, then ``more`` (e.g. ``total``, ``next``) in order."""
    return {"items": [_dump(item) for item in items], **more}


def _page_json(items: Sequence[BaseModel]) -> dict[str, Any]:
    """The --json body of a listing the client has followed to its end: one page, no next."""
    return _items_json(items, total=len(items), next=None)


_Fetched = TypeVar("_Fetched")


def _fetch_and_show(
    url: str,
    api_key: str | None,
    as_json: bool,
    fetch: Callable[[Client], _Fetched],
    show: Callable[[_Fetched], None],
    as_dict: Callable[[Any], Any] = _dump,
    spelling: Spelling | None = None,
) -> None:
    """The body of a command that asks the service one thing: ``fetch`` it through a client,
    then print ``as_dict`` of it as JSON with --json, else ``show`` it (errors as every
    command's, :func:`_service_errors`, in ``spelling``: the command's options)."""
    with _service_errors(as_json, spelling), _client(url, api_key) as client:
        value = fetch(client)
        if as_json:
            _print_json(as_dict(value))
            return
        show(value)


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
    # What a pure release (delta 0) is admitted at: the 409 carries it and its message names
    # it, and the refusal printed every figure but this one.
    "epsilon_remaining_pure",
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
_REMAINING_EXTRAS = frozenset(
    (
        "epsilon_remaining",
        "epsilon_remaining_pure",
        "delta_remaining",
        "rho_remaining",
        "mu_remaining",
        "epsilon_admissible",
        "delta_admissible",
        "delta_admissible_epsilon",
    )
)


def _shown_extra(error: DpssError, extra: str) -> bool:
    """Whether stderr repeats ``extra``: epsilon_remaining_pure only where it is not
    epsilon_remaining itself (basic), so that a basic refusal does not print one figure twice."""
    if extra != "epsilon_remaining_pure":
        return True
    return getattr(error, extra, None) != getattr(error, "epsilon_remaining", None)


@contextmanager
def _service_errors(as_json: bool, spelling: Spelling | None = None) -> Iterator[None]:
    """Report a DpssError (stderr; and stdout as JSON with --json) and exit with its code.
    ``spelling``: the command's options for the API's fields (dpss_client.spelling), so that
    a refusal names ``--epsilon``, not ``"epsilon": ...``; the code and figures are the API's."""
    from api_schemas.common import canonical_decimal
    from dpss_client.client import DpssError, ServiceTimeoutError
    from dpss_client.spelling import respell_ids

    try:
        yield
    except DpssError as error:
        if isinstance(error, ServiceTimeoutError):
            error = error.with_hint(CLI_TIMEOUT_HINT)
        code = _exit_code_for(error)
        detail = spelling.respell(error.detail) if spelling is not None else error.detail
        # An id argument is named as the command's argument, not as the API's path.release_id.
        detail = respell_ids(detail)
        if as_json:
            body: dict[str, Any] = {"error": error.code, "detail": detail}
            for extra in _ERROR_EXTRAS:
                value = getattr(error, extra, None)
                if value is not None:
                    # The API's exact text ("0.0000002"), never str(Decimal)'s "2E-7".
                    exact = isinstance(value, Decimal)
                    body[extra] = canonical_decimal(value) if exact else str(value)
            _print_json(body)
        console = _stderr()
        console.print(f"[bold red]error[/bold red] {escape(f'[{error.code}]')} {escape(detail)}")
        for extra in _ERROR_EXTRAS:
            value = getattr(error, extra, None)
            if value is not None and _shown_extra(error, extra):
                shown = _figure(value) if extra in _REMAINING_EXTRAS else str(value)
                console.print(f"  {extra}: {shown}", markup=False)
        raise typer.Exit(int(code)) from None
