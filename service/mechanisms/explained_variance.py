"""The explained-variance estimate of ``analyze_gauss`` (issue 24 item 1, issue 32 item 4): the
fresh noisy ``(captured, residual)`` sums of squares, their point estimate and 90% interval,
and the flag that says when the noise hides the share.

Privacy: after the basis ``U`` is chosen, the vector
``(sum_i ||U^T y_i||^2, sum_i ||(I - U U^T) y_i||^2)`` over the rows ``y_i`` clipped to ``C``
gets fresh Gaussian noise (its own share of the release's ``mu``, see
:mod:`service.mechanisms.analyze_gauss`): each row adds a point of the simplex
``{a, b >= 0, a + b <= C^2}``, whose l2 diameter is ``sqrt(2) C^2``. Everything in this module
other than the noise draw in :func:`variance_extras` is post-processing of the noisy sums, the
released eigenvalues and public scales.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.special import chdtri, ndtri

from service.mechanisms.gauss_release import GaussRelease
from service.mechanisms.linalg import FloatArray, captured_energy
from service.mechanisms.noise import GRID_DIVISOR, round_to_grid
from service.mechanisms.usefulness import usefulness_extras

#: Coverage of the released explained-variance ratio interval.
INTERVAL_COVERAGE = 0.9


def expected_noise_norm(sigma: float, d: int) -> float:
    """``2 sigma sqrt(d)``: the spectral norm of ``E(sigma)`` for large ``d`` (semicircle law)."""
    return 2.0 * sigma * math.sqrt(d)


def spiked_debias(noisy: FloatArray, sigma: float, d: int) -> FloatArray:
    """Invert the upward shift of the top eigenvalues of ``H + E(sigma)`` (spiked Wigner model,
    Baik, Ben Arous & Peche): ``lam = (v + sqrt(v^2 - edge^2))/2`` above the edge
    ``2 sigma sqrt(d)``, 0 below it. Used only to share the captured variance among the
    components (post-processing)."""
    edge = expected_noise_norm(sigma, d)
    out = np.zeros_like(noisy)
    above = noisy > edge
    # v (1 + sqrt(1 - (edge/v)^2))/2: no square of v, so no overflow at any accepted scale.
    ratio = edge / noisy[above]
    out[above] = noisy[above] * (1.0 + np.sqrt(1.0 - ratio * ratio)) / 2.0
    return out


@dataclass(frozen=True)
class ExplainedVariance:
    """Explained variance from the fresh noisy ``(captured, residual)`` sums of squares.

    ``per_component``: the captured sum of squares shared among the components in proportion
    to their debiased eigenvalues; ``ratio``: per component, each in ``[0, 1]``, summing to at
    most 1; ``interval``: ``(low, high)`` for the total captured share, coverage at least
    :data:`INTERVAL_COVERAGE`; ``total``: the estimated total sum of squares; ``hidden``: the
    interval, or the one the noise gives before it is cut to ``[0, 1]``, is at least
    :data:`HIDDEN_WIDTH` wide (:func:`hides_share`), so the noise hides the share and the point
    estimate is not a measurement.
    """

    per_component: FloatArray
    ratio: FloatArray
    interval: tuple[float, float]
    total: float
    hidden: bool = False
    #: :func:`uncut_width` of the interval (0 where the share is a public fact).
    spread: float = 0.0
    #: :func:`decision_width` where the decision read a split of the total, else ``None``.
    decision: float | None = None


#: The two-sided normal quantile of the box interval (:func:`explained_variance`,
#: :func:`uncut_width`): each noisy sum within ``BOX_Z`` noise sds (0.96 each), ``ndtri(0.98)``.
BOX_Z = float(ndtri(0.98))

#: The accuracy a stated point promises (issue 32 item 4): its expected absolute error from the
#: share kept is at most this.
POINT_ACCURACY = 0.05

# E|X| / sd(X) for a normal X (the mean absolute deviation of N(0, 1)).
_MEAN_ABS_PER_SD = math.sqrt(2.0 / math.pi)

# Why HIDDEN_WIDTH follows from POINT_ACCURACY (the maths; the docstring of hides_share says it
# in words). Without a private centre the box interval's uncut bounds are (c -+ z s)/T with
# T = c + r (the two totals c + z s + r - z s are both T), so its width is exactly
#     w = 2 z s / T.
# The point f = c/T of two sums each observed with independent N(0, s^2) noise has, to first
# order (delta method, grad f = (r, -c)/T^2),
#     sd(f) = (s/T) sqrt(f^2 + (1 - f)^2) <= s/T = w / (2 z),
# equality at f = 0 or 1, sd/sqrt(2) at f = 1/2; ratio_point's bias is O((s/T)^3). Its
# expected absolute error is then at most sqrt(2/pi) w / (2 z) = 0.1943 w (z = ndtri(0.98)), and
# that is at most POINT_ACCURACY = 0.05 exactly when
#     w <= POINT_ACCURACY 2 z / sqrt(2/pi) = 0.05 x 4.1075 / 0.7979 = 0.2574.
# At the former round edge 0.3 the bound is 0.058 (MNIST eps 0.3: 0.104 stated for 0.012 kept
# with an uncut interval 0.298 wide). With a private centre the uncut width is
# (2 z s + b)/(T - b) >= 2 z s / T (b = mean_bias_high), so the noise's share of the error is
# bounded the same way; the centre's own residual error (its bias removed in expectation) is
# not in this bound and is measured (bench_honest_point).

#: An interval at least this wide (as released, or before its cut to ``[0, 1]``) says the noise
#: hides the captured share (issue 32 item 4; :func:`hides_share`): the release is flagged and
#: warned about rather than its point estimate read as a measurement. Not a round constant:
#: the widest interval whose point is within :data:`POINT_ACCURACY` of the truth on average,
#: ``POINT_ACCURACY * 2 * BOX_Z / sqrt(2/pi)`` (about 0.2574; derivation above).
HIDDEN_WIDTH = POINT_ACCURACY * 2.0 * BOX_Z / _MEAN_ABS_PER_SD


def uncut_width(captured: float, residual: float, noise_std: float, bias_high: float) -> float:
    """The width of :func:`explained_variance`'s 90% box interval for the share ``c/(c + r)``
    before its bounds are cut to ``[0, 1]``: ``c`` and ``r`` each within ``z s`` of the noisy
    sums and, with a private centre, lower by up to ``bias_high``; about ``2 z s / T`` without
    a centre. ``inf`` when a bound's total is not positive. The interval as released can be
    far narrower where a low (high) draw cuts it at 0 (1): the noise and the centre's error are
    no smaller there, and a narrow cut interval is no measurement (digits, standardised rows,
    k = 1, eps 1: ``[0, 0.15]`` and 0 stated for 0.10 kept, noise sd 0.45 of the total; MNIST
    2,000 rows, spatial_sign with a private centre, k = 10, eps 0.7: ``[0, 0.26]`` and 0.21
    stated for 0.06 kept). Post-processing of the noisy sums and public scales."""
    z = BOX_Z
    c_low = captured - z * noise_std - bias_high
    c_high = captured + z * noise_std
    r_low = residual - z * noise_std - bias_high
    r_high = residual + z * noise_std
    low_total, high_total = c_low + r_high, c_high + r_low
    if not (low_total > 0 and high_total > 0):
        return math.inf
    width = c_high / high_total - c_low / low_total
    return width if math.isfinite(width) else math.inf


def hides_share(low: float, high: float, uncut: float) -> bool:
    """The noise hides the captured share: the released interval ``[low, high]`` or the same
    interval before it is cut to ``[0, 1]`` (``uncut``, :func:`uncut_width`) is at least
    :data:`HIDDEN_WIDTH` wide.

    Why that width: a point is stated only where its expected absolute error is at most
    :data:`POINT_ACCURACY` (0.05, issue 32 item 4). The box interval of :func:`uncut_width` is
    ``2 z s / T`` wide (``z = ndtri(0.98)``, ``s`` the sums' noise sd, ``T`` their total), and
    the point ``c/T`` has sd at most ``s/T`` (at a share of 0 or 1; ``1/sqrt(2)`` of it at 1/2),
    so its mean absolute error is at most ``sqrt(2/pi) w / (2 z)``, about ``0.194 w``. That is
    at most 0.05 for ``w`` below ``0.05 * 2 z / sqrt(2/pi)``, about 0.257 (the former round 0.3
    allowed 0.058). The forecast reads the same flag: a release's share that is hidden is not a
    measurement it could carry either (:mod:`service.mechanisms.forecast_figures`)."""
    return high - low >= HIDDEN_WIDTH or uncut >= HIDDEN_WIDTH


# Why the decision reads a split of the noisy total (issue 32 item 4, the selection effect).
# With e1, e2 the sums' iid N(0, s^2) noise, the total T^ = T + e1 + e2 and the difference
# D^ = c - r + e1 - e2 have independent noise (uncorrelated jointly Gaussian), and the point is
# (1 + D^/T^)/2: deciding on the width 2 z s / T^ and then stating (1 + D^/T^)/2 selects the
# releases whose T^ was drawn high, which pulls the stated point towards 1/2 (at a share of 0.1
# and a true width of 0.28, 18% stated with a mean absolute error of 0.057 against 0.047 for
# all). Data fission (Leiner, Duan, Wasserman & Ramdas 2023): with a fresh Z ~ N(0, 2 s^2)
# drawn independently of the data,
#     T_dec = T^ + tau Z    (noise N(0, 2 s^2 (1 + tau^2))),
#     T_pt  = T^ - Z / tau  (noise N(0, 2 s^2 (1 + 1/tau^2))),
# are independent of each other (their noises' covariance is 2 s^2 - 2 s^2 = 0) and of D^. The
# decision reads T_dec only, the point (1 + D^/T_pt)/2 reads T_pt and D^ only, so whether a
# point is stated is independent of its error: the stated points' mean absolute error is the
# point's own at every width, with no selection. Privacy: the released noisy sums and their
# noise are unchanged (same draw, same sd per ALGORITHMS.md); Z is independent of the data, so
# T_dec and T_pt are post-processing of the release (no budget, no new noisy sum). The cost
# is in the point's denominator only: the sums (T_pt +- D^)/2 carry
# N(0, s^2) each plus a shared N(0, s^2/(2 tau^2)), so ratio_point's bias term reads the total's
# variance 2 s^2 (1 + 1/tau^2) (SPLIT_POINT_NOISE) and the point's sd is at most
# (s/T) sqrt(1 + 1/(2 tau^2)) (at a share of 0 or 1; at 1/2 no loss): the decision's width is
# the box width at that sd, SPLIT_DECISION_NOISE s. tau = 2: the point's sd up 6%, while a
# true width of 0.28 (0.30) is stated in 24% (15%) of runs with a mean absolute error of
# 0.049 (0.052) at a share of 0.1, the point's own (seeded simulation, docs/benchmarks.md).

#: ``tau``: the decision's share of the fission (:func:`explained_variance`; maths above).
SPLIT_RATIO = 2.0

#: The point's noise sd bound over ``s`` after the split, ``sqrt(1 + 1/(2 tau^2))``: the
#: decision's width is the box's at this sd.
SPLIT_DECISION_NOISE = math.sqrt(1.0 + 1.0 / (2.0 * SPLIT_RATIO**2))

#: The sd ``ratio_point`` corrects for after the split, over ``s``: ``sqrt(1 + 1/tau^2)``
#: (its bias term is ``(2f - 1) var(T)/(2 T^2)``, ``var(T_pt) = 2 s^2 (1 + 1/tau^2)``).
SPLIT_POINT_NOISE = math.sqrt(1.0 + 1.0 / SPLIT_RATIO**2)


def split_total(captured: float, residual: float, draw: float) -> tuple[float, float, float]:
    """``(T_dec, c_pt, r_pt)``: the fission of the noisy total by ``draw`` (``Z ~ N(0, 2 s^2)``,
    independent of the data): the decision's total ``T^ + tau Z`` and the point's sums
    ``c^ - Z/(2 tau)``, ``r^ - Z/(2 tau)`` (their total ``T^ - Z/tau``, their difference
    ``D^``). Post-processing of the noisy sums."""
    shift = draw / (2.0 * SPLIT_RATIO)
    return captured + residual + SPLIT_RATIO * draw, captured - shift, residual - shift


def decision_width(total: float, noise_std: float, bias_high: float) -> float:
    """The width the decision reads: :func:`uncut_width`'s ``(2 z s' + b)/(T - b)`` at the
    decision's total ``T`` (``T_dec``, independent of the point) and the point's noise sd bound
    ``s' = SPLIT_DECISION_NOISE s``; ``inf`` when ``T - b`` is not positive."""
    rest = total - bias_high
    if not rest > 0:
        return math.inf
    width = (2.0 * BOX_Z * SPLIT_DECISION_NOISE * noise_std + bias_high) / rest
    return width if math.isfinite(width) else math.inf


