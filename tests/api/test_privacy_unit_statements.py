"""A person-level release's cost says per person wherever the cost is stated (outside privacy
audit of the privacy unit). Before, GET .../budget and the release_requested and
release_previewed audit events of a person-level dataset stated ``(epsilon, delta)`` with no
unit: an auditor reading the log (or an owner reading the budget) saw the same figures as a
row-level dataset's, though they protect a different neighbour. Now the budget says its
``privacy_unit``, and the release events of a person-level dataset record
``privacy_unit: person`` and ``n_units`` beside the cost."""

from __future__ import annotations

import pytest

from tests.api.test_privacy_unit_http import csv_bytes, people, upload
from tests.conftest import bearer, post_release

pytestmark = pytest.mark.release_seed(3411)


def events(client, keys, kind):
    found = client.get("/v1/audit?limit=200", headers=bearer(keys.auditor)).json()["items"]
    return [event for event in found if event["event_type"] == kind]


def test_budget_and_release_events_state_the_unit(client, keys, upload_dataset) -> None:
    ids, rows = people(30, [1, 4, 15], 5, seed=3)
    response = upload(
        client,
        keys.owner,
        "v.csv",
        csv_bytes(ids, rows),
        privacy_unit_column="patient",
        row_norm_bound="1",
    )
    assert response.status_code == 201, response.text
    person = response.json()
    row = upload_dataset(client, keys.owner, rows, row_norm_bound=1.0)
    for dataset, unit in ((person, "person"), (row, "row")):
        budget = client.get(f"/v1/datasets/{dataset['id']}/budget", headers=bearer(keys.owner))
        assert budget.json()["privacy_unit"] == unit
        shown = client.get(f"/v1/datasets/{dataset['id']}", headers=bearer(keys.analyst))
        assert shown.json()["budget"]["privacy_unit"] == unit
        request = {"mechanism": "spectrum", "k": 2, "epsilon": "0.5", "delta": "1e-8"}
        priced = client.post(
            f"/v1/datasets/{dataset['id']}/releases?dry_run=true",
            headers=bearer(keys.analyst),
            json=request,
        )
        assert priced.status_code == 200, priced.text
        post_release(client, keys.analyst, dataset["id"], **request)
    for kind in ("release_previewed", "release_requested"):
        by_dataset = {event["dataset_id"]: event["details"] for event in events(client, keys, kind)}
        assert by_dataset[person["id"]]["privacy_unit"] == "person"
        assert by_dataset[person["id"]]["n_units"] == 30
        assert "privacy_unit" not in by_dataset[row["id"]]


def test_a_grant_states_the_unit_its_share_protects(client, keys, upload_dataset) -> None:
    """A grant is a share of the dataset's budget: its figures and its grant_created event say
    per person on a person-level dataset (before: neither said any unit)."""
    ids, rows = people(12, [1, 3], 4, seed=4)
    person = upload(
        client,
        keys.owner,
        "g.csv",
        csv_bytes(ids, rows),
        privacy_unit_column="patient",
        row_norm_bound="1",
    ).json()
    row = upload_dataset(client, keys.owner, rows, row_norm_bound=1.0)
    for dataset, unit in ((person, "person"), (row, "row")):
        url = f"/v1/datasets/{dataset['id']}/grants"
        made = client.post(url, headers=bearer(keys.owner), json={"epsilon": "1", "delta": "1e-7"})
        assert made.status_code == 201, made.text
        assert made.json()["privacy_unit"] == unit
        (listed,) = client.get(url, headers=bearer(keys.owner)).json()["items"]
        assert listed["privacy_unit"] == unit
    by_dataset = {
        event["dataset_id"]: event["details"] for event in events(client, keys, "grant_created")
    }
    assert by_dataset[person["id"]]["privacy_unit"] == "person"
    assert "privacy_unit" not in by_dataset[row["id"]]
