"""The finite-``d`` simulation behind the forecast from an earlier release (issue 32 item 4,
:func:`service.mechanisms.gauss_forecast.range_at`): a modelled spectrum plus fresh Gram noise,
its top ``k`` eigenvectors, the share of the centred variance they keep. The draws come from a
fixed seed: a deterministic quadrature of the model's expectation and spread, a function of
released figures only (post-processing, not privacy noise)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from service.mechanisms.linalg import FloatArray

#: Noise draws of the simulation, from a fixed seed: a deterministic quadrature of the
#: model's expectation, not privacy noise (the forecast is post-processing of released values).
SIMULATION_DRAWS = 12
SIMULATION_SEED = 20261130
#: A fresh release's 90% two-sided prediction interval from :data:`SIMULATION_DRAWS` simulated
#: releases: the 0.95 quantile of Student's t with ``draws - 1`` degrees of freedom times
#: ``sqrt(1 + 1/draws)`` (the simulated mean's own error), in units of the draws' sd. With 12
#: draws: 1.796 x 1.041 = 1.870, where Z (1.645) treated the estimated sd as known.
PREDICTION_T = 1.7958848187036691 * math.sqrt(1.0 + 1.0 / SIMULATION_DRAWS)


@dataclass(frozen=True)
class Model:
    """The spectrum a forecast simulates (:func:`simulated_share`): the known eigenvalues
    ``values`` (Gram units) with the shares ``shares`` of the centred variance along them,
    the other directions' eigenvalues ``tail_values`` (:func:`~service.mechanisms.
    forecast_tail.tail_spectrum`, ``d - m`` of them) holding ``tail_shares`` of the variance,
    and a noise spike of size ``spike`` along a random direction (the private mean's; 0
    without)."""

    values: FloatArray
    shares: FloatArray
    tail_values: FloatArray
    tail_shares: FloatArray
    spike: float


def simulated_share(model: Model, d: int, k: int, sigma: float) -> tuple[float, float]:
    """The share of the centred variance the top ``k`` eigenvectors of ``diag(model) + spike u
    u^T + E(sigma)`` keep: its mean and standard deviation over :data:`SIMULATION_DRAWS`
    draws from the fixed :data:`SIMULATION_SEED` (a deterministic function of released
    figures: post-processing). The finite-``d`` counterpart of the spiked-Wigner overlaps;
    the standard deviation is a release's own draw-to-draw spread in the model."""
    m = model.values.shape[0]
    k = min(k, d)
    diagonal = np.concatenate([model.values, model.tail_values[: d - m]])
    weights = np.concatenate([model.shares, model.tail_shares[: d - m]])
    rng = np.random.default_rng(SIMULATION_SEED)
    kept = np.zeros(SIMULATION_DRAWS)
    for draw in range(SIMULATION_DRAWS):
        from service.mechanisms.noise import symmetric_gaussian  # no import cycle

        matrix = symmetric_gaussian(d, sigma, rng)
        matrix[np.diag_indices(d)] += diagonal
        direction = rng.standard_normal(d)
        if model.spike > 0:
            direction /= np.linalg.norm(direction)
            matrix += model.spike * np.outer(direction, direction)
        _, vectors = np.linalg.eigh(matrix)
        top = vectors[:, d - k :]
        kept[draw] = float(np.sum(weights[:, None] * top**2))
    return float(kept.mean()), float(kept.std(ddof=1)) if SIMULATION_DRAWS > 1 else 0.0
