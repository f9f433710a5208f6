"""A read's database cost does not grow with the ledger or with the page.

Budgets used to be summed in Python from every ledger row of the dataset, once per dataset of a
page: each read fetched O(ledger) rows and a list page ran one query per dataset, so every
release made every later read slower. Counted here with an SQLAlchemy event, not timed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from decimal import Decimal
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, event

from service.config import Settings
from tests.conftest import Keys, bearer, post_release

DATA = np.random.default_rng(3).normal(size=(30, 4)) * 0.1
RELEASE = {"mechanism": "analyze_gauss", "k": 1, "epsilon": "0.01", "delta": "1e-9"}


@contextmanager
def counted(engine: Engine) -> Iterator[list[tuple[str, int]]]:
    """Every statement sent while open, with the rows it returned (-1 where the driver does not
    say: SQLite's ``rowcount`` of a SELECT)."""
    seen: list[tuple[str, int]] = []

    def record(_conn: Any, cursor: Any, statement: str, *_args: Any) -> None:
        seen.append((statement, cursor.rowcount))

    event.listen(engine, "after_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine, "after_cursor_execute", record)


def cost(client: TestClient, engine: Engine, key: str, path: str) -> tuple[int, int]:
    """(statements, rows returned) of one GET."""
    with counted(engine) as seen:
        response = client.get(path, headers=bearer(key))
    assert response.status_code == 200, response.text
    return len(seen), sum(max(rows, 0) for _, rows in seen)


@pytest.fixture
def settings(settings: Settings) -> Settings:
    # Every read checks its key: the counts compare like with like whatever the key cache held.
    return settings.model_copy(update={"auth_cache_seconds": 0})


@pytest.fixture
def engine(engines: dict[str, Engine], backend: str) -> Engine:
    return engines[backend]


def test_read_cost_is_independent_of_ledger_size_and_page_size(
    client: TestClient,
    engine: Engine,
    backend: str,
    keys: Keys,
    upload_dataset: Callable[..., dict[str, Any]],
) -> None:
    first = upload_dataset(client, keys.owner, DATA, row_norm_bound="1")["id"]
    post_release(client, keys.analyst, first, **RELEASE)
    reads = [
        f"/v1/datasets/{first}/budget",
        f"/v1/datasets/{first}",
        "/v1/datasets?limit=20",
    ]
    before = {path: cost(client, engine, keys.analyst, path) for path in reads}

    for _ in range(12):
        post_release(client, keys.analyst, first, **RELEASE)
    for _ in range(2):
        upload_dataset(client, keys.owner, DATA, row_norm_bound="1")
    after = {path: cost(client, engine, keys.analyst, path) for path in reads}

    for path in reads:
        # Same number of statements with 13x the ledger rows and 3x the datasets on the page.
        assert after[path][0] == before[path][0], (path, before[path], after[path])
        if backend == "postgresql":
            # The database sums: the ledger's rows never come back. The list page has two more
            # datasets: each brings its row and its budget's one row from the ledger's single
            # budget statement (ledger.budget_select; zeros when it has no entries).
            grown = 4 if path.startswith("/v1/datasets?") else 0
            assert after[path][1] == before[path][1] + grown, (path, before[path], after[path])

    budget = client.get(f"/v1/datasets/{first}/budget", headers=bearer(keys.analyst)).json()
    assert Decimal(budget["epsilon_spent"]) == Decimal("0.13")
    assert Decimal(budget["delta_spent"]) == Decimal("13e-9")
    assert Decimal(budget["epsilon_remaining"]) == Decimal(10) - Decimal("0.13")
    listed = client.get("/v1/datasets?limit=20", headers=bearer(keys.analyst)).json()["items"]
    spent = {item["id"]: Decimal(item["budget"]["epsilon_spent"]) for item in listed}
    assert spent[first] == Decimal("0.13")
    assert sorted(spent.values()) == [0, 0, Decimal("0.13")]