#: The second-order bias correction of ``c/(c + r)`` is applied once ``c + r`` is at least this
#: many noise sds (below it the Taylor expansion does not hold; such a release is hidden anyway).
CORRECTION_MIN_SDS = 3.0

#: Extras' code of the warning that the noise hides the explained variance.
HIDDEN_WARNING_CODE = "explained_variance_hidden_by_noise"

#: The extras that carry the point estimate of the captured share: the per-component ratios
#: (their sum is the point) and the per-component sums of squares (the point times the
#: estimated total). Both are ``null`` where the noise hides the share (issue 32 item 4: no
#: figure that reads as a measurement); the interval and the noise sd stay. The sums of squares
#: are withheld too where a release is shown (:func:`shown_variance_extras`).
POINT_FIELDS = ("explained_variance_ratio", "explained_sum_of_squares")

#: Extras' flag that the components span the whole space (``k = d``, the share is exactly 1)
#: but fewer of them stand out of the Gram noise than were released: the split of the total
#: among them follows their debiased eigenvalues (0 below the edge), which is no measurement
#: (``[1, 0, 0, 0, 0]`` on isotropic rows, where each direction keeps ``1/d``), so
#: :data:`POINT_FIELDS` are ``null`` as for a hidden share; the total and its interval stay.
SPLIT_HIDDEN_FLAG = "explained_variance_split_hidden_by_noise"


