"""Issue 34: ``auto`` on a person-level dataset (service.privacy_unit_auto).

Its estimate reads each person's rows bounded to trace ``C^2`` (replacing one person moves the
tail and the trace by at most ``C^2``, as one row), friendly partitions people (excluded when
its ``t`` exceeds the people), analyze_gauss runs per person, delta = 0 (smooth_sensitivity) is
refused naming the unit. Audit: neighbours differing in one person of 20 rows stay under the
claimed epsilon; the same auto calibrated per row is caught.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from bench.grids import near_subspace
from service import privacy_unit_auto
from service.mechanisms import auto as auto_module
from service.mechanisms.auto import Auto, AutoParams, plan, tail_and_trace
from service.mechanisms.base import InvalidParameter, PublicContext, ReleaseSpec
from service.mechanisms.friendly_aggregate import FriendlyAggregate
from service.privacy_unit import bound_contributions
from service.privacy_unit_auto import person_level
from tests.mechanisms.privacy_audit import audit

AUTO = Auto()
K, DELTA, N = 3, 1e-6, 20_000


def ctx(n: int, d: int, people: int | None) -> PublicContext:
    return PublicContext(n_rows=n, n_cols=d, row_norm_bound=1.0, n_units=people)


def spec_for(n: int, d: int, people: int | None, eps: float = 1.0) -> ReleaseSpec[AutoParams]:
    params = AUTO.prepare(ctx(n, d, people), K, eps, DELTA, AutoParams())
    return ReleaseSpec(K, eps, DELTA, params)


def grouped(n: int, seed: int) -> np.ndarray:
    """1-20 rows per person, in order of first appearance."""
    counts = np.random.default_rng(seed).integers(1, 21, size=n)
    return np.repeat(np.arange(n), counts)[:n]


def test_delta_zero_is_refused_naming_the_unit() -> None:
    with pytest.raises(InvalidParameter) as refusal:
        plan(ctx(1000, 5, 100), K, 1.0, 0.0, AutoParams(clip_norm=1.0))
    assert refusal.value.field == "privacy_unit_column"
    assert "smooth_sensitivity" in refusal.value.message
    # Per row it is smooth_sensitivity, as before.
    assert plan(ctx(1000, 5, None), K, 1.0, 0.0, AutoParams(clip_norm=1.0)).default.name == (
        "smooth_sensitivity"
    )


def test_high_dimension_keeps_analyze_gauss_per_person() -> None:
    # 200 rows x 50 columns: 50 >= 200^(2/3) = 34, where auto offers spatial_sign per row;
    # spatial_sign has no person-level run, so a person-level plan keeps analyze_gauss.
    per_row = plan(ctx(200, 50, None), K, 1.0, DELTA, AutoParams(clip_norm=1.0))
    per_person = plan(ctx(200, 50, 40), K, 1.0, DELTA, AutoParams(clip_norm=1.0))
    assert {c.name for c in per_row.choices()} >= {"spatial_sign"}
    assert "spatial_sign" not in {c.name for c in per_person.choices()}
    assert per_person.default.name == "analyze_gauss"
    assert "no person-level run" in per_person.reason


def test_friendly_is_excluded_when_its_subsets_outnumber_the_people() -> None:
    row_level = plan(ctx(N, 10, None), K, 1.0, DELTA, AutoParams(clip_norm=1.0))
    assert row_level.sure is not None
    t = int(row_level.sure.run.params.t)  # type: ignore[attr-defined]
    few = plan(ctx(N, 10, t - 1), K, 1.0, DELTA, AutoParams(clip_norm=1.0))
    assert few.sure is None and few.default.name == "analyze_gauss"
    assert "friendly_aggregate excluded" in few.reason and f"has {t - 1}" in few.reason
    enough = plan(ctx(N, 10, t), K, 1.0, DELTA, AutoParams(clip_norm=1.0))
    assert enough.sure is not None
    assert any("privacy unit: person" in note for note in enough.notes)


def test_replacing_a_person_moves_the_estimate_by_at_most_c_squared() -> None:
    rng = np.random.default_rng(3)
    base = rng.standard_normal((200, 4)) * 0.4
    units = np.repeat(np.arange(40), 5)
    worst = 0.0
    for _ in range(20):
        sides = []
        for rows in (rng.standard_normal((20, 4)) * 3, rng.standard_normal((2, 4)) * 3):
            data = np.vstack([base, rows])
            who = np.concatenate([units, np.full(rows.shape[0], 40)])
            sides.append(tail_and_trace(bound_contributions(data, who, 1.0, "trace"), 2, 1.0))
        worst = max(worst, *(abs(a - b) for a, b in zip(*sides, strict=True)))
    assert worst <= 1.0 + 1e-9
    assert worst > 0.3


def test_friendly_partitions_people_and_analyze_gauss_runs_per_person(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data, _ = near_subspace(N, 10, K, 1e-5, seed=4)
    units = grouped(N, 5)
    people = int(units.max()) + 1
    seen: dict[str, Any] = {}
    real_search = FriendlyAggregate.search

    def search(self: Any, rows: Any, spec: Any, rng: Any, units_: Any = None) -> Any:
        seen["units"] = units_
        return real_search(self, rows, spec, rng, units_)

    gauss_runs: list[int] = []
    real_gauss = privacy_unit_auto.gauss_person_run

    def gauss(rows: Any, who: Any, spec: Any, rng: Any) -> Any:
        gauss_runs.append(int(who.max()) + 1)
        return real_gauss(rows, who, spec, rng)

    monkeypatch.setattr(FriendlyAggregate, "search", search)
    monkeypatch.setattr(privacy_unit_auto, "gauss_person_run", gauss)
    # The estimate says friendly wins: its search runs on the partition of people.
    monkeypatch.setattr(auto_module, "decide", lambda p, *args: p.sure)
    spec = spec_for(N, 10, people)
    out = AUTO.run(data, spec, np.random.default_rng(6), person=person_level(data, units, 1.0))
    assert seen["units"] is units
    assert out.extras["auto_choice"] in ("friendly_aggregate", "analyze_gauss")
    if out.extras["auto_choice"] == "analyze_gauss":
        assert gauss_runs == [people]
    # The estimate says analyze_gauss: it runs per person.
    monkeypatch.setattr(auto_module, "decide", lambda p, *args: None)
    gauss_runs.clear()
    out = AUTO.run(data, spec, np.random.default_rng(7), person=person_level(data, units, 1.0))
    assert out.extras["auto_choice"] == "analyze_gauss" and gauss_runs == [people]
    assert "privacy unit: person" in out.extras["auto_reason"] or "auto_search" in out.extras


# ---------------------------------------------------------------------------------------------
# Empirical audit: neighbours differ in one person with 20 rows (the whole of auto).

EPS = 1.0
CROSS = np.vstack([np.tile(v, (20, 1)) for v in ([1.0, 0], [-1.0, 0], [0, 1.0], [0, -1.0])])
PAIR = (
    np.vstack([CROSS, np.tile([1.0, 0.0], (20, 1))]),
    np.vstack([CROSS, np.tile([0.0, 1.0], (20, 1))]),
)
UNITS = np.concatenate([np.arange(80), np.full(20, 80)])


def small_spec(people: int | None) -> ReleaseSpec[AutoParams]:
    params = AUTO.prepare(ctx(100, 2, people), 1, EPS, 1e-5, AutoParams())
    return ReleaseSpec(1, EPS, 1e-5, params)


def near_e1(output: Any) -> bool:
    return bool(output.basis[0, 0] ** 2 > 0.5)


def test_auto_person_level_audit_and_its_row_calibrated_control(runs: int = 1500) -> None:
    person_spec, row_spec = small_spec(81), small_spec(None)

    def person(data: np.ndarray, rng: np.random.Generator) -> Any:
        return AUTO.run(data, person_spec, rng, person=person_level(data, UNITS, 1.0))

    def per_row(data: np.ndarray, rng: np.random.Generator) -> Any:
        return AUTO.run(data, row_spec, rng)

    passed = audit(person, *PAIR, near_e1, runs, 1e-5, seed=31)
    assert passed.eps_lower_bound <= EPS, passed
    caught = audit(per_row, *PAIR, near_e1, runs, 1e-5, seed=32)
    assert caught.eps_lower_bound > EPS, caught
