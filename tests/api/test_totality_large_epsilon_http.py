"""The largest epsilons a request may name (up to 1000) through the whole service: every
registered mechanism under every accounting answers a dry run and a request with 200/202 or a
422 naming its field, never a 500, and what is accepted and fits the budget ends ``succeeded`` or
``no_result`` (a continual one ``running``) on rows that mix 1e300 and 5e-324.

Before, three public calibrations overflowed past eps ~ 139 or ~ 709.8 and the request was a
500 before anything was charged: ``accounting.pure_mu`` (erfinv of ``2/(1 + e^eps) - 1``, which
is -1 at 200 bits: every pure step of auto, histogram_aggregate, friendly_aggregate and
smooth_sensitivity's Cauchy variant), ``noise.truncated_laplace_params`` (``e^eps - 1`` over
``2 delta``: exact_gapmax) and ``base.laplace_test_step`` (``e^eps delta``).
"""

from __future__ import annotations

import numpy as np
import pytest

from service.mechanisms.registry import MECHANISMS
from tests.conftest import bearer, fetch_release, npy_bytes

ACCOUNTINGS = ["basic", "gaussian", "zcdp", "hybrid"]
#: What each mechanism needs at n = 200, d = 3 to get past its own public refusals.
PARAMS = {"continual_gauss": {"horizon": 2}}


def rows() -> np.ndarray:
    data = np.random.default_rng(9).standard_normal((200, 3))
    data[0] = [1e300, -1e300, 0.0]
    data[1] = 5e-324
    data[2:40] = data[2]  # one row repeated
    return data


@pytest.mark.parametrize("accounting", ACCOUNTINGS)
def test_the_largest_epsilons_never_give_a_500(client, keys, run_worker, accounting):
    dataset = client.post(
        "/v1/datasets",
        headers=bearer(keys.owner),
        files={"file": ("rows.npy", npy_bytes(rows()), "application/octet-stream")},
        data={"name": "large epsilon", "epsilon_budget": "100000", "delta_budget": "0.999",
              "allow_large_delta": "true", "row_norm_bound": "1", "accounting": accounting},
    )  # fmt: skip
    assert dataset.status_code == 201, dataset.text
    url = f"/v1/datasets/{dataset.json()['id']}/releases"
    answers: dict[tuple[str, str, str], int] = {}
    ran = 0
    for mechanism in sorted(MECHANISMS):
        for epsilon in ("1000", "709.5", "200"):
            for delta in ("0", "1e-12", "0.5"):
                body = {
                    "mechanism": mechanism,
                    "k": 1,
                    "epsilon": epsilon,
                    "delta": delta,
                    "params": PARAMS.get(mechanism, {}),
                }
                preview = client.post(
                    f"{url}?dry_run=true", headers=bearer(keys.analyst), json=body
                )
                answers[mechanism, epsilon, delta] = preview.status_code
                assert preview.status_code in {200, 422}, (body, preview.text)
                if preview.status_code == 422:
                    assert preview.json()["detail"].split(":")[0], preview.text
                if epsilon != "1000" or preview.status_code != 200:
                    continue
                posted = client.post(url, headers=bearer(keys.analyst), json=body)
                # 409: this dataset's budget (spent by the earlier requests here) is short.
                assert posted.status_code in {202, 409}, (body, posted.text)
                if posted.status_code == 409:
                    continue
                ran += 1
                assert run_worker() == 1
                shown = fetch_release(client, keys.owner, posted.json()["id"])
                assert shown["status"] in {"succeeded", "no_result", "running"}, (body, shown)
    assert ran >= 3
    # Pure and Laplace steps were reached, not only refused (each failed with a 500 before).
    if accounting in {"basic", "zcdp"}:
        assert answers["auto", "1000", "0"] == 200
        assert answers["histogram_aggregate", "1000", "0.5"] == 200
    if accounting == "basic":
        assert answers["exact_gapmax", "1000", "0.5"] == 200
        assert answers["smooth_sensitivity", "1000", "0"] == 200