def withhold_hidden_point(extras: Mapping[str, Any]) -> dict[str, Any]:
    """``extras`` with :data:`POINT_FIELDS` set to ``None`` when it is flagged
    ``explained_variance_hidden_by_noise`` or :data:`SPLIT_HIDDEN_FLAG`; otherwise an unchanged
    copy.

    Applied where the estimate is made (:func:`variance_extras`) and again where a stored
    result is shown (:func:`shown_variance_extras`; releases made before the rule kept the
    figure beside the flag), so a hidden share reads ``null`` everywhere. Post-processing of
    released figures."""
    out = dict(extras)
    if out.get("explained_variance_hidden_by_noise") is True or out.get(SPLIT_HIDDEN_FLAG) is True:
        for field in POINT_FIELDS:
            if field in out:
                out[field] = None
    return out


#: The sums of squares whose ratios read as the captured share: ``captured/(captured +
#: residual)`` is the share itself, and ``total_sum_of_squares`` is the debiased sum of the two
#: parts each cut at 0 (where the residual draw is negative it equals the captured part, so
#: ``captured/total`` reads 1). Shown ``null`` exactly when :data:`POINT_FIELDS` are (issue 32
#: item 4: a hidden share states no figures that imply a point); stored as drawn, since the dry
#: run's forecast (:mod:`service.mechanisms.forecast_figures`) reads their total ``c + r``.
SUM_FIELDS = ("captured_sum_of_squares", "residual_sum_of_squares", "total_sum_of_squares")

