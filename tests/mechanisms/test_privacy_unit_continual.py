"""Issue 34: continual releases per person (service.privacy_unit.first_batch_rows).

Each person counts in the batch of their first row only, bounded there by the Frobenius rule.
Calibration: replacing one person (rows in any batches) moves each level of the tree by at most
``sqrt(2) C^2`` (brute force over the leaves). Audit: neighbours differing in one person of 20
rows stay under the claimed epsilon; the same release per row is caught.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from service.mechanisms.base import PublicContext, ReleaseSpec
from service.mechanisms.continual_gauss import ContinualGauss, ContinualGaussParams
from service.privacy_unit import first_batch_rows
from tests.mechanisms.privacy_audit import audit

SQRT2 = math.sqrt(2.0)


def leaves(batches: list[np.ndarray], units: np.ndarray) -> list[np.ndarray]:
    """Each batch's Gram after the per-person rule."""
    grams, offset = [], 0
    for rows in batches:
        end = offset + rows.shape[0]
        kept = first_batch_rows(rows, units[:end], offset, 1.0)
        grams.append(kept.T @ kept)
        offset = end
    return grams


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
            sides.append(leaves(batches, dense))
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
    for rows in (first, SECOND):
        end = offset + rows.shape[0]
        batch = first_batch_rows(rows, UNITS[:end], offset, 1.0) if person else rows
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
