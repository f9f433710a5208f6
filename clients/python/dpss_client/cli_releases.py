"""``dpss releases``: request a private release and wait for it (create), show and list them."""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

# httpx, numpy, pydantic, the schemas, the client and rich.progress are imported by the
# commands that use them, so that `dpss --help` and `dpss <command> --help` start without them
# (bench/bench_cli_startup.py).
from dpss_client.cli_common import (
    ApiKeyOption,
    DatasetAsOption,
    ExitCode,
    JsonOption,
    OutOption,
    ReleaseAsOption,
    TimeoutOption,
    UrlOption,
    _client,
    _dump,
    _exit_code_for,
    _print_json,
    _release_statuses,
    _service_errors,
    _stderr,
    _stdout,
)
from dpss_client.cli_format import _kv_table, _list_table, _preview_rows, _release_rows, _text
from dpss_client.defaults import DEFAULT_MECHANISM, DEFAULT_URL
from dpss_client.spelling import CLI_RELEASE

if TYPE_CHECKING:
    from dpss_client.client import DpssError, ReleaseHandle


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


@contextmanager
def _defaulted_mechanism(asked: str | None, sent: str) -> Iterator[None]:
    """:func:`dpss_client.client.defaulted_mechanism` with the CLI's hint (its options'
    names)."""
    from dpss_client.client import defaulted_mechanism

    with defaulted_mechanism(
        asked,
        f" (no --mechanism was given, so {sent}, the default, was sent: it takes only the "
        "fields listed; pass --mechanism analyze_gauss to set this one)",
    ):
        yield


@releases_app.command("create")
def releases_create(
    ctx: typer.Context,
    dataset_id: Annotated[str, typer.Argument(help="Dataset id.")],
    k: Annotated[int, typer.Option("--k", min=1, help="Dimension of the released subspace.")],
    mechanism: Annotated[
        str,
        typer.Option(
            "--mechanism",
            help="See `dpss mechanisms`. The default, auto, is the API's advice when unsure: "
            "the service chooses from public facts and a private estimate, and says what it "
            "chose and why (auto_choice, auto_reason). It releases the subspace of X^T X; "
            "for PCA add --param center=private.",
        ),
    ] = DEFAULT_MECHANISM,
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
    dataset_as_option: DatasetAsOption = None,
) -> None:
    """Request a release of DATASET_ID (analyst key). The cost is charged when it is queued."""
    params = parse_params(param or [])
    if dry_run and (wait or out is not None or idempotency_key is not None):
        raise typer.BadParameter(
            "a dry run creates nothing to wait for, save or retry; drop --wait, --out and "
            "--idempotency-key",
            param_hint="--dry-run",
        )
    # Whether --mechanism was given, so that a refusal can say the default was sent.
    # (By name: typer may carry its own copy of click's ParameterSource.)
    source = ctx.get_parameter_source("mechanism")
    defaulted = source is not None and source.name == "DEFAULT"
    with (
        _service_errors(as_json, CLI_RELEASE),
        _defaulted_mechanism(None if defaulted else mechanism, mechanism),
        _client(url, api_key) as client,
    ):
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
                    # In the command's spelling: "--param center=private", not JSON.
                    console.print(f"- {CLI_RELEASE.respell(line)}", markup=False)
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
    release_as_option: ReleaseAsOption = None,
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
        table = _list_table(f"{len(items)} of {total} release(s)", padding=(0, 1), pad_edge=False)
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
