"""``dpss grants``: share a dataset's budget with analyst keys (create, list, revoke)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated

import typer

# The rich parts typer's own help draws with anyway; the rest (httpx, numpy, pydantic, the
# schemas, the client, rich.progress) is imported by the commands that use it, so that
# `dpss --help` and `dpss <command> --help` start without them (bench/bench_cli_startup.py).
from rich.table import Table

from dpss_client.cli_common import (
    ApiKeyOption,
    DatasetAsOption,
    JsonOption,
    UrlOption,
    _fetch_and_show,
    _items_json,
    _stdout,
)
from dpss_client.cli_format import _figure, _list_table
from dpss_client.defaults import DEFAULT_URL
from dpss_client.spelling import CLI_GRANT

if TYPE_CHECKING:
    from api_schemas.grants import Grant
    from dpss_client.client import Client


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
    table = _list_table(title, caption="exact values: --json")
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


def _grant_shown(title: str) -> Callable[[Grant], None]:
    """How a command that changed one grant shows it: a one-row table titled ``title``."""
    return lambda grant: _stdout().print(_grants_table([grant], title))


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
    dataset_as_option: DatasetAsOption = None,
) -> None:
    """Grant an analyst key (or every analyst) a share of DATASET_ID's budget."""

    def create(client: Client) -> Grant:
        try:
            return client.create_grant(
                dataset_id, epsilon, delta, mu=mu, rho=rho, analyst_key_id=analyst_key_id
            )
        except (ValueError, TypeError) as exc:
            raise typer.BadParameter(str(exc)) from exc

    _fetch_and_show(
        url, api_key, as_json, create, _grant_shown("grant created"), spelling=CLI_GRANT
    )


@grants_app.command("list")
def grants_list(
    dataset_id: Annotated[str, typer.Argument(help="Dataset id.")],
    url: UrlOption = DEFAULT_URL,
    api_key: ApiKeyOption = None,
    as_json: JsonOption = False,
    dataset_as_option: DatasetAsOption = None,
) -> None:
    """List DATASET_ID's grants with what each spent and has left."""
    _fetch_and_show(
        url,
        api_key,
        as_json,
        lambda client: client.list_grants(dataset_id),
        lambda items: _stdout().print(_grants_table(items, f"{len(items)} grant(s)")),
        lambda items: _items_json(items, total=len(items)),
    )


@grants_app.command("revoke")
def grants_revoke(
    dataset_id: Annotated[str, typer.Argument(help="Dataset id.")],
    grant_id: Annotated[str, typer.Argument(help="Grant id.")],
    url: UrlOption = DEFAULT_URL,
    api_key: ApiKeyOption = None,
    as_json: JsonOption = False,
    dataset_as_option: DatasetAsOption = None,
) -> None:
    """Revoke a grant: no further charges; what it spent stays spent."""

    def revoke(client: Client) -> Grant:
        return client.revoke_grant(dataset_id, grant_id)

    _fetch_and_show(url, api_key, as_json, revoke, _grant_shown("grant revoked"))
