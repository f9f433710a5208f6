"""Issue 31's done-when for ``auto`` on digits, through HTTP on the product's default accounting
(``zcdp``) and on ``basic``: with ``center: "private"``, k = 10 and epsilon 1, ``auto`` keeps at
least 0.48 of the centred variance (0.314 on a default dataset before), running analyze_gauss
with the default clip quantile and the centring route chosen at run time, and its dry run says
so (issue 32, item 1)."""

from __future__ import annotations

from decimal import Decimal

import numpy as np
import pytest

from service.config import Settings
from service.mechanisms.analyze_gauss import DEFAULT_PRIVATE_CENTRE_QUANTILE
from tests.conftest import bearer, release_and_wait
from tests.mechanisms.test_pca_defaults import digits_train

pytestmark = pytest.mark.release_seed(700)

PRODUCT_DEFAULT = Settings.model_fields["default_accounting"].default
BODY = {"k": 10, "epsilon": "1", "delta": "1e-6", "params": {"center": "private"}}
RELEASES = 3


@pytest.mark.parametrize("mechanism", ["auto", "analyze_gauss"])
@pytest.mark.parametrize("accounting", [PRODUCT_DEFAULT, "basic"])
def test_auto_keeps_half_of_digits_centred_variance(
    client, keys, upload_dataset, run_worker, accounting, mechanism
):
    assert PRODUCT_DEFAULT == "hybrid"  # issue 31, item 5 (it was zcdp)
    rows = digits_train(0)
    dataset = upload_dataset(
        client,
        keys.owner,
        rows,
        epsilon_budget="10",
        delta_budget="1e-5",
        row_norm_bound=1.0,
        accounting=accounting,
    )
    assert dataset["budget"]["accounting"] == accounting
    url = f"/v1/datasets/{dataset['id']}/releases"
    shown = client.post(
        url,
        params={"dry_run": "true"},
        headers=bearer(keys.analyst),
        json={**BODY, "mechanism": mechanism},
    )
    assert shown.status_code == 200, shown.text
    scales = shown.json()["scales"]
    if mechanism == "auto":
        assert scales["auto_choice"] == "analyze_gauss"
        assert scales["auto_centring"] == "private"
        assert scales["auto_clip_quantile"] == DEFAULT_PRIVATE_CENTRE_QUANTILE
        assert "PCA requested" in scales["auto_reason"]
        assert scales["analyze_gauss.clip_quantile_source"] == "default"
    centred = rows - rows.mean(axis=0)
    kept = []
    for _ in range(RELEASES):
        body = release_and_wait(
            client, keys.analyst, dataset["id"], run_worker, mechanism=mechanism, **BODY
        )
        assert body["status"] == "succeeded", body
        extras = body["result"]["extras"]
        if mechanism == "auto":
            assert extras["auto_choice"] == "analyze_gauss"
            assert extras["auto_params"]["clip_quantile"] == DEFAULT_PRIVATE_CENTRE_QUANTILE
            assert extras["auto_params"]["center_route"] == "auto"
        assert extras["centring"] in ("mean", "pairs", "none")
        basis = np.array(body["result"]["basis"])
        kept.append(float(np.sum((centred @ basis) ** 2) / np.sum(centred**2)))
    print(f"{mechanism} on {accounting}: mean kept {np.mean(kept):.3f} over {RELEASES}")
    assert np.mean(kept) >= 0.48, kept
    spent = client.get(f"/v1/datasets/{dataset['id']}/budget", headers=bearer(keys.owner))
    if accounting == "basic":
        assert Decimal(spent.json()["epsilon_spent"]) == RELEASES
    else:
        assert Decimal(spent.json()["rho_spent"]) > 0
