"""The dry run's forecast of what ``analyze_gauss`` keeps (issue 24 item 6, issue 32 item 4),
from public facts only: it runs before the release and reads no row."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from service.mechanisms.linalg import FloatArray

#: A range of forecasts wider than this does not determine the share kept to within the 0.1 a
#: forecast should meet (issue 32 item 4): the dry run says it depends on the spectrum.
DETERMINED_WIDTH = 0.2


@dataclass(frozen=True)
class Forecast:
    """What the noise leaves recoverable, from public facts (issue 24, item 6), and how far
    public facts determine the share kept (issue 32, item 4): ``share_range`` spans the
    share under a flat spectrum (``k/d``, the least) and under a one-direction spectrum (the
    most; :func:`spectrum_bounds`); ``depends_on_spectrum`` when it is wider than
    :data:`DETERMINED_WIDTH`, i.e. when no figure from public facts is a forecast."""

    threshold_share: float
    power_law_share: float
    rows_needed: int
    meaning: str
    share_range: tuple[float, float] = (0.0, 1.0)
    depends_on_spectrum: bool = True


def spectrum_bounds(sigma: float, n: int, d: int, k: int, clip_norm: float) -> tuple[float, float]:
    """``(flat, one)``: the share of the variance ``k`` released components keep under a flat
    spectrum and under a spectrum with all the variance along one direction, in the
    spiked-Wigner model of :func:`recoverable_forecast` (trace ``n C^2``; the top noisy
    eigenvector's squared overlap with a spike ``lambda`` is ``1 - (sigma sqrt(d)/lambda)^2``
    above the edge ``sigma sqrt(d)``, and never below ``1/d``, what a random direction has).

    - flat: every ``k``-dimensional subspace keeps ``k/d`` of a flat spectrum, whatever the
      noise (and no subspace is worse than a random one, which keeps ``k/d`` on average);
    - one direction ``v``: the top released vector keeps its overlap ``o`` of ``v``, the other
      ``k - 1`` (orthogonal to it, otherwise random) ``(k - 1)/(d - 1)`` of the rest, so
      ``o + (1 - o)(k - 1)/(d - 1)``: the most a spectrum leaves (a spike holding the whole
      trace stands out of the noise the furthest).

    Public facts only: the data's spectrum decides where between the two a release lands."""
    k = min(k, d)
    total = n * clip_norm**2
    if d <= 1:
        return 1.0, 1.0
    threshold = sigma * math.sqrt(d)
    overlap_ = 1.0 - (threshold / total) ** 2 if total > threshold else 0.0
    overlap_ = max(overlap_, 1.0 / d)
    return k / d, overlap_ + (1.0 - overlap_) * (k - 1) / (d - 1)


