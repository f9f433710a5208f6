"""A private centre and a clip quantile per person (issue 34): ``analyze_gauss`` and ``spectrum``
with ``center: "private"`` and ``clip_quantile`` on a dataset with ``privacy_unit_column``.

The per-row steps (``ALGORITHMS.md``; :mod:`service.mechanisms.centring`,
:mod:`service.mechanisms.clip_quantile`) average rows and count rows, so one person of ``r``
rows moves them ``r`` times as much as a row. Here each person contributes **one** vector to the
mean and **one** value to the quantile, and the Gram steps then bound each person on the rows
centred on the released mean (:func:`service.privacy_unit.bound_contributions`). ``P =
n_units`` is public (as ``n`` is).

Person-level argument, step by step, in the order the run draws them:

1. **Mean** (``center: "private"``). Person ``p`` contributes ``v_p = clip_C(mean of their rows
   clip_C(x_i))`` (a mean of vectors of norm ``<= C`` has norm ``<= C``: the outer clip only
   guards rounding). ``mu_hat = (1/P) sum_p v_p + N(0, sigma_mu^2 I)``. Replacing one person
   (any number of rows, either side) changes one ``v_p``: the mean moves by ``(v - v')/P``, of
   norm ``<= 2C/P``. With ``sigma_mu = (2C/P)/mu_M`` this is ``mu_M``-GDP, the same ``mu_M`` the
   row-level step has with ``(2C/n)/mu_M`` (``analyze_gauss``); with the analytic-Gaussian
   ``sigma_mu`` for ``2C/P`` at ``(s eps, s delta)`` it is ``(s eps, s delta)``-DP as the
   row-level step is for ``2C/n`` (``spectrum``; its pure variant: Laplace for the l1
   sensitivity ``2 C sqrt(d)/P``). The declared step's ratio ``Delta/sigma`` is the same, so
   the declared cost is exact; only the noise is larger (by ``n/P``).
2. **Clip quantile** (``analyze_gauss``'s ``clip_quantile``). Given the released ``mu_hat``
   (public), person ``p`` contributes one value ``a_p = min(C, sqrt(trace G_p))``, ``G_p`` the
   Gram of their rows ``y_i = clip_C(clip_C(x_i) - mu_hat)`` (``clip_C(x_i)`` without a
   centre): the norm of their rows concatenated, the very size the trace rule bounds. The
   values are counted on the public grid of
   :func:`~service.mechanisms.clip_quantile.quantile_edges`; replacing one person moves one
   count down and one up, l2 sensitivity ``sqrt(2)``, as one row did;
   the noise and the read-out are the row-level ones with ``P`` values
   (``count_noise_std(mu)``: ``mu``-GDP). The released ``C2 <= C`` is the bound each person's
   trace is then scaled to (so about a ``1 - q`` share of the people are scaled down).
3. **Gram** (``analyze_gauss``: trace rule at ``C2``; ``spectrum``: Frobenius rule at ``C``).
   Given ``mu_hat`` and ``C2``, each person's rows are a fixed map of their own rows, with
   ``||G_p'||_F <= trace(G_p') <= C2^2``: replacing one person moves the Gram's upper triangle
   (and the eigenvalue vector) by ``<= sqrt(2) C2^2`` (two PSD matrices of Frobenius norm
   ``<= B`` differ by ``<= sqrt(2) B``), the row-level sensitivity at ``C2``; the noise is the
   row-level one (``sqrt(2) C2^2 / mu_G``).
4. **Explained variance** (``analyze_gauss``). The same rows bounded at ``C`` (not ``C2``):
   each person adds ``(||U^T Y_p||_F^2, ||(I - U U^T) Y_p||_F^2)``, a point of the simplex
   ``{a, b >= 0, a + b <= C^2}`` (their trace is ``<= C^2``), whose l2 diameter is
   ``sqrt(2) C^2``: the row-level sensitivity, the row-level noise. What is computed from the
   noisy sums is post-processing of them, the released eigenvalues and public scales: among
   it the private centre's rank-one term read in the units of the Gram the basis came from
   (each of the ``P`` people scaled to a trace ``<= C2^2``: ``n d sigma_mu^2`` times
   ``min(1, P C2^2 / total)``, ``total`` the noisy sums'; ``C2`` and ``P`` are public once
   released), which decides where the centre's bias is taken off
   (:func:`~service.mechanisms.explained_variance.spike_in_gram`). No noise, no budget.

Composition: each step is a Gaussian mechanism with the row-level step's ``mu`` (the quantile
with the centring probe's ``2/mu_Q`` noise per count and sensitivity ``sqrt(2) <= 2`` when the
request chose its centring: the row-level path for data read in one pass), so adaptive GDP
composition (Dong, Roth & Su 2022, Theorem 3.2) gives exactly the declared total, per person.
The probe's route choice (pairs of rows) is not made per person: a request that lets the
service choose (``center_route`` "auto") gets the mean route or, when the per-person mean's
noise alone would fill the ball, no centring (:func:`person_route`, public facts only); pairs
are never taken. Without centring the mean's share goes to the Gram (one Gram at
``mu_R = sqrt(mu_M^2 + mu_G^2)``: the same ``rho``) and the explained-variance step reads the
uncentred rows.

Everything read from the data is in the steps above; the rest (``P``, ``C``, the grid, the
shares) is public. Memory: the person means (``8 P d`` bytes, ``P <= n``) beside the bounded
rows of :func:`service.privacy_unit.transform_bytes`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt

from service.mechanisms.analyze_gauss import gram_energy, release_of_gram
from service.mechanisms.base import MechanismOutput, ReleaseSpec
from service.mechanisms.centring import (
    BudgetSplit,
    mean_sensitivity,
    private_center,
    private_center_pure,
    private_center_sigma,
)
from service.mechanisms.centring_choice import Route
from service.mechanisms.clip_quantile import private_clip_norm
from service.mechanisms.explained_variance import variance_extras
from service.mechanisms.gauss_calibration import (
    AnalyzeGaussParams,
    chooses_centring,
    gauss_split,
    gram_sensitivity,
)
from service.mechanisms.linalg import FloatArray, clip_rows, gram_rows
from service.mechanisms.noise import GRID_DIVISOR
from service.mechanisms.spectrum import SpectrumParams, spectrum, spectrum_output
from service.privacy_unit import CHUNK_ROWS, bound_contributions, needs_internals

__all__ = [
    "bounded_grams",
    "gauss_person_run",
    "needs_internals",
    "person_center_sigma",
    "person_clip_norm",
    "person_means",
    "person_sizes",
    "preview_scales",
    "run_person_centred",
    "spectrum_person_center",
    "spectrum_person_run",
]


def person_means(
    data: npt.NDArray[Any], units: npt.NDArray[np.int64], clip_norm: float, n_units: int
) -> FloatArray:
    """``v_p = clip_C(mean of clip_C(x_i) over person p's rows)``, shape ``(P, d)``: one vector of
    norm ``<= C`` per person (step 1 of the module). A person without rows (impossible in a
    dense index) would get the zero vector."""
    n, d = data.shape
    sums = np.zeros((n_units, d), dtype=np.float64)
    for start in range(0, n, CHUNK_ROWS):
        block = clip_rows(data[start : start + CHUNK_ROWS], clip_norm)
        np.add.at(sums, units[start : start + CHUNK_ROWS], block)
    counts = np.bincount(units, minlength=n_units).astype(np.float64)
    means = sums / np.maximum(counts, 1.0)[:, None]
    # A mean of vectors in the ball is in the ball; the clip only absorbs rounding.
    return clip_rows(means, clip_norm)


def person_center_sigma(
    data: npt.NDArray[Any],
    units: npt.NDArray[np.int64],
    clip_norm: float,
    n_units: int,
    sigma: float,
    rng: np.random.Generator,
) -> FloatArray:
    """``mu_hat = (1/P) sum_p v_p + N(0, sigma^2 I)``: ``(2C/P)/sigma``-GDP per person; rounded
    to multiples of ``sigma / 1000`` (released directly)."""
    means = person_means(data, units, clip_norm, n_units)
    return private_center_sigma(means, clip_norm, sigma, rng)


def person_sizes(
    data: npt.NDArray[Any],
    units: npt.NDArray[np.int64],
    clip_norm: float,
    n_units: int,
    center: FloatArray | None,
) -> FloatArray:
    """``trace(G_p) / C^2`` per person over the Gram rows ``gram_rows(x, C, center)`` (each
    term in ``[0, 1]``, so no overflow at any finite scale)."""
    n = data.shape[0]
    squared = np.empty(n, dtype=np.float64)
    for start in range(0, n, CHUNK_ROWS):
        rows = gram_rows(data[start : start + CHUNK_ROWS], clip_norm, center) / clip_norm
        squared[start : start + CHUNK_ROWS] = np.einsum("ij,ij->i", rows, rows)
    return np.asarray(np.bincount(units, weights=squared, minlength=n_units), dtype=np.float64)


def person_clip_norm(
    sizes: FloatArray, clip_norm: float, quantile: float, mu: float, rng: np.random.Generator
) -> float:
    """``C2``: the row-level quantile read-out over one value per person,
    ``a_p = C min(1, sqrt(size_p))`` (step 2 of the module; ``mu``-GDP per person)."""
    values = clip_norm * np.minimum(np.sqrt(np.maximum(sizes, 0.0)), 1.0)
    return private_clip_norm(values, clip_norm, quantile, mu, rng)


def bounded_grams(
    data: npt.NDArray[Any],
    units: npt.NDArray[np.int64],
    clip_norm: float,
    center: FloatArray | None,
    row_clip: float,
    sizes: FloatArray,
) -> tuple[FloatArray, FloatArray]:
    """The Grams of the Gram rows with each person's trace scaled to ``<= C^2`` and to
    ``<= C2^2`` (``row_clip``): ``(H_C, H_C2)`` (steps 3 and 4 of the module). ``sizes`` is
    :func:`person_sizes` of the same rows. A person of one row within the bound is unchanged."""
    n, d = data.shape
    # s_p^2 = min(1, B^2 / trace_p) with trace_p = C^2 size_p.
    ratio = (row_clip / clip_norm) ** 2
    factor_c = np.sqrt(1.0 / np.maximum(sizes, 1.0))
    single = np.bincount(units, minlength=sizes.shape[0]) == 1
    factor_c[single] = 1.0  # one clipped row is within C^2 already (size may round above 1)
    factor_low = np.sqrt(np.minimum(1.0, ratio / np.maximum(sizes, np.finfo(float).tiny)))
    gram_c = np.zeros((d, d), dtype=np.float64)
    gram_low = np.zeros((d, d), dtype=np.float64)
    for start in range(0, n, CHUNK_ROWS):
        rows = gram_rows(data[start : start + CHUNK_ROWS], clip_norm, center)
        chunk_units = units[start : start + CHUNK_ROWS]
        scaled = rows * factor_c[chunk_units][:, None]
        gram_c += scaled.T @ scaled
        low = rows * np.minimum(factor_c, factor_low)[chunk_units][:, None]
        gram_low += low.T @ low
    return gram_c, gram_low


def gauss_person_run(
    data: npt.NDArray[Any],
    units: npt.NDArray[np.int64],
    spec: ReleaseSpec[AnalyzeGaussParams],
    rng: np.random.Generator,
) -> MechanismOutput:
    """``analyze_gauss`` with a private centre and/or a clip quantile, per person (the module's
    steps 1-4; the row-level non-probe path of :meth:`AnalyzeGauss.run` with one vector and one
    value per person). Extras as the row-level release's mean route."""
    params = spec.params
    clip = params.clip_norm
    assert clip is not None  # resolved by prepare
    n, _ = data.shape
    n_units = int(units.max(initial=-1)) + 1
    split = gauss_split(spec.epsilon, spec.delta, params)
    extras: dict[str, Any] = {}
    route = person_route(n_units, data.shape[1], clip, split) if chooses_centring(params) else None
    if route is not None:
        extras["centring"] = route
    # The "none" route gives the mean's share to the Gram: one Gram at mu_R (same rho).
    gram_mu = math.hypot(split.mean_mu, split.gram_mu) if route == "none" else split.gram_mu
    center: FloatArray | None = None
    mean_noise = 0.0
    if params.center == "private" and route != "none":
        mean_noise = mean_sensitivity(clip, max(1, n_units)) / split.mean_mu
        center = person_center_sigma(data, units, clip, n_units, mean_noise, rng)
        extras["center"] = center.tolist()
    elif isinstance(params.center, list):
        center = np.asarray(params.center, dtype=np.float64)
    sizes = person_sizes(data, units, clip, n_units, center)
    row_clip = clip
    if params.quantile is not None:
        # With a chosen centring the declared step is the probe's (sensitivity 2, noise
        # 2/mu_Q per count); one histogram of sensitivity sqrt(2) at that noise is within it.
        count_mu = split.clip_mu / math.sqrt(2.0) if chooses_centring(params) else split.clip_mu
        row_clip = person_clip_norm(sizes, clip, params.quantile, count_mu, rng)
        extras["row_clip_norm"] = row_clip
    gram_c, gram_low = bounded_grams(data, units, clip, center, row_clip, sizes)
    sigma = gram_sensitivity(row_clip) / gram_mu
    release = release_of_gram(gram_low, spec.k, sigma, rng)
    extras["eigenvalues"] = release.eigenvalues.tolist()
    extras["trace"] = release.trace
    extras["gram_noise_std"] = sigma
    variance_noise = gram_sensitivity(clip) / split.variance_mu
    # The bias bound n mean_noise^2 per dimension stays an upper bound: each row's weight
    # s_p^2 is at most 1. What the centre's error delta adds to the sums (issue 32 item 4):
    # person p's rows y_i = z_i - delta (z_i centred on the true mean) enter gram_c scaled by
    # g_p = min(1, C^2/T_p) (T_p their trace at the released centre; one row: g_p = 1), so,
    # in expectation over delta (isotropic, E||delta||^2 = d mean_noise^2, cross terms mean
    # 0), the sums gain ||delta||^2 w in the bounded rows' units, w = sum_p r_p g_p =
    # sum_p min(r_p, C^2/t_p) (t_p <= C^2 the person's mean squared row norm), shared between
    # the two sums as the basis leans. So P <= w <= n. w is not read from what is released:
    # a person of r >= 9 rows of squared norm t, r t just under C^2 (not scaled), and one of
    # r rows three times as long (scaled by 1/3), both averaging to the common mean, add the
    # same bounded rows (to a factor as near 1 as one likes) to every released figure (the
    # mean, the quantile's value, the Gram at C2, the sums at C), while w counts r for the
    # first and r/9 for the second; the sums' own part is unknown, so their total does not
    # tell either. The point therefore reads w at its bound n: a reading at P (or between)
    # removes too little where people have many unscaled rows. Measured (the script
    # bench_person_centre_point at commit 52ef2cec, 100 seeds a cell, d 20, k 1; stated
    # points' mean error):
    # 2,000 people of 30 small rows (w = n), eps 2: n +0.002 (MAE 0.023), P -0.048 (0.048),
    # (n + P)/2 -0.024 (0.029); 70% one row / 30% 30 scaled rows (w 4,600), eps 1: n +0.025
    # (0.029), P -0.004 (0.019). The interval and the decision read only the bound.
    # The basis came from gram_low, each person scaled to a trace <= C2^2:
    # the centre's rank-one term is read in those units (gram_clip=C2 over P people, as the
    # row-level release reads it over n rows clipped at its probe's clip; issue 32 item 4).
    # Its base n ||delta||^2 is still the rows' (the total is of the rows bounded at C), so
    # the term stays an estimate from above, like the bias.
    energy = (*gram_energy(gram_c, release.basis), n)
    noises = (variance_noise, sigma, mean_noise)
    extras.update(
        variance_extras(
            data,
            release,
            clip,
            center,
            noises,
            rng,
            1.0,
            energy,
            gram_clip=row_clip,
            gram_units=max(1, n_units),
        )
    )
    return MechanismOutput(basis=release.basis, extras=extras)


def person_route(n_units: int, n_cols: int, clip_norm: float, split: Any) -> Route:
    """The centring route of a request that lets the service choose it (``center_route``
    "auto"), per person, from public facts only: the row-level choice's scores
    (:func:`~service.mechanisms.centring_choice.choose_centring`) with public bounds in place of
    the probe's quantiles, the mean route at its best (centred rows of squared norm
    ``min(C^2, d sigma_mu^2)``: the mean's noise alone) and the uncentred route at its worst
    (``C^2``). Per person ``sigma_mu = (2C/P)/mu_M`` is ``n/P`` times the row-level one, so
    with few people the mean's noise alone can fill the ball: then the rows are not centred
    and the mean's share goes to the Gram (``extras.centring = "none"``, no centre released).
    Post-processing of public facts: the privacy argument of each route holds as stated."""
    sigma_mu = mean_sensitivity(clip_norm, max(1, n_units)) / split.mean_mu
    mean_norm2 = min(clip_norm**2, n_cols * sigma_mu**2)
    rest = math.hypot(split.mean_mu, split.gram_mu)
    if mean_norm2 > 0 and split.gram_mu / mean_norm2 < rest / clip_norm**2:
        return "none"
    return "mean"


def spectrum_person_center(
    data: npt.NDArray[Any],
    units: npt.NDArray[np.int64],
    params: SpectrumParams,
    split: BudgetSplit,
    rng: np.random.Generator,
) -> FloatArray:
    """``spectrum``'s private mean per person at ``(s eps, s delta)`` (analytic Gaussian for
    ``2C/P``) or, with ``delta = 0``, ``(s eps)``-DP Laplace for ``2 C sqrt(d)/P``."""
    clip = params.clip_norm
    assert clip is not None
    n_units = int(units.max(initial=-1)) + 1
    means = person_means(data, units, clip, n_units)
    if split.mean_delta > 0:
        return private_center(means, clip, split.mean_epsilon, split.mean_delta, rng)
    return private_center_pure(means, clip, split.mean_epsilon, rng)


def spectrum_person_run(
    data: npt.NDArray[Any],
    units: npt.NDArray[np.int64],
    spec: ReleaseSpec[SpectrumParams],
    rng: np.random.Generator,
) -> MechanismOutput:
    """``spectrum`` with a private centre, per person: the mean of step 1, then each person's
    rows centred on it bounded by the Frobenius rule (step 3) and the eigenvalues at the Gram
    share. Always the mean route (``extras.center_route = "mean"``); the rank-one bias it
    subtracts to suggest ``k`` uses the per-person mean noise and ``n`` (an upper bound on the
    rows' total weight: post-processing of public figures)."""
    from service.mechanisms.centring import budget_split, mean_noise_scale

    params = spec.params
    clip = params.clip_norm
    assert clip is not None
    split = budget_split(spec.epsilon, spec.delta, params)
    n, d = data.shape
    n_units = int(units.max(initial=-1)) + 1
    center = spectrum_person_center(data, units, params, split, rng)
    bounded = bound_contributions(data, units, clip, "frobenius", center=center)
    values, suggested, std = spectrum(
        bounded, spec.k, split.gram_epsilon, split.gram_delta, clip, rng
    )
    noise = mean_noise_scale(clip, max(1, n_units), d, split)
    variance = noise**2 if split.mean_delta > 0 else 2.0 * noise**2
    bias = n * d * variance
    extras: dict[str, Any] = {"center": center.tolist(), "center_route": "mean"}
    return spectrum_output(values, suggested, std, spec.k, bias, extras)


def preview_scales(
    mechanism: str, spec: ReleaseSpec[Any], n_units: int, n_cols: int
) -> tuple[dict[str, float], list[str]]:
    """The dry run's per-person figures: the private mean's noise at ``P = n_units`` (replacing
    the per-row figure the mechanism's preview computed from ``n``) and what the quantile
    counts. Empty when the params need no per-person internals."""
    params = spec.params
    if not needs_internals(params) or params.clip_norm is None:
        return {}, []
    from service.mechanisms.centring import budget_split, mean_noise_scale

    people = max(1, n_units)
    scales: dict[str, float] = {}
    notes: list[str] = []
    if params.center == "private":
        if mechanism == "analyze_gauss":
            split = gauss_split(spec.epsilon, spec.delta, params)
            noise = mean_sensitivity(params.clip_norm, people) / split.mean_mu
            key = "center_sigma"
        else:
            eps_split = budget_split(spec.epsilon, spec.delta, params)
            noise = mean_noise_scale(params.clip_norm, people, n_cols, eps_split)
            key = "center_sigma" if eps_split.mean_delta > 0 else "center_laplace_scale"
        scales = {key: noise, "center_grid": noise / GRID_DIVISOR}
        notes.append(
            f"Per person: the private mean is of {people} vectors, one per person (the mean of "
            f"their clipped rows, clipped to C): sensitivity 2C/{people}, noise {noise:.4g} per "
            "coordinate (the figure above is per person). Rows are then centred on it and each "
            "person bounded on the centred rows."
        )
    if getattr(params, "quantile", None) is not None:
        notes.append(
            "Per person: the clip quantile counts one value per person (the norm of their "
            "centred rows taken together), and each person's rows are scaled down together to "
            "the released clip rather than clipped row by row."
        )
    if mechanism == "analyze_gauss" and chooses_centring(params):
        split = gauss_split(spec.epsilon, spec.delta, params)
        route = person_route(people, n_cols, params.clip_norm, split)
        notes.append(
            f"Per person the centring route is chosen from public facts only: {route} "
            + (
                "(the per-person mean's noise is small enough against C)."
                if route == "mean"
                else "(the per-person mean's noise alone would fill the ball of radius C, so "
                "the rows are not centred, no centre is released and the mean's share goes "
                "to X^T X)."
            )
        )
    return scales, notes


def run_person_centred(
    mechanism: Any,
    data: npt.NDArray[Any],
    units: npt.NDArray[np.int64],
    spec: ReleaseSpec[Any],
    rng: np.random.Generator,
) -> MechanismOutput:
    """Dispatch to the per-person run of ``analyze_gauss`` or ``spectrum``; anything else is a
    caller's bug (the request gate admits only these)."""
    if mechanism.name == "analyze_gauss":
        return gauss_person_run(data, units, spec, rng)
    if mechanism.name == "spectrum":
        return spectrum_person_run(data, units, spec, rng)
    raise TypeError(f"{mechanism.name} has no per-person centring")
