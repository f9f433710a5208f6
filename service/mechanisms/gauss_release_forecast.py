"""The dry run's forecast of what ``analyze_gauss`` keeps from an earlier release's figures
(issue 32 item 4, ``?forecast_from=``): the share of the variance a new request keeps, read off
the figures an earlier release of the same data already released to the caller (its stated
shares and interval, eigenvalues, trace and scales) and the new request's public facts (``k``,
its noise, its probe's risk). :func:`range_from_release` gives a range, and a point only where
it is narrow (:attr:`RangeForecast.point`); :func:`forecast_from_release` the model's figure.
The forecast from public facts alone is :mod:`service.mechanisms.gauss_forecast`.

Privacy: post-processing of released figures and public facts. It runs before the release,
reads no row and spends no budget; the simulation's draws
(:mod:`service.mechanisms.forecast_simulation`) come from a fixed seed (a deterministic
quadrature, not privacy noise)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from service.mechanisms.forecast_figures import ReleasedFigures
from service.mechanisms.forecast_simulation import Model, request_cache, simulated_share
from service.mechanisms.forecast_spread import (
    filled,
    moved_share,
    random_share_high,
    trace_readings,
)
from service.mechanisms.gauss_forecast import DETERMINED_WIDTH, overlap
from service.mechanisms.linalg import FloatArray

#: The normal quantile of each end of the forecast-from-a-release range: a released
#: eigenvalue is read at ``+- Z sqrt(2) sigma`` (its fluctuation about the spiked-Wigner
#: outlier location has standard deviation at most ``sqrt(2) sigma``), the 90% two-sided
#: normal interval's end, as the release's own explained-variance interval. Not tuned.
Z = 1.6448536269514722


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


def data_spectrum(
    figures: ReleasedFigures, leading: FloatArray, rank: int = 0, mean_rank: int = 0
) -> tuple[FloatArray, float, int]:
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
    beyond a random direction's. ``rank``: drop the ``rank``-th nearest eigenvalue to the
    spike instead (1: the next nearest; the released figures do not say which is the noise's,
    so :func:`range_from_release` reads both). ``mean_rank``: on the uncentred route, the
    eigenvalue dropped as the mean's (0: the top; 1: the next, read by
    :func:`range_from_release` as well). Public figures and public scales only."""
    trace = figures.trace
    taken = 0
    if figures.uncentred and leading.size:
        drop = min(mean_rank, leading.size - 1)
        trace -= float(leading[drop])
        leading = np.delete(leading, drop)
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
            order = np.argsort(np.abs(leading - bias), kind="stable")
            leading = np.delete(leading, int(order[min(rank, leading.size - 1)]))
            taken += 1
    return leading, trace, taken


@dataclass(frozen=True)
class RangeForecast:
    """The forecast from an earlier release (issue 32 item 4): ``central``, the model's
    figure, and ``(low, high)``, what the released figures allow (:func:`range_from_release`).
    ``point``: ``central`` when it is within :data:`DETERMINED_WIDTH` / 2 of both ends of
    the range (as the public-facts forecast's point, the middle of a range at most that
    wide: then within 0.1 of any share in the range) and the probe is not at risk, else
    ``None``: the released figures do not determine the share. ``unseen``: the share of the
    variance the earlier release did not resolve (a random subspace's share in ``central``);
    ``probe_risk``: the chance, from public facts, that the new release's probe picks its
    route or clip from noise (:func:`probe_risk`)."""

    central: float
    low: float
    high: float
    unseen: float
    probe_risk: float = 0.0
    #: ``True`` when ``(low, high)`` includes the new release's own draw-to-draw spread (it was
    #: simulated, ``d <= SIMULATE_MAX_D``); ``False`` when it bounds only the expected share
    #: (above that, a single release can fall outside: on MNIST, d = 784, the range covered
    #: 50-88% of releases across settings, on d = 784 power-law spectra 0-6%).
    covers_spread: bool = True
    #: Components the forecast read as taken by directions that are not the data's.
    assumed: int = 0

    @property
    def point(self) -> float | None:
        # Off-centre in a range under 0.2 it missed: MNIST eps 2 to 0.3, k = 10: [0.007,
        # 0.165] around 0.137, the releases kept 0.025-0.029 (20 points, 0.10 off).
        off = max(self.central - self.low, self.high - self.central)
        if self.probe_risk >= PROBE_RISK or off > DETERMINED_WIDTH / 2.0:
            return None
        return self.central