def recoverable_forecast(sigma: float, n: int, d: int, k: int, clip_norm: float) -> Forecast:
    """The smallest eigenvalue of ``X^T X`` that stands out of ``E(sigma)``, as a share of the
    largest possible trace ``n C^2``: ``sigma sqrt(d)`` (below it the top eigenvector of a
    spiked Wigner matrix carries no information about the spike, Baik, Ben Arous & Peche; above
    it the squared overlap is ``1 - sigma^2 d/lambda^2``); and the expected share of the
    variance that k released components capture when the spectrum follows a power law
    ``lambda_i ~ 1/i`` over ``d`` with the rows at the bound (trace ``n C^2``)."""
    threshold = sigma * math.sqrt(d)
    total = n * clip_norm**2
    share = threshold / total if total > 0 else math.inf
    weights = 1.0 / np.arange(1, d + 1, dtype=np.float64)
    spectrum = total * weights / weights.sum()
    top = spectrum[:k]
    overlap = np.clip(1.0 - (threshold / top) ** 2, 0.0, 1.0)
    captured = float(np.sum(top * overlap) / total) if total > 0 else 0.0
    # Rows at which the k-th power-law eigenvalue n C^2 w_k / sum(w) reaches the threshold
    # (sigma does not depend on n); for the budget, sigma scales about as 1/epsilon.
    needed = math.ceil(threshold * float(weights.sum()) / (float(weights[k - 1]) * clip_norm**2))
    flat, one = spectrum_bounds(sigma, n, d, k, clip_norm)
    depends = one - flat > DETERMINED_WIDTH
    meaning = (
        f"Forecast: an eigenvalue of the clipped X^T X below {threshold:.4g} "
        f"({share:.3g} of n C^2) is lost in the noise; with a 1/i spectrum over d and rows at "
        f"the bound, k = {k} released components would capture about {captured:.3g} of the "
        f"variance (non-private PCA: {float(top.sum() / total):.3g}). All k components stand "
        f"out of the noise from about n = {needed} rows at this budget; the threshold share "
        "falls as 1/n and about as 1/epsilon, and grows as sqrt(d)."
    )
    if depends:
        meaning += (
            f" What a release keeps depends on the data's spectrum, which public facts do not "
            f"give: from {flat:.3g} (a flat spectrum) to {one:.3g} (all the variance along one "
            "direction), so the 1/i figure is an illustration, not a prediction (measured: it "
            "missed by 0.01-0.60 on digits, breast_cancer and MNIST at eps 0.3 and 1). An "
            "earlier release of the same data forecasts it (forecast_from=<release id>)."
        )
    else:
        meaning += (
            f" Whatever the spectrum, the release keeps between {flat:.3g} and {one:.3g} of "
            f"the variance: about {(flat + one) / 2:.3g} (forecast_captured_share, within "
            f"{(one - flat) / 2:.2g} of any share in that range)."
        )
    return Forecast(share, captured, needed, meaning, (flat, one), depends)


@dataclass(frozen=True)
class ReleasedFigures:
    """What an earlier ``analyze_gauss`` release on the same dataset published and the
    forecast reads (all released, so reading them is post-processing): its per-component
    ``ratios`` and their total's ``interval``, its noisy ``eigenvalues`` (descending), the
    trace of ``H + E``, the Gram noise's ``sigma`` (all in the Gram's units, scaled as
    released), ``d``, and the public ``n`` with the clip the Gram's rows had (``row_clip``,
    released; 0 when unknown: the spectrum is then read as unclipped)."""

    ratios: tuple[float, ...]
    interval: tuple[float, float]
    eigenvalues: tuple[float, ...]
    trace: float
    sigma: float
    n_cols: int
    n_rows: int = 0
    row_clip: float = 0.0
    uncentred: bool = False
    mean_noise: float = 0.0
    sums: float = 0.0

    @classmethod
    def from_extras(
        cls,
        extras: Mapping[str, Any],
        n_cols: int,
        n_rows: int = 0,
        clip_norm: float = 0.0,
        mean_noise: float = 0.0,
    ) -> ReleasedFigures | None:
        """The figures of a release's extras, or ``None`` when one is missing (another
        mechanism, or a release from before the figures existed). ``clip_norm``: the
        request's ``C``, the Gram's clip when the extras name no ``row_clip_norm``;
        ``mean_noise``: the private mean's per-coordinate noise at the earlier request
        (public), kept when the release centred on a private mean (it released ``center``).
        ``uncentred``: the release took the route without centring (``centring: none``)."""
        try:
            ratios = tuple(float(x) for x in extras["explained_variance_ratio"])
            low, high = (float(x) for x in extras["explained_variance_ratio_interval"])
            values = tuple(float(x) for x in extras["eigenvalues"])
            trace = float(extras["trace"])
            sigma = float(extras["gram_noise_std"])
            row_clip = float(extras.get("row_clip_norm", clip_norm))
        except (KeyError, TypeError, ValueError):
            return None
        if not ratios or len(ratios) != len(values) or not sigma > 0:
            return None
        if not (math.isfinite(row_clip) and row_clip > 0):
            row_clip = 0.0
        uncentred = extras.get("centring") == "none"
        noise = mean_noise if "center" in extras else 0.0
        try:
            sums = float(extras["captured_sum_of_squares"]) + float(
                extras["residual_sum_of_squares"]
            )
        except (KeyError, TypeError, ValueError):
            sums = 0.0
        if not math.isfinite(sums):
            sums = 0.0
        return cls(
            ratios,
            (low, high),
            values,
            trace,
            sigma,
            n_cols,
            n_rows,
            row_clip,
            uncentred,
            noise,
            sums,
        )

    @property
    def measured(self) -> bool:
        """The release measured its share: its interval is narrower than
        :data:`~service.mechanisms.explained_variance.HIDDEN_WIDTH` (not hidden by noise)."""
        from service.mechanisms.explained_variance import HIDDEN_WIDTH  # no import cycle

        low, high = self.interval
        return high - low < HIDDEN_WIDTH

    @property
    def clipped_share(self) -> float:
        """``tr(H + E) / (n C2^2)`` clamped to ``[0, 1]``: how far the Gram's rows were
        clipped (1 when all were, the trace being ``n C2^2`` then; pairs: the trace is scaled
        to ``n`` rows). 0 when ``n`` or the clip is unknown."""
        if self.n_rows <= 0 or self.row_clip <= 0 or not self.trace > 0:
            return 0.0
        share = self.trace / (self.n_rows * self.row_clip**2)
        return min(max(share, 0.0), 1.0) if math.isfinite(share) else 0.0


