"""The run-time model behind ``visible_at``: public inputs, floor, multiplier, rates."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError
from sqlalchemy import update

from service import calibration, releases
from service.config import Settings
from service.db.models import Dataset, Release
from service.mechanisms.registry import MECHANISMS
from service.padding import (
    DEFAULT_RATES,
    OVERHEAD,
    WORK_MODELS,
    PaddingModel,
    late_schedule,
    next_late_step,
    work_units,
)
from tests.conftest import post_release


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


# -- issue 30: every input public, lateness on a public schedule --------------------------------


def test_center_and_clip_quantile_lengthen_the_modelled_work():
    # The recommended PCA settings ran 1.1-5x longer than the defaults at the same padding.
    plain = work_units("analyze_gauss", 20_000, 50, 3, {})
    centred = work_units("analyze_gauss", 20_000, 50, 3, {"center": "private"})
    both = work_units("analyze_gauss", 20_000, 50, 3, {"center": "private", "clip_quantile": 0.9})
    assert plain < centred < both and both >= 3 * plain
    for name in ("spectrum", "gap_perturbation", "smooth_sensitivity"):
        assert work_units(name, 20_000, 50, 3, {"center": "private"}) > work_units(
            name, 20_000, 50, 3, {}
        )
    # auto's Gram candidate always runs with a clip quantile.
    assert work_units("auto", 20_000, 50, 3, {}) > work_units("analyze_gauss", 20_000, 50, 3, {})


def test_uncalibrated_defaults_fit_this_class_of_machine():
    # A fresh service: 3,500 x 784 ran 0.5 s quiet, 2.1 s under a load of 4.5; it was padded
    # 51.9 s. Now within the floor's order, and a small d gets a lower rate, not a higher one.
    padding = model()
    assert padding.padding("analyze_gauss", 3500, 784, 3, {}) <= timedelta(seconds=20)
    assert padding.default_rate("analyze_gauss", 50) < padding.default_rate("analyze_gauss", 784)
    assert padding.default_rate("analyze_gauss", 50) <= 5e8
    # An operator's rate applies at every d.
    pinned = PaddingModel.from_settings(Settings(release_padding_rates={"analyze_gauss": 1e8}))
    assert pinned.default_rate("analyze_gauss", 50) == pinned.default_rate("analyze_gauss", 784)


T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("ended", "shown", "step"),
    [
        (5, 10, 0),  # within the padding: at visible_at
        (10, 10, 0),
        (10.000001, 20, 1),  # late: the first doubling at or after the end
        (20, 20, 1),
        (20.5, 40, 2),
        (79, 80, 3),
        (81, 160, 4),
    ],
)
def test_a_late_outcome_shows_at_the_next_doubling_of_its_padding(ended, shown, step):
    visible = T0 + timedelta(seconds=10)
    assert late_schedule(T0, visible, T0 + timedelta(seconds=ended)) == (
        T0 + timedelta(seconds=shown),
        step,
    )


def test_the_late_schedule_steps_are_public_and_few():
    visible = T0 + timedelta(seconds=2)
    ends = [T0 + timedelta(seconds=2 + 0.37 * i) for i in range(1, 5000)]
    steps = {late_schedule(T0, visible, end)[0] for end in ends}
    # 1,850 s of possible ends reveal one of 10 moments: log2(10) = 3.3 bits.
    assert steps == {T0 + timedelta(seconds=2 * 2**j) for j in range(1, 11)}
    # Until the next step nothing changes; zero padding (switched off) hides nothing.
    assert next_late_step(T0, visible, T0 + timedelta(seconds=3)) == T0 + timedelta(seconds=4)
    assert next_late_step(T0, visible, T0 + timedelta(seconds=4)) == T0 + timedelta(seconds=8)
    assert late_schedule(T0, T0, T0 + timedelta(seconds=3)) == (T0 + timedelta(seconds=3), 0)


# -- the padding reads no other job's real state (both databases) ----------------------------


def _target_and_probe(client, keys, upload_dataset, rng):
    target = upload_dataset(client, keys.owner, rng.normal(size=(60, 8)) * 0.1, row_norm_bound="1")
    probe = upload_dataset(client, keys.owner, rng.normal(size=(30, 4)) * 0.1, row_norm_bound="1")
    return target, probe


def _probe_padding(session_factory, settings, probe_id, now):
    with session_factory() as session:
        dataset = session.get(Dataset, uuid.UUID(probe_id))
        assert dataset is not None
        return releases._padding(session, settings, "analyze_gauss", dataset, 1, {}, now)


def _set_target(session_factory, release_id, **values):
    with session_factory.begin() as session:
        session.execute(update(Release).where(Release.id == uuid.UUID(release_id)).values(**values))


def test_a_probe_padding_is_the_same_whether_a_target_job_runs_or_has_ended(
    client, keys, upload_dataset, session_factory, settings, rng
):
    """Issue 30 item 1: the queue term counted jobs whose real status was queued or running, so
    a cheap probe's visible_at told whether another job had really finished."""
    with session_factory.begin() as session:
        calibration.store(
            session, "w", {("analyze_gauss", 4): 1e6, ("analyze_gauss", 8): 1e6, (OVERHEAD, 0): 2}
        )
    target, probe = _target_and_probe(client, keys, upload_dataset, rng)
    body = {"mechanism": "analyze_gauss", "k": 2, "epsilon": "0.5", "delta": "1e-6"}
    target_release = post_release(client, keys.analyst, target["id"], **body)
    with session_factory() as session:
        stored = session.get(Release, uuid.UUID(target_release))
        assert stored is not None and stored.visible_at is not None
        now = stored.created_at + (stored.visible_at - stored.created_at) / 2
    seen = []
    for values in (
        {"status": "queued"},
        {"status": "running", "started_at": now, "lease_owner": "w"},
        {"status": "succeeded", "finished_at": now, "lease_owner": None},
        {"status": "failed", "finished_at": now, "refunded": True},
    ):
        _set_target(session_factory, target_release, **values)
        seen.append(_probe_padding(session_factory, settings, probe["id"], now))
    assert len(set(seen)) == 1
    # The target counts (it was requested and is before its visible_at) ...
    with session_factory.begin() as session:
        session.execute(update(Release).values(visible_at=now))
    # ... and stops counting at its own visible_at, a public moment, whatever its state.
    assert _probe_padding(session_factory, settings, probe["id"], now) < seen[0]
