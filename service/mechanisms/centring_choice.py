"""Choosing how ``analyze_gauss`` centres (issue 24, item 2): a private mean, differences of
publicly paired rows, or no centring, decided from public facts and released values only.

Why: centring on a private mean ``mu_hat = mu + delta`` adds ``n delta delta^T`` to the
centred Gram, a rank-one term of expected size ``n d sigma_mu^2 = 4 C^2 d/(n mu_M^2)`` along a
random direction, and lengthens every centred row from ``||y||`` to about
``sqrt(||y||^2 + d sigma_mu^2)``. Where the rows' spread is small against the mean's noise
(unit-norm breast_cancer: centred norms ~0.05, ``d sigma_mu^2`` ~0.8 at eps 0.3) the centred
rows are mostly that noise and the released subspace follows it. Two alternatives need no
mean: **pairs**, ``p_j = (clip_C(x_r(2j)) - clip_C(x_r(2j+1)))/sqrt(2)`` (``j < m =
floor(n/2)``, ``r`` a permutation drawn from the run's CSPRNG before the data is read: public
randomness; the stored order would pair alike rows where the owner sorted them), whose
second moment is the covariance ``Sigma`` (``m`` rows: half the signal, no mean noise); and
**none**, the uncentred rows (the mean's direction takes a slot, the rows are longer).

The choice (:func:`choose_centring`): a probe releases, with ``CLIP_SHARE`` of ``mu^2`` (the
clip quantile's step, which it replaces), two noisy histograms on the half-octave grid
:func:`probe_edges`: the norms of ``clip_C(x_i)`` and those of ``p_j`` (clipped to ``C``).
Replacing one row moves one count of each by one down and one up (it is in one pair): l2
sensitivity 2, noise ``N(0, (2/mu_Q)^2)`` per count: ``mu_Q``-GDP. Each histogram is read
twice (:func:`read_quantiles`): a top-down ``q``-quantile for the choice (``C_u``, ``C_p``)
and a bottom-up one for the clip. Each route's signal-to-noise (signal over the Gram noise
``sqrt(2) c^2/mu``) is then

- none: ``n mu_R / C_u^2``;
- pairs: ``m mu_R / C_p^2``;
- mean: ``n mu_G / c_M^2``, ``c_M^2 = min(C^2, C_p^2 + d sigma_mu^2)``,
  ``sigma_mu = 2C/(n mu_M)``, the centred rows' expected squared norm (``C_p`` estimates
  the centred norm: ``E||p_j||^2 = E||y||^2``);

with ``mu_R^2 = mu_M^2 + mu_G^2`` (a route without a mean gives the mean's share to the Gram).
The largest wins (ties: mean, then pairs). A function of the released quantiles and public
facts only: post-processing.

Privacy: the probe is ``mu_Q``-GDP; given its output the rest is one of three blocks, each
``mu_R``-GDP (the mean ``mu_M`` then the Gram ``mu_G``, or one Gram at ``mu_R``; pairs: a
replaced row changes one ``p_j``, sensitivity ``sqrt(2) c^2`` at the clip ``c`` as for rows);
then the explained-variance step ``mu_V`` (without a mean, over paired differences: a replaced
row changes one, sensitivity ``sqrt(2) C^2`` as for rows). Adaptive composition of GDP
mechanisms with fixed parameters (Dong, Roth & Su 2022, Theorem 3.2):
``sqrt(mu_Q^2 + mu_R^2 + mu_V^2) = mu``, the same total as declared. The declared steps
(:meth:`AnalyzeGauss.privacy_steps`) list the mean route's; their ``rho`` sum equals every
route's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from service.mechanisms.linalg import FloatArray, clip_rows, gram_norm_counts

Route = Literal["mean", "pairs", "none"]

#: The probe's grid: ``C 2^(-j/PROBE_STEPS_PER_OCTAVE)``, ``j < PROBE_GRID_STEPS``; coarser than
#: the clip quantile's (fewer bins: less noise summed into a count above an edge).
PROBE_STEPS_PER_OCTAVE = 2
PROBE_GRID_STEPS = 24

#: Probe histograms' l2 sensitivity: one replaced row moves two counts in each of the two.
PROBE_SENSITIVITY = 2.0


def probe_edges(clip_norm: float) -> FloatArray:
    """The probe's public grid ``C 2^(-j/PROBE_STEPS_PER_OCTAVE)``, ascending, ending at ``C``."""
    exponents = -np.arange(PROBE_GRID_STEPS - 1, -1, -1, dtype=np.float64)
    return np.asarray(clip_norm * np.exp2(exponents / PROBE_STEPS_PER_OCTAVE), dtype=np.float64)


