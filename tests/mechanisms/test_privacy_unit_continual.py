"""Issue 34: continual releases per person (service.privacy_unit.continual_batch_rows).

Each person has one bound over all batches: their rows in each batch are scaled (Frobenius
rule) to what their earlier batches left of ``C^2``. Calibration: replacing one person (rows in
any batches) moves each level of the tree by at most ``sqrt(2) C^2`` (brute force over the
leaves, and a randomized replace-one-person search). Audit: neighbours differing in one person
of 20 rows stay under the claimed epsilon; the same release per row is caught.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import pytest

from service.mechanisms.base import PublicContext, ReleaseSpec
from service.mechanisms.continual_gauss import ContinualGauss, ContinualGaussParams
from service.privacy_unit import continual_batch_rows, first_batch_rows
from tests.mechanisms.privacy_audit import audit

SQRT2 = math.sqrt(2.0)


def leaves(
    batches: list[np.ndarray], units: np.ndarray, clip: float = 1.0, person: int | None = None
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Each batch's Gram after the per-person rule (usage carried from batch to batch, as the
    release's state carries it), and ``person``'s own Gram in each batch."""
    grams, own, offset, used = [], [], 0, np.zeros(0)
    for rows in batches:
        end = offset + rows.shape[0]
        kept, used = continual_batch_rows(rows, units[:end], offset, clip, used)
        grams.append(kept.T @ kept)
        if person is not None:
            mine = kept[units[offset:end] == person]
            own.append(mine.T @ mine)
        offset = end
    return grams, own


def test_a_returning_person_takes_what_their_earlier_batches_left() -> None:
    """The carried item: a person seen in an earlier epoch used to have their later rows
    dropped; now they count within the one bound (before: all zero)."""
    e1, e2 = np.eye(3)[0], np.eye(3)[1]
    batches = [
        np.vstack([0.5 * e1, e1, e2, e1]),  # person 0: trace 0.25; person 1: F = sqrt 2; 2: 1
        np.vstack([e2, e2, e2, e1, 3 * e2]),  # 0 returns (3 rows), 1 returns, 3 new
        np.vstack([e1, e1]),  # 0 again
    ]
    units = np.array([0, 1, 1, 2, 0, 0, 0, 1, 3, 0, 0])
    sizes = []
    for person in range(4):
        own = leaves(batches, units, person=person)[1]
        sizes.append([float(np.linalg.norm(g)) for g in own])
    assert sizes[0][0] == pytest.approx(0.25)
    assert sizes[0][1] == pytest.approx(0.75)  # 3 collinear unit rows (F = 3), scaled to 0.75
    assert sizes[0][2] == 0.0  # used up
    assert sizes[1][1] == 0.0  # used up in their first batch
    assert sizes[3] == [0.0, pytest.approx(1.0), 0.0]
    assert all(sum(person) <= 1.0 + 1e-12 for person in sizes)
    _, used = continual_batch_rows(batches[0], units[:4], 0, 1.0, np.zeros(0))
    kept, after = continual_batch_rows(batches[1], units[:9], 4, 1.0, used)
    np.testing.assert_allclose(after, [1.0, 1.0, 1.0, 1.0])
    # Usage is the person's own: another person's rows never change it.
    other = batches[1].copy()
    other[4] *= 1e6
    np.testing.assert_array_equal(
        continual_batch_rows(other, units[:9], 4, 1.0, used)[0][:3], kept[:3]
    )