#: The noisy sums shown cut at 0 where no share is hidden (a sum of squares is not negative).
NOISY_SUM_FIELDS = ("captured_sum_of_squares", "residual_sum_of_squares")


def shown_variance_extras(extras: Mapping[str, Any]) -> dict[str, Any]:
    """``extras`` as a release shows them (release GET, lists, epochs): the stored figures made
    honest by post-processing alone (no noise, no budget).

    Flagged ``explained_variance_hidden_by_noise``: :data:`POINT_FIELDS` and
    :data:`SUM_FIELDS` ``None`` (no figure, and no ratio of figures, that reads as the point
    the release refuses to state; the interval and ``variance_noise_std`` stay). Otherwise the
    noisy ``captured``/``residual`` sums below 0 are shown as 0: a sum of squares is at least
    0, and a draw below it says only that the true sum is within about ``2 variance_noise_std``
    of 0 (a negative figure read as a measurement says less than nothing). Applied to stored
    results too, so releases made before the rule read the same way."""
    out = withhold_hidden_point(extras)
    if out.get("explained_variance_hidden_by_noise") is True:
        for field in SUM_FIELDS:
            if field in out:
                out[field] = None
        return out
    for field in NOISY_SUM_FIELDS:
        value = out.get(field)
        # bool is an int; a stored figure is a float (or an int from JSON), never a bool.
        if isinstance(value, int | float) and not isinstance(value, bool) and value < 0:
            out[field] = 0.0
    return out


def ratio_point(captured: float, residual: float, noise_std: float) -> float | None:
    """The bias-corrected ratio ``c/(c + r)`` of two sums each observed with independent
    ``N(0, s^2)`` noise, or ``None`` when their total is not positive (the noise hides it).

    With ``T = c + r`` and ``f(c, r) = c/T``: ``f_cc = -2r/T^3``, ``f_rr = 2c/T^3``, so
    ``E f(c + e1, r + e2) ~ f + (s^2/2)(f_cc + f_rr) = f + s^2 (2f - 1)/T^2`` (delta method);
    the estimate subtracts that term, evaluated at the observed ratio. Unlike a shrink towards a
    prior share, it has no pull of order ``s/T`` (the previous estimator's, which stated 0.73
    for 0.88 kept); its remaining bias is of order ``(s/T)^3``. The noisy sums are not clamped
    to 0 before the ratio: a clamp adds its own upward bias where ``c`` is comparable to ``s``.
    """
    total = captured + residual
    if not total > 0 or not math.isfinite(total):
        return None
    share = captured / total
    if total >= CORRECTION_MIN_SDS * noise_std:
        # (s/T)^2, not s^2/T^2: T^2 underflows to 0 at tiny scales (totality), while
        # s/T <= 1/CORRECTION_MIN_SDS here.
        share -= (noise_std / total) ** 2 * (2.0 * share - 1.0)
    return share if math.isfinite(share) else None