def overlap(eigenvalue: float, sigma: float, d: int) -> float:
    """Squared overlap of the top eigenvector of ``lambda v v^T + E(sigma)`` with ``v``
    (spiked Wigner, Baik, Ben Arous & Peche): ``1 - sigma^2 d / lambda^2`` above the edge
    ``lambda > sigma sqrt(d)``, 0 below it."""
    if not eigenvalue > sigma * math.sqrt(d):
        return 0.0
    return 1.0 - (sigma * math.sqrt(d) / eigenvalue) ** 2


def forecast_from_release(figures: ReleasedFigures, k: int, noise_ratio: float) -> float:
    """The share of the centred variance a release of ``k`` components keeps, forecast from an
    earlier release's released figures when the new Gram noise is ``noise_ratio`` times the
    earlier one's (a public ratio of the two requests' Gram ``mu``, the clip rule being the
    same): :func:`carried_share` when the earlier release measured its share
    (:attr:`ReleasedFigures.measured`), else :func:`spectrum_share` (its share was hidden by
    its noise, its eigenvalues still say how the variance is spread)."""
    if figures.measured:
        return carried_share(figures, k, noise_ratio)
    return spectrum_share(figures, k, noise_ratio)


def carried_share(figures: ReleasedFigures, k: int, noise_ratio: float) -> float:
    """The earlier release's stated shares carried to the new noise.

    Component ``i`` of the earlier release kept ``r_i`` (its stated ratio) of the variance;
    that is ``v_i w_i(sigma_0)``, ``v_i`` the share of the variance along the true direction
    and ``w_i`` the squared overlap of :func:`overlap` at the debiased eigenvalue ``lambda_i``
    (:func:`~service.mechanisms.explained_variance.spiked_debias`). The new release keeps
    ``sum_i v_i w_i(sigma_1)`` over its ``k`` components; components beyond the earlier
    release's are unknown and counted as keeping nothing (the forecast is then low)."""
    from service.mechanisms.explained_variance import spiked_debias  # no import cycle

    d = figures.n_cols
    noisy = np.asarray(figures.eigenvalues, dtype=np.float64)
    debiased = spiked_debias(noisy, figures.sigma, d)
    kept = 0.0
    for i, (ratio, value) in enumerate(zip(figures.ratios, debiased, strict=True)):
        if i >= k:
            break
        before = overlap(float(value), figures.sigma, d)
        if before <= 0:
            continue
        share = min(ratio / before, 1.0)
        kept += share * overlap(float(value), figures.sigma * noise_ratio, d)
    return float(min(max(kept, 0.0), 1.0))


