"""The docs against the running app: every route the prose names exists with its method, and
the dry-run example quotes what the service answers.

The docs name routes in prose (``GET /v1/datasets/{id}/ledger``, ``POST
/v1/dataset-references/{id}/batches``, a bare ``/v1/audit/verification``); an outside reader
checks each against the service. A route renamed or removed in the code must not survive in
the docs (nothing else reads that prose)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from fastapi.routing import APIRoute
from starlette.routing import Route

from tests.conftest import bearer

ROOT = Path(__file__).resolve().parents[2]
PAGES = [
    ROOT / "README.md",
    ROOT / "clients/python/README.md",
    *sorted((ROOT / "docs").glob("*.md")),
]

#: ``GET /v1/...`` in prose; a path runs to the first character a path cannot hold.
_WITH_METHOD = re.compile(r"\b(GET|POST|PUT|PATCH|DELETE) `?(/[\w/{}.\-]*)")
#: A bare ``/v1/...`` path (not part of a URL or file path before it).
_BARE = re.compile(r"(?<![\w.:/])(/v1/[\w/{}\-]*)")


def _shape(path: str) -> str:
    """A path with every ``{parameter}`` one placeholder, so ``{id}`` matches ``{dataset_id}``."""
    return re.sub(r"\{[^}]*\}", "{}", path.rstrip("/.-") or "/")


def _served(client) -> set[tuple[str, str]]:
    """The OpenAPI document's operations and the app's own routes outside it (``/metrics``,
    the dashboard, the docs pages)."""
    document = client.get("/openapi.json").json()
    found = {
        (method.upper(), _shape(path))
        for path, operations in document["paths"].items()
        for method in operations
    }
    for route in client.app.routes:
        if isinstance(route, (APIRoute, Route)):
            for method in route.methods or ():
                found.add((method, _shape(route.path)))
    return found


def test_every_route_named_in_the_docs_exists(client):
    served = _served(client)
    shapes = {shape for _, shape in served}
    missing = []
    named = 0
    for page in PAGES:
        text = page.read_text()
        for method, path in _WITH_METHOD.findall(text):
            named += 1
            if (method, _shape(path.split("?")[0])) not in served:
                missing.append((page.name, method, path))
        for path in _BARE.findall(text):
            named += 1
            shape = _shape(path)
            # A bare prefix (``/v1/dataset-references/``) names the routes under it.
            if shape not in shapes and not any(s.startswith(shape + "/") for s in shapes):
                missing.append((page.name, "?", path))
    assert named > 100
    assert missing == []


def test_the_check_finds_a_route_that_is_not_served(client):
    served = _served(client)
    assert ("GET", _shape("/v1/datasets/{id}/ledger")) in served
    assert ("POST", _shape("/v1/datasets/{id}/ledger")) not in served
    assert ("GET", _shape("/v1/datasets/{id}/budgets")) not in served


def test_the_dry_run_example_of_the_service_page_is_what_the_service_answers(
    client, keys, upload_dataset
):
    """docs/service.md's dry-run example (the walkthrough's 5,000 x 20 dataset, `analyze_gauss`
    k = 3 at (0.5, 1e-6)) quotes scales that depend on public facts only (n, d, k, the budget,
    the bound): a change of calibration must change the page too (it quoted the figures from
    before the explained-variance share for a while)."""
    text = (ROOT / "docs/service.md").read_text()
    example = re.search(
        r'"scales": \{"sigma": ([\d.]+), "noise_spectral_norm": ([\d.]+), '
        r'"gap_for_error_0_1": ([\d.]+)',
        text,
    )
    assert example is not None
    rows = np.full((5000, 20), 0.01)
    dataset = upload_dataset(
        client,
        keys.owner,
        rows,
        epsilon_budget="1",
        delta_budget="1e-5",
        accounting="basic",
        row_norm_bound="1",
    )
    response = client.post(
        f"/v1/datasets/{dataset['id']}/releases?dry_run=true",
        headers=bearer(keys.analyst),
        json={"mechanism": "analyze_gauss", "k": 3, "epsilon": 0.5, "delta": 1e-6},
    )
    assert response.status_code == 200, response.text
    scales = response.json()["scales"]
    quoted = [float(value) for value in example.groups()]
    served = [scales["sigma"], scales["noise_spectral_norm"], scales["gap_for_error_0_1"]]
    # The page rounds to 5 significant digits.
    assert served == pytest.approx(quoted, rel=1e-4)
