"""M6 ``friendly_aggregate``: random-partition sample-and-aggregate with friendly averaging.

Tsfadia, "On Differentially Private Subspace Estimation in a Distribution-Free Setting",
NeurIPS 2024, Section 4.1 with FriendlyCore averaging (seed 001); constants as in ALGORITHMS.md M6.
The service's mechanism, composed of one module per step, each with its own privacy argument:

* ``sample_aggregate`` and ``subset_top_k``: the random partition into ``t`` subsets, each
  subset's top-k basis ``U_j`` and the points ``y_j`` (shared with M5 ``histogram_aggregate``);
  one replaced row moves one ``y_j``.
* ``friendly_weights``: friend counts, weights and ``W``, with ``Delta_W = 1 + (t-1)/b`` and the
  mean's sensitivity ``r (4(t-1)/b + 6)/W``.
* ``friendly_radius``: the radius by AboveThreshold over ``W(r_i)``, ``(eps0, 0)``-DP.
* ``friendly_ptr``: the public shares of the budget and the propose-test-release step
  (``W_low``; Laplace ``(eps1, 0)`` failing with probability ``delta1``, or F3's Gaussian test).
* ``friendly_aggregators``: the ``reference_points`` and ``projection`` means with Gaussian noise
  for ``D = r (4(t-1)/b + 6)/W_low``, ``(eps2, delta2)``-DP on the test's good event, and
  :func:`friendly_aggregate`, the release in that order.
* ``friendly_sizing``: the default ``t`` and the peak memory, from public facts.

Privacy: total ``(eps0+eps1+eps2, delta1+delta2) = (eps, delta)`` by sequential composition (or
F3's exact composition, still within ``(eps, delta)``); everything after the noisy mean is
post-processing. The shares are a public function of ``(t, eps, delta, radius given)``.

Names of the parts are re-exported here for the modules and tests that import them from
``friendly_aggregate``; the module globals a test patches (``laplace``, ``ACCOUNTING``, ...)
live, and are patched, in the part that uses them.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt
from pydantic import Field

from api_schemas.common import format_budget
from service.mechanisms.base import (
    InvalidParameter,
    Mechanism,
    MechanismOutput,
    MechanismParams,
    Preview,
    PreviewValue,
    PrivacyStep,
    PublicContext,
    ReleaseSpec,
)

# The parts' names, re-exported for the modules and tests that import them from here (one
# statement per part: isort would split every ``name as name`` into its own statement).
# isort: off
from service.mechanisms.friendly_weights import (
    MAX_DISTANCE_WORKERS as MAX_DISTANCE_WORKERS,
    Aggregator as Aggregator,
    BlockFn as BlockFn,
    calibrated_sensitivity as calibrated_sensitivity,
    count_friends as count_friends,
    friend_counts as friend_counts,
    friendly_weights as friendly_weights,
    mean_sensitivity as mean_sensitivity,
    pairwise_distances as pairwise_distances,
    projection_distance_block as projection_distance_block,
    projection_distances as projection_distances,
    projection_rounding as projection_rounding,
    ramp_width as ramp_width,
    reference_distance_block as reference_distance_block,
    total_weight as total_weight,
    weight_sensitivity as weight_sensitivity,
    weights_from_counts as weights_from_counts,
)
from service.mechanisms.friendly_radius import (
    PROJECTION_RADIUS_STEPS as PROJECTION_RADIUS_STEPS,
    RADIUS_STEPS as RADIUS_STEPS,
    THRESHOLD_FRACTION as THRESHOLD_FRACTION,
    above_threshold as above_threshold,
    radius_floor as radius_floor,
    radius_grid as radius_grid,
    radius_steps as radius_steps,
    search_radius as search_radius,
)
from service.mechanisms.friendly_ptr import (
    COMFORTABLE_NO_RESULT as COMFORTABLE_NO_RESULT,
    GDP_FRACTIONS as GDP_FRACTIONS,
    SPARE_NOISE_SCALES as SPARE_NOISE_SCALES,
    Accounting as Accounting,
    AnySplit as AnySplit,
    BudgetSplit as BudgetSplit,
    GdpSplit as GdpSplit,
    agreeing_noise as agreeing_noise,
    budget_split as budget_split,
    comfortable_t as comfortable_t,
    gdp_budget_split as gdp_budget_split,
    gdp_split as gdp_split,
    gdp_t_min as gdp_t_min,
    min_feasible_t as min_feasible_t,
    no_result_at as no_result_at,
    noisy_weight_lower_bound as noisy_weight_lower_bound,
    ptr_feasible as ptr_feasible,
    ptr_heavy_split as ptr_heavy_split,
    ptr_margin as ptr_margin,
    ptr_no_result_if_agreeing as ptr_no_result_if_agreeing,
    radius_search_threshold as radius_search_threshold,
    release_noise as release_noise,
    release_split as release_split,
    release_weight as release_weight,
    split_margin as split_margin,
    split_mean_sigma as split_mean_sigma,
    split_no_result_if_agreeing as split_no_result_if_agreeing,
    split_noise_scale as split_noise_scale,
    split_search_threshold as split_search_threshold,
    split_shift as split_shift,
    split_steps as split_steps,
    standard_split as standard_split,
    t_comfortable_for as t_comfortable_for,
    t_min_for as t_min_for,
    weight_floor as weight_floor,
    weight_lower_bound as weight_lower_bound,
    weight_noise_scale as weight_noise_scale,
    weight_shift as weight_shift,
)
from service.mechanisms.friendly_aggregators import (
    FriendlyResult as FriendlyResult,
    FriendlySearch as FriendlySearch,
    components_above_noise as components_above_noise,
    friendly_aggregate as friendly_aggregate,
    friendly_continue as friendly_continue,
    friendly_search as friendly_search,
    projection_mean as projection_mean,
    safe_top_k_eigh as safe_top_k_eigh,
    weighted_mean as weighted_mean,
)
from service.mechanisms.friendly_sizing import (
    MAX_T as MAX_T,
    ROWS_PER_DIMENSION as ROWS_PER_DIMENSION,
    TChoice as TChoice,
    choose_t as choose_t,
    default_t as default_t,
    friendly_memory_bytes as friendly_memory_bytes,
    memory_cap_t as memory_cap_t,
    rows_cap_t as rows_cap_t,
)

# isort: on
from service.mechanisms.linalg import FloatArray
from service.mechanisms.usefulness import WARNING_CODE

#: Largest ``t q d`` accepted (the stacked points, 8 bytes each: 2 GB).
MAX_POINT_FLOATS = 250_000_000
#: The projection aggregator averages ``d x d`` matrices: ``d^2`` memory, ``d^3`` for the final
#: eigendecomposition and ``d^2`` noise coordinates; above this ``d`` use ``reference_points``.
PROJECTION_MAX_D = 1000


class FriendlyAggregateParams(MechanismParams):
    """Params of ``friendly_aggregate``."""

    t: int | None = Field(
        default=None,
        ge=3,
        description=(
            "Number of subsets of the random partition (>= 3: the weight ramp is t/2 - 1 wide). "
            "Default: the largest t that keeps floor(n/t) >= 10k rows per subset, fits the "
            "worker memory (DPSS_WORKER_MEMORY_MB) and is at most 10,000; refused when that is "
            "below t_min, the least t whose test can pass."
        ),
    )
    q: int | None = Field(
        default=None,
        ge=1,
        description="Number of Gaussian reference points (reference_points only); default 2k.",
    )
    aggregator: Aggregator | None = Field(
        default=None,
        description=(
            "reference_points: average P U_j U_j^T for q public Gaussian points P (any d). "
            "projection: average the d x d projectors U_j U_j^T (d <= 1000). Default: "
            "projection when d <= 1000 and q is not given (about 2x more accurate), else "
            "reference_points."
        ),
    )
    radius: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description=(
            "Friendly-averaging radius r (distance between aggregated points). Default: chosen "
            "privately by AboveThreshold over r_max 2^-i, using a quarter of epsilon."
        ),
    )


def resolve_aggregator(params: FriendlyAggregateParams, d: int) -> Aggregator:
    """The given aggregator, else ``projection`` when ``d <= 1000`` and ``q`` is not given (it
    was about 2x more accurate than ``reference_points`` where both run), else
    ``reference_points``."""
    if params.aggregator is not None:
        return params.aggregator
    if params.q is None and d <= PROJECTION_MAX_D:
        return "projection"
    return "reference_points"


# ---------------------------------------------------------------------------------------------
# The service's mechanism


class FriendlyAggregate(Mechanism[FriendlyAggregateParams]):
    name: ClassVar[str] = "friendly_aggregate"
    accountings: ClassVar[frozenset[str]] = frozenset({"basic", "zcdp"})
    title: ClassVar[str] = "Friendly aggregation of subset subspaces (sample and aggregate)"
    paper: ClassVar[str] = (
        "Tsfadia, On Differentially Private Subspace Estimation in a Distribution-Free "
        "Setting, NeurIPS 2024, Section 4.1 (random-partition sample-and-aggregate with "
        "FriendlyCore averaging)"
    )
    summary: ClassVar[str] = (
        "Splits the rows into t random subsets, computes each subset's top-k subspace, and "
        "privately averages those that agree (friendly averaging with a privately chosen "
        "radius and a propose-test-release check). Needs no row norm bound. When the data lies "
        "within ~1e-4 of a k-dimensional subspace it is 10-1000 times more accurate than "
        "analyze_gauss in any d; farther from low rank it loses. May return no result when "
        "the subsets do not agree or n is small for the budget."
    )
    params_model: ClassVar[type[FriendlyAggregateParams]] = FriendlyAggregateParams

    def prepare(
        self,
        ctx: PublicContext,
        k: int,
        epsilon: float,
        delta: float,
        params: FriendlyAggregateParams,
    ) -> FriendlyAggregateParams:
        self.check_common(ctx, k, epsilon, delta)
        n, d = ctx.n_rows, ctx.n_cols
        aggregator = resolve_aggregator(params, d)

        if aggregator == "projection":
            if params.q is not None:
                raise InvalidParameter("q", "q applies only to aggregator 'reference_points'")
            if d > PROJECTION_MAX_D:
                raise InvalidParameter(
                    "aggregator",
                    f"'projection' averages d x d projectors; with d = {d} > {PROJECTION_MAX_D} "
                    "its d^2 memory, d^3 eigendecomposition and d^2 noise coordinates are too "
                    "costly: use 'reference_points' (error does not grow with d^2)",
                )
        q = params.q if params.q is not None else 2 * k
        if aggregator == "reference_points" and q < k:
            raise InvalidParameter("q", f"must be >= k = {k} (the q x d average has rank <= q)")
        q_used = q if aggregator == "reference_points" else None

        budget = f"epsilon = {format_budget(epsilon)}, delta = {format_budget(delta)}"
        if params.t is None:
            choice = choose_t(
                n, d, k, epsilon, delta, q_used, aggregator, params.radius, ctx.memory_limit
            )
            t = choice.t
            if t < choice.t_min:
                rows = ROWS_PER_DIMENSION * k
                if choice.rows_cap >= choice.t_min:
                    raise InvalidParameter(
                        "t",
                        f"at {budget} the propose-test-release check needs t >= {choice.t_min} "
                        "subsets even if every subset agreed, but none of "
                        f"t = {choice.t_min}..{min(choice.rows_cap, MAX_T)} fits "
                        "the worker memory (DPSS_WORKER_MEMORY_MB): try a smaller q, or a "
                        "larger epsilon or delta",
                    )
                raise InvalidParameter(
                    "t",
                    f"n = {n} rows give at most t = {choice.rows_cap} subsets of {rows} rows, "
                    f"but at {budget} the propose-test-release check needs t >= "
                    f"{choice.t_min} even if every subset agreed; needs n >= "
                    f"{choice.t_min * rows} rows (t = {choice.t_min} subsets of {rows}), or a "
                    "larger epsilon or delta",
                )
        else:
            t = params.t
            t_min = t_min_for(epsilon, delta, params.radius is not None)
            if t < t_min:
                raise InvalidParameter(
                    "t",
                    f"t = {t} is too small for {budget}: the propose-test-release check needs "
                    f"t >= {t_min} even if every subset agreed (and n >= {t_min * k})",
                )
        if n // t < k:
            raise InvalidParameter(
                "t",
                f"t = {t} subsets of n = {n} rows have {n // t} rows each, fewer than k = {k}; "
                f"needs t <= {n // k}",
            )
        if t > MAX_T:
            raise InvalidParameter("t", f"must be <= {MAX_T} (t x t pairwise distances)")
        if aggregator == "reference_points" and t * q * d > MAX_POINT_FLOATS:
            raise InvalidParameter(
                "t",
                f"t q d = {t * q * d} exceeds {MAX_POINT_FLOATS} (memory of the stacked "
                "points); lower t or q",
            )
        return params.model_copy(update={"t": t, "q": q_used, "aggregator": aggregator})

    def privacy_steps(
        self, ctx: PublicContext, spec: ReleaseSpec[FriendlyAggregateParams]
    ) -> list[PrivacyStep] | None:
        """:func:`split_steps` of the split :meth:`run` uses (public: ``t``, epsilon, delta)."""
        params = spec.params
        assert params.t is not None  # resolved by prepare
        radius_given = params.radius is not None
        return split_steps(release_split(spec.epsilon, spec.delta, radius_given, t=params.t))

    def preview(self, ctx: PublicContext, spec: ReleaseSpec[FriendlyAggregateParams]) -> Preview:
        params = spec.params
        assert params.t is not None and params.aggregator is not None  # resolved by prepare
        t, k = params.t, spec.k
        split = release_split(spec.epsilon, spec.delta, params.radius is not None, t=t)
        ramp = ramp_width(t)
        sens = weight_sensitivity(t, ramp)
        choice = choose_t(
            ctx.n_rows,
            ctx.n_cols,
            k,
            spec.epsilon,
            spec.delta,
            params.q,
            params.aggregator,
            params.radius,
            ctx.memory_limit,
        )
        no_result = split_no_result_if_agreeing(t, split)
        standard = standard_split(spec.epsilon, spec.delta, params.radius is not None)
        if isinstance(split, GdpSplit):
            split_name = "gaussian_test"
        else:
            split_name = "standard" if split == standard else "test_heavy"
        floor = weight_floor(sens)
        scale = split_noise_scale(split, sens)
        shift = split_shift(split, sens)
        steps = radius_steps(params.aggregator)
        # Projections lie within sqrt(2k) of each other; the reference points' r_max is the
        # norm of the q x d Gaussian points drawn at run time (about sqrt(q d)).
        if params.aggregator == "projection":
            r_max: float = math.sqrt(2.0 * k)
            where = f"r_max = sqrt(2k) = {r_max:.4g}"
        else:
            assert params.q is not None
            r_max = math.sqrt(params.q * ctx.n_cols)
            where = (
                f"r_max = the norm of the public reference points, about sqrt(q d) = {r_max:.4g}"
            )
        scales: dict[str, PreviewValue] = {
            "t": t,
            "t_min": choice.t_min,
            "t_default": choice.t,
            "t_reason": choice.reason if t == choice.t else "given in the request",
            "t_comfortable": choice.t_comfortable,
            "ptr_no_result_if_agreeing": no_result,
            "budget_split": split_name,
            "epsilon0": split.eps0,
            "ramp_width": ramp,
            "weight_sensitivity": sens,
            "aggregator": params.aggregator,
            "m": ctx.n_rows // t,
            "weight_noise_scale": scale,
            "weight_shift": shift,
            "ptr_floor": floor,
            "no_result_weight": floor + shift,
            "radius_steps": steps,
            "r_max": r_max,
        }
        if isinstance(split, GdpSplit):
            scales["test_mu"] = split.ptr_mu
            scales["mean_mu"] = split.mean_mu
            scales["test_share"] = split.fraction
            shares = (
                f"Budget split gaussian_test (derivation F3): epsilon0 = {split.eps0:.4g} "
                f"(radius search, pure); a Gaussian test of mu1 = {split.ptr_mu:.4g} and a "
                f"Gaussian mean of mu2 = {split.mean_mu:.4g} (Gaussian DP), composed exactly "
                f"with the search to ({format_budget(spec.epsilon)}, "
                f"{format_budget(spec.delta)}) including the test's "
                f"failure probability {split.delta1:.3g}; chosen because its mean's noise is "
                "smaller here than the basic split's."
            )
            test_noise = f"N(0, {scale:.4g}^2)"
            test_budget = f"mu1 = {split.ptr_mu:.4g}"
        else:
            scales["epsilon1"] = split.eps1
            scales["epsilon2"] = split.eps2
            shares = (
                f"Budget split {split_name}: epsilon0 = {split.eps0:.4g} (radius search), "
                f"epsilon1 = {split.eps1:.4g} (test), epsilon2 = {split.eps2:.4g} (mean); "
                + (
                    "the standard split of ALGORITHMS.md M6."
                    if split_name == "standard"
                    else "at this t the standard split's test would fail often even on "
                    "agreeing subsets and leave a small W_low (a noisier mean), so a quarter "
                    "of epsilon moved from the mean to the test (derivation F2)."
                )
            )
            test_noise = f"Laplace({scale:.4g})"
            test_budget = f"epsilon1 = {split.eps1:.4g}"
        chosen = (
            f"t = {t} is {choice.reason}"
            if t == choice.t
            else f"t = {t} as given (the default would be {choice.t}: {choice.reason})"
        )
        meaning = [
            f"The rows are split into t = {t} subsets of {ctx.n_rows // t} rows; each gives a "
            "top-k subspace, weighted by how many others lie within the radius: a subset with "
            f"c friends gets weight clip((c - t/2 - 1)/{ramp:.4g}, 0, 1) (ramp b = t/2 - 1), "
            f"so the total weight moves by at most Delta_W = {sens:.4g} when one row changes.",
            f"{chosen}; t_min = {choice.t_min} is the least t for which even full agreement "
            f"can pass the test, and t >= {choice.t_comfortable} passes it with "
            "a chance of failing on all-agreeing subsets of at most "
            f"{COMFORTABLE_NO_RESULT:.2g}. At t = {t}, if every subset agrees "
            f"the test still ends in no_result with probability {no_result:.2g}.",
            shares,
            f"Test ({test_budget}): W_low = W + {test_noise} - "
            f"{shift:.4g}; the release ends in no_result (charged) when W_low < {floor:.4g}. "
            f"W is at most t = {t}, so the total weight of agreeing subsets must be above about "
            f"{floor + shift:.4g}.",
        ]
        if params.radius is None:
            bar = split_search_threshold(t, split)
            scales["radius_search_threshold"] = bar
            meaning.append(
                f"The radius is chosen privately (epsilon0 = {split.eps0:.4g}) on the grid "
                f"r_max 2^-i, i = {steps}..0, {where}: the smallest radius whose noisy total "
                f"weight reaches {bar:.4g} (the larger of 0.75 t and the weight the test needs)."
            )
        else:
            meaning.append(
                f"The radius {params.radius:.4g} is used as given (raised to the floor "
                f"r_max 2^-{steps} if below it; {where})."
            )
        return Preview(scales=scales, meaning=meaning)

    def memory_bytes(self, ctx: PublicContext, spec: ReleaseSpec[FriendlyAggregateParams]) -> int:
        """Peak bytes of :meth:`run` from its own allocations (``n``, ``d``, ``k``, params)."""
        params = spec.params
        assert params.t is not None and params.aggregator is not None
        return friendly_memory_bytes(
            ctx.n_rows, ctx.n_cols, spec.k, params.t, params.q, params.aggregator, params.radius
        )

    def search(
        self,
        data: FloatArray,
        spec: ReleaseSpec[FriendlyAggregateParams],
        rng: np.random.Generator,
        units: npt.NDArray[np.int64] | None = None,
    ) -> FriendlySearch:
        """The first phase of :meth:`run` (:func:`friendly_search`); :meth:`finish` ends it.
        ``units``: the person of each row on a person-level dataset (a partition of people)."""
        params = spec.params
        assert params.t is not None and params.aggregator is not None  # resolved by prepare
        return friendly_search(
            data,
            spec.k,
            spec.epsilon,
            spec.delta,
            rng,
            t=params.t,
            q=params.q,
            aggregator=params.aggregator,
            radius=params.radius,
            units=units,
        )

    def run(
        self,
        data: FloatArray,
        spec: ReleaseSpec[FriendlyAggregateParams],
        rng: np.random.Generator,
        units: npt.NDArray[np.int64] | None = None,
    ) -> MechanismOutput:
        return self.finish(self.search(data, spec, rng, units), spec, rng)

    def finish(
        self,
        state: FriendlySearch,
        spec: ReleaseSpec[FriendlyAggregateParams],
        rng: np.random.Generator,
    ) -> MechanismOutput:
        """The second phase of :meth:`run`: PTR, noisy mean and the output."""
        params = spec.params
        assert params.t is not None and params.aggregator is not None  # resolved by prepare
        result = friendly_continue(state, rng)
        # Raw noisy doubles (W_low, and sigma, which is a function of it) are not returned: see
        # the floating-point note in noise.py. The radius is a point of the public grid.
        extras: dict[str, Any] = {
            "t": params.t,
            "aggregator": params.aggregator,
            "radius": result.radius,
            "radius_searched": params.radius is None,
            "radius_exponent": result.radius_exponent,
        }
        if params.q is not None:
            extras["q"] = params.q
        if result.basis is None:
            sens = weight_sensitivity(params.t, ramp_width(params.t))
            return MechanismOutput.no_result(
                f"the subsets' subspaces do not agree enough at radius {result.radius:.3g}: the "
                f"noisy lower bound on the total weight is below the floor {weight_floor(sens):.2f}"
                f" (data not close enough to a {spec.k}-dimensional subspace, or too few rows "
                "for this budget)",
                **extras,
            )
        extras["components_above_noise"] = result.components_above_noise
        if result.components_above_noise < spec.k:
            extras["warning"] = (
                f"only {result.components_above_noise} of the {spec.k} directions of the noisy "
                "average stand above its noise and clearly above the next one: the subsets' "
                "subspaces do not agree at this radius, and the others are indistinguishable "
                "from random directions"
            )
            extras["warning_code"] = WARNING_CODE
        return MechanismOutput(basis=result.basis, extras=extras)
