"""DESIGN.md, "Privacy unit": the unit is stated wherever the budget is. The 409 (remaining,
``epsilon_admissible``), the dry run (remaining, ``releases_remaining``) and the ledger page
(``epsilon_after``) stated budget figures without it, while ``GET .../budget`` and the grants
said ``person``: on a person-level dataset a client reading only the refusal could not tell
that its ``epsilon_remaining`` protects people, not rows. Every response schema that states a
budget figure now carries ``privacy_unit`` (the first test enumerates them from the OpenAPI
document, so a new one must too), and each says ``person`` on a person-level dataset and
``row`` otherwise (both databases)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tests.conftest import bearer

#: A field naming one of these states a budget (a total, a spend or what remains or is
#: admitted): its schema must say what unit the figure protects.
BUDGET_FIELDS = (
    "epsilon_total",
    "epsilon_remaining",
    "epsilon_spent",
    "epsilon_after",
    "epsilon_admissible",
    "releases_remaining",
)

RELEASE = {"mechanism": "analyze_gauss", "k": 1, "epsilon": "0.4", "delta": "1e-7"}


@pytest.fixture
def settings(settings):
    # The product's default accounting: its 409s carry the most budget figures.
    return settings.model_copy(update={"default_accounting": "hybrid"})


def _pages_of(name: str, schemas: dict[str, Any]) -> list[str]:
    """The schemas listing ``name`` as their items."""
    ref = f"#/components/schemas/{name}"
    return [
        page
        for page, schema in schemas.items()
        if any(v.get("items", {}).get("$ref") == ref for v in schema.get("properties", {}).values())
    ]


def test_every_schema_stating_a_budget_states_its_unit(client):
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    # A request states no budget of the service's: only responses are checked.
    requests = {"DatasetReferenceCreate", "GrantCreate"}
    stating = {
        name
        for name, schema in schemas.items()
        if name not in requests and any(f in schema.get("properties", {}) for f in BUDGET_FIELDS)
    }
    assert {"Budget", "Grant", "BudgetExceeded", "ReleasePreview", "LedgerEntry"} <= stating

    def states_unit(name: str) -> bool:
        # Itself, or every page that lists it (a ledger entry is stated by its page).
        if "privacy_unit" in schemas[name].get("properties", {}):
            return True
        pages = _pages_of(name, schemas)
        return bool(pages) and all(states_unit(page) for page in pages)

    assert sorted(name for name in stating if not states_unit(name)) == []


def _rows(people: bool) -> tuple[np.ndarray, dict[str, str]]:
    rng = np.random.default_rng(4)
    data = rng.normal(size=(400, 3))
    data /= np.maximum(1.0, np.linalg.norm(data, axis=1, keepdims=True))
    if not people:
        return data, {}
    ids = np.repeat(np.arange(100), 4).astype(float)[:, None]
    return np.hstack([data, ids]), {"privacy_unit_column": "3"}


@pytest.mark.parametrize("people", [True, False], ids=["person", "row"])
def test_refusal_dry_run_and_ledger_state_the_unit(client, keys, upload_dataset, people):
    data, form = _rows(people)
    made = upload_dataset(
        client, keys.owner, data, epsilon_budget="1", delta_budget="1e-5",
        row_norm_bound=1.0, **form,
    )  # fmt: skip
    unit = "person" if people else "row"
    budget = client.get(f"/v1/datasets/{made['id']}/budget", headers=bearer(keys.owner)).json()
    assert budget["privacy_unit"] == unit
    path = f"/v1/datasets/{made['id']}/releases"
    dry = client.post(f"{path}?dry_run=true", headers=bearer(keys.analyst), json=RELEASE)
    assert dry.status_code == 200, dry.text
    assert dry.json()["privacy_unit"] == unit
    response = client.post(path, headers=bearer(keys.analyst), json=RELEASE)
    while response.status_code == 202:
        response = client.post(path, headers=bearer(keys.analyst), json=RELEASE)
    assert response.status_code == 409, response.text
    refusal = response.json()
    assert refusal["error"] == "budget_exceeded" and refusal["privacy_unit"] == unit
    page = client.get(f"/v1/datasets/{made['id']}/ledger", headers=bearer(keys.owner)).json()
    assert page["items"] and page["privacy_unit"] == unit
