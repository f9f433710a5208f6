"""Budget figures for people (issue 31, item 2): 4 significant digits in the CLI and the slim
client's tables, spent rounded up and remaining down; exact values stay in --json and the API."""

from __future__ import annotations

from decimal import Decimal

import pytest
from rich.console import Console

from api_schemas.datasets import Budget
from api_schemas.figures import shown
from dpss_client.remote_cli import _budget_table

#: The issue's example: the CLI printed this figure whole, wrapped over two lines.
LONG = Decimal("0.473864190891855484302600395495")


@pytest.mark.parametrize(
    ("value", "up", "expected"),
    [
        (LONG, False, "0.4738"),
        (LONG, True, "0.4739"),
        (Decimal("0.5"), True, "0.5"),
        (Decimal("0.00001"), False, "0.00001"),
        (Decimal("0.000005"), False, "0.000005"),
        (Decimal("12345.678"), False, "12340"),
        (Decimal("12345.678"), True, "12350"),
        (Decimal("1E-30"), False, "0.000000000000000000000000000001"),
        (Decimal(0), True, "0"),
    ],
)
def test_figures_round_the_safe_way(value, up, expected):
    assert shown(value, up=up) == expected


def test_a_shown_remaining_figure_never_exceeds_the_exact_one():
    for digits in range(1, 8):
        for text in ("0.999999999", "0.123456789", "7.00000001", "0.000123456"):
            exact = Decimal(text)
            assert Decimal(shown(exact, digits=digits)) <= exact
            assert Decimal(shown(exact, up=True, digits=digits)) >= exact


def render(budget: Budget) -> str:
    console = Console(width=120, record=True)
    console.print(_budget_table(budget))
    return console.export_text()


def test_the_budget_table_prints_four_digits_and_the_delta_held_for_the_conversion():
    budget = Budget(
        accounting="zcdp",
        epsilon_total=Decimal(1),
        delta_total=Decimal("0.00001"),
        epsilon_spent=LONG,
        delta_spent=Decimal(0),
        epsilon_remaining=1 - LONG,
        delta_remaining=Decimal("0.000005"),
        rho_total=Decimal("0.0221364819"),
        rho_spent=Decimal("0.00552"),
        rho_remaining=Decimal("0.0166164819"),
        delta_conversion=Decimal("0.000005"),
        delta_reserved_for_conversion=Decimal("0.000005"),
    )
    text = render(budget)
    assert "0.4739" in text and "0.5261" in text  # spent up, remaining (0.52613...) down
    assert "4738" not in text.replace("0.4739", "")
    assert "delta held for the conversion" in text and "0.000005" in text
    assert "0.02213" in text and "0.01661" in text
    assert "docs/mechanisms.md#reading-a-budget" in text


def test_rho_and_mu_are_explained_in_one_text_that_the_docs_and_the_dashboard_show():
    from pathlib import Path

    from fastapi.testclient import TestClient

    from api_schemas.figures import READING_A_BUDGET
    from service.api.dashboard import install_dashboard

    docs = (Path(__file__).resolve().parents[1] / "docs" / "mechanisms.md").read_text()
    section = docs.split("## Reading a budget", 1)[1].split("\n## ", 1)[0]
    flat = " ".join(section.split())
    for heading, text in READING_A_BUDGET:
        assert f"**{heading}.** {text}" in flat, heading
    from fastapi import FastAPI

    app = FastAPI()
    install_dashboard(app)
    with TestClient(app) as client:
        page = client.get("/dashboard/reading-a-budget")
        assert page.status_code == 200
        for heading, _ in READING_A_BUDGET:
            assert heading in page.text
        # Every screen links to it.
        for view in ("", "/owner", "/analyst", "/auditor", "/admin"):
            assert 'href="/dashboard/reading-a-budget"' in client.get(f"/dashboard{view}").text


def test_the_dashboard_states_figures_to_the_cli_s_significant_digits():
    # An audit found the dashboard at 6 significant digits while the CLI and the slim client
    # print 4 (api_schemas.figures.SIGNIFICANT) and "Reading a budget", which every dashboard
    # page links to, said "Tables print 4": one figure, two ways of stating it. The page now
    # carries the CLI's digits and the script reads them from there, with no number of its own.
    import re
    from pathlib import Path

    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from api_schemas.figures import READING_A_BUDGET, SIGNIFICANT
    from service.api.dashboard import install_dashboard, static_dir

    app = FastAPI()
    install_dashboard(app)
    with TestClient(app) as client:
        for view in ("", "/owner", "/analyst", "/auditor", "/admin", "/reading-a-budget"):
            body = re.search(r"<body [^>]*>", client.get(f"/dashboard{view}").text)
            assert body is not None and f'data-significant="{SIGNIFICANT}"' in body[0], view
    script = (Path(static_dir()) / "dashboard.js").read_text()
    assert re.search(r"const DIGITS = \d", script) is None
    assert "document.body.dataset.significant" in script
    (figures,) = [text for heading, text in READING_A_BUDGET if heading == "Figures for people"]
    assert f"print {SIGNIFICANT} significant digits" in figures and "dashboard" in figures