def explained_variance(
    captured: float,
    residual: float,
    noise_std: float,
    weights: FloatArray,
    mean_bias: tuple[float, float] = (0.0, 0.0),
    mean_bias_high: float = 0.0,
    prior_share: float = 0.5,
    split_draw: float | None = None,
) -> ExplainedVariance:
    """Post-processing of the noisy sums ``captured, residual`` (each ``+ N(0, noise_std^2)``).

    With a private centre the rows were centred on ``mu_hat = mu + delta``: the sums exceed the
    centred ones by ``n ||U^T delta||^2`` and ``n ||(I - U U^T) delta||^2``, together
    ``n ||delta||^2`` (below ``mean_bias_high`` with probability ``0.995``), split between them
    in a way that depends on how far ``U`` leans towards ``delta``. The point estimate removes
    ``mean_bias`` (the expected bias of each sum if ``U`` did not depend on ``delta``); the
    interval allows any split. Coverage: each sum within ``z noise_std`` (two-sided ``0.96``
    each) and the bias bound (``0.995``) hold together with probability at least
    ``1 - 0.04 - 0.04 - 0.005 > 0.9``; the share ``c/(c + r)`` increases in ``c`` and decreases
    in ``r``, so its bounds are at the box's corners. ``weights`` (``k``, non-negative) share
    the captured part among the components. The point estimate is :func:`ratio_point` of the
    debiased sums, clamped into the interval; when their total is not positive it is
    ``prior_share`` clamped into the interval (the caller passes ``k/d``, what a uniformly
    random rank-k subspace captures in expectation, ``E tr(P A)/tr(A) = k/d`` for any ``A``).
    ``hidden`` when the interval, or the one the noise gives before it is cut to ``[0, 1]``, is
    at least :data:`HIDDEN_WIDTH` wide (:func:`hides_share`).

    ``split_draw`` (``Z ~ N(0, 2 noise_std^2)``, independent of the data; the service always
    passes one): the total is split (:func:`split_total`) so that whether a point is stated
    does not depend on its error. ``hidden`` is then :func:`decision_width` of ``T^ + tau Z``
    at least :data:`HIDDEN_WIDTH`, and the point is :func:`ratio_point` of the sums
    ``c^ - Z/(2 tau)``, ``r^ - Z/(2 tau)`` (debiased) at ``SPLIT_POINT_NOISE noise_std``. The
    interval is the full sums' either way (its coverage unchanged), so a stated point's
    interval can be a little wider than :data:`HIDDEN_WIDTH` and a hidden one's narrower: the
    flag follows the decision's width (released), not the interval's.
    """
    z = BOX_Z
    k = weights.shape[0]
    total_weight = float(weights.sum())
    shares = weights / total_weight if total_weight > 0 else np.full(k, 1.0 / k)
    c_debiased = captured - mean_bias[0]
    r_debiased = residual - mean_bias[1]
    total = max(0.0, c_debiased) + max(0.0, r_debiased)
    c_low = max(0.0, captured - z * noise_std - mean_bias_high)
    c_high = max(0.0, captured + z * noise_std)
    r_low = max(0.0, residual - z * noise_std - mean_bias_high)
    r_high = max(0.0, residual + z * noise_std)
    low = c_low / (c_low + r_high) if c_low + r_high > 0 else 0.0
    high = c_high / (c_high + r_low) if c_high + r_low > 0 else 1.0
    uncut = uncut_width(captured, residual, noise_std, mean_bias_high)
    decision: float | None = None
    if split_draw is None:
        point = ratio_point(c_debiased, r_debiased, noise_std)
        hidden = hides_share(low, high, uncut)
    else:
        # The decision reads T^ + tau Z, the point the rest (independent; maths above).
        decision_total, c_point, r_point = split_total(captured, residual, split_draw)
        decision = decision_width(decision_total, noise_std, mean_bias_high)
        hidden = decision >= HIDDEN_WIDTH
        point = ratio_point(
            c_point - mean_bias[0], r_point - mean_bias[1], SPLIT_POINT_NOISE * noise_std
        )
    # No positive total: the noise hides both sums, and the interval's middle says nothing
    # either (0.5 whatever the data: the audit saw 0.50 stated for 0.03 captured); a subspace
    # the noise hides is about a random one, which keeps k/d.
    ratio_total = min(max(prior_share if point is None else point, low), high)
    return ExplainedVariance(
        per_component=ratio_total * total * shares,
        ratio=ratio_total * shares,
        interval=(low, high),
        total=total,
        hidden=hidden,
        spread=uncut,
        decision=decision,
    )


