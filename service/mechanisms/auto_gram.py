"""``auto``'s Gram candidate: ``analyze_gauss`` (its private clip quantile), or ``spatial_sign``
in high dimension, and its predicted error (issue 32 item 3, issue 33 item 1).

Both release the top-k eigenvectors of a Gram matrix of rows of norm ``<= C`` plus the same
symmetric Gaussian ``E(sigma)``, ``sigma = sqrt(2) C^2/mu_g``; first-order Davis-Kahan (the
``(d - k) x k`` block of ``E``, Davidson-Szarek) predicts ``sin Theta ~ sigma (sqrt(d - k) +
sqrt(k))/g`` with ``g`` that Gram's gap. They differ in the Gram:

- ``analyze_gauss``: the clipped rows', ``g ~ S/k`` from the private estimate (``S`` its head);
  predicted at its clip ``C`` and the whole Gram budget (its quantile clip is private).
- ``spatial_sign``: every row scaled to norm ``C``. Where a row's norm does not depend on its
  direction (elliptical rows: Visuri, Koivunen & Oja 2000, the sign covariance has the
  covariance's eigenvectors in the same order) its Gram is the clipped Gram times ``n C^2 /
  trace``: ``g_S = g/f`` with the fill ``f = trace/(n C^2) <= 1`` (the private trace), at the
  same ``sigma`` per unit of ``mu`` and no budget spent on choosing a clip. So its predicted
  error is at most ``analyze_gauss``'s at the same budget, at the clip ``C`` (``f <= 1``) and at
  a quantile clip ``r`` (the rows below ``r`` fill less than ``r^2``, and the quantile takes
  ``CLIP_SHARE`` of ``mu^2``): no estimate is needed to choose between the two.

What the noise bound does not see is the sign map's bias: it weights a short row as a long
one, which moves the subspace where norm and direction depend on each other (a fixed effect,
while the noise term falls like ``sqrt(d)/(n eps)``). So ``spatial_sign`` is offered only in
high dimension, ``d >= n^(2/3)`` (the regime of issue 32's literature, Dong, Liang & Yi 2022;
a public fact, not a fitted constant), where the noise term decides; below it ``analyze_gauss``
keeps its clip quantile. (Measured, docs/benchmarks.md: below ``n^(2/3)`` the sign map also
wins on the synthetic families there, 1.07-1.6x, whose norms are independent of their
directions; where short rows carry a direction of their own it loses 18-3,000x to the clip
quantile at d = 50 (a quarter of the rows, norm 0.05-0.2, along one direction). No statistic
at the estimate's share can bound that bias where it matters: the clip quantile's captured
deficit on power-law rows at d = 50, eps 0.3 is ~5 in ``C^2`` units, against a Laplace scale
of at least ``2 C^2/(s eps)`` = 222 on any sum over rows, so ``auto`` cannot predict the sign
map's error below ``n^(2/3)`` and does not offer it there.)

With a private centre the sign map has a second cost that grows as epsilon falls: the signs
are taken about ``c = m + delta``, and the error ``delta`` (``E ||delta||^2 = d sigma_c^2``) is a
common offset of every centred row, a rank-one term of their Gram matrix of about
``n ||delta||^2`` in the rows' units and ``C^2 / ||x - c||^2`` times that in the signs'. Once
it exceeds the spiked-Wigner threshold ``sigma_g sqrt(d)`` of the Gram noise (Baik, Ben Arous
& Peche; the edge ``2 sigma_g sqrt(d)`` halved), the top-k eigenvectors lean towards
``delta``, a direction of no variance, and ``analyze_gauss``'s probe (which can choose paired
differences or no centring instead of the mean) does better. The rows' centred norms are
private, so the rule takes them at ``C/sqrt(2)`` or more (the signs' factor at most 2):
``spatial_sign`` with a private centre is offered only where ``n d sigma_c^2 <
SIGN_CENTRE_LIMIT sigma_g sqrt(d)``, ``SIGN_CENTRE_LIMIT = 1/2`` (public: the noise scales of its
own split). That factor is a choice, checked (not fitted) on MNIST (4,000 x 784, k = 10; unit
rows centred have norms 0.71-0.87), where the ratio ``n d sigma_c^2 / (sigma_g sqrt(d))`` is
1.08, 0.82, 0.67, 0.49, 0.35 at eps 0.3, 0.4, 0.5, 0.7, 1 and ``spatial_sign`` kept 0.69x,
0.82x, 1.08x, 1.58x, 1.84x what ``analyze_gauss`` kept (docs/benchmarks.md): the rule gives up
the 1.08x at eps 0.5 and keeps the others' better side. Swept on data it was not fitted to
(``bench/bench_sign_centre.py``, in the history at 0b18334; 286 cells, docs/benchmarks.md): no
limit on this ratio keeps every family within 1.1x (zero-mean rows of centred norm ~C/3 lose
with the sign map from 0.3 up, MNIST gains with it up to about 0.55); of the limits the tests
allow, 1/2 scores best. The variable the public ratio misses is the rows' centred norm (the
signs' factor is 7-17 there, not <= 2), which is private.
"""

