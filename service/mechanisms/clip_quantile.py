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

**The grid's resolvable floor** (:func:`resolvable_steps`, :func:`resolvable_floor`: public,
a statement about the noise, not a restriction of the read-out). The search returns the smallest
edge whose noisy count above is at most ``(1 - q) n``: a first passage from the bottom. The
noisy count above edge ``j`` (after :func:`noisy_above`'s projection onto the public total) is
the exact count plus ``-(W_j - (j + 1) W_B / B)`` for the partial sums ``W`` of the ``B`` bins'
noises, a Brownian bridge of step variance ``s^2`` sampled at the edges. At an edge with fewer
than ``q n/2`` rows below it (below the rows' ``q/2``-quantile) the exact count above exceeds
the threshold by ``m >= q n/2``, so the search stops there only if the bridge dips to ``-m``;
the bridge's minimum over ``B`` bins reaches ``-m`` with probability at most ``exp(-2
m^2/(B s^2))`` (the continuous bridge's, whose samples these are), at most
:data:`QUANTILE_ALPHA` when ``B <= B' = (q n)^2/(2 s^2 ln(1/QUANTILE_ALPHA))``. A read-out
restricted to the top ``B'`` edges would be below the ``q/2``-quantile at most that often; its
lowest edge is the *floor*, ``C`` when ``B' < 2``. A clip released below the floor may be a
noise reading (at small ``n mu`` the first passage comes early and the clip falls to the
grid's bottom: 300 rows of norms 0.5-0.8 at eps 0.2 were clipped at 0.0023), and ``auto``'s
reason says so. The read-out is not restricted to the floor: measured (docs/benchmarks.md, 30
Nov 2026, wip/autoclip; ``bench/bench_clip_floor.py``, removed, in git history at commit
3fa7e908; 10 paired seeds, n 200-1,000, eps 0.1-0.5) clipping at the floor or at ``C``
instead lost to the collapsed reading on power-law rows (captured deficit 0.43 -> 0.69 at
n = 1,000, eps 0.2; 0.18 -> 0.36 at eps 0.5, where the reading was the quantile and the floor
0.5 sat above it) and on rows with short ones along their own direction, gained at most 5% on
rows of norms 0.5-0.8, and tied on unit rows (every row clipped by the same factor: the same
release as at ``C``). A clip far below every norm makes every row its direction: the sign map,
whose Gram the rows fill (``auto_gram``), which at these budgets the noise, not its bias,
decides.
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

#: The stated chance, at the floor, that the noise alone reads a clip below the rows'
#: ``q/2``-quantile (module docstring): the service's stated error rate, as ``auto``'s ``ALPHA``.
QUANTILE_ALPHA = 0.05


def quantile_edges(clip_norm: float) -> FloatArray:
    """The public grid ``C 2^(-j/4)``, ascending, ending at ``C``."""
    exponents = -np.arange(GRID_STEPS - 1, -1, -1, dtype=np.float64) / STEPS_PER_OCTAVE
    return np.asarray(clip_norm * np.exp2(exponents), dtype=np.float64)


def count_noise_std(mu: float) -> float:
    """Standard deviation of each count's noise: ``sqrt(2)/mu`` (sensitivity ``sqrt(2)``)."""
    return math.sqrt(2.0) / mu


def resolvable_steps(n_rows: int, quantile: float, mu: float) -> int:
    """``B'``, the number of top grid edges the noise resolves (module docstring): the largest
    ``B <= GRID_STEPS`` with ``exp(-(q n)^2/(2 B s^2)) <= QUANTILE_ALPHA``, ``s`` the counts'
    noise std; below 2 no edge below ``C`` is resolved. Public facts only (``n``, ``q``,
    ``mu``)."""
    if n_rows <= 0 or quantile <= 0 or mu <= 0:
        return 0
    std = count_noise_std(mu)
    if not std > 0:  # no noise (mu infinite): every edge resolves
        return GRID_STEPS
    bound = (quantile * n_rows) ** 2 / (2.0 * std * std * math.log(1.0 / QUANTILE_ALPHA))
    return int(min(float(GRID_STEPS), math.floor(bound))) if math.isfinite(bound) else GRID_STEPS


def resolvable_floor(clip_norm: float, n_rows: int, quantile: float, mu: float) -> float:
    """The lowest edge the noise resolves (:func:`resolvable_steps`; ``C`` when none below it
    is): a clip released below it may be a noise reading (module docstring)."""
    steps = resolvable_steps(n_rows, quantile, mu)
    return float(quantile_edges(clip_norm)[GRID_STEPS - steps]) if steps >= 2 else clip_norm


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