def paired_differences(
    data: Any, clip_norm: float, offset: int = 0, order: npt.NDArray[np.intp] | None = None
) -> FloatArray:
    """``p_j = (clip_C(x_(r(2j+o))) - clip_C(x_(r(2j+o+1))))/sqrt(2)``, ``o = offset`` (0 or 1),
    ``j < m = floor((n - o)/2)``, shape ``(m, d)``, each of norm ``<= sqrt(2) C`` (the Gram
    step clips them to ``C`` and below), with ``r = order`` (shape ``(n,)``, a permutation of
    the row indices; the identity when None). A row changes one ``p_j`` whatever ``r`` is.

    The caller passes a permutation drawn from the run's CSPRNG, independent of the data: the
    rows' stored order is the owner's (sorted by label, by time, by site...) and pairing
    neighbours in it would pair alike rows, whose differences miss the variance between them.

    The Gram step uses ``o = 0``; the explained-variance step ``o = 1``: its pairs share no
    cross term ``x_a x_b^T`` with the Gram's, so the basis, fitted to the Gram's pairs, is not
    also scored on them (on the same pairs the captured share is biased upwards against the
    rows' centred share, by what the basis fitted of that pairing's own fluctuation)."""
    n, d = data.shape
    m = (n - offset) // 2
    out = np.empty((max(m, 0), d), dtype=np.float64)
    if m <= 0:
        return out
    index = np.arange(n) if order is None else np.asarray(order)
    chosen = index[offset : offset + 2 * m]
    # Chunks of an even number of rows: pairs never straddle two chunks.
    chunk = 8192
    with np.errstate(under="ignore"):
        for start in range(0, 2 * m, chunk):
            rows = np.sort(chosen[start : start + chunk])
            block = np.asarray(data[rows], dtype=np.float64)
            # data[rows] reads in ascending order (a memory map reads forward); put the rows
            # back in the permuted order.
            where = np.searchsorted(rows, chosen[start : start + chunk])
            clipped = clip_rows(block[where], clip_norm)
            first = start // 2
            out[first : first + clipped.shape[0] // 2] = (
                clipped[0::2] - clipped[1::2]
            ) / math.sqrt(2.0)
    return out


@dataclass(frozen=True)
class CentringChoice:
    """The route, the released quantiles ``C_u`` (uncentred rows) and ``C_p`` (pairs), and
    each route's signal-to-noise score (public given the quantiles)."""

    route: Route
    uncentred_clip: float
    pair_clip: float
    scores: dict[str, float]


def choose_centring(
    uncentred_clip: float,
    pair_clip: float,
    n_rows: int,
    n_cols: int,
    clip_norm: float,
    mean_mu: float,
    gram_mu: float,
) -> CentringChoice:
    """The route with the largest signal-to-noise score (module docstring) from the released
    quantiles and public facts only. ``n_rows < 2``: no pairs."""
    rest = math.hypot(mean_mu, gram_mu)
    sigma_mu = 2.0 * clip_norm / (max(1, n_rows) * mean_mu)
    mean_norm2 = min(clip_norm**2, pair_clip**2 + n_cols * sigma_mu**2)
    pairs = n_rows // 2
    scores = {
        "mean": n_rows * gram_mu / mean_norm2,
        "pairs": pairs * rest / pair_clip**2 if pairs > 0 else 0.0,
        "none": n_rows * rest / uncentred_clip**2,
    }
    route: Route = "mean"
    for candidate in ("pairs", "none"):
        if scores[candidate] > scores[route]:
            route = candidate
    return CentringChoice(route, uncentred_clip, pair_clip, scores)


