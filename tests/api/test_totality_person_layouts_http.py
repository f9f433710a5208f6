"""Totality of the person-level paths on extreme *layouts of people* (outside audit of the
privacy unit), through the real app and worker, under every accounting: every row one person,
every row its own person, one person with most rows, float identifiers at the edges of their
range (0.0 and -0.0, 5e-324, +-1e300, beyond 2**53), one feature column, two rows; and a
continual release whose later batch brings back the upload's people with extreme rows (their
bound already partly used). The rows are extreme as in test_totality_combinations_http.py.

Every dry run answers 200 or 422 (never 500); every request is accepted (202) or refused with
422 charging nothing; every accepted release ends ``succeeded`` or ``no_result`` (a continual
one ``running`` between batches), never ``failed``.
"""

from __future__ import annotations

import numpy as np
import pytest

from service.accounting import ACCOUNTINGS
from service.mechanisms.registry import MECHANISMS
from tests.api.test_append_rows import append
from tests.conftest import bearer, fetch_release, npy_bytes

PARAMS = {"continual_gauss": {"horizon": 2}, "histogram_aggregate": {"gamma": 0.5}}


def extreme(seed: int, n: int, d: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    scales = np.array([1e-300, 1e300, -1.7e308 / 4, 1.0])[:d] if d > 1 else np.array([1e300])
    rows = rng.standard_normal((n, d)) * scales
    if d > 1:
        rows[:, -1] = 7.0  # a constant column
    if n > 6:
        rows[2 : n // 3] = rows[1]  # one huge row repeated
        rows[n // 3 : n // 3 + 5] = 0.0
        rows[-4:] = 5e-324
    assert np.all(np.isfinite(rows))
    return rows


FLOAT_IDS = [0.0, -0.0, 5e-324, 1e300, -1e300, 12345678901234567.0, 2.0**53, 7.5, -3.0]


def layout(name: str, n: int) -> np.ndarray:
    """The person of each row (float identifiers, written into a .npy beside the features)."""
    if name == "one_person":
        return np.zeros(n)
    if name == "own_row":
        return np.arange(n, dtype=np.float64)
    if name == "heavy":
        ids = np.arange(n, dtype=np.float64)
        ids[: n // 2] = 1e15  # one person with half the rows
        return ids
    if name == "float_edges":
        return np.resize(np.array(FLOAT_IDS), n)
    raise AssertionError(name)


SHAPES = {"n400_d4": (400, 4), "n60_d4": (60, 4), "n60_d1": (60, 1), "n2_d3": (2, 3)}
LAYOUTS = ["one_person", "own_row", "heavy", "float_edges"]


def upload(client, keys, accounting: str, ids: np.ndarray, rows: np.ndarray) -> str:
    response = client.post(
        "/v1/datasets",
        headers=bearer(keys.owner),
        files={"file": ("p.npy", npy_bytes(np.column_stack([ids, rows])), "application/x")},
        data={"name": "people", "epsilon_budget": "1000", "delta_budget": "0.5",
              "allow_large_delta": "true", "row_norm_bound": "1", "privacy_unit_column": "0",
              "accounting": accounting},
    )  # fmt: skip
    assert response.status_code == 201, response.text
    assert response.json()["privacy_unit"] == "person"
    return str(response.json()["id"])


def spent(client, keys, dataset_id: str) -> str:
    budget = client.get(f"/v1/datasets/{dataset_id}/budget", headers=bearer(keys.owner)).json()
    return str(budget["epsilon_spent"])


def body(mechanism: str, k: int) -> dict:
    return {
        "mechanism": mechanism,
        "k": k,
        "epsilon": "1" if mechanism == "smooth_sensitivity" else "5",
        "delta": "1e-5",
        "params": dict(PARAMS.get(mechanism, {})),
    }


def request(client, keys, dataset_id: str, mechanism: str, k: int, tally: dict) -> str | None:
    url = f"/v1/datasets/{dataset_id}/releases"
    dry = client.post(url, headers=bearer(keys.analyst), json=body(mechanism, k),
                      params={"dry_run": "true"})  # fmt: skip
    assert dry.status_code in {200, 422}, (mechanism, dry.status_code, dry.text)
    tally["dry_runs"] += 1
    before = spent(client, keys, dataset_id)
    response = client.post(url, headers=bearer(keys.analyst), json=body(mechanism, k))
    tally["requests"] += 1
    if response.status_code == 422:
        assert spent(client, keys, dataset_id) == before, (mechanism, response.text)
        tally["refused"] += 1
        return None
    assert response.status_code == 202, (mechanism, response.status_code, response.text)
    return str(response.json()["id"])


@pytest.mark.parametrize("accounting", ACCOUNTINGS)
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("people", LAYOUTS)
def test_every_mechanism_is_total_on_extreme_layouts_of_people(
    client, keys, run_worker, accounting, shape, people
) -> None:
    n, d = SHAPES[shape]
    rows = extreme(1, n, d)
    ids = layout(people, n)
    dataset_id = upload(client, keys, accounting, ids, rows)
    shown = client.get(f"/v1/datasets/{dataset_id}", headers=bearer(keys.analyst)).json()
    # 0.0 and -0.0 are one person; the other float identifiers are eight more.
    expected_people = {"one_person": 1, "own_row": n, "heavy": n - n // 2 + 1}
    assert shown["n_units"] == expected_people.get(people, min(n, 9) - 1), shown
    assert all(repr(v) not in str(shown) for v in FLOAT_IDS if abs(v) > 10), shown
    tally = {"dry_runs": 0, "requests": 0, "refused": 0}
    outcomes: dict[str, str] = {}
    for mechanism in sorted(MECHANISMS):
        release_id = request(client, keys, dataset_id, mechanism, 1, tally)
        if release_id is None:
            outcomes[mechanism] = "refused"
            continue
        assert run_worker() == 1
        shown = fetch_release(client, keys.owner, release_id)
        expected = {"succeeded", "no_result"} | (
            {"running"} if mechanism == "continual_gauss" else set()
        )
        assert shown["status"] in expected, (mechanism, shown)
        outcomes[mechanism] = shown["status"]
        if mechanism == "continual_gauss":
            # The same people return in the later batch, with extreme rows.
            batch = np.column_stack([ids, extreme(2, n, d)])
            grown = append(client, keys.owner, dataset_id, npy_bytes(batch),
                           privacy_unit_column="0")  # fmt: skip
            assert grown.status_code == 201, grown.text
            assert run_worker() == 1
            shown = fetch_release(client, keys.owner, release_id)
            assert shown["status"] in {"succeeded", "no_result"}, (mechanism, shown)
            assert shown["epochs_done"] == 2
    ran = {mechanism for mechanism, outcome in outcomes.items() if outcome != "refused"}
    assert {"analyze_gauss", "spectrum"} <= ran, outcomes
    if shape == "n400_d4" and people in {"own_row", "heavy"} and accounting != "gaussian":
        # Enough people for the partitions of people: those paths ran too (a GDP filter
        # admits only Gaussian mechanisms).
        assert {"friendly_aggregate", "histogram_aggregate"} <= ran, outcomes
    assert tally["requests"] == len(MECHANISMS)
