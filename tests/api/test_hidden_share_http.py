"""Issue 32 item 4: where the noise hides the explained-variance share, no figure that reads as
a measurement is shown: `explained_variance_ratio` and `explained_sum_of_squares` are null on
the release, also for a release stored before the rule (its figure beside the flag), and so are
the sums of squares whose ratios read as that point; a shown noisy sum is never negative."""

from __future__ import annotations

import uuid

import pytest

from service.db import models
from tests.conftest import bearer


@pytest.fixture
def dataset(isotropic_dataset):
    # 200 isotropic unit rows at eps 0.1: the noise hides any share (interval about [0, 1]).
    return isotropic_dataset(8)


@pytest.fixture
def body(dataset, centred_release):
    """A centred analyze_gauss release of rank 2 at eps 0.1 on the dataset, run (succeeded)."""
    released = centred_release(dataset["id"], k=2, epsilon="0.1")
    assert released["status"] == "succeeded"
    return released


def test_a_hidden_share_is_null_on_the_release(client, keys, body, session_factory):
    extras = body["result"]["extras"]
    assert extras["explained_variance_hidden_by_noise"] is True
    assert extras["explained_variance_ratio"] is None
    assert extras["explained_sum_of_squares"] is None
    # Nor any sums whose ratio reads as the point (captured/(captured + residual), captured/total).
    for field in ("captured_sum_of_squares", "residual_sum_of_squares", "total_sum_of_squares"):
        assert extras[field] is None, field
    assert extras["variance_noise_std"] > 0
    low, high = extras["explained_variance_ratio_interval"]
    assert 0.0 <= low <= high <= 1.0
    assert "no point estimate is stated" in extras["warning"]
    # A release stored before the rule kept a figure beside the flag: shown null as well.
    with session_factory() as session:
        stored = session.get(models.Release, uuid.UUID(body["id"]))
        assert stored is not None
        stored.result_extras = {
            **extras,
            "explained_variance_ratio": [0.3, 0.2],
            "explained_sum_of_squares": [30.0, 20.0],
            "captured_sum_of_squares": 50.0,
            "residual_sum_of_squares": -205.8,
            "total_sum_of_squares": 50.0,
        }
        session.commit()
    for url in (f"/v1/releases/{body['id']}", "/v1/releases"):
        response = client.get(url, headers=bearer(keys.analyst))
        assert response.status_code == 200, response.text
        shown = response.json()
        item = shown if "result" in shown else shown["items"][0]
        assert item["result"]["extras"]["explained_variance_ratio"] is None
        assert item["result"]["extras"]["explained_sum_of_squares"] is None
        assert item["result"]["extras"]["explained_variance_ratio_interval"] == [low, high]
        for field in ("captured_sum_of_squares", "residual_sum_of_squares"):
            assert item["result"]["extras"][field] is None, field
        assert item["result"]["extras"]["total_sum_of_squares"] is None


def test_a_shown_residual_is_never_negative(client, keys, body, session_factory):
    for field in ("captured_sum_of_squares", "residual_sum_of_squares"):
        value = body["result"]["extras"][field]
        assert value is None or value >= 0.0, field
    # A release not flagged hidden whose residual draw fell below 0 (stored as drawn): shown 0.
    with session_factory() as session:
        stored = session.get(models.Release, uuid.UUID(body["id"]))
        assert stored is not None
        stored.result_extras = {
            **(stored.result_extras or {}),
            "explained_variance_hidden_by_noise": False,
            "explained_variance_ratio": [0.6, 0.39],
            "explained_sum_of_squares": [1313.3, 853.7],
            "captured_sum_of_squares": 2188.9,
            "residual_sum_of_squares": -50.8,
            "total_sum_of_squares": 2188.9,
        }
        session.commit()
    for url in (f"/v1/releases/{body['id']}", "/v1/releases"):
        response = client.get(url, headers=bearer(keys.analyst))
        assert response.status_code == 200, response.text
        shown = response.json()
        item = shown if "result" in shown else shown["items"][0]
        assert item["result"]["extras"]["residual_sum_of_squares"] == 0.0
        assert item["result"]["extras"]["captured_sum_of_squares"] == 2188.9
        assert item["result"]["extras"]["explained_variance_ratio"] == [0.6, 0.39]
