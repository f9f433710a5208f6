"""M5 ``histogram_aggregate``: subsample-and-aggregate with a stability histogram.

Singhal & Steinke, "Privately Learning Subspaces", NeurIPS 2021, Algorithm 2 (DPASE) and
Algorithm 3 (boosting); seeds 000/003 (Lemmas 2.15, 4.4, Theorem 4.10).

Privacy: the partition, reference points and grid offsets are public randomness. Replacing one
row changes one subset, hence one point ``y_j``, hence two cell counts by 1. Each non-empty
cell gets ``count + Lap(2/eps)`` and only cells above ``T = 1 + (2/eps) ln(1/delta)`` survive: a
cell present on one side only has count 1 and survives with probability ``<= delta/2``, so the
histogram is ``(eps, delta)``-DP; the cell's point and its top-k subspace are post-processing.
Boosting runs this on disjoint groups of rows (parallel composition) and selects among the
outputs (post-processing). Cost: exactly ``(eps, delta)``.

Floating point and totality: each subset's rows are scaled by a power of two of their own
before its Gram matrix or SVD, and a subset LAPACK cannot decompose gets the fixed public basis
``e_1..e_k`` (``subset_top_k``), so a computed ``y_j`` depends on subset ``j`` alone and one
row still changes one point. A point's cell is a function of that point alone (indices clamped
to ``+-2^62`` so that a tiny width cannot overflow), so the histogram's sensitivity is exact
in floating point. The released basis comes from a power-of-two-scaled SVD of the cell's point,
with the public fallback if it cannot be decomposed (only for widths near the largest double).
No finite input raises. Memory: :meth:`HistogramAggregate.memory_bytes`, from ``n, d, k`` and
params. The noise samplers are the textbook ones on doubles (see ``noise.py``).

Choices the paper leaves open (fixed here)
------------------------------------------
* ``c2`` of the width rule ``w = c2 gamma sqrt(dk) (sqrt(k) + sqrt(ln(kt))) / sqrt(m)`` is
  :data:`C2_WIDTH` = 40, fixed by ``bench/experiments/simulate_gamma_width.py`` (removed; in
  git history at commit ad45863) under the paper's model (rows
  ``N(0, Sigma)``, ``lambda_{k+1} = gamma^2 lambda_k``, ``q = 2k``): it is the smallest round
  value for which, in every setting simulated (``d <= 20``, ``k <= 3``, ``m in {10k, 40k}``),
  some cell holds ``>= t/2`` of the points with probability ``>= 0.9`` over the offsets (needed
  values 4-37.5). Having *all* ``t`` points in one cell would need 45-530, growing like
  ``sqrt(qd)``, which the rule does not model; in higher ``d`` give ``cell_width`` instead.
* Default ``t``: ``floor(n / (10 k))`` (so ``m >= 10k``), capped at :data:`MAX_DEFAULT_SUBSETS`,
  refused below ``2T``. An explicit ``t`` must also be ``>= 2T`` and leave ``m >= k``.
* The released point is the cell centre by default (``point = "uniform"``: a uniform point of the
  cell, as in the paper). Boosting returns the first group's output (in group order) within
  ``2 alpha`` of at least ``0.6 T_b - 1`` others, ``T_b = ceil(4 ln(1/beta))``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import numpy.typing as npt
from pydantic import Field

from api_schemas.common import format_budget
from service.mechanisms.base import (
    ApproximateStep,
    InvalidParameter,
    Mechanism,
    MechanismOutput,
    MechanismParams,
    Preview,
    PreviewValue,
    PrivacyStep,
    PublicContext,
    PureStep,
    ReleaseSpec,
)
from service.mechanisms.linalg import FloatArray, subspace_distance
from service.mechanisms.noise import laplace
from service.mechanisms.sample_aggregate import (
    allowance,
    embeddings_bytes,
    random_partition,
    reference_embeddings,
    reference_points,
    subset_bases,
    subset_bases_bytes,
)
from service.mechanisms.subset_top_k import safe_top_right_singular_vectors
from service.mechanisms.usefulness import (
    count_above,
    rectangular_edge,
    top_singular_values,
    usefulness_extras,
)
from service.mechanisms.width_selection import (
    WIDTH_STEPS,
    WidthSearch,
    cell_counts,
    query_noise_scale,
    search_memory_bytes,
    search_split,
    search_threshold,
    search_width,
    threshold_noise_scale,
)

#: ``c2`` of the width rule, fixed by simulation (``bench/experiments/simulate_gamma_width.py``,
#: removed; in git history at commit ad45863).
C2_WIDTH = 40.0
#: Cap on the default number of subsets (memory ``O(t q d)``; more subsets shrink ``m``).
MAX_DEFAULT_SUBSETS = 2000
#: Sensitivity of the histogram (two counts change by 1).
COUNT_SENSITIVITY = 2.0
#: Cell indices are clamped to ``[-2^62, 2^62]`` (a per-point map: the sensitivity is unchanged).
CELL_INDEX_LIMIT = float(2**62)


class HistogramAggregateParams(MechanismParams):
    """Params of ``histogram_aggregate``."""

    t: int | None = Field(
        default=None, ge=1, description="Number of subsets. Default floor(n/(10k)), at most 2000."
    )
    q: int | None = Field(default=None, ge=1, description="Reference points; default 2k, >= k.")
    cell_width: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description=(
            "Grid cell width w. With neither cell_width nor gamma the width is chosen privately "
            "(a quarter of epsilon) on the grid ||P||_F 2^-i, i = 26..0."
        ),
    )
    gamma: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="Assumed gap sqrt(lambda_{k+1}/lambda_k); sets the cell width (give at most "
        "one of cell_width and gamma; neither: the width is searched privately).",
    )
    point: Literal["center", "uniform"] = Field(
        default="center", description="Point of the chosen cell: its centre or a uniform point."
    )
    boost_beta: float | None = Field(
        default=None, gt=0, lt=1, description="Boosting failure probability (with boost_alpha)."
    )
    boost_alpha: float | None = Field(
        default=None, gt=0, description="Boosting target spectral error (with boost_beta)."
    )


# ---------------------------------------------------------------------------------------------
# Public calibration


def threshold(epsilon: float, delta: float) -> float:
    """``T = 1 + (2/eps) ln(1/delta)``: a one-sided cell (count 1) passes w.p. ``<= delta/2``."""
    return 1.0 + COUNT_SENSITIVITY / epsilon * math.log(1.0 / delta)


def count_noise_scale(epsilon: float) -> float:
    """Laplace scale of each noisy count: ``2/eps``."""
    return COUNT_SENSITIVITY / epsilon


def width_from_gamma(gamma: float, d: int, k: int, t: int, m: int, c2: float = C2_WIDTH) -> float:
    """``w = c2 gamma sqrt(dk) (sqrt(k) + sqrt(ln(kt))) / sqrt(m)`` (seed 003, Algorithm 2)."""
    return (
        c2 * gamma * math.sqrt(d * k) * (math.sqrt(k) + math.sqrt(math.log(k * t))) / math.sqrt(m)
    )


def histogram_epsilon(params: HistogramAggregateParams, epsilon: float) -> float:
    """The histogram's epsilon: all of it with a given width (``cell_width`` or ``gamma``),
    ``3 eps/4`` when the width is searched (the search spends ``eps/4``)."""
    if params.cell_width is None and params.gamma is None:
        return search_split(epsilon)[1]
    return epsilon


def boost_groups(beta: float) -> int:
    """``T_b = ceil(4 ln(1/beta))`` disjoint groups for boosting."""
    return max(1, math.ceil(4.0 * math.log(1.0 / beta)))


def min_subsets(epsilon: float, delta: float) -> int:
    """``ceil(2T)``: fewest subsets for which a cell can clear ``T`` with room for the noise."""
    return math.ceil(2.0 * threshold(epsilon, delta))


# ---------------------------------------------------------------------------------------------
# The mechanism


def stability_histogram(
    points: FloatArray,
    width: float,
    epsilon: float,
    delta: float,
    rng: np.random.Generator,
    offsets: FloatArray | None = None,
) -> tuple[FloatArray, FloatArray] | None:
    """The heavy cell of a randomly shifted grid, or ``None``.

    Parameters
    ----------
    points : (t, D) array
        One point per subset.
    width : float
        Cell width ``w``.
    epsilon, delta : float
        Budget of the histogram.
    rng : numpy.random.Generator
        Draws the offsets (uniform on ``[0, w)``, one per coordinate) unless given, and the noise.
    offsets : (D,) array, optional
        Public offsets already drawn (the width search's grid at the chosen width).

    Returns
    -------
    (lower, offsets) : two (D,) arrays, or None
        The lower corner of the kept cell with the largest noisy count, and the grid offsets;
        ``None`` when no cell's ``count + Lap(2/eps)`` exceeds ``T``.
    """
    if offsets is None:
        offsets = np.asarray(rng.uniform(0.0, width, size=points.shape[1]), dtype=np.float64)
    # A point's cell is a function of that point alone, so clamping the (public-width) cell
    # index to a finite range keeps the histogram's sensitivity and keeps a tiny width from
    # overflowing to infinite cells.
    # The same operations as floor((points - offsets) / width), in one buffer of t D doubles
    # (three fewer arrays of that size).
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        cells = np.subtract(points, offsets)
        np.divide(cells, width, out=cells)
        np.floor(cells, out=cells)
    np.clip(cells, -CELL_INDEX_LIMIT, CELL_INDEX_LIMIT, out=cells)
    # Canonicalised in place (-0.0 to +0.0): the kept cell's lower corner is the same double,
    # as offsets (>= 0) plus a signed zero times the width is the offset either way.
    first, counts = cell_counts(cells, overwrite=True)
    occupied = cells[first]
    noisy = counts + laplace(count_noise_scale(epsilon), rng, size=counts.shape[0])
    best = int(np.argmax(noisy))
    if not noisy[best] > threshold(epsilon, delta):
        return None
    with np.errstate(over="ignore", invalid="ignore"):
        lower = np.asarray(offsets + occupied[best] * width, dtype=np.float64)
    return lower, np.asarray(offsets, dtype=np.float64)


def histogram_aggregate_once(
    data: npt.NDArray[Any],
    rows: npt.NDArray[np.int64] | None,
    k: int,
    epsilon: float,
    delta: float,
    t: int,
    q: int,
    width: float | None,
    point: str,
    rng: np.random.Generator,
    units: npt.NDArray[np.int64] | None = None,
) -> tuple[FloatArray | None, dict[str, Any]]:
    """Algorithm 2 on the rows ``rows`` of ``data`` (all rows when ``None``); with ``units``
    (the person of each row of ``data``) on a partition of people.

    Parameters
    ----------
    data : (n, d) array
        May be a read-only memory map (subsets are read one group at a time).
    rows : (n_g,) sorted int array or None
        The rows this run may use (a boosting group).
    k, epsilon, delta, t, q, width, point
        As resolved by ``prepare``; ``m = floor(n_g / t) >= k``. ``width = None``: searched
        privately (:mod:`width_selection`) with ``eps/4``, the histogram gets ``3 eps/4``.
    rng : numpy.random.Generator
        Draw order: partition, reference points, [search offsets and noise], grid offsets
        (unless searched), count noise, uniform point.

    Returns
    -------
    basis : (d, k) array or None
        Top-k right singular vectors of the chosen cell's point reshaped to ``q x d``.
    info : dict
        With a searched width: ``cell_width`` and ``width_exponent`` (``None`` when no width
        reached the threshold).
    """
    embedded, r_max = histogram_points(data, rows, k, t, q, rng, units)
    if width is None:
        state = histogram_search(embedded, r_max, q, data.shape[1], epsilon, rng)
        return histogram_continue(state, k, delta, point, rng)
    found = stability_histogram(embedded, width, epsilon, delta, rng)
    basis, above = _released_basis(found, width, q, data.shape[1], k, point, rng)
    return basis, ({} if basis is None else {"components_above_noise": above})


@dataclass(frozen=True)
class HistogramSearch:
    """The state of a width-searched :func:`histogram_aggregate_once` after its search.

    ``points`` are private (go through :func:`histogram_continue`); ``search.width`` and
    ``search.exponent`` are the search's ``(eps0, 0)``-DP output; ``epsilon`` is the
    histogram's remaining ``3 eps/4``.
    """

    points: FloatArray
    q: int
    d: int
    epsilon: float
    search: WidthSearch


def histogram_points(
    data: npt.NDArray[Any],
    rows: npt.NDArray[np.int64] | None,
    k: int,
    t: int,
    q: int,
    rng: np.random.Generator,
    units: npt.NDArray[np.int64] | None = None,
) -> tuple[FloatArray, float]:
    """The ``t`` points ``y_j = P U_j U_j^T`` (``(t, q d)``) and ``||P||_F``: partition, subset
    bases, public reference points ``P``, drawn from ``rng`` in that order. ``units`` (the
    person of each row of ``data``): the partition is of people."""
    d = data.shape[1]
    in_play = None if units is None else (units if rows is None else units[rows])
    partition = random_partition(data.shape[0] if rows is None else rows.shape[0], t, rng, in_play)
    if rows is not None:
        partition = rows[partition]
    bases = subset_bases(data, partition, k)
    ref = reference_points(q, d, rng)
    embedded = reference_embeddings(bases, ref)  # (t, q d)
    # ||P U U^T||_F <= ||P||_F bounds every coordinate of every point: a public scale (the
    # search's r_max)
    return embedded, float(np.linalg.norm(ref))


def histogram_search(
    embedded: FloatArray, r_max: float, q: int, d: int, epsilon: float, rng: np.random.Generator
) -> HistogramSearch:
    """The width search (``eps/4``) on the points of :func:`histogram_points`."""
    eps0, eps_h = search_split(epsilon)
    return HistogramSearch(embedded, q, d, eps_h, search_width(embedded, r_max, eps0, rng))


def histogram_continue(
    state: HistogramSearch, k: int, delta: float, point: str, rng: np.random.Generator
) -> tuple[FloatArray | None, dict[str, Any]]:
    """The stability histogram (``3 eps/4, delta``) at the searched width and the release;
    ``(None, info)`` when the search found no width (no result)."""
    found_width = state.search
    info: dict[str, Any] = {"cell_width": found_width.width, "width_exponent": found_width.exponent}
    if found_width.width is None:
        return None, info
    found = stability_histogram(
        state.points, found_width.width, state.epsilon, delta, rng, found_width.offsets
    )
    basis, above = _released_basis(found, found_width.width, state.q, state.d, k, point, rng)
    if basis is not None:
        info["components_above_noise"] = above
    return basis, info


def _released_basis(
    found: tuple[FloatArray, FloatArray] | None,
    width: float,
    q: int,
    d: int,
    k: int,
    point: str,
    rng: np.random.Generator,
) -> tuple[FloatArray | None, int]:
    """The top-k subspace of the chosen cell's point (centre or uniform), ``None`` if none;
    and how many of its top-k singular values stand out of the cell's spread (issue 24, item
    5): the point differs from the subsets' points in the cell by up to ``w/2`` per
    coordinate, about uniform (the grid's offsets are uniform), a ``q x d`` matrix of entry
    scale ``w/sqrt(12)`` whose edge is :func:`~service.mechanisms.usefulness.rectangular_edge`;
    a cell wider than the points' own singular values pins no subspace. Post-processing of the
    released point and width."""
    if found is None:
        return None, 0
    lower, _ = found
    with np.errstate(over="ignore", invalid="ignore"):
        if point == "uniform":
            chosen = lower + rng.uniform(0.0, width, size=lower.shape[0])
        else:
            chosen = lower + width / 2.0
    # Total: scaled by a power of two, and a public fallback basis if the point is not finite
    # (only possible for widths near the largest double) or LAPACK fails.
    matrix = chosen.reshape(q, d)
    edge = rectangular_edge(width / math.sqrt(12.0), q, d)
    above = count_above(top_singular_values(matrix, k), k, edge)
    return safe_top_right_singular_vectors(matrix, k), above


def select_boosted(bases: list[FloatArray | None], alpha: float) -> tuple[int, int] | None:
    """Algorithm 3's selection: the first output within ``2 alpha`` of ``>= 0.6 T_b - 1`` others.

    Returns ``(index, agreeing)`` or ``None``; ``None`` entries (failed groups) agree with nothing.
    """
    n_groups = len(bases)
    needed = 0.6 * n_groups - 1.0
    for i, basis in enumerate(bases):
        if basis is None:
            continue
        agreeing = sum(
            1
            for j, other in enumerate(bases)
            if j != i and other is not None and subspace_distance(basis, other) <= 2.0 * alpha
        )
        if agreeing >= needed:
            return i, agreeing
    return None


def histogram_aggregate(
    data: npt.NDArray[Any],
    k: int,
    epsilon: float,
    delta: float,
    t: int,
    q: int,
    width: float | None,
    point: str,
    rng: np.random.Generator,
    boost: tuple[float, float] | None = None,
    units: npt.NDArray[np.int64] | None = None,
) -> tuple[FloatArray | None, dict[str, Any]]:
    """Algorithm 2, or Algorithm 3 when ``boost = (beta, alpha)``.

    Parameters
    ----------
    data : (n, d) array
    k, epsilon, delta : subspace dimension and budget.
    t, q, width, point : resolved parameters (``t`` subsets per run; ``width = None``: each
        run searches it privately, see :func:`histogram_aggregate_once`).
    rng : numpy.random.Generator
    boost : (beta, alpha) or None

    Returns
    -------
    basis : (d, k) array or None
    info : dict
        ``agreeing`` (boosting only; a post-processing of private outputs) or a failure note;
        with a searched width, the chosen ``cell_width`` and ``width_exponent`` (boosting: of
        the released group).
    """
    if boost is None:
        return histogram_aggregate_once(
            data, None, k, epsilon, delta, t, q, width, point, rng, units
        )
    if units is not None:
        # Refused before charging (privacy_unit.check_partition): a boosting group trimmed to
        # its public size could lose whole people and hold fewer than t.
        raise ValueError("boosting has no partition of people")
    beta, alpha = boost
    n_groups = boost_groups(beta)
    size = data.shape[0] // n_groups
    groups = np.sort(rng.permutation(data.shape[0])[: n_groups * size].reshape(n_groups, size))
    runs = [
        histogram_aggregate_once(data, g, k, epsilon, delta, t, q, width, point, rng)
        for g in groups.astype(np.int64)
    ]
    outputs = [basis for basis, _ in runs]
    picked = select_boosted(outputs, alpha)
    if picked is None:
        return None, {"groups_with_result": sum(o is not None for o in outputs)}
    index, agreeing = picked
    return outputs[index], {**runs[index][1], "agreeing": agreeing}


class HistogramAggregate(Mechanism[HistogramAggregateParams]):
    name: ClassVar[str] = "histogram_aggregate"
    accountings: ClassVar[frozenset[str]] = frozenset({"basic", "zcdp"})
    title: ClassVar[str] = "Subsample-and-aggregate with a stability histogram"
    paper: ClassVar[str] = (
        "Singhal & Steinke, Privately Learning Subspaces, NeurIPS 2021, Algorithms 2 and 3"
    )
    summary: ClassVar[str] = (
        "For data very close to a k-dimensional subspace in moderate dimension: splits the rows "
        "into t subsets, projects public Gaussian reference points onto each subset's top-k "
        "subspace, and releases the subspace of the heaviest cell of a randomly shifted grid "
        "(stability histogram). The cell width is given (cell_width), derived from an assumed "
        "gap gamma, or else chosen privately with a quarter of epsilon. No clipping."
    )
    params_model: ClassVar[type[HistogramAggregateParams]] = HistogramAggregateParams

    def prepare(
        self,
        ctx: PublicContext,
        k: int,
        epsilon: float,
        delta: float,
        params: HistogramAggregateParams,
    ) -> HistogramAggregateParams:
        self.check_common(ctx, k, epsilon, delta)
        if params.cell_width is not None and params.gamma is not None:
            raise InvalidParameter(
                "cell_width",
                "give at most one of cell_width and gamma (the assumed gap); with neither the "
                "width is chosen privately",
            )
        if (params.boost_beta is None) != (params.boost_alpha is None):
            raise InvalidParameter(
                "boost_beta", "boosting needs both boost_beta and boost_alpha (or neither)"
            )
        q = 2 * k if params.q is None else params.q
        if q < k:
            raise InvalidParameter("q", f"is {q}, below k = {k} (short by {k - q})")
        n_groups = 1 if params.boost_beta is None else boost_groups(params.boost_beta)
        rows = ctx.n_rows // n_groups
        where = "" if n_groups == 1 else f" in each of the {n_groups} boosting groups"
        # with a searched width the histogram has 3 eps/4 (the search eps/4)
        t_min = min_subsets(histogram_epsilon(params, epsilon), delta)
        if params.t is not None:
            t = params.t
            if t < t_min:
                raise InvalidParameter(
                    "t",
                    f"is {t}, below 2T = {t_min} for epsilon={format_budget(epsilon)}, "
                    f"delta={format_budget(delta)} "
                    f"(short by {t_min - t}): no cell could clear T reliably",
                )
            if rows // t < k:
                raise InvalidParameter(
                    "t",
                    f"{t} subsets of the {rows} rows{where} leave {rows // t} rows each, "
                    f"below k = {k}; at most {rows // k} subsets",
                )
        else:
            t = min(rows // (10 * k), MAX_DEFAULT_SUBSETS)
            if t < t_min:
                needed = 10 * k * t_min * n_groups
                raise InvalidParameter(
                    # The cost is what the analyst can change (no param is n_rows).
                    "epsilon",
                    f"the dataset has {ctx.n_rows} rows; {t_min} subsets (2T for "
                    f"epsilon={format_budget(epsilon)}, "
                    f"delta={format_budget(delta)}) of 10k = {10 * k} rows{where} need "
                    f"{needed} (short by {needed - ctx.n_rows}); raise epsilon or delta"
                    + ("" if n_groups == 1 else " or boost_beta"),
                )
        resolved = params.model_copy(update={"t": t, "q": q})
        width, _ = self.cell_width_for(resolved, ctx.n_rows, ctx.n_cols, k)
        if width is not None and not 0.0 < width < math.inf:
            raise InvalidParameter(
                "gamma",
                f"gives a cell width of {width:g}: the width must be a positive finite number "
                "(use a smaller gamma, or give cell_width)",
            )
        return resolved

    @staticmethod
    def cell_width_for(
        params: HistogramAggregateParams, n: int, d: int, k: int
    ) -> tuple[float | None, int]:
        """The public cell width (``None``: searched privately at run time) and the rows per
        subset ``m`` for resolved ``params``."""
        assert params.t is not None
        n_groups = 1 if params.boost_beta is None else boost_groups(params.boost_beta)
        m = (n // n_groups) // params.t
        if params.cell_width is not None:
            return params.cell_width, m
        if params.gamma is None:
            return None, m
        return width_from_gamma(params.gamma, d, k, params.t, m), m

    def privacy_steps(
        self, ctx: PublicContext, spec: ReleaseSpec[HistogramAggregateParams]
    ) -> list[PrivacyStep]:
        """The width search (AboveThreshold, ``eps0``-DP, when the width is searched) and the
        stability histogram: outside the event that a cell present on one side only (count 1;
        at most two such cells, each passing ``T`` with probability ``<= delta/2``) survives,
        the kept noisy counts are ``eps_h``-DP (two counts move by 1 under ``Lap(2/eps_h)``),
        so ``delta``-approximately ``eps_h^2/2``-zCDP; the released point is post-processing.
        The events (one per side: its own one-sided cells dropped) serve both directions: they
        concern only the one-sided cells' noise, independent of the common cells', so each
        conditioned law is the common cells' unconditioned one (same support, no
        renormalisation), and those differ by ``e^eps_h`` at most both ways.
        Boosting's groups are disjoint rows (parallel composition): the same steps."""
        eps_h = histogram_epsilon(spec.params, spec.epsilon)
        steps: list[PrivacyStep] = []
        if spec.params.cell_width is None and spec.params.gamma is None:
            steps.append(PureStep(search_split(spec.epsilon)[0]))
        return [*steps, ApproximateStep(eps_h, spec.delta)]

    def preview(self, ctx: PublicContext, spec: ReleaseSpec[HistogramAggregateParams]) -> Preview:
        params = spec.params
        assert params.t is not None and params.q is not None  # resolved by prepare
        width, m = self.cell_width_for(params, ctx.n_rows, ctx.n_cols, spec.k)
        eps_h = histogram_epsilon(params, spec.epsilon)
        bar = threshold(eps_h, spec.delta)
        scale = count_noise_scale(eps_h)
        scales: dict[str, PreviewValue] = {
            "t": params.t,
            "m": m,
            "q": params.q,
            "cell_width": width,
            "width_searched": width is None,
            "threshold": bar,
            "count_noise_scale": scale,
        }
        grid = "a grid of cell width " + (
            f"{width:.4g}." if width is not None else "a privately chosen width (below)."
        )
        meaning = [
            f"The rows are split into t = {params.t} subsets of m = {m} rows; each subset's "
            f"top-k subspace maps {params.q} public reference points to a point of {grid}",
            f"Each cell count gets Laplace({scale:.4g}) noise; the heaviest cell is released "
            f"only if its noisy count exceeds T = {bar:.4g}, otherwise no_result (charged). "
            f"So about {math.ceil(bar)} or more of the {params.t} subsets must agree within "
            "one cell.",
        ]
        if width is None:
            eps0, _ = search_split(spec.epsilon)
            scales.update(
                {
                    "width_search_epsilon": eps0,
                    "width_search_threshold": search_threshold(params.t),
                    "width_threshold_noise_scale": threshold_noise_scale(eps0),
                    "width_query_noise_scale": query_noise_scale(eps0),
                    "width_steps": WIDTH_STEPS,
                }
            )
            meaning.append(
                f"The width is chosen privately (epsilon0 = {eps0:.4g}; the histogram gets "
                f"the remaining {eps_h:.4g}) by AboveThreshold over ||P||_F 2^-i, "
                f"i = {WIDTH_STEPS}..0 (||P||_F, the norm of the reference points, is about "
                f"sqrt(q d) = {math.sqrt(params.q * ctx.n_cols):.4g}), smallest first: the first "
                f"width whose largest cell holds about {search_threshold(params.t):.4g} of the "
                f"{params.t} points (threshold noise Laplace({threshold_noise_scale(eps0):.4g}),"
                f" query noise Laplace({query_noise_scale(eps0):.4g})); if none does, "
                "no_result (charged)."
            )
        if params.boost_beta is not None:
            scales["groups"] = boost_groups(params.boost_beta)
            meaning.append(
                f"Boosting runs this on {scales['groups']} disjoint groups and releases a "
                "result on which most agree within 2 boost_alpha."
            )
        return Preview(scales=scales, meaning=meaning)

    def memory_bytes(self, ctx: PublicContext, spec: ReleaseSpec[HistogramAggregateParams]) -> int:
        """Peak bytes of :meth:`run` from its own allocations (``n``, ``d``, ``k``, params).

        One run of Algorithm 2 at a time (boosting runs the groups one after another and keeps
        only their ``d x k`` outputs, plus the ``n`` group indices): the larger of the subset
        step (:func:`subset_bases_bytes`, the partition ``t m`` indices besides) and the
        histogram step, which holds the bases (``t d k``), the points (``t q d``, with the
        reference points and coordinates) and the grid's cells, their canonical (``+0.0``)
        copy, the byte keys of the distinct cells (:func:`cell_counts`), the occupied cells
        and the expression temporaries (at most ``5 t q d``).
        """
        params = spec.params
        assert params.t is not None and params.q is not None
        n, d, k, t, q = ctx.n_rows, ctx.n_cols, spec.k, params.t, params.q
        n_groups = 1 if params.boost_beta is None else boost_groups(params.boost_beta)
        m = (n // n_groups) // t
        boost = 0 if n_groups == 1 else 8 * (2 * n + n_groups * d * k)
        partition = 8 * (2 * n + t * m)  # the permutation and the partition (and its copy)
        bases_step = subset_bases_bytes(t, m, d, k)
        histogram_step = 8 * t * d * k + embeddings_bytes(t, q, d, k) + 8 * 5 * t * q * d
        if params.cell_width is None and params.gamma is None:
            # the width search's query (one width at a time) next to the points and bases
            search_step = (
                8 * t * d * k + embeddings_bytes(t, q, d, k) + search_memory_bytes(t, q * d)
            )
            histogram_step = max(histogram_step, search_step)
        return allowance(boost + partition + max(bases_step, histogram_step))

    def run(
        self,
        data: FloatArray,
        spec: ReleaseSpec[HistogramAggregateParams],
        rng: np.random.Generator,
        units: npt.NDArray[np.int64] | None = None,
    ) -> MechanismOutput:
        """``units``: the person of each row on a person-level dataset (partitions of people)."""
        params = spec.params
        assert params.t is not None and params.q is not None  # resolved by prepare
        n, d = data.shape
        width, _ = self.cell_width_for(params, n, d, spec.k)
        boost = (
            None
            if params.boost_beta is None or params.boost_alpha is None
            else (params.boost_beta, params.boost_alpha)
        )
        basis, info = histogram_aggregate(
            data,
            spec.k,
            spec.epsilon,
            spec.delta,
            params.t,
            params.q,
            width,
            params.point,
            rng,
            boost,
            units,
        )
        return self._output(basis, info, spec, n, d)

    def search(
        self,
        data: FloatArray,
        spec: ReleaseSpec[HistogramAggregateParams],
        rng: np.random.Generator,
    ) -> HistogramSearch:
        """The first phase of :meth:`run` when the width is searched and there is no boosting
        (the points and the width search); :meth:`finish` ends it. Same draws as :meth:`run`."""
        params = spec.params
        assert params.t is not None and params.q is not None  # resolved by prepare
        if params.cell_width is not None or params.gamma is not None or params.boost_beta:
            raise ValueError("the staged run needs a searched width and no boosting")
        embedded, r_max = histogram_points(data, None, spec.k, params.t, params.q, rng)
        return histogram_search(embedded, r_max, params.q, data.shape[1], spec.epsilon, rng)

    def finish(
        self,
        state: HistogramSearch,
        spec: ReleaseSpec[HistogramAggregateParams],
        rng: np.random.Generator,
        n: int,
    ) -> MechanismOutput:
        """The second phase of :meth:`run` (``n`` rows): the histogram and the output."""
        basis, info = histogram_continue(state, spec.k, spec.delta, spec.params.point, rng)
        return self._output(basis, info, spec, n, state.d)

    def _output(
        self,
        basis: FloatArray | None,
        info: dict[str, Any],
        spec: ReleaseSpec[HistogramAggregateParams],
        n: int,
        d: int,
    ) -> MechanismOutput:
        params = spec.params
        assert params.t is not None and params.q is not None  # resolved by prepare
        width, m = self.cell_width_for(params, n, d, spec.k)
        boost = params.boost_beta
        extras: dict[str, Any] = {
            "t": params.t,
            "m": m,
            "q": params.q,
            "cell_width": width,
            "threshold": threshold(histogram_epsilon(params, spec.epsilon), spec.delta),
            **info,
        }
        if width is None:
            extras["width_searched"] = True
            extras.setdefault("width_exponent", None)
        if boost is not None:
            extras["groups"] = boost_groups(boost)
        if basis is None:
            if boost is not None:
                reason = "too few boosting groups agreed within 2 boost_alpha"
            elif width is None and extras.get("width_exponent") is None:
                reason = (
                    "the private width search found no cell width at which three quarters of "
                    "the subsets' points share a cell: the subsets' subspaces do not agree"
                )
            else:
                reason = (
                    "no histogram cell's noisy count exceeded the threshold: the subsets' "
                    "subspaces do not agree at this cell width"
                )
            return MechanismOutput.no_result(reason, **extras)
        extras.update(
            usefulness_extras(
                int(extras.pop("components_above_noise", spec.k)),
                spec.k,
                "singular values of the released cell's point against the edge of the cell's "
                "spread, width/sqrt(12) per coordinate",
            )
        )
        return MechanismOutput(basis=basis, extras=extras)
