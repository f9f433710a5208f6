"""Issue 34: the per-person contribution bound (service.privacy_unit).

Calibration: after the bound, replacing one whole person (up to 20 rows here) moves the Gram
matrix's upper triangle, its Frobenius norm, its eigenvalue vector and analyze_gauss's
explained-variance pair by at most ``sqrt(2) C^2``: one row's sensitivity, the one the
mechanisms are calibrated to. Audit: neighbours differing in one person with 20 rows stay under
the claimed epsilon with the bound, and the same mechanism calibrated per row (no bound) is
caught exceeding it.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from service.mechanisms.analyze_gauss import AnalyzeGauss, AnalyzeGaussParams
from service.mechanisms.base import PublicContext, ReleaseSpec
from service.mechanisms.linalg import clip_rows
from service.mechanisms.spectrum import Spectrum, SpectrumParams
from service.privacy_unit import (
    UnitIndexer,
    bound_contributions,
    rows_per_unit_buckets,
)
from tests.mechanisms.privacy_audit import audit

SQRT2 = math.sqrt(2.0)
TOL = 1e-9


def person_rows(rng: np.random.Generator, rows: int, d: int, scale: float) -> np.ndarray:
    """A person's rows: random directions and norms up to ``3 scale`` (many above C)."""
    return rng.standard_normal((rows, d)) * scale * rng.uniform(0, 3, size=(rows, 1))


def gram(rows: np.ndarray) -> np.ndarray:
    return rows.T @ rows


@pytest.mark.parametrize("rule", ["trace", "frobenius"])
@pytest.mark.parametrize("clip", [1.0, 3.5])
def test_every_person_is_within_the_bound_and_every_row_within_c(rule: Any, clip: float) -> None:
    rng = np.random.default_rng(1)
    d = 5
    sizes = rng.integers(1, 21, size=40)
    units = np.repeat(np.arange(40), sizes)
    rng.shuffle(units)
    data = person_rows(rng, units.size, d, clip)
    out = bound_contributions(data, units, clip, rule)
    assert np.linalg.norm(out, axis=1).max() <= clip * (1 + TOL)
    for person in range(40):
        g = gram(out[units == person])
        size = np.trace(g) if rule == "trace" else np.linalg.norm(g)
        assert size <= clip**2 * (1 + TOL)
        # Scaled, never more than needed: a person above the bound ends on it.
        before = gram(clip_rows(data[units == person], clip))
        before_size = np.trace(before) if rule == "trace" else np.linalg.norm(before)
        if before_size > clip**2:
            assert size == pytest.approx(clip**2, rel=1e-9)
        else:
            np.testing.assert_array_equal(
                out[units == person], clip_rows(data[units == person], clip)
            )


def test_one_row_per_person_is_exactly_the_row_level_input() -> None:
    rng = np.random.default_rng(2)
    data = rng.standard_normal((50, 4)) * 2
    for rule in ("trace", "frobenius"):
        out = bound_contributions(data, np.arange(50), 1.0, rule)  # type: ignore[arg-type]
        np.testing.assert_array_equal(out, clip_rows(data, 1.0))


def upper(matrix: np.ndarray) -> np.ndarray:
    rows, cols = np.triu_indices(matrix.shape[0])
    return matrix[rows, cols]


@pytest.mark.parametrize("rule", ["trace", "frobenius"])
def test_replacing_one_person_of_20_rows_moves_h_by_at_most_one_rows_sensitivity(
    rule: Any,
) -> None:
    rng = np.random.default_rng(3)
    d, clip = 4, 1.0
    others = rng.standard_normal((30, d))
    other_units = np.arange(30)
    worst_upper = worst_eigen = 0.0
    for trial in range(300):
        # Adversarial shapes: collinear rows (one direction repeated) and spread-out ones.
        if trial % 2:
            a = np.tile(rng.standard_normal(d), (20, 1)) * 5
            b = np.tile(rng.standard_normal(d), (20, 1)) * 5
        else:
            a, b = person_rows(rng, 20, d, 2.0), person_rows(rng, int(rng.integers(1, 21)), d, 2)
        sides = []
        for person in (a, b):
            data = np.vstack([others, person])
            units = np.concatenate([other_units, np.full(person.shape[0], 30)])
            out = bound_contributions(data, units, clip, rule)
            sides.append(gram(out))
        change = sides[0] - sides[1]
        worst_upper = max(worst_upper, float(np.linalg.norm(upper(change))))
        eig = [np.sort(np.linalg.eigvalsh(side))[::-1] for side in sides]
        worst_eigen = max(worst_eigen, float(np.linalg.norm(eig[0] - eig[1])))
    assert worst_upper <= SQRT2 * clip**2 * (1 + TOL)
    assert worst_eigen <= SQRT2 * clip**2 * (1 + TOL)
    # The bound is attained (two orthogonal collinear people), so it is not loose either.
    e = np.eye(d)
    pair = [
        gram(bound_contributions(np.tile(e[i], (20, 1)) * 3, np.zeros(20, np.int64), clip, rule))
        for i in (0, 1)
    ]
    assert np.linalg.norm(upper(pair[0] - pair[1])) == pytest.approx(SQRT2 * clip**2)