def _centre_direction(
    eigenvalues: FloatArray, weights: FloatArray, spike: float, gram_sigma: float, d: int
) -> int | None:
    """The index of the released direction taken to be the private centre's noise, or None.

    ``spike`` (``theta``) is the centre error's rank-one term in the Gram's units (0 without a
    private centre). A rank-one term separates from the noise (spiked Wigner, the rule of
    :mod:`service.mechanisms.usefulness`) when ``theta > sigma sqrt(d)``, half the edge: its
    noisy eigenvalue ``theta + sigma^2 d / theta`` is then above the edge ``2 sigma sqrt(d)``.
    It is taken when it does and that eigenvalue is at least the smallest released one (else
    the top-k passed it over): the direction above the edge whose eigenvalue, with the
    noise's upward shift undone, is nearest to ``theta``. Post-processing of public scales and
    released eigenvalues."""
    half_edge = expected_noise_norm(gram_sigma, d) / 2.0
    if not spike > half_edge or eigenvalues.shape[0] == 0:
        return None
    above = np.flatnonzero(weights > 0)
    # theta + sigma^2 d / theta, with sigma^2 d = half_edge^2 (no square of a large theta).
    noisy_spike = spike + half_edge * (half_edge / spike)
    if above.shape[0] == 0 or noisy_spike < float(np.min(eigenvalues)):
        return None
    return int(above[np.argmin(np.abs(weights[above] - spike))])


def spike_in_gram(
    bias: float,
    n: int,
    rows_total: float,
    sign_norm: float | None,
    gram_clip: float | None,
    gram_units: int | None = None,
) -> float:
    """The private centre's rank-one term in the units of the Gram the basis came from:
    ``bias = n ||delta||^2`` (about ``n d mean_sigma^2``) for the rows themselves.

    Spatial signs at ``sign_norm``: the direction weighs ``||delta||^2 / ||z_i||^2`` per row,
    up to every row's whole norm, ``n sign_norm^2 min(1, bias / rows_total)`` (Jensen; far
    more than in the rows' units on a tight cluster). Rows clipped to ``gram_clip``: row ``i``
    enters the Gram scaled by ``f_i = min(1, c/||z_i||)``, its part of the term by ``f_i^2``,
    so the term is ``bias`` times the mean ``f_i^2``, estimated ``min(1, n c^2 / rows_total)``
    (exact when every row is clipped, as at the probe's low quantile readings). Without it
    the term read in the rows' units against a Gram in the clipped rows' (issue 32 item 4):
    digits, k = 1, eps 0.5, a row clip read at 0.16 gave a Gram whose top eigenvalue was 8.8
    and noise edge 5.9, against a centre term taken as 46 (about 3.5 in the Gram's units), so
    the release's only direction was counted as the centre's and the whole bias came off the
    captured sum (0.002 stated for 0.125 kept). ``rows_total`` is the noisy sums' total;
    post-processing of it and public scales.

    ``gram_units``: the number of contributions bounded at ``gram_clip`` when that is not the
    rows (default ``n``): per person (:mod:`service.privacy_unit_centre`) each of the ``P``
    people's rows are scaled together to a trace ``<= gram_clip^2``, by
    ``s_p^2 = min(1, c^2 / T_p)``, so the term is ``||delta||^2 sum_p r_p s_p^2``; with every
    person scaled and rows of like size (``T_p = r_p t``) that is ``bias P c^2 / rows_total``
    whatever the ``r_p``, the row-level estimate with ``P`` for ``n``. Read with ``n`` it is
    ``n/P`` times too large (1 once ``n c^2 >= rows_total``: the rows' units again)."""
    if sign_norm is not None:
        whole = n * sign_norm**2
        return whole if rows_total <= 0 else whole * min(1.0, bias / rows_total)
    if gram_clip is not None:
        whole = (n if gram_units is None else gram_units) * gram_clip**2
        return bias if rows_total <= 0 else bias * min(1.0, whole / rows_total)
    return bias


def centre_bias(
    per_dim: float, d: int, k: int, spike: float, gram_sigma: float, taken: bool
) -> tuple[float, float]:
    """The expected bias ``(captured, residual)`` a private centre's error ``delta`` adds to
    the sums (``per_dim = n mean_sigma^2``, so ``n ||delta||^2`` is about ``per_dim d``):
    all of it in the captured sum where its rank-one term ``spike`` stands above the Gram
    noise's edge ``2 sigma sqrt(d)`` and the basis took its direction (``taken``,
    :func:`_centre_direction`), else ``k/d`` of it (a direction ``U`` does not lean towards).

    Why ``taken`` (issue 32 item 4, the clip's selection): standing out of the Gram *noise*
    does not put the direction in the top-k when the data's own top-k eigenvalues are larger.
    The Gram noise ``sigma`` scales with the probe's private row clip squared, so a low clip
    reading lowered the edge, the spike passed it, and the whole bias was taken off the
    captured sum while ``U`` held the data's directions and the bias sat in the residual:
    digits (unit rows), k = 1, eps 0.5, 300 seeds: that branch in 26% of releases (52% of the
    stated ones, their clip 0.79 against 0.90), its points 0.069 low on average against the
    truth (the centre's actual bias 0.0065 of the total in the captured sum and 0.0705 in the
    residual; the branch's model 0.0707 and 0). The same low clip makes the sums' noise and
    the interval narrow, so those releases were the ones that stated a point. Post-processing
    of public scales (``per_dim``, ``gram_sigma``) and the released eigenvalues (``taken``):
    no noise, no budget."""
    if taken and spike > expected_noise_norm(gram_sigma, d):
        return per_dim * d, 0.0
    return per_dim * k, per_dim * (d - k)