from __future__ import annotations

import math
from typing import Any

from service.mechanisms.analyze_gauss import DEFAULT_PRIVATE_CENTRE_QUANTILE
from service.mechanisms.base import PublicContext
from service.mechanisms.centring import CenterParams, mean_sensitivity
from service.mechanisms.gauss_calibration import AnalyzeGaussParams, gauss_split
from service.mechanisms.gauss_forecast import recoverable_forecast
from service.mechanisms.spatial_sign import (
    SpatialSignParams,
    gram_sensitivity,
    spatial_sign_split,
)

#: The Gram candidates, by name.
GAUSS, SIGN = "analyze_gauss", "spatial_sign"

#: With a private centre, ``spatial_sign`` is offered only where its expected offset term
#: ``n d sigma_c^2`` is below this many spiked-Wigner thresholds ``sigma_g sqrt(d)`` (rows'
#: units; 1/2 allows the signs' factor ``C^2/||x - c||^2`` up to 2; module docstring).
SIGN_CENTRE_LIMIT = 0.5


def high_dimension(n: int, d: int) -> bool:
    """``d >= n^(2/3)`` (public facts): where ``auto`` offers ``spatial_sign``."""
    return d > 0 and float(d) ** 3 >= float(max(n, 1)) ** 2


def centre_offset_ratio(n: int, d: int, epsilon: float, delta: float, raw: dict[str, Any]) -> float:
    """``n d sigma_c^2 / (sigma_g sqrt(d))``: the private centre's expected offset term in the
    signs' Gram matrix (rows' units) over the Gram noise's spiked-Wigner threshold, at
    ``spatial_sign``'s own split of ``(epsilon, delta)``; ``0`` without a private centre.
    Public facts only. ``spatial_sign`` is offered where it is below
    :data:`SIGN_CENTRE_LIMIT` (module docstring)."""
    params = SpatialSignParams.model_validate(raw)
    if params.center != "private" or n < 1:
        return 0.0
    split = spatial_sign_split(epsilon, delta, params)
    clip = float(params.clip_norm or 1.0)
    sigma_c = mean_sensitivity(clip, n) / split.mean_mu
    sigma_g = gram_sensitivity(clip) / split.gram_mu
    # n d sigma_c^2 over sigma_g sqrt(d): both scale as C^2, so the ratio does not depend on C.
    return n * math.sqrt(d) * sigma_c * sigma_c / sigma_g


