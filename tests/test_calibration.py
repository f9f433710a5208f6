"""The padding tracks this machine: rates timed on public random data by the workers, read when
a release is requested, with a margin for the queue; a release's ``visible_at`` never moves
afterwards, and it is a function of public facts only."""

from __future__ import annotations

import math
import uuid
from datetime import timedelta
from typing import Any

import numpy as np
import pytest
from sqlalchemy import select

from service import calibration
from service.config import Settings
from service.db.models import MachineRate, Release
from service.padding import DATA_DEPENDENT_FACTOR, CalibratedRates, PaddingModel, work_units
from service.worker import Worker
from tests.conftest import post_release

RATES = {("analyze_gauss", 50): 1e9, ("analyze_gauss", 400): 4e9, ("exact_gapmax", 10): 1e7}


def test_rates_are_interpolated_in_log_d_and_clamped_outside() -> None:
    rates = CalibratedRates(RATES, workers=1)
    assert rates.rate("analyze_gauss", 50) == 1e9
    assert rates.rate("analyze_gauss", 10) == 1e9
    assert rates.rate("analyze_gauss", 5000) == 4e9
    # d = 100 is a third of the way from 50 to 400 in log d (a factor 2 of 8).
    assert rates.rate("analyze_gauss", 100) == pytest.approx(1e9 * 4 ** (1 / 3))
    assert rates.rate("spectrum", 50) is None


def test_a_calibrated_padding_is_floor_plus_queue_plus_multiple_of_the_measured_run() -> None:
    settings = Settings(
        release_padding_calibrated_floor_seconds=1.5, release_padding_calibrated_multiplier=2.5
    )
    model = PaddingModel.from_settings(settings, CalibratedRates(RATES, workers=2))
    work = work_units("analyze_gauss", 3500, 400, 3, {})
    assert model.padding("analyze_gauss", 3500, 400, 3, {}, queue_seconds=4) == timedelta(
        seconds=1.5 + 4 + 2.5 * work / 4e9
    )
    # Within 3x the modelled run plus 2 s whenever the run is as modelled and nothing is queued.
    run = work / 4e9
    assert model.padding("analyze_gauss", 3500, 400, 3, {}).total_seconds() <= 3 * run + 2
    # The data-dependent mechanism keeps extra margin; an uncalibrated one keeps the defaults.
    gap = work_units("exact_gapmax", 200, 10, 2, {"sample_rows": 150})
    assert model.padding("exact_gapmax", 200, 10, 2, {"sample_rows": 150}) == timedelta(
        seconds=1.5 + 2.5 * DATA_DEPENDENT_FACTOR["exact_gapmax"] * gap / 1e7
    )
    default = PaddingModel.from_settings(settings)
    assert model.padding("spectrum", 3500, 400, 3, {}) == default.padding(
        "spectrum", 3500, 400, 3, {}
    )
    # Two jobs ahead, two workers: each worker takes one, at its padding's multiple.
    assert model.queue_seconds([("analyze_gauss", 3500, 400, 3, {})] * 2) == pytest.approx(
        2 * 2.5 * run / 2
    )


def test_operators_rates_and_switching_off_win_over_the_calibration(monkeypatch) -> None:
    calibrated = CalibratedRates(RATES, workers=1)
    off = PaddingModel.from_settings(Settings(release_padding_calibrated=False), calibrated)
    assert off.padding("analyze_gauss", 3500, 400, 3, {}) == PaddingModel.from_settings(
        Settings()
    ).padding("analyze_gauss", 3500, 400, 3, {})
    monkeypatch.setenv("DPSS_RELEASE_PADDING_RATES", '{"analyze_gauss": 1e8}')
    pinned = PaddingModel.from_settings(Settings(), calibrated)
    work = work_units("analyze_gauss", 3500, 400, 3, {})
    assert pinned.padding("analyze_gauss", 3500, 400, 3, {}) == timedelta(
        seconds=Settings().release_padding_multiplier * work / 1e8
    )


def test_measure_times_public_random_data_and_stops_when_a_job_waits(monkeypatch) -> None:
    monkeypatch.setattr(calibration, "DEFAULT_SHAPES", ((300, 8, 2), (200, 16, 2)))
    rates = calibration.measure({"analyze_gauss": None, "spectrum": None})
    assert set(rates) == {(m, d) for m in ("analyze_gauss", "spectrum") for d in (8, 16)}
    assert all(rate > 0 and math.isfinite(rate) for rate in rates.values())
    asked: list[int] = []

    def waiting() -> bool:  # a job arrives after the first mechanism
        asked.append(1)
        return len(asked) > 1

    partial = calibration.measure({"analyze_gauss": None, "spectrum": None}, waiting)
    assert set(partial) == {("analyze_gauss", 8), ("analyze_gauss", 16)}