def whole_space(captured: float, weights: FloatArray) -> ExplainedVariance:
    """The estimate when the basis spans the whole space (``k = d``): share 1 with the
    interval ``[1, 1]``, and the captured sum (its noisy figure, at least 0) shared among the
    components by ``weights``; post-processing of released figures and public facts."""
    k = weights.shape[0]
    total_weight = float(weights.sum())
    shares = weights / total_weight if total_weight > 0 else np.full(k, 1.0 / k)
    total = max(0.0, captured)
    return ExplainedVariance(
        per_component=total * shares, ratio=shares, interval=(1.0, 1.0), total=total, hidden=False
    )


def _add_warning(extras: dict[str, Any], text: str, code: str) -> None:
    """Append ``text`` to ``extras["warning"]`` (joined by "; "); ``code`` becomes
    ``warning_code`` only when it is the first warning (the first one's code stays)."""
    if "warning" in extras:
        extras["warning"] = f"{extras['warning']}; {text}"
    else:
        extras["warning"] = text
        extras["warning_code"] = code


def variance_extras(
    data: FloatArray,
    release: GaussRelease,
    clip_norm: float,
    center: FloatArray | None,
    noise: tuple[float, float, float],
    rng: np.random.Generator,
    scale: float = 1.0,
    energy: tuple[float, float, int] | None = None,
    sign_norm: float | None = None,
    gram_clip: float | None = None,
    gram_units: int | None = None,
) -> dict[str, Any]:
    """The fresh explained-variance estimate and what is computed from it and public facts.

    ``noise`` is ``(variance_noise_std, gram_sigma, mean_sigma)`` (public; ``mean_sigma`` 0
    without a private centre). The noisy ``(captured, residual)`` sums are released (rounded to
    ``variance_noise_std / 1000``); from them: ratios in ``[0, 1]`` summing to at most 1, a
    90% interval for their sum, and a warning when the released components do not stand out
    of the Gram noise (their noisy eigenvalues below its edge ``2 sigma sqrt(d)``).
    ``scale`` multiplies the released sums and their noise (post-processing): ``n/m`` for the
    ``m`` paired differences, whose sums estimate half the centred rows'. ``gram_sigma`` is
    then already scaled, like the release's eigenvalues. ``energy``: the exact
    ``(captured, residual, rows)`` when the caller computed them (over rows it did not
    materialise, see :func:`~service.mechanisms.centring_choice.paired_energy`); else
    :func:`~service.mechanisms.linalg.captured_energy` of ``data``. ``sign_norm``: the
    released eigenvalues are those of the centred rows' spatial signs scaled to this norm
    (``spatial_sign``), not of the rows. ``gram_clip``: the Gram's rows were clipped to this
    norm (the probe's private row clip, public once released; :func:`spike_in_gram`), or
    with ``gram_units`` (public, e.g. the number of people) that many contributions were each
    bounded to a trace ``<= gram_clip^2`` (:func:`spike_in_gram`).

    A private centre's error ``delta`` adds a rank-one term along ``delta`` to the Gram the
    basis was chosen from: ``n ||delta||^2`` (about ``n d mean_sigma^2``) for the rows, and for
    the signs ``sum_i C_s^2 ||delta||^2 / ||z_i||^2 >= n^2 C_s^2 ||delta||^2 / sum_i ||z_i||^2``
    (Jensen; ``z_i`` the rows centred on the private centre, whose sum of squares is the noisy
    captured plus residual). Where that term separates from the Gram noise and reaches the
    smallest released eigenvalue, one released direction is the centre's noise, not the
    data's: it is not counted in ``components_above_noise`` and takes no share of the captured
    variance (post-processing of public scales and released figures).
    """
    n, d = data.shape
    k = release.basis.shape[1]
    noise_std, gram_sigma, mean_noise = noise
    if energy is None:
        captured, residual = captured_energy(data, release.basis, clip_norm, center)
    else:
        captured, residual, n = energy
    noisy = np.asarray([captured, residual]) + rng.normal(0.0, noise_std, size=2)
    noisy = round_to_grid(noisy, noise_std / GRID_DIVISOR) * scale
    # The fission draw of the decision (split_total): independent of the data, drawn after the
    # sums so that a seed's released sums are the same as before the split.
    split_draw = float(rng.normal(0.0, math.sqrt(2.0) * noise_std)) * scale
    noise_std *= scale
    bias = (0.0, 0.0)
    bias_high = 0.0
    centre_spike = 0.0
    # The private centre's noise per dimension in the sums, n mean_sigma^2 (0 without one).
    per_dim = n * mean_noise**2
    if mean_noise > 0:
        # scipy.stats.chi2.ppf(0.995, d)'s own kernel (the same value), without its checks.
        bias_high = per_dim * float(chdtri(d, 1 - 0.995))
        # The bias n ||delta||^2 lies along one random direction; above the Gram noise's edge
        # it stands out as an eigenvalue of its own, and where the top-k picked it up (the
        # released direction _centre_direction finds) all of it is in the captured sum; else
        # only its share k/d falls inside U on average (centre_bias).
        rows_total = float(noisy[0] + noisy[1]) / scale
        centre_spike = spike_in_gram(per_dim * d, n, rows_total, sign_norm, gram_clip, gram_units)
    weights = spiked_debias(release.eigenvalues, gram_sigma, d)
    centre_direction = _centre_direction(release.eigenvalues, weights, centre_spike, gram_sigma, d)
    if mean_noise > 0:
        taken = centre_direction is not None
        bias = centre_bias(per_dim, d, k, centre_spike, gram_sigma, taken)
    if centre_direction is not None:
        weights = weights.copy()
        weights[centre_direction] = 0.0
    estimate = explained_variance(
        float(noisy[0]), float(noisy[1]), noise_std, weights, bias, bias_high, k / d, split_draw
    )
    if k >= d:
        # A public fact: k orthonormal columns in R^d with k = d span it, so every row's
        # residual is 0 and the share is exactly 1 (the noisy sums could only blur it).
        estimate = whole_space(float(noisy[0]) - bias[0], weights)
    above = int(np.count_nonzero(weights > 0))
    extras: dict[str, Any] = {
        "captured_sum_of_squares": float(noisy[0]),
        "residual_sum_of_squares": float(noisy[1]),
        "variance_noise_std": noise_std,
        "explained_sum_of_squares": estimate.per_component.tolist(),
        "total_sum_of_squares": estimate.total,
        "explained_variance_ratio": estimate.ratio.tolist(),
        "explained_variance_ratio_interval": list(estimate.interval),
    }
    edge = expected_noise_norm(gram_sigma, d)
    why = f"their noisy eigenvalues against the edge 2 sigma sqrt(d) = {edge:.4g}"
    if centre_direction is not None:
        why += (
            "; one that does is not counted: the private centre's noise stands out along a "
            "direction of its own, and the basis took it"
        )
    extras.update(usefulness_extras(above, k, why))
    extras["explained_variance_hidden_by_noise"] = estimate.hidden
    # k = d: the total is 1 by a public fact, but a component below the noise's edge gets 0 of
    # it and the others its part by their noisy eigenvalues; with fewer than k above the edge
    # no per-component figure is a measurement, so none is stated (withhold_hidden_point).
    split_hidden = k >= d and above < k
    extras[SPLIT_HIDDEN_FLAG] = split_hidden
    if split_hidden:
        split = (
            f"the {k} components span the whole space, so they keep all of the variance "
            "(the interval is [1, 1]), but only "
            f"{above} of them stand out of the noise: how it splits among them is not "
            "measured, so explained_variance_ratio and explained_sum_of_squares are null "
            "(more rows or a larger epsilon separate them)"
        )
        _add_warning(extras, split, SPLIT_HIDDEN_FLAG)
    if estimate.decision is not None:
        # Post-processing of the noisy sums and the data-independent split draw.
        extras["explained_variance_decision_width"] = (
            estimate.decision if math.isfinite(estimate.decision) else None
        )
    if estimate.hidden:
        low, high = estimate.interval
        # Public words, the released interval and the decision's width only.
        if high - low < HIDDEN_WIDTH and estimate.spread >= HIDDEN_WIDTH:
            # Cut at 0 or 1: narrow as released, while uncut it is wider.
            uncut = "more than 1" if estimate.spread > 1 else f"{estimate.spread:.2f}"
            spread = f"is cut at 0 or 1, while uncut it is {uncut} wide"
        else:
            spread = f"is {high - low:.2f} wide"
        decided = estimate.decision if estimate.decision is not None else estimate.spread
        width = "more than 1" if decided > 1 else f"{decided:.2f}"
        hidden = (
            f"the noise hides how much variance the components keep: the 90% interval "
            f"[{low:.2f}, {high:.2f}] {spread}, and the width that decides (from an independent "
            f"split of the noisy total, at the point's own noise) is {width}, at least "
            f"{HIDDEN_WIDTH:.3f}, so no point estimate is stated "
            "(explained_variance_ratio, explained_sum_of_squares and the sums of squares "
            "are null; the interval is the measurement; more rows or a larger epsilon "
            "narrow it)"
        )
        _add_warning(extras, hidden, HIDDEN_WARNING_CODE)
    return withhold_hidden_point(extras)