def gram_candidate(
    ctx: PublicContext, params: CenterParams, clip: float, epsilon: float, delta: float
) -> tuple[str, dict[str, Any]]:
    """The Gram candidate's name and raw params, from public facts: the request's clip norm and
    centring; ``analyze_gauss`` with its private ``DEFAULT_PRIVATE_CENTRE_QUANTILE`` clip,
    ``spatial_sign`` (no clip to choose) in high dimension, with a private centre only where
    its error stays below the Gram noise (:func:`centre_offset_ratio` below
    :data:`SIGN_CENTRE_LIMIT`)."""
    raw: dict[str, Any] = {"clip_norm": clip, "center": params.center}
    if params.center != "none":
        raw["center_share"] = params.center_share
    # spatial_sign has no person-level run (issue 34): on a dataset whose privacy unit is a
    # person, analyze_gauss (bounded per person) stays the Gram candidate in every dimension.
    if (
        high_dimension(ctx.n_rows, ctx.n_cols)
        and ctx.n_units is None
        and centre_offset_ratio(ctx.n_rows, ctx.n_cols, epsilon, delta, raw) < SIGN_CENTRE_LIMIT
    ):
        return SIGN, raw
    if params.center == "none":
        del raw["center"]  # analyze_gauss's own default
    return GAUSS, {**raw, "clip_quantile": DEFAULT_PRIVATE_CENTRE_QUANTILE}


def gram_sigma(name: str, params: Any, epsilon: float, delta: float) -> float:
    """The Gram noise's ``sigma = sqrt(2) C^2/mu_g`` per entry at the candidate's budget (its
    own split of ``mu^2``: the quantile's, the centre's and the variance estimate's shares)."""
    split = spatial_sign_split if name == SIGN else gauss_split
    return gram_sensitivity(params.clip_norm) / split(epsilon, delta, params).gram_mu


def predicted_gram_error(
    name: str, params: Any, epsilon: float, delta: float, gap: float, fill: float, d: int, k: int
) -> float:
    """``sigma (sqrt(d - k) + sqrt(k))/g``, ``g = gap/fill`` where every row fills the norm
    that sets the noise (the sign map; a quantile clip at its best, module docstring), else
    ``g = gap`` (analyze_gauss at its clip ``C``)."""
    sigma = gram_sigma(name, params, epsilon, delta)
    filled = name == SIGN or getattr(params, "quantile", None) is not None
    g = gap / min(max(fill, 1e-300), 1.0) if filled else gap
    return sigma * (math.sqrt(max(d - k, 0)) + math.sqrt(k)) / max(g, 1e-300)


def gram_sentence(
    name: str, n: int, d: int, person_level: bool = False, centre_ratio: float = 0.0
) -> str:
    """Why this Gram candidate (for ``auto_reason``); ``centre_ratio``: its
    :func:`centre_offset_ratio`."""
    edge = f"{float(max(n, 1)) ** (2.0 / 3.0):.0f}"
    if person_level and name != SIGN and high_dimension(n, d):
        return (
            f"high dimension (d = {d} >= n^(2/3) = {edge}), but spatial_sign has no "
            "person-level run: analyze_gauss, bounded per person, with its private clip quantile"
        )
    if name != SIGN and high_dimension(n, d) and centre_ratio >= SIGN_CENTRE_LIMIT:
        return (
            f"high dimension (d = {d} >= n^(2/3) = {edge}), but at this budget the private "
            f"centre's error would stand out of the Gram noise ({centre_ratio:.2f} times its "
            f"spiked-Wigner threshold, limit {SIGN_CENTRE_LIMIT:g}) and pull spatial_sign's "
            "components towards it: "
            "analyze_gauss, whose private probe can centre by paired differences or not at "
            "all, with its private clip quantile"
        )
    if name == SIGN:
        return (
            f"high dimension (d = {d} >= n^(2/3) = {edge}): every row scaled to the norm bound, "
            "its predicted error (noise over the gap) is at most analyze_gauss's at the same "
            "budget, with no budget spent choosing a clip"
        )
    return (
        f"d = {d} < n^(2/3) = {edge}: with its private clip quantile (spatial_sign, which weights "
        "short rows as long ones, runs only in high dimension)"
    )


