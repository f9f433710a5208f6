"""Continual releases under the default (hybrid) accounting, cases the other files do not name:
the charge and the stated noise against the calibration for several horizons, appends of extreme,
empty, misshapen and past-the-horizon batches (never ``failed`` for the data), and the
determinism of an epoch recomputed after a restart."""

from __future__ import annotations

import uuid
from decimal import Decimal

import numpy as np
import pytest
from sqlalchemy import func, select

from service import continual
from service.db.models import LedgerEntry, Release
from service.mechanisms.base import ReleaseSpec
from service.mechanisms.continual_gauss import noise_sigma, tree_sensitivity
from service.mechanisms.registry import get_mechanism
from service.release_calibration import float_not_above
from tests.api.test_append_rows import append
from tests.api.test_privacy_unit_http import MARK, csv_bytes, people, upload
from tests.conftest import bearer, npy_bytes, post_release

D = 4
CLIP = 2.0


def _request(horizon: int, epsilon: str = "0.5") -> dict[str, object]:
    return {
        "mechanism": "continual_gauss", "k": 2, "epsilon": epsilon, "delta": "1e-7",
        "params": {"horizon": horizon, "clip_norm": CLIP},
    }  # fmt: skip


@pytest.mark.parametrize("horizon", [1, 3, 5, 6, 12, 33, 64])
def test_hybrid_dry_run_states_the_calibrated_sigma_and_one_charge(
    client, keys, upload_dataset, rng, horizon
):
    dataset = upload_dataset(
        client, keys.owner, rng.normal(size=(50, D)), row_norm_bound=3, accounting="hybrid"
    )
    assert dataset["budget"]["accounting"] == "hybrid"
    url = f"/v1/datasets/{dataset['id']}/releases"
    dry = client.post(url + "?dry_run=true", headers=bearer(keys.analyst), json=_request(horizon))
    assert dry.status_code == 200, dry.text
    body = dry.json()
    expected = noise_sigma(CLIP, 0.5, 1e-7, horizon)
    stated = body["scales"]["sigma"]
    assert stated == pytest.approx(expected, rel=1e-12)
    assert body["scales"]["levels"] == horizon.bit_length()
    mu = tree_sensitivity(CLIP, horizon) / expected
    assert Decimal(body["mu"]) == pytest.approx(Decimal(str(mu)), rel=Decimal("1e-9"))
    real = client.post(url, headers=bearer(keys.analyst), json=_request(horizon))
    assert real.status_code == 202, real.text
    after = client.get(f"/v1/datasets/{dataset['id']}/budget", headers=bearer(keys.owner)).json()
    # One Gaussian step with mu = Delta / sigma: the whole horizon, once.
    assert Decimal(after["mu_spent"]) == pytest.approx(Decimal(str(mu)), rel=Decimal("1e-9"))


def test_extreme_empty_misshapen_and_late_appends_never_fail_the_release(
    client, keys, upload_dataset, rng, run_worker, session_factory
):
    dataset = upload_dataset(
        client, keys.owner, rng.normal(size=(20, D)), row_norm_bound=3, accounting="hybrid"
    )
    release_id = post_release(client, keys.analyst, dataset["id"], **_request(5))
    # A batch of another width is refused naming the file, and changes nothing.
    wrong = append(client, keys.owner, dataset["id"], npy_bytes(rng.normal(size=(3, D + 1))))
    assert wrong.status_code == 422, wrong.text
    assert wrong.json()["detail"].startswith("file:") and "columns" in wrong.text
    batches = [
        np.full((4, D), 1e300),
        np.full((4, D), 1e-300),
        np.vstack([np.full((2, D), -1e300), np.full((2, D), 1e300)]),
        np.zeros((3, D)),
        rng.normal(size=(5, D)),  # the sixth batch: past the horizon of 5, never read
    ]
    statuses = []
    for batch in batches:
        response = append(client, keys.owner, dataset["id"], npy_bytes(batch))
        statuses.append(response.status_code)
    assert statuses == [201] * 5, statuses
    assert run_worker() == 1
    body = client.get(f"/v1/releases/{release_id}", headers=bearer(keys.owner)).json()
    assert body["status"] == "succeeded", body.get("reason")
    assert body["epochs_done"] == 5
    assert [e["batch_seq"] for e in body["epochs"]] == [0, 1, 2, 3, 4]
    for epoch in body["epochs"]:
        assert epoch["n_rows_read"] > 0
    basis = np.asarray(body["latest_epoch"]["basis"])
    assert np.all(np.isfinite(basis))
    assert run_worker() == 0
    with session_factory() as session:
        assert session.execute(select(func.count()).select_from(LedgerEntry)).scalar_one() == 1


def test_an_append_of_no_rows_is_refused_naming_the_file(
    client, keys, upload_dataset, rng, run_worker
):
    dataset = upload_dataset(
        client, keys.owner, rng.normal(size=(20, D)), row_norm_bound=3, accounting="hybrid"
    )
    release_id = post_release(client, keys.analyst, dataset["id"], **_request(3))
    empty = append(client, keys.owner, dataset["id"], npy_bytes(np.zeros((0, D))))
    # Refused naming the file, changing nothing: no empty leaf, no epoch for it.
    assert empty.status_code == 422 and empty.json()["detail"].startswith("file:"), empty.text
    run_worker()
    body = client.get(f"/v1/releases/{release_id}", headers=bearer(keys.owner)).json()
    assert body["status"] == "running", body.get("reason")
    assert body["epochs_done"] == 1


