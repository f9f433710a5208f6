"""The noise a continual release actually adds, measured through the real app and worker, epoch
by epoch, against ALGORITHMS.md M8 and the module's stated variances.

On a stream of zero rows every clipped leaf is 0, so the prefix estimate the worker stores after
epoch ``t`` (the sum of the decomposition's closed nodes, kept in ``release_states``) is pure
noise: its upper-triangle entries must have standard deviation ``sigma sqrt(v_t)``, with
``sigma`` the analytic-Gaussian scale for ``sqrt(L) sqrt(2) C^2``, ``L = floor(log2 T) + 1``,
and ``v_t`` the estimator's per-entry variance (``popcount(t)`` for the plain tree, the refined
``sum v_h`` for Honaker's). Checked at powers of two and not, under the default (hybrid) and
basic accounting, with batches of different sizes. The sigma handed to the noise draw is
checked elsewhere (tests/api/test_privacy_unit_noise_drawn.py); this measures what reached the
state, so a node drawn twice, skipped, scaled wrongly or combined with wrong weights fails."""

from __future__ import annotations

import math
import uuid

import numpy as np
import pytest
from sqlalchemy import select

from service.db.models import ReleaseState
from service.mechanisms.continual_gauss import (
    ContinualState,
    noise_sigma,
    prefix_estimate,
    prefix_variance,
    tree_sensitivity,
)
from service.mechanisms.linalg import top_k_eigh
from service.mechanisms.noise import analytic_gaussian_sigma
from tests.api.test_append_rows import append
from tests.conftest import bearer, npy_bytes, post_release

D, C = 40, 2.0
EPS, DELTA = 1.0, 1e-6
#: 820 upper-triangle entries per epoch: a sample standard deviation within 4.1% of the true
#: one with probability > 0.999 (chi-square with 820 degrees of freedom); 12% is far beyond it,
#: and a wrong level count (sqrt(3/4) = 0.87 at T = 5) or a wrong estimator falls outside.
TOLERANCE = 0.12


@pytest.mark.parametrize(
    ("horizon", "estimator", "accounting"),
    [(8, "honaker", "hybrid"), (5, "tree", "basic"), (6, "honaker", "basic")],
)
def test_each_epochs_prefix_noise_is_the_stated_one(
    client, keys, upload_dataset, run_worker, session_factory, horizon, estimator, accounting
):
    dataset = upload_dataset(
        client, keys.owner, np.zeros((3, D)), row_norm_bound=C, accounting=accounting
    )
    request = {
        "mechanism": "continual_gauss", "k": 2, "epsilon": str(EPS), "delta": str(DELTA),
        "params": {"horizon": horizon, "estimator": estimator, "clip_norm": C},
    }  # fmt: skip
    preview = client.post(
        f"/v1/datasets/{dataset['id']}/releases?dry_run=true",
        headers=bearer(keys.analyst),
        json=request,
    )
    assert preview.status_code == 200, preview.text
    scales = preview.json()["scales"]
    release_id = post_release(
        client, keys.analyst, dataset["id"], mechanism="continual_gauss", k=2,
        epsilon=str(EPS), delta=str(DELTA),
        params={"horizon": horizon, "estimator": estimator, "clip_norm": C},
    )  # fmt: skip
    levels = math.floor(math.log2(horizon)) + 1
    sigma = analytic_gaussian_sigma(math.sqrt(levels) * math.sqrt(2) * C * C, EPS, DELTA)
    assert sigma == pytest.approx(noise_sigma(C, EPS, DELTA, horizon), rel=1e-12)
    assert tree_sensitivity(C, horizon) == pytest.approx(math.sqrt(2 * levels) * C * C)
    upper = np.triu_indices(D)
    seen = []
    for t in range(1, horizon + 1):
        if t > 1:
            rows = np.zeros((2 if t % 2 else 7, D))
            assert append(client, keys.owner, dataset["id"], npy_bytes(rows)).status_code == 201
        run_worker()
        body = client.get(f"/v1/releases/{release_id}", headers=bearer(keys.analyst)).json()
        assert body["epochs_done"] == t
        with session_factory() as session:
            raw = session.execute(
                select(ReleaseState.state).where(ReleaseState.release_id == uuid.UUID(release_id))
            ).scalar_one()
        estimate = prefix_estimate(ContinualState.from_bytes(raw))
        stated = sigma * math.sqrt(prefix_variance(t, horizon, estimator))
        extras = body["latest_epoch"]["extras"]
        assert extras["noise_sigma"] == pytest.approx(sigma, rel=1e-12)
        assert extras["prefix_entry_std"] == pytest.approx(stated, rel=1e-12)
        measured = float(np.std(estimate[upper]))
        assert abs(measured / stated - 1) < TOLERANCE, (t, measured, stated)
        # The released eigenvalues are those of the stored estimate (rounded to sigma / 1000).
        values, _ = top_k_eigh(estimate, 2)
        np.testing.assert_allclose(extras["eigenvalues"], values, atol=sigma / 1000)
        # Each epoch's noise is fresh where a new node closed: the estimates differ.
        seen.append(estimate)
        assert all(not np.array_equal(estimate, earlier) for earlier in seen[:-1])
    assert body["status"] == "succeeded"
    # The dry run stated the same scales before anything ran.
    epochs = client.get(f"/v1/releases/{release_id}/epochs", headers=bearer(keys.analyst)).json()
    stds = [epoch["extras"]["prefix_entry_std"] for epoch in epochs["items"]]
    assert scales["sigma"] == pytest.approx(sigma, rel=1e-12)
    assert scales["prefix_entry_std_first_epoch"] == pytest.approx(stds[0], rel=1e-12)
    assert scales["prefix_entry_std_last_epoch"] == pytest.approx(stds[-1], rel=1e-12)
    assert scales["prefix_entry_std_worst_epoch"] == pytest.approx(max(stds), rel=1e-12)