@pytest.fixture
def calibrated_settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"worker_calibrate_seconds": 3600})


def test_the_worker_calibrates_at_start_and_when_due_and_keeps_one_set(
    session_factory: Any, store: Any, calibrated_settings: Settings, monkeypatch
) -> None:
    measured = [2e9, 1e9]

    def fake_measure(**_: object) -> dict[tuple[str, int], float]:
        return {("analyze_gauss", 50): measured.pop(0)}

    monkeypatch.setattr(calibration, "measure", fake_measure)
    worker = Worker(session_factory, store, calibrated_settings, worker_id="w1")
    assert worker.calibrate_if_due() and not worker.calibrate_if_due()
    worker._calibrated_at = -1e9  # due again (as after worker_calibrate_seconds)
    assert worker.calibrate_if_due()
    with session_factory() as session:
        rows = session.execute(select(MachineRate.worker_id, MachineRate.rate)).all()
        assert rows == [("w1", 1e9)]  # the slowdown applies at once
        assert calibration.current_rates(session).rate("analyze_gauss", 50) == 1e9
    off = Worker(
        session_factory,
        store,
        calibrated_settings.model_copy(update={"worker_calibrate_seconds": 0}),
    )
    assert not off.calibrate_if_due()


def test_a_speed_up_counts_only_once_it_lasts(session_factory: Any) -> None:
    key = ("spectrum", 50)
    _store_rates(session_factory, "w", {key: 1e9})
    _store_rates(session_factory, "w", {key: 5e9})  # one fast sample: the slower stays
    with session_factory() as session:
        assert calibration.current_rates(session).rate(*key) == 1e9
    with session_factory.begin() as session:
        row = session.get(MachineRate, ("w", "spectrum", 50))
        row.measured_at -= timedelta(hours=1)  # the slow sample is old now
    _store_rates(session_factory, "w", {key: 5e9})
    with session_factory() as session:
        assert calibration.current_rates(session).rate(*key) == 5e9


def _store_rates(session_factory: Any, worker_id: str, rates: dict[tuple[str, int], float]) -> None:
    with session_factory.begin() as session:
        calibration.store(session, worker_id, rates)


def _padding_of(session_factory: Any, release_id: str) -> float:
    with session_factory() as session:
        release = session.get(Release, uuid.UUID(release_id))
        assert release is not None
        return (release.visible_at - release.created_at).total_seconds()


def test_visible_at_uses_the_slowest_worker_is_public_and_never_moves(
    client: Any, keys: Any, upload_dataset: Any, session_factory: Any, settings: Settings
) -> None:
    rng = np.random.default_rng(11)
    first = upload_dataset(client, keys.owner, rng.normal(size=(40, 6)) * 0.1, row_norm_bound="1")
    # Same public shape, different rows (and a different scale): the padding cannot differ.
    other = upload_dataset(client, keys.owner, rng.uniform(size=(40, 6)) * 0.3, row_norm_bound="1")
    _store_rates(session_factory, "fast", {("analyze_gauss", 6): 1e9})
    _store_rates(session_factory, "slow", {("analyze_gauss", 6): 1e3})
    body = {"mechanism": "analyze_gauss", "k": 1, "epsilon": "0.1", "delta": "1e-8"}
    release = post_release(client, keys.analyst, first["id"], **body)
    padding = _padding_of(session_factory, release)
    model = PaddingModel.from_settings(settings, CalibratedRates({("analyze_gauss", 6): 1e3}, 2))
    with session_factory() as session:
        params = session.get(Release, uuid.UUID(release)).params  # type: ignore[union-attr]
    assert padding == pytest.approx(
        model.padding("analyze_gauss", 40, 6, 1, params).total_seconds()
    )
    # The next one waits behind the first (queued, modelled at the slowest rate, 2 workers).
    queued = post_release(client, keys.analyst, other["id"], **body)
    queue = model.queue_seconds([("analyze_gauss", 40, 6, 1, params)])
    assert _padding_of(session_factory, queued) == pytest.approx(padding + queue)
    # Recalibration (10x slower) applies to new requests only.
    _store_rates(session_factory, "slow", {("analyze_gauss", 6): 1e2})
    assert _padding_of(session_factory, release) == padding
    later = post_release(client, keys.analyst, first["id"], **body)
    assert _padding_of(session_factory, later) > padding
