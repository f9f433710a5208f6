"""With ``k = d`` the components span the whole space: the share is exactly 1 (a public fact),
but when fewer of them stand out of the noise than were released, how that total splits among
them follows their debiased eigenvalues (0 below the edge: ``[1, 0, 0, 0, 0]`` on isotropic
rows, where each direction keeps 1/d) and is no measurement. The release states no split
(``explained_variance_ratio`` and ``explained_sum_of_squares`` null) and flags it
(``explained_variance_split_hidden_by_noise``); the dry run's ``forecast_from`` does not carry
it as a measured share."""

from __future__ import annotations

import uuid

import pytest

from service.db import models
from tests.api.conftest import CENTRED_BODY
from tests.conftest import bearer

D = 5


@pytest.fixture
def dataset(isotropic_dataset):
    # 200 isotropic unit rows: no direction stands out of the noise at eps 0.3.
    return isotropic_dataset(D)


BODY = {**CENTRED_BODY, "k": D, "epsilon": "0.3"}


@pytest.mark.release_seed(500)
def test_a_whole_space_split_the_noise_hides_is_null_and_flagged(
    client, keys, dataset, centred_release
):
    released = centred_release(dataset["id"], **BODY)
    assert released["status"] == "succeeded", released
    extras = released["result"]["extras"]
    assert extras["components_above_noise"] < D
    # Before: [1, 0, 0, 0, 0]-like shares stated as if measured, with no flag.
    assert extras["explained_variance_split_hidden_by_noise"] is True
    assert extras["explained_variance_ratio"] is None
    assert extras["explained_sum_of_squares"] is None
    # The total is still true: exactly 1, and not hidden.
    assert extras["explained_variance_ratio_interval"] == [1.0, 1.0]
    assert extras["explained_variance_hidden_by_noise"] is False
    assert "how it splits among them is not measured" in extras["warning"]
    # The same on the list.
    listed = client.get("/v1/releases", headers=bearer(keys.analyst)).json()["items"]
    shown = next(item for item in listed if item["id"] == released["id"])
    assert shown["result"]["extras"]["explained_variance_ratio"] is None
    assert shown["result"]["extras"]["explained_variance_split_hidden_by_noise"] is True


@pytest.mark.release_seed(500)
def test_a_release_that_states_its_split_says_so(dataset, centred_release):
    # k < d: the flag is present and false (the split is of a measured share).
    released = centred_release(dataset["id"], **{**BODY, "k": 2})
    assert released["status"] == "succeeded", released
    assert released["result"]["extras"]["explained_variance_split_hidden_by_noise"] is False


@pytest.mark.release_seed(500)
@pytest.mark.parametrize("k", [2, D])
def test_forecast_from_does_not_read_a_withheld_split_as_measured(
    client, keys, dataset, centred_release, k
):
    earlier = centred_release(dataset["id"], **BODY)
    assert earlier["result"]["extras"]["explained_variance_split_hidden_by_noise"] is True
    response = client.post(
        f"/v1/datasets/{dataset['id']}/releases",
        params={"dry_run": "true", "forecast_from": earlier["id"]},
        headers=bearer(keys.analyst),
        json={**BODY, "k": k},
    )
    # Before: 400 ("has no explained variance") once the split is null, or, with the split
    # stated, a "measured share" forecast carrying [1, 0, 0, 0, 0].
    assert response.status_code == 200, response.text
    scales = response.json()["scales"]
    assert scales["forecast_from_release_basis"] == "spectrum"
    assert scales["forecast_from_release_hidden_by_noise"] is False
    low = scales["forecast_from_release_captured_share_low"]
    high = scales["forecast_from_release_captured_share_high"]
    assert 0.0 <= low <= high <= 1.0
    if k < D:
        # No point read off an unmeasured split.
        assert scales["forecast_from_release_captured_share"] is None
        assert scales["forecast_from_release_determined"] is False
    meaning = " ".join(response.json()["meaning"])
    assert "hidden by its noise" in meaning


@pytest.mark.release_seed(500)
def test_forecast_from_a_release_from_before_the_flag_reads_its_spectrum(
    client, keys, dataset, centred_release, session_factory
):
    # A release stored before the flag stated the split, e.g. [1, 0, 0, 0, 0], and no flag:
    # its components_above_noise < k = d says the same.
    earlier = centred_release(dataset["id"], **BODY)
    extras = dict(earlier["result"]["extras"])
    del extras["explained_variance_split_hidden_by_noise"]
    above = extras["components_above_noise"]
    extras["explained_variance_ratio"] = [1.0 / max(above, 1)] * above + [0.0] * (D - above)
    extras["explained_sum_of_squares"] = [10.0] * D
    with session_factory() as session:
        stored = session.get(models.Release, uuid.UUID(earlier["id"]))
        assert stored is not None
        stored.result_extras = extras
        session.commit()
    response = client.post(
        f"/v1/datasets/{dataset['id']}/releases",
        params={"dry_run": "true", "forecast_from": earlier["id"]},
        headers=bearer(keys.analyst),
        json={**BODY, "k": 2},
    )
    assert response.status_code == 200, response.text
    scales = response.json()["scales"]
    assert scales["forecast_from_release_basis"] == "spectrum"
    assert scales["forecast_from_release_captured_share"] is None