def spectrum_share(figures: ReleasedFigures, k: int, noise_ratio: float) -> float:
    """The share kept, forecast from the earlier release's eigenvalues and trace alone (its
    stated share hidden by noise; issue 32 item 4).

    The eigenvalues above the noise's edge, debiased (spiked Wigner), are the leading
    ``lambda_i`` of the clipped Gram ``H``, ``lambda_i / tr(H + E)`` their shares (the trace's
    noise, ``sigma sqrt(d)``, is unbiased); the rest of the trace is spread over the other
    directions. Those are shares of the clipped rows' matrix, flatter than the centred rows'
    covariance the kept share is measured on: :func:`~service.mechanisms.clipped_spectrum.
    declipped_shares` undoes the clip (:attr:`ReleasedFigures.clipped_share`) in a Gaussian
    model, giving ``v_i``. The new release's ``k`` vectors keep ``sum_i v_i w_i`` with ``w_i``
    the squared overlap of :func:`overlap` at the new noise (the noise and the clipped
    eigenvalues scale together with the clip); its other ``k - sum w_i`` dimensions lie at
    random in the ``d - sum w_i`` left and keep their share of the rest."""
    from service.mechanisms.clipped_spectrum import declipped_shares  # no import cycle
    from service.mechanisms.explained_variance import spiked_debias

    d = figures.n_cols
    k = min(k, d)
    if not figures.trace > 0 or not math.isfinite(figures.trace):
        return k / d
    noisy = np.asarray(figures.eigenvalues, dtype=np.float64)
    debiased = spiked_debias(noisy, figures.sigma, d)
    leading, trace, taken = data_spectrum(figures, debiased[debiased > 0])
    if not trace > 0:
        return k / d
    leading = leading[: max(k - taken, 0)]
    shares = np.minimum(leading / trace, 1.0)
    if shares.sum() > 1.0 - 1e-6:
        # The trace's noise put the leading eigenvalues above the whole trace: keep a sliver
        # for the rest (the model needs a positive remainder).
        shares = shares * (1.0 - 1e-6) / shares.sum()
    covariance, _ = declipped_shares(shares, d, figures.clipped_share)
    sigma = figures.sigma * noise_ratio
    weights = np.asarray([overlap(float(value), sigma, d) for value in leading])
    kept = float(np.sum(covariance * weights))
    aligned = float(weights.sum())
    fill = max(0.0, k - aligned) / max(1.0, d - aligned)
    return float(min(max(kept + fill * (1.0 - kept), 0.0), 1.0))


def data_spectrum(figures: ReleasedFigures, leading: FloatArray) -> tuple[FloatArray, float, int]:
    """The leading eigenvalues (debiased, above the edge) and the trace of the centred
    rows' part of the released Gram, without what is not the data's variance:

    - uncentred (``centring: none``): the rows' mean takes the top direction (the route is
      taken where the mean is shorter than the spread, still longer than any one direction's
      on the data it is chosen for, e.g. MNIST's unit rows: 0.33-0.48 of the trace); its
      eigenvalue is dropped and taken off the trace;
    - private mean: centring on ``mu + delta`` adds ``n delta delta^T``, about ``n d
      sigma_mu^2``, to rows whose squares sum to about the released explained-variance
      sums ``c + r`` (over the same centred rows, clipped near their top: ``sums``), so
      ``delta`` fills ``n d sigma_mu^2 / (c + r)`` of each row's square (capped at 1; when
      the sums are not positive, ``d sigma_mu^2 / C2^2``) and as much of the clipped
      Gram's trace. It is taken off the trace, and where it stands out of the noise (above
      ``sigma sqrt(d)``) the leading eigenvalue nearest it is dropped as its.

    The third value counts the directions so dropped: a new release spends a component on
    each as well (its own mean's or noise's), which keeps none of the centred variance
    beyond a random direction's. Public figures and public scales only."""
    trace = figures.trace
    taken = 0
    if figures.uncentred and leading.size:
        trace -= float(leading[0])
        leading = leading[1:]
        taken += 1
    if figures.mean_noise > 0 and figures.row_clip > 0:
        spread = figures.n_cols * figures.mean_noise**2
        if figures.sums > 0 and figures.n_rows > 0:
            share = min(1.0, figures.n_rows * spread / figures.sums)
        else:
            share = min(1.0, spread / figures.row_clip**2)
        bias = share * trace
        trace -= bias
        if leading.size and bias > figures.sigma * math.sqrt(figures.n_cols):
            leading = np.delete(leading, int(np.argmin(np.abs(leading - bias))))
            taken += 1
    return leading, trace, taken
