"""A private clip norm for the Gram mechanisms: a quantile of the row norms (issue 24, item 3).

Owners declare the largest possible row norm ``C``; the Gram noise scales with ``C^2``, so data
whose rows are mostly much shorter (raw features, or rows after centring) pays for a bound it
rarely meets. This releases ``C2``, an edge of a public geometric grid below ``C``, near the
``q``-quantile of the norms of the rows the Gram step uses, and that step then clips to ``C2``.

Privacy: the norms (each in ``[0, C]``) are counted in the bins of the public grid
``C 2^(-j/4)``, ``j = 0..GRID_STEPS - 1`` (the lowest bin also takes everything below its
edge). Replacing one row moves one count down by 1 and one up by 1: l2 sensitivity
``sqrt(2)``. Each count gets ``N(0, (sqrt(2)/mu)^2)``, a ``mu``-GDP Gaussian mechanism (Dong,
Roth & Su 2022); the choice of the edge is post-processing of the noisy counts and ``n``
(public). Nothing else about the counts is released. Composed with the Gram step in GDP
(``mu^2`` add up), see :mod:`service.mechanisms.analyze_gauss`.
"""

from __future__ import annotations

import math

import numpy as np

from service.mechanisms.linalg import FloatArray

#: Edges per octave of the grid: the released clip norm is within a factor 2^(1/4) of the
#: quantile's grid cell.
STEPS_PER_OCTAVE = 4

#: Number of grid edges: down to ``C 2^-12``; norms below that share the lowest bin.
GRID_STEPS = 48


def quantile_edges(clip_norm: float) -> FloatArray:
    """The public grid ``C 2^(-j/4)``, ascending, ending at ``C``."""
    exponents = -np.arange(GRID_STEPS - 1, -1, -1, dtype=np.float64) / STEPS_PER_OCTAVE
    return np.asarray(clip_norm * np.exp2(exponents), dtype=np.float64)


def count_noise_std(mu: float) -> float:
    """Standard deviation of each count's noise: ``sqrt(2)/mu`` (sensitivity ``sqrt(2)``)."""
    return math.sqrt(2.0) / mu


def noisy_above(noisy: FloatArray, n_rows: int) -> FloatArray:
    """``above[j]``, the estimated number of rows above edge ``j`` (bins ``j+1`` and up; the
    last is 0), from noisy counts whose exact values sum to the public ``n`` (every row is in
    exactly one bin).

    The counts are first moved onto that plane: ``noisy + (n - sum(noisy)) / B`` for ``B``
    bins, the least-squares estimate under the constraint (equal, independent noise). Summed
    from the top alone, the count above the lowest edge carried ``B - 1`` bins' noise
    (variance ``(B - 1) s^2``), so at small ``mu`` it fell below ``(1 - q) n`` by chance and
    the bottom-up reading returned the grid's floor (README data, eps 0.05: 11 of 20 runs
    clipped at ``C 2^-11.5`` against a 0.3-quantile of 0.36). After the projection the count
    above edge ``j`` with ``a`` bins above it has variance ``s^2 a (B - a) / B``: at most
    ``s^2 B / 4``, and about ``s^2 (j + 1)`` near the bottom, where ``n`` minus the few bins
    below is the better reading. Post-processing of the noisy counts and ``n``: no privacy
    cost, the noise unchanged."""
    adjusted = noisy + (float(n_rows) - float(np.sum(noisy))) / noisy.shape[0]
    return np.concatenate([np.cumsum(adjusted[::-1])[::-1][1:], [0.0]])


def private_clip_norm(
    norms: FloatArray, clip_norm: float, quantile: float, mu: float, rng: np.random.Generator
) -> float:
    """The smallest grid edge with at most ``(1 - quantile) n`` rows above it by the noisy
    counts (``mu``-GDP; ``C`` when none qualifies).

    Parameters
    ----------
    norms : (n,) array
        Row norms, each in ``[0, C]``.
    clip_norm : float
        The public bound ``C``.
    quantile : float
        ``q`` in ``(0, 1]``.
    mu : float
        This step's GDP parameter.
    rng : numpy.random.Generator

    Returns
    -------
    float
        ``C2``, an edge of :func:`quantile_edges`.
    """
    edges = quantile_edges(clip_norm)
    # Bin j holds the norms in (edge_{j-1}, edge_j]; bin 0 everything up to edge_0.
    bins = np.minimum(np.searchsorted(edges, norms, side="left"), GRID_STEPS - 1)
    counts = np.bincount(bins, minlength=GRID_STEPS).astype(np.float64)
    return clip_from_counts(counts, norms.shape[0], clip_norm, quantile, mu, rng)


def clip_from_counts(
    counts: FloatArray,
    n_rows: int,
    clip_norm: float,
    quantile: float,
    mu: float,
    rng: np.random.Generator,
) -> float:
    """:func:`private_clip_norm` from the bins' exact counts (shape ``(GRID_STEPS,)``, as
    :func:`service.mechanisms.linalg.gram_norm_counts` gives them on the grid of
    :func:`quantile_edges`) and the public ``n``: the same noise, the same choice."""
    edges = quantile_edges(clip_norm)
    noisy = counts + rng.normal(0.0, count_noise_std(mu), size=GRID_STEPS)
    above = noisy_above(noisy, n_rows)
    allowed = (1.0 - quantile) * n_rows
    fits = np.flatnonzero(above <= allowed)
    return float(edges[fits[0]]) if fits.size else float(clip_norm)
