"""The run-time model behind ``visible_at``: public inputs, floor, multiplier, rates."""

from __future__ import annotations

from datetime import timedelta

import pytest
from pydantic import ValidationError

from service.config import Settings
from service.mechanisms.registry import MECHANISMS
from service.padding import DEFAULT_RATES, WORK_MODELS, PaddingModel


def model(**overrides: object) -> PaddingModel:
    return PaddingModel.from_settings(Settings(**overrides))  # type: ignore[arg-type]


def test_every_mechanism_has_a_work_model_and_a_default_rate():
    assert set(WORK_MODELS) == set(MECHANISMS) == set(DEFAULT_RATES)


def test_the_floor_applies_to_small_jobs_and_the_model_to_large_ones():
    padding = model(release_padding_floor_seconds=5, release_padding_multiplier=4)
    assert padding.padding("analyze_gauss", 100, 5, 2, {}) == timedelta(seconds=5)
    large = padding.padding("analyze_gauss", 10**6, 1000, 2, {})
    work = 10**6 * 1000 * 1000 + 10**6 * 1000 + 9 * 1000**3
    assert large == timedelta(seconds=4 * work / DEFAULT_RATES["analyze_gauss"])


@pytest.mark.parametrize("mechanism", sorted(WORK_MODELS))
def test_work_grows_with_n_and_d(mechanism):
    padding = model()
    params = {"t": 10, "q": 4, "sample_rows": 30}
    small = padding.work(mechanism, 1000, 10, 2, params)
    assert padding.work(mechanism, 1000, 40, 2, params) > small
    if mechanism != "exact_gapmax":  # it works on a sample of sample_rows rows, whatever n
        assert padding.work(mechanism, 100_000, 10, 2, params) > small


def test_rates_are_overridden_per_mechanism_from_the_environment(monkeypatch):
    monkeypatch.setenv("DPSS_RELEASE_PADDING_RATES", '{"spectrum": 1000}')
    padding = PaddingModel.from_settings(Settings())
    assert padding.rates["spectrum"] == 1000
    assert padding.rates["analyze_gauss"] == DEFAULT_RATES["analyze_gauss"]
    slow = padding.padding("spectrum", 1000, 10, 2, {})
    assert slow > padding.padding("analyze_gauss", 1000, 10, 2, {})


@pytest.mark.parametrize("bad", ['{"spectrum": 0}', '{"spectrum": -1}', '{"spectrum": "fast"}'])
def test_a_rate_must_be_positive(monkeypatch, bad):
    monkeypatch.setenv("DPSS_RELEASE_PADDING_RATES", bad)
    with pytest.raises(ValidationError):
        Settings()


def test_an_absurd_job_gets_a_bounded_padding():
    padding = model()
    assert padding.padding("exact_gapmax", 10**9, 10**5, 50, {"sample_rows": 10**6}) == timedelta(
        days=30
    )