@pytest.mark.parametrize("horizon", [3, 64])
def test_a_refused_continual_request_names_an_epsilon_that_is_admitted(
    client, keys, upload_dataset, rng, horizon
):
    dataset = upload_dataset(
        client, keys.owner, rng.normal(size=(50, D)), row_norm_bound=3, accounting="hybrid",
        epsilon_budget="1", delta_budget="1e-6",
    )  # fmt: skip
    url = f"/v1/datasets/{dataset['id']}/releases"
    first = client.post(url, headers=bearer(keys.analyst), json=_request(horizon, "0.9"))
    assert first.status_code == 202, first.text
    dry = client.post(
        url + "?dry_run=true", headers=bearer(keys.analyst), json=_request(horizon, "0.9")
    )
    assert dry.status_code == 200 and dry.json()["affordable"] is False, dry.text
    refused = client.post(url, headers=bearer(keys.analyst), json=_request(horizon, "0.9"))
    assert refused.status_code == 409, refused.text
    admissible = dry.json()["epsilon_admissible"]
    assert admissible is not None and refused.json()["epsilon_admissible"] == admissible
    assert Decimal(admissible) < Decimal("0.9")
    before = client.get(f"/v1/datasets/{dataset['id']}/budget", headers=bearer(keys.owner)).json()
    # Asking a little more is refused; asking the figure is admitted, and spends what it said.
    above = str(Decimal(admissible) * Decimal("1.01"))
    more = client.post(url, headers=bearer(keys.analyst), json=_request(horizon, above))
    assert more.status_code == 409, more.text
    asked = client.post(url, headers=bearer(keys.analyst), json=_request(horizon, admissible))
    assert asked.status_code == 202, asked.text
    after = client.get(f"/v1/datasets/{dataset['id']}/budget", headers=bearer(keys.owner)).json()
    assert Decimal(after["mu_spent"]) > Decimal(before["mu_spent"])


def test_person_level_extreme_batches_under_hybrid_end_succeeded(client, keys, run_worker):

    ids, rows = people(30, [1, 3, 7], D, seed=5)
    response = upload(
        client, keys.owner, "visits.csv", csv_bytes(ids, rows), privacy_unit_column="patient",
        row_norm_bound="1", accounting="hybrid",
    )  # fmt: skip
    assert response.status_code == 201, response.text
    dataset = response.json()
    request = {**_request(4), "params": {"horizon": 4}}
    release_id = post_release(client, keys.analyst, dataset["id"], **request)
    batches = [
        ([ids[0]] * 3 + [f"{MARK}-huge"] * 2, np.full((5, D), 1e300)),
        ([ids[1]] * 2 + [f"{MARK}-tiny"] * 2, np.full((4, D), -1e-300)),
        ([ids[0]] * 4, np.vstack([np.full((2, D), 1e300), np.zeros((2, D))])),
        ([ids[2]] * 2, rows[:2]),  # past the horizon of 4: never read
    ]
    for batch_ids, batch in batches:
        appended = append(
            client, keys.owner, dataset["id"], csv_bytes(batch_ids, batch), filename="more.csv",
            privacy_unit_column="patient",
        )  # fmt: skip
        assert appended.status_code == 201, appended.text
    assert run_worker() == 1
    shown = client.get(f"/v1/releases/{release_id}", headers=bearer(keys.analyst))
    body = shown.json()
    assert body["status"] == "succeeded" and body["epochs_done"] == 4, shown.text
    assert np.all(np.isfinite(np.asarray(body["latest_epoch"]["basis"])))
    assert MARK not in shown.text


def test_an_epoch_recomputed_after_a_restart_is_the_same_epoch(
    client, keys, store, settings, session_factory, run_worker
):
    """A worker that dies after computing epoch t (person-level, mid-horizon) and before
    storing it leaves the next worker to compute it again: the same key, state and batch give
    the same noise, so the epoch released is the one the dead worker would have released and
    no second noisy copy of any node exists."""

    ids, rows = people(30, [1, 3, 7], D, seed=9)
    response = upload(
        client, keys.owner, "visits.csv", csv_bytes(ids, rows), privacy_unit_column="patient",
        row_norm_bound="1", accounting="hybrid",
    )  # fmt: skip
    dataset = response.json()
    release_id = post_release(client, keys.analyst, dataset["id"], **_request(4))
    assert run_worker() == 1  # epoch 1 stored, waiting
    appended = append(
        client, keys.owner, dataset["id"], csv_bytes(ids[:6], rows[:6] * 3), filename="b.csv",
        privacy_unit_column="patient",
    )  # fmt: skip
    assert appended.status_code == 201, appended.text
    with session_factory.begin() as session:
        release = session.get(Release, uuid.UUID(release_id))
        assert release is not None and release.epochs_done == 1
        step = continual.next_input(session, release, settings)
        mechanism = get_mechanism("continual_gauss")
        params = mechanism.parse_params(release.params)
        epsilon, delta = float_not_above(release.epsilon), float_not_above(release.delta)
        spec = ReleaseSpec(k=release.k, epsilon=epsilon, delta=delta, params=params)
    assert isinstance(step, continual.EpochInput) and step.epoch == 2 and step.person_level
    first = continual.compute_epoch(store, mechanism, spec, step)
    again = continual.compute_epoch(store, mechanism, spec, step)
    assert first.state is not None and first.state == again.state
    assert first.outcome.basis == again.outcome.basis
    assert run_worker() == 1  # the worker's own epoch 2 is that same epoch
    body = client.get(f"/v1/releases/{release_id}", headers=bearer(keys.owner)).json()
    assert body["epochs_done"] == 2
    assert body["latest_epoch"]["basis_sha256"] == first.outcome.basis[2]