@dataclass(frozen=True)
class ProbeQuantiles:
    """Two readings of each noisy histogram (:func:`read_quantiles`): ``*_high`` (top-down)
    for the choice, ``*_low`` (bottom-up) for the clip."""

    uncentred_high: float
    uncentred_low: float
    pair_high: float
    pair_low: float


def read_quantiles(
    noisy: FloatArray, n_rows: int, clip_norm: float, quantile: float
) -> tuple[float, float]:
    """``(high, low)`` readings of the ``q``-quantile from noisy counts on the grid of
    :func:`probe_edges`, ``low <= high``.

    ``above[j]``, the noisy number of rows above edge ``j``, sums the bins above it, so its
    noise grows with their number. ``high``: scanning down from ``C``, the edge above the
    first with ``above > (1 - q) n`` (few bins summed, so rarely far below the quantile; where
    the noise is large against ``n`` it errs upwards). ``low``: the smallest edge with
    ``above <= (1 - q) n`` (the rule of ``clip_quantile``; errs downwards). The choice reads
    ``high`` (a clip that is too small reads as a spread that is too small); the Gram clips at
    ``low``: a clip below most norms costs little (the rows become their directions, whose
    second moment has the same top eigenvectors for elliptical data, and signal and noise
    both scale with the clip's square) while one far above them multiplies the noise.
    """
    edges = probe_edges(clip_norm)
    above = np.concatenate([np.cumsum(noisy[::-1])[::-1][1:], [0.0]])
    allowed = (1.0 - quantile) * n_rows
    over = np.flatnonzero(above > allowed)
    high = interpolate(edges, above, allowed, int(over[-1]) + 1) if over.size else edges[0]
    fits = np.flatnonzero(above <= allowed)
    low = interpolate(edges, above, allowed, int(fits[0])) if fits.size else clip_norm
    return float(high), float(min(low, high))


def interpolate(edges: FloatArray, above: FloatArray, allowed: float, j: int) -> float:
    """Where between edges ``j - 1`` and ``j`` the noisy count above crosses ``allowed``, with
    the rows spread evenly in ``log`` norm within the bin: ``edge_j`` itself when ``j`` is 0 or
    past the grid, or when the noisy counts do not decrease there."""
    if j <= 0:
        return float(edges[0])
    if j >= edges.shape[0]:
        return float(edges[-1])
    drop = float(above[j - 1] - above[j])
    if drop <= 0:
        return float(edges[j])
    t = min(max((float(above[j - 1]) - allowed) / drop, 0.0), 1.0)
    return float(edges[j - 1] * (edges[j] / edges[j - 1]) ** t)


def probe_quantiles(
    data: Any,
    pairs: FloatArray,
    clip_norm: float,
    quantile: float,
    probe_mu: float,
    rng: np.random.Generator,
) -> ProbeQuantiles:
    """:func:`read_quantiles` of the uncentred rows' and the pairs' norms, each count
    ``+ N(0, (2/probe_mu)^2)`` (the two histograms together have l2 sensitivity 2:
    ``probe_mu``-GDP)."""
    edges = probe_edges(clip_norm)
    std = PROBE_SENSITIVITY / probe_mu
    counts_u = gram_norm_counts(data, clip_norm, None, edges)
    counts_p = gram_norm_counts(pairs, clip_norm, None, edges)
    noisy_u = counts_u + rng.normal(0.0, std, size=edges.shape[0])
    noisy_p = counts_p + rng.normal(0.0, std, size=edges.shape[0])
    u_high, u_low = read_quantiles(noisy_u, data.shape[0], clip_norm, quantile)
    p_high, p_low = read_quantiles(noisy_p, pairs.shape[0], clip_norm, quantile)
    return ProbeQuantiles(u_high, u_low, p_high, p_low)


def mean_route_clip(clip_norm: float, pair_clip: float, n_cols: int, sigma_mu: float) -> float:
    """The mean route's row clip: ``min(C, sqrt(C_p^2 + d sigma_mu^2))``, the centred rows'
    expected norm at the pairs' quantile (public given ``C_p``)."""
    return min(clip_norm, math.sqrt(pair_clip**2 + n_cols * sigma_mu**2))