def test_the_trace_rule_bounds_the_explained_variance_pair_and_frobenius_would_not() -> None:
    # analyze_gauss adds per row (||U^T y||^2, ||(I - UU^T) y||^2): per person their sums, whose
    # l2 change is at most sqrt(2) C^2 only if each person's trace is at most C^2.
    d, clip = 16, 1.0
    spread = np.eye(d) * 3  # one person, 16 orthogonal rows
    units = np.zeros(d, dtype=np.int64)
    by_trace = bound_contributions(spread, units, clip, "trace")
    by_frobenius = bound_contributions(spread, units, clip, "frobenius")
    assert np.sum(by_trace**2) == pytest.approx(clip**2)
    assert np.sum(by_frobenius**2) == pytest.approx(math.sqrt(d) * clip**2)  # trace 4 C^2
    rng = np.random.default_rng(4)
    basis = np.linalg.qr(rng.standard_normal((d, 3)))[0]
    worst = 0.0
    for _ in range(200):
        people = [person_rows(rng, int(rng.integers(1, 21)), d, 2) for _ in range(2)]
        pairs = []
        for rows in people:
            out = bound_contributions(rows, np.zeros(len(rows), np.int64), clip, "trace")
            captured = float(np.sum((out @ basis) ** 2))
            pairs.append(np.array([captured, float(np.sum(out**2)) - captured]))
        worst = max(worst, float(np.linalg.norm(pairs[0] - pairs[1])))
    assert worst <= SQRT2 * clip**2 * (1 + TOL)


@pytest.mark.parametrize("value", [1e300, 1e-300, 0.0, -1e200])
def test_the_bound_is_total_at_any_finite_scale(value: float) -> None:
    data = np.full((25, 3), value)
    data[::2] = 1.0
    units = np.arange(25) % 4
    for rule in ("trace", "frobenius"):
        out = bound_contributions(data, units, 2.0, rule)  # type: ignore[arg-type]
        assert np.isfinite(out).all()
        assert np.linalg.norm(out, axis=1).max() <= 2.0 * (1 + TOL)


def test_the_indexer_and_buckets() -> None:
    indexer = UnitIndexer()
    first = indexer.add(["a", "007", "a", "7"])
    second = indexer.add(np.array([7.0, 7, 8.5]))
    assert first.tolist() == [0, 1, 0, 2] and second.tolist() == [3, 3, 4]
    assert indexer.n_units == 5
    units = np.concatenate([np.zeros(30, np.int64), np.arange(1, 4), np.full(150, 4)])
    assert rows_per_unit_buckets(units) == {
        "1": 3,
        "2-5": 0,
        "6-20": 0,
        "21-100": 1,
        "over 100": 1,
    }


# ---------------------------------------------------------------------------------------------
# Empirical audit: neighbours differ in one person with 20 rows.

EPS, DELTA = 1.0, 1e-5
#: 20 people on e1 and 20 on e2, one row each; then the person who differs: 20 rows on e1 on
#: one side, 20 rows on e2 on the other (the worst case for the top eigenvector's side).
BASE = np.vstack([np.tile([1.0, 0.0], (20, 1)), np.tile([0.0, 1.0], (20, 1))])
BASE_UNITS = np.arange(40)
PAIR = (
    np.vstack([BASE, np.tile([1.0, 0.0], (20, 1))]),
    np.vstack([BASE, np.tile([0.0, 1.0], (20, 1))]),
)
UNITS = np.concatenate([BASE_UNITS, np.full(20, 40)])


def gauss_run(data: np.ndarray, rng: np.random.Generator) -> Any:
    mechanism = AnalyzeGauss()
    ctx = PublicContext(n_rows=data.shape[0], n_cols=2, row_norm_bound=1.0)
    params = mechanism.prepare(ctx, 1, EPS, DELTA, AnalyzeGaussParams())
    return mechanism.run(data, ReleaseSpec(1, EPS, DELTA, params), rng).basis


