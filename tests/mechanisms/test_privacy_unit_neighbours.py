"""A randomized replace-one-PERSON search over the one-shot person-level inputs (outside audit,
issue 34): the person replaced has 1, a few or the maximum number of rows, rows at extreme
finite scales (1e-300 to 1e300), collinear or spread; the statistic each mechanism adds noise
to moves by at most the sensitivity its calibration assumes:

- the bounded Gram ``H = sum_p G_p'`` (both rules, with and without a public centre):
  ``sqrt(2) C^2`` in Frobenius norm (so in upper triangle and eigenvalues);
- each person's own size after the bound (trace or Frobenius) at most ``C^2``, every row within
  ``C`` (so the trace rule's explained-variance pair is a point of ``a + b <= C^2``);
- the person means' average (private centre): ``2 C / P``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from service.mechanisms.centring import mean_sensitivity
from service.privacy_unit import bound_contributions
from service.privacy_unit_centre import person_means

SQRT2 = math.sqrt(2.0)
TOL = 1e-9
MAX_ROWS = 200
SCALES = (1e-300, 1e-150, 1e-3, 0.4, 1.0, 3.0, 1e150, 1e300)


def person(rng: np.random.Generator, d: int) -> np.ndarray:
    count = int(rng.choice([1, int(rng.integers(2, 12)), MAX_ROWS]))
    if rng.random() < 0.5:
        rows = np.outer(rng.standard_normal(count), rng.standard_normal(d))
    else:
        rows = rng.standard_normal((count, d))
    return rows * float(rng.choice(SCALES))


def crowd(rng: np.random.Generator, d: int, n_people: int, most: int):
    """``n_people`` other people of at most ``most`` rows each, and their unit index."""
    groups = [person(rng, d)[:most] for _ in range(n_people)]
    units = np.concatenate([np.full(g.shape[0], i, np.int64) for i, g in enumerate(groups)])
    return np.vstack(groups), units


def with_person(others: np.ndarray, units: np.ndarray, rows: np.ndarray, rng: np.random.Generator):
    """The others' rows with the person's rows inserted at random places (index P)."""
    data = np.vstack([others, rows])
    labels = np.concatenate([units, np.full(rows.shape[0], int(units.max()) + 1)])
    order = rng.permutation(data.shape[0])
    return data[order], labels[order]


@pytest.mark.parametrize("rule", ["trace", "frobenius"])
@pytest.mark.parametrize("centred", [False, True])
def test_replacing_a_person_moves_the_bounded_gram_by_at_most_sqrt2_c_squared(
    rule: str, centred: bool
) -> None:
    rng = np.random.default_rng(3403)
    d, clip = 4, 1.7
    center = rng.standard_normal(d) * 0.5 if centred else None
    worst = 0.0
    for _ in range(150):
        others, units = crowd(rng, d, 6, 5)
        grams = []
        for _side in range(2):
            data, labels = with_person(others, units, person(rng, d), rng)
            out = bound_contributions(data, labels, clip, rule, center=center)  # type: ignore[arg-type]
            assert np.all(np.isfinite(out))
            assert np.all(np.linalg.norm(out, axis=1) <= clip * (1 + TOL))
            mine = out[labels == int(units.max()) + 1]
            size = np.trace(mine.T @ mine) if rule == "trace" else np.linalg.norm(mine.T @ mine)
            assert size <= clip**2 * (1 + TOL)
            grams.append(out.T @ out)
        worst = max(worst, float(np.linalg.norm(grams[0] - grams[1])) / clip**2)
    assert worst <= SQRT2 * (1 + TOL)
    assert worst > 1.0


def test_replacing_a_person_moves_the_mean_of_person_means_by_at_most_2c_over_p() -> None:
    rng = np.random.default_rng(3404)
    d, clip, n_people = 3, 1.3, 8
    worst = 0.0
    for _ in range(200):
        others, units = crowd(rng, d, n_people - 1, 4)
        means = []
        for _side in range(2):
            data, labels = with_person(others, units, person(rng, d), rng)
            found = person_means(data, labels, clip, n_people)
            assert np.all(np.isfinite(found))
            means.append(found.mean(axis=0))
        worst = max(worst, float(np.linalg.norm(means[0] - means[1])))
    assert worst <= mean_sensitivity(clip, n_people) * (1 + TOL)
