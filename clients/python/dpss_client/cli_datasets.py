"""``dpss datasets`` (upload, register, append, list, show, delete) and ``dpss budget``."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

# httpx, numpy, pydantic, the schemas, the client and rich.progress are imported by the
# commands that use them, so that `dpss --help` and `dpss <command> --help` start without them
# (bench/bench_cli_startup.py).
from dpss_client.cli_common import (
    AllowLargeDeltaOption,
    ApiKeyOption,
    DatasetAsOption,
    JsonOption,
    TimeoutOption,
    UrlOption,
    _client,
    _dump,
    _fetch_and_show,
    _page_json,
    _print_json,
    _service_errors,
    _stderr,
    _stdout,
)
from dpss_client.cli_format import (
    _budget_table,
    _dataset_rows,
    _figure,
    _kv_table,
    _list_table,
)
from dpss_client.defaults import DEFAULT_URL
from dpss_client.spelling import CLI_UPLOAD

if TYPE_CHECKING:
    from api_schemas.datasets import Budget, Dataset
    from dpss_client.client import UploadProgress


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
    with (
        _service_errors(as_json, CLI_UPLOAD),
        _client(url, api_key) as client,
        _upload_bar() as report,
    ):
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
    with _service_errors(as_json, CLI_UPLOAD), _client(url, api_key) as client:
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
    dataset_as_option: DatasetAsOption = None,
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

    def show(items: list[Dataset]) -> None:
        table = _list_table(f"{len(items)} dataset(s)")
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

    _fetch_and_show(url, api_key, as_json, lambda client: client.datasets(), show, _page_json)


@datasets_app.command("show")
def datasets_show(
    dataset_id: Annotated[str, typer.Argument(help="Dataset id.")],
    url: UrlOption = DEFAULT_URL,
    api_key: ApiKeyOption = None,
    as_json: JsonOption = False,
    dataset_as_option: DatasetAsOption = None,
) -> None:
    """Show one dataset's metadata and budget."""

    def show(ds: Dataset) -> None:
        out = _stdout()
        out.print(_kv_table("dataset", _dataset_rows(ds)))
        out.print(_budget_table(ds.budget))

    _fetch_and_show(url, api_key, as_json, lambda client: client.dataset(dataset_id), show)


@datasets_app.command("delete")
def datasets_delete(
    dataset_id: Annotated[str, typer.Argument(help="Dataset id.")],
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask for confirmation.")] = False,
    url: UrlOption = DEFAULT_URL,
    api_key: ApiKeyOption = None,
    as_json: JsonOption = False,
    dataset_as_option: DatasetAsOption = None,
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
    dataset_as_option: DatasetAsOption = None,
) -> None:
    """Show a dataset's privacy budget: total, spent and remaining (exact decimals)."""

    def show(b: Budget) -> None:
        out = _stdout()
        out.print(f"dataset {dataset_id}", markup=False)
        out.print(_budget_table(b))

    _fetch_and_show(url, api_key, as_json, lambda client: client.budget(dataset_id), show)