def person_level(data: np.ndarray, rng: np.random.Generator) -> Any:
    """What the worker runs on a person-level dataset."""
    return gauss_run(bound_contributions(data, UNITS, 1.0, "trace"), rng)


def near_e1(basis: np.ndarray) -> bool:
    return bool(basis[0, 0] ** 2 > 0.5)


def test_person_level_audit_stays_under_epsilon(runs: int = 1500) -> None:
    result = audit(person_level, *PAIR, near_e1, runs, DELTA, seed=11)
    assert result.eps_lower_bound <= EPS, result


def test_row_calibrated_control_is_caught(runs: int = 1500) -> None:
    # The same mechanism calibrated per row, on the same person-level neighbours: a person of
    # 20 rows moves H 20 times further than the noise is calibrated for.
    result = audit(gauss_run, *PAIR, near_e1, runs, DELTA, seed=12)
    assert result.eps_lower_bound > EPS, result


def spectrum_run(data: np.ndarray, rng: np.random.Generator) -> Any:
    mechanism = Spectrum()
    ctx = PublicContext(n_rows=data.shape[0], n_cols=2, row_norm_bound=1.0)
    params = mechanism.prepare(ctx, 2, EPS, DELTA, SpectrumParams())
    return mechanism.run(data, ReleaseSpec(2, EPS, DELTA, params), rng).extras["eigenvalues"]


#: Spectrum's worst case: the person adds 20 rows on e1 or nothing on the top eigenvalue (rows
#: of zeros), so the top eigenvalue moves by the whole bound.
SPECTRUM_PAIR = (PAIR[0], np.vstack([BASE, np.zeros((20, 2))]))


def top_above(values: list[float]) -> bool:
    return bool(values[0] > 20.5)


def test_spectrum_person_level_audit_and_its_row_calibrated_control(runs: int = 1500) -> None:
    def bounded(data: np.ndarray, rng: np.random.Generator) -> Any:
        return spectrum_run(bound_contributions(data, UNITS, 1.0, "frobenius"), rng)

    passed = audit(bounded, *SPECTRUM_PAIR, top_above, runs, DELTA, seed=13)
    assert passed.eps_lower_bound <= EPS, passed
    caught = audit(spectrum_run, *SPECTRUM_PAIR, top_above, runs, DELTA, seed=14)
    assert caught.eps_lower_bound > EPS, caught


@pytest.mark.slow
def test_person_level_audit_long() -> None:
    test_person_level_audit_stays_under_epsilon(runs=20_000)


@pytest.mark.parametrize("people", [1, 7, 3000])
@pytest.mark.parametrize("rule", ["trace", "frobenius"])
def test_the_memory_estimate_bounds_the_transform(people: int, rule: Any) -> None:
    import tracemalloc

    from service.privacy_unit import transform_bytes

    n, d = 3000, 40
    rng = np.random.default_rng(5)
    data = rng.standard_normal((n, d))
    units = (np.arange(n) % people).astype(np.int64)
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        bound_contributions(data, units, 1.0, rule, chunk_rows=1024)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak <= transform_bytes(n, d, chunk_rows=1024)


@pytest.mark.parametrize("rule", ["trace", "frobenius"])
def test_a_public_centre_is_applied_before_the_bound_as_the_mechanisms_centre(rule: Any) -> None:
    """Rows centred as the Gram mechanisms centre them (``gram_rows``), then bounded per
    person: one row per person is exactly the mechanisms' own centred rows, and every person
    of many rows is within the bound *after* centring (a bound made before would not be: rows
    at the origin have trace 0 and ``r ||c||^2`` once centred)."""
    from service.mechanisms.linalg import gram_rows

    rng = np.random.default_rng(9)
    data = rng.standard_normal((300, 4)) * 0.2
    center = np.array([0.5, -0.5, 0.0, 0.25])
    single = bound_contributions(data, np.arange(300), 1.0, rule, center=center)
    np.testing.assert_array_equal(single, gram_rows(data, 1.0, center))
    units = (np.arange(300) % 12).astype(np.int64)
    data[units == 0] = 0.0  # a person at the origin: nothing before centring, a lot after
    bounded = bound_contributions(data, units, 1.0, rule, center=center)
    for person in range(12):
        rows = bounded[units == person]
        g = rows.T @ rows
        size = np.trace(g) if rule == "trace" else np.linalg.norm(g)
        assert size <= 1.0 + 1e-9
    before = bound_contributions(data, units, 1.0, rule)[units == 0]
    assert np.all(before == 0.0)
    assert np.trace(gram_rows(before, 1.0, center).T @ gram_rows(before, 1.0, center)) > 5.0