#: What each Gram candidate kept where the other was the alternative, through ``PrivatePCA``
#: with no settings (docs/benchmarks.md, "Issue 32 Done-when on 30 Nov 2026 code" and
#: "`auto` as PrivatePCA's default"): the dry run states them beside the public-facts figures.
MEASURED_WHEN_SIGN = (
    "Measured at eps 1, k = 10 (centred share kept, unit rows, 10 seeds): MNIST 4,000 x 784 "
    "0.153 with spatial_sign against 0.082 with analyze_gauss (1.86x; centred norms 0.66-0.88 "
    "of C); power-law rows 4,000 x 1,000 (centred norms 0.94-0.98 of C) 0.118 against 0.122 "
    "(0.97x)."
)
MEASURED_WHEN_GAUSS = (
    "Measured at eps 0.3, k = 10 on MNIST 4,000 x 784 (6 runs): 0.027 with analyze_gauss "
    "against 0.019 with spatial_sign."
)


def alternative_gram(
    ctx: PublicContext,
    params: CenterParams,
    clip: float,
    epsilon: float,
    delta: float,
    k: int,
    chosen: str,
) -> tuple[dict[str, Any], str] | None:
    """What the other Gram candidate of a centred request in high dimension would use and what
    it kept where measured (issue 32, item 1: the dry run says what it chose and what the
    alternative would have kept); public facts only. ``None`` where dimension does not decide
    between them (no centre, ``d < n^(2/3)``: analyze_gauss's own lines state its clip's
    alternative; a person-level dataset: spatial_sign has no person-level run)."""
    n, d = ctx.n_rows, ctx.n_cols
    if params.center == "none" or ctx.n_units is not None or not high_dimension(n, d):
        return None
    raw: dict[str, Any] = {"clip_norm": clip, "center": params.center}
    if params.center == "private":
        raw["center_share"] = params.center_share
    gauss = AnalyzeGaussParams.model_validate(
        {**raw, "clip_quantile": DEFAULT_PRIVATE_CENTRE_QUANTILE}
    )
    sigma = {
        GAUSS: gram_sigma(GAUSS, gauss, epsilon, delta),
        SIGN: gram_sigma(SIGN, SpatialSignParams.model_validate(raw), epsilon, delta),
    }
    kept = {
        name: recoverable_forecast(s, n, d, k, clip).power_law_share for name, s in sigma.items()
    }
    other = GAUSS if chosen == SIGN else SIGN
    scales = {
        "auto_alternative": other,
        "auto_alternative_sigma": sigma[other],
        "auto_alternative_forecast_power_law_captured_share": kept[other],
        "auto_chosen_sigma": sigma[chosen],
        "auto_chosen_forecast_power_law_captured_share": kept[chosen],
    }
    figures = (
        f"with a 1/i spectrum over d and rows at the bound, k = {k} components would keep about "
        f"{kept[chosen]:.3g} with {chosen} and {kept[other]:.3g} with {other} (public facts: "
        "what each keeps depends on the rows' centred norms, which are private; the sign map "
        "gains where they are mostly shorter than C)."
    )
    if chosen == SIGN:
        return scales, (
            "The alternative, analyze_gauss with its recommended settings (a private "
            f"{DEFAULT_PRIVATE_CENTRE_QUANTILE:g}-quantile clip, the centring route from its "
            f"probe), has Gram noise sigma {sigma[GAUSS]:.4g} at C (times (C2/C)^2 at the "
            f"released clip C2) against spatial_sign's {sigma[SIGN]:.4g} with every centred row "
            f"at C; {figures} {MEASURED_WHEN_SIGN}"
        )
    return scales, (
        "The alternative, spatial_sign (every centred row scaled to C), has Gram noise sigma "
        f"{sigma[SIGN]:.4g} against analyze_gauss's {sigma[GAUSS]:.4g} at C; {figures} "
        f"{MEASURED_WHEN_GAUSS}"
    )
