"""The finite-``d`` simulation behind the forecast from an earlier release (issue 32 item 4,
:func:`service.mechanisms.gauss_release_forecast.range_at`): a modelled spectrum plus fresh
Gram noise, its top ``k`` eigenvectors, the share of the centred variance they keep. The draws
come from a fixed seed: a deterministic quadrature of the model's expectation and spread, a
function of released figures only (post-processing, not privacy noise)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from service.mechanisms.linalg import FloatArray

#: The seed of the simulation's draws: a deterministic quadrature of the model's expectation
#: and spread, not privacy noise (the forecast is post-processing of released values), so a
#: request's forecast is the same every time it is asked.
SIMULATION_SEED = 20261130
#: The draws per simulation: ``12 (256 / d)^2`` within ``[MIN_DRAWS, MAX_DRAWS]``. Twelve
#: fixed draws erred the same way in every forecast (one model: sd 0.051 from 12 draws, 0.077
#: from 300; digits k 1: overstated), which Student t's factor does not cover. The cost bound
#: (measured 30 Nov 2026, one ``symmetric_gaussian`` + ``eigh``: 2.2 ms at d <= 64, 5.8 ms at
#: 100, 7.1 ms at 128, 15 ms at 180, 22 ms at 256): a simulation costs at most about 1.5x the
#: 12 draws' at d = 256 (0.27 s) up to d = 180, and 2x it at 256 (the floor of 24).
MIN_DRAWS = 24
MAX_DRAWS = 64
#: The 90% prediction interval's tails: a fresh draw falls below the ``j``-th smallest of
#: ``n`` exchangeable draws with chance ``j / (n + 1)``, so ``[x_(j), x_(n+1-j)]`` with
#: ``j = floor(0.05 (n + 1))`` holds it with chance at least 0.9, whatever the draws'
#: distribution (a share is bounded and, at k = 1 near the noise's edge, skewed).
TAIL = 0.05


def simulation_draws(d: int) -> int:
    """The number of simulated releases at dimension ``d`` (:data:`MIN_DRAWS` ..
    :data:`MAX_DRAWS`, fewer as an ``eigh`` costs more)."""
    wanted = int(12.0 * (256.0 / max(d, 1)) ** 2)
    return max(MIN_DRAWS, min(MAX_DRAWS, wanted))


class Simulated(NamedTuple):
    """A simulation's outcome: the draws' ``mean`` and standard deviation ``spread``, and a
    fresh release's 90% prediction interval around the mean, ``mean - below`` to ``mean +
    above``, from the draws' order statistics (:data:`TAIL`)."""

    mean: float
    spread: float
    below: float
    above: float


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


#: The simulations already run in the current forecast (:func:`request_cache`), by their exact
#: inputs. A context variable, so each thread and task sees only its own request's.
_CACHE: ContextVar[dict[tuple[object, ...], Simulated] | None] = ContextVar(
    "forecast_simulation_cache", default=None
)


@contextmanager
def request_cache() -> Iterator[None]:
    """A cache of :func:`simulated_share` for one request's forecast (nested scopes share the
    outermost one). One forecast simulates the same model more than once (the readings of
    :func:`~service.mechanisms.gauss_release_forecast.range_from_release` share the anchoring and,
    where the tail is already resolved, the profiled model); the draws come from a fixed
    seed, so a repeat is the same outcome. Never kept across requests: a cache shared
    between callers would let one analyst time whether another had just asked a forecast
    from the same released figures (a hit is faster than a miss)."""
    if _CACHE.get() is not None:
        yield
        return
    token = _CACHE.set({})
    try:
        yield
    finally:
        _CACHE.reset(token)


def _key(model: Model, d: int, k: int, sigma: float) -> tuple[object, ...]:
    def exact(values: FloatArray) -> bytes:
        return np.asarray(values, dtype=np.float64).tobytes()

    return (
        exact(model.values),
        exact(model.shares),
        exact(model.tail_values),
        exact(model.tail_shares),
        float(model.spike),
        d,
        k,
        float(sigma),
    )


def simulated_share(model: Model, d: int, k: int, sigma: float) -> Simulated:
    """:func:`_simulate`, read from the current request's cache (:func:`request_cache`) when
    the same model was simulated in it already (the same inputs, so the same outcome)."""
    cache = _CACHE.get()
    if cache is None:
        return _simulate(model, d, k, sigma)
    key = _key(model, d, k, sigma)
    found = cache.get(key)
    if found is None:
        found = cache[key] = _simulate(model, d, k, sigma)
    return found


def _simulate(model: Model, d: int, k: int, sigma: float) -> Simulated:
    """The share of the centred variance the top ``k`` eigenvectors of ``diag(model) + spike u
    u^T + E(sigma)`` keep over :func:`simulation_draws` draws from the fixed
    :data:`SIMULATION_SEED` (a deterministic function of released figures: post-processing):
    their mean, standard deviation and a fresh release's 90% prediction interval from their
    order statistics. The finite-``d`` counterpart of the spiked-Wigner overlaps; the spread
    is a release's own draw-to-draw spread in the model."""
    from service.mechanisms.noise import symmetric_gaussian  # no import cycle

    m = model.values.shape[0]
    k = min(k, d)
    diagonal = np.concatenate([model.values, model.tail_values[: d - m]])
    weights = np.concatenate([model.shares, model.tail_shares[: d - m]])
    rng = np.random.default_rng(SIMULATION_SEED)
    draws = simulation_draws(d)
    kept = np.zeros(draws)
    for draw in range(draws):
        matrix = symmetric_gaussian(d, sigma, rng)
        matrix[np.diag_indices(d)] += diagonal
        direction = rng.standard_normal(d)
        if model.spike > 0:
            direction /= np.linalg.norm(direction)
            matrix += model.spike * np.outer(direction, direction)
        _, vectors = np.linalg.eigh(matrix)
        top = vectors[:, d - k :]
        kept[draw] = float(np.sum(weights[:, None] * top**2))
    mean = float(kept.mean())
    ordered = np.sort(kept)
    j = max(1, math.floor(TAIL * (draws + 1)))
    return Simulated(
        mean,
        float(kept.std(ddof=1)),
        max(mean - float(ordered[j - 1]), 0.0),
        max(float(ordered[draws - j]) - mean, 0.0),
    )
