"""How the remote commands render what the service answers: values, figures, budgets and the
key/value tables of a dataset, a preview and a release.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import TYPE_CHECKING, Any

# The rich parts typer's own help draws with anyway; the rest (httpx, numpy, pydantic, the
# schemas, the client, rich.progress) is imported by the commands that use it, so that
# `dpss --help` and `dpss <command> --help` start without them (bench/bench_cli_startup.py).
from rich import box
from rich.table import Table

if TYPE_CHECKING:
    from api_schemas.datasets import Budget, Dataset
    from api_schemas.releases import Release, ReleasePreview


# --------------------------------------------------------------------------------------------
# Rendering


def _text(value: Any) -> str:
    """A table cell: budgets in the JSON's plain notation (never "1E-7"), the rest as ``str``."""
    from api_schemas.common import format_budget

    if value is None:
        return ""
    if isinstance(value, bool):
        # As the JSON and the release's extras write it (`false`), not Python's `False`.
        return "true" if value else "false"
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


def _list_table(title: str, **options: Any) -> Table:
    """The table a listing command draws its rows in (left title, a rule under the header)."""
    return Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, **options)


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
    pure = budget.epsilon_remaining_pure
    if pure is not None and budget.accounting in ("zcdp", "hybrid"):
        # epsilon_remaining there is a Gaussian release's figure at delta_total; a pure one
        # (delta 0) is admitted at another (hybrid: up to the whole epsilon while its basic
        # filter holds).
        table.add_row("epsilon, pure release (delta 0)", "-", "-", _figure(pure))
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
        # Without a bound every release is refused until it sends its own public clip norm:
        # an empty cell said nothing of that.
        (
            "row_norm_bound",
            "none: each release must send --param clip_norm=C (a public bound)"
            if ds.row_norm_bound is None
            else ds.row_norm_bound,
        ),
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


def _request_rows(info: ReleasePreview | Release) -> list[tuple[str, Any]]:
    """What a release (or its preview) asked for: its dataset, mechanism, k, cost and params."""
    return [
        ("dataset_id", info.dataset_id),
        ("mechanism", info.mechanism),
        ("k", info.k),
        ("epsilon", info.epsilon),
        ("delta", info.delta),
        ("params", json.dumps(info.params, sort_keys=True)),
    ]


def _preview_rows(info: ReleasePreview) -> list[tuple[str, Any]]:
    rows: list[tuple[str, Any]] = [
        *_request_rows(info),
        ("affordable", "yes" if info.affordable else "NO: the budget does not cover it"),
        ("epsilon_remaining", _figure(info.epsilon_remaining)),
    ]
    if info.epsilon_admissible is not None:
        # What this request IS admitted at (on hybrid epsilon_remaining is
        # what a Gaussian release at the budget's delta is admitted at).
        rows.append(("epsilon_admissible", _figure(info.epsilon_admissible)))
    if info.delta_admissible is not None and info.delta_admissible_epsilon is not None:
        # None at its delta (e.g. hybrid's delta filter spent): the same request at this delta.
        rows.append(("delta_admissible", _figure(info.delta_admissible)))
        rows.append(("delta_admissible_epsilon", _figure(info.delta_admissible_epsilon)))
    pure = info.epsilon_remaining_pure
    if pure is not None and info.accounting in ("zcdp", "hybrid"):
        # As `dpss budget` shows it: there epsilon_remaining is a Gaussian release's figure at
        # the budget's delta, and a pure release (delta 0) is admitted at this one.
        rows.append(("epsilon_remaining_pure", _figure(pure)))
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
        # null as the JSON and the release table write it (an empty cell read as a blank).
        (name, f"{value:.6g}" if isinstance(value, float) else "null" if value is None else value)
        for name, value in info.scales.items()
    ]
    return rows


def _release_rows(info: Release) -> list[tuple[str, Any]]:
    rows: list[tuple[str, Any]] = [("id", info.id), *_request_rows(info), ("status", info.status)]
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
            # A sentence (auto_reason, warning) or a name (auto_choice, centring) as text, as
            # the mechanism and status rows are: JSON's quotes and escapes only obscured it.
            text = value if isinstance(value, str) else json.dumps(value)
            rows.append((key, _text(value) if numbers else text))
    return rows
