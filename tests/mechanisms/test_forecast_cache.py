"""The per-request cache of the forecast's simulations (issue 32 item 4): a forecast from an
earlier release simulates some models more than once (digits k = 10, eps 1 -> 0.3: 10
simulations, 5 of them repeats); the cache answers the repeats within one forecast and is
never kept across forecasts (a shared cache's hit would tell one analyst, by its speed, that
another had asked a forecast from the same released figures)."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

from service.mechanisms import forecast_simulation, gauss_release_forecast
from service.mechanisms.forecast_simulation import Model, request_cache, simulated_share


def _model(spike: float = 0.0) -> Model:
    return Model(np.asarray([30.0]), np.asarray([0.4]), np.full(15, 2.0), np.full(15, 0.04), spike)


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    runs: list[int] = []
    inner = forecast_simulation._simulate

    def counted(*args: Any) -> Any:
        runs.append(1)
        return inner(*args)

    monkeypatch.setattr(forecast_simulation, "_simulate", counted)
    return runs


def test_a_repeat_within_one_request_is_answered_from_its_cache(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runs = _counting(monkeypatch)
    with request_cache():
        first = simulated_share(_model(), 16, 1, 1.0)
        again = simulated_share(_model(), 16, 1, 1.0)
        # Any input that differs is another simulation.
        other = simulated_share(_model(spike=5.0), 16, 1, 1.0)
        simulated_share(_model(), 16, 2, 1.0)
        simulated_share(_model(), 16, 1, 1.5)
        with request_cache():  # a nested scope shares the outer one
            nested = simulated_share(_model(), 16, 1, 1.0)
    assert again == first == nested
    assert other != first
    assert len(runs) == 4


def test_nothing_is_kept_across_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    runs = _counting(monkeypatch)
    simulated_share(_model(), 16, 1, 1.0)
    simulated_share(_model(), 16, 1, 1.0)  # no scope: no cache
    with request_cache():
        simulated_share(_model(), 16, 1, 1.0)
    with request_cache():
        simulated_share(_model(), 16, 1, 1.0)  # a new request simulates again
    assert len(runs) == 4
    assert forecast_simulation._CACHE.get() is None


def test_concurrent_requests_do_not_share_a_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    runs = _counting(monkeypatch)
    entered, done = threading.Event(), threading.Event()

    def other_request() -> None:
        entered.wait(5.0)
        with request_cache():
            simulated_share(_model(), 16, 1, 1.0)
        done.set()

    thread = threading.Thread(target=other_request)
    thread.start()
    with request_cache():
        simulated_share(_model(), 16, 1, 1.0)
        entered.set()
        assert done.wait(5.0)
    thread.join()
    assert len(runs) == 2


def test_a_forecast_is_the_same_with_its_cache_and_repeats_are_not_rerun(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # digits (unit rows), k = 10, a release at eps 1 (center private, delta 1e-6; the seed of
    # bench/bench_forecast_coverage.py's release 0) forecasting eps 0.3: 10 simulations asked,
    # 5 repeats (bench/bench_forecast_cpu.py, removed; in git history at commit 3fa7e908).
    from sklearn.datasets import load_digits

    from service.mechanisms.analyze_gauss import AnalyzeGauss
    from service.mechanisms.base import PublicContext, ReleaseSpec
    from service.mechanisms.gauss_preview import release_forecast

    data = load_digits().data
    rows = data / np.linalg.norm(data, axis=1, keepdims=True)
    ctx = PublicContext(n_rows=rows.shape[0], n_cols=rows.shape[1], row_norm_bound=1.0)
    mechanism = AnalyzeGauss()

    def spec(eps: float) -> ReleaseSpec[Any]:
        params = mechanism.prepare(
            ctx, 10, eps, 1e-6, mechanism.parse_params({"center": "private"})
        )
        return ReleaseSpec(k=10, epsilon=eps, delta=1e-6, params=params)

    earlier = mechanism.run(rows, spec(1.0), np.random.default_rng(10_000 * 12))
    runs = _counting(monkeypatch)
    cached = release_forecast(ctx, spec(0.3), spec(1.0), earlier.extras)
    ran = len(runs)
    with monkeypatch.context() as patched:
        patched.setattr(gauss_release_forecast, "request_cache", _none)
        runs.clear()
        plain = release_forecast(ctx, spec(0.3), spec(1.0), earlier.extras)
    assert cached == plain
    assert ran < len(runs)
    assert forecast_simulation._CACHE.get() is None


class _Nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _none() -> _Nothing:
    return _Nothing()
