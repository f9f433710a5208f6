"""The private radius search of M6 ``friendly_aggregate``: AboveThreshold over ``W(r_i)``.

ALGORITHMS.md M6, unknown ``r``: AboveThreshold (sparse vector) with ``eps0`` over the public grid
``r_i = r_max 2^{-i}``, smallest first, querying the total weight ``W(r_i)``
(``friendly_weights``) against a public threshold; none above: ``r = r_max``. ``r_max`` is a
public bound on all distances (``||P||_F`` for reference points, ``sqrt(2k)`` for projections).

Privacy argument: one replaced row moves one point, so each query ``W(r_i)`` has sensitivity
``Delta_W = 1 + (t-1)/b`` (``friendly_weights``: the counts come from per-pair distances).
AboveThreshold with threshold noise ``Lap(2 Delta_W/eps0)`` and query noise ``Lap(4 Delta_W/eps0)``
(Dwork & Roth 2014, Algorithm 1) is ``(eps0, 0)``-DP however many radii are asked; the
threshold (:data:`THRESHOLD_FRACTION` of ``t``, or the weight the test needs,
``friendly_ptr.split_search_threshold``) and the grid are public functions of ``t``, the budget
and ``r_max``. A given radius costs nothing (``eps0 = 0``). Any radius used is floored at
``r_max 2^{-26}`` (projections ``r_max 2^{-17}``, :func:`radius_floor`), far above the rounding
of the distances. The same :func:`above_threshold` serves ``width_selection`` (M5's width).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from service.mechanisms.friendly_weights import (
    Aggregator,
    BlockFn,
    count_friends,
    ramp_width,
    total_weight,
    weight_sensitivity,
    weights_from_counts,
)
from service.mechanisms.linalg import FloatArray
from service.mechanisms.noise import laplace

#: Radii searched: ``r_i = r_max 2^{-i}`` for ``i = RADIUS_STEPS, ..., 1, 0`` (smallest first),
#: and the public floor on any radius (given or searched): ``r_max 2^{-26} ~ 1.5e-8 r_max``, the
#: first power of two above ``1e-8 r_max``. It is far above the rounding of the direct-difference
#: distances (a few ``eps_machine`` relative) and of the weighted mean (``~ eps_machine r_max``),
#: so a distance compared with the radius, and the mean whose sensitivity is proportional to
#: it, are not dominated by rounding. Every extra radius is also one more chance for
#: AboveThreshold to stop spuriously, so the grid stops there.
RADIUS_STEPS = 26
#: The same for the projection aggregator, whose distances ``sqrt(2k - 2||U_j^T U_l||_F^2)``
#: carry an absolute rounding of ``~ 2e-8 r_max``: floor ``r_max 2^{-17} ~ 7.6e-6 r_max``.
PROJECTION_RADIUS_STEPS = 17
#: AboveThreshold stops at the first radius whose total weight exceeds this fraction of ``t``
#: (or the weight the test needs, if larger: :func:`radius_search_threshold`).
THRESHOLD_FRACTION = 0.75


def radius_grid(r_max: float, steps: int = RADIUS_STEPS) -> FloatArray:
    """``r_max 2^{-i}`` for ``i = steps, ..., 0``: ascending, as AboveThreshold asks them."""
    return np.asarray(r_max * np.exp2(-np.arange(steps, -1, -1, dtype=np.float64)))


def radius_steps(aggregator: Aggregator) -> int:
    """Grid depth: the floor ``r_max 2^{-steps}`` of each aggregator's distances."""
    return RADIUS_STEPS if aggregator == "reference_points" else PROJECTION_RADIUS_STEPS


def radius_floor(r_max: float, aggregator: Aggregator) -> float:
    """Public floor on any radius used: ``r_max 2^{-26} ~ 1.5e-8 r_max`` (reference points),
    ``r_max 2^{-17} ~ 7.6e-6 r_max`` (projections); the smallest point of the search grid."""
    return float(r_max * 2.0 ** -radius_steps(aggregator))


def above_threshold(
    answers: FloatArray,
    threshold: float,
    sensitivity: float,
    epsilon: float,
    rng: np.random.Generator,
) -> int | None:
    """AboveThreshold (sparse vector, one positive answer): index of the first noisy answer
    above the noisy threshold, or ``None``.

    Dwork & Roth, The Algorithmic Foundations of Differential Privacy (2014), Algorithm 1, for
    queries of sensitivity ``Delta``: noisy threshold ``T + Lap(2 Delta/eps)``, each query
    ``f_i + Lap(4 Delta/eps)``, halt at the first ``f_i + nu_i >= T_hat``. ``eps``-DP however many
    queries are asked. Answers are computed up front (they are cheap); that is the same
    distribution as asking them one at a time.

    Parameters
    ----------
    answers : (r,) array
        True query answers in the order asked.
    """
    noisy_threshold = threshold + float(laplace(2.0 * sensitivity / epsilon, rng))
    query_noise = laplace(4.0 * sensitivity / epsilon, rng, size=answers.shape[0])
    above = np.flatnonzero(answers + query_noise >= noisy_threshold)
    return int(above[0]) if above.size else None


def above_threshold_lazy(
    answer: Callable[[int], float],
    count: int,
    threshold: float,
    sensitivity: float,
    epsilon: float,
    rng: np.random.Generator,
) -> int | None:
    """:func:`above_threshold` asking the queries one at a time (``answer(i)`` for
    ``i = 0, 1, ...``) and none after the first noisy answer above the noisy threshold.

    The textbook form of the algorithm (Dwork & Roth, Algorithm 1); it draws the same noise
    from ``rng`` in the same order as :func:`above_threshold` (the threshold's, then all
    ``count`` queries' at once), and compares the same sums, so with the same draws it returns
    the same index, bit for bit. For queries that are costly and whose later ones are never
    used once the search has stopped.
    """
    noisy_threshold = threshold + float(laplace(2.0 * sensitivity / epsilon, rng))
    query_noise = laplace(4.0 * sensitivity / epsilon, rng, size=count)
    for i in range(count):
        if answer(i) + query_noise[i] >= noisy_threshold:
            return i
    return None


def search_radius(
    block: BlockFn,
    t: int,
    radii: FloatArray,
    eps0: float,
    rng: np.random.Generator,
    *,
    rows: int,
    workers: int = 1,
    threshold: float | None = None,
) -> tuple[int | None, FloatArray]:
    """The private radius search: AboveThreshold over ``W(r_i)``, smallest radius first.

    Queries ``W(r_i)`` (sensitivity ``Delta_W``: the counts come from per-pair distances, so one
    moved point changes its own weight by at most 1 and each other weight by at most ``1/b``)
    against the public ``threshold`` (default ``0.75 t``; the mechanism passes
    :func:`radius_search_threshold`), ``eps0``-DP.

    Parameters
    ----------
    block : distance blocks of the ``t`` points
    radii : (R,) ascending grid
    eps0 : float

    Returns
    -------
    stop : int or None
        Index of the first radius above the noisy threshold, ``None`` when none is.
    weights : (t, R) array
        The weights at every radius (so the chosen one needs no second pass).
    """
    b = ramp_width(t)
    counts = count_friends(block, t, radii, rows=rows, workers=workers)
    weights = weights_from_counts(counts, t, b)
    totals = np.array([total_weight(column) for column in weights.T])
    sens = weight_sensitivity(t, b)
    bar = THRESHOLD_FRACTION * t if threshold is None else threshold
    return above_threshold(totals, bar, sens, eps0, rng), weights