@dataclass(frozen=True)
class NewRelease:
    """Public facts of the request forecast: ``k``, its Gram noise over the earlier
    release's (``noise_ratio``, the ratio of the two Gram steps' ``mu``), its private mean's
    per-coordinate noise (``mean_noise``; 0 without one) and :func:`probe_risk`."""

    k: int
    noise_ratio: float
    mean_noise: float = 0.0
    probe_risk: float = 0.0


def probe_risk(n_rows: int, quantile: float, probe_mu: float, steps_per_octave: int) -> float:
    """The chance that the centring probe's noise alone reads the pairs' norms at the top of
    its grid, from public facts only (issue 32 item 4): the top-down reading counts the noisy
    pairs above each edge from ``C`` down; the bins within the top half-octave (``s``
    bins of the grid ``C 2^(-j/s)``, ``s = steps_per_octave / 2``, at least 1) hold no pair
    when the pairs' norms are well below ``C`` (the case the pairs route exists for), so their
    counts are noise ``N(0, (2/mu_Q)^2)`` each, and a running sum above ``(1 - q) m`` (``m =
    n/2`` pairs) reads a pair norm near ``C``: the route then falls to no centring, or the
    clip to near ``C``, and the release keeps about nothing (breast_cancer at eps 0.3: 3 of
    16 runs took no centring and kept 0.03-0.14; wine). Reflection bound for the maximum of
    the running sum over those bins: ``2 (1 - Phi((1 - q) m / (sd sqrt(s))))``."""
    pairs = n_rows // 2
    if pairs <= 0 or not probe_mu > 0:
        return 1.0
    bins = max(1, steps_per_octave // 2)
    sd = 2.0 / probe_mu * math.sqrt(bins)
    margin = (1.0 - quantile) * pairs
    return float(min(1.0, math.erfc(margin / (sd * math.sqrt(2.0)))))


#: A probe that reads its route from noise with at least this chance leaves the new release's
#: outcome unpredictable: the range's low end is then 0 (the 90% range's one tail, 0.05).
PROBE_RISK = 0.05

#: Up to this ``d`` the new release is simulated at finite ``d`` (:func:`simulated_share`):
#: there the spiked-Wigner overlaps, exact only as ``d`` grows, miss what many eigenvalues near
#: the noise's edge keep together (digits, d = 64, eps 1 to 0.3 at k = 10: the asymptotic
#: overlaps forecast 0.11 for 0.31 kept). A cost bound, not a fitted constant: an ``eigh``
#: at ``d = 256`` takes about 10 ms (at most 48 per forecast), so the preview stays fast;
#: above it the asymptotic overlaps (MNIST, d = 784: within 0.03 at the same settings).
SIMULATE_MAX_D = 256


def range_from_release(figures: ReleasedFigures, new: NewRelease) -> RangeForecast:
    """:func:`_range_from_release` with one cache of its simulations for this call
    (:func:`~service.mechanisms.forecast_simulation.request_cache`: its readings simulate some
    models twice; the cache lives for this request's forecast only)."""
    with request_cache():
        return _range_from_release(figures, new)


def _range_from_release(figures: ReleasedFigures, new: NewRelease) -> RangeForecast:
    """:func:`range_at` reading the eigenvalue nearest the private mean's noise spike as the
    spike, and where the earlier release's share was hidden also the next nearest (the
    released figures do not say which is the noise's): the range spans both readings and
    ``central`` is their mean (neither is favoured; on held-out spiked rows at eps 0.3 the
    mean's error was 0.005-0.013 below the nearest reading's in each of 8 settings)."""
    found = range_at(figures, new, 0)
    if found.assumed:
        # Components read as taken by a direction that is not the data's (the uncentred
        # route's mean, a mean's noise spike) are an assumption on the order of eigenvalues
        # the released figures do not fix (the new probe may take another route; the spike
        # mixes with the data): the high end also reads them as the data's. Without it a
        # release of k = 1 from an uncentred one was forecast [0, 0] (digits eps 0.1 -> 0.3:
        # the new release took the mean route and kept 0.02-0.08).
        spared = range_at(figures, new, 0, spare=True)
        found = dataclasses.replace(found, high=max(found.high, spared.high))
    if figures.uncentred and not figures.measured and len(figures.eigenvalues) >= 2:
        # The uncentred route's mean need not hold the top eigenvalue: power-law rows whose
        # mean lies along a weak direction (0.08 of the trace against the top direction's
        # 0.18) had theirs second, and the range read with the top dropped missed 10 cells
        # (0.50-0.85). The released figures do not say which it is: the range spans both.
        second = range_at(figures, new, 0, mean_rank=1)
        found = dataclasses.replace(
            found, low=min(found.low, second.low), high=max(found.high, second.high)
        )
    if figures.measured or figures.mean_noise <= 0 or len(figures.eigenvalues) < 2:
        return found
    other = range_at(figures, new, 1)
    return RangeForecast(
        (found.central + other.central) / 2.0,
        min(found.low, other.low),
        max(found.high, other.high),
        found.unseen,
        found.probe_risk,
        found.covers_spread and other.covers_spread,
    )


def range_at(
    figures: ReleasedFigures,
    new: NewRelease,
    rank: int,
    spare: bool = False,
    at_floor: bool = False,
    mean_rank: int = 0,
) -> RangeForecast:
    """:class:`RangeForecast` of the share the release ``new`` keeps, from an earlier
    release's released figures and public facts only (post-processing: no budget, no row).

    The known directions are the earlier release's components whose debiased eigenvalue stands
    above its noise's edge (:func:`~service.mechanisms.explained_variance.spiked_debias`),
    with the share ``v_i`` of the centred variance along them: from its stated shares when
    it measured them (:func:`carried_share`), else from its eigenvalues and trace
    (:func:`spectrum_share`, without the uncentred route's mean direction and the private
    mean's noise spike). Carried to ``new``:

    - the Gram noise scales by ``noise_ratio``; on the mean route the new private mean's noise
      ``delta`` lengthens the centred rows (clipped near their norms) so the data's part of the
      trace is ``1 - s`` with ``s = n d sigma_mu^2 / (n ||y||^2 + n d sigma_mu^2)``, the rows'
      ``n ||y||^2`` read from the released explained-variance sums without the earlier
      mean's noise: the data's eigenvalues scale by ``(1 - s_new)/(1 - s_old)``, and where the
      new spike ``s_new tr`` stands out of the new noise it takes one of the ``k`` components;
    - ``central``: ``sum_i v_i w_i`` over the first known directions (``w_i``, the spiked-Wigner
      overlap at the new noise), plus a random subspace's share of the rest on the other
      components; at ``d <= SIMULATE_MAX_D`` instead the new release simulated on that
      spectrum (:func:`simulated_share`), scaled by the earlier release's stated share over
      its own simulation where it measured one, and the range widened by the simulated
      release's spread (its draws' 90% prediction interval, with the half-widths below in
      squares);
    - ``low`` / ``high``: each known eigenvalue read at ``-/+ Z sqrt(2) sigma`` and a measured
      share at its interval's ends; ``high`` lets each of the new release's components beyond
      the known ones hold up to the largest eigenvalue the earlier release could have left
      unseen (its largest released eigenvalue below the edge, else its smallest above it,
      read high) at that eigenvalue's overlap: the unseen variance widens the range instead
      of being guessed. A release with no less noise and no fewer components keeps no less
      in expectation than the earlier one, and one with no more noise and no more components
      no more: where the earlier release measured its share the range is clamped by its
      interval accordingly;
    - where the new release's probe may read its route from noise (:func:`probe_risk` at
      least :data:`PROBE_RISK`), ``low`` is 0 and ``high`` at least a random ``k``-subspace's
      upper quantile (:func:`~service.mechanisms.forecast_spread.random_share_high`): the
      outcome is not predictable;
    - the unseen variance's random components: their expected share in ``central``, the
      upper quantile of one draw in ``high`` where no simulation gives their spread; a hidden
      earlier release's shares also at its noisy trace's two ends
      (:func:`~service.mechanisms.forecast_spread.trace_readings`).

    ``at_floor``: ``figures`` are already read as a sign map's
    (:func:`~service.mechanisms.forecast_spread.filled`, the risky high end); ``mean_rank``: the
    eigenvalue read as the uncentred route's mean (:func:`data_spectrum`)."""
    from service.mechanisms.clipped_spectrum import declipped_shares  # no import cycle
    from service.mechanisms.explained_variance import expected_noise_norm, spiked_debias

    d = figures.n_cols
    k = min(new.k, d)
    sigma0 = figures.sigma
    sigma1 = sigma0 * new.noise_ratio
    risky = new.probe_risk >= PROBE_RISK
    if not figures.trace > 0 or not math.isfinite(figures.trace) or not sigma0 > 0:
        return RangeForecast(k / d, 0.0, 1.0, 1.0, new.probe_risk)
    noisy = np.asarray(figures.eigenvalues, dtype=np.float64)
    debiased = spiked_debias(noisy, sigma0, d)
    shift = Z * math.sqrt(2.0) * sigma0
    above = np.flatnonzero(debiased > 0)
    unseen_values = noisy[debiased <= 0]
    # The data's share of the new Gram's trace relative to the earlier one's (mean route).
    scale, spike = _mean_noise_change(figures, new)
    # The new mean's noise spike takes one of the ``k`` components where it stands out of the
    # new noise and is not outranked by ``k`` of the data's known eigenvalues (then the top
    # ``k`` eigenvectors are theirs, not the spike's; counting it regardless left a release of
    # ``k = 1`` keeping nothing: a range [0, 0] on digits from eps 1 to 0.3, which kept 0.03-0.08).
    spike_value = spike * figures.trace
    outranked = int(np.sum(debiased[above] * scale > spike_value)) >= k
    stands = spike_value > sigma1 * math.sqrt(d) and not outranked
    taken = int(figures.uncentred) + int(stands)
    freed = 0
    if figures.measured:
        # The earlier release's components already hold its mean's direction or its noise
        # spike where they stood out (their stated shares are about nothing): only a spike the
        # new release adds takes a further component.
        _, old_spike = _mean_noise_change(figures, NewRelease(k, 1.0, figures.mean_noise))
        spent = int(old_spike * figures.trace > sigma0 * math.sqrt(d))
        freed = max(0, spent - (taken - int(figures.uncentred)))
        taken = max(0, taken - int(figures.uncentred) - spent)
    assumed = taken
    if spare:
        taken = 0
    slots = max(k - taken, 0)
    # The simulation draws the new mean's spike itself (``Model.spike``) beside the data's
    # known eigenvalues, so it is given as many of them as the ``k`` components could take
    # without the spike: whether the spike's direction or the data's wins a component, and how
    # far they mix, is then the simulated release's, not assumed (a spike 1.5x the top data
    # eigenvalue still leaves the release of k = 1 on digits 0.03-0.08 of the variance).
    slots_sim = max(k - (0 if figures.measured else int(figures.uncentred)), 0)
    trace = figures.trace
    if figures.measured:
        ratios = np.asarray(figures.ratios, dtype=np.float64)
        known = above
        v = np.asarray(
            [min(float(ratios[i]) / overlap(float(debiased[i]), sigma0, d), 1.0) for i in known]
        )
        if freed and v.size > 1:
            # The earlier spike's component (the least kept) is not the new release's: its
            # place goes to the next direction.
            keep = np.sort(np.argsort(v, kind="stable")[freed:])
            known, v = known[keep], v[keep]
        plain = v
    else:
        leading, trace, _ = data_spectrum(figures, debiased[above], rank, mean_rank)
        values = set(leading.tolist())
        known = np.asarray([i for i in above if float(debiased[i]) in values], dtype=np.intp)
        v = plain = np.zeros(0)
        if trace > 0 and known.size:
            plain = np.minimum(leading / trace, 1.0)[:slots_sim]
            if plain.sum() > 1.0 - 1e-6:
                plain = plain * (1.0 - 1e-6) / plain.sum()
            v, _ = declipped_shares(plain, d, figures.clipped_share)
        if not trace > 0:
            trace = figures.trace
    use = min(slots, known.size, v.size)
    known_all, v_all = known, v
    known, v = known[:use], v[:use]
    lam = debiased[known] * scale
    lam_low = spiked_debias(noisy[known] - shift, sigma0, d) * scale
    lam_high = spiked_debias(noisy[known] + shift, sigma0, d) * scale
    v_low, v_high = v, v
    v_moved: FloatArray | None = None
    if not figures.measured and v.size:
        # The clip's correction is a model's (Gaussian rows): the range reads the shares
        # between the clipped matrix's own (no correction) and the corrected ones, each at
        # the noisy trace's two ends as well (forecast_spread.trace_readings).
        read_low, read_high = trace_readings(plain[:use], trace, sigma0, d)
        v_low = np.minimum(v, read_low)
        v_high = np.maximum(v, declipped_shares(read_high, d, figures.clipped_share)[0])
    if figures.measured and v.sum() > 0:
        stated = float(np.sum(figures.ratios))
        if stated > 0:
            v_low = v * max(figures.interval[0], 0.0) / stated
            v_high = np.minimum(v * figures.interval[1] / stated, 1.0)
            if figures.uncentred and known.size and int(known[0]) == 0:
                # The uncentred route's first component is the rows' mean tilted towards the
                # data's top directions; how far depends on the noise, not on the data alone
                # (MNIST: eigenvalue about 1,010 at eps 1 and 3, stated share 0.02-0.04 at
                # eps 1 and 0.19-0.20 at eps 3), so its share is not carried as a data
                # direction's: the low end counts it as keeping nothing.
                v_low = v_low.copy()
                v_low[0] = 0.0
            if figures.uncentred and known.size >= 2:
                # ... and the high end lets any one component's stated share be the data's
                # top direction's (the released figures do not say which is the mean's).
                # (The high end's alone: the low end's rest is what the stated split leaves.)
                v_moved = moved_share(
                    v_high,
                    np.asarray([overlap(float(x), sigma0, d) for x in debiased[known]]),
                    np.asarray([overlap(float(x), sigma1, d) for x in lam_high]),
                )
    elif figures.measured and v.size and figures.interval[1] > 0:
        # A stated share of 0 whose interval reaches above 0: the known directions may hold up
        # to the interval's end, shared among them as the release shares what it captured (in
        # proportion to the debiased eigenvalues), each over its overlap. (Read as 0 before,
        # the range missed: held-out spiked rows, eps 0.3 to 1, a point 0.12-0.17 off.)
        values_known = debiased[known]
        weights = values_known / float(values_known.sum())
        overlaps = np.asarray([overlap(float(x), sigma0, d) for x in values_known])
        v_high = np.minimum(
            figures.interval[1] * weights / np.maximum(overlaps, np.finfo(np.float64).tiny), 1.0
        )

    def kept(values: FloatArray, shares: FloatArray) -> tuple[float, float]:
        weights = np.asarray([overlap(float(x), sigma1, d) for x in values])
        return float(np.sum(shares * weights)), float(weights.sum())

    def fill(aligned: float) -> float:
        return max(0.0, k - aligned) / max(1.0, d - aligned)

    central, aligned = kept(lam, v)
    low, aligned_low = kept(lam_low, v_low)
    high, aligned_high = kept(lam_high, v_high if v_moved is None else v_moved)
    rest = max(0.0, 1.0 - float(v.sum()))
    # The unresolved directions: the tail model (a power law from the last known eigenvalue,
    # each below the earlier noise's detection threshold where the earlier release showed one
    # below its edge) instead of a flat rest; its largest values may stand out of less noise.
    threshold0 = sigma0 * math.sqrt(d) if unseen_values.size else math.inf
    tail, tail_shares = _tail(figures, debiased, known, trace, threshold0, rest)
    free = max(slots - use, 0)
    tail_weights = np.asarray([overlap(float(x) * scale, sigma1, d) for x in tail[:free]])
    from_tail = float(np.sum(tail_shares[:free] * tail_weights))
    aligned_tail = float(tail_weights.sum())
    central += from_tail + fill(aligned + taken + aligned_tail) * max(0.0, rest - from_tail)
    asymptotic = central
    low += fill(aligned_low + taken) * max(0.0, 1.0 - float(v_high.sum()))
    rest_high = max(0.0, 1.0 - float(v_low.sum()))
    extra = max(slots - use, 0)
    edge = expected_noise_norm(sigma0, d)
    if unseen_values.size:
        cap = _debias_one(float(unseen_values.max()) + shift, sigma0, d)
    elif use:
        cap = float(lam_high.min()) / scale if scale > 0 else 0.0
    else:
        cap = _debias_one(edge + shift, sigma0, d)
    held = min(rest_high, extra * min(1.0, cap / trace)) if extra and trace > 0 else 0.0
    cap_weight = overlap(cap * scale, sigma1, d)
    high += held * cap_weight
    use_sim = min(slots_sim, known_all.size, v_all.size)
    # The uncentred route's mean as a hidden release's spectrum showed it (dropped by
    # data_spectrum; 0 on the other routes, for a measured release, and when the high end
    # reads its component as the data's: ``spare``).
    mean_value = 0.0
    if figures.uncentred and not figures.measured and not spare and above.size:
        mean_value = float(debiased[above][min(mean_rank, above.size - 1)])
    simulated = d <= SIMULATE_MAX_D and bool(use_sim)
    occupied = aligned_high + taken + extra * cap_weight
    aligned_top = high
    high += fill(occupied) * (rest_high - held)
    if not simulated:
        # Unaligned components as one random draw (MNIST eps 0.3 to 0.1, k = 5: kept
        # 0.007-0.012 above a top of 0.006 from expected shares).
        loose = k - aligned_high - taken
        high = max(high, aligned_top + random_share_high(loose, d - k + loose) * rest_high)
    if d <= SIMULATE_MAX_D and use_sim:
        # Finite d: the new release simulated on the model (the known eigenvalues, the rest of
        # the trace spread evenly, the new mean's noise spike), the range kept around it.
        known_sim, v_sim = known_all[:use_sim], v_all[:use_sim]
        lam_sim = debiased[known_sim] * scale
        rest_sim = max(0.0, 1.0 - float(v_sim.sum()))
        tail_sim, shares_sim = _tail(figures, debiased, known_sim, trace, threshold0, rest_sim)
        resolved_new = _resolved(tail_sim * scale, shares_sim, sigma1, d)
        if mean_value > 0:
            # The uncentred route's mean, dropped from a hidden release's spectrum as not the
            # data's variance, still stands in the new release's Gram and takes one of its
            # ``k`` components where it outranks the data's: simulated as a direction holding
            # none of the centred variance (without it the simulated release spent all ``k``
            # on the data: power-law rows, eps 0.3 to 1 and 2 at k 2, a low end of 0.18-0.22
            # above the 0.17-0.18 kept, 8 of 20 runs).
            lam_sim = np.append(lam_sim, mean_value)
            v_sim = np.append(v_sim, 0.0)
            resolved_new = (resolved_new[0][:-1], resolved_new[1][:-1])
            tail_sim, shares_sim = tail_sim[:-1], shares_sim[:-1]
        model = Model(lam_sim, v_sim, *resolved_new, spike * figures.trace)
        sim = simulated_share(model, d, k, sigma1)
        central = sim.mean
        spread_below, spread_above = sim.below, sim.above
        # The same release with the tail's modelled profile kept below the new threshold:
        # at finite d the top noisy eigenvectors catch part of a profile the released figures
        # do not rule out (an even spread there is the least they catch, the profile the
        # most the tail model allows). The range spans both readings; ``central`` stays the
        # even one's (power-law rows, eps 0.3 to 0.1 at k 10: kept 0.148, the even reading
        # 0.12, the range's high end below the kept share in 15 of 20 runs).
        profiled = Model(lam_sim, v_sim, tail_sim * scale, shares_sim, spike * figures.trace)
        prof = simulated_share(profiled, d, k, sigma1)
        profile = prof.mean
        spread_below = max(spread_below, prof.below)
        spread_above = max(spread_above, prof.above)
        anchor = 1.0
        if figures.measured and not figures.uncentred:
            # Anchored on what the earlier release measured: the simulation of the earlier
            # release (its noise, its k, its own mean's spike) against its stated share.
            same = NewRelease(len(figures.ratios), 1.0, figures.mean_noise)
            _, old_spike = _mean_noise_change(figures, same)
            rest_all = max(0.0, 1.0 - float(v_all.sum()))
            tail_all, shares_all = _tail(figures, debiased, known_all, trace, threshold0, rest_all)
            resolved = _resolved(tail_all, shares_all, sigma0, d)
            before = Model(debiased[known_all], v_all, *resolved, old_spike * figures.trace)
            modelled = simulated_share(before, d, len(figures.ratios), sigma0).mean
            stated = float(np.sum(figures.ratios))
            if modelled > 0 and stated > 0:
                anchor = stated / modelled
                central = central * stated / modelled
                spread_below = spread_below * stated / modelled
                spread_above = spread_above * stated / modelled
                profile = profile * stated / modelled
        # The range's half-widths: the asymptotic ones (what the released figures leave open)
        # and the new release's own draw-to-draw spread, independent, in squares. The spread
        # is the draws' own 90% prediction interval (their order statistics, each side its
        # own: a share near the noise's edge is skewed), not a normal's or Student t's
        # quantile of their sd.
        below, above_ = asymptotic - low, high - asymptotic
        low = min(central, profile) - math.hypot(max(below, 0.0), spread_below)
        high = max(central, profile) + math.hypot(max(above_, 0.0), spread_above)
        if figures.measured and use:
            # The ends' readings simulated too: below the new edge the asymptotic overlaps
            # are 0, so ``below`` / ``above_`` carry none of the released figures' own
            # uncertainty (power-law rows, eps 1-2 to 0.1 at k 5-10: the stated shares read at
            # their interval's top moved no end), while at finite d eigenvalues near the edge
            # keep part of their share: the high reading (eigenvalues at +Z sqrt(2) sigma,
            # shares at the interval's top, the tail's profile) and the low one simulated.
            v_top = v_high if v_moved is None else v_moved
            for ends, lam_end, v_end, tailed in (
                (1, lam_high, v_top, True),
                (0, lam_low, v_low, False),
            ):
                lam_e, v_e = lam_sim.copy(), v_sim.copy()
                lam_e[:use], v_e[:use] = lam_end, v_end
                rest_e = max(0.0, 1.0 - float(v_e.sum()))
                tail_e, sh_e = _tail(figures, debiased, known_sim, trace, threshold0, rest_e)
                if mean_value > 0:
                    tail_e, sh_e = tail_e[:-1], sh_e[:-1]
                tail_e = tail_e * scale
                model_e = Model(
                    lam_e,
                    v_e,
                    *(tail_e, sh_e) if tailed else _resolved(tail_e, sh_e, sigma1, d),
                    spike * figures.trace,
                )
                sim_e = simulated_share(model_e, d, k, sigma1)
                if ends:
                    high = max(high, (sim_e.mean + sim_e.above) * anchor)
                else:
                    low = min(low, (sim_e.mean - sim_e.below) * anchor)
    if figures.measured and not figures.uncentred:
        earlier_k = len(figures.ratios)
        low_i, high_i = figures.interval
        if new.noise_ratio >= 1.0 and k <= earlier_k and scale >= 1.0:
            high = min(high, high_i)
        if new.noise_ratio <= 1.0 and k >= earlier_k and scale <= 1.0:
            low = max(low, low_i)
    if risky:
        # The probe may read its clip (to the grid's floor: a sign map) or its route from
        # noise, so the release may be as good as random: at least its spread (digits, eps 1
        # to 0.1, k = 1: the range was 0.021 wide at its top, the releases kept up to 0.034),
        # or as good as a sign map: the probe's clip may land at the grid's floor, where
        # every row fills it and the data's eigenvalues stand higher against the same noise
        # (forecast_spread.filled; breast_cancer, eps 1-2 to 0.3 at k 2-10: releases at the
        # floor kept 0.57-0.85, up to 0.15 above the high end read at the earlier clip).
        full = None if at_floor else filled(figures)
        if full is not None:
            high = max(high, range_at(full, new, rank, spare, at_floor=True).high)
        low, high = 0.0, max(high, random_share_high(k, d))
    central = min(max(central, 0.0), 1.0)
    low = min(max(low, 0.0), central)
    high = max(min(high, 1.0), central)
    return RangeForecast(
        central, low, high, rest, new.probe_risk, covers_spread=simulated, assumed=assumed
    )


def _mean_noise_change(figures: ReleasedFigures, new: NewRelease) -> tuple[float, float]:
    """``(scale, spike)``: on the mean route, the factor ``(1 - s_new)/(1 - s_old)`` by which
    the data's eigenvalues change against the trace when the private mean's noise changes
    from the earlier release's to the new one's, and ``s_new``, the new noise spike's share of
    the trace (:func:`range_from_release`); ``(1, 0)`` on the other routes or without the
    released sums."""
    if figures.uncentred or figures.n_rows <= 0 or not figures.sums > 0:
        return 1.0, 0.0
    if figures.mean_noise <= 0 and new.mean_noise <= 0:
        return 1.0, 0.0
    n, d = figures.n_rows, figures.n_cols
    old = n * d * figures.mean_noise**2
    fresh = n * d * new.mean_noise**2
    data = figures.sums - old
    if not data > 0:
        # The sums are about all noise: the data's spread is not resolved; no change read.
        return 1.0, min(1.0, fresh / figures.sums) if figures.mean_noise > 0 else 0.0
    s_old = old / (data + old)
    s_new = fresh / (data + fresh)
    return (1.0 - s_new) / (1.0 - s_old), s_new


def _tail(
    figures: ReleasedFigures,
    debiased: FloatArray,
    known: npt.NDArray[np.intp],
    trace: float,
    threshold: float,
    rest: float,
) -> tuple[FloatArray, FloatArray]:
    """The unresolved directions' eigenvalues (Gram units, shape ``(d - m,)``, ``m`` the known
    directions ``known``) by :func:`~service.mechanisms.forecast_tail.tail_spectrum` --
    a power law from the least known eigenvalue of the data's (not a measured uncentred
    release's first, the rows' mean) holding the trace the known ones leave, unless its first
    value exceeds ``threshold`` (the earlier noise's detection threshold ``sigma sqrt(d)``
    where it released an eigenvalue below its edge, else unbounded): then flat -- and the
    shares of the centred variance along them
    (``rest`` split in proportion). With no data direction known there is nothing to
    extrapolate from: the tail is flat (a random subspace's share, the range's high end
    bounds what it may hold)."""
    from service.mechanisms.forecast_tail import tail_spectrum  # no import cycle

    d = figures.n_cols
    values_known = debiased[known]
    m = int(values_known.shape[0])
    count = max(d - m, 0)
    remaining = max(trace - float(np.sum(values_known)), 0.0)
    data = values_known
    if figures.measured and figures.uncentred and m and int(known[0]) == 0:
        data = values_known[1:]
    if data.size:
        values = tail_spectrum(
            float(data.min()), int(data.size), remaining, count, threshold, figures.measured
        )
    else:
        values = np.full(count, remaining / max(count, 1))
    total = float(values.sum())
    shares = values * (rest / total) if total > 0 else np.full(count, rest / max(count, 1))
    return values, shares


def _resolved(
    values: FloatArray, shares: FloatArray, sigma: float, d: int
) -> tuple[FloatArray, FloatArray]:
    """The tail as a release at noise ``sigma`` resolves it: its values above the detection
    threshold ``sigma sqrt(d)`` as modelled, the others (and their shares) spread evenly over
    their directions. Below the threshold the model's profile is not what the released
    figures showed (the earlier release saw none of it), only its sum: simulating it as a
    profile would credit a release with what its finite-``d`` noise catches of a guess (on a
    flat bulk it over-read 0.03 at the same settings)."""
    below = values <= sigma * math.sqrt(d)
    out, weights = values.copy(), shares.copy()
    if below.any():
        out[below] = float(values[below].mean())
        weights[below] = float(shares[below].mean())
    return out, weights


def _debias_one(value: float, sigma: float, d: int) -> float:
    from service.mechanisms.explained_variance import spiked_debias  # no import cycle

    return float(spiked_debias(np.asarray([value]), sigma, d)[0])