def test_a_state_from_before_usage_keeps_its_rule_and_a_bad_one_is_refused() -> None:
    rows = np.eye(3)[[0, 1]]
    units = np.array([0, 1, 0, 2])
    legacy, after = continual_batch_rows(rows, units, 2, 1.0, None)
    assert np.all(legacy[0] == 0.0) and np.all(legacy[1] == rows[1])
    np.testing.assert_array_equal(after, [1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="people"):
        continual_batch_rows(rows, units, 2, 1.0, np.zeros(5))


def test_a_returning_person_is_zeroed_and_new_people_are_bounded() -> None:
    rng = np.random.default_rng(1)
    units = np.array([0, 0, 1, 1, 0, 2, 2, 2, 1])
    rows = rng.standard_normal((9, 3)) * 3
    kept = first_batch_rows(rows[4:], units, 4, 1.0)
    assert np.all(kept[[0, 4]] == 0.0)  # persons 0 and 1 came before the batch
    person = kept[1:4]
    assert np.linalg.norm(person.T @ person) <= 1.0 + 1e-9
    # The returning rows never touch a new person's factor.
    other = rows[4:].copy()
    other[[0, 4]] = 1e6
    np.testing.assert_array_equal(first_batch_rows(other, units, 4, 1.0), kept)


def test_replacing_a_person_moves_each_level_by_at_most_one_rows_sensitivity() -> None:
    rng = np.random.default_rng(2)
    worst = 0.0
    for _ in range(30):
        base = [rng.standard_normal((6, 3)) for _ in range(4)]
        base_units = [np.arange(6) + 6 * b for b in range(4)]
        # Some base people return in later batches.
        base_units[2][:2] = [0, 1]
        sides = []
        for placement in (rng.integers(0, 4, size=20), rng.integers(0, 4, size=3)):
            batches, units = [], []
            for b in range(4):
                extra = int(np.count_nonzero(placement == b))
                batches.append(np.vstack([base[b], rng.standard_normal((extra, 3)) * 5]))
                units.append(np.concatenate([base_units[b], np.full(extra, 99)]))
            # Dense indices in order of first appearance, as the store keeps them.
            flat = np.concatenate(units)
            _, first = np.unique(flat, return_index=True)
            rank = {value: i for i, value in enumerate(flat[np.sort(first)])}
            dense = np.array([rank[value] for value in flat])
            sides.append(leaves(batches, dense)[0])
        # Dyadic levels over 4 leaves: leaves, pairs, the root.
        for width in (1, 2, 4):
            change = [
                np.linalg.norm(sum(sides[0][j : j + width]) - sum(sides[1][j : j + width]))
                for j in range(0, 4, width)
            ]
            worst = max(worst, float(np.linalg.norm(change)))
    assert worst <= SQRT2 + 1e-9
    assert worst > 1.0


# ---------------------------------------------------------------------------------------------
# Empirical audit: one person of 20 rows, on e1 or on e2, in the first of two batches.

EPS, DELTA = 1.0, 1e-5
CROSS = np.vstack([np.tile(v, (20, 1)) for v in ([1.0, 0], [-1.0, 0], [0, 1.0], [0, -1.0])])
PAIR = (
    np.vstack([CROSS, np.tile([1.0, 0.0], (20, 1))]),
    np.vstack([CROSS, np.tile([0.0, 1.0], (20, 1))]),
)
UNITS = np.concatenate([np.arange(80), np.full(20, 80), np.arange(80)])
SECOND = CROSS * 0.5  # the same 80 people return in batch 2
MECHANISM = ContinualGauss()
SPEC = ReleaseSpec(
    1,
    EPS,
    DELTA,
    MECHANISM.prepare(
        PublicContext(n_rows=100, n_cols=2, row_norm_bound=1.0),
        1,
        EPS,
        DELTA,
        ContinualGaussParams(horizon=2),
    ),
)


def two_epochs(first: np.ndarray, rng: np.random.Generator, person: bool) -> Any:
    state = MECHANISM.start(2, SPEC)
    offset = 0
    output = None
    used = np.zeros(0)
    for rows in (first, SECOND):
        end = offset + rows.shape[0]
        batch = rows
        if person:
            batch, used = continual_batch_rows(rows, UNITS[:end], offset, 1.0, used)
        state, output = MECHANISM.advance(state, batch, SPEC, rng)
        offset = end
    return output


def near_e1(output: Any) -> bool:
    return bool(output.basis[0, 0] ** 2 > 0.5)


def test_continual_person_level_audit_and_its_row_calibrated_control(runs: int = 1500) -> None:
    passed = audit(
        lambda data, rng: two_epochs(data, rng, True), *PAIR, near_e1, runs, DELTA, seed=41
    )
    assert passed.eps_lower_bound <= EPS, passed
    caught = audit(
        lambda data, rng: two_epochs(data, rng, False), *PAIR, near_e1, runs, DELTA, seed=42
    )
    assert caught.eps_lower_bound > EPS, caught


# ---------------------------------------------------------------------------------------------
# Randomized replace-one-person search: the person replaced has 1, many or the maximum rows,
# rows at extreme scales, and rows split over the batches (returning in later epochs).

MAX_ROWS = 40


def _person_rows(rng: np.random.Generator, d: int) -> np.ndarray:
    count = int(rng.choice([1, int(rng.integers(2, 8)), MAX_ROWS]))
    scale = float(rng.choice([1e-300, 1e-3, 0.3, 1.0, 7.0, 1e150, 1e300]))
    rows = rng.standard_normal((count, d))
    if rng.random() < 0.5:  # collinear rows: the Frobenius size equals the trace
        rows = np.outer(rng.standard_normal(count), rng.standard_normal(d))
    return rows * scale


def _dataset(
    rng: np.random.Generator,
    horizon: int,
    others: list[tuple[np.ndarray, np.ndarray]],
    person: np.ndarray,
) -> tuple[list[np.ndarray], np.ndarray, int]:
    """Batches (the others' rows where they are, the person's spread over random batches),
    the dense unit index (order of first appearance), and the person's index."""
    batches: list[list[np.ndarray]] = [[] for _ in range(horizon)]
    labels: list[list[int]] = [[] for _ in range(horizon)]
    for label, (rows, where) in enumerate(others):
        for row, b in zip(rows, where, strict=True):
            batches[b].append(row)
            labels[b].append(label)
    spread = rng.integers(0, horizon, size=person.shape[0])
    if rng.random() < 0.3:
        spread[:] = rng.integers(0, horizon)
    for row, b in zip(person, spread, strict=True):
        batches[b].append(row)
        labels[b].append(-1)
    flat = np.concatenate([np.asarray(x, dtype=np.int64) for x in labels])
    _, first = np.unique(flat, return_index=True)
    rank = {value: i for i, value in enumerate(flat[np.sort(first)])}
    dense = np.array([rank[value] for value in flat], dtype=np.int64)
    d = person.shape[1]
    stacked = [np.asarray(rows).reshape(-1, d) for rows in batches]
    return stacked, dense, rank[-1]


def test_replacing_a_person_randomized_stays_within_the_calibrated_sensitivity() -> None:
    rng = np.random.default_rng(3402)
    d, clip = 3, 2.5
    worst_level, worst_total, worst_own = 0.0, 0.0, 0.0
    for trial in range(60):
        horizon = 4 if trial % 2 else 8
        others = []
        for _ in range(8):
            rows = _person_rows(rng, d)[: int(rng.integers(1, 6))]
            others.append((rows, rng.integers(0, horizon, size=rows.shape[0])))
        sides, owns = [], []
        for _ in range(2):
            batches, units, person = _dataset(rng, horizon, others, _person_rows(rng, d))
            grams, own = leaves(batches, units, clip, person)
            assert all(np.all(np.isfinite(g)) for g in grams)
            sides.append(grams)
            owns.append(own)
        for own in owns:
            worst_own = max(worst_own, sum(float(np.linalg.norm(g)) for g in own) / clip**2)
        total = 0.0
        width = 1
        while width <= horizon:
            change = [
                np.linalg.norm(sum(sides[0][j : j + width]) - sum(sides[1][j : j + width]))
                for j in range(0, horizon, width)
            ]
            level = float(np.linalg.norm(change)) / clip**2
            worst_level = max(worst_level, level)
            total += level**2
            width *= 2
        levels = int(math.log2(horizon)) + 1
        worst_total = max(worst_total, math.sqrt(total / levels))
    # Each person within one bound over all batches; each level moves by at most one row's
    # sqrt(2) C^2, so all the released nodes by sqrt(L) sqrt(2) C^2, as calibrated.
    assert worst_own <= 1.0 + 1e-9
    assert worst_level <= SQRT2 + 1e-9
    assert worst_total <= SQRT2 + 1e-9
    assert worst_level > 1.2  # the search reaches near the bound


def test_the_state_keeps_each_persons_usage_between_epochs() -> None:
    state = MECHANISM.start(2, SPEC)
    assert MECHANISM.start(2, SPEC).person_used is None
    kept = dataclasses.replace(state, person_used=np.array([0.25, 1.0, 0.0]))
    again = type(state).from_bytes(kept.to_bytes())
    np.testing.assert_array_equal(again.person_used, [0.25, 1.0, 0.0])
    assert type(state).from_bytes(state.to_bytes()).person_used is None


# The distinguishing person returns: one tiny row in batch 1 (almost none of their bound used)
# and 20 rows on e1 or on e2 in batch 2, which now count (the rule used to drop them).
FIRST_SPLIT = np.vstack([CROSS, [[1e-3, 0.0]]])
SPLIT_PAIR = (np.tile([1.0, 0.0], (20, 1)), np.tile([0.0, 1.0], (20, 1)))
SPLIT_UNITS = np.concatenate([np.arange(81), np.full(20, 80)])


def split_epochs(second: np.ndarray, rng: np.random.Generator, person: bool) -> Any:
    state = MECHANISM.start(2, SPEC)
    used = np.zeros(0)
    output = None
    offset = 0
    for rows in (FIRST_SPLIT, second):
        end = offset + rows.shape[0]
        batch = rows
        if person:
            batch, used = continual_batch_rows(rows, SPLIT_UNITS[:end], offset, 1.0, used)
        state, output = MECHANISM.advance(state, batch, SPEC, rng)
        offset = end
    return output


def test_a_returning_persons_rows_count_and_stay_within_epsilon(runs: int = 1500) -> None:
    kept, _ = continual_batch_rows(
        SPLIT_PAIR[0], SPLIT_UNITS, 81, 1.0, np.concatenate([np.ones(80), [1e-6]])
    )
    assert np.linalg.norm(kept.T @ kept) == pytest.approx(1.0 - 1e-6)
    passed = audit(
        lambda data, rng: split_epochs(data, rng, True), *SPLIT_PAIR, near_e1, runs, DELTA, seed=43
    )
    assert passed.eps_lower_bound <= EPS, passed
    caught = audit(
        lambda data, rng: split_epochs(data, rng, False), *SPLIT_PAIR, near_e1, runs, DELTA, seed=44
    )
    assert caught.eps_lower_bound > EPS, caught
