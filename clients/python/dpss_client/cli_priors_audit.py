"""``dpss priors`` (public priors: upload, list), ``dpss mechanisms`` and ``dpss audit list``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

# httpx, numpy, pydantic, the schemas, the client and rich.progress are imported by the
# commands that use them, so that `dpss --help` and `dpss <command> --help` start without them
# (bench/bench_cli_startup.py).
from dpss_client.cli_common import (
    ApiKeyOption,
    JsonOption,
    UrlOption,
    _client,
    _dump,
    _fetch_and_show,
    _items_json,
    _page_json,
    _print_json,
    _service_errors,
    _stdout,
)
from dpss_client.cli_format import _kv_table, _list_table
from dpss_client.defaults import DEFAULT_URL

if TYPE_CHECKING:
    from api_schemas.mechanisms import MechanismInfo
    from api_schemas.priors import Prior


# --------------------------------------------------------------------------------------------
# mechanisms and audit


def mechanisms(
    url: UrlOption = DEFAULT_URL,
    api_key: ApiKeyOption = None,
    as_json: JsonOption = False,
) -> None:
    """List the mechanisms, their papers and cost rules."""

    def show(items: list[MechanismInfo]) -> None:
        table = _list_table(f"{len(items)} mechanism(s)")
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

    _fetch_and_show(url, api_key, as_json, lambda client: client.mechanisms(), show, _items_json)


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
            _print_json(_items_json(events, total=total, next=following, next_after=next_after))
            return
        table = _list_table(f"{len(events)} audit event(s)")
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

    def show(items: list[Prior]) -> None:
        table = _list_table(f"{len(items)} prior(s)")
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

    _fetch_and_show(url, api_key, as_json, lambda client: client.priors(), show, _page_json)
